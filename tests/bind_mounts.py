"""A command run where one folder is also reachable under a second path (a
bind mount in a private mount namespace: `unshare --user --map-root-user
--mount`), as on a machine whose disk is mounted twice, or a macOS disk
where `Run` and `run` are one folder: the same directory, which no path
string shows. The mount ends with the command; tests skip where the host
refuses it (no unshare, user namespaces off)."""
import functools
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

import repo


@functools.lru_cache(maxsize=None)
def available() -> bool:
  """Whether a bind mount can be made here (once per process)."""
  if not sys.platform.startswith("linux") or not shutil.which("unshare"):
    return False
  with tempfile.TemporaryDirectory() as root:
    source, alias = os.path.join(root, "a"), os.path.join(root, "b")
    os.mkdir(source)
    os.mkdir(alias)
    open(os.path.join(source, "probe"), "w").close()
    try:
      return run(source, alias, ["test", "-e", os.path.join(alias, "probe")],
                 probe=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
      return False


def run(source, alias, argv, probe: bool = False, **kwargs):
  """`argv` run (subprocess.run, output captured as text; `kwargs` passed
  on) with the directory `source` bound onto the existing directory
  `alias`, `PYTHONPATH` the repository. Skips the test where the host
  cannot bind-mount."""
  if not probe and not available():
    pytest.skip("no bind mount here (unshare --user --mount refused)")
  env = dict(kwargs.pop("env", None) or os.environ, PYTHONPATH=repo.ROOT)
  return subprocess.run(
      ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
       'mount --bind "$0" "$1" && shift && exec "$@"', os.fspath(source),
       os.fspath(alias), *map(os.fspath, argv)],
      capture_output=True, text=True, check=False, timeout=kwargs.pop(
          "timeout", 120), env=env, **kwargs)


def python(source, alias, code: str, *args, **kwargs) -> str:
  """`code` run by this Python (`args` its sys.argv[1:]) with `source`
  bound onto `alias`; its stdout. Fails the test where it fails."""
  done = run(source, alias, [sys.executable, "-c", code, *args], **kwargs)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout
