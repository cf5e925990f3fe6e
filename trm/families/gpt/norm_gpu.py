"""Pallas Triton kernels (NVIDIA GPUs) for GPT's residual add and the
LayerNorm that reads its sum (`config.model.norm_kernel='triton'`).

On the H100 GPT-2's LayerNorms and residual adds were XLA fusions taking
about 159 ms of the 1,083 ms iteration, against 106 ms at their HBM
roofline: most are XLA's own Triton normalization fusions, which took
1.5-2.8x their bytes' time, the largest at 255 registers and 12.5%
occupancy (BUILD_NOTES "Third run", "After the third run, on the CPU ...
session 41"). Here one kernel per block of rows does each direction:
- forward: s = x + delta (the residual stream, float32) and
  y = LayerNorm(s), with each row's mean and 1/std kept for the backward;
- backward: ds' = ds + LayerNorm's backward of dy, written as the
  residual stream's float32 gradient and as delta's (in delta's dtype),
  with each program's partial sums of the scale's and bias's gradients.

The Block hands its last residual add on to the next norm (`layers.Block`
with this kernel), so every add meets its norm here. The arithmetic is
`kernels.layer_norm`'s (float32, eps 1e-5); only the order of the row sums
differs. 'triton_interpret' runs the kernels in Pallas's interpreter on a
CPU, for tests. Under a mesh the kernels run per batch shard.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from trm.core import mesh as mesh_lib
from trm.nn import cross_entropy_gpu
from trm.nn import dtypes

KINDS = ("triton", "triton_interpret")
_EPS = 1e-5
# `rows` per program (the first that divides the rows), the backward's
# `groups` of rows per program (its partial sums of the scale's gradient
# are one [width] row per program), and `warps`. At GPT-2's width (768,
# padded to 1024 lanes) one row per program and 4 warps compile for an
# H100 to 40 registers (forward, 75% occupancy) and 72 (backward, 44%);
# 4 rows take 118 and 198 (25% and 12.5%). BUILD_NOTES has the table.
CONSTANTS = dict(rows=(1,), groups=8, warps=4)


def _rows(n: int) -> int:
  return cross_entropy_gpu.rows_per_program(n, CONSTANTS["rows"],
                                            "config.model.norm_kernel")


def _columns(width: int):
  block = pl.next_power_of_2(width)
  cols = jnp.arange(block, dtype=jnp.int32)
  return block, cols < width


def _load_rows(ref, first, rows, block, ok):
  return plgpu.load(ref.at[pl.ds(first, rows), pl.ds(0, block)],
                    mask=ok[None, :], other=0.0).astype(jnp.float32)


def _store_rows(ref, first, rows, block, ok, value):
  plgpu.store(ref.at[pl.ds(first, rows), pl.ds(0, block)],
              value.astype(ref.dtype), mask=ok[None, :])


def _vector(ref, block, ok):
  return plgpu.load(ref.at[pl.ds(0, block)], mask=ok,
                    other=0.0).astype(jnp.float32)


def _forward_kernel(x_ref, delta_ref, scale_ref, bias_ref, s_ref, y_ref,
                    mean_ref, inv_ref, *, width):
  rows = mean_ref.shape[0]
  first = pl.program_id(0) * rows
  block, ok = _columns(width)
  s = (_load_rows(x_ref, first, rows, block, ok)
       + _load_rows(delta_ref, first, rows, block, ok))
  mean = jnp.sum(s, axis=1) / width
  centred = jnp.where(ok[None, :], s - mean[:, None], 0.0)
  inv = jax.lax.rsqrt(jnp.sum(centred * centred, axis=1) / width + _EPS)
  y = (centred * inv[:, None] * _vector(scale_ref, block, ok)[None, :]
       + _vector(bias_ref, block, ok)[None, :])
  _store_rows(s_ref, first, rows, block, ok, s)
  _store_rows(y_ref, first, rows, block, ok, y)
  mean_ref[...] = mean
  inv_ref[...] = inv


def _backward_kernel(s_ref, mean_ref, inv_ref, scale_ref, dy_ref, ds_ref,
                     dx_ref, d_delta_ref, d_scale_ref, d_bias_ref, *, width,
                     rows, groups):
  base = pl.program_id(0) * rows * groups
  block, ok = _columns(width)
  scale = _vector(scale_ref, block, ok)

  def group(g, sums):
    first = base + g * rows
    index = pl.ds(first, rows)
    mean = plgpu.load(mean_ref.at[index])
    inv = plgpu.load(inv_ref.at[index])
    x_hat = jnp.where(ok[None, :], (_load_rows(s_ref, first, rows, block, ok)
                                     - mean[:, None]) * inv[:, None], 0.0)
    dy = _load_rows(dy_ref, first, rows, block, ok)
    d_xhat = dy * scale[None, :]
    dx = inv[:, None] * (
        d_xhat - (jnp.sum(d_xhat, axis=1) / width)[:, None]
        - x_hat * (jnp.sum(d_xhat * x_hat, axis=1) / width)[:, None])
    dx = dx + _load_rows(ds_ref, first, rows, block, ok)
    _store_rows(dx_ref, first, rows, block, ok, dx)
    _store_rows(d_delta_ref, first, rows, block, ok, dx)
    d_scale, d_bias = sums
    return (d_scale + jnp.sum(dy * x_hat, axis=0),
            d_bias + jnp.sum(dy, axis=0))

  zeros = jnp.zeros((block,), jnp.float32)
  d_scale, d_bias = jax.lax.fori_loop(0, groups, group, (zeros, zeros))
  program = pl.program_id(0)
  plgpu.store(d_scale_ref.at[program, pl.ds(0, block)], d_scale, mask=ok)
  plgpu.store(d_bias_ref.at[program, pl.ds(0, block)], d_bias, mask=ok)


def _params():
  return plgpu.CompilerParams(num_warps=CONSTANTS["warps"], num_stages=1)


def _whole():
  """The whole array, indexed by the kernel itself. (Made at call time:
  this module is imported with GPT's config, on any JAX.)"""
  return pl.BlockSpec(memory_space=pl.ANY)


def _cost(flops_per_element: int, n: int, width: int, *arrays):
  """The kernel's cost estimate: elementwise FLOPs, one rsqrt per row, and
  every operand and result moved through HBM once. Pallas's Triton
  lowering drops it; `benchmarks/gpu/offline.py` records it for the
  forecast."""
  return pl.CostEstimate(
      flops=flops_per_element * n * width, transcendentals=n,
      bytes_accessed=dtypes.nbytes(*arrays))


def _forward(x, delta, scale, bias, out_dtype, interpret):
  """x [N, C] float32, delta [N, C] -> (s, y in out_dtype, mean, 1/std)."""
  n, width = x.shape
  rows = _rows(n)
  per_row = pl.BlockSpec((rows,), lambda i: (i,))
  out_shape = [jax.ShapeDtypeStruct((n, width), jnp.float32),
               jax.ShapeDtypeStruct((n, width), out_dtype),
               jax.ShapeDtypeStruct((n,), jnp.float32),
               jax.ShapeDtypeStruct((n,), jnp.float32)]
  return pl.pallas_call(
      functools.partial(_forward_kernel, width=width),
      grid=(n // rows,), in_specs=[_whole()] * 4,
      out_specs=[_whole(), _whole(), per_row, per_row],
      out_shape=out_shape, compiler_params=_params(),
      # The add, the mean, the variance, and the scaled, shifted output.
      cost_estimate=_cost(8, n, width, x, delta, scale, bias, *out_shape),
      interpret=interpret, name="gpt_add_layer_norm")(x, delta, scale, bias)


def _backward(s, mean, inv, scale, dy, ds, delta_dtype, interpret):
  n, width = s.shape
  rows = _rows(n)
  groups = CONSTANTS["groups"]
  while (n // rows) % groups:
    groups //= 2
  programs = n // (rows * groups)
  out_shape = [jax.ShapeDtypeStruct((n, width), jnp.float32),
               jax.ShapeDtypeStruct((n, width), delta_dtype),
               jax.ShapeDtypeStruct((programs, width), jnp.float32),
               jax.ShapeDtypeStruct((programs, width), jnp.float32)]
  return pl.pallas_call(
      functools.partial(_backward_kernel, width=width, rows=rows,
                        groups=groups),
      grid=(programs,), in_specs=[_whole()] * 6,
      out_specs=[_whole()] * 4, out_shape=out_shape,
      compiler_params=_params(),
      # The normalised input again, its two row means, dx and the partial
      # sums of the scale's and bias's gradients.
      cost_estimate=_cost(12, n, width, s, mean, inv, scale, dy, ds,
                          *out_shape),
      interpret=interpret,
      name="gpt_add_layer_norm_grad")(s, mean, inv, scale, dy, ds)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def add_layer_norm(x, delta, scale, bias, out_dtype, interpret=False):
  """(s, y): s = x + delta in float32 and y = LayerNorm(s) * scale + bias,
  computed in float32 and rounded to `out_dtype`, over the last axis of
  x [B, T, C] (float32) and delta [B, T, C] (any float dtype);
  `kernels.layer_norm`'s arithmetic."""
  return _add_layer_norm_fwd(x, delta, scale, bias, out_dtype, interpret)[0]


def _add_layer_norm_fwd(x, delta, scale, bias, out_dtype, interpret):
  def per_shard(x, delta, scale, bias):
    b, t, c = x.shape
    s, y, mean, inv = _forward(x.reshape(b * t, c), delta.reshape(b * t, c),
                               scale, bias, out_dtype, interpret)
    return (s.reshape(b, t, c), y.reshape(b, t, c), mean.reshape(b, t),
            inv.reshape(b, t))

  s, y, mean, inv = mesh_lib.per_batch_shard(
      per_shard, (x, delta), (scale, bias), batch_axis=0)
  # An empty array stands for delta's dtype (residuals are arrays).
  return (s, y), (s, mean, inv, scale, bias, jnp.zeros((0,), delta.dtype))


def _add_layer_norm_bwd(out_dtype, interpret, residuals, cotangents):
  del out_dtype
  s, mean, inv, scale, bias, delta_like = residuals
  delta_dtype = delta_like.dtype
  ds, dy = cotangents

  def per_shard(s, mean, inv, dy, ds, scale):
    b, t, c = s.shape
    dx, d_delta, d_scale, d_bias = _backward(
        s.reshape(b * t, c), mean.reshape(b * t), inv.reshape(b * t), scale,
        dy.reshape(b * t, c), ds.reshape(b * t, c), delta_dtype, interpret)
    return (dx.reshape(b, t, c), d_delta.reshape(b, t, c),
            jnp.sum(d_scale, axis=0), jnp.sum(d_bias, axis=0))

  dx, d_delta, d_scale, d_bias = mesh_lib.per_batch_shard(
      per_shard, (s, mean, inv, dy, ds), (scale,), batch_axis=0,
      reduce_outputs=(2, 3))
  return (dx, d_delta, d_scale.astype(scale.dtype),
          d_bias.astype(bias.dtype))


add_layer_norm.defvjp(_add_layer_norm_fwd, _add_layer_norm_bwd)
