"""benchmarks/gpu/kernel_report.py's parts that need no CUDA plugin: reading
`ptxas -v` and XLA's thunk sequence, and the occupancy arithmetic, checked
against the kernel details the H100's trace recorded (2026-11-27)."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")
sys.path.insert(0, KIT)
import kernel_report  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'trm_token_mixer_dx' for 'sm_90a'
ptxas info    : Function properties for trm_token_mixer_dx
    2844 bytes stack frame, 2844 bytes spill stores, 2320 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers
ptxas info    : Compiling entry function 'trm_token_mixer_forward' for 'sm_90a'
ptxas info    : Function properties for trm_token_mixer_forward
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 159 registers, used 1 barriers
ptxas info    : Compile time = 290.365 ms
"""

THUNKS = """\
001: kCustomKernel [source       | next=003 (2)] wrapped_transpose_1 grid: [16, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
003: kCustomKernel [prev=002 (1) | sink        ] trm_token_mixer_weight_grads grid: [32, 16, 1] threads: [128, 1, 1]  shared_memory: 61440 bytes
"""


def test_ptxas_registers_and_spills_per_function():
  assert kernel_report.parse_ptxas(PTXAS) == {
      "trm_token_mixer_dx": (255, 2844, 2320),
      "trm_token_mixer_forward": (159, 0, 0)}


def test_thunk_sequence_grid_threads_and_shared_memory():
  assert kernel_report.parse_thunks(THUNKS) == {
      "wrapped_transpose_1": (16, 128, 0),
      "trm_token_mixer_weight_grads": (512, 128, 61440)}


@pytest.mark.parametrize("registers, threads, shared, blocks, occupancy", [
    # The H100 trace's kernel details (run 1): regs, block, dynamic shared,
    # occ_pct.
    (255, 128, 81920, 2, 0.125),    # trm_token_mixer_forward
    (255, 128, 163840, 1, 0.0625),  # trm_token_mixer_dx
    (255, 128, 61440, 2, 0.125),    # trm_token_mixer_weight_grads
    (255, 256, 8192, 1, 0.125),     # GPT's fusion_2077 (regs:255, 256 threads)
    (64, 256, 8192, 4, 0.5),        # GPT's fusion_1993 (occ_pct:50)
    # Registers bound by their allocation granule, shared memory by the
    # SM's 228 KiB less 1 KiB per block.
    (159, 128, 57344, 3, 0.1875),
    (32, 128, 100 * 1024, 2, 0.125),
    (32, 128, 120 * 1024, 1, 0.0625),
])
def test_occupancy_follows_the_h100_limits(registers, threads, shared,
                                           blocks, occupancy):
  kernel = kernel_report.Kernel("k", registers, 0, 0, threads, shared, 1)
  assert kernel.blocks_per_sm() == blocks
  assert kernel.occupancy() == pytest.approx(occupancy)


def test_waves_count_the_grid_over_resident_blocks():
  kernel = kernel_report.Kernel("k", 255, 0, 0, 128, 163840, 3072)
  assert kernel.waves() == pytest.approx(3072 / 132)


def test_no_ptxas_is_one_line(monkeypatch):
  monkeypatch.setattr(sys, "path", ["/nonexistent"])
  monkeypatch.setattr(kernel_report.shutil, "which", lambda name: None)
  with pytest.raises(SystemExit, match="no ptxas"):
    kernel_report.find_ptxas()


PTX = """\
.visible .entry trm_token_mixer_forward(
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, 0, 1, 1, 1, 1;
	wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%r2}, {%r3}, %rd3, %p1, 1, 1, 1;
	wgmma.fence.sync.aligned;
	st.shared.v4.b32 [%r5], {%r6, %r7, %r8, %r9};
	st.shared.b16 [%r10], %rs1;
.visible .entry trm_token_mixer_weight_grads(
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1}, {%r1}, {%r2}, {%f2};
	wgmma.commit_group.sync.aligned;
"""


def test_instructions_are_counted_per_entry():
  """wgmma's fences and commits are not MMAs; each entry counts its own."""
  assert kernel_report.parse_instructions(PTX) == {
      "trm_token_mixer_forward": (2, 0, 2),
      "trm_token_mixer_weight_grads": (0, 1, 0)}


def test_gpt_settings_start_with_the_kernels_defaults():
  """`--gpt`'s and gptk's first setting per kernel is what the model runs."""
  import gpt_kernels  # pylint: disable=g-import-not-at-top
  for kernel, (module, *_) in gpt_kernels.functions(False).items():
    assert gpt_kernels.GPT_SETTINGS[kernel][0] == module.CONSTANTS


def test_kernels_are_found_when_xla_writes_ptx_only_for_named_emitters(
    tmp_path, monkeypatch):
  """XLA in JAX 0.11 writes a module's PTX only for the emitters that
  `xla_dump_emitter_re` names (0.10 always wrote it); without that option
  the report found no kernel at all."""
  ptxas = tmp_path / "ptxas"
  ptxas.write_text("#!/bin/sh\ncat >&2 <<'EOT'\n" + PTXAS + "EOT\n")
  ptxas.chmod(0o755)
  seen = []
  monkeypatch.setattr(kernel_report, "_PTX_DUMP", {})

  def compile_like_jax_0_11(options):
    seen.append(dict(options))
    dump = options["xla_dump_to"]
    with open(os.path.join(dump, "module_0001.jit_f.thunk_sequence.txt"),
              "w") as f:
      f.write(THUNKS.replace("trm_token_mixer_weight_grads",
                             "trm_token_mixer_forward"))
    if options.get("xla_dump_emitter_re"):
      with open(os.path.join(dump, "module_0001.jit_f.1.ptx"), "w") as f:
        f.write(".entry trm_token_mixer_forward(\n)\n{\n"
                "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16\n}\n")

  found = kernel_report.kernels_of(compile_like_jax_0_11, str(ptxas))
  assert [o.get("xla_dump_emitter_re") for o in seen] == [None, ".*"]
  assert [(k.name, k.registers, k.grid, k.wgmma) for k in found] == [
      ("trm_token_mixer_forward", 159, 512, 1)]
  # Later compiles ask for the PTX at once.
  seen.clear()
  assert len(kernel_report.kernels_of(compile_like_jax_0_11, str(ptxas))) == 1
  assert [o.get("xla_dump_emitter_re") for o in seen] == [".*"]
  # JAX 0.10 writes the PTX anyway: one compile, without the slow option.
  monkeypatch.setattr(kernel_report, "_PTX_DUMP", {})
  seen.clear()
  found = kernel_report.kernels_of(
      lambda o: compile_like_jax_0_11({**o, "xla_dump_emitter_re": "x"}),
      str(ptxas))
  assert len(seen) == 1 and len(found) == 1
  assert kernel_report._PTX_DUMP == {}  # pylint: disable=protected-access
