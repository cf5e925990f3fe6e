"""Dot-product attention with float32 scores and softmax, and the GQA
key/value repeat. Dream and GPT share this core; their projections, cache
handling and (for Dream) the Pallas splash path stay in the families.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def repeat_kv(x, groups: int):
  """[B, L, KV, K] -> [B, L, KV * groups, K]; q-head n reads kv-head n // g."""
  return jnp.repeat(x, groups, axis=2)


def dot_product_attention(q, k, v, mask=None, *, probs_dtype=None,
                          dropout=None, heads_major: bool = False):
  """softmax(q k^T / sqrt(D)) v.

  q [B, T, H, D], k/v [B, S, H, D] (as many heads as q: `repeat_kv` first
  for GQA) -> [B, T, H, D]. The scores accumulate in float32 and are scaled,
  masked and normalised in float32; mask (broadcastable to [B, H, T, S],
  True = attend, None = all) puts finfo.min, not -inf, so a row with nothing
  to attend to stays finite (uniform). `dropout`, if given, is applied to
  the float32 probabilities (torch sdpa's dropout_p); they are then cast to
  `probs_dtype` (default v's dtype) for the product with v.

  heads_major: run both products on [B, H, L, D] operands (transposed in and
  out). The same sums; XLA:CPU runs these batched products several times
  faster at Dream's shapes, while GPT keeps the [B, L, H, D] contraction its
  numerics were fixed with.
  """
  scale = jnp.float32(1.0 / math.sqrt(q.shape[-1]))
  if heads_major:
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))
    scores = jnp.einsum("bhqk,bhsk->bhqs", q, k,
                        preferred_element_type=jnp.float32)
  else:
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                        preferred_element_type=jnp.float32)
  scores = scores * scale
  if mask is not None:
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  if dropout is not None:
    probs = dropout(probs)
  probs = probs.astype(v.dtype if probs_dtype is None else probs_dtype)
  if heads_major:
    return jnp.swapaxes(jnp.einsum("bhqs,bhsk->bhqk", probs, v), 1, 2)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v)
