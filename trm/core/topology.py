"""TPU slices as compile targets: chips, their HBM, peak and networks.

`parse_topology('v4-64')` names a slice (every size Cloud TPU sells, and
any `gen:AxBxC` shape); `topology_devices` gets libtpu's compile-only
devices for it (no TPU needed), which `trm.aot` compiles for. The chip
constants below are the forecast's time model; BUILD_NOTES ("Multi-pod
forecast") gives the public source of each.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re


@dataclasses.dataclass(frozen=True)
class Chip:
  usable_hbm_gib: float   # what XLA:TPU reports as available (libtpu 0.0.42.1)
  peak_bf16_tflops: float  # published peak per chip
  chip_config: str
  chips_per_host: tuple[int, int, int]  # libtpu's host bounds
  hbm_gbps: float         # published HBM bandwidth per chip, GB/s
  ici_link_gbps: float    # one ICI link, one direction, GB/s
  torus_dims: int         # 3: 3-D torus (6 ports), 2: 2-D torus (4 ports)
  dcn_gbits_per_host: float  # data-center network, per host, Gb/s
  host_chips: int         # chips sharing one host's network
  wrap_rule: str          # 'cube': an axis wraps when it is a multiple of 4
                          # in a slice of whole 4x4x4 cubes; 'full16': only
                          # an axis of 16 (a full v5e/v6e pod side)
  mxu_width: int          # side of one MXU systolic array (W x W): Cloud
                          # TPU's architecture pages, 128 up to v5p, 256 on
                          # v6e. The time model charges a matmul the
                          # array's padding (ops.mxu_padding), not MFU.
  # The chip's PCIe link to its host, one direction, GB/s: what a remat
  # policy's offloaded tensors move at (How to Scale Your Model, ch. 2:
  # 16 each way on v4, "around 1.5e10 bytes/s per chip" typically, 32 on
  # v6e, "about 2x higher than v5").
  host_link_gbps: float = 15.0

  @property
  def dcn_gbits_per_chip(self) -> float:
    """One chip's share of its host's network: what it moves a
    cross-slice collective's bytes at."""
    return self.dcn_gbits_per_host / self.host_chips


CHIPS = {
    # v4's DCN: PaLM's cross-pod burst, 81 Tbps over 1536 hosts.
    "v4": Chip(30.75, 275.0, "megacore", (2, 2, 1), 1200.0, 45.0, 3,
               81e3 / 1536, 4, "cube", 128, host_link_gbps=16.0),
    "v5p": Chip(95.74, 459.0, "megacore", (2, 2, 1), 2765.0, 90.0, 3,
                4 * 50.0, 4, "cube", 128),
    "v5e": Chip(15.75, 197.0, "default", (2, 2, 1), 819.0, 45.0, 2,
                2 * 100.0, 8, "full16", 128),
    "v6e": Chip(31.25, 918.0, "default", (2, 2, 1), 1640.0, 90.0, 2,
                4 * 200.0, 8, "full16", 256, host_link_gbps=32.0),
}
ICI_HOP_SECONDS = 1e-6   # per ICI hop (How to Scale Your Model, ch. 2)
# Per step of a cross-slice ring (2 (N-1) steps per all-reduce over N
# slices): fitted on how MaxText's v5e 16B lost speed from 2 to 32 slices
# (benchmarks/forecast/forecast_maxtext.py --fit_dcn_on=v5e16b, 122.4 us;
# its 32B, 64B and 128B rows give 132-145 us; BUILD_NOTES "Session 51").
# No data sheet gives it.
DCN_STEP_SECONDS = 122e-6

# Named shapes per chip count (v4 and v5p name TensorCores: v4-N has N/2
# chips). Slices of whole 4x4x4 cubes not listed take the most cubic
# AxBxC of multiples of 4 (v4-384 is 4x4x12).
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8", 512: "8x8x8", 768: "8x8x12",
              1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16",
              6144: "16x16x24"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
              128: "8x16", 256: "16x16"}
# Largest slice of one ICI domain, in chips.
_MAX_CHIPS = {"v4": 4096, "v5p": 6144, "v5e": 256, "v6e": 256}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str        # e.g. v4-64
  generation: str  # v4 | v5p | v5e | v6e
  shape: str       # e.g. 2x4x4
  chips: int

  @property
  def chip(self) -> Chip:
    return CHIPS[self.generation]

  @property
  def dims(self) -> tuple[int, ...]:
    return tuple(int(d) for d in self.shape.split("x"))

  @property
  def wraps(self) -> tuple[bool, ...]:
    """Whether each axis closes into a ring (wraparound links)."""
    if self.chip.wrap_rule == "cube":
      whole_cubes = all(d % 4 == 0 for d in self.dims)
      return tuple(whole_cubes and d % 4 == 0 for d in self.dims)
    return tuple(d == 16 for d in self.dims)

  @property
  def wraps_xyz(self) -> tuple[bool, bool, bool]:
    """`wraps` over three axes (a 2-D slice's third axis is one chip)."""
    return self.wraps + (False,) * (3 - len(self.wraps))


def _cube_shape(chips: int) -> str | None:
  """Most cubic AxBxC (A <= B <= C, multiples of 4) with `chips` chips."""
  if chips % 64:
    return None
  best = None
  for a, b in itertools.product(range(4, 68, 4), repeat=2):
    if a > b or chips % (a * b) or (chips // (a * b)) % 4:
      continue
    c = chips // (a * b)
    if c < b:
      continue
    if best is None or c / a < best[2] / best[0]:
      best = (a, b, c)
  return "x".join(map(str, best)) if best else None


def _sizes_message(generation: str) -> str:
  if generation in ("v4", "v5p"):
    named = ", ".join(f"{generation}-{c * 2}" for c in sorted(_SHAPES_3D)
                      if c <= _MAX_CHIPS[generation])
    return (f"{named}, or any whole number of 4x4x4 cubes (e.g. "
            f"{generation}-384 = 4x4x12), or {generation}:AxBxC")
  return ", ".join(f"{generation}-{c}" for c in sorted(_SHAPES_2D))


def parse_topology(name: str) -> Topology:
  """'v4-64' -> 32 v4 chips in a 2x4x4 torus; 'v4:4x4x12' names a shape;
  v5litepod-N is v5e-N. Raises ValueError naming --topology."""
  name = str(name).strip()
  # ASCII digits only: a shape of other digits ('v4:4x4x٨') passed `\d`
  # and int() and reached libtpu, whose refusal was a traceback.
  explicit = re.fullmatch(
      r"(v4|v5p|v5e|v5litepod|v6e):([0-9]+(?:x[0-9]+){1,2})", name)
  match = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-([0-9]+)", name)
  if not (explicit or match):
    raise ValueError(
        f"--topology={name!r}: use v4-N or v5p-N (N = TensorCores, 2 per "
        "chip), v5e-N or v6e-N (N = chips), or a shape such as v4:4x4x12; "
        "e.g. --topology=v4-128.")
  generation = (explicit or match).group(1)
  generation = "v5e" if generation == "v5litepod" else generation
  three_d = generation in ("v4", "v5p")
  if explicit:
    shape = explicit.group(2)
    dims = [int(d) for d in shape.split("x")]
    chips = math.prod(dims)
    if (len(dims) != (3 if three_d else 2) or min(dims) < 1
        or chips > _MAX_CHIPS[generation]
        or (three_d and chips > 64 and any(d % 4 for d in dims))
        or (three_d and chips <= 64 and shape not in _SHAPES_3D.values())
        or (not three_d and shape not in _SHAPES_2D.values())):
      raise ValueError(f"--topology={name!r} is not a {generation} slice "
                       f"shape; sizes: {_sizes_message(generation)}.")
    return Topology(name, generation, shape, chips)
  count = int(match.group(2))
  if three_d:
    chips = count // 2
    shape = _SHAPES_3D.get(chips) or _cube_shape(chips)
    if count % 2 or shape is None or chips > _MAX_CHIPS[generation]:
      raise ValueError(f"--topology={name!r} is not a {generation} slice "
                       f"size; sizes: {_sizes_message(generation)}.")
  else:
    chips, shape = count, _SHAPES_2D.get(count)
    if shape is None:
      raise ValueError(f"--topology={name!r} is not a {generation} slice "
                       f"size; sizes: {_sizes_message(generation)}.")
  return Topology(name, generation, shape, chips)


def topology_devices(topology: Topology, num_slices: int):
  """Compile-only TPU devices from libtpu (no TPU needed), with the slice's
  wraparound links (`Topology.wraps`). libtpu's default is none: a v4-128
  then compiles for a 4x4x4 mesh rather than its torus, and XLA:TPU turns
  every FSDP all-gather into an all-reduce of a zero-padded buffer (twice
  the traffic, not overlapped): MaxText's 22B forecast 55.8% MFU on 4 of
  its layers instead of 60.5%."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  # A slice smaller than a host (v5e-1, v6e-1: one chip) is its own host:
  # libtpu refuses a layout its host bounds do not divide.
  dims = topology.dims + (1,) * (3 - len(topology.dims))
  host = tuple(min(h, d) for h, d in zip(topology.chip.chips_per_host, dims))
  try:
    return topologies.get_topology_desc(
        platform="tpu", topology_name=f"{topology.generation}:{topology.shape}",
        chip_config_name=topology.chip.chip_config,
        chips_per_host_bounds=host,
        num_slices=num_slices, wrap=topology.wraps_xyz).devices
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


def hbm_use(memory) -> tuple[int, int]:
  """(peak, sum): bytes a chip of a compiled program, from its
  `memory_analysis()` (`memory`): XLA's peak (`peak_memory_in_bytes`: arguments
  included, and host memory a remat policy offloads to: the 70B at 2 a
  chip on v6e-64 peaks at 57.15 GiB with 45.00 offloaded), and the sum of
  arguments, outputs and temporaries in HBM less the aliased (what MaxText
  prints). A backend that reports no peak (0) gets the sum for both.

  Neither is what XLA:TPU holds against the chip. It compiles a program
  for the chip's HBM (rescheduling and rematerializing under its limit)
  and refuses one it cannot fit ("... exceeds available HBM"), so a step
  that compiles fits: GPT-3 175B's on v6e-256 compiles with a sum of 35.56
  GiB for the chip's 31.25 (peak 29.02; BUILD_NOTES "Session 92")."""
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  peak = getattr(memory, "peak_memory_in_bytes", 0) or 0
  return (peak if peak > 0 else total), total


def roofline(flops: float, hbm_bytes: float, chip: Chip) -> dict:
  """Per-device step time bounds from compute and from HBM traffic."""
  compute_s = flops / (chip.peak_bf16_tflops * 1e12)
  memory_s = hbm_bytes / (chip.hbm_gbps * 1e9)
  return {"xla_flops_per_device": flops, "hbm_bytes_per_device": hbm_bytes,
          "flops_per_byte": flops / hbm_bytes if hbm_bytes else float("inf"),
          "compute_seconds": compute_s, "memory_seconds": memory_s,
          "bound": "memory" if memory_s > compute_s else "compute"}
