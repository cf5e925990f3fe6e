"""Compile one forecast_llama row (compile-only TPU devices) with fewer
layers and print its HBM a chip; with --dump=DIR XLA also writes its
buffer assignment there (`*-memory-usage-report.txt`: the largest
buffers; `*-live-range.txt`: those live at the peak, which the script
prints, `--peak=N`, with the op each came from). libtpu takes
`xla_dump_to` as a compile option, not in LIBTPU_INIT_ARGS.

  PYTHONPATH=. python3 benchmarks/forecast/memory_dump.py \
      --run=v6e_l8b_8k --layers=2 --reduce_once=1 --dump=/tmp/dump

With --hbm_limit_mib=MIB it compiles for a chip of that much HBM: XLA:TPU
reschedules and rematerializes to fit, or refuses, and the line says which.
"""
import argparse
import ast
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import forecast_llama  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import tpu_flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core.topology import parse_topology  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.forecast import plan  # pylint: disable=g-import-not-at-top,wrong-import-position

# An allocation's line in XLA's buffer assignment: its size, memory color
# (absent: 0, HBM) and kind.
_ALLOCATION = re.compile(r"allocation \d+: size (\d+)(?:, color (\d+))?(.*)")
# A live buffer's line under "Live ranges at N (peak):".
_LIVE = re.compile(r"^\s+(\S+): (\d+) bytes")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", required=True,
                      help=f"one of {', '.join(forecast_llama.RUNS)}")
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--reduce_once", type=int, choices=(0, 1), default=1,
                      help="config.loss_reduce_once")
  parser.add_argument("--dump", default=None, help="XLA's dump directory")
  parser.add_argument("--peak", type=int, default=20, metavar="N",
                      help="with --dump: print the N largest buffers live "
                      "at the step's peak, as XLA's live-range report "
                      "lists them")
  parser.add_argument("--hbm_limit_mib", type=int, default=None,
                      metavar="MIB",
                      help="compile for a chip of MIB MiB of HBM "
                      "(xla_tpu_max_hbm_size_mib): where XLA's own check "
                      "refuses the step, and what it compiles under it")
  parser.add_argument("--set", action="append", default=[],
                      metavar="KEY=VALUE",
                      help="a config field on top of the row's, e.g. "
                      "model.head_gather=compute (a Python literal, else "
                      "text; repeatable)")
  args = parser.parse_args(argv)
  if args.run not in forecast_llama.RUNS:
    parser.error(f"--run={args.run!r}: not one of "
                 f"{', '.join(forecast_llama.RUNS)}")
  if args.layers < 1:
    parser.error(f"--layers={args.layers}: must be at least 1")
  if args.peak < 0:
    parser.error(f"--peak={args.peak}: must be 0 or more")
  run = forecast_llama.RUNS[args.run]
  config = forecast_llama.config_for(run)
  config.n_layer = args.layers
  config.loss_reduce_once = bool(args.reduce_once)
  try:
    config_lib.set_values(config, dict(_override(item) for item in args.set))
  except ValueError as e:
    parser.error(f"--set: {e}")
  topology = parse_topology(run["topology"])
  if args.hbm_limit_mib is not None:
    # One of the row's own options: checked against LIBTPU_INIT_ARGS and
    # the chip as they are.
    config.tpu_compiler_options = (
        f"{config.get('tpu_compiler_options', '')} "
        f"--{tpu_flags.HBM_LIMIT}={args.hbm_limit_mib}").strip()
    try:
      tpu_flags.hbm_limit_gib(config, topology.chip.usable_hbm_gib)
      tpu_flags.check_environment(
          tpu_flags.parse(config.tpu_compiler_options))
    except ValueError as e:
      parser.error(f"--hbm_limit_mib: {e}")
  for_mesh = tpu_flags.for_mesh
  if args.dump:
    tpu_flags.for_mesh = lambda config, mesh: dict(
        for_mesh(config, mesh), xla_dump_to=args.dump,
        xla_dump_hlo_as_text=True)
  try:
    row = plan.compile_row(config, topology, 1, None,
                           config.global_batch_size)
  finally:
    tpu_flags.for_mesh = for_mesh
  head = (f"{args.run} layers={args.layers} "
          f"reduce_once={bool(args.reduce_once)}"
          + (f" hbm_limit_mib={args.hbm_limit_mib}"
             if args.hbm_limit_mib is not None else "")
          + "".join(" " + item for item in args.set))
  if row.program is None:
    print(f"{head}: refused by XLA ("
          + (f"{row.memory_gib:.3f} GiB a chip" if row.memory_gib
             else f"{row.host_memory_gib:.3f} GiB of host memory a chip"
             if row.host_memory_gib else "no figure") + f"): {row.error}")
    return
  print(f"{head}: {row.memory_gib:.3f} GiB a chip (arguments, outputs and "
        f"temporaries less aliased; XLA's peak {row.memory_peak_gib:.3f}), "
        f"fits={row.fits} (XLA compiled it), host "
        f"{row.host_memory_gib:.2f} GiB")
  if args.dump:
    print(allocations(args.dump))
  if args.dump and args.peak:
    print("\n".join(peak_buffers(args.dump, args.peak)))


def _override(item: str) -> tuple[str, object]:
  """'KEY=VALUE' -> (KEY, VALUE as a Python literal, else the text), as
  benchmarks/reliability/mesh_equivalence.py reads its overrides."""
  key, sep, text = item.partition("=")
  if not sep:
    raise ValueError(f"{item!r}: expected KEY=VALUE")
  try:
    return key, ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return key, text


def _newest_report(dump: str, kind: str) -> str | None:
  """The newest `*train_step*after_optimizations-{kind}.txt` in `dump`."""
  reports = glob.glob(os.path.join(
      dump, f"*train_step*after_optimizations-{kind}.txt"))
  return max(reports, key=os.path.getmtime) if reports else None


def allocations(dump: str) -> str:
  """XLA's buffer assignment of the train step in HBM (memory color 0):
  GiB of parameters and outputs, and of temporaries (a sum of allocations,
  each temporary one the heap it packs)."""
  report = _newest_report(dump, "buffer-assignment")
  if report is None:
    return f"no train step buffer assignment in {dump}"
  params = temps = 0
  with open(report, encoding="utf-8") as f:
    for line in f:
      match = _ALLOCATION.match(line)
      if not match or (match.group(2) or "0") != "0":
        continue
      if "parameter" in match.group(3) or "live-out" in match.group(3):
        params += int(match.group(1))
      else:
        temps += int(match.group(1))
  return (f"buffer assignment, HBM: {params / 2**30:.2f} GiB parameters "
          f"and outputs, {temps / 2**30:.2f} GiB temporaries, "
          f"{(params + temps) / 2**30:.2f} GiB in all")


def peak_buffers(dump: str, count: int) -> list[str]:
  """The train step's `count` largest buffers live at its peak, from XLA's
  `*train_step*after_optimizations-live-range.txt` in `dump` (the header
  line first: the schedule's position of the peak)."""
  report = _newest_report(dump, "live-range")
  if report is None:
    return [f"no train step live-range report in {dump}"]
  with open(report, encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = next((i for i, line in enumerate(lines) if "(peak):" in line),
               None)
  if start is None:
    return [f"{report}: no peak section"]
  live = []
  for line in lines[start + 1:]:
    match = _LIVE.match(line)
    if not match:
      break
    live.append((int(match.group(2)), match.group(1)))
  live.sort(key=lambda item: -item[0])
  program = report.replace("-live-range.txt", ".txt")
  text = ""
  if os.path.exists(program):
    with open(program, encoding="utf-8") as f:
      text = f.read()
  rows = []
  for size, name in live[:count]:
    # Where it comes from: the instruction's op_name, when XLA kept one.
    made = re.search(r"\n\s*%?" + re.escape(name.split("{")[0])
                     + r" = [^\n]*?op_name=\"([^\"]+)\"", text)
    rows.append(f"{size / 2**20:10.1f} MiB  {name}"
                + (f"  {made.group(1)}" if made else ""))
  return [lines[start].strip()] + rows


if __name__ == "__main__":
  main()
