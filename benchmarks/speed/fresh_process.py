"""One timed child process for the start-up benchmarks (import_seconds.py,
event_writer_seconds.py): Python code in a fresh interpreter, its one
`RESULT {json}` line read back, its wall time from start to exit added."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def run(tool: str, code: str, args=(), path=(), cpu=None) -> dict:
  """Runs `code` with `args` as sys.argv[1:], `path` then the repository
  then the caller's PYTHONPATH on its path, on CPU jax, under `taskset -c
  cpu` if given; returns its RESULT dict with "wall" (seconds). A failed
  child ends the benchmark (`tool` names it) with its stderr's tail."""
  # No empty entry: it would put the caller's directory on the path.
  entries = [*path, ROOT, os.environ.get("PYTHONPATH", "")]
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             PYTHONPATH=os.pathsep.join(p for p in entries if p))
  command = [sys.executable, "-c", code, *args]
  if cpu is not None:
    command = ["taskset", "-c", str(cpu)] + command
  start = time.perf_counter()
  done = subprocess.run(command, env=env, capture_output=True, text=True,
                        check=False)
  wall = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"{tool}: the child failed (exit {done.returncode}):\n"
                     f"{done.stderr[-2000:]}")
  line = next((l for l in done.stdout.splitlines()
               if l.startswith("RESULT ")), None)
  if line is None:
    raise SystemExit(f"{tool}: the child printed no RESULT line:\n"
                     f"{done.stdout[-2000:]}")
  result = json.loads(line[len("RESULT "):])
  result["wall"] = wall
  return result


def alternate(rounds: int, sides, run_side, describe) -> dict:
  """`rounds` rounds of every side in turn (A, B, A, B, ...), so drift in
  the machine's load hits each alike: `run_side(side, round)` gives a
  result, printed as `describe(result)` with the 1-minute load average
  before it ran; returns each side's results."""
  results = {side: [] for side in sides}
  for round_ in range(rounds):
    for side in sides:
      load = os.getloadavg()[0]
      result = run_side(side, round_)
      results[side].append(result)
      print(f"round {round_} {side}: {describe(result)} (load {load:.2f})",
            flush=True)
  return results


def print_medians(first_column: str, columns: dict, results: dict) -> None:
  """A markdown table of each side's medians over the rounds: `columns`
  maps a RESULT key to its header, `results` a side to its rounds."""
  print("\nmedians over the rounds:")
  print(f"| {first_column} | " + " | ".join(columns.values()) + " |")
  print("|---" * (len(columns) + 1) + "|")
  for side, rows in results.items():
    print(f"| {side} | " + " | ".join(
        f"{statistics.median(r[k] for r in rows):.3f}" for k in columns)
          + " |")
