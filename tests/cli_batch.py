"""`python -m trm.<tool>` runs of a test file for the price of one start-up.

A test that checks a refusal line per bad flag ran one subprocess per case,
each importing jax and the tool's modules again (2-5 s of the 2-core host's
time for a check that takes a tenth of it). A `Server` is ONE process (this
file run as a script) that imports those modules once; `Server.run` then
forks it and the child runs the tool as `python -m` does (`runpy`, as
`__main__`, with the case's argv and working directory), its stdout and
stderr in files of their own, and exits with the tool's exit code. A case
thus gets what `subprocess.run` gave it: a fresh process (the tool's flags
defined and parsed once, its globals new), the same exit code and the same
output, without the imports. The server never starts a jax backend (it
only imports), so forking it is safe; a child may start one.

`serve(module, preload)` makes a module-scoped fixture of a server. Keep
one true `subprocess.run` of the tool per test file: the start-up itself
(imports in the tool's own order, argv as the OS passes it) is covered
there.

Preload only modules the tool imports before its flags are parsed, or ones
that define no flags: a module the tool imports later, preloaded, would
let its flags be parsed where the real tool refused them as unknown.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

_HERE = os.path.abspath(__file__)
# Set by pytest for each test: a case's child gets its own (as the whole
# environment), but the server need not have been started with it.
_PER_TEST = ("PYTEST_CURRENT_TEST",)


class Server:
  """Runs `python -m module argv` cases in forks of one process that has
  imported `preload` with the environment `env` (os.environ when None)."""

  def __init__(self, module: str, preload=(), env=None):
    self.module = module
    self.preload = tuple(preload)
    self.restarts = 0  # starts for a case with another environment
    self._work = tempfile.TemporaryDirectory(prefix="cli_batch_")
    self._cases = 0
    self._start(dict(os.environ if env is None else env))

  def _start(self, env: dict) -> None:
    self.env = env
    self._process = subprocess.Popen(
        [sys.executable, _HERE, json.dumps(list(self.preload))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env,
        cwd=self._work.name)
    self._replies = b""  # read from the server, not yet taken as lines

  def run(self, argv, cwd=None, env=None, timeout: float = 600
          ) -> subprocess.CompletedProcess:
    """What `subprocess.run([python, -m, module, *argv], cwd=cwd, env=env,
    capture_output=True, text=True, timeout=timeout)` returns. `env`
    (os.environ when None) must be the server's: preloaded modules read
    theirs at import, so a case with another environment gets a server
    started with it (one start-up more). Not only a test changes it:
    a library may set a variable in os.environ when first used (torch's
    TORCHINDUCTOR_CACHE_DIR, once anything imports torch._dynamo), and the
    server started before then differs from the next case's."""
    env = dict(os.environ if env is None else env)
    changed = sorted(k for k in set(env) | set(self.env)
                     if env.get(k) != self.env.get(k) and k not in _PER_TEST)
    if changed:
      self._stop()
      self._start(env)
      self.restarts += 1
    argv = [os.fsdecode(a) for a in argv]
    self._cases += 1
    out = os.path.join(self._work.name, f"{self._cases}")
    self._process.stdin.write(json.dumps({
        "module": self.module, "argv": argv, "env": env,
        "cwd": os.path.abspath(cwd or os.getcwd()), "out": out}).encode()
                              + b"\n")
    self._process.stdin.flush()
    pid = json.loads(self._read_line(60))["pid"]
    try:
      line = self._read_line(timeout)
    except subprocess.TimeoutExpired:
      os.kill(pid, signal.SIGKILL)
      self._read_line(60)
      raise subprocess.TimeoutExpired([self.module, *argv], timeout) from None
    returncode = json.loads(line)["returncode"]
    streams = []
    for name in ("stdout", "stderr"):
      with open(f"{out}.{name}", encoding="utf-8", errors="strict",
                newline=None) as f:
        streams.append(f.read())
      os.remove(f"{out}.{name}")
    return subprocess.CompletedProcess(
        [sys.executable, "-m", self.module, *argv], returncode, *streams)

  def _read_line(self, timeout: float) -> str:
    """The server's next reply. Read unbuffered: a buffered reader could
    take both of a case's replies at once, and `select` would then wait
    for the second, already read."""
    deadline = time.monotonic() + timeout
    reply = self._process.stdout.fileno()
    while b"\n" not in self._replies:
      ready, _, _ = select.select([reply], [], [],
                                  max(0, deadline - time.monotonic()))
      if not ready:
        raise subprocess.TimeoutExpired("cli_batch", timeout)
      chunk = os.read(reply, 1 << 16)
      if not chunk:
        raise RuntimeError(f"cli_batch server for {self.module} exited "
                           f"({self._process.wait()}); see its stderr.")
      self._replies += chunk
    line, self._replies = self._replies.split(b"\n", 1)
    return line.decode()

  def _stop(self) -> None:
    # Nothing to save: killed rather than left to unload jax (seconds).
    self._process.kill()
    self._process.wait()
    self._process.stdin.close()
    self._process.stdout.close()

  def close(self) -> None:
    self._stop()
    self._work.cleanup()


# Preloads shared by several files. trm.main's: what it imports before it
# parses its flags, and libraries its training imports that define no absl
# flag (trm.core.train itself would define Grain's and Orbax's: a fork
# would then accept --grain_py_debug_mode, which the real tool refuses).
# trm.export's for a Dream export: what it imports at its top.
# tests/core/test_cli.py checks that neither defines a flag the tool lacks.
MAIN_PRELOAD = ("trm.core.cli", "trm.core.config_lib", "trm.core.distributed",
                "jax", "flax.linen", "optax", "tensorstore",
                "clu.metric_writers")
DREAM_EXPORT_PRELOAD = ("trm.core.cli", "trm.core.distributed",
                        "trm.core.processes", "trm.core.weights_io",
                        "trm.data.text.tokenizer",
                        "trm.families.dream.hf_import", "trm.generate")


def serve(module: str, preload=(), env=None):
  """A module-scoped fixture: a `Server` for `module`, closed after the
  file's tests. `env`: a function returning the environment (os.environ's
  when None), called when the fixture starts."""
  import pytest  # pylint: disable=g-import-not-at-top

  @pytest.fixture(scope="module")
  def server():
    started = Server(module, preload, None if env is None else env())
    yield started
    started.close()

  return server


def _run_case(case: dict, reply: int) -> None:
  """In the forked child: `python -m module *argv`, then exit as it would
  (never returns)."""
  import atexit  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  code = 1
  try:
    os.close(reply)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, name in ((1, "stdout"), (2, "stderr")):
      target = os.open(f"{case['out']}.{name}",
                       os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
      os.dup2(target, fd)
      os.close(target)
    os.environ.clear()
    os.environ.update(case["env"])
    os.chdir(case["cwd"])
    sys.path[0] = case["cwd"]   # as `python -m`: its directory first
    sys.argv = [case["module"], *case["argv"]]  # runpy sets argv[0]
    try:
      runpy.run_module(case["module"], run_name="__main__", alter_sys=True)
      code = 0
    except SystemExit as stop:   # as the interpreter reads sys.exit(...)
      if stop.code is None:
        code = 0
      elif isinstance(stop.code, int):
        code = stop.code
      else:
        print(stop.code, file=sys.stderr)
        code = 1
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code & 0xFF)  # pylint: disable=protected-access


def _serve(preload: list[str]) -> None:
  # Replies on a descriptor of their own: what an import prints goes to
  # stderr, not into the replies.
  reply = os.dup(1)
  os.dup2(2, 1)
  # As a `python -m` run's path: the working directory, not this file's.
  sys.path[0] = os.getcwd()
  import importlib  # pylint: disable=g-import-not-at-top
  for name in preload:
    importlib.import_module(name)
  for line in sys.stdin:
    case = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _run_case(case, reply)
    os.write(reply, (json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    os.write(reply, (json.dumps(
        {"returncode": os.waitstatus_to_exitcode(status)}) + "\n").encode())


if __name__ == "__main__":
  _serve(json.loads(sys.argv[1]))
