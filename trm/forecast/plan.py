"""Forecast a multi-slice run: compile the real train step once per slice
count, play the compiled program (`trm.forecast.timeline`), and report per
row what a pod would give.

One constant is not published: the fraction of peak the dense compute
reaches (`efficiency`). It defaults to the value fitted on one row of a
published pod measurement (MaxText's 22B on 1x v4-128, BUILD_NOTES
"Multi-pod forecast"); `calibrate_mfu` fits it on the first row of a run
of your own instead.
"""
from __future__ import annotations

import dataclasses
import math
import re
import shlex
import sys
import time

from trm.core import topology as topology_lib
from trm.forecast import network
from trm.forecast import timeline

GIB = 2**30
# Fitted on MaxText's 22B, 1x v4-128, 56.7% MFU (BUILD_NOTES,
# benchmarks/forecast/forecast_maxtext.py): 0.7985 since session 47, when
# the compile target gained the slice's torus (0.867 before, fitted on a
# program compiled for a mesh without wraparound). Refitted on session 87's
# program (the chunked loss's head gradient reduced per chunk): 0.7982,
# not applied (0.04% apart; the tables stay comparable).
DEFAULT_EFFICIENCY = 0.7985
# The header's word for it (and how `chip_check_note` knows it was used).
DEFAULT_EFFICIENCY_SOURCE = "default (fitted on MaxText 22B, 1x v4-128)"
# The least dense-compute efficiency a forecast takes (and the floor of
# `calibrate`'s search): below it no chip runs, and at 5e-324 the step
# time overflowed to inf and the run cost divided by a zero rate.
MIN_EFFICIENCY = 1e-3
# Cross-slice collectives block the chip: what MaxText's published v4
# multi-slice runs show (BUILD_NOTES); 'schedule' trusts the program's
# overlap.
DEFAULT_DCN_OVERLAP = "none"
ROW_KEYS = ("slices", "chips", "fits", "memory_gib", "step_seconds",
            "tflops_per_chip", "mfu", "scaling_efficiency", "ici_bytes",
            "dcn_bytes", "bound")


HOT_SPOTS = 12  # compute ops per row in its `hot_spots`
# A row whose step waits this share of its time or more on collectives its
# schedule left nothing to overlap with gets a note (`unoverlapped_lines`).
UNOVERLAPPED_NOTE_SHARE = 0.1
# A step using this share of the chip's HBM or more is short of memory for
# that note's purpose.
MEMORY_TIGHT_SHARE = 0.9
# XLA:TPU's option that keeps the latency-hiding scheduler's first schedule
# (it reschedules, tighter, one over its memory limit): session 99's v5p
# 32B at 8 sequences a chip went from 14.29 s to 11.68 s a step at an XLA
# peak of 90.60 GiB (90.64 before).
NO_SCHEDULER_RERUN = "--xla_latency_hiding_scheduler_rerun=0"


class ForecastError(ValueError):
  """A flag or config that cannot be forecast; the message names it."""


@dataclasses.dataclass
class CompiledRow:
  """One slice count (or mesh layout), compiled."""
  slices: int
  chips: int
  mesh: dict
  global_batch: int
  model_flops: float           # per step, whole mesh
  tokens_per_example: int | None
  compile_seconds: float
  fits: bool
  # Arguments + outputs + temporaries - aliased a chip, as MaxText prints
  # it; where XLA refused the step, the figure its message gives.
  memory_gib: float | None
  program: timeline.Program | None = None
  error: str | None = None
  # Host memory the step's offloaded tensors take per chip (a remat
  # policy's `remat_offload`), beside `memory_gib` of HBM.
  host_memory_gib: float = 0.0
  # XLA's peak a chip (topology.hbm_use: host memory a remat policy
  # offloads to included); None where the compile was refused.
  memory_peak_gib: float | None = None
  # The HBM a chip XLA fitted the step to (tpu_flags.hbm_limit_gib);
  # None: the chip's.
  chip_hbm_gib: float | None = None
  # The config's XLA:TPU options it was compiled with (None: not known).
  tpu_compiler_options: str | None = None


def row_config(config, slices: int, global_batch: int, mesh=None):
  """The config with `slices` slices (data-parallel over DCN unless the
  config or `mesh` says otherwise) and this global batch."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  row = config.copy_and_resolve_references()
  with row.unlocked():
    for key, value in (mesh or {}).items():
      row.mesh[key] = value
    dcn = math.prod(int(row.mesh.get(f"dcn_{a}", 1))
                    for a in mesh_lib.MESH_AXES)
    if dcn == 1 and slices > 1:
      row.mesh.dcn_data = slices
    elif dcn != slices:
      raise ForecastError(
          f"--num_slices={slices}: config.mesh.dcn_* multiply to {dcn}. "
          "Leave them at 1 (each row sets config.mesh.dcn_data to its slice "
          "count) or forecast only that slice count.")
    row.global_batch_size = int(global_batch)
  return row


def row_context(config, topology: topology_lib.Topology, slices: int,
                global_batch: int, mesh=None):
  """(the row's config, its sharding context on `slices` compile-only
  slices of `topology`); nothing compiled."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  row = row_config(config, slices, global_batch, mesh)
  devices = topology_lib.topology_devices(topology, slices)
  return row, mesh_lib.ShardingContext.from_config(row, devices)


def check_rows(config, topology: topology_lib.Topology, slice_counts,
               global_batches=None) -> None:
  """Every row's config, mesh and global batch (`global_batches`, one per
  slice count; None: the config's, not checked), before any row compiles:
  a later row's error came only after minutes of compiling the earlier
  ones."""
  for slices, batch in zip(slice_counts, global_batches or [
      config.global_batch_size] * len(slice_counts)):
    row, ctx = row_context(config, topology, slices, batch)
    if global_batches is not None:
      try:
        ctx.check_batch_size(row.global_batch_size)
      except ValueError as e:
        if len(slice_counts) == 1:
          raise
        raise type(e)(f"--num_slices={slices}: {e}") from None  # which row


# XLA:TPU's two refusals: before scheduling, "the total memory required
# for HLO temporaries (35.79G) exceeds available HBM (31.25G)"; after,
# "Ran out of memory in memory space hbm. Used 20.38M of 16.00M hbm".
_REFUSED = re.compile(r"required for HLO temporaries \(([\d.]+)([KMG])\)"
                      r"|memory space hbm\. Used ([\d.]+)([KMG]) of")


def refused_gib(text: str) -> float | None:
  """GiB a chip that XLA:TPU's refusal says the step needs (None: not
  given)."""
  found = _REFUSED.search(text)
  if not found:
    return None
  number, unit = found.group(1, 2) if found.group(1) else found.group(3, 4)
  return float(number) / {"K": 2**20, "M": 2**10, "G": 1}[unit]


def compile_row(config, topology: topology_lib.Topology, slices: int,
                shapes, global_batch: int, mesh=None) -> CompiledRow:
  """Compiles the train step for `slices` slices of `topology`."""
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  from trm.core import tpu_flags  # pylint: disable=g-import-not-at-top
  row, ctx = row_context(config, topology, slices, global_batch, mesh)
  ctx.check_batch_size(row.global_batch_size)
  hbm_gib = tpu_flags.hbm_limit_gib(row, topology.chip.usable_hbm_gib)
  program = families.program(row.model.name).build(row, ctx, shapes)
  families.warn_if_heads_unsplit(row, ctx)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  start = time.time()
  base = dict(slices=slices, chips=ctx.mesh.devices.size,
              mesh=dict(ctx.mesh.shape), chip_hbm_gib=hbm_gib,
              global_batch=row.global_batch_size,
              model_flops=float(program.flops_per_step or 0.0),
              tokens_per_example=program.tokens_per_example,
              tpu_compiler_options=row.get("tpu_compiler_options", ""))
  try:
    compiled = task_lib.compile_train_step(
        program, ctx, row.global_batch_size, abstract, shardings,
        tpu_flags.for_mesh(row, ctx.mesh))
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text and "hbm" not in text.lower():
      raise
    # Host memory (a remat policy's offloads) runs out apart from HBM:
    # "Ran out of memory in memory space host. Used 160.00G of 128.00G".
    host = re.search(r"memory space host\. Used ([\d.]+)G", text)
    return CompiledRow(**base, compile_seconds=time.time() - start,
                       fits=False,
                       memory_gib=None if host else refused_gib(text),
                       error=text.splitlines()[0][:300],
                       host_memory_gib=float(host.group(1)) if host else 0.0)
  seconds = time.time() - start
  memory = compiled.memory_analysis()
  peak, total = (b / GIB for b in topology_lib.hbm_use(memory))
  fabric = network.Fabric.for_mesh(ctx.mesh, topology, slices)
  # XLA:TPU fits the step to the chip or refuses it (the except above):
  # the sum can run GiBs over a step it compiled (topology.hbm_use).
  return CompiledRow(**base, compile_seconds=seconds, fits=True,
                     memory_gib=total, memory_peak_gib=peak,
                     host_memory_gib=getattr(
                         memory, "host_temp_size_in_bytes", 0) / GIB,
                     program=timeline.Program(compiled.as_text(), fabric))


def with_fabric(compiled: CompiledRow, **fields) -> CompiledRow:
  """The row on its fabric with `fields` (`network.Fabric`'s) changed; the
  program is not parsed again."""
  if compiled.program is None:
    return compiled
  fabric = dataclasses.replace(compiled.program.fabric, **fields)
  return dataclasses.replace(compiled,
                             program=compiled.program.on_fabric(fabric))


def with_dcn_step(compiled: CompiledRow, seconds: float) -> CompiledRow:
  """The row with each cross-slice ring step costing `seconds`."""
  return with_fabric(compiled, dcn_step_seconds=seconds)


def forecast_row(compiled: CompiledRow, topology: topology_lib.Topology,
                 efficiency: float,
                 dcn_overlap: str = DEFAULT_DCN_OVERLAP) -> dict:
  """The row's figures at this dense-compute efficiency."""
  chip = topology.chip
  row = {"slices": compiled.slices, "chips": compiled.chips,
         "fits": compiled.fits, "memory_gib": compiled.memory_gib,
         "memory_peak_gib": compiled.memory_peak_gib,
         "chip_hbm_gib": compiled.chip_hbm_gib or chip.usable_hbm_gib,
         "mesh": compiled.mesh, "global_batch": compiled.global_batch,
         "compile_seconds": round(compiled.compile_seconds, 1),
         "efficiency": efficiency, "dcn_overlap": dcn_overlap,
         "tpu_compiler_options": compiled.tpu_compiler_options,
         "dcn_step_seconds": (compiled.program.fabric.dcn_step_seconds
                              if compiled.program is not None else None)}
  if compiled.program is None:
    row.update({k: None for k in ROW_KEYS if k not in row})
    row["error"] = compiled.error
    return row
  step = compiled.program.play(chip.peak_bf16_tflops * 1e12, efficiency,
                               chip.hbm_gbps * 1e9, dcn_overlap,
                               chip.mxu_width)
  if step.seconds <= 0:  # rates and MFU would divide by it
    raise ForecastError(
        f"the {compiled.slices}-slice step's compiled program computes, "
        "moves and sends nothing the time model counts: no step time to "
        "forecast; check that the config builds a model.")
  flops_per_chip = compiled.model_flops / compiled.chips
  other = "schedule" if dcn_overlap == "none" else "none"
  other_step = compiled.program.play(chip.peak_bf16_tflops * 1e12,
                                     efficiency, chip.hbm_gbps * 1e9, other,
                                     chip.mxu_width)
  tflops = flops_per_chip / step.seconds / 1e12
  examples = compiled.global_batch / step.seconds
  totals = step.totals
  row.update({
      "step_seconds": step.seconds,
      "examples_per_second": examples,
      "tokens_per_second": (examples * compiled.tokens_per_example
                            if compiled.tokens_per_example else None),
      "tflops_per_chip": tflops,
      "mfu": tflops / chip.peak_bf16_tflops,
      "ici_bytes": totals.ici_bytes,
      "dcn_bytes": totals.dcn_bytes,
      "hbm_bytes": totals.hbm_bytes,
      "host_bytes": totals.host_bytes,
      "host_memory_gib": compiled.host_memory_gib,
      "host_link_bytes_per_second":
          compiled.program.fabric.host_bytes_per_second,
      "program_flops_per_chip": totals.flops,
      "bound": step.bound,
      "seconds_by_cause": {k: round(v, 6) for k, v in
                           sorted(step.by_cause.items())},
      "unoverlapped_seconds": round(step.unoverlapped_seconds, 6),
      "unknown_loops": totals.unknown_loops,
      "undeclared_kernels": totals.undeclared_kernels,
      f"mfu_dcn_{other}": (flops_per_chip / other_step.seconds / 1e12
                           / chip.peak_bf16_tflops),
      "collectives": collective_summary(totals),
      "hot_spots": compiled.program.hot_spots(
          chip.peak_bf16_tflops * 1e12, efficiency, chip.hbm_gbps * 1e9,
          top=HOT_SPOTS, mxu_width=chip.mxu_width),
  })
  return row


def collective_summary(totals: timeline.Totals, limit: int = 12) -> list:
  """The step's collectives, grouped, largest traffic first: the first
  `limit`, and every cross-slice one after them (a few small DCN
  collectives can cost more than many large ICI ones)."""
  out = []
  for (kind, net, axes, group, payload, traffic), runs in (
      totals.collectives.items()):
    out.append({"kind": kind, "network": net, "axes": axes,
                "group": group, "payload_bytes": payload,
                "runs_per_step": runs, "bytes_per_step": traffic * runs})
  out.sort(key=lambda c: -c["bytes_per_step"])
  return out[:limit] + [c for c in out[limit:] if c["network"] == "dcn"]


def with_scaling(rows: list[dict]) -> list[dict]:
  """Per-chip throughput of each row against the first."""
  base = rows[0] if rows else None
  for row in rows:
    if (base and base.get("examples_per_second")
        and row.get("examples_per_second")):
      row["scaling_efficiency"] = ((row["examples_per_second"] / row["chips"])
                                   / (base["examples_per_second"]
                                      / base["chips"]))
    else:
      row["scaling_efficiency"] = None
  return rows


def run_steps(config) -> int | None:
  """The steps a run of `config` trains, as the forecast costs them; None
  where config.num_epochs derives them from the training data (the family's
  task, `config_lib.total_steps_from_epochs`), which trm.aot does not read:
  the file's total_steps is then not the run's length."""
  return None if config.get("num_epochs", 0) else int(config.total_steps)


def with_run_cost(rows: list[dict], total_steps: int | None) -> list[dict]:
  """What each row's run costs in time and chips: `total_steps` steps at the
  forecast step time (start-up, compiles, evaluations and checkpoints are
  left out; None, `run_steps`' unknown length: not costed), and the
  chip-hours per billion tokens (language models) or
  per million examples, a figure that does not depend on the run's length
  or on how the batch grows with the slices."""
  for row in rows:
    step = row.get("step_seconds")
    if not step:
      row.update(run_steps=total_steps, run_hours=None, chip_hours=None,
                 chip_hours_per_unit=None, cost_unit=None)
      continue
    hours = None if total_steps is None else total_steps * step / 3600
    tokens = row.get("tokens_per_second")
    rate, per, unit = ((tokens, 1e9, "1B tokens") if tokens else
                       (row["examples_per_second"], 1e6, "1M examples"))
    row.update(run_steps=total_steps, run_hours=hours,
               chip_hours=None if hours is None else hours * row["chips"],
               chip_hours_per_unit=row["chips"] * per / rate / 3600,
               cost_unit=unit)
  return rows


def format_run_cost(rows: list[dict],
                    chip_hour_price: float | None = None) -> str:
  """The rows' run cost (`with_run_cost`), a line each; with a price per
  chip-hour, its cost in that currency too. A run whose length is not
  known (`run_steps`) has its cost per unit of data only."""
  costed = [r for r in rows if r.get("chip_hours_per_unit") is not None]
  if not costed:
    return ""
  unit = costed[0]["cost_unit"]
  price = chip_hour_price is not None
  length = (f"run cost at {costed[0]['run_steps']} steps (config.total_steps;"
            if costed[0]["run_steps"] is not None else
            "run cost per unit of data only (config.num_epochs derives the "
            "run's steps from the training data, which trm.aot does not "
            "read: to cost the run, set config.total_steps to the steps "
            "trm.main logs for it, with config.num_epochs=0;")
  lines = [f"{length} step time only: no start-up, compiles, evaluations or "
           "saves)" + (f", at {chip_hour_price:g} per chip-hour" if price
                       else ""),
           f"{'slices':>6} {'chips':>6} {'hours':>10} {'chip-hours':>12} "
           f"{'chip-h/' + unit:>20}"
           + (f" {'cost':>14} {'cost/' + unit:>16}" if price else "")]
  figure = lambda value, width, form: (
      f"{'-':>{width}}" if value is None else f"{value:>{width}{form}}")
  for r in costed:
    line = (f"{r['slices']:>6} {r['chips']:>6} "
            f"{figure(r['run_hours'], 10, '.4g')} "
            f"{figure(r['chip_hours'], 12, '.5g')} "
            f"{r['chip_hours_per_unit']:>20.4g}")
    if price:
      total = (None if r["chip_hours"] is None
               else r["chip_hours"] * chip_hour_price)
      line += (f" {figure(total, 14, '.6g')} "
               f"{r['chip_hours_per_unit'] * chip_hour_price:>16.4g}")
    lines.append(line)
  return "\n".join(lines)


def calibrate(compiled: CompiledRow, topology: topology_lib.Topology,
              mfu: float, dcn_overlap: str = DEFAULT_DCN_OVERLAP) -> float:
  """The dense-compute efficiency at which the row's forecast MFU is
  `mfu` (a measurement of that row)."""
  if compiled.program is None:
    raise ForecastError("--calibrate_mfu: the first row does not compile "
                        "(it does not fit), so it cannot be calibrated.")
  def mfu_at(eff):
    return forecast_row(compiled, topology, eff, dcn_overlap)["mfu"]
  top = mfu_at(1.0)
  if mfu > top:
    raise ForecastError(
        f"--calibrate_mfu={mfu:.4f} is above the {top:.4f} this program "
        "reaches with its dense compute at peak; check the measurement (a "
        "fraction, e.g. 0.567) and that it is of the first row.")
  lo, hi = MIN_EFFICIENCY, 1.0
  bottom = mfu_at(lo)
  if mfu < bottom:  # the search would stop at lo and miss the measurement
    raise ForecastError(
        f"--calibrate_mfu={mfu:g} is below the {bottom:.4g} this program "
        f"reaches with its dense compute at {lo:g} x peak; check the "
        "measurement (a fraction, e.g. 0.567) and that it is of the first "
        "row.")
  for _ in range(60):
    mid = (lo + hi) / 2
    if mfu_at(mid) < mfu:
      lo = mid
    else:
      hi = mid
  return (lo + hi) / 2


def batches(config, slice_counts, scaling: str) -> list[int]:
  """Global batch per row: 'weak' keeps the per-chip batch of the first
  row as slices grow (MaxText's runs); 'strong' keeps the config's."""
  base = int(config.global_batch_size)
  if scaling == "strong":
    return [base] * len(slice_counts)
  first = slice_counts[0]
  out = []
  for slices in slice_counts:
    if (base * slices) % first:
      raise ForecastError(
          f"--batch_scaling=weak: the global batch {base} x {slices}/{first}"
          " slices is not a whole number; use --batch_scaling=strong or a "
          "first slice count that divides the others.")
    out.append(base * slices // first)
  return out


def progress(message: str):
  print(message, file=sys.stderr, flush=True)


def forecast(config, topology: topology_lib.Topology, slice_counts,
             shapes=None, efficiency: float | None = None,
             calibrate_mfu: float | None = None, scaling: str = "weak",
             dcn_overlap: str = DEFAULT_DCN_OVERLAP, report=progress,
             dcn_step_seconds: float | None = None
             ) -> tuple[list[dict], float, str]:
  """(rows, efficiency, where the efficiency came from). dcn_step_seconds:
  the cross-slice ring step's latency (default the topology's constant)."""
  compiled = []
  global_batches = batches(config, slice_counts, scaling)
  check_rows(config, topology, slice_counts, global_batches)
  for slices, batch in zip(slice_counts, global_batches):
    chips = slices * topology.chips
    report(f"[forecast] compiling {slices} x {topology.name} ({chips} chips,"
           f" global batch {batch}) ...")
    begin = time.time()
    row = compile_row(config, topology, slices, shapes, batch)
    report(f"[forecast]   compiled in {row.compile_seconds:.0f} s; "
           + (f"{row.memory_gib:.2f} GiB per chip" if row.memory_gib
              else "memory unknown")
           + ("" if row.fits else " (DOES NOT FIT)")
           + f"; read and played in {time.time() - begin - row.compile_seconds:.0f} s")
    if dcn_step_seconds is not None:
      row = with_dcn_step(row, dcn_step_seconds)
    compiled.append(row)
  if calibrate_mfu is not None:
    efficiency = calibrate(compiled[0], topology, calibrate_mfu, dcn_overlap)
    source = (f"calibrated: the {slice_counts[0]}-slice row's MFU set to "
              f"{calibrate_mfu:.4f}")
  elif efficiency is not None:
    source = "--efficiency"
  else:
    efficiency = DEFAULT_EFFICIENCY
    source = DEFAULT_EFFICIENCY_SOURCE
  rows = with_scaling([forecast_row(c, topology, efficiency, dcn_overlap)
                       for c in compiled])
  for row in rows:
    row["dcn_step_source"] = DCN_STEP_SOURCES[dcn_step_seconds is not None]
  return with_run_cost(rows, run_steps(config)), efficiency, source


def format_rows(rows: list[dict], topology_name: str, efficiency: float,
                source: str) -> str:
  lm = any(r.get("tokens_per_second") for r in rows)
  unit = "tokens/s" if lm else "examples/s"
  overlap = rows[0].get("dcn_overlap") if rows else DEFAULT_DCN_OVERLAP
  lines = [f"forecast for {topology_name}; dense compute at "
           f"{efficiency:.4f} x peak ({source}); cross-slice collectives "
           + ("overlapped as the program schedules them "
              "(--dcn_overlap=schedule)" if overlap == "schedule" else
              "exposed (--dcn_overlap=none; 'MFU sched' assumes the "
              "program's overlap)")
           + _dcn_step_note(rows),
           f"{'slices':>6} {'chips':>6} {'fits':>4} {'GiB/chip':>8} "
           f"{'step s':>9} {unit:>12} {'TFLOP/s/chip':>12} {'MFU':>6} "
           f"{'scaling':>7} {'ICI GB/chip':>11} {'DCN GB/chip':>11} "
           f"{'bound':<7} MFU {'none' if overlap == 'schedule' else 'sched'}"]
  for r in rows:
    if r.get("step_seconds") is None:
      memory = f"{r['memory_gib']:.2f}" if r.get("memory_gib") else "?"
      lines.append(f"{r['slices']:>6} {r['chips']:>6} {'no':>4} "
                   f"{memory:>8} (does not fit: {r.get('error')})")
      continue
    rate = r["tokens_per_second"] if lm else r["examples_per_second"]
    scaling = (f"{100 * r['scaling_efficiency']:.1f}%"
               if r.get("scaling_efficiency") is not None else "-")
    lines.append(
        f"{r['slices']:>6} {r['chips']:>6} "
        f"{'yes' if r['fits'] else 'no':>4} {memory_text(r):>8} "
        f"{r['step_seconds']:>9.4f} {rate:>12.4g} "
        f"{r['tflops_per_chip']:>12.1f} {100 * r['mfu']:>5.1f}% "
        f"{scaling:>7} {r['ici_bytes'] / 1e9:>11.3f} "
        f"{r['dcn_bytes'] / 1e9:>11.3f} {r['bound']:<7} "
        f"{100 * r.get('mfu_dcn_none', r.get('mfu_dcn_schedule', 0)):.1f}%")
  lines.extend(sum_over_chip_lines(rows))
  lines.extend(host_offload_lines(rows))
  lines.extend(unoverlapped_lines(rows))
  lines.extend(unread_loop_warnings(rows))
  lines.extend(undeclared_kernel_warnings(rows))
  return "\n".join(lines)


def sum_over_chip(row: dict) -> bool:
  """A step XLA fitted whose memory sum is over the chip's HBM."""
  return bool(row.get("fits") and row.get("memory_gib") and row.get(
      "chip_hbm_gib") and row["memory_gib"] > row["chip_hbm_gib"])


def memory_text(row: dict) -> str:
  """A compiled row's GiB a chip, starred where `sum_over_chip`."""
  return f"{row['memory_gib']:.2f}" + ("*" if sum_over_chip(row) else "")


def sum_over_chip_lines(rows: list[dict]) -> list[str]:
  """The line under a table that says what its stars mean (none: no
  star)."""
  over = [r for r in rows if sum_over_chip(r)]
  if not over:
    return []
  # A table can mix chips (maxtext_program.py --run=all: v4, v5e, v5p).
  chips = " or ".join(f"{gib:.2f}" for gib in sorted(
      {r["chip_hbm_gib"] for r in over}))
  return ["* the sum of arguments, outputs and temporaries (GiB/chip) is "
          f"over the chip's {chips} GiB, and XLA:TPU "
          "compiled the step for it all the same: the verdict is XLA's "
          "(BUILD_NOTES \"Session 92\")"]


def host_offload_lines(rows: list[dict]) -> list[str]:
  """One line per row that moves tensors to and from host memory (a remat
  policy's `remat_offload`): the bytes, the host memory they take, and
  what of their time on the host link the step waits for."""
  out = []
  for r in rows:
    if not r.get("host_bytes"):
      continue
    rate = r.get("host_link_bytes_per_second") or 0.0
    link = (f"{r['host_bytes'] / rate:.3f} s of transfers at "
            f"{rate / 1e9:.0f} GB/s a direction" if rate else
            "not priced")
    out.append(
        f"host offload: the {r['slices']}-slice row moves "
        f"{r['host_bytes'] / 1e9:.1f} GB per chip to and from host memory "
        f"a step ({r.get('host_memory_gib', 0.0):.2f} GiB held there; "
        f"{link}), {r['seconds_by_cause'].get('host', 0.0):.3f} s of it "
        "on the step's path")
  return out


# What the published runs of each chip said of the default efficiency
# (BUILD_NOTES "Multi-pod forecast"): printed under a forecast that used it.
CHIP_CHECKS = {
    "v6e": ("on v6e this forecast came within 2.3 MFU points of "
            "MaxText's published runs of Llama 3.1 8B (on v6e-8 to "
            "v6e-256) and GPT-3 175B, and ran 4-9 points above its runs "
            "of 70B models (Llama 3.1 70B on v6e-32 to v6e-256, "
            "Llama2-70B; BUILD_NOTES 'Session 87', 'Session 88'): read "
            "it as an upper bound for runs like those, or pass "
            "--calibrate_mfu with an MFU measured on v6e."),
}


def chip_check_note(generation: str, efficiency_source: str) -> str:
  """The NOTE line for a forecast of `generation` at the default
  efficiency ('' where its published runs agreed or another was set)."""
  note = CHIP_CHECKS.get(generation)
  if not note or efficiency_source != DEFAULT_EFFICIENCY_SOURCE:
    return ""
  return "NOTE: " + note


# Where a row's cross-slice latency came from: False the topology's
# constant, True the caller's figure.
DCN_STEP_SOURCES = {False: "fitted on MaxText's v5e runs",
                    True: "--dcn_step_us"}


def _dcn_step_note(rows: list[dict]) -> str:
  """The header's word on the cross-slice latency its multi-slice rows
  were charged ('' for one slice)."""
  charged = sorted({(r["dcn_step_seconds"], r.get("dcn_step_source", ""))
                    for r in rows if r.get("slices", 1) > 1
                    and r.get("dcn_step_seconds") is not None})
  return "".join(
      f", {step * 1e6:.4g} us per cross-slice ring step"
      + (f" ({source})" if source else "") for step, source in charged)


def waits_unoverlapped(seconds: float | None, step: float | None) -> bool:
  """Whether a step of `step` s waiting `seconds` on collectives awaited
  back to back gets the NOTE (`UNOVERLAPPED_NOTE_SHARE` of it or more)."""
  return bool(seconds and step and seconds >= UNOVERLAPPED_NOTE_SHARE * step)


def unoverlapped_lines(rows: list[dict]) -> list[str]:
  """One line per row whose step waits `UNOVERLAPPED_NOTE_SHARE` of its
  time or more on asynchronous collectives its compiled schedule started
  and awaited back to back. XLA:TPU's latency-hiding scheduler gives up
  such overlap when the step is short of memory (session 99: MaxText's
  v5p 32B on one v5p-128, 8 sequences a chip, 99.68 GiB); a small step
  may have nothing independent to place beside them. The time is the
  program's, so the forecast keeps it, and says what may win it back."""
  out = []
  for r in rows:
    seconds, step = r.get("unoverlapped_seconds"), r.get("step_seconds")
    if not waits_unoverlapped(seconds, step):
      continue
    line = (f"NOTE: the {r['slices']}-slice step waits {seconds:.3f} s of its "
            f"{step:.3f} s ({100 * seconds / step:.0f}%) on asynchronous "
            "collectives that its compiled schedule starts and awaits with "
            "nothing between to overlap them; ")
    gib, chip = r.get("memory_gib"), r.get("chip_hbm_gib")
    if gib and chip and gib >= MEMORY_TIGHT_SHARE * chip:
      line += ("XLA:TPU's scheduler does this when a step is short of "
               f"memory (this step: {gib:.2f} GiB of the chip's {chip:.2f}), "
               "scheduling again, tighter, when its first schedule goes over "
               "its memory limit. ")
      remedies = [_keep_first_schedule(r.get("tpu_compiler_options")),
                  "a smaller batch a chip (--config.global_batch_size; "
                  "GPT's --config.batch_size)", "more remat"]
      remedies = [x for x in remedies if x]
      sentence = ", ".join(remedies[:-1]) + " or " + remedies[-1]
      line += sentence[0].upper() + sentence[1:] + " may forecast faster."
    else:
      line += ("the step is not short of memory"
               + (f" ({gib:.2f} GiB of the chip's {chip:.2f})"
                  if gib and chip else "")
               + ", so its program has too little independent work beside "
               "them; more work a chip (a larger batch) may hide them.")
    out.append(line)
  return out


def _keep_first_schedule(options: str | None) -> str:
  """The NOTE's first remedy: the row's own options with the scheduler's
  rerun off, as a flag to copy where they are known; '' where they set the
  rerun already."""
  if options is None:
    return (f"keeping the first schedule (add {NO_SCHEDULER_RERUN} to "
            "--config.tpu_compiler_options; the compile says whether it "
            "still fits)")
  if "xla_latency_hiding_scheduler_rerun" in options:
    return ""
  kept = shlex.quote(f"{options} {NO_SCHEDULER_RERUN}".strip())
  return (f"keeping the first schedule (--config.tpu_compiler_options="
          f"{kept}; the compile says whether it still fits)")


def unread_loop_warnings(rows: list[dict]) -> list[str]:
  """One line per row whose program has loops of unknown trip count: such
  a loop is counted once, so that row's step is too short and its MFU too
  high, and its figures must not be trusted."""
  return [f"WARNING: the {r['slices']}-slice row has {r['unknown_loops']} "
          "while loop(s) whose trip count could not be read; each is counted"
          " once, so this row's step time is too short and its MFU too high."
          for r in rows if r.get("unknown_loops")]


def undeclared_kernel_warnings(rows: list[dict]) -> list[str]:
  """One line per row whose program calls Pallas kernels that declare no
  cost (jax's splash attention): their FLOPs count as 0, so that row's step
  is too short and its MFU too high (above 100% where they dominate)."""
  return [f"WARNING: the {r['slices']}-slice row calls "
          f"{r['undeclared_kernels']} Pallas kernel(s) that declare no cost "
          "(e.g. config.model.attention='splash'); their FLOPs are counted "
          "as 0, so this row's step time is too short and its MFU too high."
          for r in rows if r.get("undeclared_kernels")]


def _per_row_table(title: str, header: str, line, entries) -> str:
  return "\n".join([title, "  " + header]
                   + ["  " + line(e) for e in entries or []])


def format_collectives(row: dict) -> str:
  return _per_row_table(
      f"collectives of the {row['slices']}-slice step (per chip):",
      f"{'kind':<18} {'net':<4} {'axes':<6} {'group':>5} "
      f"{'payload MB':>11} {'runs/step':>9} {'GB/step':>9}",
      lambda c: (f"{c['kind']:<18} {c['network']:<4} {c['axes'] or '-':<6}"
                 f" {c['group']:>5} {c['payload_bytes'] / 1e6:>11.3f} "
                 f"{c['runs_per_step']:>9g} "
                 f"{c['bytes_per_step'] / 1e9:>9.3f}"),
      row.get("collectives"))


def format_hot_spots(row: dict) -> str:
  """The row's compute instructions with the most roofline time per step,
  by the model code's op name (`timeline.Program.hot_spots`)."""
  return _per_row_table(
      f"hot spots of the {row['slices']}-slice step (per chip, roofline "
      "time; network not included):",
      f"{'seconds':>8} {'HBM GB':>8} {'TFLOP':>8} {'runs':>7} {'kind':<12} op",
      lambda h: (f"{h['seconds']:>8.4f} {h['hbm_bytes'] / 1e9:>8.1f} "
                 f"{h['flops'] / 1e12:>8.1f} {h['runs']:>7g} "
                 f"{h['kind']:<12} {h['op']}"),
      row.get("hot_spots"))
