"""Checks a run makes before it builds anything: config values, workdir."""
from __future__ import annotations

import errno
import math
import os
import re

from absl import logging
import jax
import ml_collections
from etils import epath

from trm.core import best_metric as best_metric_lib
from trm.core import cli
from trm.core import config_record
from trm.core import loss_scale
from trm.core import metrics as metrics_lib
from trm.core import tpu_flags
from trm.core import wandb_writer
from trm.core import workdir_lock
from trm.nn import attention as attention_lib


class WorkdirError(OSError):
  """The workdir cannot be created or written."""


class EvalOnlyError(cli.UserError, ValueError):
  """config.eval_only on a workdir with nothing to evaluate."""


def starting_weights(config) -> str:
  """The config field naming weights a run starts from when its workdir
  holds no checkpoint ('' when it starts from a random init): DiffuCoder's
  and TRM's init_checkpoint, GPT's init_from='gpt2*' / 'resume' with
  init_checkpoint."""
  init_checkpoint = config.get("init_checkpoint", "")
  init_from = config.get("init_from", None)
  if not init_checkpoint:
    return ""
  if init_from is None:  # DiffuCoder, TRM: the weights named there
    return f"config.init_checkpoint={init_checkpoint!r}"
  if init_from != "scratch":
    return f"config.init_from={init_from!r}"
  return ""


def check_eval_only(config, workdir: str) -> None:
  """config.eval_only evaluates the workdir's newest checkpoint (or the
  weights the config starts from): on a workdir with neither it would
  only evaluate a random init. Refused in one line (EvalOnlyError) before
  anything is built or written."""
  if not config.get("eval_only", False) or starting_weights(config):
    return
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  checkpoints = epath.Path(workdir) / "checkpoints"
  if ckpt_lib.complete_steps(checkpoints):
    return
  raise EvalOnlyError(
      f"config.eval_only=True but the workdir {workdir} holds no complete "
      f"checkpoint ({checkpoints}), so there is nothing to evaluate (only a "
      "random init): pass the --workdir of a trained run, or set "
      "config.eval_only=False to train.")


def check_config(config) -> None:
  """Rejects values that would only fail (or misbehave) deep in the run:
  `check_values`, then what this host must have (W&B, a GPU for cuDNN).
  cuDNN on devices without it is named first: the families' checks of
  config.model would otherwise ask for its dtype on a host that cannot run
  it at all."""
  check_gpu_attention(config)
  check_values(config)
  wandb_writer.check_config(config)


def check_values(config) -> None:
  """The config's values on their own, wherever the run will be: also what
  `trm.aot` checks before it compiles a step for other devices."""
  from trm import families  # pylint: disable=g-import-not-at-top
  families.check_config(config)
  for key in ("total_steps", "eval_every", "log_every", "keep_checkpoints",
              "data.prefetch"):
    node = config
    for name in key.split("."):
      node = node[name]
    if node <= 0:
      raise ValueError(f"config.{key}={node} must be a positive integer.")
  for key in ("profiler_steps", "skip_first_n_steps_for_profiler"):
    # A negative window would never start (or never end) silently.
    if config.get(key, 0) < 0:
      raise ValueError(f"config.{key}={config[key]} must be >= 0"
                       + (" (0: no profile)." if key == "profiler_steps"
                          else "."))
  check_checkpoints_off(config)
  keep_every = config.get("keep_checkpoint_every", 0)
  if config.checkpoint_every and (keep_every < 0
                                  or keep_every % config.checkpoint_every):
    # Only saved steps can be kept: another period would keep the steps
    # that are multiples of both, far fewer than asked (big_vision asserts
    # the same of keep_ckpt_steps).
    raise ValueError(
        f"config.keep_checkpoint_every={keep_every} must be 0 (keep no step"
        " for good) or a multiple of config.checkpoint_every="
        f"{config.checkpoint_every} (only saved steps can be kept).")
  resume_step = config.get("resume_step", 0)
  if not _is_int(resume_step) or resume_step < 0:
    raise ValueError(f"config.resume_step={resume_step!r} must be a saved "
                     "step to resume from, or 0 (the newest).")
  if resume_step and config.get("eval_only", False):
    raise ValueError(
        f"config.resume_step={resume_step} with eval_only=True: eval_only "
        "evaluates the newest step and moves none aside. Set resume_step=0, "
        f"or read step {resume_step} with trm.evaluate's --step="
        f"{resume_step}.")
  check_early_stopping(config)
  check_epochs(config)
  best_metric_lib.check_config(config)
  if config.max_consecutive_bad_steps < 0:
    raise ValueError(
        f"config.max_consecutive_bad_steps={config.max_consecutive_bad_steps} "
        "must be >= 0 (0: never stop on non-finite steps).")
  for pattern, ok, want in _NUMBER_RANGES:
    for key, value in _numeric_fields(config, pattern):
      if not (math.isfinite(value) and ok(value)):
        raise ValueError(f"config.{key}={value} must be {want}.")
  check_warmup(config)
  data = config.get("data") or {}
  limit = data.get("max_eval_batches")
  if limit is not None and (limit == 0 or limit < -1):
    # 0 evaluates nothing: no eval loss, so always_save_checkpoint=False
    # would never save.
    raise ValueError(f"config.data.max_eval_batches={limit} must be -1 (the "
                     "whole test split) or >= 1.")
  if (config.checkpoint_every and not config.always_save_checkpoint
      and config.checkpoint_every % config.eval_every):
    # Such a step saves only when its evaluation beats the best: a
    # checkpoint step with no evaluation would never save (only the last).
    raise ValueError(
        f"config.checkpoint_every={config.checkpoint_every} must be a "
        f"multiple of config.eval_every={config.eval_every} with "
        "always_save_checkpoint=False (a step is saved only when its "
        "evaluation improves on the best); change one, or set "
        "always_save_checkpoint=True.")
  if data.get("eval_sheet_rows", 0) < 0:
    raise ValueError(f"config.data.eval_sheet_rows={data.eval_sheet_rows} "
                     "must be >= 0 (0: no sheet).")
  loss_scale.check_config(config)
  tpu_flags.parse(config.get("tpu_compiler_options", ""))
  warn_frozen_weights(config)


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def check_epochs(config) -> None:
  """config.num_epochs (0: config.total_steps as set; > 0: total_steps
  derived from the training data, `config_lib.total_steps_from_epochs`)."""
  epochs = config.get("num_epochs", 0)
  if (not isinstance(epochs, (int, float)) or isinstance(epochs, bool)
      or not math.isfinite(epochs) or epochs < 0):
    raise ValueError(f"config.num_epochs={epochs!r} must be a finite number "
                     ">= 0 (passes over the training data; 0: "
                     "config.total_steps as set).")
  if not epochs:
    return
  data = config.get("data") or {}
  if data.get("source") == "synthetic":
    # Endless hashed rows: no epoch to count.
    raise ValueError(
        f"config.num_epochs={epochs:g} with config.data.source='synthetic': "
        "synthetic data has no epochs; set config.total_steps instead.")
  model = config.get("model") or {}
  if model.get("name"):
    from trm import families  # pylint: disable=g-import-not-at-top
    if not getattr(families.task(model.name), "COUNTS_EPOCHS", False):
      # Its task never derives total_steps: num_epochs would do nothing.
      raise ValueError(
          f"config.num_epochs={epochs:g}: model family {model.name!r} does "
          "not count epochs of its data; set config.total_steps instead.")
  if config.get("compiled_step", ""):
    # trm.aot compiled the schedule of the config's total_steps.
    raise ValueError(
        f"config.num_epochs={epochs:g} with config.compiled_step: the step "
        "compiled ahead of time holds the schedule of config.total_steps, "
        "not of the steps derived from the data; set config.total_steps "
        "(the number trm.main logs for num_epochs) and compile again.")


def check_early_stopping(config) -> None:
  """config.early_stopping_patience (evaluations without improvement; 0:
  off) and early_stopping_threshold (the improvement that counts), as
  Hugging Face's EarlyStoppingCallback takes them; a threshold with the
  patience off would silently do nothing."""
  patience = config.get("early_stopping_patience", 0)
  threshold = config.get("early_stopping_threshold", 0.0)
  # A config file's value may be any type: 2.5 stopped after 3 evaluations
  # and True after 1 without a word, a string or None was a TypeError.
  if not _is_int(patience) or patience < 0:
    raise ValueError(
        f"config.early_stopping_patience={patience!r} must be an integer >= 0"
        " (the evaluations in a row without improvement that stop the run; "
        "0: never stop early).")
  if not (isinstance(threshold, (int, float)) and not isinstance(
      threshold, bool) and math.isfinite(threshold) and threshold >= 0):
    raise ValueError(
        f"config.early_stopping_threshold={threshold!r} must be a number >= 0 "
        "(how much lower than the best an eval/loss must be to count as an "
        "improvement).")
  if threshold and not patience:
    raise ValueError(
        f"config.early_stopping_threshold={threshold} does nothing with "
        "config.early_stopping_patience=0 (early stopping off): set a "
        "patience, or early_stopping_threshold=0.")


def check_warmup(config) -> None:
  """A warmup set both ways (warmup_ratio > 0 and warmup_steps, GPT's
  warmup_iters, > 0) is refused in one line: Hugging Face lets the steps
  win silently, and our configs' warmup steps are not 0 by default, so a
  ratio alone would be ignored."""
  for node, prefix in ((config, ""), (config.get("optim"), "optim.")):
    if not hasattr(node, "get") or not node.get("warmup_ratio", 0.0) > 0:
      continue
    key = "warmup_iters" if "warmup_iters" in node else "warmup_steps"
    if node.get(key, 0):
      raise ValueError(
          f"config.{prefix}warmup_ratio={node.warmup_ratio} and config."
          f"{prefix}{key}={node[key]} both set the warmup: set {key}=0 to "
          f"warm up over ceil(warmup_ratio x total_steps) = "
          f"{math.ceil(node.warmup_ratio * config.total_steps)} steps, or "
          "warmup_ratio=0.")


def check_checkpoints_off(config) -> None:
  """config.checkpoint_every=0 writes no checkpoint at all (MaxText's
  enable_checkpointing=False, Hugging Face's save_strategy="no"): not the
  final step's, nor one on preemption. A negative value, and the fields
  that only steer checkpoints when set to save fewer or keep more, are
  refused in one line: they would silently do nothing."""
  every = config.checkpoint_every
  if every < 0:
    raise ValueError(f"config.checkpoint_every={every} must be a positive "
                     "integer (or 0: write no checkpoint).")
  if every:
    return
  if config.get("keep_checkpoint_every", 0):
    raise ValueError(
        "config.checkpoint_every=0 writes no checkpoint, so config."
        f"keep_checkpoint_every={config.keep_checkpoint_every} has none to "
        "keep: set keep_checkpoint_every=0, or a positive checkpoint_every.")
  if not config.get("always_save_checkpoint", True):
    raise ValueError(
        "config.checkpoint_every=0 writes no checkpoint, not even the "
        "improving ones always_save_checkpoint=False keeps: set "
        "always_save_checkpoint=True, or a positive checkpoint_every.")


def check_no_checkpoints_to_ignore(config, workdir: str) -> None:
  """A run with config.checkpoint_every=0 starts from its starting weights
  and saves nothing, so in a workdir holding another run's checkpoints it
  would ignore them and overwrite that run's records (eval_<step>.json,
  which rank its checkpoints; config.json; metrics.jsonl): refused in one
  line, before anything is built or written. (MaxText with
  enable_checkpointing=False would start over silently; here a workdir is
  one run.) eval_only evaluates those checkpoints and writes none: it may."""
  if config.checkpoint_every or config.get("eval_only", False):
    return
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  checkpoints = epath.Path(workdir) / "checkpoints"
  steps = ckpt_lib.complete_steps(checkpoints)
  if steps:
    raise ValueError(
        f"config.checkpoint_every=0 writes and reads no checkpoint, but "
        f"{checkpoints} holds step(s) {', '.join(map(str, steps))} of "
        "another run, which this one would neither resume nor keep apart "
        "from: pass a new --workdir, or a positive checkpoint_every to "
        "resume them.")


# The peak rate of the main optimizer, by family: TRM and Dream keep it in
# config.optim.lr, GPT in nanoGPT's config.learning_rate.
_PEAK_RATES = ("optim.lr", "learning_rate")


def warn_frozen_weights(config) -> None:
  """A peak learning rate of 0 trains nothing. It stays allowed (it pins a
  run's weights, which some checks want), but a training run says so in one
  warning, since a dropped digit looks the same."""
  if config.get("eval_only", False):
    return
  for key in _PEAK_RATES:
    node = config
    for name in key.split("."):
      node = node.get(name) if hasattr(node, "get") else None
    if key == "learning_rate" and config.get("decay_lr", False) and (
        config.get("min_lr", 0) > 0):
      continue  # GPT's cosine rises from 0 to min_lr (nanoGPT's get_lr)
    if isinstance(node, (int, float)) and not isinstance(node, bool) \
        and node == 0:
      logging.warning(
          "config.%s=0: the weights will not change during training (set a "
          "positive rate to train, or config.eval_only=True to evaluate "
          "only).", key)


def check_gpu_attention(config) -> None:
  """config.model.attention='cudnn' (cuDNN flash attention) on devices other
  than NVIDIA GPUs: one line naming the field, before any data is built, as
  the TPU-only kernels are refused off TPU (`mesh.check_tpu_kernels`)."""
  model = config.get("model") or {}
  if model.get("attention") in attention_lib.GPU_KINDS:
    attention_lib.check_cudnn(jax.devices()[0].platform)


# Numbers checked wherever they sit in a config, by key: (key pattern,
# test of a finite value, what the value must be). Non-finite ones fail too.
_NUMBER_RANGES = (
    # An infinite or NaN rate makes every parameter non-finite in one step;
    # a negative one climbs the loss.
    (r"(^|_)lr$|learning_rate|weight_decay", lambda v: v >= 0,
     "a finite number >= 0"),
    (r"^warmup_(steps|iters)$", lambda v: v >= 0, ">= 0 (0: no warmup)"),
    # A negative norm bound scales every gradient by a negative factor.
    (r"^grad_clip(_norm)?$", lambda v: v >= 0,
     "a finite number >= 0 (0: no clipping)"),
    # Adam's denominator sqrt(v) + eps: a negative eps can make it zero.
    (r"^eps$", lambda v: v >= 0, "a finite number >= 0"),
    # The cosine's floor as a fraction of the peak: below 0 the rate turns
    # negative at the end of the run (gradient ascent).
    (r"^lr_min_ratio$", lambda v: 0 <= v <= 1,
     "in [0, 1] (1.0: a constant rate after warmup)"),
    # Adam's betas and EMA decay rates: Adam's bias correction divides by
    # 1 - beta**t (beta = 1: a division by zero at the first step); above 1
    # the averages grow without bound.
    (r"^beta\d$|(^|_)ema_(rate|decay)$", lambda v: 0 <= v < 1,
     "a number in [0, 1)"),
    # numpy's generators (data order, dataset builders) refuse a negative
    # seed, after the data is built; JAX's keys keep only the low 32 bits
    # (seed 2**32 would initialise as seed 0 does).
    (r"^seed$", lambda v: v == int(v) and 0 <= v < 2**32,
     "an integer in [0, 2**32 - 1]"),
    # torch's cross_entropy refuses a smoothing outside [0, 1]; past 1 the
    # label's own weight turns negative. A negative z-loss rewards a large
    # log-normaliser.
    # Hugging Face's warmup_ratio: a share of the run's steps.
    (r"^warmup_ratio$", lambda v: 0 <= v <= 1,
     "in [0, 1] (0: the warmup is set in steps)"),
    (r"^label_smoothing$", lambda v: 0 <= v <= 1,
     "in [0, 1] (0: none, torch's label_smoothing)"),
    (r"^z_loss$", lambda v: v >= 0,
     "a finite number >= 0 (0: none; MaxText's z_loss_multiplier)"),
    (r"^data_seed$", lambda v: v == int(v) and -1 <= v < 2**32,
     "-1 (follow config.seed) or an integer in [0, 2**32 - 1]"),
)


def _numeric_fields(node, pattern: str, prefix=""):
  """(dotted key, value) of every number whose key matches `pattern`."""
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _numeric_fields(value, pattern, f"{prefix}{key}.")
    elif (isinstance(value, (int, float)) and not isinstance(value, bool)
          and re.search(pattern, key)):
      yield prefix + key, value


# What the trainer writes at the top of its workdir: files it replaces whole
# (a record of the config, of its changes, of an evaluation; the lock) and
# the directories of an evaluation's outputs (sheets, submissions).
_RUN_FILES = {config_record.RECORD: "config record",
              config_record.HISTORY: "record of config changes",
              workdir_lock.LOCK_NAME: "workdir lock",
              metrics_lib.JSONL_NAME: "metrics as JSON lines"}
_EVAL_RECORD = re.compile(r"eval_(\d+)\.json")
_EVAL_OUTPUTS = re.compile(r"eval_(\d+)")


def is_run_record(name: str) -> bool:
  """Whether `name` is one of the files the run replaces whole at the top of
  its workdir (its lock aside, which is made otherwise)."""
  return (name in _RUN_FILES and name != workdir_lock.LOCK_NAME
          or bool(_EVAL_RECORD.fullmatch(name)))


def remove_unfinished_writes(workdir: str) -> list[str]:
  """Removes the temporary files of the run's records (eval_<step>.json,
  config.json) and evaluation outputs (eval_<step>/) that a run killed
  inside `atomic_write` left; returns their paths. Only the run's own: a
  dataset may be built into the workdir. Local workdirs only; call holding
  the workdir lock."""
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  if "://" in workdir:
    return []
  removed = atomic_files.remove_temporaries(workdir, is_run_record)
  for name in sorted(os.listdir(workdir)):
    if _EVAL_OUTPUTS.fullmatch(name):
      removed += atomic_files.remove_temporaries(os.path.join(workdir, name))
  return removed


def check_run_file_kinds(workdir: str) -> None:
  """A WorkdirError naming the first of the workdir's own names held by the
  wrong kind of thing (a directory where the run replaces a file, a file
  where it fills a directory). Found where it was written, it stopped the
  run as a bare "[Errno 21] Is a directory" or "[Errno 17] File exists",
  after the steps since the last checkpoint were trained (an evaluation's
  record is written before that step's save). Local workdirs only."""
  if "://" in workdir or not os.path.isdir(workdir):
    return
  for entry in sorted(os.scandir(workdir), key=lambda e: e.name):
    record = _EVAL_RECORD.fullmatch(entry.name)
    outputs = _EVAL_OUTPUTS.fullmatch(entry.name)
    if entry.name in _RUN_FILES or record:
      what = (_RUN_FILES.get(entry.name)
              or f"record of step {record.group(1)}'s evaluation")
      # An evaluation's record is only replaced (os.replace takes the place
      # of a link or a FIFO) or read as a checked record; the others are
      # also opened as they are (a FIFO for a lock: the read hung).
      if entry.is_file() or record and not entry.is_dir(
          follow_symlinks=False):
        continue
      found, kind = ("a directory" if entry.is_dir() else
                     "not a regular file"), "file"
    elif outputs:
      what = f"outputs of step {outputs.group(1)}'s evaluation"
      if entry.is_dir():
        continue
      found, kind = "not a directory", "directory"
    else:
      continue
    raise WorkdirError(
        f"{entry.path} is {found}: the run keeps its {what} there (a "
        f"{kind}). Move it away (or pass another --workdir) and rerun; "
        "nothing was changed.")


def missing_directories(workdir: str) -> list[str]:
  """The local directories `check_workdir` will create for `workdir` (it
  and its missing parents), deepest first; none for a `gs://` one."""
  if "://" in workdir:
    return []
  missing, path = [], os.path.abspath(workdir)
  while not os.path.lexists(path):
    missing.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


def remove_if_empty(directories: list[str]) -> None:
  """Removes `directories` (deepest first) while they are empty: a run that
  failed before writing anything leaves no new empty workdir. rmdir never
  removes a directory that holds anything (another process's file, a
  later trainer's lock)."""
  for path in directories:
    try:
      os.rmdir(path)
    except OSError:  # not empty, gone, or not ours to remove
      return


def check_workdir(workdir: str, config=None) -> epath.Path:
  """Creates the workdir and writes a file into it (every process, since
  each writes its checkpoint shards), so an unwritable one fails now rather
  than at the first checkpoint.

  First, with the run's `config`, `check_eval_only`; then
  `check_run_dirs_writable`."""
  path = epath.Path(workdir)
  checkpoints = path / "checkpoints"
  if checkpoints.exists() and not checkpoints.is_dir():
    # Found only after the data was built, as a bare "[Errno 20] Not a
    # directory".
    raise WorkdirError(
        f"{checkpoints} is not a directory: the run keeps its checkpoints "
        "there. Move it away (or pass another --workdir) and rerun.")
  check_run_file_kinds(workdir)
  if config is not None:
    check_eval_only(config, workdir)
    check_no_checkpoints_to_ignore(config, workdir)
  _write_probe(path, f"the workdir {workdir!r}",
               "checkpoints, metrics and config.json go there", mkdir=True)
  # What a resumed run writes into, not beside: read-only (a copied run, a
  # `chmod -R a-w` undone at the top only), a new checkpoint failed at the
  # first save, after the compile and the steps before it, and the
  # metrics were a bare "[Errno 13] Permission denied".
  if checkpoints.is_dir() and not (config is not None
                                  and config.get("eval_only", False)):
    _write_probe(checkpoints, str(checkpoints),
                 "this run saves its checkpoints there")
  if config is not None:
    check_run_dirs_writable(config, workdir)
  metrics = os.path.join(workdir, metrics_lib.JSONL_NAME)
  if ("://" not in workdir and os.path.isfile(metrics)
      and (config is None or config.get("metrics_jsonl", True))
      and jax.process_index() == 0):
    try:
      open(metrics, "a", encoding="utf-8").close()  # appends nothing
    except OSError as e:
      raise WorkdirError(
          f"Cannot append to {metrics} ({type(e).__name__}: {e}); this run "
          "adds its metrics to it. Make it writable to resume there, set "
          "config.metrics_jsonl=False, or pass another --workdir.") from e
  return path


def check_run_dirs_writable(config, workdir: str) -> None:
  """A `WorkdirError` naming the first read-only directory in a writable
  workdir that this run may have to change: a step of checkpoints/ (keep-N
  deletes it after a later save, config.resume_step moves it aside, a
  resume writes its ranking into it; those every
  config.keep_checkpoint_every steps are kept as they are), or the outputs
  folder eval_<N>/ of a step it evaluates again or moves aside (N at least
  the newest step, or config.resume_step). Found where the run changed
  them, a read-only step was a save's failure after the training (the new
  step saved, the line naming the writable checkpoints/), a read-only
  outputs folder a bare "[Errno 13] Permission denied" after the training,
  before that step's save. Local workdirs only."""
  if "://" in workdir:
    return
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  checkpoints = os.path.join(workdir, "checkpoints")
  rewind = config.get("resume_step", 0)
  keep_every = config.get("keep_checkpoint_every", 0)
  # Steps kept for good are never deleted, unless a rewind moves them.
  kept = lambda step: (  # noqa: E731
      keep_every and step % keep_every == 0 and not step > rewind > 0)
  path = (None if config.get("eval_only", False) else
          ckpt_lib.read_only_step(checkpoints, exempt=kept))
  if path:
    blocked = ckpt_lib.read_only_directory(path)
    raise WorkdirError(
        f"{path} is read-only"
        + (f" ({blocked} inside it)" if blocked != path else "")
        + ": this run may delete that step (config.keep_checkpoints="
        f"{config.get('keep_checkpoints', '?')} keeps the newest and the "
        "best), move it aside (config.resume_step) or write its ranking "
        "into it, and would fail there after training. Make it writable "
        f"(chmod -R u+w {path}) or move it out of {checkpoints}, then "
        "rerun; nothing was changed.")
  complete = ckpt_lib.complete_steps(checkpoints)
  first = rewind or (complete[-1] if complete else 0)
  for name in sorted(os.listdir(workdir)):
    outputs = _EVAL_OUTPUTS.fullmatch(name)
    path = os.path.join(workdir, name)
    if (outputs and int(outputs.group(1)) >= first and os.path.isdir(path)
        and not ckpt_lib.can_change_entries(path)):
      raise WorkdirError(
          f"{path} is read-only: this run may write step "
          f"{outputs.group(1)}'s evaluation outputs into it again (or move "
          "it aside, config.resume_step), and would fail there after "
          "training. Make it writable (chmod -R u+w) or move it away, then "
          "rerun; nothing was changed.")


def _write_probe(path: epath.Path, named: str, why: str,
                 mkdir: bool = False) -> None:
  """Writes and removes a file in `path` (each process its own), or raises
  a `WorkdirError` naming it (`named`), saying why it must be writable
  (`why`) and what to do."""
  probe = path / f".write_test.{jax.process_index()}"
  existed = False
  try:
    existed = path.is_dir()  # EACCES on a parent raises
    if mkdir:
      path.mkdir(parents=True, exist_ok=True)
    probe.write_text("ok")
    # Gone already: a second trainer starting on this workdir wrote and
    # removed the same name (the workdir lock refuses one of them next).
    probe.unlink(missing_ok=True)
  except Exception as e:  # pylint: disable=broad-except
    try:  # created before the write failed (a full disk): not left behind
      probe.unlink(missing_ok=True)
    except Exception:  # pylint: disable=broad-except
      pass
    full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
    raise WorkdirError(
        f"Cannot write to {named} ({type(e).__name__}: {e}); {why}. "
        + ("Free space there or pass another --workdir." if full else
           "Make it writable or pass another --workdir." if existed else
           "Pass a writable --workdir.")) from e
