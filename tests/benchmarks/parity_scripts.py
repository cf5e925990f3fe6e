"""Loading and running a `benchmarks/parity/` script from its tests (the
folder is not a package; the scripts import `common` from beside them)."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import repo

FOLDER = os.path.join(repo.ROOT, "benchmarks", "parity")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    filter(None, [repo.ROOT, os.environ.get("PYTHONPATH")])))


def path(name: str) -> str:
  return os.path.join(FOLDER, f"{name}.py")


def loaded(name: str):
  """Yields the script imported as module `name`, registered in
  sys.modules while in use (its dataclasses look their module up)."""
  spec = importlib.util.spec_from_file_location(name, path(name))
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  yield module
  del sys.modules[name]


def run(name: str, *args) -> subprocess.CompletedProcess:
  """The script run as a command (its exit status is the caller's to
  check)."""
  return subprocess.run([sys.executable, path(name), *args],
                        capture_output=True, text=True, env=ENV, timeout=60,
                        check=False)


def run_with(name: str, body: str, timeout: float = 60) -> str:
  """stdout of `body`, run in a fresh interpreter where the script is
  loaded as `m` (so what it imports at load time can be inspected)."""
  code = ("import importlib.util, sys\n"
          f"spec = importlib.util.spec_from_file_location('s', "
          f"{path(name)!r})\n"
          "m = importlib.util.module_from_spec(spec); sys.modules['s'] = m\n"
          "spec.loader.exec_module(m)\n" + textwrap.dedent(body))
  return subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, env=ENV, timeout=timeout,
                        check=True).stdout
