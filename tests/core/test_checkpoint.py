"""Checkpoint bookkeeping (`trm.core.checkpoint`): the best step survives keep-N,
the run's best held-out loss travels in the checkpoint's own metadata (so a
resume after preemption knows it), and nothing non-finite is ever written.
8 CPU devices; the GPT runs on a data-parallel mesh (test_train's
`ONE_AXIS`: their later runs load the step from the session's compilation
cache, where a 2x2x2 mesh's step is compiled afresh by each)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from trm.core import cli
from trm.core import checkpoint as ckpt_lib
from trm.core import preemption as preemption_lib
from trm.core import train
from trm import families

from test_checkpoint_integrity import _snapshot  # pylint: disable=g-import-not-at-top
from test_gpt_task import tiny_config  # pylint: disable=g-import-not-at-top
from test_train import ONE_AXIS  # pylint: disable=g-import-not-at-top
import workers as workers_lib  # pylint: disable=g-import-not-at-top


class _Iterator:
  """The part of a Grain iterator a save reads."""

  def get_state(self):
    return {"position": 0}


def _steps(directory):
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def test_keep_n_never_deletes_the_best_step(tmp_path):
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  state = {"w": jnp.ones((4,))}
  ckpt_lib.save(manager, 10, state, _Iterator(), eval_loss=1.0,
                best_eval_loss=1.0)
  # A save on preemption: no evaluation of its own.
  ckpt_lib.save(manager, 15, state, _Iterator(), best_eval_loss=1.0)
  ckpt_lib.save(manager, 20, state, _Iterator(), eval_loss=2.0,
                best_eval_loss=1.0)
  assert _steps(tmp_path) == [10, 20]
  reopened = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1)
  assert ckpt_lib.saved_best_loss(reopened, 20) == 1.0
  ckpt_lib.save(reopened, 30, state, _Iterator(), eval_loss=0.5,
                best_eval_loss=0.5)
  reopened.wait_until_finished()
  assert _steps(tmp_path) == [30]


def test_keep_every_keeps_its_steps_for_good(tmp_path):
  # big_vision's keep_ckpt_steps (config.keep_checkpoint_every): before,
  # keep-N deleted every step but the newest and the best.
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False, keep_every=20)
  state = {"w": jnp.ones((4,))}
  for step in (10, 20, 30, 40, 50):
    ckpt_lib.save(manager, step, state, _Iterator())
  assert _steps(tmp_path) == [20, 40, 50]


def test_cpu_saves_copy_replicated_arrays_whole(tmp_path, monkeypatch):
  # Orbax's replica-parallel save cuts a replicated array into one slice
  # per device, each a dispatched op, to copy host memory to itself.
  from orbax.checkpoint._src.serialization import replica_slices  # pylint: disable=g-import-not-at-top
  modes = []
  real = replica_slices.transfer_arrays_to_host

  def spy(arrays, replica_id, use_replica_parallel, *args, **kwargs):
    modes.append(use_replica_parallel)
    return real(arrays, replica_id, use_replica_parallel, *args, **kwargs)

  monkeypatch.setattr(replica_slices, "transfer_arrays_to_host", spy)
  mesh = jax.make_mesh((8,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = jax.device_put(
      jnp.arange(64.0).reshape(8, 8),
      jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  ckpt_lib.save(manager, 1, {"w": replicated}, _Iterator())
  assert modes and not any(modes), modes
  restored = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1).restore(
      1, args=ckpt_lib.ocp.args.Composite(
          state=ckpt_lib.ocp.args.StandardRestore({"w": replicated}),
          data_iter=ckpt_lib.ocp.args.JsonRestore()))
  np.testing.assert_array_equal(restored.state["w"], replicated)


def test_the_best_step_survives_a_reopened_manager(tmp_path):
  """A resumed run opens a new manager: it must still know each step's
  held-out loss, or keep-N deletes the best step at the next save (Orbax
  wrote metrics to disk only when given `best_fn`)."""
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  state = {"w": jnp.ones((4,))}
  ckpt_lib.save(manager, 10, state, _Iterator(), eval_loss=1.0,
                best_eval_loss=1.0)
  reopened = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                   async_save=False)
  assert reopened.metrics(10) == {ckpt_lib.EVAL_LOSS: 1.0}
  ckpt_lib.save(reopened, 20, state, _Iterator(), eval_loss=2.0,
                best_eval_loss=1.0)
  assert _steps(tmp_path) == [10, 20]


@pytest.mark.parametrize("text,why", [
    ('{"eval_lo', "cannot be read as JSON"),
    ("{}", "holds {}, not a finite number at 'eval_loss'"),
    ('{"eval_loss": "2.5"}', "not a finite number"),
    ('{"eval_loss": NaN}', "not a finite number"),
    # Past float's range: np.isfinite raised TypeError, a traceback.
    pytest.param('{"eval_loss": 1' + "0" * 400 + "}", "not a finite number",
                 id="integer-past-float-range"),
    ("\xff", "cannot be read as JSON")])
def test_a_damaged_loss_record_is_one_line_naming_it(tmp_path, text, why):
  """A step's held-out loss record (Orbax's `metrics` item) truncated or
  hand-edited: Orbax read it when the manager opened the directory and
  stopped with a bare JSON error naming no file (`trm.main: error:
  Unterminated string ...`), or, for a record without a number, trained on
  and failed the first save (KeyError / TypeError from the ranking).
  Readers (`restore_fields`) do not rank steps and are not stopped."""
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  state = {"w": jnp.ones((4,))}
  ckpt_lib.save(manager, 10, state, _Iterator(), eval_loss=1.0,
                best_eval_loss=1.0)
  record = tmp_path / "10" / "metrics" / "metrics"
  record.write_bytes(text.encode("latin-1"))
  before = _snapshot(str(tmp_path))
  with pytest.raises(ckpt_lib.CheckpointError) as error:
    ckpt_lib.make_manager(str(tmp_path), max_to_keep=1)
  message = str(error.value)
  assert "\n" not in message and why in message, message
  assert f"{record}, is damaged" in message
  assert f"delete {tmp_path / '10' / 'metrics'}" in message
  assert _snapshot(str(tmp_path)) == before
  fields, step = ckpt_lib.restore_fields(
      str(tmp_path), {"w": jax.ShapeDtypeStruct((4,), jnp.float32)})
  assert step == 10 and np.array_equal(fields["w"], np.ones(4))
  # Deleted as the line says: the step opens unranked.
  shutil.rmtree(tmp_path / "10" / "metrics")
  assert ckpt_lib.make_manager(str(tmp_path), max_to_keep=1).metrics(
      10) is None


def test_readers_restore_a_trm_state_without_puzzle_embeddings(tmp_path):
  """config.model.puzzle_emb_ndim=0: the puzzle table is an empty field, so
  the step holds none. trm.evaluate and trm.export refused every such
  checkpoint as "written by another model" (and named the same family on
  both sides); a config that wants a table still names the tensor."""
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  w = jnp.arange(4.0)
  ckpt_lib.save(manager, 2, {"params": {"w": w}, "ema_params": {"w": w + 1},
                             "buffers": {"b": w}, "puzzle_emb": {},
                             "carry": {"steps": jnp.zeros((2,), jnp.int32)}},
                _Iterator(), eval_loss=1.0, best_eval_loss=1.0)
  vector = jax.ShapeDtypeStruct((4,), jnp.float32)
  wanted = {"params": {"w": vector}, "ema_params": {"w": vector},
            "buffers": {"b": vector}}
  fields, step = ckpt_lib.restore_fields(
      str(tmp_path), {**wanted, "puzzle_emb": {}}, family="TRM (puzzle)")
  assert step == 2 and np.array_equal(fields["ema_params"]["w"], w + 1)
  with pytest.raises(ValueError, match=re.escape(
      "does not hold this config's model: missing puzzle_emb/weights")):
    ckpt_lib.restore_fields(
        str(tmp_path), {**wanted, "puzzle_emb": {"weights": jax.ShapeDtypeStruct(
            (3, 4), jnp.float32)}}, family="TRM (puzzle)")


@pytest.mark.parametrize("text,why", [
    ("[]", "Metadata dict must be a dictionary, but got list"),
    ('{"custom_metadata": 5}', "Object must be of type <class 'dict'>"),
    ('{"commit_timestamp_nsecs": "x"}', "Object must be of type <class "
     "'int'>")])
def test_a_step_metadata_of_the_wrong_shape_is_one_line_naming_it(
    tmp_path, text, why):
  """An older step's _CHECKPOINT_METADATA edited into JSON that is not
  Orbax's step metadata: the manager stopped with a bare `Metadata dict
  must be a dictionary, but got list`."""
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=2,
                                  async_save=False)
  for step in (10, 20):
    ckpt_lib.save(manager, step, {"w": jnp.ones((4,))}, _Iterator(),
                  eval_loss=1.0, best_eval_loss=1.0)
  path = tmp_path / "10" / "_CHECKPOINT_METADATA"
  path.write_text(text)
  before = _snapshot(str(tmp_path))
  with pytest.raises(ckpt_lib.CheckpointError) as error:
    ckpt_lib.make_manager(str(tmp_path), max_to_keep=2)
  message = str(error.value)
  assert "\n" not in message and why in message, message
  assert message.startswith(f"The metadata of checkpoint {tmp_path / '10'}"
                            f", {path}, is not Orbax's step metadata")
  assert f"move {tmp_path / '10'} out of {tmp_path}, and rerun" in message
  assert _snapshot(str(tmp_path)) == before


def test_a_null_step_metadata_is_opened_as_orbax_opens_it(tmp_path):
  """JSON `null` is no metadata to Orbax (its reader's None): the manager
  opens, ranks and saves as before, so it is not refused."""
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=2,
                                  async_save=False)
  for step in (10, 20):
    ckpt_lib.save(manager, step, {"w": jnp.ones((4,))}, _Iterator(),
                  eval_loss=1.0, best_eval_loss=1.0)
  (tmp_path / "10" / "_CHECKPOINT_METADATA").write_text("null")
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=2,
                                  async_save=False)
  assert manager.all_steps() == [10, 20]
  assert manager.metrics(10) == {ckpt_lib.EVAL_LOSS: 1.0}


def test_saves_a_killed_run_left_unfinished_are_removed(tmp_path, caplog):
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  ckpt_lib.save(manager, 10, {"w": jnp.ones((4,))}, _Iterator(),
                eval_loss=1.0, best_eval_loss=1.0)
  complete = _snapshot(str(tmp_path / "10"))
  abandoned = tmp_path / "15.orbax-checkpoint-tmp" / "state"
  abandoned.mkdir(parents=True)
  (abandoned / "chunk").write_bytes(b"x" * 2**20)
  with caplog.at_level("WARNING"):
    ckpt_lib.remove_abandoned_saves(str(tmp_path))
  assert sorted(os.listdir(tmp_path)) == ["10"]
  assert _snapshot(str(tmp_path / "10")) == complete
  assert (f"Removed 15.orbax-checkpoint-tmp in {tmp_path}: the unfinished "
          "save(s) of a run that was killed while saving (1.0 MiB)"
          ) in caplog.text


def test_a_failed_redone_eval_record_leaves_the_step_as_it_was(
    tmp_path, monkeypatch, caplog):
  """A redone evaluation that cannot be written into its step (a full disk)
  is a warning, not a stop, and changes no file of the step."""
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  ckpt_lib.save(manager, 10, {"w": jnp.ones((4,))}, _Iterator(),
                eval_owed=True)

  def files():
    return _snapshot(os.path.join(str(tmp_path), "10"))

  before = files()

  def full(path, *unused_args, **unused_kwargs):
    raise OSError(28, "No space left on device", path)

  monkeypatch.setattr(ckpt_lib.atomic_files, "atomic_write", full)
  with caplog.at_level("WARNING"):
    ckpt_lib.record_redone_eval(manager, 10, eval_loss=1.0,
                                best_eval_loss=1.0)
  assert "Could not record the redone evaluation in checkpoint" in caplog.text
  assert files() == before
  assert ckpt_lib.saved_eval_owed(manager, 10)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_state_is_never_written(tmp_path, bad):
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=3,
                                  async_save=False)
  good = {"w": jnp.ones((4,)), "count": jnp.int32(3)}
  ckpt_lib.save(manager, 1, good, _Iterator())
  poisoned = {"w": jnp.ones((4,)).at[2].set(bad), "count": jnp.int32(3)}
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"Not saving step 2 .* 1 leaves .*\['w'\].*"
                     r"complete steps: \[1\]"):
    ckpt_lib.save(manager, 2, poisoned, _Iterator())
  assert _steps(tmp_path) == [1]


def test_resume_after_preemption_keeps_the_best_checkpoint(
    tmp_path, monkeypatch):
  """nanoGPT's always_save_checkpoint=False with keep 1: the step saved on
  preemption must not make the resumed run forget its best loss (it used to
  read it from an eval file the preemption save does not write), or the
  next save would happen whatever the loss and delete the best step."""
  workdir = str(tmp_path / "run")
  config = tiny_config(tmp_path, learning_rate=0.0, min_lr=0.0,
                       max_iters=40, lr_decay_iters=40, eval_interval=10,
                       always_save_checkpoint=False, eval_at_start=False,
                       **{"keep_checkpoints": 1}, **ONE_AXIS)
  real_reached = preemption_lib.PreemptionWatch.reached  # pylint: disable=protected-access
  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached",  # pylint: disable=protected-access
                      lambda self, step: step == 15 or real_reached(self, step))
  with pytest.raises(train.Preempted,
                     match=r"Preempted at step 15 \(SIGTERM\); saved"):
    train.train_and_evaluate(config, workdir, families.build_task)
  checkpoints = os.path.join(workdir, "checkpoints")
  assert _steps(checkpoints) == [10, 15]
  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached", real_reached)  # pylint: disable=protected-access
  train.train_and_evaluate(config, workdir, families.build_task)
  # With a learning rate of 0 no later evaluation improves on step 10's: no
  # further save, and step 10 (the best) is still there.
  assert 10 in _steps(checkpoints)
  assert max(_steps(checkpoints)) == 15


def test_a_preemption_with_checkpoints_off_promises_no_resume(
    tmp_path, monkeypatch):
  """config.checkpoint_every=0 saves nothing, yet the stop line said "Rerun
  with the same --workdir to resume" and Orbax left an empty checkpoints/."""
  workdir = tmp_path / "run"
  config = tiny_config(tmp_path, max_iters=40, lr_decay_iters=40,
                       eval_interval=10, eval_at_start=False,
                       checkpoint_every=0, always_save_checkpoint=True,
                       **ONE_AXIS)
  real_reached = preemption_lib.PreemptionWatch.reached  # pylint: disable=protected-access
  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached",  # pylint: disable=protected-access
                      lambda self, step: step == 5 or real_reached(self, step))
  with pytest.raises(train.Preempted) as info:
    train.train_and_evaluate(config, str(workdir), families.build_task)
  assert str(info.value) == (
      "Preempted at step 5 (SIGTERM); no checkpoint saved "
      "(config.checkpoint_every=0): a rerun trains from the start again.")
  assert not (workdir / "checkpoints").exists()


def test_a_preemption_at_an_evaluation_step_owes_it(tmp_path, monkeypatch):
  """Preempted at step 10, an evaluation step, before its evaluation: the
  checkpoint records the debt and the resumed run evaluates step 10 first,
  with the loss an uninterrupted run gets there."""
  def run(workdir, preempt_at=None):
    config = tiny_config(tmp_path, max_iters=20, lr_decay_iters=20,
                         eval_interval=10, **ONE_AXIS)
    real = preemption_lib.PreemptionWatch.reached
    monkeypatch.setattr(
        preemption_lib.PreemptionWatch, "reached",
        lambda self, step: step == preempt_at or real(self, step))
    try:
      return train.train_and_evaluate(config, workdir, families.build_task)
    finally:
      monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached", real)

  straight = str(tmp_path / "straight")
  run(straight)
  workdir = str(tmp_path / "run")
  with pytest.raises(train.Preempted, match=r"Preempted at step 10"):
    run(workdir, preempt_at=10)
  assert not os.path.exists(os.path.join(workdir, "eval_10.json"))
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"),
                                  max_to_keep=5)
  assert ckpt_lib.saved_eval_owed(manager, 10)
  run(workdir)
  with open(os.path.join(workdir, "eval_10.json"), encoding="utf-8") as f:
    redone = json.load(f)
  with open(os.path.join(straight, "eval_10.json"), encoding="utf-8") as f:
    expected = json.load(f)
  assert redone["eval/loss"] == pytest.approx(expected["eval/loss"],
                                              rel=1e-6)
  assert os.path.exists(os.path.join(workdir, "eval_20.json"))
  # A step saved after its evaluation owes nothing.
  assert not ckpt_lib.saved_eval_owed(manager, 20)


def test_a_redone_evaluation_ranks_its_checkpoint(tmp_path, monkeypatch):
  """Step 10 saved owing its evaluation, and the resumed run lost (a crash)
  right after redoing it: checkpoint 10 now holds the redone loss as its
  Orbax metric, as the uninterrupted save would have, so keep-N keeps it
  against a worse later step; the run's best in its metadata includes it;
  and it owes nothing, so the next resume does not evaluate it again."""
  config = tiny_config(tmp_path, max_iters=20, lr_decay_iters=20,
                       eval_interval=10, keep_checkpoints=1, **ONE_AXIS)
  workdir = str(tmp_path / "run")
  checkpoints = os.path.join(workdir, "checkpoints")
  real_reached = preemption_lib.PreemptionWatch.reached

  def run(reached=real_reached):
    monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached", reached)
    try:
      return train.train_and_evaluate(config, workdir, families.build_task)
    finally:
      monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached",
                          real_reached)

  with pytest.raises(train.Preempted, match=r"Preempted at step 10"):
    run(lambda self, step: step == 10 or real_reached(self, step))

  def crash(self, step):  # at step 11, after the redone evaluation
    raise RuntimeError(f"host lost at step {step}")

  with pytest.raises(RuntimeError, match=r"host lost at step 11"):
    run(crash)
  with open(os.path.join(workdir, "eval_10.json"), encoding="utf-8") as f:
    redone = json.load(f)["eval/loss"]
  assert _steps(checkpoints) == [10]
  manager = ckpt_lib.make_manager(checkpoints, max_to_keep=1,
                                  async_save=False)
  assert manager.metrics(10) == {ckpt_lib.EVAL_LOSS: pytest.approx(redone)}
  assert ckpt_lib.saved_best_loss(manager, 10) == pytest.approx(redone)
  assert not ckpt_lib.saved_eval_owed(manager, 10)
  # Ranked: a later, worse step does not push it out (on a copy).
  copy = str(tmp_path / "copy")
  shutil.copytree(checkpoints, copy)
  ranked = ckpt_lib.make_manager(copy, max_to_keep=1, async_save=False)
  ckpt_lib.save(ranked, 30, {"w": jnp.ones((4,))}, _Iterator(),
                eval_loss=redone + 1.0, best_eval_loss=redone)
  assert _steps(copy) == [10, 30]
  # The next resume restores step 10 (its checksums still hold) and
  # evaluates only step 20.
  real_evaluate = train.evaluate
  calls = []
  monkeypatch.setattr(train, "evaluate",
                      lambda *args: calls.append(1) or real_evaluate(*args))
  state, _ = run()
  assert int(state.step) == 20
  assert len(calls) == 1


def _as_written_before_metrics_were_kept(checkpoints):
  """Makes every step of `checkpoints` look as trm wrote it before a step's
  held-out loss was kept on disk: no `metrics` item, none in its metadata."""
  for step in _steps(checkpoints):
    step_dir = os.path.join(checkpoints, str(step))
    shutil.rmtree(os.path.join(step_dir, "metrics"), ignore_errors=True)
    path = os.path.join(step_dir, "_CHECKPOINT_METADATA")
    with open(path, encoding="utf-8") as f:
      metadata = json.load(f)
    metadata["item_handlers"].pop("metrics", None)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(metadata, f)


def test_a_resume_ranks_checkpoints_written_without_their_loss(
    tmp_path, monkeypatch, caplog):
  """Step 10 (the best, keep 1) was written by a trm that kept no step's
  loss on disk, and the run stopped after it: the resumed run gives step 10
  the loss its evaluation recorded (eval_10.json) before its manager reads
  the steps, so its save of a worse step 20 keeps step 10; unranked, keep-N
  deleted it. (20 iterations, as the other tests here: the same compiled
  program.)"""
  config = tiny_config(tmp_path, max_iters=20, lr_decay_iters=20,
                       eval_interval=10, keep_checkpoints=1,
                       always_save_checkpoint=True, **ONE_AXIS)
  workdir = str(tmp_path / "run")
  checkpoints = os.path.join(workdir, "checkpoints")
  real_reached = preemption_lib.PreemptionWatch.reached

  def crash(self, step):
    if step == 11:
      raise RuntimeError(f"host lost at step {step}")
    return real_reached(self, step)

  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached", crash)
  with pytest.raises(RuntimeError, match=r"host lost at step 11"):
    train.train_and_evaluate(config, workdir, families.build_task)
  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached", real_reached)
  assert _steps(checkpoints) == [10]
  _as_written_before_metrics_were_kept(checkpoints)
  with open(os.path.join(workdir, "eval_10.json"), encoding="utf-8") as f:
    loss_10 = json.load(f)["eval/loss"]
  real_evaluate = train.evaluate

  def worse(*args):
    results = real_evaluate(*args)
    return dict(results, loss=results["loss"] + 10.0)

  monkeypatch.setattr(train, "evaluate", worse)
  with caplog.at_level("INFO"):
    train.train_and_evaluate(config, workdir, families.build_task)
  assert _steps(checkpoints) == [10, 20]
  assert "Ranked checkpoint(s) [10]" in caplog.text
  manager = ckpt_lib.make_manager(checkpoints, max_to_keep=1,
                                  async_save=False)
  assert manager.metrics(10) == {ckpt_lib.EVAL_LOSS: pytest.approx(loss_10)}
  assert manager.best_step() == 10


def test_a_broken_eval_file_leaves_its_step_unranked(tmp_path, caplog):
  """Steps written before their loss was kept on disk are ranked by their
  eval files, which anything may have replaced: each broken one leaves its
  step unranked, all of them in one warning, and none stops the run. A step
  owing its evaluation, one whose record of the run's best is above the
  file's loss (saved without it), one with no file and one with its metric
  already are left as they are."""
  checkpoints = str(tmp_path / "checkpoints")
  manager = ckpt_lib.make_manager(checkpoints, max_to_keep=20,
                                  async_save=False)
  broken = {10: b"\xff not JSON", 20: b'{"eval/loss": NaN}',
            30: b'{"eval/loss": "1.0"}', 40: b"[1.0]",
            50: b'{"eval/loss": true}', 60: b'{"eval/loss": 1e999}',
            70: b"[" * 100000, 80: b'{"eval/loss": 1' + b"0" * 400 + b"}",
            90: b"{}", 100: b" " * (2 << 20)}
  for step, text in broken.items():
    (tmp_path / f"eval_{step}.json").write_bytes(text)
  os.mkdir(tmp_path / "eval_110.json")
  os.mkfifo(tmp_path / "eval_120.json")  # a read would wait forever
  for step in (130, 140, 150, 160):
    (tmp_path / f"eval_{step}.json").write_text('{"eval/loss": 1.5}')
  state = {"w": jnp.ones((4,))}
  for step in (*broken, 110, 120, 130, 170):
    ckpt_lib.save(manager, step, state, _Iterator(), best_eval_loss=1.5)
  ckpt_lib.save(manager, 140, state, _Iterator(), eval_owed=True)
  ckpt_lib.save(manager, 150, state, _Iterator(), best_eval_loss=2.0)
  ckpt_lib.save(manager, 160, state, _Iterator(), eval_loss=3.0,
                best_eval_loss=1.5)
  steps = ckpt_lib.complete_steps(checkpoints)
  with caplog.at_level("WARNING"):
    ckpt_lib.rank_saved_steps(
        checkpoints, steps,
        lambda step: train._eval_file_loss(epath.Path(tmp_path), step))  # pylint: disable=protected-access
  # (Orbax warns once per process when it first registers its type
  # handlers: this test run alone saw it.)
  warnings = [r for r in caplog.records if r.levelname == "WARNING"
              and "orbax" not in r.pathname]
  assert len(warnings) == 1, caplog.text
  assert (f"Checkpoint(s) {[*broken, 110, 120]} in {checkpoints} stay "
          "unranked") in warnings[0].getMessage()
  reopened = ckpt_lib.make_manager(checkpoints, max_to_keep=20,
                                   async_save=False)
  assert {step: reopened.metrics(step) for step in steps
          if reopened.metrics(step)} == {130: {ckpt_lib.EVAL_LOSS: 1.5},
                                         160: {ckpt_lib.EVAL_LOSS: 3.0}}
  assert ckpt_lib.saved_eval_owed(reopened, 140)


def test_a_signal_during_the_final_evaluation(tmp_path, monkeypatch):
  """Stopped during the last step's evaluation: the step is saved, and the
  rerun (a finished run) evaluates it instead of training."""
  # (No evaluation of the starting weights: the second is the final one.)
  config = tiny_config(tmp_path, max_iters=20, lr_decay_iters=20,
                       eval_interval=10, eval_at_start=False, **ONE_AXIS)
  workdir = str(tmp_path / "run")
  real_evaluate = train.evaluate
  calls = []

  def signalled_second_time(*args):
    calls.append(1)
    stop = args[-1]
    if len(calls) == 2:  # the final evaluation: a SIGTERM arrives
      stop.__self__.signal_time = time.time()
    if len(calls) == 1:  # a diverged figure, as eval_10.json's null below
      return dict(real_evaluate(*args), perplexity=float("inf"))
    return real_evaluate(*args)

  monkeypatch.setattr(train, "evaluate", signalled_second_time)
  with pytest.raises(train.Preempted, match=r"Preempted at step 20 "
                     r"\(SIGTERM\); saved"):
    train.train_and_evaluate(config, workdir, families.build_task)
  monkeypatch.setattr(train, "evaluate", real_evaluate)
  assert not os.path.exists(os.path.join(workdir, "eval_20.json"))
  assert _steps(os.path.join(workdir, "checkpoints"))[-1] == 20
  # Strict JSON (Python wrote `Infinity`, which jq and others refuse).
  with open(os.path.join(workdir, "eval_10.json"), encoding="utf-8") as f:
    recorded = json.loads(f.read(), parse_constant=pytest.fail)
  assert recorded["eval/perplexity"] is None and recorded["eval/loss"] > 0
  state, results = train.train_and_evaluate(config, workdir,
                                            families.build_task)
  assert int(state.step) == 20
  assert "eval/loss" in results
  assert os.path.exists(os.path.join(workdir, "eval_20.json"))
  # The step's debt is settled: it holds the loss as its metric.
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"),
                                  max_to_keep=5)
  assert manager.metrics(20) == {
      ckpt_lib.EVAL_LOSS: pytest.approx(results["eval/loss"])}
  assert not ckpt_lib.saved_eval_owed(manager, 20)


def test_config_rejects_nonfinite_or_negative_rates(tmp_path):
  for key, value in (("learning_rate", float("inf")),
                     ("learning_rate", float("nan")),
                     ("min_lr", -1e-4), ("weight_decay", float("inf"))):
    config = tiny_config(tmp_path, **{key: value})
    with pytest.raises(ValueError, match=f"config.{key}=.* must be a finite"):
      train.check_config(config)


def test_a_floor_above_the_peak_rate_is_a_warning(tmp_path, caplog):
  # nanoGPT's get_lr runs it (a rising cosine); so does the run, saying so.
  with caplog.at_level("WARNING"):
    train.check_config(tiny_config(tmp_path, learning_rate=6e-5, min_lr=6e-4))
  assert "config.min_lr=0.0006 > config.learning_rate=6e-05" in caplog.text
  # Without the cosine, min_lr is unused.
  caplog.clear()
  with caplog.at_level("WARNING"):
    train.check_config(tiny_config(tmp_path, learning_rate=6e-5, min_lr=6e-4,
                                   decay_lr=False))
  assert "min_lr" not in caplog.text
  # A peak of 0 under a floor above it trains (the cosine rises to min_lr):
  # not the warning that the weights will not change.
  caplog.clear()
  with caplog.at_level("WARNING"):
    train.check_config(tiny_config(tmp_path, learning_rate=0.0, min_lr=6e-4))
  assert "config.min_lr=0.0006 > config.learning_rate=0" in caplog.text
  assert "will not change" not in caplog.text


def test_a_zero_peak_rate_is_a_warning(tmp_path, caplog):
  from test_train import tiny_config as trm_config  # pylint: disable=g-import-not-at-top
  for config, key in (
      (tiny_config(tmp_path, learning_rate=0.0, min_lr=0.0), "learning_rate"),
      (trm_config(**{"optim.lr": 0.0}), "optim.lr")):
    caplog.clear()
    with caplog.at_level("WARNING"):
      train.check_config(config)
    assert f"config.{key}=0: the weights will not change" in caplog.text
    config.eval_only = True
    caplog.clear()
    with caplog.at_level("WARNING"):
      train.check_config(config)
    assert "will not change" not in caplog.text
  caplog.clear()
  with caplog.at_level("WARNING"):
    train.check_config(tiny_config(tmp_path))
  assert "will not change" not in caplog.text


@pytest.fixture
def small_disk(tmp_path):
  """A 9 MiB tmpfs: room for one checkpoint of the tiny TRM, not two."""
  mount = tmp_path / "disk"
  mount.mkdir()
  made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=9M", "tmpfs",
                         str(mount)], capture_output=True, check=False)
  if made.returncode:
    pytest.skip("mounting a tmpfs needs root")
  yield mount
  subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_is_one_line_and_loses_nothing(small_disk, tmp_path):
  from test_reliability import _cli_flags  # pylint: disable=g-import-not-at-top
  from test_train import ROOT  # pylint: disable=g-import-not-at-top
  from test_train import tiny_config as trm_config  # pylint: disable=g-import-not-at-top
  # Two layers: `small_disk` holds one such checkpoint, not two.
  config = trm_config(**{"data.data_dir": str(tmp_path / "data"),
                         "mesh.data": 1, "mesh.fsdp": 1, "mesh.model": 1,
                         "model.L_layers": 2})
  workdir = small_disk / "run"
  command = [sys.executable, "-m", "trm.main",
             "--config=configs/trm_sudoku.py:cpu", f"--workdir={workdir}"
             ] + _cli_flags(config)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(1))
  full = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=600)
  assert full.returncode == 2, full.stderr[-3000:]
  assert "Traceback" not in full.stderr
  errors = [l for l in full.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, errors
  assert re.fullmatch(
      rf"trm\.main: error: Writing a checkpoint to {workdir}/checkpoints "
      r"failed \(no space left on device\); [0-9.]+ MiB free there\. Removed "
      r"the partial save \(12\.orbax-checkpoint-tmp\); the last good "
      rf"checkpoint, {workdir}/checkpoints/6, is kept\..*", errors[0])
  assert _steps(workdir / "checkpoints") == [6]
  assert os.listdir(workdir / "checkpoints") == ["6"]  # no partial left
  # More room: the rerun resumes from step 6 and finishes.
  subprocess.run(["mount", "-o", "remount,size=40M", str(small_disk)],
                 check=True)
  resumed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Restoring checkpoint" in resumed.stderr and "/6" in resumed.stderr
  assert 12 in _steps(workdir / "checkpoints")


_UNWRITABLE_SAVE = """
import subprocess, sys, time
import jax.numpy as jnp
from trm.core import checkpoint as ckpt_lib
class Iterator:
  def get_state(self):
    return {"position": 0}
directory = sys.argv[1]
manager = ckpt_lib.make_manager(directory, max_to_keep=1, async_save=True)
ckpt_lib.save(manager, 1, {"w": jnp.ones(4)}, Iterator())
ckpt_lib.wait_until_finished(manager)
subprocess.run(["chattr", "+i", directory], check=True)
try:
  ckpt_lib.save(manager, 2, {"w": jnp.ones(4)}, Iterator())
  ckpt_lib.wait_until_finished(manager)
except ckpt_lib.CheckpointError as e:
  print("ERROR", e, flush=True)
finally:
  subprocess.run(["chattr", "-i", directory], check=True)
print("EXITING", time.time(), flush=True)
"""


def test_an_unwritable_checkpoint_directory_does_not_hang_the_exit(tmp_path):
  """A checkpoint directory that turns unwritable mid-run (a disk remounted
  read-only, `chattr +i` here): the error was printed, then the process
  hung at exit for 20 minutes, Orbax's commit threads waiting for the
  signal of a step directory its background thread had failed to make."""
  directory = tmp_path / "checkpoints"
  directory.mkdir()
  probe = subprocess.run(["chattr", "+i", str(directory)],
                         capture_output=True, check=False)
  if probe.returncode:
    pytest.skip("chattr +i needs root and a file system that has it")
  subprocess.run(["chattr", "-i", str(directory)], check=True)
  from test_train import ROOT  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  try:
    done = subprocess.run([sys.executable, "-c", _UNWRITABLE_SAVE,
                           str(directory)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=90)
  except subprocess.TimeoutExpired:
    pytest.fail("the process did not exit after the failed save")
  finally:
    subprocess.run(["chattr", "-i", str(directory)], check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  errors = [l for l in done.stdout.splitlines() if l.startswith("ERROR")]
  assert len(errors) == 1, done.stdout
  assert errors[0].startswith(
      f"ERROR Writing a checkpoint to {directory} failed (PermissionError: ")
  # Not "Free space (or fix the cause)" with the MiB free, as for a full
  # disk.
  assert errors[0].endswith(
      f"The last good checkpoint, {directory / '1'}, is kept. Make "
      f"{directory} writable and rerun to resume."), errors[0]
  assert "MiB free" not in errors[0]
  assert "EXITING" in done.stdout
  assert _steps(directory) == [1]


# What both two-process workers start with: a step's state sharded over
# both processes' devices, and the part of an iterator a save reads.
_WORKER_STATE = workers_lib.JOIN + """
import os
import jax.numpy as jnp
import numpy as np
from trm.core import checkpoint as ckpt_lib

class Iterator:
  def get_state(self):
    return {{"position": 0}}

mesh = jax.sharding.Mesh(np.array(jax.devices()), ("d",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
state = {{"w": jax.make_array_from_callback(
    (8,), sharding, lambda i: np.arange(8, dtype=np.float32)[i])}}
"""

# Two processes save a step owing its evaluation, record the evaluation
# (process 0 writes) with its early-stopping count, and keep it as the best
# against a worse later step; they agree to stop when one says so (as early
# stopping asks them), then resume from step 10 (config.resume_step: process
# 0 moves step 20 aside, both then see 10 alone).
_REDONE_WORKER = _WORKER_STATE + """
from trm.core import preemption
manager = ckpt_lib.make_manager({directory!r}, max_to_keep=1,
                                async_save=False)
ckpt_lib.save(manager, 10, state, Iterator(), eval_owed=True,
              early_stopping={{"best": None, "count": 0}})
ckpt_lib.record_redone_eval(manager, 10, eval_loss=1.0, best_eval_loss=1.0,
                            early_stopping={{"best": 1.0, "count": 1}})
owed = ckpt_lib.saved_eval_owed(manager, 10)
count = ckpt_lib.saved_early_stopping(manager, 10)["count"]
best = manager.best_step()
ckpt_lib.save(manager, 20, state, Iterator(), eval_loss=2.0,
              best_eval_loss=1.0)
manager.wait_until_finished()
steps = lambda: sorted(int(d) for d in os.listdir({directory!r})
                       if d.isdigit())
saved = steps()
stop = preemption.any_process(jax.process_index() == 1)
ckpt_lib.resume_from_step(os.path.dirname({directory!r}), 10)
print("RESULT", jax.process_index(), owed, best, saved, count, stop, steps(),
      flush=True)
"""

# Two processes: step 10, saved without its loss (as before the metrics were
# kept on disk), is ranked before their managers open (process 0 writes),
# and both keep it as the best against a worse later step.
_RANK_WORKER = _WORKER_STATE + """
old = ckpt_lib.make_manager({directory!r}, max_to_keep=1, async_save=False)
ckpt_lib.save(old, 10, state, Iterator(), best_eval_loss=1.0)
old.close()
ckpt_lib.rank_saved_steps({directory!r}, [10], lambda step: 1.0)
manager = ckpt_lib.make_manager({directory!r}, max_to_keep=1,
                                async_save=False)
best = manager.best_step()
ckpt_lib.save(manager, 20, state, Iterator(), eval_loss=2.0,
              best_eval_loss=1.0)
manager.wait_until_finished()
print("RESULT", jax.process_index(), best, sorted(
    int(d) for d in os.listdir({directory!r}) if d.isdigit()), flush=True)
"""


def _two_workers(worker: str, directory: str) -> list[str]:
  """The sorted RESULT lines of `worker` run by two processes."""
  address = f"127.0.0.1:{workers_lib.free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(4))
  from test_train import ROOT  # pylint: disable=g-import-not-at-top
  workers = [subprocess.Popen(
      [sys.executable, "-c", worker.format(
          directory=directory, process_id=i, address=address)],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True) for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=300)
  for worker_process, output in zip(workers, outputs):
    assert worker_process.returncode == 0, output[-3000:]
  return sorted(line for output in outputs for line in output.splitlines()
                if line.startswith("RESULT"))


def test_rewind_folders_are_utc_sort_as_made_and_never_collide(
    tmp_path, monkeypatch):
  """config.resume_step's checkpoints_abandoned/<time> names: UTC (a
  daylight-saving fall-back repeats no local hour), to the nanosecond,
  with a counter where one is taken (before: local seconds, and an 11th
  rewind in one second took the 10th's name); the newest rewind is found
  past folders named the old way."""
  monkeypatch.setenv("TZ", "America/New_York")
  time.tzset()
  monkeypatch.setattr(time, "time_ns", lambda: 1793511000_000000005)
  made = []
  try:
    for step in range(12):
      folder = ckpt_lib._new_folder(tmp_path)  # pylint: disable=protected-access
      ckpt_lib._record_rewind(folder, step, [], [])  # pylint: disable=protected-access
      made.append(folder.name)
  finally:
    monkeypatch.undo()
    time.tzset()
  # 2026-11-01 05:30:00.000000005 UTC: 01:30 EST, the hour repeated.
  assert made[0] == "20261101T053000.000000005Z"
  assert made[1:3] == [f"{made[0]}-000001", f"{made[0]}-000002"]
  assert len(set(made)) == 12 and sorted(made) == made
  os.makedirs(tmp_path / ckpt_lib.ABANDONED / "20261101-235959")  # local
  ckpt_lib._record_rewind(  # pylint: disable=protected-access
      tmp_path / ckpt_lib.ABANDONED / "20261101-235959", 99, [], [])
  folder, record = ckpt_lib._last_rewind(tmp_path)  # pylint: disable=protected-access
  assert (folder.name, record["resume_step"]) == (made[-1], 11)
  assert record["time"].endswith(" UTC")


def test_two_processes_record_a_redone_evaluation(tmp_path):
  results = _two_workers(_REDONE_WORKER, str(tmp_path / "checkpoints"))
  # Every process's manager sees the metric (10 is its best), the count and
  # no debt; the save of worse step 20 keeps 10; process 1's stop is both
  # processes'; resuming from 10 moved 20 aside once, for both.
  assert results == ["RESULT 0 False 10 [10, 20] 1 True [10]",
                     "RESULT 1 False 10 [10, 20] 1 True [10]"]
  assert os.listdir(next((tmp_path / ckpt_lib.ABANDONED).iterdir())
                    / "checkpoints") == ["20"]


def test_two_processes_rank_a_step_written_without_its_loss(tmp_path):
  results = _two_workers(_RANK_WORKER, str(tmp_path / "checkpoints"))
  assert results == ["RESULT 0 10 [10, 20]", "RESULT 1 10 [10, 20]"]


def test_a_peer_lost_is_recognised_whatever_type_carries_it():
  """Reproduced (session 64, 1 of ~20 SIGKILLs of process 1): the gloo
  error reached cli.run as a ValueError, not jax's runtime error, so process
  0 took the generic exit and aborted in jax's shutdown barrier ~90 s later.
  Session 65 found the source: jit's dispatch of process_allgather's program
  (in preemption.reached) raises a failure during the call as ValueError.
  Its text, or its cause's, is what counts."""
  text = ("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/"
          "tcp/pair.cc:538] Read error [127.0.0.1]:38326: Connection reset "
          "by peer")
  assert cli.peer_lost(ValueError(text)) and cli.peer_lost(OSError(text))
  try:
    try:
      raise RuntimeError(text)
    except RuntimeError as e:
      raise ValueError("fetching the metrics failed") from e
  except ValueError as wrapped:
    assert cli.peer_lost(wrapped)
  assert not cli.peer_lost(ValueError("Connection reset by peer"))  # no gloo
  assert not cli.peer_lost(ValueError("Gloo AllGather failed: a bad shape"))


def test_a_peer_lost_during_a_save_is_not_reported_as_a_disk_error(tmp_path):
  """Process 1 killed while a checkpoint was being written: process 0 said
  "Writing a checkpoint ... failed (... Connection closed by peer); ... MiB
  free there ... Free space (or fix the cause)", then aborted a minute
  later. The collective's error now goes to cli.run, whose one line names
  the lost process."""

  class JaxRuntimeError(RuntimeError):  # jax's type, by name
    pass

  lost = JaxRuntimeError(
      "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/"
      "pair.cc:547] Connection closed by peer [127.0.0.1]:56214")

  class Manager:
    directory = tmp_path

    def check_for_errors(self):
      raise lost

  with pytest.raises(JaxRuntimeError) as raised:
    ckpt_lib.check_async_errors(Manager())
  assert raised.value is lost and cli.peer_lost(raised.value)


def _fake_checkpoints(directory, losses: dict):
  """Step directories as a trainer leaves them, each with its held-out loss
  record (`<step>/metrics/metrics`) where `losses` gives one."""
  for step, loss in losses.items():
    os.makedirs(directory / str(step))
    if loss is not None:
      os.makedirs(directory / str(step) / "metrics")
      (directory / str(step) / "metrics" / "metrics").write_text(
          json.dumps({ckpt_lib.EVAL_LOSS: loss}))


def test_a_resume_that_changes_best_metric_ranks_again_from_eval_files(
    tmp_path, caplog):
  """Steps ranked by eval/loss, resumed with config.best_metric=
  'eval/accuracy' (auto: max): each is ranked again by its eval file's
  accuracy (negated: lower is better), tagged with the metric, so keep-N
  and --step=best take the most accurate step; one whose file lacks the
  metric is no longer ranked (its loss rank must not stand); a step
  already ranked by the new metric is left as it is."""
  from trm.core import best_metric  # pylint: disable=g-import-not-at-top
  checkpoints = str(tmp_path / "checkpoints")
  manager = ckpt_lib.make_manager(checkpoints, max_to_keep=20,
                                  async_save=False)
  state = {"w": jnp.ones((4,))}
  figures = {10: (1.0, 0.5), 20: (0.5, 0.25), 30: (2.0, None)}
  for step, (loss, accuracy) in figures.items():
    (tmp_path / f"eval_{step}.json").write_text(json.dumps(
        {"eval/loss": loss, **({} if accuracy is None
                               else {"eval/accuracy": accuracy})}))
    ckpt_lib.save(manager, step, state, _Iterator(), eval_loss=loss,
                  best_eval_loss=0.5)
  metric = best_metric.spec({"best_metric": "accuracy"})
  assert metric == ("eval/accuracy", "max")
  tag = best_metric.tag(metric)
  ckpt_lib.save(manager, 40, state, _Iterator(), eval_loss=-0.3,
                best_eval_loss=-0.5, metric_tag=tag)
  # A nanoGPT export's best_val_loss is a loss: not an accuracy's score.
  assert ckpt_lib.read_best_loss(checkpoints, 10) == 0.5
  assert ckpt_lib.read_best_loss(checkpoints, 40) is None
  with caplog.at_level("INFO"):
    ckpt_lib.rank_saved_steps(
        checkpoints, [10, 20, 30, 40],
        lambda step: train._eval_file_loss(epath.Path(tmp_path), step,  # pylint: disable=protected-access
                                           metric), metric)
  assert "Checkpoint(s) [30] in" in caplog.text
  assert "Ranked checkpoint(s) [10, 20]" in caplog.text
  reopened = ckpt_lib.make_manager(checkpoints, max_to_keep=1,
                                   async_save=False)
  assert {step: reopened.metrics(step) for step in (10, 20, 30, 40)} == {
      10: {ckpt_lib.EVAL_LOSS: -0.5, best_metric.TAG: tag},
      20: {ckpt_lib.EVAL_LOSS: -0.25, best_metric.TAG: tag},
      30: None, 40: {ckpt_lib.EVAL_LOSS: -0.3, best_metric.TAG: tag}}
  assert reopened.best_step() == 10
  assert ckpt_lib.choose_step(checkpoints, "best") == 10
  assert ckpt_lib.saved_metric(reopened, 40) == metric
  assert ckpt_lib.saved_metric(reopened, 10) == best_metric.DEFAULT
  # Back to eval/loss, with one record damaged meanwhile: the others are
  # ranked again; the damaged one is left for the manager to name.
  (tmp_path / "checkpoints" / "20" / "metrics" / "metrics").write_text("{")
  caplog.clear()
  with caplog.at_level("INFO"):
    ckpt_lib.rank_saved_steps(
        checkpoints, [10, 20, 30, 40],
        lambda step: train._eval_file_loss(epath.Path(tmp_path), step))  # pylint: disable=protected-access
  assert "Ranked checkpoint(s) [10, 30]" in caplog.text  # 40: no eval file
  assert "Checkpoint(s) [40] in" in caplog.text
  assert "Could not rank" not in caplog.text
  assert ckpt_lib.read_record(tmp_path / "checkpoints" / "10" / "metrics" /
                              "metrics") == {ckpt_lib.EVAL_LOSS: 1.0}
  with pytest.raises(ckpt_lib.CheckpointError, match=r"20/metrics/metrics"):
    ckpt_lib.make_manager(checkpoints, max_to_keep=1)


def test_step_flag_chooses_latest_best_or_a_step_on_disk(tmp_path):
  """--step of trm.generate, trm.evaluate, trm.export and trm.sample: best
  is the step with the lowest held-out loss, a tie going to the newest (the
  one Orbax's keep-best policy keeps); a step not on disk, a best with no
  ranked step and a bad value are one line, before any weight is read."""
  from absl import app  # pylint: disable=g-import-not-at-top
  parse = cli._StepParser().parse  # pylint: disable=protected-access
  assert (parse("Best"), parse("latest"), parse("0020")) == ("best",
                                                             "latest", 20)
  for bad in ("-1", "1e3", "²", "", "newest"):
    with pytest.raises(ValueError, match="none of latest, best or a step"):
      parse(bad)
  workdir = tmp_path / "run"
  directory = workdir / "checkpoints"
  _fake_checkpoints(directory, {10: 2.0, 20: 1.5, 30: None, 40: 1.5,
                                50: 3.0})
  os.makedirs(directory / "60.orbax-checkpoint-tmp")  # not a step
  assert cli.workdir_step(str(workdir), "latest") is None
  assert cli.workdir_step(str(workdir), "best") == 40
  assert cli.workdir_step(str(workdir), 30) == 30
  with pytest.raises(FileNotFoundError, match=re.escape(
      r"--step=25: " + f"{directory} has no step 25 (its steps: "
      "[10, 20, 30, 40, 50])")):
    cli.workdir_step(str(workdir), 25)
  with pytest.raises(app.UsageError, match=re.escape(
      f"is one checkpoint of the trm.main workdir {workdir}: pass "
      f"--workdir={workdir} --step=20.")):  # for every --step
    cli.workdir_step(str(directory / "20"), "latest", "--workdir")
  with pytest.raises(app.UsageError, match=r"--checkpoint=.*hf is not one"):
    cli.workdir_step(str(tmp_path / "hf"), "best")
  assert cli.workdir_step(str(tmp_path / "hf"), "latest") is None
  (directory / "20" / "metrics" / "metrics").write_text("{")
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"20/metrics/metrics is damaged"):
    cli.workdir_step(str(workdir), "best")
  unranked = tmp_path / "unranked" / "checkpoints"
  _fake_checkpoints(unranked, {6: None, 12: None})
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"steps \[6, 12\].*config\.eval_every"):
    ckpt_lib.choose_step(str(unranked), "best")


def test_step_best_refusals_name_the_runs_best_metric(tmp_path):
  """A run ranked by config.best_metric='accuracy' (its steps' metadata
  say so): --step=best's refusals name that metric, not a held-out loss,
  and a damaged record's advice writes its negated score, tagged."""
  from trm.core import best_metric  # pylint: disable=g-import-not-at-top
  metric = best_metric.spec({"best_metric": "accuracy"})
  directory = tmp_path / "checkpoints"
  _fake_checkpoints(directory, {6: None, 12: None})
  for step in (6, 12):
    (directory / str(step) / "_CHECKPOINT_METADATA").write_text(json.dumps(
        {"custom_metadata": {best_metric.TAG: best_metric.tag(metric)}}))
  with pytest.raises(ckpt_lib.CheckpointError, match=re.escape(
      "has a config.best_metric='eval/accuracy' score to rank it by")):
    ckpt_lib.choose_step(str(directory), "best")
  os.makedirs(directory / "12" / "metrics")
  (directory / "12" / "metrics" / "metrics").write_text("{")
  with pytest.raises(ckpt_lib.CheckpointError, match=re.escape(
      "the config.best_metric='eval/accuracy' score record")) as e:
    ckpt_lib.choose_step(str(directory), "best")
  assert ("write the step's eval/accuracy from eval_12.json in the workdir, "
          'negated (higher is better), there as {"eval_loss": <number>, '
          '"best_metric": {"name": "eval/accuracy", "mode": "max"}}.'
          ) in str(e.value)


def test_resume_step_at_the_newest_is_recorded_so_a_restart_keeps_on(
    tmp_path):
  """config.resume_step=N with N the newest step moves nothing, but its
  restart (a job keeps its flags) must not take the steps trained since for
  newer ones: before, nothing recorded the plain resume, and the restart
  moved them aside, back to N at every restart."""

  def saved(step):
    for name in ckpt_lib._COMMITTED_FILES:  # pylint: disable=protected-access
      path = tmp_path / "checkpoints" / str(step) / name
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text("")

  saved(10)
  saved(20)
  ckpt_lib.resume_from_step(str(tmp_path), 20)  # the newest: a plain resume
  assert _steps(tmp_path / "checkpoints") == [10, 20]
  saved(30)  # trained by that run
  ckpt_lib.resume_from_step(str(tmp_path), 20)  # the job restarted
  assert _steps(tmp_path / "checkpoints") == [10, 20, 30]
  # Another step asked is a rewind as before (step 30 moved aside).
  ckpt_lib.resume_from_step(str(tmp_path), 10)
  assert _steps(tmp_path / "checkpoints") == [10]
  # keep_checkpoints deleted step 10 once the run saved newer ones: the
  # restart was refused ("no complete step 10"), though its preemption
  # had said to rerun the same command.
  import shutil  # pylint: disable=g-import-not-at-top
  saved(40)
  saved(50)
  shutil.rmtree(tmp_path / "checkpoints" / "10")
  ckpt_lib.resume_from_step(str(tmp_path), 10)
  assert _steps(tmp_path / "checkpoints") == [40, 50]
  # A step never applied, missing, is still one line.
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"resume_step=30: .* has no complete step 30 "
                           r"\(its steps: \[40, 50\]\)"):
    ckpt_lib.resume_from_step(str(tmp_path), 30)


def test_a_step_that_is_a_link_to_no_directory_is_refused_up_front(tmp_path):
  """checkpoints/20 as a dangling link: the run trained to step 20 again,
  then failed to save there ("Not a directory", with advice to free
  space), at every rerun. A plain file in its place is replaced by the
  save, as before."""
  directory = tmp_path / "checkpoints"
  directory.mkdir()
  (directory / "10").mkdir()
  (directory / "15").write_text("x")  # replaced by the save's rename
  (directory / "30.orbax-checkpoint-tmp").symlink_to(tmp_path / "gone")
  ckpt_lib.check_step_entries(directory)
  (directory / "20").symlink_to(tmp_path / "gone")
  with pytest.raises(ckpt_lib.CheckpointError) as error:
    ckpt_lib.check_step_entries(directory)
  assert str(error.value) == (
      f"{directory}/20 is a dangling symbolic link, not a checkpoint: "
      "saving step 20 there would fail once the run has trained to it. Move "
      f"it out of {directory} and rerun.")
  (directory / "20").unlink()
  (directory / "20").symlink_to(directory / "15")
  with pytest.raises(ckpt_lib.CheckpointError,
                     match="20 is a symbolic link to a file"):
    ckpt_lib.check_step_entries(directory)
  (directory / "20").unlink()
  (directory / "20").symlink_to(directory / "10")  # a linked checkpoint
  ckpt_lib.check_step_entries(directory)
