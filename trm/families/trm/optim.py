"""TRM optimisers: AdamATan2, sparse puzzle-embedding SignSGD, LR schedule, EMA.

All functions are pure, operate on pytrees and are jit-friendly (no host
syncs), so they run inside a sharded train step.
"""

import math
from typing import Any, Callable, NamedTuple, Union

import jax
import jax.numpy as jnp
import optax

from trm.core import mesh as mesh_lib

ScalarOrSchedule = Union[float, Callable[[jax.Array], jax.Array]]


def lr_schedule(base_lr: float, warmup_steps: int, total_steps: int,
                min_ratio: float) -> Callable[[jax.Array], jax.Array]:
  """Upstream's linear-warmup + cosine schedule as a function of optax's count.

  Upstream increments its step before computing the LR, so optax's 0-based
  `count` maps to step s = count + 1 and the first update uses
  base_lr / warmup_steps. With min_ratio = 1.0 (upstream default) the LR is
  constant after warmup.
  """
  decay_span = float(max(1, total_steps - warmup_steps))

  def fn(count):
    s = jnp.asarray(count).astype(jnp.float32) + 1.0
    warm = base_lr * s / max(warmup_steps, 1)
    progress = (s - warmup_steps) / decay_span
    cos = jnp.maximum(
        0.0, (1.0 - min_ratio) * 0.5 * (1.0 + jnp.cos(math.pi * progress)))
    after = base_lr * (min_ratio + cos)
    return jnp.where(s < warmup_steps, warm, after).astype(jnp.float32)

  return fn


class AdamATan2State(NamedTuple):
  """AdamATan2 state: a plain pytree, sharded and checkpointed like params."""
  count: jax.Array  # int32, number of updates applied so far.
  mu: Any
  nu: Any


def adam_atan2(learning_rate: ScalarOrSchedule, b1: float = 0.9,
               b2: float = 0.95, weight_decay: float = 0.0,
               mask=None) -> optax.GradientTransformation:
  """imoneoi's AdamATan2 (the optimiser TRM uses) as an optax transformation.

  Per element, with t the 1-based step:
    p <- p * (1 - lr * wd)
    m <- lerp(m, g, 1 - b1);  v <- lerp(v, g^2, 1 - b2)
    p <- p - lr / (1 - b1^t) * atan2(m, sqrt(v) / sqrt(1 - b2^t))
  There is no epsilon, so the step is invariant to the gradient's scale. The
  returned update is new_p - p, which needs `params` because weight decay is
  decoupled and multiplicative. `mask` (a tree of bools like the params,
  or a function of them; None: every parameter): the parameters decayed
  (GPT's `decay_mask`, when another family chooses AdamATan2).
  """

  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p)
    return AdamATan2State(
        count=jnp.zeros([], jnp.int32),
        mu=jax.tree.map(zeros, params),
        nu=jax.tree.map(zeros, params))

  def update_fn(grads, state, params=None):
    if params is None:
      raise ValueError("adam_atan2 needs params for its weight decay.")
    lr = (learning_rate(state.count) if callable(learning_rate)
          else learning_rate)
    lr = jnp.asarray(lr, jnp.float32)
    count = optax.safe_int32_increment(state.count)
    t = count.astype(jnp.float32)
    step_size = lr / (1.0 - jnp.power(b1, t))
    sqrt_bc2 = jnp.sqrt(1.0 - jnp.power(b2, t))

    mu = jax.tree.map(
        lambda m, g: m + (1.0 - b1) * (g.astype(m.dtype) - m), state.mu, grads)
    nu = jax.tree.map(
        lambda v, g: v + (1.0 - b2) * (jnp.square(g.astype(v.dtype)) - v),
        state.nu, grads)

    def leaf_update(p, m, v, decayed=True):
      direction = jnp.arctan2(m, jnp.sqrt(v) / sqrt_bc2)
      decay = weight_decay if decayed else 0.0
      upd = -(lr * decay) * p - step_size * direction
      return upd.astype(p.dtype)

    if mask is None:
      updates = jax.tree.map(leaf_update, params, mu, nu)
    else:
      decayed = mask(params) if callable(mask) else mask
      updates = jax.tree.map(leaf_update, params, mu, nu, decayed)
    return updates, AdamATan2State(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def sparse_sign_sgd_update(table: jax.Array, ids: jax.Array,
                           row_grads: jax.Array, lr, weight_decay) -> jax.Array:
  """Upstream's sparse SignSGD step for the puzzle-embedding table.

  Gradients of duplicate ids are summed, then only the touched rows change:
  row <- row * (1 - lr * wd) - lr * sign(summed_grad). Untouched rows get no
  weight decay. Cost is O(B*D + B^2): duplicates are summed with a [B, B]
  equality matmul instead of a dense [N, D] gradient.

  Args:
    table: [N, D] embedding table.
    ids: [B] int row ids, possibly repeated.
    row_grads: [B, D] gradient w.r.t. the looked-up rows table[ids].
    lr: scalar learning rate (may be traced).
    weight_decay: scalar decoupled weight decay.

  Returns:
    The updated [N, D] table.
  """
  ids, _, new_rows = _touched_rows(table, ids, row_grads, lr, weight_decay)
  # Duplicate ids compute identical rows, so scatter order does not matter.
  return table.at[ids].set(new_rows)


def guarded_sparse_sign_sgd_update(table: jax.Array, ids: jax.Array,
                                   row_grads: jax.Array, lr, weight_decay,
                                   ok) -> tuple[jax.Array, jax.Array]:
  """`sparse_sign_sgd_update` under the train step's finiteness verdict.

  Returns (table, ok): `ok` (scalar bool, the rest of the step's verdict)
  also requires the new rows to be finite, and the rows change only when it
  holds. The check costs O(B*D), not a pass over the whole table, which is
  why the table stays outside the state-wide check (`skip_nonfinite`).
  """
  ids, rows, new_rows = _touched_rows(table, ids, row_grads, lr,
                                      weight_decay)
  ok = jnp.logical_and(ok, jnp.isfinite(new_rows).all())
  return table.at[ids].set(jnp.where(ok, new_rows, rows)), ok


def _touched_rows(table, ids, row_grads, lr, weight_decay):
  """(ids, rows = table[ids], the rows after the step): [B] and [B, D] in
  the table's dtype, each whole on every device of a mesh."""
  # Under a mesh that splits the batch, each device sums the gradients of
  # its own rows into all B rows and the [B, D] partial sums are
  # all-reduced, rather than the gradients all-gathered: XLA:TPU's async
  # all-gather (config.tpu_compiler_options' default) let the scheduler
  # keep 7.8-15 GiB more of the backward's activations alive on ARC-1's
  # v4-8 step (BUILD_NOTES, session 96). Outside a mesh both are no-ops.
  ids = mesh_lib.constrain(ids, (None,))
  rows = table[ids]
  same = mesh_lib.constrain(
      (ids[:, None] == ids[None, :]).astype(jnp.float32),
      (None, "activation_batch"))
  # HIGHEST keeps the sum in full fp32 (no TF32/bf16 passes), since only its
  # sign is used and a rounded near-cancelling sum could flip it.
  summed = mesh_lib.constrain(
      jnp.matmul(same, mesh_lib.constrain(row_grads.astype(jnp.float32),
                                          ("activation_batch", None)),
                 precision=jax.lax.Precision.HIGHEST), (None, None))
  lr = jnp.asarray(lr, jnp.float32)
  new_rows = (rows.astype(jnp.float32) * (1.0 - lr * weight_decay)
              - lr * jnp.sign(summed))
  return ids, rows, new_rows.astype(rows.dtype)


def ema_update(ema_params, params, decay):
  """EMA without bias correction: (1 - decay) * params + decay * ema."""
  return jax.tree.map(
      lambda e, p: ((1.0 - decay) * p + decay * e).astype(e.dtype),
      ema_params, params)
