"""trm.nn.attention against a numpy softmax attention."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.nn import attention
from trm.nn import masks


def _np_attention(q, k, v, mask):
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  s = np.where(np.broadcast_to(mask, s.shape), s, -1e30)
  p = np.exp(s - s.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhd->bqhd", p, v)


def _qkv(t=5, s=7):
  return [jax.random.normal(jax.random.key(i), (2, n, 3, 4))
          for i, n in enumerate((t, s, s))]


@pytest.mark.parametrize("heads_major", [False, True])
def test_matches_numpy_with_mask(heads_major):
  q, k, v = _qkv()
  mask = masks.causal(5, 7, 2)
  got = attention.dot_product_attention(q, k, v, mask,
                                        heads_major=heads_major)
  assert got.shape == (2, 5, 3, 4)
  np.testing.assert_allclose(got, _np_attention(q, k, v, np.asarray(mask)),
                             rtol=1e-5, atol=1e-5)
  none = attention.dot_product_attention(q, k, v, heads_major=heads_major)
  np.testing.assert_allclose(none, _np_attention(q, k, v, True),
                             rtol=1e-5, atol=1e-5)


def test_fully_masked_row_is_uniform_and_dtypes():
  q, k, v = _qkv()
  mask = np.ones((2, 1, 5, 7), bool)
  mask[0, 0, 1] = False
  got = attention.dot_product_attention(q, k, v, jnp.asarray(mask))
  np.testing.assert_allclose(got[0, 1], np.asarray(v[0]).mean(0), rtol=1e-5,
                             atol=1e-6)
  qb, kb, vb = (t.astype(jnp.bfloat16) for t in (q, k, v))
  assert attention.dot_product_attention(qb, kb, vb).dtype == jnp.bfloat16
  assert attention.dot_product_attention(
      qb, kb, vb, probs_dtype=jnp.float32).dtype == jnp.float32


def test_dropout_hook_sees_float32_probs():
  q, k, v = _qkv()
  seen = []

  def dropout(p):
    seen.append(p)
    return jnp.zeros_like(p)

  got = attention.dot_product_attention(q, k, v, dropout=dropout)
  assert seen[0].dtype == jnp.float32 and seen[0].shape == (2, 3, 5, 7)
  np.testing.assert_allclose(np.asarray(seen[0]).sum(-1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(got, 0.0)


def test_repeat_kv_reads_head_n_over_groups():
  x = jnp.arange(2 * 4.0).reshape(1, 1, 2, 4)
  y = attention.repeat_kv(x, 3)
  assert y.shape == (1, 1, 6, 4)
  for n in range(6):
    np.testing.assert_array_equal(y[0, 0, n], x[0, 0, n // 3])
