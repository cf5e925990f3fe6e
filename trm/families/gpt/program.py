"""What to compile for GPT: nanoGPT's model, AdamW state and iteration.

One train step is one nanoGPT iteration: gradient accumulation and the AdamW
update together. A character-level config's vocabulary comes from its data,
so `trm.aot` needs it given (`data_shapes`).
"""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from trm.core import lm_state
from trm.core import loss_scale
from trm.core import mesh as mesh_lib
from trm.core import mfu
from trm.core.task import BatchField, Program
from trm.families.gpt import model as gpt
from trm.families.gpt import steps as gpt_steps
from trm.nn import cross_entropy_gpu
from trm.nn import platform as platform_lib

DISPLAY_NAME = "GPT"
# What sets the tensors' shapes (a checkpoint of other shapes names them).
SIZE_FIELDS = ("config.n_layer, config.n_head, config.n_embd, "
               "config.block_size, config.bias, config.model.head_size, "
               "config.model.mlp_size or the vocabulary "
               "(config.model.vocab_size; 0: the dataset's)")
# config.loss_kernel: XLA's passes over the logits, or one Pallas Triton
# kernel on NVIDIA GPUs (nn.cross_entropy_gpu; "_interpret" on a CPU).
LOSS_KERNELS = ("xla",) + cross_entropy_gpu.KINDS


def owns_state(paths) -> bool:
  """nanoGPT's names: params/wte, params/wpe, params/h_<i>, ..."""
  return any(p.startswith("params/wte") for p in paths)


def batch_spec(block_size: int) -> dict:
  """Windows x and their next tokens y; evaluation batches also carry the
  split (train 0 / val 1) of each row, for nanoGPT's estimate_loss."""
  rows = (mesh_lib.BATCH, None)
  return {"x": BatchField((block_size,), np.int32, rows),
          "y": BatchField((block_size,), np.int32, rows),
          "split": BatchField((), np.int32, (mesh_lib.BATCH,),
                              eval_only=True)}


def data_shapes(config, overrides: dict) -> dict:
  """The vocabulary for `trm.aot`: --vocab_size, else the config's."""
  vocab = overrides.get("vocab_size") or config.model.vocab_size
  if not vocab:
    raise ValueError("config.model.vocab_size is 0 (taken from the prepared "
                     "data at training time): pass --vocab_size, e.g. 65 for "
                     "tinyshakespeare's characters or 50304 for GPT-2's "
                     "tokens (nanoGPT's padded figure).")
  return {"vocab_size": vocab}


def attention_heads(model_config) -> dict[str, int]:
  """The heads `trm.families.warn_if_heads_unsplit` checks against the
  mesh (q, and k and v unless n_kv_head gives them fewer)."""
  heads = {"n_head": int(model_config.n_head)}
  if model_config.get("n_kv_head", 0):
    heads["n_kv_head"] = int(model_config.n_kv_head)
  return heads


def check_config(config) -> None:
  """config.model's fields and the loss's, before any weights are read or
  data prepared (`build` checks the model again with the vocabulary the
  data give)."""
  model_config = config.model.to_dict()
  model_config["vocab_size"] = model_config["vocab_size"] or 1  # the data's
  if config.init_checkpoint and config.init_from != "scratch":
    # The weights' shapes replace the config's (task._adopt_shapes).
    model_config.update(n_layer=1, n_head=1, n_embd=64)
  gpt.GPTConfig.from_config(model_config)
  _loss_options(config)


def _loss_options(config) -> tuple[int, str, bool]:
  """(config.loss_chunk_size, config.loss_kernel,
  config.loss_reduce_once), checked."""
  chunk = config.get("loss_chunk_size", 0)
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
    raise ValueError(f"config.loss_chunk_size={chunk!r} must be an integer "
                     ">= 0 (0: the whole sequence's logits at once).")
  loss_kernel = config.get("loss_kernel", "xla")
  if loss_kernel not in LOSS_KERNELS:
    raise ValueError(f"config.loss_kernel={loss_kernel!r}: use one of "
                     f"{LOSS_KERNELS}.")
  if loss_kernel != "xla" and chunk:
    raise ValueError(f"config.loss_kernel={loss_kernel!r} makes the whole "
                     "sequence's logits in one kernel: set "
                     "config.loss_chunk_size=0, or loss_kernel='xla'.")
  reduce_once = config.get("loss_reduce_once", False)
  if not isinstance(reduce_once, bool):
    raise ValueError(f"config.loss_reduce_once={reduce_once!r} must be True "
                     "or False.")
  if reduce_once and not chunk:
    raise ValueError("config.loss_reduce_once=True sums the chunked loss's "
                     "head gradient: set config.loss_chunk_size > 0, or "
                     "leave it False.")
  return chunk, loss_kernel, reduce_once


def build(config, ctx, shapes=None) -> Program:
  """`shapes` ({'vocab_size'}) overrides config.model.vocab_size."""
  # The layers place themselves by logical names; the platform decides
  # where the weights' bf16 copies are made (gpt.steps.train_step).
  cast_once = (ctx is not None
               and ctx.platform in platform_lib.GPU_PLATFORMS)
  shapes = shapes or data_shapes(config, {})
  model_config = config.model.to_dict()
  model_config["vocab_size"] = shapes["vocab_size"]
  cfg = gpt.GPTConfig.from_config(model_config)
  chunk, loss_kernel, loss_reduce_once = _loss_options(config)
  model = gpt.GPT(cfg)
  tx = gpt_steps.make_optimizer(config)
  # The loss's terms, the same in training and estimate_loss.
  objective = dict(label_smoothing=float(config.get("label_smoothing", 0.0)),
                   z_loss=float(config.get("z_loss", 0.0)))
  non_embedding = gpt.num_params(gpt.abstract_params(cfg),
                                 non_embedding=True)
  return Program(
      model=model,
      init_fn=lm_state.make_init_fn(
          lambda key: model.init(key, jnp.zeros((1, 1), jnp.int32))["params"],
          tx, config.seed, loss_scale.initial_state(config)),
      train_step=functools.partial(
          gpt_steps.train_step, model=model, tx=tx, **objective,
          accum_steps=config.gradient_accumulation_steps,
          loss_chunk_size=chunk, loss_kernel=loss_kernel,
          loss_reduce_once=loss_reduce_once, cast_once=cast_once,
          reduce_once=config.get("reduce_gradients_once", True),
          schedule=gpt_steps.learning_rate_schedule(config)),
      eval_step=functools.partial(gpt_steps.eval_step, model=model,
                                  **objective),
      batch_spec=batch_spec(cfg.block_size),
      flops_per_step=mfu.nanogpt_flops_per_iter(
          non_embedding, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size,
          config.global_batch_size, head_size=cfg.head_dim),
      compute_dtype=cfg.dtype,
      tokens_per_example=cfg.block_size)
