"""A crashed xdist worker's last native words reach the run's summary."""
import glob
import os
import subprocess
import sys
import tempfile

import worker_stderr

_CONFTEST = f"""
import sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
import worker_stderr
worker_stderr.redirect_if_worker()
def pytest_configure(config): worker_stderr.configure(config)
def pytest_runtest_logreport(report): worker_stderr.record(report)
def pytest_terminal_summary(terminalreporter):
  worker_stderr.summarize(terminalreporter)
def pytest_unconfigure(config): worker_stderr.unconfigure()
"""

_TESTS = """
import os
def test_dies_in_native_code():
  os.write(2, b"F0000 fake.cc:1] Check failed: the native reason\\n")
  os.abort()
"""

REASON = "Check failed: the native reason"


def _folders():
  return set(glob.glob(os.path.join(tempfile.gettempdir(),
                                    worker_stderr.FOLDER_PREFIX + "*")))


def _run(folder, capture):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(worker_stderr.DIR_ENV)
         and k != "PYTEST_XDIST_WORKER"}
  return subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-n", "2",
       "--max-worker-restart=0", f"--capture={capture}", "-p",
       "no:cacheprovider", str(folder)],
      cwd=folder, env=env, capture_output=True, text=True, timeout=300)


def test_the_summary_prints_what_the_crashed_worker_wrote(tmp_path):
  (tmp_path / "pytest.ini").write_text("[pytest]\n")
  (tmp_path / "conftest.py").write_text(_CONFTEST)
  (tmp_path / "test_crash.py").write_text(_TESTS)
  before = _folders()
  run = _run(tmp_path, "sys")
  assert run.returncode != 0
  summary = run.stdout.split("what gw", 1)
  assert len(summary) == 2, run.stdout[-3000:]
  # XLA's line and the Python stack of the abort, after the crash report.
  assert REASON in summary[1] and "Fatal Python error: Aborted" in summary[1]
  assert "crashed while running" in summary[0]
  # The workers' folder is gone with the run.
  assert _folders() <= before


def test_under_fd_capture_the_reason_is_lost(tmp_path):
  """Why the test command captures at sys level: pytest's default holds
  descriptor 2 in a temporary file that dies with the worker."""
  (tmp_path / "pytest.ini").write_text("[pytest]\n")
  (tmp_path / "conftest.py").write_text(_CONFTEST)
  (tmp_path / "test_crash.py").write_text(_TESTS)
  run = _run(tmp_path, "fd")
  assert run.returncode != 0 and "crashed while running" in run.stdout
  assert REASON not in run.stdout + run.stderr
