"""trm.export's --out next to the run it exports: --overwrite swaps --out in
as a whole, so an --out that is, holds or lies in the run's checkpoints
would delete them (it did: the workdir became the export)."""
import os
import subprocess
import sys

import pytest
from absl import app

import repo
from trm import export


def _workdir(tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "3").mkdir(parents=True)
  (workdir / "checkpoints" / "3" / "state").write_text("weights")
  os.symlink(workdir, tmp_path / "link")
  return workdir


@pytest.mark.parametrize("out", ["run", "", "link", "run/checkpoints",
                                 "run/checkpoints/hf", "run/checkpoints/3"])
def test_out_over_the_checkpoints_is_refused(tmp_path, out):
  workdir = _workdir(tmp_path)
  with pytest.raises(app.UsageError, match="--checkpoint="):
    export.check_out_dir(str(tmp_path / out), None, True, str(workdir))


def test_out_beside_or_inside_the_run_is_allowed(tmp_path):
  workdir = _workdir(tmp_path)
  for out in (tmp_path / "hf", workdir / "hf", tmp_path / "run2"):
    export.check_out_dir(str(out), None, True, str(workdir))


def _export_error(workdir, *flags) -> str:
  """The one error line of a trm.export run that must stop before it
  reads the (fake) checkpoint."""
  result = subprocess.run(
      [sys.executable, "-m", "trm.export",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       *flags],
      cwd=repo.ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr[-3000:]
  return errors[0]


def test_cli_keeps_the_workdir_it_was_asked_to_overwrite(tmp_path):
  workdir = _workdir(tmp_path)
  error = _export_error(workdir, f"--out={workdir}", "--overwrite")
  assert "contains --checkpoint=" in error
  assert (workdir / "checkpoints" / "3" / "state").read_text() == "weights"


def test_cli_checks_the_tokenizer_before_the_weights(tmp_path):
  """A --tokenizer without tokenizer.json failed only after the weights
  were loaded and written."""
  workdir = _workdir(tmp_path)
  error = _export_error(workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={tmp_path}")
  assert f"{tmp_path} holds no tokenizer.json" in error


def test_cli_checks_the_sources_special_ids_before_the_weights(tmp_path):
  """--tokenizer's config.json gives the export its bos/eos ids; one that
  is no token id of the model stops the export before any weight is read
  (the fake checkpoint would fail to load) and leaves --out unwritten."""
  workdir = _workdir(tmp_path)
  source = tmp_path / "source"
  source.mkdir()
  (source / "tokenizer.json").write_text("{}")
  (source / "config.json").write_text('{"eos_token_id": 99999999}')
  error = _export_error(workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={source}")
  assert "config.json: eos_token_id=99999999 is not token id(s)" in error
  assert not (tmp_path / "hf").exists()


def test_an_empty_out_is_refused():
  """--out= read as '/': the export was staged in /.partial-PID and then
  failed to rename the root directory, after loading every weight."""
  with pytest.raises(app.UsageError, match="--out is empty"):
    export.check_out_dir("", None, False, "/nonexistent")
