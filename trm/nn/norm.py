"""RMS normalisation: statistics in float32, result in the input dtype.

`rms_norm` is the scale-free form (TRM's post-norm); `RMSNorm` multiplies by
a learned per-feature `scale` after casting back, in the input dtype
(Qwen2's / Dream's pre-norm). `inv_rms` is the shared statistic, also used
by TRM's fused SwiGLU + norm.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from trm.nn import linear


def inv_rms(x32, eps: float, axis: int = -1):
  """1 / sqrt(mean(x^2) + eps) over `axis` (kept), for float32 `x32`."""
  return jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=axis, keepdims=True)
                       + eps)


def add_rms_norm(x, m, eps: float, axis: int = -1):
  """(y, 1/rms): the scale-free RMSNorm of the residual sum x + m (rounded
  to x's dtype, then normalised in float32 over `axis`), y in x's dtype."""
  r = (x + m).astype(jnp.float32)
  inv = inv_rms(r, eps, axis)
  return (r * inv).astype(x.dtype), inv


def rms_norm_grad(y, dy, inv, axis: int = -1):
  """The scale-free RMSNorm's input gradient from its output y, 1/rms and
  dy, in float32: inv * (dy - y * mean(dy * y)) over `axis`."""
  y32, dy32 = y.astype(jnp.float32), dy.astype(jnp.float32)
  return inv * (dy32 - y32 * jnp.mean(dy32 * y32, axis=axis, keepdims=True))


def rms_norm(x, eps: float):
  """Scale-free RMSNorm over the last axis, computed in float32."""
  x32 = x.astype(jnp.float32)
  return (x32 * inv_rms(x32, eps)).astype(x.dtype)


class RMSNorm(nn.Module):
  """rms_norm(x) * scale, the product in x's dtype (scale cast down to it).

  One parameter, `scale` [features], initialised to ones, stored in
  `param_dtype`, with logical axes `axes`.
  """
  eps: float
  param_dtype: Any = jnp.float32
  axes: tuple[str | None, ...] = ("embed",)

  @nn.compact
  def __call__(self, x):
    scale = linear.logical_param(self, "scale", nn.initializers.ones,
                                 self.axes, (x.shape[-1],), self.param_dtype)
    return rms_norm(x, self.eps) * scale.astype(x.dtype)
