"""The training loop, top to bottom: setup, mesh, data, model, shard, step,
checkpoint, loop. `python -m trm.main` calls `train_and_evaluate`.

Reliability: an unwritable workdir fails before anything is built; a step
with a NaN/Inf loss or gradient is skipped inside the jitted step
(`state.skip_nonfinite`), never checkpointed, and too many in a row stop the
run (`NonFiniteError`); SIGTERM or a preemption notice saves the current step
and raises `Preempted` (`trm.main` exits 0); an unreadable newest checkpoint
falls back to the previous one (`checkpoint.restore_latest`).

Run control: config.best_metric (default eval/loss; `trm.core.best_metric`)
ranks the checkpoints kept as best; config.early_stopping_patience ends a
run whose best_metric stops improving (`trm.core.early_stopping`: the stop step is saved and a
rerun only evaluates it); config.resume_step=N resumes from saved step N,
the newer steps moved aside (`checkpoint.resume_from_step`).
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import time
from typing import Callable

import jax
import ml_collections
from absl import logging
from etils import epath
# clu.metric_writers writes with the tensorboard package's writer, not
# TensorFlow's (trm.core.tf_free, installed when trm.core is imported).
from clu import metric_writers, parameter_overview

from trm.core import metrics as metrics_lib
from trm.core import array_sizes
from trm.core import best_metric as best_metric_lib
from trm.core import checkpoint as ckpt_lib
from trm.core import preemption as preemption_lib
from trm.core import step_timer
from trm.core import tpu_flags
from trm.core.preemption import Preempted
from trm.core import run_checks
from trm.core.run_checks import check_config, check_workdir
from trm.core import cli
from trm.core import compiled_step
from trm.core import config_record
from trm.core import dispatch
from trm.core import distributed
from trm.core import early_stopping as early_stopping_lib
from trm.core import mesh as mesh_lib
from trm.core import progress
from trm.core import state as state_lib
from trm.core import task as task_lib
from trm.core import wandb_writer
from trm.core import workdir_lock
from trm.core import pipeline
from trm import families
from trm.data import atomic_files


class NonFiniteError(cli.UserError, RuntimeError):
  """Too many consecutive steps had a NaN or Inf loss or gradient."""


class WorkdirWriteError(cli.UserError, OSError):
  """The workdir filled up or turned read-only while the run wrote to it."""


# A write that failed because of the workdir's disk, not the input.
_DISK_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT)


def _denied_in(error: OSError, workdir: str) -> bool:
  """Whether `error` is a permission denied on a file of the local
  `workdir` (a folder of it made read-only during the run: `check_workdir`
  refuses one found at the start)."""
  name = error.filename
  return (error.errno in (errno.EACCES, errno.EPERM) and "://" not in workdir
          and isinstance(name, str) and os.path.isabs(name)
          and cli.within(name, workdir))


def _disk_error(error: OSError, workpath: epath.Path) -> WorkdirWriteError:
  """One line for a write into the workdir (an evaluation's record, its
  sheets, the logs) that failed for want of space or a writable disk (or
  folder: `_denied_in`): which file, the cause, the space left (not for a
  folder made read-only) and the checkpoint kept (saves
  themselves say as much through `checkpoint.CheckpointError`)."""
  where = error.filename or f"to the workdir {workpath}"
  cause = os.strerror(error.errno).lower() if error.errno else str(error)
  # The space left on the disk of the file that failed (a dataset prepared
  # outside the workdir may be on another disk).
  free = ckpt_lib._free_space(  # pylint: disable=protected-access
      os.path.dirname(os.path.abspath(error.filename)) if error.filename
      and "://" not in str(error.filename) else workpath)
  kept = ckpt_lib.complete_steps(workpath / "checkpoints")
  last = (f"The last good checkpoint, {workpath / 'checkpoints'}/"
          f"{kept[-1]}, is kept" if kept else
          "No complete checkpoint was written yet")
  denied = error.errno in (errno.EACCES, errno.EPERM)
  fix = (f"Make {os.path.dirname(where)} writable again" if denied else
         "Free space (or make the workdir writable again)")
  result = WorkdirWriteError(
      f"Writing {where} failed ({cause}){'' if denied else free}. {last}. "
      f"{fix} and rerun " +
      ("to resume." if kept else "(it trains from the start)."))
  result.errno = error.errno
  return result


def evaluate(eval_fn, state, eval_source, batch_shardings, hook=None,
             save_dir: str | None = None, stop=None) -> dict | None:
  """Mean metrics over every batch of the held-out split, plus the task's
  hook's (e.g. ARC pass@K), which may write files into `save_dir`. None if
  `stop()` (asked before each batch) said to stop: a preemption must not
  wait for a whole evaluation."""
  totals = None
  bound = dispatch.DispatchBound()
  for k in range(len(eval_source)):
    if stop is not None and stop():
      return None
    batch = pipeline.to_global(eval_source[k], batch_shardings)
    metrics, outputs = bound(eval_fn(state, batch))
    totals = metrics_lib.merge(totals, metrics)
    if hook is not None:
      hook.update(batch, outputs)
  results = metrics_lib.compute(totals) if totals else {}
  if hook is not None:
    results.update(hook.result(save_dir))
  return results


def _saved_eval_loss(workpath: epath.Path, step: int,
                     metric=best_metric_lib.DEFAULT) -> float:
  """The score of `metric` a run recorded at `step` (inf if it recorded
  none)."""
  try:
    loss = _eval_file_loss(workpath, step, metric)
  except Exception:  # pylint: disable=broad-except
    loss = None
  return float("inf") if loss is None else loss


def _repeats_recorded_eval(workpath: epath.Path, step: int,
                           results: dict) -> bool:
  """Whether the run's `eval_<step>.json` holds exactly `results` (its
  timing aside)."""
  path = workpath / f"eval_{step}.json"
  try:
    recorded = ckpt_lib.read_record(path) if path.exists() else None
  except ValueError:
    return False
  if not isinstance(recorded, dict):
    return False
  figures = {k: v for k, v in results.items() if k != "eval/seconds"}
  try:
    return all(k in recorded and float(recorded[k]) == float(v)
               for k, v in figures.items())
  except (TypeError, ValueError):
    return False


def _eval_file_loss(workpath: epath.Path, step: int,
                    metric=best_metric_lib.DEFAULT) -> float | None:
  """The score of `metric` (`best_metric.score`: the held-out loss by
  default) in the run's `eval_<step>.json`, None if there is no such file;
  a ValueError naming the file if it holds none."""
  path = workpath / f"eval_{step}.json"
  if not path.exists():
    return None
  try:
    value = ckpt_lib.read_loss_record(path, metric[0])
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  return best_metric_lib.score({metric[0]: value}, metric)


def _best_in_eval_files(workpath: epath.Path, last_step: int,
                        metric) -> float:
  """The best score of `metric` in the run's eval files up to `last_step`
  (inf if none holds it): the run's best, re-read after config.best_metric
  changed (the checkpoints' records are another metric's)."""
  best = float("inf")
  if not workpath.exists():
    return best
  for path in workpath.iterdir():
    step = path.name.removeprefix("eval_").removesuffix(".json")
    if not (path.name.endswith(".json") and step.isdigit()
            and int(step) <= last_step):
      continue
    try:
      score = _eval_file_loss(workpath, int(step), metric)
    except ValueError:
      continue
    if score is not None:
      best = min(best, score)
  return best


def _declared_eval_metrics(program, abstract, config, ctx) -> set | None:
  """The names ('eval/...') of the metrics the program's eval step
  reports, from its traced shapes (nothing compiled or run); None if it
  cannot be traced on its own."""
  batch = {key: jax.ShapeDtypeStruct(
      (config.data.eval_batch_size, *field.shape), field.dtype)
           for key, field in program.batch_spec.items()}
  try:
    with ctx:
      metrics, _ = jax.eval_shape(program.eval_step, abstract, batch)
  except Exception as e:  # pylint: disable=broad-except
    logging.info("config.best_metric: the eval step's metric names cannot "
                 "be traced ahead (%s); checked at the first evaluation.",
                 type(e).__name__)
    return None
  return {f"eval/{name}" for name in metrics}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       build_task: Callable):
  """Trains, evaluates and checkpoints; resumes from `workdir` if it can.

  `build_task(config, workdir, ctx) -> Task` supplies the model family's
  program and data (`trm.families.build_task` picks it by
  config.model.name); this loop is the same for every family.

  The workdir is locked for the whole run (`workdir_lock`): a second
  trainer on it is refused before it writes anything."""
  check_config(config)
  # Before any process writes: all must train one config in one workdir.
  distributed.check_same_settings(
      {"--workdir": workdir, **{f"config.{k}": v for k, v in
                                config_record.flat(json.loads(
                                    config.to_json_best_effort())).items()}},
      "--config file and variant, --config.* overrides and --workdir")
  # A run that fails before writing anything (its data missing, a config
  # the task refuses) removes the directories it made for the workdir.
  created = run_checks.missing_directories(workdir)
  try:
    workpath = check_workdir(workdir, config)  # local or gs://
    try:
      with (workdir_lock.WorkdirLock(workdir) as lock,
            contextlib.ExitStack() as cleanup):
        return _train_and_evaluate(config, workdir, workpath, cleanup,
                                   build_task, lock)
    except OSError as e:
      # A bare "[Errno 28] No space left on device" named neither the file
      # nor what was kept.
      if isinstance(e, cli.UserError) or not (
          e.errno in _DISK_ERRNOS or _denied_in(e, workdir)):
        raise
      raise _disk_error(e, workpath) from e
  except BaseException:
    run_checks.remove_if_empty(created)
    raise


def make_writer(config, workdir: str, is_main: bool, metrics_file=None):
  """TensorBoard (and W&B when config.wandb.enabled; and `metrics_file`,
  the run's metrics.jsonl) on process 0; the other processes write nothing
  (metrics are global)."""
  if not is_main:
    return metric_writers.MultiWriter([])
  writers = [metric_writers.create_default_writer(workdir, asynchronous=True)]
  if metrics_file is not None:
    writers.append(metrics_file)
  if config.wandb.enabled:
    writers.append(wandb_writer.create(config, workdir))
  return metric_writers.MultiWriter(writers)


def _train_and_evaluate(config, workdir: str, workpath: epath.Path,
                        cleanup: contextlib.ExitStack, build_task: Callable,
                        lock: workdir_lock.WorkdirLock):
  # ---------------------------------------------------------------- setup
  is_main = jax.process_index() == 0
  # What ranks the checkpoints and drives early stopping (every record
  # below holds its score: lower is better).
  metric = best_metric_lib.spec(config)
  metric_tag = best_metric_lib.tag(metric)
  if config.get("resume_step", 0):
    # Before anything is built or read: the newer steps move aside, so
    # every later reader (the config record, ranking, restore) sees step N
    # as the newest.
    ckpt_lib.resume_from_step(workdir, config.resume_step)
  # A train step compiled ahead of time (trm.aot --save_compiled) is checked
  # against the config as given, before the task fills in what it derives
  # from the data (trm.aot never reads the data).
  compiled_path = "" if config.eval_only else config.get("compiled_step", "")
  program_fields = (compiled_step.program_fields(config) if compiled_path
                    else None)
  # Read (and its checksum verified) before the data is built.
  compiled_file = compiled_step.read(compiled_path) if compiled_path else None

  # ----------------------------------------------------------------- mesh
  ctx = mesh_lib.ShardingContext.from_config(config)
  mesh = ctx.mesh
  if "batch_size" in config:
    # GPT's micro-batch (nanoGPT's batch_size), of which global_batch_size
    # is a multiple: the field to change when the batch does not split
    # (global_batch_size, derived from it, is refused when set apart).
    ctx.check_batch_size(config.batch_size, "batch_size")
  ctx.check_batch_size(config.global_batch_size)
  ctx.check_batch_size(config.data.eval_batch_size,
                            "data.eval_batch_size")
  logging.info("Mesh %s over %d devices, %d processes", dict(mesh.shape),
               mesh.size, jax.process_count())

  # ------------------------------------------------------ data and model
  # The model family's task reads its data and names its model and steps.
  task = build_task(config, workdir, ctx)
  program = task.program
  # Each process reads its rows of every batch from its own copy of the
  # data: a host with other files fed other rows, silently (the config
  # check above sees only the paths).
  data_names = {f"{name} rows (data fingerprint)": source.fingerprint()
                for name, source in (("training", task.train_source),
                                     ("evaluation", task.eval_source))
                if hasattr(source, "fingerprint")}
  if data_names:  # (a source that names none: no extra collective)
    distributed.check_same_settings(
        data_names, "data: identical files at config.data's paths on every "
        "host")
  # A resume may not change how the run trains. Checked after the task has
  # filled in what it derives from the data (e.g. nanoGPT's vocab_size, as
  # recorded), before anything is restored.
  saved_steps = ckpt_lib.complete_steps(workpath / "checkpoints")
  resume_step = saved_steps[-1] if saved_steps else None
  config_changes = config_record.check(config, workpath, resume_step)
  # Saved with every checkpoint, so a lost config.json loses nothing.
  saved_record = config_record.run_record(config, workpath, resume_step,
                                         config_changes)
  # A resume past a lowered config.total_steps (allow_config_change) only
  # evaluates again, but restores its data position first.
  # eval_only reads no training batch: its position may be over other data.
  train_iter = pipeline.grain_iterator(
      task.train_source, config.data.prefetch, min_length=resume_step or 0,
      allow_data_change=bool(config.get("allow_config_change", False)
                             or config.eval_only))

  # ---------------------------------------------------------------- shard
  abstract, state_shardings = state_lib.abstract_state(program.init_fn, ctx)
  if is_main:
    # The cause first: heads the model axis does not divide are what the
    # replicated-weights warning and XLA's rematerialization lines follow.
    families.warn_if_heads_unsplit(config, ctx)
    # MaxText's assert_params_sufficiently_sharded, as a warning
    mesh_lib.warn_if_params_replicated(getattr(abstract, "params", abstract),
                                       mesh)
  # Before anything compiles (even the initialiser): a file built for other
  # software, devices, config or inputs is one line naming the difference.
  if metric != best_metric_lib.DEFAULT:
    # A name the evaluation never reports: before anything compiles, where
    # the eval step's own metrics tell (a task's eval hook adds figures
    # known only after the first evaluation, checked there).
    declared = _declared_eval_metrics(program, abstract, config, ctx)
    hook_metrics = (() if not task.make_eval_hook
                    else task.eval_hook_metrics)
    if declared is not None and hook_metrics is not None:
      best_metric_lib.check_reported(
          metric, declared | {f"eval/{name}" for name in hook_metrics},
          "its eval step's metrics" + (", and its eval hook's"
                                       if hook_metrics else ""))
  prepared = (compiled_step.prepare(
      compiled_path, compiled_file, program, ctx, abstract,
      config.global_batch_size, program_fields) if compiled_path else None)

  def is_eval_step(step: int) -> bool:
    return step % config.eval_every == 0 or step == config.total_steps

  def is_checkpoint_step(step: int) -> bool:
    if not config.checkpoint_every:  # checkpoints off: not even the last
      return False
    return step % config.checkpoint_every == 0 or step == config.total_steps

  def saved_loss(step: int) -> float | None:
    """The held-out loss `save_checkpoint` gave step `step`, as far as the
    eval files tell: only a step both evaluated and saved on schedule had
    one (a step saved on preemption had none)."""
    if not (is_eval_step(step) and is_checkpoint_step(step)):
      return None
    return _eval_file_loss(workpath, step, metric)

  ckpt_lib.check_step_entries(workpath / "checkpoints")
  # The workdir is this run's (locked): a save a killed run left unfinished
  # is nobody's, and Orbax would keep it unless it saved that step again.
  ckpt_lib.remove_abandoned_saves(workpath / "checkpoints")
  # Likewise the temporary files of records and evaluation outputs a
  # killed run was writing.
  left = run_checks.remove_unfinished_writes(workdir) if is_main else []
  if left:
    logging.warning("Removed %s: the unfinished writes of a run that was "
                    "killed while writing them.", ", ".join(left))
  # Before the manager reads the steps' metrics: checkpoints written before
  # they were kept on disk would otherwise be unranked, and the next save
  # would let keep-N delete the best of them.
  # A step ranked under another config.best_metric was saved at its
  # evaluation, whatever the schedule (early stopping's stop step).
  ckpt_lib.rank_saved_steps(
      workpath / "checkpoints", saved_steps, saved_loss, metric,
      lambda step: _eval_file_loss(workpath, step, metric))
  manager = ckpt_lib.make_manager(
      str(workpath / "checkpoints"), max_to_keep=config.keep_checkpoints,
      keep_every=config.get("keep_checkpoint_every", 0),
      # Checkpoints off: no empty checkpoints/ for a run that writes none.
      create=bool(config.checkpoint_every))
  state = ckpt_lib.restore_latest(manager, abstract, train_iter)
  restored = state is not None
  from_initial_state = state is None and task.initial_state is not None
  if from_initial_state:
    state = task.initial_state(ctx, state_shardings)
    logging.info("Initialised from the task's starting weights.")
  elif state is None:
    state = state_lib.init_state(program.init_fn, ctx, state_shardings)
    logging.info("Initialised a new model.")
  start_step = int(state.step)
  if not config.checkpoint_every and not config.eval_only:
    logging.warning(
        "config.checkpoint_every=0: this run writes no checkpoint, not at "
        "step %d (config.total_steps) nor on preemption; a rerun starts "
        "from step %d again.", config.total_steps, start_step)
  # Only a run whose config checked out (mesh, data, restore) records it, so
  # a bad restart leaves the run's config.json and logs as they were.
  metrics_file = None
  if is_main and config.get("metrics_jsonl", True):
    if "://" in workdir:  # an object store has no appends
      logging.warning("config.metrics_jsonl: no metrics.jsonl in a %s "
                      "workdir (TensorBoard's events hold the metrics).",
                      workdir.split("://")[0])
    else:
      metrics_file = metrics_lib.JsonlWriter(
          os.path.join(workdir, metrics_lib.JSONL_NAME))
      cleanup.callback(metrics_file.close)  # also if the writers fail
  writer = make_writer(config, workdir, is_main, metrics_file)
  cleanup.callback(writer.close)  # also on errors: W&B finishes its run
  if is_main:
    config_record.record(config, workpath, config_changes, resume_step)
  if is_main:
    parameter_overview.log_parameter_overview(
        state.params, include_stats=jax.process_count() == 1)
  writer.write_hparams({"num_params": int(sum(
      x.size for x in jax.tree.leaves(state.params)))})

  # ----------------------------------------------------------------- step
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  with ctx:
    eval_step = state_lib.eval_step(program.eval_step, state_shardings,
                                    batch_shardings)

  def run_eval(step: int, stop=None) -> dict | None:
    """The held-out metrics at `step`; None if `stop()` cut it short."""
    with ctx:
      start = time.time()
      hook = task.make_eval_hook() if task.make_eval_hook else None
      save_dir = None if "://" in workdir else os.path.join(workdir,
                                                            f"eval_{step}")
      results = evaluate(eval_step, state, task.eval_source, batch_shardings,
                         hook, save_dir, stop)
    if results is None:
      return None
    results = {f"eval/{k}": v for k, v in results.items()}
    results["eval/seconds"] = time.time() - start
    if _repeats_recorded_eval(workpath, step, results):
      # A rerun of a finished run (or eval_only) evaluating a step again:
      # TensorBoard already holds these figures at this step.
      logging.info("Step %d: the evaluation equals eval_%d.json; not written "
                   "to TensorBoard again.", step, step)
      # metrics.jsonl may not: a run killed after this evaluation but before
      # its checkpoint resumed from an earlier one, and drop_after took the
      # record out with the steps it trains again.
      if metrics_file is not None and not metrics_file.holds_eval(step):
        metrics_file.write_scalars(step, results)
        metrics_file.flush()
    else:
      writer.write_scalars(step, results)
      # On disk before the record below: a run killed between the two
      # (SIGKILL, before the checkpoint's flush) resumed from the previous
      # checkpoint, found this step's record equal to its own evaluation
      # and never wrote the figures, which the buffer had lost.
      writer.flush()
    if is_main:
      # Whole or not at all: a resume ranks checkpoints by these records.
      atomic_files.replace_whole(
          workpath / f"eval_{step}.json",
          json.dumps(atomic_files.nonfinite_as_null(results), indent=1,
                     allow_nan=False))
    return results

  if config.eval_only:  # nanoGPT's eval_only: no training
    results = run_eval(start_step)
    writer.flush()
    logging.info("eval_only at step %d: %s", start_step, results)
    return state, results

  def build_train_step():
    """The compiled train step: loaded from config.compiled_step, else
    compiled now."""
    start = time.time()
    if prepared is not None:
      step_fn = prepared.load()
      how, key = (f"loaded from {prepared.path} (built for "
                  f"{compiled_step.describe(prepared.header)}; not compiled)",
                  "timing/compiled_step_load_seconds")
    else:
      step_fn = task_lib.compile_train_step(
          program, ctx, config.global_batch_size, abstract, state_shardings,
          tpu_flags.for_mesh(config, ctx.mesh))
      how, key = "compiled", "timing/compile_seconds"
    seconds = time.time() - start
    memory = step_fn.memory_analysis()
    logging.info(
        "Train step %s in %.1f s; per device: arguments %.1f MiB, "
        "temporaries %.1f MiB", how, seconds,
        getattr(memory, "argument_size_in_bytes", 0) / 2**20,
        getattr(memory, "temp_size_in_bytes", 0) / 2**20)
    writer.write_scalars(start_step, {key: seconds})
    array_sizes.check_program_host_memory(
        step_fn, list(ctx.mesh.devices.flat),
        f"The train step at config.global_batch_size="
        f"{config.global_batch_size}",
        "lower the batch ("
        + ("or raise config.gradient_accumulation_steps, "
           if "gradient_accumulation_steps" in config else "")
        + "or the model's sizes), or run on an accelerator")
    return step_fn

  # The best held-out loss so far (what always_save_checkpoint=False must
  # beat), the checkpoint's own record first: the step resumed from may have
  # been saved on preemption, with no evaluation (and no eval file) of its
  # own.
  # With config.best_metric, these are its scores (lower is better).
  saved_metric = (ckpt_lib.saved_metric(manager, start_step) if restored
                  else metric)
  if saved_metric != metric:
    # A resume that changed config.best_metric (or its mode): the steps
    # were ranked again from their eval files (`rank_saved_steps`), the
    # best is read from those files likewise, and early stopping counts
    # afresh (Hugging Face keeps the old metric's best: compared with the
    # new metric's values, it ranked nonsense).
    best_loss = _best_in_eval_files(workpath, start_step, metric)
    logging.warning(
        "config.best_metric: checkpoint %d was ranked by %s, this run ranks "
        "by %s: the checkpoints were ranked again from their eval files, "
        "the best so far is %s, and the early-stopping count starts at 0.",
        start_step, best_metric_lib.describe(saved_metric),
        best_metric_lib.describe(metric),
        best_metric_lib.display(best_loss, metric))
  else:
    best_loss = ckpt_lib.saved_best_loss(manager, start_step)
    if best_loss is None:
      best_loss = _saved_eval_loss(workpath, start_step, metric)
  if (from_initial_state and task.initial_best_loss is not None
      and metric == best_metric_lib.DEFAULT):  # a loss: another metric's
    best_loss = task.initial_best_loss
  # config.early_stopping_patience's count and best, as the checkpoint
  # resumed from left them (read on every process: all decide alike).
  stopping = early_stopping_lib.EarlyStopping.resumed(
      config, ckpt_lib.saved_early_stopping(manager, start_step)
      if restored and saved_metric == metric else None, best_loss)
  # always_save_checkpoint=False keeps only improving steps: a run whose
  # final evaluation (eval_<total_steps>.json, written after its last step)
  # did not improve ended without a checkpoint there, and a rerun trained
  # the steps since its best one again, every time. One that did improve
  # but was killed while saving it is not finished: it trains them again
  # (before, it ended on its older checkpoint and called the better loss
  # not below the best).
  final_record = workpath / f"eval_{config.total_steps}.json"
  ended_unsaved = (not config.always_save_checkpoint
                   and start_step < config.total_steps
                   and final_record.exists()
                   and not _saved_eval_loss(workpath, config.total_steps,
                                            metric) < best_loss)
  # A run that stopped early ended there: a rerun (a restarted job, the
  # same command) only evaluates, until the patience is raised.
  stopped_early = (restored and start_step < config.total_steps
                   and stopping.exhausted)
  finished = (start_step >= config.total_steps or ended_unsaved
              or stopped_early)
  if not finished:
    train_step = build_train_step()
  else:  # a finished run only evaluates again: no train step to build
    train_step = None
    if ended_unsaved:
      logging.info(
          "Step %d (config.total_steps) was trained and evaluated by an "
          "earlier run (%s) and not saved, its loss not below the best "
          "(always_save_checkpoint=False): the run is finished; evaluating "
          "its newest checkpoint, step %d, without building the train step.",
          config.total_steps, final_record, start_step)
    elif stopped_early:
      logging.info(
          "Step %d: the run stopped early there (%s): it is finished; "
          "evaluating without building the train step. Raise config."
          "early_stopping_patience (or set it to 0) to train on.",
          start_step, stopping.reason())
    else:
      logging.info("Step %d %s config.total_steps=%d: the run is finished; "
                   "evaluating without building the train step.", start_step,
                   "reaches" if start_step == config.total_steps
                   else "is past", config.total_steps)
  speed = step_timer.StepTimer(
      program.flops_per_step, program.compute_dtype,
      tokens_per_step=(program.tokens_per_example * config.global_batch_size
                       if program.tokens_per_example else None))

  bad_limit = config.max_consecutive_bad_steps

  def check_bad_streak(step: int, streak: int) -> None:
    """Stops once `bad_limit` consecutive steps were skipped (non-finite)."""
    if not bad_limit or streak < bad_limit:
      return
    ckpt_lib.wait_until_finished(manager)
    last = manager.latest_step()
    kept = (f"The last good checkpoint, {manager.directory / str(last)}, is "
            "kept" if last is not None else "No checkpoint had been written")
    raise NonFiniteError(
        f"{streak} consecutive train steps (by step {step}) had a NaN or Inf "
        "loss or gradient; their updates were skipped. Stopping: config."
        f"max_consecutive_bad_steps={bad_limit}. {kept}, and nothing was "
        "saved after the bad steps began. Check the data and the learning "
        "rate, then rerun " + ("to resume from it." if last is not None
                               else "(it trains from the start)."))

  def write_train_metrics(step: int, metrics, timing=None) -> None:
    values = metrics_lib.compute(metrics)
    scalars = {f"train/{k}": v for k, v in values.items()}
    if timing:
      scalars.update(timing)
      speed.log(step, values, timing)
    writer.write_scalars(step, scalars)
    check_bad_streak(step, int(values.get("max_bad_streak", 0)))

  def write_metrics_to_disk(step: int) -> None:
    """Every step's metrics up to checkpoint `step`, written and flushed
    before it is saved: a run killed after it (SIGKILL, a lost host, no
    cleanup) resumes from the checkpoint and never writes them again, and
    the events file holds only what was flushed (`trm.core.metrics`: at the
    latest 120 s after a write). The steps since the last `log_every` step
    (a `checkpoint_every` that is no multiple of it) are logged at `step`
    as an interval of their own, so a resumed run, whose next interval
    starts after the checkpoint, writes what an uninterrupted run writes.
    Fetching these metrics waits for no step the save does not wait for:
    they are this step's at the latest."""
    nonlocal pending, train_metrics
    if pending is not None:
      write_train_metrics(*pending)
      pending = None
    if train_metrics is not None:
      write_train_metrics(step, train_metrics)
      train_metrics = None
    writer.flush()

  def save_checkpoint(step: int) -> bool:
    """Saves unless the newest step was skipped (the state is then not one
    a clean run reaches, and must not displace a good checkpoint). The
    step's held-out loss (if evaluated now) and the run's best go into the
    checkpoint's own metadata."""
    nonlocal best_loss
    streak = int(state.bad_streak)  # waits for the step, as the save would
    if streak:
      check_bad_streak(step, streak)
      logging.warning(
          "Step %d: not saving a checkpoint, the last %d step(s) had a "
          "non-finite loss or gradient; the newest checkpoint stays step %s.",
          step, streak, manager.latest_step())
      return False
    eval_loss = (best_metric_lib.score(results, metric)
                 if evaluated_at == step else None)
    if eval_loss is not None:
      best_loss = min(best_loss, float(eval_loss))
    lock.check_held()  # another trainer took the workdir over: no save
    ckpt_lib.save(manager, step, state, train_iter, eval_loss=eval_loss,
                  best_eval_loss=best_loss, config_record=saved_record,
                  eval_owed=is_eval_step(step) and evaluated_at != step,
                  early_stopping=stopping.record(), metric_tag=metric_tag)
    return True

  def stop_for_preemption(step: int):
    since = (f" {time.time() - preemption.signal_time:.1f} s after "
             f"{signal.Signals(preemption.signum).name}"
             if preemption.signal_time else "")
    if not config.checkpoint_every:  # checkpoints off: nothing to save
      logging.warning("Preemption at step %d: stopping without a checkpoint "
                      "(config.checkpoint_every=0)%s.", step, since)
      if pending is not None:
        write_train_metrics(*pending)
      if train_metrics is not None:
        write_train_metrics(step, train_metrics)
      raise Preempted(step, None, preemption.signum, checkpoints_off=True)
    if step == start_step:  # the step resumed from: it is on disk already
      logging.warning("Preemption at step %d, the step resumed from; "
                      "stopping%s.", step, since)
      raise Preempted(step, str(manager.directory / str(step)),
                      preemption.signum)
    logging.warning("Preemption: saving step %d and stopping%s.", step, since)
    saved = save_checkpoint(step)
    ckpt_lib.wait_until_finished(manager)
    if pending is not None:
      write_train_metrics(*pending)
    if train_metrics is not None:
      write_train_metrics(step, train_metrics)
    raise Preempted(step, str(manager.directory / str(step)) if saved
                    else None, preemption.signum)

  def evaluate_now(step: int, counts: bool = True) -> None:
    """The scheduled evaluation at `step`; a signal during it saves the step
    (marked as owing its evaluation) and stops. Its loss goes to the
    early-stopping count (`counts=False`: to its best only)."""
    nonlocal results, evaluated_at
    with report.timed("eval", barrier=state), speed.paused(step):
      evaluated = run_eval(step, preemption.pending)
    if evaluated is None:  # a signal arrived during the evaluation
      logging.warning("Step %d: evaluation stopped by %s.", step,
                      signal.Signals(preemption.signum).name)
      stop_for_preemption(step)
    results = evaluated
    evaluated_at = step
    if metric != best_metric_lib.DEFAULT:  # (a task may report no loss)
      best_metric_lib.check_reported(metric, results, f"step {step}'s "
                                     "evaluation")
    stopping.watch(results, counts)
    logging.info("Step %d eval: %s", step, results)

  def stops_early(step: int) -> bool:
    """Whether the evaluation just done at `step` exhausted
    config.early_stopping_patience, agreed by every process as a signal
    is (`preemption.any_process`); never at the last step, which ends the
    run anyway."""
    return (bool(stopping.patience) and step < config.total_steps
            and preemption_lib.any_process(stopping.exhausted))

  def log_early_stop(step: int, saved: bool) -> None:
    logging.warning(
        "Early stopping at step %d: %s. %s", step, stopping.reason(),
        f"Step {step} is saved; a rerun of this workdir only evaluates it "
        "(raise config.early_stopping_patience, or set it to 0, to train "
        "on)." if saved else "No checkpoint was saved.")

  def record_redone_eval(step: int) -> None:
    """Gives checkpoint `step`, saved owing its evaluation, what the
    uninterrupted run's save there would have held now that the evaluation
    is done; a step saved only because of the preemption (not a checkpoint
    step) gets no loss, so neither its rank nor the best counts it."""
    nonlocal best_loss
    loss = (best_metric_lib.score(results, metric)
            if is_checkpoint_step(step) else None)
    if loss is not None:  # saved when it improved, or always: min either way
      best_loss = min(best_loss, float(loss))
    ckpt_lib.record_redone_eval(manager, step, eval_loss=loss,
                                best_eval_loss=best_loss,
                                early_stopping=stopping.record(),
                                metric_tag=metric_tag)

  # ----------------------------------------------------------------- loop
  # Its steps/s and ETA leave out the evaluations and saves it times.
  report = progress.TrainProgress(
      num_train_steps=config.total_steps, writer=writer, every_secs=30,
      examples_per_step=config.global_batch_size)
  hooks = [report] if is_main else []
  # config.profiler_steps steps traced by jax.profiler (MaxText's window),
  # on process 0, skipping this run's first steps (compilation, warm-up).
  profile = progress.ProfileWindow(
      workdir, start_step, config.get("skip_first_n_steps_for_profiler", 1),
      config.get("profiler_steps", 0) if is_main else 0,
      end_step=None if finished else config.total_steps)
  train_metrics, pending, results = None, None, {}
  step = start_step
  stopped_at = None  # the step early stopping ended the run at
  # nanoGPT's always_save_checkpoint=False: save only when the held-out loss
  # improves on the best so far (that of the checkpoint resumed from).
  save_improved_only = not config.always_save_checkpoint
  evaluated_at = None
  # Read before any evaluation, on every process: process 0 clears the mark
  # once the evaluation is done (`record_redone_eval`, collective).
  eval_owed = ckpt_lib.saved_eval_owed(manager, start_step)
  preemption = preemption_lib.PreemptionWatch(manager, config.log_every)
  # The host stays at most two steps ahead: XLA:CPU's multi-device
  # collectives deadlock and abort when many more are queued (dispatch.py).
  bound = dispatch.DispatchBound()
  try:
    with metric_writers.ensure_flushes(writer), preemption:
      if not finished and eval_owed:
        # A preemption cut this step's evaluation: it is done now, as an
        # uninterrupted run would have done it, before training on.
        logging.info("Step %d: redoing the evaluation the preemption cut "
                     "short.", start_step)
        evaluate_now(start_step)
        record_redone_eval(start_step)
        if stops_early(start_step):
          log_early_stop(start_step, saved=True)
          stopped_at = start_step
      elif (not finished and not restored and is_eval_step(start_step)
            and config.get("eval_at_start", False)):
        # nanoGPT's evaluation before its first iteration: the starting
        # weights' (new or imported) losses as a baseline. As there, it is
        # not saved, but the best loss (what always_save_checkpoint=False
        # must beat) starts from it.
        evaluate_now(start_step, counts=False)
        if best_metric_lib.score(results, metric) is not None:
          best_loss = min(best_loss, best_metric_lib.score(results, metric))
      if not finished and stopped_at is None:
        logging.info("Training from step %d to %d.", start_step,
                     config.total_steps)
        if metrics_file is not None:
          # A killed run's records after the checkpoint resumed from: this
          # run writes those steps again (a run that only evaluates keeps
          # them all: the steps past its checkpoint were not retrained).
          metrics_file.drop_after(start_step)
        profile(step, barrier=state)  # skip_first_n_steps_for_profiler=0
      while not finished and stopped_at is None and (
          step < config.total_steps):
        batch = pipeline.to_global(next(train_iter), batch_shardings)
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
          state, metrics = train_step(state, batch)
        bound(metrics)  # the metrics: the state is donated to the next step
        step += 1
        train_metrics = metrics_lib.merge(train_metrics, metrics)
        for hook in hooks:
          hook(step)
        profile(step, barrier=state)
        # Metrics are fetched one interval late so the host never waits on
        # the step it just dispatched.
        if step % config.log_every == 0 or step == config.total_steps:
          ckpt_lib.check_async_errors(manager)
          if pending is not None:
            write_train_metrics(*pending)
          pending = (step, train_metrics,
                     speed.interval(step, bound.unfinished()))
          train_metrics = None
        if preemption.reached(step):
          stop_for_preemption(step)
        if is_eval_step(step):
          evaluate_now(step)
        stop = is_eval_step(step) and stops_early(step)
        saved = False
        # Early stopping ends the run as its last step would, saving the
        # stop step (whatever the save cadence or always_save_checkpoint,
        # as a preemption does): its record is what stops a rerun.
        if is_checkpoint_step(step) or (stop and config.checkpoint_every):
          score = best_metric_lib.score(results, metric)
          improved = (evaluated_at == step and score is not None
                      and score < best_loss)
          if not save_improved_only or improved or stop:
            write_metrics_to_disk(step)
            with report.timed("checkpoint", barrier=state), speed.paused(
                step):
              saved = save_checkpoint(step)
          else:
            logging.info("Step %d: no checkpoint, %s %s does not improve on "
                         "the best %.4f (always_save_checkpoint=False).", step,
                         metric[0], results.get(metric[0])
                         if evaluated_at == step else "not computed",
                         best_metric_lib.display(best_loss, metric))
        if stop:
          if not saved:  # the steps since the last log, as a save would
            write_metrics_to_disk(step)
          log_early_stop(step, saved)
          stopped_at = step
      if pending is not None:
        write_train_metrics(*pending)
      if finished:  # a finished run: report again
        results = run_eval(step)
        if eval_owed:
          record_redone_eval(step)
  finally:
    # Also on a crash: a save in flight completes, so the newest checkpoint
    # on disk is whole. Under the preemption watch again: a SIGTERM now (the
    # loop is over, the final save may still be writing) waits for the save
    # instead of abandoning it (a second signal still exits at once).
    profile.close()  # a run that stopped inside the window keeps its trace
    signalled = preemption.signal_time
    with preemption:
      ckpt_lib.wait_until_finished(manager)
    if signalled is None and preemption.signal_time is not None:
      logging.warning("%s after training ended: the checkpoints in flight "
                      "were completed first.",
                      signal.Signals(preemption.signum).name)
  logging.info("Final evaluation at step %d: %s", step, "  ".join(
      f"{k.removeprefix('eval/')}={v:.4f}" for k, v in sorted(results.items())))
  return state, results
