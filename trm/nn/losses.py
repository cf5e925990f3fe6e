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


def _forward(logits, labels):
  x = logits.astype(jnp.float32)
  log_z = _log_sum_exp(x)
  picked = jnp.take_along_axis(x, labels[..., None], axis=-1)[..., 0]
  return log_z - picked, log_z


@jax.custom_vjp
def softmax_cross_entropy(logits, labels):
  """-log softmax(logits)[label] per position, float32.

  logits [..., V] in any float dtype (the softmax runs in float32); labels
  [...] integers in [0, V). Positions to ignore are the caller's: give them
  a valid label and a zero weight.
  """
  return _forward(logits, labels)[0]


def _fwd(logits, labels):
  loss, log_z = _forward(logits, labels)
  return loss, (logits, labels, log_z)


def _bwd(residuals, g):
  logits, labels, log_z = residuals
  probs = jnp.exp(logits.astype(jnp.float32) - log_z[..., None])
  vocab = jax.lax.broadcasted_iota(labels.dtype, logits.shape,
                                   logits.ndim - 1)
  one_hot = (vocab == labels[..., None]).astype(jnp.float32)
  return ((probs - one_hot) * g[..., None]).astype(logits.dtype), None


softmax_cross_entropy.defvjp(_fwd, _bwd)
