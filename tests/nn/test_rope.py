"""trm.nn.rope against a numpy rotation of (first half, second half) pairs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.nn import rope


def test_inverse_frequencies():
  for on_host in (True, False):
    inv = np.asarray(rope.inverse_frequencies(16, 10000.0, on_host=on_host))
    assert inv.dtype == np.float32 and inv.shape == (8,)
    np.testing.assert_allclose(
        inv, 10000.0 ** (-np.arange(0, 16, 2) / 16.0), rtol=1e-6)
  # The host path is numpy's float32 power of float32 exponents, exactly.
  exps = np.arange(0, 16, 2).astype(np.float32) / np.float32(16)
  np.testing.assert_array_equal(
      rope.inverse_frequencies(16, 1e6),
      np.float32(1.0) / (np.float32(1e6) ** exps))


def test_cos_sin_shapes_dtype_and_values():
  pos = jnp.array([[0, 1, 2], [5, 6, 7]])
  inv = rope.inverse_frequencies(8, 100.0)
  cos, sin = rope.cos_sin(pos, inv, jnp.bfloat16)
  assert cos.shape == sin.shape == (2, 3, 8) and cos.dtype == jnp.bfloat16
  cos, sin = rope.cos_sin(pos, inv)
  ang = np.asarray(pos, np.float64)[..., None] * np.asarray(inv, np.float64)
  ang = np.concatenate([ang, ang], -1)
  np.testing.assert_allclose(cos, np.cos(ang), atol=1e-5)
  np.testing.assert_allclose(sin, np.sin(ang), atol=1e-5)


def test_rotate_half():
  x = jnp.arange(6.0)
  np.testing.assert_array_equal(rope.rotate_half(x), [-3, -4, -5, 0, 1, 2])


@pytest.mark.parametrize("batched_tables", [False, True])
def test_apply_rope_rotates_pairs(batched_tables):
  b, l, h, k = 2, 5, 3, 8
  x = jax.random.normal(jax.random.key(0), (b, l, h, k))
  pos = jnp.broadcast_to(jnp.arange(l), (b, l)) if batched_tables else (
      jnp.arange(l))
  cos, sin = rope.cos_sin(pos, rope.inverse_frequencies(k, 50.0))
  got = np.asarray(rope.apply_rope(x, cos, sin))
  # Pair (x_i, x_{i+k/2}) rotated by angle pos * inv_freq_i.
  xn = np.asarray(x, np.float64)
  ang = np.arange(l)[:, None] * 50.0 ** (-np.arange(0, k, 2) / k)
  c, s = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
  x1, x2 = xn[..., :k // 2], xn[..., k // 2:]
  want = np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], -1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got[:, 0], np.asarray(x[:, 0]), atol=1e-6)
