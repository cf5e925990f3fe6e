r"""Our masked-diffusion sampler against the reference loop in PyTorch.

  taskset -c 0 python benchmarks/speed/dream_sampler_speed.py [--rounds=3] \
      [--dtype=float32] [--batch=4 --prompt_len=128 --max_new_tokens=128 \
       --steps=128]

Same weights on both sides: a random Qwen2-shaped Dream (default vocab 16384,
hidden 256, 4 layers, 8 query / 2 key-value heads, intermediate 1024) is
written once in the Hugging Face layout, then read by ours
(`hf_import.load_hf_checkpoint`) and by transformers' `Qwen2ForCausalLM`
running `dream_torch_sampler.diffusion_generate` (the reference `_sample`
loop). One thread each (torch.set_num_threads(1); XLA's CPU client with one
intra-op thread), to be pinned to one core with taskset; rounds alternate
which side runs first. Three settings, `alg=entropy`: top_k unset; top_k=50
greedy; top_p=0.95, top_k=50, temperature 0.2. Our compile time is measured
apart (lower + compile) and excluded from tokens/s. Prints per setting the
median and min-max tokens/s of both, the ratio, and for greedy settings the
fraction of generated tokens equal on both sides; the 1-minute load average
before each round.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

# One intra-op thread for XLA's CPU client, set before jax loads.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false "
                           "intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                           "Compute dtype on both sides.")
_BATCH = flags.DEFINE_integer("batch", 4, "Prompts per call.")
_PROMPT = flags.DEFINE_integer("prompt_len", 128, "Prompt tokens.")
_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Generated tokens.")
_STEPS = flags.DEFINE_integer("steps", 128, "Denoising steps.")
_VOCAB = flags.DEFINE_integer("vocab", 16384, "Vocabulary size.")
_HIDDEN = flags.DEFINE_integer("hidden", 256, "Hidden size.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Decoder layers.")
_HEAD_SCALE = flags.DEFINE_float(
    "head_scale", 20.0, "Multiplies the random LM head: peaked predictions "
    "as a trained model's (at 1, the init's near-uniform ones make the "
    "confidences tie to within float noise, and the two sides' roundings "
    "pick the reveal order).")
_SETTINGS = flags.DEFINE_list(
    "settings", ["unset", "top_k", "top_p"],
    "Which of: unset (top_k off, greedy), top_k (50, greedy), top_p (0.95 "
    "with top_k 50, temperature 0.2).")

SETTINGS = {
    "unset": dict(top_k=None, top_p=None, temperature=0.0),
    "top_k": dict(top_k=50, top_p=None, temperature=0.0),
    "top_p": dict(top_k=50, top_p=0.95, temperature=0.2),
}


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
  from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(1)
  cfg = dream.DreamConfig(
      vocab_size=_VOCAB.value, hidden_size=_HIDDEN.value,
      intermediate_size=4 * _HIDDEN.value, num_hidden_layers=_LAYERS.value,
      num_attention_heads=8, num_key_value_heads=2,
      mask_token_id=_VOCAB.value - 1, pad_token_id=0, dtype=_DTYPE.value,
      param_dtype="float32", remat="none")
  init = nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  init["lm_head"]["kernel"] = init["lm_head"]["kernel"] * _HEAD_SCALE.value
  directory = tempfile.mkdtemp(prefix="dream_speed_")
  hf_import.export_hf_checkpoint(init, cfg, directory, dtype="float32")
  params = hf_import.load_hf_checkpoint(directory, cfg)
  torch_model = ref.qwen2_from_hf_dir(
      directory, torch.float32 if _DTYPE.value == "float32"
      else torch.bfloat16)
  rng = np.random.default_rng(0)
  ids = rng.integers(1, cfg.mask_token_id, (_BATCH.value, _PROMPT.value))
  common = dict(mask_token_id=cfg.mask_token_id,
                max_new_tokens=_NEW.value, steps=_STEPS.value, alg="entropy")
  denoiser = dream.denoiser(cfg)
  new_tokens = _BATCH.value * _NEW.value
  print(f"Dream {dream.param_count(cfg):,} params, compute {_DTYPE.value}; "
        f"batch {_BATCH.value}, prompt {_PROMPT.value} + {_NEW.value} new, "
        f"{_STEPS.value} steps, alg=entropy, LM head x{_HEAD_SCALE.value:g}; "
        f"JAX {jax.__version__}, torch "
        f"{torch.__version__}, 1 thread each", flush=True)

  compiled = {}
  for name in _SETTINGS.value:
    start = time.perf_counter()
    lowered = diffusion_sampling.lower_generate(
        denoiser, jax.ShapeDtypeStruct(ids.shape, jnp.int32), None,
        params=params, **common, **SETTINGS[name])
    compiled[name] = lowered.compile()
    print(f"{name}: ours compiled in {time.perf_counter() - start:.2f} s",
          flush=True)

  def ours(name, seed):
    out = compiled[name](params, jnp.asarray(ids, jnp.int32), None,
                         jax.random.key(seed))
    return np.asarray(jax.block_until_ready(out))

  def theirs(name, seed):
    torch.manual_seed(seed)
    return ref.diffusion_generate(torch_model, ids, None, **common,
                                  **SETTINGS[name])

  times = {(name, side): [] for name in _SETTINGS.value
           for side in ("ours", "torch")}
  outputs = {}
  for r in range(_ROUNDS.value):
    load = os.getloadavg()[0]
    print(f"round {r + 1}: load {load:.2f}", flush=True)
    for name in _SETTINGS.value:
      sides = [("ours", ours), ("torch", theirs)]
      for side, fn in (sides if r % 2 == 0 else sides[::-1]):
        start = time.perf_counter()
        outputs[(name, side)] = fn(name, r)
        seconds = time.perf_counter() - start
        times[(name, side)].append(seconds)
        print(f"  {name:6s} {side:5s} {seconds:7.2f} s "
              f"{new_tokens / seconds:7.1f} tokens/s", flush=True)

  print("setting  ours tok/s (min-max)     torch tok/s (min-max)    "
        "ours/torch  greedy tokens equal")
  for name in _SETTINGS.value:
    rate = {side: [new_tokens / t for t in times[(name, side)]]
            for side in ("ours", "torch")}
    med = {side: statistics.median(v) for side, v in rate.items()}
    equal = ""
    if SETTINGS[name]["temperature"] == 0:
      a, b = outputs[(name, "ours")], outputs[(name, "torch")]
      equal = f"{np.mean(a[:, _PROMPT.value:] == b[:, _PROMPT.value:]):.4f}"
    print(f"{name:7s} {med['ours']:7.1f} ({min(rate['ours']):.1f}-"
          f"{max(rate['ours']):.1f})   {med['torch']:7.1f} "
          f"({min(rate['torch']):.1f}-{max(rate['torch']):.1f})   "
          f"{med['ours'] / med['torch']:6.2f}x     {equal}")


if __name__ == "__main__":
  app.run(main)
