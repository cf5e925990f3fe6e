r"""Compile the real train step for a TPU topology on a CPU host.

  python -m trm.aot --config=configs/trm_sudoku.py --topology=v4-64 \
      [--num_slices=2] [--config.key=value]
  python -m trm.aot --config=configs/gpt.py:maxtext22b --topology=v4-128 \
      --num_slices=1,2,4,8 --forecast [--forecast_json=PATH] [--collectives]
      [--hot_spots]
      [--calibrate_mfu=F | --efficiency=F] [--batch_scaling=weak|strong]
      [--dcn_overlap=none|schedule] [--dcn_step_us=X]
  python -m trm.aot --config=... --topology=v4-128 --num_slices=2 \
      --forecast --search [--search_limit=N --search_top=5]
  python -m trm.aot --config=configs/gpt.py --topology=v4-8 --vocab_size=50304
  python -m trm.aot --config=configs/diffucoder_7b.py --topology=v4-64 \
      --mode=sample [--sample_batch=32 --prompt_len=512 --max_new_tokens=512
      --steps=512 --alg=entropy --temperature=0.3 --top_p=0.95
      --cache=dual --block_length=32 --threshold=0.9]
  python -m trm.aot --config=configs/trm_sudoku.py --topology=v4-64 \
      --save_compiled=step.bin     # then: trm.main --config.compiled_step=
  JAX_PLATFORMS=cpu python -m trm.aot --config=configs/trm_sudoku.py:cpu \
      --topology=local --save_compiled=step.bin   # this host's devices

Uses libtpu's compile-only devices (`pip install -e .[tpu]`; no TPU needed)
and the trainer's own mesh, sharding and step code, then prints per chip the
argument, output, temporary and total bytes and XLA's peak, a FITS / DOES
NOT FIT verdict (XLA:TPU's: it compiles the step for the chip's HBM or
refuses it; exit code 1 when it does not fit), the compile time,
and the analytic training FLOPs per step with the step time they imply at 50%
MFU.

`--num_slices` takes a list (one compile each; config.mesh.dcn_data follows
each count). `--forecast` turns each compiled step into a row of step time,
throughput, TFLOP/s per chip, MFU, scaling, ICI and DCN bytes per chip and
the bound, from the compiled program's own collectives and schedule
(`trm/forecast/`); `--search` ranks the mesh layouts of one slice count.

The step comes from the model family's program builder
(`trm/families/<name>/program.py`), the same code `trm.main` trains with.
`--mode=sample` compiles instead a family's whole sampling loop (Dream /
DiffuCoder: `trm/families/dream/sample_program.py`; `--cache=prefix|dual`
compiles the cached block decoder instead of the exact loop).

`--save_compiled=FILE` writes the compiled train step with what it was
built for (`trm/core/compiled_step.py`): every worker of a run started with
`--config.compiled_step=FILE` loads it instead of compiling, after checking
jax/libtpu, devices, mesh, code, config and input shapes against its own.
"""
from __future__ import annotations

import os
import tempfile

# Before jax loads libtpu: compile for TPU from a host that has none.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
from trm.core import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
if not any(__import__("glob").glob(p) for p in cli.ACCELERATOR_FILES):
  # With no metadata server, libtpu logs E0000 lines about the host it runs
  # on; it only compiles here, for the topology named by --topology.
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v4-8")

import dataclasses  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import math
import sys
import time

from absl import app, flags  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags

from trm import families  # (imports no family until one is named)
from trm.core.topology import (Topology, hbm_use, parse_topology, roofline,
                               step_cost, topology_devices)

GIB = 2**30
# --topology=local: this host's own devices, for --save_compiled.
LOCAL = "local"


def _step_compiler(program, ctx, config):
  """() -> the program's train step compiled for one global batch, with
  the trainer's XLA options for this mesh (`tpu_flags.for_mesh`)."""
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  from trm.core import tpu_flags  # pylint: disable=g-import-not-at-top
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  return lambda: task_lib.compile_train_step(
      program, ctx, config.global_batch_size, abstract, shardings,
      tpu_flags.for_mesh(config, ctx.mesh))


def _step_saver(program, ctx, config, topology_name: str):
  """(compiled step, path) -> header: writes what `--config.compiled_step`
  loads (`trm.core.compiled_step`), checked against the same inputs."""
  from trm.core import compiled_step  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  fields = compiled_step.program_fields(config)
  abstract, _ = state_lib.abstract_state(program.init_fn, ctx)
  args = compiled_step.abstract_args(program, ctx, abstract,
                                     config.global_batch_size)
  return lambda compiled, path: compiled_step.save(
      path, compiled, ctx.mesh, args, fields, topology_name)


def _progress(message: str) -> None:
  print(message, file=sys.stderr, flush=True)


def _state_gib(program, ctx) -> float:
  """GiB of the train state (parameters, optimizer moments, counters) that
  one chip holds: each array's shard on the mesh, before any activation."""
  import jax  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  abstract, _ = state_lib.abstract_state(program.init_fn, ctx)
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(abstract)) / GIB


def _train_step_builder(config, ctx, shapes, topology_name: str = ""):
  """(function that compiles the family's train step, FLOPs per step,
  function that compiles its loop-unrolled twin for cost analysis or None,
  function that saves a compiled step for `--config.compiled_step`,
  function giving the train state's GiB per chip), from the family's
  program builder: the trainer's own model, state and step."""
  program = families.program(config.model.name).build(config, ctx, shapes)
  # The trainer's line, after the family's own refusals (Dream's weights).
  families.warn_if_heads_unsplit(config, ctx)

  def compile_twin():
    return _step_compiler(program.cost_twin(), ctx, config)()

  def save(compiled, path):
    return _step_saver(program, ctx, config, topology_name)(compiled, path)

  return (_step_compiler(program, ctx, config), program.flops_per_step,
          compile_twin if program.cost_twin is not None else None, save,
          lambda: _state_gib(program, ctx))


def _sampler_family(config):
  """The program module of a family that has a sampler to compile."""
  family = families.program(config.model.name)
  if not hasattr(family, "build_sampler"):
    raise ValueError(f"--mode=sample: model family {config.model.name!r} "
                     "has no sampler to compile (Dream / DiffuCoder "
                     "configs do).")
  return family


@dataclasses.dataclass(frozen=True)
class SampleSettings:
  """What `--mode=sample` compiles: one `diffusion_generate` call, or with
  `cache` 'prefix' / 'dual' one `cached_generate` call."""
  batch: int | None        # prompts per call (None: one per data-parallel
                           # device, filled in by `compile_report`)
  prompt_len: int = 512    # left-padded prompt length P
  max_new_tokens: int = 512
  steps: int = 512
  alg: str = "entropy"
  temperature: float = 0.0
  top_p: float | None = None
  cache: str = "none"      # none: the exact loop; prefix / dual: cached
  block_length: int = 32   # cached: tokens per block
  threshold: float | None = None  # cached: parallel decoding threshold
  fast_dllm: bool = False  # cached: Fast-dLLM's own block rules

  def __post_init__(self):
    for flag, value in (("sample_batch", self.batch),
                        ("prompt_len", self.prompt_len),
                        ("max_new_tokens", self.max_new_tokens),
                        ("steps", self.steps),
                        ("block_length", self.block_length)):
      # Below 2**31, as the train sizes' flags: --max_new_tokens=10**20
      # was "error: Maximum allowed size exceeded", naming no flag.
      if value is not None and (not isinstance(value, int)
                                or not 1 <= value < 2**31):
        raise ValueError(f"--{flag}={value!r} must be a positive integer "
                         "below 2**31.")
    # Before: nan passed the family's `temperature < 0` check and was
    # compiled and reported as the sampling temperature.
    if not math.isfinite(self.temperature):
      raise ValueError(f"--temperature={self.temperature} must be a finite "
                       "number >= 0 (0: greedy).")


def compile_report(config, topology: Topology, num_slices: int,
                   shapes=None, sample: SampleSettings | None = None,
                   save_compiled: str | None = None) -> dict:
  """Compiles the train step (or with `sample`, the family's sampling loop)
  for the topology; returns the figures. `shapes`: the data's sizes where
  the model depends on them (the family's `data_shapes`). `save_compiled`:
  a file to write the compiled train step to when it fits, for
  `--config.compiled_step` (report key `saved`)."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import tpu_flags  # pylint: disable=g-import-not-at-top

  slices = math.prod(config.mesh.get(f"dcn_{a}", 1) for a in mesh_lib.MESH_AXES)
  if slices != num_slices:
    raise mesh_lib.MeshConfigError(
        f"config.mesh.dcn_* multiply to {slices} slices but --num_slices="
        f"{num_slices}: set --config.mesh.dcn_data={num_slices}.")
  devices = topology_devices(topology, num_slices)
  ctx = mesh_lib.ShardingContext.from_config(config, devices)
  mesh = ctx.mesh
  half_peak = 0.5 * len(devices) * topology.chip.peak_bf16_tflops * 1e12
  report = {
      "mode": "sample" if sample else "train",
      "topology": topology.name, "num_slices": num_slices,
      "chips": len(devices), "mesh": dict(mesh.shape),
      "usable_gib": tpu_flags.hbm_limit_gib(config,
                                            topology.chip.usable_hbm_gib),
  }
  if sample is None:
    ctx.check_batch_size(config.global_batch_size)
    compile_step, flops, compile_twin, save_step, state_gib = (
        _train_step_builder(config, ctx, shapes, topology.name))
    report.update({
        "global_batch_size": config.global_batch_size,
        "per_device_batch": config.global_batch_size / ctx.batch_parallelism,
        "train_flops_per_step": flops,
        "step_seconds_at_50pct_mfu": flops / half_peak,
    })
  else:
    family = _sampler_family(config)
    compile_twin = None
    ways = ctx.batch_parallelism
    if sample.batch is None:
      sample = dataclasses.replace(sample, batch=ways)
    compile_step, flops = family.build_sampler(config, ctx, sample)
    families.warn_if_heads_unsplit(config, ctx)
    seconds = flops / half_peak
    report.update({
        "sample_batch": sample.batch,
        "per_device_batch": sample.batch / ways,
        "prompt_len": sample.prompt_len,
        "max_new_tokens": sample.max_new_tokens,
        "steps": sample.steps, "alg": sample.alg,
        "temperature": sample.temperature, "top_p": sample.top_p,
        "cache": sample.cache, "block_length": sample.block_length,
        "threshold": sample.threshold, "fast_dllm": sample.fast_dllm,
        "param_dtype": config.model.param_dtype,
        "sample_flops_per_call": flops,
        "call_seconds_at_50pct_mfu": seconds,
        "new_tokens_per_second_at_50pct_mfu":
            sample.batch * sample.max_new_tokens / seconds,
    })
  start = time.time()
  _progress(f"[aot] compiling the {'sampling loop' if sample else 'train step'} "
            f"for {num_slices} x {topology.name} ...")
  try:
    compiled = compile_step()
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text and "hbm" not in text.lower():
      raise
    report.update(compile_seconds=time.time() - start, fits=False,
                  error=text.splitlines()[0][:400])
    if sample is None:
      # XLA's message counts its temporaries only; the state beside them
      # says how much of the chip no smaller batch can free.
      report["state_gib"] = state_gib()
    return report
  compile_seconds = time.time() - start
  if compile_twin is not None:
    # XLA counts each loop body once; the unrolled twin counts every cycle.
    _progress(f"[aot]   compiled in {compile_seconds:.0f} s; a second compile"
              " with the recursion unrolled counts FLOPs and bytes ...")
    start = time.time()
    unrolled = compile_twin()
    report.update(roofline(*step_cost(unrolled), topology.chip),
                  analysis_compile_seconds=time.time() - start,
                  **_pallas_calls(unrolled.as_text()))
  memory = compiled.memory_analysis()
  peak, total = hbm_use(memory)
  report.update(
      compile_seconds=compile_seconds,
      argument_gib=memory.argument_size_in_bytes / GIB,
      output_gib=memory.output_size_in_bytes / GIB,
      temp_gib=memory.temp_size_in_bytes / GIB,
      alias_gib=memory.alias_size_in_bytes / GIB,
      total_gib=total / GIB,
      peak_gib=peak / GIB,
      # A remat policy's offloaded tensors, in the host's memory.
      host_temp_gib=getattr(memory, "host_temp_size_in_bytes", 0) / GIB,
      # XLA:TPU fits the program to the chip or refuses it (the except
      # above); the sum can run GiBs over a step it compiled
      # (topology.hbm_use).
      fits=True)
  if save_compiled and sample is None and report["fits"]:
    report["saved"] = _save(save_step, compiled, save_compiled)
  return report


def _pallas_calls(text: str) -> dict:
  """The program's Pallas kernel calls, and how many of them declare no
  cost (jax's splash attention), which XLA then counts as no FLOPs."""
  from trm.forecast import hlo  # pylint: disable=g-import-not-at-top
  from trm.forecast import ops  # pylint: disable=g-import-not-at-top
  calls = [inst for comp in hlo.parse_module(text).computations.values()
           for inst in comp.instructions if ops.is_pallas_call(inst)]
  return {"pallas_kernel_calls": len(calls),
          "pallas_calls_without_cost": sum(ops.pallas_cost(inst) is None
                                           for inst in calls)}


def _save(save_step, compiled, path: str) -> str:
  """Writes the compiled step; the line the report prints about it."""
  from trm.core import compiled_step  # pylint: disable=g-import-not-at-top
  header = save_step(compiled, path)
  return f"saved: {path} ({compiled_step.describe(header)})"


def save_local_step(config, path: str, shapes=None) -> dict:
  """`--topology=local`: compiles the train step for this host's devices
  (those JAX_PLATFORMS gives: CPU by default here) and saves it; returns
  the compile seconds, the mesh and the line saying what was saved."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  ctx = mesh_lib.ShardingContext.from_config(config, devices)
  ctx.check_batch_size(config.global_batch_size)
  compile_step, _, _, save_step, _ = _train_step_builder(config, ctx, shapes,
                                                         LOCAL)
  _progress(f"[aot] compiling the train step for the {len(devices)} local "
            f"{devices[0].platform} device(s) ...")
  start = time.time()
  compiled = compile_step()
  seconds = time.time() - start
  return {"compile_seconds": seconds, "mesh": dict(ctx.mesh.shape),
          "saved": _save(save_step, compiled, path)}


def format_report(report: dict) -> str:
  where = (f"topology: {report['topology']} x {report['num_slices']} "
           f"slice(s), {report['chips']} chips; mesh {report['mesh']}; ")
  if report.get("mode") == "sample":
    lines = [
        where + f"sampling batch {report['sample_batch']} "
        f"({report['per_device_batch']:g} per data-parallel device), prompt "
        f"{report['prompt_len']} + {report['max_new_tokens']} new tokens, "
        f"{report['steps']} steps, alg {report['alg']}, temperature "
        f"{report['temperature']:g}, top_p {report['top_p']}; "
        + (f"cache {report['cache']}, blocks of {report['block_length']}, "
           f"threshold {report['threshold']}"
           + (", Fast-dLLM's rules" if report.get("fast_dllm") else "")
           + "; "
           if report.get("cache", "none") != "none" else "cache none; ")
        + f"params {report['param_dtype']}"]
  else:
    lines = [where + f"global batch {report['global_batch_size']} "
             f"({report['per_device_batch']:g} per data-parallel device)"]
  lines.append(f"compile_seconds: {report['compile_seconds']:.1f}")
  if "total_gib" in report:
    lines.append(
        f"per chip: arguments {report['argument_gib']:.2f} GiB, outputs "
        f"{report['output_gib']:.2f} GiB, temporaries {report['temp_gib']:.2f}"
        f" GiB, aliased {report['alias_gib']:.2f} GiB, total "
        f"{report['total_gib']:.2f} GiB; XLA's peak "
        f"{report['peak_gib']:.2f} GiB; XLA:TPU "
        f"compiled it for the chip's {report['usable_gib']:.2f} GiB")
    if report.get("host_temp_gib"):
      lines.append(f"host memory per chip: {report['host_temp_gib']:.2f} GiB"
                   " (offloaded by config.model.remat_offload)")
  else:
    lines.append(f"compiler: {report['error']}")
    if "state_gib" in report:
      lines.append(
          f"train state per chip: {report['state_gib']:.2f} GiB of "
          f"{report['usable_gib']:.2f} GiB usable (parameters and optimizer "
          "state, before any activation)")
  if report.get("mode") == "sample":
    counted = ("forward x steps" if report.get("cache", "none") == "none"
               else "per block one full forward + window forwards"
               + (", threshold at its bound of block_length steps per block"
                  if report.get("threshold") is not None else ""))
    lines += [
        f"sample_flops_per_call: {report['sample_flops_per_call']:.3e} (model"
        f" FLOPs: {counted})",
        f"call_seconds_at_50pct_mfu: {report['call_seconds_at_50pct_mfu']:.3f}"
        f" ({report['new_tokens_per_second_at_50pct_mfu']:.1f} new tokens/s)",
    ]
  else:
    lines += [
        f"train_flops_per_step: {report['train_flops_per_step']:.3e} (model "
        "FLOPs)",
        f"step_seconds_at_50pct_mfu: "
        f"{report['step_seconds_at_50pct_mfu']:.4f}",
    ]
  if "hbm_bytes_per_device" in report:
    lines.append(
        f"compiled program per chip (recursion unrolled): "
        f"{report['xla_flops_per_device']:.3e} FLOPs, "
        f"{report['hbm_bytes_per_device'] / GIB:.2f} GiB HBM traffic, "
        f"{report['flops_per_byte']:.0f} FLOPs/byte; at peak "
        f"{report['compute_seconds'] * 1e3:.2f} ms compute vs "
        f"{report['memory_seconds'] * 1e3:.2f} ms memory: "
        f"{report['bound']}-bound (analysis compile "
        f"{report['analysis_compile_seconds']:.1f} s)")
    calls = report.get("pallas_kernel_calls", 0)
    bare = report.get("pallas_calls_without_cost", 0)
    if calls > bare:
      # XLA cannot look inside a kernel: it adds what the kernel declares.
      lines.append(
          f"  of which {calls - bare} Pallas kernel calls count the FLOPs "
          "and bytes they declare (pl.CostEstimate)")
    if bare:
      lines.append(
          f"  {bare} Pallas kernel calls declare no cost (e.g. "
          "config.model.attention='splash'): their FLOPs are not counted, "
          "so the FLOPs and compute time above are too low")
  lines.append(f"verdict: {'FITS' if report['fits'] else 'DOES NOT FIT'}")
  if "saved" in report:
    lines.append(report["saved"])
  return "\n".join(lines)


def data_shapes(config, overrides: dict):
  """The family's data shapes without reading the data (its program
  module's `data_shapes`); None for families whose sizes are all in the
  config. `overrides`: --seq_len, --vocab_size, --num_puzzle_identifiers."""
  family = families.program(config.model.name)
  shapes = (family.data_shapes(config, overrides)
            if hasattr(family, "data_shapes") else None)
  # Before: an override the family does not read (--seq_len for GPT, whose
  # sequence is config.block_size; any of them for Dream) was dropped
  # without a word and the report was of the config's sizes.
  taken = (set(shapes) if isinstance(shapes, dict) else
           {f.name for f in dataclasses.fields(shapes)} if shapes else set())
  ignored = sorted(k for k, v in overrides.items()
                   if v is not None and k not in taken)
  if ignored:
    raise ValueError(
        f"--{ignored[0]} does not apply to config.model.name="
        f"{config.model.name!r}, whose sizes come from its config: set the "
        "config's own field (--config.*) instead.")
  return shapes


def slice_counts(text: str) -> list[int]:
  """'1,2,4,8' -> [1, 2, 4, 8]; one line naming --num_slices otherwise."""
  try:
    counts = [int(x) for x in str(text).split(",") if x.strip()]
  except ValueError:
    counts = []
  if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
    raise ValueError(
        f"--num_slices={text!r} must be one slice count or a list of "
        "distinct ones, each >= 1, e.g. --num_slices=1,2,4,8.")
  return counts


# Chips of all slices together that a plan may hold: libtpu's compile-only
# topology aborts the process (a CHECK failure, no Python error) once the
# slice count passes int32, and long before that building millions of
# device objects takes minutes and gigabytes. The largest multi-slice jobs
# published are about 50,000 chips.
MAX_TOTAL_CHIPS = 1 << 17
# libtpu's cross-slice rewrite CHECKs `NumSlices() < kMaxNumSlices` (512):
# at 512 slices the compile aborts the process, losing the rows before it.
MAX_SLICES = 511


def check_slice_total(topology: Topology, counts: list[int]) -> None:
  """One line naming --num_slices when a count is more than libtpu
  compiles for or asks for more chips than MAX_TOTAL_CHIPS, before libtpu
  is asked for the devices."""
  most = max(counts)
  if most > MAX_SLICES:
    raise ValueError(
        f"--num_slices={most}: libtpu compiles for at most {MAX_SLICES} "
        "slices (its compiler aborts at 512).")
  if most * topology.chips > MAX_TOTAL_CHIPS:
    raise ValueError(
        f"--num_slices={most} x {topology.name} is {most * topology.chips:,} "
        f"chips; trm.aot plans at most {MAX_TOTAL_CHIPS:,} "
        f"({MAX_TOTAL_CHIPS // topology.chips} slices of {topology.name}).")


def check_forecast_flags(counts: list[int]) -> None:
  """Flag errors of --forecast and --search, before anything compiles."""
  if not _FORECAST.value:
    for name in ("forecast_json", "search", "calibrate_mfu", "efficiency",
                 "collectives", "hot_spots", "dcn_overlap", "batch_scaling",
                 "chip_hour_price", "dcn_step_us", "search_top",
                 "search_limit"):
      if flags.FLAGS[name].present:
        raise ValueError(f"--{name} needs --forecast.")
    return
  # Before: each of these was ignored without a word (a --calibrate_mfu
  # given to --search ranked at the default efficiency, its MFU column
  # not calibrated at all).
  if not _SEARCH.value:
    for name in ("search_top", "search_limit"):
      if flags.FLAGS[name].present:
        raise ValueError(f"--{name} needs --search.")
  else:
    per_row = ("prints --forecast's rows; --search ranks layouts: forecast "
               "the layout you pick (its --config.mesh.* overrides) to see "
               "them")
    for name, why in (
        ("calibrate_mfu", "fits the efficiency on the first row of "
         "--forecast's slice counts; --search ranks layouts at --efficiency "
         "(or the default): give --efficiency, or calibrate without "
         "--search"),
        ("collectives", per_row), ("hot_spots", per_row)):
      if flags.FLAGS[name].value not in (None, False):
        raise ValueError(f"--{name} {why}.")
  if _MODE.value != "train":
    raise ValueError("--forecast forecasts the train step: drop "
                     "--mode=sample.")
  for name, value in (("efficiency", _EFFICIENCY.value),
                      ("calibrate_mfu", _CALIBRATE.value)):
    if value is not None and not 0 < value <= 1:
      raise ValueError(f"--{name}={value} must be a fraction in (0, 1], "
                       "e.g. 0.567 for 56.7%.")
  from trm.forecast import plan  # pylint: disable=g-import-not-at-top
  if (_EFFICIENCY.value is not None
      and _EFFICIENCY.value < plan.MIN_EFFICIENCY):
    raise ValueError(f"--efficiency={_EFFICIENCY.value:g} is below the "
                     f"{plan.MIN_EFFICIENCY:g} of peak a forecast takes; "
                     "give a fraction such as 0.567 for 56.7%.")
  step = _DCN_STEP_US.value
  if step is not None and not (math.isfinite(step) and 0 <= step <= 1e6):
    raise ValueError(f"--dcn_step_us={step} must be a latency in "
                     "microseconds, 0 to 1e6.")
  price = _CHIP_HOUR_PRICE.value
  if price is not None and not (math.isfinite(price) and price > 0):
    raise ValueError(f"--chip_hour_price={price} must be a positive "
                     "number (the price of one chip-hour).")
  if price is not None and _SEARCH.value:
    raise ValueError("--chip_hour_price prices --forecast's rows; --search "
                     "ranks layouts without a run cost: drop one.")
  if _EFFICIENCY.value is not None and _CALIBRATE.value is not None:
    raise ValueError("--efficiency and --calibrate_mfu both set the "
                     "dense-compute efficiency: give one.")
  if _SEARCH.value and len(counts) != 1:
    raise ValueError("--search ranks the mesh layouts of one slice "
                     "count: give --num_slices=N.")
  # Before: --search_limit=-3 compiled nothing and said "no layout fits";
  # --search_top=0 compiled every layout and printed none.
  if _SEARCH_LIMIT.value < 0:
    raise ValueError(f"--search_limit={_SEARCH_LIMIT.value} must be >= 0 "
                     "(0: every layout).")
  if _SEARCH_TOP.value < 1:
    raise ValueError(f"--search_top={_SEARCH_TOP.value} must be >= 1.")
  if flags.FLAGS["forecast_json"].present:
    check_output_file("--forecast_json", _FORECAST_JSON.value)


def _dcn_step_seconds() -> float | None:
  return None if _DCN_STEP_US.value is None else _DCN_STEP_US.value * 1e-6


def run_forecast(config, topology, counts, shapes) -> int:
  """--forecast (and --search): prints rows, writes JSON; exit code."""
  from trm.forecast import plan  # pylint: disable=g-import-not-at-top
  from trm.forecast import search  # pylint: disable=g-import-not-at-top
  if _SEARCH.value:
    ranked, tried = search.search(
        config, topology, counts[0], shapes,
        efficiency=_EFFICIENCY.value or plan.DEFAULT_EFFICIENCY,
        limit=_SEARCH_LIMIT.value, dcn_overlap=_DCN_OVERLAP.value,
        dcn_step_seconds=_dcn_step_seconds())
    print(search.format_ranking(ranked, tried, topology.name, counts[0],
                                _SEARCH_TOP.value), flush=True)
    rows = ranked[:_SEARCH_TOP.value]
  else:
    rows, efficiency, source = plan.forecast(
        config, topology, counts, shapes, efficiency=_EFFICIENCY.value,
        calibrate_mfu=_CALIBRATE.value, scaling=_BATCH_SCALING.value,
        dcn_overlap=_DCN_OVERLAP.value,
        dcn_step_seconds=_dcn_step_seconds())
    print(plan.format_rows(rows, topology.name, efficiency, source),
          flush=True)
    note = plan.chip_check_note(topology.generation, source)
    if note:
      print(note, flush=True)
    cost = plan.format_run_cost(rows, _CHIP_HOUR_PRICE.value)
    if cost:
      print(cost, flush=True)
    for row in rows:
      if _COLLECTIVES.value and row.get("collectives") is not None:
        print(plan.format_collectives(row), flush=True)
      if _HOT_SPOTS.value and row.get("hot_spots") is not None:
        print(plan.format_hot_spots(row), flush=True)
  if _FORECAST_JSON.value:
    from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
    # Whole or not at all: a failed dump or a signal leaves no half file.
    atomic_files.atomic_write(
        _FORECAST_JSON.value,
        lambda f: json.dump(rows, f, indent=1, default=float), mode="w")
  return 0 if rows and all(r.get("fits") for r in rows) else 1


def check_save_flags(counts: list[int]) -> None:
  """Flag errors of --save_compiled and --topology=local, before anything
  compiles."""
  path = _SAVE_COMPILED.value
  if _TOPOLOGY.value == LOCAL and not path:
    raise ValueError(f"--topology={LOCAL} compiles for this host only to "
                     "save the step: add --save_compiled=FILE.")
  if not flags.FLAGS["save_compiled"].present:
    return
  for clash, given in (("--forecast", _FORECAST.value),
                       ("--mode=sample", _MODE.value == "sample"),
                       ("several --num_slices", len(counts) > 1),
                       (f"--num_slices with --topology={LOCAL}",
                        _TOPOLOGY.value == LOCAL and counts != [1])):
    if given:
      raise ValueError(f"--save_compiled saves one train step: drop {clash}.")
  if "://" not in path:
    check_output_file("--save_compiled", path)


def check_save_length(config) -> None:
  """--save_compiled with config.num_epochs: the step would hold the
  schedule of the file's total_steps, not of the steps the family's task
  derives from the training data (which this tool does not read), and
  trm.main refuses num_epochs with config.compiled_step anyway."""
  epochs = config.get("num_epochs", 0)
  if flags.FLAGS["save_compiled"].present and epochs:
    raise ValueError(
        f"--save_compiled with config.num_epochs={epochs:g}: the compiled "
        "step holds the learning-rate schedule of config.total_steps, and "
        "num_epochs derives those from the training data, which trm.aot "
        "does not read; set config.total_steps to the steps trm.main logs "
        "for num_epochs, with config.num_epochs=0, and run both tools so.")


def check_output_file(flag: str, path: str) -> None:
  """One line naming `flag` unless the local `path` can take the file it
  writes after minutes of compiling: a file path (not a directory, FIFO or
  device, which the final rename would replace) in an existing directory
  this process can write, and not the --config file it was given."""
  if not path:  # e.g. --save_compiled=$OUT with OUT unset
    raise ValueError(f"{flag} is given but empty: name the file to write.")
  parent = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path) or not os.path.isdir(parent):
    raise ValueError(f"{flag}={path!r} must be a file path in an existing "
                     "directory.")
  if os.path.exists(path) and not os.path.isfile(path):
    raise ValueError(f"{flag}={path!r} is not a regular file (a FIFO or "
                     "device); name a file.")
  config = config_flags.get_config_filename(flags.FLAGS["config"]).split(
      ":", 1)[0]   # 'configs/gpt.py:shakespeare_char': the file, its arg
  if (config and os.path.isfile(path) and os.path.isfile(config)
      and os.path.samefile(path, config)):
    raise ValueError(f"{flag}={path!r} is the --config file, which it would "
                     "overwrite; name another file.")
  try:  # a file there, made and removed, before minutes of compiling
    with tempfile.TemporaryFile(dir=parent):
      pass
  except OSError as e:
    raise ValueError(f"{flag}={path!r}: its directory {parent} is not "
                     f"writable ({e.strerror}).") from None


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _TOPOLOGY.value:
    raise app.UsageError("--topology is required, e.g. --topology=v4-8 (or "
                         f"{LOCAL} with --save_compiled).")
  local = _TOPOLOGY.value == LOCAL
  topology = None if local else parse_topology(_TOPOLOGY.value)
  counts = slice_counts(_NUM_SLICES.value)
  if topology is not None:
    check_slice_total(topology, counts)
  check_forecast_flags(counts)
  check_save_flags(counts)
  check_mode_flags()  # before jax loads: a usage error in a fraction of a second
  from trm.core import run_checks  # pylint: disable=g-import-not-at-top
  try:  # what trm.main would refuse is not compiled or forecast either
    run_checks.check_values(_CONFIG.value)
    check_save_length(_CONFIG.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  sample = sample_settings_from_flags(_CONFIG.value)
  shapes = None
  if sample is None:
    shapes = data_shapes(_CONFIG.value, {
        "seq_len": _SEQ_LEN.value, "vocab_size": _VOCAB.value,
        "num_puzzle_identifiers": _PUZZLES.value})
  if local:
    report = save_local_step(_CONFIG.value, _SAVE_COMPILED.value, shapes)
    print(f"mesh {report['mesh']}\ncompile_seconds: "
          f"{report['compile_seconds']:.1f}\n{report['saved']}", flush=True)
    sys.exit(0)
  if _FORECAST.value:
    sys.exit(run_forecast(_CONFIG.value, topology, counts, shapes))
  from trm.forecast import plan  # pylint: disable=g-import-not-at-top
  plan.check_rows(_CONFIG.value, topology, counts, None if sample else [
      _CONFIG.value.global_batch_size] * len(counts))
  fits = True
  for count in counts:
    if len(counts) > 1:
      print(f"[aot] compiling for {count} x {topology.name} ...",
            file=sys.stderr, flush=True)
    config = plan.row_config(_CONFIG.value, count,
                             _CONFIG.value.global_batch_size)
    report = compile_report(config, topology, count, shapes, sample,
                            _SAVE_COMPILED.value)
    print(format_report(report), flush=True)
    if _SAVE_COMPILED.value and "saved" not in report:
      print(f"--save_compiled: {_SAVE_COMPILED.value} not written: the step "
            "does not fit.", file=sys.stderr, flush=True)
    fits = fits and report["fits"]
  sys.exit(0 if fits else 1)


_TRAIN_ONLY = ("seq_len", "vocab_size", "num_puzzle_identifiers")
_SAMPLE_ONLY = ("sample_batch", "prompt_len", "max_new_tokens", "steps",
                "alg", "temperature", "top_p", "cache", "block_length",
                "threshold", "fast_dllm")


def check_mode_flags() -> None:
  """Flags of the other --mode are an error rather than silently ignored
  (needs no model family: `main` checks it before jax loads)."""
  given = lambda names: [f"--{n}" for n in names  # noqa: E731
                         if flags.FLAGS[n].present]
  if _MODE.value == "train":
    if given(_SAMPLE_ONLY):
      raise app.UsageError(f"{', '.join(given(_SAMPLE_ONLY))} only apply to "
                           "--mode=sample.")
  elif given(_TRAIN_ONLY):
    raise app.UsageError(f"{', '.join(given(_TRAIN_ONLY))} only apply to "
                         "--mode=train.")


def sample_settings_from_flags(config) -> SampleSettings | None:
  """SampleSettings for --mode=sample, None for --mode=train (`main` has
  already refused the other mode's flags: `check_mode_flags`)."""
  if _MODE.value == "train":
    return None
  try:
    family = _sampler_family(config)
    settings = SampleSettings(
        batch=_SAMPLE_BATCH.value, prompt_len=_PROMPT_LEN.value,
        max_new_tokens=_MAX_NEW.value,
        steps=_MAX_NEW.value if _STEPS.value is None else _STEPS.value,
        alg=_ALG.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
        cache=_CACHE.value, block_length=_BLOCK_LENGTH.value,
        threshold=_THRESHOLD.value, fast_dllm=_FAST_DLLM.value)
    family.check_sample_settings(settings)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  return settings


def define_flags():
  """Defines the command-line flags; only when run as a program, so that
  tests can import several entry points into one process."""
  global _CONFIG, _TOPOLOGY, _NUM_SLICES, _SEQ_LEN, _VOCAB, _PUZZLES, _MODE
  global _FORECAST, _FORECAST_JSON, _SEARCH, _SEARCH_TOP, _SEARCH_LIMIT
  global _EFFICIENCY, _CALIBRATE, _BATCH_SCALING, _COLLECTIVES, _DCN_OVERLAP
  global _SAMPLE_BATCH, _PROMPT_LEN, _MAX_NEW, _STEPS, _ALG, _TEMPERATURE
  global _TOP_P, _CACHE, _BLOCK_LENGTH, _THRESHOLD, _FAST_DLLM, _SAVE_COMPILED
  global _CHIP_HOUR_PRICE, _DCN_STEP_US, _HOT_SPOTS
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.",
                                            lock_config=True)
  _TOPOLOGY = flags.DEFINE_string(
      "topology", None, f"e.g. v4-8, v4-64, v5p-128; {LOCAL}: this host's "
      "devices (JAX_PLATFORMS; with --save_compiled).")
  _SAVE_COMPILED = flags.DEFINE_string(
      "save_compiled", None, "Write the compiled train step to this file "
      "for `trm.main --config.compiled_step=FILE` (loads it instead of "
      "compiling; same jax/libtpu, devices, mesh, config and code).")
  _NUM_SLICES = flags.DEFINE_string(
      "num_slices", "1", "Slices (multi-slice): one count, or a list such as "
      "1,2,4,8 (one compile each; config.mesh.dcn_data follows each count).")
  _FORECAST = flags.DEFINE_bool(
      "forecast", False, "Forecast each slice count: step time, tokens/s, "
      "TFLOP/s per chip, MFU, scaling, ICI/DCN bytes and the bound.")
  _FORECAST_JSON = flags.DEFINE_string("forecast_json", None, "With "
                                       "--forecast: write the rows here.")
  _SEARCH = flags.DEFINE_bool(
      "search", False, "With --forecast: rank the mesh layouts (data x fsdp "
      "x model over ICI, data or fsdp over DCN) of one slice count.")
  _SEARCH_TOP = flags.DEFINE_integer("search_top", 5, "--search: layouts "
                                     "printed.")
  _SEARCH_LIMIT = flags.DEFINE_integer(
      "search_limit", 0, "--search: compile at most this many layouts, "
      "pure data/fsdp ones first (0: all).")
  _EFFICIENCY = flags.DEFINE_float(
      "efficiency", None, "--forecast: fraction of peak the dense compute "
      "reaches (default: fitted on MaxText 22B, 1x v4-128).")
  _CALIBRATE = flags.DEFINE_float(
      "calibrate_mfu", None, "--forecast: a measured MFU of the first row "
      "(fraction); the dense-compute efficiency is fitted to it.")
  _BATCH_SCALING = flags.DEFINE_enum(
      "batch_scaling", "weak", ["weak", "strong"], "--forecast: weak keeps "
      "the per-chip batch of the first row as slices grow (MaxText's runs); "
      "strong keeps the config's global batch.")
  _DCN_OVERLAP = flags.DEFINE_enum(
      "dcn_overlap", "none", ["none", "schedule"], "--forecast: "
      "cross-slice collectives block the chip (none: what MaxText's "
      "published v4 multi-slice runs show), or overlap what the program "
      "schedules beside them (schedule).")
  _DCN_STEP_US = flags.DEFINE_float(
      "dcn_step_us", None, "--forecast: latency of one step of a "
      "cross-slice ring, microseconds (default "
      "trm.core.topology.DCN_STEP_SECONDS, fitted on MaxText's v5e runs; "
      "give your pod's if you have measured it).")
  _CHIP_HOUR_PRICE = flags.DEFINE_float(
      "chip_hour_price", None, "--forecast: price of one chip-hour (any "
      "currency; none is assumed) to state each row's run cost in it.")
  _COLLECTIVES = flags.DEFINE_bool(
      "collectives", False, "--forecast: print each row's collectives "
      "(kind, ICI/DCN, torus axes, bytes per chip).")
  _HOT_SPOTS = flags.DEFINE_bool(
      "hot_spots", False, "--forecast: print each row's compute ops with "
      "the most roofline time per step (by the model code's op name).")
  # Below 2**31, as the configs' sizes: a puzzle table of 2**31 rows or
  # more overflowed the int32 arithmetic of its gather (a JAX traceback).
  sizes = dict(lower_bound=1, upper_bound=2**31 - 1)
  _SEQ_LEN = flags.DEFINE_integer("seq_len", None, "Override the dataset's "
                                  "sequence length (e.g. 900 for ARC/Maze).",
                                  **sizes)
  _VOCAB = flags.DEFINE_integer("vocab_size", None, "Override the vocabulary.",
                                **sizes)
  _PUZZLES = flags.DEFINE_integer("num_puzzle_identifiers", None,
                                  "Override the puzzle-embedding rows.",
                                  **sizes)
  _MODE = flags.DEFINE_enum("mode", "train", ["train", "sample"],
                            "train: the train step; sample: the Dream "
                            "masked-diffusion sampling loop.")
  _SAMPLE_BATCH = flags.DEFINE_integer(
      "sample_batch", None, "sample: prompts per call (default: one per "
      "data-parallel device).")
  _PROMPT_LEN = flags.DEFINE_integer("prompt_len", 512, "sample: left-padded "
                                     "prompt length.")
  _MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512,
                                  "sample: tokens generated per prompt.")
  _STEPS = flags.DEFINE_integer("steps", None, "sample: denoising steps "
                                "(default: --max_new_tokens).")
  _ALG = flags.DEFINE_string("alg", "entropy", "sample: origin, "
                             "maskgit_plus, topk_margin or entropy.")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sample: token "
                                    "sampling temperature (0: greedy).")
  _TOP_P = flags.DEFINE_float("top_p", None, "sample: nucleus mass (None: "
                              "off; 0.95 compiles the vocabulary sort).")
  # A string, not an enum: a bad value gets sample_program's one-line error.
  _CACHE = flags.DEFINE_string("cache", "none", "sample: none (the exact "
                               "loop), prefix or dual (cached block "
                               "decoding, Fast-dLLM style).")
  _BLOCK_LENGTH = flags.DEFINE_integer("block_length", 32, "sample, with "
                                       "--cache: tokens per block.")
  _THRESHOLD = flags.DEFINE_float("threshold", None, "sample, with --cache: "
                                  "parallel decoding threshold (None: fixed "
                                  "steps per block).")
  _FAST_DLLM = flags.DEFINE_bool("fast_dllm", False, "sample, with --cache: "
                                 "Fast-dLLM's own block rules.")


# A stop signal exits 143 (SIGTERM) with this line, not trm.main's 0: a
# forecast or memory check cut short is no verdict.
STOPPED_LINE = ("{tool}: stopped by {name} before the report was complete "
                "(a --forecast_json already written is kept whole); run it "
                "again.")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config"])
  cli.run(main, compilation_cache=False, stopped_line=STOPPED_LINE)
