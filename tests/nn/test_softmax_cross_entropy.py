"""softmax_cross_entropy: optax's values, autodiff's gradient in one pass."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from trm.nn import losses


def _case(dtype, shape=(3, 5), vocab=40):
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  logits = (4.0 * jax.random.normal(k1, shape + (vocab,))).astype(dtype)
  labels = jax.random.randint(k2, shape, 0, vocab)
  weights = jax.random.uniform(k3, shape).at[0, 0].set(0.0)  # one ignored
  return logits, labels, weights


def _reference(logits, labels, weights):
  return jnp.sum(weights * optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels))


def _ours(logits, labels, weights):
  return jnp.sum(weights * losses.softmax_cross_entropy(logits, labels))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_are_optax_on_float32_logits(dtype):
  logits, labels, _ = _case(dtype)
  ours = losses.softmax_cross_entropy(logits, labels)
  assert ours.dtype == jnp.float32
  np.testing.assert_array_equal(
      ours, optax.softmax_cross_entropy_with_integer_labels(
          logits.astype(jnp.float32), labels))


def test_float32_gradient_is_autodiffs():
  logits, labels, weights = _case(jnp.float32)
  ours = jax.jit(jax.grad(_ours))(logits, labels, weights)
  want = jax.grad(_reference)(logits, labels, weights)
  np.testing.assert_allclose(ours, want, rtol=0, atol=1e-6)
  assert not np.any(ours[0, 0])  # weight 0: no gradient


def test_bfloat16_gradient_is_autodiffs_rounded_once():
  logits, labels, weights = _case(jnp.bfloat16)
  ours = jax.grad(_ours)(logits, labels, weights)
  assert ours.dtype == jnp.bfloat16
  # Autodiff through the float32 upcast, rounded to bf16 at the end.
  want = jax.grad(lambda x: _reference(x, labels, weights))(
      logits.astype(jnp.float32)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(ours, np.float32),
                                np.asarray(want, np.float32))


def test_backward_has_no_scatter_and_one_pass_over_the_vocabulary():
  logits, labels, weights = _case(jnp.bfloat16, shape=(8, 16), vocab=512)
  text = jax.jit(jax.grad(_ours)).lower(logits, labels, weights).as_text()
  assert "scatter" not in text
  reference = jax.jit(jax.grad(lambda x: _reference(x, labels, weights))
                      ).lower(logits).as_text()
  assert "scatter" in reference  # what the written-out backward avoids
