"""The run's record of its config: `config.json` says how its steps were
trained, so a resume may not silently change that.

The first run writes `config.json`; it is never overwritten while the run
has checkpoints. A resume compares its config with it: a change of a field
that alters the trajectory (model, optimizer, schedule, data, seed, batch;
everything not in `HARMLESS`) is refused before anything is restored,
listing the changed fields, unless `--config.allow_config_change=True`; a
change of the checkpoints' layout (`LAYOUT`) or of the optimizer, whose
state they hold (`OPTIMIZER`), is refused even then.
Every change, harmless or accepted, is appended to `config_history.jsonl`
beside it (time, step, {field: [recorded, new]}); an accepted one is also
said in one warning.

The record also travels in every checkpoint (the step's metadata, see
`trm.core.checkpoint.save`; after an accepted change, the config the step
was trained with), and a resume compares against the newest checkpoint's
copy: a deleted, damaged or edited `config.json` cannot let a
changed config through. A missing or damaged `config.json` is then
rewritten from the checkpoint's record (one warning line naming the file).
Checkpoints written before records travelled with them fall back to
`config.json`; a damaged one then stops the run with one line naming it.
"""
from __future__ import annotations

import json
import time

from absl import logging
from etils import epath

from trm.data import atomic_files

RECORD = "config.json"
HISTORY = "config_history.jsonl"

# Fields that change how a run is watched, saved or laid out on devices, or
# which kernel computes the same math, never which updates it makes
# (restores across meshes are bitwise). A run recorded before one of them
# existed resumes too (its record lacks the key).
HARMLESS = (
    "allow_config_change", "checkpoint_every", "eval_every", "log_every",
    "keep_checkpoints", "max_consecutive_bad_steps", "data.prefetch",
    "data.eval_batch_size", "data.max_eval_batches", "data.eval_sheet_rows",
    "eval_interval", "log_interval", "eval_iters", "eval_only",
    "eval_at_start",
    "always_save_checkpoint", "init_from", "init_checkpoint",
    "logical_axis_rules", "model.remat", "model.remat_policy",
    "model.remat_save", "model.remat_offload", "model.attention",
    "model.qkv_projection", "model.mlp_kernel", "model.norm_kernel",
    "loss_kernel", "wandb_log", "wandb_project", "wandb_run_name",
    "tpu_compiler_options", "compiled_step", "reduce_gradients_once",
    "loss_reduce_once",
    "profiler_steps", "skip_first_n_steps_for_profiler",
    "keep_checkpoint_every", "metrics_jsonl", "resume_step",
    "early_stopping_patience", "early_stopping_threshold",
    # Its total_steps, derived from the data, is recorded and compared.
    "num_epochs", "best_metric", "best_metric_mode")
# loss_scale.*: the scale itself is checkpointed state (float16 runs); its
# knobs only steer how it moves, and runs recorded before they existed
# resume.
HARMLESS_PREFIXES = ("mesh.", "wandb.", "loss_scale.")
# May grow (train for longer), not shrink below the recorded value; nor
# grow where the learning-rate schedule spans the run (`_schedule_spans_run`).
LONGER = ("total_steps", "max_iters")
# How many micro-batches a step's batch is split into: harmless where the
# family's accumulated step is the one-batch step (its task's
# `accumulation_keeps_the_step(config)`: DiffuCoder draws the noise for the
# whole batch and divides by its whole count); a change of the batch itself
# is config.global_batch_size's, refused on its own.
SPLIT_STEP = "gradient_accumulation_steps"
# Fields added after runs were recorded: absent from an older record, they
# change nothing while they keep that run's data (the .bin directory or
# files; the data.tfds keys are unused unless data.source is 'tfds').
_ADDED_DATA_SOURCE = ("data.source", ("bin", "files"))
_ADDED_TFDS_PREFIX = "data.tfds."
# Fields added after runs were recorded, with the value every older run
# implicitly had: an older record lacks the key, and a config that sets it
# to that value is no change (not even a logged one). Another value is a
# change like any other.
IMPLICIT = {"model.scan_layers": False,  # GPT's blocks were h_0 .. h_{L-1}
            "model.residual_dtype": "float32",  # GPT's residual stream
            "model.head_size": 0,  # GPT's heads were n_embd // n_head wide
            "model.mlp_size": 0,  # GPT's MLP was 4 * n_embd wide
            "model.n_kv_head": 0,  # GPT's k, v had a head per query head
            "model.logits_dtype": "float32",  # GPT's LM head output
            # Nothing kept or offloaded by name (remat_policy=custom's)
            "model.remat_save": "", "model.remat_offload": "",
            "loss_chunk_size": 0,  # GPT's logits, all positions at once
            "loss_reduce_once": False,  # its head gradient summed per chunk
            "compiled_step": "",  # the train step compiled by the run
            "profiler_steps": 0,  # no profile was taken
            "skip_first_n_steps_for_profiler": 1,
            "keep_checkpoint_every": 0,  # no step kept for good
            # DiffuCoder's whole batch at once (GPT's records all hold it)
            "gradient_accumulation_steps": 1,
            "data_seed": -1,  # the data drew with config.seed
            "label_smoothing": 0.0,  # GPT's loss: plain cross-entropy
            "z_loss": 0.0,
            "warmup_ratio": 0.0,  # the warmup was set in steps
            "optim.warmup_ratio": 0.0,
            "optim.freeze_weights": False,  # TRM trained every weight
            "resume_step": 0,  # resumed from the newest step
            "early_stopping_patience": 0,  # never stopped early
            "early_stopping_threshold": 0.0,
            "num_epochs": 0.0,  # total_steps as set
            "optimizer": "adamw",  # GPT's nanoGPT AdamW
            # No per-parameter multipliers (a record holds JSON's list).
            "optim.lr_mults": [], "optim.wd_mults": [],
            "lr_mults": [], "wd_mults": [],
            "best_metric": "eval/loss",  # checkpoints ranked by eval/loss
            "best_metric_mode": "auto"}
# As IMPLICIT, where each model family (config.model.name; DiffuCoder's
# oldest records lack it) had its own value.
IMPLICIT_BY_FAMILY = {
    "optim.optimizer": {"trm": "adam_atan2", "dream": "adamw"}}
# Fields that decide how the checkpointed tensors are laid out (scanned
# layers are one stacked `h`, unscanned ones h_0 ..): the checkpoints cannot
# be restored in the other layout, so not even allow_config_change accepts
# a change.
LAYOUT = ("model.scan_layers",)
# Fields that decide the optimizer state's tree (AdamW's moments, Lion's
# one, Adafactor's factored ones): a checkpoint's state cannot be restored
# for another, so not even allow_config_change accepts a change.
OPTIMIZER = ("optimizer", "optim.optimizer")
# GPT's config.grad_clip above 0 adds a clipping stage to the optimizer
# state's tree (`gpt.steps.make_optimizer`): turning clipping on or off
# cannot restore a checkpoint's state, so not even allow_config_change
# accepts it (another clip above 0 is a trajectory change like any).
CLIP = "grad_clip"


def _clipping_switched(key: str, old, new) -> bool:
  numbers = all(type(v) in (int, float) for v in (old, new))
  return key == CLIP and numbers and (old > 0) != (new > 0)


class ConfigChangedError(ValueError):
  """A resume's config alters the trajectory of the recorded run."""


class ConfigRecordError(ValueError):
  """The run's config.json cannot be read as a config record."""


def read_file(record_path: epath.Path) -> dict:
  """The config record in `record_path`; `ConfigRecordError` (one line,
  naming the file) if it is not a JSON object."""
  try:
    text = record_path.read_text()
    record = json.loads(text)
  except UnicodeDecodeError as e:
    raise ConfigRecordError(f"{record_path} is not UTF-8 text ({e})") from None
  except ValueError as e:
    raise ConfigRecordError(
        f"{record_path} is not valid JSON ({e})" if text.strip()
        else f"{record_path} is empty") from None
  except RecursionError:  # was a traceback
    raise ConfigRecordError(f"{record_path} is no config record: its JSON "
                            "is nested deeper than Python's recursion "
                            "limit") from None
  if not isinstance(record, dict):
    raise ConfigRecordError(f"{record_path} holds a JSON "
                            f"{type(record).__name__}, not a config record "
                            "(an object)")
  return record


def _checkpoint_record(workpath: epath.Path, step: int):
  """(record, step) from the newest complete checkpoint up to `step` that
  carries one, or (None, None)."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  directory = workpath / "checkpoints"
  for saved in sorted(ckpt_lib.complete_steps(directory), reverse=True):
    if saved > step:
      continue
    record = ckpt_lib.saved_config_record(directory / str(saved))
    if record is not None:
      return record, saved
  return None, None


def _recorded(workpath: epath.Path, step: int, quiet: bool = False):
  """(record, where it is kept, whether config.json must be rewritten) for
  a resume from `step`: the checkpoint's record first, else config.json's;
  (None, None, True) if there is neither."""
  record_path = workpath / RECORD
  saved, saved_step = _checkpoint_record(workpath, step)
  file_record, file_error = None, None
  if record_path.exists():
    try:
      file_record = read_file(record_path)
    except ConfigRecordError as e:
      file_error = e
  if saved is None:
    if file_error is not None:
      raise ConfigRecordError(
          f"{file_error}, and the checkpoints predate the config record "
          "saved with each step, so nothing else says how this run trained."
          f" Restore {record_path} (e.g. from a backup); or, if you are sure"
          " the config is the run's, delete it (it is then written anew "
          "from this config).")
    if file_record is None and not quiet:
      logging.warning(
          "%s is missing and the checkpoints predate the config record saved"
          " with each step: this resume cannot be checked against the run's "
          "config; it is recorded anew.", record_path)
    return file_record, str(record_path), file_record is None
  where = (f"the config record saved with checkpoint "
           f"{workpath / 'checkpoints' / str(saved_step)}")
  if not quiet:
    if file_error is not None:
      logging.warning("%s; comparing with %s instead, and rewriting %s from "
                      "it.", file_error, where, record_path)
    elif file_record is None:
      logging.warning("%s is missing; comparing with %s instead, and "
                      "rewriting %s from it.", record_path, where,
                      record_path)
    elif file_record != saved:
      logging.warning("%s differs from %s; the checkpoint's record is the "
                      "one compared with (changes accepted by "
                      "allow_config_change are listed in %s).", record_path,
                      where, workpath / HISTORY)
  # config.json keeps the run's first config after an accepted change.
  copied = (f" (copied in {record_path})"
            if file_record is None or file_record == saved else "")
  return saved, where + copied, file_record is None


def run_record(config, workpath: epath.Path, step: int | None,
               diff: dict | None = None) -> dict:
  """The config record this run saves with its checkpoints: the one it
  resumes under (checkpoint's, else config.json's), or for a new run (or an
  old one with neither) this config. A resume whose changes to how the run
  trains were accepted (`diff`, from `check`, with allow_config_change)
  records this config too: its steps are trained with it, and a later
  resume that went back to the old values would otherwise pass unchecked
  (and one that kept them be refused)."""
  if step is not None and not accepted(diff or {}, config):
    record, _, _ = _recorded(workpath, step, quiet=True)
    if record is not None:
      return record
  record = json.loads(config.to_json_best_effort())
  if step is not None and "allow_config_change" in record:
    # The flag let this resume through; recorded as True, every later
    # resume without it would log a change to config_history.jsonl.
    record["allow_config_change"] = False
  return record


def accepted(diff: dict, config) -> list[str]:
  """The fields of a resume's `diff` that change how the run trains (what
  config.allow_config_change let through)."""
  return sorted(k for k, v in diff.items() if not _harmless(k, *v, config))


def flat(tree, prefix: str = "") -> dict:
  """{'a.b.c': value} of a nested record or ConfigDict."""
  out = {}
  for key, value in tree.items():
    if hasattr(value, "items"):  # a dict, or a ConfigDict (not a dict)
      out.update(flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def _schedule_spans_run(config) -> bool:
  """Whether the family's learning-rate schedule is laid over
  config.total_steps (its task's optional `schedule_spans_run(config)`): a
  longer run then changes the rate of every step left."""
  if config is None:
    return False
  from trm import families  # pylint: disable=g-import-not-at-top
  spans = getattr(families.task(config.model.name), "schedule_spans_run",
                  None)
  return bool(spans is not None and spans(config))


def _accumulation_keeps_the_step(config) -> bool:
  """Whether the family's step with any config.gradient_accumulation_steps
  is its one-batch step (its task's optional
  `accumulation_keeps_the_step(config)`); not for GPT, whose micro-batches
  are nanoGPT's (each its own mean and dropout draws)."""
  if config is None:
    return False
  from trm import families  # pylint: disable=g-import-not-at-top
  keeps = getattr(families.task(config.model.name),
                  "accumulation_keeps_the_step", None)
  return bool(keeps is not None and keeps(config))


def _harmless(key: str, old, new, config=None) -> bool:
  """`config` (the resume's): a longer run is harmless only if its schedule
  does not span the run; another micro-batch split only if the family's
  step stays the one-batch step."""
  if key in HARMLESS or key.startswith(HARMLESS_PREFIXES):
    return True
  if key == SPLIT_STEP:
    return _accumulation_keeps_the_step(config)
  return key in LONGER and isinstance(old, int) and isinstance(new, int) and (
      new >= old) and not _schedule_spans_run(config)


def _added_and_unused(key: str, old, new, config) -> bool:
  if old is not None:
    return False
  source_key, old_sources = _ADDED_DATA_SOURCE
  if key == source_key:
    return new in old_sources
  return key.startswith(_ADDED_TFDS_PREFIX) and (
      config.data.get("source") != "tfds")


def _implicit(key: str, old_record: dict, new) -> bool:
  """A field absent from the record, set to the value it implicitly had."""
  if key in old_record:
    return False
  if key in IMPLICIT_BY_FAMILY:
    family = old_record.get("model.name", "dream")
    return new == IMPLICIT_BY_FAMILY[key].get(family, object())
  return key in IMPLICIT and new == IMPLICIT[key]


def _data_seed(flat_config: dict):
  """The seed the data drew with (`config_lib.data_seed` of a flat record):
  data_seed, or seed where it is -1 or absent."""
  seed = flat_config.get("data_seed", -1)
  return flat_config.get("seed") if seed == -1 else seed


def changes(recorded: dict, config: dict) -> dict:
  """{field: [recorded, new]} for every field that differs (a field in
  `IMPLICIT` that the record lacks differs only from another value; a
  data_seed only where the data's seed differs: -1 draws with config.seed,
  so data_seed=seed is no change, recorded before the field or after)."""
  old, new = flat(recorded), flat(config)
  return {key: [old.get(key), new.get(key)]
          for key in sorted(set(old) | set(new))
          if old.get(key) != new.get(key)
          and not _implicit(key, old, new.get(key))
          and not (key == "data_seed" and _data_seed(old) == _data_seed(new))}


def _listed(diff: dict) -> str:
  return "; ".join(f"config.{k}: {old!r} -> {new!r}"
                   for k, (old, new) in diff.items())


def check(config, workpath: epath.Path, step: int | None) -> dict:
  """The changes of `config` against the run's record when resuming from
  checkpoint `step` (None: a new run, nothing to compare).

  Raises `ConfigChangedError` when a trajectory field changed and
  `config.allow_config_change` is False; call it before restoring.
  """
  if step is None:
    return {}
  recorded, record_path, _ = _recorded(workpath, step)
  if recorded is None:
    return {}
  record_path = record_path[0].upper() + record_path[1:]  # a sentence's start
  diff = changes(recorded, json.loads(config.to_json_best_effort()))
  # Another family's fields differ by the dozen; listing them (scan_layers
  # first) hid the one that matters, and allow_config_change let a restore
  # of another model's tree through. DiffuCoder's oldest records lack it.
  families_differ = diff.get("model.name")
  if families_differ and families_differ[0] is not None:
    raise ConfigChangedError(
        f"Resuming {workpath} from step {step} with another model: "
        f"config.model.name: {families_differ[0]!r} -> "
        f"{families_differ[1]!r}. {record_path} records a "
        f"{families_differ[0]!r} run, whose checkpoints no other model can "
        "restore (not even with --config.allow_config_change=True). Use "
        "another --workdir, or that model's config file.")
  refused = {k: v for k, v in diff.items()
             if not _harmless(k, *v, config)
             and not _added_and_unused(k, *v, config)}

  def from_weights(new: str) -> str:
    return (f"train on with the new {new} in another --workdir from this "
            "run's weights (TRM: config.init_checkpoint=WORKDIR; DiffuCoder "
            "and GPT: `trm.export --format=hf`, then "
            "config.init_checkpoint=DIR, GPT with config.init_from='gpt2').")

  for fields, what, why, instead in (
      (lambda k, *_: k in LAYOUT,
       "a config that changes the layout of its checkpoints",
       f"{record_path} records the config its steps were trained with, and "
       "its checkpoints cannot be restored in another layout",
       "Rerun with the recorded values or use another --workdir."),
      (lambda k, *_: k in OPTIMIZER, "another optimizer",
       "Its checkpoints hold the recorded optimizer's state, which the new "
       "one cannot take up",
       f"Rerun with the recorded value, or {from_weights('one')}"),
      (_clipping_switched, "gradient clipping turned on or off",
       "Its checkpoints' optimizer state has a clipping stage only where "
       "config.grad_clip is above 0, and cannot be restored without it or "
       "with it added",
       "Keep the recorded config.grad_clip (a clip above 0 may change "
       f"to another above 0), or {from_weights('clip')}")):
    fixed = {k: v for k, v in refused.items() if fields(k, *v)}
    if fixed:
      raise ConfigChangedError(
          f"Resuming {workpath} from step {step} with {what}: "
          f"{_listed(fixed)}. {why} (not even with "
          f"--config.allow_config_change=True). {instead}")
  if refused and not config.allow_config_change:
    why = (" (this model's learning-rate schedule decays over "
           "config.total_steps: a longer run changes the rate of every step "
           "left)" if "total_steps" in refused and _harmless(
               "total_steps", *refused["total_steps"]) else "")
    raise ConfigChangedError(
        f"Resuming {workpath} from step {step} with a config that changes how"
        f" it trains: {_listed(refused)}{why}. {record_path} records the "
        "config its steps were trained with. Rerun with the recorded values, "
        "use another --workdir, or pass --config.allow_config_change=True to "
        f"accept the change (it is then recorded in {workpath / HISTORY}).")
  return diff


def record(config, workpath: epath.Path, diff: dict, step: int | None) -> None:
  """Writes `config.json` for a new run (one with no checkpoint yet), or
  appends a resume's changes to the history; a resume whose config.json
  is missing or damaged rewrites it from the checkpoint's record. Call on
  process 0 only."""
  record_path = workpath / RECORD
  if step is None:
    atomic_files.replace_whole(record_path,
                               config.to_json_best_effort(indent=2))
    return
  recorded, _, rewrite = _recorded(workpath, step, quiet=True)
  if recorded is None:  # old checkpoints, no config.json: record this one
    atomic_files.replace_whole(record_path,
                               config.to_json_best_effort(indent=2))
    return
  if rewrite:
    atomic_files.replace_whole(record_path, json.dumps(recorded, indent=2))
  if not diff:
    return
  entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "step": step,
           "changes": diff, "accepted": accepted(diff, config)}
  history = workpath / HISTORY
  # Read and rewrite rather than append: object stores cannot append. As
  # bytes: a hand-edited history (another encoding, no last newline) is
  # kept as it is, not refused after the restore with a bare decode error.
  try:
    before = history.read_bytes() if history.exists() else b""
  except OSError as e:
    raise ConfigRecordError(
        f"Cannot read {history} to add this resume's config changes to it "
        f"({type(e).__name__}: {e.strerror or e}): move it away (a new "
        "history is then started) and rerun.") from None
  if before and not before.endswith(b"\n"):
    before += b"\n"
  atomic_files.replace_whole(history,
                             before + (json.dumps(entry) + "\n").encode())
  if entry["accepted"]:  # allow_config_change: say what now trains otherwise
    logging.warning(
        "Resuming from step %d with changes to how the run trains, accepted "
        "by config.allow_config_change: %s (recorded in %s).", step,
        _listed({k: diff[k] for k in entry["accepted"]}), history)
