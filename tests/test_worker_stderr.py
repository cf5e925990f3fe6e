"""What an xdist worker writes to its descriptors 1 and 2 reaches a failed
test's report, and a crashed worker's last native words the summary."""
import os
import subprocess
import sys

_CONFTEST = f"""
import sys
import pytest
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import worker_stderr
worker_stderr.redirect_if_worker()
def pytest_configure(config): worker_stderr.configure(config)
def pytest_runtest_logreport(report): worker_stderr.record(report)
def pytest_runtest_logstart(nodeid, location): worker_stderr.phase_start()
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
  report = yield
  worker_stderr.attach(report)
  return report
def pytest_terminal_summary(terminalreporter):
  worker_stderr.summarize(terminalreporter)
def pytest_unconfigure(config): worker_stderr.unconfigure()
"""

# XLA's CHECK: its reason, then a C++ stack longer than the summary's
# 30 lines before Python's fatal error.
_CRASH = """
import os
def test_dies_in_native_code():
  os.write(2, b"F0000 fake.cc:1] Check failed: the native reason\\n")
  os.write(2, b"*** Check failure stack trace: ***\\n")
  os.write(2, b"".join(b"    @ 0x%x frame\\n" % i for i in range(80)))
  os.abort()
"""

_OUTPUTS = """
import subprocess, sys
def _child(tag):
  subprocess.run([sys.executable, "-c",
                  f"import os; os.write(1, b'{tag} out\\\\n'); "
                  f"os.write(2, b'{tag} err\\\\n')"], check=True)
def test_fails_after_its_child_wrote():
  _child("FAILING")
  assert False
def test_passes_after_its_child_wrote():
  _child("PASSING")
"""


def _run(folder, tests):
  (folder / "pytest.ini").write_text("[pytest]\n")
  (folder / "conftest.py").write_text(_CONFTEST)
  (folder / "test_it.py").write_text(tests)
  temp = folder / "temp"  # the run's folders, apart from other runs'
  temp.mkdir()
  env = {k: v for k, v in os.environ.items()
         if not k.startswith("TRM_TEST_WORKER_STDERR")
         and k != "PYTEST_XDIST_WORKER"}
  env["TMPDIR"] = str(temp)
  run = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-n", "2",
       "--max-worker-restart=0", "--capture=sys", "-p", "no:cacheprovider",
       str(folder)],
      cwd=folder, env=env, capture_output=True, text=True, timeout=300)
  # The workers' folder is gone with the run.
  assert not [p for p in temp.iterdir()
              if p.name.startswith("trm_test_worker_stderr_")]
  return run


def test_the_summary_prints_what_the_crashed_worker_wrote(tmp_path):
  run = _run(tmp_path, _CRASH)
  assert run.returncode != 0
  report, summary = run.stdout.split("what gw", 1)
  assert "crashed while running" in report
  # XLA's reason (before 82 lines of C++ stack), then Python's stack.
  assert "Check failed: the native reason" in summary
  assert "Fatal Python error: Aborted" in summary


def test_a_failed_tests_report_has_what_its_child_wrote(tmp_path):
  run = _run(tmp_path, _OUTPUTS)
  assert run.returncode == 1, run.stdout[-3000:]
  assert "Captured fd 1 and 2 call" in run.stdout
  assert "FAILING out" in run.stdout and "FAILING err" in run.stdout
  # A passing test's output is kept out of the console, as before.
  assert "PASSING" not in run.stdout + run.stderr
  assert "what gw" not in run.stdout  # no crash, no summary section
