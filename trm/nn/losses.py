"""Softmax cross-entropy over a vocabulary, with a one-pass backward.

GPT's and Dream's token losses share it. The values are
`optax.softmax_cross_entropy_with_integer_labels` on the float32 logits;
only the backward pass is written out: the gradient (softmax - one-hot) x g
is one elementwise pass over [..., V] that comes out in the logits' dtype.
Autodiff of logsumexp and take_along_axis instead scatters the label's -1
into a float32 [..., V] tensor, adds that to the softmax term, and rounds to
a low-precision logits dtype in a further pass: on the compiled XLA:GPU
program of GPT-2's iteration that was three extra passes over
[12, 1024, 50304] float32 per micro-step (BUILD_NOTES "On a GPU").
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _log_sum_exp_one_pass(x):
  """logsumexp over the last axis of float32 x in one read of x: a
  reduction of (running max, sum of exp(x - max)) pairs, one exp per pair
  combined. XLA's logsumexp reads x twice (the max, then the sum)."""
  def combine(a, b):
    (m1, s1), (m2, s2) = a, b
    m, low = jnp.maximum(m1, m2), jnp.minimum(m1, m2)
    scale = jnp.where(low == -jnp.inf, 0.0, jnp.exp(low - m))
    return m, jnp.where(m1 >= m2, s1 + s2 * scale, s2 + s1 * scale)

  m, s = jax.lax.reduce((x, jnp.ones_like(x)),
                        (jnp.float32(-jnp.inf), jnp.float32(0.0)), combine,
                        (x.ndim - 1,))
  return m + jnp.log(s)


def _log_sum_exp(x):
  """logsumexp over the last axis; on a GPU in one pass over x (one read of
  GPT-2's [12, 1024, 50304] logits less per micro-step); elsewhere XLA's
  two passes, which XLA:CPU vectorises."""
  return jax.lax.platform_dependent(
      x, cuda=_log_sum_exp_one_pass,
      default=lambda x: jax.nn.logsumexp(x, axis=-1))


def _forward(logits, labels, label_smoothing=0.0, z_loss=0.0):
  x = logits.astype(jnp.float32)
  log_z = _log_sum_exp(x)
  picked = jnp.take_along_axis(x, labels[..., None], axis=-1)[..., 0]
  if label_smoothing:
    # -sum(q log softmax(x)) for q = (1 - s) one-hot + s / V (torch's
    # cross_entropy(label_smoothing=s)): lse - (1 - s) x[label] - s mean(x).
    loss = log_z - (1.0 - label_smoothing) * picked - (
        label_smoothing * jnp.mean(x, axis=-1))
  else:
    loss = log_z - picked
  if z_loss:
    loss = loss + z_loss * jnp.square(log_z)  # MaxText's z_loss_multiplier
  return loss, log_z


def softmax_cross_entropy(logits, labels, label_smoothing=0.0, z_loss=0.0):
  """-log softmax(logits)[label] per position, float32.

  logits [..., V] in any float dtype (the softmax runs in float32); labels
  [...] integers in [0, V). Positions to ignore are the caller's: give them
  a valid label and a zero weight. `label_smoothing` s (Python float in
  [0, 1]) scores q = (1 - s) one-hot + s / V instead of the one-hot, as
  torch's cross_entropy(label_smoothing=s); `z_loss` z adds z lse**2, the
  log-normaliser's penalty of MaxText's z_loss_multiplier (PaLM's). At 0
  (the defaults) neither term is computed.
  """
  return _loss_and_log_z(logits, labels, label_smoothing, z_loss)[0]


def softmax_cross_entropy_and_log_z(logits, labels, label_smoothing=0.0,
                                    z_loss=0.0):
  """(`softmax_cross_entropy`, the log-normaliser lse per position): the
  same pass gives both, so the z-loss term (z lse**2) can be logged alone,
  as MaxText logs it. lse is a metric: no gradient flows through it."""
  loss, log_z = _loss_and_log_z(logits, labels, label_smoothing, z_loss)
  return loss, jax.lax.stop_gradient(log_z)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _loss_and_log_z(logits, labels, label_smoothing, z_loss):
  return _forward(logits, labels, label_smoothing, z_loss)


def _fwd(logits, labels, label_smoothing, z_loss):
  loss, log_z = _forward(logits, labels, label_smoothing, z_loss)
  return (loss, log_z), (logits, labels, log_z)


def _bwd(label_smoothing, z_loss, residuals, cotangents):
  # lse's cotangent is dropped: the public functions return it only under
  # stop_gradient (a metric), so it is zero.
  g, _ = cotangents
  logits, labels, log_z = residuals
  probs = jnp.exp(logits.astype(jnp.float32) - log_z[..., None])
  if z_loss:  # d(z lse**2) = 2 z lse softmax
    probs = probs * (1.0 + 2.0 * z_loss * log_z[..., None])
  vocab = jax.lax.broadcasted_iota(labels.dtype, logits.shape,
                                   logits.ndim - 1)
  one_hot = (vocab == labels[..., None]).astype(jnp.float32)
  if label_smoothing:
    target = (1.0 - label_smoothing) * one_hot + (
        label_smoothing / logits.shape[-1])
  else:
    target = one_hot
  return ((probs - target) * g[..., None]).astype(logits.dtype), None


_loss_and_log_z.defvjp(_fwd, _bwd)
