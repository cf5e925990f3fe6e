r"""Cached block decoding (Fast-dLLM style) against our exact sampler.

  taskset -c 0 python benchmarks/speed/dream_cached_speed.py [--rounds=3] \
      [--batch=1 --prompt_len=512 --max_new_tokens=512 --block_length=32]
      [--temperature=0.2 --top_p=0.95 --top_k=50]

The model is the random Qwen2-shaped Dream of `dream_sampler_speed.py`
(12.2M parameters; LM head scaled so that predictions are peaked), built
once; both samplers get the same weights, one XLA thread, `alg=entropy`,
greedy and top_k 50 unless --temperature / --top_p / --top_k say
otherwise. The exact sampler runs one token per step (steps =
max_new_tokens), as Dream's and DiffuCoder's evaluations do. Each
cached variant (prefix / dual cache, fixed steps / threshold 0.9) is timed in
the same rounds, rotating the order; compile times are printed apart.
Prints per variant the median and min-max tokens/s, the speedup over the
exact sampler and, when greedy, the fraction of generated tokens equal to
the exact sampler's (the cache is an approximation, so not 1; with
temperature > 0 the draws differ anyway and it is not printed), and the
1-minute load before each round.
"""
from __future__ import annotations

import os
import statistics
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false "
                           "intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Rounds (order rotates).")
_BATCH = flags.DEFINE_integer("batch", 1, "Prompts per call.")
_PROMPT = flags.DEFINE_integer("prompt_len", 512, "Prompt tokens.")
_NEW = flags.DEFINE_integer("max_new_tokens", 512, "Generated tokens.")
_BLOCK = flags.DEFINE_integer("block_length", 32, "Tokens per block.")
_THRESHOLD = flags.DEFINE_float("threshold", 0.9, "Parallel decoding "
                                "threshold of the threshold variants.")
_HEAD_SCALE = flags.DEFINE_float("head_scale", 20.0, "LM head multiplier "
                                 "(peaked predictions, as a trained model).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature "
                                  "(0: greedy).")
_TOP_P = flags.DEFINE_float("top_p", None, "Nucleus mass (None: off).")
_TOP_K = flags.DEFINE_integer("top_k", 50, "Top-k (0: off).")
_VARIANTS = flags.DEFINE_list(
    "variants", ["exact", "prefix", "dual", "prefix_threshold",
                 "dual_threshold"], "Which samplers to time.")


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import cache as dream_cache  # pylint: disable=g-import-not-at-top

  import dream_random  # pylint: disable=g-import-not-at-top  # beside this file

  cfg, params = dream_random.random_dream(_HEAD_SCALE.value)
  ids = np.random.default_rng(0).integers(
      1, cfg.mask_token_id, (_BATCH.value, _PROMPT.value))
  abstract_ids = jax.ShapeDtypeStruct(ids.shape, jnp.int32)
  new = _NEW.value
  greedy = _TEMPERATURE.value == 0
  common = dict(mask_token_id=cfg.mask_token_id, max_new_tokens=new,
                alg="entropy", temperature=_TEMPERATURE.value,
                top_p=_TOP_P.value, top_k=_TOP_K.value or None)
  drawing = ("greedy" if greedy else f"temperature {_TEMPERATURE.value:g}")
  drawing += f", top_p {_TOP_P.value}, top_k {_TOP_K.value or None}"
  print(f"Dream {dream.param_count(cfg):,} params, float32; batch "
        f"{_BATCH.value}, prompt {_PROMPT.value} + {new} new, blocks of "
        f"{_BLOCK.value}, threshold {_THRESHOLD.value:g}; {drawing}; "
        f"JAX {jax.__version__}, 1 thread", flush=True)

  def lower(name):
    if name == "exact":
      return diffusion_sampling.lower_generate(
          dream.denoiser(cfg), abstract_ids, None, params=params, steps=new,
          **common)
    cache, _, threshold = name.partition("_")
    return cached_sampling.lower_cached_generate(
        dream_cache.cached_denoiser(cfg), abstract_ids, None, params=params,
        cache=cache, block_length=_BLOCK.value, steps=new,
        threshold=_THRESHOLD.value if threshold else None, **common)

  compiled = {}
  for name in _VARIANTS.value:
    start = time.perf_counter()
    compiled[name] = lower(name).compile()
    print(f"{name}: compiled in {time.perf_counter() - start:.2f} s",
          flush=True)

  names = list(_VARIANTS.value)
  times = {name: [] for name in names}
  outputs = {}
  for r in range(_ROUNDS.value):
    print(f"round {r + 1}: load {os.getloadavg()[0]:.2f}", flush=True)
    order = names[r % len(names):] + names[:r % len(names)]
    for name in order:
      start = time.perf_counter()
      out = compiled[name](params, jnp.asarray(ids, jnp.int32), None,
                           jax.random.key(r))
      outputs[name] = np.asarray(jax.block_until_ready(out))
      times[name].append(time.perf_counter() - start)
      print(f"  {name:17s} {times[name][-1]:8.2f} s", flush=True)

  tokens = _BATCH.value * new
  base = (statistics.median(tokens / t for t in times["exact"])
          if "exact" in times else None)
  print("variant            tokens/s (min-max)        x exact   tokens equal "
        "to exact")
  for name in names:
    rate = [tokens / t for t in times[name]]
    med = statistics.median(rate)
    speedup = f"{med / base:7.2f}x" if base else "   -"
    equal = (f"{np.mean(outputs[name][:, _PROMPT.value:] == outputs['exact'][:, _PROMPT.value:]):.4f}"  # pylint: disable=line-too-long
             if "exact" in outputs and greedy else "-")
    print(f"{name:17s} {med:8.1f} ({min(rate):.1f}-{max(rate):.1f})   "
          f"{speedup}   {equal}")


if __name__ == "__main__":
  app.run(main)
