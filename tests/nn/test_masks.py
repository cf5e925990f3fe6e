"""trm.nn.masks against numpy."""
import jax.numpy as jnp
import numpy as np

from trm.nn import masks


def test_causal_square_and_offset():
  np.testing.assert_array_equal(masks.causal(4, 4),
                                np.tril(np.ones((4, 4), bool)))
  got = masks.causal(2, 6, jnp.int32(3))
  want = np.arange(6)[None, :] <= (3 + np.arange(2))[:, None]
  np.testing.assert_array_equal(got, want)
  assert got[0].sum() == 4 and got[1].sum() == 5


def test_key_padding_and_pairs():
  m = np.array([[True, True, False], [False, True, True]])
  kp = masks.key_padding(jnp.asarray(m))
  assert kp.shape == (2, 1, 1, 3)
  np.testing.assert_array_equal(kp[:, 0, 0], m)
  pairs = masks.pairs(jnp.asarray(m.astype(np.int32)))
  assert pairs.shape == (2, 1, 3, 3) and pairs.dtype == jnp.bool_
  np.testing.assert_array_equal(pairs[:, 0], m[:, :, None] & m[:, None, :])
