"""`trm.aot --forecast --search`: every mesh layout of one slice count,
compiled, forecast and ranked.

Layouts: data x fsdp x model over the slice's chips (ICI), and the slices
as data or fsdp parallelism (DCN). Those whose global batch does not split
over their batch axes are skipped without compiling; those that do not fit
in HBM are dropped after compiling.
"""
from __future__ import annotations

import itertools
import time

from trm.core import topology as topology_lib
from trm.forecast import plan


def divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def layouts(chips_per_slice: int, slices: int) -> list[dict]:
  """Mesh overrides, pure data/fsdp layouts first, then fewer model ways
  (the order `--search_limit` cuts in)."""
  out = []
  dcn_axes = ("data", "fsdp") if slices > 1 else ("data",)
  for data, fsdp in itertools.product(divisors(chips_per_slice), repeat=2):
    if chips_per_slice % (data * fsdp):
      continue
    model = chips_per_slice // (data * fsdp)
    for dcn in dcn_axes:
      out.append({"data": data, "fsdp": fsdp, "model": model,
                  "dcn_data": slices if dcn == "data" else 1,
                  "dcn_fsdp": slices if dcn == "fsdp" else 1,
                  "dcn_model": 1})
  out.sort(key=lambda m: (m["model"], m["dcn_fsdp"] > 1, m["data"]))
  return out


def overrides(mesh: dict) -> str:
  return " ".join(f"--config.mesh.{k}={v}" for k, v in mesh.items())


def search(config, topology: topology_lib.Topology, slices: int, shapes,
           efficiency: float, limit: int = 0,
           dcn_overlap: str = plan.DEFAULT_DCN_OVERLAP,
           report=plan.progress, dcn_step_seconds: float | None = None
           ) -> tuple[list[dict], dict]:
  """(fitting rows ranked by forecast step time, counts of what was tried);
  dcn_step_seconds as in `plan.forecast`."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  candidates = layouts(topology.chips, slices)
  tried = {"layouts": len(candidates), "batch_does_not_split": 0,
           "compiled": 0, "does_not_fit": 0, "not_compiled": 0}
  rows = []
  batch = int(config.global_batch_size)
  if batch % slices:  # every layout shards the batch over the slices
    raise plan.ForecastError(
        f"--search: config.global_batch_size={batch} splits over none of the"
        f" {len(candidates)} mesh layouts of {slices} x {topology.name} (each"
        f" shards the batch over the {slices} slices at least); use a "
        f"multiple of {slices}.")
  for index, mesh in enumerate(candidates):
    ways = mesh["data"] * mesh["fsdp"] * mesh["dcn_data"] * mesh["dcn_fsdp"]
    if batch % ways:
      tried["batch_does_not_split"] += 1
      continue
    if limit and tried["compiled"] >= limit:
      tried["not_compiled"] += 1
      continue
    report(f"[search] {index + 1}/{len(candidates)}: {overrides(mesh)} ...")
    try:
      compiled = plan.compile_row(config, topology, slices, shapes, batch,
                                  mesh)
    except mesh_lib.MeshConfigError as e:
      report(f"[search]   skipped: {e}")
      tried["batch_does_not_split"] += 1
      continue
    tried["compiled"] += 1
    if dcn_step_seconds is not None:
      compiled = plan.with_dcn_step(compiled, dcn_step_seconds)
    begin = time.time()
    row = plan.forecast_row(compiled, topology, efficiency, dcn_overlap)
    row["dcn_step_source"] = plan.DCN_STEP_SOURCES[
        dcn_step_seconds is not None]
    row["overrides"] = overrides(mesh)
    if not compiled.fits:
      tried["does_not_fit"] += 1
      need = (f" (XLA:TPU: {compiled.memory_gib:.2f} GiB)"
              if compiled.memory_gib else "")
      report(f"[search]   does not fit{need}")
      continue
    report(f"[search]   {row['step_seconds']:.4f} s/step, "
           f"{compiled.memory_gib:.2f} GiB (compile "
           f"{compiled.compile_seconds:.0f} s, play {time.time() - begin:.0f}"
           " s)")
    rows.append(row)
  rows.sort(key=lambda r: r["step_seconds"])
  return plan.with_scaling(rows), tried


def format_ranking(rows: list[dict], tried: dict, topology_name: str,
                   slices: int, top: int) -> str:
  lines = [f"mesh layouts of {slices} x {topology_name}: {tried['layouts']} "
           f"layouts, {tried['batch_does_not_split']} skipped (the batch "
           f"does not split), {tried['compiled']} compiled, "
           f"{tried['does_not_fit']} do not fit"
           + (f", {tried['not_compiled']} not compiled (--search_limit)"
              if tried["not_compiled"] else "")]
  if not rows:
    lines.append("no layout fits.")
    return "\n".join(lines)
  best = rows[0]["step_seconds"]
  for rank, row in enumerate(rows[:top], 1):
    lines.append(
        f"{rank}. {row['step_seconds']:.4f} s/step ({best / row['step_seconds']:.0%}"
        f" of the best's speed), MFU {100 * row['mfu']:.1f}%, "
        f"{plan.memory_text(row)} GiB/chip, bound {row['bound']}, ICI "
        f"{row['ici_bytes'] / 1e9:.2f} GB, DCN {row['dcn_bytes'] / 1e9:.2f} "
        f"GB per chip\n   {row['overrides']}")
  lines += plan.sum_over_chip_lines(rows[:top])
  lines += plan.unoverlapped_lines(rows[:top])
  return "\n".join(lines)
