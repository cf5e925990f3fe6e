"""config.eval_only on a workdir with no checkpoint is refused in one line,
before any data is built (`trm.core.run_checks.check_eval_only`)."""
import os

import pytest

from test_train import tiny_config  # pylint: disable=g-import-not-at-top
from trm import families
from trm.core import checkpoint as ckpt_lib
from trm.core import config_lib
from trm.core import run_checks
from trm.core import train


def test_eval_only_without_a_checkpoint_stops_before_the_data(tmp_path):
  data = tmp_path / "data"
  workdir = tmp_path / "run"
  config = tiny_config(**{"data.data_dir": str(data), "eval_only": True})
  with pytest.raises(run_checks.EvalOnlyError) as info:
    train.train_and_evaluate(config, str(workdir), families.build_task)
  message = str(info.value)
  assert "\n" not in message
  assert "config.eval_only=True" in message and str(workdir) in message
  assert "holds no complete checkpoint" in message
  assert not data.exists()  # nothing was built
  assert not (workdir / "checkpoints").exists()


def _fake_complete_step(workdir, step=3):
  for name in ckpt_lib.missing_files(os.path.join(workdir, "checkpoints",
                                                  str(step))):
    path = os.path.join(workdir, "checkpoints", str(step), name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()


def test_eval_only_with_a_checkpoint_or_starting_weights_passes(tmp_path):
  config = tiny_config(eval_only=True)
  workdir = str(tmp_path / "run")
  with pytest.raises(run_checks.EvalOnlyError):
    run_checks.check_eval_only(config, workdir)
  # An unfinished step does not count.
  os.makedirs(os.path.join(workdir, "checkpoints", "3"))
  with pytest.raises(run_checks.EvalOnlyError):
    run_checks.check_eval_only(config, workdir)
  _fake_complete_step(workdir)
  run_checks.check_eval_only(config, workdir)
  # Not eval_only: nothing to check.
  run_checks.check_eval_only(tiny_config(), str(tmp_path / "fresh"))
  # nanoGPT's eval_only on GPT-2 weights (init_from='gpt2'), DiffuCoder's
  # on an init_checkpoint: the weights come from there.
  gpt = config_lib.load_config("configs/gpt.py")
  config_lib.set_values(gpt, {"eval_only": True, "init_from": "gpt2",
                              "init_checkpoint": "gpt2_dir"})
  run_checks.check_eval_only(gpt, str(tmp_path / "fresh"))
  config_lib.set_values(gpt, {"init_from": "scratch"})
  with pytest.raises(run_checks.EvalOnlyError):
    run_checks.check_eval_only(gpt, str(tmp_path / "fresh"))
  dc = config_lib.load_config("configs/diffucoder_7b.py", "tiny")
  config_lib.set_values(dc, {"eval_only": True, "init_checkpoint": "hf"})
  run_checks.check_eval_only(dc, str(tmp_path / "fresh"))


def test_check_workdir_checks_eval_only_with_the_runs_config(tmp_path):
  config = tiny_config(eval_only=True)
  run_checks.check_config(config)
  with pytest.raises(run_checks.EvalOnlyError):
    run_checks.check_workdir(str(tmp_path / "run"), config)
  assert not (tmp_path / "run").exists()  # refused before it is created
  # Without a config (tools that only need a writable directory): no check.
  run_checks.check_workdir(str(tmp_path / "run"))