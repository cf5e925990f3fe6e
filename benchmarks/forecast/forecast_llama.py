r"""Forecast MaxText's published Llama2-70B runs (FSDP only, one slice; on
v6e also GPT-3 175B and Llama 3.1) and compare: an out-of-sample check
with nothing fitted.

  python benchmarks/forecast/forecast_llama.py
      [--run=v5e,v5p128,v5p1024,v6e,v6e2025,v6e_gpt3,...|all]
      [--efficiency=X[,Y...]] [--splash_factor=F] [--per_chip=N]
      [--json=PATH]

Published:
- MaxText `getting_started/Run_Llama2.md`: Llama2-70b at 57% MFU on a
  v5e-256 and 65% on a v5p-128 (and 57% on a v4-128, whose command was
  never published). Their configs: `benchmarks/maxtext_v5e_model_configs.py`
  `llama2_70b_v5e_256` (= `MaxText/configs/v5e/llama2_70b.sh`: FSDP over
  the slice, 2 sequences of 2048 per chip, remat `qkv_proj_offloaded`) and
  `maxtext_v5p_model_configs.py` `llama2_70b_v5p_128` (FSDP, 4 sequences
  of 4096 per chip, remat `save_dot_except_mlpwi`), both with MaxText's
  DATA_PARALLEL_OVERLAP + CF_FOR_ALL_GATHER flags (the seven of its v5e
  runs). MaxText's count of 2024: attention not halved for causality.
- MaxText's "Optimized models tiering" page: v5p, "Llama 2 70B, 512 Chips,
  BF16, SL=4096, 65.4% MFU, 692 tokens/sec/device" (its count of 2025:
  attention halved), recipe `MaxText/configs/v5p/llama2_70b.sh` (4 per chip).
- v6e (Trillium), one v6e-256: tpu-recipes
  `training/trillium/Llama2-70B-MaxText/README.md` (2024-10-31, MaxText
  e7292a3a, libtpu 20241028) logged 17.373 s a step, 419.193 TFLOP/s per
  chip (45.66% of 918) for `llama2_70b_4096` of
  `benchmarks/maxtext_trillium_model_configs.py`: 4 sequences of 4096 per
  chip, FSDP over the slice (its `fsdp_transpose` axis), remat `full`,
  flash (splash) attention, flags DENSE_VMEM_LIMIT + CF_FOR_ALL_GATHER.
  MaxText's "Optimized models tiering" page (2025-10) lists "Llama 2 70B,
  256, BF16, SL=4096, 43.8% MFU, 900" tokens/s per chip: the recipe's
  2025-03 log, `llama2_70b_4096_sc` at tpu-recipes-v0.1.0 (2 per chip,
  remat `qkv_proj_offloaded`, all-reduces offloaded to the SparseCores;
  9.052 s, 402.274 TFLOP/s = 43.82%). Both in the 2024 count (attention
  not halved: PR #1988, 2025-07, came after both runs).
- v6e, a third run (`--run=v6e_gpt3`, session 83): tpu-recipes
  `training/trillium/GPT3-175B-MaxText/bf16/README.md` (MaxText tag
  tpu-recipes-v0.1.2, JAX 0.5.2) logged 17.182 s a step, 384.891 TFLOP/s
  per chip (41.93% of 918) for `gpt_3_175b_bf16`: 3 sequences of 2048 per
  chip, FSDP over the slice, remat `full`, flash attention, flags
  DENSE_VMEM_LIMIT + CF_FOR_ALL_GATHER + DATA_PARALLEL_OVERLAP +
  DISABLE_BUNDLE_AWARE_COST_MODEL; the count before PR #1988 reproduces
  its TFLOP/s. GPT-3 is a GPT: no proxy, its own MLP (49152) and
  vocabulary (50304).
- v6e at sequence 8192 (session 84), Llama 3.1 on one v6e-256, all with
  flash attention in blocks of 2048 (fused backward), remat `custom` with
  the layer input and q, k, v offloaded to the host, flags DENSE_VMEM_LIMIT
  + LAYOUT_FOR_ALL_REDUCE_SCATTER + DATA_PARALLEL_OVERLAP +
  CF_FOR_ALL_GATHER (+ HOST_OFFLOAD_FLAGS, and for the 8B the SparseCore
  all-reduce offload: XLA:TPU's lowering, left out), each in the count
  before PR #1988 (checked against its log):
  `v6e_l70b_8k`: tpu-recipes `training/trillium/Llama3.1-70B-MaxText/
  README.md` (tpu-recipes-v0.1.2, JAX 0.5.2) logged 34.562 s, 456.442
  TFLOP/s (49.72%) at 32768 tokens per chip: 4 sequences (its listed
  `per_device_batch_size` says 5; its log's tokens and weights say 4).
  `v6e_l70b_8k_b5`: `.../Llama3.1-70B-MaxText/v6e-256/README.md`
  (tpu-recipes-v0.1.4, JAX 0.6.1), 5 per chip: 42.656 s, 462.297 (50.36%).
  `v6e_l8b_8k`: `.../Llama3.1-8B-MaxText/v6e-256/README.md` (v0.1.4), 4
  per chip: 4.546 s, 417.397 (45.47%); the 8B runs also offloaded
  attention's output projection (`out_proj`, since session 87 here).
- The same two models on smaller v6e slices (session 87; tpu-recipes
  `training/trillium/Llama3.1-{70B,8B}-MaxText/v6e-N/README.md`,
  v0.1.4, JAX 0.6.1, each its log's step): the 70B at 4 per chip on a
  v6e-128 (`v6e128_l70b_8k`, 34.786 s), 2 per chip on a v6e-64
  (`v6e64_l70b_8k`, 18.688 s) and on a v6e-32 with bfloat16 weights and
  collective matmuls off (`v6e32_l70b_8k`, 17.790 s); the 8B at 4 per chip
  on a v6e-128 (`v6e128_l8b_8k`, 4.602 s), 3 on a v6e-32 and a v6e-8
  (`v6e32_l8b_8k`, 3.495 s; `v6e8_l8b_8k`, 3.443 s; collective matmuls
  off). Whether a miss follows the model or the slice.
  These rows compile with the runs' remat (`remat_policy=custom`, the
  layer input and q, k, v offloaded to the host, `CUSTOM_OFFLOAD`; the
  time model moves them over the chip's PCIe link). Before our GPT could
  offload (session 84) the 70B at 4 or 5 x 8192 per chip needed 52-64 GB
  of temporaries and XLA:TPU refused to compile it; with the offload but
  full-width k and v (before session 86) 4 per chip needed 160 GiB of
  host memory, over the 128 GiB libtpu's compile-only v6e allows. With
  Llama's 8 key/value heads both published batches compile (90 GiB of
  host memory at 4 per chip). `--per_chip=N` still compiles another
  batch where one does not (the row is compared with the published MFU,
  and says so).

Our GPT has no SwiGLU or RoPE, so the model is a GPT with Llama2-70B's
attention and weight-matmul FLOPs and parameters in every layer: 80 x
8192, 64 query heads of 128 over Llama's 8 key/value heads (GQA:
`n_kv_head`, since session 86; before, k and v were full width and the MLP
narrower), and the MLP widened to `proxy_mlp_size()` = 43008 = 1.5 x
28672 so that its two matmuls carry SwiGLU's three (855.6M per layer both
ways); vocabulary 32000 (tied: the same logits matmul). MaxText's count
of that step equals ours to 2e-5 (relative). Our remat is
`full` outside the Llama 3.1 rows (it fits; `minimal` would need ~200 GB per chip on v5p): it
recomputes 1.0% (v5e) and 3.0% (v5p) more weight-matmul FLOPs than MaxText's
policies did, which the table leaves in (BUILD_NOTES). MaxText's 2024 v6e run
used `full` too; at its 4 x 4096 per chip our GPT compiles with a memory sum
of 34.42 GiB per chip, over v6e's 31.25, which XLA fits all the same
(`yes 34.42*`; the verdict is XLA's compile since session 92).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# First: it points JAX at compile-only TPU devices before jax loads, and puts
# the repository on the path.
import forecast_maxtext  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core import config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.core.topology import parse_topology  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.data import atomic_files  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.forecast import ops  # pylint: disable=g-import-not-at-top,wrong-import-position
from trm.forecast import plan  # pylint: disable=g-import-not-at-top,wrong-import-position

ROOT = forecast_maxtext.ROOT

# MaxText's configs/models/llama2-70b.yml.
LLAMA2_70B = dict(n_layer=80, emb=8192, heads=64, kv_heads=8, head_dim=128,
                  mlp=28672, vocab=32000)

# MaxText's configs/models/llama3.1-70b.yml and llama3.1-8b.yml.
LLAMA31_70B = dict(LLAMA2_70B, vocab=128256)
LLAMA31_8B = dict(n_layer=32, emb=4096, heads=32, kv_heads=8, head_dim=128,
                  mlp=14336, vocab=128256)

# MaxText's configs/models/gpt3-175b.yml: a GPT (two GELU MLP matmuls,
# full multi-head attention).
GPT3_175B = dict(n_layer=96, emb=12288, heads=96, kv_heads=96, head_dim=128,
                 mlp=49152, vocab=50304, mlp_matmuls=2)

# Published one-slice rows: topology, sequences per chip, sequence length,
# MFU % and whether that count halved the attention term (causal); the
# model where it is not Llama2-70B.
# The Llama 3.1 runs' remat_policy=custom: these offloaded to the host,
# everything else recomputed (MaxText's decoder_layer_input, query_proj,
# key_proj, value_proj: offload).
CUSTOM_OFFLOAD = "decoder_layer_input,query_proj,key_proj,value_proj"
# The 8B runs' also offloaded attention's output projection (`out_proj`).
CUSTOM_OFFLOAD_8B = CUSTOM_OFFLOAD + ",out_proj"


def _llama31(topology: str, per_chip: int, tflops: float, model: dict,
             flags: str = "trillium_llama31", **extra) -> dict:
  """A tpu-recipes Llama 3.1 run at 8192 (its logged TFLOP/s per chip / 918
  peak): splash in tiles of 2048, remat_policy=custom with its offloads,
  the head's gradient summed once (MaxText's one logits matmul)."""
  return dict(topology=topology, per_chip=per_chip, seq=8192,
              mfu=100 * tflops / 918, causal=False, flags=flags, model=model,
              splash_block=2048,
              remat_offload=(CUSTOM_OFFLOAD_8B if model is LLAMA31_8B
                             else CUSTOM_OFFLOAD),
              loss_reduce_once=True, **extra)


RUNS = {
    "v5e": dict(topology="v5e-256", per_chip=2, seq=2048, mfu=57.0,
                causal=False),
    "v5p128": dict(topology="v5p-128", per_chip=4, seq=4096, mfu=65.0,
                   causal=False),
    "v5p1024": dict(topology="v5p-1024", per_chip=4, seq=4096, mfu=65.4,
                    causal=True),
    # The recipe logged TFLOP/s per chip (419.193), not MFU: / 918 peak.
    "v6e": dict(topology="v6e-256", per_chip=4, seq=4096,
                mfu=100 * 419.193 / 918, causal=False, flags="trillium"),
    "v6e2025": dict(topology="v6e-256", per_chip=2, seq=4096, mfu=43.8,
                    causal=False, flags="trillium"),
    # Logged 384.891 TFLOP/s per chip: / 918 peak.
    "v6e_gpt3": dict(topology="v6e-256", per_chip=3, seq=2048,
                     mfu=100 * 384.891 / 918, causal=False,
                     flags="trillium_gpt3", model=GPT3_175B),
    # Llama 3.1 at 8192 (`_llama31`).
    "v6e_l70b_8k": _llama31("v6e-256", 4, 456.442, LLAMA31_70B),
    "v6e_l70b_8k_b5": _llama31("v6e-256", 5, 462.297, LLAMA31_70B),
    "v6e_l8b_8k": _llama31("v6e-256", 4, 417.397, LLAMA31_8B),
    # The same models on smaller v6e slices (tpu-recipes-v0.1.4, JAX
    # 0.6.1, each its own README's logged step): does the miss follow the
    # model or the slice?
    "v6e128_l70b_8k": _llama31("v6e-128", 4, 453.500, LLAMA31_70B),
    # Summed once: 29.91 GiB a chip in sum since session 90's lookup
    # (33.17 before; per chunk 38.67 in session 87; sums, read against the
    # chip before session 92 made XLA's compile the verdict): the
    # optimizer's state is 4x 256 chips' a chip.
    "v6e64_l70b_8k": _llama31("v6e-64", 2, 422.091, LLAMA31_70B),
    # bfloat16 weights (MaxText's weight_dtype; Adam's moments follow),
    # windowed-einsum collective matmuls disabled.
    "v6e32_l70b_8k": _llama31("v6e-32", 2, 443.385, LLAMA31_70B,
                              flags="trillium_llama31_no_cm",
                              param_dtype="bfloat16"),
    "v6e128_l8b_8k": _llama31("v6e-128", 4, 412.319, LLAMA31_8B),
    "v6e32_l8b_8k": _llama31("v6e-32", 3, 407.225, LLAMA31_8B,
                             flags="trillium_llama31_no_cm"),
    "v6e8_l8b_8k": _llama31("v6e-8", 3, 413.433, LLAMA31_8B,
                            flags="trillium_llama31_no_cm"),
}
# MaxText's v6e LIBTPU_INIT_ARGS (benchmarks/xla_flags_library.py:
# DENSE_VMEM_LIMIT_FLAG + CF_FOR_ALL_GATHER); the 2025 run's SparseCore
# all-reduce offload is left out (XLA:TPU's lowering, not the model's).
FLAGS = {
    "trillium": ("--xla_tpu_scoped_vmem_limit_kib=98304 "
                 "--xla_tpu_enable_async_collective_fusion=true "
                 "--xla_tpu_enable_async_collective_fusion_fuse_all_gather="
                 "true "
                 "--xla_tpu_enable_async_collective_fusion_multiple_steps="
                 "true "
                 "--xla_tpu_overlap_compute_collective_tc=true "
                 "--xla_enable_async_all_gather=true"),
}
# The GPT-3 run's: those, DATA_PARALLEL_OVERLAP and
# DISABLE_BUNDLE_AWARE_COST_MODEL (benchmarks/xla_flags_library.py).
FLAGS["trillium_gpt3"] = FLAGS["trillium"] + (
    " --xla_tpu_enable_data_parallel_all_reduce_opt=true"
    " --xla_tpu_data_parallel_opt_different_sized_ops=true"
    " --xla_tpu_use_bundle_aware_cost_model_for_fusions=false")
# The Llama 3.1 runs': DENSE_VMEM_LIMIT, CF_FOR_ALL_GATHER,
# LAYOUT_FOR_ALL_REDUCE_SCATTER and DATA_PARALLEL_OVERLAP.
FLAGS["trillium_llama31"] = FLAGS["trillium"] + (
    " --xla_tpu_use_minor_sharding_for_major_trivial_input=true"
    " --xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1"
    " --xla_tpu_assign_all_reduce_scatter_layout=true"
    " --xla_tpu_enable_data_parallel_all_reduce_opt=true"
    " --xla_tpu_data_parallel_opt_different_sized_ops=true")
# Those with DISABLE_COLLECTIVE_MATMUL (no windowed einsums).
FLAGS["trillium_llama31_no_cm"] = FLAGS["trillium_llama31"] + (
    " --xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000")


def attention_params(m: dict = LLAMA2_70B) -> int:
  """Weight-matmul parameters of one layer's attention: GQA q|k|v and the
  output projection."""
  return (m["emb"] * (m["heads"] + 2 * m["kv_heads"]) * m["head_dim"]
          + m["heads"] * m["head_dim"] * m["emb"])


def llama_layer_params(m: dict = LLAMA2_70B) -> int:
  """Weight-matmul parameters of one Llama decoder layer: its attention,
  SwiGLU's gate, up and down projections (a GPT's: two MLP matmuls)."""
  return attention_params(m) + m.get("mlp_matmuls", 3) * m["emb"] * m["mlp"]


def proxy_mlp_size(m: dict = LLAMA2_70B) -> int:
  """The GPT MLP width whose two matmuls, beside Llama's q|k|v (GQA: our
  GPT's n_kv_head) and output projections, give the layer Llama's
  weight-matmul parameters: SwiGLU's three matmuls as two 1.5x as wide."""
  width, rest = divmod(llama_layer_params(m) - attention_params(m),
                       2 * m["emb"])
  assert not rest, "no integer MLP width matches the layer"
  return width


def maxtext_flops_per_chip(per_chip: int, seq: int, causal: bool,
                           m: dict = LLAMA2_70B) -> float:
  """MaxText's `calculate_tflops_training_per_device` for Llama (x 1e12):
  3 x (weight matmuls per layer x layers + logits), plus 3 x attention
  (4 B S^2 H hd per layer, halved when `causal`, as its count since 2025)."""
  tokens = per_chip * seq
  weights = 2 * tokens * (llama_layer_params(m) * m["n_layer"]
                          + m["emb"] * m["vocab"])
  attention = (4 * per_chip * seq**2 * m["heads"] * m["head_dim"]
               * m["n_layer"] * (0.5 if causal else 1.0))
  return 3 * (weights + attention)


def splash_seconds(compiled, topology, efficiency: float) -> float | None:
  """The roofline seconds a step spends in jax's splash attention kernels
  (forward, remat recompute, dq, dkv; as `hot_spots` charges them), or None
  where the row has no program."""
  program = getattr(compiled, "program", None)
  if program is None:
    return None
  chip = topology.chip
  total = 0.0
  for inst, seconds, _, _, runs in program.instruction_times(
      chip.peak_bf16_tflops * 1e12, efficiency, chip.hbm_gbps * 1e9,
      chip.mxu_width):
    name = ops.pallas_kernel_name(inst)
    if name and name.startswith(("splash_mha_", "splash_mqa_")):
      total += seconds * runs
  return total


def config_for(run: dict):
  """configs/gpt.py:maxtext64b (FSDP over the slice, splash attention, full
  remat over scanned layers, MaxText's v5e flags unless the run names
  others) with the run's model's matmuls (Llama2-70B's unless it names
  another), the run's batch and sequence, its splash tile if it set one,
  and its offloads (remat_policy=custom) if it had them."""
  m = run.get("model", LLAMA2_70B)
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "maxtext64b")
  chips = parse_topology(run["topology"]).chips
  config.n_layer, config.n_head = m["n_layer"], m["heads"]
  config.n_embd, config.block_size = m["emb"], run["seq"]
  config.batch_size = run["per_chip"] * chips
  config.model.head_size = m["head_dim"]
  config.model.n_kv_head = m["kv_heads"] if m["kv_heads"] != m["heads"] else 0
  config.model.mlp_size = proxy_mlp_size(m)
  config.model.vocab_size = m["vocab"]
  config.model.remat_policy = "full"
  if run.get("remat_offload"):  # MaxText's remat_policy=custom
    config.model.remat_policy = "custom"
    config.model.remat_offload = run["remat_offload"]
  # The run's splash tile where it set one for every pass (MaxText's
  # sa_block_*); else ours (512 at these lengths: the Llama2 and GPT-3 runs
  # set q 1024 with the default 512 key blocks, which one tile cannot say).
  config.model.splash_block = run.get("splash_block", 0)
  if "flags" in run:  # else maxtext64b's: MaxText's v5e flags
    config.tpu_compiler_options = FLAGS[run["flags"]]
  if "param_dtype" in run:  # MaxText's weight_dtype
    config.model.param_dtype = run["param_dtype"]
  # The Llama 3.1 rows sum the head's gradient over the chips once, as
  # MaxText's one logits matmul does (GPT-3's float32 copy took its sum to
  # 31.76 GiB in session 87; not recompiled under XLA's verdict).
  config.loss_reduce_once = run.get("loss_reduce_once", False)
  return config


def parse_args(argv=None):
  """The flags, checked before anything compiles."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--run", default="all",
                      help=f"comma-separated of {', '.join(RUNS)}, or all")
  parser.add_argument("--efficiency", default=str(plan.DEFAULT_EFFICIENCY),
                      help="dense-compute fraction of peak, or several "
                           "comma-separated (one compile, a line each; "
                           "default: the constant fitted on MaxText's v4 "
                           "22B)")
  parser.add_argument("--splash_factor", type=float, default=None,
                      help="also the MFU if the splash kernels took this "
                           "many times their modelled seconds (a candidate "
                           "for v6e, not part of the time model)")
  parser.add_argument("--per_chip", type=int, default=None,
                      help="compile N sequences per chip instead of the "
                           "run's (a stand-in where the run's batch does "
                           "not compile; the published MFU stays the run's)")
  parser.add_argument("--json", default=None, help="also write the rows")
  args = parser.parse_args(argv)
  names = list(RUNS) if args.run == "all" else args.run.split(",")
  unknown = [n for n in names if n not in RUNS]
  if unknown or not names:
    raise SystemExit(f"--run: unknown {unknown or [args.run]}; choose from "
                     f"{', '.join(RUNS)} or all.")
  try:
    efficiencies = [float(e) for e in args.efficiency.split(",")]
  except ValueError:
    raise SystemExit(f"--efficiency={args.efficiency}: fractions of peak, "
                     "comma-separated.") from None
  for efficiency in efficiencies:
    if not 0.0 < efficiency <= 1.0:
      raise SystemExit(f"--efficiency={efficiency}: a fraction of peak, "
                       "above 0 and at most 1.")
  if args.splash_factor is not None and not (
      0.0 < args.splash_factor < 100.0):  # also refuses nan
    raise SystemExit(f"--splash_factor={args.splash_factor}: a multiple of "
                     "the splash kernels' modelled time, above 0 and below "
                     "100.")
  # Below 2**31, as the configs' sizes: --per_chip=10**23 was an MLIR
  # TypeError traceback (a shape past int64).
  if args.per_chip is not None and not 1 <= args.per_chip < 2**31:
    raise SystemExit(f"--per_chip={args.per_chip}: sequences per chip, 1 "
                     f"to {2**31 - 1}.")
  if args.json is not None:  # written after minutes of compiling
    if (not args.json or args.json.endswith(os.sep)
        or os.path.isdir(args.json) or atomic_files.is_special(args.json)):
      raise SystemExit(f"--json={args.json!r}: name a file to write the "
                       "rows to.")
    try:
      cli.check_writable_ancestor(args.json, "--json")
    except ValueError as e:
      raise SystemExit(str(e)) from None
  args.names, args.efficiencies = names, efficiencies
  return args


def main(argv=None):
  args = parse_args(argv)
  print("dense compute at "
        + ", ".join(f"{e:.4f}" for e in args.efficiencies)
        + " x peak; MFU in MaxText's count of each published row")
  print(f"{'run':>8} {'eff':>6} {'chips':>5} {'fits':>4} {'GiB':>6} "
        f"{'step s':>7} {'MFU pub':>7} {'forecast':>8} {'error':>6} {'compute only':>12} "
        f"{'splash s':>8} "
        + (f"{'x' + format(args.splash_factor, 'g'):>6} {'error':>6} "
           if args.splash_factor is not None else "")
        + "compute / ICI / HBM / host s on the path")
  rows = []
  for name in args.names:
    run = RUNS[name]
    if args.per_chip is not None and args.per_chip != run["per_chip"]:
      print(f"{name}: compiled at {args.per_chip} sequences per chip, "
            f"published at {run['per_chip']}")
      run = dict(run, per_chip=args.per_chip)
    topology = parse_topology(run["topology"])
    config = config_for(run)
    plan.progress(f"compiling {name} ({topology.name}) ...")
    try:
      compiled = plan.compile_row(config, topology, 1, None,
                                  config.global_batch_size)
    except ValueError as e:  # a size no machine holds (--per_chip=2**30)
      raise SystemExit(f"forecast_llama.py: {name}: {e}") from None
    peak = topology.chip.peak_bf16_tflops * 1e12
    theirs = maxtext_flops_per_chip(run["per_chip"], run["seq"],
                                    run["causal"],
                                    run.get("model", LLAMA2_70B))
    for efficiency in args.efficiencies:
      row = plan.forecast_row(compiled, topology, efficiency)
      if row["step_seconds"] is None:
        print(f"{name:>8} compiler: {row['error']}")
        rows.append(dict(row, run=name, published_mfu=run["mfu"]))
        break
      causes = row["seconds_by_cause"]
      mfu = 100 * theirs / row["step_seconds"] / peak
      compute_alone = forecast_maxtext.compute_only(
          theirs, peak / 1e12, efficiency, row, run["mfu"])
      splash = splash_seconds(compiled, topology, efficiency)
      extra = dict(splash_seconds=splash)
      columns = f"{splash:>8.3f} " if splash is not None else f"{'-':>8} "
      if args.splash_factor is not None:
        # Assumed to land on the step's path whole: in these FSDP steps the
        # kernels are compute on the path, beside weight gathers only.
        scaled = (100 * theirs / peak / (
            row["step_seconds"] + (args.splash_factor - 1) * splash)
                  if splash is not None else float("nan"))
        extra.update(splash_factor=args.splash_factor,
                     splash_scaled_mfu=scaled)
        columns += f"{scaled:>6.2f} {scaled - run['mfu']:>+6.2f} "
      print(f"{name:>8} {efficiency:>6.4f} {row['chips']:>5} "
            f"{'yes' if row['fits'] else 'no':>4} "
            f"{plan.memory_text(row):>6} {row['step_seconds']:>7.3f} "
            f"{run['mfu']:>7.1f} {mfu:>8.2f} {mfu - run['mfu']:>+6.2f} "
            f"{compute_alone['compute_only_mfu']:>11.1f}% " + columns
            + " / ".join(
                f"{causes.get(k, 0.0):.2f}"
                for k in ("compute", "ici", "hbm", "host")))
      out = dict(row, run=name, published_mfu=run["mfu"],
                 per_chip=run["per_chip"], forecast_mfu=mfu,
                 error_points=mfu - run["mfu"], **compute_alone, **extra)
      for line in (plan.sum_over_chip_lines([row])
                   + plan.host_offload_lines([row])
                   + plan.unoverlapped_lines([row])
                   + forecast_maxtext.compute_only_lines([out], efficiency)):
        print(f"{name:>8} {line}")
      rows.append(out)
  if args.json:
    atomic_files.write_json_atomic(args.json, rows)


if __name__ == "__main__":
  main()
