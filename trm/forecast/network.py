"""Collectives of the compiled program, placed on the slice's torus and the
data-center network, with the time their algorithm takes.

Inside a slice (ICI) a collective over a group of n chips runs as rings
along the torus axes the group spans, all axes at once: a ring on an axis
that wraps around sends both ways (2 links per chip), one that does not
sends one way. Its time is its traffic per chip over the summed bandwidth
of those rings, plus one hop latency per hop of each ring's diameter
(half the ring on an axis that wraps, extent - 1 on one that does not),
once per collective, not per ring step. Across slices (DCN),
XLA:TPU emits megascale send/recv pairs; each chip's share of the host
NICs carries a ring all-reduce's 2 (N-1)/N of its buffer, and each of the
ring's 2 (N-1) steps (N-1 for a gather or scatter) costs a latency
(`topology.DCN_STEP_SECONDS`, fitted): the bytes per chip level off as N
grows, the steps do not.

Traffic per chip (bytes it sends), n = group size:
  all-gather      (n-1)/n x its result
  reduce-scatter  (n-1)/n x its operand
  all-reduce      2 (n-1)/n x its operand
  all-to-all      (n-1)/n x its operand
  collective-permute   its operand
"""
from __future__ import annotations

import dataclasses
import math
import re

from trm.core import topology as topology_lib
from trm.forecast import hlo
from trm.forecast import ops

AXIS_NAMES = ("x", "y", "z")


@dataclasses.dataclass(frozen=True)
class Fabric:
  """Where the program's partitions sit and how fast they talk."""
  coords: tuple[tuple[int, ...], ...]  # torus coordinates per partition id
  dims: tuple[int, ...]                # torus extent per axis
  wraps: tuple[bool, ...]              # per axis: closes into a ring
  link_bytes_per_second: float         # one ICI link, one direction
  dcn_bytes_per_second: float          # per chip
  num_slices: int
  hop_seconds: float = topology_lib.ICI_HOP_SECONDS
  dcn_step_seconds: float = topology_lib.DCN_STEP_SECONDS
  # The chip's link to host memory, per direction (0: not priced).
  host_bytes_per_second: float = 0.0
  # Links a collective-permute's bytes share: 1 is the model (one link,
  # one direction); more is a sensitivity (forecast_maxtext.py
  # --permute_links), not a measured figure.
  permute_links: float = 1.0

  @classmethod
  def for_mesh(cls, mesh, topology: topology_lib.Topology,
               num_slices: int) -> "Fabric":
    """Partition p of the compiled (per-slice) program is the p-th device
    of slice 0 in the mesh's device order."""
    devices = [d for d in mesh.devices.flat
               if getattr(d, "slice_index", 0) == 0]
    dims = topology.dims + (1,) * (3 - len(topology.dims))
    coords = tuple(tuple(int(c) for c in (list(d.coords) + [0, 0, 0])[:3])
                   for d in devices)
    chip = topology.chip
    return cls(coords, dims, topology.wraps_xyz, chip.ici_link_gbps * 1e9,
               chip.dcn_gbits_per_chip * 1e9 / 8, num_slices,
               host_bytes_per_second=chip.host_link_gbps * 1e9)

  def axes_of(self, group: list[int]) -> list[tuple[int, int]]:
    """(axis, distinct coordinates) of each torus axis the group spans."""
    if not group or max(group) >= len(self.coords):
      return []
    out = []
    for axis in range(3):
      extent = len({self.coords[p][axis] for p in group})
      if extent > 1:
        out.append((axis, extent))
    return out

  def ring_seconds(self, traffic: float, group: list[int]) -> tuple[float,
                                                                     str]:
    """Time of `traffic` bytes per chip moved in rings over the group's
    axes, and the axes' names."""
    axes = self.axes_of(group)
    if not axes:
      # Unknown placement (more partitions than devices): one axis, one way.
      if len(group) <= 1:
        return 0.0, ""
      return (traffic / self.link_bytes_per_second
              + (len(group) - 1) * self.hop_seconds), "?"
    bandwidth, hops = 0.0, 0
    for axis, extent in axes:
      ring = self.wraps[axis] and extent == self.dims[axis]
      bandwidth += self.link_bytes_per_second * (2 if ring else 1)
      hops += extent // 2 if ring else extent - 1
    return (traffic / bandwidth + hops * self.hop_seconds,
            "".join(AXIS_NAMES[a] for a, _ in axes))

  def hops(self, a: int, b: int) -> list[tuple[int, int]]:
    """(axis, signed hops) from partition a to b on the torus."""
    out = []
    for axis in range(3):
      delta = self.coords[b][axis] - self.coords[a][axis]
      size = self.dims[axis]
      if self.wraps[axis] and abs(delta) > size // 2:
        delta -= int(math.copysign(size, delta))
      if delta:
        out.append((axis, delta))
    return out


@dataclasses.dataclass(frozen=True)
class Collective:
  """One collective as the program runs it once."""
  name: str
  kind: str              # all-gather | all-reduce | reduce-scatter | ...
  network: str           # ici | dcn
  payload_bytes: float   # the buffer per chip (see the module docstring)
  traffic_bytes: float   # what each chip sends
  group_size: int
  axes: str              # torus axes (ICI, e.g. 'xyz') or 'slices' (DCN)
  seconds: float         # at full bandwidth, uncontended
  resource: str          # concurrent collectives on one resource queue


def _first_group_size(groups):
  return len(groups[0]) if groups else 1


def _megascale_slices(target: str | None, default: int) -> int:
  """'{1,2,3,4}x{0:7}' -> 4: the slices the transfer spans."""
  if not target:
    return default
  first = re.match(r"\{([^}]*)\}", target)
  if not first:
    return default
  count = 0
  for item in first.group(1).split(","):
    item = item.strip()
    if ":" in item:
      lo, hi = (int(x) for x in item.split(":"))
      count += hi - lo + 1
    elif item:
      count += 1
  return max(count, 1)


def _dcn_traffic(kind: str, payload: float, slices: int) -> float:
  if slices <= 1:
    return 0.0
  share = (slices - 1) / slices
  return {"ALL_REDUCE": 2 * share * payload,
          "REDUCE_SCATTER": share * payload,
          "ALL_GATHER": (slices - 1) * payload,
          "ALL_TO_ALL": share * payload}.get(kind, payload)


def _dcn_steps(kind: str, slices: int) -> int:
  """Sequential steps of the cross-slice ring: 2 (N-1) for an all-reduce
  (a reduce-scatter, then an all-gather), N-1 for one of those alone or an
  all-to-all, 1 for a point-to-point transfer."""
  if slices <= 1:
    return 0
  return {"ALL_REDUCE": 2 * (slices - 1), "REDUCE_SCATTER": slices - 1,
          "ALL_GATHER": slices - 1, "ALL_TO_ALL": slices - 1}.get(kind, 1)


def _traffic(kind: str, payload: float, n: int) -> float:
  if n <= 1:
    return 0.0
  share = (n - 1) / n
  return {"all-reduce": 2 * share * payload}.get(
      kind, payload if kind == "collective-permute" else share * payload)


def describe(module: hlo.Module, comp: hlo.Computation,
             inst: hlo.Instruction, fabric: Fabric) -> Collective | None:
  """The collective `inst` starts or runs, or None if it is not one."""
  opcode = inst.opcode
  if opcode == "send" and inst.frontend_attribute(
      "_xla_megascale_transfer_type"):
    kind = inst.frontend_attribute("_xla_megascale_transfer_type")
    payload = inst.shape[0].bytes if inst.shape else 0.0
    slices = _megascale_slices(
        inst.frontend_attribute("_xla_megascale_target"), fabric.num_slices)
    traffic = _dcn_traffic(kind, payload, slices)
    seconds = (traffic / fabric.dcn_bytes_per_second
               + _dcn_steps(kind, slices) * fabric.dcn_step_seconds)
    return Collective(inst.name, "dcn-" + kind.lower().replace("_", "-"),
                      "dcn", payload, traffic, slices, "slices", seconds,
                      "dcn")
  if opcode == "async-start":
    called = [c for c in inst.called() if c in module.computations]
    if not called:
      return None
    inner_comp = module.computations[called[0]]
    inner = inner_comp.root
    if inner.opcode not in ops.COLLECTIVES:
      return None
    return _ici(module, inner_comp, inner, inner.opcode, fabric, inst.name)
  kind = ops.ASYNC_STARTS.get(opcode, opcode if opcode in ops.COLLECTIVES
                              else None)
  if kind is None:
    return None
  return _ici(module, comp, inst, kind, fabric, inst.name)


def _ici(module, comp, inst, kind, fabric, name) -> Collective:
  operand_bytes = [sum(a.bytes for a in comp.by_name[o].shape)
                   for o in inst.operands if o in comp.by_name]
  if kind == "collective-permute":
    payload = inst.shape[0].bytes if inst.shape else 0.0
    pairs = [(s, t) for s, t in hlo.source_target_pairs(inst) if s != t]
    if not pairs:
      return Collective(name, kind, "ici", payload, 0.0, 1, "", 0.0, "ici")
    steps = fabric.hops(*pairs[0]) if max(max(p) for p in pairs) < len(
        fabric.coords) else [(0, 1)]
    hops = sum(abs(d) for _, d in steps) or 1
    axes = "".join(AXIS_NAMES[a] for a, _ in steps)
    direction = "+" if (steps and steps[0][1] > 0) else "-"
    seconds = payload / (fabric.link_bytes_per_second
                         * fabric.permute_links) + hops * fabric.hop_seconds
    return Collective(name, kind, "ici", payload, payload, len(pairs), axes,
                      seconds, f"ici-permute-{axes}{direction}")
  groups = hlo.replica_groups(inst, module.num_partitions)
  n = _first_group_size(groups)
  if kind == "all-gather":
    outputs = inst.shape[len(inst.operands):] or inst.shape
    if inst.opcode == "all-gather":
      outputs = inst.shape
    payload = sum(a.bytes for a in outputs)
  elif kind in ("reduce-scatter",):
    payload = sum(operand_bytes) or inst.result_bytes * n
  else:
    payload = sum(operand_bytes) or inst.result_bytes
  traffic = _traffic(kind, payload, n)
  seconds, axes = fabric.ring_seconds(traffic, groups[0] if groups else [])
  return Collective(name, kind, "ici", payload, traffic, n, axes, seconds,
                    "ici")
