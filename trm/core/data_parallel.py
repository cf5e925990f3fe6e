"""Gradients summed over the data-parallel devices once per step.

A weight used several times in one step (TRM's shared network, applied
L_cycles + 1 times with gradient; any model over gradient-accumulation
micro-batches) gets one partial gradient per use. Under plain GSPMD each
partial is reduced over the batch's devices where it is made: XLA:TPU
compiles TRM's paper Sudoku step on 2 v4-64 slices with 58 cross-slice
all-reduces per step (14 per weight, in bfloat16), and a micro-batch loop
all-reduces every gradient in every micro-step. PyTorch's DDP sums the
local float32 gradients once (`no_sync` for the micro-steps).

`sum_over_data` does the same on a data-parallel mesh: the step's body
runs under `shard_map` on each device's rows, so every partial gradient
stays on its device and is summed there in float32, and the body's summed
outputs are reduced over the batch's devices once. The data-parallel axes
are those that split the batch and no weight; with them, each across the
slices (`dcn_data`) and inside them.

A mesh that also splits weights (`fsdp` or `model` > 1) cannot be made
manual over `data` alone: XLA's SPMD partitioner (jax 0.10.2) aborts the
process on a step manual over `data` and automatic over both `fsdp` and
`model`. There the body stays GSPMD's, mapped (`vmap`) over the rows of
each data-parallel index: each group's partial sums keep a leading axis
split over the data axes, so GSPMD has nothing to reduce over them until
the groups are summed, once, after the body. Over `fsdp` and `model` a
weight's gradient is still reduce-scattered where it is made, as FSDP's
must be to keep its memory split.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

from trm.core import mesh as mesh_lib
from trm.nn import linear


def data_parallel_axes(mesh, rules) -> tuple[str, ...]:
  """Mesh axes (size > 1) that split the batch ('activation_batch') and
  that no other logical-axis rule names: over them every weight is whole
  on each device, so its gradient can wait to be summed."""
  if mesh is None or mesh.empty:
    return ()
  batch, other = None, set()
  for name, axes in rules:
    if name == mesh_lib.BATCH:
      if batch is None:  # first match wins, as for the rules (None too)
        batch = mesh_lib.axes_of(axes)
    else:
      other.update(mesh_lib.axes_of(axes))
  free = mesh_lib.free_axes(mesh)
  return tuple(a for a in batch or ()
               if a not in other and a in free and mesh.shape[a] > 1)


def rules_without(rules, axes) -> tuple:
  """The rules with `axes` dropped from every entry."""
  out = []
  for name, value in rules:
    kept = tuple(a for a in mesh_lib.axes_of(value) if a not in axes)
    out.append((name, None if not kept else kept[0] if len(kept) == 1
                else kept))
  return tuple(out)


def _plan():
  """(mesh, rules, data-parallel axes (() to run the body as it is), and
  whether the mesh also splits weights), from the context being traced
  under."""
  mesh = jax.sharding.get_abstract_mesh()
  rules = tuple(nn.get_logical_axis_rules())
  axes = data_parallel_axes(mesh, rules)
  free = mesh_lib.free_axes(mesh)
  splits_weights = any(mesh.shape[a] > 1 for a in free - set(axes))
  return mesh, rules, axes, splits_weights


def shard_count(enabled: bool = True) -> int:
  """How many data-parallel groups `sum_over_data` splits the rows into
  here (1: it runs the body as it is)."""
  if not enabled:
    return 1
  mesh, _, axes, _ = _plan()
  return math.prod(mesh.shape[a] for a in axes) if axes else 1


def sum_over_data(body: Callable, whole: Any, rows: Any,
                  enabled: bool = True):
  """(summed, rows_out) = body(whole, rows), the step's data-parallel part.

  `whole`: what every device holds whole over the batch's devices (the
  parameters, random keys, scalars). `rows`: arrays whose leading axis is
  the batch (split as 'activation_batch'). `body` returns `(summed,
  rows_out)`: `summed` (gradients, the loss: each this device's share of
  the whole batch's) is summed over the data-parallel devices once, and
  every leaf of `rows_out` has the batch as its leading axis. Run inside
  the step's trace, under the sharding context.

  Partials are summed in the dtype the body returns them in: a gradient
  the body makes in bfloat16 (a bfloat16 weight's) is rounded once per
  device or group before the sum, where one device rounds the whole sum
  once. A `summed` leaf that does not depend on the rows is counted once
  per device or group, and every `rows_out` leaf must come from the rows.
  `enabled=False` (`config.reduce_gradients_once`) runs the body as it is.
  """
  mesh, rules, axes, splits_weights = _plan()
  if not axes or not enabled:
    return body(whole, rows)
  if splits_weights:
    return _sum_over_groups(body, whole, rows, mesh, rules, axes)
  free = mesh_lib.free_axes(mesh)
  split = PartitionSpec(axes)
  local_rules = rules_without(rules, free)

  def local(whole, rows):
    with nn.logical_axis_rules(local_rules):
      summed, rows_out = body(whole, rows)
    return jax.lax.psum(summed, axes), rows_out

  # Each spec is a prefix of its whole tree: every leaf of `whole` and
  # `summed` whole, every leaf of `rows` and `rows_out` split.
  return jax.shard_map(
      local, mesh=mesh, in_specs=(PartitionSpec(), split),
      out_specs=(PartitionSpec(), split),
      axis_names=free, check_vma=False)(whole, rows)


def _sum_over_groups(body, whole, rows, mesh, rules, axes):
  """sum_over_data on a mesh that also splits weights, under GSPMD: the
  rows are grouped by their data-parallel devices and the body is mapped
  over the groups (`vmap` with the data axes as its SPMD axis), so each
  group's partial sums keep a leading axis split over those axes and are
  reduced over them once, after the body. Inside, the weights' own axes
  (fsdp, model) are GSPMD's as before."""
  groups = math.prod(mesh.shape[a] for a in axes)
  inner = rules_without(rules, axes)
  inner_batch = next(v for name, v in inner if name == mesh_lib.BATCH)
  unconstrained = PartitionSpec.UNCONSTRAINED

  def grouped(a):  # [rows, ...] -> [groups, rows per group, ...], no copy
    a = a.reshape(groups, a.shape[0] // groups, *a.shape[1:])
    return jax.lax.with_sharding_constraint(a, PartitionSpec(
        axes, inner_batch, *(unconstrained,) * (a.ndim - 2)))

  def local(whole, rows):
    with nn.logical_axis_rules(inner), linear.widened_on_cpu():
      return body(whole, rows)

  summed, rows_out = jax.vmap(
      local, in_axes=(None, 0), out_axes=0, spmd_axis_name=axes)(
          whole, jax.tree.map(grouped, rows))
  summed = jax.tree.map(lambda a: a.sum(0), summed)
  rows_out = jax.tree.map(
      lambda a: a.reshape(a.shape[0] * a.shape[1], *a.shape[2:]), rows_out)
  return summed, rows_out
