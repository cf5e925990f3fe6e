"""Reliability of the training loop: NaN/Inf steps are skipped, counted and
stop the run; SIGTERM saves and exits 0; an unreadable newest checkpoint falls
back to the previous one; an unwritable workdir fails at start-up and a failed
save keeps the earlier checkpoints; checkpoints restore onto other meshes.
8 CPU devices."""
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import task as task_lib
from trm.core import checkpoint as ckpt_lib
from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.families.trm import state as trm_state
from trm.families.trm import steps
from trm.core import run_checks
from trm.core import train
from trm import families
from trm.core import pipeline
from trm.data.puzzles import format as puzzle_format
from trm.families.dream import program as dream_program
from trm.families.trm import program as trm_program
from trm.families.trm import task as puzzle

from test_train import ONE_AXIS, ROOT, tiny_config  # pylint: disable=g-import-not-at-top
from test_checkpoint_integrity import _Position  # pylint: disable=g-import-not-at-top


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("sudoku"))
  puzzle.prepare_data(tiny_config(**{"data.data_dir": path}), path)
  return path


# The runs the SIGTERM and flipped-bit tests (both slow) resume and compare:
# 40 steps of test_train's tiny model, checkpoints at 20 and 40.
_RUN = {"total_steps": 40, "checkpoint_every": 20, "eval_every": 40,
        "log_every": 5}


def _run_config(data_dir):
  return tiny_config(**{"data.data_dir": data_dir}, **_RUN)


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
  """Every leaf of the state an uninterrupted run ends with."""
  state, _ = train.train_and_evaluate(
      _run_config(data_dir), str(tmp_path_factory.mktemp("straight")), families.build_task)
  return _host(state)


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _assert_trees_equal(a, b):
  leaves_a, tree_a = jax.tree.flatten(a)
  leaves_b, tree_b = jax.tree.flatten(b)
  assert tree_a == tree_b
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(x, y)


def _steps_on_disk(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))
                if d.isdigit())


# ------------------------------------------------------------ NaN / Inf steps


def _poison(batch):
  """Token ids past the vocabulary: the embedding lookup reads NaN rows, so
  the loss and every gradient (the puzzle rows' too) are NaN."""
  return dict(batch, inputs=np.full_like(batch["inputs"], 10**6))


def _trm_train_step(config, workdir):
  """(task, initial state, run(state, host batch) -> (state, metrics)),
  `run` returning once the step has finished."""
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = families.build_task(config, str(workdir), ctx)
  program = task.program
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  step = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                     abstract, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)

  def run(state, batch):
    # Waits for the step. Unwaited, two steps queued and then the copies
    # of the fresh state deadlocked XLA:CPU's collectives on a loaded host,
    # and XLA aborted the process after 40 s: the CI run of de797d4 lost
    # its worker here, and 9 of 40 runs of this file's two TRM step tests
    # beside three busy processes aborted; waiting, none of 40 did
    # (benchmarks/reliability/busy_host.py; BUILD_NOTES "Session 91").
    return jax.block_until_ready(
        step(state, pipeline.to_global(batch, batch_shardings)))

  return task, state, run


@pytest.fixture(scope="module")
def trm_step(data_dir, tmp_path_factory):
  """`_trm_train_step` of the tiny model without halting exploration, built
  and compiled once for the tests that start from its fresh state (each
  runs on a copy: the step donates its state)."""
  return _trm_train_step(
      tiny_config(**{"data.data_dir": data_dir,
                     "model.halt_exploration_prob": 0.0}),
      tmp_path_factory.mktemp("trm_step"))


def test_trm_nonfinite_step_changes_nothing_but_the_counters(trm_step):
  task, fresh, run = trm_step
  state = jax.tree.map(jnp.copy, fresh)  # the step donates its state
  # The first step: every row of the fresh carry takes the (poisoned) batch.
  before = _host(state)
  state, metrics = run(state, _poison(task.train_source[0]))
  after = _host(state)
  assert int(after.step) == 1
  assert (int(after.skipped_steps), int(after.bad_streak)) == (1, 1)
  _assert_trees_equal(
      before.replace(step=None, skipped_steps=None, bad_streak=None),
      after.replace(step=None, skipped_steps=None, bad_streak=None))
  values = {k: float(m.compute()) for k, m in _host(metrics).items()
            if int(m.count)}
  assert values["skipped_steps"] == 1 and values["max_bad_streak"] == 1
  assert "loss" not in values  # the bad step's averages are left out

  state, metrics = run(state, task.train_source[1])
  good = _host(state)
  assert (int(good.step), int(good.skipped_steps), int(good.bad_streak)) == (
      2, 1, 0)
  assert np.isfinite(float(metrics["loss"].compute()))
  for name in ("params", "opt_state", "ema_params", "puzzle_emb"):
    changed = [not np.array_equal(x, y) for x, y in zip(
        jax.tree.leaves(getattr(after, name)),
        jax.tree.leaves(getattr(good, name)))]
    assert any(changed), name


def test_trm_steps_after_a_skipped_one_are_those_of_a_clean_run(trm_step):
  """Both optimizers count the updates applied: after a skipped step the
  weights and the puzzle table move as in a run without it (before, the
  puzzle table's schedule read the trainer's step, one ahead of
  AdamATan2's count, and its rows moved by the next step's rate).
  (`trm_step` has halt_exploration_prob=0, as this test always had.)"""
  task, fresh, run = trm_step
  batches = [task.train_source[i] for i in range(2)]
  clean = jax.tree.map(jnp.copy, fresh)  # the step donates its state
  for batch in batches:
    clean = run(clean, batch)[0]
  skipped = run(jax.tree.map(jnp.copy, fresh), _poison(batches[0]))[0]
  for batch in batches:
    skipped = run(skipped, batch)[0]
  clean, skipped = _host(clean), _host(skipped)
  assert int(skipped.skipped_steps) == 1 and int(skipped.step) == 3
  for name in ("params", "opt_state", "puzzle_emb"):
    for x, y in zip(jax.tree.leaves(getattr(clean, name)),
                    jax.tree.leaves(getattr(skipped, name))):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7, err_msg=name)


def _assert_first_step_skipped(tmp_path, data_dir, overrides):
  """The first step under `overrides` (no warm-up) is skipped: the state
  changes only in its step and skip counters."""
  task, state, run = _trm_train_step(
      tiny_config(**{"data.data_dir": data_dir, "optim.warmup_steps": 0,
                     **overrides}), tmp_path)
  before = _host(state)
  after = _host(run(state, task.train_source[0])[0])
  assert (int(after.skipped_steps), int(after.bad_streak)) == (1, 1)
  _assert_trees_equal(
      before.replace(step=None, skipped_steps=None, bad_streak=None),
      after.replace(step=None, skipped_steps=None, bad_streak=None))


def test_trm_step_with_overflowed_weights_leaves_the_puzzle_table(tmp_path,
                                                                  data_dir):
  """Finite loss and gradients, but a learning rate at float32's edge sends
  the weights to inf: the step is skipped, and its puzzle-table update with
  it (before, the skipped step still moved the rows its batch touched)."""
  _assert_first_step_skipped(tmp_path, data_dir, {"optim.lr": 3e38})


def test_trm_step_with_overflowed_puzzle_rows_is_skipped(tmp_path, data_dir):
  """The puzzle table's own rate and decay overflow (their product is inf,
  so a zero row becomes 0 * -inf = NaN) while the loss and gradients stay
  finite: the whole step is skipped (before, the table was outside the
  finiteness verdict: its rows were kept NaN and the weights moved on)."""
  _assert_first_step_skipped(tmp_path, data_dir, {
      "optim.puzzle_emb_lr": 1e20, "optim.puzzle_emb_weight_decay": 1e20})


def test_lm_nonfinite_step_changes_nothing_but_the_counters():
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")
  config.mesh.update(data=2, fsdp=2, model=2)
  config.update(seq_len=16, global_batch_size=8)
  ctx = mesh_lib.ShardingContext.from_config(config)
  program = dream_program.build(config, ctx)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  step = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                     abstract, shardings)

  def batch(first_token):
    tokens = np.tile(np.arange(16, dtype=np.int32) + 5, (8, 1))
    tokens[:, 0] = first_token
    return {"tokens": jax.device_put(tokens, batch_shardings["tokens"]),
            "maskable": jax.device_put(np.ones((8, 16), bool),
                                       batch_shardings["maskable"])}

  before = _host(state)
  # A token id past the vocabulary: its embedding row reads as NaN.
  state, metrics = step(state, batch(program.model.cfg.vocab_size + 7))
  after = _host(state)
  assert (int(after.step), int(after.skipped_steps),
          int(after.bad_streak)) == (1, 1, 1)
  _assert_trees_equal((before.params, before.opt_state),
                      (after.params, after.opt_state))
  assert float(metrics["skipped_steps"].compute()) == 1
  assert int(metrics["loss"].count) == 0
  state, _ = step(state, batch(5))
  good = _host(state)
  assert (int(good.step), int(good.skipped_steps), int(good.bad_streak)) == (
      2, 1, 0)
  # (Its learning rate is still 0: the schedule starts from 0 at count 0.)
  assert any(not np.array_equal(x, y) for x, y in zip(
      jax.tree.leaves(good.opt_state), jax.tree.leaves(after.opt_state)))


def test_consecutive_nonfinite_steps_stop_the_run_keeping_the_checkpoint(
    tmp_path, data_dir, monkeypatch):
  config = tiny_config(**{"data.data_dir": data_dir, "log_every": 1,
                          "checkpoint_every": 2,
                          "max_consecutive_bad_steps": 3, **ONE_AXIS})
  real_to_global, calls = pipeline.to_global, [0]

  def poisoned_from_step_5(batch, shardings):
    calls[0] += 1
    return real_to_global(_poison(batch) if calls[0] >= 5 else batch,
                          shardings)

  monkeypatch.setattr(pipeline, "to_global", poisoned_from_step_5)
  workdir = str(tmp_path)
  with pytest.raises(train.NonFiniteError) as error:
    train.train_and_evaluate(config, workdir, families.build_task)
  message = str(error.value)
  assert "3 consecutive train steps" in message
  assert "max_consecutive_bad_steps=3" in message
  assert os.path.join(workdir, "checkpoints", "4") in message
  # Steps 5 (or 6) on were skipped: nothing was saved after step 4, and the
  # run stopped within two steps of the third bad one.
  assert _steps_on_disk(workdir) == [2, 4]
  assert calls[0] <= 10


def test_nonfinite_steps_before_any_checkpoint_promise_no_resume(
    tmp_path, data_dir, monkeypatch):
  """With nothing saved yet the line said "rerun to resume from it" of a
  checkpoint that does not exist."""
  config = tiny_config(**{"data.data_dir": data_dir, "log_every": 1,
                          "checkpoint_every": 1000,
                          "max_consecutive_bad_steps": 2, **ONE_AXIS})
  real_to_global = pipeline.to_global
  monkeypatch.setattr(pipeline, "to_global", lambda batch, shardings:
                      real_to_global(_poison(batch), shardings))
  with pytest.raises(train.NonFiniteError) as error:
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  message = str(error.value)
  assert "No checkpoint had been written" in message
  assert message.endswith("then rerun (it trains from the start).")
  assert not os.path.isdir(tmp_path / "checkpoints") or not _steps_on_disk(
      str(tmp_path))


# ------------------------------------------------------------------ SIGTERM


def _cli_flags(config, prefix="--config"):
  """Flags that set every leaf of `config` (so the CLI run is this config)."""
  flags = []
  for key, value in config.items():
    if hasattr(value, "items"):
      flags += _cli_flags(value, f"{prefix}.{key}")
    elif not isinstance(value, (list, tuple)):
      flags.append(f"{prefix}.{key}={value}")
  return flags


# slow: test_multihost.py's SIGTERM test (save, exit 0), test_cli.py's Ctrl-C test and
# test_train.py's crash-and-resume equality cover the same path.
@pytest.mark.slow
def test_sigterm_saves_exits_zero_and_resumes_identically(
    tmp_path, data_dir, reference):
  config = _run_config(data_dir)
  workdir = str(tmp_path)
  process = subprocess.Popen(
      [sys.executable, "-m", "trm.main", "--config=configs/trm_sudoku.py:cpu",
       f"--workdir={workdir}", "--alsologtostderr"] + _cli_flags(config),
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines, started = [], threading.Event()

  def read():
    for line in process.stderr:
      lines.append(line)
      if "Training from step 0" in line:  # logged once SIGTERM is handled
        started.set()

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  try:
    assert started.wait(300), "".join(lines[-50:])
    time.sleep(0.2)  # a step or two in
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    returncode = process.wait(timeout=60)
    seconds = time.time() - sent
  finally:
    if process.poll() is None:
      process.kill()
  reader.join(timeout=10)
  log = "".join(lines)
  assert returncode == 0, log[-3000:]
  assert seconds < 30, seconds
  print(f"SIGTERM to exit: {seconds:.2f} s")
  # The CLI flags reproduced the config exactly.
  with open(os.path.join(workdir, "config.json")) as f:
    assert json.load(f) == json.loads(config.to_json_best_effort())
  stopped = int(re.search(r"Preempted at step (\d+) \(SIGTERM\); saved",
                          log).group(1))
  assert 0 < stopped < config.total_steps
  assert stopped in _steps_on_disk(workdir)

  resumed, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert int(resumed.step) == config.total_steps
  _assert_trees_equal(reference, _host(resumed))


# ------------------------------------------------------ unreadable checkpoints


def test_corrupt_newest_checkpoint_falls_back_and_matches(
    tmp_path, data_dir, caplog):
  # test_train's 12-step run, checkpoints at 6 and 12: the run itself is the
  # uninterrupted reference the resumed one must end equal to. (On
  # test_train's data-parallel mesh: the resume loads the step the first
  # run compiled from the session's cache.)
  config = tiny_config(**{"data.data_dir": data_dir, **ONE_AXIS})
  workdir = str(tmp_path)
  straight, _ = train.train_and_evaluate(config, workdir, families.build_task)
  reference = _host(straight)
  del straight
  assert _steps_on_disk(workdir) == [6, 12]
  newest = os.path.join(workdir, "checkpoints", "12")
  arrays = [p for p in glob.glob(os.path.join(newest, "state", "**", "d", "*"),
                                 recursive=True) if os.path.isfile(p)]
  assert arrays
  for path in arrays:
    os.truncate(path, os.path.getsize(path) // 2)
  os.remove(os.path.join(newest, "state", "_METADATA"))

  with caplog.at_level(logging.WARNING):
    resumed, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert f"Checkpoint {newest} cannot be restored" in caplog.text
  assert "Resuming from checkpoint" in caplog.text
  assert int(resumed.step) == 12
  _assert_trees_equal(reference, _host(resumed))
  # The unreadable step was set aside (for inspection); 12 was saved anew.
  assert glob.glob(os.path.join(workdir, "checkpoints", "12.unreadable-*"))
  assert _steps_on_disk(workdir) == [6, 12]


def _flip_a_bit_silently(step_dir, fields=("params", "ema_params")):
  """Flips one bit of the step's data files where Orbax still reads the
  state back, with other numbers in one of `fields` and without a word
  (its compressed chunks carry no checksum): the damage only a checksum
  can catch. Returns the path of the array that changed."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  state_dir = os.path.join(step_dir, "state")

  def read():
    tree = ocp.StandardCheckpointer().restore(state_dir)
    return {jax.tree_util.keystr(k): np.asarray(v)
            for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}

  good = read()
  files = sorted((p for p in glob.glob(os.path.join(state_dir, "**", "d",
                                                    "*"), recursive=True)
                  if os.path.isfile(p)), key=os.path.getsize, reverse=True)
  for path in files:
    size = os.path.getsize(path)
    for offset in range(size // 3, size, max(1, size // 48)):
      with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x04]))
      try:
        silently = read()
      except Exception:  # pylint: disable=broad-except
        silently = {}  # fails to decode: the easy case, not this one
      changed = [k for k, v in silently.items()
                 if not np.array_equal(v, good[k])]
      if changed and all(k.split("'")[1] in fields for k in changed):
        return changed[0]
      with open(path, "r+b") as f:  # undo, try the next
        f.seek(offset)
        f.write(bytes([byte]))
  raise AssertionError(f"no silent bit flip found in {state_dir}")


# A chunk that fails to decode (while looking for a silent flip) leaves
# Orbax coroutines that warn when garbage-collected.
# slow: tests/core/test_checkpoint_integrity.py flips bits in saved steps and
# checks both restore paths fall back; test_corrupt_newest_checkpoint_... runs the trainer's.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_flipped_bit_in_the_newest_checkpoint_falls_back_for_training_and_evaluation(
    tmp_path, data_dir, reference, caplog):
  """The checksums saved with each step catch a flipped bit that Orbax
  reads back silently: the resume uses step 20 and ends identical to an
  uninterrupted run; trm.evaluate's restore (`restore_fields`) also skips
  step 40."""
  from trm import evaluate  # pylint: disable=g-import-not-at-top
  config = _run_config(data_dir)
  workdir = str(tmp_path)
  train.train_and_evaluate(config, workdir, families.build_task)
  newest = os.path.join(workdir, "checkpoints", "40")
  _flip_a_bit_silently(newest)

  with caplog.at_level(logging.WARNING):
    _, source = evaluate.evaluate_checkpoint(config, workdir,
                                             str(tmp_path / "eval"))
  assert source.endswith("checkpoints step 20"), source
  assert (f"Checkpoint {newest} cannot be read (array " in caplog.text
          and "does not match the checksum saved with step 40" in caplog.text)
  assert os.path.isdir(newest)  # evaluation only reads
  caplog.clear()

  with caplog.at_level(logging.WARNING):
    resumed, _ = train.train_and_evaluate(config, workdir, families.build_task)
  warnings = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith(f"Checkpoint {newest} cannot be")]
  assert len(warnings) == 1 and "\n" not in warnings[0]
  assert re.fullmatch(
      rf"Checkpoint {newest} cannot be restored \(array \S+ "
      r"(\(and \d+ more\) )?does not match the checksum saved with step 40: "
      r"its files changed after the save\); falling back to the previous "
      r"one\.", warnings[0]), warnings[0]
  assert int(resumed.step) == 40
  _assert_trees_equal(reference, _host(resumed))
  assert glob.glob(os.path.join(workdir, "checkpoints", "40.unreadable-*"))


# --------------------------------------------------- workdir and failed saves


def test_unwritable_workdir_fails_before_data_or_compile(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a directory")

  def no_build(*args, **kwargs):
    raise AssertionError("the task was built before the workdir check")

  with pytest.raises(run_checks.WorkdirError, match="Cannot write to the workdir"):
    train.train_and_evaluate(tiny_config(), str(blocker / "sub"), no_build)


def test_a_full_workdir_is_named_and_the_probe_not_left(tmp_path,
                                                       monkeypatch):
  """The write probe's file was created, its write failed (a full disk),
  and it stayed behind; the line said to pass a writable --workdir."""
  import errno  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  path_type = type(epath.Path(str(tmp_path)))

  def full(self, *unused_args, **unused_kwargs):
    with open(str(self), "w"):
      pass
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(path_type, "write_text", full)
  with pytest.raises(run_checks.WorkdirError) as error:
    run_checks.check_workdir(str(tmp_path / "run"))
  assert str(error.value).endswith(
      "No space left on device); checkpoints, metrics and config.json go "
      "there. Free space there or pass another --workdir.")
  assert os.listdir(tmp_path / "run") == []


def test_a_probe_a_second_starting_trainer_removed_is_no_error(
    tmp_path, monkeypatch):
  """Two trainers started on one workdir at once write and remove the same
  probe name (.write_test.<process>): the one whose file the other removed
  said "Cannot write to ... Make it writable", not that the workdir is in
  use (the lock's line, after the probes)."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  path_type = type(epath.Path(str(tmp_path)))
  real = path_type.write_text

  def written_then_removed_by_the_other(self, *args, **kwargs):
    count = real(self, *args, **kwargs)
    os.remove(str(self))  # the other trainer's probe.unlink()
    return count

  (tmp_path / "run" / "checkpoints").mkdir(parents=True)
  monkeypatch.setattr(path_type, "write_text",
                      written_then_removed_by_the_other)
  run_checks.check_workdir(str(tmp_path / "run"))  # the workdir's and
  assert os.listdir(tmp_path / "run" / "checkpoints") == []  # checkpoints'


def test_a_workdir_folder_denied_mid_run_is_one_line(tmp_path):
  """A write into the workdir denied during the run (an evaluation's
  outputs folder made read-only then; `check_workdir` refuses one found at
  the start) was a bare "[Errno 13] Permission denied" naming a temporary
  file; one outside the workdir (the data's) is not the workdir's."""
  import errno  # pylint: disable=g-import-not-at-top
  left = str(tmp_path / "run" / "eval_12" / ".sheet.png.0.tmp")

  def denied(path):
    def build_task(*unused_args):
      raise PermissionError(errno.EACCES, "Permission denied", path)
    return build_task

  with pytest.raises(PermissionError) as error:
    train.train_and_evaluate(tiny_config(), str(tmp_path / "run"),
                             denied(str(tmp_path / "data")))
  assert not isinstance(error.value, train.WorkdirWriteError)
  with pytest.raises(train.WorkdirWriteError) as error:
    train.train_and_evaluate(tiny_config(), str(tmp_path / "run"),
                             denied(left))
  assert str(error.value) == (
      f"Writing {left} failed (permission denied). No complete checkpoint "
      f"was written yet. Make {tmp_path}/run/eval_12 writable again and "
      "rerun (it trains from the start).")


def _modes_binding(tmp_path):
  """A command prefix under which a file's mode binds the process: none for
  a user other than root; for root (whom `chmod a-w` does not stop), setpriv
  taking away the capabilities that override modes (`setpriv
  --reuid=nobody` would need the interpreter readable by nobody: a pyenv
  under /root is not). Skips the test where neither binds."""
  prefix = [] if os.geteuid() else [
      "setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
  probe = tmp_path / "modes_probe"
  probe.mkdir(mode=0o555)
  try:
    done = subprocess.run(
        prefix + [sys.executable, "-c",
                  "import sys; open(sys.argv[1] + '/x', 'w')", str(probe)],
        capture_output=True, text=True, timeout=60)
  except OSError as e:  # no setpriv
    pytest.skip(f"as root, a read-only directory needs setpriv: {e}")
  finally:
    probe.chmod(0o755)
  if "PermissionError" not in done.stderr:
    pytest.skip("no read-only directory here: " + (
        "root, and `setpriv --bounding-set=-dac_override,...` "
        + ("still wrote into one" if done.returncode == 0 else
           f"failed: {done.stderr.strip()[-200:]}") if prefix
        else "a non-root user wrote into a directory of mode 555"))
  return prefix


def _set_writable(root, writable: bool) -> None:
  """chmod -R u+w (`writable`) or a-w."""
  for folder, _, files in os.walk(root):
    for path in [folder] + [os.path.join(folder, f) for f in files]:
      mode = os.stat(path).st_mode & 0o7777
      os.chmod(path, mode | 0o200 if writable else mode & ~0o222)


def _tree_digest(root) -> dict:
  """{relative path: sha256 of a file, or None for a directory}."""
  import hashlib  # pylint: disable=g-import-not-at-top
  out = {}
  for folder, dirs, files in os.walk(root):
    for name in dirs:
      out[os.path.relpath(os.path.join(folder, name), root)] = None
    for name in files:
      with open(os.path.join(folder, name), "rb") as f:
        out[os.path.relpath(os.path.join(folder, name), root)] = (
            hashlib.sha256(f.read()).hexdigest())
  return out


def test_a_read_only_workdir_is_one_line_before_the_compile_and_kept(
    tmp_path, data_dir, caplog, monkeypatch):
  """A run stopped after its step-6 checkpoint, its workdir made read-only
  (`chmod -R a-w`) and resumed by `python -m trm.main` as a user the modes
  bind: one line naming the workdir, before the compile, every file as it
  was; made writable again, it resumes. (Untested before session 77: the
  sessions run as root, whom the modes do not stop.) A copy in which only
  step 6 is read-only, resumed with keep_checkpoints=1: one line naming
  the step, before the compile, nothing changed."""
  prefix = _modes_binding(tmp_path)
  workdir = str(tmp_path / "run")
  # test_corrupt_newest_checkpoint_falls_back_and_matches's run, so its
  # program: both compiles here are hits in the session's cache. Stopped
  # as test_train's crash test stops it: at the batch of step 7.
  config = tiny_config(**{"data.data_dir": data_dir, **ONE_AXIS})
  real_to_global, calls = pipeline.to_global, [0]

  def crash_at_step_7(batch, shardings):
    calls[0] += 1
    if calls[0] == 7:
      raise RuntimeError("stopped")
    return real_to_global(batch, shardings)

  monkeypatch.setattr(pipeline, "to_global", crash_at_step_7)
  with pytest.raises(RuntimeError, match="stopped"):
    train.train_and_evaluate(config, workdir, families.build_task)
  monkeypatch.setattr(pipeline, "to_global", real_to_global)
  assert _steps_on_disk(workdir) == [6]
  # A copy whose step 6 alone is read-only, resumed keeping one step: the
  # run trained and saved step 12, then failed at deleting step 6, naming
  # checkpoints/ (writable) as what to make writable (session 77).
  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  before = _tree_digest(workdir)
  _set_writable(workdir, False)
  _set_writable(os.path.join(copy, "checkpoints", "6"), False)
  copied = _tree_digest(copy)

  def resume(where, **overrides):
    return subprocess.run(
        prefix + [sys.executable, "-m", "trm.main",
                  "--config=configs/trm_sudoku.py:cpu", f"--workdir={where}"]
        + _cli_flags(config_lib.set_values(config.copy_and_resolve_references(),
                                           overrides)),
        cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
        capture_output=True, text=True, timeout=300)

  try:
    done = resume(workdir)
    after = _tree_digest(workdir)
    step_done = resume(copy, keep_checkpoints=1)
    assert _tree_digest(copy) == copied
  finally:
    _set_writable(workdir, True)
    _set_writable(copy, True)
  step = os.path.join(copy, "checkpoints", "6")
  errors = [line for line in step_done.stderr.splitlines() if "error:" in line]
  assert step_done.returncode == 2 and errors == [
      f"trm.main: error: {step} is read-only: this run may delete that step "
      "(config.keep_checkpoints=1 keeps the newest and the best), move it "
      "aside (config.resume_step) or write its ranking into it, and would "
      f"fail there after training. Make it writable (chmod -R u+w {step}) "
      f"or move it out of {copy}/checkpoints, then rerun; nothing was "
      "changed."], step_done.stderr[-3000:]
  assert "compiled in" not in step_done.stderr
  assert done.returncode == 2, done.stderr[-3000:]
  assert "Traceback" not in done.stderr, done.stderr[-3000:]
  errors = [line for line in done.stderr.splitlines() if "error:" in line]
  assert errors == [
      f"trm.main: error: Cannot write to the workdir {workdir!r} "
      "(PermissionError: [Errno 13] Permission denied: "
      f"'{workdir}/.write_test.0'); checkpoints, metrics and config.json go "
      "there. Make it writable or pass another --workdir."], errors
  assert "compiled in" not in done.stderr  # refused before the compile
  assert after == before
  with caplog.at_level(logging.INFO):
    resumed, _ = train.train_and_evaluate(config, workdir,
                                          families.build_task)
  assert "Training from step 6 to 12." in caplog.text
  assert int(resumed.step) == 12


def test_read_only_checkpoints_metrics_or_output_dir_are_refused_at_once(
    tmp_path):
  """checkpoints/ or metrics.jsonl read-only in a writable workdir: the run
  compiled and trained to its first save, then said "Free space" with the
  MiB free; the metrics were a bare "[Errno 13] Permission denied". A
  read-only --output_dir (trm.evaluate, the puzzle builders) in a writable
  one: the same bare line, naming a temporary file, after the work. And
  the read-only steps, outputs folders and leftovers in the comments
  below."""
  prefix = _modes_binding(tmp_path)
  checkpoints, metrics = tmp_path / "a", tmp_path / "b"
  output = tmp_path / "out"
  output.mkdir(mode=0o555)
  for workdir in (checkpoints, metrics):
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "metrics.jsonl").write_text('{"step": 1}\n')
  (checkpoints / "checkpoints").chmod(0o555)
  (metrics / "metrics.jsonl").chmod(0o444)
  # Read-only pieces the run deletes, moves or writes into (session 77's
  # probes): a step keep-N deletes (a save's failure after the training,
  # naming checkpoints/), one kept for good by keep_checkpoint_every (left
  # be), an evaluation's outputs folder a step evaluated again writes into
  # (a bare "[Errno 13]" after the training) and an older one (left be).
  steps, outputs, saves = tmp_path / "c", tmp_path / "d", tmp_path / "e"
  for folder in ("c/checkpoints/5", "c/checkpoints/6/state", "d/eval_3",
                 "d/eval_12", "e/checkpoints/4", "e/checkpoints/8",
                 "e/checkpoints/9.orbax-checkpoint-tmp-1"):
    (tmp_path / folder).mkdir(parents=True)
  for name in ckpt_lib._COMMITTED_FILES:  # pylint: disable=protected-access
    (outputs / "checkpoints" / "6" / name).parent.mkdir(parents=True,
                                                        exist_ok=True)
    (outputs / "checkpoints" / "6" / name).write_text("")
  # A killed run's unfinished write in the older one, and its unfinished
  # save, read-only: they were named as removed, or were a bare "[Errno 13]".
  left = outputs / "eval_3" / f".sheet.png.{'a' * 32}.tmp"
  left.write_text("")
  (saves / "checkpoints" / "9.orbax-checkpoint-tmp-1" / "x").write_text("")
  unmode = [steps / "checkpoints/5", steps / "checkpoints/6/state",
            outputs / "eval_3", outputs / "eval_12", saves / "checkpoints/8",
            saves / "checkpoints/9.orbax-checkpoint-tmp-1"]
  for folder in unmode:
    folder.chmod(0o555)
  cases = [(str(steps), {"keep_checkpoints": 1, "keep_checkpoint_every": 5}),
           (str(outputs), {})]
  script = ("import json, sys\nfrom trm.core import run_checks\n"
            "from trm.core import checkpoint, config_lib\n"
            "for workdir in sys.argv[1:3]:\n"
            "  try:\n    run_checks.check_workdir(workdir)\n"
            "  except run_checks.WorkdirError as e:\n    print(e)\n"
            "for workdir, overrides in json.loads(sys.argv[3]):\n"
            "  config = config_lib.set_values(config_lib.load_config(\n"
            "      'configs/trm_sudoku.py', 'cpu'), overrides)\n"
            "  try:\n    run_checks.check_workdir(workdir, config)\n"
            "  except run_checks.WorkdirError as e:\n    print(e)\n"
            "print(run_checks.remove_unfinished_writes(sys.argv[4]))\n"
            "class Manager:\n  directory = sys.argv[5]\n"
            "print(checkpoint._save_error(Manager, PermissionError(\n"
            "    13, 'Permission denied', '_CHECKPOINT_METADATA')))\n"
            "from trm.core import cli\n"
            f"try:\n  cli.check_output_dir({str(output)!r})\n"
            "except ValueError as e:\n  print(e)\n")
  done = subprocess.run(
      prefix + [sys.executable, "-c", script, str(checkpoints), str(metrics),
                json.dumps(cases), str(outputs),
                str(saves / "checkpoints")],
      cwd=ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"),
      capture_output=True, text=True, timeout=120)
  (checkpoints / "checkpoints").chmod(0o755)
  output.chmod(0o755)
  for folder in unmode:
    folder.chmod(0o755)
  assert done.stdout.splitlines() == [
      f"Cannot write to {checkpoints}/checkpoints (PermissionError: [Errno "
      f"13] Permission denied: '{checkpoints}/checkpoints/.write_test.0'); "
      "this run saves its checkpoints there. Make it writable or pass "
      "another --workdir.",
      f"Cannot append to {metrics}/metrics.jsonl (PermissionError: [Errno "
      f"13] Permission denied: '{metrics}/metrics.jsonl'); this run adds "
      "its metrics to it. Make it writable to resume there, set "
      "config.metrics_jsonl=False, or pass another --workdir.",
      f"{steps}/checkpoints/6 is read-only ({steps}/checkpoints/6/state "
      "inside it): this run may delete that step (config.keep_checkpoints=1 "
      "keeps the newest and the best), move it aside (config.resume_step) "
      "or write its ranking into it, and would fail there after training. "
      f"Make it writable (chmod -R u+w {steps}/checkpoints/6) or move it "
      f"out of {steps}/checkpoints, then rerun; nothing was changed.",
      f"{outputs}/eval_12 is read-only: this run may write step 12's "
      "evaluation outputs into it again (or move it aside, "
      "config.resume_step), and would fail there after training. Make it "
      "writable (chmod -R u+w) or move it away, then rerun; nothing was "
      "changed.",
      "[]",
      f"Writing a checkpoint to {saves}/checkpoints failed (PermissionError: "
      "[Errno 13] Permission denied: '_CHECKPOINT_METADATA'). No complete "
      f"checkpoint was written yet. Make {saves}/checkpoints/8 writable and "
      "rerun to resume.",
      f"--output_dir={output}: the directory is not writable; make it "
      "writable or pass another --output_dir."
  ], done.stdout + done.stderr[-2000:]
  assert (f"Could not remove {left}, the unfinished write of a killed run "
          f"(Permission denied); left there. Make {outputs}/eval_3 writable "
          "and delete it." in done.stderr), done.stderr[-2000:]
  assert (f"Could not remove {saves}/checkpoints/9.orbax-checkpoint-tmp-1, "
          "the unfinished save of a run that was killed while saving "
          "(PermissionError: [Errno 13] Permission denied: 'x'); the run "
          "goes on without it. Make it writable and delete it to free its "
          "space." in done.stderr), done.stderr[-2000:]


def test_a_checkpoints_path_that_is_a_file_fails_before_the_data(tmp_path):
  (tmp_path / "checkpoints").write_text("x")

  def no_build(*args, **kwargs):
    raise AssertionError("the task was built before the workdir check")

  for eval_only in (False, True):
    config = tiny_config()
    config.eval_only = eval_only
    with pytest.raises(run_checks.WorkdirError) as error:
      train.train_and_evaluate(config, str(tmp_path), no_build)
  assert str(error.value) == (
      f"{tmp_path}/checkpoints is not a directory: the run keeps its "
      "checkpoints there. Move it away (or pass another --workdir) and "
      "rerun.")


def test_a_run_file_of_the_wrong_kind_fails_before_the_data(tmp_path):
  """A directory where the run replaces a file (an evaluation's record,
  config.json), a file where it fills a directory: found where it was
  written, a bare "[Errno 21] Is a directory" or "[Errno 17] File exists",
  the steps since the last checkpoint trained for nothing. A FIFO as the
  lock hung the run. A FIFO or a link as an evaluation's record is
  replaced when the step is evaluated again: no error."""
  def no_build(*args, **kwargs):
    raise AssertionError("the task was built before the workdir check")

  cases = {"eval_12.json": ("a directory", "record of step 12's evaluation",
                            "file"),
           "eval_12": ("not a directory", "outputs of step 12's evaluation",
                       "directory"),
           "config.json": ("a directory", "config record", "file"),
           # (The lock's read waited for a writer forever.)
           "trainer.lock": ("not a regular file", "workdir lock", "file"),
           # (The JSON-lines writer's read at open would wait forever too.)
           "metrics.jsonl": ("not a regular file", "metrics as JSON lines",
                             "file")}
  for name, (found, what, kind) in cases.items():
    workdir = tmp_path / name.replace(".", "_")
    if name in ("trainer.lock", "metrics.jsonl"):
      workdir.mkdir()
      os.mkfifo(workdir / name)
    elif kind == "file":
      (workdir / name).mkdir(parents=True)
    else:
      workdir.mkdir()
      (workdir / name).write_text("")
    with pytest.raises(run_checks.WorkdirError) as error:
      train.train_and_evaluate(tiny_config(), str(workdir), no_build)
    assert str(error.value) == (
        f"{workdir}/{name} is {found}: the run keeps its {what} there (a "
        f"{kind}). Move it away (or pass another --workdir) and rerun; "
        "nothing was changed.")
    assert sorted(os.listdir(workdir)) == [name]
  fine = tmp_path / "fine"
  fine.mkdir()
  os.mkfifo(fine / "eval_6.json")
  (fine / "eval_12.json").symlink_to(tmp_path)
  run_checks.check_run_file_kinds(str(fine))


# slow: tests/core/test_checkpoint.py's full-disk test fails a save the same way
# and checks the previous checkpoint is kept.
@pytest.mark.slow
def test_failed_save_keeps_the_previous_checkpoint(tmp_path, data_dir,
                                                   monkeypatch):
  from orbax.checkpoint._src.handlers import json_checkpoint_handler  # pylint: disable=g-import-not-at-top
  real_save, calls = json_checkpoint_handler.JsonCheckpointHandler._save_fn, [0]

  async def disk_full_on_second_save(self, x, directory):
    calls[0] += 1
    if calls[0] == 2:
      raise OSError(28, "No space left on device")
    return await real_save(self, x, directory)

  monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler,
                      "_save_fn", disk_full_on_second_save)
  config = tiny_config(**{"data.data_dir": data_dir, "keep_checkpoints": 1})
  workdir = str(tmp_path)
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"no space left on device.*Removed the partial "
                     r"save \(12.orbax-checkpoint-tmp\); the last good "
                     r"checkpoint, .*/checkpoints/6, is kept"):
    train.train_and_evaluate(config, workdir, families.build_task)
  assert _steps_on_disk(workdir) == [6]
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["6"]
  assert not ckpt_lib.missing_files(os.path.join(workdir, "checkpoints", "6"))


# ------------------------------------------------------- restore across meshes


def test_checkpoint_restores_onto_other_meshes_bitwise(tmp_path, data_dir):
  config = tiny_config(**{"data.data_dir": data_dir, "mesh.data": 4,
                          "mesh.fsdp": 1, "mesh.model": 2})
  rules = mesh_lib.logical_rules(config)
  meta, _ = puzzle_format.read_split(data_dir, "train")
  model = trm_program.make_model(config.model, meta)
  init_fn = trm_state.make_init_fn(
      model, steps.make_optimizer(config.optim, config.total_steps),
      config.global_batch_size, config.seed)

  ctx = mesh_lib.ShardingContext(mesh_lib.make_mesh(config.mesh), rules)
  abstract, shardings = state_lib.abstract_state(init_fn, ctx)
  state = state_lib.init_state(init_fn, ctx, shardings)
  # No leaf left at its initial value (Adam moments start as zeros).
  def change(x):
    if x.dtype == jnp.bool_:
      return ~x
    return x * 3 + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x + 2

  state = jax.jit(lambda s: jax.tree.map(change, s),
                  out_shardings=shardings)(state)
  saved = _host(state)
  directory = str(tmp_path / "checkpoints")
  manager = ckpt_lib.make_manager(directory, max_to_keep=1)
  ckpt_lib.save(manager, 5, state, _Position(5))
  ckpt_lib.wait_until_finished(manager)
  kernel = ("params", "L_level", "layers_0", "mlp", "gate_up_proj", "kernel")

  for sizes, devices in [((8, 1, 1), jax.devices()),
                         ((2, 1, 2), jax.devices()[:4])]:
    other = mesh_lib.make_mesh(tiny_config(**{
        f"mesh.{axis}": size for axis, size in zip(mesh_lib.MESH_AXES, sizes)
    }).mesh, devices=devices)
    other_abstract, _ = state_lib.abstract_state(
        init_fn, mesh_lib.ShardingContext(other, rules))
    restored = ckpt_lib.restore_latest(
        ckpt_lib.make_manager(directory, max_to_keep=1), other_abstract,
        _Position())
    _assert_trees_equal(saved, _host(restored))
    leaf = restored
    for name in kernel:
      leaf = getattr(leaf, name) if name == "params" else leaf[name]
    assert leaf.sharding.mesh.shape == dict(zip(mesh_lib.MESH_AXES, sizes))
    assert {d.id for d in leaf.sharding.device_set} == {d.id for d in devices}
    for x in jax.tree.leaves(restored.opt_state):
      assert x.sharding.mesh.devices.size == len(devices)


def test_streak_metric_keeps_the_longest_run_of_an_interval():
  def streak(n):
    return state_lib.Counter(jnp.int32(n), jnp.int32(1), keep_max=True)

  merged = streak(0)
  for n in (1, 2, 3, 0, 1):  # a run of 3 that recovered inside the interval
    merged = merged.merge(streak(n))
  assert int(merged.compute()) == 3
  total = state_lib.Counter(jnp.int32(4), jnp.int32(1)).merge(
      state_lib.Counter(jnp.int32(5), jnp.int32(1)))
  assert int(total.compute()) == 5
