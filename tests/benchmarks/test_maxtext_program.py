"""benchmarks/forecast/maxtext_program.py: MaxText's commands carry our
variants' shapes, and a dumped program is read, played and charged
MaxText's FLOP count."""
import os
import re

import pytest
import repo

from trm.core import config_lib
from trm.core import topology
from trm.families.gpt.config import GPTConfig

SCRIPT = os.path.join(repo.ROOT, "benchmarks", "forecast",
                      "maxtext_program.py")
pytestmark = pytest.mark.usefixtures("no_compilation_cache")


@pytest.fixture(scope="module")
def script():
  return repo.load_script("benchmarks", "forecast", "maxtext_program.py")


def _flag(command, name):
  found = re.findall(rf"(?<![\w_]){name}=(\S+)", command)
  assert len(found) == 1, (name, command)
  return found[0]


@pytest.mark.parametrize("name", ["22b", "52b", "v5e16b", "v5e32b",
                                  "v5e64b", "v5e128b"])
def test_each_command_compiles_the_model_our_variant_has(script, name):
  run = script.forecast_maxtext.RUNS[name]
  config = config_lib.load_config(os.path.join(repo.ROOT, "configs",
                                               "gpt.py"), run["variant"])
  cfg = GPTConfig.from_config(config.model)
  chips = topology.parse_topology(run["topology"]).chips
  command = script.command(name, "/d")
  assert int(_flag(command, "base_num_decoder_layers")) == cfg.n_layer
  assert int(_flag(command, "base_emb_dim")) == cfg.n_embd
  assert int(_flag(command, "base_num_query_heads")) == cfg.n_head
  assert int(_flag(command, "head_dim")) == cfg.head_dim
  assert int(_flag(command, "base_mlp_dim")) == cfg.mlp_width
  assert int(_flag(command, "max_target_length")) == cfg.block_size
  assert int(_flag(command, "vocab_size")) == cfg.vocab_size
  assert (int(_flag(command, "per_device_batch_size"))
          == config.global_batch_size // chips)
  assert _flag(command, "compile_topology") == run["topology"]
  assert _flag(command, "dump_hlo_local_dir") == f"/d/{name}"
  # MaxText's flags for the run are the ones our variant compiles with.
  assert f'LIBTPU_INIT_ARGS="{config.tpu_compiler_options}"' in command
  attention = _flag(command, "attention")
  assert attention == ("flash" if cfg.attention == "splash"
                       else "dot_product")


# One bf16 [4096, 4096] x [4096, 4096] matmul: 2 * 4096^3 FLOPs.
_PROGRAM = """HloModule jit_train_step, is_scheduled=true, num_partitions=256

%fused_dot (p0: bf16[4096,4096], p1: bf16[4096,4096]) -> f32[4096,4096] {
  %p0 = bf16[4096,4096]{1,0} parameter(0)
  %p1 = bf16[4096,4096]{1,0} parameter(1)
  ROOT %d = f32[4096,4096]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[4096,4096]) -> f32[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  ROOT %f = f32[4096,4096]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot
}
"""
_LOG = ("Jitting and compilation complete!\nMemory analysis: "
        "CompiledMemoryStats(generated_code_size_in_bytes=1, "
        "argument_size_in_bytes=3221225472, output_size_in_bytes=3221225472,"
        " alias_size_in_bytes=3221225472, temp_size_in_bytes=12884901888, "
        "host_temp_size_in_bytes=0)\n")


def _write_run(folder, log: str):
  """One run's folder as train_compile.py leaves it: the dumped programs
  (only the optimized one is read) and the command's output."""
  folder.mkdir()
  (folder / "module_0001.jit_train_step.cl_1.after_optimizations.txt"
   ).write_text(_PROGRAM)
  (folder / "module_0001.jit_train_step.cl_1.after_codegen.txt"
   ).write_text("not read")
  (folder / "train_compile.log").write_text(log)


def test_a_dumped_program_is_played_and_charged_maxtexts_count(
    script, tmp_path, capsys, monkeypatch):
  _write_run(tmp_path / "v5e16b", _LOG)
  out = tmp_path / "rows.json"
  monkeypatch.setattr("sys.argv", [
      SCRIPT, f"--dumps={tmp_path}", "--run=v5e16b", "--efficiency=0.5",
      f"--json={out}"])
  script.main()
  row = __import__("json").loads(out.read_text())["runs"][0]
  chip = topology.CHIPS["v5e"]
  dot_seconds = 2 * 4096**3 / (chip.peak_bf16_tflops * 1e12 * 0.5)
  assert row["maxtext_step_seconds"] == pytest.approx(dot_seconds, rel=1e-6)
  config = config_lib.load_config(os.path.join(repo.ROOT, "configs",
                                               "gpt.py"), "maxtext16b")
  theirs = script.forecast_maxtext.maxtext_flops_per_chip(
      config, config.global_batch_size / 256, True)
  assert row["maxtext_program_mfu"] == pytest.approx(
      100 * theirs / dot_seconds / (chip.peak_bf16_tflops * 1e12))
  assert row["published_mfu"] == 61.10
  assert row["error_points"] == pytest.approx(
      row["maxtext_program_mfu"] - 61.10)
  assert row["maxtext_memory_gib"] == pytest.approx(15.0)  # 3 + 3 + 12 - 3
  out = capsys.readouterr().out
  assert "v5e16b" in out and " 15.00 " in out  # under the chip: no star
  assert "over the chip" not in out


def test_a_compiled_program_whose_sum_is_over_the_chip_is_starred(
    script, tmp_path, capsys, monkeypatch):
  # 3 + 3 + 14 - 3 = 17 GiB, over v5e's 15.75: train_compile.py printed
  # the line, so XLA:TPU compiled it for the chip.
  _write_run(tmp_path / "v5e32b",
             _LOG.replace("temp_size_in_bytes=12884901888",
                          f"temp_size_in_bytes={14 * 2**30}"))
  monkeypatch.setattr("sys.argv", [SCRIPT, f"--dumps={tmp_path}",
                                   "--run=v5e32b"])
  script.main()
  out = capsys.readouterr().out
  assert " 17.00* " in out
  assert "over the chip's 15.75 GiB" in out


def test_a_missing_dump_names_the_folder_and_the_way_to_make_it(
    script, tmp_path, monkeypatch):
  (tmp_path / "v5e32b").mkdir()
  monkeypatch.setattr("sys.argv", [SCRIPT, f"--dumps={tmp_path}",
                                   "--run=v5e32b"])
  with pytest.raises(SystemExit, match=r"v5e32b: no .*--print_commands"):
    script.main()


def test_an_unknown_run_is_refused(script, monkeypatch, capsys):
  monkeypatch.setattr("sys.argv", [SCRIPT, "--run=v5e7b",
                                   "--print_commands"])
  with pytest.raises(SystemExit):
    script.main()
  assert "'v5e7b' is none of" in capsys.readouterr().err
