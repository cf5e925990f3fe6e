"""Stablemax cross-entropy (TRM's default LM loss), NaN-safe in float32.

Stablemax replaces exp with s(x) = 1/(1-x) for x < 0 and x + 1 for x >= 0, and
normalises like softmax. Upstream computes it in float64; here it is computed
in float32 in log space so neither the value nor the gradient can overflow.
"""

import jax
import jax.numpy as jnp

IGNORE_LABEL_ID = -100


def log_stablemax(logits, axis=-1):
  """log(s(x) / sum(s(x))) along `axis`, in float32.

  log s(x) is -log1p(-x) for x < 0 and log1p(x) for x >= 0. Upstream's 1e-30
  in the negative branch's denominator 1 - x + 1e-30 cannot change anything
  there, since 1 - x >= 1 (it is below float64 resolution too), so it is
  omitted. Each branch only ever sees inputs from its own side of 0: with a
  plain where, the unused branch at e.g. x = 1.0 would be 1/(1 - 1 + 1e-30),
  whose derivative overflows float32 to inf, and 0 * inf makes the gradient
  NaN ("double-where" trick).
  """
  x = logits.astype(jnp.float32)
  neg = x < 0
  x_neg = jnp.where(neg, x, 0.0)
  x_pos = jnp.where(neg, 0.0, x)
  log_s = jnp.where(neg, -jnp.log1p(-x_neg), jnp.log1p(x_pos))
  # Normalising with logsumexp of log s keeps huge logits (sum of s overflows)
  # and tiny probabilities (s / sum underflows) finite.
  return log_s - jax.nn.logsumexp(log_s, axis=axis, keepdims=True)


def stablemax_cross_entropy(logits, labels, ignore_index=IGNORE_LABEL_ID):
  """Per-token stablemax cross-entropy.

  Args:
    logits: [..., L, V] logits of any float dtype (computed in float32).
    labels: [..., L] int labels; `ignore_index` marks unsupervised tokens.
    ignore_index: label value that contributes zero loss and zero gradient.

  Returns:
    [..., L] float32 loss, 0 where labels == ignore_index.
  """
  logprobs = log_stablemax(logits, axis=-1)
  valid = labels != ignore_index
  # Ignored labels (-100) would gather out of range; point them at class 0.
  safe_labels = jnp.where(valid, labels, 0).astype(jnp.int32)
  picked = jnp.take_along_axis(
      logprobs, safe_labels[..., None], axis=-1)[..., 0]
  return jnp.where(valid, -picked, 0.0)
