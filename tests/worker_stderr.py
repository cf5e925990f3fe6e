"""What a pytest-xdist worker wrote to its file descriptors 1 and 2, kept.

A worker that dies inside XLA (a C++ CHECK, a collective's timeout) writes
its reason to descriptor 2 and aborts. Under pytest's default fd-level
capture that line goes to the running test's temporary file and dies with the
process: six CI runs lost a worker with only "Fatal Python error: Aborted" to
show for it (BUILD_NOTES, "Session 101"). Under `--capture=sys` (the test
command's) each worker's descriptors 1 and 2 go to a file of its own
instead:
- a failed test's report gets what was written there during each of its
  phases (XLA's messages, a subprocess's inherited output), as fd capture
  gave it;
- the summary prints, for a worker that crashed, the file from XLA's reason
  through the start of Python's stack dump.
Python's own output is still captured per test, as before, and the console
stays free of XLA's warnings.

tests/conftest.py calls `redirect_if_worker()` at import and delegates the
hooks below; a conftest of a few lines can use them too (the module's test).
"""
import os
import re
import shutil
import tempfile

DIR_ENV = "TRM_TEST_WORKER_STDERR"
OWNER_ENV = DIR_ENV + "_OWNER"
FOLDER_PREFIX = "trm_test_worker_stderr_"
TAIL_LINES = 60
# Python's faulthandler's first line when the process dies of a signal.
FATAL = "Fatal Python error"
# XLA's reasons before it: a CHECK, a collective's timeout.
XLA_REASONS = ("Check failed", "Termination timeout")
_CRASHED = re.compile(r"worker '(gw\d+)' crashed")
# At most this much of a failed phase's output goes into its report.
SECTION_CHARS = 20_000

_crashed_workers = []
_worker_file = None  # in a redirected worker: (its path, offset read to)


def redirect_if_worker() -> None:
  """In a worker started by a controller that chose this (its
  `pytest_configure`): descriptors 1 and 2 to the worker's own file. At
  conftest import, before faulthandler duplicates descriptor 2 for its
  reports."""
  folder, worker = os.environ.get(DIR_ENV), os.environ.get(
      "PYTEST_XDIST_WORKER")
  if not folder or not worker:
    return
  global _worker_file
  path = os.path.join(folder, f"{worker}.stderr")
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(fd, 2)
  # execnet points a worker's descriptor 1 at /dev/null.
  os.dup2(fd, 1)
  os.close(fd)
  _worker_file = [path, os.path.getsize(path)]
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


def phase_start() -> None:
  """At a test's start in a worker: what follows in the file is its own."""
  if _worker_file:
    _worker_file[1] = os.path.getsize(_worker_file[0])


def attach(report) -> None:
  """In a worker, after each phase of a test: what the phase wrote to the
  file, added to its report if it failed."""
  if not _worker_file:
    return
  path, start = _worker_file
  end = os.path.getsize(path)
  _worker_file[1] = end
  if report.failed and end > start:
    offset = max(start, end - SECTION_CHARS)
    with open(path, "rb") as f:
      f.seek(offset)
      text = f.read(end - offset).decode(errors="replace")
    report.sections.append((f"Captured fd 1 and 2 {report.when}", text))


def record(report) -> None:
  """Notes the worker a crash report names."""
  if report.failed:
    found = _CRASHED.search(str(report.longrepr))
    if found and found.group(1) not in _crashed_workers:
      _crashed_workers.append(found.group(1))


def tails() -> list:
  """(worker, its file's last words) for each worker that crashed or whose
  file holds Python's fatal error."""
  folder = os.environ.get(DIR_ENV)
  if not folder or os.environ.get(OWNER_ENV) != str(os.getpid()):
    return []
  found = []
  for name in sorted(os.listdir(folder)):
    worker = name.split(".")[0]
    with open(os.path.join(folder, name), errors="replace") as f:
      text = f.read()
    if worker in _crashed_workers or FATAL in text:
      found.append((worker, _last_words(text.splitlines())))
  return found


def _last_words(lines: list) -> list:
  """From the first of XLA's crash lines in the 200 before Python's last
  fatal error (a CHECK's reason comes before its C++ stack), else 30 lines
  before it, to the start of Python's stack dump (every thread's; a JAX
  process has dozens); without a fatal error, the file's end."""
  fatal = [i for i, line in enumerate(lines)
           if line.startswith(FATAL)]
  if not fatal:
    return lines[-TAIL_LINES:]
  at = fatal[-1]
  start = max(0, at - TAIL_LINES // 2)
  previous = [j for j in range(max(0, at - 200), at) if any(
      reason in lines[j] for reason in XLA_REASONS)]
  if previous:
    start = min(start, previous[0])
  return lines[start:at + TAIL_LINES // 2]


def summarize(terminalreporter) -> None:
  for worker, lines in tails():
    terminalreporter.write_sep(
        "=", f"what {worker} last wrote to fd 1 and 2 ({len(lines)} lines)")
    for line in lines:
      terminalreporter.write_line(line)


def unconfigure() -> None:
  folder = os.environ.get(DIR_ENV)
  if folder and os.environ.get(OWNER_ENV) == str(os.getpid()):
    shutil.rmtree(folder, ignore_errors=True)
