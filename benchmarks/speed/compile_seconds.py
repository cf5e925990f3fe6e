"""Seconds XLA:CPU spends compiling a test file's programs, per XLA_FLAGS
choice, rounds alternating (the CI's time is mostly compiles).

  PYTHONPATH=. python benchmarks/speed/compile_seconds.py \
      --file=tests/families/gpt/test_gpt_steps.py --rounds=2 \
      --extra="" --extra=--xla_cpu_use_fusion_emitters=false

Each round runs `pytest FILE` once per `--extra` (appended to the tests'
XLA_FLAGS; tests/conftest.py's own choice is overridden by it, and with
`--extra=""` the fusion emitters are forced on, as XLA's default), with
the session compilation cache off, so every program compiles. This file
is also the pytest plugin that times `backend_compile_and_load` in each
run (loaded with `-p`), and prints one line per run and a median per
choice. The device count and optimisation level are tests/conftest.py's
(8, O0); XLA_FLAGS of the calling shell are replaced.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_RESULT = "COMPILE_SECONDS_OUT"


def pytest_configure(config):
  """As a plugin (in the pytest run): wrap jax's backend compile."""
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  original = compiler.backend_compile_and_load
  totals = {"seconds": 0.0, "compiles": 0}

  def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      totals["seconds"] += time.perf_counter() - start
      totals["compiles"] += 1

  compiler.backend_compile_and_load = timed
  config._compile_totals = totals  # pylint: disable=protected-access


def pytest_unconfigure(config):
  totals = getattr(config, "_compile_totals", None)
  if totals is not None and os.environ.get(_RESULT):
    with open(os.environ[_RESULT], "w", encoding="utf-8") as f:
      json.dump(totals, f)


def _run(test_file: str, extra: str, out: str) -> dict:
  # tests/conftest.py adds its device count and optimisation level to
  # these, and the loop emitters only where XLA_FLAGS names none.
  flags = extra or "--xla_cpu_use_fusion_emitters=true"
  here = os.path.dirname(os.path.abspath(__file__))
  env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
             TRM_TEST_COMPILATION_CACHE="off",
             PYTHONPATH=os.pathsep.join(
                 [here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
  env[_RESULT] = out
  start = time.perf_counter()
  done = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "-p", "compile_seconds", test_file],
      env=env, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if done.returncode != 0:
    sys.exit(f"pytest {test_file} with XLA_FLAGS={env['XLA_FLAGS']!r} "
             f"failed ({done.returncode}):\n{done.stdout[-2000:]}"
             f"{done.stderr[-2000:]}")
  with open(out, encoding="utf-8") as f:
    totals = json.load(f)
  return dict(totals, wall=wall)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--file", default="tests/families/gpt/test_gpt_steps.py")
  parser.add_argument("--rounds", type=int, default=2)  # >= 1
  parser.add_argument("--extra", action="append",
                      help="XLA flags added to the tests' (repeat; '' = "
                           "XLA's defaults)")
  args = parser.parse_args()
  choices = args.extra or ["", "--xla_cpu_use_fusion_emitters=false"]
  if args.rounds < 1:
    sys.exit(f"--rounds={args.rounds}: must be 1 or more.")
  if not os.path.exists(args.file):
    sys.exit(f"--file={args.file}: no such test file (run from the "
             "repository root).")
  print(f"load before: {os.getloadavg()}  cpus: {os.cpu_count()}")
  seen = {choice: [] for choice in choices}
  out = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                     f"compile_seconds_{os.getpid()}.json")
  for round_ in range(args.rounds):
    for choice in choices:
      got = _run(args.file, choice, out)
      seen[choice].append(got)
      print(f"round {round_} {choice or '(XLA defaults)'}: compile "
            f"{got['seconds']:.1f} s in {got['compiles']} compiles, "
            f"pytest wall {got['wall']:.1f} s", flush=True)
  if os.path.exists(out):
    os.remove(out)
  for choice, runs in seen.items():
    print(f"median {choice or '(XLA defaults)'}: compile "
          f"{statistics.median(r['seconds'] for r in runs):.1f} s, wall "
          f"{statistics.median(r['wall'] for r in runs):.1f} s")
  print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
  main()
