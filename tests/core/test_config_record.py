"""A resume checks its config against the run's record (`trm.core.config_record`):
trajectory changes are refused before restore unless allowed, harmless ones
pass, the original config.json is kept and every change is logged."""
import json
import os
import sys

import pytest
import repo

from trm.core import config_lib
from trm.core import config_record
from trm.core import train
from trm import families

from test_train import tiny_config  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A 10-step run with checkpoints; its config.json as written."""
  workdir = str(tmp_path_factory.mktemp("run"))
  config = tiny_config(total_steps=10, checkpoint_every=10, eval_every=10)
  train.train_and_evaluate(config, workdir, families.build_task)
  with open(os.path.join(workdir, "config.json")) as f:
    return workdir, config, f.read()


def _history(workdir):
  path = os.path.join(workdir, config_record.HISTORY)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f]


@pytest.mark.parametrize("key,value", [("seed", 7), ("optim.lr", 5e-4),
                                       ("global_batch_size", 32),
                                       ("model.hidden_size", 48)])
def test_a_trajectory_change_is_refused_before_restore(finished_run, key,
                                                       value):
  workdir, config, recorded = finished_run
  changed = config.copy_and_resolve_references()
  node, *path = [changed] + key.split(".")
  for name in path[:-1]:
    node = node[name]
  node[path[-1]] = value
  with pytest.raises(config_record.ConfigChangedError,
                     match=rf"from step 10 .*config\.{key}: .* -> "
                     rf"{value!r}.*allow_config_change=True"):
    train.train_and_evaluate(changed, workdir, families.build_task)
  with open(os.path.join(workdir, "config.json")) as f:
    assert f.read() == recorded


def test_harmless_changes_pass_and_are_logged(finished_run):
  workdir, config, recorded = finished_run
  changed = config.copy_and_resolve_references()
  changed.total_steps = 12  # longer
  changed.log_every = config.log_every + 1
  train.train_and_evaluate(changed, workdir, families.build_task)
  with open(os.path.join(workdir, "config.json")) as f:
    assert f.read() == recorded  # the original record is kept
  last = _history(workdir)[-1]
  assert last["step"] == 10 and last["accepted"] == []
  assert last["changes"]["total_steps"] == [10, 12]
  assert last["changes"]["log_every"] == [config.log_every, config.log_every + 1]


def test_kernel_choice_is_harmless_even_when_unrecorded(finished_run,
                                                        tmp_path):
  """A TRM run recorded before config.model.mlp_kernel existed, or trained
  with the other kernel, resumes: the kernel computes the same math."""
  _, config, recorded = finished_run
  record = json.loads(recorded)
  for old in (None, "pallas"):
    if old is None:
      record["model"].pop("mlp_kernel", None)
    else:
      record["model"]["mlp_kernel"] = old
    (tmp_path / config_record.RECORD).write_text(json.dumps(record))
    diff = config_record.check(config, tmp_path, step=10)
    assert diff == {"model.mlp_kernel": [old, config.model.mlp_kernel]}


def test_allow_config_change_accepts_and_records(finished_run):
  workdir, config, _ = finished_run
  changed = config.copy_and_resolve_references()
  changed.total_steps = 14
  changed.optim.lr = 5e-4
  changed.allow_config_change = True
  train.train_and_evaluate(changed, workdir, families.build_task)
  last = _history(workdir)[-1]
  assert last["accepted"] == ["optim.lr"]
  assert last["changes"]["optim.lr"] == [config.optim.lr, 5e-4]


def test_a_shorter_run_is_a_change():
  assert config_record.changes({"total_steps": 10}, {"total_steps": 5})
  assert not config_record._harmless("total_steps", 10, 5)  # pylint: disable=protected-access
  assert config_record._harmless("total_steps", 10, 20)  # pylint: disable=protected-access


def _gpt_config(scan_layers: bool):
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "gpt.py"), "shakespeare_char_cpu")
  with config.unlocked():  # whether or not the config file sets it
    config.model.scan_layers = scan_layers
  return config


def _record_without_scan_layers(config, workdir):
  """config.json as a GPT run wrote it before model.scan_layers (and
  model.residual_dtype and loss_chunk_size) existed."""
  record = json.loads(config.to_json_best_effort())
  del record["model"]["scan_layers"]
  del record["model"]["residual_dtype"]
  del record["loss_chunk_size"]
  (workdir / config_record.RECORD).write_text(json.dumps(record))


def test_a_field_added_later_at_its_implicit_value_is_no_change():
  assert config_record.IMPLICIT == {"model.scan_layers": False,
                                    "model.residual_dtype": "float32",
                                    "loss_chunk_size": 0}
  old = {"model": {"name": "gpt"}}
  assert config_record.changes(old, {"model": {"name": "gpt",
                                               "scan_layers": False}}) == {}
  assert config_record.changes(
      old, {"model": {"name": "gpt", "scan_layers": True}}) == {
          "model.scan_layers": [None, True]}
  # Recorded explicitly, the value is compared as any other.
  assert config_record.changes(
      {"model": {"scan_layers": True}}, {"model": {"scan_layers": False}}) == {
          "model.scan_layers": [True, False]}
  # A residual stream or loss chunking other than nanoGPT's is a change.
  assert config_record.changes(old, {"model": {
      "name": "gpt", "residual_dtype": "bfloat16"}}) == {
          "model.residual_dtype": [None, "bfloat16"]}


def test_a_run_recorded_before_tpu_compiler_options_resumes(tmp_path):
  """The TPU flags change how XLA schedules the step, not what it
  computes: a resume accepts and logs them."""
  config = _gpt_config(False)
  record = json.loads(config.to_json_best_effort())
  del record["tpu_compiler_options"]
  (tmp_path / config_record.RECORD).write_text(json.dumps(record))
  assert config_record.check(config, tmp_path, step=10) == {
      "tpu_compiler_options": [None, config.tpu_compiler_options]}


def test_a_gpt_run_recorded_before_scan_layers_resumes_unscanned(tmp_path):
  _record_without_scan_layers(_gpt_config(False), tmp_path)
  assert config_record.check(_gpt_config(False), tmp_path, step=10) == {}
  # Nothing to log either.
  config_record.record(_gpt_config(False), tmp_path, {}, step=10)
  assert not (tmp_path / config_record.HISTORY).exists()


@pytest.mark.parametrize("recorded", [None, False, True])
@pytest.mark.parametrize("allow", [False, True])
def test_switching_scan_layers_is_refused_even_when_allowed(tmp_path,
                                                            recorded, allow):
  """The checkpoints' layout (h_0 .. or one stacked h) changes: no
  allow_config_change can restore them, so the change is always refused,
  in one line naming the field."""
  if recorded is None:
    _record_without_scan_layers(_gpt_config(False), tmp_path)
  else:
    (tmp_path / config_record.RECORD).write_text(
        _gpt_config(recorded).to_json_best_effort())
  config = _gpt_config(not recorded)
  config.allow_config_change = allow
  with pytest.raises(config_record.ConfigChangedError) as error:
    config_record.check(config, tmp_path, step=10)
  message = str(error.value)
  assert "\n" not in message
  assert (f"config.model.scan_layers: {recorded!r} -> {not recorded!r}"
          in message), message
  assert "layout" in message and "from step 10" in message
