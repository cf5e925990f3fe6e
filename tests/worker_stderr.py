"""What a crashed pytest-xdist worker wrote last, printed in the run's summary.

A worker that dies inside XLA (a C++ CHECK, a collective's timeout) writes
its reason to file descriptor 2 and aborts. Under pytest's default fd-level
capture that line goes to the running test's temporary file and dies with the
process: six CI runs lost a worker with only "Fatal Python error: Aborted" to
show for it (BUILD_NOTES, "Session 101"). Under `--capture=sys` (the test
command's) each worker's descriptor 2 goes to a file of its own instead, and
the summary prints the end of the file of any worker that crashed. Python's
own output is still captured per test, as before; what reaches descriptor 2
directly (XLA's warnings, a subprocess's inherited stderr) stays out of the
console.

tests/conftest.py calls `redirect_if_worker()` at import and delegates the
hooks below; a conftest of two lines can use them too (the module's test).
"""
import os
import re
import shutil
import tempfile

DIR_ENV = "TRM_TEST_WORKER_STDERR"
OWNER_ENV = DIR_ENV + "_OWNER"
FOLDER_PREFIX = "trm_test_worker_stderr_"
TAIL_LINES = 60
# The reasons a worker dies with: Python's faulthandler, XLA's CHECKs and
# fatal logs, a collective's timeout.
CRASH_MARKS = ("Fatal Python error", "Check failed", "Termination timeout")
_CRASHED = re.compile(r"worker '(gw\d+)' crashed")

_crashed_workers = []


def redirect_if_worker() -> None:
  """In a worker started by a controller that chose this (its
  `pytest_configure`): descriptor 2 to the worker's own file. At conftest
  import, before faulthandler duplicates descriptor 2 for its reports."""
  folder, worker = os.environ.get(DIR_ENV), os.environ.get(
      "PYTEST_XDIST_WORKER")
  if not folder or not worker:
    return
  fd = os.open(os.path.join(folder, f"{worker}.stderr"),
               os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(fd, 2)
  os.close(fd)
  # Not for the worker's children (they inherit the descriptor): a test's
  # own pytest run would otherwise take the worker's file for its own.
  del os.environ[DIR_ENV]


def configure(config) -> None:
  """In the controller of an xdist run under --capture=sys: the folder the
  workers (started after this) write to."""
  if (os.environ.get("PYTEST_XDIST_WORKER")
      or not getattr(config.option, "numprocesses", None)
      or config.option.capture != "sys"):
    return
  os.environ[DIR_ENV] = tempfile.mkdtemp(prefix=FOLDER_PREFIX)
  os.environ[OWNER_ENV] = str(os.getpid())


def record(report) -> None:
  """Notes the worker a crash report names."""
  if report.failed:
    found = _CRASHED.search(str(report.longrepr))
    if found and found.group(1) not in _crashed_workers:
      _crashed_workers.append(found.group(1))


def tails() -> list:
  """(worker, its file's last lines) for each worker that crashed or whose
  file holds a crash's marks."""
  folder = os.environ.get(DIR_ENV)
  if not folder or os.environ.get(OWNER_ENV) != str(os.getpid()):
    return []
  found = []
  for name in sorted(os.listdir(folder)):
    worker = name.split(".")[0]
    with open(os.path.join(folder, name), errors="replace") as f:
      text = f.read()
    if worker in _crashed_workers or any(m in text for m in CRASH_MARKS):
      found.append((worker, _last_words(text.splitlines())))
  return found


def _last_words(lines: list) -> list:
  """The lines before Python's fatal error (XLA's reason comes first) and
  the start of its stack dump (every thread's; a JAX process has dozens),
  else the file's end."""
  fatal = [i for i, line in enumerate(lines)
           if line.startswith("Fatal Python error")]
  if not fatal:
    return lines[-TAIL_LINES:]
  at = fatal[-1]
  return lines[max(0, at - TAIL_LINES // 2):at + TAIL_LINES // 2]


def summarize(terminalreporter) -> None:
  for worker, lines in tails():
    terminalreporter.write_sep(
        "=", f"what {worker} last wrote to stderr (fd 2, {len(lines)} lines)")
    for line in lines:
      terminalreporter.write_line(line)


def unconfigure() -> None:
  folder = os.environ.get(DIR_ENV)
  if folder and os.environ.get(OWNER_ENV) == str(os.getpid()):
    shutil.rmtree(folder, ignore_errors=True)
