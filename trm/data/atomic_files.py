"""Atomic file writes (temp file in the same directory, then os.replace).

Shared by the dataset builders (`trm.data.puzzles`) and the text pipeline
(`trm.data.text`).
"""

import contextlib
import json
import math
import os
import re
import stat
import threading
import uuid
from typing import Any

from absl import logging

def is_special(path: str) -> bool:
  """Whether `path` (or what a link there points to) is a device, FIFO or
  socket: neither a regular file nor a directory, which `atomic_write`'s
  rename would replace with a regular file."""
  return (os.path.exists(path) and not os.path.isfile(path)
          and not os.path.isdir(path))


def atomic_write(path: str, write_fn, mode: str = "wb") -> None:
  """Writes `path` by calling `write_fn(file)` on a temp file, then renaming.

  The temp file lives in the same directory, so the final os.replace is
  atomic: readers (and `ensure_dataset`-style existence checks) never see a
  half-written file, even if the writer is killed.

  A device, FIFO or socket at `path` (or a link to one) is refused: the
  rename replaced it with a regular file (`trm.visualize --out=/dev/null`,
  run as root, replaced /dev/null for every process on the host).
  """
  if is_special(path):  # a directory: the rename says so
    raise ValueError(f"{path} is not a regular file (a device, FIFO or "
                     "socket), which writing the file would replace; name a "
                     "file.")
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  # Not tempfile.mkstemp: its files are mode 0600, this one honours the umask
  # like a plain open() would. Mode "x" refuses to reuse an existing name.
  tmp = os.path.join(directory,
                     f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
  try:
    with open(tmp, mode.replace("w", "x")) as f:
      write_fn(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError) and e.filename is None:
      # A failed write or fsync (a full disk) names no file; the caller's
      # message should name the one being written.
      e.filename = path
    raise
  sync_directory(directory)


class _PythonWrites:
  """A file seen by numpy as no real file, so np.save writes through
  Python's `write` (16 MiB chunks): numpy's own `tofile` path reports a
  full disk as OSError with no errno ("[Errno None] None"), which no
  disk-error message recognised."""

  def __init__(self, file):
    self._file = file

  def write(self, data):
    return self._file.write(data)


def write_npy(path: str, array) -> None:
  """`array` to the .npy file `path`, atomically (no pickles)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  array = np.asarray(array)
  atomic_write(path, lambda f: np.save(_PythonWrites(f), array,
                                       allow_pickle=False))


def sync_directory(directory: str) -> None:
  """The rename on disk before the caller goes on: after a power loss a
  later write (a settings file, the next checkpoint's marker) could be
  there and this one not. Best effort: some file systems refuse to sync a
  directory (EINVAL), and the file itself is already synced."""
  try:
    fd = os.open(directory, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


# `atomic_write`'s temporary names: a dot, the final name, 32 hex digits.
_TEMPORARY = re.compile(r"\.(.+)\.[0-9a-f]{32}\.tmp")


def remove_temporaries(directory: str, final=lambda name: True) -> list[str]:
  """Deletes the temporary files `atomic_write` left in `directory` (a
  writer killed before its rename: nothing else ever removed them) for the
  final names `final` accepts; the paths removed. Only for files no other
  process writes now (ones the caller holds a lock on): a live writer's
  file would go too."""
  try:
    names = os.listdir(directory)
  except OSError:  # missing, not a directory: nothing was left there
    return []
  removed = []
  for name in sorted(names):
    path = os.path.join(directory, name)
    match = _TEMPORARY.fullmatch(name)
    if match and final(match.group(1)) and os.path.isfile(path) and not (
        os.path.islink(path)):
      try:
        os.remove(path)
      except FileNotFoundError:
        continue
      except PermissionError as e:  # a read-only folder: kept, said once
        logging.warning("Could not remove %s, the unfinished write of a "
                        "killed run (%s); left there. Make %s writable and "
                        "delete it.", path, e.strerror, directory)
        continue
      removed.append(path)
  return removed


def replace_whole(path, text: str | bytes) -> None:
  """Replaces the file `path` (a str or epath.Path) whole: a local file
  through `atomic_write`, so a crash or a full disk mid-write leaves the
  previous file (or none) instead of a truncated one; an object store's
  object is replaced whole by its own write."""
  data = text.encode() if isinstance(text, str) else text
  if "://" in str(path):
    from etils import epath  # pylint: disable=g-import-not-at-top
    epath.Path(path).write_bytes(data)
  else:
    atomic_write(str(path), lambda f: f.write(data))


def remove_before_rewrite(*paths: str) -> None:
  """Removes each of `paths` that exists (records describing a file about
  to be rewritten, such as its settings or summary) and syncs their
  directories, so the removals reach the disk before the rewrite that
  follows: no kill or crash leaves an old record beside new contents."""
  directories = set()
  for path in paths:
    try:
      os.remove(path)
    except FileNotFoundError:
      continue
    directories.add(os.path.dirname(os.path.abspath(path)))
  for directory in sorted(directories):
    sync_directory(directory)


def write_json_atomic(path: str, obj: Any) -> None:
  """Atomically writes `obj` as JSON to `path`."""
  atomic_write(path, lambda f: json.dump(obj, f, indent=2), mode="w")


def nonfinite_as_null(value):
  """`value` with each NaN or infinite float (a diverged loss) made None,
  for `json.dump(..., allow_nan=False)`: null, as JavaScript's
  JSON.stringify writes them. Python's default `NaN`/`Infinity` tokens are
  not JSON: jq and other strict readers refused such files."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {key: nonfinite_as_null(v) for key, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [nonfinite_as_null(v) for v in value]
  return value


_held = threading.local()  # directories whose dir_lock this thread holds


def _locked_dir(path: str) -> int:
  """An fd of directory `path` (made if missing) holding its flock; the
  directory is made again if a holder removed it while this one waited."""
  import fcntl  # pylint: disable=g-import-not-at-top
  while True:
    os.makedirs(path, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as e:
      logging.info("No flock on %s (%s); preparing without it.", path, e)
      return fd
    try:
      if os.path.samestat(os.fstat(fd), os.stat(path)):
        return fd
    except FileNotFoundError:
      pass
    os.close(fd)


def check_dir_or_absent(path: str, what: str = "") -> None:
  """A NotADirectoryError naming `path` (and `what`, the flag or config
  field that gave it) when something other than a directory is there: a
  file, a link that loops or leads to no directory. os.makedirs said only
  "[Errno 17] File exists" of them. A link to a missing path is fine (the
  directory is made where it points). A remote path (gs://...) is a
  ValueError."""
  named = f" ({what})" if what else ""
  if "://" in str(path):
    # os.makedirs made a local directory "gs:" and the data went there,
    # named as if in the bucket.
    raise ValueError(
        f"{path}{named} is a remote path, but datasets are prepared on (and "
        "memory-mapped from) local disk: name a local directory (copy the "
        "data there first if it is prepared).")
  # One stat decides: an isdir and then an lexists saw "no directory" and
  # then "something", and called a directory another process made in
  # between (process 0 preparing the data the others wait for) a file.
  try:
    if stat.S_ISDIR(os.stat(path).st_mode):
      return
    kind = "a link to a file" if os.path.islink(path) else "a file"
  except FileNotFoundError:
    return  # absent, or a dangling link: makedirs makes its target
  except OSError as e:
    if not os.path.islink(path):
      return  # unreadable: makedirs' own error names it
    kind = f"a link that cannot be followed ({e.strerror.lower()})"
  raise NotADirectoryError(
      f"{path}{named} is {kind}, not a directory: move it away, or name "
      "another directory.")


@contextlib.contextmanager
def dir_lock(output_dir: str, what: str = ""):
  """Holds `output_dir` against other preparations of it (other processes
  or threads) until the block ends: an flock on the directory itself (no
  extra file), so two runs started together do not interleave their
  files. Re-entrant in one thread; where flock is refused (some network
  file systems) they run unguarded, as before. A directory it made is
  removed again if the block leaves it empty (input refused before
  anything was written leaves nothing behind). Something other than a
  directory at `output_dir` is refused in one line naming it and `what`
  (`check_dir_or_absent`)."""
  check_dir_or_absent(output_dir, what)
  key = os.path.realpath(output_dir)
  held = _held.__dict__.setdefault("dirs", set())
  if key in held:
    yield
    return
  made = not os.path.isdir(key)
  fd = _locked_dir(key)
  try:
    held.add(key)
    try:
      yield
    finally:
      held.discard(key)
      if made:  # before the flock goes: a waiter then makes it again
        try:
          os.rmdir(key)
        except OSError:
          pass  # not empty: the preparation wrote into it
  finally:
    os.close(fd)  # releases the flock
