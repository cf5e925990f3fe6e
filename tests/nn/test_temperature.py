"""Logits over a sampling temperature (trm.nn.temperature)."""
import jax.numpy as jnp
import numpy as np

from trm.nn import temperature


def test_only_an_overflowing_row_is_shifted():
  """A row whose quotient stays finite keeps the plain division bit for bit
  (the reference's bfloat16 rounding, which shifting would change); a row
  that overflows keeps its likeliest token at 0 and the rest at -inf."""
  logits = jnp.array([[0.3, -1.7, 2.9, 1.1], [1.0, 50.0, -2.0, 0.0]],
                     jnp.bfloat16)
  t = jnp.asarray(1e-37, jnp.bfloat16)
  got = np.asarray(temperature.divide_unless_overflow(logits, t), np.float32)
  np.testing.assert_array_equal(got[0], np.asarray(logits[0] / t, np.float32))
  assert got[1, 1] == 0 and np.all(np.isneginf(got[1, [0, 2, 3]]))
  # No row overflows: the plain quotient.
  np.testing.assert_array_equal(
      np.asarray(temperature.divide_unless_overflow(logits, 0.7), np.float32),
      np.asarray(logits / 0.7, np.float32))


def test_a_masked_logit_stays_minus_inf_at_a_huge_temperature():
  """jit divides by the temperature as a product with its reciprocal, which
  1e38 flushes to 0: a masked id's -inf became -inf x 0 = NaN, and
  trm.sample --temperature=1e38 drew ids past its tokenizer's (exit 2,
  'Token id 8 is outside the 8-character vocabulary')."""
  import jax  # pylint: disable=g-import-not-at-top
  logits = jnp.array([[0.5, -1.0, 2.0, -jnp.inf]], jnp.float32)
  for t in (1e38, 3e38, 1.0):
    got = np.asarray(jax.jit(temperature.shift_and_divide)(
        logits, jnp.float32(t)))
    assert not np.isnan(got).any(), (t, got)
    assert np.isneginf(got[0, 3]) and got[0, 2] == 0, (t, got)
