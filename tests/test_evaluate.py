"""trm.evaluate: a native workdir and the same weights exported as an
upstream PyTorch checkpoint evaluate to the trainer's own final figures."""
import json
import os
import subprocess
import sys

import jax
import pytest

from trm import evaluate
from trm.core import train
from trm import families
from trm.families.trm import program as trm_program
from trm.families.trm import torch_import
from trm.data.puzzles import format as puzzle_format

from test_train import ROOT, tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("sudoku"))
  config = tiny_config(**{"data.data_dir": os.path.join(workdir, "data")})
  state, results = train.train_and_evaluate(config, workdir, families.build_task)
  return config, workdir, state, results


def test_workdir_evaluates_to_the_trainers_figures(trained, tmp_path):
  config, workdir, _, results = trained
  ours, source = evaluate.evaluate_checkpoint(config, workdir,
                                              str(tmp_path / "eval"))
  assert source.endswith("step 12")
  for key in ("accuracy", "exact_accuracy", "lm_loss"):
    assert ours[key] == pytest.approx(results[f"eval/{key}"], rel=1e-6)
  assert (tmp_path / "eval" / "sheet.png").is_file()
  with open(tmp_path / "eval" / "eval.json") as f:
    assert json.load(f)["exact_accuracy"] == ours["exact_accuracy"]


def test_upstream_pytorch_checkpoint_evaluates_the_same(trained, tmp_path):
  config, workdir, state, results = trained
  metadata = puzzle_format.read_metadata(config.data.data_dir, "train")
  model = trm_program.make_model(config.model, metadata)
  path = str(tmp_path / "step_12")
  torch_import.export_torch_checkpoint(
      jax.device_get(state.ema_params), jax.device_get(state.buffers),
      jax.device_get(state.puzzle_emb), model.cfg, path)
  ours, source = evaluate.evaluate_checkpoint(config, path,
                                              str(tmp_path / "eval"))
  assert "upstream PyTorch" in source
  assert ours["exact_accuracy"] == pytest.approx(
      results["eval/exact_accuracy"], rel=1e-6)
  assert ours["lm_loss"] == pytest.approx(results["eval/lm_loss"], rel=1e-5)


def test_cli_prints_the_paper_metric(trained, tmp_path):
  config, workdir, _, _ = trained
  result = subprocess.run(
      [sys.executable, "-m", "trm.evaluate",
       "--config=configs/trm_sudoku.py:cpu", f"--checkpoint={workdir}",
       f"--output_dir={tmp_path}", "--config.model.hidden_size=32",
       "--config.model.num_heads=2", "--config.model.puzzle_emb_ndim=32",
       "--config.model.halt_max_steps=2",
       f"--config.data.data_dir={config.data.data_dir}",
       # The dataset's build arguments: other ones are refused (issue 25).
       "--config.data.build.num_train=256", "--config.data.build.num_test=32",
       "--config.data.build.num_blanks=30",
       "--config.data.eval_batch_size=16", "--config.mesh.data=2",
       "--config.mesh.fsdp=2", "--config.mesh.model=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "paper metric exact_accuracy:" in result.stdout


def test_missing_checkpoint_is_a_clear_error(trained, tmp_path):
  config, _, _, _ = trained
  with pytest.raises(FileNotFoundError, match="neither a trm.main workdir"):
    evaluate.evaluate_checkpoint(config, str(tmp_path / "nope"),
                                 str(tmp_path / "eval"))


def test_missing_config_or_checkpoint_is_one_line():
  """Required unless --score_only rescores a samples file (no model)."""
  result = subprocess.run(
      [sys.executable, "-m", "trm.evaluate",
       "--config=configs/trm_sudoku.py:cpu"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [
      "trm.evaluate: error: --config and --checkpoint are required (or "
      "--benchmark / --score_only for code benchmarks)."]
