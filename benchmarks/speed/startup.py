r"""Start-up with the persistent compilation cache off and warm.

  python benchmarks/speed/startup.py --rounds=3

What `trm/core/compile_cache.py` saves a second run: the time from starting
the process to

  * its first token: `python -m trm.generate` on a tiny DiffuCoder run,
    up to the line that prints the completion ("=== <prompt>"; the
    diffusion sampler reveals every token of the completion in one
    compiled program, so the first token comes with the whole completion,
    hence --max_new_tokens is small);
  * its first train step: a `python -m trm.main` resume of that run (a
    fresh copy each time), up to the line of its first resumed step's
    train metrics ("[N] train/loss=...", logged once step N's metrics are
    back on the host; with log_every=1, N is the first step resumed; the
    "iter N:" line is not used, it skips the first interval). The process
    is then killed: its evaluation and checkpoint are no start-up.

No log line was added for this: both lines already exist. Each command
runs under `taskset -c <--cpu>` (one core, so the other work on a shared
machine disturbs it less), with $TRM_COMPILATION_CACHE=off or pointing at
a cache primed once before the rounds ("cold": printed, not counted).
Rounds alternate off, warm, off, warm, ... so drift in the machine's load
hits both alike; the 1-minute load average (os.getloadavg) is printed at
each run. The tools' own compile figures are printed beside the walls.
The tiny run (2 steps of `configs/diffucoder_7b.py:tiny`, cache off) is
made first under --workdir, which is left behind with the cache in it.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, _ROOT)
from trm.core import compile_cache  # pylint: disable=g-import-not-at-top,wrong-import-position

CONFIG = "configs/diffucoder_7b.py:tiny"
TRAINED_STEPS = 2
# The tiny run's flags, and its resume's: two steps longer. DiffuCoder's
# cosine decays over total_steps, so the trainer refuses a longer resume
# unless allow_config_change accepts it (without it every round stopped
# at the resume, before the first row was printed).
TRAIN_FLAGS = (f"--config.total_steps={TRAINED_STEPS}",
               f"--config.checkpoint_every={TRAINED_STEPS}",
               f"--config.eval_every={TRAINED_STEPS}")
RESUME_FLAGS = (f"--config.total_steps={TRAINED_STEPS + 2}",
                "--config.allow_config_change=True",
                "--config.log_every=1", "--config.eval_every=1000",
                "--config.checkpoint_every=1000")
PROMPT = "def main("
FIRST_TOKEN = re.compile(r"^=== ")  # trm.generate prints the completion
FIRST_STEP = re.compile(r"\] \[(\d+)\] train/")  # trm.main's metrics line
GENERATE_COMPILE = re.compile(r"compile ([\d.]+) s\)")
TRAIN_COMPILE = re.compile(r"Train step compiled in ([\d.]+) s")


def _env(cache: str, platform: str) -> dict:
  env = dict(os.environ, TRM_COMPILATION_CACHE=cache, PYTHONUNBUFFERED="1")
  if platform:
    env["JAX_PLATFORMS"] = platform
  # One device per process, whatever the caller's shell forces.
  env.pop("XLA_FLAGS", None)
  return env


def _timed(argv, env, until, kill_at_line: bool, timeout: float):
  """(seconds from start to the first output line matching `until`, whole
  output). Raises RuntimeError if the line never comes."""
  start = time.perf_counter()
  proc = subprocess.Popen(argv, cwd=_ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  seen, lines = None, []
  try:
    for line in proc.stdout:
      lines.append(line)
      if seen is None and until.search(line):
        seen = time.perf_counter() - start
        if kill_at_line:
          proc.kill()
          break
      if time.perf_counter() - start > timeout:
        proc.kill()
        break
  finally:
    proc.stdout.close()
    proc.wait()
  if seen is None:
    raise RuntimeError(f"{' '.join(argv)}: no line matching {until.pattern!r}"
                       f" (exit {proc.returncode}); its output ended:\n"
                       + "".join(lines[-30:]))
  return seen, "".join(lines)


def _first(pattern, text: str) -> float:
  match = pattern.search(text)
  return float(match.group(1)) if match else float("nan")


def train_run(workdir: str, platform: str) -> str:
  """The tiny DiffuCoder run both commands start from (cache off)."""
  run = os.path.join(workdir, "run")
  if os.path.isdir(os.path.join(run, "checkpoints", str(TRAINED_STEPS))):
    return run
  shutil.rmtree(run, ignore_errors=True)
  subprocess.run(
      [sys.executable, "-m", "trm.main", f"--config={CONFIG}",
       f"--workdir={run}", *TRAIN_FLAGS],
      cwd=_ROOT, env=_env("off", platform), check=True,
      stdout=subprocess.DEVNULL)
  return run


def first_token(run: str, cache: str, args) -> dict:
  argv = ["taskset", "-c", args.cpu, sys.executable, "-m", "trm.generate",
          f"--checkpoint={run}", f"--prompt={PROMPT}",
          f"--max_new_tokens={args.max_new_tokens}",
          f"--steps={args.max_new_tokens}"]
  seconds, out = _timed(argv, _env(cache, args.platform), FIRST_TOKEN,
                        kill_at_line=False, timeout=args.timeout)
  return {"token_s": seconds, "gen_compile_s": _first(GENERATE_COMPILE, out)}


def first_step(run: str, cache: str, workdir: str, args) -> dict:
  resume = os.path.join(workdir, "resume")
  shutil.rmtree(resume, ignore_errors=True)
  shutil.copytree(run, resume)
  argv = ["taskset", "-c", args.cpu, sys.executable, "-m", "trm.main",
          f"--config={CONFIG}", f"--workdir={resume}", *RESUME_FLAGS]
  seconds, out = _timed(argv, _env(cache, args.platform), FIRST_STEP,
                        kill_at_line=True, timeout=args.timeout)
  step = int(FIRST_STEP.search(out).group(1))
  if step != TRAINED_STEPS + 1:
    raise RuntimeError(f"the resume's first metrics line is step {step}, "
                       f"not {TRAINED_STEPS + 1}: it did not resume")
  shutil.rmtree(resume, ignore_errors=True)
  return {"step_s": seconds, "train_compile_s": _first(TRAIN_COMPILE, out)}


def measure(run: str, cache_setting: str, workdir: str, args) -> dict:
  load = os.getloadavg()[0]
  row = {"load1": load}
  row.update(first_token(run, cache_setting, args))
  row.update(first_step(run, cache_setting, workdir, args))
  return row


COLUMNS = (("load1", "load 1m"), ("token_s", "first token s"),
           ("gen_compile_s", "generate compile s"),
           ("step_s", "first step s"),
           ("train_compile_s", "train step compile s"))


def _print_row(label: str, mode: str, row: dict) -> None:
  cells = " | ".join(f"{row[k]:.1f}" if k != "load1" else f"{row[k]:.2f}"
                     for k, _ in COLUMNS)
  print(f"| {label} | {mode} | {cells} |", flush=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=3,
                      help="Rounds of (cache off, cache warm) (>= 1).")
  parser.add_argument("--workdir", default=None,
                      help="Where the tiny run and the cache go (default: a "
                           "new temporary directory).")
  parser.add_argument("--cpu", default="0",
                      help="taskset -c list every measured command runs on.")
  parser.add_argument("--max_new_tokens", type=int, default=8,
                      help="trm.generate's completion length (= its steps).")
  parser.add_argument("--platform", default="cpu",
                      help="JAX_PLATFORMS for the commands ('' = JAX's "
                           "choice).")
  parser.add_argument("--timeout", type=float, default=600.0,
                      help="Seconds one command may take.")
  args = parser.parse_args()
  if args.rounds < 1:
    parser.error(f"--rounds={args.rounds}: must be >= 1")
  if shutil.which("taskset") is None:
    parser.error("taskset is not installed (util-linux); it pins every "
                 "measured command to --cpu")
  workdir = args.workdir or tempfile.mkdtemp(prefix="trm_startup_")
  os.makedirs(workdir, exist_ok=True)
  run = train_run(workdir, args.platform)
  cache = os.path.join(workdir, "cache")
  shutil.rmtree(cache, ignore_errors=True)
  print(f"run: {run}\ncache: {cache}\ncommands under taskset -c {args.cpu}; "
        f"generate: --max_new_tokens={args.max_new_tokens}; resume: one "
        f"step past {TRAINED_STEPS}\n")
  header = " | ".join(title for _, title in COLUMNS)
  print(f"| round | cache | {header} |\n|" + "---|" * (len(COLUMNS) + 2))
  _print_row("prime", "cold", measure(run, cache, workdir, args))
  rows = {"off": [], "warm": []}
  for r in range(1, args.rounds + 1):
    for mode, setting in (("off", "off"), ("warm", cache)):
      row = measure(run, setting, workdir, args)
      rows[mode].append(row)
      _print_row(str(r), mode, row)
  for mode in rows:
    median = {k: statistics.median(row[k] for row in rows[mode])
              for k, _ in COLUMNS}
    _print_row("median", mode, median)
  size = compile_cache.size_bytes(cache)
  files = sum(len(f) for _, _, f in os.walk(cache))
  print(f"\ncache after the runs: {size / 2**10:.0f} KiB in {files} files "
        f"({cache})")


if __name__ == "__main__":
  main()
