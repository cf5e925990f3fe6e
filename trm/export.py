r"""Export fine-tuned DiffuCoder / Dream weights to the Hugging Face layout.

  python -m trm.export --config=configs/diffucoder_7b.py \
      --checkpoint=runs/dc-sft --out=DiffuCoder-7B-mine \
      --tokenizer=DiffuCoder-7B-Instruct --dtype=bfloat16

Reads the newest checkpoint of a `trm.main` workdir (parameters only),
writes sharded `*.safetensors` + `model.safetensors.index.json` +
`config.json`, and copies the tokenizer and remote-code files of
--tokenizer's directory, so the result loads in `transformers`
(trust_remote_code) and in `trm.generate --checkpoint=OUT`. On a pod run it
on every worker, as trm.main; process 0 writes.
"""
from __future__ import annotations

import glob
import os
import shutil

from absl import app, flags
from ml_collections import config_flags

from trm import cli
from trm import config_lib

# Files of a Hugging Face model directory that are not weights or config.json.
TOKENIZER_FILES = ("tokenizer*", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json",
                   "generation_config.json", "chat_template.jinja", "*.py")


def copy_tokenizer_files(source: str, out: str) -> list[str]:
  copied = []
  for pattern in TOKENIZER_FILES:
    for path in sorted(glob.glob(os.path.join(source, pattern))):
      shutil.copy2(path, out)
      copied.append(os.path.basename(path))
  if "tokenizer.json" not in copied:
    raise FileNotFoundError(f"{source} holds no tokenizer.json; point "
                            "--tokenizer at the checkpoint you fine-tuned.")
  return copied


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from trm import generate  # pylint: disable=g-import-not-at-top
  from trm import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.models import dream, hf_import  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  if not os.path.isdir(os.path.join(_CHECKPOINT.value, "checkpoints")):
    raise app.UsageError(f"--checkpoint={_CHECKPOINT.value} is not a trm.main "
                         "workdir (it has no checkpoints/ directory).")
  cfg = dream.DreamConfig.from_config(config.model)
  mesh = mesh_lib.make_mesh(config.mesh)
  rules = mesh_lib.logical_rules(config)
  with nn.logical_axis_rules(rules):
    shardings = mesh_lib.tree_shardings(mesh, rules,
                                        dream.abstract_params(cfg))
  params, source = generate.load_params(_CHECKPOINT.value, cfg, shardings)
  files = hf_import.export_hf_checkpoint(params, cfg, _OUT.value,
                                         dtype=_DTYPE.value)
  if jax.process_index() == 0:
    copied = (copy_tokenizer_files(_TOKENIZER.value, _OUT.value)
              if _TOKENIZER.value else [])
    print(f"exported {source} to {_OUT.value}: {len(files)} weight file(s), "
          f"config.json, {', '.join(copied) or 'no tokenizer files'}")


def define_flags():
  global _CONFIG, _CHECKPOINT, _OUT, _TOKENIZER, _DTYPE
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Model config.",
                                            lock_config=True)
  _CHECKPOINT = flags.DEFINE_string("checkpoint", None, "trm.main workdir.")
  _OUT = flags.DEFINE_string("out", None, "Output directory.")
  _TOKENIZER = flags.DEFINE_string(
      "tokenizer", None, "Directory whose tokenizer and remote-code files "
      "are copied (the checkpoint you fine-tuned from).")
  _DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"],
                             "Stored dtype (the hub's is bfloat16).")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "checkpoint", "out"])
  cli.run(main)
