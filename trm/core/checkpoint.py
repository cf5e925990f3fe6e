"""Orbax checkpoints of the train state with the Grain iterator beside it.

Each checkpoint step holds two items: `state` (the whole TrainState: params,
optimizer, EMA, puzzle table, ACT carry, skipped-step counters) and
`data_iter` (the Grain iterator state), so a resumed run continues on exactly
the data it would have seen.
Every process's iterator walks the same sequence of *global* batches (each
takes its rows), so their states are identical: one JSON file, written by the
primary process, restores onto any number of processes.
Orbax writes a step into a temporary directory and renames it when complete,
so a crash mid-save leaves the previous checkpoints as they were, and it
deletes old steps (beyond `max_to_keep`) only after a new one has committed,
so a failed save deletes nothing. Restores go onto the shardings of the
*current* mesh, whatever mesh wrote them. A newest checkpoint that cannot be
read (truncated files, missing metadata or commit marker) is moved aside
with a warning and the previous one restored; if none can be, the run stops
with an error and nothing is moved.
"""
from __future__ import annotations

import os
import shutil
import time

import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from trm.core import cli

# What Orbax 0.12 writes last into every finished step, relative to the step
# directory: the commit markers of the step and of each item, and metadata.
_COMMITTED_FILES = ("commit_success.txt", "_CHECKPOINT_METADATA",
                    "state/commit_success.txt", "state/_METADATA",
                    "data_iter/commit_success.txt")


class CheckpointError(cli.UserError, RuntimeError):
  """Checkpoints exist but none can be restored, or a save failed."""


# Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it.
_TMP_MARK = ".orbax-checkpoint-tmp"

# The held-out loss a step was saved with (Orbax keeps it in the step's own
# metadata), and the best such loss of the run up to that step.
EVAL_LOSS = "eval_loss"
BEST_EVAL_LOSS = "best_eval_loss"


def make_manager(directory: str, *, max_to_keep: int,
                 async_save: bool = True) -> ocp.CheckpointManager:
  """Keeps the newest `max_to_keep` steps plus the step with the lowest
  held-out loss: a save after preemption (or any save without an evaluation)
  can never push the best checkpoint out."""
  from orbax.checkpoint.checkpoint_managers import preservation_policy as pp  # pylint: disable=g-import-not-at-top
  keep = pp.AnyPreservationPolicy([
      pp.LatestN(n=max_to_keep),
      pp.BestN(get_metric_fn=lambda metrics: metrics[EVAL_LOSS], reverse=True,
               n=1, keep_checkpoints_without_metrics=False)])
  return ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(
          preservation_policy=keep, create=True,
          enable_async_checkpointing=async_save),
      item_names=("state", "data_iter"))


def complete_steps(directory) -> list[int]:
  """Steps on disk that carry every commit marker, oldest first."""
  directory = epath.Path(directory)
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and not missing_files(p))


def _free_space(directory) -> str:
  if "://" in str(directory):
    return ""
  try:
    free = shutil.disk_usage(str(directory)).free
  except OSError:
    return ""
  return f"; {free / 2**20:.1f} MiB free there"


def _remove_partial_saves(directory) -> list[str]:
  """Deletes the temporary directories of saves that never committed (a
  full disk stays full otherwise); primary process only."""
  directory = epath.Path(directory)
  if jax.process_index() != 0 or not directory.exists():
    return []
  removed = []
  partial = [path for path in directory.iterdir() if _TMP_MARK in path.name]
  for path in partial:
    if "://" in str(path):
      path.rmtree(missing_ok=True)
    else:
      _wait_until_quiet(str(path))
      shutil.rmtree(str(path), ignore_errors=True)
    removed.append(path.name)
  return removed


def _wait_until_quiet(path: str, quiet: float = 0.5, limit: float = 15.0):
  """Waits until nothing under `path` has changed for `quiet` seconds: a
  failed save's other writers (tensorstore) may still be finishing, and
  deleting under them makes them fail again, noisily."""
  def fingerprint():
    out = []
    for root, _, files in os.walk(path):
      for name in files:
        try:
          st = os.stat(os.path.join(root, name))
        except OSError:
          continue
        out.append((root, name, st.st_size, st.st_mtime_ns))
    return sorted(out)
  deadline, last, since = time.time() + limit, None, time.time()
  while time.time() < deadline:
    now = fingerprint()
    if now != last:
      last, since = now, time.time()
    elif time.time() - since >= quiet:
      return
    time.sleep(0.1)


def _save_error(manager, error: Exception) -> CheckpointError:
  free = _free_space(manager.directory)  # before the partial save goes
  removed = _remove_partial_saves(manager.directory)
  kept = complete_steps(manager.directory)
  last = (f"the last good checkpoint, {epath.Path(manager.directory) / str(kept[-1])}"
          f", is kept" if kept else "no complete checkpoint was written yet")
  cause = " ".join(str(error).split())
  if "No space left on device" in cause:  # buried at the end of Orbax's text
    cause = "no space left on device"
  elif len(cause) > 300:
    cause = f"{type(error).__name__}: {cause[:300]} ..."
  else:
    cause = f"{type(error).__name__}: {cause}"
  return CheckpointError(
      f"Writing a checkpoint to {manager.directory} failed ({cause}){free}. "
      + (f"Removed the partial save ({', '.join(removed)}); " if removed
         else "") + f"{last}. Free space (or fix the cause) and rerun to "
      "resume.")


def check_async_errors(manager: ocp.CheckpointManager) -> None:
  """Raises `CheckpointError` now if a background save has failed, rather
  than at the next save."""
  try:
    manager.check_for_errors()
  except Exception as e:  # pylint: disable=broad-except
    raise _save_error(manager, e) from e


@jax.jit
def _finite_flags(leaves):
  return jnp.stack([jnp.isfinite(x).all() for x in leaves])


def nonfinite_leaves(state) -> list[str]:
  """Paths of the floating leaves of `state` holding a NaN or Inf (one
  compiled reduction; its replicated result reads on every process)."""
  named = [(jax.tree_util.keystr(path), x) for path, x in
           jax.tree_util.tree_flatten_with_path(state)[0]
           if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not named:
    return []
  flags = np.asarray(_finite_flags([x for _, x in named]))
  return [name for (name, _), ok in zip(named, flags) if not ok]


def save(manager: ocp.CheckpointManager, step: int, state, data_iter, *,
         eval_loss: float | None = None,
         best_eval_loss: float | None = None) -> None:
  """Starts an (async) save of `state` and the iterator position at `step`.

  `eval_loss` is the held-out loss measured at this step (it ranks the step
  for keeping the best, see `make_manager`); `best_eval_loss` the lowest of
  the run so far, recorded in the step's metadata so a resumed run knows it
  whatever files lie beside the checkpoint. A state with a NaN or Inf
  anywhere is never written (`CheckpointError`, naming the leaves). Raises
  `CheckpointError` if this or the previous (async) save failed.
  """
  bad = nonfinite_leaves(state)
  if bad:
    raise CheckpointError(
        f"Not saving step {step} to {manager.directory}: {len(bad)} leaves of "
        f"the state hold NaN or Inf (first: {', '.join(bad[:3])}). The "
        f"checkpoints already there are untouched (complete steps: "
        f"{complete_steps(manager.directory) or 'none'}).")
  metadata = ({} if best_eval_loss is None or not np.isfinite(best_eval_loss)
              else {BEST_EVAL_LOSS: float(best_eval_loss)})
  metrics = (None if eval_loss is None or not np.isfinite(eval_loss)
             else {EVAL_LOSS: float(eval_loss)})
  try:
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data_iter=ocp.args.JsonSave(data_iter.get_state())), force=True,
                 metrics=metrics, custom_metadata=metadata)
  except Exception as e:  # pylint: disable=broad-except
    raise _save_error(manager, e) from e


def saved_best_loss(manager: ocp.CheckpointManager, step: int) -> float | None:
  """The best held-out loss recorded with checkpoint `step`, or None."""
  try:
    value = (manager.metadata(step).custom_metadata or {}).get(BEST_EVAL_LOSS)
  except Exception:  # pylint: disable=broad-except
    return None
  return None if value is None else float(value)


def wait_until_finished(manager: ocp.CheckpointManager) -> None:
  """Blocks until a save in flight has committed; `CheckpointError` if it
  failed (the earlier checkpoints are then still on disk)."""
  try:
    manager.wait_until_finished()
  except Exception as e:  # pylint: disable=broad-except
    raise _save_error(manager, e) from e


def missing_files(step_dir) -> list[str]:
  """The commit markers and metadata files a finished step lacks."""
  step_dir = epath.Path(step_dir)
  return [name for name in _COMMITTED_FILES if not (step_dir / name).exists()]


def _all_processes_agree(ok: bool) -> bool:
  """True only if `ok` on every process (all must restore the same step)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _move(source: epath.Path, target: epath.Path, copy: bool) -> None:
  """Renames a directory; with `copy`, copies it file by file and deletes
  the source (object stores cannot rename directories)."""
  if not copy:
    source.rename(target)
    return

  def copy_tree(src, dst):
    dst.mkdir(parents=True, exist_ok=True)
    for child in src.iterdir():
      if child.is_dir():
        copy_tree(child, dst / child.name)
      else:
        child.copy(dst / child.name)

  copy_tree(source, target)
  source.rmtree()


def _set_aside(manager: ocp.CheckpointManager, steps) -> None:
  """Moves unreadable steps to `<step>.unreadable-<time>` beside them (kept
  for inspection, out of Orbax's view) so that saving those steps again does
  not collide with them."""
  directory = epath.Path(manager.directory)
  if jax.process_index() == 0:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for step in steps:
      target = directory / f"{step}.unreadable-{stamp}"
      _move(directory / str(step), target, copy="://" in str(directory))
      logging.warning("Moved unreadable checkpoint %s to %s.",
                      directory / str(step), target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("trm_checkpoint_set_aside")
  manager.reload()


def _short(text: str, limit: int = 600) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit] + " ..."


def restore_latest(manager: ocp.CheckpointManager, abstract_state, data_iter):
  """Restores the newest readable checkpoint onto `abstract_state`'s
  shardings.

  `data_iter` is moved to the saved position in place. Returns the state, or
  None when the directory holds no checkpoint. A step that lacks a commit
  marker or metadata file, or fails to load, is skipped with a warning for
  the previous one (and, once an older one has loaded, set aside, see
  `_set_aside`). Raises `CheckpointError` naming the directory if
  checkpoints exist but none loads: the run must not silently start over.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return None
  # A checkpoint of another config (sizes, batch, model family) is the
  # user's mistake, not corruption: say so instead of falling back.
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  restore_check.check(str(manager.directory), abstract_state, steps[0])
  failures = []
  for step in steps:
    path = epath.Path(manager.directory) / str(step)
    error = None
    missing = missing_files(path)
    if missing:
      error = f"incomplete, it has no {', '.join(missing)}"
    else:
      logging.info("Restoring checkpoint %s", path)
      try:
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data_iter=ocp.args.JsonRestore()))
        # Every restored buffer materialised before anything runs on it.
        jax.block_until_ready(restored["state"])
        data_iter.set_state(restored["data_iter"])
      except Exception as e:  # pylint: disable=broad-except
        error = f"{type(e).__name__}: {_short(e)}"
    if not _all_processes_agree(error is None):
      error = error or "another process could not read it"
      logging.warning("Checkpoint %s cannot be restored (%s); falling back to "
                      "the previous one.", path, error)
      failures.append((step, error))
      continue
    if failures:
      _set_aside(manager, [s for s, _ in failures])
      logging.warning("Resuming from checkpoint %s instead of the newer, "
                      "unreadable step(s) %s.", path, [s for s, _ in failures])
    return restored["state"]
  raise CheckpointError(
      f"{manager.directory} holds checkpoints (steps {sorted(steps)}) but none"
      f" can be restored; the newest, step {failures[0][0]}: "
      f"{failures[0][1]}. Refusing to start from scratch over them: if the "
      "config (or the trm version) changed since they were written, go back "
      "to it; otherwise move the directory away or use another --workdir.")


def restore_fields(directory: str, abstract_fields: dict,
                   step: int | None = None, family: str | None = None):
  """(fields, step): only the named fields of a saved train state (e.g.
  {'params': ...}; the optimizer state and ACT carry are never read), onto
  the shardings of the given abstract arrays. For sampling, evaluation and
  export, whose batch and optimizer may differ from the run's. A checkpoint
  of another config or model `family` is refused first
  (`restore_check.check`)."""
  if "://" not in directory:  # Orbax reads local paths only when absolute
    directory = os.path.abspath(directory)
  manager = ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False,
                                                      read_only=True),
      item_names=("state", "data_iter"))
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"{directory} holds no checkpoint; point at a "
                            "trm.main workdir.")
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  restore_check.check(directory, abstract_fields, step, family=family)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(
          item=abstract_fields,
          restore_args=ocp.checkpoint_utils.construct_restore_args(
              abstract_fields),
          partial_restore=True)))
  return dict(restored["state"]), step
