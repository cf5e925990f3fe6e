r"""Forecast MaxText's published v4 runs (22B, 52B) and compare.

  python benchmarks/forecast/forecast_maxtext.py [--run=22b|52b|both]
      [--slices=...] [--efficiency=X] [--dcn_overlap=none|schedule]
      [--json=PATH]

MaxText's README ("Runtime Performance Results", TPU v4, commit 281e04bf3)
measured, counting 6 x parameters x tokens per step (train.py, no attention
term):
- a 22B decoder on 1, 2, 4 and 8 slices of v4-128: 156, 152, 149 and 146
  TFLOP/s per chip (56.7, 55.2, 54.3, 53.2 % MFU);
- a 52B decoder on 1 and 2 slices of v4-384: 154 and 162 TFLOP/s per chip
  (56.0 and 58.9 %; "quirkily higher than single slice because of choices
  made by the compiler, not for a fundamental reason", its README says).

`--run=22b` compiles our `configs/gpt.py:maxtext22b` train step for each
slice count on compile-only v4 devices, fits the one free constant (the
dense-compute efficiency) on the 1-slice row only, forecasts the other rows
and prints them beside the published ones in MaxText's FLOP count, with the
error per row and the goal's verdict (every row within 2 MFU points, the
8-slice scaling within 2 points of 93.8 %). `--run=52b` forecasts
`configs/gpt.py:maxtext52b` with the constant fitted on the 22B (compiled
in the same run unless `--efficiency` gives it): nothing is fitted on the
52B, so its rows check the forecast out of sample.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import math
import sys
import time

import jax  # pylint: disable=g-import-not-at-top

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from trm.core import config_lib  # pylint: disable=g-import-not-at-top
from trm.core.topology import parse_topology  # pylint: disable=g-import-not-at-top
from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
from trm.forecast import plan  # pylint: disable=g-import-not-at-top

# Published rows: slices -> (TFLOP/s per chip, MFU %), MaxText's count.
RUNS = {
    "22b": dict(variant="maxtext22b", topology="v4-128", slices="1,2,4,8",
                published={1: (156, 56.7), 2: (152, 55.2), 4: (149, 54.3),
                           8: (146, 53.2)}),
    "52b": dict(variant="maxtext52b", topology="v4-384", slices="1,2",
                published={1: (154, 56.0), 2: (162, 58.9)}),
}
GOAL_POINTS = 2.0


def maxtext_flops_per_chip(config, sequences_per_chip: float) -> float:
  """MaxText's count (train.py, 2023): 6 x parameters x tokens per chip.
  Its parameters are ours without the learned position table (MaxText's
  decoders have none to train)."""
  cfg = gpt.GPTConfig.from_config(config.model)
  params = gpt.num_params(gpt.abstract_params(cfg), non_embedding=True)
  return 6.0 * params * sequences_per_chip * cfg.block_size


def compile_rows(variant: str, topology, slices):
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  variant)
  rows = []
  for count in slices:
    plan.progress(f"compiling gpt.py:{variant}, {count} x {topology.name} "
                  "...")
    row = plan.compile_row(config, topology, count, None,
                           config.global_batch_size * count)
    plan.progress(f"  {row.compile_seconds:.0f} s, "
                  + (f"{row.memory_gib:.2f} GiB/chip" if row.memory_gib
                     else "memory unknown") + f", fits: {row.fits}")
    rows.append(row)
  # Our model FLOPs per chip over MaxText's 6 N T for the same step.
  ratio = (rows[0].model_flops / rows[0].chips) / maxtext_flops_per_chip(
      config, rows[0].global_batch / rows[0].chips)
  return config, rows, ratio


def fit(run: dict, topology, compiled, ratio, dcn_overlap: str) -> float:
  """The efficiency at which the first row's MFU is the published one."""
  first = compiled[0].slices
  target = run["published"][first][1] / 100 * ratio
  return plan.calibrate(compiled[0], topology, target, dcn_overlap)


def compare(name: str, run: dict, topology, config, compiled, ratio,
            efficiency: float, fitted_here: bool, dcn_overlap: str) -> dict:
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
      config, compiled[0].global_batch / compiled[0].chips)
  peak = topology.chip.peak_bf16_tflops
  how = (f"fitted on its {first}-slice row" if fitted_here else
         "fitted on the 22B, not on this run")
  print(f"\n{name} (gpt.py:{run['variant']}, {topology.name}): dense compute"
        f" at {efficiency:.4f} x peak, {how} (our model FLOPs are "
        f"{ratio:.4f} x MaxText's 6 N T); --dcn_overlap={dcn_overlap}")
  print(f"{'slices':>6} {'fits':>4} {'GiB':>6} {'step s':>8} "
        f"{'TFLOP/s pub':>11} {'forecast':>8} {'MFU pub':>7} "
        f"{'forecast':>8} {'error':>6} {'scaling pub':>11} {'forecast':>8} "
        f"{'DCN GB/chip':>11} bound")
  table, checked = [], []
  for row in rows:
    count = row["slices"]
    pub_tflops, pub_mfu = published.get(count, (math.nan, math.nan))
    tflops = theirs / row["step_seconds"] / 1e12
    mfu = 100 * tflops / peak
    error = mfu - pub_mfu
    pub_scaling = pub_mfu / published[first][1]
    if not (fitted_here and count == first):
      checked.append(abs(error))
    table.append(dict(slices=count, published_tflops=pub_tflops,
                      forecast_tflops=tflops, published_mfu=pub_mfu,
                      forecast_mfu=mfu, error_points=error,
                      published_scaling=pub_scaling,
                      forecast_scaling=row["scaling_efficiency"],
                      step_seconds=row["step_seconds"],
                      memory_gib=row["memory_gib"], fits=row["fits"],
                      dcn_bytes=row["dcn_bytes"], ici_bytes=row["ici_bytes"],
                      bound=row["bound"],
                      seconds_by_cause=row["seconds_by_cause"]))
    print(f"{count:>6} {'yes' if row['fits'] else 'no':>4} "
          f"{row['memory_gib']:>6.2f} {row['step_seconds']:>8.3f} "
          f"{pub_tflops:>11.0f} {tflops:>8.1f} {pub_mfu:>7.1f} {mfu:>8.2f} "
          f"{error:>+6.2f} {100 * pub_scaling:>10.1f}% "
          f"{100 * row['scaling_efficiency']:>7.1f}% "
          f"{row['dcn_bytes'] / 1e9:>11.3f} {row['bound']}")
  worst = max(checked, default=0.0)
  last = rows[-1]
  scaling_error = 100 * (last["scaling_efficiency"]
                         - published[last["slices"]][1] / published[first][1])
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
            for r in alternative))
  return {"variant": run["variant"], "topology": topology.name,
          "efficiency": efficiency, "fitted_here": fitted_here,
          "meets_goal": meets, "rows": table}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", default="22b", choices=("22b", "52b", "both"))
  parser.add_argument("--variant", default=None,
                      help="configs/gpt.py variant (default: the run's)")
  parser.add_argument("--slices", default=None,
                      help="slice counts (default: the published ones)")
  parser.add_argument("--efficiency", type=float, default=None,
                      help="dense-compute efficiency to use instead of "
                      "fitting it on the 22B's 1-slice row")
  parser.add_argument(
      "--dcn_overlap", default="none", choices=("none", "schedule"),
      help="none: the cross-slice reduction blocks, as MaxText's 2023 "
      "runtime ran it (BUILD_NOTES); schedule: as today's compiler "
      "schedules it")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  names = ["22b", "52b"] if args.run == "both" else [args.run]
  print(f"jax {jax.__version__}; runs {', '.join(names)}; host load "
        f"{os.getloadavg()[0]:.2f}", flush=True)
  begin = time.time()
  efficiency, results = args.efficiency, {}
  compiled = {}
  for name in names:
    run = dict(RUNS[name])
    if args.variant:
      run["variant"] = args.variant
    slices = [int(s) for s in (args.slices or run["slices"]).split(",")]
    if name == "22b" and slices[0] != 1 and efficiency is None:
      raise SystemExit("--slices: the 22B fit needs the 1-slice row first.")
    topology = parse_topology(run["topology"])
    compiled[name] = (topology, *compile_rows(run["variant"], topology,
                                              slices))
  if efficiency is None:
    if "22b" not in compiled:  # the 52B alone: fit on the 22B's 1 slice
      topology = parse_topology(RUNS["22b"]["topology"])
      compiled["22b-fit"] = (topology, *compile_rows(
          RUNS["22b"]["variant"], topology, [1]))
    key = "22b" if "22b" in compiled else "22b-fit"
    topology, _, rows, ratio = compiled[key]
    efficiency = fit(RUNS["22b"], topology, rows, ratio, args.dcn_overlap)
  for name in names:
    topology, config, rows, ratio = compiled[name]
    results[name] = compare(
        name, dict(RUNS[name], **({"variant": args.variant}
                                  if args.variant else {})),
        topology, config, rows, ratio, efficiency,
        fitted_here=name == "22b" and args.efficiency is None,
        dcn_overlap=args.dcn_overlap)
  print(f"\nwall time {time.time() - begin:.0f} s, compiles included")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"efficiency": efficiency, "dcn_overlap": args.dcn_overlap,
                 "runs": results}, f, indent=1)


if __name__ == "__main__":
  main()
