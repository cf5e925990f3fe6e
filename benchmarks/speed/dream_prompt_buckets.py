r"""Compiles and wall time for prompts of many lengths, bucketed or not.

  python benchmarks/speed/dream_prompt_buckets.py [--prompts=12 \
      --max_new_tokens=16 --buckets=1,64]

A notebook that calls `DiffusionLM.generate` with one prompt after another
compiles a sampling program per prompt width. `generate` left-pads prompts
to a multiple of `prompt_bucket` tokens (default 64; the padding is masked
and cut off again), so prompts of nearby lengths share one program. This
script times the same prompts (lengths drawn between 3 and 300 bytes, one
`generate` call each, as a notebook would) once per bucket size on a fresh
model object: the programs compiled, compile seconds, run seconds, wall,
and how many outputs equal the unbucketed (bucket 1) ones (equal up to
floating-point rounding: a near-tie can flip). The model is the `:tiny`
shape of configs/diffucoder_7b.py with random weights and the byte tokenizer
(the compile count does not depend on the weights), or --checkpoint.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))  # the repository root: `trm`

from absl import app, flags  # pylint: disable=wrong-import-position

_PROMPTS = flags.DEFINE_integer("prompts", 12, "Prompts (one call each).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 16, "New tokens per call.")
_BUCKETS = flags.DEFINE_list("buckets", ["1", "64"], "prompt_bucket values "
                             "to compare (1: no bucketing, the reference).")
_SEED = flags.DEFINE_integer("seed", 0, "Draws the prompt lengths.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A byte-tokenizer Hugging Face directory (e.g. a "
    "trm.export of a :tiny run) instead of random :tiny weights.")


def tiny_checkpoint(directory: str) -> str:
  """Random `:tiny` weights in the Hugging Face layout."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  # configs/diffucoder_7b.py:tiny's model, without remat (no backward here).
  tiny = config_lib.load_config(os.path.join(
      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
          __file__)))), "configs", "diffucoder_7b.py"), "tiny")
  cfg = dataclasses.replace(dream.DreamConfig.from_config(tiny.model),
                            remat="none")
  params = nn.meta.unbox(dream.init_params(cfg, jax.random.key(0)))
  hf_import.export_hf_checkpoint(params, cfg, directory)
  return directory


def main(argv):
  del argv
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  lengths = np.random.default_rng(_SEED.value).integers(3, 301,
                                                         _PROMPTS.value)
  text = "def f(x):\n    return x + 1\n" * 20
  prompts = [text[:n] for n in lengths]
  print(f"{len(prompts)} prompts, lengths {sorted(map(int, lengths))} "
        f"bytes, {_MAX_NEW.value} new tokens, one generate call each")
  reference = None
  with tempfile.TemporaryDirectory() as directory:
    path = _CHECKPOINT.value or tiny_checkpoint(directory)
    for bucket in map(int, _BUCKETS.value):
      lm = DiffusionLM.from_pretrained(path, dtype="float32",
                                       tokenizer="bytes")
      outputs, compile_s, run_s = [], 0.0, 0.0
      start = time.perf_counter()
      for prompt in prompts:
        out = lm.generate(prompt, max_new_tokens=_MAX_NEW.value,
                          prompt_bucket=bucket, return_tokens=True)
        outputs.append(out.tokens)
        compile_s += lm.timings["compile_seconds"]
        run_s += lm.timings["run_seconds"]
      wall = time.perf_counter() - start
      if reference is None:
        reference = outputs
      same = sum(np.array_equal(a, b) for a, b in zip(outputs, reference))
      print(f"prompt_bucket={bucket}: {len(lm._compiled)} programs compiled "  # pylint: disable=protected-access
            f"for {len(prompts)} prompts; compile {compile_s:.1f} s, run "
            f"{run_s:.1f} s, wall {wall:.1f} s; outputs equal to "
            f"prompt_bucket={_BUCKETS.value[0]}: {same}/{len(prompts)}",
            flush=True)


if __name__ == "__main__":
  app.run(main)
