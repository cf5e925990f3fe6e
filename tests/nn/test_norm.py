"""trm.nn.norm against a plain numpy RMSNorm."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.nn import norm


def _np_rms(x, eps, axis=-1):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, axis=axis, keepdims=True) + eps)


def test_rms_norm_matches_numpy_and_keeps_dtype():
  x = 3.0 * jax.random.normal(jax.random.key(0), (2, 5, 16)) + 1.0
  np.testing.assert_allclose(norm.rms_norm(x, 1e-5), _np_rms(x, 1e-5),
                             rtol=1e-5, atol=1e-6)
  xb = x.astype(jnp.bfloat16)
  yb = norm.rms_norm(xb, 1e-5)
  assert yb.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(yb, np.float32),
                             _np_rms(np.asarray(xb, np.float32), 1e-5),
                             rtol=1e-2, atol=1e-2)


def test_inv_rms_axis_and_eps():
  x = jax.random.normal(jax.random.key(1), (6, 4))
  got = norm.inv_rms(x, 0.5, axis=0)
  assert got.shape == (1, 4)
  want = 1.0 / np.sqrt(np.mean(np.square(np.asarray(x)), axis=0,
                               keepdims=True) + 0.5)
  np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rms_norm_module_param_and_scale(dtype):
  layer = norm.RMSNorm(1e-6, jnp.float32, axes=("embed",))
  x = jax.random.normal(jax.random.key(2), (3, 8)).astype(dtype)
  variables = layer.init(jax.random.key(0), x)
  boxed = variables["params"]["scale"]
  assert boxed.names == ("embed",)
  scale = nn.meta.unbox(boxed)
  assert scale.shape == (8,) and scale.dtype == jnp.float32
  np.testing.assert_array_equal(scale, np.ones(8))
  scale = jnp.arange(1.0, 9.0)
  y = layer.apply({"params": {"scale": scale}}, x)
  assert y.dtype == dtype
  # The product happens after the cast back, in x's dtype.
  want = norm.rms_norm(x, 1e-6) * scale.astype(dtype)
  np.testing.assert_array_equal(y, want)
  np.testing.assert_allclose(np.asarray(y, np.float32),
                             _np_rms(np.asarray(x, np.float32), 1e-6)
                             * np.arange(1.0, 9.0),
                             rtol=2e-2 if dtype == jnp.bfloat16 else 1e-5)
