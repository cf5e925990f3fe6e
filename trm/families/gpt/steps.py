"""nanoGPT's optimizer, schedule, train step and estimate_loss, jitted.

The state is `trm.families.dream.steps.LMState` (step, params, AdamW state, PRNG key,
skipped-step counters), built abstract-first and sharded by logical names
like every family's. One iteration is `gradient_accumulation_steps`
micro-batches summed inside the jitted step (a `lax.scan`), then one clipped
AdamW update, as nanoGPT's loop does outside its compiled model.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics

from trm.core import accumulation
from trm.core import config_lib
from trm.core import loss_scale as loss_scale_lib
from trm.core import optimizers
from trm.core import state as state_lib
from trm.nn import chunked_loss
from trm.families.gpt import layers as gpt_layers
from trm.families.gpt import model as gpt
from trm.nn import cross_entropy_gpu
from trm.nn import losses


def learning_rate_schedule(config):
  """nanoGPT's get_lr(it): linear warmup that is non-zero at iteration 0,
  cosine from learning_rate to min_lr at lr_decay_iters, then min_lr."""
  lr, min_lr = config.learning_rate, config.min_lr
  warmup = config_lib.warmup_steps(config, config.total_steps, "warmup_iters")
  decay = config.lr_decay_iters
  if not config.decay_lr:
    return lambda it: jnp.asarray(lr, jnp.float32)

  def schedule(it):
    it = jnp.asarray(it, jnp.float32)
    warm = lr * (it + 1) / (warmup + 1)
    ratio = jnp.clip((it - warmup) / max(decay - warmup, 1), 0.0, 1.0)
    cosine = min_lr + 0.5 * (1.0 + jnp.cos(math.pi * ratio)) * (lr - min_lr)
    return jnp.where(it < warmup, warm, jnp.where(it > decay, min_lr, cosine))

  return schedule


def _stacked(path) -> bool:
  """Is this leaf a scanned model's stacked block leaf (under `h`)?"""
  return any(getattr(key, "key", None) == gpt.SCANNED for key in path)


def decay_mask(params):
  """nanoGPT's parameter groups: weight decay on tensors of 2 or more
  dimensions (matmul weights, embeddings), none on biases and LayerNorms.

  A scanned model's block leaves (cfg.scan_layers) carry a leading layers
  axis, which is not counted: a stack of LayerNorm scales is 2-D but is
  still not decayed. Both layouts decay the same tensors.
  """
  return jax.tree_util.tree_map_with_path(
      lambda path, p: p.ndim - _stacked(path) >= 2, params)


def make_optimizer(config):
  """torch.optim.AdamW(groups, betas) after clip_grad_norm_(grad_clip), or
  config.optimizer's choice with the same groups, and config.lr_mults /
  wd_mults (`trm.core.optimizers`)."""
  tx = optimizers.build(config.get("optimizer", "adamw"),
                        learning_rate_schedule(config), b1=config.beta1,
                        b2=config.beta2, eps=1e-8,
                        weight_decay=config.weight_decay, mask=decay_mask,
                        field="config.optimizer",
                        lr_mults=config.get("lr_mults", ()),
                        wd_mults=config.get("wd_mults", ()),
                        mults_field="config")
  if config.grad_clip > 0:
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), tx)
  return tx


def with_adam_state(opt_state, schedule_count, adam=None):
  """`make_optimizer`'s state with the schedule at `schedule_count` and, when
  given, AdamW's moments and step count (adam = {mu, nu, count}, e.g. from
  a nanoGPT checkpoint); without, AdamW's own state is kept."""
  def replace(node):
    if isinstance(node, optax.ScaleByAdamState) and adam is not None:
      return node._replace(count=jnp.asarray(adam["count"], node.count.dtype),
                           mu=adam["mu"], nu=adam["nu"])
    if isinstance(node, optax.ScaleByScheduleState):
      return node._replace(count=jnp.asarray(schedule_count,
                                             node.count.dtype))
    return node

  kinds = (optax.ScaleByAdamState, optax.ScaleByScheduleState)
  return jax.tree.map(replace, opt_state,
                      is_leaf=lambda node: isinstance(node, kinds))


def advance_schedule(opt_state):
  """`opt_state` with only the learning-rate schedule one step on: a
  skipped step (non-finite gradients, a float16 overflow) leaves AdamW's
  moments and count alone, as torch's GradScaler skips `optimizer.step()`,
  but nanoGPT's rate is `get_lr(iter_num)` and its iteration still counts,
  so the schedule must not fall behind the iterations."""
  def advance(node):
    if isinstance(node, optax.ScaleByScheduleState):
      return node._replace(count=optax.safe_increment(node.count))
    return node

  return jax.tree.map(
      advance, opt_state,
      is_leaf=lambda node: isinstance(node, optax.ScaleByScheduleState))


def _z_term(z_loss, log_z_squared_sum, count):
  """The z-loss term alone, z mean(lse**2) over the scored targets
  (MaxText's `learning/z_loss`); 0 without a z-loss."""
  if not z_loss:
    return jnp.zeros((), jnp.float32)
  return z_loss * log_z_squared_sum / jnp.maximum(count, 1)


def _mean_over_scored(token_terms, targets, z_loss):
  """(mean of the loss of token_terms(labels) = (loss, lse) over the
  targets that are not -1, their count, the z-loss term alone); the
  ignored positions get label 0 and weight 0."""
  valid = targets >= 0
  per_token, log_z = token_terms(jnp.where(valid, targets, 0))
  count = valid.sum()
  total = lambda x: jnp.where(valid, x, 0.0).sum()  # noqa: E731
  return (total(per_token) / jnp.maximum(count, 1), count,
          _z_term(z_loss, total(jnp.square(log_z)) if z_loss else None,
                  count))


def cross_entropy(logits, targets, label_smoothing=0.0, z_loss=0.0):
  """Mean token cross-entropy, ignoring targets of -1 (F.cross_entropy's
  ignore_index=-1), the number of scored tokens, and the z-loss term
  alone (included in the mean; 0 without one). `label_smoothing` and
  `z_loss`: `losses.softmax_cross_entropy`'s (torch's label_smoothing,
  MaxText's z_loss_multiplier, both averaged over the scored tokens)."""
  return _mean_over_scored(
      lambda labels: losses.softmax_cross_entropy_and_log_z(
          logits, labels, label_smoothing, z_loss), targets, z_loss)


def chunked_cross_entropy(hidden, table, targets, chunk_size: int, logits_fn,
                          label_smoothing=0.0, z_loss=0.0, grad_axes=None,
                          reduce_once: bool = False, gather_fn=None):
  """`cross_entropy(logits_fn(hidden, table), targets, ...)` with the logits
  made `chunk_size` positions at a time, with their gradients in the same
  pass, so the [B, T, vocab] logits and their gradient never exist whole;
  each chunk's table gradient is reduced straight into `grad_axes`'
  layout, or with `reduce_once` over the batch devices once; `gather_fn`:
  how the loss gathers the table as the parameter holds it
  (`trm.nn.chunked_loss`)."""
  total, log_z_squared = chunked_loss.chunked_cross_entropy(
      hidden, table, targets, chunk_size, logits_fn, label_smoothing, z_loss,
      grad_axes, reduce_once, gather_fn=gather_fn)
  count = (targets >= 0).sum()
  return (total / jnp.maximum(count, 1), count,
          _z_term(z_loss, log_z_squared, count))


def fused_cross_entropy(hidden, table, targets, logits_dtype,
                        interpret: bool, label_smoothing=0.0, z_loss=0.0):
  """`cross_entropy(hidden @ table^T, targets, ...)` with the loss's passes
  over the logits in one Pallas Triton kernel (`nn.cross_entropy_gpu`)."""
  return _mean_over_scored(
      lambda labels: cross_entropy_gpu.linear_cross_entropy_and_log_z(
          hidden, table, labels, logits_dtype, interpret, label_smoothing,
          z_loss), targets, z_loss)


def matmul_weights_in(params, dtype):
  """params with the Linear kernels cast to the compute dtype `dtype`.

  The layers cast each kernel at use (torch autocast's casts). Inside the
  micro-batch loop that cast ran once per micro-step: on the H100, 24
  small kernels per micro-step, 960 per GPT-2 iteration, about 10 us each
  whatever their size (BUILD_NOTES "After the third run, on the CPU").
  Cast once before the loop, the layers' casts are no-ops, and the
  gradients are the same values: each kernel's gradient came out of its
  matmul in `dtype` and was widened. Embeddings and norm parameters stay
  as they are (the token lookup and the norms read them in float32).
  """
  def cast(path, leaf):
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    return leaf.astype(dtype) if names and names[-1] == "kernel" else leaf
  return jax.tree_util.tree_map_with_path(cast, params)


def train_step(state, batch, *, model: gpt.GPT, tx, accum_steps: int,
               loss_chunk_size: int = 0, loss_kernel: str = "xla",
               loss_reduce_once: bool = False,
               cast_once: bool = False, reduce_once: bool = True,
               schedule=None, label_smoothing: float = 0.0,
               z_loss: float = 0.0):
  """One iteration over batch = {x, y: [accum_steps * B, T] int32}.

  Rows are grouped as [B, accum_steps]: each device's contiguous rows hold
  every micro-batch's share, so splitting into micro-batches moves no data.
  The loss of each micro-batch is divided by accum_steps and the gradients
  summed, as nanoGPT does. `cast_once` (GPUs): the weights' compute-dtype
  copies are made before the micro-batch loop, not in every micro-step.
  `schedule` (`learning_rate_schedule`): the `lr` metric, the rate `tx`
  gives this iteration. `label_smoothing`, `z_loss`: the training loss's
  (`cross_entropy`), which the `loss` metric includes, as estimate_loss's
  (`eval_step`) does; with a z-loss its term is also the `z_loss` metric.
  """
  split = functools.partial(accumulation.split, accum_steps=accum_steps)

  step_rng = jax.random.fold_in(state.rng, state.step)

  def loss_fn(params, table, x, y, rng, loss_scale, scored):
    hidden = model.apply({"params": params}, x, deterministic=False,
                         rngs={"dropout": rng}, method=gpt.GPT.hidden)
    if loss_kernel != "xla":
      if table is None:
        table = model.apply({"params": params}, method=gpt.GPT.head_table)
      loss, count, z_term = fused_cross_entropy(hidden, table, y,
                                        model.cfg.logits_dtype,
                                        loss_kernel == "triton_interpret",
                                        label_smoothing, z_loss)
    else:
      # Without cast_once the head makes its table where it is used: made
      # here, before the layers, XLA kept it live through the forward and
      # backward (MaxText's 52B on v4-384: 31.70 GiB per chip, against
      # 30.56 made at use).
      if loss_chunk_size:
        # Gathered by the loss, for the chunks, which read it whole (and
        # again in its backward pass, whose gradient then leaves in the
        # parameter's layout), unless cast_once made it.
        gather = None
        if table is None:
          table = params["wte"]["embedding"]
          gather = functools.partial(gpt_layers.gather_table, cfg=model.cfg)
        loss, count, z_term = chunked_cross_entropy(
            hidden, table, y, loss_chunk_size,
            functools.partial(gpt_layers.tied_logits, cfg=model.cfg),
            label_smoothing, z_loss, gpt_layers.TABLE_AXES,
            loss_reduce_once, gather)
      else:
        logits = model.apply({"params": params}, hidden, table,
                             method=gpt.GPT.logits_from_hidden)
        loss, count, z_term = cross_entropy(logits, y, label_smoothing,
                                            z_loss)
    # This device's share of the micro-batch's mean over all its scored
    # targets (`scored`: the whole micro-batch's count; 1 when these rows
    # are the whole micro-batch), so shards with fewer scored targets
    # (-1s) weigh less, as in the one-device mean.
    share = jnp.maximum(count, 1) / jnp.maximum(scored, 1)
    loss = loss * share
    # With a z-loss its term rides along as a second summed scalar (its
    # metric); without, the step sums the loss alone, as before.
    terms = (loss, z_term * share) if z_loss else loss
    return loss_scale_lib.scale_loss(loss_scale, loss), terms

  grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)
  # With cast_once, made once per iteration, not in every micro-step: the
  # layers' kernels and the LM head's copy of the tied table in the
  # compute dtype (with, under FSDP, the table's gather). The token lookup
  # reads the float32 table, whose gradient each micro-step's head
  # gradient joins. On TPUs and CPUs the casts stay in the loop: on a pod
  # the copies of FSDP-sharded weights would hold memory through it, and
  # the H100's per-launch cost that this removes was measured on a GPU.
  params, table = state.params, None
  if cast_once:
    params = matmul_weights_in(state.params, model.cfg.compute_dtype)
    table = model.apply({"params": state.params}, method=gpt.GPT.head_table)

  def micro_steps(whole, rows):
    params, table, loss_scale, rng, scored = whole

    def micro_step(k, x, y, n):
      (_, terms), (grads, d_table) = grad_fn(
          params, table, x, y, jax.random.fold_in(rng, k), loss_scale, n)
      if table is not None:
        wte = grads["wte"]["embedding"] + d_table.astype(jnp.float32)
        grads = {**grads, "wte": {**grads["wte"], "embedding": wte}}
      return terms, grads

    xs = tuple(split(a) for a in rows) + (scored,)
    return accumulation.sum_micro_steps(micro_step, accum_steps, xs, params,
                                        divisor=accum_steps,
                                        loss_terms=2 if z_loss else 1), ()

  rows = (batch["x"], batch["y"])
  scored = (split(batch["y"]) >= 0).sum((1, 2))  # per micro-batch, all rows
  whole = (params, table, state.loss_scale, step_rng, scored)
  # Each micro-step's gradients stay with their data-parallel index and are
  # reduced over the data-parallel devices once per iteration, as DDP's
  # no_sync does (under FSDP they are still reduce-scattered over `fsdp` in
  # each micro-step); GSPMD alone reduced them over every axis in every
  # micro-step. Not with dropout, whose masks would depend on the mesh.
  (terms, grads), _ = accumulation.run(
      micro_steps, whole, rows, accum_steps, reduce_once,
      mesh_dependent_draws=bool(model.cfg.dropout))
  loss, z_term = terms if z_loss else (terms, None)
  # Unscaled (float16 runs) before the finite check, clipping and AdamW.
  grads = loss_scale_lib.unscale(state.loss_scale, grads)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
  ok = state_lib.all_finite(loss, grads)

  # The update runs only when finite, rather than being selected against the
  # old state afterwards: that select kept the old AdamW moments alive next
  # to their in-place update, and XLA copied every moment each step.
  def apply(operands):
    params, opt_state, grads = operands
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, opt_state = jax.lax.cond(
      ok, apply,
      lambda operands: (operands[0], advance_schedule(operands[1])),
      (state.params, state.opt_state, grads))
  one = jnp.int32(1)
  metrics = {
      "loss": clu_metrics.Average(total=loss, count=one),
      "grad_norm": clu_metrics.Average(total=optax.tree.norm(grads),
                                       count=one),
  }
  if z_loss:  # its own scalar, as MaxText's learning/z_loss (in `loss`)
    metrics["z_loss"] = clu_metrics.Average(total=z_term, count=one)
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state)
  new_state, metrics = state_lib.skip_nonfinite(
      state, new_state, metrics, ok, guarded=("params", "opt_state"))
  state_lib.add_learning_rate(metrics, schedule, state.opt_state)
  return new_state, metrics


def eval_step(state, batch, *, model: gpt.GPT, label_smoothing: float = 0.0,
              z_loss: float = 0.0):
  """estimate_loss for one batch: batch['split'] says per row whether it
  comes from train.bin (0) or val.bin (1); `loss` is the validation loss.

  The losses are the training objective's, with its `label_smoothing` and
  `z_loss` (Hugging Face's eval_loss and MaxText's evaluation loss include
  them). With either term, `train_cross_entropy` and `val_cross_entropy`
  are also the plain cross-entropy, the figure nanoGPT's val loss is."""
  logits = model.apply({"params": state.params}, batch["x"])
  valid = batch["y"] >= 0
  labels = jnp.where(valid, batch["y"], 0)
  is_val = batch["split"] == 1

  def split_averages(token_loss):
    row_loss = (jnp.where(valid, token_loss, 0.0).sum(-1)
                / jnp.maximum(valid.sum(-1), 1))

    def average(rows):
      return clu_metrics.Average(total=jnp.where(rows, row_loss, 0.0).sum(),
                                 count=rows.sum().astype(jnp.int32))

    return average(jnp.logical_not(is_val)), average(is_val)

  train, val = split_averages(losses.softmax_cross_entropy(
      logits, labels, label_smoothing, z_loss))
  metrics = {"loss": val, "val_loss": val, "train_loss": train}
  if label_smoothing or z_loss:
    # The same logits' log-normaliser: XLA computes it once for both.
    metrics["train_cross_entropy"], metrics["val_cross_entropy"] = (
        split_averages(losses.softmax_cross_entropy(logits, labels)))
  return metrics, {}
