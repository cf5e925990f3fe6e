"""Masked-diffusion fine-tuning step for DiffuCoder / Dream.

State and step follow the TRM ones: `trm.core.state.abstract_state` /
`init_state` build the state abstract-first from logical axis names; one
jitted step runs with the state donated, and a step with a non-finite loss or
gradient is skipped (`trm.core.state.skip_nonfinite`). The objective is
`trm.families.dream.loss`; training attends to every position, pads included, as
DiffuCoder's maintainers trained it.
"""
from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics

from trm.families.dream import loss as diffusion_loss
from trm.core import loss_scale as loss_scale_lib
from trm.core import state as state_lib
from trm.families.dream import model as dream


@flax.struct.dataclass
class LMState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  skipped_steps: jax.Array  # see `trm.core.state.skip_nonfinite`
  bad_streak: jax.Array
  # float16 compute only (`trm.core.loss_scale`); None holds no arrays, so other
  # runs' checkpoints are unchanged.
  loss_scale: Any = None


def make_optimizer(optim_config, total_steps: int):
  """AdamW after global-norm clipping; linear warmup, then cosine to 10%."""
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, optim_config.lr, optim_config.warmup_steps,
      max(total_steps, optim_config.warmup_steps + 1),
      end_value=0.1 * optim_config.lr)
  return optax.chain(
      optax.clip_by_global_norm(optim_config.grad_clip_norm),
      optax.adamw(schedule, b1=optim_config.beta1, b2=optim_config.beta2,
                  eps=optim_config.eps,
                  weight_decay=optim_config.weight_decay))


def make_init_fn(model: dream.Dream, tx, seed: int, loss_scale=None):
  """() -> boxed LMState (leaves carry logical axis names); `loss_scale`
  from `trm.core.loss_scale.initial_state` (None unless float16)."""

  def init():
    init_key, state_key = jax.random.split(jax.random.PRNGKey(seed))
    if isinstance(model, dream.Dream):  # whatever its attention kernel
      params = dream.init_params(model.cfg, init_key)
    else:  # GPT shares this state
      params = model.init(init_key, jnp.zeros((1, 1), jnp.int32))["params"]
    return LMState(step=jnp.zeros((), jnp.int32), params=params,
                   opt_state=tx.init(params), rng=state_key,
                   loss_scale=loss_scale, **state_lib.zero_counters())

  return init


def train_step(state: LMState, batch, *, model: dream.Dream, tx,
               chunk_size: int = 512):
  """batch = {tokens [B, L] int32, maskable [B, L] bool}."""
  cfg = model.cfg
  rng = jax.random.fold_in(state.rng, state.step)
  noisy, masked, t = diffusion_loss.add_noise(
      rng, batch["tokens"], batch["maskable"], cfg.mask_token_id)

  def loss_fn(params):
    variables = {"params": params}
    hidden = model.apply(variables, noisy, method="hidden")
    head = functools.partial(model.apply, variables,
                             method="logits_from_hidden")
    loss, num_masked = diffusion_loss.shifted_masked_loss(
        hidden, head, batch["tokens"], masked, t, chunk_size)
    scaled = loss_scale_lib.scale_loss(state.loss_scale, loss)
    return scaled, (loss, num_masked)

  (_, (loss, num_masked)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
      state.params)
  grads = loss_scale_lib.unscale(state.loss_scale, grads)
  # PyTorch's padding_idx: the pad row of the embedding is never updated.
  grads["embed_tokens"] = grads["embed_tokens"].at[cfg.pad_token_id].set(0)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      "loss": clu_metrics.Average(total=loss, count=jnp.int32(1)),
      "masked_tokens": clu_metrics.Average(
          total=num_masked.astype(jnp.float32), count=jnp.int32(1)),
      "grad_norm": clu_metrics.Average(total=optax.tree.norm(grads),
                                       count=jnp.int32(1)),
  }
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state)
  return state_lib.skip_nonfinite(state, new_state, metrics,
                                  state_lib.all_finite(loss, grads))


def eval_step(state: LMState, batch, *, model: dream.Dream, seed: int,
              chunk_size: int = 512):
  """(metrics, no outputs): the held-out diffusion loss with the same noise
  at every evaluation, so figures from different steps compare."""
  noisy, masked, t = diffusion_loss.add_noise(
      jax.random.PRNGKey(seed), batch["tokens"], batch["maskable"],
      model.cfg.mask_token_id)
  variables = {"params": state.params}
  hidden = model.apply(variables, noisy, method="hidden")
  head = functools.partial(model.apply, variables, method="logits_from_hidden")
  loss, num_masked = diffusion_loss.shifted_masked_loss(
      hidden, head, batch["tokens"], masked, t, chunk_size)
  return {"loss": clu_metrics.Average(total=loss, count=jnp.int32(1)),
          "masked_tokens": clu_metrics.Average(
              total=num_masked.astype(jnp.float32), count=jnp.int32(1))}, {}


def state_from_hf_checkpoint(directory: str, model: dream.Dream, tx,
                             seed: int, mesh, rules, shardings,
                             loss_scale=None) -> LMState:
  """A fresh fine-tuning state around published weights: each process reads
  only its devices' slices of the safetensors; the optimizer state is born
  sharded next to them."""
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  del rules  # the shardings already hold them
  params = hf_import.load_hf_checkpoint(directory, model.cfg,
                                        shardings.params)
  return state_around_params(params, tx, seed, mesh, shardings, loss_scale)


def state_around_params(params, tx, seed: int, mesh, shardings,
                        loss_scale=None) -> LMState:
  """A step-0 state holding `params` (already on `shardings.params`), with
  the optimizer state created sharded beside them; `params` is donated."""
  _, state_key = jax.random.split(jax.random.PRNGKey(seed))

  def build(params):
    return LMState(step=jnp.zeros((), jnp.int32), params=params,
                   opt_state=tx.init(params), rng=state_key,
                   loss_scale=loss_scale, **state_lib.zero_counters())

  with jax.set_mesh(mesh):
    return jax.jit(build, in_shardings=(shardings.params,),
                   out_shardings=shardings, donate_argnums=0)(params)


def batch_shardings(mesh, rules):
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  rows = mesh_lib.logical_sharding(mesh, rules, (mesh_lib.BATCH, None))
  return {"tokens": rows, "maskable": rows}


def abstract_batch(global_batch_size: int, seq_len: int, shardings):
  """ShapeDtypeStructs of one global batch (for ahead-of-time lowering)."""
  shape = (global_batch_size, seq_len)
  return {"tokens": jax.ShapeDtypeStruct(shape, jnp.int32,
                                         sharding=shardings["tokens"]),
          "maskable": jax.ShapeDtypeStruct(shape, jnp.bool_,
                                           sharding=shardings["maskable"])}


def compile_train_step(config, model, tx, abstract_state, state_shardings,
                       batch_sharding):
  """The fine-tuning step, compiled ahead of time (`state.compile_step`)."""
  return state_lib.compile_step(
      functools.partial(train_step, model=model, tx=tx,
                        chunk_size=config.loss_chunk_size),
      abstract_state, state_shardings,
      abstract_batch(config.global_batch_size, config.seq_len,
                     batch_sharding))


def train_flops_per_example(cfg: dream.DreamConfig, seq_len: int) -> int:
  """Model FLOPs (6 x matmul parameters x tokens, plus attention scores and
  values), recomputation not counted."""
  d, h = cfg.hidden_size, cfg.head_dim
  kv = cfg.num_key_value_heads * h
  per_layer = (d * d + 2 * d * kv + d * d  # q, k, v, o projections
               + 3 * d * cfg.intermediate_size)  # gate, up, down
  matmul = cfg.num_hidden_layers * per_layer + d * cfg.vocab_size  # + head
  attention = cfg.num_hidden_layers * 2 * 2 * seq_len * d  # QK^T and AV
  return 3 * seq_len * (2 * matmul + attention)

