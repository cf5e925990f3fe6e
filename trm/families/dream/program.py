"""What to compile for Dream / DiffuCoder: model, state, diffusion steps.

Every size comes from the config (`configs/diffucoder_7b.py` presets, or a
Hugging Face directory's config.json through `trm.generate`). `trm.aot
--mode=sample` compiles the sampling loop through `build_sampler`.
"""
from __future__ import annotations

import functools

from trm.core import loss_scale
from trm.core.task import Program
from trm.families.dream import model as dream
from trm.families.dream import steps as lm_steps

DISPLAY_NAME = "DiffuCoder/Dream"


def owns_state(paths) -> bool:
  """Qwen2's names: params/layers (scanned) or params/layers_<i>, beside
  params/embed_tokens (TRM has an embed_tokens too, but its layers sit under
  params/L_level)."""
  return any(p.startswith("params/layers") for p in paths)


def check_config(config) -> None:
  # Token j is predicted from position j-1, so the first token of a row is
  # never scored: a 1-token row trains nothing and reports a loss of 0.
  if config.seq_len < 2:
    raise ValueError(f"config.seq_len={config.seq_len} must be an integer of "
                     "at least 2 (tokens per training sequence; the first "
                     "has no position before it to be predicted from).")
  if config.loss_chunk_size <= 0:
    raise ValueError(f"config.loss_chunk_size={config.loss_chunk_size} must "
                     "be a positive integer.")


def build(config, ctx, shapes=None) -> Program:
  del ctx, shapes  # every size is in the config
  check_config(config)
  model = dream.Dream(dream.DreamConfig.from_config(config.model))
  tx = lm_steps.make_optimizer(config.optim, config.total_steps)
  return Program(
      model=model,
      init_fn=lm_steps.make_init_fn(model, tx, config.seed,
                                    loss_scale.initial_state(config)),
      train_step=functools.partial(lm_steps.train_step, model=model, tx=tx,
                                   chunk_size=config.loss_chunk_size),
      eval_step=functools.partial(lm_steps.eval_step, model=model,
                                  seed=config.seed,
                                  chunk_size=config.loss_chunk_size),
      batch_spec=lm_steps.batch_spec(config.seq_len),
      flops_per_step=lm_steps.train_flops_per_example(
          model.cfg, config.seq_len) * config.global_batch_size,
      compute_dtype=config.model.dtype,
      tokens_per_example=config.seq_len)


def check_sample_settings(settings) -> None:
  """`trm.aot --mode=sample`'s flags, checked before anything compiles."""
  from trm.families.dream import sample_program  # pylint: disable=g-import-not-at-top
  sample_program.check_settings(settings)


def build_sampler(config, ctx, settings):
  """(() -> compiled sampling loop, model FLOPs per call); see
  `trm.families.dream.sample_program`."""
  from trm.families.dream import sample_program  # pylint: disable=g-import-not-at-top
  return sample_program.build(config, ctx, settings)
