"""One trainer per workdir: a lock file naming its holder.

`<workdir>/trainer.lock` is JSON {host, pid, started, renewed, path,
processes}. Process 0 of a job takes it before anything is written and the
other processes of the same job share it (they learn process 0's verdict,
so a refused job stops everywhere). A second trainer is refused with the
holder's name. A lock whose holder is gone is taken over with a warning: on
the same host when its pid no longer runs or now belongs to a process
that started at another time than the holder recorded (`pid_start`: a
restarted container's trainer often gets its predecessor's pid), otherwise (another host, or
`gs://`, where no pid can be checked) when its lease has not been renewed
for `LEASE_SECONDS`; the holder renews it from a daemon thread.

Race-free on local disks: the lock's content is written (and fsynced) into
a private temporary file first and then hard-linked to `trainer.lock`, which
fails if that name exists, so no reader ever sees a half-written lock and
of two trainers starting at the same instant exactly one wins. Taking over a
stale lock (read, judge, remove, link) runs under `flock` on the workdir
itself, so two trainers cannot both remove the stale lock and both win; the
lock is removed only if it is still the file (inode) that was judged stale.
A lock that is not a well-formed record (invalid JSON, not an object, a
field of the wrong type) is never taken over: the run stops with one line
naming the file. On `gs://` there is no exclusive create: the lease is what
protects there (two trainers started within the same second can still
both start).
"""
from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import socket
import tempfile
import threading
import time

import jax
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
import numpy as np

from trm.core import cli
from trm.core import processes
from trm.data import atomic_files

LOCK_NAME = "trainer.lock"
LEASE_SECONDS = 300.0

# Required fields of a lock record and their types (bool is no int here).
_FIELDS = {"host": str, "pid": int, "started": numbers.Real,
           "renewed": numbers.Real}
_OPTIONAL = {"path": str, "processes": int, "pid_start": int}


class WorkdirLockedError(cli.UserError, RuntimeError):
  """Another live trainer holds the workdir."""


class MalformedLockError(WorkdirLockedError):
  """The lock file is not a lock record this code can judge."""


def _pid_reused(holder: dict) -> bool:
  """Whether the live process with the holder's pid is another process (a
  restarted container's trainer often gets its predecessor's pid, its own
  included): it started at another time than the one the holder recorded.
  A record without `pid_start` (an older trainer's) keeps its live pid:
  comparing wall-clock times instead would hand a live trainer's lock to a
  second one whenever the clock stepped back."""
  if "pid_start" not in holder:
    return False
  ticks = processes.start_ticks(holder["pid"])
  return ticks is not None and ticks != holder["pid_start"]


def _stale(holder: dict, now: float) -> str | None:
  """Why the recorded holder is gone, or None if it may still run."""
  if holder["host"] == socket.gethostname() and "://" not in holder.get(
      "path", ""):
    if not processes.alive(holder["pid"]):
      return f"its process {holder['pid']} is no longer running"
    if _pid_reused(holder):
      return (f"its process {holder['pid']} is gone; that pid now belongs to "
              "a process started at another time")
    return None
  age = now - float(holder["renewed"])
  if age > LEASE_SECONDS:
    return f"its lease was last renewed {age:.0f} s ago"
  return None


def _describe(holder: dict) -> str:
  started = time.strftime("%Y-%m-%d %H:%M:%S",
                          time.localtime(float(holder["started"])))
  return (f"host {holder['host']}, pid {holder['pid']}, started "
          f"{started}")


def parse(text: str) -> dict:
  """The lock record in `text`; ValueError saying what is wrong with it."""
  try:
    record = json.loads(text)
  except ValueError as e:
    raise ValueError(f"not valid JSON ({e})" if text.strip()
                     else "it is empty") from None
  if not isinstance(record, dict):
    raise ValueError(f"it holds a JSON {type(record).__name__}, not an "
                     "object")
  for name, kind in list(_FIELDS.items()) + list(_OPTIONAL.items()):
    if name not in record:
      if name in _FIELDS:
        raise ValueError(f"it has no field {name!r}")
      continue
    value = record[name]
    wanted = {numbers.Real: "a finite number", int: "an integer",
              str: "a string"}[kind]
    if (isinstance(value, bool) or not isinstance(value, kind)
        or (kind is numbers.Real and not math.isfinite(value))):
      raise ValueError(f"field {name!r} is {value!r}, not {wanted}")
  return record


class WorkdirLock:
  """Context manager holding `<workdir>/trainer.lock` for a whole run."""

  def __init__(self, workdir: str):
    self.path = epath.Path(workdir) / LOCK_NAME
    self._local = "://" not in str(self.path)
    self._record = None
    self._stop = threading.Event()
    self._thread = None
    self.taken_over = None  # the record of a trainer that took the lock

  # ------------------------------------------------------------ local files

  def _temporary(self, text: str) -> str:
    """A finished, fsynced private file holding `text`, beside the lock."""
    fd, tmp = tempfile.mkstemp(prefix=f".{LOCK_NAME}.", suffix=".tmp",
                               dir=str(self.path.parent))
    try:
      with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
      os.chmod(tmp, 0o644)
    except BaseException:
      os.unlink(tmp)
      raise
    return tmp

  def _create_local(self, text: str) -> bool:
    """Puts a complete lock in place unless one is there (hard link: fails
    with EEXIST if another trainer's lock appeared first)."""
    tmp = self._temporary(text)
    try:
      os.link(tmp, str(self.path))
    except FileExistsError:
      return False
    finally:
      os.unlink(tmp)
    atomic_files.sync_directory(str(self.path.parent))
    return True

  @contextlib.contextmanager
  def _guard(self):
    """Serialises lock acquisition on a local workdir (flock on the
    directory itself: no extra file). Where flock is refused (some network
    file systems) the inode check in `_remove_if_same` is what remains."""
    if not self._local:
      yield
      return
    import fcntl  # pylint: disable=g-import-not-at-top
    try:
      fd = os.open(str(self.path.parent), os.O_RDONLY)
    except OSError:
      yield
      return
    try:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX)
      except OSError as e:
        logging.info("No flock on %s (%s); taking the lock without it.",
                     self.path.parent, e)
      yield
    finally:
      os.close(fd)  # releases the flock

  def _read(self):
    """(record or None if there is no lock, raw text, inode or None).
    Raises MalformedLockError for a lock that is not a record."""
    try:
      if self._local:
        with open(str(self.path), "rb") as f:
          inode = os.fstat(f.fileno())
          raw = f.read()
        inode = (inode.st_dev, inode.st_ino)
      else:
        raw, inode = self.path.read_bytes(), None
    except FileNotFoundError:
      return None, None, None
    try:
      return parse(raw.decode("utf-8")), raw, inode
    except (ValueError, UnicodeDecodeError) as e:
      raise MalformedLockError(
          f"The workdir lock {self.path} is not a lock record ({e}), so it "
          "cannot tell whether a trainer holds the workdir. If no trainer "
          f"runs on {self.path.parent}, delete {self.path} and rerun; "
          "otherwise wait for that run or pass another --workdir.") from None

  def _remove_if_same(self, inode) -> None:
    """Removes the lock if it is still the file that was judged stale."""
    if self._local:
      try:
        st = os.stat(str(self.path))
      except FileNotFoundError:
        return
      if inode is not None and (st.st_dev, st.st_ino) != inode:
        return  # another trainer's fresh lock: leave it
      try:
        os.unlink(str(self.path))
      except FileNotFoundError:
        pass
    else:
      try:
        self.path.unlink()
      except FileNotFoundError:
        pass

  def _write_remote(self, text: str, exclusive: bool) -> bool:
    # Object stores have no exclusive create; the lease protects them.
    if exclusive and self.path.exists():
      return False
    self.path.write_text(text)
    return True

  def _replace(self, text: str) -> None:
    """Rewrites the held lock (lease renewal); readers see the old or the
    new record, never part of one."""
    if not self._local:
      self.path.write_text(text)
      return
    tmp = self._temporary(text)
    try:
      # os.replace overwrites atomically; epath's rename refuses an
      # existing destination, which made every lease renewal fail.
      os.replace(tmp, str(self.path))
    except BaseException:
      os.unlink(tmp)
      raise

  # ---------------------------------------------------------------- holding

  def _acquire_here(self) -> str | None:
    """Process 0's attempt: None on success, else the refusal message."""
    now = time.time()
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": now, "renewed": now, "path": str(self.path),
              "processes": jax.process_count()}
    ticks = processes.start_ticks(os.getpid())
    if ticks is not None:
      record["pid_start"] = ticks
    text = json.dumps(record)
    with self._guard():
      for _ in range(3):
        if (self._create_local(text) if self._local
            else self._write_remote(text, exclusive=True)):
          self._record = record
          return None
        holder, _, inode = self._read()
        if holder is None:  # released meanwhile: try again
          continue
        reason = _stale(holder, now)
        if reason is None:
          return (
              f"The workdir {self.path.parent} is in use by another trainer "
              f"({_describe(holder)}; lock file {self.path}). Two trainers "
              "would overwrite each other's checkpoints and logs. Wait for "
              "that run or stop it, or pass another --workdir; if that "
              "trainer is gone, delete the lock file.")
        logging.warning("Taking over the stale workdir lock %s (%s; holder "
                        "%s).", self.path, reason, _describe(holder))
        self._remove_if_same(inode)
    return f"Could not take the workdir lock {self.path}; try again."

  def __enter__(self):
    error, kind = None, WorkdirLockedError
    if jax.process_index() == 0:
      try:
        error = self._acquire_here()
      except MalformedLockError as e:
        error, kind = str(e), MalformedLockError
    if jax.process_count() > 1:
      refused = multihost_utils.broadcast_one_to_all(
          np.int32(error is not None))
      if int(refused) and error is None:
        error = (f"Process 0 could not take the workdir lock {self.path} "
                 "(another trainer holds it, or it is malformed; see "
                 "process 0's log).")
    if error:
      raise kind(error)
    if self._record is not None:
      self._thread = threading.Thread(target=self._renew, daemon=True,
                                      name="workdir-lock")
      self._thread.start()
    return self

  def _is_ours(self, holder: dict) -> bool:
    return all(holder.get(k) == self._record[k]
               for k in ("host", "pid", "started"))

  def _renew(self):
    while not self._stop.wait(LEASE_SECONDS / 4):
      try:
        with self._guard():
          try:
            holder, _, _ = self._read()
          except MalformedLockError:
            holder = None  # damaged: ours is written over it
          if holder is not None and not self._is_ours(holder):
            # This trainer stalled past its lease (a hung file system, a
            # stopped process) and another took the workdir over: writing
            # our record back hid that from both.
            self.taken_over = holder
            logging.error(
                "The workdir lock %s was taken over by another trainer (%s) "
                "while this one held it, stalled past its %d s lease; this "
                "trainer saves no more checkpoints there.", self.path,
                _describe(holder), LEASE_SECONDS)
            return
          self._record["renewed"] = time.time()
          self._replace(json.dumps(self._record))
      except OSError as e:
        logging.warning("Could not renew the workdir lock %s: %s", self.path,
                        e)

  def check_held(self) -> None:
    """A WorkdirLockedError once another trainer has taken the lock over
    (`_renew`): this one must not write the workdir any more. Collective
    in a job of several processes (call it on all, at the same step, as a
    save): process 0 holds the lock, and its verdict stops every process
    before the save (the others went on into the save's collectives and
    waited there until process 0's exit ended them as a lost process)."""
    if jax.process_count() > 1:
      taken = multihost_utils.broadcast_one_to_all(
          np.int32(self.taken_over is not None))
      if int(taken) and self.taken_over is None:
        raise WorkdirLockedError(
            f"The workdir {self.path.parent} was taken over by another "
            "trainer while this job stalled past its "
            f"{LEASE_SECONDS:g} s lease (process 0 found it; see its log); "
            "stopping without saving. Wait for that run, or pass another "
            "--workdir.")
    if self.taken_over is not None:
      raise WorkdirLockedError(
          f"The workdir {self.path.parent} was taken over by another trainer "
          f"({_describe(self.taken_over)}) while this one stalled past its "
          f"{LEASE_SECONDS:g} s lease; stopping without saving, so as not to "
          "write over its checkpoints. Wait for that run, or pass another "
          "--workdir.")

  def __exit__(self, *unused_exc):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
    if self._record is None:
      return
    try:
      with self._guard():
        holder, _, inode = self._read()
        if holder is not None and (holder["pid"], holder["host"]) == (
            self._record["pid"], self._record["host"]):
          self._remove_if_same(inode)
    except (OSError, MalformedLockError):
      pass
    self._record = None
