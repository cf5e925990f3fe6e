r"""What a process pays to import jax and a tool's modules, per ml_dtypes version.

  PYTHONPATH=. python benchmarks/speed/import_seconds.py --versions=0.6.0,0.7.0 --rounds=5

Every `python -m trm.<tool>` (and every test that starts one) imports jax,
and jax imports ml_dtypes. Each version named is installed (`pip install
--no-deps --target`, from the package index or pip's cache) into a folder
of its own under --dir, which goes first on PYTHONPATH in a fresh process
that times, with `time.perf_counter`:

  * `ml_dtypes`: its import alone (numpy imported before, untimed);
  * `trm.core.train`: the trainer's imports (jax, flax, optax, orbax,
    grain and ours), as `python -m trm.main` starts them;

and the process's wall time from start to exit. Rounds alternate the
versions (A, B, A, B, ...), so drift in the machine's load hits each
alike; the 1-minute load average is printed at each round. With
`--cpu=N` every process runs under `taskset -c N`.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fresh_process  # pylint: disable=g-import-not-at-top,wrong-import-position

_CHILD = r"""
import json, sys, time
import numpy
start = time.perf_counter()
import ml_dtypes
dtypes = time.perf_counter() - start
start = time.perf_counter()
import trm.core.train
tool = time.perf_counter() - start
print("RESULT " + json.dumps({"version": ml_dtypes.__version__,
                              "ml_dtypes": dtypes, "tool": tool}))
"""


def _install(version: str, directory: str) -> str:
  target = os.path.join(directory, f"ml_dtypes-{version}")
  if not os.path.isdir(os.path.join(target, "ml_dtypes")):
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", "--no-deps",
                           "--target", target, f"ml_dtypes=={version}"],
                          capture_output=True, text=True, check=False)
    if done.returncode:
      last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
      raise SystemExit(f"import_seconds: --versions: pip could not install "
                       f"ml_dtypes=={version} into {target}: {last}")
  return target


def _run(target: str, cpu) -> dict:
  return fresh_process.run("import_seconds", _CHILD, path=[target], cpu=cpu)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--versions", default="0.6.0,0.7.0",
                      help="ml_dtypes versions, comma-separated")
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--dir", default=os.path.join(
      os.environ.get("TMPDIR", "/tmp"), "trm_import_seconds"),
                      help="where each version is installed")
  parser.add_argument("--cpu", type=int, default=None,
                      help="run each process under taskset -c CPU")
  args = parser.parse_args(argv)
  versions = [v.strip() for v in args.versions.split(",") if v.strip()]
  if not versions or args.rounds < 1:
    parser.error("give --versions and --rounds >= 1")
  targets = {v: _install(v, args.dir) for v in versions}
  for version in versions:  # a first run of each, not counted (disk cache)
    got = _run(targets[version], args.cpu)["version"]
    if got != version:
      raise SystemExit(f"import_seconds: asked for ml_dtypes {version}, "
                       f"the child imported {got}")
  print(f"python {sys.version.split()[0]}, cpu {args.cpu}, "
        f"{os.cpu_count()} cores")
  results = fresh_process.alternate(
      args.rounds, versions,
      lambda version, _: _run(targets[version], args.cpu),
      lambda r: (f"import ml_dtypes {r['ml_dtypes']:.3f} s, trm.core.train "
                 f"{r['tool']:.3f} s, process {r['wall']:.3f} s"))
  fresh_process.print_medians(
      "ml_dtypes", {"ml_dtypes": "import ml_dtypes s",
                    "tool": "import trm.core.train s", "wall": "process s"},
      results)


if __name__ == "__main__":
  main()
