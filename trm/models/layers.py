"""Building blocks shared by the recursive models, faithful to upstream TRM.

Parameters are float32 and annotated with logical axis names; compute runs in
`dtype` (bfloat16 by default) with weights cast down at use, as upstream's
CastedLinear does. Normalisation and RoPE run in float32.
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trm import mesh as mesh_lib

# Std of a standard normal truncated to [-2, 2]; dividing by it makes the
# truncated draw have exactly the requested std (upstream trunc_normal_init_).
_TRUNC_STD = 0.87962566103423978


def trunc_normal(std: float):
  """Truncated normal (±2 of the underlying normal) whose true std is `std`."""

  def init(key, shape, dtype=jnp.float32):
    if std == 0:
      return jnp.zeros(shape, dtype)
    draw = jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
    return (draw * (std / _TRUNC_STD)).astype(dtype)

  return init


def lecun_trunc_normal(fan_in: int):
  return trunc_normal(1.0 / math.sqrt(fan_in))


def rms_norm(x, eps: float):
  """Scale-free RMSNorm over the last axis, computed in float32."""
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
                            + eps)
  return x32.astype(x.dtype)


def find_multiple(a: int, b: int) -> int:
  return -(a // -b) * b


def swiglu_width(hidden_size: int, expansion: float) -> int:
  # Python's round (banker's rounding) as upstream: 512 -> 1536, 97 -> 512.
  return find_multiple(round(expansion * hidden_size * 2 / 3), 256)


class Linear(nn.Module):
  """y = x W (+ b) with fp32 LeCun truncated-normal W cast to `dtype`."""
  features: int
  axes: tuple[str | None, str | None]
  use_bias: bool = False
  dtype: jnp.dtype = jnp.bfloat16
  kernel_init: object = None
  bias_init: object = nn.initializers.zeros

  @nn.compact
  def __call__(self, x):
    fan_in = x.shape[-1]
    init = self.kernel_init or lecun_trunc_normal(fan_in)
    kernel = self.param("kernel", nn.with_logical_partitioning(init, self.axes),
                        (fan_in, self.features), jnp.float32)
    y = jnp.dot(x.astype(self.dtype), kernel.astype(self.dtype))
    if self.use_bias:
      bias = self.param("bias",
                        nn.with_logical_partitioning(self.bias_init,
                                                     (self.axes[1],)),
                        (self.features,), jnp.float32)
      y = y + bias.astype(self.dtype)
    return y


class Embed(nn.Module):
  """fp32 table with truncated-normal init; lookups are cast to `dtype`."""
  num_embeddings: int
  features: int
  init_std: float
  axes: tuple[str, str] = ("vocab", "embed")
  dtype: jnp.dtype = jnp.bfloat16

  @nn.compact
  def __call__(self, ids):
    table = self.param(
        "embedding",
        nn.with_logical_partitioning(trunc_normal(self.init_std), self.axes),
        (self.num_embeddings, self.features), jnp.float32)
    return jnp.take(table, ids, axis=0).astype(self.dtype)


def rope_tables(positions: int, head_dim: int, theta: float):
  """cos/sin tables [positions, head_dim], halves repeated (non-interleaved)."""
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32)
                              / head_dim))
  freqs = jnp.outer(jnp.arange(positions, dtype=jnp.float32), inv_freq)
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
  """Rotates [B, S, H, D] by the 'rotate_half' convention, in float32."""
  x32 = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  out = x32 * cos[:, None, :] + rotated * sin[:, None, :]
  return out.astype(x.dtype)


class Attention(nn.Module):
  """Non-causal multi-head attention with fused [q | k | v] projection."""
  hidden_size: int
  num_heads: int
  num_kv_heads: int
  dtype: jnp.dtype = jnp.bfloat16

  @nn.compact
  def __call__(self, x, rope=None):
    batch, seq, _ = x.shape
    head_dim = self.hidden_size // self.num_heads
    heads = self.num_heads + 2 * self.num_kv_heads
    qkv = Linear(heads * head_dim, ("embed", "heads"), dtype=self.dtype,
                 name="qkv_proj")(x)
    qkv = qkv.reshape(batch, seq, heads, head_dim)
    q = qkv[:, :, :self.num_heads]
    k = qkv[:, :, self.num_heads:self.num_heads + self.num_kv_heads]
    v = qkv[:, :, self.num_heads + self.num_kv_heads:]
    if rope is not None:
      q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q = mesh_lib.constrain(q, ("activation_batch", "activation_length",
                               "activation_heads", None))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=False)
    out = out.reshape(batch, seq, self.num_heads * head_dim)
    return Linear(self.hidden_size, ("heads", "embed"), dtype=self.dtype,
                  name="o_proj")(out)


class SwiGLU(nn.Module):
  """down(silu(gate) * up), gate = first half of the fused projection."""
  hidden_size: int
  expansion: float
  dtype: jnp.dtype = jnp.bfloat16
  # Logical names of (model width, inner width); the token-mixing MLP of the
  # mlp_t variant acts on the sequence axis and uses different names.
  axes: Sequence[str] = ("embed", "mlp")

  @nn.compact
  def __call__(self, x):
    inter = swiglu_width(self.hidden_size, self.expansion)
    outer, inner = self.axes
    gate_up = Linear(2 * inter, (outer, inner), dtype=self.dtype,
                     name="gate_up_proj")(x)
    gate, up = jnp.split(gate_up, 2, axis=-1)
    return Linear(self.hidden_size, (inner, outer), dtype=self.dtype,
                  name="down_proj")(nn.silu(gate) * up)
