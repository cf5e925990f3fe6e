"""Rotary position embeddings, rotate-half convention (halves, not
interleaved pairs), as Llama/Qwen2 and TRM use them.

  inv = inverse_frequencies(head_dim, theta)       # [head_dim / 2] float32
  cos, sin = cos_sin(positions, inv, dtype)        # [..., head_dim]
  x = apply_rope(x, cos, sin)                      # x [B, L, H, head_dim]

`apply_rope` computes in the dtype it is given. The order in which the
terms are built is part of the numerics: autodiff sums the cotangents in
that order, and XLA:CPU's fusions round differently when it changes. TRM
builds them in another order, so it keeps its own apply_rope (on
`rotate_half`); see trm/families/trm/layers.py.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, theta: float, *, on_host: bool = True):
  """theta ** (-2i / head_dim) for i < head_dim / 2, float32.

  on_host=True evaluates the float32 power with numpy, once, as a constant
  (torch's float32 `base ** (arange / dim)` to the bit, on every backend);
  on_host=False traces it with jnp, whose power can differ from numpy's in
  the last bit for some (head_dim, theta): TRM's numerics are defined by it.
  """
  if on_host:
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32)
    return jnp.asarray(
        1.0 / (np.float32(theta) ** (exponents / np.float32(head_dim))),
        jnp.float32)
  return 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                          / head_dim))


def cos_sin(positions, inv_freq, dtype=jnp.float32):
  """cos/sin [..., 2 * len(inv_freq)] of positions [...] (any int or float),
  angles in float32, the halves repeated; cast to `dtype` at the end."""
  freqs = positions.astype(jnp.float32)[..., None] * inv_freq
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def rotate_half(x):
  """[x1, x2] -> [-x2, x1] along the last axis."""
  half = x.shape[-1] // 2
  return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, cos, sin):
  """x * cos + rotate_half(x) * sin, in the dtype of the operands.

  x [..., L, H, K]; cos/sin [..., L, K] (one table for all heads: a head
  axis is inserted before their last axis).
  """
  cos, sin = cos[..., None, :], sin[..., None, :]
  return x * cos + rotate_half(x) * sin
