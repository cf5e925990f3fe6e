r"""GFLOP/s of one jitted `a @ b` (XLA:CPU) and of torch's, on TRM's shapes.

  PYTHONPATH=. python benchmarks/speed/trm_matmul_shapes.py
  XLA_FLAGS=--xla_cpu_use_xnnpack=true PYTHONPATH=. python \
      benchmarks/speed/trm_matmul_shapes.py

Shapes: the `:cpu` token mixer ([2I, S] x [S, B*D] with S = 97, and the
down projection), its channel MLP ([B*S, D] x [D, 2I]), and the paper
config's channel MLP at batch 8. Median of `--calls` calls after one
warm-up; float32 and bfloat16 on both sides; torch with all cores. "bf16->f32"
is our `nn.linear.dot`: bf16 operands, the float32 accumulator asked for,
rounded after (XLA:CPU's fast bf16 kernels take that form only).
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import torch  # pylint: disable=g-import-not-at-top,wrong-import-position

from trm.nn import linear  # pylint: disable=g-import-not-at-top,wrong-import-position

SHAPES = [(1024, 97, 4096), (97, 512, 4096), (6208, 64, 512),
          (776, 512, 3072)]


def _median_seconds(fn, calls):
  fn()
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--calls", type=int, default=20)
  args = p.parse_args()
  torch.set_num_threads(os.cpu_count())
  matmul = jax.jit(lambda a, b: a @ b)
  dot = jax.jit(linear.dot)
  rng = np.random.default_rng(0)
  print(f"load {os.getloadavg()[0]:.2f}; XLA_FLAGS="
        f"{os.environ.get('XLA_FLAGS', '')!r}")
  for m, k, n in SHAPES:
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    row = []
    for jdt, tdt in ((jnp.float32, torch.float32),
                     (jnp.bfloat16, torch.bfloat16)):
      ja, jb = jnp.asarray(a, jdt), jnp.asarray(b, jdt)
      ta, tb = torch.tensor(a, dtype=tdt), torch.tensor(b, dtype=tdt)
      for fn in (lambda: matmul(ja, jb).block_until_ready(),
                 lambda: ta @ tb):
        row.append(2 * m * k * n / _median_seconds(fn, args.calls) / 1e9)
    row.append(2 * m * k * n / _median_seconds(
        lambda: dot(ja, jb).block_until_ready(), args.calls) / 1e9)
    print(f"[{m},{k}]x[{k},{n}] GFLOP/s  f32 jax {row[0]:.0f} torch "
          f"{row[1]:.0f} | bf16 jax {row[2]:.0f} torch {row[3]:.0f} | "
          f"bf16->f32 jax (nn.linear.dot) {row[4]:.0f}")


if __name__ == "__main__":
  main()
