r"""What `import trm`'s XLA:CPU pool costs a train step on forced CPU devices.

  python benchmarks/speed/cpu_pool_step.py [--rounds=3] [--pools=8,16] \
      [--hidden=256] [--steps=150]

The TRM trainer (`configs/trm_sudoku.py:cpu`, one layer, hidden size
`--hidden`, 256 generated puzzles) on a 2x2x2 mesh of 8 forced CPU devices,
`--steps` steps, each run a fresh process with PJRT_NPROC set to one of
`--pools` (8: XLA's own size on a host of up to 8 cores; 16: what `import
trm` sets, trm/core/cpu_threads.py). Milliseconds a step are read from the
train loop's own dispatch bound (one call a step) over steps 21 to the last,
so compiling and the data build are left out. Rounds alternate the pools, so
drift in the machine's load hits each alike; the 1-minute load average is
printed before each run. The 8 devices need more than one core, so the runs
are not pinned.
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_CHILD = r"""
import os, sys, tempfile, time
from trm import families
from trm.core import config_lib, dispatch, train
from trm.families.trm import task as puzzle

steps, hidden, root = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
times = []
record = dispatch.DispatchBound.__call__
def timed(self, outputs):
  outputs = record(self, outputs)
  times.append(time.perf_counter())
  return outputs
dispatch.DispatchBound.__call__ = timed
config = config_lib.load_config(
    os.path.join(root, "configs", "trm_sudoku.py"), "cpu")
data = tempfile.mkdtemp()
config = config_lib.set_values(config, {
    "model.hidden_size": hidden, "model.num_heads": 2,
    "model.puzzle_emb_ndim": hidden, "model.halt_max_steps": 2,
    "model.L_layers": 1, "data.build.num_train": 256,
    "data.build.num_test": 32, "data.build.num_blanks": 30,
    "data.eval_batch_size": 16, "optim.warmup_steps": 5,
    "mesh.data": 2, "mesh.fsdp": 2, "mesh.model": 2,
    "global_batch_size": 16, "total_steps": steps, "eval_every": steps,
    "checkpoint_every": 0, "log_every": steps, "data.data_dir": data})
puzzle.prepare_data(config, data)
train.train_and_evaluate(config, tempfile.mkdtemp(), families.build_task)
train_steps = times[20:steps]
print((train_steps[-1] - train_steps[0]) / (len(train_steps) - 1) * 1000)
"""


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--pools", default="8,16",
                      help="comma-separated PJRT_NPROC values")
  parser.add_argument("--hidden", type=int, default=256)
  parser.add_argument("--steps", type=int, default=150)
  args = parser.parse_args()
  pools = args.pools.split(",")
  for pool in pools:
    if not pool.isdigit() or int(pool) < 1:
      parser.error(f"--pools: {pool!r} is not a positive number")
  if args.steps < 30 or args.rounds < 1 or args.hidden < 2:
    parser.error("--steps must be at least 30 (steps 21 on are timed), "
                 "--rounds at least 1, --hidden at least 2")
  env = {k: v for k, v in os.environ.items()
         if k not in ("NPROC", "TRM_PJRT_NPROC")}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  print(f"cpus: {os.cpu_count()}; hidden {args.hidden}, mesh 2x2x2, "
        f"{args.steps} steps; ms a step over steps 21-{args.steps}")
  for round_ in range(1, args.rounds + 1):
    for pool in pools:
      load = os.getloadavg()[0]
      with tempfile.TemporaryDirectory() as cwd:
        run = subprocess.run(
            [sys.executable, "-c", _CHILD, str(args.steps),
             str(args.hidden), ROOT], env=dict(env, PJRT_NPROC=pool),
            cwd=cwd, capture_output=True, text=True, timeout=1800)
      if run.returncode != 0:
        sys.exit(f"PJRT_NPROC={pool} failed (exit {run.returncode}):\n"
                 + run.stderr[-2000:])
      ms = float(run.stdout.strip().splitlines()[-1])
      print(f"round {round_} PJRT_NPROC={pool:>3}: {ms:7.1f} ms a step "
            f"(load {load:.2f})", flush=True)


if __name__ == "__main__":
  main()
