"""Resumes under a changed config (`trm.core.config_record`, `trm.core.train`):
a total_steps lowered below the checkpoint, a longer run whose learning-rate
schedule spans total_steps, an accepted change said in the log."""
import json
import os
import shutil

import pytest
from etils import epath

from trm.core import checkpoint as ckpt_lib
from trm.core import config_lib
from trm.core import config_record
from trm.core import train
from trm import families

import repo
from test_train import ONE_AXIS, tiny_config  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="module")
def six_steps(tmp_path_factory):
  """A finished 6-step run, checkpointed at 3 and 6 (on the data-parallel
  mesh: the resume loads its step from the compilation cache)."""
  workdir = str(tmp_path_factory.mktemp("run"))
  config = tiny_config(total_steps=6, checkpoint_every=3, eval_every=6,
                       **ONE_AXIS)
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


def test_a_longer_run_is_a_change_where_the_schedule_spans_it(six_steps,
                                                              tmp_path):
  """TRM's cosine (lr_min_ratio < 1) decays over total_steps: lengthening
  the run changes the rate of every step left, so it is refused unless
  allowed, naming the reason; at the constant rate it passes."""
  workdir, config = _copy(six_steps, tmp_path)
  workdir = epath.Path(workdir)
  record = workdir / config_record.RECORD
  config.total_steps = 12
  assert set(config_record.check(config, workdir, 6)) == {"total_steps"}
  config.optim.lr_min_ratio = 0.1
  # As if the run had trained with it (the checkpoint's record is
  # compared first: without checkpoints, config.json is).
  shutil.rmtree(workdir / "checkpoints")
  recorded = json.loads(record.read_text())
  recorded["optim"]["lr_min_ratio"] = 0.1
  record.write_text(json.dumps(recorded))
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.total_steps: 6 -> 12 \(this model's "
                     r"learning-rate schedule decays over config\.total_steps"):
    config_record.check(config, workdir, 6)
  config.allow_config_change = True
  assert set(config_record.check(config, workdir, 6)) == {
      "total_steps", "allow_config_change"}


@pytest.mark.parametrize("name,arg,key", [
    ("diffucoder_7b.py", "tiny", "total_steps"),
    ("gpt.py", "shakespeare_char_cpu", "max_iters")])
def test_a_longer_run_by_schedule(tmp_path, name, arg, key):
  """Dream's cosine always ends at total_steps: a longer run is refused;
  nanoGPT's ends at lr_decay_iters, so its max_iters may grow."""
  config = config_lib.load_config(os.path.join(repo.ROOT, "configs", name),
                                  arg)
  workdir = epath.Path(tmp_path)
  (workdir / config_record.RECORD).write_text(config.to_json_best_effort())
  config = config_lib.set_values(config, {key: 2 * config.total_steps})
  if name == "gpt.py":
    assert set(config_record.check(config, workdir, 10)) == {
        "max_iters", "total_steps"}
  else:
    with pytest.raises(config_record.ConfigChangedError,
                       match=r"config\.total_steps: 300 -> 600 \(this"):
      config_record.check(config, workdir, 10)


def test_an_accepted_change_is_said_in_the_log(tmp_path, caplog):
  """Not only in config_history.jsonl: the log of the resume that trains
  otherwise says so, in one warning naming the fields."""
  config = tiny_config()
  workdir = epath.Path(tmp_path)
  (workdir / config_record.RECORD).write_text(config.to_json_best_effort())
  config = config_lib.set_values(config, {"seed": 7, "log_every": 2,
                                          "allow_config_change": True})
  diff = config_record.check(config, workdir, 6)
  config_record.record(config, workdir, diff, 6)
  assert [r.getMessage() for r in caplog.records
          if r.levelname == "WARNING"] == [
              "Resuming from step 6 with changes to how the run trains, "
              "accepted by config.allow_config_change: config.seed: 0 -> 7 "
              f"(recorded in {workdir / config_record.HISTORY})."]


def test_a_resume_over_edited_sft_rows_is_refused(tmp_path):
  """DiffuCoder's epoch order depends on every row: rows appended to the
  JSONL between a checkpoint and its resume would repeat some rows and skip
  others (and train on the old held-out tail), so the restore stops, saying
  why; allow_config_change goes on."""
  data = tmp_path / "sft.jsonl"

  def write(count):
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "response":
                                        f"answer number {i}"}) + "\n"
                            for i in range(count)))

  config = config_lib.set_values(config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "diffucoder_7b.py"), "tiny"), {
          "data.format": "jsonl", "data.path": str(data), "data.chat": False,
          "data.eval_rows": 8, "data.eval_batch_size": 8,
          "global_batch_size": 8, "seq_len": 32, "total_steps": 4,
          "checkpoint_every": 2, "eval_every": 4})
  workdir = str(tmp_path / "run")
  write(40)
  train.train_and_evaluate(config, workdir, families.build_task)
  shutil.rmtree(os.path.join(workdir, "checkpoints", "4"))  # killed at 3
  write(56)
  with pytest.raises(ckpt_lib.CheckpointError, match=(
      r"checkpoints/2 failed: its data position .* \(ValueError: the "
      r"training data \(config.data's files\) is not what it was trained "
      r"on")):
    train.train_and_evaluate(config, workdir, families.build_task)
  # eval_only trains nothing: the checkpoint evaluates on the rows now there.
  config = config_lib.set_values(config, {"eval_only": True})
  state, results = train.train_and_evaluate(config, workdir,
                                            families.build_task)
  assert int(state.step) == 2 and "eval/loss" in results
  config = config_lib.set_values(config, {"eval_only": False,
                                          "allow_config_change": True})
  state, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert int(state.step) == 4
