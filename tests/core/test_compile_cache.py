"""The persistent compilation cache every `python -m trm.*` command turns on
(`trm.core.compile_cache`): where it lives, how it is turned off, and that a
second run loads what the first compiled."""
import os
import subprocess
import sys
import textwrap

import pytest

from trm.core import compile_cache
from test_train import ROOT  # pylint: disable=g-import-not-at-top

_PROGRAM = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from trm.core import cli

    def body(x):
      for _ in range(600):  # long enough to compile that it is cached
        x = jnp.tanh(x @ x) + x
      return x

    def main(argv):
      print("cache dir:", jax.config.jax_compilation_cache_dir)
      print(float(jax.jit(body)(jnp.ones((64, 64))).sum()))

    cli.run(main)
""")


def _run(tmp_path, *flags, **env):
  script = tmp_path / "program.py"
  script.write_text(_PROGRAM)
  environ = dict(os.environ, JAX_PLATFORMS="cpu",
                 JAX_DEBUG_LOG_MODULES="jax._src.compiler", **env)
  environ.pop("TRM_COMPILATION_CACHE", None)
  environ.update(env)
  return subprocess.run([sys.executable, str(script), *flags], cwd=ROOT,
                        env=environ, capture_output=True, text=True,
                        timeout=300)


def test_where_the_cache_lives(monkeypatch, tmp_path):
  monkeypatch.delenv(compile_cache.ENV, raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert compile_cache.resolve(None) == str(tmp_path / "trm" / "jax")
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
  assert compile_cache.resolve(None) == str(tmp_path / "env")
  assert compile_cache.resolve(str(tmp_path / "flag")) == str(
      tmp_path / "flag")
  # Blank is unset (it was a directory named ' ' in the current one).
  assert compile_cache.resolve("  ") == str(tmp_path / "env")
  monkeypatch.setenv(compile_cache.ENV, " ")
  assert compile_cache.resolve(None) == str(tmp_path / "trm" / "jax")
  for off in ("off", "OFF", "0", "none"):
    assert compile_cache.resolve(off) is None
    monkeypatch.setenv(compile_cache.ENV, off)
    assert compile_cache.resolve(None) is None


def test_an_unusable_directory_turns_it_off_in_one_line(tmp_path, capsys):
  blocker = tmp_path / "file"
  blocker.write_text("")
  assert compile_cache.configure(str(blocker / "cache")) is None
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "compilation cache off" in err
  with pytest.raises(ValueError, match="--compilation_cache_max_gb=0"):
    compile_cache.configure(str(tmp_path), max_gb=0)
  # No bound is not a size: it raised OverflowError (a traceback).
  with pytest.raises(ValueError, match="--compilation_cache_max_gb=inf: "
                     "must be a finite number > 0"):
    compile_cache.configure(str(tmp_path), max_gb=float("inf"))


def test_a_second_run_loads_the_first_runs_executable(tmp_path):
  cache = tmp_path / "cache"
  first = _run(tmp_path, f"--compilation_cache={cache}")
  assert first.returncode == 0, first.stderr[-2000:]
  assert f"cache dir: {cache}" in first.stdout
  assert "CACHE MISS for 'jit_body'" in first.stderr
  assert any(name.startswith("jit_body") for name in os.listdir(cache))
  second = _run(tmp_path, f"--compilation_cache={cache}")
  assert "cache hit for 'jit_body'" in second.stderr, second.stderr[-2000:]
  assert first.stdout.splitlines()[-1] == second.stdout.splitlines()[-1]
  # The default is on (XDG cache); off leaves no directory behind.
  default = _run(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
  assert f"cache dir: {tmp_path / 'xdg' / 'trm' / 'jax'}" in default.stdout
  off = _run(tmp_path, "--compilation_cache=off",
             XDG_CACHE_HOME=str(tmp_path / "xdg2"))
  assert "cache dir: None" in off.stdout, off.stderr[-2000:]
  assert not (tmp_path / "xdg2").exists()


def test_without_filelock_the_cache_still_hits_unbounded(tmp_path):
  """JAX bounds the cache with file locks: with a bound set and no
  `filelock` package, every read failed (one warning per compile) and the
  cache never hit. Now the bound is left out, said in one line."""
  blocked = tmp_path / "no_filelock"
  blocked.mkdir()
  (blocked / "filelock.py").write_text(
      "raise ImportError('filelock hidden by the test')\n")
  path = os.pathsep.join(filter(None, [str(blocked),
                                       os.environ.get("PYTHONPATH")]))
  cache = tmp_path / "cache"
  runs = [_run(tmp_path, f"--compilation_cache={cache}", PYTHONPATH=path)
          for _ in range(2)]
  for run in runs:
    assert run.returncode == 0, run.stderr[-2000:]
    assert "has no size bound" in run.stderr
    assert "Error reading persistent compilation cache" not in run.stderr
  assert "cache hit for 'jit_body'" in runs[1].stderr, runs[1].stderr[-2000:]
