r"""Which dispatch depths let XLA:CPU's multi-device collectives deadlock.

  python benchmarks/reliability/cpu_dispatch_depth.py [--steps=3000] [--depths=none,2,8,32]

Each depth runs in a fresh process with 8 simulated CPU devices: `--steps`
jitted, data-parallel steps (a gradient all-reduce each), with the host kept
at most DEPTH calls ahead by `trm.core.dispatch.DispatchBound` (`none`: never
waits, as a loop that reads no result). A deadlocked process is aborted by
XLA after its collective timeouts (20 s to a warning, 40 s more to the
abort; `--collective_timeout=S` sets both to S). Prints one line per depth:
finished (with seconds), or the exit code and XLA's reason.
"""
import argparse
import os
import subprocess
import sys
import time

import busy_host  # this folder's: XLA's abort in one line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_CHILD = r"""
import sys, time
import jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from trm.core import dispatch

steps, depth = int(sys.argv[1]), sys.argv[2]
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
w = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P()))
x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P("data")))

@jax.jit
def step(w, x):
  loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(w)
  return w - 1e-3 * grad, loss

bound = (lambda out: out) if depth == "none" else dispatch.DispatchBound(
    int(depth))
float(step(w, x)[1])  # compile outside the timing
begin = time.time()
for _ in range(steps):
  w, loss = step(w, x)
  bound(loss)
float(loss)
print(f"finished in {time.time() - begin:.2f} s")
"""


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--depths", default="none,2,8,32")
  parser.add_argument("--timeout", type=int, default=180,
                      help="seconds before a depth's process is killed")
  parser.add_argument("--collective_timeout", type=int, default=None,
                      help="seconds XLA waits on a stuck collective before "
                      "it warns and again before it aborts (XLA: 20 and 40)")
  args = parser.parse_args()
  flags = "--xla_force_host_platform_device_count=8"
  if args.collective_timeout:
    flags += "".join(
        f" --xla_cpu_collective_call_{name}_seconds={args.collective_timeout}"
        for name in ("warn_stuck_timeout", "terminate_timeout"))
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=flags)
  with open("/proc/loadavg") as f:
    print(f"cpus: {os.cpu_count()}; load: {f.read().split()[0]}; "
          f"steps: {args.steps}")
  for depth in args.depths.split(","):
    begin = time.time()
    try:
      run = subprocess.run(
          [sys.executable, "-c", _CHILD, str(args.steps), depth], env=env,
          capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
      print(f"depth {depth}: killed after {args.timeout} s")
      continue
    if run.returncode == 0:
      print(f"depth {depth}: {run.stdout.strip()}")
    else:
      reason = busy_host.xla_abort_reason(run.stderr)
      print(f"depth {depth}: exit code {run.returncode} after "
            f"{time.time() - begin:.0f} s; {reason}")


if __name__ == "__main__":
  main()
