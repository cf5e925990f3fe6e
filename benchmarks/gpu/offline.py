"""The GPU kit's programs compiled for an H100 or H200 on a CPU host, with
no GPU: how much memory each step needs, what `trm.forecast`'s roofline
timeline says it takes, and which parts of the model the time goes to.

XLA:GPU compiles without a device when given the GPU's description
(deviceless AOT compilation); its compiler comes with JAX's CUDA plugin,
which needs no driver for this. In a scratch environment (about 4 GB):

  python3 -m venv --system-site-packages /tmp/gpuvenv
  /tmp/gpuvenv/bin/pip install "jax-cuda13-plugin[with-cuda]==$(python3 -c \\
      'import jax; print(jax.__version__)')"
  /tmp/gpuvenv/bin/python benchmarks/gpu/offline.py --out=DIR \\
      [--only=trm,gpt,dream] [--match=dual] [--gpu=h100|h200] \\
      [--measured=benchmarks/gpu/results/2026-11-26-h100/run1-figures.jsonl
       --measured=benchmarks/gpu/results/2026-11-26-h100/run2-figures.jsonl]

It writes `figures.jsonl` (one line per program: memory, forecast, hot
spots, and the measured time of the same program where `--measured` has
it) and each compiled program's HLO (gzip) into --out, and prints a table.

`--replay=FILE` (repeatable; .hlo or .hlo.gz, e.g. an optimized module a
GPU wrote with XLA_FLAGS=--xla_dump_to, or one this script kept) plays a
saved program instead of compiling: no CUDA plugin needed, and no memory
figure.

What the forecast leaves out: the compiler here cannot autotune, so
matmuls are cuBLAS calls (Triton's GEMM fusions are off: their tiling needs
a device) and no epilogue is fused into them; the per-instruction roofline
charges each fusion its operands' whole bytes; float32 matmuls count at
TF32's half rate. The measured H100 runs are what calibrate it
(BUILD_NOTES "On a GPU").
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import os
import sys
import time

# The kit's own folder (sys.path[0] when run as a script).
import json_out  # pylint: disable=g-bad-import-order
import profile_table  # pylint: disable=g-bad-import-order

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# XLA:GPU's view of each GPU (its GpuTargetConfig text format): public
# figures (SXM parts: SMs, boost clock, L2, HBM size and bandwidth) and the
# Hopper limits every sm_90 part shares.
GPUS = {
    "h100": dict(name="NVIDIA H100 80GB HBM3", memory=85_520_809_984,
                 bandwidth=3.35e12, peak_bf16=989e12),
    "h200": dict(name="NVIDIA H200", memory=150_754_820_096,
                 bandwidth=4.8e12, peak_bf16=989e12),
}
_TARGET = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth:.0f}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 12 }}
runtime_version {{ major: 13 minor: 0 }}
device_description_str: "{name}"
"""


def target_config(gpu: str) -> str:
  return _TARGET.format(**GPUS[gpu])


def prepare_environment() -> None:
  """Before jax is imported: the CUDA plugin registers its compiler without
  checking for a driver (JAX_PLATFORMS=cpu), and matmuls go to cuBLAS."""
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_gpu_enable_triton_gemm" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_enable_triton_gemm=false"
                               ).strip()


def gpu_devices(gpu: str):
  """One compile-only GPU device, or SystemExit saying what to install."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    return topologies.get_topology_desc(
        platform="cuda", target_config=target_config(gpu),
        topology="1x1x1").devices
  except Exception as e:  # pylint: disable=broad-except
    raise SystemExit(
        f"offline.py: no XLA:GPU compiler ({type(e).__name__}: {e}). Install "
        "JAX's CUDA plugin (no GPU needed) in a scratch environment: see "
        "this file's docstring.") from None


# --------------------------------------------------------------------------
# The programs: the kit's (benchmarks/gpu/measure.py), same configs.


@dataclasses.dataclass
class Compiled:
  name: str
  executable: object
  model_flops: float
  measured: str  # the kit's figure name for its measured time
  batch: int
  attention: str


def _kit_args(section: str, *flags: str):
  """The kit's settings for a section, as measure.py parses them."""
  import measure  # pylint: disable=g-import-not-at-top
  return measure.parse_args([section, "--out=/nonexistent", *flags])


def compile_trm(devices, name, file, metadata, batch, attention,
                mlp_kernel="dot"):
  import measure  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  from trm.families.trm import program as trm_program  # pylint: disable=g-import-not-at-top
  config = measure.trm_config(file, None, batch, False, attention,
                              mlp_kernel)
  ctx = mesh_lib.ShardingContext.from_config(config, devices)
  program = trm_program.build(config, ctx, metadata)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  step = task_lib.compile_train_step(program, ctx, batch, abstract, shardings)
  return Compiled(name, step, float(program.flops_per_step),
                  f"trm/{name.split('/')[1]}/train_step/ms", batch, attention)


def compile_gpt(devices, variant):
  """GPT-2 124M's iteration for one of the kit's `measure.GPT_VARIANTS`."""
  import measure  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  config = measure.gpt_config(_kit_args("gpt"), "/nonexistent", variant)
  attention = config.model.attention
  config = config.copy_and_resolve_references()
  ctx = mesh_lib.ShardingContext.from_config(config, devices)
  program = families.program("gpt").build(
      config, ctx, {"vocab_size": config.model.vocab_size})
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  step = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                     abstract, shardings)
  return Compiled(f"gpt/attention_{variant}", step,
                  float(program.flops_per_step),
                  f"gpt/attention_{variant}/iteration/ms",
                  config.batch_size, attention)


def compile_dream(devices, batch, attention, variant="exact"):
  """The exact sampler's whole program (a loop of the kit's steps of
  denoiser calls), or with variant='dual' the dual-cache sampler's (the
  kit's blocks), for its DiffuCoder-7B shape with bf16 weights."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import measure  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from trm.families.dream import cache as dream_cache  # pylint: disable=g-import-not-at-top
  from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sample_program  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sampling  # pylint: disable=g-import-not-at-top
  from trm.nn import platform as platform_lib  # pylint: disable=g-import-not-at-top
  kit = _kit_args("dream", f"--dream_attention={attention}")
  cfg = measure.dream_cfg(kit)
  prompt, new, steps = kit.dream_prompt, kit.dream_new, kit.dream_steps
  mesh = jax.sharding.Mesh(np.array(devices), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  params = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
      nn.meta.unbox(dream.abstract_params(cfg)))
  ids = jax.ShapeDtypeStruct((batch, prompt), jnp.int32, sharding=replicated)
  rng = jax.ShapeDtypeStruct((), jax.eval_shape(
      lambda: jax.random.key(0)).dtype, sharding=replicated)
  common = dict(params=params, rng=rng, steps=steps,
                mask_token_id=cfg.mask_token_id, max_new_tokens=new,
                alg="entropy", temperature=0.0, top_p=None, top_k=50)
  with platform_lib.mesh_platform("cuda"):
    if variant == "exact":
      lowered = sampling.lower_generate(dream.denoiser(cfg), ids, None,
                                        **common)
      flops = sample_program.sample_flops_per_call(cfg, batch, prompt, new,
                                                   steps)
    else:
      lowered = cached_sampling.lower_cached_generate(
          dream_cache.cached_denoiser(cfg), ids, None, cache="dual",
          block_length=kit.dream_block, threshold=None, **common)
      flops = sample_program.cached_flops_per_call(
          cfg, batch, prompt, new, steps, "dual", kit.dream_block, None)
  return Compiled(f"dream/b{batch}/{variant}/attention_{attention}",
                  lowered.compile(), float(flops),
                  f"dream/b{batch}/{variant}/new_tokens_per_s", batch,
                  attention)


def programs(devices, only):
  """(name, thunk) of every program to compile, in the kit's order."""
  from trm.data.puzzles import maze, sudoku  # pylint: disable=g-import-not-at-top
  out = []
  if "trm" in only:
    for batch in (384, 768):
      out.append((f"trm/mlp_t_sudoku/b{batch}", lambda b=batch: compile_trm(
          devices, f"trm/mlp_t_sudoku/b{b}", "trm_sudoku.py",
          sudoku.dataset_metadata(1), b, "dot")))
    # The token mixer as mlp_gpu's Pallas Triton kernels (the kit's
    # mlp_t_sudoku_triton): compiled for the GPU, kernels included.
    out.append(("trm/mlp_t_sudoku_triton/b384", lambda: compile_trm(
        devices, "trm/mlp_t_sudoku_triton/b384", "trm_sudoku.py",
        sudoku.dataset_metadata(1), 384, "dot", "triton")))
    # The channel MLP as channel_gpu's kernel where --mixer_setting
    # selects it (channel=...; XLA's otherwise).
    out.append(("trm/att_maze/b48/cudnn_triton", lambda: compile_trm(
        devices, "trm/att_maze/b48/cudnn_triton", "trm_maze.py",
        maze.dataset_metadata(1), 48, "cudnn", "triton")))
    for attention in ("dot", "cudnn"):
      out.append((f"trm/att_maze/b48/{attention}",
                  lambda a=attention: compile_trm(
                      devices, f"trm/att_maze/b48/{a}", "trm_maze.py",
                      maze.dataset_metadata(1), 48, a)))
  if "gpt" in only:
    import measure  # pylint: disable=g-import-not-at-top
    for variant in measure.GPT_VARIANTS:
      out.append((f"gpt/{variant}",
                  lambda v=variant: compile_gpt(devices, v)))
  if "dream" in only:
    for batch in (1, 16):
      for attention in ("dot", "cudnn"):
        out.append((f"dream/b{batch}/{attention}",
                    lambda b=batch, a=attention: compile_dream(devices, b, a)))
    for batch in (1, 16):
      out.append((f"dream/b{batch}/dual/cudnn",
                  lambda b=batch: compile_dream(devices, b, "cudnn", "dual")))
  return out


# --------------------------------------------------------------------------
# Measured figures and the report.


def measured_seconds(paths, gpu_name: str) -> dict:
  """(figure name, batch, attention) -> seconds per step, from the kit's
  figures files, for ours on this GPU: step and iteration times as they
  are; Dream's new tokens per second turned into seconds per sampling
  call (batch x new tokens / rate). A later file's figure wins."""
  out = {}
  for path in paths or ():
    for row in json_out.read_lines(path, "offline.py", "--measured"):
      if (row.get("side") != "ours" or row.get("device") != gpu_name
          or not isinstance(row.get("value"), (int, float))):
        continue  # another side or GPU, or a figure with no value (null)
      name, value = row["name"], float(row["value"])
      if name.endswith("/ms"):
        seconds = value / 1e3
      elif name.endswith("/new_tokens_per_s") and row.get("new_tokens"):
        seconds = row["batch"] * row["new_tokens"] / value
      else:
        continue
      out[(name, row.get("batch"), row.get("attention", "dot"))] = seconds
  return out


TRITON_CALL = 'custom_call_target="__gpu$xla.gpu.triton"'


def gpu_program(text: str, kernel_flops: dict | None = None):
  """`trm.forecast`'s timeline of one GPU's compiled program (no network)."""
  from trm.forecast import network  # pylint: disable=g-import-not-at-top
  from trm.forecast import timeline  # pylint: disable=g-import-not-at-top
  one_gpu = network.Fabric(((0, 0, 0),), (1, 1, 1), (False,) * 3, 1.0, 1.0, 1)
  return timeline.Program(text, one_gpu, kernel_flops)


@contextlib.contextmanager
def declared_kernel_flops():
  """Yields {(kernel name, result dims): FLOPs per call}, filled from each
  Pallas Triton kernel's `cost_estimate` as programs lower inside the
  context. Pallas's Triton lowering drops that estimate (JAX 0.10 and
  0.11), so the compiled HLO shows such a kernel's operands and results
  but not its FLOPs; the forecast charges it these."""
  table = {}
  # pylint: disable=g-import-not-at-top,protected-access
  try:
    from jax._src.pallas import core as pallas_core
    from jax._src.pallas.triton import core as triton_core
    from jax._src.pallas.triton import pallas_call_registration as triton
    lower = triton.pallas_call_lowering
  except (ImportError, AttributeError):  # another JAX: bytes only
    yield table
    return
  # pylint: enable=g-import-not-at-top
  # A call with Triton compiler params finds its lowering in this registry;
  # one without them, as the module's attribute.
  rules = getattr(pallas_core, "_backend_lowering_rules", {})
  registered = rules.get(triton_core.CompilerParams)

  def recording(ctx, *args, **params):
    cost, name = params.get("cost_estimate"), params.get("name")
    if cost is not None and name:
      dims = tuple(tuple(a.shape) for a in ctx.avals_out)
      table[(name, dims)] = cost.flops
    return lower(ctx, *args, **params)

  triton.pallas_call_lowering = recording
  if registered is not None:
    rules[triton_core.CompilerParams] = (recording,) + tuple(registered[1:])
  try:
    yield table
  finally:
    triton.pallas_call_lowering = lower
    if registered is not None:
      rules[triton_core.CompilerParams] = registered


def forecast(name: str, text: str, gpu: str, efficiency: float,
             top: int, kernel_flops: dict | None = None) -> dict:
  """The roofline timeline's figures for one compiled program's HLO."""
  spec = GPUS[gpu]
  program = gpu_program(text, kernel_flops)
  step = program.play(spec["peak_bf16"], efficiency, spec["bandwidth"])
  calls = [inst for comp in program.module.computations.values()
           for inst in comp.instructions
           if inst.opcode == "custom-call" and TRITON_CALL in inst.attrs]
  return {
      "name": name, "device": spec["name"], "efficiency": efficiency,
      "forecast_ms": 1e3 * step.seconds,
      # Pallas Triton kernels do not hand XLA their cost estimates: the
      # forecast charges them their bytes, and the FLOPs they declared
      # where the compile recorded them (`declared_kernel_flops`).
      "triton_kernels": len(calls),
      "triton_kernels_without_flops": sum(
          program.declared_flops(inst) is None for inst in calls),
      "seconds_by_cause": {k: round(v, 6) for k, v in step.by_cause.items()},
      "program_flops": step.totals.flops, "hbm_bytes": step.totals.hbm_bytes,
      "hot_spots": program.hot_spots(spec["peak_bf16"], efficiency,
                                     spec["bandwidth"], top),
  }


def replay(path: str, gpu: str, efficiency: float, top: int) -> dict:
  """The forecast of one compiled program's text, FILE(.gz) (or
  ARCHIVE.tar.gz:MEMBER), checked as profile_table.py checks --hlo."""
  text = profile_table.checked_hlo(path, "--replay", "offline.py")
  name = os.path.basename(path).removesuffix(".gz").removesuffix(".txt")
  return forecast(name, text, gpu, efficiency, top)


def report(compiled: Compiled, gpu: str, efficiency: float, measured: dict,
           out_dir: str, top: int, kernel_flops: dict | None = None) -> dict:
  spec = GPUS[gpu]
  memory = compiled.executable.memory_analysis()
  need = (memory.argument_size_in_bytes + memory.output_size_in_bytes
          + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  text = compiled.executable.as_text()
  path = os.path.join(out_dir, compiled.name.replace("/", "_") + ".hlo.gz")
  with gzip.open(path, "wt") as f:
    f.write(text)
  row = forecast(compiled.name, text, gpu, efficiency, top, kernel_flops)
  seconds = row["forecast_ms"] / 1e3
  row.update(memory_gib=need / 2**30, fits=need <= spec["memory"],
             forecast_mfu=compiled.model_flops / seconds / spec["peak_bf16"],
             model_flops=compiled.model_flops, hlo=os.path.basename(path))
  found = measured.get((compiled.measured, compiled.batch,
                        compiled.attention))
  if found:
    row["measured_ms"] = 1e3 * found
    row["forecast_over_measured"] = seconds / found
  return row


def format_row(row: dict) -> str:
  measured = (f"measured {row['measured_ms']:9.1f} ms  forecast/measured "
              f"{row['forecast_over_measured']:.2f}"
              if "measured_ms" in row else "measured -")
  memory = (f"{row['memory_gib']:6.1f} GiB" if "memory_gib" in row
            else "     - GiB")
  mfu = (f"MFU {100 * row['forecast_mfu']:.0f}%, " if "forecast_mfu" in row
         else "")
  causes = ", ".join(f"{k} {1e3 * v:.0f} ms"
                     for k, v in sorted(row["seconds_by_cause"].items()))
  lines = [f"{row['name']:34s} {memory}  forecast {row['forecast_ms']:9.1f} "
           f"ms ({mfu}{causes})  {measured}"]
  unknown = row.get("triton_kernels_without_flops",
                    row.get("triton_kernels", 0))
  if row.get("triton_kernels"):
    lines.append(f"    ({row['triton_kernels']} Pallas Triton kernel calls "
                 "in the program, charged their operands' and results' "
                 "bytes and their declared FLOPs"
                 + (f"; {unknown} declared none, so the forecast is a "
                    "lower bound)" if unknown else ")"))
  for spot in row["hot_spots"]:
    lines.append(f"    {1e3 * spot['seconds']:8.1f} ms {spot['hbm_bytes'] / 1e9:8.1f}"
                 f" GB {spot['flops'] / 1e12:7.2f} TF  {spot['kind']:11s} "
                 f"{spot['op']}")
  return "\n".join(lines)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True, help="directory for figures.jsonl "
                 "and the compiled programs' HLO")
  p.add_argument("--gpu", choices=sorted(GPUS), default="h100")
  p.add_argument("--only", default="trm,gpt,dream",
                 help="comma-separated sections: trm, gpt, dream")
  p.add_argument("--match", default="",
                 help="compile only the programs whose names contain this "
                 "(e.g. dual, b1/exact, att_maze)")
  p.add_argument("--efficiency", type=float, default=0.6,
                 help="dense matmul efficiency of the roofline (0, 1]")
  p.add_argument("--measured", action="append", default=[],
                 help="a kit figures.jsonl to compare with (repeatable)")
  p.add_argument("--top", type=int, default=12, help="hot spots per program")
  p.add_argument("--mixer_setting", default="",
                 help="the Triton TRM kernels' settings from the mixer "
                 "sweep, e.g. forward=epi_t128_w8,dx=epi_t128_w8,channel=epi "
                 "(names in mixer_sweep.KERNELS); default: the modules' own "
                 "constants")
  p.add_argument("--replay", action="append", default=[],
                 help="play a saved HLO file (.hlo or .hlo.gz) instead of "
                 "compiling (repeatable)")
  args = p.parse_args(argv)
  only = {s.strip() for s in args.only.split(",") if s.strip()}
  if not only or only - {"trm", "gpt", "dream"}:
    p.error(f"--only={args.only!r}: choose from trm, gpt, dream.")
  if not 0 < args.efficiency <= 1:
    p.error(f"--efficiency={args.efficiency}: must be in (0, 1].")
  for flag in ("measured", "replay"):
    for path in getattr(args, flag):
      if not os.path.isfile(path):
        p.error(f"--{flag}={path}: no such file.")
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    p.error(f"--out={args.out}: exists and is not a directory.")
  args.only = only
  return args


def mixer_choice(setting: str) -> dict:
  """'kernel=name,...' -> {kernel: name} of the mixer sweep's settings;
  an unknown kernel or name is an error. Imports no JAX, so main checks
  it before the CUDA plugin loads."""
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  names = {k: [n for n, _ in s] for k, _, s in mixer_sweep.KERNELS}
  chosen = {}
  for pair in filter(None, setting.split(",")):
    kernel, _, name = pair.partition("=")
    if kernel not in names or name not in names[kernel]:
      raise SystemExit(f"offline.py: --mixer_setting={setting!r}: "
                       f"{pair!r} is not one of the sweep's settings "
                       f"({names})")
    chosen[kernel] = name
  return chosen


def mixer_constants(setting: str):
  """A context with the TRM kernels' constants (mlp_gpu's, channel_gpu's)
  set to the named mixer-sweep settings ('kernel=name,...', checked by
  mixer_choice)."""
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  changes = mixer_sweep._changes(mixer_choice(setting))  # pylint: disable=protected-access
  return mixer_sweep.kernel_constants(changes)


def main(argv=None) -> None:
  args = parse_args(argv)
  for path in (REPO, HERE):
    if path not in sys.path:
      sys.path.insert(0, path)
  if args.replay:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "figures.jsonl"), "a") as figures:
      for path in args.replay:
        row = replay(path, args.gpu, args.efficiency, args.top)
        figures.write(json.dumps(row) + "\n")
        print(format_row(row), flush=True)
    return
  mixer_choice(args.mixer_setting)  # a wrong name fails before any compile
  measured = measured_seconds(args.measured, GPUS[args.gpu]["name"])
  prepare_environment()
  import jax  # pylint: disable=g-import-not-at-top
  devices = gpu_devices(args.gpu)
  os.makedirs(args.out, exist_ok=True)
  print(f"offline.py: {devices[0].device_kind} (compile-only), jax "
        f"{jax.__version__}, efficiency {args.efficiency}", flush=True)
  with open(os.path.join(args.out, "figures.jsonl"), "a") as figures, \
      mixer_constants(args.mixer_setting), \
      declared_kernel_flops() as kernel_flops:
    chosen = [(n, b) for n, b in programs(devices, args.only)
              if args.match in n]
    if not chosen:
      print(f"offline.py: no program of {sorted(args.only)} matches "
            f"--match={args.match!r}", flush=True)
    for name, build in chosen:
      start = time.time()
      try:
        compiled = build()
      except Exception as e:  # pylint: disable=broad-except
        print(f"{name}: did not compile ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:300]})", flush=True)
        continue
      row = report(compiled, args.gpu, args.efficiency, measured, args.out,
                   args.top, kernel_flops)
      row.update(compile_s=round(time.time() - start, 1),
                 jax=jax.__version__)
      figures.write(json.dumps(row) + "\n")
      figures.flush()
      print(format_row(row), flush=True)


if __name__ == "__main__":
  main()
