"""Dot-product attention with float32 scores and softmax, and the GQA
key/value repeat. Dream and GPT share this core; their projections, cache
handling and (for Dream) the Pallas splash path stay in the families.

`cudnn_attention` is the GPU alternative (`config.model.attention='cudnn'`):
cuDNN's fused flash attention through `jax.nn.dot_product_attention`, which
keeps no [B, H, T, S] scores in device memory. It runs on NVIDIA GPUs only;
elsewhere `check_cudnn` refuses it in one line naming the config field.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from trm.nn import platform as platform_lib

# Attention kernels for NVIDIA GPUs only (the TPU kernels are in
# trm.nn.tpu_attention).
GPU_KINDS = ("cudnn",)
# What cuDNN's flash attention takes (jax._src.cudnn's checks; 256 on
# Hopper and later, 128 before).
CUDNN_DTYPES = ("bfloat16", "float16")
CUDNN_MAX_HEAD_DIM = 256


def check_cudnn_config(*, dtype: str, head_dim: int,
                       prefix: str = "config.model.",
                       dtype_field: str = "dtype") -> None:
  """A config asking for attention='cudnn' with a dtype or head size that
  cuDNN's flash attention does not take: one line naming the field
  (`dtype_field`: the family's name for its compute dtype)."""
  if dtype not in CUDNN_DTYPES:
    raise ValueError(
        f"{prefix}attention='cudnn' computes in bfloat16 or float16, not "
        f"{prefix}{dtype_field}={dtype!r}: set it or use attention='dot'.")
  if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
    raise ValueError(
        f"{prefix}attention='cudnn' needs a head dim that is a multiple of 8 "
        f"and at most {CUDNN_MAX_HEAD_DIM}, got {head_dim}: use "
        "attention='dot'.")


def check_cudnn(platform: str | None = None,
                field: str = "config.model.attention") -> None:
  """cuDNN attention on devices other than NVIDIA GPUs fails here, in one
  line naming the field (`platform`: default the active mesh's, else the
  default backend's)."""
  platform = platform or platform_lib.current()
  if platform not in platform_lib.GPU_PLATFORMS:
    raise ValueError(
        f"{field}='cudnn' runs on NVIDIA GPUs only (cuDNN flash attention), "
        f"and this run's devices are {platform}: use 'dot'.")


def cudnn_attention(q, k, v, mask=None, *, causal: bool = False):
  """softmax(q k^T / sqrt(D)) v in cuDNN's fused flash attention.

  q [B, T, H, D], k/v [B, S, KV, D] with H a multiple of KV (GQA without
  the repeat: query head n reads key/value head n // (H / KV)), bfloat16 or
  float16 -> [B, T, H, D]. `mask` (broadcastable to [B, 1, T, S], True =
  attend) becomes an additive bias of large negatives (JAX's cuDNN path);
  `causal`: query i sees keys <= i (T == S). The softmax runs in float32
  inside the kernel.
  """
  check_cudnn()
  if mask is not None:
    mask = jnp.broadcast_to(mask, (q.shape[0], 1, q.shape[1], k.shape[1]))
  return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=causal,
                                      implementation="cudnn")


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
