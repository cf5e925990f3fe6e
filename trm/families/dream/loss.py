"""Masked-diffusion fine-tuning objective (DiffuCoder / DiffuLLaMA recipe).

Per sequence t ~ U(eps, 1); every maskable (response) token is replaced by the
mask token with probability t; the model sees the noisy sequence and is
trained with cross-entropy on the masked tokens, weighted 1/t, normalised by
the number of masked tokens in the batch:

  loss = sum_{b,j} [masked_bj] / t_b * CE(logits_b,j-1, x_bj) / sum [masked]

Dream keeps the autoregressive alignment of its Qwen initialisation: the
prediction for token j comes from the model's output at position j-1 (the
"logit shift"). Logits are computed chunk by chunk over the sequence from the
final hidden states, so the [B, L, 152064] tensor never exists at once, and
from one copy of the LM head gathered before the chunks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from trm.nn import chunked_loss


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


def shifted_masked_loss(hidden, table, logits_fn, tokens, masked, t,
                        chunk_size: int = 512, num_scored=None,
                        grad_axes=None, reduce_once: bool = False,
                        gather_fn=None):
  """1/t-weighted CE on masked tokens, predicted from the previous position.

  `hidden` [B, L, D] are the final hidden states of the noisy sequence;
  `logits_fn(h [B, C, D], table) -> [B, C, V]` applies the LM head whose
  weights are `table` (`model.head_kernel` and `model.head_logits`), read
  through `gather_fn` (`model.gather_head`) once for all the chunks
  (`trm.nn.chunked_loss`; `grad_axes`: the table's logical axes, the
  layout its gradient is summed into; `reduce_once`: summed over the batch
  devices once instead). Returns
  (loss, number of masked tokens); a batch with no masked token gives 0.
  `num_scored`: the masked tokens of the whole batch these rows are part of
  (a micro-batch's), which the sum is divided by instead of their own, so
  the micro-batches' losses sum to the whole batch's.
  """
  # Hidden j predicts token j + 1: the targets move left, not the hidden
  # states, whose length stays a multiple of the chunk. The last position
  # predicts nothing, and neither does an unmasked one.
  scored = jnp.pad(masked[:, 1:], ((0, 0), (0, 1)))
  targets = jnp.where(scored, jnp.pad(tokens[:, 1:], ((0, 0), (0, 1))), -1)
  weights = scored.astype(jnp.float32) / t[:, None]
  total, _ = chunked_loss.chunked_cross_entropy(
      hidden, table, targets, chunk_size, logits_fn, grad_axes=grad_axes,
      reduce_once=reduce_once, weights=weights, gather_fn=gather_fn)
  num_masked = masked[:, 1:].sum()
  if num_scored is None:
    num_scored = num_masked
  return total / jnp.maximum(num_scored, 1), num_masked
