"""Helpers shared by the config files in `configs/`."""
from __future__ import annotations

import math
import os
import re

import ml_collections
from trm.core import foreign_names
from trm.core import tpu_flags

# XLA:TPU options of the train step (TPU meshes only; trm.core.tpu_flags).
TPU_COMPILER_OPTIONS = tpu_flags.DEFAULT


def parse_variants(arg: str | None, allowed: set[str]) -> set[str]:
  """'cpu,att' -> {'cpu', 'att'}; unknown names are a clear error."""
  names = {a.strip() for a in (arg or "").split(",") if a.strip()}
  unknown = names - allowed
  if unknown:
    raise ValueError(f"Unknown config variant(s) {sorted(unknown)}; choose "
                     f"from {sorted(allowed)} (e.g. --config=FILE.py:cpu).")
  return names


def integer_text(value: int, max_digits: int = 30) -> str:
  """`value` in decimal, or "<an integer of N digits>" past `max_digits`
  (a crafted setting can be thousands of digits long; str() refuses one
  past 4,300 digits, whose count is then taken from its bit length)."""
  value = int(value)
  if value.bit_length() < 14000:  # under 4,215 digits
    text = str(abs(value))
    if len(text) <= max_digits:
      return str(value)
    return f"<an integer of {len(text):,} digits>"
  return f"<an integer of about {int(value.bit_length() * 0.30103):,} digits>"


def is_number(value) -> bool:
  """A real number a float holds: a Python or numpy int or float, not a
  bool, and no integer of 309 digits or more (float() and math.isfinite
  raise OverflowError there, not ValueError)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  if (not isinstance(value, (int, float, np.integer, np.floating))
      or isinstance(value, (bool, np.bool_))):
    return False
  try:
    float(value)
  except OverflowError:
    return False
  return True


def model_kwargs(model_config, config_class, family: str) -> dict:
  """`config.model` as keyword arguments of the family's config dataclass;
  a key the model does not know is a one-line error naming it."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  kwargs = dict(model_config)
  kwargs.pop("name", None)
  known = sorted(f.name for f in dataclasses.fields(config_class))
  unknown = sorted(set(kwargs) - set(known))
  if unknown:
    which = "this key" if len(unknown) == 1 else "these keys"
    raise ValueError(
        f"{', '.join('config.model.' + k for k in unknown)}: model {family!r}"
        f" does not know {which}; known: {', '.join(known)}.")
  return kwargs


def data_seed(config) -> int:
  """The seed of the data's draws (training order, GPT's windows):
  config.data_seed, or config.seed where it is -1 or absent (MaxText's
  data_shuffle_seed, Hugging Face's data_seed). Initialisation and the
  model's noise (dropout, masks, ACT exploration) keep config.seed."""
  seed = config.get("data_seed", -1)
  return config.seed if seed == -1 else seed


def warmup_steps(node, total_steps: int, key: str = "warmup_steps") -> int:
  """The warmup's length in steps: `node[key]` (config.optim.warmup_steps,
  GPT's config.warmup_iters), or, where node.warmup_ratio r > 0, Hugging
  Face's ceil(r * total_steps) (`run_checks` refuses both set)."""
  ratio = node.get("warmup_ratio", 0.0)
  return math.ceil(ratio * total_steps) if ratio else node[key]


def total_steps_from_epochs(config, steps_per_epoch: float,
                            epoch: str) -> None:
  """Where config.num_epochs > 0 (Hugging Face's num_train_epochs; 0, the
  default: config.total_steps as set), sets config.total_steps (and
  nanoGPT's max_iters, tied to it) to ceil(num_epochs x steps_per_epoch)
  and says so in one line; `epoch` says what one epoch is. Called by a
  family's task once it has read its training data, before anything
  reads total_steps (the schedule, the data's length, the loop's cadence
  and the run's config record)."""
  epochs = config.get("num_epochs", 0)
  if not epochs:
    return
  # Rounded first: 0.1 x 30 batches is 3 steps, not ceil(3.0000000000000004).
  total = max(1, math.ceil(round(epochs * steps_per_epoch, 6)))
  with config.unlocked():
    config.total_steps = total
  from absl import logging  # pylint: disable=g-import-not-at-top
  logging.info("config.num_epochs=%g: config.total_steps=%d (%s).", epochs,
               total, epoch)


def default_logical_axis_rules():
  """Logical axis -> mesh axes, ordered, first match wins.

  Batch over data x fsdp; weights' model width over fsdp (ZeRO-3 style) and
  their inner widths (MLP, heads, vocabulary) over model (tensor parallel).
  The puzzle-embedding table is split by columns: its row count (876,406 for
  ARC-AGI-1) rarely divides a mesh axis, its width (512) does, and a column
  split keeps lookups and sparse updates local to each device.
  """
  return (
      ("activation_batch", ("data", "fsdp")),
      ("activation_length", None),
      ("activation_embed", None),
      ("activation_heads", "model"),
      ("embed", "fsdp"),
      ("mlp", "model"),
      ("heads", "model"),
      ("vocab", "model"),
      ("token", None),
      ("token_mlp", "model"),
      ("puzzle", None),
      ("puzzle_embed", "fsdp"),
      ("kv_heads", None),   # 4 key/value heads (Qwen2-7B): rarely divisible
      ("head_dim", None),
      ("layers", None),     # the stacked axis of scanned layers
  )


def mesh_config(data: int = -1, fsdp: int = 1, model: int = 1,
                dcn_data: int = 1) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      data=data,      # data-parallel size inside a slice (-1: the rest)
      fsdp=fsdp,      # fully-sharded data-parallel size inside a slice
      model=model,    # tensor-parallel size inside a slice
      dcn_data=dcn_data,  # number of slices, data parallel across them
      dcn_fsdp=1,     # fsdp across slices (rarely useful)
      dcn_model=1,    # tensor parallel across slices (rarely useful)
  ))


def wandb_config(enabled=False, project="trm",
                 name="") -> ml_collections.ConfigDict:
  """The Weights & Biases writer's knobs (`trm/core/wandb_writer.py`)."""
  return ml_collections.ConfigDict(dict(
      enabled=enabled,  # also log metrics to W&B (pip install -e .[wandb])
      project=project,  # W&B project
      entity="",        # W&B team or user; '' = your default entity
      name=name,        # run name; '' = W&B picks one
      mode="online",    # online | offline (sync later) | disabled
  ))


def loss_scale_config() -> ml_collections.ConfigDict:
  """Dynamic loss scaling, used when model.dtype='float16' (trm/core/loss_scale.py)."""
  return ml_collections.ConfigDict(dict(
      initial=2.0**15,        # starting scale (float; a power of two)
      growth_interval=2000,   # finite steps in a row before it doubles
  ))


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file, as `--config=path:arg` would give it
  (for tests, benchmarks and notebooks)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"trm_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def set_values(config: ml_collections.ConfigDict, values: dict):
  """Sets dotted keys ({'data.path': ...}) as --config.key=value would.

  A key the config does not define, or a value of the wrong type, is a
  ValueError naming `config.<key>`.
  """
  for key, value in values.items():
    node = config
    *path, last = key.split(".")
    for depth, name in enumerate(path + [last]):
      if not isinstance(node, ml_collections.ConfigDict) or name not in node:
        where = ".".join(["config"] + (path + [last])[:depth])
        known = (sorted(node.keys()) if isinstance(node,
                                                   ml_collections.ConfigDict)
                 else [])
        raise ValueError(f"config.{key}: {where} has no field {name!r}"
                         + (f"; its fields are {known}" if known else "")
                         + ". Only fields the config file defines can be set.")
      if depth < len(path):
        node = node[name]
    try:
      node[last] = value
    except (TypeError, ValueError):
      raise ValueError(
          f"config.{key}={value!r} has the wrong type: config.{key} holds "
          f"type {type(node[last]).__name__}, not {type(value).__name__}."
      ) from None
  return config


def _unknown_flag_message(error, flag_values) -> str | None:
  """One line for a flag the tool does not define whose name is a field of
  the loaded --config (nanoGPT's `--max_iters=2000`: here
  `--config.max_iters`) or one of nanoGPT's flags with no counterpart of
  that name; None for other flag errors. absl's own line suggested
  --log_dir (absl's logging directory) for nanoGPT's --out_dir."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not isinstance(error, flags.UnrecognizedFlagError):
    return None
  name = error.flagname
  hint = (foreign_names.nanogpt_hint(name, flag_values)
          or foreign_names.generate_hint(name, flag_values))
  if hint is None and "config" in flag_values:
    config = flag_values["config"].value
    if (isinstance(config, ml_collections.ConfigDict) and name in config
        and not isinstance(config[name], ml_collections.ConfigDict)):
      hint = f"it is a config field: set it with --config.{name}=VALUE"
  if hint is None and "workdir" in flag_values:
    # A trainer's flag only where the tool trains (trm.main): trm.generate's
    # own --steps is another thing.
    hint = foreign_names.other_trainer_hint(name, flag_values)
  if hint is None:
    return None
  return f"Unknown command line flag {name!r}: {hint}"


def _config_override_error(error: Exception, argv,
                           flag_values=None) -> str | None:
  """The one-line message for ml_collections' error on a --config.KEY=VALUE
  that names no field (a KeyError wrapped in an AttributeError), or None.
  With the tool's `flag_values`, a nanoGPT flag's name (`--config.out_dir`)
  also says what replaces it."""
  inner = error
  while inner.args and isinstance(inner.args[0], BaseException):
    inner = inner.args[0]
  text = str(inner.args[0] if inner.args else inner)
  name, _, hint = text.partition("\n")
  name = name.strip("'\"")
  overrides = [a.split("=", 1)[0] for a in argv[1:]
               if a.startswith("--config.")]
  named = [flag for flag in overrides if name in flag.split(".")[1:]]
  if not named:
    return None
  nanogpt = None
  if flag_values:
    nanogpt = foreign_names.nanogpt_hint(name, flag_values)
    if nanogpt is None and named[0] == f"--config.{name}":
      # A top-level name only: config.model.steps is no MaxText name.
      nanogpt = foreign_names.other_trainer_hint(name, flag_values)
  return (f"{named[0]}: the config has no field {name!r}"
          + (f" ({hint.strip()})" if hint.strip() else "")
          + "; --config.KEY=VALUE only sets fields the config file defines"
          + (f" ({nanogpt})." if nanogpt else "."))


# Python's conversion errors, as ml_collections' config flags pass them on
# for a value of the wrong type, and the type each one means.
_CONVERSION_ERRORS = (
    (re.compile(r"invalid literal for int\(\) with base 10: "), "an integer"),
    (re.compile(r"could not convert string to float: "), "a number"),
    (re.compile(r"\('Non-boolean argument to boolean flag', "),
     "true or false"),
)
_FLAG_VALUE = re.compile(r"flag --(config[\w.]*)=(.*?): (.*)", re.DOTALL)


def _config_file_error(text: str) -> str:
  """ml_collections reports an exception raised by a config file (e.g. an
  unknown variant) with its whole traceback; keep the flag and the error.
  A value of the wrong type is said in the field's type (Python's own
  words, "invalid literal for int()", named the value only)."""
  match = _FLAG_VALUE.fullmatch(text)
  if match:
    key, value, reason = match.groups()
    for pattern, kind in _CONVERSION_ERRORS:
      if pattern.match(reason):
        return f"flag --{key}={value}: {key} takes {kind}, not {value!r}"
  if "Traceback (most recent call last)" not in text:
    return text
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return f"{lines[0]} {lines[-1]}"


_HELP_FLAGS = ("--help", "--helpshort", "--helpfull", "--helpxml", "-?")


def _asks_for_help(argv) -> bool:
  return any(arg.split("=", 1)[0] in _HELP_FLAGS for arg in argv[1:])


def _flag_values(argv, name: str):
  """The values `argv` gives flag `name`, in absl's spellings (`--name=V`,
  `-name=V`, `--name V`), up to a `--` (past it absl reads no flag)."""
  args = list(argv[1:])
  for i, arg in enumerate(args):
    if arg == "--":
      return
    if not arg.startswith("-"):
      continue
    given, equals, value = arg.lstrip("-").partition("=")
    if given != name:
      continue
    if equals:
      yield value
    elif i + 1 < len(args):
      yield args[i + 1]


def _missing_config_file(argv) -> str | None:
  """ml_collections reads --config lazily, so a missing file would only
  fail after jax has started, with a chained traceback; name it now. A
  path that is no regular file is refused too (a FIFO would block the
  read), and said as what it is."""
  import os  # pylint: disable=g-import-not-at-top
  for value in _flag_values(argv, "config"):
    path = value.split(":", 1)[0]
    if path and not os.path.isfile(path):
      example = "e.g. --config=configs/trm_sudoku.py"
      if os.path.isdir(path):
        return (f"--config={path}: a directory, not a config file; name "
                f"one of its Python files, {example}")
      if os.path.exists(path):
        return (f"--config={path}: not a regular file (a device, FIFO or "
                f"socket); pass a Python config file, {example}")
      return (f"--config={path}: no such config file (relative paths start"
              f" from {os.getcwd()}); {example}")
  return None


def _piped_flagfile(argv, flag_values) -> str | None:
  """A --flagfile that is a pipe (a shell's `<(...)`), FIFO or socket, in
  a tool with a --config: ml_collections reads every flagfile when
  --config is defined, for the overrides it names, and absl reads it again
  when it parses, so a pipe's flags reached only the first reader (the
  parse then said "Unknown command line flag 'config.total_steps'"). A
  file that reads the same twice (/dev/null) passes."""
  import os  # pylint: disable=g-import-not-at-top
  import stat  # pylint: disable=g-import-not-at-top
  if "config" not in flag_values:
    return None
  for value in _flag_values(argv, "flagfile"):
    try:
      mode = os.stat(os.path.expanduser(value)).st_mode
    except OSError:
      continue  # absl names a missing one
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
      return (f"--flagfile={value}: a pipe (such as a shell's <(...)) or "
              "FIFO; its flags are read twice (for --config's overrides, "
              "then by the parse), so write them to a file and pass that")
  return None


def _config_load_error(error: BaseException, argv) -> str | None:
  """The one-line message for an exception raised while ml_collections
  loads a --config file (a SyntaxError, ImportError, NameError, a missing
  get_config, ...: it wraps only TypeError and ValueError), or None if the
  exception did not come from loading one."""
  import traceback  # pylint: disable=g-import-not-at-top
  frames = traceback.extract_tb(error.__traceback__)
  if not any(f.filename.endswith("config_flags.py") and f.name == "parse"
             for f in frames):
    return None
  paths = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  flag = f"--config={paths[-1]}" if paths else "--config"
  path = paths[-1].split(":", 1)[0] if paths else ""
  where = ""
  if isinstance(error, SyntaxError) and error.lineno:
    where = f" (line {error.lineno})"
  else:
    lines = [f.lineno for f in frames
             if path and os.path.abspath(f.filename) == os.path.abspath(path)]
    if lines:
      where = f" (line {lines[-1]})"
  what = " ".join(str(getattr(error, "msg", None) or error).split())
  return (f"{flag}: loading the config file failed{where}: "
          f"{type(error).__name__}: {what}. Fix the file; it must define "
          "get_config(arg=None) returning an ml_collections.ConfigDict")


def _not_a_config(argv) -> str | None:
  """A --config file whose get_config() returned something that is not a
  ConfigDict (e.g. a plain dict): every field lookup would fail later with
  an AttributeError traceback."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  if "config" not in flags.FLAGS:
    return None
  holder = flags.FLAGS["config"]
  if type(holder.parser).__name__ != "ConfigFileFlagParser":
    return None
  value = holder.value
  if value is None or isinstance(value, ml_collections.ConfigDict):
    return None
  if type(value).__name__ == "_ErrorConfig":  # ml_collections' deferred IOError
    return None
  paths = [a.split("=", 1)[1] for a in argv[1:] if a.startswith("--config=")]
  flag = f"--config={paths[-1]}" if paths else "--config"
  return (f"{flag}: get_config() returned a {type(value).__name__}, not an "
          "ml_collections.ConfigDict; return one (ml_collections.ConfigDict"
          "(...))")


def _stored_field(config, path: str):
  """What `config` holds at the dotted `path` (a FieldReference where the
  config file tied the field to another), or None."""
  node = config
  for name in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      return None
    node = node._fields.get(name)  # pylint: disable=protected-access
  return node


def _conflicting_aliases(flag_values=None) -> str | None:
  """Two --config.KEY=VALUE overrides of fields the config file ties
  together (one FieldReference, e.g. nanoGPT's max_iters and the trainer's
  total_steps) with different values: the later one would silently win,
  the earlier one dropped. `flag_values`: absl's FLAGS unless given."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if "config" not in flag_values:
    return None
  holder = flag_values["config"]
  if not holder.present:  # an optional --config left out (trm.generate)
    return None
  values = getattr(holder, "override_values", None) or {}
  config = holder.value
  if not isinstance(config, ml_collections.ConfigDict) or len(values) < 2:
    return None
  seen = {}  # id of the shared reference -> (path, value) first given
  for path, value in values.items():
    stored = _stored_field(config, path)
    if not isinstance(stored, ml_collections.FieldReference):
      continue
    first = seen.setdefault(id(stored), (path, value))
    if first[0] != path and first[1] != value:
      return (f"--config.{first[0]}={first[1]!r} and --config.{path}="
              f"{value!r} set the same field (the config file ties "
              f"config.{first[0]} and config.{path} together), so one value"
              " would be dropped; give one of them, or both the same value.")
  return None


def _epochs_and_steps(flag_values=None) -> str | None:
  """config.num_epochs > 0 with a --config.total_steps override (or one of a
  field the config file ties to it, nanoGPT's max_iters): num_epochs sets
  the run's length, so the given step count would be dropped silently."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if "config" not in flag_values or not flag_values["config"].present:
    return None
  config = flag_values["config"].value
  values = getattr(flag_values["config"], "override_values", None) or {}
  if not isinstance(config, ml_collections.ConfigDict):
    return None
  epochs = config.get("num_epochs", 0)
  if not isinstance(epochs, (int, float)) or not epochs:
    return None
  steps = _stored_field(config, "total_steps")
  for path in values:
    if path == "total_steps" or (
        isinstance(steps, ml_collections.FieldReference)
        and _stored_field(config, path) is steps):
      return (f"--config.{path}={values[path]!r} and config.num_epochs="
              f"{epochs!r} both set the run's length: num_epochs derives "
              "config.total_steps from the training data (the config file's "
              "total_steps is then unused); drop one of them (num_epochs=0: "
              "the steps as given).")
  return None


def _past_int64(value):
  """The first integer in `value` (nested tuples, lists and dicts) outside
  int64's range, or None."""
  if isinstance(value, int) and not isinstance(value, bool):
    return value if not -2**63 <= value < 2**63 else None
  items = value.values() if isinstance(value, dict) else (
      value if isinstance(value, (tuple, list)) else ())
  for item in items:
    found = _past_int64(item)
    if found is not None:
      return found
  return None


def _integers_past_int64(flag_values=None) -> str | None:
  """A --config.KEY=VALUE integer outside int64's range: every integer
  setting ends in an int64 or a float, and float() of one past 1e308
  raised OverflowError tracebacks (seed, total_steps, global_batch_size,
  model sizes)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  flag_values = flags.FLAGS if flag_values is None else flag_values
  if "config" not in flag_values or not flag_values["config"].present:
    return None
  values = getattr(flag_values["config"], "override_values", None) or {}
  for path, value in values.items():
    found = _past_int64(value)
    if found is not None:
      return (f"--config.{path}: {integer_text(found)} is outside the "
              "64-bit integer range (+-9.2e18) that every integer setting "
              "is held in; pass a smaller value.")
  return None


def parse_flags(argv):
  """absl `flags_parser` for the command-line tools (`app.run(main,
  flags_parser=config_lib.parse_flags)`). Flag errors stay one line: a
  --config.KEY=VALUE naming no config field names the flag (ml_collections
  raises a chained KeyError traceback), and an error raised by the config
  file itself is shown without its traceback. Every tool says it the same
  way as its other input errors: `<tool>: error: ...`, exit 2."""
  import sys  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  message = None
  try:
    message = (None if _asks_for_help(argv)
               else _piped_flagfile(argv, flags.FLAGS))
    if message is None:
      # --flagfile's lines, here: the check below then sees a --config
      # given in one (a FIFO there blocked absl's parse); absl finds no
      # --flagfile left to read again.
      argv = [argv[0]] + flags.FLAGS.read_flags_from_files(argv[1:],
                                                           force_gnu=False)
      # Before parsing: a --config.KEY override, or a variant after the
      # path, makes ml_collections read the file there (a missing one's
      # OSError traceback; a FIFO blocked the read). Not when help is
      # asked for: absl prints it during the parse, whatever --config
      # names.
      message = None if _asks_for_help(argv) else _missing_config_file(argv)
    if message is None:
      parsed = flags.FLAGS(argv)
      message = (_not_a_config(argv) or _integers_past_int64()
                 or _conflicting_aliases() or _epochs_and_steps())
      if message is None:
        return parsed
  except flags.Error as e:
    message = (_unknown_flag_message(e, flags.FLAGS)
               or _config_file_error(str(e)))
  except Exception as e:  # pylint: disable=broad-except
    message = (_config_override_error(e, argv, flags.FLAGS)
               if isinstance(e, (AttributeError, KeyError)) else None)
    if message is None:
      message = _config_load_error(e, argv)
    from trm.core import cli  # pylint: disable=g-import-not-at-top
    if message is None or cli.traceback_requested(argv):
      raise
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  sys.stderr.write(f"{cli.tool_name()}: error: {message} (--helpshort "
                   "lists the flags)\n")
  sys.exit(2)
