r"""Peak memory of a nanoGPT export with AdamW's moments, and its warnings.

  PYTHONPATH=. python benchmarks/reliability/export_memory.py \
      [--n_embd=768 --n_layer=12] [--consume]

Builds a GPT (vocabulary 50304, 8 heads, block 256) and two moment trees
of its shape, then times `gpt_export.export_nanogpt` into a temporary
directory (with `consume=True` under `--consume`, as `trm.export` calls
it). Prints the tree's size, the export's seconds, tracemalloc's peak
(numpy's allocations only, not JAX's buffers), the process's max RSS
before and after, and how many of torch's "not writable" warnings the
export raised. One export per process: max RSS never goes down, so
compare runs, not exports within one.
"""
import argparse
import os
import resource
import tempfile
import time
import tracemalloc
import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp

from trm.families.gpt import gpt_export
from trm.families.gpt import model as gpt
from trm.families.gpt.config import GPTConfig


def _max_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--n_embd", type=int, default=768)
  parser.add_argument("--n_layer", type=int, default=12)
  parser.add_argument("--consume", action="store_true")
  args = parser.parse_args()
  cfg = GPTConfig(n_embd=args.n_embd, n_layer=args.n_layer, n_head=8,
                  block_size=256)
  params = nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  mu = jax.tree.map(lambda x: x * 0.5, params)
  nu = jax.tree.map(lambda x: x * x, params)
  jax.block_until_ready((params, mu, nu))
  tree_mib = sum(x.size * 4 for x in jax.tree.leaves(params)) / 2**20
  before = _max_rss_mib()
  tracemalloc.start()
  with tempfile.TemporaryDirectory() as out, warnings.catch_warnings(
      record=True) as caught:
    warnings.simplefilter("always")
    start = time.perf_counter()
    gpt_export.export_nanogpt(
        params, cfg, os.path.join(out, gpt_export.NANOGPT_FILE), 7,
        adam={"mu": mu, "nu": nu, "count": 7},
        hyper=dict(learning_rate=1e-3, beta1=0.9, beta2=0.95,
                   weight_decay=0.1),
        consume=args.consume)
    seconds = time.perf_counter() - start
  _, peak = tracemalloc.get_traced_memory()
  after = _max_rss_mib()
  read_only = sum("not writable" in str(w.message) for w in caught)
  print(f"consume={args.consume}: tree {tree_mib:.1f} MiB; export "
        f"{seconds:.2f} s; tracemalloc peak {peak / 2**20:.1f} MiB; max RSS "
        f"{before:.0f} -> {after:.0f} MiB (+{after - before:.0f}); "
        f"read-only warnings: {read_only}")


if __name__ == "__main__":
  main()
