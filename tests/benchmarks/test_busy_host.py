"""benchmarks/reliability/busy_host.py: counts passed and aborted runs of a
pytest selection, and reads XLA:CPU's collective timeout."""
import os
import subprocess
import sys

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
  assert busy_host._reason(_XLA_ABORT) == (  # pylint: disable=protected-access
      "XLA's collective timeout (40 s) in all gather over devices [1, 3]: "
      "1 of 2 arrived")
  assert busy_host._reason("x\nlast line\n") == "last line"  # pylint: disable=protected-access


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
