"""Which config keys a run never reads: a knob that is set and ignored.

  python benchmarks/reliability/config_reads.py trm.main \
      --config=configs/trm_sudoku.py:cpu --workdir=/tmp/reads \
      --config.total_steps=4 --config.eval_every=2

Runs the entry point (`python -m MODULE ARGS...`) in this process with
every read of a `ConfigDict` key recorded, then prints the keys of the
`--config` file that no code read. Reads by code that walks a whole config
(flag parsing, the config file itself, the numeric-field checks, the
model's keyword arguments, config.json) are not counted; `config.model`'s
keys go to the family's config dataclass as a whole, so they show here as
unread and are checked there (each field is used by the model). A key
that others follow through a FieldReference (configs/gpt.py's nanoGPT
names, e.g. `bias` for `model.bias`) is read through them, unseen here.
A key read only on another path (a float16 run's `loss_scale.*`, W&B's
`wandb.*`, TFDS's `data.tfds.*`, JSONL's `data.prompt_key`) is unread in
a run that does not take that path: read the list with the run in mind. Exits 0; prints `unread: KEY` lines and a count.
"""
from __future__ import annotations

import runpy
import sys

import ml_collections
from ml_collections import config_dict

# Callers that read every key of a config (not a use of the knob).
_WALKERS = ("_numeric_fields", "model_kwargs", "_flag.py", "get_config",
            "config_record", "set_values", "check_values")


# Frames of their own before Python 3.12: the function around them reads.
_COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _caller() -> str:
  frame = sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None and ("ml_collections" in frame.f_code.co_filename
                               or frame.f_code.co_name in _COMPREHENSIONS):
    frame = frame.f_back
  if frame is None:
    return "?"
  return f"{frame.f_code.co_filename}:{frame.f_code.co_name}"


def _leaves(config, prefix=""):
  """(parent's key signature, key, dotted path) of every non-dict leaf."""
  sig = ",".join(sorted(config.keys()))
  for key in config.keys():
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield sig, key, prefix + key


def main(argv) -> int:
  if len(argv) < 2 or not any(a.startswith("--config=") for a in argv[1:]):
    print(__doc__)
    return 2
  module, args = argv[0], argv[1:]
  spec = next(a for a in args if a.startswith("--config="))[len("--config="):]
  path, _, arg = spec.partition(":")
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  leaves = list(_leaves(config_lib.load_config(path, arg or None)))

  reads = set()
  real = config_dict.ConfigDict.__getitem__

  def recording(self, key):
    caller = _caller()
    if not any(w in caller for w in _WALKERS):
      reads.add((",".join(sorted(self._fields.keys())), key))  # pylint: disable=protected-access
    return real(self, key)

  config_dict.ConfigDict.__getitem__ = recording
  sys.argv = [module] + args
  try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
  except SystemExit as e:
    print(f"{module} exited with {e.code}")
  finally:
    config_dict.ConfigDict.__getitem__ = real
  unread = [name for sig, key, name in leaves if (sig, key) not in reads]
  for name in unread:
    print(f"unread: {name}")
  print(f"{len(unread)} of {len(leaves)} keys of {spec} unread")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
