"""Masked-diffusion SFT objective against a direct numpy computation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.families.dream import loss as diffusion_loss


def _reference(hidden, kernel, tokens, masked, t):
  """Full logits, explicit shift, float64."""
  logits = np.einsum("bld,dv->blv", hidden.astype(np.float64), kernel)
  total, count = 0.0, 0
  for b in range(tokens.shape[0]):
    for j in range(1, tokens.shape[1]):
      if masked[b, j]:
        row = logits[b, j - 1]
        log_z = np.log(np.sum(np.exp(row - row.max()))) + row.max()
        total += (log_z - row[tokens[b, j]]) / t[b]
        count += 1
  return total / max(count, 1), count


@pytest.mark.parametrize("chunk_size", [4, 5, 64])
def test_loss_matches_reference(chunk_size):
  rng = np.random.default_rng(0)
  b, length, d, v = 3, 13, 8, 50
  hidden = rng.normal(size=(b, length, d)).astype(np.float32)
  kernel = rng.normal(size=(d, v)).astype(np.float32)
  tokens = rng.integers(0, v, (b, length)).astype(np.int32)
  masked = rng.random((b, length)) < 0.5
  t = np.array([0.2, 0.5, 0.9], np.float32)
  loss, count = jax.jit(
      lambda h: diffusion_loss.shifted_masked_loss(
          h, kernel, lambda x, k: x @ k, tokens, masked, t, chunk_size))(hidden)
  expected, expected_count = _reference(hidden, kernel, tokens, masked, t)
  assert int(count) == expected_count == masked[:, 1:].sum()
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)


def test_no_masked_token_gives_zero_and_finite_gradient():
  hidden = jnp.ones((2, 6, 4))
  kernel = jnp.ones((4, 7))
  masked = jnp.zeros((2, 6), bool)
  loss_fn = lambda h: diffusion_loss.shifted_masked_loss(
      h, kernel, lambda x, k: x @ k, jnp.zeros((2, 6), jnp.int32), masked,
      jnp.array([0.5, 0.5]), 4)[0]
  assert float(loss_fn(hidden)) == 0.0
  assert np.all(np.isfinite(jax.grad(loss_fn)(hidden)))


def test_gradient_matches_full_logits_loss():
  """Gradients of the hidden states and of the head's weights."""
  rng = np.random.default_rng(1)
  hidden = jnp.asarray(rng.normal(size=(2, 9, 6)), jnp.float32)
  kernel = jnp.asarray(rng.normal(size=(6, 11)), jnp.float32)
  tokens = jnp.asarray(rng.integers(0, 11, (2, 9)), jnp.int32)
  masked = jnp.asarray(rng.random((2, 9)) < 0.6)
  t = jnp.array([0.3, 0.7])

  def direct(h, k):
    logits = (h @ k)[:, :-1]
    ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
        logits, tokens[:, 1:, None], -1)[..., 0]
    w = masked[:, 1:] / t[:, None]
    return jnp.sum(w * ce) / jnp.maximum(masked[:, 1:].sum(), 1)

  chunked = lambda h, k: diffusion_loss.shifted_masked_loss(
      h, k, lambda x, k: x @ k, tokens, masked, t, 3)[0]
  for got, want in zip(jax.grad(chunked, (0, 1))(hidden, kernel),
                       jax.grad(direct, (0, 1))(hidden, kernel)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_noise_masks_only_maskable_tokens_at_rate_t():
  tokens = jnp.arange(4 * 2000).reshape(4, 2000) % 97
  maskable = jnp.arange(2000)[None, :] >= 500  # prompt = first 500 tokens
  maskable = jnp.broadcast_to(maskable, tokens.shape)
  noisy, masked, t = diffusion_loss.add_noise(
      jax.random.PRNGKey(0), tokens, maskable, mask_token_id=999, eps=1e-3)
  assert not np.any(np.asarray(masked)[:, :500])
  np.testing.assert_array_equal(np.asarray(noisy)[:, :500],
                                np.asarray(tokens)[:, :500])
  assert np.all(np.asarray(noisy)[np.asarray(masked)] == 999)
  assert np.all((np.asarray(t) >= 1e-3) & (np.asarray(t) <= 1.0))
  rates = np.asarray(masked)[:, 500:].mean(axis=1)
  np.testing.assert_allclose(rates, np.asarray(t), atol=0.05)
