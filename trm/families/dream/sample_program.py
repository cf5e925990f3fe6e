"""`trm.aot --mode=sample`: the whole masked-diffusion sampling loop.

Compiled as `trm.generate` runs it: weights sharded by the config's rules and
passed as arguments, a left-padded prompt batch with its padding mask,
replicated as `trm.generate`'s host arrays are; the model's activation
constraints shard the batch over the data-parallel axes inside. Its FLOPs
are the model forward over prompt + canvas, times the steps.

With `--cache=prefix|dual` it compiles the cached block decoder instead
(`cached_sampling`, Fast-dLLM style); its FLOPs are one full forward per
block plus the block's window forwards (`cached_flops_per_call`).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from trm.core import array_sizes
from trm.core import state as state_lib
from trm.families.dream import cache as dream_cache
from trm.families.dream import cached_sampling
from trm.families.dream import model as dream
from trm.families.dream import program as dream_program
from trm.families.dream import sampling as diffusion_sampling
from trm.families.dream import steps as lm_steps

CACHES = ("none",) + cached_sampling.CACHES  # --cache's choices


def check_settings(sample) -> None:
  """The sampler's own knobs, checked before anything compiles."""
  if sample.alg not in diffusion_sampling.ALGS:
    raise ValueError(f"--alg={sample.alg!r}: choose from "
                     f"{', '.join(diffusion_sampling.ALGS)}.")
  # As trm.generate's --steps (`inference.check_settings`): 2**31 - 1
  # steps built a 16 GiB host table of times, and the OOM killer ended
  # trm.aot before anything compiled.
  if sample.steps > diffusion_sampling.MAX_STEPS:
    raise ValueError(f"--steps={sample.steps} must be at most "
                     f"{diffusion_sampling.MAX_STEPS:,} (each step is one "
                     "call of the model; --steps defaults to "
                     "--max_new_tokens).")
  if sample.temperature < 0:
    raise ValueError(f"--temperature={sample.temperature} must be >= 0.")
  if sample.top_p is not None and not 0 <= sample.top_p <= 1:
    raise ValueError(f"--top_p={sample.top_p} must lie in [0, 1] (0: the "
                     "likeliest token alone).")
  if sample.cache not in CACHES:
    raise ValueError(f"--cache={sample.cache!r}: choose from "
                     f"{', '.join(CACHES)}.")
  cached_sampling.check_needs_cache(sample.cache != "none", sample.threshold,
                                    sample.fast_dllm, cli=True)
  if sample.cache == "none":
    return
  try:  # cached_sampling's messages start "name=value": make them flags
    cached_sampling.check_cached_settings(
        cache=sample.cache, block_length=sample.block_length,
        threshold=sample.threshold, max_new_tokens=sample.max_new_tokens,
        steps=sample.steps, alg=sample.alg, fast_dllm=sample.fast_dllm)
  except ValueError as e:
    raise ValueError(f"--{e}") from None



def sample_flops_per_call(cfg, batch: int, prompt_len: int,
                          max_new_tokens: int, steps: int) -> int:
  """Model FLOPs of one sampling call: every step is a full forward over
  prompt + canvas (no KV cache), i.e. a third of the train step's 6N."""
  length = prompt_len + max_new_tokens
  return lm_steps.train_flops_per_example(cfg, length) // 3 * batch * steps


def forward_flops(cfg, queries: int, keys: int) -> int:
  """Model FLOPs of one forward of `queries` positions attending to `keys`
  (the LM head counted on every query row, as `sample_flops_per_call`)."""
  full = lm_steps.train_flops_per_example(cfg, 1) // 3  # matmuls + head
  attention_per_key = cfg.num_hidden_layers * 2 * 2 * cfg.hidden_size
  return queries * (full - attention_per_key + attention_per_key * keys)


def cached_flops_per_call(cfg, batch: int, prompt_len: int,
                          max_new_tokens: int, steps: int, cache: str,
                          block_length: int,
                          threshold: float | None,
                          fast_dllm: bool = False) -> int:
  """Model FLOPs of one cached call: per block one full forward over
  prompt + canvas (the cache refresh), then steps_per_block - 1 window
  forwards whose queries attend to the whole sequence (dual: block + 1
  positions; prefix: the block, everything after it, + 1; without the + 1
  with `fast_dllm`). With a threshold
  the step count follows the model's confidence: counted at its bound,
  block_length steps per block (one token per step)."""
  length = prompt_len + max_new_tokens
  blocks = max_new_tokens // block_length
  per_block = block_length if threshold is not None else steps // blocks
  total = 0
  for j in range(blocks):
    start = prompt_len + j * block_length
    lead = 0 if fast_dllm else 1  # the window's position before the block
    width = (block_length if cache == "dual" else length - start) + lead
    total += (forward_flops(cfg, length, length)
              + (per_block - 1) * forward_flops(cfg, width, length))
  return total * batch


def _checked_compile(lowered):
  array_sizes.check_lowered(lowered, "The sampling loop",
                            "lower --prompt_len, --max_new_tokens or --batch")
  return lowered.compile()


def build(config, ctx, sample):
  """(() -> the compiled sampling loop, model FLOPs per call) for
  `sample` (trm.aot's SampleSettings)."""
  check_settings(sample)
  cfg = dream.DreamConfig.from_config(config.model)
  dream_program.check_heads_fit(cfg, ctx)  # as generation on that mesh
  boxed, shardings = ctx.boxed_shardings(lambda: dream.abstract_params(cfg))
  params = state_lib.with_shardings(nn.meta.unbox(boxed), shardings)
  # trm.generate hands the sampler host arrays: they enter replicated.
  replicated = NamedSharding(ctx.mesh, PartitionSpec())
  shape = (sample.batch, sample.prompt_len)
  ids = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=replicated)
  mask = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=replicated)
  key = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)

  if sample.cache != "none":
    denoiser = dream_cache.cached_denoiser(cfg)

    def compile_cached():
      with ctx:
        return _checked_compile(cached_sampling.lower_cached_generate(
            denoiser, ids, mask, params=params, rng=rng,
            mask_token_id=cfg.mask_token_id,
            max_new_tokens=sample.max_new_tokens, steps=sample.steps,
            cache=sample.cache, block_length=sample.block_length,
            threshold=sample.threshold, alg=sample.alg,
            temperature=sample.temperature, top_p=sample.top_p,
            fast_dllm=sample.fast_dllm))

    return compile_cached, cached_flops_per_call(
        cfg, sample.batch, sample.prompt_len, sample.max_new_tokens,
        sample.steps, sample.cache, sample.block_length, sample.threshold,
        sample.fast_dllm)

  def compile_sampler():
    with ctx:
      return _checked_compile(diffusion_sampling.lower_generate(
          dream.denoiser(cfg), ids, mask, params=params, rng=rng,
          mask_token_id=cfg.mask_token_id,
          max_new_tokens=sample.max_new_tokens, steps=sample.steps,
          alg=sample.alg, temperature=sample.temperature,
          top_p=sample.top_p))

  flops = sample_flops_per_call(cfg, sample.batch, sample.prompt_len,
                                sample.max_new_tokens, sample.steps)
  return compile_sampler, flops
