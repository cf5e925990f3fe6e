"""Resumes under a changed config (`trm.core.config_record`, `trm.core.train`):
a total_steps lowered below the checkpoint."""
import json
import os
import shutil

import pytest

from trm.core import config_record
from trm.core import train
from trm import families

from test_train import tiny_config  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory):
  """A finished 6-step run, checkpointed at 3 and 6."""
  workdir = str(tmp_path_factory.mktemp("run"))
  config = tiny_config(total_steps=6, checkpoint_every=3, eval_every=6)
  train.train_and_evaluate(config, workdir, families.build_task)
  return workdir, config


def _copy(six_steps, tmp_path):
  workdir, config = six_steps
  copy = str(tmp_path / "run")
  shutil.copytree(workdir, copy)
  return copy, config.copy_and_resolve_references()


def test_total_steps_below_the_checkpoint_evaluates_it_and_keeps_it(
    six_steps, tmp_path):
  """Lowered (and allowed) below the newest step, the run is finished: it
  evaluates that step again, as at total_steps, instead of calling the
  checkpoint's data position unfit for the data, and deletes nothing."""
  workdir, config = _copy(six_steps, tmp_path)
  config.update(total_steps=4, allow_config_change=True)
  state, results = train.train_and_evaluate(config, workdir,
                                            families.build_task)
  assert int(state.step) == 6 and "eval/loss" in results
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3", "6"]
  with open(os.path.join(workdir, config_record.HISTORY)) as f:
    assert json.loads(f.readlines()[-1])["accepted"] == ["total_steps"]
