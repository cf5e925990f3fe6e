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

Integrity: Orbax's compressed chunks carry no checksum, so a flipped bit
restores silently as other weights. Each save therefore records, in the
step's own metadata (`_CHECKPOINT_METADATA`, committed with the step), a
64-bit checksum of every array of the state and of the iterator position,
and every restore recomputes them: a mismatch is damage (warning naming the
step and the array; the previous step is used, as for unreadable files).
The array checksum is a function of the logical array alone (its global
index and bits, mixed and summed modulo 2**32 in two lanes, computed by one
jitted program on the devices), not of its shards: it is the same whatever
mesh, device count or process count wrote or reads the array, each process
reading only its own shards and the sum being an all-reduce. Restores of
checkpoints written before checksums existed are not verified (one info
line). A restore error that is not damage to the files (a data position
the current dataset lacks, a mismatched config, running out of memory) stops
the run with one line and moves nothing. Each step also carries the run's
config record (`config_record`), so a resume is checked against it even if
`config.json` is lost. A step's held-out loss, which ranks it for keeping
(`make_manager`), is on disk with it (Orbax's `metrics` item), so a resumed
run ranks the steps of the runs before it; a step saved owing its
evaluation gets it when the resumed run has done it (`record_redone_eval`),
and a step written before the loss was kept there gets the one its
evaluation recorded when a run resumes over it (`rank_saved_steps`). A
state saved before a field of today's (the skipped-step counters) existed
restores with that field at 0.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging as std_logging
import math
import os
import re
import shutil
import time

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from trm.core import best_metric as best_metric_lib
from trm.core import cli
from trm.core import host_arrays
from trm.core import state as state_lib
from trm.data import atomic_files

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
# metadata), and the best such loss of the run up to that step: with
# config.best_metric set, that metric's score (`trm.core.best_metric`: lower
# is better), both records then tagged with the metric (`best_metric.TAG`).
EVAL_LOSS = "eval_loss"
BEST_EVAL_LOSS = "best_eval_loss"
# Set on a step saved at an evaluation step whose evaluation did not run to
# the end (a preemption before or during it): the resumed run evaluates it.
EVAL_OWED = "eval_owed"
# The step's checksums (see the module docstring) and the run's config
# record (`config_record`), also in the step's custom metadata.
CHECKSUMS = "checksums"
CONFIG_RECORD = "config_record"
# The run's early-stopping count and best (`trm.core.early_stopping`).
EARLY_STOPPING = "early_stopping"
_ALGORITHM = "fmix32x2-sum-v1"
_METADATA_FILE = "_CHECKPOINT_METADATA"


def _no_replica_parallel_saves_on_cpu() -> None:
  """Orbax's replica-parallel save splits every replicated array into one
  slice per replica, each cut by a separately dispatched (and, per new
  shape, compiled) slice op, so that the replicas' hosts share the copy to
  host memory. On XLA:CPU every device is host memory already, so the cuts
  only cost: 1,764 of them, about 4 of the 27 s of a 24-step tiny TRM run
  on 8 CPU devices (BUILD_NOTES "Session 63"). Orbax turns it off itself
  on GPU; here it is off on CPU too, by the same ArrayHandler Orbax
  registers by default. Each array is then written by the process holding
  its replica 0, as on GPU."""
  if jax.default_backend() != "cpu":
    return
  from orbax.checkpoint._src.metadata import array_metadata_store  # pylint: disable=g-import-not-at-top
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if (type(handler) is not ocp.type_handlers.ArrayHandler  # a user's own
      or not getattr(handler, "_use_replica_parallel", True)):
    return
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(
          array_metadata_store=array_metadata_store.Store(),
          use_replica_parallel=False), override=True)


def make_manager(directory: str, *, max_to_keep: int,
                 async_save: bool = True,
                 keep_every: int = 0,
                 create: bool = True) -> ocp.CheckpointManager:
  """Keeps the newest `max_to_keep` steps plus the step with the lowest
  held-out loss: a save after preemption (or any save without an evaluation)
  can never push the best checkpoint out. With `keep_every` > 0, every step
  that is a multiple of it is kept too, for good (big_vision's
  keep_ckpt_steps, Orbax's keep_period)."""
  from orbax.checkpoint.checkpoint_managers import preservation_policy as pp  # pylint: disable=g-import-not-at-top
  check_saved_metrics(directory)
  _no_replica_parallel_saves_on_cpu()
  policies = [
      pp.LatestN(n=max_to_keep),
      pp.BestN(get_metric_fn=_eval_loss, reverse=True,
               n=1, keep_checkpoints_without_metrics=False)]
  if keep_every:
    policies.append(pp.EveryNSteps(interval_steps=keep_every))
  keep = pp.AnyPreservationPolicy(policies)
  return ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(
          preservation_policy=keep, create=create,
          enable_async_checkpointing=async_save,
          # The step's directories are made by `save` itself, not by a
          # background thread: made there, a failure (a workdir turned
          # read-only or out of inodes mid-run) left Orbax's other commit
          # threads waiting for a signal that never came, and the process,
          # its error printed, hung at exit for their 20-minute timeout.
          async_options=ocp.AsyncOptions(
              create_directories_asynchronously=False),
          # Only with `best_fn` does Orbax write a step's metrics to disk
          # (`<step>/metrics/metrics`); without it they lived in this
          # manager's memory alone, and a resumed run, knowing no step's
          # loss, let LatestN delete the best step at its next save.
          best_fn=_eval_loss, best_mode="min"),
      item_names=("state", "data_iter"))


def _eval_loss(metrics) -> float:
  return metrics[EVAL_LOSS]


# Far above any loss record (a few scalars): a larger file is not one.
_LOSS_RECORD_LIMIT = 1 << 20


def read_record(path):
  """The JSON value in the small record `path` (see `read_loss_record`); a
  ValueError saying why there is none."""
  path = epath.Path(path)
  if "://" not in str(path) and not os.path.isfile(path):
    raise ValueError("it is not a regular file")
  try:
    too_big = path.stat().length > _LOSS_RECORD_LIMIT
    record = None if too_big else json.loads(path.read_bytes())
  except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
    raise ValueError(f"it cannot be read as JSON ({type(e).__name__}: "
                     f"{_short(e, 200)})") from None
  if too_big:
    raise ValueError(f"it is over {_LOSS_RECORD_LIMIT >> 20} MiB")
  return record


def read_loss_record(path, key: str) -> float:
  """The finite number at `key` in the small JSON record `path` (a step's
  Orbax `metrics` item, a run's `eval_<step>.json`); a ValueError saying why
  it holds none. Anything may lie in a workdir: a FIFO or a directory there
  is refused, not waited on or read."""
  record = read_record(path)
  loss = record.get(key) if isinstance(record, dict) else None
  try:  # an integer past float's range (np.isfinite: TypeError) is none
    value = float(loss) if type(loss) in (int, float) else math.nan
  except OverflowError:
    value = math.nan
  if not math.isfinite(value):
    raise ValueError(f"it holds {_short(json.dumps(record), 100)}, not a "
                     f"finite number at {key!r}")
  return value


def _metrics_problem(path: str) -> str | None:
  """What is wrong with the held-out loss record `path` (a step's Orbax
  `metrics` item), or None if it holds a finite number at EVAL_LOSS."""
  try:
    read_loss_record(path, EVAL_LOSS)
  except ValueError as e:
    return str(e)
  return None


def _check_step_metadata(step_dir: str) -> None:
  """Refuses a step whose `_CHECKPOINT_METADATA` is JSON but not Orbax's
  step metadata (a list, a field of the wrong type): Orbax reads it when a
  manager opens the directory and stopped with a bare "Metadata dict must
  be a dictionary, but got list" naming no file. One that is not JSON at
  all Orbax skips (logged); the restore sets such a step aside."""
  from orbax.checkpoint._src.metadata import step_metadata_serialization  # pylint: disable=g-import-not-at-top
  path = os.path.join(step_dir, _METADATA_FILE)
  try:
    if not os.path.isfile(path) or os.path.getsize(path) > 1 << 26:
      return
    with open(path, "rb") as f:
      record = json.loads(f.read())
  except (OSError, ValueError):
    return
  if record is None:  # `null`: Orbax reads it as no metadata, and opens
    return
  try:
    step_metadata_serialization.deserialize(record)
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(
        f"The metadata of checkpoint {step_dir}, {path}, is not Orbax's step "
        f"metadata ({_short(e, 200)}), and Orbax cannot open "
        f"{os.path.dirname(step_dir)} with it. Restore the file, or move "
        f"{step_dir} out of {os.path.dirname(step_dir)}, and rerun. Nothing "
        "was changed.") from None


def check_saved_metrics(directory) -> None:
  """Refuses (`CheckpointError`, one line naming the file) a step whose
  held-out loss record cannot rank it: Orbax reads every step's `metrics`
  item when a manager opens the directory, and a damaged or hand-edited one
  would stop it there with a bare JSON error, or (a record without a
  number) fail the first save after training resumed. Local disks only
  (an object store's are not checked)."""
  from orbax.checkpoint import checkpoint_manager as ocp_manager  # pylint: disable=g-import-not-at-top
  name = ocp_manager.METRIC_ITEM_NAME
  directory = str(directory)
  if "://" in directory or not os.path.isdir(directory):
    return
  for entry in sorted(os.listdir(directory)):
    if entry.isdigit():
      _check_step_metadata(os.path.join(directory, entry))
    item = os.path.join(directory, entry, name)
    if not entry.isdigit() or not os.path.lexists(item):
      continue
    path = os.path.join(item, name)
    problem = (_metrics_problem(path) if os.path.lexists(path)
               else None)  # no record: the step is unranked (Orbax too)
    if problem is None and not os.path.isdir(item):
      path, problem = item, "it is not a directory"
    if problem is None:
      continue
    raise CheckpointError(
        f"The held-out loss record of checkpoint {os.path.join(directory, entry)}"
        f", {path}, is damaged: {problem}. It must be "
        f'{{"{EVAL_LOSS}": <number>}}: write the step\'s eval/loss (from '
        f"eval_{entry}.json in the workdir) there, or delete "
        f"{item} to leave the step unranked (keep_checkpoints may then "
        "delete it). Nothing was changed.")


class _SavesWithoutMetrics(std_logging.Filter):
  """Orbax, given `best_fn`, warns at every save without metrics; here most
  saves (no evaluation at that step, a preemption) have none by design."""

  def filter(self, record):
    return "did not provide metrics" not in record.getMessage()


logging.get_absl_logger().addFilter(_SavesWithoutMetrics())


def complete_steps(directory) -> list[int]:
  """Steps on disk that carry every commit marker, oldest first."""
  directory = epath.Path(directory)
  if not directory.exists():
    return []
  return sorted(int(p.name) for p in directory.iterdir()
                if p.name.isdigit() and not missing_files(p))


def can_change_entries(folder: str) -> bool:
  """Whether this process can create, delete or rename entries of the local
  `folder` (as its effective user, where the system tells)."""
  return os.access(folder, os.W_OK | os.X_OK,
                   effective_ids=os.access in os.supports_effective_ids)


def read_only_directory(root) -> str | None:
  """The first directory at or under the local `root` whose entries
  `can_change_entries` says no to (deleting or moving a step needs all of
  them writable), or None."""
  for folder, dirs, _ in os.walk(str(root)):
    dirs.sort()
    if not can_change_entries(folder):
      return folder
  return None


def read_only_step(directory, exempt=lambda step: False) -> str | None:
  """The first step directory of the local checkpoints `directory`, other
  than the steps `exempt(step)` spares, that `read_only_directory` finds
  read-only, or None."""
  if "://" in str(directory) or not os.path.isdir(str(directory)):
    return None
  for step in sorted((n for n in os.listdir(str(directory)) if n.isdigit()),
                     key=int):
    path = os.path.join(str(directory), step)
    if (not exempt(int(step)) and os.path.isdir(path)
        and read_only_directory(path)):
      return path
  return None


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
      try:
        shutil.rmtree(str(path))
      except FileNotFoundError:
        pass
      except OSError as e:
        # Read-only (a copied workdir): it was named as removed, and stayed.
        logging.warning(
            "Could not remove %s, the unfinished save of a run that was "
            "killed while saving (%s: %s); the run goes on without it. Make "
            "it writable and delete it to free its space.", path,
            type(e).__name__, e)
        continue
    removed.append(path.name)
  return removed


def check_step_entries(directory) -> None:
  """A CheckpointError for a step's name in `directory` that is a symbolic
  link to no directory (dangling, or to a file): not a checkpoint, so the
  run trained up to that step again and then failed to save it there
  ("Not a directory", with advice to free space), at every rerun."""
  if "://" in str(directory) or not os.path.isdir(str(directory)):
    return
  for name in sorted(os.listdir(str(directory))):
    path = os.path.join(str(directory), name)
    # A plain file is replaced by the save's rename; a link is not.
    if not name.isdigit() or not os.path.islink(path) or os.path.isdir(path):
      continue
    what = ("a dangling symbolic link" if not os.path.exists(path)
            else "a symbolic link to a file")
    raise CheckpointError(
        f"{path} is {what}, not a checkpoint: saving step {name} there would "
        f"fail once the run has trained to it. Move it out of {directory} "
        "and rerun.")


def remove_abandoned_saves(directory) -> None:
  """Deletes the temporary directories of saves that a killed run left
  (one warning naming them): Orbax removes such a directory only when it
  saves that same step again, so a save killed at a step the resumed run
  never saves again (a preemption's, or one past a lowered total_steps)
  kept the disk space of a whole checkpoint for good. Call it while this
  run holds the workdir (no save of its own in flight); primary process."""
  directory = epath.Path(directory)
  if jax.process_index() != 0 or not directory.exists():
    return
  sizes = {}
  for path in directory.iterdir():
    if _TMP_MARK in path.name and "://" not in str(path):
      sizes[path.name] = sum(
          os.path.getsize(os.path.join(root, name))
          for root, _, files in os.walk(str(path)) for name in files
          if os.path.isfile(os.path.join(root, name)))
  removed = _remove_partial_saves(directory)
  if removed:
    freed = sum(sizes.get(name, 0) for name in removed) / 2**20
    logging.warning("Removed %s in %s: the unfinished save(s) of a run that "
                    "was killed while saving (%.1f MiB). Its complete "
                    "checkpoints are untouched.", ", ".join(sorted(removed)),
                    directory, freed)


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
  if cli.peer_lost(error):
    # Another process of the job died during the save: not this disk's
    # fault ("Free space ..." misled), and cli.run's line for a lost peer
    # says what to do. The next run removes the partial save.
    raise error
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
  if not removed:  # it starts the sentence
    last = last[0].upper() + last[1:]
  # Made read-only during the run (`check_workdir` refuses one at the
  # start): "Free space" and the free MiB misled.
  denied = isinstance(error, PermissionError) or any(
      text in cause for text in ("Permission denied",
                                 "Read-only file system"))
  return CheckpointError(
      f"Writing a checkpoint to {manager.directory} failed ({cause})"
      f"{'' if denied else free}. "
      + (f"Removed the partial save ({', '.join(removed)}); " if removed
         else "") + f"{last}. "
      # A read-only older step (keep-N deletes it after the save): the
      # checkpoints folder itself was named.
      + (f"Make {read_only_step(manager.directory) or manager.directory} "
         "writable" if denied
         else "Free space (or fix the cause)")
      + " and rerun to resume.")


def check_async_errors(manager: ocp.CheckpointManager) -> None:
  """Raises `CheckpointError` now if a background save has failed, rather
  than at the next save."""
  try:
    manager.check_for_errors()
  except Exception as e:  # pylint: disable=broad-except
    raise _save_error(manager, e) from e


def _fmix(h):
  """MurmurHash3's 32-bit finaliser: a bijection on uint32."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


# Types narrower than a byte: hashed as their (exact) float32 values.
_SUB_BYTE = ("int2", "uint2", "int4", "uint4", "float4_e2m1fn")


def _bits(x):
  """Every element's bits as uint32 (64-bit types: two words each)."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if jnp.issubdtype(x.dtype, jnp.complexfloating):
    x = jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)
  if x.dtype.name in _SUB_BYTE:
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}
  return lax.bitcast_convert_type(
      x, unsigned[x.dtype.itemsize]).astype(jnp.uint32)


def _array_checksum(x):
  """[2] uint32: sums over the elements of two mixes of (global flat index,
  bits). Each mix is injective in the bits at a given index, so a single
  changed element always changes the checksum; sums modulo 2**32 do not
  depend on the order (the sharding) in which they are added."""
  bits = _bits(x)
  index = jnp.zeros(bits.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(bits.ndim)):
    index = index + lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * (
        jnp.uint32(stride % 2**32))
    stride *= bits.shape[axis]
  a = _fmix(_fmix(index * jnp.uint32(0x9E3779B9) + jnp.uint32(0x7F4A7C15))
            ^ bits)
  b = _fmix(_fmix(index ^ jnp.uint32(0x2545F491)) + bits * jnp.uint32(
      0x27D4EB2F))
  return jnp.stack([jnp.sum(a, dtype=jnp.uint32),
                    jnp.sum(b, dtype=jnp.uint32)])


@functools.partial(jax.jit, static_argnums=1)
def _inspect_arrays(leaves, inexact: tuple[bool, ...]):
  """(finite flag per leaf with `inexact`, [n, 2] checksums): one compiled
  program over the whole state."""
  finite = [jnp.isfinite(x).all() if check else jnp.bool_(True)
            for x, check in zip(leaves, inexact)]
  sums = [_array_checksum(x) for x in leaves]
  return (jnp.stack(finite) if finite else jnp.zeros((0,), jnp.bool_),
          jnp.stack(sums) if sums else jnp.zeros((0, 2), jnp.uint32))


# The same checksum in numpy, for arrays held in host memory (CPU devices):
# no compilation (the jitted form takes seconds to compile for a state of a
# few dozen arrays on XLA:CPU, more than it saves), and each process hashes
# only its own shards (one copy of each, `replica_id` 0).
def _np_fmix(h):
  h = h ^ (h >> np.uint32(16))
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> np.uint32(13))
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> np.uint32(16))


def _np_bits(x: np.ndarray) -> np.ndarray:
  """`_bits` in numpy."""
  if x.dtype == np.bool_:
    return x.astype(np.uint32)
  if np.issubdtype(x.dtype, np.complexfloating):
    x = np.stack([x.real, x.imag], axis=-1)
  if x.dtype.name in _SUB_BYTE:
    return np.ascontiguousarray(x.astype(np.float32)).view(np.uint32)
  x = np.ascontiguousarray(x)
  if x.dtype.itemsize == 8:
    return x.view(np.uint32).reshape(x.shape + (2,))
  unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
  return x.view(unsigned).astype(np.uint32)


def _np_partial_checksum(block: np.ndarray, starts, shape) -> np.ndarray:
  """[2] uint64: this block's part of `_array_checksum` of the whole
  array of `shape`, the block starting at index `starts`."""
  bits = _np_bits(block)
  shape = tuple(shape) + bits.shape[block.ndim:]
  starts = tuple(starts) + (0,) * (bits.ndim - block.ndim)
  index = np.zeros(bits.shape, np.uint32)
  stride = 1
  with np.errstate(over="ignore"):
    for axis in reversed(range(bits.ndim)):
      along = ((np.arange(bits.shape[axis], dtype=np.uint64) + starts[axis])
               * stride) % 2**32
      index += along.astype(np.uint32).reshape(
          [-1 if a == axis else 1 for a in range(bits.ndim)])
      stride *= shape[axis]
    a = _np_fmix(_np_fmix(index * np.uint32(0x9E3779B9)
                          + np.uint32(0x7F4A7C15)) ^ bits)
    b = _np_fmix(_np_fmix(index ^ np.uint32(0x2545F491))
                 + bits * np.uint32(0x27D4EB2F))
  return np.array([a.sum(dtype=np.uint64), b.sum(dtype=np.uint64)],
                  np.uint64) % 2**32


def _inspect_on_host(leaves, inexact):
  """`_inspect_arrays` for arrays in host memory: (finite flags, sums)."""
  first = jax.process_index() == 0
  bad = np.zeros(len(leaves), np.int32)
  sums = np.zeros((len(leaves), 2), np.uint64)
  for k, (x, check) in enumerate(zip(leaves, inexact)):
    if isinstance(x, jax.Array):
      if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
      blocks = [(np.asarray(shard.data),
                 [sl.start or 0 for sl in shard.index])
                for shard in x.addressable_shards if shard.replica_id == 0]
    else:  # a host value, the same on every process: counted once
      blocks = [(np.asarray(x), [0] * np.ndim(x))] if first else []
    for block, starts in blocks:
      if check and not np.isfinite(block).all():
        bad[k] = 1
      sums[k] = (sums[k] + _np_partial_checksum(block, starts, x.shape)
                 ) % 2**32
  if jax.process_count() > 1:
    bad = np.asarray(multihost_utils.process_allgather(bad)).max(axis=0)
    # uint64 does not travel everywhere: two uint32 words are enough here.
    sums = np.asarray(multihost_utils.process_allgather(
        sums.astype(np.uint32))).astype(np.uint64).sum(axis=0) % 2**32
  return bad == 0, sums


def _in_host_memory(leaves) -> bool:
  return all(not isinstance(x, jax.Array)
             or all(d.platform == "cpu" for d in x.sharding.device_set)
             for x in leaves)


def _array_leaves(tree):
  """[(display key, 'a/b/c' name, array)] for every array leaf."""
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  return [(jax.tree_util.keystr(path), restore_check.path_name(path), x)
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
          if hasattr(x, "dtype") and hasattr(x, "shape")]


def _inspect(tree, on_device: bool | None = None):
  """(names of leaves holding NaN/Inf, {'a/b/c': checksum entry}).
  Collective. On accelerators one jitted program computes both; arrays in
  host memory (CPU devices) are hashed in numpy (`on_device` forces
  either, for tests: both give the same sums)."""
  named = _array_leaves(tree)
  if not named:
    return [], {}
  leaves = [x for _, _, x in named]
  inexact = tuple(bool(jnp.issubdtype(x.dtype, jnp.inexact))
                  for x in leaves)
  if on_device is None:
    on_device = not _in_host_memory(leaves)
  if on_device:
    finite, sums = _inspect_arrays(leaves, inexact)
    finite, sums = host_arrays.whole(finite), host_arrays.whole(sums)
  else:
    finite, sums = _inspect_on_host(leaves, inexact)
  bad = [key for (key, _, _), ok in zip(named, finite) if not ok]
  entries = {name: {"dtype": str(x.dtype), "shape": list(x.shape),
                    "sum": f"{int(total[0]):08x}{int(total[1]):08x}"}
             for (_, name, x), total in zip(named, sums)}
  return bad, entries


def _json_digest(value) -> str:
  text = json.dumps(value, sort_keys=True, separators=(",", ":"))
  return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def nonfinite_leaves(state) -> list[str]:
  """Paths of the floating leaves of `state` holding a NaN or Inf (one
  compiled reduction; its replicated result reads on every process)."""
  return _inspect(state)[0]


def checksums(state, on_device: bool | None = None) -> dict:
  """{'a/b/c': {dtype, shape, sum}} for every array of `state`, as a save
  records them (collective over the processes, like a save)."""
  return _inspect(state, on_device)[1]


def save(manager: ocp.CheckpointManager, step: int, state, data_iter, *,
         eval_loss: float | None = None,
         best_eval_loss: float | None = None,
         config_record: dict | None = None,
         eval_owed: bool = False,
         early_stopping: dict | None = None,
         metric_tag: dict | None = None) -> None:
  """Starts an (async) save of `state` and the iterator position at `step`.

  `eval_loss` is the held-out loss measured at this step (it ranks the step
  for keeping the best, see `make_manager`); `best_eval_loss` the lowest of
  the run so far, recorded in the step's metadata so a resume knows it
  whatever files lie beside the checkpoint; `config_record` the run's
  config record (`trm.core.config_record`), kept with the step likewise;
  `eval_owed` marks a step whose scheduled evaluation was cut short
  (`saved_eval_owed`); `early_stopping` is the run's early-stopping count
  and best (`trm.core.early_stopping`), kept with the step likewise;
  `metric_tag` (`best_metric.tag`) the metric the losses are scores of. The
  checksum of every array and of the iterator
  position goes into the same metadata (the module docstring). A state with a NaN or Inf anywhere
  is never written (`CheckpointError`, naming the leaves). Raises
  `CheckpointError` if this or the previous (async) save failed.
  """
  bad, sums = _inspect(state)
  if bad:
    raise CheckpointError(
        f"Not saving step {step} to {manager.directory}: {len(bad)} leaves of "
        f"the state hold NaN or Inf (first: {', '.join(bad[:3])}). The "
        f"checkpoints already there are untouched (complete steps: "
        f"{complete_steps(manager.directory) or 'none'}).")
  position = data_iter.get_state()
  metadata = ({} if best_eval_loss is None or not np.isfinite(best_eval_loss)
              else {BEST_EVAL_LOSS: float(best_eval_loss)})
  metadata[CHECKSUMS] = {"algorithm": _ALGORITHM, "arrays": sums,
                         "data_iter": _json_digest(position)}
  if config_record is not None:
    metadata[CONFIG_RECORD] = config_record
  if eval_owed:
    metadata[EVAL_OWED] = True
  if early_stopping is not None:
    metadata[EARLY_STOPPING] = early_stopping
  if metric_tag is not None:
    metadata[best_metric_lib.TAG] = metric_tag
  metrics = (None if eval_loss is None or not np.isfinite(eval_loss)
             else _metric_record(eval_loss, metric_tag))
  try:
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data_iter=ocp.args.JsonSave(position)), force=True,
                 metrics=metrics, custom_metadata=metadata)
  except Exception as e:  # pylint: disable=broad-except
    raise _save_error(manager, e) from e


def _metric_record(eval_loss: float, metric_tag: dict | None) -> dict:
  """A step's Orbax metric: its score, tagged with a metric not the
  default's."""
  record = {EVAL_LOSS: float(eval_loss)}
  if metric_tag is not None:
    record[best_metric_lib.TAG] = metric_tag
  return record


def saved_metric(manager: ocp.CheckpointManager,
                 step: int) -> tuple[str, str]:
  """The metric (`best_metric.spec`) that checkpoint `step`'s best and
  early-stopping records are scores of."""
  return best_metric_lib.of_tag(_saved_custom(manager, step).get(
      best_metric_lib.TAG))


def _saved_custom(manager: ocp.CheckpointManager, step: int) -> dict:
  """The custom metadata saved with checkpoint `step`; {} when it has none
  or cannot be read."""
  try:
    return manager.metadata(step).custom_metadata or {}
  except Exception:  # pylint: disable=broad-except
    return {}


def saved_best_loss(manager: ocp.CheckpointManager, step: int) -> float | None:
  """The best held-out loss recorded with checkpoint `step`, or None."""
  value = _saved_custom(manager, step).get(BEST_EVAL_LOSS)
  return None if value is None else float(value)


def read_best_loss(directory: str, step: int) -> float | None:
  """`saved_best_loss` of step `step` in a checkpoint directory, read from
  the step's metadata file (for exports; no manager); None if the step has
  none or it cannot be read, or it is another config.best_metric's score
  (`best_metric`: a nanoGPT export's best_val_loss must be a loss)."""
  try:
    custom = step_metadata(epath.Path(directory) / str(step))
    value = custom.get(BEST_EVAL_LOSS)
    if best_metric_lib.of_tag(custom.get(
        best_metric_lib.TAG)) != best_metric_lib.DEFAULT:
      return None
    return None if value is None else float(value)
  except (_Damaged, TypeError, ValueError):
    return None


def saved_early_stopping(manager: ocp.CheckpointManager,
                         step: int) -> dict | None:
  """The early-stopping record (`trm.core.early_stopping`) saved with
  checkpoint `step`; None for a step saved before it was kept."""
  record = _saved_custom(manager, step).get(EARLY_STOPPING)
  return record if isinstance(record, dict) else None


def saved_eval_owed(manager: ocp.CheckpointManager, step: int) -> bool:
  """Whether checkpoint `step` was saved with its evaluation cut short
  (checkpoints written before this record existed: False)."""
  return _saved_custom(manager, step).get(EVAL_OWED) is True


def record_redone_eval(manager: ocp.CheckpointManager, step: int, *,
                       eval_loss: float | None,
                       best_eval_loss: float | None,
                       early_stopping: dict | None = None,
                       metric_tag: dict | None = None) -> None:
  """Completes checkpoint `step`, saved owing its evaluation
  (`saved_eval_owed`), once the resumed run has done that evaluation: as
  the save would have written it had the evaluation come first,
  `eval_loss` becomes the step's Orbax metric (so `make_manager`'s policy
  ranks it; None leaves it unranked), `best_eval_loss` the best and
  `early_stopping` the count with that evaluation in its metadata; and the mark goes, so a later resume from the step does not
  evaluate it again.

  The state, the iterator and their checksums are not touched, and each
  file is replaced whole (written beside it, then renamed over it), so the
  step is restorable at every moment; a crash before the metadata is
  replaced leaves the mark, and the next resume redoes all this. On an
  object store (`://`) nothing is written (warning): the step stays
  unranked and owing, as before. Collective: process 0 writes, then every
  process's manager reads the steps again; call it with no save in flight.
  """
  step_dir = epath.Path(manager.directory) / str(step)
  if "://" in str(step_dir):
    logging.warning(
        "Checkpoint %s keeps its eval_owed mark and no held-out loss: "
        "rewriting a step's files is done on local disks only. It is not "
        "ranked among the best, and a resume from it evaluates it again.",
        step_dir)
    return
  if jax.process_index() == 0:
    def settle(custom):
      custom.pop(EVAL_OWED, None)
      if best_eval_loss is not None and np.isfinite(best_eval_loss):
        custom[BEST_EVAL_LOSS] = float(best_eval_loss)
      elif metric_tag != custom.get(best_metric_lib.TAG):
        custom.pop(BEST_EVAL_LOSS, None)  # another metric's
      if early_stopping is not None:
        custom[EARLY_STOPPING] = early_stopping
      custom.pop(best_metric_lib.TAG, None)
      if metric_tag is not None:
        custom[best_metric_lib.TAG] = metric_tag

    try:
      _write_metric(str(step_dir), eval_loss, settle, metric_tag)
    except Exception as e:  # pylint: disable=broad-except
      # Each file was replaced whole or not at all, so the step is intact;
      # a record not written must not stop the run (nor leave the other
      # processes waiting at the barrier).
      logging.warning("Could not record the redone evaluation in checkpoint "
                      "%s (%s: %s); a resume from it evaluates it again.",
                      step_dir, type(e).__name__, _short(e, 300))
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("trm_checkpoint_redone_eval")
  manager.reload()


def rank_saved_steps(directory, steps, loss_at,
                     metric=best_metric_lib.DEFAULT, rescore_at=None) -> None:
  """Gives each complete step of `steps` that has no held-out loss on disk
  (written before the manager kept it there, see `make_manager`) the loss
  `loss_at(step)` as its Orbax metric, so `make_manager`'s policy ranks it:
  without it a resumed run's next save lets keep-N delete the best step.

  `loss_at(step)` is the loss the step's save was given, None when it had
  none, or raises when its record cannot be read (such steps stay unranked:
  one warning for all). A step owing its evaluation (`saved_eval_owed`) is
  left to `record_redone_eval`, and one whose own record of the run's best
  is above the loss was not saved with it.

  `loss_at` gives scores of `metric` (`best_metric.spec`): a step ranked
  under another metric (a resume that changed config.best_metric) is
  ranked again by `rescore_at` (default `loss_at`: the score of the
  evaluation it was ranked by, which was at its step), or left unranked
  where it gives none (its eval file lacks the metric). Files are written as
  `record_redone_eval` writes them; on an object store (`://`) nothing is
  written (warning). Collective, before `make_manager` opens `directory`
  (it reads the metrics once, when it is made): process 0 reads and
  writes, the others wait for it.
  """
  directory = epath.Path(directory)
  cloud = "://" in str(directory)
  if jax.process_index() == 0:
    try:
      _rank_saved_steps(directory, steps, loss_at, cloud, metric,
                        rescore_at or loss_at)
    except Exception as e:  # pylint: disable=broad-except
      # Ranking is bookkeeping: the run must start (and the other
      # processes must not wait at the barrier for a process 0 that left).
      logging.warning("Could not rank the checkpoints in %s by their "
                      "held-out loss (%s: %s); keep-N may delete the best.",
                      directory, type(e).__name__, _short(e, 300))
  if not cloud and jax.process_count() > 1:
    multihost_utils.sync_global_devices("trm_checkpoint_rank_saved_steps")


def _rank_saved_steps(directory: epath.Path, steps, loss_at,
                      cloud: bool, metric, rescore_at) -> None:
  from orbax.checkpoint import checkpoint_manager as ocp_manager  # pylint: disable=g-import-not-at-top
  name = ocp_manager.METRIC_ITEM_NAME
  losses, unreadable, unranked = {}, {}, []
  for step in steps:
    step_dir = directory / str(step)
    record = step_dir / name / name
    # Ranked already: under this metric it stays. A damaged record is left
    # for `make_manager`'s `check_saved_metrics` to name.
    rerank = record.exists() and _ranked_by(record) not in (metric, None)
    if record.exists() and not rerank:
      continue
    try:
      custom = step_metadata(step_dir)
    except Exception:  # pylint: disable=broad-except
      continue  # damage is the restore's to report (and set aside)
    if custom.get(EVAL_OWED) is True:
      continue
    try:
      loss = (rescore_at if rerank else loss_at)(step)
    except Exception as e:  # pylint: disable=broad-except
      unreadable[step] = f"{type(e).__name__}: {_short(e, 100)}"
      loss = None
    best = (custom.get(BEST_EVAL_LOSS) if best_metric_lib.of_tag(
        custom.get(best_metric_lib.TAG)) == metric else None)
    if loss is None or (type(best) in (int, float) and best > loss):
      if rerank:  # another metric's rank must not stand
        unranked.append(step)
      continue
    losses[step] = loss
  if unranked and not cloud:
    for step in unranked:
      _unrank(str(directory / str(step)))
    logging.warning(
        "Checkpoint(s) %s in %s are no longer ranked among the best: they "
        "were ranked by another metric, and their eval files hold no %s.",
        unranked, directory, metric[0])
  if unreadable:
    logging.warning(
        "Checkpoint(s) %s in %s stay unranked among the best: the held-out "
        "loss of their evaluation cannot be read (%s).", sorted(unreadable),
        directory, "; ".join(f"step {step}: {why}"
                             for step, why in sorted(unreadable.items())))
  if not losses:
    return
  if cloud:
    logging.warning(
        "Checkpoint(s) %s in %s hold no held-out loss (written before trm "
        "kept it with the step): rewriting a step's files is done on local "
        "disks only, so they are not ranked among the best and keep-N may "
        "delete them.", sorted(losses), directory)
    return
  for step, loss in sorted(losses.items()):
    try:
      _write_metric(str(directory / str(step)), loss,
                    metric_tag=best_metric_lib.tag(metric))
    except Exception as e:  # pylint: disable=broad-except
      # Most likely a full disk: the other steps would fail alike.
      logging.warning("Could not write the held-out loss into checkpoint %s "
                      "(%s: %s); it and the steps after it stay unranked "
                      "among the best.", directory / str(step),
                      type(e).__name__, _short(e, 300))
      losses = {s: v for s, v in losses.items() if s < step}
      break
  if losses:
    logging.info("Ranked checkpoint(s) %s in %s by the %s of their "
                 "evaluation (written before trm kept it with the step, or "
                 "ranked by another metric).", sorted(losses), directory,
                 best_metric_lib.describe(metric))


def _ranked_by(record) -> tuple[str, str] | None:
  """The metric a step's Orbax metric `record` ranks it by; None if it
  cannot be read."""
  try:
    value = read_record(record)
  except ValueError:
    return None
  return (best_metric_lib.of_tag(value.get(best_metric_lib.TAG))
          if isinstance(value, dict) else None)


def _unrank(step_dir: str) -> None:
  """Takes checkpoint `step_dir`'s Orbax metric away (the step is then as
  one saved without an evaluation): the metadata first, no longer naming
  the item, then the item."""
  from orbax.checkpoint import checkpoint_manager as ocp_manager  # pylint: disable=g-import-not-at-top
  name = ocp_manager.METRIC_ITEM_NAME
  metadata_path = os.path.join(step_dir, _METADATA_FILE)
  with open(metadata_path, encoding="utf-8") as f:
    metadata = json.load(f)
  if isinstance(metadata.get("item_handlers"), dict):
    metadata["item_handlers"].pop(name, None)
  atomic_files.atomic_write(metadata_path,
                            lambda f: f.write(json.dumps(metadata)), mode="w")
  shutil.rmtree(os.path.join(step_dir, name), ignore_errors=True)


def _write_metric(step_dir: str, eval_loss, edit_custom=None,
                  metric_tag: dict | None = None) -> None:
  """Writes `eval_loss` (if finite) into checkpoint `step_dir` as Orbax's
  own `metrics` item, what a save given it writes, then the step's
  metadata, naming the item and with `edit_custom` applied to its custom
  metadata. Each file is written beside the old one and renamed over it;
  the state, the iterator and their checksums (which never covered the
  metrics) are not touched."""
  from orbax.checkpoint import checkpoint_manager as ocp_manager  # pylint: disable=g-import-not-at-top
  def replace(path, text):
    atomic_files.atomic_write(path, lambda f: f.write(text), mode="w")

  metadata_path = os.path.join(step_dir, _METADATA_FILE)
  with open(metadata_path, encoding="utf-8") as f:
    metadata = json.load(f)
  # The metric first: until the metadata is replaced (a redone evaluation's
  # drops its mark), a crash costs only the evaluation again.
  if eval_loss is not None and np.isfinite(eval_loss):
    name = ocp_manager.METRIC_ITEM_NAME
    item = os.path.join(step_dir, name)
    os.makedirs(item, exist_ok=True)
    replace(os.path.join(item, name),
            json.dumps(_metric_record(eval_loss, metric_tag)))
    replace(os.path.join(item, "commit_success.txt"),
            f"Checkpoint commit was successful to {item}")
    if isinstance(metadata.get("item_handlers"), dict):
      metadata["item_handlers"][name] = ocp.JsonCheckpointHandler.typestr()
  if edit_custom is not None:
    custom = metadata.get("custom_metadata") or {}
    edit_custom(custom)
    metadata["custom_metadata"] = custom
  replace(metadata_path, json.dumps(metadata))


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


# A step's restore outcome, agreed by all processes (the worst wins).
_OK, _DAMAGED, _FAILED = 0, 1, 2


def _agree(status: int) -> int:
  """The worst of every process's `status` (all restore the same step)."""
  if jax.process_count() == 1:
    return status
  return int(np.max(multihost_utils.process_allgather(np.int32(status))))


class _Damaged(Exception):
  """A step's own files say it is damaged."""


# Markers of an error that comes from reading damaged or missing files
# (tensorstore's status codes and messages, Orbax's read errors) ...
_DAMAGE_MARKERS = ("DATA_LOSS", "OUT_OF_RANGE", "FAILED_PRECONDITION",
                   "NOT_FOUND", "Error reading", "Error decoding",
                   "Encountered error while reading array", "Truncated",
                   "corrupt", "Corrupt", "not found")
# ... and of one that does not (memory, permissions, the network): the files
# may be fine, so nothing may be moved aside.
_NOT_DAMAGE_MARKERS = ("RESOURCE_EXHAUSTED", "out of memory",
                       "Out of memory", "PERMISSION_DENIED",
                       "Permission denied", "UNAVAILABLE",
                       "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "CANCELLED",
                       "ABORTED")


def _is_damage(error: BaseException) -> bool:
  """Whether a restore error comes from the step's files being damaged
  (truncated, missing, undecodable) rather than from the run (config,
  memory, permissions, network)."""
  chain, e = [], error
  while e is not None and len(chain) < 12:
    chain.append(e)
    e = e.__cause__ or e.__context__
  text = " ".join(f"{type(c).__name__}: {c}" for c in chain)
  if any(isinstance(c, (MemoryError, PermissionError)) for c in chain) or any(
      m in text for m in _NOT_DAMAGE_MARKERS):
    return False
  if any(isinstance(c, (_Damaged, json.JSONDecodeError, FileNotFoundError,
                        UnicodeDecodeError, EOFError)) for c in chain):
    return True
  return any(m in text for m in _DAMAGE_MARKERS)


def step_metadata(step_dir) -> dict:
  """The custom metadata saved with a step (best loss, checksums, config
  record); {} for a step that has none. Raises `_Damaged` if the step's
  metadata file is missing or unreadable."""
  path = epath.Path(step_dir) / _METADATA_FILE
  try:
    text = path.read_text()
  except FileNotFoundError:
    raise _Damaged(f"it has no {_METADATA_FILE}") from None
  try:
    metadata = json.loads(text)
  except ValueError as e:
    raise _Damaged(f"its {_METADATA_FILE} is not valid JSON ({e})") from None
  custom = metadata.get("custom_metadata") if isinstance(metadata,
                                                          dict) else None
  if not isinstance(metadata, dict) or not isinstance(custom or {}, dict):
    raise _Damaged(f"its {_METADATA_FILE} is not Orbax's step metadata")
  return custom or {}


def saved_config_record(step_dir) -> dict | None:
  """The config record saved with a step, or None (a step written before
  records were saved with it, or whose metadata is unreadable)."""
  try:
    record = step_metadata(step_dir).get(CONFIG_RECORD)
  except (_Damaged, OSError):
    return None
  return record if isinstance(record, dict) else None


def _saved_checksums(path: epath.Path) -> dict | None:
  """The checksums saved with a step; None (logged) for a step written
  before they were. Raises `_Damaged` for an unreadable record."""
  record = step_metadata(path).get(CHECKSUMS)
  if record is None:
    logging.info("Checkpoint %s has no checksums (written before trm "
                 "recorded them); restoring it without verification.", path)
    return None
  if (not isinstance(record, dict) or record.get("algorithm") != _ALGORITHM
      or not isinstance(record.get("arrays"), dict)):
    logging.warning("Checkpoint %s has checksums this version cannot read "
                    "(%s); restoring it without verification.", path,
                    _short(record, 100))
    return None
  return record


def _verify(step: int, saved: dict | None, tree, position=None) -> str | None:
  """None if the restored `tree` (and iterator `position`) match the
  checksums saved with `step`, else what differs. Collective: every process
  calls it on the same step. Arrays restored in another dtype than saved
  (a changed config) are not compared."""
  if not _agree(int(saved is not None)):  # no process has checksums
    return None
  _, now = _inspect(tree)  # on every process: it is collective
  if saved is None:
    return None
  arrays = saved["arrays"]
  wrong = [f"array {name}" for name, entry in now.items()
           if isinstance(arrays.get(name), dict)
           and arrays[name].get("dtype") == entry["dtype"]
           and list(arrays[name].get("shape", ())) == entry["shape"]
           and arrays[name].get("sum") != entry["sum"]]
  if position is not None and saved.get("data_iter") not in (
      None, _json_digest(position)):
    wrong.append("the data position (data_iter)")
  if not wrong:
    return None
  more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
  return (f"{wrong[0]}{more} does not match the checksum saved with "
          f"step {step}: its files changed after the save")


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


# config.resume_step=N moves the steps after N (and their evaluations'
# records) into ABANDONED/<time>/, with a record of the move.
ABANDONED = "checkpoints_abandoned"
_REWIND_RECORD = "resume_step.json"
RESUME_STEP = "config.resume_step"


def _last_rewind(workpath: epath.Path) -> tuple[epath.Path, dict] | None:
  """(its folder, its record) of the newest rewind into
  `ABANDONED` (`resume_from_step`), or None."""
  folders = (sorted((p for p in (workpath / ABANDONED).iterdir()
                     if (p / _REWIND_RECORD).exists()),
                    key=lambda p: (_STAMP.fullmatch(p.name) is not None,
                                   p.name))
             if (workpath / ABANDONED).is_dir() else [])
  for folder in reversed(folders):
    try:
      record = json.loads((folder / _REWIND_RECORD).read_text())
    except (OSError, ValueError):
      continue
    if isinstance(record, dict):
      return folder, record
  return None


def resume_from_step(workdir: str, step: int) -> None:
  """`config.resume_step=N` (Hugging Face's resume_from_checkpoint): the
  run resumes from its saved step N instead of the newest. The steps after
  N are never lost: their checkpoints, their evaluations' records
  (eval_<s>.json, eval_<s>/: a resume ranks steps and decides whether the
  run ended by them) and a copy of metrics.jsonl (whose records past N the
  resumed run drops, as after any resume) move to
  WORKDIR/checkpoints_abandoned/<time>/, said in one warning, with a record
  of the move written last. A rerun with the same N (a restarted job keeps
  its flags) finds that record and resumes from its newest step instead of
  going back again (one warning); N the newest moves nothing but is
  recorded likewise. A step that is not on disk, whole, is one
  line naming those that are. Call it holding the workdir lock, before any
  step is read. Collective: every process reads the steps, then process 0
  moves them."""
  workpath = epath.Path(workdir)
  directory = workpath / "checkpoints"
  complete = complete_steps(directory)
  newer = sorted(int(p.name) for p in directory.iterdir()
                 if p.name.isdigit() and int(p.name) > step) if (
                     directory.exists()) else []
  last = _last_rewind(workpath)
  # Before step N's own check: once the resumed run has saved
  # keep_checkpoints newer steps, N itself is deleted, and a restart with
  # the same flags (a preempted job's) was refused for it.
  applied = last is not None and last[1].get("resume_step") == step
  if step not in complete and not (applied and newer):
    raise CheckpointError(
        f"{RESUME_STEP}={step}: {directory} has no complete step {step} "
        f"(its steps: {complete or 'none'}); pass one of them, or 0 to "
        "resume from the newest.")
  if applied:
    if not newer:
      return  # nothing trained since the earlier run applied it
    logging.warning(
        "%s=%d was applied by an earlier run, which moved the steps after it "
        "to %s; step(s) %s were trained since, so this run resumes from the "
        "newest. Set %s=0 (to go back to step %d again, move those steps "
        "out of %s first).", RESUME_STEP, step, last[0], newer, RESUME_STEP,
        step, directory)
    return
  if "://" in str(workpath) and newer:
    raise CheckpointError(
        f"{RESUME_STEP}={step}: the step(s) {newer} after it would be moved "
        f"aside, which is done on local disks only: move {directory}/"
        f"<step> for those steps (and eval_<step>.json) elsewhere yourself, "
        f"then set {RESUME_STEP}=0.")
  if jax.process_count() > 1:  # every process has read the steps
    multihost_utils.sync_global_devices("trm_resume_step_read")
  error = None
  if jax.process_index() == 0 and not newer:
    # Step N is the newest: a plain resume, moving nothing. Its record is
    # written all the same: without it, a restarted job (its flags keep N)
    # took the steps trained since for newer ones and moved them aside,
    # back to N at every restart. Not writable: the rerun's case only, so
    # a warning.
    try:
      _record_rewind(_new_folder(workpath), step, [], [])
    except OSError as e:
      logging.warning(
          "%s=%d is the newest step (a plain resume), but its record could "
          "not be written in %s (%s): a restart with the same %s will move "
          "the steps trained from here aside; set %s=0 once this run has "
          "saved a step.", RESUME_STEP, step, workpath / ABANDONED, e,
          RESUME_STEP, RESUME_STEP)
  elif jax.process_index() == 0:
    try:
      _move_newer_steps(workpath, step, newer)
    except OSError as e:
      error = (f"{RESUME_STEP}={step}: moving the newer step(s) {newer} "
               f"aside into {workpath / ABANDONED} failed ({e}); what was "
               "moved is there, the rest is where it was. Fix the cause (or "
               "move them yourself) and rerun.")
  # Agreed by all (a barrier too): a failure on process 0 stops every one.
  if _agree(int(error is not None)):
    raise CheckpointError(error or f"{RESUME_STEP}={step}: process 0 could "
                          "not move the newer steps aside (see its log).")


def _move_newer_steps(workpath: epath.Path, step: int, newer: list[int]):
  """`resume_from_step`'s move of the steps after `step` (process 0)."""
  directory = workpath / "checkpoints"
  target = _new_folder(workpath)
  (target / "checkpoints").mkdir(parents=True)
  # The records first and the record of the move last: a run killed
  # part-way still has newer steps, and its rerun moves the rest.
  records = sorted(p.name for p in workpath.iterdir()
                   if _EVAL_NAME.fullmatch(p.name)
                   and int(_EVAL_NAME.fullmatch(p.name).group(1)) > step)
  for name in records:
    (workpath / name).rename(target / name)
  jsonl = workpath / "metrics.jsonl"
  if jsonl.exists():
    shutil.copy2(str(jsonl), str(target / "metrics.jsonl"))
  for moved in newer:
    (directory / str(moved)).rename(target / "checkpoints" / str(moved))
  _record_rewind(target, step, newer, records)
  logging.warning(
      "%s=%d: resuming from step %d; the newer step(s) %s, their "
      "evaluations' records and a copy of metrics.jsonl were moved to %s "
      "(nothing deleted).", RESUME_STEP, step, step, newer, target)


# `_new_folder`'s names: UTC to the nanosecond, then a counter where that
# name was taken, so names sort as they were made (no daylight-saving
# fall-back repeats an hour) and never collide. Folders named by local time
# (YYYYmmdd-HHMMSS[-n], before) sort before all of them.
_STAMP = re.compile(r"\d{8}T\d{6}\.\d{9}Z(-\d{6})?")


def _new_folder(workpath: epath.Path) -> epath.Path:
  """A folder of `ABANDONED` named by the time (`_STAMP`), not yet on
  disk."""
  ns = time.time_ns()
  stamp = (time.strftime("%Y%m%dT%H%M%S", time.gmtime(ns // 10**9))
           + f".{ns % 10**9:09d}Z")
  target, n = workpath / ABANDONED / stamp, 0
  while target.exists():
    n += 1
    target = workpath / ABANDONED / f"{stamp}-{n:06d}"
  return target


def _record_rewind(target: epath.Path, step: int, newer: list[int],
                   records: list[str]) -> None:
  """The record of a rewind to `step` (`_last_rewind` reads it), written
  last into `target`."""
  target.mkdir(parents=True, exist_ok=True)
  atomic_files.replace_whole(target / _REWIND_RECORD, json.dumps(
      {"resume_step": step, "moved_steps": newer, "moved_records": records,
       "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())},
      indent=1))


# An evaluation's record (eval_<step>.json) or outputs (eval_<step>/).
_EVAL_NAME = re.compile(r"eval_(\d+)(\.json)?")


def _short(text: str, limit: int = 600) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[:limit] + " ..."


def _stop_message(path, error: str, damaged_before, fix: str | None = None
                  ) -> str:
  newer = (f" (the newer step(s) {[st for st, _ in damaged_before]} are "
           "damaged)" if damaged_before else "")
  fix = fix or ("If the config, the dataset or the trm version changed since "
                "it was written, go back to them (or use another --workdir); "
                f"if its files are damaged, move {path} away and rerun to "
                "resume from the previous checkpoint.")
  return (f"Restoring checkpoint {path} failed{newer}: {error}. This is not "
          f"damage to its files, so nothing was moved aside. {fix}")


def _read_verified(path: epath.Path, restore, with_position: bool = False):
  """(agreed status, error, restored) of one step: its files present, read
  by `restore()` with every buffer materialised, and its arrays (and data
  position, `with_position`) matched against the checksums saved with it.
  Collective: every process agrees on the status (`_agree`)."""
  status, error, restored, saved = _OK, None, None, None
  try:
    missing = missing_files(path)
    if missing:
      raise _Damaged(f"incomplete, it has no {', '.join(missing)}")
    saved = _saved_checksums(path)
    restored = restore()
    # Every restored buffer materialised before anything runs on it.
    jax.block_until_ready(restored["state"])
  except _Damaged as e:
    status, error = _DAMAGED, str(e)
  except Exception as e:  # pylint: disable=broad-except
    status = _DAMAGED if _is_damage(e) else _FAILED
    error = f"{type(e).__name__}: {_short(e)}"
  agreed = _agree(status)
  if agreed == _OK:  # collective: every process has the arrays
    position = restored["data_iter"] if with_position else None
    error = _verify(int(path.name), saved, restored["state"], position)
    agreed = _agree(_DAMAGED if error else _OK)
  return agreed, error, restored


_EDITED_POSITION = ("No save writes that (a whole count of the batches read, "
                    "one a step): {path}/data_iter/metadata was edited by "
                    "hand. Put it back as saved, or move {path} away and "
                    "rerun to resume from the previous checkpoint.")


def _position_problem(position, step: int | None) -> str | None:
  """What is wrong with a restored Grain position (`next_index`: the batches
  read, one per step) that no save writes, or None; with `step`, the
  checkpoint's, also a count past it. Grain checks only the dataset's
  length: NaN was a traceback at the first batch, `true` read from batch
  1, and a count past the step silently skipped batches (a count behind it
  is not refused: a run imported from nanoGPT's ckpt.pt reads from batch 0
  at its iteration)."""
  if not isinstance(position, dict) or "next_index" not in position:
    return None  # another iterator's state: its own set_state judges it
  index = position["next_index"]
  if type(index) is not int or index < 0:  # pylint: disable=unidiomatic-typecheck
    return (f"its data position {_short(position, 200)} is not a count of "
            "batches read (next_index: an integer from 0)")
  if step is not None and index > step:
    return (f"its data position {_short(position, 200)} is past its step "
            f"{step}")
  return None


def restore_latest(manager: ocp.CheckpointManager, abstract_state, data_iter):
  """Restores the newest readable checkpoint onto `abstract_state`'s
  shardings.

  `data_iter` is moved to the saved position in place. Returns the state, or
  None when the directory holds no checkpoint. A damaged step (lacking a
  commit marker or metadata file, files that cannot be read, or arrays
  whose checksum differs from the one saved with them) is skipped with a
  warning naming the step and the array, for the previous one (and, once
  an older one has loaded, set aside, see `_set_aside`). A step of another
  config (`restore_check`), or one that fails for another reason (its data
  position beyond the current dataset, memory, permissions), stops the run
  with `CheckpointError` and nothing moved. Raises `CheckpointError` naming
  the directory if checkpoints exist but none loads: the run must not
  silently start over.
  """
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    return None
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  failures = []
  for step in steps:
    # A checkpoint of another config (sizes, batch, model family) is the
    # user's mistake, not corruption: say so instead of falling back.
    absent = restore_check.check(str(manager.directory), abstract_state, step,
                                 optional=state_lib.COUNTER_FIELDS)
    path = epath.Path(manager.directory) / str(step)
    logging.info("Restoring checkpoint %s", path)
    target = _without(abstract_state, absent)
    agreed, error, restored = _read_verified(
        path, lambda step=step, target=target: manager.restore(
            step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target),
                data_iter=ocp.args.JsonRestore())), with_position=True)
    status, fix = agreed, None
    if agreed == _OK:
      try:
        error = _position_problem(restored["data_iter"], None)
        if error is None:
          data_iter.set_state(restored["data_iter"])  # Grain's range check
          error = _position_problem(restored["data_iter"], step)
        if error is not None:
          status, fix = _FAILED, _EDITED_POSITION.format(path=path)
      except Exception as e:  # pylint: disable=broad-except
        status = _FAILED
        error = (f"its data position {_short(restored['data_iter'], 200)} "
                 f"does not fit the current training data ({type(e).__name__}"
                 f": {_short(e, 300)})")
        fix = ("The dataset (or config.data, config.global_batch_size) "
               "changed since it was written: go back to the data it was "
               "trained on, or use another --workdir.")
      agreed = _agree(status)
    if agreed == _FAILED:
      raise CheckpointError(_stop_message(
          path, error or "another process could not restore it (see its "
          "log)", failures, fix))
    if agreed == _DAMAGED:
      error = error or "another process could not read it"
      logging.warning("Checkpoint %s cannot be restored (%s); falling back to "
                      "the previous one.", path, error)
      failures.append((step, error))
      continue
    if failures:
      _set_aside(manager, [s for s, _ in failures])
      logging.warning("Resuming from checkpoint %s instead of the newer, "
                      "damaged step(s) %s.", path, [s for s, _ in failures])
    if absent:
      logging.warning("Checkpoint %s was written before trm kept %s in the "
                      "train state; they start at 0.", path, absent)
    return _with_zeros(abstract_state, restored["state"], absent)
  raise CheckpointError(
      f"{manager.directory} holds checkpoints (steps {sorted(steps)}) but none"
      f" can be restored; the newest, step {failures[0][0]}: "
      f"{failures[0][1]}. Refusing to start from scratch over them: move "
      "the directory away or use another --workdir (nothing was moved).")


def _without(abstract_state, absent):
  """`abstract_state`, or with fields `absent` (names) a dict of its other
  fields: the tree a checkpoint lacking those fields holds."""
  if not absent:
    return abstract_state
  return {field.name: getattr(abstract_state, field.name)
          for field in dataclasses.fields(abstract_state)
          if field.name not in absent}


def _with_zeros(abstract_state, restored, absent):
  """The restored state with the fields `absent` from its checkpoint made as
  zeros on `abstract_state`'s shardings (`restored`: `_without`'s tree)."""
  if not absent:
    return restored
  zeros = {name: jax.jit(
      functools.partial(jnp.zeros, spec.shape, spec.dtype),
      out_shardings=spec.sharding)()
           for name in absent
           for spec in [getattr(abstract_state, name)]}
  return abstract_state.replace(**restored, **zeros)


def choose_step(directory: str, choice, flag: str = "--step",
                spell=None) -> int | None:
  """The step of the checkpoint directory `directory` (a trm.main workdir's
  checkpoints/, local or gs://) that `--step` (`cli.define_step_flag`)
  names, for `restore_fields`: None for 'latest' (the newest readable step,
  past a damaged one, as before), the step with the lowest held-out loss
  for 'best' (the one the trainer's keep-best policy keeps; a tie goes to
  the newest, as Orbax's), or the step number given. Called before any
  weight is read; refuses in one line, naming the steps on disk, a step
  that is not there or a 'best' with no ranked step. `flag`: how the
  errors spell the choice (the flag, or the Python API's
  `checkpoint_step`); `spell` (choice -> text), where a config field names
  the step inside a path (TRM's init_checkpoint=WORKDIR/checkpoints/best),
  spells it instead."""
  if choice == "latest":
    return None
  any_step = spell("<N>") if spell else f"{flag}=<a step>"
  any_saved_step = (f"{any_step} (one of the steps)" if spell
                    else f"{flag}=<one of the steps>")
  spell = spell or cli.step_spelling(flag)
  from orbax.checkpoint import checkpoint_manager as ocp_manager  # pylint: disable=g-import-not-at-top
  path = epath.Path(directory)
  steps = (sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())
           if path.is_dir() else [])
  if not steps:
    raise FileNotFoundError(f"{directory} holds no checkpoint; point at a "
                            "trm.main workdir.")
  if choice != "best":
    if choice not in steps:
      raise FileNotFoundError(
          f"{spell(choice)}: {directory} has no step {choice} (its steps: "
          f"{steps}); pass one of them, best or latest.")
    return choice
  name = ocp_manager.METRIC_ITEM_NAME
  losses = {}
  for step in steps:
    record = path / str(step) / name / name
    if not record.exists():
      continue  # saved without an evaluation (or a preemption): unranked
    try:
      losses[step] = read_loss_record(record, EVAL_LOSS)
    except ValueError as e:
      metric = _ranking_metric(path, steps)
      raise CheckpointError(
          f"{spell('best')}: the {_ranks_by(metric)} record {record} is "
          f"damaged ({e}), so the steps cannot be ranked. Pass {any_step} "
          f"(steps: {steps}), or {_record_advice(metric, step)}.") from None
  if not losses:
    raise CheckpointError(
        f"{spell('best')}: no checkpoint of {directory} (steps {steps}) has a "
        f"{_ranks_by(_ranking_metric(path, steps))} to rank it by: a step "
        "is ranked when it is saved "
        "at an evaluation (config.eval_every; the run's config.eval_every "
        f"was 0, or no save met an evaluation). Pass {spell('latest')} or "
        f"{any_saved_step}.")
  return min(losses, key=lambda step: (losses[step], -step))


def _ranking_metric(path: epath.Path, steps: list) -> tuple[str, str]:
  """The metric (`best_metric.spec`) the run ranked its steps by: the one
  the newest step whose metadata can be read was saved under (a resume
  that changed config.best_metric ranks the older steps again)."""
  for step in reversed(steps):
    try:
      return best_metric_lib.of_tag(step_metadata(path / str(step)).get(
          best_metric_lib.TAG))
    except (_Damaged, OSError):
      continue
  return best_metric_lib.DEFAULT


def _ranks_by(metric: tuple[str, str]) -> str:
  """How a refusal names what ranks the steps."""
  return ("held-out loss" if metric == best_metric_lib.DEFAULT
          else f"config.best_metric={metric[0]!r} score")


def _record_advice(metric: tuple[str, str], step: int) -> str:
  """How to write step `step`'s record of `metric` by hand."""
  if metric == best_metric_lib.DEFAULT:
    return (f"write the step's eval/loss from eval_{step}.json in the "
            f'workdir there as {{"{EVAL_LOSS}": <number>}}')
  negated = ", negated (higher is better)," if metric[1] == "max" else ""
  example = (f'{{"{EVAL_LOSS}": <number>, "{best_metric_lib.TAG}": '
             f"{json.dumps(best_metric_lib.tag(metric))}}}")
  return (f"write the step's {metric[0]} from eval_{step}.json in the "
          f"workdir{negated} there as {example}")


def restore_fields(directory: str, abstract_fields: dict,
                   step: int | None = None, family: str | None = None):
  """(fields, step): only the named fields of a saved train state (e.g.
  {'params': ...}; the optimizer state and ACT carry are never read), onto
  the shardings of the given abstract arrays. For sampling, evaluation and
  export, whose batch and optimizer may differ from the run's. A checkpoint
  of another config or model `family` is refused first
  (`restore_check.check`). The fields read are verified against the
  checksums saved with the step; without `step`, a damaged newest step is
  skipped with a warning naming the step and the array for the previous
  one (nothing is moved: these tools only read). With `step`, or when no
  step is readable, `CheckpointError`."""
  if "://" not in directory:  # Orbax reads local paths only when absolute
    directory = os.path.abspath(directory)
  manager = ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(
          create=False, read_only=True,
          # Steps only: their held-out losses (which rank them for keeping)
          # are not read, so a damaged record cannot stop a reader.
          lightweight_initialize=True),
      item_names=("state", "data_iter"))
  steps = sorted(manager.all_steps(), reverse=True)
  if not steps:
    raise FileNotFoundError(f"{directory} holds no checkpoint; point at a "
                            "trm.main workdir.")
  if step is not None:
    if step not in steps:
      raise FileNotFoundError(f"{directory} has no step {step} (its steps: "
                              f"{sorted(steps)}).")
    steps = [step]
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  failures = []
  for candidate in steps:
    restore_check.check(directory, abstract_fields, candidate, family=family)
    path = epath.Path(directory) / str(candidate)
    agreed, error, restored = _read_verified(
        path, lambda step=candidate: manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
                item=abstract_fields,
                restore_args=ocp.checkpoint_utils.construct_restore_args(
                    abstract_fields),
                partial_restore=True))))
    if agreed == _FAILED:
      raise CheckpointError(
          f"Reading checkpoint {path} failed: "
          f"{error or 'on another process (see its log)'}. If the config or "
          "the trm version differs from the run that wrote it, use the "
          "run's config.")
    if agreed == _DAMAGED:
      failures.append((candidate, error or "another process could not read "
                       "it"))
      if step is not None:
        break
      logging.warning("Checkpoint %s cannot be read (%s); using the previous "
                      "one.", path, failures[-1][1])
      continue
    if failures:
      logging.warning("Using checkpoint %s instead of the newer, damaged "
                      "step(s) %s.", path, [s for s, _ in failures])
    return dict(restored["state"]), candidate
  first, why = failures[0]
  raise CheckpointError(
      f"Checkpoint {epath.Path(directory) / str(first)} is damaged: {why}"
      + (f"; no older step of {directory} is readable either" if step is None
         and len(steps) > 1 else "")
      + ". Point at another checkpoint, or rerun training to write a good "
      "one.")
