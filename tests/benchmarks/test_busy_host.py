"""benchmarks/reliability/busy_host.py: counts passed and aborted runs of a
pytest selection, and reads XLA:CPU's collective timeout."""
import os
import subprocess
import sys
import time

import repo

SCRIPT = os.path.join(repo.ROOT, "benchmarks", "reliability", "busy_host.py")

sys.path.insert(0, os.path.dirname(SCRIPT))
import busy_host  # pylint: disable=g-import-not-at-top,wrong-import-position

_XLA_ABORT = (
    "F1206 07:02:10.357048   28998 rendezvous.cc:161] [id=0] Termination "
    "timeout for `all gather RendezvousKey{run_id=RunId: 332762907, "
    "global_devices=[1, 3], num_local_participants=2, collective_op_kind="
    "cross_module, op_id=17}` of 40 seconds exceeded. Exiting to ensure a "
    "consistent program state. Expected 2 threads to join the rendezvous, "
    "but only 1 of them arrived on time.\n*** Check failure stack trace: ***")


def test_reason_names_the_collective_and_who_arrived():
  assert busy_host.xla_abort_reason(_XLA_ABORT) == (
      "XLA's collective timeout (40 s) in all gather over devices [1, 3]: "
      "1 of 2 arrived")
  assert busy_host.xla_abort_reason("x\nlast line\n") == "last line"


def test_counts_passed_and_aborted_runs(tmp_path):
  (tmp_path / "test_ok.py").write_text("def test_ok():\n  pass\n")
  (tmp_path / "test_abort.py").write_text(
      "import os\n\ndef test_abort():\n  os.abort()\n")

  def run(name):
    return subprocess.run(
        [sys.executable, SCRIPT, "--runs=2", "--busy=1",
         str(tmp_path / name)], capture_output=True, text=True, timeout=300,
        check=True).stdout

  assert "passed 2 of 2 runs, failed 0" in run("test_ok.py")
  out = run("test_abort.py")
  assert "passed 0 of 2 runs, failed 2" in out
  assert out.count("exit code -6") == 2, out


def test_refuses_no_tests():
  done = subprocess.run([sys.executable, SCRIPT, "--runs=1"],
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 2 and "name the tests" in done.stderr


def test_refuses_a_bad_count_and_leaves_no_spinner_behind(tmp_path):
  done = subprocess.run([sys.executable, SCRIPT, "--runs=0", "x.py"],
                        capture_output=True, text=True, timeout=60)
  assert done.returncode == 2 and "--runs must be >= 1" in done.stderr
  # Killed mid-run (SIGKILL: no cleanup of its own), the script's spinning
  # processes stop by themselves.
  (tmp_path / "test_slow.py").write_text(
      "import time\n\ndef test_slow():\n  time.sleep(60)\n")
  script = subprocess.Popen([sys.executable, SCRIPT, "--runs=1", "--busy=2",
                             str(tmp_path / "test_slow.py")],
                            stdout=subprocess.PIPE, text=True)
  assert script.stdout.readline().startswith("cpus:")
  spinners = _children(script.pid)
  assert len(spinners) == 2
  script.kill()
  script.wait()
  deadline = time.time() + 30
  while time.time() < deadline and any(_alive(p) for p in spinners):
    time.sleep(0.2)
  assert not any(_alive(p) for p in spinners)


def _children(pid):
  """The spinning processes among `pid`'s children."""
  time.sleep(1)  # the spinners and the pytest run start
  with open(f"/proc/{pid}/task/{pid}/children") as f:
    children = [int(p) for p in f.read().split()]
  return [p for p in children if _SPINNER in _cmdline(p)]


_SPINNER = "getppid"  # busy_host._SPIN's; the pytest run is another child


def _cmdline(pid):
  with open(f"/proc/{pid}/cmdline", "rb") as f:
    return f.read().decode(errors="replace")


def _alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"
  except FileNotFoundError:
    return False
