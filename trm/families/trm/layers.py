"""Building blocks shared by the recursive models, faithful to upstream TRM.

Parameters are float32 and annotated with logical axis names; compute runs in
`dtype` (bfloat16 by default) with weights cast down at use, as upstream's
CastedLinear does. Normalisation and RoPE run in float32.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from trm.core import mesh as mesh_lib
from trm.families.trm import channel_gpu
from trm.families.trm import mlp_gpu
from trm.families.trm import mlp_tpu
from trm.nn import attention as attention_lib
from trm.nn import linear
from trm.nn import norm
from trm.nn import rope as rope_lib
from trm.nn import tpu_attention
# Re-exported: part of this module's interface (scale-free, float32 stats).
from trm.nn.norm import rms_norm  # noqa: F401

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


def find_multiple(a: int, b: int) -> int:
  return -(a // -b) * b


def swiglu_width(hidden_size: int, expansion: float) -> int:
  # Python's round (banker's rounding) as upstream: 512 -> 1536, 97 -> 512.
  return find_multiple(round(expansion * hidden_size * 2 / 3), 256)


def _linear_dot(x, w):
  """x @ w in x's dtype. The backward pass is nn.linear.matmul's: the
  weight gradient as (dy^T x)^T, which XLA:CPU runs without transposing (and
  recomputing) the activation gradient; same math as jnp.dot. On a GPU the
  matmul itself rounds (nn.linear.matmul_to)."""
  return linear.matmul_to(x, w, x.dtype)


class Linear(nn.Module):
  """y = x W (+ b) with fp32 LeCun truncated-normal W cast to `dtype`."""
  features: int
  axes: tuple[str | None, str | None]
  use_bias: bool = False
  dtype: jnp.dtype = jnp.bfloat16
  kernel_init: object = None
  bias_init: object = nn.initializers.zeros

  @nn.compact
  def __call__(self, x, widths: Sequence[int] | None = None):
    """y, or with `widths` the list of y's column blocks of those widths,
    each from its own matmul against that block of the kernel (no bias)."""
    fan_in = x.shape[-1]
    init = self.kernel_init or lecun_trunc_normal(fan_in)
    kernel = linear.logical_param(self, "kernel", init, self.axes,
                                  (fan_in, self.features), jnp.float32)
    x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
    if widths is not None:
      if self.use_bias or sum(widths) != self.features:
        raise ValueError(f"Linear({self.name}): column blocks {widths} of a "
                         f"{self.features}-wide kernel (bias "
                         f"{self.use_bias}) do not split it")
      return [_linear_dot(x_i, kernel[:, c])
              for x_i, c in linear.column_blocks(x, widths)]
    y = _linear_dot(x, kernel)
    if self.use_bias:
      bias = linear.logical_param(self, "bias", self.bias_init,
                                  (self.axes[1],), (self.features,),
                                  jnp.float32)
      # Added after the product is rounded to `dtype`: two roundings, not
      # nn.linear.add_bias's one (GPT's and Dream's projections).
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
    table = linear.logical_param(self, "embedding",
                                 trunc_normal(self.init_std), self.axes,
                                 (self.num_embeddings, self.features),
                                 jnp.float32)
    return jnp.take(table, ids, axis=0).astype(self.dtype)


def rope_tables(positions: int, head_dim: int, theta: float):
  """float32 cos/sin tables [positions, head_dim], halves repeated
  (non-interleaved); the frequencies are traced (jnp), as they always were."""
  return rope_lib.cos_sin(
      jnp.arange(positions, dtype=jnp.float32),
      rope_lib.inverse_frequencies(head_dim, theta, on_host=False))


def apply_rope(x, cos, sin):
  """Rotates [B, S, H, D] by the 'rotate_half' convention, in float32.

  Not nn.rope.apply_rope: the rotated half is built before the products
  here, which changes the gradients' last bits (see nn/rope.py).
  """
  x32 = x.astype(jnp.float32)
  rotated = rope_lib.rotate_half(x32)
  out = x32 * cos[:, None, :] + rotated * sin[:, None, :]
  return out.astype(x.dtype)


def splash_attention(q, k, v, interpret: bool):
  """jax.nn.dot_product_attention(q, k, v) (no mask, scale 1/sqrt(K)) as
  the Pallas splash kernel: the sequence padded to a multiple of 128 with
  the pad keys masked out, the pad rows dropped after."""
  seq, head_dim = q.shape[1], q.shape[-1]
  padded = -(-seq // 128) * 128
  pad = ((0, 0), (0, padded - seq), (0, 0), (0, 0))
  q = (q * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
  real = jnp.broadcast_to(jnp.arange(padded) < seq, (q.shape[0], padded))
  out = tpu_attention.splash_attention(
      jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad), real,
      interpret=interpret)
  return out[:, :seq]


class Attention(nn.Module):
  """Non-causal multi-head attention with fused [q | k | v] projection."""
  hidden_size: int
  num_heads: int
  num_kv_heads: int
  dtype: jnp.dtype = jnp.bfloat16
  # dot | splash (TPU) | splash_interpret (tpu_attention) | cudnn (GPU)
  kernel: str = "dot"

  @nn.compact
  def __call__(self, x, rope=None):
    batch, seq, _ = x.shape
    head_dim = self.hidden_size // self.num_heads
    heads = self.num_heads + 2 * self.num_kv_heads
    qkv_proj = Linear(heads * head_dim, ("embed", "heads"), dtype=self.dtype,
                      name="qkv_proj")
    if self.kernel == "cudnn":
      # On a GPU, three matmuls on the fused kernel's column blocks: the
      # same products, without the copies that split one [.., 3D] result
      # (and join the gradients) around cuDNN's attention. GPT's c_attn
      # measured 15.9 ms less per iteration this way on an H100.
      q, k, v = (a.reshape(batch, seq, -1, head_dim) for a in qkv_proj(
          x, [self.num_heads * head_dim] + [self.num_kv_heads * head_dim] * 2))
    else:
      qkv = qkv_proj(x).reshape(batch, seq, heads, head_dim)
      q = qkv[:, :, :self.num_heads]
      k = qkv[:, :, self.num_heads:self.num_heads + self.num_kv_heads]
      v = qkv[:, :, self.num_heads + self.num_kv_heads:]
    if rope is not None:
      q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q = mesh_lib.constrain(q, ("activation_batch", "activation_length",
                               "activation_heads", None))
    if self.kernel == "dot":
      out = jax.nn.dot_product_attention(q, k, v, is_causal=False)
    elif self.kernel == "cudnn":
      out = attention_lib.cudnn_attention(q, k, v)
    else:
      out = splash_attention(q, k, v, self.kernel == "splash_interpret")
    out = out.reshape(batch, seq, self.num_heads * head_dim)
    return Linear(self.hidden_size, ("heads", "embed"), dtype=self.dtype,
                  name="o_proj")(out)


def _dot(a, b, contract):
  """a . b contracting a's axis contract[0] with b's axis contract[1]."""
  return linear.dot(a, b, ((contract[0],), (contract[1],)))


def _dot_rows(a, b):
  """a^T b over every leading (row) axis of a and b: [..., P] x [..., Q]."""
  rows = tuple(range(a.ndim - 1))
  return linear.dot(a, b, (rows, rows))


def _swiglu_norm(x, w_in, w_out, eps, tokens):
  """Forward of `swiglu_residual_norm`; returns (y, residuals)."""
  # Token mixing multiplies from the left by the transposed (small) weights,
  # so that every dot reads both operands in their stored order.
  h = linear.dot(w_in.T, x) if tokens else linear.dot(x, w_in)
  axis = 0 if tokens else -1
  gate, up = jnp.split(h, 2, axis=axis)
  act = mlp_tpu.silu_parts(gate)[1] * up
  m = linear.dot(w_out.T, act) if tokens else linear.dot(act, w_out)
  y, inv = norm.add_rms_norm(x, m, eps, axis)
  return y, (x, w_in, w_out, h, y, inv)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def swiglu_residual_norm(x, w_in, w_out, eps, tokens):
  """rms_norm(x + down(silu(gate) * up)) on a 2-D x, with a written-out
  backward pass (the same math as autodiff of SwiGLU then `rms_norm`).

  tokens=False: x [..., D], w_in [D, 2I], w_out [I, D], features last
  (not flattened: merging a sequence-major [S, B, D]'s S with its sharded
  batch axis would make GSPMD all-gather the batch).
  tokens=True: x [S, M] with the features (tokens) on axis 0, w_in [S, 2I],
  w_out [I, S]: the token mixer of the mlp_t block on a sequence-major
  activation, so neither direction transposes an activation.

  Why by hand: autodiff keeps silu(gate) * up, the residual sum and the
  normalised output besides what is needed, and XLA:CPU lays the weight
  gradients out with the activation gradient transposed, fusing that
  transpose into its producers. Here the backward keeps x, the fused
  projection h, the output y and 1/rms, and every dot reads its operands as
  stored. Weights arrive cast to x.dtype (CastedLinear), gradients return in
  the dtypes that came in.
  """
  return _swiglu_norm(x, w_in, w_out, eps, tokens)[0]


def _swiglu_norm_bwd(eps, tokens, residuals, dy):
  del eps
  x, w_in, w_out, h, y, inv = residuals
  axis = 0 if tokens else -1
  dr = norm.rms_norm_grad(y, dy, inv, axis).astype(x.dtype)
  gate, up = jnp.split(h, 2, axis=axis)
  sig, silu = mlp_tpu.silu_parts(gate)
  act = silu * up
  if tokens:   # m = w_out^T act
    d_out = _dot(act, dr, (1, 1))                    # [I, S]
    d_act = linear.dot(w_out, dr)                    # [I, M]
  else:        # m = act w_out
    d_out = _dot_rows(act, dr)                       # [I, D]
    d_act = linear.dot(dr, w_out.T)                  # [..., I]
  d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))
  dh = jnp.concatenate([d_gate, d_act * silu], axis=axis)
  if tokens:   # h = w_in^T x
    d_in = _dot(x, dh, (1, 1))                       # [S, 2I]
    dx = dr + linear.dot(w_in, dh)
  else:        # h = x w_in
    d_in = _dot_rows(x, dh)                          # [D, 2I]
    dx = dr + linear.dot(dh, w_in.T)
  return dx, d_in.astype(w_in.dtype), d_out.astype(w_out.dtype)


swiglu_residual_norm.defvjp(
    lambda x, w_in, w_out, eps, tokens: _swiglu_norm(x, w_in, w_out, eps,
                                                     tokens),
    _swiglu_norm_bwd)


class Kernel(nn.Module):
  """A Linear's fp32 kernel without the product, for fused callers; same
  name, shape, init and logical axes as `Linear` creates."""
  shape: tuple[int, int]
  axes: tuple[str | None, str | None]

  @nn.compact
  def __call__(self, dtype):
    return linear.logical_param(self, "kernel",
                                lecun_trunc_normal(self.shape[0]), self.axes,
                                self.shape, jnp.float32).astype(dtype)


def _one_device() -> bool:
  """No mesh, or a mesh of one device: nothing is sharded."""
  mesh = jax.sharding.get_abstract_mesh()
  return mesh.empty or mesh.size == 1


class SwiGLUNorm(nn.Module):
  """rms_norm(x + SwiGLU(x)) with upstream's SwiGLU parameters
  (gate_up_proj [hidden, 2 inter], first half the gate; down_proj).

  `x` is [..., hidden] (tokens=False), or [hidden, ...] for the mlp_t token
  mixer on a sequence-major activation (tokens=True); the norm runs over the
  same axis as the MLP.
  """
  hidden_size: int
  expansion: float
  dtype: jnp.dtype = jnp.bfloat16
  eps: float = 1e-5
  # Logical names of (model width, inner width); the token-mixing MLP of the
  # mlp_t variant acts on the sequence axis and uses different names.
  axes: Sequence[str] = ("embed", "mlp")
  tokens: bool = False
  # 'pallas': the fused TPU kernels of mlp_tpu ('pallas_interpret': the
  # same on CPU); they need x 3-D with its batch on `batch_axis`.
  # 'triton': mlp_gpu's GPU kernels for the token mixer (tokens=True, x
  # [S, B, D]); the channel MLP is XLA's unless channel_gpu's layout is
  # 'epilogue'.
  kernel: str = "dot"
  batch_axis: int = 0

  @nn.compact
  def __call__(self, x):
    inter = swiglu_width(self.hidden_size, self.expansion)
    outer, inner = self.axes
    w_in = Kernel((self.hidden_size, 2 * inter), (outer, inner),
                  name="gate_up_proj")(self.dtype)
    w_out = Kernel((inter, self.hidden_size), (inner, outer),
                   name="down_proj")(self.dtype)
    shape = x.shape
    if self.kernel in mlp_gpu.KINDS and self.tokens:
      return mlp_gpu.token_mixer(x.astype(self.dtype), w_in, w_out, self.eps,
                                 self.kernel == "triton_interpret")
    if self.kernel in mlp_gpu.KINDS and channel_gpu.use_kernel():
      return channel_gpu.channel_mlp(x.astype(self.dtype), w_in, w_out,
                                     self.eps, self.batch_axis,
                                     self.kernel == "triton_interpret")
    if self.kernel in mlp_tpu.KINDS and self.kernel != "dot":
      return mlp_tpu.swiglu_norm(x.astype(self.dtype), w_in, w_out, self.eps,
                                 self.tokens, self.batch_axis,
                                 self.kernel == "pallas_interpret")
    if self.tokens:  # [S, B*D] keeps the (major) batch sharding
      flat = x.reshape(shape[0], -1)
    elif _one_device():  # 2-D dots: ~10% faster on XLA:CPU
      flat = x.reshape(-1, shape[-1])
    else:  # [S*B, D] would all-gather a sharded B: keep the axes
      flat = x
    y = swiglu_residual_norm(flat.astype(self.dtype), w_in, w_out, self.eps,
                             self.tokens)
    return y.reshape(shape)
