r"""Which dispatch depths and pool sizes let XLA:CPU's multi-device
collectives deadlock.

  python benchmarks/reliability/cpu_dispatch_depth.py [--steps=3000] \
      [--depths=none,2,8,32] [--mesh=8|2x2x2] [--eager_ops=K] \
      [--pool_threads=N,...]

Each depth runs in a fresh process with 8 simulated CPU devices: `--steps`
jitted steps, with the host kept at most DEPTH steps ahead by
`trm.core.dispatch.DispatchBound` (`none`: never waits, as a loop that reads
no result). `--mesh=8`: data-parallel (a gradient all-reduce each);
`--mesh=2x2x2`: a two-layer MLP (256x1024x256) sharded over data, fsdp and
model (all gathers and reduce-scatters over pairs of devices). After each
step, `--eager_ops` eager additions to a running total (each a program of
its own on all 8 devices, as CLU's metric merges outside jit were; the
bound counts steps, not these; default 0 with `--mesh=8`, 1 with
`--mesh=2x2x2`). `--pool_threads`:
the XLA:CPU pool's size (PJRT_NPROC), one pass over the depths per value;
`default` is what `import trm` sets (trm/core/cpu_threads.py: twice the
devices), 8 is XLA's own on a host of up to 8 cores. A deadlocked process
is aborted by XLA after its collective timeouts (20 s to a warning, 40 s
more to the abort; `--collective_timeout=S` sets both to S). Prints one
line per depth: finished (with seconds), or the exit code and XLA's reason.
"""
import argparse
import os
import subprocess
import sys
import time

import busy_host  # this folder's: XLA's abort in one line

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from trm.core import cpu_threads  # pylint: disable=g-import-not-at-top,wrong-import-position

_CHILD = r"""
import sys, time
import jax, jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from trm.core import dispatch

steps, depth, shape = int(sys.argv[1]), sys.argv[2], sys.argv[3]
eager_ops = int(sys.argv[4])
if shape == "8":
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  w = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P()))
  x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P("data")))
  forward = lambda w: jnp.mean((x @ w) ** 2)
else:
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "model"),
                       axis_types=(AxisType.Auto,) * 3)
  # Large enough that the devices fall behind the host (with 64x128
  # weights XLA's pool of 8 kept up on an idle host, and aborted under load).
  w = (jax.device_put(jnp.full((256, 1024), 0.01),
                      NamedSharding(mesh, P("fsdp", "model"))),
       jax.device_put(jnp.full((1024, 256), 0.01),
                      NamedSharding(mesh, P("model", "fsdp"))))
  x = jax.device_put(jnp.ones((64, 256)),
                     NamedSharding(mesh, P(("data", "fsdp"))))
  forward = lambda w: jnp.mean((jax.nn.relu(x @ w[0]) @ w[1]) ** 2)

@jax.jit
def step(w, x):
  loss, grad = jax.value_and_grad(forward)(w)
  return jax.tree.map(lambda a, b: a - 1e-3 * b, w, grad), loss

bound = (lambda out: out) if depth == "none" else dispatch.DispatchBound(
    int(depth))
total = step(w, x)[1]
float(total)  # compile outside the timing
begin = time.time()
for _ in range(steps):
  w, loss = step(w, x)
  bound(loss)
  for _ in range(eager_ops):  # each its own 8-device program
    total = total + loss
float(loss)
print(f"finished in {time.time() - begin:.2f} s")
"""


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--depths", default="none,2,8,32")
  parser.add_argument("--mesh", choices=("8", "2x2x2"), default="8")
  parser.add_argument("--eager_ops", type=int, default=None,
                      help="eager 8-device additions after each step")
  parser.add_argument("--pool_threads", default="default",
                      help="comma-separated PJRT_NPROC values, or default")
  parser.add_argument("--timeout", type=int, default=180,
                      help="seconds before a depth's process is killed")
  parser.add_argument("--collective_timeout", type=int, default=None,
                      help="seconds XLA waits on a stuck collective before "
                      "it warns and again before it aborts (XLA: 20 and 40)")
  args = parser.parse_args()
  if args.eager_ops is None:
    args.eager_ops = 0 if args.mesh == "8" else 1
  if args.eager_ops < 0:
    parser.error(f"--eager_ops={args.eager_ops} must be >= 0")
  flags = "--xla_force_host_platform_device_count=8"
  if args.collective_timeout:
    flags += "".join(
        f" --xla_cpu_collective_call_{name}_seconds={args.collective_timeout}"
        for name in ("warn_stuck_timeout", "terminate_timeout"))
  base = {k: v for k, v in os.environ.items()
          if k not in ("PJRT_NPROC", "NPROC", cpu_threads.OURS_ENV)}
  base.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, XLA_FLAGS=flags)
  with open("/proc/loadavg") as f:
    print(f"cpus: {os.cpu_count()}; load: {f.read().split()[0]}; "
          f"steps: {args.steps}; mesh: {args.mesh}; "
          f"eager ops a step: {args.eager_ops}")
  pools = args.pool_threads.split(",")
  for threads in pools:
    if threads != "default" and (not threads.isdigit() or int(threads) < 1):
      parser.error(f"--pool_threads: {threads!r} is not a positive number "
                   "or 'default'")
  for threads in pools:
    env = dict(base)
    if threads != "default":
      env["PJRT_NPROC"] = threads
    else:
      threads = str(cpu_threads.pool_threads(8, os.cpu_count() or 1))
    for depth in args.depths.split(","):
      begin = time.time()
      label = f"pool {threads}, depth {depth}"
      try:
        run = subprocess.run(
            [sys.executable, "-c", _CHILD, str(args.steps), depth,
             args.mesh, str(args.eager_ops)], env=env,
            capture_output=True, text=True, timeout=args.timeout)
      except subprocess.TimeoutExpired:
        print(f"{label}: killed after {args.timeout} s")
        continue
      if run.returncode == 0:
        print(f"{label}: {run.stdout.strip()}")
      else:
        reason = busy_host.xla_abort_reason(run.stderr)
        print(f"{label}: exit code {run.returncode} after "
              f"{time.time() - begin:.0f} s; {reason}")


if __name__ == "__main__":
  main()
