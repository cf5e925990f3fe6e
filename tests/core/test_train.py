"""End-to-end: the loss falls, a crashed run resumes bit-exactly, bad
configs fail early with clear messages. 8 CPU devices: mesh 2x2x2 where
the sharding is checked, 8x1x1 for the resume runs (`ONE_AXIS`)."""
import json
import logging
import os
import re
import shutil
import subprocess
import sys

from flax.core import meta as nn_meta
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import repo

from trm.core import checkpoint as ckpt_lib
from trm.core import config_lib
from trm.core import dispatch
from trm.core import mesh as mesh_lib
from trm.core import train
from trm.core import weights_io
from trm import families
from trm.core import pipeline
from trm.core import state as state_lib
from trm.families.trm import task as puzzle

ROOT = repo.ROOT


def tiny_config(**overrides):
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "trm_sudoku.py"), "cpu")
  # One layer: the trainer's tests exercise the loop, not the depth (the
  # model's tests cover two), and a second layer cost a third of each
  # tiny run (25 -> 17 s for 24 steps, BUILD_NOTES "Session 63").
  config.model.update(hidden_size=32, num_heads=2, puzzle_emb_ndim=32,
                      halt_max_steps=2, L_layers=1)
  config.data.build.update(num_train=256, num_test=32, num_blanks=30)
  config.data.update(eval_batch_size=16)
  config.optim.update(warmup_steps=5)
  config.mesh.update(data=2, fsdp=2, model=2)
  config.update(global_batch_size=16, total_steps=12, eval_every=12,
                checkpoint_every=6, log_every=3)
  return config_lib.set_values(config, overrides)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """One generated dataset shared by the tests (built by the trainer)."""
  path = str(tmp_path_factory.mktemp("sudoku"))
  puzzle.prepare_data(tiny_config(**{"data.data_dir": path}), path)
  return path


def _params(state):
  return jax.tree.map(np.asarray, jax.device_get(state.params))


# A data-parallel mesh for the runs whose subject is not the weights'
# sharding (resumes, metrics, disk errors): a step whose collectives span
# one group of devices goes into the session's compilation cache, so the
# second and later runs of the same tiny model load it instead of compiling
# it again (the 2x2x2 mesh's step is compiled afresh by every run:
# trm/core/cpu_collectives.py). test_loss_falls_and_state_is_sharded and
# test_init_checkpoint_... keep the 2x2x2 mesh (the latter restores this
# run's checkpoint onto it); the tiny runs of test_cli, test_reliability,
# test_config_record and test_resume_changes use this one too, so in the
# CI most of them load the same step.
ONE_AXIS = {"mesh.data": 8, "mesh.fsdp": 1, "mesh.model": 1}


def _run_config(data_dir):
  """The 12-step run the resume tests compare with: checkpoints at 6 and
  12, logs every 4 (so steps 5 and 6 are logged at the checkpoint), on
  the data-parallel mesh (`ONE_AXIS`)."""
  return tiny_config(**{"data.data_dir": data_dir, "log_every": 4,
                        **ONE_AXIS})


@pytest.fixture(scope="module")
def finished_run(data_dir, tmp_path_factory):
  """`_run_config` trained once, uninterrupted, for the tests that compare
  a crashed, killed or rewritten run with it: (its workdir, its final state
  on the host, {step: the train/loss steps on disk when it was saved}).
  Tests copy the workdir before writing to it."""
  workdir = tmp_path_factory.mktemp("straight")
  on_disk = {}
  real_save = ckpt_lib.save

  def save(manager, step, *args, **kwargs):
    on_disk[step] = _train_steps_on_disk(workdir)
    return real_save(manager, step, *args, **kwargs)

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(train.ckpt_lib, "save", save)
    state, _ = train.train_and_evaluate(_run_config(data_dir), str(workdir),
                                        families.build_task)
  return workdir, jax.tree.map(np.asarray, jax.device_get(state)), on_disk


def _assert_resumed_equal(reference, resumed):
  """The params, carry and puzzle table of `resumed` are `reference`'s."""
  for a, b in zip(jax.tree.leaves(reference.params),
                  jax.tree.leaves(_params(resumed))):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(np.asarray(reference.carry.z_H),
                                np.asarray(resumed.carry.z_H))
  np.testing.assert_array_equal(
      np.asarray(reference.puzzle_emb["weights"]),
      np.asarray(resumed.puzzle_emb["weights"]))


def test_loss_falls_and_state_is_sharded(tmp_path, data_dir, monkeypatch,
                                        caplog):
  in_flight = []  # the unfinished calls after each train and eval step

  class RecordingBound(dispatch.DispatchBound):
    def __call__(self, outputs):
      outputs = super().__call__(outputs)
      in_flight.append(len(self))
      return outputs

  monkeypatch.setattr(train.dispatch, "DispatchBound", RecordingBound)
  # Steps 3-4 traced by jax.profiler (MaxText's profiler window): none was
  # configurable before.
  # Checkpoints off (MaxText's enable_checkpointing=False): none was, not
  # even the last step's (a pod benchmark wrote a 22B model's ~260 GB).
  config = tiny_config(**{"data.data_dir": data_dir, "total_steps": 24,
                          "eval_every": 24, "log_every": 4,
                          "optim.lr": 3e-3, "profiler_steps": 2,
                          "skip_first_n_steps_for_profiler": 2,
                          "checkpoint_every": 0})
  with caplog.at_level(logging.WARNING):
    state, results = train.train_and_evaluate(config, str(tmp_path),
                                              families.build_task)
  assert ("config.checkpoint_every=0: this run writes no checkpoint, not at "
          "step 24 (config.total_steps) nor on preemption") in caplog.text
  assert int(state.step) == 24
  assert ckpt_lib.complete_steps(tmp_path / "checkpoints") == []
  # Not even an empty checkpoints/ (Orbax made one).
  assert not (tmp_path / "checkpoints").exists()
  traces = list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0, traces
  # 24 train steps and 2 eval batches, never more than 2 of them unfinished.
  assert len(in_flight) == 26 and max(in_flight) == 2, in_flight
  kernel = state.params["L_level"]["layers_0"]["mlp"]["gate_up_proj"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "model")
  assert "eval/blank_accuracy" in results
  assert (tmp_path / "eval_24.json").exists()
  # Train loss from the TensorBoard logs: the last interval is below the first.
  from tensorboard.backend.event_processing import event_accumulator
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  losses = [float(tensor_util.make_ndarray(e.tensor_proto))
            for e in events.Tensors("train/lm_loss")]
  # Every 4 steps (no checkpoint logs the steps since the last log: see
  # test_metrics_up_to_a_checkpoint_are_on_disk_before_it_is_saved).
  assert [e.step for e in events.Tensors("train/lm_loss")] == [
      4, 8, 12, 16, 20, 24]
  # The same figures as JSON lines (MaxText's metrics_file), strictly parsed.
  records = _metrics_jsonl(tmp_path)
  assert [r["step"] for r in records if "train/lm_loss" in r] == [
      4, 8, 12, 16, 20, 24]
  np.testing.assert_allclose(
      [r["train/lm_loss"] for r in records if "train/lm_loss" in r],
      [float(tensor_util.make_ndarray(e.tensor_proto))
       for e in events.Tensors("train/lm_loss")], rtol=1e-6)
  assert [r["step"] for r in records if "eval/loss" in r] == [24]
  assert losses[-1] < losses[0] - 0.1, losses
  # The learning rate of each logged step's update, as AdamATan2 took it
  # from the schedule (count = the steps applied before it): not logged
  # before, where upstream logs train/lr every step.
  from trm.families.trm import optim  # pylint: disable=g-import-not-at-top
  schedule = optim.lr_schedule(3e-3, config.optim.warmup_steps, 24,
                               config.optim.lr_min_ratio)
  rates = {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
           for e in events.Tensors("train/lr")}
  assert list(rates) == [4, 8, 12, 16, 20, 24]
  np.testing.assert_allclose(list(rates.values()),
                             [float(schedule(s - 1)) for s in rates],
                             rtol=1e-6)
  assert rates[4] < rates[8]  # warming up to step 5


def test_crash_and_resume_matches_uninterrupted_run(tmp_path, data_dir,
                                                    finished_run,
                                                    monkeypatch):
  config = _run_config(data_dir)
  _, reference, _ = finished_run

  # Crash while fetching the batch of step 9, after the step-6 checkpoint.
  real_to_global = pipeline.to_global
  calls = {"n": 0}

  def crashing_to_global(batch, shardings):
    calls["n"] += 1
    if calls["n"] == 9:
      raise RuntimeError("simulated crash")
    return real_to_global(batch, shardings)

  workdir = str(tmp_path / "crashed")
  monkeypatch.setattr(pipeline, "to_global", crashing_to_global)
  with pytest.raises(RuntimeError, match="simulated crash"):
    train.train_and_evaluate(config, workdir, families.build_task)
  monkeypatch.setattr(pipeline, "to_global", real_to_global)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["6"]
  # And a save killed half-written at a step the resumed run never saves
  # (a preemption's at 9): Orbax removed such a directory only when it
  # saved that step again, so its disk space was lost for good.
  abandoned = os.path.join(workdir, "checkpoints", "9.orbax-checkpoint-tmp")
  os.makedirs(os.path.join(abandoned, "state"))
  with open(os.path.join(abandoned, "state", "chunk"), "wb") as f:
    f.write(b"x" * 4096)

  resumed, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert int(resumed.step) == 12
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
      "12", "6"]
  _assert_resumed_equal(reference, resumed)


def test_an_evaluation_killed_before_its_checkpoint_stays_in_metrics_jsonl(
    tmp_path, data_dir, finished_run):
  """Killed after step 12's evaluation (eval_12.json and its records
  written) but before checkpoint 12 committed: the rerun resumed from 6,
  dropped metrics.jsonl's records past 6 to write them again, found its
  evaluation at 12 equal to eval_12.json and wrote it to no writer, so
  metrics.jsonl lost the step's evaluation for good (TensorBoard kept it
  in the killed run's events file)."""
  import shutil  # pylint: disable=g-import-not-at-top
  reference_dir, _, _ = finished_run
  workdir = tmp_path / "killed"
  shutil.copytree(reference_dir, workdir)
  shutil.rmtree(workdir / "checkpoints" / "12")
  reference = _metrics_jsonl(reference_dir)
  assert [r["step"] for r in reference if "eval/loss" in r] == [12]
  train.train_and_evaluate(_run_config(data_dir), str(workdir),
                           families.build_task)
  records = _metrics_jsonl(workdir)
  evals = [r for r in records if "eval/loss" in r]
  assert [r["step"] for r in evals] == [12]
  want = next(r for r in reference if "eval/loss" in r)
  assert {k: v for k, v in evals[0].items() if k != "eval/seconds"} == {
      k: v for k, v in want.items() if k != "eval/seconds"}


def test_a_trainer_whose_workdir_was_taken_over_saves_no_more(
    tmp_path, data_dir, monkeypatch):
  """Once its lock's renewal finds another trainer's record (it stalled past
  the lease), the trainer stops before its next save instead of writing
  over that trainer's checkpoints (tests/core/test_workdir_lock.py has the
  renewal's side)."""
  from trm.core import workdir_lock  # pylint: disable=g-import-not-at-top
  checks = []
  real_check = workdir_lock.WorkdirLock.check_held

  def check_held(lock):
    checks.append(lock.path)
    if len(checks) == 2:  # taken over between the two saves
      lock.taken_over = {"host": "host-b", "pid": 4321, "started": 0.0}
    real_check(lock)

  monkeypatch.setattr(workdir_lock.WorkdirLock, "check_held", check_held)
  workdir = tmp_path / "run"
  with pytest.raises(workdir_lock.WorkdirLockedError,
                     match="stopping without saving"):
    train.train_and_evaluate(_run_config(data_dir), str(workdir),
                             families.build_task)
  assert len(checks) == 2
  assert ckpt_lib.complete_steps(workdir / "checkpoints") == [6]


def _train_loss_events(workdir, tag="train/loss") -> list:
  """The `tag` events in `workdir`'s events files, as TensorBoard reads
  them now."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(str(workdir))
  events.Reload()
  if tag not in events.Tags()["tensors"]:
    return []
  return events.Tensors(tag)


def _metrics_jsonl(workdir) -> list[dict]:
  """The records of `workdir`'s metrics.jsonl, parsed strictly (no NaN or
  Infinity tokens, one object per line)."""
  def refuse(name):
    raise ValueError(f"{name} in metrics.jsonl")
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    text = f.read()
  assert text.endswith("\n")
  return [json.loads(line, parse_constant=refuse)
          for line in text.splitlines()]


def _jsonl_losses(workdir, key="train/loss") -> dict:
  """{step: `key`} from metrics.jsonl, each step's record once."""
  records = [r for r in _metrics_jsonl(workdir) if key in r]
  steps = [r["step"] for r in records]
  assert len(steps) == len(set(steps)), steps
  return {r["step"]: r[key] for r in records}


def _train_steps_on_disk(workdir):
  """The steps of train/loss, each as often as it was written."""
  return sorted(e.step for e in _train_loss_events(workdir))


def _train_losses_on_disk(workdir):
  """{step: train/loss} (the last write of a step wins)."""
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  return {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
          for e in _train_loss_events(workdir)}


class _Killed(Exception):
  pass


def test_metrics_up_to_a_checkpoint_are_on_disk_before_it_is_saved(
    finished_run):
  """A run killed after a checkpoint (SIGKILL: no cleanup, no flush)
  resumes from it and never writes the earlier steps' metrics again, so
  they must be in the events file by then. Before the fix the file held
  only its header when step 6 was saved (the writer's buffer and its
  120 s flush timer held the rest). (`finished_run` records the steps on
  disk at each of its saves.)"""
  workdir, _, on_disk = finished_run  # log 4, save 6
  assert on_disk == {6: [4, 6], 12: [4, 6, 8, 12]}
  assert _train_steps_on_disk(workdir) == [4, 6, 8, 12]  # once each


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_metrics(
    tmp_path, data_dir, finished_run, monkeypatch):
  """Checkpoints every 6 steps, logs every 4: the steps after the last log
  (5 and 6) were held back with the next interval (5-8), which a run
  killed after checkpoint 6 never wrote, and its resumed run's step 8 then
  averaged 7-8 where an uninterrupted run's averaged 5-8. They are now
  logged at the checkpoint, in every run."""
  config = _run_config(data_dir)
  whole, _, _ = finished_run
  real_save = ckpt_lib.save

  def save_then_die(manager, step, *args, **kwargs):
    real_save(manager, step, *args, **kwargs)
    ckpt_lib.wait_until_finished(manager)
    raise _Killed(step)

  killed = tmp_path / "killed"
  monkeypatch.setattr(train.ckpt_lib, "save", save_then_die)
  with pytest.raises(_Killed):
    train.train_and_evaluate(config, str(killed), families.build_task)
  assert _train_steps_on_disk(killed) == [4, 6]
  assert list(_jsonl_losses(killed)) == [4, 6]  # flushed before the save
  # A record the killed run wrote after its checkpoint (step 8, which the
  # resumed run writes again), then a line cut short by the kill.
  with open(killed / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"step": 8, "train/loss": 99.0}\n{"step": 9, "train/lo')
  # What a run killed inside `atomic_write` leaves (no later write removed
  # them); a file of the user's, a link of that form and a dataset's
  # temporary (its build has a lock of its own) stay.
  temporary = f".eval_12.json.{'a0' * 16}.tmp"
  (killed / temporary).write_text('{"eval/lo')
  (killed / "eval_12").mkdir()
  (killed / "eval_12" / f".sheet.png.{'b1' * 16}.tmp").write_bytes(b"")
  (killed / "notes.tmp").write_text("mine")
  (killed / f".x.{'c2' * 16}.tmp").symlink_to(killed / "notes.tmp")
  dataset_temporary = killed / f".train.bin.{'d3' * 16}.tmp"
  dataset_temporary.write_bytes(b"")
  monkeypatch.setattr(train.ckpt_lib, "save", real_save)
  train.train_and_evaluate(config, str(killed), families.build_task)
  assert not (killed / temporary).exists()
  assert os.listdir(killed / "eval_12") == ["sheet.png"]  # its own, now
  assert (killed / "notes.tmp").exists()
  assert (killed / f".x.{'c2' * 16}.tmp").is_symlink()
  assert dataset_temporary.exists()
  assert _train_steps_on_disk(whole) == [4, 6, 8, 12]
  assert _train_steps_on_disk(killed) == [4, 6, 8, 12]  # once each
  expected = _train_losses_on_disk(whole)
  resumed = _train_losses_on_disk(killed)
  np.testing.assert_allclose([resumed[k] for k in sorted(resumed)],
                             [expected[k] for k in sorted(expected)],
                             rtol=1e-5)
  # metrics.jsonl: the records past checkpoint 6 and the torn line were
  # dropped, and the resumed run wrote steps 8 and 12 once, as the
  # uninterrupted run did.
  assert _jsonl_losses(whole) == pytest.approx(expected, rel=1e-6)
  assert _jsonl_losses(killed) == pytest.approx(_jsonl_losses(whole),
                                                rel=1e-5)


def test_a_full_disk_at_an_evaluation_is_one_line(tmp_path, data_dir,
                                                  monkeypatch):
  """The disk fills (or turns read-only) while the evaluation's record is
  written: the run stopped with a bare `[Errno 28] No space left on
  device`, naming neither the file nor the checkpoint kept."""
  import errno  # pylint: disable=g-import-not-at-top
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  config = tiny_config(**{"data.data_dir": data_dir, **ONE_AXIS})
  real_atomic_write = atomic_files.atomic_write

  def write_on_a_full_disk(f):
    # What a write on a full disk raises: the error names no file.
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  eval_steps_on_disk = []  # TensorBoard's when the record was written

  def full(path, write_fn, *args, **kwargs):
    # The record goes through a temporary file (a kill mid-write left a
    # truncated eval_<step>.json, which a resume ranks checkpoints by).
    if os.path.basename(path).startswith("eval_"):
      eval_steps_on_disk.extend(
          e.step for e in _train_loss_events(workdir, "eval/loss"))
      write_fn = write_on_a_full_disk
    return real_atomic_write(path, write_fn, *args, **kwargs)

  monkeypatch.setattr(atomic_files, "atomic_write", full)
  workdir = tmp_path / "run"
  with pytest.raises(train.WorkdirWriteError) as error:
    train.train_and_evaluate(config, str(workdir), families.build_task)
  assert str(error.value) == (
      f"Writing {workdir}/eval_12.json failed (no space left on device); "
      + re.search(r"[0-9.]+ MiB free there", str(error.value)).group()
      + f". The last good checkpoint, {workdir}/checkpoints/6, is kept. "
      "Free space (or make the workdir writable again) and rerun to "
      "resume.")
  assert error.value.errno == errno.ENOSPC
  assert sorted(os.listdir(workdir / "checkpoints")) == ["6"]
  # The figures were in the events file before their record: a run killed
  # between the two resumed, found the record equal to its evaluation and
  # never wrote them (the writer's buffer had lost them).
  assert eval_steps_on_disk == [12]
  assert not (workdir / "trainer.lock").exists()


def test_a_step_past_the_hosts_memory_is_one_line_before_it_runs(
    tmp_path, data_dir, monkeypatch):
  """XLA:CPU allocates a step's temporaries at its first run: a batch whose
  temporaries the host cannot hold (config.global_batch_size=16384 of the
  :cpu Sudoku: 117.7 GiB on a 23.5 GiB host) ended in a JaxRuntimeError
  traceback ("Out of memory allocating 126371977048 bytes"), or the OOM
  killer's silence. XLA's memory analysis of the compiled step says so
  before it runs."""
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  config = tiny_config(**{"data.data_dir": data_dir, **ONE_AXIS})
  # The state's own check (`state.abstract_state`) is not under test here.
  monkeypatch.setattr(array_sizes, "check_host_memory", lambda *a: None)
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 2**20)
  with pytest.raises(ValueError, match=re.escape(
      "The train step at config.global_batch_size=16 needs ") + r"[0-9.]+ GiB"
      r" on this host's \d CPU device\(s\) \(XLA's memory analysis: .* GiB"
      r" of temporaries a device\), which share its 0\.0 GiB \(memory and "
      r"swap\); lower the batch \(or the model's sizes\), or run on an "
      r"accelerator\."):
    train.train_and_evaluate(config, str(tmp_path / "run"),
                             families.build_task)
  assert not os.path.exists(tmp_path / "run" / "checkpoints" / "0")
  assert not _train_steps_on_disk(tmp_path / "run")


class _SavedPosition:
  """A data position as read back from a checkpoint (`checkpoint.save`
  asks the iterator for it)."""

  def __init__(self, state):
    self.state = state

  def get_state(self):
    return self.state


def _drop_fields(checkpoints, step, names):
  """Rewrites checkpoint `step` as a version of trm whose train state had
  no fields `names` wrote it: the same arrays, position and config record."""
  manager = ckpt_lib.make_manager(checkpoints, max_to_keep=5)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(), data_iter=ocp.args.JsonRestore()))
  record = manager.metadata(step).custom_metadata[ckpt_lib.CONFIG_RECORD]
  manager.delete(step)
  state = {k: v for k, v in restored["state"].items() if k not in names}
  ckpt_lib.save(manager, step, state, _SavedPosition(restored["data_iter"]),
                config_record=record)
  ckpt_lib.wait_until_finished(manager)
  manager.close()


def test_a_checkpoint_without_the_skipped_step_counters_resumes(
    tmp_path, data_dir, finished_run, caplog):
  """A checkpoint written before the train state kept `skipped_steps` and
  `bad_streak` resumes as the same checkpoint with them would, counters
  at 0 (it used to be refused as another version's): to the state of the
  uninterrupted run (test_crash_and_resume_matches_uninterrupted_run
  resumes its step 6 with the counters to the same state)."""
  straight, reference, _ = finished_run
  shutil.copytree(straight, tmp_path / "old")
  shutil.rmtree(tmp_path / "old" / "checkpoints" / "12")
  _drop_fields(str(tmp_path / "old" / "checkpoints"), 6,
               state_lib.COUNTER_FIELDS)
  # config.metrics_jsonl=False: the file is neither written nor cut back
  # to step 6.
  jsonl = (tmp_path / "old" / "metrics.jsonl").read_text()
  config = _run_config(data_dir)
  config.metrics_jsonl = False
  with caplog.at_level(logging.WARNING):
    resumed, _ = train.train_and_evaluate(config, str(tmp_path / "old"),
                                          families.build_task)
  assert (tmp_path / "old" / "metrics.jsonl").read_text() == jsonl
  assert ("was written before trm kept ['bad_streak', 'skipped_steps'] in "
          "the train state; they start at 0.") in caplog.text
  assert int(resumed.step) == 12
  assert (int(resumed.skipped_steps), int(resumed.bad_streak)) == (0, 0)
  _assert_resumed_equal(reference, resumed)


def test_mesh_mismatch_fails_before_anything_is_built(tmp_path):
  config = tiny_config(**{"mesh.data": 3})
  with pytest.raises(mesh_lib.MeshConfigError, match="config.mesh"):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  assert not (tmp_path / "data").exists()


def test_batch_not_divisible_is_a_clear_error(tmp_path):
  config = tiny_config(**{"global_batch_size": 10})
  with pytest.raises(mesh_lib.MeshConfigError, match="global_batch_size=10"):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)


def test_missing_csv_data_is_a_clear_error(tmp_path):
  config = tiny_config(**{"data.build.source": "csv",
                          "data.build.csv_dir": str(tmp_path / "nowhere")})
  with pytest.raises((FileNotFoundError, ValueError), match="nowhere"):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)


def test_unknown_model_key_is_rejected(tmp_path, data_dir):
  config = tiny_config(**{"data.data_dir": data_dir})
  with config.unlocked():
    config.model.hidden_sise = 8
  with pytest.raises(ValueError, match="hidden_sise"):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)


@pytest.mark.parametrize("override, message", [
    ("--config.total_stepz=3", "total_stepz"),
    ("--config.total_steps=abc", "total_steps"),
])
def test_cli_rejects_typos_and_wrong_types(tmp_path, override, message):
  result = subprocess.run(
      [sys.executable, "-m", "trm.main",
       "--config=configs/trm_sudoku.py:cpu", f"--workdir={tmp_path}",
       override], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert message in result.stderr
  assert not (tmp_path / "checkpoints").exists()


def test_cli_rejects_unknown_variant(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "trm.main",
       "--config=configs/trm_sudoku.py:gpu", f"--workdir={tmp_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert "Unknown config variant" in result.stderr


_KILLED_RUN = """
import os, signal, sys
sys.path[:0] = {tests!r}
from test_train import tiny_config
from trm import families
from trm.core import train
from trm.core import pipeline
real, calls = pipeline.to_global, [0]
def to_global(batch, shardings):
  calls[0] += 1
  if calls[0] == {kill_at}:
    os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no finally
  return real(batch, shardings)
pipeline.to_global = to_global
train.train_and_evaluate(tiny_config(**{{"data.data_dir": {data!r}}}),
                         {workdir!r}, families.build_task)
"""


# slow: test_crash_and_resume_matches_uninterrupted_run resumes the same way
# (benchmarks/reliability/kill_resume.py kills 20 times).
@pytest.mark.slow
def test_sigkill_mid_run_then_resume_matches(tmp_path, data_dir):
  """kill -9 during training; the rerun ends with the uninterrupted params."""
  config = tiny_config(**{"data.data_dir": data_dir})
  reference, _ = train.train_and_evaluate(config, str(tmp_path / "straight"), families.build_task)
  workdir = str(tmp_path / "killed")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  result = subprocess.run(
      [sys.executable, "-c", _KILLED_RUN.format(
          tests=[os.path.dirname(os.path.abspath(__file__)), os.path.join(ROOT, "tests")], kill_at=8, data=data_dir,
          workdir=workdir)], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=300)
  assert result.returncode == -9, result.stderr[-2000:]
  # Only whole checkpoints count: step 6 if its async save had finished,
  # otherwise none (a half-written one is left in a temporary directory).
  saved = [d for d in os.listdir(os.path.join(workdir, "checkpoints"))
           if d.isdigit()]
  assert saved in ([], ["6"])
  resumed, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert int(resumed.step) == 12
  for a, b in zip(jax.tree.leaves(_params(reference)),
                  jax.tree.leaves(_params(resumed))):
    np.testing.assert_array_equal(a, b)


def test_remote_data_dir_is_a_clear_error():
  config = tiny_config(**{"data.data_dir": "gs://bucket/sudoku"})
  with pytest.raises(ValueError, match="config.data.data_dir"):
    puzzle.prepare_data(config, "/tmp/unused")


def test_a_data_dir_that_is_a_file_is_a_clear_error(tmp_path):
  # Was "[Errno 17] File exists: '...'", naming neither the field nor a fix.
  path = tmp_path / "sudoku"
  path.write_text("not a dataset")
  config = tiny_config(**{"data.data_dir": str(path)})
  with pytest.raises(ValueError, match=r"config.data.data_dir.*is a file, "
                     r"not a directory"):
    puzzle.prepare_data(config, str(tmp_path))
  assert path.read_text() == "not a dataset"


@pytest.mark.parametrize("key", ["total_steps", "eval_every",
                                 "data.epochs_per_iter"])
def test_non_positive_cadence_is_a_clear_error(tmp_path, key):
  with pytest.raises(ValueError, match=f"config.{key}=0"):
    train.train_and_evaluate(tiny_config(**{key: 0}), str(tmp_path), families.build_task)


@pytest.mark.parametrize("key", ["profiler_steps",
                                 "skip_first_n_steps_for_profiler"])
def test_a_negative_profiler_window_is_a_clear_error(tmp_path, key):
  with pytest.raises(ValueError, match=f"config.{key}=-1 must be >= 0"):
    train.train_and_evaluate(tiny_config(**{key: -1}), str(tmp_path),
                             families.build_task)


@pytest.mark.parametrize("every", [-6, 9])
def test_a_keep_period_off_the_save_cadence_is_a_clear_error(tmp_path, every):
  # checkpoint_every=6: 9 would keep only steps 18, 36, ... (multiples of both).
  with pytest.raises(ValueError, match=f"config.keep_checkpoint_every={every}"
                     " must be 0 .* or a multiple of config.checkpoint_every=6"):
    train.train_and_evaluate(tiny_config(keep_checkpoint_every=every),
                             str(tmp_path), families.build_task)


@pytest.mark.parametrize("overrides, message", [
    ({"checkpoint_every": -1}, r"config.checkpoint_every=-1 must be a "
     r"positive integer \(or 0: write no checkpoint\)"),
    ({"checkpoint_every": 0, "keep_checkpoint_every": 6},
     r"checkpoint_every=0 writes no checkpoint, so config."
     r"keep_checkpoint_every=6 has none to keep"),
    ({"checkpoint_every": 0, "always_save_checkpoint": False},
     r"checkpoint_every=0 writes no checkpoint, not even the improving ones "
     r"always_save_checkpoint=False keeps"),
])
def test_checkpoints_off_refuses_contradicting_fields(tmp_path, overrides,
                                                      message):
  # Before: keep_checkpoint_every % 0 raised ZeroDivisionError, and 0 was
  # refused outright.
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(tiny_config(**overrides), str(tmp_path),
                             families.build_task)
  assert not os.listdir(tmp_path)  # refused before anything was written


def test_checkpoints_off_in_a_run_with_checkpoints_is_refused(finished_run):
  """A run that saves no checkpoint would start over in a workdir holding
  another run's, overwriting the eval records that rank them: refused
  before anything is built or written."""
  workdir, _, _ = finished_run
  before = sorted(os.listdir(workdir))
  with pytest.raises(ValueError, match=r"checkpoint_every=0 writes and reads "
                     r"no checkpoint, but .*checkpoints holds step\(s\) 6, 12 "
                     r"of another run.*pass a new --workdir"):
    train.train_and_evaluate(tiny_config(checkpoint_every=0), str(workdir),
                             families.build_task)
  assert sorted(os.listdir(workdir)) == before


def test_a_resume_step_that_cannot_be_is_one_line():
  """Refused with the config's other values, before the workdir is
  touched: a negative step, and eval_only (which moves no step aside)."""
  from trm.core import run_checks  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"config.resume_step=-6 must be a "
                     r"saved step to resume from, or 0 \(the newest\)"):
    run_checks.check_values(tiny_config(resume_step=-6))
  # A config file's value may be any type (a string was a TypeError).
  config = tiny_config()
  with config.unlocked():
    del config["resume_step"]
    config["resume_step"] = "6"
  with pytest.raises(ValueError, match=r"config.resume_step='6' must be a "
                     r"saved step"):
    run_checks.check_values(config)
  with pytest.raises(ValueError, match=r"config.resume_step=6 with eval_only="
                     r"True: .* or read step 6 with trm.evaluate's --step=6"):
    run_checks.check_values(tiny_config(resume_step=6, eval_only=True))


def test_resume_step_moves_the_newer_steps_aside(finished_run, data_dir,
                                                 tmp_path, monkeypatch,
                                                 caplog):
  """config.resume_step=N (Hugging Face's resume_from_checkpoint; before,
  no field: only the newest step resumed): the steps after N, their
  evaluations' records and a copy of metrics.jsonl move to
  checkpoints_abandoned/<time>/ (one warning), before anything is read,
  so the restore, the ranking and the end-of-run checks see N as the
  newest. A rerun with the same N resumes from the steps trained since; a
  step not on disk names those that are."""
  whole, _, _ = finished_run
  workdir = tmp_path / "run"
  shutil.copytree(whole, workdir)
  jsonl = (workdir / "metrics.jsonl").read_text()
  restored = []

  def stop_at_restore(manager, *unused_args):
    restored.append(sorted(manager.all_steps()))
    raise _Killed()

  monkeypatch.setattr(train.ckpt_lib, "restore_latest", stop_at_restore)
  run = lambda step: train.train_and_evaluate(
      tiny_config(**{"data.data_dir": data_dir, "log_every": 4,
                     "resume_step": step, **ONE_AXIS}), str(workdir),
      families.build_task)
  with pytest.raises(ckpt_lib.CheckpointError, match=(
      r"^config.resume_step=7: .*/checkpoints has no complete step 7 \(its "
      r"steps: \[6, 12\]\); pass one of them, or 0 to resume from the "
      r"newest.$")):
    run(7)
  assert sorted(os.listdir(workdir / "checkpoints"))[:2] == ["12", "6"]
  # A move that fails (here: a file in the folder's place) is one line.
  (workdir / ckpt_lib.ABANDONED).write_text("")
  with pytest.raises(ckpt_lib.CheckpointError, match=(
      r"^config.resume_step=6: moving the newer step\(s\) \[12\] aside into "
      r".*checkpoints_abandoned failed \(.*\); what was moved is there")):
    run(6)
  (workdir / ckpt_lib.ABANDONED).unlink()
  with caplog.at_level(logging.WARNING), pytest.raises(_Killed):
    run(6)
  assert restored == [[6]]
  [moved] = list((workdir / ckpt_lib.ABANDONED).iterdir())
  assert f"the newer step(s) [12], their evaluations' records and a copy of " \
      f"metrics.jsonl were moved to {moved} (nothing deleted)" in caplog.text
  assert sorted(os.listdir(moved / "checkpoints")) == ["12"]
  assert (moved / "eval_12.json").exists()
  assert not (workdir / "eval_12.json").exists()
  assert (moved / "metrics.jsonl").read_text() == jsonl
  assert json.loads((moved / "resume_step.json").read_text())[
      "moved_steps"] == [12]
  # The resumed run saved step 12 again; the same command, rerun (a
  # restarted job), resumes from it instead of going back again.
  shutil.copytree(moved / "checkpoints" / "12", workdir / "checkpoints" / "12")
  caplog.clear()
  with caplog.at_level(logging.WARNING), pytest.raises(_Killed):
    run(6)
  assert restored[-1] == [6, 12]
  assert "config.resume_step=6 was applied by an earlier run" in caplog.text
  assert len(list((workdir / ckpt_lib.ABANDONED).iterdir())) == 1


def test_init_checkpoint_starts_a_new_run_from_a_workdirs_weights(
    finished_run, data_dir, tmp_path, caplog):
  """config.init_checkpoint=WORKDIR: a new run starts from the weights that
  run evaluated (its EMA), its H_init / L_init and puzzle table, sharded,
  with a fresh optimizer at step 0 (before, TRM configs had no such
  field); WORKDIR/checkpoints/N names step N, .../best the best (a step
  not on disk names those that are); a workdir that already holds
  checkpoints resumes and reads none of it (said once)."""
  workdir, final, _ = finished_run
  config = tiny_config(**{"data.data_dir": data_dir,
                          "init_checkpoint": str(workdir)})
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = families.build_task(config, str(tmp_path), ctx)
  _, shardings = state_lib.abstract_state(task.program.init_fn, ctx)
  state = task.initial_state(ctx, shardings)
  assert jax.tree.all(jax.tree.map(lambda x, s: x.sharding == s, state,
                                   shardings))
  # Buffers of its own for the EMA: the train step donates both.
  buffers = lambda tree: {shard.data.unsafe_buffer_pointer()
                          for x in jax.tree.leaves(tree)
                          for shard in x.addressable_shards}
  assert not buffers(state.params) & buffers(state.ema_params)
  state = jax.device_get(state)
  for name, want in (("params", final.ema_params),
                     ("ema_params", final.ema_params),
                     ("buffers", final.buffers),
                     ("puzzle_emb", final.puzzle_emb)):
    for a, b in zip(jax.tree.leaves(want),
                    jax.tree.leaves(getattr(state, name))):
      np.testing.assert_array_equal(a, b, err_msg=name)
  assert int(state.step) == 0
  assert not any(np.any(x) for x in jax.tree.leaves(state.opt_state))
  one_step = tiny_config(init_checkpoint=os.path.join(workdir, "checkpoints",
                                                      "6"))
  assert puzzle.init_source(one_step, str(tmp_path)) == (str(workdir), 6)
  # WORKDIR/checkpoints/best: the step the tools' --step=best reads (the
  # lowest held-out loss; here step 12, then step 6 given a lower one).
  named = lambda run, name: tiny_config(init_checkpoint=os.path.join(
      run, "checkpoints", name))
  assert puzzle.init_source(named(workdir, "best"), str(tmp_path)) == (
      str(workdir), 12)
  copy = tmp_path / "copy"
  shutil.copytree(workdir / "checkpoints", copy / "checkpoints")
  ckpt_lib._write_metric(str(copy / "checkpoints" / "6"), 0.5)  # pylint: disable=protected-access
  assert puzzle.init_source(named(copy, "best"), str(tmp_path)) == (
      str(copy), 6)
  assert puzzle.init_source(named(copy, "latest"), str(tmp_path)) == (
      str(copy), None)
  with pytest.raises(FileNotFoundError, match=(
      r"^config.init_checkpoint='.*/checkpoints/7': .* has no step 7 \(its "
      r"steps: \[6, 12\]\); pass one of them, best or latest.$")):
    puzzle.init_source(named(copy, "7"), str(tmp_path))
  shutil.rmtree(copy / "checkpoints" / "6" / "metrics")
  shutil.rmtree(copy / "checkpoints" / "12" / "metrics")
  with pytest.raises(ckpt_lib.CheckpointError, match=(
      r"^config.init_checkpoint='.*/checkpoints/best': no checkpoint .* has "
      r"a held-out loss .* Pass config.init_checkpoint='.*/checkpoints/"
      r"latest' or config.init_checkpoint='.*/checkpoints/<N>'")):
    puzzle.init_source(named(copy, "best"), str(tmp_path))
  with caplog.at_level(logging.WARNING):
    assert puzzle.init_source(config, str(workdir)) is None
  assert caplog.text.count("is not read") == 1


@pytest.mark.parametrize("overrides,error,message", [
    ({"model.hidden_size": 64}, ValueError,
     r"config.init_checkpoint='.*': Checkpoint .*/12: buffers/H_init has "
     r"shape \(32,\) but this config needs \(64,\) \(and 6 more.*\. "
     # What to do about a starting run (not "another --workdir /
     # --checkpoint": the new run's workdir has nothing to do with it).
     r"Point config\.init_checkpoint at a run of this config's model and "
     r"sizes, or set config\.model as that run's config\.json records it\.$"),
    ({"model.puzzle_emb_ndim": 64}, ValueError,
     r"puzzle_emb/weights in .*/12 has shape \(1, 32\) but this config "
     r"needs \(1, 64\): only its number of identifiers may differ"),
    ({"init_checkpoint": "no_such_run"}, FileNotFoundError,
     r"config.init_checkpoint='no_such_run' is neither a trm.main workdir"),
    ({"init_checkpoint": "gs://bucket/run"}, weights_io.CheckpointError,
     r"config.init_checkpoint='gs://bucket/run' is an object-store path"),
])
def test_an_init_checkpoint_that_does_not_fit_is_one_line(
    finished_run, data_dir, tmp_path, overrides, error, message):
  """Refused before anything compiles (a path that is no checkpoint:
  before the data is built)."""
  workdir, _, _ = finished_run
  built = "init_checkpoint" not in overrides
  config = tiny_config(**{
      "data.data_dir": data_dir if built else str(tmp_path / "data"),
      "init_checkpoint": str(workdir), **overrides})
  with pytest.raises(error, match=message):
    families.build_task(config, str(tmp_path),
                        mesh_lib.ShardingContext.from_config(config))
  assert built or not os.path.exists(tmp_path / "data")


def _upstream_file(program, path, rows, seed):
  """An upstream-layout file (safetensors) of random weights of
  `program`'s model with a puzzle table of `rows` identifiers; (path, its
  variables)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  abstract = jax.eval_shape(lambda: nn_meta.unbox(program.init_fn()))
  rng = np.random.default_rng(seed)
  fill = lambda x: (rng.normal(size=x.shape) / 4).astype(x.dtype)
  params, buffers = (jax.tree.map(fill, abstract.params),
                     jax.tree.map(fill, abstract.buffers))
  table = {"weights": fill(jax.ShapeDtypeStruct(
      (rows,) + abstract.puzzle_emb["weights"].shape[1:], np.float32))}
  cfg = dataclasses.replace(program.model.cfg, num_puzzle_identifiers=rows)
  torch_import.export_torch_checkpoint(params, buffers, table, cfg, path)
  return path, (params, buffers, table)


def test_freeze_weights_trains_the_puzzle_table_alone(tmp_path, data_dir):
  """config.optim.freeze_weights (upstream's, for test-time adaptation):
  after a few steps every weight, its AdamATan2 state and EMA are
  bit-identical and the puzzle table moved, on 8 devices; the logged
  rate is the table's. It starts from an upstream file of another dataset
  (3 identifiers; this one has 1): the table starts at their mean. (One
  recursion and a data-parallel mesh: the step compiles in half the time
  of the 2x2x2 mesh's, where the probe ran it too.)"""
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  config = tiny_config(**{"data.data_dir": data_dir,
                          "optim.freeze_weights": True,
                          "model.H_cycles": 1, "model.L_cycles": 1,
                          "mesh.data": 8, "mesh.fsdp": 1, "mesh.model": 1})
  ctx = mesh_lib.ShardingContext.from_config(config)
  program = families.build_task(config, str(tmp_path), ctx).program
  path, (params, _, table) = _upstream_file(
      program, str(tmp_path / "other.safetensors"), 3, 1)
  config.init_checkpoint = path
  task = families.build_task(config, str(tmp_path), ctx)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = task.initial_state(ctx, shardings)
  before = jax.device_get(state)
  np.testing.assert_allclose(
      before.puzzle_emb["weights"],
      np.broadcast_to(table["weights"].mean(0), (1, table["weights"].shape[1])),
      rtol=1e-6)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(before.params)):
    np.testing.assert_array_equal(a, b)
  step = task_lib.compile_train_step(task.program, ctx,
                                     config.global_batch_size, abstract,
                                     shardings)
  batch_shardings = task_lib.batch_shardings(task.program.batch_spec, ctx)
  for i in range(2):
    state, metrics = step(state, pipeline.to_global(task.train_source[i],
                                                    batch_shardings))
  after = jax.device_get(state)
  assert int(after.step) == 2 and int(after.skipped_steps) == 0
  for name in ("params", "ema_params", "opt_state", "buffers"):
    for a, b in zip(jax.tree.leaves(getattr(before, name)),
                    jax.tree.leaves(getattr(after, name))):
      np.testing.assert_array_equal(a, b, err_msg=name)
  assert not np.array_equal(before.puzzle_emb["weights"],
                            after.puzzle_emb["weights"])
  # The second update's rate: puzzle_emb_lr x 2 / warmup_steps.
  np.testing.assert_allclose(float(metrics["lr"].compute()),
                             config.optim.puzzle_emb_lr * 2 / 5, rtol=1e-6)


def test_freeze_weights_without_a_puzzle_table_is_one_line(tmp_path):
  with pytest.raises(ValueError, match=r"config.optim.freeze_weights=True "
                     r"trains the puzzle embeddings alone, but "
                     r"config.model.puzzle_emb_ndim=0 gives the model none"):
    families.build_task(
        tiny_config(**{"optim.freeze_weights": True,
                       "model.puzzle_emb_ndim": 0,
                       "data.data_dir": str(tmp_path / "data")}),
        str(tmp_path), None)
  assert not os.path.exists(tmp_path / "data")  # before the data is built


def test_metrics_jsonl_is_strict_and_drops_what_a_resume_rewrites(tmp_path):
  """NaN/Inf are null (strict JSON readers refused NaN tokens); a torn last
  line is left out at open (it would have joined the next record); and
  drop_after keeps the steps up to the checkpoint resumed from."""
  path = str(tmp_path / "metrics.jsonl")
  with open(path, "w", encoding="utf-8") as f:
    f.write('{"step": 2, "a": 1.0}\n{"step": 4, "a": 2.0}\n{"step": 6, "a')
  writer = train.metrics_lib.JsonlWriter(path)
  writer.write_scalars(6, {"a": np.float32("nan"), "b": np.inf,
                           "c": np.int32(3)})
  writer.flush()
  assert _metrics_jsonl(tmp_path) == [
      {"step": 2, "a": 1.0}, {"step": 4, "a": 2.0},
      {"step": 6, "a": None, "b": None, "c": 3}]
  writer.drop_after(4)
  writer.write_scalars(5, {"a": 0.5})
  writer.close()
  assert [r["step"] for r in _metrics_jsonl(tmp_path)] == [2, 4, 5]


def test_a_split_smaller_than_one_batch_fails_before_compile(tmp_path):
  config = tiny_config(**{"data.build.num_train": 2})
  with pytest.raises(ValueError, match=r"holds 2 examples in 2 groups.*"
                     r"config.global_batch_size=16.*epochs_per_iter"):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  # Nothing of a run was written: no config record, events or checkpoints.
  assert sorted(os.listdir(tmp_path)) == ["data"]


def test_a_full_disk_before_any_checkpoint_promises_no_resume(
    tmp_path, monkeypatch):
  """With no checkpoint kept the line said "rerun to resume"; a rerun
  trains from the start."""
  import errno  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                 str(tmp_path / "eval_2.json"))
  message = str(train._disk_error(full, epath.Path(tmp_path)))  # pylint: disable=protected-access
  assert "No complete checkpoint was written yet" in message
  assert message.endswith("and rerun (it trains from the start).")
  monkeypatch.setattr(ckpt_lib, "complete_steps", lambda directory: [4])
  message = str(train._disk_error(full, epath.Path(tmp_path)))  # pylint: disable=protected-access
  assert message.endswith("and rerun to resume.")
