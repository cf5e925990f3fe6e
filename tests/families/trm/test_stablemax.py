"""Tests for trm.families.trm.stablemax against a float64 numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.families.trm.stablemax import (IGNORE_LABEL_ID, log_stablemax,
                           stablemax_cross_entropy)


def _s64(x):
  """Upstream's s(x) in float64, including its 1e-30."""
  x = np.asarray(x, np.float64)
  with np.errstate(divide="ignore"):
    return np.where(x < 0, 1.0 / (1.0 - x + 1e-30), x + 1.0)


def _ref_loss(logits, labels, ignore_index=IGNORE_LABEL_ID):
  s = _s64(logits)
  logp = np.log(s / s.sum(-1, keepdims=True))
  valid = labels != ignore_index
  safe = np.where(valid, labels, 0)
  picked = np.take_along_axis(logp, safe[..., None], -1)[..., 0]
  return np.where(valid, -picked, 0.0)


def _ref_grad(logits, labels, ignore_index=IGNORE_LABEL_ID):
  """Analytic float64 gradient of sum(loss) w.r.t. logits.

  loss = -log s(x_y) + log S, so d/dx_j = s'(x_j)/S - [j == y] s'(x_y)/s(x_y),
  with s'(x) = 1/(1-x)^2 for x < 0 and 1 for x >= 0.
  """
  x = np.asarray(logits, np.float64)
  s = _s64(x)
  ds = np.where(x < 0, 1.0 / np.square(1.0 - np.minimum(x, 0.0)), 1.0)
  grad = ds / s.sum(-1, keepdims=True)
  valid = labels != ignore_index
  safe = np.where(valid, labels, 0)
  onehot = np.eye(x.shape[-1])[safe]
  grad = grad - onehot * ds / s
  return np.where(valid[..., None], grad, 0.0)


def _grad_of_sum(loss_fn, logits):
  """d sum(loss_fn(logits)) / d logits, jitted: one compile instead of one
  per op of the backward pass (eager), which took most of these tests'
  time. Training takes the gradient under jit too."""
  return jax.jit(jax.grad(lambda x: loss_fn(x).sum()))(logits)


def _logits_with_edge_cases(rng, shape):
  x = rng.normal(size=shape) * 3.0
  flat = x.reshape(-1)
  specials = [1.0, 0.0, -1.0, 1.0, 1e6, -1e6, 1e-7, -1e-7, 2.0, 1.0]
  idx = rng.choice(flat.size, size=len(specials), replace=False)
  flat[idx] = specials
  return flat.reshape(shape).astype(np.float32)


def test_values_match_float64_reference():
  rng = np.random.default_rng(0)
  logits = _logits_with_edge_cases(rng, (4, 7, 11))
  labels = rng.integers(0, 11, size=(4, 7))
  labels[0, :3] = IGNORE_LABEL_ID
  out = stablemax_cross_entropy(jnp.asarray(logits), jnp.asarray(labels))
  assert out.dtype == jnp.float32 and out.shape == (4, 7)
  np.testing.assert_allclose(
      np.asarray(out), _ref_loss(logits, labels), rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(out)[0, :3] == 0.0)


@pytest.mark.parametrize("scale", [1e3, 1e10, 1e30])
def test_extreme_logits_finite_and_correct(scale):
  logits = np.array([[scale, -scale, 0.0, 1.0, -scale, scale / 2]], np.float32)
  logits_b = np.repeat(logits, 6, axis=0)  # One row per label choice.
  labels_b = np.arange(6)
  out = stablemax_cross_entropy(jnp.asarray(logits_b), jnp.asarray(labels_b))
  assert np.all(np.isfinite(np.asarray(out)))
  np.testing.assert_allclose(
      np.asarray(out), _ref_loss(logits_b, labels_b), rtol=1e-5, atol=1e-6)
  grad = _grad_of_sum(lambda x: stablemax_cross_entropy(x, labels_b),
                      jnp.asarray(logits_b))
  assert np.all(np.isfinite(np.asarray(grad)))
  np.testing.assert_allclose(np.asarray(grad), _ref_grad(logits_b, labels_b),
                             rtol=1e-5, atol=1e-7)


def test_log_stablemax_sums_to_one():
  rng = np.random.default_rng(1)
  logits = _logits_with_edge_cases(rng, (5, 9))
  p = np.exp(np.asarray(log_stablemax(jnp.asarray(logits)), np.float64))
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)


def _naive_loss(x, y):
  """Upstream's formula verbatim in float32 with a plain where."""
  s = jnp.where(x < 0, 1.0 / (1.0 - x + 1e-30), x + 1.0)
  logp = jnp.log(s / s.sum(-1, keepdims=True))
  return -jnp.take_along_axis(logp, y[..., None], -1)[..., 0]


def test_grad_finite_at_exactly_one():
  logits = np.array([[1.0, 0.5, -2.0, 0.0], [3.0, 1.0, 1.0, -0.5]], np.float32)
  labels = np.array([0, 2])
  # The measured upstream pitfall: a plain where gives NaN grads at 1.0.
  naive = _grad_of_sum(lambda x: _naive_loss(x, jnp.asarray(labels)),
                       jnp.asarray(logits))
  assert np.isnan(np.asarray(naive)).any()

  grad = _grad_of_sum(lambda x: stablemax_cross_entropy(x, labels),
                      jnp.asarray(logits))
  grad = np.asarray(grad)
  assert np.all(np.isfinite(grad))
  np.testing.assert_allclose(grad, _ref_grad(logits, labels), rtol=1e-5,
                             atol=1e-7)


def test_grad_matches_reference_and_finite_differences():
  rng = np.random.default_rng(2)
  logits = _logits_with_edge_cases(rng, (3, 5, 8))
  logits[np.abs(logits) > 1e3] = 0.5  # Keep finite differences meaningful.
  labels = rng.integers(0, 8, size=(3, 5))
  labels[1, 2] = IGNORE_LABEL_ID
  grad = np.asarray(_grad_of_sum(
      lambda x: stablemax_cross_entropy(x, labels), jnp.asarray(logits)))
  ref = _ref_grad(logits, labels)
  np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-7)

  # Cross-check the analytic reference with central differences in float64,
  # away from the kink-free but branch-switching point x = 0.
  x64 = logits.astype(np.float64)
  h = 1e-6
  fd = np.zeros_like(x64)
  for i in np.ndindex(x64.shape):
    if abs(x64[i]) < 10 * h:
      fd[i] = ref[i]
      continue
    xp, xm = x64.copy(), x64.copy()
    xp[i] += h
    xm[i] -= h
    fd[i] = (_ref_loss(xp, labels).sum()
             - _ref_loss(xm, labels).sum()) / (2 * h)
  np.testing.assert_allclose(ref, fd, rtol=1e-5, atol=1e-7)


def test_ignored_rows_zero_loss_and_grad():
  logits = jnp.asarray(
      np.array([[[1.0, 2.0, -3.0], [1.0, 1.0, 1.0]]], np.float32))
  labels = jnp.asarray(np.array([[IGNORE_LABEL_ID, 1]]))
  loss = stablemax_cross_entropy(logits, labels)
  assert float(loss[0, 0]) == 0.0
  np.testing.assert_allclose(float(loss[0, 1]), np.log(3.0), rtol=1e-6)
  grad = _grad_of_sum(lambda x: stablemax_cross_entropy(x, labels), logits)
  assert np.all(np.asarray(grad)[0, 0] == 0.0)
  assert np.all(np.isfinite(np.asarray(grad)))


def test_custom_ignore_index_and_bf16_input():
  logits = jnp.asarray(np.array([[0.5, 1.0, -1.0]] * 2), jnp.bfloat16)
  labels = jnp.asarray(np.array([1, 7]))
  loss = stablemax_cross_entropy(logits, labels, ignore_index=7)
  assert loss.dtype == jnp.float32
  ref = _ref_loss(np.asarray(logits, np.float32), np.array([1, 7]), 7)
  np.testing.assert_allclose(np.asarray(loss), ref, rtol=1e-6)
  grad = _grad_of_sum(
      lambda x: stablemax_cross_entropy(x, labels, ignore_index=7), logits)
  assert np.all(np.isfinite(np.asarray(grad, np.float32)))


def test_jit():
  rng = np.random.default_rng(3)
  logits = jnp.asarray(_logits_with_edge_cases(rng, (2, 6, 10)))
  labels = jnp.asarray(rng.integers(0, 10, size=(2, 6)))
  eager = stablemax_cross_entropy(logits, labels)
  jitted = jax.jit(stablemax_cross_entropy)(logits, labels)
  np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-6)
