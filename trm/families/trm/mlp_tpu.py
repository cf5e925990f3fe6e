"""Pallas TPU kernels for TRM's SwiGLU blocks: rms_norm(x + SwiGLU(x)) with
the SwiGLU's inner activations kept in VMEM (`config.model.mlp_kernel=
'pallas'`).

On a v4 the paper TRM steps are bound by HBM bandwidth, and the largest
buffers they move are the SwiGLUs' inner projections: XLA writes the
[.., 2I] product of the first dot to HBM, reads it back for the SwiGLU and
the second dot, and the backward pass keeps it as a residual. Both SwiGLU
blocks of TRM act on independent slices of the activation, with the norm
over the same axis as the MLP:
- the mlp_t token mixer on the columns of the sequence-major [S, B*D]
  (tokens=True; w_in [S, 2I], w_out [I, S], I = 512 for 97 tokens);
- the channel MLP on the rows of [S*B, D] or [B*S, D] (tokens=False;
  w_in [D, 2I], w_out [I, D], I = 1536 for D = 512).
So a kernel takes a tile of slices, runs both dots, the SwiGLU, the
residual and the norm in VMEM, and writes only y: HBM traffic is x in, y
out, the weights once (their block never changes, so they stay resident).
The backward kernels recompute the projection from x instead of saving it
and accumulate the weight gradients over the tiles in VMEM (per TensorCore
half of the grid; the halves are summed after). Residuals: x, y and 1/rms
for the token mixer; x and the residual sum x + SwiGLU(x) for the channel
MLP (exact in x's dtype, and row-major where a [rows, 1] 1/rms would be
lane-sparse in HBM).

The arithmetic is `layers.swiglu_residual_norm`'s, rounding at the same
points: dots accumulate in float32 and round to x's dtype, the SwiGLU runs
in x's dtype, the residual sum rounds before the float32 norm. The weight
gradients accumulate over all slices in float32 and round once, as one dot
over all slices does.

'pallas_interpret' runs the same kernels in Pallas' interpret mode, which
works on CPU: the tests compare it with the XLA path there. Under a mesh the
kernels run per shard (`jax.shard_map`) over the batch axis; the weight
gradients are summed over it.

XLA cannot see inside a kernel, so each `pallas_call` declares its cost
(`pl.CostEstimate`): the FLOPs of its dots (the backward's recomputation
included), and as bytes every operand read once and every result written
once, the weights once per half of the grid. `trm.aot`'s per-chip figures
include these declarations.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from trm.core import mesh as mesh_lib
from trm.nn import norm
from trm.nn.dtypes import nbytes

KINDS = ("dot", "pallas", "pallas_interpret")
# Tiles: the token mixer's columns (multiples of the 128-lane width); the
# channel MLP's rows, whose kernels go over the inner width in chunks. The
# backward kernels hold about a dozen [tile, I or chunk] float32
# temporaries, hence smaller tiles (v4 scoped VMEM: 16 MiB).
_COLUMN_TILES = {"forward": (1024, 512, 256, 128),
                 "backward": (512, 256, 128)}
_ROW_TILES = {"forward": 256, "backward": 64}


def silu_parts(gate):
  """(sigmoid(gate), silu(gate)); sigmoid via tanh, which XLA:CPU evaluates
  faster than the exp of its logistic (the same function). Shared with the
  XLA path (`layers.swiglu_residual_norm`), so both compute one formula."""
  sig = 0.5 * jnp.tanh(0.5 * gate) + 0.5
  return sig, gate * sig


def _dot(a, b, contract, dtype=None):
  """a . b contracting a's axis contract[0] with b's contract[1], float32
  accumulate, rounded to `dtype` (None: kept float32)."""
  out = jax.lax.dot_general(a, b, (((contract[0],), (contract[1],)),
                                   ((), ())),
                            preferred_element_type=jnp.float32)
  return out if dtype is None else out.astype(dtype)


def _one_buffer(interpret):
  """A block whose index changes rarely or never needs no second buffer to
  overlap its copies with compute (and VMEM is short: 16 MiB on v4)."""
  return {} if interpret else {"pipeline_mode": pl.Buffered(1)}


def _whole(shape, grid_rank, interpret):
  """A block that is the whole (weight) array, fetched once."""
  index = (lambda i: (0,) * len(shape)) if grid_rank == 1 else (
      lambda c, j: (0,) * len(shape))
  return pl.BlockSpec(shape, index, **_one_buffer(interpret))


# ----------------------------------------------------------------- tokens


def _column_tile(columns: int, tiles) -> int:
  """The largest tile dividing the columns; else the smallest tile (the
  last one reaching past the columns), or all columns when fewer."""
  for tile in tiles:
    if columns % tile == 0:
      return tile
  return min(columns, tiles[-1])


def _real(first, shape, axis, count):
  """Mask of the tile's slices (along `axis`) that exist: the last tile of
  a grid may reach past `count`, where a block holds garbage."""
  return first + jax.lax.broadcasted_iota(jnp.int32, shape, axis) < count


def _tokens_forward_kernel(x_ref, w_in_t_ref, w_out_t_ref, *out_refs, eps,
                           inter):
  x = x_ref[...]                                          # [S, T]
  h = _dot(w_in_t_ref[...], x, (1, 0), x.dtype)           # [2I, T]
  act = silu_parts(h[:inter])[1] * h[inter:]
  m = _dot(w_out_t_ref[...], act, (1, 0), x.dtype)        # [S, T]
  r = (x + m).astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(r * r, axis=0, keepdims=True) + eps)
  out_refs[0][...] = (r * inv).astype(out_refs[0].dtype)
  if len(out_refs) > 1:
    out_refs[1][...] = inv


def _tokens_backward_kernel(x_ref, y_ref, dy_ref, inv_ref, w_in_t_ref,
                            w_in_ref, w_out_ref, dx_ref, d_in_ref, d_out_ref,
                            *, inter, columns, tile, per_half):
  c, j = pl.program_id(0), pl.program_id(1)

  @pl.when(j == 0)
  def _():
    d_in_ref[...] = jnp.zeros_like(d_in_ref)
    d_out_ref[...] = jnp.zeros_like(d_out_ref)

  # Zeroed past the columns, a slice adds exactly zero to the gradients.
  real = _real((c * per_half + j) * tile, (1, tile), 1, columns)
  x, y, dy, inv = (jnp.where(real, ref[...], jnp.zeros_like(ref[...]))
                   for ref in (x_ref, y_ref, dy_ref, inv_ref))
  dtype = x.dtype
  dr = norm.rms_norm_grad(y, dy, inv, axis=0).astype(dtype)  # [S, T]
  h = _dot(w_in_t_ref[...], x, (1, 0), dtype)             # recomputed
  gate, up = h[:inter], h[inter:]
  sig, silu = silu_parts(gate)
  act = silu * up
  d_out_ref[...] += _dot(act, dr, (1, 1))                 # [I, S]
  d_act = _dot(w_out_ref[...], dr, (1, 0), dtype)         # [I, T]
  d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))
  dh = jnp.concatenate([d_gate, d_act * silu], axis=0)    # [2I, T]
  d_in_ref[...] += _dot(x, dh, (1, 1))                    # [S, 2I]
  dx_ref[...] = dr + _dot(w_in_ref[...], dh, (1, 0), dtype)


def _tokens_forward(x, w_in, w_out, *, eps, interpret, with_inv):
  """x [S, M] -> y [S, M] (and 1/rms [1, M] float32 with `with_inv`)."""
  seq, columns = x.shape
  inter = w_out.shape[0]
  tile = _column_tile(columns, _COLUMN_TILES["forward"])
  w_in_t, w_out_t = w_in.T, w_out.T
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)]
  out_specs = [pl.BlockSpec((seq, tile), lambda i: (0, i))]
  if with_inv:
    out_shape.append(jax.ShapeDtypeStruct((1, columns), jnp.float32))
    out_specs.append(pl.BlockSpec((1, tile), lambda i: (0, i)))
  return _forward_call(
      functools.partial(_tokens_forward_kernel, eps=eps, inter=inter),
      pl.cdiv(columns, tile), x, out_shape, out_specs, (w_in_t, w_out_t),
      flops=6 * seq * inter * columns, transcendentals=(inter + 1) * columns,
      interpret=interpret)


def _forward_call(kernel, steps, x, out_shape, out_specs, weights, *, flops,
                  transcendentals, interpret):
  """Runs a forward kernel over `steps` tiles of x (tiled like the first
  output), the weights whole; returns its outputs as a tuple."""
  return tuple(pl.pallas_call(
      kernel, grid=(steps,),
      in_specs=[out_specs[0]] + [_whole(w.shape, 1, interpret)
                                 for w in weights],
      out_specs=out_specs, out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel",)),
      cost_estimate=pl.CostEstimate(
          flops=flops, transcendentals=transcendentals,
          bytes_accessed=nbytes(x, *weights, *out_shape)),
      interpret=interpret)(x, *weights))


def _halves(steps: int):
  """(halves, steps per half): two independent halves of the grid (one per
  TensorCore of a megacore chip) when the tiles split evenly."""
  halves = 2 if steps % 2 == 0 else 1
  return halves, steps // halves


def _tokens_backward(x, y, dy, inv, w_in, w_out, *, interpret):
  """-> dx [S, M], float32 (d_w_in [S, 2I], d_w_out [I, S])."""
  seq, columns = x.shape
  inter = w_out.shape[0]
  tile = _column_tile(columns, _COLUMN_TILES["backward"])
  halves, per_half = _halves(pl.cdiv(columns, tile))
  cols = lambda c, j: (0, c * per_half + j)  # noqa: E731
  w_in_t = w_in.T
  return _backward_call(
      functools.partial(_tokens_backward_kernel, inter=inter,
                        columns=columns, tile=tile, per_half=per_half),
      (halves, per_half), (x, y, dy, inv), [(seq, tile)] * 3 + [(1, tile)],
      cols, (w_in_t, w_in, w_out), (w_in, w_out),
      flops=16 * seq * inter * columns, transcendentals=inter * columns,
      interpret=interpret)


def _backward_call(kernel, grid, acts, act_blocks, act_index, weights,
                   grads_like, *, flops, transcendentals, interpret):
  """Runs a backward kernel over `grid` (halves, tiles per half): the
  activations tiled by `act_blocks` / `act_index`, the weights whole. It
  returns dx (tiled like acts[0]) and the weight gradients shaped like
  `grads_like`, summed over the halves' float32 partials."""
  halves = grid[0]
  partial = lambda c, j: (c, 0, 0)  # noqa: E731
  x = acts[0]
  out_shape = (jax.ShapeDtypeStruct(x.shape, x.dtype),) + tuple(
      jax.ShapeDtypeStruct((halves,) + w.shape, jnp.float32)
      for w in grads_like)
  dx, *grads = pl.pallas_call(
      kernel, grid=grid,
      in_specs=[pl.BlockSpec(b, act_index) for b in act_blocks] +
      [_whole(w.shape, 2, interpret) for w in weights],
      out_specs=[pl.BlockSpec(act_blocks[0], act_index)] +
      [pl.BlockSpec((None,) + w.shape, partial, **_one_buffer(interpret))
       for w in grads_like],
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary")),
      cost_estimate=pl.CostEstimate(
          flops=flops, transcendentals=transcendentals,
          bytes_accessed=nbytes(*acts, *out_shape) +
          halves * nbytes(*weights)),
      interpret=interpret)(*acts, *weights)
  return (dx,) + tuple(g.sum(0) for g in grads)


# --------------------------------------------------------------- channels


def _inner_chunks(inter: int):
  """Static slices of the inner width: the kernels work on one at a time,
  so their [tile, chunk] temporaries fit VMEM."""
  step = next(c for c in (512, 256, 128, inter) if inter % c == 0)
  return [slice(k, k + step) for k in range(0, inter, step)]


def _swiglu_chunk(x, w_in_ref, inter, chunk):
  """gate, up, sigmoid(gate), silu(gate) and the SwiGLU for one chunk."""
  gate = _dot(x, w_in_ref[:, chunk], (1, 0), x.dtype)
  up = _dot(x, w_in_ref[:, inter + chunk.start:inter + chunk.stop], (1, 0),
            x.dtype)
  sig, silu = silu_parts(gate)
  return gate, up, sig, silu, silu * up


def _channels_residual(x, w_in_ref, w_out_ref, inter):
  """x + SwiGLU(x) in x's dtype; the second dot accumulates over the chunks
  in float32 and rounds once."""
  m = None
  for chunk in _inner_chunks(inter):
    act = _swiglu_chunk(x, w_in_ref, inter, chunk)[-1]
    part = _dot(act, w_out_ref[chunk, :], (1, 0))
    m = part if m is None else m + part
  return x + m.astype(x.dtype)


def _norm_rows(r, eps):
  """(y, 1/rms) of the residual sum r over its rows' features."""
  r = r.astype(jnp.float32)
  inv = jax.lax.rsqrt(jnp.mean(r * r, axis=1, keepdims=True) + eps)
  return inv * r, inv


def _channels_forward_kernel(x_ref, w_in_ref, w_out_ref, *out_refs, eps,
                             inter):
  r = _channels_residual(x_ref[...], w_in_ref, w_out_ref, inter)
  out_refs[0][...] = _norm_rows(r, eps)[0].astype(out_refs[0].dtype)
  if len(out_refs) > 1:  # the residual sum, exact in x's dtype
    out_refs[1][...] = r


def _channels_backward_kernel(x_ref, r_ref, dy_ref, w_in_ref, w_out_ref,
                              dx_ref,
                              d_in_ref, d_out_ref, *, eps, inter, rows, tile,
                              per_half):
  c, j = pl.program_id(0), pl.program_id(1)

  @pl.when(j == 0)
  def _():
    d_in_ref[...] = jnp.zeros_like(d_in_ref)
    d_out_ref[...] = jnp.zeros_like(d_out_ref)

  # The last tile may reach past the rows; zeroing them there makes their
  # contribution to the weight gradients exactly zero.
  real = _real((c * per_half + j) * tile, (tile, 1), 0, rows)
  x, r, dy = (jnp.where(real, ref[...], jnp.zeros_like(ref[...]))
              for ref in (x_ref, r_ref, dy_ref))
  dtype = x.dtype
  y, inv = _norm_rows(r, eps)
  dr = norm.rms_norm_grad(y.astype(dtype), dy, inv,
                          axis=1).astype(dtype)           # [T, D]
  dx = None
  for chunk in _inner_chunks(inter):  # the SwiGLU again, chunk by chunk
    up_chunk = slice(inter + chunk.start, inter + chunk.stop)
    gate, up, sig, silu, act = _swiglu_chunk(x, w_in_ref, inter, chunk)
    d_out_ref[chunk, :] += _dot(act, dr, (0, 0))          # [c, D]
    d_act = _dot(dr, w_out_ref[chunk, :], (1, 1), dtype)  # [T, c]
    d_gate = d_act * up * (sig * (1 + gate * (1 - sig)))
    d_up = d_act * silu
    d_in_ref[:, chunk] += _dot(x, d_gate, (0, 0))         # [D, c]
    d_in_ref[:, up_chunk] += _dot(x, d_up, (0, 0))
    part = (_dot(d_gate, w_in_ref[:, chunk], (1, 1)) +
            _dot(d_up, w_in_ref[:, up_chunk], (1, 1)))
    dx = part if dx is None else dx + part
  dx_ref[...] = dr + dx.astype(dtype)


def _channels_forward(x, w_in, w_out, *, eps, interpret, with_sum):
  """x [R, D] -> y [R, D] (and x + SwiGLU(x) [R, D] with `with_sum`)."""
  rows, width = x.shape
  inter = w_out.shape[0]
  tile = min(_ROW_TILES["forward"], rows)
  out_shape = [jax.ShapeDtypeStruct(x.shape, x.dtype)] * (1 + with_sum)
  return _forward_call(
      functools.partial(_channels_forward_kernel, eps=eps, inter=inter),
      pl.cdiv(rows, tile), x, out_shape,
      [pl.BlockSpec((tile, width), lambda i: (i, 0))] * len(out_shape),
      (w_in, w_out), flops=6 * rows * width * inter,
      transcendentals=(inter + 1) * rows, interpret=interpret)


def _channels_backward(x, r, dy, w_in, w_out, *, eps, interpret):
  rows, width = x.shape
  inter = w_out.shape[0]
  tile = min(_ROW_TILES["backward"], rows)
  halves, per_half = _halves(pl.cdiv(rows, tile))
  block = lambda c, j: (c * per_half + j, 0)  # noqa: E731
  return _backward_call(
      functools.partial(_channels_backward_kernel, eps=eps, inter=inter,
                        rows=rows, tile=tile, per_half=per_half),
      (halves, per_half), (x, r, dy), [(tile, width)] * 3, block,
      (w_in, w_out), (w_in, w_out), flops=16 * rows * width * inter,
      transcendentals=(inter + 1) * rows, interpret=interpret)


# ------------------------------------------------------------ shard + vjp


# Kept under its old name: the TPU and GPU token-mixer kernels call it.
per_shard = mesh_lib.per_batch_shard


def as_matrix(tokens):
  """Local [.., .., D] arrays -> the kernels' 2-D layout, and back."""
  if tokens:  # sequence-major [S, B, D] -> [S, B*D]
    return (lambda a: a.reshape(a.shape[0], -1),
            lambda a, like: a.reshape((a.shape[0],) + like.shape[1:]))
  return (lambda a: a.reshape(-1, a.shape[-1]),
          lambda a, like: a.reshape(like.shape))


def _forward(x, w_in, w_out, eps, tokens, batch_axis, interpret, for_grad):
  flat, unflat = as_matrix(tokens)

  def fn(x, w_in, w_out):
    if tokens:
      outs = _tokens_forward(flat(x), w_in, w_out, eps=eps,
                             interpret=interpret, with_inv=for_grad)
    else:
      outs = _channels_forward(flat(x), w_in, w_out, eps=eps,
                               interpret=interpret, with_sum=for_grad)
    return tuple(unflat(o, x) for o in outs)

  return per_shard(fn, (x,), (w_in, w_out), batch_axis=batch_axis)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def swiglu_norm(x, w_in, w_out, eps: float, tokens: bool, batch_axis: int,
                interpret: bool = False):
  """`layers.swiglu_residual_norm` on TPU. tokens=True: x is the
  sequence-major [S, B, D] (batch_axis 1), w_in [S, 2I], w_out [I, S], the
  MLP and norm over S. tokens=False: x [.., D] with its batch on
  `batch_axis`, w_in [D, 2I], w_out [I, D], over D. Weights come in x's
  dtype; gradients return in the dtypes that came in."""
  return _forward(x, w_in, w_out, eps, tokens, batch_axis, interpret,
                  for_grad=False)[0]


def _swiglu_norm_fwd(x, w_in, w_out, eps, tokens, batch_axis, interpret):
  outs = _forward(x, w_in, w_out, eps, tokens, batch_axis, interpret,
                  for_grad=True)
  saved = (x, outs[0], outs[1]) if tokens else (x, outs[1])
  return outs[0], (saved, w_in, w_out)


def _swiglu_norm_bwd(eps, tokens, batch_axis, interpret, residuals, dy):
  saved, w_in, w_out = residuals
  flat, unflat = as_matrix(tokens)

  def fn(*args):
    *acts, w_in, w_out = args
    x = acts[0]
    if tokens:
      dx, d_in, d_out = _tokens_backward(*map(flat, acts), w_in, w_out,
                                         interpret=interpret)
    else:
      dx, d_in, d_out = _channels_backward(*map(flat, acts), w_in, w_out,
                                           eps=eps, interpret=interpret)
    return unflat(dx, x), d_in, d_out

  acts = (saved[0], saved[1], dy) + saved[2:]  # tokens: x, y, dy, 1/rms
  dx, d_in, d_out = per_shard(fn, acts, (w_in, w_out),
                               batch_axis=batch_axis, reduce_outputs=(1, 2))
  return dx, d_in.astype(w_in.dtype), d_out.astype(w_out.dtype)


swiglu_norm.defvjp(_swiglu_norm_fwd, _swiglu_norm_bwd)
