"""Do XLA:CPU programs loaded back from the persistent compilation cache
deadlock? (BUILD_NOTES, "Session 55".)

  python benchmarks/reliability/cpu_cache_deadlock.py --runs=3 --reps=3

Each run is a child process that trains DiffuCoder's `:tiny` config as
tests/families/dream/test_diffusion_lm.py's fixture does (mesh 2x2x2 on 8
CPU devices, 40 steps, evaluation and checkpoint every 20) `--reps` times
in a row, each in a fresh workdir, with JAX's in-memory caches cleared in
between so that every rep asks the persistent cache again. Modes:

  compiled  no persistent cache: every program is compiled in the process
  loaded    JAX's cache turned on directly: programs are loaded back
  guarded   the cache as `trm.*` commands turn it on
            (`trm.core.compile_cache.configure`), which keeps CPU programs
            whose collectives span several device groups out of it

Each mode has its own cache directory, filled by one unreported run first.
A deadlock is XLA's abort after its collective timeout (15 s here). Prints
one line per mode: runs, reps finished, runs aborted, seconds.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))
MODES = ("compiled", "loaded", "guarded")


def child(mode: str, cache: str, reps: int, data_glob: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  if mode == "loaded":
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
  elif mode == "guarded":
    from trm.core import compile_cache  # pylint: disable=g-import-not-at-top
    compile_cache.configure(cache)
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  from trm.core import train  # pylint: disable=g-import-not-at-top
  fixture = {"data.path": data_glob, "data.eval_rows": 16,
             "data.eval_batch_size": 8, "mesh.data": 2, "mesh.fsdp": 2,
             "mesh.model": 2, "total_steps": 40, "eval_every": 20,
             "checkpoint_every": 20, "log_every": 10, "seq_len": 64}
  for rep in range(reps):
    config = config_lib.set_values(config_lib.load_config(
        os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny"), fixture)
    workdir = tempfile.mkdtemp(prefix="cpu_cache_deadlock_")
    try:
      train.train_and_evaluate(config, workdir, families.build_task)
    finally:
      shutil.rmtree(workdir, ignore_errors=True)
    jax.clear_caches()
    print(f"rep {rep} finished", flush=True)


def run_child(mode: str, cache: str, reps: int, data_glob: str):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  env.pop("TRM_COMPILATION_CACHE", None)
  env["XLA_FLAGS"] = " ".join((
      env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8",
      "--xla_backend_optimization_level=0",
      "--xla_cpu_collective_call_terminate_timeout_seconds=15"))
  start = time.perf_counter()
  result = subprocess.run(
      [sys.executable, __file__, f"--child={mode}", f"--cache={cache}",
       f"--reps={reps}", f"--data_glob={data_glob}"],
      env=env, capture_output=True, text=True, timeout=600 + 300 * reps,
      check=False)
  finished = result.stdout.count(" finished")
  aborted = result.returncode != 0
  if aborted and "Termination timeout" not in result.stderr:
    sys.exit(f"{mode}: the child failed otherwise (exit "
             f"{result.returncode}):\n{result.stderr[-3000:]}")
  return finished, aborted, time.perf_counter() - start


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=3)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--modes", default=",".join(MODES))
  parser.add_argument("--data_glob",
                      default=os.path.join(ROOT, "trm", "**", "*.py"))
  parser.add_argument("--child", choices=MODES)
  parser.add_argument("--cache", default="")
  args = parser.parse_args()
  if args.child:
    child(args.child, args.cache, args.reps, args.data_glob)
    return
  modes = args.modes.split(",")
  for mode in modes:
    if mode not in MODES:
      parser.error(f"--modes: {mode!r} is none of {', '.join(MODES)}")
  print(f"{args.runs} runs x {args.reps} reps per mode; load "
        f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} cores", flush=True)
  root = tempfile.mkdtemp(prefix="cpu_cache_deadlock_caches_")
  try:
    for mode in modes:
      cache = os.path.join(root, mode)
      os.makedirs(cache)
      run_child(mode, cache, 1, args.data_glob)  # fills the cache
      finished = aborted = 0
      seconds = 0.0
      for _ in range(args.runs):
        done, failed, took = run_child(mode, cache, args.reps,
                                       args.data_glob)
        finished, aborted, seconds = (finished + done, aborted + failed,
                                      seconds + took)
      print(f"{mode:9s} {args.runs} runs: {finished} of "
            f"{args.runs * args.reps} reps finished, {aborted} runs aborted "
            f"(deadlock), {seconds:.0f} s", flush=True)
  finally:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
  main()
