r"""Compile the real train step for a TPU topology on a CPU host.

  python -m trm.aot --config=configs/trm_sudoku.py --topology=v4-64 \
      [--num_slices=2 --config.mesh.dcn_data=2] [--config.key=value]

Uses libtpu's compile-only devices (`pip install -e .[tpu]`; no TPU needed)
and the trainer's own mesh, sharding and step code, then prints per chip the
argument, output, temporary and total bytes against the usable HBM, a FITS /
DOES NOT FIT verdict (exit code 1 when it does not fit), the compile time,
and the analytic training FLOPs per step with the step time they imply at 50%
MFU.
"""
from __future__ import annotations

import os

# Before jax loads libtpu: compile for TPU from a host that has none.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import dataclasses  # pylint: disable=g-import-not-at-top,wrong-import-position
import math
import re
import sys
import time

from absl import app, flags  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  usable_hbm_gib: float   # what XLA:TPU reports as available (libtpu 0.0.42.1)
  peak_bf16_tflops: float  # published peak per chip
  chip_config: str
  chips_per_host: tuple[int, int, int]


CHIPS = {
    "v4": Chip(30.75, 275.0, "megacore", (2, 2, 1)),
    "v5p": Chip(95.74, 459.0, "megacore", (2, 2, 1)),
    "v5e": Chip(15.75, 197.0, "default", (2, 2, 1)),
    "v6e": Chip(31.25, 918.0, "default", (2, 2, 1)),
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


def _train_step_builder(config, mesh, rules, metadata):
  """(function that compiles the model family's train step, FLOPs per step)."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from trm import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.models import get_model  # pylint: disable=g-import-not-at-top

  def under_mesh(fn):
    def run():
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        return fn()
    return run

  batch = config.global_batch_size
  if config.model.name == "dream":
    from trm import lm_steps  # pylint: disable=g-import-not-at-top
    model = get_model(config.model)
    tx = lm_steps.make_optimizer(config.optim, config.total_steps)
    init_fn = lm_steps.make_init_fn(model, tx, config.seed)
    abstract, shardings = state_lib.abstract_state(init_fn, mesh, rules)
    batch_shardings = lm_steps.batch_shardings(mesh, rules)
    flops = lm_steps.train_flops_per_example(model.cfg, config.seq_len) * batch
    return under_mesh(lambda: lm_steps.compile_train_step(
        config, model, tx, abstract, shardings, batch_shardings)), flops
  from trm import steps  # pylint: disable=g-import-not-at-top
  from trm.data import pipeline  # pylint: disable=g-import-not-at-top
  from trm.models import trm  # pylint: disable=g-import-not-at-top
  model = get_model(config.model, metadata)
  tx = steps.make_optimizer(config.optim, config.total_steps)
  init_fn = state_lib.make_init_fn(model, tx, batch, config.seed)
  abstract, shardings = state_lib.abstract_state(init_fn, mesh, rules)
  batch_shardings = pipeline.batch_shardings(mesh, rules)
  flops = trm.train_flops_per_example(model.cfg) * batch
  return under_mesh(lambda: steps.compile_train_step(
      config, model, tx, abstract, shardings, batch_shardings,
      metadata.seq_len)), flops


def compile_report(config, topology: Topology, num_slices: int,
                   metadata=None) -> dict:
  """Compiles the train step for the topology; returns the figures."""
  from trm import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  slices = math.prod(config.mesh.get(f"dcn_{a}", 1) for a in mesh_lib.MESH_AXES)
  if slices != num_slices:
    raise mesh_lib.MeshConfigError(
        f"config.mesh.dcn_* multiply to {slices} slices but --num_slices="
        f"{num_slices}: set --config.mesh.dcn_data={num_slices}.")
  devices = topology_devices(topology, num_slices)
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  rules = mesh_lib.logical_rules(config)
  mesh_lib.check_batch_size(config.global_batch_size, mesh, rules)
  compile_step, flops = _train_step_builder(config, mesh, rules, metadata)
  report = {
      "topology": topology.name, "num_slices": num_slices,
      "chips": len(devices), "mesh": dict(mesh.shape),
      "global_batch_size": config.global_batch_size,
      "per_device_batch": config.global_batch_size
                          / mesh_lib.batch_parallelism(mesh, rules),
      "usable_gib": topology.chip.usable_hbm_gib,
      "train_flops_per_step": flops,
      "step_seconds_at_50pct_mfu": flops / (
          0.5 * len(devices) * topology.chip.peak_bf16_tflops * 1e12),
  }
  start = time.time()
  try:
    compiled = compile_step()
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text and "hbm" not in text.lower():
      raise
    report.update(compile_seconds=time.time() - start, fits=False,
                  error=text.splitlines()[0][:400])
    return report
  memory = compiled.memory_analysis()
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  report.update(
      compile_seconds=time.time() - start,
      argument_gib=memory.argument_size_in_bytes / GIB,
      output_gib=memory.output_size_in_bytes / GIB,
      temp_gib=memory.temp_size_in_bytes / GIB,
      alias_gib=memory.alias_size_in_bytes / GIB,
      total_gib=total / GIB,
      fits=total / GIB <= topology.chip.usable_hbm_gib)
  return report


def format_report(report: dict) -> str:
  lines = [
      f"topology: {report['topology']} x {report['num_slices']} slice(s), "
      f"{report['chips']} chips; mesh {report['mesh']}; global batch "
      f"{report['global_batch_size']} ({report['per_device_batch']:g} per "
      "data-parallel device)",
      f"compile_seconds: {report['compile_seconds']:.1f}",
  ]
  if "total_gib" in report:
    lines.append(
        f"per chip: arguments {report['argument_gib']:.2f} GiB, outputs "
        f"{report['output_gib']:.2f} GiB, temporaries {report['temp_gib']:.2f}"
        f" GiB, aliased {report['alias_gib']:.2f} GiB, total "
        f"{report['total_gib']:.2f} GiB of {report['usable_gib']:.2f} GiB "
        "usable")
  else:
    lines.append(f"compiler: {report['error']}")
  lines += [
      f"train_flops_per_step: {report['train_flops_per_step']:.3e} (model "
      "FLOPs)",
      f"step_seconds_at_50pct_mfu: {report['step_seconds_at_50pct_mfu']:.4f}",
      f"verdict: {'FITS' if report['fits'] else 'DOES NOT FIT'}",
  ]
  return "\n".join(lines)


def dataset_metadata(config, overrides: dict):
  """Shapes of the config's dataset without reading it (TRM configs; None
  for language models, whose shapes are all in the config)."""
  from trm.data import sudoku  # pylint: disable=g-import-not-at-top
  if config.model.name != "trm":
    return None
  if config.data.name != "sudoku":
    raise ValueError(f"config.data.name={config.data.name!r}: no known shapes;"
                     " known: 'sudoku'.")
  metadata = sudoku.dataset_metadata(1)
  return dataclasses.replace(
      metadata, **{k: v for k, v in overrides.items() if v is not None})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _TOPOLOGY.value:
    raise app.UsageError("--topology is required, e.g. --topology=v4-8.")
  topology = parse_topology(_TOPOLOGY.value)
  if _NUM_SLICES.value < 1:
    raise app.UsageError("--num_slices must be >= 1.")
  metadata = dataset_metadata(_CONFIG.value, {
      "seq_len": _SEQ_LEN.value, "vocab_size": _VOCAB.value,
      "num_puzzle_identifiers": _PUZZLES.value})
  report = compile_report(_CONFIG.value, topology, _NUM_SLICES.value,
                          metadata)
  print(format_report(report), flush=True)
  sys.exit(0 if report["fits"] else 1)


def define_flags():
  """Defines the command-line flags; only when run as a program, so that
  tests can import several entry points into one process."""
  global _CONFIG, _TOPOLOGY, _NUM_SLICES, _SEQ_LEN, _VOCAB, _PUZZLES
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.",
                                            lock_config=True)
  _TOPOLOGY = flags.DEFINE_string("topology", None, "e.g. v4-8, v4-64, v5p-128.")
  _NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices (multi-slice).")
  _SEQ_LEN = flags.DEFINE_integer("seq_len", None, "Override the dataset's "
                                  "sequence length (e.g. 900 for ARC/Maze).")
  _VOCAB = flags.DEFINE_integer("vocab_size", None, "Override the vocabulary.")
  _PUZZLES = flags.DEFINE_integer("num_puzzle_identifiers", None,
                                  "Override the puzzle-embedding rows.")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config"])
  app.run(main)
