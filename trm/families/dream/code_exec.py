"""Run untrusted Python programs (model-written code plus its tests), one
subprocess each, with limits.

What is enforced for every program:
- its own Python (`-I`: no PYTHONPATH, no user site, no cwd on sys.path;
  `-S` unless `site_packages`: the standard library only), started in a new session so a timeout kills its whole process group;
- a wall-clock timeout (the group gets SIGKILL) and RLIMIT_CPU (SIGXCPU for
  a busy loop, even if the wall clock were missed);
- RLIMIT_AS (address space: a memory bomb gets MemoryError or dies),
  RLIMIT_FSIZE (no file over `max_file_mb`; stdout and stderr are files
  too, so endless printing is cut), RLIMIT_CORE 0;
- a fresh temporary working directory, also HOME and TMPDIR, removed after;
  a minimal environment (no credentials or proxies from ours);
- no network: in a new network namespace (`unshare --net`, only a loopback
  that is down) when that works here, and in any case socket creation in
  Python raises (a guard, not a wall: C code could still open a socket;
  the namespace is the wall).
What is NOT enforced: the program runs as our user and can read or write
whatever that user can outside its directory; it is not a security boundary
against deliberately hostile code. Run untrusted models' code in a container
or as a throwaway user.

The limits are set by a small bootstrap inside the child, before the
program's first line, not with `preexec_fn`: that hook is unsafe when the
parent has threads (jax's, and the thread pool that runs these), where the
child can deadlock between fork and exec.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

# Runs inside the child with argv = [program, memory bytes, cpu seconds,
# file bytes]; only then is the program read and executed.
_BOOTSTRAP = r"""
import resource, sys
def _limit(kind, value):
  soft, hard = resource.getrlimit(kind)
  if hard != resource.RLIM_INFINITY:
    value = min(value, hard)
  resource.setrlimit(kind, (value, value))
_limit(resource.RLIMIT_AS, int(sys.argv[2]))
_limit(resource.RLIMIT_CPU, int(sys.argv[3]))
_limit(resource.RLIMIT_FSIZE, int(sys.argv[4]))
_limit(resource.RLIMIT_CORE, 0)
import _socket, socket
def _no_network(*args, **kwargs):
  raise OSError("network access is disabled in the code-evaluation sandbox")
for _name in ("socket", "SocketType", "socketpair", "create_connection",
              "create_server", "fromfd", "getaddrinfo"):
  if hasattr(socket, _name):
    setattr(socket, _name, _no_network)
for _name in ("socket", "SocketType", "socketpair", "getaddrinfo"):
  if hasattr(_socket, _name):
    setattr(_socket, _name, _no_network)
del _limit, _name, _no_network, resource, socket, _socket
_path = sys.argv[1]
sys.argv = [_path]
with open(_path, encoding="utf-8") as _f:
  _code = compile(_f.read(), _path, "exec")
del _f, _path
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""

# Output kept per stream: enough for the error line, bounded in memory.
_TAIL_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-program limits. `network_namespace`: None = use one when this
  machine allows it (probed once), True = require it, False = guard only."""
  timeout_s: float = 10.0
  memory_mb: int = 1024
  max_file_mb: int = 16
  network_namespace: Optional[bool] = None
  site_packages: bool = False  # False: the standard library only (faster
                               # start; HumanEval and MBPP need no more)

  def check(self) -> None:
    if not self.timeout_s > 0:
      raise ValueError(f"timeout={self.timeout_s!r}: must be > 0 seconds.")
    if self.memory_mb < 64:
      raise ValueError(f"memory_mb={self.memory_mb!r}: Python needs at "
                       "least 64 MB of address space.")
    if self.max_file_mb < 1:
      raise ValueError(f"max_file_mb={self.max_file_mb!r}: must be >= 1.")


@dataclasses.dataclass(frozen=True)
class Outcome:
  passed: bool
  result: str          # "passed", "timed out", "failed: <last error line>"
  seconds: float


@functools.lru_cache(maxsize=None)
def namespace_prefix() -> tuple[str, ...]:
  """The command prefix that puts a child in an empty network namespace,
  or () where that is not allowed (no unshare, no user namespaces)."""
  for prefix in (("unshare", "--net"),
                 ("unshare", "--net", "--map-root-user")):
    try:
      probe = subprocess.run([*prefix, sys.executable, "-c", "pass"],
                             capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
      continue
    if probe.returncode == 0:
      return prefix
  return ()


def _namespace(limits: Limits) -> tuple[str, ...]:
  """The prefix to run under; raises if a required namespace is missing."""
  if limits.network_namespace is False:
    return ()
  prefix = namespace_prefix()
  if limits.network_namespace and not prefix:
    raise OSError("A network namespace was required (network_namespace="
                  "True) but `unshare --net` does not work on this machine.")
  return prefix


def network_isolation(limits: Limits) -> str:
  """How network access is blocked under `limits`, in words."""
  if _namespace(limits):
    return "network namespace + python socket guard"
  if limits.network_namespace is False:
    return "python socket guard"
  return "python socket guard (no network namespace on this machine)"


def _tail(path: str) -> str:
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    f.seek(max(0, f.tell() - _TAIL_BYTES))
    return f.read().decode("utf-8", errors="replace")


def _describe_failure(returncode: int, stderr: str) -> str:
  lines = [line for line in stderr.strip().splitlines() if line.strip()]
  last = lines[-1].strip() if lines else ""
  if returncode < 0:
    name = signal.Signals(-returncode).name
    why = {"SIGXCPU": "CPU time limit", "SIGXFSZ": "file size limit",
           "SIGKILL": "killed", "SIGSEGV": "crashed"}.get(name, name)
    return f"failed: {why} ({name})" + (f": {last}" if last else "")
  if "MemoryError" in last:
    return "failed: memory limit (MemoryError)"
  return f"failed: {last}" if last else f"failed: exit status {returncode}"


def _kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def run_program(program: str, limits: Limits = Limits()) -> Outcome:
  """Runs `program` (Python source) in the sandbox; passed = exit status 0
  within the limits."""
  prefix = _namespace(limits)
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="trm_code_") as work:
    path = os.path.join(work, "solution.py")
    with open(path, "w", encoding="utf-8") as f:
      f.write(program)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work,
           "TMPDIR": work, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
           "PYTHONDONTWRITEBYTECODE": "1"}
    cpu_seconds = int(limits.timeout_s) + 1
    flags = "-I" if limits.site_packages else "-IS"
    command = [*prefix, sys.executable, flags, "-c", _BOOTSTRAP, path,
               str(limits.memory_mb << 20), str(cpu_seconds),
               str(limits.max_file_mb << 20)]
    out_path, err_path = (os.path.join(work, n) for n in ("stdout", "stderr"))
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
      child = subprocess.Popen(command, cwd=work, env=env,
                               stdin=subprocess.DEVNULL, stdout=out,
                               stderr=err, start_new_session=True)
      try:
        returncode = child.wait(timeout=limits.timeout_s)
        timed_out = False
      except subprocess.TimeoutExpired:
        timed_out = True
      # Also reaps anything the program left running in its group.
      _kill_group(child.pid)
      if timed_out:
        child.wait()
    seconds = time.perf_counter() - start
    if timed_out:
      return Outcome(False, f"timed out after {limits.timeout_s:g} s",
                     seconds)
    if returncode == 0:
      return Outcome(True, "passed", seconds)
    return Outcome(False, _describe_failure(returncode, _tail(err_path)),
                   seconds)


def run_programs(programs: Sequence[str], limits: Limits = Limits(),
                 workers: Optional[int] = None) -> list[Outcome]:
  """`run_program` over `programs`, at most `workers` at a time (default:
  the CPU count); results in the input order."""
  limits.check()
  workers = workers or os.cpu_count() or 1
  if workers < 1:
    raise ValueError(f"workers={workers!r}: must be >= 1.")
  network_isolation(limits)  # probe once, before the pool starts
  # Threads suffice: each one only waits on its child process.
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(lambda p: run_program(p, limits), programs))
