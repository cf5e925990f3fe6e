"""Masked-diffusion fine-tuning objective (DiffuCoder / DiffuLLaMA recipe).

Per sequence t ~ U(eps, 1); every maskable (response) token is replaced by the
mask token with probability t; the model sees the noisy sequence and is
trained with cross-entropy on the masked tokens, weighted 1/t, normalised by
the number of masked tokens in the batch:

  loss = sum_{b,j} [masked_bj] / t_b * CE(logits_b,j-1, x_bj) / sum [masked]

Dream keeps the autoregressive alignment of its Qwen initialisation: the
prediction for token j comes from the model's output at position j-1 (the
"logit shift"). Logits are computed chunk by chunk over the sequence from the
final hidden states, so the [B, L, 152064] tensor never exists at once.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from trm.nn import losses


def add_noise(rng, tokens, maskable, mask_token_id: int, eps: float = 1e-3):
  """Returns (noisy tokens, masked [B, L] bool, t [B] float32)."""
  t_key, mask_key = jax.random.split(rng)
  t = (1.0 - eps) * jax.random.uniform(t_key, (tokens.shape[0],)) + eps
  masked = maskable & (jax.random.uniform(mask_key, tokens.shape) < t[:, None])
  return jnp.where(masked, mask_token_id, tokens), masked, t


def add_noise_per_row(keys, tokens, maskable, mask_token_id: int,
                      eps: float = 1e-3):
  """`add_noise` with row b's t and mask drawn from keys[b] [B] alone, so a
  row's noise does not depend on the batch it sits in."""
  noisy, masked, t = jax.vmap(
      lambda key, x, m: add_noise(key, x[None], m[None], mask_token_id, eps)
  )(keys, tokens, maskable)
  return noisy[:, 0], masked[:, 0], t[:, 0]


def shifted_masked_loss(hidden, logits_fn, tokens, masked, t,
                        chunk_size: int = 512, num_scored=None):
  """1/t-weighted CE on masked tokens, predicted from the previous position.

  `hidden` [B, L, D] are the final hidden states of the noisy sequence;
  `logits_fn(h [B, C, D]) -> [B, C, V]` applies the LM head. Returns
  (loss, number of masked tokens); a batch with no masked token gives 0.
  `num_scored`: the masked tokens of the whole batch these rows are part of
  (a micro-batch's), which the sum is divided by instead of their own, so
  the micro-batches' losses sum to the whole batch's.
  """
  # Position j's target is predicted from hidden j-1; position 0 has none.
  inputs = hidden[:, :-1]
  targets = tokens[:, 1:]
  weights = masked[:, 1:].astype(jnp.float32) / t[:, None]
  length = inputs.shape[1]
  pad = -length % chunk_size
  if pad:
    inputs = jnp.pad(inputs, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    weights = jnp.pad(weights, ((0, 0), (0, pad)))
  chunks = inputs.shape[1] // chunk_size

  def split(x):  # [B, chunks * C, ...] -> [chunks, B, C, ...]
    x = x.reshape((x.shape[0], chunks, chunk_size) + x.shape[2:])
    return jnp.moveaxis(x, 1, 0)

  @jax.checkpoint  # recompute each chunk's logits in the backward pass
  def chunk_loss(h, y, w):
    return jnp.sum(w * losses.softmax_cross_entropy(logits_fn(h), y))

  def body(total, xs):
    return total + chunk_loss(*xs), None

  total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32),
                          (split(inputs), split(targets), split(weights)))
  num_masked = masked[:, 1:].sum()
  if num_scored is None:
    num_scored = num_masked
  return total / jnp.maximum(num_scored, 1), num_masked
