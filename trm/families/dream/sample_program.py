"""`trm.aot --mode=sample`: the whole masked-diffusion sampling loop.

Compiled as `trm.generate` runs it: weights sharded by the config's rules and
passed as arguments, a left-padded prompt batch with its padding mask,
replicated as `trm.generate`'s host arrays are; the model's activation
constraints shard the batch over the data-parallel axes inside. Its FLOPs
are the model forward over prompt + canvas, times the steps.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from trm.core import state as state_lib
from trm.families.dream import model as dream
from trm.families.dream import sampling as diffusion_sampling
from trm.families.dream import steps as lm_steps


def check_settings(sample) -> None:
  """The sampler's own knobs, checked before anything compiles."""
  if sample.alg not in diffusion_sampling.ALGS:
    raise ValueError(f"--alg={sample.alg!r}: choose from "
                     f"{', '.join(diffusion_sampling.ALGS)}.")
  if sample.temperature < 0:
    raise ValueError(f"--temperature={sample.temperature} must be >= 0.")
  if sample.top_p is not None and not 0 < sample.top_p <= 1:
    raise ValueError(f"--top_p={sample.top_p} must lie in (0, 1].")


def sample_flops_per_call(cfg, batch: int, prompt_len: int,
                          max_new_tokens: int, steps: int) -> int:
  """Model FLOPs of one sampling call: every step is a full forward over
  prompt + canvas (no KV cache), i.e. a third of the train step's 6N."""
  length = prompt_len + max_new_tokens
  return lm_steps.train_flops_per_example(cfg, length) // 3 * batch * steps


def build(config, ctx, sample):
  """(() -> the compiled sampling loop, model FLOPs per call) for
  `sample` (trm.aot's SampleSettings)."""
  check_settings(sample)
  cfg = dream.DreamConfig.from_config(config.model)
  boxed, shardings = ctx.boxed_shardings(lambda: dream.abstract_params(cfg))
  params = state_lib.with_shardings(nn.meta.unbox(boxed), shardings)
  # trm.generate hands the sampler host arrays: they enter replicated.
  replicated = NamedSharding(ctx.mesh, PartitionSpec())
  shape = (sample.batch, sample.prompt_len)
  ids = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=replicated)
  mask = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=replicated)
  key = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)

  def compile_sampler():
    with ctx:
      return diffusion_sampling.lower_generate(
          dream.denoiser(cfg), ids, mask, params=params, rng=rng,
          mask_token_id=cfg.mask_token_id,
          max_new_tokens=sample.max_new_tokens, steps=sample.steps,
          alg=sample.alg, temperature=sample.temperature,
          top_p=sample.top_p).compile()

  flops = sample_flops_per_call(cfg, sample.batch, sample.prompt_len,
                                sample.max_new_tokens, sample.steps)
  return compile_sampler, flops
