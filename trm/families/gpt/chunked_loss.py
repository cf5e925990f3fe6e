"""The LM head's cross-entropy with the logits made a chunk of positions at
a time (`config.loss_chunk_size`), so [B, T, vocab] never exists whole.

Under FSDP the batch is split over devices and the head's table over its
width. Left to autodiff of a `lax.scan` with the table made inside the
loop, XLA gathered the table in every chunk and all-reduced every chunk's
[vocab, C] gradient to whole copies (32 of each a micro-step for 8192
positions in chunks of 256). Here the table is gathered once, before the
chunks, and the loss has its own backward pass: each chunk's table
gradient is reduce-scattered straight into a float32 accumulator laid out
like the parameter (`grad_axes`), so a chunk moves a third of the bytes
and no device holds the whole float32 gradient.
"""
from __future__ import annotations

import functools
import jax
import jax.numpy as jnp

from trm.core import mesh as mesh_lib
from trm.nn import losses


def chunked_cross_entropy(hidden, table, targets, chunk_size: int, logits_fn,
                          label_smoothing=0.0, z_loss=0.0, grad_axes=None):
  """(sum of the token losses, sum of their logsumexp**2) over the scored
  targets (not -1) of `logits_fn(hidden, table)`, made `chunk_size`
  positions at a time in the forward and again in the backward pass.
  hidden [B, T, C]; table: the head's weights as logits_fn reads them
  (gathered); logits_fn(h [B, c, C], table) -> [B, c, vocab], a function of
  its arguments alone (it is not differentiated through a closure);
  grad_axes: the table's logical axis names, how its gradient is laid out
  as the chunks add to it (None: as XLA places it)."""
  length = hidden.shape[1]
  pad = -length % chunk_size
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)), constant_values=-1)
  sums = _sums(hidden, table, targets, chunk_size, logits_fn,
               float(label_smoothing), float(z_loss),
               None if grad_axes is None else tuple(grad_axes))
  return sums[0], sums[1]


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _sums(hidden, table, targets, chunk_size, logits_fn, label_smoothing,
          z_loss, grad_axes):
  del grad_axes  # the backward pass's

  def body(acc, xs):
    return acc + _chunk_sums(*xs, table, logits_fn, label_smoothing,
                             z_loss), None

  sums, _ = jax.lax.scan(body, jnp.zeros((2,), jnp.float32),
                         (_split(hidden, chunk_size),
                          _split(targets, chunk_size)))
  return sums


def _sums_fwd(hidden, table, targets, chunk_size, logits_fn, label_smoothing,
              z_loss, grad_axes):
  sums = _sums(hidden, table, targets, chunk_size, logits_fn,
               label_smoothing, z_loss, grad_axes)
  return sums, (hidden, table, targets)


def _sums_bwd(chunk_size, logits_fn, label_smoothing, z_loss, grad_axes,
              residuals, cotangent):
  """Each chunk's logits remade and differentiated; its table gradient
  (this device's rows' share) reduced into the accumulator's layout."""
  hidden, table, targets = residuals

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
  return (_unsplit(hidden_grad).astype(hidden.dtype),
          table_grad.astype(table.dtype), None)


_sums.defvjp(_sums_fwd, _sums_bwd)
