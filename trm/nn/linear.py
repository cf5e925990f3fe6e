"""Dense-layer pieces shared by the families.

`logical_param` declares a parameter annotated with logical axis names (the
mesh rules turn them into shardings). `matmul` is x @ w accumulated in
float32 with a written-out backward pass (GPT's Linear and TRM's Linear and
fused SwiGLU use it); `matmul_to` rounds that product to a given dtype.
`add_bias` adds a bias to a float32 accumulator and rounds once, as torch's
Linear (addmm) does (Dream's and GPT's projections). `column_blocks` splits
one projection into a matmul per block of its kernel's columns.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp


def logical_param(module: nn.Module, name: str, init, axes, shape, dtype):
  """`module.param(name, ...)` with logical axis names `axes` on its dims."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                      dtype)


def add_bias(y32, bias, dtype):
  """(y32 + bias) rounded once to `dtype`; y32 is a float32 accumulator and
  the bias is first rounded to `dtype` (torch keeps it in the layer dtype)."""
  return (y32 + bias.astype(dtype).astype(jnp.float32)).astype(dtype)


def column_blocks(x, widths):
  """[(a copy of x, the block's column slice)] for consecutive column
  blocks of these widths, so each block is its own matmul: the copies come
  through one optimization barrier, which keeps XLA's dot merger from
  joining matmuls that share an operand back into one, followed by the
  slices this avoids."""
  xs = jax.lax.optimization_barrier((x,) * len(widths))
  starts = [sum(widths[:i]) for i in range(len(widths))]
  return [(xs[i], slice(start, start + width))
          for i, (start, width) in enumerate(zip(starts, widths))]


_WIDEN_ON_CPU = contextvars.ContextVar("trm_widen_on_cpu", default=False)


@contextlib.contextmanager
def widened_on_cpu():
  """Inside, `dot`'s bfloat16 operands are widened to float32 on XLA:CPU.

  For code traced under `jax.vmap` (`trm.core.data_parallel`'s row
  groups): the group axis lands before an operand's contracted axis, and
  XLA:CPU (jax 0.10.2) fails such a bfloat16 x bfloat16 = float32 dot when
  it runs ("Unsupported element type for DotThunk::Execute"). Widening is
  exact and the products and their float32 sum are the same; only slower,
  on the CPU meshes that are for tests and dry runs.
  """
  token = _WIDEN_ON_CPU.set(True)
  try:
    yield
  finally:
    _WIDEN_ON_CPU.reset(token)


def dot(a, b, contract=None):
  """a . b in the operands' dtype, accumulated in float32 (for float32
  operands, exactly `jnp.dot` / `lax.dot_general`).

  `contract`: ((a axes), (b axes)) to contract; default a's last with b's
  first. Asking for the float32 accumulator and rounding after is the same
  arithmetic as a bfloat16-result dot, but XLA:CPU runs the float32-result
  form on its fast bf16 kernels and the bf16-result form on a slow path
  (`[776, 512] x [512, 3072]`, one core: 1,075 against 167 GFLOP/s).
  """
  if contract is None:
    contract = ((a.ndim - 1,), (0,))
  dims = (contract, ((), ()))
  out_dtype = jnp.result_type(a.dtype, b.dtype)

  def float32_then_round(a, b):
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32
                               ).astype(out_dtype)

  if out_dtype == jnp.float32:
    return float32_then_round(a, b)
  on_cpu = float32_then_round
  if _WIDEN_ON_CPU.get():
    on_cpu = lambda a, b: float32_then_round(  # noqa: E731
        a.astype(jnp.float32), b.astype(jnp.float32))
  # Only for XLA:CPU. A TPU accumulates a bfloat16-result dot in float32
  # anyway, and given the float32-result form it kept the float32 products:
  # ARC-1's step on a v4-8 went from 17.34 to 25.16 GiB per chip.
  return jax.lax.platform_dependent(
      a, b, cpu=on_cpu,
      default=lambda a, b: jax.lax.dot_general(
          a, b, dims, preferred_element_type=out_dtype))


@jax.custom_vjp
def matmul(x, w):
  """x [..., K] @ w [K, N] accumulated in float32 (x, w in one dtype).

  The same product and gradients as jnp.dot; the backward pass is written
  out so that the weight gradient is dy^T x followed by a transpose of the
  small [N, K] result. Left to autodiff, XLA's CPU backend lays the weight
  gradient out as x^T dy with dy physically transposed, and fuses that
  transpose with everything that produces dy: for the residual projections
  dy is the residual-stream gradient, a chain of adds through every later
  block, so each transpose recomputed the whole chain in a cache-hostile
  order (about a quarter of a shakespeare_char_cpu step). On TPU and GPU
  both forms compile to the same dots.
  """
  return jnp.dot(x, w, preferred_element_type=jnp.float32)


def _matmul_fwd(x, w):
  return matmul(x, w), (x, w)


def _matmul_bwd(residuals, dy):
  x, w = residuals
  # dy arrives in float32. Where the caller rounds the product to x.dtype
  # this cast is exact; GPT's LM head keeps float32 logits, whose gradient
  # is rounded here as torch autocast rounds its bf16 LM head's. Like
  # autodiff of jnp.dot, the gradients come out of the dots in the
  # operands' dtype.
  dy = dy.astype(x.dtype)
  dx = dot(dy, w.T)
  dw_t = dot(dy.reshape(-1, dy.shape[-1]).T, x.reshape(-1, x.shape[-1]))
  return dx, dw_t.T.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul_to(x, w, dtype):
  """`matmul(x, w).astype(dtype)`, with `matmul`'s backward pass.

  On a GPU or TPU the rounding is the matmul's own: the dot still
  accumulates in float32 and rounds once, so the float32 product never
  reaches memory. Given the float32-result form, XLA:GPU writes the product
  and rounds it in a separate pass (GPT-2's bias-free projections and
  bfloat16 logits: about 8 bytes per output element read and written for
  nothing). Under tensor parallelism (a contraction split over `model`)
  each device's partial product is rounded before the partials are
  summed, as the backward pass's are and as MaxText's and Megatron's are;
  in the float32-result form XLA:TPU reduce-scattered float32 partials,
  twice the bytes on the tensor axis (BUILD_NOTES "Session 95": 2-4 points
  of forecast MFU on every tensor-parallel v5p and v5e row). CPU programs
  keep the float32-result form they were measured with (XLA:CPU's
  bfloat16-result dot differs in the last bit of a few elements).
  """
  dtype = jnp.dtype(dtype)
  if dtype == jnp.float32:
    return matmul(x, w)
  return _matmul_to(x, w, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul_to(x, w, dtype):
  def round_after(x, w):
    return matmul(x, w).astype(dtype)

  def rounded_by_the_matmul(x, w):
    return jnp.dot(x, w, preferred_element_type=dtype)

  return jax.lax.platform_dependent(x, w, cpu=round_after,
                                    default=rounded_by_the_matmul)


def _matmul_to_fwd(x, w, dtype):
  return _matmul_to(x, w, dtype), (x, w)


def _matmul_to_bwd(dtype, residuals, dy):  # pylint: disable=unused-argument
  return _matmul_bwd(residuals, dy)


_matmul_to.defvjp(_matmul_to_fwd, _matmul_to_bwd)
