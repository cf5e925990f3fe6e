"""The "add a model family" recipe: a family registered from the tests
(`toy_config.py`) trains through `trm.main` and compiles with `trm.aot`,
with no edit to `trm/`."""
import json
import os
import subprocess
import sys

import repo

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(module, *args):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [HERE, repo.ROOT, os.environ.get("PYTHONPATH", "")]))
  return subprocess.run(
      [sys.executable, "-m", module,
       f"--config={os.path.join(HERE, 'toy_config.py')}", *args],
      cwd=repo.ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_trains_three_steps_through_trm_main(tmp_path):
  result = _run("trm.main", f"--workdir={tmp_path}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]
  with open(tmp_path / "eval_3.json") as f:
    results = json.load(f)
  assert 0 <= results["eval/accuracy"] <= 1 and results["eval/loss"] > 0
  # A second run resumes the finished one instead of training again.
  again = _run("trm.main", f"--workdir={tmp_path}")
  assert again.returncode == 0, again.stderr[-3000:]


def test_compiles_for_a_tpu_slice_with_trm_aot():
  result = _run("trm.aot", "--topology=v4-8")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "verdict: FITS" in result.stdout
  assert "train_flops_per_step: 9.216e+03" in result.stdout
