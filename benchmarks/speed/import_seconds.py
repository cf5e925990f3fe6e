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
import json
import os
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

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
  # No empty entry: it would put the caller's directory on the path.
  path = [target, _ROOT, os.environ.get("PYTHONPATH", "")]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(p for p in path if p))
  command = [sys.executable, "-c", _CHILD]
  if cpu is not None:
    command = ["taskset", "-c", str(cpu)] + command
  start = time.perf_counter()
  done = subprocess.run(command, env=env, capture_output=True, text=True,
                        check=False)
  wall = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"import_seconds: the child failed:\n{done.stderr[-2000:]}")
  line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
  result = json.loads(line[len("RESULT "):])
  result["wall"] = wall
  return result


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
  results = {v: [] for v in versions}
  print(f"python {sys.version.split()[0]}, cpu {args.cpu}, "
        f"{os.cpu_count()} cores")
  for round_ in range(args.rounds):
    for version in versions:
      load = os.getloadavg()[0]
      result = _run(targets[version], args.cpu)
      results[version].append(result)
      print(f"round {round_} ml_dtypes {version}: import ml_dtypes "
            f"{result['ml_dtypes']:.3f} s, trm.core.train {result['tool']:.3f}"
            f" s, process {result['wall']:.3f} s (load {load:.2f})",
            flush=True)
  print("\nmedians over the rounds:")
  print("| ml_dtypes | import ml_dtypes s | import trm.core.train s | "
        "process s |")
  print("|---|---|---|---|")
  for version in versions:
    rows = results[version]
    print(f"| {version} | "
          + " | ".join(f"{statistics.median(r[k] for r in rows):.3f}"
                       for k in ("ml_dtypes", "tool", "wall")) + " |")


if __name__ == "__main__":
  main()
