"""TPU slices as compile targets: chips, their HBM and peak, and rooflines.

`parse_topology('v4-64')` names a slice; `topology_devices` gets libtpu's
compile-only devices for it (no TPU needed), which `trm.aot` compiles for.
"""
from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Chip:
  usable_hbm_gib: float   # what XLA:TPU reports as available (libtpu 0.0.42.1)
  peak_bf16_tflops: float  # published peak per chip
  chip_config: str
  chips_per_host: tuple[int, int, int]
  hbm_gbps: float         # published HBM bandwidth per chip, GB/s


CHIPS = {
    "v4": Chip(30.75, 275.0, "megacore", (2, 2, 1), 1200.0),
    "v5p": Chip(95.74, 459.0, "megacore", (2, 2, 1), 2765.0),
    "v5e": Chip(15.75, 197.0, "default", (2, 2, 1), 819.0),
    "v6e": Chip(31.25, 918.0, "default", (2, 2, 1), 1640.0),
}

# Physical shape per chip count (v4 and v5p name cores: v4-N has N/2 chips).
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8", 512: "8x8x8", 768: "8x8x12",
              1024: "8x8x16", 2048: "8x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
              128: "8x16", 256: "16x16"}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str        # e.g. v4-64
  generation: str  # v4 | v5p | v5e | v6e
  shape: str       # e.g. 2x4x4
  chips: int

  @property
  def chip(self) -> Chip:
    return CHIPS[self.generation]


def parse_topology(name: str) -> Topology:
  """'v4-64' -> 32 v4 chips in a 2x4x4 torus; v5litepod-N is v5e-N."""
  match = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name)
  if not match:
    raise ValueError(f"--topology={name!r}: use v4-N, v5p-N (N = TensorCores,"
                     " 2 per chip), v5e-N or v6e-N (N = chips), e.g. v4-64.")
  generation, count = match.group(1), int(match.group(2))
  generation = "v5e" if generation == "v5litepod" else generation
  if generation in ("v4", "v5p"):
    chips, shapes = count // 2, _SHAPES_3D
  else:
    chips, shapes = count, _SHAPES_2D
  if chips not in shapes or (generation in ("v4", "v5p") and count % 2):
    raise ValueError(f"--topology={name!r} is not a known slice size; known "
                     f"{generation} sizes: " + ", ".join(
                         f"{generation}-{c * 2 if generation in ('v4', 'v5p') else c}"
                         for c in sorted(shapes)))
  return Topology(name, generation, shapes[chips], chips)


def topology_devices(topology: Topology, num_slices: int):
  """Compile-only TPU devices from libtpu (no TPU needed)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    return topologies.get_topology_desc(
        platform="tpu", topology_name=f"{topology.generation}:{topology.shape}",
        chip_config_name=topology.chip.chip_config,
        chips_per_host_bounds=topology.chip.chips_per_host,
        num_slices=num_slices).devices
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"Could not create {topology.name} devices from libtpu ({e}). Install "
        "the TPU extra: pip install -e .[tpu]") from e


def step_cost(compiled) -> tuple[float, float]:
  """(FLOPs, bytes accessed) per device from XLA's cost analysis of a
  compiled program (loop bodies counted once: see `unroll_loops`)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0]
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def roofline(flops: float, hbm_bytes: float, chip: Chip) -> dict:
  """Per-device step time bounds from compute and from HBM traffic."""
  compute_s = flops / (chip.peak_bf16_tflops * 1e12)
  memory_s = hbm_bytes / (chip.hbm_gbps * 1e9)
  return {"xla_flops_per_device": flops, "hbm_bytes_per_device": hbm_bytes,
          "flops_per_byte": flops / hbm_bytes if hbm_bytes else float("inf"),
          "compute_seconds": compute_s, "memory_seconds": memory_s,
          "bound": "memory" if memory_s > compute_s else "compute"}
