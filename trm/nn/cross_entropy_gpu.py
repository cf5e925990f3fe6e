"""The LM head's softmax cross-entropy with one Pallas Triton kernel
(NVIDIA GPUs) over the logits (`config.loss_kernel='triton'`).

On the H100 the two largest XLA fusions of GPT-2's iteration were the
loss's passes over the [12288, 50304] bf16 logits of each micro-step: the
forward's log-sum-exp (one read, 0.80 ms, 2.2x its HBM time) and the
backward's (softmax - one-hot) x g (a read and a write, 0.92 ms): 68.8 ms
of the 1,083 ms iteration (BUILD_NOTES "Third run"). Here one kernel per
row block does both in the forward pass: it reads the row for the
log-sum-exp and the label's logit, then reads it again, newest blocks
first (those are the likeliest to be still in L2), and writes
P = softmax - one-hot over the logits' own buffer. The backward pass then
has no elementwise pass over the logits at all, because the loss's
cotangent g scales whole rows, and a row scaling commutes with the head's
two matmuls:

    dlogits = g * P    dh = g * (P @ W)    dW = P^T @ (g * h)

so both matmuls read P as stored and only [N, C] operands are scaled.

The arithmetic is `losses.softmax_cross_entropy` on the logits of
`linear.matmul_to(h, W^T, logits_dtype)` (the tied head's): float32
log-sum-exp, the loss lse - logit[label]. The gradient differs in one
rounding: P is rounded to the logits' dtype and g applied in the
matmuls' float32 accumulation, where the XLA path rounds g * P.

'triton_interpret' runs the same kernel in Pallas's interpreter on a CPU,
for tests. Under a mesh the kernel runs per batch shard.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from trm.core import mesh as mesh_lib
from trm.nn import linear

KINDS = ("triton", "triton_interpret")
# Launch constants: `rows` per program (the first that divides the rows),
# `block` vocabulary entries per loop step, `warps`, `stages`. A program
# holds a [rows, block] float32 tile; few rows per program keep the rows
# in flight (each 100 KB at GPT-2's vocabulary) within the H100's 50 MB
# L2 for the second read.
CONSTANTS = dict(rows=(1,), block=4096, warps=8, stages=2)


def rows_per_program(n: int, choices, field: str) -> int:
  """The first of `choices` that divides the n rows; else an error naming
  the config `field` ('triton') and its way out ('xla')."""
  for rows in choices:
    if n % rows == 0:
      return rows
  raise ValueError(f"{field}='triton' needs the positions per batch shard "
                   f"({n}) to be a multiple of {choices[-1]}: use "
                   f"{field.rsplit('.', 1)[-1]}='xla'.")


def _rows(n: int) -> int:
  return rows_per_program(n, CONSTANTS["rows"], "config.loss_kernel")


def _kernel(logits_ref, labels_ref, loss_ref, *refs, vocab, block,
            label_smoothing, z_loss):
  """One row block: loss = lse - logit[label]; P over the logits. With
  `label_smoothing` s and `z_loss` z (`losses.softmax_cross_entropy`'s):
  loss = lse - (1 - s) logit[label] - s mean(logits) + z lse**2 and
  P = softmax (1 + 2 z lse) - (1 - s) one-hot - s / V. With z, `refs`
  also holds lse's output before P's (the z-loss term's metric)."""
  *log_z_ref, p_ref = refs
  rows = loss_ref.shape[0]
  first = pl.program_id(0) * rows
  labels = labels_ref[...]
  steps = pl.cdiv(vocab, block)

  def load(j):
    cols = j * block + jnp.arange(block, dtype=jnp.int32)
    ok = cols < vocab
    x = plgpu.load(logits_ref.at[pl.ds(first, rows), pl.ds(j * block, block)],
                   mask=ok[None, :], other=float("-inf"))
    return cols, ok, x.astype(jnp.float32)

  # The sums stay per lane ([rows, block]) until the loop ends: one
  # cross-warp reduction per step (the max), not three.
  def stats(j, carry):
    top, total, picked, *summed = carry
    cols, ok, x = load(j)
    new_top = jnp.maximum(top, jnp.max(x, axis=1))
    total = (total * jnp.exp(top - new_top)[:, None]
             + jnp.exp(x - new_top[:, None]))
    hit = cols[None, :] == labels[:, None]
    # With label smoothing, also the row's sum of logits (for their mean);
    # without, the loop carries no third tile.
    summed = [s + jnp.where(ok[None, :], x, 0.0) for s in summed]
    return (new_top, total, picked + jnp.where(hit, x, 0.0), *summed)

  tiles = 3 if label_smoothing else 2
  start = (jnp.full((rows,), float("-inf"), jnp.float32),
           *(jnp.zeros((rows, block), jnp.float32) for _ in range(tiles)))
  top, total, picked, *summed = jax.lax.fori_loop(0, steps, stats, start)
  log_z = top + jnp.log(jnp.sum(total, axis=1))
  if label_smoothing:
    loss = (log_z - (1.0 - label_smoothing) * jnp.sum(picked, axis=1)
            - label_smoothing / vocab * jnp.sum(summed[0], axis=1))
  else:
    loss = log_z - jnp.sum(picked, axis=1)
  if z_loss:
    loss = loss + z_loss * log_z * log_z
    log_z_ref[0][...] = log_z
  loss_ref[...] = loss
  # d(z lse**2) = 2 z lse softmax: the softmax's factor in P.
  softmax_scale = 1.0 + 2.0 * z_loss * log_z if z_loss else None

  def softmax_minus_one_hot(i, carry):
    j = steps - 1 - i
    cols, ok, x = load(j)
    hit = (cols[None, :] == labels[:, None]).astype(jnp.float32)
    p = jnp.exp(x - log_z[:, None])
    if z_loss:
      p = p * softmax_scale[:, None]
    if label_smoothing:
      p = p - ((1.0 - label_smoothing) * hit + label_smoothing / vocab)
    else:
      p = p - hit
    plgpu.store(p_ref.at[pl.ds(first, rows), pl.ds(j * block, block)],
                p.astype(p_ref.dtype), mask=ok[None, :])
    return carry

  jax.lax.fori_loop(0, steps, softmax_minus_one_hot, 0)


def _loss_and_p(logits, labels, interpret: bool, label_smoothing=0.0,
                z_loss=0.0):
  """logits [N, V], labels [N] -> (loss [N] float32, lse [N] float32 (None
  without `z_loss`: the kernel writes no lse), P [N, V] over the logits'
  buffer)."""
  n, vocab = logits.shape
  rows = _rows(n)
  itemsize = jnp.dtype(logits.dtype).itemsize
  row_spec = pl.BlockSpec((rows,), lambda i: (i,))
  row_shape = jax.ShapeDtypeStruct((n,), jnp.float32)
  with_log_z = 1 if z_loss else 0
  out = pl.pallas_call(
      functools.partial(_kernel, vocab=vocab, block=CONSTANTS["block"],
                        label_smoothing=label_smoothing, z_loss=z_loss),
      grid=(n // rows,),
      in_specs=[pl.BlockSpec(memory_space=pl.ANY),
                pl.BlockSpec((rows,), lambda i: (i,))],
      out_specs=[row_spec] * (1 + with_log_z)
      + [pl.BlockSpec(memory_space=pl.ANY)],
      out_shape=[row_shape] * (1 + with_log_z)
      + [jax.ShapeDtypeStruct(logits.shape, logits.dtype)],
      input_output_aliases={0: 1 + with_log_z},
      compiler_params=plgpu.CompilerParams(num_warps=CONSTANTS["warps"],
                                           num_stages=CONSTANTS["stages"]),
      cost_estimate=pl.CostEstimate(
          flops=6 * n * vocab, transcendentals=2 * n * vocab,
          bytes_accessed=3 * n * vocab * itemsize + 8 * n),
      interpret=interpret, name="lm_head_cross_entropy")(logits, labels)
  return out[0], (out[1] if z_loss else None), out[-1]


def linear_cross_entropy(h, table, labels, logits_dtype, interpret=False,
                         label_smoothing=0.0, z_loss=0.0):
  """-log softmax(h @ table^T)[label] per position, float32 (with
  `losses.softmax_cross_entropy`'s label_smoothing and z_loss terms).

  h [B, T, C] and table [V, C] (the tied embedding) in the compute dtype;
  labels [B, T] integers in [0, V) (positions to ignore are the caller's:
  a valid label and a zero weight). The logits are made in `logits_dtype`,
  as `GPT.logits_from_hidden` makes them, and never leave this function.
  """
  return _loss_and_log_z(h, table, labels, logits_dtype, interpret,
                         label_smoothing, z_loss)[0]


def linear_cross_entropy_and_log_z(h, table, labels, logits_dtype,
                                   interpret=False, label_smoothing=0.0,
                                   z_loss=0.0):
  """(`linear_cross_entropy`, the log-normaliser lse [B, T] float32), for
  logging the z-loss term alone; lse is None without `z_loss` (the kernel
  writes it only then) and carries no gradient (a metric)."""
  loss, log_z = _loss_and_log_z(h, table, labels, logits_dtype, interpret,
                                label_smoothing, z_loss)
  return loss, (None if log_z is None else jax.lax.stop_gradient(log_z))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _loss_and_log_z(h, table, labels, logits_dtype, interpret,
                    label_smoothing, z_loss):
  return _forward(h, table, labels, logits_dtype, interpret,
                  label_smoothing, z_loss)[0]


def _forward(h, table, labels, logits_dtype, interpret, label_smoothing,
             z_loss):
  logits = linear.matmul_to(h, table.T, logits_dtype)

  def per_shard(logits, labels):
    b, t, vocab = logits.shape
    loss, log_z, p = _loss_and_p(logits.reshape(b * t, vocab),
                                 labels.reshape(b * t), interpret,
                                 label_smoothing, z_loss)
    rows = (loss,) if log_z is None else (loss, log_z)
    return tuple(r.reshape(b, t) for r in rows) + (p.reshape(b, t, vocab),)

  *rows, p = mesh_lib.per_batch_shard(per_shard, (logits, labels), (),
                                      batch_axis=0)
  loss, log_z = rows if z_loss else (rows[0], None)
  return (loss, log_z), (h, table, p)


def _backward(logits_dtype, interpret, label_smoothing, z_loss, residuals,
              cotangents):
  del logits_dtype, interpret, label_smoothing, z_loss  # all in P
  # lse's cotangent is dropped: it leaves only under stop_gradient.
  g, _ = cotangents
  h, table, p = residuals
  # The head's matmuls run in the compute dtype, as `linear.matmul`'s
  # backward rounds the logits' gradient before them.
  p = p.astype(h.dtype)
  g = g.astype(jnp.float32)[..., None]
  p_table = jax.lax.dot_general(p, table, (((2,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
  dh = (g * p_table).astype(h.dtype)
  scaled_h = (g * h.astype(jnp.float32)).astype(h.dtype)
  d_table = linear.dot(p, scaled_h, ((0, 1), (0, 1)))        # [V, C]
  return dh, d_table.astype(table.dtype), None


_loss_and_log_z.defvjp(_forward, _backward)
