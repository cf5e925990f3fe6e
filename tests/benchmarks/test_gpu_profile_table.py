"""benchmarks/gpu/profile_table.py: a jax.profiler trace's GPU kernels per
step, by kind and joined to the program's instructions, on a hand-written
program and trace whose answers are known by hand."""
from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")
sys.path.insert(0, KIT)
import profile_table  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

_GEMM = ('"gemm_backend_config":{"dot_dimension_numbers":{'
         '"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":'
         '["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}')

# Two layers' identical adds (one kernel on the GPU, named after one of
# them), a Triton GEMM fusion, and a cuBLAS matmul whose result the second
# add reads as `%mm#0`.
HLO = """HloModule jit_step, is_scheduled=true, num_partitions=1

%fused_add (p0: f32[1024,1024], p1: f32[1024,1024]) -> f32[1024,1024] {
  %p0 = f32[1024,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  ROOT %a = f32[1024,1024]{1,0} add(%p0, %p1)
}

%fused_add.1 (p0.1: f32[1024,1024], p1.1: f32[1024,1024]) -> f32[1024,1024] {
  %p0.1 = f32[1024,1024]{1,0} parameter(0)
  %p1.1 = f32[1024,1024]{1,0} parameter(1)
  ROOT %a.1 = f32[1024,1024]{1,0} add(%p0.1, %p1.1)
}

%triton_dot (p0.2: bf16[1024,1024], p1.2: bf16[1024,1024]) -> f32[1024,1024] {
  %p0.2 = bf16[1024,1024]{1,0} parameter(0)
  %p1.2 = bf16[1024,1024]{1,0} parameter(1)
  ROOT %d = f32[1024,1024]{1,0} dot(%p0.2, %p1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (x: f32[1024,1024], w: bf16[1024,1024]) -> f32[1024,1024] {
  %x = f32[1024,1024]{1,0} parameter(0)
  %w = bf16[1024,1024]{1,0} parameter(1)
  %loop_add_fusion = f32[1024,1024]{1,0} fusion(%x, %x), kind=kLoop, calls=%fused_add, metadata={op_name="jit(step)/jvp(Net)/layers_0/mlp/add"}
  %gemm_fusion_dot.3 = f32[1024,1024]{1,0} fusion(%w, %w), kind=kCustom, calls=%triton_dot, metadata={op_name="jit(step)/Net/head/dot_general"}
  %mm = (f32[1024,1024]{1,0}, s8[4096]{0}) custom-call(%w, %w), custom_call_target="__cublas$lt$matmul", backend_config={GEMM}
  ROOT %loop_add_fusion.1 = f32[1024,1024]{1,0} fusion(%loop_add_fusion, %mm#0), kind=kLoop, calls=%fused_add.1, metadata={op_name="jit(step)/jvp(Net)/layers_1/mlp/add"}
}
""".replace("{GEMM}", "{" + _GEMM + "}")


def _trace(runs: int = 2) -> dict:
  """`runs` executions of jit_step: per run the add kernel twice (20 and
  40 us), a cuBLAS kernel (100 us), the Triton GEMM (30 us), a memset
  (1 us); and a kernel of another module."""
  events = [
      {"ph": "M", "name": "process_name", "pid": 1,
       "args": {"name": "/device:GPU:0"}},
      {"ph": "M", "name": "process_name", "pid": 2,
       "args": {"name": "/host:CPU"}},
  ]
  clock = 0
  for _ in range(runs):
    events.append({"ph": "X", "pid": 2, "tid": 1, "ts": clock, "dur": 500,
                   "name": "jit_step:XLA GPU module"})
    for name, duration in (("loop_add_fusion_1", 20), ("gemm_fusion_dot_3", 30),
                           ("nvjet_sm90_tst_128x128_64x4", 100),
                           ("loop_add_fusion_1", 40), ("Memset 0", 1)):
      events.append({"ph": "X", "pid": 1, "tid": 7, "ts": clock,
                     "dur": duration, "name": name,
                     "args": {"hlo_module": "jit_step",
                              "hlo_op": "command_buffer_1"}})
      clock += duration
  events.append({"ph": "X", "pid": 1, "tid": 7, "ts": clock, "dur": 5,
                 "name": "loop_divide_fusion",
                 "args": {"hlo_module": "jit_true_divide"}})
  return {"traceEvents": events}


def test_kernels_per_run_by_kind():
  result = profile_table.table(_trace())
  assert result["module"] == "jit_step" and result["runs"] == 2
  kinds = {r["kind"]: r["measured_ms"] for r in result["by_kind"]}
  assert kinds == pytest.approx({
      "XLA elementwise fusion": 0.060, "XLA Triton GEMM fusion": 0.030,
      "cuBLAS matmul": 0.100, "memset/memcpy": 0.001})
  assert result["measured_ms"] == pytest.approx(0.191)
  add = next(r for r in result["kernels"] if r["kernel"] == "loop_add_fusion_1")
  assert add["launches"] == 2


@pytest.mark.parametrize("kernel, kind", [
    ("trm_token_mixer_dx__1", "Pallas kernel (ours)"),
    ("trm_token_mixer_forward", "Pallas kernel (ours)"),
    ("gpt_add_layer_norm_grad", "Pallas kernel (ours)"),
    ("lm_head_cross_entropy", "Pallas kernel (ours)"),
    ("loop_multiply_fusion_18", "XLA elementwise fusion"),
    ("input_reduce_fusion_27", "XLA reduction fusion"),
    ("wrapped_concatenate", "XLA data movement (concatenate, slice, copy)")])
def test_our_pallas_kernels_are_a_kind_of_their_own(kernel, kind):
  """The project's pallas_calls (named trm_*) are not counted as XLA's
  elementwise fusions (2026-11-27: the Triton token mixer's 92.8 ms)."""
  assert profile_table.library_kind(kernel) is None
  assert profile_table.xla_kind(kernel) == kind


def test_every_pallas_kernel_in_the_project_is_counted_as_ours():
  """Each `name="..."` in a module of trm/ that calls pallas_call is a
  kernel name; a new kernel whose name the table does not know would be
  counted as an XLA fusion (GPT's three were, until session 43)."""
  import re  # pylint: disable=g-import-not-at-top
  names = set()
  for root, _, files in os.walk(os.path.join(ROOT, "trm")):
    for file in files:
      if not file.endswith(".py"):
        continue
      with open(os.path.join(root, file)) as f:
        text = f.read()
      if "pallas_call(" in text:
        names |= set(re.findall(r'\bname="([A-Za-z0-9_]+)"', text))
  assert {"trm_channel_swiglu", "gpt_add_layer_norm",
          "lm_head_cross_entropy"} <= names
  assert {n for n in names
          if profile_table.xla_kind(n) != "Pallas kernel (ours)"} == set()


def test_kernels_join_the_instructions_they_run():
  result = profile_table.table(_trace(), HLO, efficiency=0.5)
  rows = {r["label"]: r for r in result["groups"]}
  # Both layers' adds are one kernel: one row, measured against the
  # forecast of both (each reads 8 MiB, writes 4 MiB at 3.35 TB/s).
  add = rows["layers_*/mlp/add"]
  assert add["kind"] == "kLoop" and add["members"] == 2
  assert add["measured_ms"] == pytest.approx(0.060)
  assert add["forecast_ms"] == pytest.approx(2 * 1e3 * 3 * 2**22 / 3.35e12)
  assert add["launches"] == 2
  # The Triton GEMM is XLA's own kernel, not cuBLAS's: 2 x 1024^3 FLOPs at
  # half the H100's bf16 peak.
  gemm = rows["Net/head/dot_general"]
  assert gemm["kind"] == "kCustom"
  assert gemm["forecast_ms"] == pytest.approx(1e3 * 2 * 2**30 / (0.5 * 989e12))
  cublas = rows["cuBLAS matmul"]
  assert cublas["measured_ms"] == pytest.approx(0.100)
  assert cublas["forecast_ms"] == pytest.approx(1e3 * 2 * 2**30
                                                / (0.5 * 989e12))
  assert result["forecast_ms"] == pytest.approx(
      add["forecast_ms"] + gemm["forecast_ms"] + cublas["forecast_ms"])
  text = profile_table.format_table(result, 10)
  assert "layers_*/mlp/add" in text and "cuBLAS matmul" in text


def test_identical_fusions_share_a_key_and_different_ones_do_not():
  from trm.forecast import hlo  # pylint: disable=g-import-not-at-top
  module = hlo.parse_module(HLO)
  entry = module.entry_computation
  key = lambda name: profile_table.kernel_key(module, entry.by_name[name])  # noqa: E731
  assert key("loop_add_fusion") == key("loop_add_fusion.1")
  assert key("loop_add_fusion") != key("gemm_fusion_dot.3")


@pytest.mark.parametrize("label, expected", [
    ("GPT.hidden/h_10/ln_2/add_any", "GPT.hidden/h_*/ln_*/add_any"),
    ("L_level/layers_0/mlp_t/mul", "L_level/layers_*/mlp_t/mul"),
    ("eval_jaxpr/reduce_sum", "eval_jaxpr/reduce_sum"),
    ("attn/attn._qkv/split", "attn/attn._qkv/split"),
])
def test_layer_indices_become_stars(label, expected):
  assert profile_table.layerless(label) == expected


def test_the_command_reads_a_kit_archive_and_an_hlo_member(tmp_path):
  data = gzip.compress(json.dumps(_trace()).encode())
  archive = tmp_path / "trace_x.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    info = tarfile.TarInfo("trace_x/plugins/profile/1/vm.trace.json.gz")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
  hlo_text = HLO.encode()
  programs = tmp_path / "hlo_after_optimizations.tar.gz"
  with tarfile.open(programs, "w:gz") as tar:
    info = tarfile.TarInfo("module_1.jit_step.after_optimizations.txt")
    info.size = len(hlo_text)
    tar.addfile(info, io.BytesIO(hlo_text))
  out = tmp_path / "table.json"
  proc = subprocess.run(
      [sys.executable, os.path.join(KIT, "profile_table.py"), str(archive),
       f"--hlo={programs}:module_1.jit_step.after_optimizations.txt",
       f"--json={out}"], cwd=ROOT, capture_output=True, text=True,
      check=False, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "module jit_step: 2 run(s)" in proc.stdout
  assert json.loads(out.read_text())["groups"]

  bad = subprocess.run(
      [sys.executable, os.path.join(KIT, "profile_table.py"), str(archive),
       "--module=jit_nothing"], cwd=ROOT, capture_output=True, text=True,
      check=False, timeout=120)
  assert bad.returncode != 0
  assert "no GPU kernels of module 'jit_nothing'" in bad.stderr
  assert "jit_step" in bad.stderr

  missing = subprocess.run(
      [sys.executable, os.path.join(KIT, "profile_table.py"), str(archive),
       f"--hlo={programs}:module_9.txt"], cwd=ROOT, capture_output=True,
      text=True, check=False, timeout=120)
  assert missing.returncode != 0 and "Traceback" not in missing.stderr
  assert "has no file 'module_9.txt'" in missing.stderr
  assert "module_1.jit_step.after_optimizations.txt" in missing.stderr


@pytest.mark.parametrize("content", [b"not gzip at all", b"[1, 2]"])
def test_a_bad_trace_is_one_line(tmp_path, content):
  path = tmp_path / "x.trace.json.gz"
  path.write_bytes(content if content.startswith(b"not") else
                   gzip.compress(content))
  proc = subprocess.run(
      [sys.executable, os.path.join(KIT, "profile_table.py"), str(path)],
      cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert str(path) in proc.stderr


def test_torch_side_of_a_kit_archive(tmp_path):
  # The kit profiles torch's side of the same steps into the same archive:
  # 2 steps, each a cuBLAS kernel, a flash-attention kernel, an Inductor
  # kernel and an ATen one.
  events = []
  for _ in range(2):
    for name, duration in (("nvjet_sm90_tst_192x192", 100),
                           ("pytorch_flash::flash_fwd_kernel", 50),
                           ("triton_per_fused_native_layer_norm_0", 30),
                           ("void at::native::vectorized_elementwise_kernel",
                            10)):
      events.append({"ph": "X", "cat": "kernel", "name": name,
                     "dur": duration, "pid": 0, "tid": 7, "ts": 0})
  events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 999,
                 "pid": 1, "tid": 1, "ts": 0})
  archive = tmp_path / "trace_gpt_cudnn.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    for name, data in (
        ("trace_gpt_cudnn/torch/torch.trace.json.gz",
         gzip.compress(json.dumps({"traceEvents": events}).encode())),
        ("trace_gpt_cudnn/torch/meta.json", json.dumps({"runs": 2}).encode()),
        ("trace_gpt_cudnn/plugins/profile/1/vm.trace.json.gz",
         gzip.compress(json.dumps(_trace()).encode()))):
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  trace = profile_table.read_trace(str(archive), "torch")
  result = profile_table.torch_table(trace)
  assert result["runs"] == 2
  assert {r["kind"]: r["measured_ms"] for r in result["by_kind"]} == (
      pytest.approx({"cuBLAS matmul": 0.1, "flash attention": 0.05,
                     "Inductor (Triton) fusion": 0.03,
                     "torch's own kernels (ATen)": 0.01}))
  # Ours' trace in the same archive is still read by default.
  assert profile_table.table(profile_table.read_trace(str(archive)))[
      "module"] == "jit_step"
  proc = subprocess.run(
      [sys.executable, os.path.join(KIT, "profile_table.py"), str(archive),
       "--side=torch"], cwd=ROOT, capture_output=True, text=True,
      check=False, timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert "module torch: 2 run(s)" in proc.stdout
