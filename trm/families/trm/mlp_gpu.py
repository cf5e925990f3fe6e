"""Pallas Triton kernels (NVIDIA GPUs) for TRM's mlp_t token mixer:
rms_norm(x + SwiGLU(x)) over the tokens of the sequence-major [S, B*D]
activation, with the SwiGLU's [2I, B*D] projection kept on chip
(`config.model.mlp_kernel='triton'`).

On the H100 the paper MLP-t step is bound by HBM traffic. XLA writes the
token mixer's [2I, M] projection and its SwiGLU product to HBM, reads them
back, and keeps the projection for the backward pass. `mlp_tpu.py` fuses
the same blocks on TPUs. (The 'epilogue' layout below fuses less: it
writes the SwiGLU's [I, M] output and leaves the other products to
cuBLAS.) On a GPU the kernels differ in three ways:
- Triton tiles are powers of two, so the S = 97 tokens are padded to 128
  rows inside the kernels (masked loads, zero rows), never in HBM.
- An H100 block has 228 KB of shared memory, less than the mixer's weights
  (about 300 KB in bf16). The kernels stream the inner width I in chunks.
- The weight gradients are sums over all M columns. One kernel per
  (column group, inner chunk) sums its chunk's gradient over the group's
  tiles in registers and writes one float32 partial per group; XLA adds
  up the groups. It reads the norm's backward dr, which the first backward
  kernel writes beside dx.

The arithmetic is the XLA path's (`layers.swiglu_residual_norm`,
tokens=True):
- dots accumulate in float32 and round to x's dtype; the second dot
  rounds once, after all the chunks;
- the SwiGLU and its derivative are evaluated in float32 and rounded once
  (Triton has no bfloat16 tanh);
- the residual sum rounds to x's dtype before the float32 norm.

'triton_interpret' runs the same kernels in Pallas's interpreter on a CPU,
for tests. Under a mesh the kernels run per batch shard
(`mlp_tpu.per_shard`). The channel MLP stays with XLA: its [B*S, D] x
[D, 2I] matmuls are large enough for cuBLAS.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from trm.families.trm import mlp_tpu
from trm.nn import dtypes

KINDS = ("triton", "triton_interpret")
# Each kernel's launch constants: `tiles`, the columns per program (the
# first that divides M); `chunk`, the inner width per loop step; `warps`;
# Triton's software-pipelining `stages`; and `layout`, the orientation of
# the loop's products (below). The weights (about 300 KB) are read from L2
# once per tile. From the H100 sweep of 2026-11-27
# (benchmarks/gpu/mixer_sweep.py, Sudoku's batch 384): the forward ran in
# 0.67 ms at 64 columns and 4 warps, against 1.11 ms at 128 and 8 warps,
# where the [128, 128] float32 accumulator and the chunk's float32 SwiGLU
# terms spill registers; dx was as fast at 128 columns with 4 warps.
#
# `layout`: Hopper's wgmma takes its A operand from registers or shared
# memory but its B operand only from shared memory. 'tokens' (the kernels
# the H100 timed) keeps the accumulators as [tokens, columns], so the
# SwiGLU products made in registers enter the next dot as B and go through
# shared memory first. 'columns' computes the transposes, [columns,
# tokens], as flash attention orients P.V: the products are A, and dx
# reads each w_in chunk once for both of its dots (the 'tokens' dx loads
# w_in in both layouts). The weight gradients' 'inner' sums [chunk,
# tokens] accumulators, whose register operand is A too, and fits chunks
# of 64 without spilling: wgmma needs 64 rows, and the 'tokens' kernel's
# chunks of 32 make most of its dots fall back to mma.sync. The forward's
# 'epilogue' fuses less: a GEMM of w_in's chunk rows with x whose epilogue
# is the SwiGLU (one [chunk, tile] block per program, no loop) writes the
# [I, M] product to HBM, and XLA does the down-projection (cuBLAS) and the
# norm: about 1.2 GB of HBM traffic per call at batch 768, against 2.6 GB
# for the XLA path, with no weights reread per column tile and no
# accumulator held across chunks. Its `chunk` is the block's rows. dx's
# 'epilogue' is the backward's counterpart, and replaces the weight-
# gradient kernel too: a GEMM recomputing the SwiGLU from x, whose
# epilogue writes d_gate, d_up and the SwiGLU's output, with cuBLAS for
# every other product (d_act, dx and the three weight gradients).
_FORWARD = dict(tiles=(64, 32, 16), chunk=64, warps=4, stages=2,
                layout="tokens")
_DX = dict(tiles=(128, 64, 32, 16), chunk=64, warps=4, stages=2,
           layout="tokens")
# The weight-gradient kernel keeps three float32 accumulators of [128,
# chunk] across its loop over tiles, so its tiles and chunks are smaller.
_GRAD = dict(tiles=(64, 32, 16), chunk=32, warps=4, stages=2,
             layout="tokens")
LAYOUTS = {"_FORWARD": ("tokens", "columns", "epilogue"),
           "_DX": ("tokens", "columns", "epilogue"),
           "_GRAD": ("tokens", "inner")}
_MAX_GROUPS = 32         # column groups of the weight gradients (partials)


def _layout(name: str) -> str:
  layout = globals()[name]["layout"]
  if layout not in LAYOUTS[name]:
    raise ValueError(f"mlp_gpu.{name}['layout']={layout!r}: use one of "
                     f"{LAYOUTS[name]}")
  return layout


def _params(constants: dict):
  return plgpu.CompilerParams(num_warps=constants["warps"],
                              num_stages=constants["stages"])


def _padded_rows(seq: int) -> int:
  return max(16, pl.next_power_of_2(seq))


def _tile(columns: int, tiles) -> int:
  for tile in tiles:
    if columns % tile == 0:
      return tile
  raise ValueError(
      f"config.model.mlp_kernel='triton' needs the token mixer's columns "
      f"(batch x hidden_size = {columns}) to be a multiple of {tiles[-1]}: "
      "use mlp_kernel='dot'.")


def _chunk(inter: int, preferred: int) -> int:
  chunk = preferred
  while inter % chunk:
    chunk //= 2
  if chunk < 16:
    raise ValueError(
        f"config.model.mlp_kernel='triton' needs the token mixer's inner "
        f"width ({inter}) to be a multiple of 16: use mlp_kernel='dot'.")
  return chunk


def _precision(dtype):
  """float32 operands multiply in float32, not TF32 (the XLA path's
  float32 dots on a CPU; tests compare the two)."""
  return (jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32
          else None)


def _row_mask(rows: int, seq: int):
  return jnp.arange(rows) < seq


def _swiglu(gate, up, dtype):
  """(sigmoid(gate), silu(gate), silu(gate) * up) in float32 by the XLA
  path's formula (`mlp_tpu.silu_parts`), the product rounded to `dtype`."""
  sig, silu = mlp_tpu.silu_parts(gate.astype(jnp.float32))
  return sig, silu, (silu * up.astype(jnp.float32)).astype(dtype)


def _swiglu_grads(gate, up, sig, silu, d_act, dtype):
  """(d_gate, d_up) of silu(gate) * up given d_act, rounded to `dtype`."""
  g32, d32 = gate.astype(jnp.float32), d_act.astype(jnp.float32)
  d_gate = d32 * up.astype(jnp.float32) * (sig * (1 + g32 * (1 - sig)))
  return d_gate.astype(dtype), (d32 * silu).astype(dtype)


def _project(w_in_t_ref, x, start, inter, chunk, ok, precision):
  """The chunk's (gate, up) = w_in[:, chunk]^T x, each rounded to x's
  dtype: [chunk, tile]."""
  def rows(first):
    w = plgpu.load(w_in_t_ref.at[pl.ds(first, chunk), :], mask=ok[None, :],
                   other=0.0)
    return plgpu.dot(w, x, precision=precision).astype(x.dtype)
  return rows(start), rows(inter + start)


def _inv_rms(r, seq, eps):
  """1/rms of the float32 residual sum r [R, T] over its seq tokens (axis
  0; padded rows are zero)."""
  return jax.lax.rsqrt(jnp.sum(r * r, axis=0, keepdims=True) / seq + eps)


def _rms_norm_grad(y, dy, inv, seq, dtype):
  """The norm's backward dr from its output y, dy and 1/rms, over seq
  tokens on axis 0, rounded to `dtype`."""
  y32, dy32 = y.astype(jnp.float32), dy.astype(jnp.float32)
  return (inv * (dy32 - y32 * jnp.sum(dy32 * y32, axis=0, keepdims=True)
                 / seq)).astype(dtype)


def _project_block(w_ref, x, ok, precision):
  """A [chunk, R] block of w_in^T times x [R, T], rounded to x's dtype
  (the 'epilogue' kernels' gate or up)."""
  w = plgpu.load(w_ref, mask=ok[None, :], other=0.0)
  return plgpu.dot(w, x, precision=precision).astype(x.dtype)


# ------------------------------------------------------------------ forward


def _forward_kernel(x_ref, w_in_t_ref, w_out_t_ref, y_ref, inv_ref, *, seq,
                    inter, chunk, eps, precision):
  ok = _row_mask(x_ref.shape[0], seq)
  x = plgpu.load(x_ref, mask=ok[:, None], other=0.0)        # [R, T]

  def body(c, acc):
    start = c * chunk
    gate, up = _project(w_in_t_ref, x, start, inter, chunk, ok, precision)
    act = _swiglu(gate, up, x.dtype)[2]                     # [chunk, T]
    w_out_t = plgpu.load(w_out_t_ref.at[:, pl.ds(start, chunk)],
                         mask=ok[:, None], other=0.0)       # [R, chunk]
    return acc + plgpu.dot(w_out_t, act, precision=precision)

  m = jax.lax.fori_loop(0, inter // chunk, body,
                        jnp.zeros(x.shape, jnp.float32))
  r = (x + m.astype(x.dtype)).astype(jnp.float32)  # padded rows stay zero
  inv = _inv_rms(r, seq, eps)
  plgpu.store(y_ref, (r * inv).astype(y_ref.dtype), mask=ok[:, None])
  inv_ref[...] = inv


def _forward_kernel_columns(x_ref, w_in_ref, w_out_ref, y_ref, inv_ref, *,
                            seq, inter, chunk, eps, precision):
  """_forward_kernel with the loop's products as [columns, tokens]."""
  ok = _row_mask(x_ref.shape[0], seq)
  x = plgpu.load(x_ref, mask=ok[:, None], other=0.0)        # [R, T]

  def body(c, acc):
    start = c * chunk
    gate, up = (plgpu.dot(x, w, trans_a=True, precision=precision)
                .astype(x.dtype)                            # [T, chunk]
                for w in _in_columns(w_in_ref, start, inter, chunk, ok))
    act = _swiglu(gate, up, x.dtype)[2]
    w_out = plgpu.load(w_out_ref.at[pl.ds(start, chunk), :],
                       mask=ok[None, :], other=0.0)         # [chunk, R]
    return acc + plgpu.dot(act, w_out, precision=precision)

  m = jax.lax.fori_loop(0, inter // chunk, body,
                        jnp.zeros(x.shape[::-1], jnp.float32))
  r = (x + m.T.astype(x.dtype)).astype(jnp.float32)  # padded rows stay zero
  inv = _inv_rms(r, seq, eps)
  plgpu.store(y_ref, (r * inv).astype(y_ref.dtype), mask=ok[:, None])
  inv_ref[...] = inv


def _swiglu_kernel(x_ref, w_gate_ref, w_up_ref, act_ref, *, seq,
                   precision):
  """One [chunk, T] block of SwiGLU(w_in^T x) (the forward's 'epilogue')."""
  ok = _row_mask(x_ref.shape[0], seq)
  x = plgpu.load(x_ref, mask=ok[:, None], other=0.0)        # [R, T]

  gate, up = (_project_block(w_ref, x, ok, precision)
              for w_ref in (w_gate_ref, w_up_ref))
  act_ref[...] = _swiglu(gate, up, x.dtype)[2]


def _forward_epilogue(x, w_in, w_out, eps, interpret):
  """_forward with only the SwiGLU in a kernel; XLA does the rest."""
  seq, columns = x.shape
  inter = w_out.shape[0]
  rows, tile = _padded_rows(seq), _tile(columns, _FORWARD["tiles"])
  chunk = _chunk(inter, _FORWARD["chunk"])
  precision = _precision(x.dtype)
  act = pl.pallas_call(
      functools.partial(_swiglu_kernel, seq=seq, precision=precision),
      grid=(columns // tile, inter // chunk),
      in_specs=[pl.BlockSpec((rows, tile), lambda j, c: (0, j)),
                pl.BlockSpec((chunk, rows), lambda j, c: (c, 0)),
                pl.BlockSpec((chunk, rows),
                             lambda j, c: (inter // chunk + c, 0))],
      out_specs=pl.BlockSpec((chunk, tile), lambda j, c: (c, j)),
      out_shape=jax.ShapeDtypeStruct((inter, columns), x.dtype),
      compiler_params=_params(_FORWARD),
      cost_estimate=_cost(4 * rows * inter * columns, inter * columns,
                          x, w_in, jax.ShapeDtypeStruct((inter, columns),
                                                        x.dtype)),
      interpret=interpret, name="trm_token_mixer_swiglu",
  )(x, w_in.T, w_in.T)
  m = _dot(w_out, act, (0, 0), precision, x.dtype)         # [S, M]
  r = (x + m).astype(jnp.float32)
  inv = _inv_rms(r, seq, eps)
  return (r * inv).astype(x.dtype), inv


def _in_columns(w_in_ref, start, inter, chunk, ok):
  """The chunk's gate and up columns of w_in [S, 2I]: two [R, chunk]."""
  return tuple(plgpu.load(w_in_ref.at[:, pl.ds(first, chunk)],
                          mask=ok[:, None], other=0.0)
               for first in (start, inter + start))


def _cost(flops: int, transcendentals: int, *arrays):
  """A kernel's cost estimate: its dots' FLOPs over the padded rows it
  computes, and every operand and result moved through HBM once (the
  weights stay in L2 across programs). Pallas's Triton lowering does not
  pass it on to XLA (JAX 0.10 and 0.11), so `offline.py` flags these
  calls; BUILD_NOTES counts the step's kernel FLOPs from these figures."""
  return pl.CostEstimate(flops=int(flops), transcendentals=int(transcendentals),
                         bytes_accessed=dtypes.nbytes(*arrays))


def _forward(x, w_in, w_out, eps, interpret):
  """x [S, M] -> (y [S, M], 1/rms [1, M] float32)."""
  if _layout("_FORWARD") == "epilogue":
    return _forward_epilogue(x, w_in, w_out, eps, interpret)
  seq, columns = x.shape
  inter = w_out.shape[0]
  rows, tile = _padded_rows(seq), _tile(columns, _FORWARD["tiles"])
  chunk = _chunk(inter, _FORWARD["chunk"])
  # The weights whole, their token axes padded to the kernels' rows.
  if _layout("_FORWARD") == "columns":
    kernel, weights = _forward_kernel_columns, (w_in, w_out)
    blocks = ((rows, 2 * inter), (inter, rows))
  else:
    kernel, weights = _forward_kernel, (w_in.T, w_out.T)
    blocks = ((2 * inter, rows), (rows, inter))
  kernel = functools.partial(kernel, seq=seq, inter=inter,
                             chunk=chunk, eps=eps,
                             precision=_precision(x.dtype))
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype),
               jax.ShapeDtypeStruct((1, columns), jnp.float32)]
  return pl.pallas_call(
      kernel, grid=(columns // tile,),
      in_specs=[pl.BlockSpec((rows, tile), lambda j: (0, j))]
      + [pl.BlockSpec(block, lambda j: (0, 0)) for block in blocks],
      out_specs=[pl.BlockSpec((rows, tile), lambda j: (0, j)),
                 pl.BlockSpec((1, tile), lambda j: (0, j))],
      out_shape=out_shape,
      compiler_params=_params(_FORWARD),
      cost_estimate=_cost(6 * rows * inter * columns, (inter + 1) * columns,
                          x, w_in, w_out, *out_shape),
      interpret=interpret, name="trm_token_mixer_forward",
  )(x, *weights)


# ----------------------------------------------------------------- backward


def _norm_backward(x_ref, y_ref, dy_ref, inv_ref, seq):
  """(row mask, x, the norm's backward dr in x's dtype), x and dr [R, T]."""
  ok = _row_mask(x_ref.shape[0], seq)
  x, y, dy = (plgpu.load(ref, mask=ok[:, None], other=0.0)
              for ref in (x_ref, y_ref, dy_ref))
  return ok, x, _rms_norm_grad(y, dy, inv_ref[...], seq, x.dtype)


def _dx_kernel(x_ref, y_ref, dy_ref, inv_ref, w_in_t_ref, w_in_ref,
               w_out_ref, dx_ref, dr_ref, *, seq, inter, chunk, precision):
  ok, x, dr = _norm_backward(x_ref, y_ref, dy_ref, inv_ref, seq)
  dtype = x.dtype

  def body(c, acc):
    start = c * chunk
    gate, up = _project(w_in_t_ref, x, start, inter, chunk, ok, precision)
    sig, silu, _ = _swiglu(gate, up, dtype)
    w_out = plgpu.load(w_out_ref.at[pl.ds(start, chunk), :],
                       mask=ok[None, :], other=0.0)         # [chunk, R]
    d_act = plgpu.dot(w_out, dr, precision=precision).astype(dtype)
    d_gate, d_up = _swiglu_grads(gate, up, sig, silu, d_act, dtype)

    def cols(first):
      return plgpu.load(w_in_ref.at[:, pl.ds(first, chunk)],
                        mask=ok[:, None], other=0.0)        # [R, chunk]
    return (acc + plgpu.dot(cols(start), d_gate, precision=precision)
            + plgpu.dot(cols(inter + start), d_up, precision=precision))

  acc = jax.lax.fori_loop(0, inter // chunk, body,
                          jnp.zeros(x.shape, jnp.float32))
  plgpu.store(dx_ref, dr + acc.astype(dtype), mask=ok[:, None])
  plgpu.store(dr_ref, dr, mask=ok[:, None])


def _dx_kernel_columns(x_ref, y_ref, dy_ref, inv_ref, w_in_ref, w_out_ref,
                       dx_ref, dr_ref, *, seq, inter, chunk, precision):
  """_dx_kernel with the loop's products as [columns, tokens]."""
  ok, x, dr = _norm_backward(x_ref, y_ref, dy_ref, inv_ref, seq)
  dtype = x.dtype

  def body(c, acc):
    start = c * chunk
    w_gate, w_up = _in_columns(w_in_ref, start, inter, chunk, ok)
    gate, up = (plgpu.dot(x, w, trans_a=True, precision=precision)
                .astype(dtype) for w in (w_gate, w_up))   # [T, chunk]
    sig, silu, _ = _swiglu(gate, up, dtype)
    w_out = plgpu.load(w_out_ref.at[pl.ds(start, chunk), :],
                       mask=ok[None, :], other=0.0)         # [chunk, R]
    d_act = plgpu.dot(dr, w_out, trans_a=True, trans_b=True,
                      precision=precision).astype(dtype)
    d_gate, d_up = _swiglu_grads(gate, up, sig, silu, d_act, dtype)
    return (acc + plgpu.dot(d_gate, w_gate, trans_b=True, precision=precision)
            + plgpu.dot(d_up, w_up, trans_b=True, precision=precision))

  acc = jax.lax.fori_loop(0, inter // chunk, body,
                          jnp.zeros(x.shape[::-1], jnp.float32))
  plgpu.store(dx_ref, dr + acc.T.astype(dtype), mask=ok[:, None])
  plgpu.store(dr_ref, dr, mask=ok[:, None])


def _swiglu_grad_kernel(x_ref, w_gate_ref, w_up_ref, d_act_ref, dh_ref,
                        act_ref, *, seq, precision):
  """One [chunk, T] block of the SwiGLU's gradients (dx's 'epilogue'):
  dh [2, chunk, T] = (d_gate, d_up) and the recomputed act."""
  ok = _row_mask(x_ref.shape[0], seq)
  x = plgpu.load(x_ref, mask=ok[:, None], other=0.0)        # [R, T]

  gate, up = (_project_block(w_ref, x, ok, precision)
              for w_ref in (w_gate_ref, w_up_ref))
  sig, silu, act = _swiglu(gate, up, x.dtype)
  d_gate, d_up = _swiglu_grads(gate, up, sig, silu, d_act_ref[...], x.dtype)
  dh_ref[0] = d_gate
  dh_ref[1] = d_up
  act_ref[...] = act


def _dot(a, b, contract, precision, dtype=jnp.float32):
  """a . b contracting a's axis contract[0] with b's contract[1], in
  `dtype`. cuBLAS accumulates a bfloat16 product in float32 and rounds it
  once, as the other kernels do; asked for float32 and a cast, XLA writes
  the float32 product and rounds it in a second pass."""
  return jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)),
                                    ((), ())),
                             precision=precision,
                             preferred_element_type=dtype)


def _backward_epilogue(x, y, dy, inv, w_in, w_out, interpret):
  """_backward with only the SwiGLU's gradients in a kernel."""
  seq, columns = x.shape
  inter = w_out.shape[0]
  rows, tile = _padded_rows(seq), _tile(columns, _DX["tiles"])
  chunk = _chunk(inter, _DX["chunk"])
  precision = _precision(x.dtype)
  dtype = x.dtype
  dr = _rms_norm_grad(y, dy, inv, seq, dtype)              # [S, M]
  d_act = _dot(w_out, dr, (1, 0), precision, dtype)        # [I, M]
  block = lambda j, c: (c, j)  # noqa: E731
  dh, act = pl.pallas_call(
      functools.partial(_swiglu_grad_kernel, seq=seq, precision=precision),
      grid=(columns // tile, inter // chunk),
      in_specs=[pl.BlockSpec((rows, tile), lambda j, c: (0, j)),
                pl.BlockSpec((chunk, rows), lambda j, c: (c, 0)),
                pl.BlockSpec((chunk, rows),
                             lambda j, c: (inter // chunk + c, 0)),
                pl.BlockSpec((chunk, tile), block)],
      out_specs=[pl.BlockSpec((2, chunk, tile), lambda j, c: (0, c, j)),
                 pl.BlockSpec((chunk, tile), block)],
      out_shape=[jax.ShapeDtypeStruct((2, inter, columns), dtype),
                 jax.ShapeDtypeStruct((inter, columns), dtype)],
      compiler_params=_params(_DX),
      # Reads x, w_in and d_act; writes dh (two of d_act's size) and act.
      cost_estimate=_cost(4 * rows * inter * columns, inter * columns,
                          x, w_in, *[d_act] * 4),
      interpret=interpret, name="trm_token_mixer_swiglu_grad",
  )(x, w_in.T, w_in.T, d_act)
  dh = dh.reshape(2 * inter, columns)                       # [gate; up]
  dx = dr + _dot(w_in, dh, (1, 0), precision, dtype)
  return (dx, _dot(x, dh, (1, 1), precision), _dot(act, dr, (1, 1), precision))


def _grad_kernel(x_ref, dr_ref, w_in_t_ref, w_out_ref, d_gate_ref, d_up_ref,
                 d_out_ref, *, seq, inter, chunk, tile, tiles, precision,
                 inner):
  """inner: w_in's gradients sum as [chunk, R] (layout 'inner'), not [R,
  chunk]."""
  c = pl.program_id(1)
  ok = _row_mask(w_in_t_ref.shape[1], seq)
  start = c * chunk
  w_out = plgpu.load(w_out_ref.at[pl.ds(start, chunk), :], mask=ok[None, :],
                     other=0.0)                             # [chunk, R]

  def body(t, accs):
    d_out, d_gate_w, d_up_w = accs
    span = pl.ds(t * tile, tile)
    x = plgpu.load(x_ref.at[:, span], mask=ok[:, None], other=0.0)
    dr = plgpu.load(dr_ref.at[:, span], mask=ok[:, None], other=0.0)
    gate, up = _project(w_in_t_ref, x, start, inter, chunk, ok, precision)
    sig, silu, act = _swiglu(gate, up, x.dtype)
    d_act = plgpu.dot(w_out, dr, precision=precision).astype(x.dtype)
    d_gate, d_up = _swiglu_grads(gate, up, sig, silu, d_act, x.dtype)
    def d_w_in(d):
      return (plgpu.dot(d, x, trans_b=True, precision=precision) if inner
              else plgpu.dot(x, d, trans_b=True, precision=precision))
    return (d_out + plgpu.dot(act, dr, trans_b=True, precision=precision),
            d_gate_w + d_w_in(d_gate), d_up_w + d_w_in(d_up))

  rows = w_in_t_ref.shape[1]
  d_in_shape = (chunk, rows) if inner else (rows, chunk)
  zeros = (jnp.zeros((chunk, rows), jnp.float32),
           jnp.zeros(d_in_shape, jnp.float32),
           jnp.zeros(d_in_shape, jnp.float32))
  d_out, d_gate_w, d_up_w = jax.lax.fori_loop(0, tiles, body, zeros)
  d_out_ref[...] = d_out
  d_gate_ref[...] = d_gate_w
  d_up_ref[...] = d_up_w


def _groups(steps: int) -> int:
  """Column groups for the weight gradients: the largest divisor of the
  tile count up to _MAX_GROUPS (each group one float32 partial)."""
  return max(g for g in range(1, min(steps, _MAX_GROUPS) + 1)
             if steps % g == 0)


def _backward(x, y, dy, inv, w_in, w_out, interpret):
  """x, y, dy [S, M], 1/rms [1, M] -> dx [S, M] (x's dtype), d_w_in
  [S, 2I] and d_w_out [I, S] float32."""
  if _layout("_DX") == "epilogue":
    return _backward_epilogue(x, y, dy, inv, w_in, w_out, interpret)
  seq, columns = x.shape
  inter = w_out.shape[0]
  rows, tile = _padded_rows(seq), _tile(columns, _DX["tiles"])
  precision = _precision(x.dtype)
  act_block = pl.BlockSpec((rows, tile), lambda j: (0, j))
  whole = lambda shape: pl.BlockSpec(shape, lambda *_: (0,) * len(shape))  # noqa: E731
  if _layout("_DX") == "columns":
    kernel, weights = _dx_kernel_columns, (w_in, w_out)
    blocks = ((rows, 2 * inter), (inter, rows))
  else:
    kernel, weights = _dx_kernel, (w_in.T, w_in, w_out)
    blocks = ((2 * inter, rows), (rows, 2 * inter), (inter, rows))
  dx, dr = pl.pallas_call(
      functools.partial(kernel, seq=seq, inter=inter,
                        chunk=_chunk(inter, _DX["chunk"]), precision=precision),
      grid=(columns // tile,),
      in_specs=[act_block, act_block, act_block,
                pl.BlockSpec((1, tile), lambda j: (0, j))]
      + [whole(block) for block in blocks],
      out_specs=[act_block, act_block],
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2,
      compiler_params=_params(_DX),
      cost_estimate=_cost(10 * rows * inter * columns, inter * columns,
                          x, y, dy, inv, w_in, w_out,
                          x, x),  # the outputs dx and dr: shaped as x
      interpret=interpret, name="trm_token_mixer_dx",
  )(x, y, dy, inv, *weights)

  tile = _tile(columns, _GRAD["tiles"])
  steps = columns // tile
  groups = _groups(steps)
  chunk = _chunk(inter, _GRAD["chunk"])
  inner = _layout("_GRAD") == "inner"
  group_block = pl.BlockSpec((rows, columns // groups), lambda g, c: (0, g))
  by_inner = pl.BlockSpec((None, chunk, rows), lambda g, c: (g, c, 0))
  by_rows = pl.BlockSpec((None, rows, chunk), lambda g, c: (g, 0, c))
  d_in_spec, d_in_shape = ((by_inner, (groups, inter, rows)) if inner
                           else (by_rows, (groups, rows, inter)))
  partials = [jax.ShapeDtypeStruct(d_in_shape, jnp.float32)] * 2 + [
      jax.ShapeDtypeStruct((groups, inter, rows), jnp.float32)]
  d_gate, d_up, d_out = pl.pallas_call(
      functools.partial(_grad_kernel, seq=seq, inter=inter, chunk=chunk,
                        tile=tile, tiles=steps // groups,
                        precision=precision, inner=inner),
      grid=(groups, inter // chunk),
      in_specs=[group_block, group_block, whole((2 * inter, rows)),
                whole((inter, rows))],
      out_specs=[d_in_spec, d_in_spec, by_inner],
      out_shape=partials,
      compiler_params=_params(_GRAD),
      # x and dr are read once per inner chunk (from L2 where the chunks'
      # programs run together); counted once per chunk here.
      cost_estimate=_cost(12 * rows * inter * columns, inter * columns,
                          *[x, dr] * (inter // chunk), w_in, w_out,
                          *partials),
      interpret=interpret, name="trm_token_mixer_weight_grads",
  )(x, dr, w_in.T, w_out)
  d_gate, d_up = d_gate.sum(0), d_up.sum(0)
  if inner:
    d_gate, d_up = d_gate.T, d_up.T
  d_in = jnp.concatenate([d_gate, d_up], axis=1)[:seq]
  return dx, d_in, d_out.sum(0)[:, :seq]


# ------------------------------------------------------------ shard + vjp


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def token_mixer(x, w_in, w_out, eps: float, interpret: bool = False):
  """`layers.swiglu_residual_norm(x, w_in, w_out, eps, tokens=True)` as
  Pallas Triton kernels, for the sequence-major x [S, B, D] (its batch on
  axis 1), w_in [S, 2I], w_out [I, S] in x's dtype. Gradients return in the
  dtypes that came in."""
  return _token_mixer_fwd(x, w_in, w_out, eps, interpret)[0]


def _token_mixer_fwd(x, w_in, w_out, eps, interpret):
  flat, unflat = mlp_tpu.as_matrix(tokens=True)

  def fn(x, w_in, w_out):  # local [S, B, D] <-> the kernels' [S, B*D]
    return tuple(unflat(a, x) for a in _forward(flat(x), w_in, w_out, eps,
                                                 interpret))

  y, inv = mlp_tpu.per_shard(fn, (x,), (w_in, w_out), batch_axis=1)
  return y, (x, y, inv, w_in, w_out)


def _token_mixer_bwd(eps, interpret, residuals, dy):
  del eps
  x, y, inv, w_in, w_out = residuals
  flat, unflat = mlp_tpu.as_matrix(tokens=True)

  def fn(x, y, dy, inv, w_in, w_out):
    dx, d_in, d_out = _backward(flat(x), flat(y), flat(dy), flat(inv),
                                w_in, w_out, interpret)
    return unflat(dx, x), d_in, d_out

  dx, d_in, d_out = mlp_tpu.per_shard(
      fn, (x, y, dy, inv), (w_in, w_out), batch_axis=1,
      reduce_outputs=(1, 2))
  return dx, d_in.astype(w_in.dtype), d_out.astype(w_out.dtype)


token_mixer.defvjp(_token_mixer_fwd, _token_mixer_bwd)
