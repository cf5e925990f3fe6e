"""What to compile for Dream / DiffuCoder: model, state, diffusion steps.

Every size comes from the config (`configs/diffucoder_7b.py` presets, or a
Hugging Face directory's config.json through `trm.generate`). `trm.aot
--mode=sample` compiles the sampling loop through `build_sampler`.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
from absl import logging

from trm.core import accumulation
from trm.core import loss_scale
from trm.core import mesh as mesh_lib
from trm.core.task import Program
from trm.data.text import sft
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
  reduce_once = config.get("loss_reduce_once", False)
  if not isinstance(reduce_once, bool):
    raise ValueError(f"config.loss_reduce_once={reduce_once!r} must be True "
                     "or False.")
  accumulation.check_micro_batch(config)
  sft.check_source(config.data)


def attention_heads(model_config) -> dict[str, int]:
  """The query heads, split as 'activation_heads'
  (`trm.families.warn_if_heads_unsplit`); the weights' 'heads' and
  'kv_heads' splits are refused by `check_heads_fit`."""
  return {"num_attention_heads": int(model_config.num_attention_heads)}


def check_heads_fit(cfg: dream.DreamConfig, ctx) -> None:
  """The mesh axes the rules split attention heads, the MLP width and the
  vocabulary over divide those sizes. `tree_shardings` replicates a
  dimension an axis does not divide, so mesh.model=8 on the 28 query heads
  kept every q/o projection whole on every device (8x their memory, no
  tensor parallelism) without a word, and mesh.model=7 (which divides the
  heads) did the same to the MLP (18,944 wide) and the embedding and LM
  head (152,064): 6.8 of the 7B model's 7.6 billion weights 7x over;
  MaxText refuses such a split."""
  for name, count, field, label in (
      ("heads", cfg.num_attention_heads, "num_attention_heads", "q/o"),
      ("kv_heads", cfg.num_key_value_heads, "num_key_value_heads", "k/v")):
    axes, ways = mesh_lib.logical_split(ctx.mesh, ctx.rules, name)
    if count % ways:
      split = " x ".join(f"config.mesh.{a}={ctx.mesh.shape[a]}" for a in axes)
      raise mesh_lib.MeshConfigError(
          f"{split} does not divide config.model.{field}={count} (the "
          f"model has {cfg.num_attention_heads} query and "
          f"{cfg.num_key_value_heads} key/value heads): the {label} "
          "projections would be replicated on every device; choose a size "
          f"that divides {count}.")
  widths = (("heads", cfg.num_attention_heads, "num_attention_heads"),
            ("kv_heads", cfg.num_key_value_heads, "num_key_value_heads"),
            ("mlp", cfg.intermediate_size, "intermediate_size"),
            ("vocab", cfg.vocab_size, "vocab_size"))
  for name, count, field, label in (
      ("mlp", cfg.intermediate_size, "intermediate_size",
       "gate/up/down projections"),
      ("vocab", cfg.vocab_size, "vocab_size", "embedding and LM head")):
    axes, ways = mesh_lib.logical_split(ctx.mesh, ctx.rules, name)
    if count % ways:
      split = " x ".join(f"config.mesh.{a}={ctx.mesh.shape[a]}" for a in axes)
      # The splits every width on the same axes allows.
      same = [(f, n) for other, n, f in widths
              if mesh_lib.logical_split(ctx.mesh, ctx.rules, other)[0] == axes]
      fits = math.gcd(*(n for _, n in same))
      sizes = ", ".join(str(d) for d in range(1, min(fits, ctx.mesh.size) + 1)
                        if fits % d == 0)
      raise mesh_lib.MeshConfigError(
          f"{split} does not divide config.model.{field}={count}: the "
          f"{label} would be replicated on every device of that split; "
          f"choose a size (product) from {sizes} (these divide each of "
          + ", ".join(f"{f}={n}" for f, n in same) + ").")
  _warn_unsplit_embed(cfg, ctx)


def _warn_unsplit_embed(cfg: dream.DreamConfig, ctx) -> None:
  """One warning when the axes 'embed' is split over (fsdp) do not divide
  hidden_size: every weight matrix then stays whole on each of their
  devices (mesh.fsdp=-1 on 6 devices held all 7.6B weights on each: 28.37
  GiB in float32, 14.19 in bfloat16). Not refused: a replicated model
  still samples, where it fits."""
  axes, ways = mesh_lib.logical_split(ctx.mesh, ctx.rules, "embed")
  if cfg.hidden_size % ways == 0:
    return
  boxed, shardings = ctx.boxed_shardings(lambda: dream.abstract_params(cfg))
  held = sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
             for s, x in zip(jax.tree.leaves(shardings),
                             jax.tree.leaves(nn.meta.unbox(boxed))))
  split = " x ".join(f"config.mesh.{a}={ctx.mesh.shape[a]}" for a in axes)
  sizes = ", ".join(str(d) for d in range(1, ctx.mesh.size + 1)
                    if cfg.hidden_size % d == 0)
  _warn_once(
      f"{split} does not divide config.model.hidden_size={cfg.hidden_size}: "
      f"the weights split over it stay whole on each of its {ways} devices, "
      f"{held / 2**30:.2f} GiB of weights per device (training keeps "
      f"optimizer state beside each); a size that divides it ({sizes}) "
      "splits them.")


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
  """A training run checks the mesh twice (task, then program): one line."""
  logging.warning("%s", message)


def build(config, ctx, shapes=None) -> Program:
  del shapes  # every size is in the config
  check_config(config)
  model = dream.Dream(dream.DreamConfig.from_config(config.model))
  check_heads_fit(model.cfg, ctx)
  accumulation.check_micro_batch(config, ctx)
  tx = lm_steps.make_optimizer(config.optim, config.total_steps)
  return Program(
      model=model,
      init_fn=lm_steps.make_init_fn(model, tx, config.seed,
                                    loss_scale.initial_state(config)),
      train_step=functools.partial(
          lm_steps.train_step, model=model, tx=tx,
          chunk_size=config.loss_chunk_size,
          loss_reduce_once=config.get("loss_reduce_once", False),
          schedule=lm_steps.learning_rate_schedule(config.optim,
                                                   config.total_steps),
          accum_steps=accumulation.steps_of(config),
          reduce_once=config.get("reduce_gradients_once", True)),
      eval_step=functools.partial(
          lm_steps.eval_step, model=model, seed=config.seed,
          chunk_size=config.loss_chunk_size,
          micro_batches=accumulation.eval_steps_of(config, ctx)),
      batch_spec=lm_steps.batch_spec(config.seq_len),
      # The whole step's rows, all of its micro-batches.
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
