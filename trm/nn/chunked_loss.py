"""The LM head's cross-entropy with the logits made a chunk of positions at
a time (`config.loss_chunk_size`), so [B, T, vocab] never exists whole.

Under FSDP the batch is split over devices and the head's table over its
width. Left to autodiff of a `lax.scan` with the table made inside the
loop, XLA gathered the table in every chunk and all-reduced every chunk's
[vocab, C] gradient to whole copies (32 of each a micro-step for 8192
positions in chunks of 256). Here the loss gathers the table once
(`gather_fn`) and has its own backward pass: when gradients are asked
for, one pass over the chunks makes each chunk's logits once and
differentiates them at once (three matmuls a chunk, as one logits matmul
and its backward; the loss is linear in its cotangent, so the backward
pass only scales what that pass kept). Each chunk's table gradient is
summed over the batch devices one of two ways:
- by default it reduce-scatters each chunk's share straight into a float32
  accumulator laid out like the parameter (`grad_axes`): a third of the
  bytes a chunk moved before, and no device holds the whole gradient;
- `reduce_once` (`config.loss_reduce_once`): each device runs the chunks
  over its own rows into its own float32 [vocab, C] sum, and the sums
  cross the batch devices once, after the last chunk (as MaxText's one
  logits matmul does), reduce-scattered into the parameter's layout, for
  vocab x C x 4 bytes more per device.
GPT's tied head ([vocab, C]) and DiffuCoder's lm_head ([C, vocab], each
token's loss weighted 1/t) both use it; `logits_fn` says how the table is
read.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from trm.core import mesh as mesh_lib
from trm.nn import losses


def chunked_cross_entropy(hidden, table, targets, chunk_size: int, logits_fn,
                          label_smoothing=0.0, z_loss=0.0, grad_axes=None,
                          reduce_once: bool = False, weights=None,
                          gather_fn=None):
  """(sum of the token losses, sum of their logsumexp**2) over the scored
  targets (not -1) of `logits_fn(hidden, table)`, made `chunk_size`
  positions at a time (with their gradients, when asked for, in the same
  pass). hidden [B, T, C]; table: the head's weights as held, which
  `gather_fn` turns into what logits_fn reads;
  logits_fn(h [B, c, C], table) -> [B, c, vocab], a function of
  its arguments alone (it is not differentiated through a closure);
  grad_axes: the table's logical axis names, how its gradient is laid out
  as the chunks add to it (None: as XLA places it); reduce_once: each
  device sums its rows' chunks alone, then the devices once (above);
  weights [B, T] float32 (None: 1): each scored token's loss is multiplied
  by its weight (not its lse**2), a constant of the loss (no gradient);
  gather_fn: table as held (the parameter's layout) -> the table logits_fn
  reads (gathered, cast), made inside the loss's forward and backward
  passes, so the gradient leaves in the parameter's layout (through a
  gather done outside, autodiff gathers the summed gradient whole and
  slices it again); it may change only layout and dtype (None: `table`
  is read as given)."""
  if weights is None:
    weights = jnp.ones(targets.shape, jnp.float32)
  weights = jax.lax.stop_gradient(weights.astype(jnp.float32))
  length = hidden.shape[1]
  pad = -length % chunk_size
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)), constant_values=-1)
    weights = jnp.pad(weights, ((0, 0), (0, pad)))
  options = (chunk_size, logits_fn, float(label_smoothing), float(z_loss),
             None if grad_axes is None else tuple(grad_axes),
             bool(reduce_once) and _batch_split_alone(),
             _as_given if gather_fn is None else gather_fn)
  sums = _sums(hidden, table, targets, weights, *options)
  return sums[0], sums[1]


def _batch_split_alone() -> bool:
  """Whether per-device sums apply: a mesh is active and the table's
  vocabulary is not split over it (tensor parallel splits the logits,
  whose softmax then needs XLA's placement)."""
  mesh = jax.sharding.get_abstract_mesh()
  return (not mesh.empty
          and mesh_lib.logical_split(mesh, None, "vocab")[1] == 1)


def _split(x, chunk_size: int):
  """[B, chunks * c, ...] -> [chunks, B, c, ...]."""
  x = x.reshape((x.shape[0], x.shape[1] // chunk_size, chunk_size)
                + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _unsplit(x):
  """[chunks, B, c, ...] -> [B, chunks * c, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])


def _chunk_sums(h, y, w, table, logits_fn, label_smoothing, z_loss):
  """[sum of the weighted losses, sum of lse**2] of one chunk's scored
  targets."""
  valid = y >= 0
  token_loss, log_z = losses.softmax_cross_entropy_and_log_z(
      logits_fn(h, table), jnp.where(valid, y, 0), label_smoothing, z_loss)
  lse_squared = (jnp.where(valid, jnp.square(log_z), 0.0).sum() if z_loss
                 else jnp.zeros((), jnp.float32))
  return jnp.stack([jnp.where(valid, w * token_loss, 0.0).sum(),
                    lse_squared])


def _as_given(table):
  return table


def _laid_out(x, grad_axes):
  return x if grad_axes is None else mesh_lib.constrain(x, grad_axes)


def _local_sums(hidden, targets, weights, table, *, chunk_size, logits_fn,
                label_smoothing, z_loss):
  def body(acc, xs):
    return acc + _chunk_sums(*xs, table, logits_fn, label_smoothing,
                             z_loss), None

  sums, _ = jax.lax.scan(body, jnp.zeros((2,), jnp.float32),
                         (_split(hidden, chunk_size),
                          _split(targets, chunk_size),
                          _split(weights, chunk_size)))
  return (sums,)


def _local_sums_and_grads(hidden, targets, weights, table, *, chunk_size,
                          logits_fn, label_smoothing, z_loss, grad_axes):
  """(sums, d sums[0] / d hidden, d sums[0] / d table in float32) in one
  pass over the chunks: each chunk's logits made once and differentiated
  at once; its table gradient laid out as `grad_axes` says (on one
  device's rows, None: kept whole) as it joins the sum. Only sums[0] has a
  gradient (lse**2 is a metric's)."""
  unit = jnp.array([1.0, 0.0], jnp.float32)

  def body(carry, xs):
    sums, table_grad = carry
    h, y, w = xs
    chunk_sums, vjp = jax.vjp(lambda h, t: _chunk_sums(
        h, y, w, t, logits_fn, label_smoothing, z_loss), h, table)
    h_grad, t_grad = vjp(unit)
    t_grad = _laid_out(t_grad, grad_axes).astype(jnp.float32)
    return (sums + chunk_sums, table_grad + t_grad), h_grad

  (sums, table_grad), hidden_grad = jax.lax.scan(
      body, (jnp.zeros((2,), jnp.float32),
             _laid_out(jnp.zeros(table.shape, jnp.float32), grad_axes)),
      (_split(hidden, chunk_size), _split(targets, chunk_size),
       _split(weights, chunk_size)))
  return sums, _unsplit(hidden_grad), table_grad


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9, 10))
def _sums(hidden, table, targets, weights, chunk_size, logits_fn,
          label_smoothing, z_loss, grad_axes, reduce_once, gather_fn):
  """The sums alone (no gradient asked): one forward pass."""
  del grad_axes  # the gradient's
  table = gather_fn(table)
  local = functools.partial(_local_sums, chunk_size=chunk_size,
                            logits_fn=logits_fn,
                            label_smoothing=label_smoothing, z_loss=z_loss)
  if reduce_once:
    return mesh_lib.per_batch_shard(local, (hidden, targets, weights),
                                    (table,), batch_axis=0,
                                    reduce_outputs=(0,))[0]
  return local(hidden, targets, weights, table)[0]


def _sums_fwd(hidden, held, targets, weights, chunk_size, logits_fn,
              label_smoothing, z_loss, grad_axes, reduce_once, gather_fn):
  """The sums and their gradients in one pass (the loss is linear in its
  cotangent, so the backward pass only scales them): each chunk's logits
  are made once, not again for the backward pass, and the table is
  gathered once for both."""
  table = gather_fn(held)
  local = functools.partial(_local_sums_and_grads, chunk_size=chunk_size,
                            logits_fn=logits_fn,
                            label_smoothing=label_smoothing, z_loss=z_loss)
  if reduce_once:
    # The devices' float32 sums reduce-scatter into the parameter's
    # layout, so no whole sum outlives the loss (one did through the
    # layers' backward pass: BUILD_NOTES "Session 89").
    sums, hidden_grad, table_grad = mesh_lib.per_batch_shard(
        functools.partial(local, grad_axes=None), (hidden, targets, weights),
        (table,), batch_axis=0, reduce_outputs=(0, 2),
        reduced_layouts=None if grad_axes is None else {2: grad_axes})
    table_grad = _laid_out(table_grad, grad_axes)
  else:
    sums, hidden_grad, table_grad = local(hidden, targets, weights, table,
                                          grad_axes=grad_axes)
  # `held` (a parameter, alive anyway) gives the gradient's dtype.
  return sums, (hidden_grad, table_grad, held)


def _sums_bwd(chunk_size, logits_fn, label_smoothing, z_loss, grad_axes,
              reduce_once, gather_fn, residuals, cotangent):
  del chunk_size, logits_fn, label_smoothing, z_loss, grad_axes
  del reduce_once, gather_fn
  hidden_grad, table_grad, held = residuals
  scale = cotangent[0]
  # The table's float32 sum, laid out as the held table, in its dtype: the
  # transpose of gather_fn's gather and cast.
  return ((hidden_grad.astype(jnp.float32) * scale).astype(hidden_grad.dtype),
          (table_grad * scale).astype(held.dtype), None, None)


_sums.defvjp(_sums_fwd, _sums_bwd)
