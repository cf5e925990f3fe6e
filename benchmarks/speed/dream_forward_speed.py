r"""One Dream forward (hidden states + LM head) against transformers' Qwen2.

  taskset -c 0 python benchmarks/speed/dream_forward_speed.py [--rounds=5] \
      [--batch=4 --length=256] [--parts]

The 12.2M-parameter model of `dream_sampler_speed.py`, float32, the same
weights on both sides (written once in the Hugging Face layout), full
bidirectional attention, one thread each; rounds alternate which side runs
first, each round times `--calls` forwards. Prints per side the median and
min-max ms per forward, our compile time apart, the largest difference of
the logits, and the 1-minute load before each round. `--parts` also times
the two halves apart on both sides, in the same alternating rounds: the
final-normed hidden states, and the LM head on given hidden states.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false "
                           "intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_ROUNDS = flags.DEFINE_integer("rounds", 5, "Alternating rounds.")
_CALLS = flags.DEFINE_integer("calls", 5, "Forwards per round and side.")
_BATCH = flags.DEFINE_integer("batch", 4, "Sequences.")
_LENGTH = flags.DEFINE_integer("length", 256, "Tokens per sequence.")
_PARTS = flags.DEFINE_bool("parts", False, "Also time the hidden states and "
                           "the LM head apart.")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))), "reference"))
  import dream_torch_sampler as ref  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(1)
  cfg = dream.DreamConfig(
      vocab_size=16384, hidden_size=256, intermediate_size=1024,
      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
      mask_token_id=16383, pad_token_id=0, dtype="float32",
      param_dtype="float32", remat="none")
  init = nn.meta.unbox(dream.init_params(cfg, jax.random.key(0)))
  directory = tempfile.mkdtemp(prefix="dream_forward_")
  hf_import.export_hf_checkpoint(init, cfg, directory, dtype="float32")
  params = hf_import.load_hf_checkpoint(directory, cfg)
  torch_model = ref.qwen2_from_hf_dir(directory, torch.float32)
  ids = np.random.default_rng(0).integers(
      0, cfg.vocab_size, (_BATCH.value, _LENGTH.value))
  model = dream.Dream(cfg)
  start = time.perf_counter()
  forward = jax.jit(lambda p, t: model.apply({"params": p}, t)).lower(
      params, jnp.asarray(ids, jnp.int32)).compile()
  print(f"Dream {dream.param_count(cfg):,} params, float32, [{_BATCH.value}, "
        f"{_LENGTH.value}]; ours compiled in {time.perf_counter() - start:.2f}"
        f" s; JAX {jax.__version__}, torch {torch.__version__}, 1 thread",
        flush=True)
  tokens = jnp.asarray(ids, jnp.int32)
  torch_ids = torch.from_numpy(ids)
  full = torch.ones(_BATCH.value, 1, _LENGTH.value, _LENGTH.value,
                    dtype=torch.bool)

  def ours():
    return np.asarray(jax.block_until_ready(forward(params, tokens)))

  def theirs():
    with torch.no_grad():
      return torch_model(torch_ids, attention_mask=full).logits.numpy()

  print(f"max |logits difference| {np.abs(ours() - theirs()).max():.2e}")
  parts = [("forward", ours, theirs)]
  if _PARTS.value:
    hidden = jax.jit(lambda p, t: model.apply(
        {"params": p}, t, method=dream.Dream.hidden)).lower(
            params, tokens).compile()
    head = jax.jit(lambda p, h: model.apply(
        {"params": p}, h, method=dream.Dream.logits_from_hidden))
    h_ours = jax.block_until_ready(hidden(params, tokens))
    head = head.lower(params, h_ours).compile()
    h_torch = torch.from_numpy(np.array(h_ours))  # a writable copy

    def torch_hidden():
      with torch.no_grad():
        return torch_model.model(torch_ids, attention_mask=full)

    def torch_head():
      with torch.no_grad():
        return torch_model.lm_head(h_torch)

    parts += [
        ("hidden", lambda: jax.block_until_ready(hidden(params, tokens)),
         torch_hidden),
        ("lm head", lambda: jax.block_until_ready(head(params, h_ours)),
         torch_head)]
  times = {(part, side): [] for part, _, _ in parts
           for side in ("ours", "torch")}
  for r in range(_ROUNDS.value):
    print(f"round {r + 1}: load {os.getloadavg()[0]:.2f}", flush=True)
    for part, mine, other in parts:
      sides = [("ours", mine), ("torch", other)]
      for side, fn in (sides if r % 2 == 0 else sides[::-1]):
        for _ in range(_CALLS.value):
          begin = time.perf_counter()
          fn()
          times[part, side].append(1000 * (time.perf_counter() - begin))
  for part, _, _ in parts:
    for side in ("ours", "torch"):
      values = times[part, side]
      print(f"{part:8s} {side:5s} {statistics.median(values):8.1f} ms "
            f"({min(values):.1f}-{max(values):.1f})")
    ratio = (statistics.median(times[part, "ours"])
             / statistics.median(times[part, "torch"]))
    print(f"{part:8s} ours / torch time: {ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
