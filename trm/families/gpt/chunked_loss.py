"""The LM head's cross-entropy with the logits made a chunk of positions at
a time (`config.loss_chunk_size`), so [B, T, vocab] never exists whole.

Under FSDP the batch is split over devices and the head's table over its
width. Left to autodiff of a `lax.scan` with the table made inside the
loop, XLA gathered the table in every chunk and all-reduced every chunk's
[vocab, C] gradient to whole copies (32 of each a micro-step for 8192
positions in chunks of 256). Here the table is gathered once, before the
chunks, and the loss has its own backward pass, which sums each chunk's
table gradient over the batch devices one of two ways:
- by default it reduce-scatters each chunk's share straight into a float32
  accumulator laid out like the parameter (`grad_axes`): a third of the
  bytes a chunk moved before, and no device holds the whole gradient;
- `reduce_once` (`config.loss_reduce_once`): each device runs the chunks
  over its own rows into its own float32 [vocab, C] sum, and the sums
  cross the batch devices once, after the last chunk (as MaxText's one
  logits matmul does), for vocab x C x 4 bytes more per device.
"""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from trm.core import mesh as mesh_lib
from trm.nn import losses


def chunked_cross_entropy(hidden, table, targets, chunk_size: int, logits_fn,
                          label_smoothing=0.0, z_loss=0.0, grad_axes=None,
                          reduce_once: bool = False):
  """(sum of the token losses, sum of their logsumexp**2) over the scored
  targets (not -1) of `logits_fn(hidden, table)`, made `chunk_size`
  positions at a time in the forward and again in the backward pass.
  hidden [B, T, C]; table: the head's weights as logits_fn reads them
  (gathered); logits_fn(h [B, c, C], table) -> [B, c, vocab], a function of
  its arguments alone (it is not differentiated through a closure);
  grad_axes: the table's logical axis names, how its gradient is laid out
  as the chunks add to it (None: as XLA places it); reduce_once: each
  device sums its rows' chunks alone, then the devices once (above)."""
  length = hidden.shape[1]
  pad = -length % chunk_size
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)), constant_values=-1)
  options = (chunk_size, logits_fn, float(label_smoothing), float(z_loss),
             None if grad_axes is None else tuple(grad_axes),
             bool(reduce_once) and _batch_split_alone())
  sums = _sums(hidden, table, targets, *options)
  return sums[0], sums[1]


def _batch_split_alone() -> bool:
  """Whether per-device sums apply: a mesh is active and the table's
  vocabulary is not split over it (tensor parallel splits the logits,
  whose softmax then needs XLA's placement)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return False
  vocab = mesh_lib.axes_of(nn.logical_to_mesh_axes(("vocab",))[0])
  return math.prod(mesh.shape[a] for a in vocab if a in mesh.shape) == 1


def _split(x, chunk_size: int):
  """[B, chunks * c, ...] -> [chunks, B, c, ...]."""
  x = x.reshape((x.shape[0], x.shape[1] // chunk_size, chunk_size)
                + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _unsplit(x):
  """[chunks, B, c, ...] -> [B, chunks * c, ...]."""
  x = jnp.moveaxis(x, 0, 1)
  return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])


def _chunk_sums(h, y, table, logits_fn, label_smoothing, z_loss):
  """[sum of the losses, sum of lse**2] of one chunk's scored targets."""
  valid = y >= 0
  token_loss, log_z = losses.softmax_cross_entropy_and_log_z(
      logits_fn(h, table), jnp.where(valid, y, 0), label_smoothing, z_loss)
  lse_squared = (jnp.where(valid, jnp.square(log_z), 0.0).sum() if z_loss
                 else jnp.zeros((), jnp.float32))
  return jnp.stack([jnp.where(valid, token_loss, 0.0).sum(), lse_squared])


def _laid_out(x, grad_axes):
  return x if grad_axes is None else mesh_lib.constrain(x, grad_axes)


def _local_sums(hidden, targets, table, *, chunk_size, logits_fn,
                label_smoothing, z_loss):
  def body(acc, xs):
    return acc + _chunk_sums(*xs, table, logits_fn, label_smoothing,
                             z_loss), None

  sums, _ = jax.lax.scan(body, jnp.zeros((2,), jnp.float32),
                         (_split(hidden, chunk_size),
                          _split(targets, chunk_size)))
  return (sums,)


def _local_grads(hidden, targets, table, cotangent, *, chunk_size, logits_fn,
                 label_smoothing, z_loss, grad_axes):
  """(d hidden, d table in float32): each chunk's logits remade and
  differentiated; its table gradient laid out as `grad_axes` says (on one
  device's rows, None: kept whole) as it joins the sum."""
  def body(table_grad, xs):
    h, y = xs
    _, vjp = jax.vjp(lambda h, t: _chunk_sums(
        h, y, t, logits_fn, label_smoothing, z_loss), h, table)
    h_grad, t_grad = vjp(cotangent)
    t_grad = _laid_out(t_grad, grad_axes).astype(jnp.float32)
    return table_grad + t_grad, h_grad

  table_grad, hidden_grad = jax.lax.scan(
      body, _laid_out(jnp.zeros(table.shape, jnp.float32), grad_axes),
      (_split(hidden, chunk_size), _split(targets, chunk_size)))
  return _unsplit(hidden_grad), table_grad


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def _sums(hidden, table, targets, chunk_size, logits_fn, label_smoothing,
          z_loss, grad_axes, reduce_once):
  del grad_axes  # the backward pass's
  local = functools.partial(_local_sums, chunk_size=chunk_size,
                            logits_fn=logits_fn,
                            label_smoothing=label_smoothing, z_loss=z_loss)
  if reduce_once:
    return mesh_lib.per_batch_shard(local, (hidden, targets), (table,),
                                    batch_axis=0, reduce_outputs=(0,))[0]
  return local(hidden, targets, table)[0]


def _sums_fwd(hidden, table, targets, *options):
  return _sums(hidden, table, targets, *options), (hidden, table, targets)


def _sums_bwd(chunk_size, logits_fn, label_smoothing, z_loss, grad_axes,
              reduce_once, residuals, cotangent):
  hidden, table, targets = residuals
  local = functools.partial(_local_grads, chunk_size=chunk_size,
                            logits_fn=logits_fn,
                            label_smoothing=label_smoothing, z_loss=z_loss)
  if reduce_once:
    hidden_grad, table_grad = mesh_lib.per_batch_shard(
        functools.partial(local, grad_axes=None), (hidden, targets),
        (table, cotangent), batch_axis=0, reduce_outputs=(1,))
  else:
    hidden_grad, table_grad = local(hidden, targets, table, cotangent,
                                    grad_axes=grad_axes)
  return (hidden_grad.astype(hidden.dtype), table_grad.astype(table.dtype),
          None)


_sums.defvjp(_sums_fwd, _sums_bwd)
