r"""One token draw of the exact sampler, unset top_k against top_k 50.

  taskset -c 0 python benchmarks/speed/dream_token_draw_speed.py [--scale=20]

`token_draws.sample_tokens` (greedy, entropy confidence) on [4, 128, 16384]
float32 logits drawn as standard normal x `--scale` (the sampler benchmark's
canvas rows; not its model's logits), one XLA thread, median of 10 calls;
then the softmax and the entropy alone, and the fraction of subnormal and
zero probabilities in XLA's softmax and in torch's on the same logits.
"""
from __future__ import annotations

import os
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false "
                           "intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_SCALE = flags.DEFINE_float("scale", 20.0, "Logit standard deviation.")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from trm.families.dream import token_draws  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(1)
  raw = (np.random.default_rng(0).standard_normal((4, 128, 16384))
         .astype(np.float32) * _SCALE.value)
  logits = jnp.asarray(raw)
  key = jax.random.key(0)

  def median_ms(fn, *args, calls=10):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))

  print(f"load {os.getloadavg()[0]:.2f}; logits [4, 128, 16384] x "
        f"{_SCALE.value:g}")
  for name, top_k in (("top_k unset", None), ("top_k 50", 50)):
    draw = jax.jit(lambda l, k, top_k=top_k: token_draws.sample_tokens(
        l, k, temperature=0.0, top_p=None, top_k=top_k, conf_kind="entropy"))
    print(f"sample_tokens, {name}: {median_ms(draw, logits, key):.1f} ms")
  softmax = jax.jit(lambda l: jax.nn.softmax(l, axis=-1))
  probs = softmax(logits)
  entropy = jax.jit(lambda p: jnp.sum(p * jnp.log(p + 1e-10), axis=-1))
  print(f"softmax alone: {median_ms(softmax, logits):.1f} ms; entropy "
        f"alone: {median_ms(entropy, probs):.1f} ms")
  tiny = np.finfo(np.float32).tiny
  for name, p in (("XLA", np.asarray(probs)),
                  ("torch", torch.softmax(torch.from_numpy(raw), -1).numpy())):
    print(f"{name} softmax: subnormal {np.mean((p > 0) & (p < tiny)):.4f}, "
          f"zero {np.mean(p == 0):.4f}")


if __name__ == "__main__":
  app.run(main)
