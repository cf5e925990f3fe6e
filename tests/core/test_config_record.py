"""A resume checks its config against the run's record (`trm.core.config_record`):
trajectory changes are refused before restore unless allowed, harmless ones
pass, the original config.json is kept and every change is logged."""
import json
import os
import shutil
import sys

import pytest
import repo

from trm.core import config_lib
from trm.core import config_record
from trm.core import train
from trm import families

from test_train import ONE_AXIS, tiny_config  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A 10-step run with checkpoints; its config.json as written. (On the
  data-parallel mesh: the resumes below load its step from the
  compilation cache.)"""
  workdir = str(tmp_path_factory.mktemp("run"))
  config = tiny_config(total_steps=10, checkpoint_every=10, eval_every=10,
                       **ONE_AXIS)
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


def test_a_remat_policy_change_is_harmless_even_when_unrecorded(tmp_path):
  """A GPT run resumes with more or less kept, recomputed or offloaded to
  the host (the same math), also one recorded before the custom policy's
  fields existed."""
  config = _gpt_config(scan_layers=True)
  record = json.loads(config.to_json_best_effort())
  for field in ("remat_save", "remat_offload"):
    del record["model"][field]
  (tmp_path / config_record.RECORD).write_text(json.dumps(record))
  with config.unlocked():
    config.model.update(remat=True, remat_policy="custom",
                        remat_offload="decoder_layer_input")
  diff = config_record.check(config, tmp_path, step=10)
  assert diff == {"model.remat": [False, True],
                  "model.remat_policy": ["full", "custom"],
                  "model.remat_offload": [None, "decoder_layer_input"]}


def test_allow_config_change_accepts_and_records(finished_run, tmp_path):
  # A copy: the shared run keeps one config (its later steps would be
  # trained, and recorded, with the accepted one). The seed changes the
  # trajectory (the data order) but not the compiled step, which
  # test_a_deleted_config_json_is_rewritten_by_a_resume's run then shares
  # (a changed learning rate compiled another).
  workdir, config, recorded = _copy_run(finished_run, tmp_path)
  changed = config.copy_and_resolve_references()
  changed.total_steps = _newest(workdir) + 2
  changed.seed = 7
  changed.allow_config_change = True
  train.train_and_evaluate(changed, str(workdir), families.build_task)
  last = _history(workdir)[-1]
  assert last["accepted"] == ["seed"]
  assert last["changes"]["seed"] == [config.seed, 7]
  # The steps trained since carry the accepted config: a later resume is
  # checked against it. Before, they carried the first run's, so going
  # back to seed 0 passed unchecked and keeping 7 was refused.
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  newest = workdir / "checkpoints" / str(changed.total_steps)
  assert ckpt_lib.saved_config_record(newest)["seed"] == 7
  with open(workdir / "config.json") as f:
    assert f.read() == recorded  # the run's first config stays there
  back = changed.copy_and_resolve_references()
  back.update(total_steps=changed.total_steps + 2, allow_config_change=False)
  back.seed = config.seed
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.seed: 7 -> 0\. The "
                     r"config record saved with checkpoint .* records"):
    config_record.check(back, workdir, changed.total_steps)
  back.seed = 7
  assert set(config_record.check(back, workdir, changed.total_steps)) == {
      "total_steps"}


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
  model.residual_dtype, model.logits_dtype and loss_chunk_size) existed."""
  record = json.loads(config.to_json_best_effort())
  del record["model"]["scan_layers"]
  del record["model"]["residual_dtype"]
  del record["model"]["logits_dtype"]
  del record["loss_chunk_size"]
  (workdir / config_record.RECORD).write_text(json.dumps(record))


def test_a_field_added_later_at_its_implicit_value_is_no_change():
  assert config_record.IMPLICIT == {"model.scan_layers": False,
                                    "model.residual_dtype": "float32",
                                    "model.head_size": 0,
                                    "model.mlp_size": 0,
                                    "model.n_kv_head": 0,
                                    "model.logits_dtype": "float32",
                                    "model.remat_save": "",
                                    "model.remat_offload": "",
                                    "loss_chunk_size": 0,
                                    "loss_reduce_once": False,
                                    "compiled_step": "",
                                    "profiler_steps": 0,
                                    "skip_first_n_steps_for_profiler": 1,
                                    "keep_checkpoint_every": 0,
                                    "gradient_accumulation_steps": 1,
                                    "data_seed": -1,
                                    "label_smoothing": 0.0, "z_loss": 0.0,
                                    "warmup_ratio": 0.0,
                                    "optim.warmup_ratio": 0.0,
                                    "optim.freeze_weights": False,
                                    "resume_step": 0,
                                    "early_stopping_patience": 0,
                                    "early_stopping_threshold": 0.0,
                                    "num_epochs": 0.0,
                                    "optimizer": "adamw",
                                    "optim.lr_mults": [],
                                    "optim.wd_mults": [],
                                    "lr_mults": [], "wd_mults": [],
                                    "best_metric": "eval/loss",
                                    "best_metric_mode": "auto"}
  assert config_record.IMPLICIT_BY_FAMILY == {
      "optim.optimizer": {"trm": "adam_atan2", "dream": "adamw"}}
  # A DiffuCoder run recorded before it could accumulate gradients.
  assert config_record.changes({"model": {"name": "dream"}}, {
      "model": {"name": "dream"}, "gradient_accumulation_steps": 1}) == {}
  old = {"model": {"name": "gpt"}}
  # The profiler window's defaults (added in session 66): an older run's
  # resume logs no change.
  assert config_record.changes(old, {
      "model": {"name": "gpt"}, "profiler_steps": 0,
      "skip_first_n_steps_for_profiler": 1, "keep_checkpoint_every": 0}) == {}
  # Session 68's run controls at their defaults: no change for an older
  # run (a resume from another step, early stopping: logged ones).
  assert config_record.changes(old, {
      "model": {"name": "gpt"}, "resume_step": 0,
      "early_stopping_patience": 0, "early_stopping_threshold": 0.0,
      "num_epochs": 0.0,
      "best_metric": "eval/loss", "best_metric_mode": "auto"}) == {}
  assert config_record.changes(old, {
      "model": {"name": "gpt"}, "early_stopping_patience": 3}) == {
          "early_stopping_patience": [None, 3]}
  # A TRM run recorded before optim.freeze_weights (session 67) trained
  # every weight: it resumes; with the weights frozen it is a change.
  trm_old = {"model": {"name": "trm"}, "optim": {"lr": 1e-4}}
  assert config_record.changes(trm_old, {"model": {"name": "trm"}, "optim": {
      "lr": 1e-4, "freeze_weights": False}}) == {}
  assert config_record.changes(trm_old, {"model": {"name": "trm"}, "optim": {
      "lr": 1e-4, "freeze_weights": True}}) == {
          "optim.freeze_weights": [None, True]}
  # Per-parameter multipliers (session 68): none is no change (the config's
  # () reaches the record as JSON's []); a frozen pattern is one.
  assert config_record.changes(trm_old, {"model": {"name": "trm"}, "optim": {
      "lr": 1e-4, "lr_mults": [], "wd_mults": []}}) == {}
  assert config_record.changes(old, {"model": {"name": "gpt"}, "lr_mults": [
      ["ln_f/.*", 0.0]], "wd_mults": []}) == {
          "lr_mults": [None, [["ln_f/.*", 0.0]]]}
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


def test_a_diffucoder_resume_may_split_its_batch_otherwise(tmp_path):
  """DiffuCoder's accumulated step is its one-batch step (the whole
  batch's noise and count): a resume that only changes
  gradient_accumulation_steps passes, logged; with the global batch
  changed too it is refused, as is GPT's, whose micro-batches are
  nanoGPT's (each its own mean and dropout draws)."""
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "diffucoder_7b.py"), "tiny")
  (tmp_path / config_record.RECORD).write_text(config.to_json_best_effort())
  config.gradient_accumulation_steps = 2
  assert config_record.check(config, tmp_path, step=10) == {
      "gradient_accumulation_steps": [1, 2]}
  config_record.record(config, tmp_path, {
      "gradient_accumulation_steps": [1, 2]}, step=10)
  assert [entry["accepted"] for entry in _history(tmp_path)] == [[]]
  config.global_batch_size *= 2
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"changes how it trains: config\.global_batch_size"
                     r": \d+ -> \d+\. "):
    config_record.check(config, tmp_path, step=10)
  gpt = _gpt_config(False)
  (tmp_path / config_record.RECORD).write_text(gpt.to_json_best_effort())
  gpt.update(gradient_accumulation_steps=2, batch_size=gpt.batch_size // 2)
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.batch_size: 12 -> 6; config\."
                     r"gradient_accumulation_steps: 1 -> 2\. "):
    config_record.check(gpt, tmp_path, step=10)


@pytest.mark.parametrize("old,new", [(0.0, 1.0), (1.0, 0.0)])
def test_turning_gpt_gradient_clipping_on_or_off_is_refused_even_when_allowed(
    tmp_path, old, new):
  """GPT's grad_clip above 0 adds a stage to the optimizer state's tree: a
  resume switching it could not restore (restore_check's tree mismatch),
  so it is refused before restore in one line naming the field; another
  clip above 0 is accepted with allow_config_change."""
  config = _gpt_config(False)
  config.grad_clip = old
  (tmp_path / config_record.RECORD).write_text(config.to_json_best_effort())
  config.update(grad_clip=new, allow_config_change=True)
  with pytest.raises(config_record.ConfigChangedError, match=(
      rf"gradient clipping turned on or off: config\.grad_clip: {old!r} -> "
      rf"{new!r}\. .*Keep the recorded config\.grad_clip")):
    config_record.check(config, tmp_path, step=10)
  config.grad_clip = 0.5 if old else 0.0
  assert config_record.check(config, tmp_path, step=10).get(
      "grad_clip") == ([1.0, 0.5] if old else None)


def test_a_data_seed_change_is_refused_and_its_default_is_no_change(
    tmp_path):
  """config.data_seed (HF's data_seed) draws the data: a run recorded
  before it existed drew with config.seed (-1, the default, is no change);
  another value changes the batches, so a resume refuses it."""
  config = _gpt_config(False)
  record = json.loads(config.to_json_best_effort())
  del record["data_seed"]
  (tmp_path / config_record.RECORD).write_text(json.dumps(record))
  assert config_record.check(config, tmp_path, step=10) == {}
  config.data_seed = 7
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"changes how it trains: config\.data_seed: None "
                     "-> 7"):
    config_record.check(config, tmp_path, step=10)
  # data_seed equal to seed draws what -1 (or no field) drew: no change,
  # either way round; a seed change stays one (the model's draws).
  config.data_seed = config.seed
  assert config_record.check(config, tmp_path, step=10) == {}
  record["data_seed"] = config.seed
  (tmp_path / config_record.RECORD).write_text(json.dumps(record))
  config.data_seed = -1
  assert config_record.check(config, tmp_path, step=10) == {}
  config.seed += 1
  config.data_seed = record["seed"]
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.seed: "):
    config_record.check(config, tmp_path, step=10)


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


def _optimizer_record(family: str, workdir, **changes):
  """config.json of a `family` run recorded before the choice of optimizer
  (the config's field deleted), and that config with `changes`."""
  path, variant = {"gpt": ("gpt.py", "shakespeare_char_cpu"),
                   "trm": ("trm_sudoku.py", "cpu"),
                   "dream": ("diffucoder_7b.py", "tiny")}[family]
  config = config_lib.load_config(os.path.join(repo.ROOT, "configs", path),
                                  variant)
  record = json.loads(config.to_json_best_effort())
  del (record if family == "gpt" else record["optim"])["optimizer"]
  (workdir / config_record.RECORD).write_text(json.dumps(record))
  return config_lib.set_values(config, changes)


@pytest.mark.parametrize("family,field,default,other", [
    ("gpt", "optimizer", "adamw", "lion"),
    ("trm", "optim.optimizer", "adam_atan2", "adamw"),
    ("dream", "optim.optimizer", "adamw", "adafactor")])
@pytest.mark.parametrize("allow", [False, True])
def test_another_optimizer_is_refused_even_when_allowed(tmp_path, family,
                                                        field, default,
                                                        other, allow):
  """A run recorded before the choice of optimizer trained with its
  family's own (TRM's AdamATan2, the others' AdamW): it resumes under that
  default, logging nothing. Another choice is refused in one line naming
  the field, also with allow_config_change: the checkpoints' optimizer
  state is the recorded optimizer's, which the new one cannot restore."""
  config = _optimizer_record(family, tmp_path)
  assert config_record.check(config, tmp_path, step=10) == {}
  config_record.record(config, tmp_path, {}, step=10)
  assert not (tmp_path / config_record.HISTORY).exists()
  config.allow_config_change = allow
  for recorded, changed in ((None, other), (other, default)):
    if recorded is not None:  # recorded explicitly, e.g. a new run's
      (tmp_path / config_record.RECORD).write_text(config_lib.set_values(
          config.copy_and_resolve_references(),
          {field: recorded}).to_json_best_effort())
    config = config_lib.set_values(config, {field: changed})
    with pytest.raises(config_record.ConfigChangedError) as error:
      config_record.check(config, tmp_path, step=10)
    message = str(error.value)
    assert "\n" not in message
    assert f"config.{field}: {recorded!r} -> {changed!r}" in message, message
    assert "another optimizer" in message and "allow_config_change" in message


# ------------------------------------- the record travels with checkpoints


def _copy_run(finished_run, tmp_path):
  """A private copy of the finished run (earlier tests of this module may
  have resumed it to steps beyond 10) and its newest step."""
  workdir, config, recorded = finished_run
  copy = tmp_path / "run"
  shutil.copytree(workdir, copy)
  return copy, config, recorded


def _newest(workdir):
  return max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))
             if d.isdigit())


def _seed_changed(config):
  changed = config.copy_and_resolve_references()
  changed.seed = 7
  return changed


def test_each_checkpoint_carries_the_record(finished_run):
  """Also those of resumes with harmless changes: the record is the run's,
  as config.json is."""
  workdir, _, recorded = finished_run
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  directory = os.path.join(workdir, "checkpoints")
  steps = ckpt_lib.complete_steps(directory)
  assert 10 in steps
  for step in steps:
    saved = ckpt_lib.saved_config_record(os.path.join(directory, str(step)))
    assert saved == json.loads(recorded), step


@pytest.mark.parametrize("damage", [None, "", "{not json", "[1, 2]", "3"],
                         ids=["deleted", "empty", "invalid JSON", "list",
                              "number"])
def test_a_lost_config_json_lets_no_change_through(finished_run, tmp_path,
                                                   caplog, damage):
  workdir, config, recorded = _copy_run(finished_run, tmp_path)
  record_path = workdir / config_record.RECORD
  if damage is None:
    record_path.unlink()
  else:
    record_path.write_text(damage)
  with pytest.raises(config_record.ConfigChangedError) as error:
    train.train_and_evaluate(_seed_changed(config), str(workdir),
                             families.build_task)
  message = str(error.value)
  assert "\n" not in message
  assert "config.seed: 0 -> 7" in message
  assert (f"The config record saved with checkpoint {workdir}/checkpoints/"
          f"{_newest(workdir)}" in message)
  # One warning line naming the file and what replaces it.
  warnings = [r.getMessage() for r in caplog.records
              if str(record_path) in r.getMessage()]
  assert warnings and "\n" not in warnings[0]
  assert "comparing with the config record saved with checkpoint" in (
      warnings[0])
  # Nothing was written before the refusal.
  assert (record_path.exists() if damage is not None
          else not record_path.exists())
  # The unchanged config resumes, and config.json is the run's record again.
  diff = config_record.check(config, workdir, step=_newest(workdir))
  assert diff == {}
  config_record.record(config, workdir, diff, step=_newest(workdir))
  assert json.loads(record_path.read_text()) == json.loads(recorded)


def test_an_edited_config_json_does_not_override_the_checkpoint(
    finished_run, tmp_path, caplog):
  """config.json rewritten to match a changed config: the checkpoint's
  record still refuses the change."""
  workdir, config, _ = _copy_run(finished_run, tmp_path)
  (workdir / config_record.RECORD).write_text(
      _seed_changed(config).to_json_best_effort(indent=2))
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.seed: 0 -> 7"):
    config_record.check(_seed_changed(config), workdir,
                        step=_newest(workdir))
  assert "differs from the config record saved with checkpoint" in (
      caplog.text)


def test_a_deleted_config_json_is_rewritten_by_a_resume(finished_run,
                                                        tmp_path):
  """End to end: trm.main's loop with config.json gone compares with the
  checkpoint's record, and writes config.json back from it."""
  workdir, config, recorded = _copy_run(finished_run, tmp_path)
  (workdir / config_record.RECORD).unlink()
  changed = config.copy_and_resolve_references()
  changed.total_steps = _newest(workdir) + 2  # longer: harmless
  train.train_and_evaluate(changed, str(workdir), families.build_task)
  assert json.loads((workdir / config_record.RECORD).read_text()) == (
      json.loads(recorded))
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  assert ckpt_lib.saved_config_record(
      workdir / "checkpoints" / str(changed.total_steps)) == json.loads(
          recorded)


@pytest.mark.parametrize("text, why", [
    ("{not json", "is not valid JSON"), ("", "is empty"),
    ("[1, 2]", "holds a JSON list, not a config record"),
    ("3", "holds a JSON int, not a config record")],
                         ids=["invalid JSON", "empty", "list", "number"])
def test_a_damaged_config_json_without_a_checkpoint_record_stops(
    tmp_path, text, why):
  """Checkpoints written before records travelled with them: config.json
  is all there is, so a damaged one is one line naming it."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  class Position:
    def get_state(self):
      return {"next_index": 10}

  manager = ckpt_lib.make_manager(str(tmp_path / "checkpoints"),
                                  max_to_keep=1)
  manager.save(10, args=ocp.args.Composite(
      state=ocp.args.StandardSave({"w": jnp.ones((4,))}),
      data_iter=ocp.args.JsonSave(Position().get_state())))
  ckpt_lib.wait_until_finished(manager)
  record_path = tmp_path / config_record.RECORD
  record_path.write_text(text)
  with pytest.raises(config_record.ConfigRecordError) as error:
    config_record.check(tiny_config(), tmp_path, step=10)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"{record_path} {why}")
  assert f"Restore {record_path}" in message
  assert record_path.read_text() == text


def test_a_failed_history_write_keeps_the_history(tmp_path, monkeypatch):
  # config_history.jsonl is rewritten whole at each resume (object stores
  # cannot append); written in place, a full disk (or a kill) mid-write
  # left it truncated: every recorded change lost.
  import builtins  # pylint: disable=g-import-not-at-top
  import errno  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  (tmp_path / config_record.RECORD).write_text(
      config.to_json_best_effort(indent=2))
  history = tmp_path / config_record.HISTORY
  before = json.dumps({"time": "2026-01-01T00:00:00", "step": 5,
                       "changes": {"seed": [0, 1]}, "accepted": ["seed"]})
  history.write_text(before + "\n")
  real_open = builtins.open

  class FullDisk:
    def __init__(self, f):
      self._f = f

    def write(self, unused_data):
      raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
      return getattr(self._f, name)

    def __enter__(self):
      return self

    def __exit__(self, *unused):
      self._f.close()

  def full_open(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if config_record.HISTORY in str(file) and set(mode) & set("wxa"):
      return FullDisk(f)
    return f

  monkeypatch.setattr(builtins, "open", full_open)
  with pytest.raises(OSError, match="No space left"):
    config_record.record(config, epath.Path(tmp_path),
                         {"log_every": [3, 4]}, 10)
  monkeypatch.setattr(builtins, "open", real_open)
  assert history.read_text() == before + "\n"
  assert sorted(os.listdir(tmp_path)) == sorted([config_record.RECORD,
                                                 config_record.HISTORY])


@pytest.mark.parametrize("before", [b"\xff\xfe not UTF-8\n",
                                    b'{"step": 5}'])
def test_a_hand_edited_history_is_kept_and_appended_to(tmp_path, before):
  """A history in another encoding stopped the resume (after its restore)
  with a bare `'utf-8' codec can't decode byte 0xff` naming no file; one
  without a last newline got the next entry glued to its last line."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  (tmp_path / config_record.RECORD).write_text(
      config.to_json_best_effort(indent=2))
  history = tmp_path / config_record.HISTORY
  history.write_bytes(before)
  config_record.record(config, epath.Path(tmp_path), {"log_every": [3, 4]},
                       10)
  text = history.read_bytes()
  assert text.startswith(before)
  lines = text[len(before):].decode().splitlines()
  if not before.endswith(b"\n"):
    assert lines[0] == ""
    lines = lines[1:]
  assert [json.loads(line)["changes"] for line in lines] == [
      {"log_every": [3, 4]}]


def test_an_unreadable_history_is_one_line_naming_it(tmp_path):
  from etils import epath  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  (tmp_path / config_record.RECORD).write_text(
      config.to_json_best_effort(indent=2))
  history = tmp_path / config_record.HISTORY
  history.mkdir()
  with pytest.raises(config_record.ConfigRecordError) as error:
    config_record.record(config, epath.Path(tmp_path),
                         {"log_every": [3, 4]}, 10)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"Cannot read {history} to add")
  assert message.endswith("move it away (a new history is then started) "
                          "and rerun.")


def test_a_workdir_of_another_model_is_refused_by_its_name(tmp_path):
  """A GPT run's workdir given a TRM config named config.model.scan_layers
  (the first layout field that differed) and not the model; the model's
  name is refused even with allow_config_change."""
  record = json.loads(_gpt_config(False).to_json_best_effort())
  (tmp_path / config_record.RECORD).write_text(json.dumps(record))
  config = tiny_config()
  with config.unlocked():
    config.allow_config_change = True
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"another model: config\.model\.name: 'gpt' -> "
                     f"{config.model.name!r}"):
    config_record.check(config, tmp_path, step=2)
