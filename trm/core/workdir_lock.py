"""One trainer per workdir: a lock file naming its holder.

`<workdir>/trainer.lock` is JSON {host, pid, started, renewed, job}. Process
0 of a job takes it before anything is written and the other processes of
the same job share it (they learn process 0's verdict, so a refused job
stops everywhere). A second trainer is refused with the holder's name. A
lock whose holder is gone is taken over with a warning: on the same host when
its pid no longer runs, otherwise (another host, or `gs://`, where no pid can
be checked) when its lease has not been renewed for `LEASE_SECONDS`; the
holder renews it from a daemon thread.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import jax
from absl import logging
from etils import epath
from jax.experimental import multihost_utils
import numpy as np

from trm.core import cli

LOCK_NAME = "trainer.lock"
LEASE_SECONDS = 300.0


class WorkdirLockedError(cli.UserError, RuntimeError):
  """Another live trainer holds the workdir."""


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  return True


def _stale(holder: dict, now: float) -> str | None:
  """Why the recorded holder is gone, or None if it may still run."""
  if holder.get("host") == socket.gethostname() and "://" not in holder.get(
      "path", ""):
    if not _pid_alive(int(holder.get("pid", -1))):
      return f"its process {holder.get('pid')} is no longer running"
    return None
  age = now - float(holder.get("renewed", 0))
  if age > LEASE_SECONDS:
    return f"its lease was last renewed {age:.0f} s ago"
  return None


def _describe(holder: dict) -> str:
  started = time.strftime("%Y-%m-%d %H:%M:%S",
                          time.localtime(float(holder.get("started", 0))))
  return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
          f"{started}")


class WorkdirLock:
  """Context manager holding `<workdir>/trainer.lock` for a whole run."""

  def __init__(self, workdir: str):
    self.path = epath.Path(workdir) / LOCK_NAME
    self._record = None
    self._stop = threading.Event()
    self._thread = None

  def _write(self, record: dict, exclusive: bool) -> bool:
    """Writes the lock; with `exclusive`, only if no file is there (atomic
    on local disks; object stores have no such primitive, and their lease is
    what protects them)."""
    text = json.dumps(record)
    local = "://" not in str(self.path)
    if exclusive and local:
      try:
        fd = os.open(str(self.path), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                     0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, "w") as f:
        f.write(text)
      return True
    if exclusive and self.path.exists():
      return False
    if local:  # readers never see a half-written lock
      tmp = self.path.parent / f".{LOCK_NAME}.{os.getpid()}.tmp"
      tmp.write_text(text)
      # os.replace overwrites atomically; epath's rename refuses an existing
      # destination, which made every lease renewal fail.
      os.replace(str(tmp), str(self.path))
    else:
      self.path.write_text(text)
    return True

  def _acquire_here(self) -> str | None:
    """Process 0's attempt: None on success, else the refusal message."""
    now = time.time()
    record = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": now, "renewed": now, "path": str(self.path),
              "processes": jax.process_count()}
    for _ in range(2):
      if self._write(record, exclusive=True):
        self._record = record
        return None
      try:
        holder = json.loads(self.path.read_text())
      except (OSError, ValueError):
        holder = None
      if holder is None:
        reason = "it is unreadable"
      else:
        reason = _stale(holder, now)
        if reason is None:
          return (
              f"The workdir {self.path.parent} is in use by another trainer "
              f"({_describe(holder)}; lock file {self.path}). Two trainers "
              "would overwrite each other's checkpoints and logs. Wait for "
              "that run or stop it, or pass another --workdir; if that "
              "trainer is gone, delete the lock file.")
      logging.warning("Taking over the stale workdir lock %s (%s%s).",
                      self.path, reason,
                      f"; holder {_describe(holder)}" if holder else "")
      try:
        self.path.unlink()
      except FileNotFoundError:
        pass
    return f"Could not take the workdir lock {self.path}; try again."

  def __enter__(self):
    error = self._acquire_here() if jax.process_index() == 0 else None
    if jax.process_count() > 1:
      refused = multihost_utils.broadcast_one_to_all(
          np.int32(error is not None))
      if int(refused) and error is None:
        error = (f"Process 0 could not take the workdir lock {self.path} "
                 "(another trainer holds it; see process 0's log).")
    if error:
      raise WorkdirLockedError(error)
    if self._record is not None:
      self._thread = threading.Thread(target=self._renew, daemon=True,
                                      name="workdir-lock")
      self._thread.start()
    return self

  def _renew(self):
    while not self._stop.wait(LEASE_SECONDS / 4):
      self._record["renewed"] = time.time()
      try:
        self._write(self._record, exclusive=False)
      except OSError as e:
        logging.warning("Could not renew the workdir lock %s: %s", self.path,
                        e)

  def __exit__(self, *unused_exc):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
    if self._record is None:
      return
    try:
      holder = json.loads(self.path.read_text())
      if (holder.get("pid"), holder.get("host")) == (
          self._record["pid"], self._record["host"]):
        self.path.unlink()
    except (OSError, ValueError):
      pass
    self._record = None
