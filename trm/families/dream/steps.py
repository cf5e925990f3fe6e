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

import jax
import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics as clu_metrics

from trm.core import accumulation
from trm.core import config_lib
from trm.core import lm_state
from trm.core import loss_scale as loss_scale_lib
from trm.core import mesh as mesh_lib
from trm.core import optimizers
from trm.core import state as state_lib
from trm.core.lm_state import LMState
from trm.core.task import BatchField
from trm.families.dream import loss as diffusion_loss
from trm.families.dream import model as dream


def learning_rate_schedule(optim_config, total_steps: int):
  """Linear warmup, then cosine to 10%."""
  warmup = config_lib.warmup_steps(optim_config, total_steps)
  return optax.warmup_cosine_decay_schedule(
      0.0, optim_config.lr, warmup, max(total_steps, warmup + 1),
      end_value=0.1 * optim_config.lr)


def make_optimizer(optim_config, total_steps: int):
  """config.optim.optimizer (default AdamW) after global-norm clipping
  (`learning_rate_schedule`; config.optim.lr_mults / wd_mults:
  `trm.core.optimizers`)."""
  schedule = learning_rate_schedule(optim_config, total_steps)
  return optax.chain(
      optax.clip_by_global_norm(optim_config.grad_clip_norm),
      optimizers.build(optim_config.get("optimizer", "adamw"), schedule,
                       b1=optim_config.beta1, b2=optim_config.beta2,
                       eps=optim_config.eps,
                       weight_decay=optim_config.weight_decay,
                       field="config.optim.optimizer",
                       lr_mults=optim_config.get("lr_mults", ()),
                       wd_mults=optim_config.get("wd_mults", ())))


def make_init_fn(model: dream.Dream, tx, seed: int, loss_scale=None):
  """() -> boxed LMState (leaves carry logical axis names); `loss_scale`
  from `trm.core.loss_scale.initial_state` (None unless float16)."""
  return lm_state.make_init_fn(
      lambda key: dream.init_params(model.cfg, key), tx, seed, loss_scale)


def train_step(state: LMState, batch, *, model: dream.Dream, tx,
               chunk_size: int = 512, schedule=None, accum_steps: int = 1,
               reduce_once: bool = True, loss_reduce_once: bool = False):
  """batch = {tokens [B, L] int32, maskable [B, L] bool}; `schedule`
  (`learning_rate_schedule`): the `lr` metric, the rate `tx` gives the
  step. `accum_steps` (config.gradient_accumulation_steps): the batch's
  gradients are summed over that many micro-batches (`trm.core.
  accumulation`), each micro-batch's loss divided by the whole batch's
  masked-token count, so the step is the one-batch step (the loss is a
  per-token mean over the whole batch, DiffuLLaMA's normalisation).
  `loss_reduce_once` (config.loss_reduce_once): the chunked loss's head
  gradient crosses the batch devices once (`trm.nn.chunked_loss`)."""
  cfg = model.cfg
  head_logits = functools.partial(dream.head_logits, cfg=cfg)
  gather_head = functools.partial(dream.gather_head, cfg=cfg)
  rng = jax.random.fold_in(state.rng, state.step)
  # The whole batch's t and masks, drawn before it is split: micro-batches
  # train on the one-batch step's draws.
  noisy, masked, t = diffusion_loss.add_noise(
      rng, batch["tokens"], batch["maskable"], cfg.mask_token_id)

  def loss_fn(params, noisy, tokens, masked, t, loss_scale, num_scored=None):
    hidden = model.apply({"params": params}, noisy, method="hidden")
    loss, num_masked = diffusion_loss.shifted_masked_loss(
        hidden, dream.head_kernel(params), head_logits, tokens, masked, t,
        chunk_size, num_scored, dream.HEAD_AXES, loss_reduce_once,
        gather_head)
    scaled = loss_scale_lib.scale_loss(loss_scale, loss)
    return scaled, (loss, num_masked)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
  if accum_steps == 1:
    (_, (loss, num_masked)), grads = grad_fn(
        state.params, noisy, batch["tokens"], masked, t, state.loss_scale)
  else:
    num_masked = masked[:, 1:].sum()

    def micro_steps(whole, rows):
      params, loss_scale, num_scored = whole

      def micro_step(k, *micro_rows):
        del k  # the noise was drawn for the whole batch
        (_, (loss, _)), grads = grad_fn(params, *micro_rows, loss_scale,
                                        num_scored)
        return loss, grads

      xs = tuple(accumulation.split(a, accum_steps) for a in rows)
      return accumulation.sum_micro_steps(micro_step, accum_steps, xs,
                                          params), ()

    (loss, grads), _ = accumulation.run(
        micro_steps, (state.params, state.loss_scale, num_masked),
        (noisy, batch["tokens"], masked, t), accum_steps, reduce_once)
  grads = loss_scale_lib.unscale(state.loss_scale, grads)
  # Summed in float32 over the micro-batches; the update is in the
  # parameters' dtype.
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
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
  new_state, metrics = state_lib.skip_nonfinite(
      state, new_state, metrics, state_lib.all_finite(loss, grads))
  state_lib.add_learning_rate(metrics, schedule, state.opt_state)
  return new_state, metrics


def eval_step(state: LMState, batch, *, model: dream.Dream, seed: int,
              chunk_size: int = 512, micro_batches: int = 1):
  """(metrics, no outputs): the held-out diffusion loss with the same noise
  at every evaluation, so figures from different steps compare. Each
  held-out row draws its own t and mask from (seed, its index): one key for
  the batch would give every batch the same t values and masks, so the
  figure would rest on one batch's draw however many rows are held out.
  `micro_batches` (`accumulation.eval_steps_of`): the rows run that many at
  a time (a `lax.scan`), as the accumulated train step's do; the loss is
  the whole batch's (the same noise, one division by its masked count)."""
  keys = jax.vmap(functools.partial(jax.random.fold_in,
                                    jax.random.PRNGKey(seed)))(batch["row"])
  noisy, masked, t = diffusion_loss.add_noise_per_row(
      keys, batch["tokens"], batch["maskable"], model.cfg.mask_token_id)
  variables = {"params": state.params}
  table = dream.gather_head(dream.head_kernel(state.params), model.cfg)
  head_logits = functools.partial(dream.head_logits, cfg=model.cfg)

  def weighted_sum(noisy, tokens, masked, t):
    hidden = model.apply(variables, noisy, method="hidden")
    # num_scored=1: the rows' 1/t-weighted sum, divided once below.
    return diffusion_loss.shifted_masked_loss(
        hidden, table, head_logits, tokens, masked, t, chunk_size,
        num_scored=1)[0]

  rows = (noisy, batch["tokens"], masked, t)
  if micro_batches == 1:
    total = weighted_sum(*rows)
  else:
    total, _ = jax.lax.scan(
        lambda total, micro: (total + weighted_sum(*micro), None),
        jnp.zeros((), jnp.float32),
        tuple(accumulation.split(a, micro_batches) for a in rows))
  num_masked = masked[:, 1:].sum()
  loss = total / jnp.maximum(num_masked, 1)
  return {"loss": clu_metrics.Average(total=loss, count=jnp.int32(1)),
          "masked_tokens": clu_metrics.Average(
              total=num_masked.astype(jnp.float32), count=jnp.int32(1))}, {}


def state_from_hf_checkpoint(directory: str, model: dream.Dream, tx,
                             seed: int, ctx, shardings,
                             loss_scale=None) -> LMState:
  """A fresh fine-tuning state around published weights: each process reads
  only its devices' slices of the safetensors; the optimizer state is born
  sharded next to them."""
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  params = hf_import.load_hf_checkpoint(directory, model.cfg,
                                        shardings.params)
  # Fine-tuning from corrupt or diverged weights would train on NaN.
  inference.check_finite_params(params, model.cfg, directory)
  return lm_state.state_around_params(params, tx, seed, ctx, shardings,
                                      loss_scale)


def batch_spec(seq_len: int) -> dict:
  rows = (mesh_lib.BATCH, None)
  return {"tokens": BatchField((seq_len,), np.int32, rows),
          "maskable": BatchField((seq_len,), np.bool_, rows),
          # The held-out row's index, which seeds its noise (`eval_step`).
          "row": BatchField((), np.int32, (mesh_lib.BATCH,), eval_only=True)}


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

