r"""Dream hidden-state forward time against the batch, with page faults.

  taskset -c 0 python benchmarks/speed/dream_batch_scaling.py [--length=1024 \
      --batches=4,8,16 --calls=5]
  GLIBC_TUNABLES=glibc.malloc.hugetlb=1 taskset -c 0 python ...

The `:tiny` shapes of `configs/diffucoder_7b.py` (random weights: the time
does not depend on them), float32, one XLA thread. Per batch: the median ms
per forward and per row, and per call the user and system CPU seconds and
minor page faults of this process (`getrusage`), the 1-minute load. A
system time and fault count that jump with the batch mean the temporary
buffers are mapped afresh every call (see NOTES_h13.md).
"""
from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_LENGTH = flags.DEFINE_integer("length", 1024, "Tokens per sequence.")
_BATCHES = flags.DEFINE_list("batches", ["4", "8", "16"], "Batch sizes.")
_CALLS = flags.DEFINE_integer("calls", 5, "Timed forwards per batch.")


def main(argv):
  del argv
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top

  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  # configs/diffucoder_7b.py:tiny's model, without remat (no backward here).
  tiny = config_lib.load_config(os.path.join(
      os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
          __file__)))), "configs", "diffucoder_7b.py"), "tiny")
  cfg = dataclasses.replace(dream.DreamConfig.from_config(tiny.model),
                            remat="none")
  params = nn.meta.unbox(dream.init_params(cfg, jax.random.key(0)))
  model = dream.Dream(cfg)
  hidden = jax.jit(lambda p, t: model.apply({"params": p}, t,
                                            method=dream.Dream.hidden))
  print(f"GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}, length "
        f"{_LENGTH.value}", flush=True)
  for batch in map(int, _BATCHES.value):
    tokens = jnp.zeros((batch, _LENGTH.value), jnp.int32)
    jax.block_until_ready(hidden(params, tokens))  # compile
    times = []
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(_CALLS.value):
      start = time.perf_counter()
      jax.block_until_ready(hidden(params, tokens))
      times.append(1000 * (time.perf_counter() - start))
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = _CALLS.value
    ms = statistics.median(times)
    print(f"batch {batch:3d}: {ms:8.1f} ms ({ms / batch:.1f} ms per row); "
          f"per call user {(after.ru_utime - before.ru_utime) / n:.3f} s, "
          f"sys {(after.ru_stime - before.ru_stime) / n:.3f} s, minor faults "
          f"{(after.ru_minflt - before.ru_minflt) // n:,}; load "
          f"{os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
  app.run(main)
