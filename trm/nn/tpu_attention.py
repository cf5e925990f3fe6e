"""Pallas splash attention for TPU: Dream's and TRM's attention without the
[L, L] score matrix in HBM (`config.model.attention='splash'`).

The kernel (jax.experimental.pallas.ops.tpu.splash_attention) streams key
blocks through VMEM with an online softmax, in the forward and in its own
backward, so training and sampling at sequence 2048 no longer hold
[B, H, L, L] float32 scores per layer. GQA is native (query head n reads
key/value head n // (H / KV)). The padding mask becomes segment ids: real
tokens are segment 1, pads segment 0, so real queries see real keys only,
as the dot path's pair mask (pad rows differ: they attend pads, the dot
path gives them a uniform softmax; nothing reads pad rows).

'splash_interpret' runs the same kernel in Pallas' interpret mode, which
works on CPU: the tests compare it with the dot path there.

Under a mesh the kernel runs per shard (`jax.shard_map`): batch over the
axes of 'activation_batch', heads over those of 'activation_heads'; the
sequence is never split (each query needs every key).
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash)
from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask)

KINDS = ("dot", "splash", "splash_interpret")
# Named scopes around the kernel calls, saying which static mask they skip
# blocks by.
SCOPE_CAUSAL = "splash_causal_mask"
SCOPE_FULL = "splash_full_mask"
# Kernel tiles along the sequence; the length must be a multiple of one.
_BLOCKS = (512, 256, 128)


def check_length(length: int, block: int = 0) -> int:
  """The kernel's tile along the sequence: `block` where set (it must be a
  multiple of 128 dividing `length`), else the largest of 512, 256 and 128
  dividing `length`; a ValueError saying what to do otherwise."""
  if block:
    if block % 128 or length % block:
      raise ValueError(
          f"config.model.splash_block={block} must be a multiple of 128 "
          f"that divides the sequence length {length}; or 0 (the largest of "
          f"{', '.join(map(str, _BLOCKS))} dividing it).")
    return block
  for block in _BLOCKS:
    if length % block == 0:
      return block
  raise ValueError(
      f"config.model.attention='splash' needs a sequence length that is a "
      f"multiple of 128, got {length}: pad the sequence (seq_len, or prompt "
      "+ max_new_tokens when sampling) or use attention='dot'.")


def _kernel(heads: int, length: int, interpret: bool, causal: bool = False,
            block: int = 0):
  # Built per trace, not cached: the kernel holds its mask tables as arrays,
  # which would leak from one trace into the next.
  block = check_length(length, block)
  sizes = splash.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block,
      block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
      block_q_dq=block, block_kv_dq=block)
  one = (splash_mask.CausalMask((length, length)) if causal
         else splash_mask.FullMask((length, length)))
  mask = splash_mask.MultiHeadMask([one] * heads)
  return splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1,
                                block_sizes=sizes, interpret=interpret)


def _per_shard(q, k, v, segments, *, interpret: bool, causal: bool = False,
               block: int = 0):
  """q [B,L,H,K] (already scaled), k/v [B,L,KV,K], segments [B,L] int32."""
  kernel = _kernel(q.shape[2], q.shape[1], interpret, causal, block)
  to_heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731

  def one(q, k, v, seg):
    return kernel(q, k, v, splash.SegmentIds(q=seg, kv=seg))

  # The kernel declares no cost; the forecast reads its mask from this
  # scope in each call's op_name (trm.forecast.ops.splash_flops).
  with jax.named_scope(SCOPE_CAUSAL if causal else SCOPE_FULL):
    out = jax.vmap(one)(to_heads_first(q), to_heads_first(k),
                        to_heads_first(v), segments)
  return to_heads_first(out)


def splash_attention(q, k, v, key_mask, *, interpret: bool = False,
                     causal: bool = False, block: int = 0):
  """Bidirectional (or with `causal`, causal) GQA attention -> [B, L, H, K]
  in q's dtype.

  q [B, L, H, K] must already carry the 1/sqrt(K) scale; k, v [B, L, KV, K];
  key_mask [B, L] bool (True: real token) or None. `block`: the kernel's
  tile along the sequence in every pass (0: `check_length`'s choice);
  MaxText's tuned v6e runs at 8192 use 2048 (its `sa_block_*`).
  """
  batch, length = q.shape[:2]
  check_length(length, block)
  segments = (jnp.ones((batch, length), jnp.int32) if key_mask is None
              else key_mask.astype(jnp.int32))
  run = functools.partial(_per_shard, interpret=interpret, causal=causal,
                          block=block)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return run(q, k, v, segments)
  heads_spec = nn.logical_to_mesh_axes(
      ("activation_batch", None, "activation_heads", None))
  model = heads_spec[2]
  model_size = 1
  for axis in (model if isinstance(model, tuple) else (model,)):
    if axis is not None:
      model_size *= mesh.shape[axis]
  if k.shape[2] % model_size:
    raise ValueError(
        f"config.model.attention='splash': {k.shape[2]} key/value heads do "
        f"not split over the {model_size} devices of 'activation_heads'; "
        "use a model axis that divides them, or attention='dot'.")
  batch_spec = jax.sharding.PartitionSpec(heads_spec[0], None)
  return jax.shard_map(
      run, mesh=mesh, in_specs=(heads_spec, heads_spec, heads_spec,
                                batch_spec),
      out_specs=heads_spec, check_vma=False)(q, k, v, segments)
