"""trm.core.processes: whether a recorded pid still runs on this host."""
import os
import subprocess
import sys

from trm.core import processes


def test_a_live_process_is_alive_and_has_a_start_time():
  assert processes.alive(os.getpid())
  assert isinstance(processes.start_ticks(os.getpid()), int)


def test_an_ended_process_is_not_alive():
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  child.wait()  # reaped: its pid names no process now
  assert not processes.alive(child.pid)
  assert processes.start_ticks(child.pid) is None


def test_pids_that_name_groups_are_never_one_process():
  # os.kill(0, 0) succeeds (it signals this process group): no trainer or
  # export ever has pid 0 or a negative one.
  for pid in (0, -1, -os.getpid()):
    assert not processes.alive(pid)
    assert processes.start_ticks(pid) is None
