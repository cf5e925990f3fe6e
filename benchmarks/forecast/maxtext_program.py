r"""Forecast MaxText's own compiled train steps beside its published rows.

  python benchmarks/forecast/maxtext_program.py --dumps=DIR
      [--run=all|v4|v5e|v5p|22b,v5e32b,...] [--efficiency=0.7985] [--ours]
      [--json=PATH]
  python benchmarks/forecast/maxtext_program.py --print_commands [--run=...]

`forecast_maxtext.py` compares MaxText's published one-slice rows with the
forecast of *our* programs for the same models, which mixes two errors: the
time model's, and how our compiled program differs from MaxText's. This
script separates them. It plays MaxText's own compiled step, compiled by
MaxText's `train_compile.py` for the same compile-only TPU slice and the same
libtpu, through the same forecast (`trm.forecast`), and prints its MFU beside
the published one; `--ours` also compiles our 1-slice row of each run and
prints it beside MaxText's program.

DIR/<run>/ holds what one `train_compile.py` command wrote for that run:
XLA's dump of the compiled step (`*jit_train_step*after_optimizations.txt`,
from `dump_hlo=true`) and, optionally, the command's output as
`train_compile.log`, whose "Memory analysis:" line gives MaxText's memory
per chip (the sum of arguments, outputs and temporaries, starred where it
is over the chip: the line is printed only once XLA:TPU has compiled the
step for the chip, so such a step fits all the same). `--print_commands`
prints the commands: MaxText's current code
given the published runs' shapes explicitly (its base.yml has changed since
2023-2024: SwiGLU, 128-wide heads, no tied embedding), each run's batch,
remat, attention and mesh, and the run's LIBTPU_INIT_ARGS; run them in
MaxText's checkout with JAX_PLATFORMS=cpu. Without Google credentials each
ends in an error uploading the dump to GCS, after the dump and the log are
written. MaxText's code is not part of this project: check it out and
install it beside (BUILD_NOTES, "Session 47: the slice's torus", part 3;
"Session 94" has the venv's commands). MaxText's splash attention calls
are charged as causal (`MAXTEXT_SPLASH_SCOPES`), as ours are.

MFU is in MaxText's count of the time (`forecast_maxtext.RUNS`), from the
model's shapes, so both programs are charged the same work.
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import argparse  # pylint: disable=g-import-not-at-top,wrong-import-position
import glob
import json
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import forecast_maxtext  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import topology as topology_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import tpu_flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.forecast import network  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.forecast import plan  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.forecast import timeline  # pylint: disable=g-import-not-at-top,wrong-import-position

GIB = 2**30
# The published runs' models in MaxText's current flags (global scale 1,
# every size given), with each run's own settings. 2023 v4 runs: base.yml of
# 281e04bf3 at scale 3 (22B) and 4 with its overrides (52B), sequence 1024,
# dot-product attention. 2024 v5e runs: base.yml of 289fa330 grown by
# global_parameter_scale (pyconfig.get_individual_scales), sequence 2048,
# flash attention. 2023 v5p runs (configs/v5p/<size>.sh at 76bd53b0f): the
# v5e runs' base.yml, FSDP x tensor over the slice, remat 'minimal' up to
# 256B. Each command's remat is our variant's (the run's own).
_COMMON = ("global_parameter_scale=1 head_dim=256 \"mlp_activations=['relu']\" "
           "logits_via_embedding=true vocab_size=32768 "
           "compile_topology_num_slices=1 dataset_type=synthetic "
           "use_iota_embed=true reuse_example_batch=1 enable_checkpointing="
           "false")
MAXTEXT_ARGS = {
    # run: (layers, d_model, heads, mlp, sequence, per-chip batch, attention,
    #       extra flags)
    "22b": (48, 6144, 24, 24576, 1024, 16, "dot_product",
            "ici_fsdp_parallelism=64"),
    "52b": (32, 12288, 32, 49152, 1024, 10, "dot_product",
            "ici_fsdp_parallelism=192"),
    "v5e16b": (32, 5120, 32, 32768, 2048, 6, "flash", ""),
    "v5e32b": (32, 10240, 32, 32768, 2048, 4, "flash", ""),
    "v5e64b": (64, 10240, 32, 32768, 2048, 2, "flash", ""),
    "v5e128b": (64, 10240, 64, 65536, 2048, 1, "flash",
                "ici_fsdp_parallelism=16 ici_tensor_parallelism=16"),
    # A tensor axis of 16 on v5p's 8 x 8 x N torus splits a physical axis,
    # which MaxText's mesh now refuses unless told to allow it.
    **{name: (*shape, 2048, batch, "flash",
              f"ici_fsdp_parallelism=-1 ici_tensor_parallelism={tensor}"
              + (" allow_split_physical_axes=true" if tensor > 8 else ""))
       for name, shape, batch, tensor in (
           ("v5p32b", (32, 10240, 32, 32768), 8, 4),
           ("v5p64b", (64, 10240, 32, 32768), 4, 4),
           ("v5p128b", (64, 10240, 64, 65536), 2, 8),
           ("v5p128b_512", (64, 10240, 64, 65536), 2, 8),
           ("v5p256b", (64, 20480, 64, 65536), 2, 8),
           ("v5p512b", (128, 20480, 64, 65536), 2, 16),
           ("v5p1024b", (128, 20480, 128, 131072), 2, 16),
           ("v5p1024b_4096", (128, 20480, 128, 131072), 2, 16))},
}


def _config(name: str):
  return config_lib.load_config(
      os.path.join(forecast_maxtext.ROOT, "configs", "gpt.py"),
      forecast_maxtext.RUNS[name]["variant"])


def global_batch(name: str) -> int:
  """The run's sequences a step on one slice: its variant's, or the run's
  own where it ran the variant on a larger slice (`batch_per_slice`)."""
  return (forecast_maxtext.RUNS[name].get("batch_per_slice")
          or _config(name).global_batch_size)


def libtpu_flags(name: str) -> str:
  """The run's LIBTPU_INIT_ARGS: those our variant compiles with (its
  published script's), less the one our variants add to them
  (`tpu_flags.COLLECTIVE_MATMUL_USERS`): each program compiles with its
  own framework's flags."""
  ours = tpu_flags.COLLECTIVE_MATMUL_USERS
  return " ".join(flag for flag in _config(name).tpu_compiler_options.split()
                  if flag != ours)


def command(name: str, dumps: str) -> str:
  """The train_compile.py command that writes DIR/<name>/."""
  layers, width, heads, mlp, seq, batch, attention, extra = MAXTEXT_ARGS[name]
  out = os.path.join(dumps, name)
  return (
      f'mkdir -p {out} && LIBTPU_INIT_ARGS="{libtpu_flags(name)}" '
      "python3 -m maxtext.trainers.pre_train.train_compile "
      f"src/maxtext/configs/base.yml run_name={name} "
      f"base_output_directory={out}/out "
      f"compile_topology={forecast_maxtext.RUNS[name]['topology']} "
      f"{_COMMON} base_num_decoder_layers={layers} base_emb_dim={width} "
      f"base_num_query_heads={heads} base_num_kv_heads={heads} "
      f"base_mlp_dim={mlp} max_target_length={seq} "
      f"per_device_batch_size={batch} attention={attention} "
      f"remat_policy={_config(name).model.remat_policy} {extra} "
      f"dump_hlo=true dump_hlo_local_dir={out} "
      f"dump_hlo_delete_local_after=false 2>&1 | tee {out}/train_compile.log"
  ).replace("  ", " ")


def dump_text(directory: str) -> str:
  found = sorted(glob.glob(os.path.join(
      directory, "*jit_train_step*after_optimizations.txt")))
  if not found:
    raise SystemExit(f"{directory}: no *jit_train_step*after_optimizations.txt"
                     " (MaxText's dump_hlo=true output); --print_commands "
                     "says how to make it.")
  if len(found) > 1:
    raise SystemExit(f"{directory}: {len(found)} train-step dumps; keep the "
                     "one of the run.")
  with open(found[0]) as f:
    return f.read()


def refusal(directory: str) -> str | None:
  """XLA:TPU's refusal of the run's step from its train_compile.log (the
  line with its figure, e.g. "Ran out of memory in memory space hbm. Used
  96.5G of 95.74G hbm"), None where the log names none. Such a run's
  folder can hold a dump all the same; the row says it was refused instead
  of a forecast."""
  path = os.path.join(directory, "train_compile.log")
  if not os.path.exists(path):
    return None
  with open(path, errors="replace") as f:
    text = f.read()
  lines = text.splitlines()
  # The line train_compile.py prints once XLA compiled the step.
  if any(l.startswith("Memory analysis:") for l in lines):
    return None
  line = next((l.strip() for l in lines
               if "Ran out of memory" in l or "RESOURCE_EXHAUSTED" in l), None)
  if line is None:
    return None
  gib = plan.refused_gib(text)
  return ((f"{gib:.2f} GiB a chip: " if gib else "")
          + line.split("RESOURCE_EXHAUSTED: ")[-1][:200])


def memory_gib(directory: str) -> float | None:
  """MaxText's figure per chip from train_compile.py's "Memory analysis:"
  line: arguments + outputs + temporaries - aliased (what trm.aot reads)."""
  path = os.path.join(directory, "train_compile.log")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    line = next((l for l in f if l.startswith("Memory analysis:")), "")
  sizes = {k: int(v) for k, v in re.findall(
      r"(?<!\w)(argument|output|alias|temp)_size_in_bytes=(\d+)", line)}
  if len(sizes) != 4:
    return None
  return (sizes["argument"] + sizes["output"] + sizes["temp"]
          - sizes["alias"]) / GIB


def fabric_and_config(name: str, topology):
  """Our config of the run and the slice's network, mapped through the
  same device order a 1-slice mesh of that config has (nothing compiled)."""
  config = _config(name)
  _, ctx = plan.row_context(config, topology, 1, global_batch(name))
  return (network.Fabric.for_mesh(ctx.mesh, topology, 1), config,
          ctx.mesh.devices.size)


# MaxText's splash attention calls (jax's kernels, under this scope of its
# attention op) carry a causal mask in every run here (decoder LMs); read
# so, they are charged as ours are instead of nothing.
MAXTEXT_SPLASH_SCOPES = {"static_sparsity_splash": True}


def forecast_program(text: str, fabric, topology, efficiency: float):
  chip = topology.chip
  program = timeline.Program(text, fabric,
                             splash_scopes=MAXTEXT_SPLASH_SCOPES)
  return program.play(chip.peak_bf16_tflops * 1e12, efficiency,
                      chip.hbm_gbps * 1e9, mxu_width=chip.mxu_width)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dumps", default=None,
                      help="folder with one subfolder per run (see above)")
  parser.add_argument("--run", default="all",
                      help="comma-separated runs (" + ", ".join(MAXTEXT_ARGS)
                      + ") or groups (v4, v5e, v5p, all)")
  parser.add_argument("--efficiency", type=float,
                      default=plan.DEFAULT_EFFICIENCY,
                      help="dense-compute efficiency (default: the one "
                      "fitted on our 22B program)")
  parser.add_argument("--ours", action="store_true",
                      help="also compile and forecast our 1-slice rows")
  parser.add_argument("--print_commands", action="store_true",
                      help="print the train_compile.py commands and stop")
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  names = []
  for part in args.run.split(","):
    group = forecast_maxtext.GROUPS.get(part, (part,))
    for name in group:
      if name not in MAXTEXT_ARGS:
        parser.error(f"--run={args.run}: {name!r} is none of "
                     f"{', '.join([*MAXTEXT_ARGS, 'v4', 'v5e', 'v5p', 'all'])}.")
      if name not in names:
        names.append(name)
  if args.print_commands:
    for name in names:
      print(command(name, args.dumps or "DUMPS"))
    return
  if not args.dumps:
    parser.error("--dumps=DIR is needed (or --print_commands).")
  print(f"dense compute at {args.efficiency:.4f} x peak; MFU in MaxText's "
        "count; one slice")
  print(f"{'run':>13} {'topology':>8} {'published':>9} {'MaxText prog':>12} "
        f"{'error':>6} {'GiB':>6}" + (f" {'ours':>6} {'ours-MT':>7} {'GiB':>6}"
                                        if args.ours else "")
        + "  MaxText program: compute / hbm / ici s")
  results = []
  starred = []
  for name in names:
    run = forecast_maxtext.RUNS[name]
    topology = topology_lib.parse_topology(run["topology"])
    directory = os.path.join(args.dumps, name)
    published = run["published"][1][1]
    # XLA dumps the optimized step before it checks the chip's HBM: a
    # refused run has a program too, which no chip runs.
    refused = refusal(directory)
    if refused:
      print(f"{name:>13} {topology.name:>8} {published:>9.2f} "
            f"MaxText's step refused by XLA:TPU ({refused})", flush=True)
      results.append(dict(run=name, topology=topology.name,
                          published_mfu=published, maxtext_refused=refused))
      continue
    fabric, config, chips = fabric_and_config(name, topology)
    theirs = forecast_maxtext.maxtext_flops_per_chip(
        config, global_batch(name) / chips, run["attention_flops"])
    peak = topology.chip.peak_bf16_tflops * 1e12
    step = forecast_program(dump_text(directory), fabric, topology,
                            args.efficiency)
    mfu = 100 * theirs / step.seconds / peak
    gib = memory_gib(directory)
    # train_compile.py prints its "Memory analysis:" line only once XLA:TPU
    # has compiled the step for the chip, so a figure means the step fits.
    theirs_row = dict(fits=gib is not None, memory_gib=gib,
                      chip_hbm_gib=topology.chip.usable_hbm_gib)
    starred.append(theirs_row)
    result = dict(run=name, topology=topology.name, published_mfu=published,
                  maxtext_program_mfu=mfu, error_points=mfu - published,
                  maxtext_step_seconds=step.seconds,
                  maxtext_seconds_by_cause=dict(step.by_cause),
                  maxtext_unoverlapped_seconds=step.unoverlapped_seconds,
                  maxtext_memory_gib=gib,
                  maxtext_unknown_loops=step.totals.unknown_loops,
                  maxtext_undeclared_kernels=step.totals.undeclared_kernels)
    line = (f"{name:>13} {topology.name:>8} {published:>9.2f} {mfu:>12.2f} "
            f"{mfu - published:>+6.2f} "
            + (f"{plan.memory_text(theirs_row):>6}" if gib is not None
               else f"{'-':>6}"))
    if args.ours:
      _, rows, _ = forecast_maxtext.compile_rows(
          run["variant"], topology, [1], run["attention_flops"],
          run.get("batch_per_slice"))
      ours = plan.forecast_row(rows[0], topology, args.efficiency)
      ours_mfu = (100 * theirs / ours["step_seconds"] / peak
                  if ours["step_seconds"] else float("nan"))
      result.update(ours_mfu=ours_mfu, ours_memory_gib=ours["memory_gib"],
                    ours_fits=ours["fits"],
                    ours_step_seconds=ours["step_seconds"])
      starred.append(ours)
      line += (f" {ours_mfu:>6.2f} {ours_mfu - mfu:>+7.2f} "
               f"{plan.memory_text(ours):>6}")
    causes = step.by_cause
    line += "  " + " / ".join(f"{causes.get(k, 0.0):.2f}"
                              for k in ("compute", "hbm", "ici"))
    if step.totals.unknown_loops:
      line += f"  WARNING: {step.totals.unknown_loops} loop(s) unread"
    if step.totals.undeclared_kernels:
      line += (f"  WARNING: {step.totals.undeclared_kernels} kernel call(s) "
               "charged no FLOPs")
    if plan.waits_unoverlapped(step.unoverlapped_seconds, step.seconds):
      line += (f"  NOTE: {step.unoverlapped_seconds:.2f} s on collectives "
               "awaited back to back (plan.unoverlapped_lines)")
    print(line, flush=True)
    results.append(result)
  for line in plan.sum_over_chip_lines(starred):
    print(line)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"efficiency": args.efficiency, "runs": results}, f,
                indent=1)


if __name__ == "__main__":
  main()
