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


@pytest.mark.parametrize("vocab", [1, 40, 50304])
def test_one_pass_log_sum_exp_is_logsumexp(vocab):
  # The GPU's one-read logsumexp (a reduction of (max, sum) pairs), run on
  # the CPU directly: the CPU itself takes XLA's two passes.
  x = 30.0 * jax.random.normal(jax.random.key(1), (4, 3, vocab))
  x = x.at[0, 0, 0].set(-jnp.inf)  # a masked logit adds nothing
  x = x.at[0, 1].set(-jnp.inf)     # a fully masked row: -inf, as logsumexp
  ours = jax.jit(losses._log_sum_exp_one_pass)(x)  # pylint: disable=protected-access
  want = jax.nn.logsumexp(x, axis=-1)
  np.testing.assert_allclose(ours, want, rtol=2e-6)
  assert ours[0, 1] == -jnp.inf


def test_one_pass_log_sum_exp_is_chosen_for_gpus_only():
  logits, labels, _ = _case(jnp.float32)

  def variadic_reduces(fn):
    text = jax.jit(fn).lower(logits, labels).compile().as_text()
    return [line for line in text.splitlines()
            if "reduce(" in line and line.count("f32[3,5]") >= 2]

  # The CPU's program takes XLA's two passes; the one-pass form is a
  # reduction of pairs (what the GPU's program runs).
  assert not variadic_reduces(losses.softmax_cross_entropy)
  assert variadic_reduces(
      lambda x, y: losses._log_sum_exp_one_pass(x))  # pylint: disable=protected-access


def _smoothed_reference(logits, labels, smoothing, z_loss):
  """torch's cross_entropy(label_smoothing=s) per position, written out,
  plus MaxText's z_loss * logsumexp**2."""
  x = np.asarray(logits, np.float64)
  log_z = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
  log_p = x - log_z[..., None]
  target = (1 - smoothing) * np.eye(x.shape[-1])[np.asarray(labels)] + (
      smoothing / x.shape[-1])
  return -(target * log_p).sum(-1) + z_loss * log_z**2


def test_label_smoothing_and_z_loss_are_the_written_out_formula():
  smoothing, z_loss = 0.3, 0.1  # both terms at once: one compile, not three
  logits, labels, weights = _case(jnp.float32)
  want = _smoothed_reference(logits, labels, smoothing, z_loss)

  def direct(logits):  # autodiff of the same formula, for the gradient
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target = (1 - smoothing) * jax.nn.one_hot(labels, logits.shape[-1]) + (
        smoothing / logits.shape[-1])
    per_token = -(target * jax.nn.log_softmax(logits)).sum(-1)
    return jnp.sum(weights * (per_token + z_loss * log_z**2))

  def ours(logits):
    per_token = losses.softmax_cross_entropy(logits, labels, smoothing,
                                             z_loss)
    return jnp.sum(weights * per_token), per_token

  (_, got), grad = jax.jit(jax.value_and_grad(ours, has_aux=True))(logits)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(grad, jax.jit(jax.grad(direct))(logits),
                             atol=1e-6)
