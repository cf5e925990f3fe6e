"""trm.data.atomic_files: a replaced file's directory is synced after the
rename (a power loss could otherwise keep a later write and lose this
one), and a file system that refuses to sync a directory is no error;
`check_dir_or_absent` names what is not a directory, and never a
directory that another process makes while it looks."""
import os
import stat
import threading

import numpy as np
import pytest
import special_files

from trm.data import atomic_files


def _synced(monkeypatch):
  """Records, per os.fsync call, whether it synced a directory."""
  calls, real = [], os.fsync

  def fsync(fd):
    calls.append(stat.S_ISDIR(os.fstat(fd).st_mode))
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  return calls


def test_the_directory_is_synced_after_the_rename(tmp_path, monkeypatch):
  path = tmp_path / "a.json"
  calls = _synced(monkeypatch)
  atomic_files.write_json_atomic(str(path), {"x": 1})
  assert calls == [False, True]  # the file, then its directory
  assert path.read_text() == '{\n  "x": 1\n}'


def test_a_directory_that_cannot_be_synced_is_no_error(tmp_path,
                                                       monkeypatch):
  real = os.fsync

  def fsync(fd):
    if stat.S_ISDIR(os.fstat(fd).st_mode):
      raise OSError(22, "Invalid argument")  # as some file systems answer
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  atomic_files.replace_whole(str(tmp_path / "b.txt"), "text")
  assert (tmp_path / "b.txt").read_text() == "text"
  (tmp_path / "settings.json").write_text("{}")
  atomic_files.remove_before_rewrite(str(tmp_path / "settings.json"))
  assert os.listdir(tmp_path) == ["b.txt"]


def test_check_dir_or_absent_names_what_is_not_a_directory(tmp_path):
  (tmp_path / "dir").mkdir()
  (tmp_path / "file").write_text("x")
  os.symlink(tmp_path / "file", tmp_path / "to_file")
  os.symlink(tmp_path / "missing", tmp_path / "dangling")
  os.symlink(tmp_path / "loop", tmp_path / "loop")
  for fine in ("dir", "absent", "dangling"):
    atomic_files.check_dir_or_absent(str(tmp_path / fine), "--out")
  for name, kind in (("file", "a file"), ("to_file", "a link to a file"),
                     ("loop", "a link that cannot be followed")):
    with pytest.raises(NotADirectoryError,
                       match=f"{name} \\(--out\\) is {kind}"):
      atomic_files.check_dir_or_absent(str(tmp_path / name), "--out")


def test_a_directory_made_while_it_is_checked_is_no_file(tmp_path):
  """Process 1 of a text run checks the data directory while process 0
  makes it (tests/data/test_text_data.py's waiter failed so in a CI run):
  two looks, "no directory" then "something there", had called it a file.
  Here a thread makes and removes it as fast as it can while 20,000
  checks run (the two looks failed in each of five runs)."""
  path = str(tmp_path / "data")
  stop = threading.Event()

  def churn():
    while not stop.is_set():
      try:
        os.mkdir(path)
        os.rmdir(path)
      except OSError:
        pass

  thread = threading.Thread(target=churn)
  thread.start()
  try:
    for _ in range(20_000):
      atomic_files.check_dir_or_absent(path, "config.data_root")
  finally:
    stop.set()
    thread.join()


def test_a_short_write_under_write_npy_has_its_errno_and_the_file(tmp_path):
  """np.save to a real file writes with ndarray.tofile, which reported a
  short write (a full disk: "1048576 requested and 10208 written") as an
  OSError with no errno, so the dataset build's message gave no cause. A
  file-size limit (RLIMIT_FSIZE, in a child process) cuts the write short
  the same way and gives Python's write its errno (EFBIG)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  path = tmp_path / "all__labels.npy"
  child = f"""
import errno, resource, signal
import numpy as np
from trm.data import atomic_files
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
try:
  atomic_files.write_npy({str(path)!r}, np.zeros((1024, 1024), np.int32))
except OSError as e:
  print(errno.errorcode.get(e.errno), e.filename)
"""
  run = subprocess.run([sys.executable, "-c", child], capture_output=True,
                       text=True, timeout=120)
  assert run.stdout.split() == ["EFBIG", str(path)], (run.stdout, run.stderr)
  assert not list(tmp_path.iterdir())  # the temp file removed
  atomic_files.write_npy(str(path), np.arange(6).reshape(2, 3))
  np.testing.assert_array_equal(np.load(path), np.arange(6).reshape(2, 3))


def test_a_fifo_or_a_link_to_one_is_never_replaced(tmp_path):
  """The final rename replaced whatever `path` named: `trm.visualize
  --out=/dev/null`, run as root, put a regular file in place of /dev/null
  for every process on the host. A FIFO stands in for the device here."""
  for path in special_files.fifo_and_link(tmp_path, "link.json"):
    with pytest.raises(ValueError, match=f"^{path} is not a regular file "
                       r"\(a device, FIFO or socket\)"):
      atomic_files.write_json_atomic(str(path), {"x": 1})
    assert special_files.still_fifo(path)
  assert sorted(os.listdir(tmp_path)) == ["fifo", "link.json"]  # no temp
