"""Helpers for the code sandbox's tests of processes that outlive their
sample (tests/families/dream/test_sandbox_hostile.py and
test_sandbox_fallback.py)."""
import os
import shutil
import signal
import tempfile
import time


def alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie does not)."""
  try:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
      return not any(line.split()[1:2] == ["Z"] for line in f
                     if line.startswith("State:"))
  except OSError:
    return False


def assert_ends(pid: int, seconds: float) -> None:
  """`pid` stops running within `seconds`; else it is killed and the test
  fails."""
  deadline = time.monotonic() + seconds
  while alive(pid) and time.monotonic() < deadline:
    time.sleep(0.05)
  try:
    assert not alive(pid)
  finally:
    if alive(pid):
      os.kill(pid, signal.SIGKILL)


class SharedDir:
  """A directory any uid may write (pytest's tmp_path sits below a 0700
  one: a fallback program as root may run as a uid of its own), removed
  on exit."""

  def __enter__(self) -> str:
    self.path = tempfile.mkdtemp(prefix="trm_sandbox_test_")
    os.chmod(self.path, 0o1777)
    return self.path

  def __exit__(self, *_):
    shutil.rmtree(self.path, ignore_errors=True)


def setsid_daemon(pid_file: str, then: str = "") -> str:
  """A program that double-forks a daemon in a session of its own, which
  writes its pid to `pid_file` and sleeps a minute; the program waits for
  the file and then runs `then`."""
  return ("import os, time\nif os.fork() == 0:\n    os.setsid()\n"
          "    if os.fork() == 0:\n"
          f"        open({pid_file!r} + '.new', 'w').write(\n"
          "            str(os.getpid()))\n"
          f"        os.rename({pid_file!r} + '.new', {pid_file!r})\n"
          "        time.sleep(60)\n    os._exit(0)\n"
          f"while not os.path.exists({pid_file!r}):\n"
          "    time.sleep(0.01)\n" + then)
