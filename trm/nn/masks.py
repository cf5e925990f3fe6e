"""Boolean attention masks (True = may attend), broadcastable to the scores
[B, H, Lq, Lk] of `trm.nn.attention.dot_product_attention`."""
from __future__ import annotations

import jax.numpy as jnp


def causal(q_len: int, kv_len: int, offset=0):
  """[q_len, kv_len]: query i (at absolute position offset + i) sees keys at
  positions <= its own. `offset` may be traced (decoding with a cache)."""
  q_pos = offset + jnp.arange(q_len, dtype=jnp.int32)
  return jnp.arange(kv_len, dtype=jnp.int32)[None, :] <= q_pos[:, None]


def key_padding(key_mask):
  """key_mask [B, Lk] (True = real token) -> [B, 1, 1, Lk]: every query
  sees the real keys."""
  return key_mask[:, None, None, :]


def pairs(token_mask):
  """token_mask [B, L] -> [B, 1, L, L]: pairs (i, j) of real tokens."""
  m = token_mask.astype(bool)
  return m[:, None, :, None] & m[:, None, None, :]
