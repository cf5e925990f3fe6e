"""benchmarks/gpu/offline.py's parts that run without XLA:GPU's compiler:
the GPU descriptions, reading the kit's measured figures, the flags, and
the one-line refusal where the CUDA plugin is absent. The compiles
themselves need the plugin (BUILD_NOTES "On a GPU" has their output)."""
from __future__ import annotations

import importlib
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")
RUNS = os.path.join(KIT, "results", "2026-11-26-h100")


@pytest.fixture(scope="module")
def offline():
  sys.path.insert(0, KIT)
  try:
    yield importlib.import_module("offline")
  finally:
    sys.path.remove(KIT)


@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_target_configs_describe_the_gpu(offline, gpu):
  text = offline.target_config(gpu)
  spec = offline.GPUS[gpu]
  assert f'device_description_str: "{spec["name"]}"' in text
  assert f"device_memory_size: {spec['memory']}" in text
  assert f"memory_bandwidth: {spec['bandwidth']:.0f}" in text
  assert "major: 9" in text and text.count("{") == text.count("}")


def test_measured_figures_are_read_per_program_batch_and_attention(offline):
  runs = [os.path.join(RUNS, f"run{i}-figures.jsonl") for i in (1, 2)]
  measured = offline.measured_seconds(runs, "NVIDIA H100 80GB HBM3")
  rows = {}
  for path in runs:
    with open(path) as f:
      for line in f:
        row = json.loads(line)
        rows[(row["name"], row.get("batch"), row["side"])] = row
  gpt = rows[("gpt/attention_dot/iteration/ms", 12, "ours")]["value"]
  assert measured[("gpt/attention_dot/iteration/ms", 12, "dot")] == (
      pytest.approx(gpt / 1e3))
  rate = rows[("dream/b16/exact/new_tokens_per_s", 16, "ours")]["value"]
  assert measured[("dream/b16/exact/new_tokens_per_s", 16, "dot")] == (
      pytest.approx(16 * 512 / rate))
  both = {k for k in measured if k[0] == "trm/mlp_t_sudoku/train_step/ms"}
  assert {k[1] for k in both} == {384, 768}
  # Other GPUs' figures and torch's are not ours on this one.
  assert not offline.measured_seconds(runs, "NVIDIA H200")
  assert all(k[2] in ("dot", "cudnn") for k in measured)


@pytest.mark.parametrize("argv, needle", [
    (["--only=trm,tpu"], "choose from trm, gpt, dream"),
    (["--efficiency=0"], "must be in (0, 1]"),
    (["--measured=/nonexistent.jsonl"], "no such file"),
    (["--gpu=a100"], "invalid choice"),
])
def test_bad_flags_are_refused_naming_the_flag(offline, capsys, argv,
                                               needle):
  with pytest.raises(SystemExit):
    offline.parse_args(["--out=/tmp/x"] + argv)
  assert needle in capsys.readouterr().err


def test_without_the_cuda_plugin_it_says_what_to_install(offline):
  try:
    importlib.import_module("jax_plugins.xla_cuda13")
  except ImportError:
    pass
  else:
    pytest.skip("JAX's CUDA plugin is installed here")
  with pytest.raises(SystemExit, match="Install JAX's CUDA plugin"):
    offline.gpu_devices("h100")


_PROGRAM = """HloModule gpu, is_scheduled=true

ENTRY %main (a: bf16[4096,512], b: bf16[512,1024]) -> bf16[4096,1024] {
  %a = bf16[4096,512]{1,0} parameter(0)
  %b = bf16[512,1024]{1,0} parameter(1)
  %mm = (bf16[4096,1024]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/mlp/c_fc/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %r = bf16[4096,1024]{1,0} get-tuple-element(%mm), index=0
}
"""


def test_replay_forecasts_a_saved_program_without_the_plugin(offline, tmp_path,
                                                             capsys):
  saved = tmp_path / "step.hlo"
  saved.write_text(_PROGRAM)
  out = tmp_path / "out"
  environment = dict(os.environ)
  offline.main([f"--out={out}", f"--replay={saved}", "--efficiency=0.5"])
  assert dict(os.environ) == environment  # nothing set for a replay
  (row,) = [json.loads(line) for line in
            (out / "figures.jsonl").read_text().splitlines()]
  flops = 2.0 * 4096 * 1024 * 512
  moved = 2 * (4096 * 512 + 512 * 1024 + 4096 * 1024)
  spec = offline.GPUS["h100"]
  want = max(flops / (0.5 * spec["peak_bf16"]), moved / spec["bandwidth"])
  assert row["name"] == "step.hlo"
  assert row["forecast_ms"] == pytest.approx(1e3 * want)
  assert row["hot_spots"][0]["op"] == "mlp/c_fc/dot_general"
  assert "step.hlo" in capsys.readouterr().out


def test_report_sets_a_compiled_program_beside_its_measured_time(offline,
                                                                 tmp_path):
  # Any compiled executable has what report reads (memory, text); a CPU one
  # stands in for XLA:GPU's, so the row's arithmetic runs without the plugin.
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
  executable = jax.jit(lambda a: a @ a).lower(x).compile()
  compiled = offline.Compiled(name="toy/step", executable=executable,
                              model_flops=2.0 * 256**3, measured="toy_ms",
                              batch=4, attention="dot")
  row = offline.report(compiled, "h100", 0.5, {("toy_ms", 4, "dot"): 2e-3},
                       str(tmp_path), top=3)
  assert row["measured_ms"] == pytest.approx(2.0)
  assert row["forecast_over_measured"] == pytest.approx(
      row["forecast_ms"] / 2.0)
  assert row["forecast_mfu"] == pytest.approx(
      2.0 * 256**3 / (row["forecast_ms"] / 1e3)
      / offline.GPUS["h100"]["peak_bf16"])
  assert (tmp_path / "toy_step.hlo.gz").exists()
  assert "forecast/measured" in offline.format_row(row)
  no_measure = offline.report(compiled, "h100", 0.5, {}, str(tmp_path), top=3)
  assert "measured_ms" not in no_measure


def test_the_programs_include_both_dream_samplers(offline):
  # --match picks programs by name, e.g. the dual-cache sampler at batch 1.
  names = [name for name, _ in offline.programs(None, {"dream"})]
  assert [n for n in names if "b1/dual" in n] == ["dream/b1/dual/cudnn"]
  assert "dream/b16/dual/cudnn" in names and "dream/b1/cudnn" in names
  assert offline.parse_args(["--out=x", "--match=dual"]).match == "dual"


def test_mixer_setting_sets_the_kernels_constants_for_the_compile(offline):
  """--mixer_setting names the sweep's settings; mlp_gpu's constants hold
  them while the programs compile and are restored after; a name the sweep
  does not have is refused with the list."""
  from trm.families.trm import mlp_gpu  # pylint: disable=g-import-not-at-top
  before = dict(mlp_gpu._FORWARD), dict(mlp_gpu._DX)  # pylint: disable=protected-access
  with offline.mixer_constants("forward=epi_t128_w8,dx=cols_t64_c32"):
    assert mlp_gpu._FORWARD["layout"] == "epilogue"  # pylint: disable=protected-access
    assert mlp_gpu._DX["layout"] == "columns"  # pylint: disable=protected-access
    assert mlp_gpu._DX["chunk"] == 32  # pylint: disable=protected-access
  assert (mlp_gpu._FORWARD, mlp_gpu._DX) == before  # pylint: disable=protected-access
  with offline.mixer_constants(""):
    assert mlp_gpu._FORWARD == before[0]  # pylint: disable=protected-access
  # The channel MLP's constant lives in channel_gpu.
  from trm.families.trm import channel_gpu  # pylint: disable=g-import-not-at-top
  assert not channel_gpu.use_kernel()
  with offline.mixer_constants("dx=epi_t128_w8,channel=epi_r64_w4"):
    assert channel_gpu.use_kernel() and channel_gpu._CHANNEL["rows"] == 64  # pylint: disable=protected-access
    assert mlp_gpu._DX["layout"] == "epilogue"  # pylint: disable=protected-access
  assert not channel_gpu.use_kernel()
  for bad in ("forward=nope", "backward=default", "forward"):
    with pytest.raises(SystemExit, match="not one of the sweep's settings"):
      offline.mixer_constants(bad)


def test_a_wrong_mixer_setting_fails_before_anything_is_written(offline,
                                                                tmp_path):
  """Checked before the CUDA plugin loads or the figures file is opened."""
  out = tmp_path / "out"
  with pytest.raises(SystemExit, match="not one of the sweep's settings"):
    offline.main([f"--out={out}", "--only=trm", "--mixer_setting=dx=nope"])
  assert not out.exists()


# One Pallas Triton kernel call: [4096, 512] x [512, 1024] as the kernel
# "trm_gemm" (its op_name), bf16, beside nothing else.
_TRITON_PROGRAM = """HloModule step, entry_computation_layout={(bf16[4096,512]{1,0}, bf16[512,1024]{1,0})->bf16[4096,1024]{1,0}}

ENTRY %main (a: bf16[4096,512], b: bf16[512,1024]) -> bf16[4096,1024] {
  %a = bf16[4096,512]{1,0} parameter(0)
  %b = bf16[512,1024]{1,0} parameter(1)
  ROOT %pallas_call = bf16[4096,1024]{1,0} custom-call(%a, %b), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/mlp/trm_gemm/pallas_call"}, backend_config={grid_x = 64 : i32}
}
"""


def test_pallas_kernels_are_charged_the_flops_they_declared(offline):
  """Pallas's Triton lowering drops a kernel's cost estimate; the compile
  records it (declared_kernel_flops) and the forecast charges it, keyed by
  the kernel's name and result shape. Without it only bytes count."""
  flops = 2.0 * 4096 * 512 * 1024
  moved = 2 * (4096 * 512 + 512 * 1024 + 4096 * 1024)
  spec = offline.GPUS["h100"]
  bytes_only = offline.forecast("s", _TRITON_PROGRAM, "h100", 0.5, 3)
  assert bytes_only["forecast_ms"] == pytest.approx(
      1e3 * moved / spec["bandwidth"])
  assert bytes_only["triton_kernels_without_flops"] == 1
  assert "lower bound" in offline.format_row(bytes_only)
  table = {("trm_gemm", ((4096, 1024),)): flops}
  charged = offline.forecast("s", _TRITON_PROGRAM, "h100", 0.5, 3, table)
  assert charged["forecast_ms"] == pytest.approx(
      1e3 * max(flops / (0.5 * spec["peak_bf16"]), moved / spec["bandwidth"]))
  assert charged["triton_kernels"] == 1
  assert charged["triton_kernels_without_flops"] == 0
  assert "lower bound" not in offline.format_row(charged)
  # Traced by autodiff, the op_name wraps the kernel's name.
  wrapped = _TRITON_PROGRAM.replace("mlp/trm_gemm/pallas_call",
                                    "transpose(jvp(trm_gemm))/pallas_call")
  assert offline.forecast("s", wrapped, "h100", 0.5, 3, table)[
      "forecast_ms"] == pytest.approx(charged["forecast_ms"])
  # Another result shape under the same name is not this kernel.
  other = {("trm_gemm", ((4096, 512),)): flops}
  assert offline.forecast("s", _TRITON_PROGRAM, "h100", 0.5, 3, other)[
      "forecast_ms"] == pytest.approx(bytes_only["forecast_ms"])


def test_the_compile_records_each_kernels_declared_flops(offline,
                                                         monkeypatch):
  """declared_kernel_flops wraps the Triton lowering for as long as it is
  open: each call's cost estimate goes into the table under its name and
  result shapes, and the lowering itself still runs."""
  import types  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.triton import pallas_call_registration as triton  # pylint: disable=g-import-not-at-top
  lowered = []
  fake = lambda ctx, *args, **params: lowered.append(params["name"]) or "ir"  # noqa: E731
  monkeypatch.setattr(triton, "pallas_call_lowering", fake)
  ctx = types.SimpleNamespace(avals_out=[
      jax.core.ShapedArray((8, 4), jax.numpy.float32)])
  from jax._src.pallas import core as pallas_core  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.triton import core as triton_core  # pylint: disable=g-import-not-at-top
  rules = pallas_core._backend_lowering_rules  # pylint: disable=protected-access
  registered = rules[triton_core.CompilerParams]
  with offline.declared_kernel_flops() as table:
    # Calls with Triton compiler params take their rule from the registry.
    assert rules[triton_core.CompilerParams][0] is triton.pallas_call_lowering
    assert triton.pallas_call_lowering(
        ctx, cost_estimate=pl.CostEstimate(flops=640, transcendentals=0,
                                           bytes_accessed=0),
        name="trm_k") == "ir"
    triton.pallas_call_lowering(ctx, cost_estimate=None, name="no_cost")
  assert table == {("trm_k", ((8, 4),)): 640}
  assert lowered == ["trm_k", "no_cost"]
  assert triton.pallas_call_lowering is fake
  assert rules[triton_core.CompilerParams] is registered
