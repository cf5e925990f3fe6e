"""A Pallas Triton kernel (NVIDIA GPUs) for TRM's channel MLP under
`config.model.mlp_kernel='triton'`: rms_norm(x + SwiGLU(x)) over the
features of x [.., D], with the SwiGLU as the epilogue of its
up-projection GEMM.

Why: at the paper MLP-t step's batch 768 the channel MLP's [M, 2I]
projection is 460 MB per call (M = 97 x 768 rows, 2I = 3072). XLA writes
it from cuBLAS, reads it back for the SwiGLU and keeps it for the backward
pass. The third run's H100 trace put the channel MLP's XLA fusions at about
28 ms of the 161 ms step, plus a 7.2 ms XLA Triton GEMM, each at about the
HBM's speed (`benchmarks/gpu/results/2026-11-27-h100-s39/`). Here:
- forward: one GEMM x [M, D] @ w_in [D, 2I] whose epilogue is the SwiGLU;
  it writes only the [M, I] product. cuBLAS does the down-projection and
  XLA the residual norm. Nothing of size [M, 2I] is written or kept.
- backward: the same GEMM recomputes gate and up from x. Its epilogue
  reads d_act and writes dh = (d_gate, d_up) as [M, 2, I], which is w_in's
  [M, 2I] column order, and the SwiGLU's output for down_proj's gradient.
  cuBLAS does d_act, dx and both weight gradients.

The arithmetic is the XLA path's (`layers.swiglu_residual_norm`,
tokens=False): the projection accumulates in float32 and rounds to x's
dtype, the SwiGLU and its derivative are evaluated in float32 and rounded
once, and the norm is XLA's. 'triton_interpret' runs the same kernels in
Pallas's interpreter on a CPU, for tests. Under a mesh they run per batch
shard (`mesh.per_batch_shard`).

`_CHANNEL['layout']` is 'xla' by default, which keeps the channel MLP with
XLA (the step the third run timed), until a GPU run has timed 'epilogue'
beside it (`benchmarks/gpu/mixer_sweep.py`'s `channel` settings).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from trm.core import mesh as mesh_lib
from trm.families.trm import mlp_gpu
from trm.nn import norm

# The kernel's launch constants: `layout` ('xla': no kernel; 'epilogue':
# the kernel below); a program computes `rows` x `columns` of gate and of
# up, stepping through D `depth` at a time, with `warps` and Triton's
# software-pipelining `stages`. Its two float32 accumulators hold
# 2 x rows x columns values, 64 registers per thread at 128 x 64 with
# 8 warps.
_CHANNEL = dict(layout="xla", rows=128, columns=64, depth=64, warps=8,
                stages=3)
LAYOUTS = ("xla", "epilogue")


def use_kernel() -> bool:
  """Whether the channel MLP runs as this module's kernel."""
  layout = _CHANNEL["layout"]
  if layout not in LAYOUTS:
    raise ValueError(f"channel_gpu._CHANNEL['layout']={layout!r}: use one "
                     f"of {LAYOUTS}")
  return layout == "epilogue"


def _block(size: int, preferred: int, what: str) -> int:
  """The largest power of two up to `preferred` (at least 16) dividing
  `size`."""
  block = preferred
  while size % block:
    block //= 2
  if block < 16:
    raise ValueError(
        f"config.model.mlp_kernel='triton' needs the channel MLP's {what} "
        f"({size}) to be a multiple of 16: use mlp_kernel='dot'.")
  return block


def _gate_and_up(x_ref, w_gate_ref, w_up_ref, *, rows, depth, precision):
  """(gate, up, row mask): this program's [R, C] blocks of x @ w_in's two
  halves, accumulated in float32 over D and rounded to x's dtype."""
  block_rows = x_ref.shape[0]
  ok = pl.program_id(1) * block_rows + jnp.arange(block_rows) < rows

  def body(k, accs):
    part = pl.ds(k * depth, depth)
    x = plgpu.load(x_ref.at[:, part], mask=ok[:, None], other=0.0)
    return tuple(acc + plgpu.dot(x, w_ref[part, :], precision=precision)
                 for acc, w_ref in zip(accs, (w_gate_ref, w_up_ref)))

  zeros = jnp.zeros((block_rows, w_gate_ref.shape[1]), jnp.float32)
  gate, up = jax.lax.fori_loop(0, x_ref.shape[1] // depth, body,
                               (zeros, zeros))
  return gate.astype(x_ref.dtype), up.astype(x_ref.dtype), ok


def _swiglu_kernel(x_ref, w_gate_ref, w_up_ref, act_ref, **kw):
  gate, up, ok = _gate_and_up(x_ref, w_gate_ref, w_up_ref, **kw)
  act = mlp_gpu._swiglu(gate, up, act_ref.dtype)[2]  # pylint: disable=protected-access
  plgpu.store(act_ref, act, mask=ok[:, None])


def _swiglu_grad_kernel(x_ref, w_gate_ref, w_up_ref, d_act_ref, dh_ref,
                        act_ref, **kw):
  gate, up, ok = _gate_and_up(x_ref, w_gate_ref, w_up_ref, **kw)
  sig, silu, act = mlp_gpu._swiglu(gate, up, act_ref.dtype)  # pylint: disable=protected-access
  d_act = plgpu.load(d_act_ref, mask=ok[:, None], other=0.0)
  d_gate, d_up = mlp_gpu._swiglu_grads(gate, up, sig, silu, d_act,  # pylint: disable=protected-access
                                       act_ref.dtype)
  for half, d in enumerate((d_gate, d_up)):
    # A traced index: Pallas's interpreter takes no Python int here.
    plgpu.store(dh_ref.at[:, jnp.int32(half), :], d, mask=ok[:, None])
  plgpu.store(act_ref, act, mask=ok[:, None])


def _swiglu_gemm(x, w_in, d_act, interpret):
  """act = SwiGLU(x @ w_in) [M, I] (d_act None); else (dh [M, 2I], act)."""
  m, depth_total = x.shape
  inter = w_in.shape[1] // 2
  rows = min(_CHANNEL["rows"], max(16, pl.next_power_of_2(m)))
  columns = _block(inter, _CHANNEL["columns"], "inner width")
  depth = _block(depth_total, _CHANNEL["depth"], "hidden size")
  halves = inter // columns
  # Column blocks vary fastest (Pallas's first grid axis is CUDA's x), so
  # the programs resident at once share a few row blocks of x in L2; the
  # weights (3 MB at the paper's sizes) stay in L2 throughout.
  grid = (halves, pl.cdiv(m, rows))
  precision = mlp_gpu._precision(x.dtype)  # pylint: disable=protected-access
  kw = dict(rows=m, depth=depth, precision=precision)
  in_specs = [pl.BlockSpec((rows, depth_total), lambda j, i: (i, 0)),
              pl.BlockSpec((depth_total, columns), lambda j, i: (0, j)),
              pl.BlockSpec((depth_total, columns),
                           lambda j, i: (0, halves + j))]
  act_spec = pl.BlockSpec((rows, columns), lambda j, i: (i, j))
  act_shape = jax.ShapeDtypeStruct((m, inter), x.dtype)
  flops = 4 * m * depth_total * inter
  params = plgpu.CompilerParams(num_warps=_CHANNEL["warps"],
                                num_stages=_CHANNEL["stages"])
  if d_act is None:
    return pl.pallas_call(
        functools.partial(_swiglu_kernel, **kw), grid=grid,
        in_specs=in_specs, out_specs=act_spec, out_shape=act_shape,
        compiler_params=params,
        cost_estimate=mlp_gpu._cost(flops, m * inter, x, w_in, act_shape),  # pylint: disable=protected-access
        interpret=interpret, name="trm_channel_swiglu",
    )(x, w_in, w_in)
  dh_shape = jax.ShapeDtypeStruct((m, 2, inter), x.dtype)
  dh, act = pl.pallas_call(
      functools.partial(_swiglu_grad_kernel, **kw), grid=grid,
      in_specs=in_specs + [act_spec],
      out_specs=[pl.BlockSpec((rows, 2, columns), lambda j, i: (i, 0, j)),
                 act_spec],
      out_shape=[dh_shape, act_shape],
      compiler_params=params,
      cost_estimate=mlp_gpu._cost(flops, m * inter, x, w_in, d_act,  # pylint: disable=protected-access
                                  dh_shape, act_shape),
      interpret=interpret, name="trm_channel_swiglu_grad",
  )(x, w_in, w_in, d_act)
  return dh.reshape(m, 2 * inter), act


def _dot(a, b, contract, dtype):
  return mlp_gpu._dot(a, b, contract, mlp_gpu._precision(a.dtype), dtype)  # pylint: disable=protected-access


def _forward(x, w_in, w_out, eps, interpret):
  """x [M, D] -> (y [M, D], 1/rms [M, 1] float32)."""
  act = _swiglu_gemm(x, w_in, None, interpret)                # [M, I]
  return norm.add_rms_norm(x, _dot(act, w_out, (1, 0), x.dtype), eps)


def _backward(x, y, dy, inv, w_in, w_out, interpret):
  """(dx, d_in [D, 2I], d_out [I, D]) of `_forward` given dy."""
  dtype = x.dtype
  dr = norm.rms_norm_grad(y, dy, inv).astype(dtype)           # [M, D]
  d_act = _dot(dr, w_out, (1, 1), dtype)                       # [M, I]
  dh, act = _swiglu_gemm(x, w_in, d_act, interpret)            # [M, 2I]
  dx = dr + _dot(dh, w_in, (1, 1), dtype)
  return dx, _dot(x, dh, (0, 0), dtype), _dot(act, dr, (0, 0), dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def channel_mlp(x, w_in, w_out, eps: float, batch_axis: int,
                interpret: bool = False):
  """`layers.swiglu_residual_norm(x, w_in, w_out, eps, tokens=False)` with
  the SwiGLU in the epilogue of its GEMM, for x [.., D] whose batch is on
  `batch_axis`, w_in [D, 2I] and w_out [I, D] in x's dtype. Gradients
  return in the dtypes that came in."""
  return _channel_fwd(x, w_in, w_out, eps, batch_axis, interpret)[0]


def _flat(a):
  return a.reshape(-1, a.shape[-1])


def _channel_fwd(x, w_in, w_out, eps, batch_axis, interpret):
  def fn(x, w_in, w_out):
    y, inv = _forward(_flat(x), w_in, w_out, eps, interpret)
    return y.reshape(x.shape), inv.reshape(x.shape[:-1] + (1,))

  y, inv = mesh_lib.per_batch_shard(fn, (x,), (w_in, w_out),
                                    batch_axis=batch_axis)
  return y, (x, y, inv, w_in, w_out)


def _channel_bwd(eps, batch_axis, interpret, residuals, dy):
  del eps
  x, y, inv, w_in, w_out = residuals

  def fn(x, y, dy, inv, w_in, w_out):
    dx, d_in, d_out = _backward(_flat(x), _flat(y), _flat(dy), _flat(inv),
                                w_in, w_out, interpret)
    return dx.reshape(x.shape), d_in, d_out

  dx, d_in, d_out = mesh_lib.per_batch_shard(
      fn, (x, y, dy, inv), (w_in, w_out), batch_axis=batch_axis,
      reduce_outputs=(1, 2))
  return dx, d_in.astype(w_in.dtype), d_out.astype(w_out.dtype)


channel_mlp.defvjp(_channel_fwd, _channel_bwd)
