"""Gradient accumulation: one train step's batch as micro-batches.

`config.gradient_accumulation_steps` (nanoGPT's name, GPT's and
DiffuCoder's field) splits each step's rows into that many micro-batches,
whose gradients are summed in float32 inside the jitted step (a
`lax.scan`) before the one optimizer update, so a global batch larger than
the devices' memory trains as one step. The rows are grouped as [B,
accum_steps]: micro-batch k is rows k, k + accum_steps, ..., so each
device's contiguous rows hold every micro-batch's share and the split
moves no data. With more than one micro-step the summed gradients are
reduced over the data-parallel devices once per step
(`trm.core.data_parallel`), as DDP's `no_sync`.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from trm.core import data_parallel
from trm.core import mesh as mesh_lib

FIELD = "gradient_accumulation_steps"


def steps_of(config) -> int:
  """config.gradient_accumulation_steps, checked: a positive integer (1
  where the config predates the field: one step per batch)."""
  steps = config.get(FIELD, 1)
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
    raise ValueError(f"config.{FIELD}={steps!r} must be a positive integer "
                     "(micro-batches per train step; 1: the whole batch at "
                     "once).")
  return steps


def check_micro_batch(config, ctx=None) -> None:
  """The step's config.global_batch_size rows split into
  gradient_accumulation_steps micro-batches, each of which splits evenly
  over the devices the batch is sharded over (`ctx`, a
  `mesh.ShardingContext`; None: not checked), before anything is read or
  compiled."""
  steps = steps_of(config)
  rows = config.global_batch_size
  if rows % steps:
    raise ValueError(
        f"config.global_batch_size={rows} must be a multiple of config."
        f"{FIELD}={steps} (each micro-batch is global_batch_size / {FIELD} "
        "rows): choose a global batch or a step count that divides it.")
  if ctx is None:
    return
  micro, ways = rows // steps, mesh_lib.batch_parallelism(ctx.mesh, ctx.rules)
  if micro % ways:
    raise mesh_lib.MeshConfigError(
        f"config.global_batch_size={rows} / config.{FIELD}={steps} = {micro} "
        f"rows per micro-batch must be a multiple of the data-parallel size "
        f"{ways} (mesh {dict(ctx.mesh.shape)}): lower config.{FIELD} or "
        "raise config.global_batch_size.")


def eval_steps_of(config, ctx=None) -> int:
  """How many micro-batches the eval step splits its
  config.data.eval_batch_size rows into: 1 without gradient accumulation
  (the whole batch, as before); with it the fewest whose rows are at most
  the train step's micro-batch (global_batch_size /
  gradient_accumulation_steps rows, which fit) and split evenly over the
  data-parallel devices (`ctx`; None: one), so a held-out batch the size
  of the global batch fits where the accumulated train step does."""
  steps = steps_of(config)
  if steps == 1:
    return 1
  rows, micro = config.data.eval_batch_size, config.global_batch_size // steps
  ways = 1 if ctx is None else mesh_lib.batch_parallelism(ctx.mesh, ctx.rules)
  per_device = max(rows // ways, 1)
  return next(k for k in range(1, per_device + 1)
              if per_device % k == 0 and (rows // k <= micro
                                          or k == per_device))


def split(a, accum_steps: int):
  """[accum_steps * B, ...] -> [accum_steps, B, ...], micro-batch k being
  rows k, k + accum_steps, ... (this device's, or the mesh's, rows)."""
  a = a.reshape(a.shape[0] // accum_steps, accum_steps, *a.shape[1:])
  a = a.swapaxes(0, 1)
  return mesh_lib.constrain(a, (None, mesh_lib.BATCH) + (None,) * (a.ndim - 2))


def sum_micro_steps(micro_step: Callable, accum_steps: int, xs, params,
                    divisor: int = 1, loss_terms: int = 1):
  """(sum of loss_k / divisor, sum of float32(grads_k) / divisor) over the
  micro-batches, where (loss_k, grads_k) = micro_step(k, *xs_k) and `xs`
  are `split` arrays ([accum_steps, ...]); `params` gives the gradients'
  shapes. `divisor`: GPT divides each micro-batch's mean by accum_steps
  (nanoGPT), DiffuCoder's micro-steps are already shares of the whole
  batch's mean (1). `loss_terms` > 1: loss_k is a tuple of that many
  float32 scalars (the loss and terms logged beside it, such as GPT's
  z-loss), each summed the same way."""
  def accumulate(carry, inputs):
    loss_sum, grad_sum = carry
    loss, grads = micro_step(*inputs)
    # Widened before the division, as float32 parameters' gradients are
    # (the same values).
    grad_sum = jax.tree.map(
        lambda a, g: a + g.astype(jnp.float32) / divisor, grad_sum, grads)
    return (jax.tree.map(lambda a, b: a + b / divisor, loss_sum, loss),
            grad_sum), None

  zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
  no_loss = jnp.zeros((), jnp.float32)
  if loss_terms > 1:
    no_loss = (no_loss,) * loss_terms
  (loss, grads), _ = jax.lax.scan(
      accumulate, (no_loss, zeros), (jnp.arange(accum_steps),) + tuple(xs))
  return loss, grads


def run(micro_steps: Callable, whole, rows, accum_steps: int,
        reduce_once: bool = True, mesh_dependent_draws: bool = False):
  """micro_steps(whole, rows) -> ((loss, grads), ()), the step's
  accumulation, with its sums reduced over the data-parallel devices once
  (`data_parallel.sum_over_data`) where that is the same step: more than
  one micro-step (one keeps GSPMD's reduction, which overlaps the backward
  layer by layer), micro-batches that split into the data-parallel groups,
  and no random draws inside (`mesh_dependent_draws`: dropout's masks,
  drawn per device or group, would depend on the mesh; GSPMD's are the
  one-device step's). `whole` and `rows` as for `sum_over_data`;
  `reduce_once`: config.reduce_gradients_once."""
  micro = jax.tree.leaves(rows)[0].shape[0] // accum_steps
  if (accum_steps > 1 and not mesh_dependent_draws
      and micro % data_parallel.shard_count(reduce_once) == 0):
    return data_parallel.sum_over_data(micro_steps, whole, rows,
                                       enabled=reduce_once)
  return micro_steps(whole, rows)
