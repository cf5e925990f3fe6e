"""Models, chosen by name from the config (`config.model.name`)."""
from __future__ import annotations

import dataclasses


def get_model(model_config, metadata=None):
  """Builds the model named by `model_config.name`.

  For TRM, sizes that depend on the data (vocabulary, sequence length, number
  of puzzle identifiers) come from the dataset's metadata, as upstream
  injects them; language models take every size from the config.
  """
  kwargs = dict(model_config)
  name = kwargs.pop("name")
  if name == "dream":
    from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
    return dream.Dream(dream.DreamConfig.from_config(model_config))
  if name == "gpt":
    from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
    return gpt.GPT(gpt.GPTConfig.from_config(model_config))
  if name == "trm":
    from trm.families.trm import model as trm  # pylint: disable=g-import-not-at-top
    known = {f.name for f in dataclasses.fields(trm.TRMConfig)}
    unknown = set(kwargs) - known
    if unknown:
      raise ValueError(f"config.model has keys {sorted(unknown)} that model "
                       f"'trm' does not know; known: {sorted(known)}.")
    cfg = trm.TRMConfig(vocab_size=metadata.vocab_size,
                        seq_len=metadata.seq_len,
                        num_puzzle_identifiers=metadata.num_puzzle_identifiers,
                        **kwargs)
    return trm.TRM(cfg)
  raise ValueError(f"config.model.name={name!r} is not a known model; "
                   "known: 'trm', 'dream', 'gpt'.")
