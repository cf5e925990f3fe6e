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
from trm.core import processes
from trm.core import workdir_lock

from test_train import ROOT, tiny_config  # pylint: disable=g-import-not-at-top


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


def test_a_lock_whose_pid_was_reused_is_taken_over(tmp_path, caplog):
  # A restarted container's trainer often gets its killed predecessor's pid
  # (its own pid here) on the same host: that pid is alive, but a process
  # that started at another time than the holder recorded is not the holder.
  ticks = processes.start_ticks(os.getpid())
  assert ticks is not None
  _write_lock(str(tmp_path), pid_start=ticks + 1)
  with workdir_lock.WorkdirLock(str(tmp_path)) as lock:
    with open(lock.path) as f:
      assert json.load(f)["pid_start"] == ticks
  assert "pid now belongs to a process started at another time" in (
      caplog.text)
  # The same start is the live holder itself ...
  _write_lock(str(tmp_path), pid_start=ticks)
  with pytest.raises(workdir_lock.WorkdirLockedError):
    workdir_lock.WorkdirLock(str(tmp_path)).__enter__()
  # ... and so is a live pid an older trainer recorded without its start,
  # however long ago it says it took the lock (no wall-clock guess).
  _write_lock(str(tmp_path), started=0.0, renewed=time.time())
  with pytest.raises(workdir_lock.WorkdirLockedError):
    workdir_lock.WorkdirLock(str(tmp_path)).__enter__()


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


def test_a_holder_whose_lock_was_taken_over_stops_renewing_and_saving(
    tmp_path, caplog, monkeypatch):
  """A trainer that stalled past its lease (a hung file system, a stopped
  process) while another host took the workdir over: its renewal wrote
  its own record back over the new holder's, and it went on saving
  checkpoints into the same workdir."""
  monkeypatch.setattr(workdir_lock, "LEASE_SECONDS", 0.2)  # renew each 0.05 s
  lock = workdir_lock.WorkdirLock(str(tmp_path))
  with lock:
    # Another host's trainer holds it now (written as its takeover does).
    other = {"host": "host-b", "pid": 4321, "started": time.time(),
             "renewed": time.time(), "path": str(lock.path)}
    tmp = tmp_path / "other.tmp"
    tmp.write_text(json.dumps(other))
    os.replace(tmp, lock.path)
    deadline = time.time() + 10
    while lock.taken_over is None and time.time() < deadline:
      time.sleep(0.05)
    assert lock.taken_over is not None, "the takeover went unnoticed"
    time.sleep(0.2)  # several renewal periods
    with open(lock.path) as f:
      assert json.load(f) == other  # never written over
    with pytest.raises(workdir_lock.WorkdirLockedError, match=(
        r"was taken over by another trainer \(host host-b, pid 4321, "
        r"started .*\) while this one stalled past its 0.2 s lease; "
        r"stopping without saving")):
      lock.check_held()
  assert "was taken over by another trainer (host host-b" in caplog.text
  with open(lock.path) as f:
    assert json.load(f) == other  # nor removed on the way out


# Process 0 of a 2-process job holds the lock; it (alone) finds the lock
# taken over, and both check before a save.
_TWO_PROCESS_CHECK = """
import sys, time
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize("127.0.0.1:" + sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
from trm.core import workdir_lock
with workdir_lock.WorkdirLock(sys.argv[3]) as lock:
  if jax.process_index() == 0:
    lock.taken_over = {"host": "host-b", "pid": 4321, "started": time.time()}
  try:
    lock.check_held()
    print("saves", flush=True)
  except workdir_lock.WorkdirLockedError as e:
    print("stops:", e, flush=True)
"""


def test_a_takeover_stops_every_process_of_the_job_before_its_save(
    tmp_path):
  """Only process 0 holds (and renews) the lock: a takeover it found
  stopped it alone, and the job's other processes went on into the save's
  collectives, to wait there until process 0's exit ended them as a lost
  process."""
  import workers as workers_lib  # pylint: disable=g-import-not-at-top
  port = str(workers_lib.free_port())
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=workers_lib.xla_flags(1))
  procs = [subprocess.Popen(
      [sys.executable, "-c", _TWO_PROCESS_CHECK, port, str(i),
       str(tmp_path)], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = workers_lib.wait_all(procs, timeout=120)
  lines = [[l for l in out.splitlines() if l.startswith(("saves", "stops"))]
           for out in outputs]
  assert lines[0] and lines[0][0].startswith(
      "stops: The workdir ") and "host host-b, pid 4321" in lines[0][0], (
          outputs[0][-2000:])
  assert lines[1] == [
      f"stops: The workdir {tmp_path} was taken over by another trainer "
      f"while this job stalled past its {workdir_lock.LEASE_SECONDS:g} s "
      "lease (process 0 found it; see its log); stopping without saving. "
      "Wait for that run, or pass another --workdir."], outputs[1][-2000:]


# ------------------------------------------------------- two at one instant

# One contender: imports the lock once, then per trial ("go DIR T") waits
# until time T (the last 2 ms spinning, so both start within microseconds),
# tries to take DIR's lock, answers "won" or "lost ...", and on "release"
# lets it go.
_CONTENDER = r"""
import sys, time
sys.path.insert(0, sys.argv[1])
from trm.core import processes
from trm.core import workdir_lock
print("ready", flush=True)
lock = None
for line in sys.stdin:
  command, *rest = line.split()
  if command == "go":
    directory, start = rest[0], float(rest[1])
    lock = workdir_lock.WorkdirLock(directory)
    if time.time() < start - 0.002:
      time.sleep(start - 0.002 - time.time())
    while time.time() < start:
      pass
    try:
      lock.__enter__()
      print("won", flush=True)
    except workdir_lock.WorkdirLockedError as e:
      lock = None
      print("lost " + " ".join(str(e).split()), flush=True)
  elif command == "release":
    if lock is not None:
      lock.__exit__(None, None, None)
    lock = None
    print("released", flush=True)
"""


def race(tmp_path, trials: int, root: str = ROOT):
  """Per trial, two processes take one workdir's lock at the same instant
  (every other trial over a stale lock of a dead process, which both try to
  take over): [(answers, lock record while held)]."""
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  contenders = [subprocess.Popen(
      [sys.executable, "-c", _CONTENDER, root], stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
                for _ in range(2)]
  results = []
  try:
    for c in contenders:
      assert c.stdout.readline().strip() == "ready"
    for trial in range(trials):
      workdir = str(tmp_path / f"trial{trial}")
      if trial % 2:
        _write_lock(workdir, pid=dead.pid)
      else:
        os.makedirs(workdir)
      start = time.time() + 0.03
      for c in contenders:
        c.stdin.write(f"go {workdir} {start}\n")
        c.stdin.flush()
      answers = [c.stdout.readline().strip() for c in contenders]
      try:
        with open(os.path.join(workdir, workdir_lock.LOCK_NAME)) as f:
          record = json.load(f)
      except (OSError, ValueError):  # (a broken lock must fail the test)
        record = None
      for c in contenders:
        c.stdin.write("release\n")
        c.stdin.flush()
      for c in contenders:
        assert c.stdout.readline().strip() == "released"
      results.append((answers, record))
  finally:
    for c in contenders:
      c.stdin.close()
      c.wait(timeout=30)
  return results, [c.pid for c in contenders]


def test_two_trainers_at_the_same_instant_exactly_one_wins(tmp_path):
  """The lock is written into a private file and hard-linked into place,
  and a stale lock is taken over under flock: however the two interleave,
  one wins and the other is refused naming the winner."""
  start = time.time()
  results, pids = race(tmp_path, trials=100)
  seconds = time.time() - start
  winners = []
  for trial, (answers, record) in enumerate(results):
    won = [i for i, a in enumerate(answers) if a == "won"]
    assert len(won) == 1, (trial, answers)
    loser = answers[1 - won[0]]
    assert loser.startswith("lost The workdir ") and (
        f"pid {pids[won[0]]}," in loser), (trial, answers)
    assert record and record["pid"] == pids[won[0]], (trial, record)
    winners.append(won[0])
  print(f"lock race: 100 trials, {seconds:.1f} s, first contender won "
        f"{winners.count(0)}")
  assert not [n for n in os.listdir(tmp_path / "trial1") if ".tmp" in n]


# ------------------------------------------------------- malformed locks


@pytest.mark.parametrize("text, why", [
    ("", "it is empty"),
    ('{"host": "h", "pid": 1', "not valid JSON"),
    ("[1, 2]", "it holds a JSON list, not an object"),
    ("7", "it holds a JSON int, not an object"),
    ('{"host": "h", "pid": "123", "started": 0, "renewed": 0}',
     "field 'pid' is '123', not an integer"),
    ('{"host": "h", "pid": true, "started": 0, "renewed": 0}',
     "field 'pid' is True, not an integer"),
    ('{"host": "h", "pid": 5, "started": NaN, "renewed": 0}',
     "field 'started' is nan, not a finite number"),
    ('{"host": 3, "pid": 5, "started": 0, "renewed": 0}',
     "field 'host' is 3, not a string"),
    ('{"pid": 5, "started": 0, "renewed": 0}', "it has no field 'host'"),
], ids=["empty", "invalid JSON", "list", "number", "pid string",
        "pid bool", "NaN", "host number", "no host"])
def test_a_malformed_lock_is_one_line_and_never_taken_over(tmp_path, text,
                                                           why):
  path = tmp_path / workdir_lock.LOCK_NAME
  path.write_text(text)
  with pytest.raises(workdir_lock.MalformedLockError) as error:
    workdir_lock.WorkdirLock(str(tmp_path)).__enter__()
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"The workdir lock {path} is not a lock record "
                            f"({why}")
  assert f"If no trainer runs on {tmp_path}, delete {path} and rerun" in (
      message)
  assert path.read_text() == text  # untouched
  assert sorted(os.listdir(tmp_path)) == [workdir_lock.LOCK_NAME]
