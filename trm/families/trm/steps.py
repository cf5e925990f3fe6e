"""TRM train and eval steps (pure functions; the loop jits them).

One train step = one ACT supervision step = one optimizer update, as upstream
`pretrain.py::train_batch`: halted carry rows take the new batch's rows, the
model runs one recursion, and both optimizers step (sparse sign-SGD on the
puzzle-embedding rows the batch touched, AdamATan2 on everything else, or
config.optim.optimizer's choice),
followed by the EMA update. A step whose loss or gradients hold a NaN or Inf
changes nothing but the step counter (`state.skip_nonfinite`).

With `optim.freeze_weights` (upstream's, for test-time adaptation) only the
puzzle table trains: as upstream builds no AdamATan2 then, the weights,
their optimizer state and so their EMA stay as they are (no weight decay
either), and no gradient of theirs is computed.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from trm.families.trm import losses
from trm.families.trm import optim
from trm.core import config_lib
from trm.core import data_parallel
from trm.core import optimizers
from trm.core import state as state_lib
from trm.families.trm import model as trm_model
from trm.families.trm.state import TrainState

# config.optim.optimizer: upstream's AdamATan2 unless it names another.
OPTIMIZER_FIELD = "config.optim.optimizer"
DEFAULT_OPTIMIZER = "adam_atan2"

def make_optimizer(optim_config, total_steps: int):
  """config.optim.optimizer (default upstream's AdamATan2) on params, with
  upstream's warmup + cosine schedule and config.optim.lr_mults / wd_mults
  (`trm.core.optimizers`; the puzzle embeddings' sign-SGD is apart)."""
  name = optim_config.get("optimizer", DEFAULT_OPTIMIZER)
  schedule = optim.lr_schedule(
      optim_config.lr, config_lib.warmup_steps(optim_config, total_steps),
      total_steps, optim_config.lr_min_ratio)
  mults = dict(lr_mults=optim_config.get("lr_mults", ()),
               wd_mults=optim_config.get("wd_mults", ()))
  if name == DEFAULT_OPTIMIZER:  # as every run before the choice trained
    return optimizers.with_multipliers(
        lambda decay: optim.adam_atan2(schedule, b1=optim_config.beta1,
                                       b2=optim_config.beta2,
                                       weight_decay=decay),
        schedule, weight_decay=optim_config.weight_decay, mask=None,
        field="config.optim", **mults)
  return optimizers.build(name, schedule, b1=optim_config.beta1,
                          b2=optim_config.beta2,
                          eps=optim_config.get("eps", 1e-8),
                          weight_decay=optim_config.weight_decay,
                          field=OPTIMIZER_FIELD, **mults)


def _puzzle_vectors(model, state, ids):
  if model.cfg.puzzle_emb_ndim <= 0:
    return None
  return jnp.take(state.puzzle_emb["weights"], ids, axis=0)


def train_step(state: TrainState, batch, *, model: trm_model.TRM,
               tx: optax.GradientTransformation, optim_config,
               total_steps: int, global_batch_size: int,
               reduce_once: bool = True):
  """Returns (new state, metrics dict of clu Averages)."""
  carry = trm_model.reset_carry(model, state.variables(), state.carry, batch)
  vectors = _puzzle_vectors(model, state, carry.puzzle_identifiers)
  rng = jax.random.fold_in(state.rng, state.step)
  # Drawn for the whole batch, so no row's draw depends on the mesh.
  min_halt = trm_model.exploration_min_halt(
      model.cfg, rng, carry.steps.shape[0])

  def loss_fn(params, vectors, carry, min_halt, others):
    new_carry, outputs = trm_model.act_step(
        model, {**others, "params": params}, carry, vectors, train=True,
        min_halt=min_halt)
    loss, _ = losses.act_loss(outputs, new_carry, train=True)
    return loss / global_batch_size, (new_carry, outputs)

  frozen = optim_config.get("freeze_weights", False)

  def local_step(whole, rows):
    params, others = whole
    (loss, (new_carry, outputs)), grads = jax.value_and_grad(
        loss_fn, argnums=(1,) if frozen else (0, 1), has_aux=True)(
            params, *rows, others)
    param_grads, vector_grads = (None, *grads) if frozen else grads
    return (loss, param_grads), (new_carry, outputs, vector_grads)

  # The shared network's gradients are summed on each device over all its
  # uses and reduced over the data-parallel devices once
  # (`trm.core.data_parallel`).
  others = {k: v for k, v in state.variables().items() if k != "params"}
  (loss, param_grads), (new_carry, outputs, vector_grads) = (
      data_parallel.sum_over_data(local_step, (state.params, others),
                                  (vectors, carry, min_halt),
                                  enabled=reduce_once))
  _, metrics = losses.act_loss(outputs, new_carry, train=True)

  ok = state_lib.all_finite(loss, param_grads, vector_grads)
  if frozen:
    params, opt_state, ema_params = (state.params, state.opt_state,
                                     state.ema_params)
  else:
    updates, opt_state = tx.update(param_grads, state.opt_state,
                                   state.params)
    params = optax.apply_updates(state.params, updates)
    ema_params = (optim.ema_update(state.ema_params, params,
                                   optim_config.ema_rate)
                  if optim_config.ema else params)
  # `skip_nonfinite` also drops a step whose new values are not finite, but
  # takes the puzzle table as this step leaves it: its update follows that
  # verdict too (before, weights overflowed by the learning rate skipped the
  # step and the table rows still moved), and its new rows join the verdict
  # (before, a puzzle_emb_lr near float32's maximum kept infinite rows).
  ok = ok & state_lib.all_finite(params, opt_state, ema_params, new_carry)
  puzzle_emb = state.puzzle_emb
  if vectors is not None:
    # On the clock of the updates applied, as AdamATan2's own count: after a
    # skipped step the trainer's step is one ahead (before, the two
    # schedules ran a step apart from then on).
    emb_lr = optim.lr_schedule(optim_config.puzzle_emb_lr,
                               config_lib.warmup_steps(optim_config,
                                                       total_steps),
                               total_steps, optim_config.lr_min_ratio)(
                                   state.step - state.skipped_steps)
    weights, ok = optim.guarded_sparse_sign_sgd_update(
        puzzle_emb["weights"], carry.puzzle_identifiers, vector_grads,
        emb_lr, optim_config.puzzle_emb_weight_decay, ok)
    puzzle_emb = {"weights": weights}
  new_state = state.replace(step=state.step + 1, params=params,
                            opt_state=opt_state, ema_params=ema_params,
                            puzzle_emb=puzzle_emb, carry=new_carry)
  new_state, metrics = state_lib.skip_nonfinite(state, new_state, metrics, ok,
                                               guarded=("puzzle_emb",))
  if frozen and vectors is not None:
    # The rate that trained this step, as upstream logs its last
    # optimizer's (the puzzle table's alone, here).
    metrics["lr"] = state_lib.Counter(emb_lr, jnp.ones((), jnp.int32))
  else:
    state_lib.add_learning_rate(
        metrics, optim.lr_schedule(
            optim_config.lr, config_lib.warmup_steps(optim_config, total_steps),
            total_steps, optim_config.lr_min_ratio),
        state.opt_state)
  return new_state, metrics


def eval_step(state: TrainState, batch, *, model: trm_model.TRM,
              use_ema: bool = True):
  """Runs every row for exactly halt_max_steps ACT steps from a fresh carry.

  Returns (metrics of the final step, predictions [B, L], q_halt logits [B]).
  """
  params = state.ema_params if use_ema else state.params
  variables = state.variables(params)
  rows = batch["inputs"].shape[0]
  carry = trm_model.reset_carry(
      model, variables, trm_model.empty_carry(model.cfg, rows), batch)
  vectors = _puzzle_vectors(model, state, carry.puzzle_identifiers)
  step = functools.partial(trm_model.act_step, model, variables,
                           puzzle_vectors=vectors, train=False)
  carry = jax.lax.fori_loop(0, model.cfg.halt_max_steps - 1,
                            lambda _, c: step(c)[0], carry)
  carry, outputs = step(carry)
  _, metrics = losses.act_loss(outputs, carry, train=False)
  return metrics, jnp.argmax(outputs["logits"], -1), outputs["q_halt_logits"]
