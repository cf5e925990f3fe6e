"""Token-embedding lookup, table[ids], that never gathers the table.

XLA's SPMD partitioner, given `jnp.take` on a table split along its width
(FSDP), gathers the whole table on every device (in the table's dtype:
float32 for GPT), and the lookup's gradient is a scatter-add into a whole
table, all-reduced whole before each device keeps its slice. For a
128,256 x 8,192 float32 table (Llama 3.1 70B) that is three buffers of
4.2 GB a chip. Here each device looks up its own columns instead:

  1. gather the token ids over the mesh axes that split the table's width
     (they split the batch too: the ids, not the table, travel);
  2. take this device's columns of those rows;
  3. all-to-all: each device gets its own rows back with every column.

The backward pass is the same in reverse, and its scatter-add lands in
this device's own block of the table. The values are the table's own
(a lookup rounds nothing), so the result equals `jnp.take` exactly.

A table whose vocabulary is split too (tensor parallelism: 'vocab' on
'model') is left to `jnp.take`, which then gathers only its share of the
rows. This route there had to sum every token's rows over the vocabulary
split, and measured no better: MaxText's 128B on two v5e-256 slices was
refused by 27 MiB where `jnp.take`'s step compiles, and the v5e 128B, the
v5p 32B and DiffuCoder-7B on v4-64 with model=4 took 0-0.5 GiB more a chip
(BUILD_NOTES "Session 93").
"""
from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from trm.core import mesh as mesh_lib
from trm.nn import platform as platform_lib

_LENGTH = "activation_length"


# A TPU tiles an array's minor dimension by 128: a device's few columns
# (4,096 over 256 devices: 16) take 128 lanes. There the rows are looked
# up in chunks of the tokens so that the padded rows of one chunk hold no
# more than all of them unpadded (elsewhere in one go).
_LANES = 128


def _chunks(tokens: int, columns: int) -> int:
  """How many chunks a device's `tokens` are looked up in: the largest
  divisor of `tokens` up to _LANES / `columns` (1 for 128 or more)."""
  most = max(1, -(-_LANES // columns))
  return max(k for k in range(1, min(most, tokens) + 1) if tokens % k == 0)


def take_rows(table, ids, names: Sequence[str | None], dtype=None):
  """table[ids] ([*ids.shape, width], in `dtype`, default the table's; cast
  before any collective moves it) for a [rows, width] table whose axes
  carry the logical `names`, ids [batch, length] split as the activations
  ('activation_batch', 'activation_length'). Returns None where this
  route does not apply (no mesh, a table whose width is not split over
  batch axes only, or whose vocabulary is split): use `jnp.take` there."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or ids.ndim != 2 or table.ndim != 2:
    return None
  free = mesh_lib.free_axes(mesh)
  spec = mesh_lib.fit_spec(nn.logical_to_mesh_axes(tuple(names)),
                           table.shape, mesh)
  ids_spec = mesh_lib.fit_spec(
      nn.logical_to_mesh_axes((mesh_lib.BATCH, _LENGTH)), ids.shape, mesh)

  def split(entry):
    return tuple(a for a in mesh_lib.axes_of(entry) if mesh.shape[a] > 1)

  vocab, width, batch = split(spec[0]), split(spec[1]), split(ids_spec[0])
  table_axes = set(mesh_lib.axes_of_spec(spec))
  ids_axes = set(mesh_lib.axes_of_spec(ids_spec))
  if (not width or vocab or not set(width) <= set(batch)
      or not table_axes | ids_axes <= free):
    return None
  dtype = table.dtype if dtype is None else dtype

  ways = math.prod(mesh.shape[a] for a in width)
  on_tpu = platform_lib.current() == "tpu"

  def lookup(table_block, ids_of_all):
    """[ways * n] ids, n of each device's -> this device's n rows, whole."""
    # The block has every row: jnp.take's reading of a negative id (from
    # the end) and of one out of range (NaN, no gradient) holds as is.
    x = jnp.take(table_block, ids_of_all, axis=0).astype(dtype)
    # Device j's tokens to device j, every device's columns side by side.
    return jax.lax.all_to_all(x, width, split_axis=0, concat_axis=1,
                              tiled=True)

  def local(table_block, ids_block):
    everyone = jax.lax.all_gather(ids_block.reshape(-1), width, axis=0,
                                  tiled=True)
    chunks = _chunks(ids_block.size, table_block.shape[1]) if on_tpu else 1
    if chunks == 1:
      return lookup(table_block, everyone).reshape(*ids_block.shape, -1)
    # Chunk c: the c-th part of every device's tokens.
    parts = everyone.reshape(ways, chunks, -1).transpose(1, 0, 2).reshape(
        chunks, -1)
    x = jax.lax.map(lambda part: lookup(table_block, part), parts)
    return x.reshape(*ids_block.shape, -1)

  return jax.shard_map(
      local, mesh=mesh, axis_names=free,
      in_specs=(spec, ids_spec),
      out_specs=PartitionSpec(ids_spec[0], ids_spec[1], None),
      check_vma=False)(table, ids)
