r"""Ways to find the top-k / top-p boundary of [rows, vocab] logits on CPU.

  taskset -c 0 python benchmarks/speed/topk_methods.py [--rows=512 --vocab=16384]

One XLA thread; each method jitted, timed over 5 calls after a warm-up:
`lax.top_k` (XLA:CPU's TopK; inside a loop it becomes a full sort), a
stable argsort plus cumulative sum (what a sort-based top-p needs), a
32-pass bisection over the whole vocabulary (`_kth_largest_key`), and the
sampler's block candidates (`token_draws._candidates`, k = 50).
"""
from __future__ import annotations

import os
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false "
                           "intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_ROWS = flags.DEFINE_integer("rows", 512, "Rows (batch x positions).")
_VOCAB = flags.DEFINE_integer("vocab", 16384, "Vocabulary size.")
_K = flags.DEFINE_integer("k", 50, "k.")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.dream import token_draws  # pylint: disable=g-import-not-at-top

  k = _K.value
  x = jax.random.normal(jax.random.key(0), (_ROWS.value, _VOCAB.value)) * 3
  methods = {
      "lax.top_k":
          lambda x: jax.lax.top_k(x, k)[0][:, -1],
      "stable argsort + cumsum":
          lambda x: jnp.cumsum(jnp.take_along_axis(
              x, jnp.argsort(-x, axis=-1, stable=True), axis=-1),
                               axis=-1),
      "bisection over the vocabulary (32 passes)":
          lambda x: token_draws._kth_largest_key(token_draws._order_keys(x), k),  # pylint: disable=protected-access
      "block candidates (k-th largest, exact)":
          lambda x: token_draws._candidates(x, k)[2],  # pylint: disable=protected-access
  }
  print(f"[{_ROWS.value}, {_VOCAB.value}] float32, k={k}, load "
        f"{os.getloadavg()[0]:.2f}")
  for name, fn in methods.items():
    fn = jax.jit(fn)
    jax.block_until_ready(fn(x))
    start = time.perf_counter()
    for _ in range(5):
      out = fn(x)
    jax.block_until_ready(out)
    print(f"{name:45s} {(time.perf_counter() - start) / 5 * 1000:8.1f} ms")


if __name__ == "__main__":
  app.run(main)
