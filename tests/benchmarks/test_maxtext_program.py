"""benchmarks/forecast/maxtext_program.py: MaxText's commands carry our
variants' shapes, and a dumped program is read, played and charged
MaxText's FLOP count."""
import os
import re

import pytest
import repo

from trm.core import config_lib
from trm.core import topology
from trm.core import tpu_flags
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


@pytest.mark.parametrize("name", [
    "22b", "52b", "v5e16b", "v5e32b", "v5e64b", "v5e128b", "v5p32b",
    "v5p64b", "v5p128b", "v5p128b_512", "v5p256b", "v5p512b", "v5p1024b",
    "v5p1024b_4096"])
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
  batch = run.get("batch_per_slice") or config.global_batch_size
  assert int(_flag(command, "per_device_batch_size")) == batch // chips
  assert _flag(command, "remat_policy") == config.model.remat_policy
  tensor = re.findall(r"ici_tensor_parallelism=(\d+)", command)
  assert int(tensor[0] if tensor else 1) == config.mesh.model
  assert _flag(command, "compile_topology") == run["topology"]
  assert _flag(command, "dump_hlo_local_dir") == f"/d/{name}"
  # MaxText's flags for the run are the ones our variant compiles with,
  # less the one our framework adds (each compiles with its own).
  ours = tpu_flags.COLLECTIVE_MATMUL_USERS
  variant_flags = config.tpu_compiler_options.split()
  assert variant_flags[-1] == ours
  assert f'LIBTPU_INIT_ARGS="{" ".join(variant_flags[:-1])}"' in command
  assert ours.split("=")[0] not in command
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
  assert row["maxtext_unoverlapped_seconds"] == 0.0 and "NOTE" not in out


def test_a_compiled_program_whose_sum_is_over_the_chip_is_starred(
    script, tmp_path, capsys, monkeypatch):
  def table(runs, **temp_gib):
    """The table of `runs`, each of temp_gib's with that many GiB of
    temporaries (3 GiB of arguments, outputs and aliases as _LOG's)."""
    for name, gib in temp_gib.items():
      _write_run(tmp_path / name,
                 _LOG.replace("temp_size_in_bytes=12884901888",
                              f"temp_size_in_bytes={gib * 2**30}"))
    monkeypatch.setattr("sys.argv", [SCRIPT, f"--dumps={tmp_path}",
                                     f"--run={runs}"])
    script.main()
    return capsys.readouterr().out

  # 3 + 3 + 14 - 3 = 17 GiB, over v5e's 15.75: train_compile.py printed
  # the line, so XLA:TPU compiled it for the chip.
  out = table("v5e32b", v5e32b=14)
  assert " 17.00* " in out
  assert "over the chip's 15.75 GiB" in out
  # Two chips in one table: the line names both.
  out = table("v5e32b,v5p32b", v5p32b=100)
  assert " 17.00* " in out and " 103.00* " in out
  assert "over the chip's 15.75 or 95.74 GiB" in out


def test_a_missing_dump_names_the_folder_and_the_way_to_make_it(
    script, tmp_path, monkeypatch):
  (tmp_path / "v5e32b").mkdir()
  monkeypatch.setattr("sys.argv", [SCRIPT, f"--dumps={tmp_path}",
                                   "--run=v5e32b"])
  with pytest.raises(SystemExit, match=r"v5e32b: no .*--print_commands"):
    script.main()


def test_a_step_xla_refused_is_a_row_that_says_so(script, tmp_path, capsys,
                                                  monkeypatch):
  # XLA:TPU refused the step for the chip after it dumped the program.
  _write_run(tmp_path / "v5p64b", "")
  (tmp_path / "v5p64b" / "train_compile.log").write_text(
      "Traceback ...\njax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran "
      "out of memory on HBM, the total memory required for HLO temporaries "
      "(97.01G) exceeds available HBM (95.74G).\n")
  _write_run(tmp_path / "v5p32b", _LOG)
  out = tmp_path / "rows.json"
  monkeypatch.setattr("sys.argv", [SCRIPT, f"--dumps={tmp_path}",
                                   "--run=v5p64b,v5p32b", f"--json={out}"])
  script.main()
  text = capsys.readouterr().out
  assert "v5p64b" in text and "refused by XLA:TPU (97.01 GiB a chip" in text
  rows = __import__("json").loads(out.read_text())["runs"]
  assert rows[0]["run"] == "v5p64b" and "(97.01G) exceeds" in rows[0][
      "maxtext_refused"]
  assert rows[1]["run"] == "v5p32b" and rows[1]["maxtext_program_mfu"] > 0
  # A log that also has the line train_compile.py prints once XLA compiled
  # the step (an earlier attempt's message above it) is a compiled run.
  assert script.refusal(str(tmp_path / "v5p64b")) is not None
  (tmp_path / "v5p64b" / "train_compile.log").write_text(
      (tmp_path / "v5p64b" / "train_compile.log").read_text() + _LOG)
  assert script.refusal(str(tmp_path / "v5p64b")) is None


def test_every_group_of_runs_has_its_commands(script, capsys, monkeypatch):
  # --run=all is the default: every run forecast_maxtext.py groups.
  monkeypatch.setattr("sys.argv", [SCRIPT, "--print_commands"])
  script.main()
  out = capsys.readouterr().out
  assert out.count("train_compile ") == len(script.forecast_maxtext.GROUPS[
      "all"])
  assert "run_name=v5p64b " in out and "remat_policy=minimal " in out


def test_an_unknown_run_is_refused(script, monkeypatch, capsys):
  monkeypatch.setattr("sys.argv", [SCRIPT, "--run=v5e7b",
                                   "--print_commands"])
  with pytest.raises(SystemExit):
    script.main()
  assert "'v5e7b' is none of" in capsys.readouterr().err
