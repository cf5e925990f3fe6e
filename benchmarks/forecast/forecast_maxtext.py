r"""Forecast MaxText's published pod runs (v4: 22B, 52B; v5e: 16B-128B;
v5p: 32B-1024B) and compare.

  python benchmarks/forecast/forecast_maxtext.py [--run=22b|52b|both|v5e|
      v5p|all|v5e16b,...] [--fit_on=22b] [--slices=...] [--efficiency=X]
      [--dcn_overlap=none|schedule] [--dcn_step_us=X | --fit_dcn_on=RUN]
      [--permute_links=F] [--programs=DIR] [--json=PATH]

MaxText's README ("Runtime Performance Results", TPU v4, commit 281e04bf3)
measured, counting 6 x parameters x tokens per step (train.py, no attention
term):
- a 22B decoder on 1, 2, 4 and 8 slices of v4-128: 156, 152, 149 and 146
  TFLOP/s per chip (56.7, 55.2, 54.3, 53.2 % MFU);
- a 52B decoder on 1 and 2 slices of v4-384: 154 and 162 TFLOP/s per chip
  (56.0 and 58.9 %; "quirkily higher than single slice because of choices
  made by the compiler, not for a fundamental reason", its README says);
- later (v5e_high_performance.md, commit 289fa330, counting attention too)
  16B, 32B, 64B and 128B decoders at sequence 2048 on 1-32 slices of
  v5e-256 (61.10 .. 46.25 % MFU);
- then (configs/v5p/README.md, commit 76bd53b0f, half the attention term)
  the same family at 32B to 1024B on 1 and 2 slices of v5p-128 to
  v5p-4096, FSDP x tensor parallel, remat 'minimal' up to 256B (71.47 ..
  51.55 % MFU).

`--run=22b` compiles our `configs/gpt.py:maxtext22b` train step for each
slice count on compile-only v4 devices, fits the one free constant (the
dense-compute efficiency) on the 1-slice row only, forecasts the other rows
and prints them beside the published ones in MaxText's FLOP count, with the
error per row and the goal's verdict (every row within 2 MFU points, the
8-slice scaling within 2 points of 93.8 %). `--run=52b` forecasts
`configs/gpt.py:maxtext52b` with the constant fitted on the 22B (compiled
in the same run unless `--efficiency` gives it): nothing is fitted on the
52B, so its rows check the forecast out of sample. `--run=v5e` does the
same for the v5e runs: another chip, whose constants come from its data
sheet, and up to 32 slices; `--fit_on=v5e16b` fits on that chip instead.
`--run=v5p` likewise on a third chip, with tensor parallelism.
`--programs=DIR` keeps each compiled program there and reads it back on a
later run with the same config, trm/ code, jax and libtpu, so a forecast
can be replayed without compiling again.

Each row also shows its "compute only" MFU: the step cut to its compute at
the constant, every memory-bound op and transfer hidden. A published row
above it gets a CEILING line with the efficiency at which this program's
compute alone takes the published step: no schedule reaches such a row at
the constant used, so its miss is the constant's (or the program's FLOPs),
not the overlap's. `--permute_links=F` replays the rows with their
collective-permutes (the tensor axis's ring transfers) over F links'
bandwidth instead of one: a sensitivity of the tensor-parallel rows to
that one charge, not a figure of the chip.

The second constant, the latency of one step of a cross-slice ring
(`trm.core.topology.DCN_STEP_SECONDS`), is what makes speed fall as slices
are added (the bytes per chip level off at twice the buffer; an
all-reduce's 2 (N-1) steps do not). `--fit_dcn_on=v5e16b` fits it on that
run's multi-slice rows (their loss of speed against its one-slice row, not
their level); `--dcn_step_us` gives it.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import functools
import glob
import hashlib
import json
import math
import sys
import time

import jax  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from trm.core import config_lib  # pylint: disable=g-import-not-at-top
from trm.core import topology as topology_lib  # pylint: disable=g-import-not-at-top
from trm.core.topology import parse_topology  # pylint: disable=g-import-not-at-top
from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
from trm.data import io as io_lib  # pylint: disable=g-import-not-at-top
from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
from trm.forecast import network  # pylint: disable=g-import-not-at-top
from trm.forecast import plan  # pylint: disable=g-import-not-at-top
from trm.forecast import timeline  # pylint: disable=g-import-not-at-top

def _v5p(topology: str, one: tuple, two: tuple,
         batch_per_slice: int | None = None) -> dict:
  """A v5p run: its train.py of December 2023 counted half the attention
  term (causal); `batch_per_slice` where the slice is not the variant's."""
  return dict(topology=topology, slices="1,2", attention_flops="causal",
              published={1: one, 2: two}, batch_per_slice=batch_per_slice)


# Published rows: slices -> (TFLOP/s per chip, MFU %), in MaxText's count
# of the time: 6 N T until mid-2023, plus the attention term (12 H L Q T^2
# per sequence, as nanoGPT's) by the v5e runs.
RUNS = {
    "22b": dict(variant="maxtext22b", topology="v4-128", slices="1,2,4,8",
                attention_flops=False,
                published={1: (156, 56.7), 2: (152, 55.2), 4: (149, 54.3),
                           8: (146, 53.2)}),
    "52b": dict(variant="maxtext52b", topology="v4-384", slices="1,2",
                attention_flops=False,
                published={1: (154, 56.0), 2: (162, 58.9)}),
    # v5e_high_performance.md (commit 289fa330), 1-32 slices of v5e-256.
    "v5e16b": dict(variant="maxtext16b", topology="v5e-256",
                   slices="1,2,4,8,16,32", attention_flops=True,
                   published={1: (120, 61.10), 2: (117, 59.37),
                              4: (117, 59.14), 8: (115, 58.27),
                              16: (111, 56.56), 32: (108, 54.65)}),
    "v5e32b": dict(variant="maxtext32b", topology="v5e-256",
                   slices="1,2,4,8,16,32", attention_flops=True,
                   published={1: (132, 66.86), 2: (128, 64.81),
                              4: (126, 64.10), 8: (125, 63.67),
                              16: (123, 62.26), 32: (119, 60.40)}),
    "v5e64b": dict(variant="maxtext64b", topology="v5e-256",
                   slices="1,2,4,8,16,32", attention_flops=True,
                   published={1: (118, 59.90), 2: (112, 56.66),
                              4: (110, 55.85), 8: (108, 54.96),
                              16: (105, 53.29), 32: (99, 50.18)}),
    "v5e128b": dict(variant="maxtext128b", topology="v5e-256",
                    slices="1,2,4,8,16,32", attention_flops=True,
                    published={1: (110, 56.06), 2: (110, 55.82),
                               4: (108, 54.93), 8: (104, 52.93),
                               16: (100, 50.86), 32: (91, 46.25)}),
    # configs/v5p/README.md (commit 76bd53b0f, 2023-12-15), 1 and 2 slices:
    # (TFLOP/s, MFU) on 1 and on 2 slices. The 128B and 1024B were also run
    # on slices twice as large, with the same batch per chip.
    **{name: dict(_v5p(*row), variant=name.split("_")[0])
       for name, row in {
        "v5p32b": ("v5p-128", (328, 71.47), (319, 69.43)),
        "v5p64b": ("v5p-128", (323, 70.31), (309, 67.26)),
        "v5p128b": ("v5p-256", (315, 68.68), (305, 66.34)),
        "v5p128b_512": ("v5p-512", (316, 68.83), (274, 59.66), 2 * 256),
        "v5p256b": ("v5p-1024", (308, 67.09), (289, 62.99)),
        "v5p512b": ("v5p-1024", (294, 63.99), (282, 61.45)),
        "v5p1024b": ("v5p-2048", (254, 55.35), (237, 51.55)),
        "v5p1024b_4096": ("v5p-4096", (297, 64.80), (279, 60.83),
                          2 * 2048),
    }.items()},
}
GROUPS = {"both": ("22b", "52b"), "v4": ("22b", "52b"),
          "v5e": ("v5e16b", "v5e32b", "v5e64b", "v5e128b"),
          "v5p": ("v5p32b", "v5p64b", "v5p128b", "v5p128b_512", "v5p256b",
                  "v5p512b", "v5p1024b", "v5p1024b_4096")}
GROUPS["all"] = GROUPS["v4"] + GROUPS["v5e"] + GROUPS["v5p"]
GOAL_POINTS = 2.0


def maxtext_flops_per_chip(config, sequences_per_chip: float,
                           attention) -> float:
  """MaxText's count: 6 x parameters x tokens per chip, plus (`attention`
  True) 12 x heads x layers x head_dim x T^2 per sequence, or half that
  (`attention='causal'`, its train.py from December 2023). Its parameters
  are ours without the learned position table (its decoders have none)."""
  cfg = gpt.GPTConfig.from_config(config.model)
  params = gpt.num_params(gpt.abstract_params(cfg), non_embedding=True)
  per_sequence = 6.0 * params * cfg.block_size
  if attention:
    per_sequence += (12.0 * cfg.n_head * cfg.n_layer * cfg.head_dim
                     * cfg.block_size**2) * (0.5 if attention == "causal"
                                             else 1.0)
  return per_sequence * sequences_per_chip


def compute_only(theirs: float, peak_tflops: float, efficiency: float,
                 row: dict, published_mfu: float) -> dict:
  """The row's fields for `compute_only_lines`: `compute_seconds` (its
  compute on the step's path), `compute_only_mfu` (MFU in MaxText's count
  if the step were that compute alone) and `published_efficiency` (the
  dense-compute efficiency at which that compute takes the published step).

  A published row above `compute_only_mfu` is out of reach of the constant
  whatever the schedule: even with every memory-bound op and transfer
  hidden the step is longer; `published_efficiency` says what the chip's
  matmuls must have run at instead (compare the efficiency used)."""
  compute = row["seconds_by_cause"].get("compute", 0.0)
  ceiling = efficiency_needed = math.nan
  if compute > 0:
    ceiling = 100 * theirs / compute / 1e12 / peak_tflops
    if published_mfu > 0:  # else no published row (nan) for this count
      published_step = theirs / (published_mfu / 100 * peak_tflops * 1e12)
      efficiency_needed = efficiency * compute / published_step
  return dict(compute_seconds=compute, compute_only_mfu=ceiling,
              published_efficiency=efficiency_needed)


def compute_only_lines(table: list[dict], efficiency: float) -> list[str]:
  """Why a row misses when its published MFU is above its compute-only
  ceiling (`compute_only`)."""
  lines = []
  for row in table:
    ceiling = row.get("compute_only_mfu", math.nan)
    if not ceiling < row["published_mfu"]:
      continue
    hidden = row["step_seconds"] - row["compute_seconds"]
    lines.append(
        f"CEILING: the {row.get('slices', 1)}-slice row is published at "
        f"{row['published_mfu']:.2f}% MFU, above the {ceiling:.2f}% its "
        f"compute alone gives at {efficiency:.4f} x peak: its published "
        f"step is this program's compute at "
        f"{row['published_efficiency']:.4f} x peak with every memory-bound "
        f"op and transfer hidden ({hidden:.3f} s of the "
        f"{row['step_seconds']:.3f} s forecast), so no schedule reaches it "
        "at this efficiency.")
  return lines


def _program_files(programs: str, variant: str, topology, count: int,
                   batch: int) -> tuple[str, str]:
  stem = os.path.join(programs, f"{variant}_{topology.name}_{count}x_b{batch}")
  return stem + ".json", stem + ".hlo.txt"


@functools.cache
def _software_key() -> dict:
  """The trm/ sources, jax and libtpu this process compiles with (read
  once: the same for every row)."""
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  try:
    libtpu = importlib.metadata.version("libtpu")
  except importlib.metadata.PackageNotFoundError:
    libtpu = None
  sources = sorted(glob.glob(os.path.join(ROOT, "trm", "**", "*.py"),
                             recursive=True))
  return dict(trm_sha256=io_lib.files_sha256(sources, ROOT),
              jax=jax.__version__, libtpu=libtpu)


def _program_key(config) -> dict:
  """What a saved program must have been compiled from to be reused."""
  return dict(_software_key(), config_sha256=hashlib.sha256(
      config.to_json(sort_keys=True).encode()).hexdigest())


def _row_digest(meta: dict, text: str) -> str:
  """SHA-256 of a saved row's JSON fields (its digest left out) and its
  program text: an edited figure or a swapped program is not replayed."""
  fields = {k: v for k, v in meta.items() if k != "sha256"}
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()
                        + b"\0" + text.encode()).hexdigest()


def load_row(programs: str, variant: str, topology, count: int, batch: int,
             config):
  """A row saved by `save_row` for this config and software, or None (then
  compiled again): also when its files are damaged or were edited."""
  meta_path, text_path = _program_files(programs, variant, topology, count,
                                        batch)
  if not (os.path.isfile(meta_path) and os.path.isfile(text_path)):
    return None
  try:
    with open(meta_path, encoding="utf-8") as f:
      meta = json.load(f)
    with open(text_path, encoding="utf-8") as f:
      text = f.read()
    if not isinstance(meta, dict) or meta.get("sha256") != _row_digest(
        meta, text):
      raise ValueError("its digest does not match its contents")
  except (OSError, ValueError, RecursionError) as e:
    plan.progress(f"  {meta_path}: damaged or edited ({str(e)[:120]}); "
                  "compiling again")
    return None
  if meta.get("key") != _program_key(config):
    plan.progress(f"  {meta_path}: compiled from another config or "
                  "software; compiling again")
    return None
  fabric = meta.pop("fabric")
  for name in ("key", "sha256"):
    meta.pop(name)
  program = None
  if fabric is not None:
    fabric = network.Fabric(**{k: tuple(map(tuple, v)) if k == "coords"
                               else tuple(v) if isinstance(v, list) else v
                               for k, v in fabric.items()})
    program = timeline.Program(text, fabric)
  return plan.CompiledRow(**meta, program=program)


def save_row(programs: str, variant: str, topology, count: int, batch: int,
             config, row) -> None:
  """The row's program text and the rest as JSON, for `load_row`."""
  meta_path, text_path = _program_files(programs, variant, topology, count,
                                        batch)
  meta = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)
          if f.name != "program"}
  meta["fabric"] = (dataclasses.asdict(row.program.fabric)
                    if row.program is not None else None)
  meta["key"] = _program_key(config)
  text = row.program.text if row.program is not None else ""
  meta["sha256"] = _row_digest(meta, text)
  atomic_files.replace_whole(text_path, text)
  atomic_files.write_json_atomic(meta_path, meta)


def compile_rows(variant: str, topology, slices, attention_flops,
                 batch_per_slice: int | None = None,
                 programs: str | None = None, permute_links: float = 1.0):
  """Each slice count's compiled row (read from `programs` where saved
  there for this config, else compiled and saved there), to be played with
  its collective-permutes over `permute_links` links (saved with 1)."""
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  variant)
  rows = []
  for count in slices:
    batch = (batch_per_slice or config.global_batch_size) * count
    row = programs and load_row(programs, variant, topology, count, batch,
                                config)
    if row:
      plan.progress(f"gpt.py:{variant}, {count} x {topology.name}: read "
                    f"from {programs}")
      rows.append(row)
      continue
    plan.progress(f"compiling gpt.py:{variant}, {count} x {topology.name} "
                  "...")
    row = plan.compile_row(config, topology, count, None, batch)
    plan.progress(f"  {row.compile_seconds:.0f} s, "
                  + (f"{row.memory_gib:.2f} GiB/chip" if row.memory_gib
                     else "memory unknown") + f", fits: {row.fits}")
    if programs:
      save_row(programs, variant, topology, count, batch, config, row)
    rows.append(row)
  if permute_links != 1:
    rows = [plan.with_fabric(row, permute_links=permute_links)
            for row in rows]
  # Our model FLOPs per chip over MaxText's 6 N T for the same step.
  ratio = (rows[0].model_flops / rows[0].chips) / maxtext_flops_per_chip(
      config, rows[0].global_batch / rows[0].chips, attention_flops)
  return config, rows, ratio


def fit(run: dict, topology, compiled, ratio, dcn_overlap: str) -> float:
  """The efficiency at which the first row's MFU is the published one."""
  first = compiled[0].slices
  target = run["published"][first][1] / 100 * ratio
  return plan.calibrate(compiled[0], topology, target, dcn_overlap)


def with_dcn_step(compiled, seconds: float) -> list:
  """The rows with each cross-slice ring step costing `seconds`."""
  return [plan.with_dcn_step(row, seconds) for row in compiled]


def fit_dcn_step(run: dict, topology, compiled, efficiency: float,
                 dcn_overlap: str) -> float:
  """The DCN ring-step latency at which the run's multi-slice rows lose
  speed against its first row as the published ones did (least squares
  over the scaling of every row that compiled, 0 to 10 ms)."""
  published = run["published"]
  first = compiled[0]
  rows = [r for r in compiled[1:] if r.program is not None
          and r.slices in published]
  if first.program is None or first.slices not in published or not rows:
    raise SystemExit(f"--fit_dcn_on: {run['variant']} needs its first row "
                     "and a multi-slice row compiled, both published.")
  def error(seconds):
    steps = [plan.forecast_row(r, topology, efficiency, dcn_overlap)[
        "step_seconds"] for r in with_dcn_step([first] + rows, seconds)]
    return sum((steps[0] / s - published[r.slices][1]
                / published[first.slices][1])**2
               for r, s in zip(rows, steps[1:]))
  # Each row's term is quasi-convex in the latency, their sum need not be
  # unimodal: a coarse grid first (0, then 1 us to 10 ms), then a
  # golden-section search between the best point's neighbours.
  grid = [0.0] + [1e-6 * 10**(k / 10) for k in range(41)]
  errors = [error(x) for x in grid]
  best = errors.index(min(errors))
  lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
  ratio = (math.sqrt(5) - 1) / 2
  for _ in range(40):
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    if error(a) <= error(b):
      hi = b
    else:
      lo = a
  fitted = (lo + hi) / 2
  if best == len(grid) - 1:
    print(f"WARNING: --fit_dcn_on: the best latency is at the search's "
          f"bound ({fitted * 1e6:.0f} us); the rows lose more speed than a "
          "ring latency explains.")
  return fitted


def compare(name: str, run: dict, topology, config, compiled, ratio,
            efficiency: float, fitted_on: str | None,
            dcn_overlap: str, dcn_fitted_here: bool = False) -> dict:
  """Prints the forecast rows beside the published ones; returns them with
  the verdict."""
  published = run["published"]
  first = compiled[0].slices
  rows = plan.with_scaling([plan.forecast_row(c, topology, efficiency,
                                              dcn_overlap)
                            for c in compiled])
  other = "schedule" if dcn_overlap == "none" else "none"
  alternative = plan.with_scaling([plan.forecast_row(c, topology, efficiency,
                                                     other)
                                   for c in compiled])
  theirs = maxtext_flops_per_chip(
      config, compiled[0].global_batch / compiled[0].chips,
      run["attention_flops"])
  peak = topology.chip.peak_bf16_tflops
  fitted_here = fitted_on == name
  how = (f"fitted on its {first}-slice row" if fitted_here else
         f"fitted on {fitted_on}, not on this run" if fitted_on else
         "given by --efficiency")
  print(f"\n{name} (gpt.py:{run['variant']}, {topology.name}): dense compute"
        f" at {efficiency:.4f} x peak, {how} (our model FLOPs are "
        f"{ratio:.4f} x MaxText's 6 N T); --dcn_overlap={dcn_overlap}"
        + ("; its multi-slice rows fix the cross-slice ring step's "
           "latency (in sample)" if dcn_fitted_here else ""))
  print(f"{'slices':>6} {'fits':>4} {'GiB':>6} {'step s':>8} "
        f"{'TFLOP/s pub':>11} {'forecast':>8} {'MFU pub':>7} "
        f"{'forecast':>8} {'error':>6} {'compute only':>12} "
        f"{'scaling pub':>11} {'forecast':>8} {'DCN GB/chip':>11} bound")
  table, checked = [], []
  for row in rows:
    count = row["slices"]
    pub_tflops, pub_mfu = published.get(count, (math.nan, math.nan))
    if row["step_seconds"] is None:  # the compiler refused it (memory)
      print(f"{count:>6}   no {row['memory_gib'] or math.nan:>6.2f} "
            f"{'-':>8} {pub_tflops:>11.0f} {'-':>8} {pub_mfu:>7.1f}  "
            f"compiler: {row['error']}")
      table.append(dict(slices=count, published_tflops=pub_tflops,
                        published_mfu=pub_mfu, fits=False,
                        memory_gib=row["memory_gib"], error=row["error"]))
      checked.append(math.inf)
      continue
    tflops = theirs / row["step_seconds"] / 1e12
    mfu = 100 * tflops / peak
    error = mfu - pub_mfu
    pub_scaling = pub_mfu / published[first][1]
    compute_alone = compute_only(theirs, peak, efficiency, row, pub_mfu)
    if not (fitted_here and count == first):
      checked.append(abs(error))
    table.append(dict(slices=count, published_tflops=pub_tflops,
                      forecast_tflops=tflops, published_mfu=pub_mfu,
                      forecast_mfu=mfu, error_points=error,
                      published_scaling=pub_scaling,
                      forecast_scaling=row["scaling_efficiency"],
                      step_seconds=row["step_seconds"],
                      **compute_alone,
                      memory_gib=row["memory_gib"], fits=row["fits"],
                      dcn_bytes=row["dcn_bytes"], ici_bytes=row["ici_bytes"],
                      bound=row["bound"],
                      seconds_by_cause=row["seconds_by_cause"],
                      unoverlapped_seconds=row.get("unoverlapped_seconds")))
    print(f"{count:>6} {'yes' if row['fits'] else 'no':>4} "
          f"{plan.memory_text(row):>6} {row['step_seconds']:>8.3f} "
          f"{pub_tflops:>11.0f} {tflops:>8.1f} {pub_mfu:>7.1f} {mfu:>8.2f} "
          f"{error:>+6.2f} {compute_alone['compute_only_mfu']:>12.2f} "
          f"{100 * pub_scaling:>10.1f}% "
          f"{100 * row['scaling_efficiency']:>7.1f}% "
          f"{row['dcn_bytes'] / 1e9:>11.3f} {row['bound']}")
  for line in (plan.sum_over_chip_lines(rows) + plan.unoverlapped_lines(rows)
               + compute_only_lines(table, efficiency)):
    print(line)
  worst = max(checked, default=0.0)
  last = rows[-1]
  scaling_error = (math.inf if last["scaling_efficiency"] is None else 100 * (
      last["scaling_efficiency"]
      - published[last["slices"]][1] / published[first][1]))
  print(f"worst MFU error of the rows not fitted: {worst:.2f} points (goal "
        f"{GOAL_POINTS:.0f}); {last['slices']}-slice scaling error: "
        f"{scaling_error:+.2f} points (goal {GOAL_POINTS:.0f})")
  warnings = plan.unread_loop_warnings(rows)
  for line in warnings:
    print(line)
  meets = (worst <= GOAL_POINTS and abs(scaling_error) <= GOAL_POINTS
           and all(r["fits"] for r in rows) and not warnings)
  print("verdict:", "MEETS THE GOAL" if meets else "MISSES THE GOAL")
  print(f"with --dcn_overlap={other} instead (same program, same "
        "constant): " + ", ".join(
            f"{r['slices']} slices {100 * theirs / r['step_seconds'] / 1e12 / peak:.2f}% MFU "
            f"({100 * r['scaling_efficiency']:.1f}% scaling)"
            for r in alternative if r["step_seconds"] is not None))
  return {"variant": run["variant"], "topology": topology.name,
          "efficiency": efficiency, "fitted_on": fitted_on,
          "meets_goal": meets, "rows": table}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
      "--run", default="22b",
      help="comma-separated runs (" + ", ".join(RUNS) + ") or groups ("
      + ", ".join(GROUPS) + ")")
  parser.add_argument("--fit_on", default="22b", choices=tuple(RUNS),
                      help="the run whose first published row fixes the "
                      "dense-compute efficiency")
  parser.add_argument("--variant", default=None,
                      help="configs/gpt.py variant (one run only; default: "
                      "the run's)")
  parser.add_argument("--slices", default=None,
                      help="slice counts (default: the published ones)")
  parser.add_argument("--efficiency", type=float, default=None,
                      help="dense-compute efficiency to use instead of "
                      "fitting it")
  parser.add_argument(
      "--dcn_overlap", default="none", choices=("none", "schedule"),
      help="none: the cross-slice reduction blocks, as MaxText's 2023 "
      "runtime ran it (BUILD_NOTES); schedule: as today's compiler "
      "schedules it")
  parser.add_argument(
      "--dcn_step_us", type=float, default=None,
      help="latency of one cross-slice ring step, microseconds (default "
      "trm.core.topology.DCN_STEP_SECONDS)")
  parser.add_argument(
      "--fit_dcn_on", default=None, choices=tuple(RUNS),
      help="fit that latency on this run's multi-slice rows instead (the "
      "run must be in --run)")
  parser.add_argument(
      "--permute_links", type=float, default=1.0,
      help="a sensitivity, not the model: collective-permutes move their "
      "bytes over this many ICI links' bandwidth (default 1, one link one "
      "way, as the time model has it; 1000 makes them nearly free)")
  parser.add_argument(
      "--programs", default=None,
      help="directory of compiled programs: each row is read from it when "
      "saved there for the same config, trm/ code, jax and libtpu, else "
      "compiled and saved")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  if args.fit_dcn_on and args.dcn_step_us is not None:
    parser.error("--dcn_step_us and --fit_dcn_on both set the latency; "
                 "pass one.")
  if args.dcn_step_us is not None and not (
      math.isfinite(args.dcn_step_us) and 0 <= args.dcn_step_us <= 1e6):
    parser.error(f"--dcn_step_us={args.dcn_step_us} must be a latency in "
                 "microseconds, 0 to 1e6.")
  if not (math.isfinite(args.permute_links) and args.permute_links >= 1):
    parser.error(f"--permute_links={args.permute_links} must be a number "
                 ">= 1 (1: the time model's one link).")
  names = []
  for part in args.run.split(","):
    if part not in RUNS and part not in GROUPS:
      parser.error(f"--run={args.run}: {part!r} is none of "
                   f"{', '.join([*RUNS, *GROUPS])}.")
    names += [n for n in GROUPS.get(part, (part,)) if n not in names]
  if args.fit_dcn_on and args.fit_dcn_on not in names:
    parser.error(f"--fit_dcn_on={args.fit_dcn_on} is not among --run's "
                 "runs; add it.")
  if args.variant and len(names) > 1:
    parser.error("--variant goes with one run.")
  runs = {n: dict(RUNS[n], **({"variant": args.variant} if args.variant
                              else {})) for n in names}
  print(f"jax {jax.__version__}; runs {', '.join(names)}; host load "
        f"{os.getloadavg()[0]:.2f}", flush=True)
  begin = time.time()
  compiled = {}
  for name, run in runs.items():
    slices = [int(s) for s in (args.slices or run["slices"]).split(",")]
    if name == args.fit_dcn_on and (slices[0] != 1 or len(slices) < 2):
      parser.error(f"--fit_dcn_on={name} needs its 1-slice row first and a "
                   "multi-slice row (--slices=1,...).")
    if (name == args.fit_on and args.efficiency is None
        and slices[0] not in run["published"]):
      parser.error(f"--slices: the fit on {name} needs a published row "
                   "first.")
    topology = parse_topology(run["topology"])
    compiled[name] = (topology, *compile_rows(
        run["variant"], topology, slices, run["attention_flops"],
        run.get("batch_per_slice"), args.programs, args.permute_links))
  dcn_step = (topology_lib.DCN_STEP_SECONDS if args.dcn_step_us is None
              else args.dcn_step_us * 1e-6)
  efficiency, fitted_on = args.efficiency, None
  if efficiency is None:
    fitted_on = args.fit_on
    if fitted_on not in compiled:  # compile the fitted run's first row
      run = RUNS[fitted_on]
      topology = parse_topology(run["topology"])
      first = int(run["slices"].split(",")[0])
      compiled[fitted_on + "-fit"] = (topology, *compile_rows(
          run["variant"], topology, [first], run["attention_flops"],
          run.get("batch_per_slice"), args.programs, args.permute_links))
    key = fitted_on if fitted_on in compiled else fitted_on + "-fit"
    topology, _, rows, ratio = compiled[key]
    if args.fit_dcn_on and rows[0].slices != 1:
      parser.error(f"--fit_dcn_on fits the latency with the efficiency "
                   f"fixed: fit the efficiency on a 1-slice row ({key}'s "
                   f"first is {rows[0].slices} slices) or give "
                   "--efficiency.")
    # A multi-slice first row is fitted with the latency it will be played at.
    efficiency = fit(RUNS[fitted_on], topology,
                     with_dcn_step(rows, dcn_step), ratio, args.dcn_overlap)
  if args.fit_dcn_on:
    topology, _, rows, _ = compiled[args.fit_dcn_on]
    dcn_step = fit_dcn_step(RUNS[args.fit_dcn_on], topology, rows,
                            efficiency, args.dcn_overlap)
  print(f"\ncross-slice ring step: {dcn_step * 1e6:.1f} us ("
        + (f"fitted on {args.fit_dcn_on}'s multi-slice rows" if
           args.fit_dcn_on else "given" if args.dcn_step_us is not None
           else "trm.core.topology.DCN_STEP_SECONDS") + ")")
  if args.permute_links != 1:
    print(f"collective-permutes over {args.permute_links:g} links' "
          "bandwidth (--permute_links: a sensitivity, not the model)")
  for name in runs:
    topology, config, rows, ratio = compiled[name]
    compiled[name] = (topology, config, with_dcn_step(rows, dcn_step), ratio)
  results = {}
  for name, run in runs.items():
    topology, config, rows, ratio = compiled[name]
    results[name] = compare(name, run, topology, config, rows, ratio,
                            efficiency, fitted_on, args.dcn_overlap,
                            name == args.fit_dcn_on)
  verdicts = ", ".join(f"{n} {'meets' if r['meets_goal'] else 'misses'}"
                       for n, r in results.items())
  print(f"\nsummary: {verdicts}; wall time {time.time() - begin:.0f} s, "
        "compiles included")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"efficiency": efficiency, "fitted_on": fitted_on,
                 "dcn_step_seconds": dcn_step,
                 "dcn_fitted_on": args.fit_dcn_on,
                 "dcn_overlap": args.dcn_overlap,
                 "permute_links": args.permute_links, "runs": results}, f,
                indent=1)


if __name__ == "__main__":
  main()
