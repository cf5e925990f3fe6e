"""One trainer per workdir (`trm.core.workdir_lock`): a live holder refuses a
second trainer before it writes anything, a dead one is taken over, and the
lock goes away with the run."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from trm.core import train

from trm import families
from trm.core import workdir_lock

from test_train import tiny_config  # pylint: disable=g-import-not-at-top


def _write_lock(workdir, **fields):
  record = {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.time(), "renewed": time.time(),
            "path": os.path.join(workdir, workdir_lock.LOCK_NAME)}
  record.update(fields)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, workdir_lock.LOCK_NAME), "w") as f:
    json.dump(record, f)


def test_a_live_holder_refuses_a_second_trainer_before_any_write(tmp_path):
  workdir = str(tmp_path / "run")
  holder = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(120)"])
  try:
    _write_lock(workdir, pid=holder.pid)
    with pytest.raises(workdir_lock.WorkdirLockedError,
                       match=rf"in use by another trainer \(host .*, pid "
                       rf"{holder.pid}, started .*another --workdir"):
      train.train_and_evaluate(tiny_config(), workdir, families.build_task)
    assert sorted(os.listdir(workdir)) == [workdir_lock.LOCK_NAME]
  finally:
    holder.kill()
    holder.wait()


def test_a_dead_holder_is_taken_over_and_the_lock_released(tmp_path, caplog):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  _write_lock(str(tmp_path), pid=dead.pid)
  with workdir_lock.WorkdirLock(str(tmp_path)) as lock:
    with open(lock.path) as f:
      assert json.load(f)["pid"] == os.getpid()
  assert "stale workdir lock" in caplog.text
  assert f"no longer running" in caplog.text
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_NAME)


def test_another_hosts_lock_is_stale_only_after_its_lease(tmp_path):
  _write_lock(str(tmp_path), host="elsewhere", pid=1)
  with pytest.raises(workdir_lock.WorkdirLockedError, match="host elsewhere"):
    workdir_lock.WorkdirLock(str(tmp_path)).__enter__()
  _write_lock(str(tmp_path), host="elsewhere", pid=1,
              renewed=time.time() - 2 * workdir_lock.LEASE_SECONDS)
  with workdir_lock.WorkdirLock(str(tmp_path)):
    pass


def test_two_concurrent_locks_exclude_each_other(tmp_path):
  with workdir_lock.WorkdirLock(str(tmp_path)):
    # The same process again (as a second trainer in one notebook would).
    # Its pid is alive, so it is refused like any other live holder.
    with pytest.raises(workdir_lock.WorkdirLockedError):
      workdir_lock.WorkdirLock(str(tmp_path)).__enter__()


def test_the_holder_renews_its_lease(tmp_path, caplog, monkeypatch):
  # Renewal rewrites an existing lock file; it used to fail every time
  # ("Cannot rename ... Destination ... already exists"), so a long run's
  # lease lapsed and another host could take the workdir over.
  monkeypatch.setattr(workdir_lock, "LEASE_SECONDS", 0.2)  # renew each 0.05 s
  with workdir_lock.WorkdirLock(str(tmp_path)) as lock:
    with open(lock.path) as f:
      first = json.load(f)
    deadline = time.time() + 10
    while time.time() < deadline:
      time.sleep(0.1)
      with open(lock.path) as f:
        record = json.load(f)
      if record["renewed"] > first["renewed"]:
        break
    assert record["renewed"] > first["renewed"]
    assert record["pid"] == os.getpid()
    assert record["started"] == first["started"]
  assert "Could not renew" not in caplog.text
  assert not os.path.exists(tmp_path / workdir_lock.LOCK_NAME)
  assert [n for n in os.listdir(tmp_path) if n.endswith(".tmp")] == []
