"""Early stopping (Hugging Face's EarlyStoppingCallback): its count, and
the loop's stop, save and rerun, on the toy family (8 CPU devices, the
batch split over all of them)."""
import logging
import math
import re

import jax
import ml_collections
import pytest

from trm.core import checkpoint as ckpt_lib
from trm.core import config_lib
from trm.core import early_stopping
from trm.core import run_checks
from trm.core import train
from trm import families


def _counts(losses, patience=2, threshold=0.02):
  stopping = early_stopping.EarlyStopping(patience, threshold, None)
  seen = []
  for loss in losses:
    stopping.update(loss)
    seen.append((stopping.count, stopping.exhausted))
  return stopping, seen


def test_the_count_is_hugging_faces():
  """An evaluation improves when it is below the best of all earlier ones
  by more than the threshold; the best follows every lower loss (as HF's
  best_metric); a NaN never improves; no loss changes nothing."""
  stopping, seen = _counts([1.0, 0.95, 0.94, None, 0.96, 0.5, math.nan,
                            0.49, 0.46])
  assert seen == [(0, False), (0, False), (1, False), (1, False),
                  (2, True), (0, False), (1, False), (2, True), (0, False)]
  assert stopping.best == 0.46
  # Patience 0: counted, never exhausted.
  assert not _counts([1.0, 1.0, 1.0], patience=0)[0].exhausted
  # The starting weights' evaluation (eval_at_start) sets the best only.
  stopping = early_stopping.EarlyStopping(1, 0.0, None)
  stopping.update(1.0, counts=False)
  stopping.update(1.0)
  assert (stopping.count, stopping.best) == (1, 1.0)
  # What a checkpoint keeps, and a resume reads (or, from a checkpoint
  # written before, starts at the run's best with nothing counted).
  config = config_lib.set_values(_toy_config(), {
      "early_stopping_patience": 3})
  assert early_stopping.EarlyStopping(1, 0.0, None).record() == {
      "best": None, "count": 0}
  again = early_stopping.EarlyStopping.resumed(config, stopping.record(), 5.0)
  assert (again.patience, again.best, again.count) == (3, 1.0, 1)
  fresh = early_stopping.EarlyStopping.resumed(config, None, 5.0)
  assert (fresh.best, fresh.count) == (5.0, 0)


@pytest.mark.parametrize("values, message", [
    ({"early_stopping_patience": -1}, r"config.early_stopping_patience=-1 "
     r"must be an integer >= 0"),
    ({"early_stopping_patience": 2, "early_stopping_threshold": -0.1},
     r"config.early_stopping_threshold=-0.1 must be a number >= 0"),
    ({"early_stopping_threshold": 0.1}, r"config.early_stopping_threshold="
     r"0.1 does nothing with config.early_stopping_patience=0"),
])
def test_bad_early_stopping_values_are_one_line(values, message):
  with pytest.raises(ValueError, match=message):
    run_checks.check_values(config_lib.set_values(_toy_config(), values))


@pytest.mark.parametrize("patience, threshold, message", [
    (2.5, 0.0, r"early_stopping_patience=2.5 must be an integer >= 0"),
    (True, 0.0, r"early_stopping_patience=True must be an integer >= 0"),
    ("3", 0.0, r"early_stopping_patience='3' must be an integer >= 0"),
    (3, "0.1", r"early_stopping_threshold='0.1' must be a number >= 0"),
    (3, None, r"early_stopping_threshold=None must be a number >= 0"),
])
def test_early_stopping_values_of_another_type_are_one_line(
    patience, threshold, message):
  """A config file's values may be of any type: before, a patience of 2.5
  stopped after 3 evaluations and True after 1 without a word, and a string
  or None was a TypeError's traceback."""
  config = ml_collections.ConfigDict({"early_stopping_patience": patience,
                                      "early_stopping_threshold": threshold})
  with pytest.raises(ValueError, match=r"^config\." + message):
    run_checks.check_early_stopping(config)


@pytest.mark.parametrize("values, message", [
    ({"best_metric": 3}, r"config\.best_metric=3 must name a held-out "
     r"metric"),
    ({"best_metric": "eval/"}, r"config\.best_metric='eval/' must name"),
    ({"best_metric_mode": "higher"}, r"config\.best_metric_mode='higher' "
     r"must be 'min' \(lower is better\), 'max'"),
    ({"best_metric": "eval/seconds"}, r"config\.best_metric='eval/seconds' "
     r"with best_metric_mode='auto': .* set best_metric_mode to 'min' or"),
])
def test_bad_best_metric_values_are_one_line(values, message):
  """Hugging Face's metric_for_best_model and greater_is_better: refused
  before anything is built (`run_checks.check_values`)."""
  from trm.core import best_metric  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"best_metric": "eval/loss",
                                      "best_metric_mode": "auto", **values})
  with pytest.raises(ValueError, match="^" + message):
    best_metric.check_config(config)
  if values == {"best_metric_mode": "higher"}:
    with pytest.raises(ValueError, match=message):
      run_checks.check_values(config_lib.set_values(_toy_config(), values))


def test_a_max_metric_counts_rises_as_improvements():
  """config.best_metric='exact_accuracy' (TRM's paper metric; auto: max):
  the count runs on its score (negated), so an accuracy that rises by more
  than the threshold improves, and the stop line names the metric."""
  from trm.core import best_metric  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({
      "early_stopping_patience": 2, "early_stopping_threshold": 0.01,
      "best_metric": "exact_accuracy", "best_metric_mode": "auto"})
  metric = best_metric.spec(config)
  assert metric == ("eval/exact_accuracy", "max")
  assert best_metric.spec(ml_collections.ConfigDict()) == ("eval/loss", "min")
  stopping = early_stopping.EarlyStopping.resumed(config, None, None)
  for accuracy in (0.5, 0.6, 0.605, 0.59):
    stopping.update(best_metric.score({"eval/exact_accuracy": accuracy},
                                      metric))
  assert (stopping.count, stopping.exhausted, stopping.best) == (2, True,
                                                                 -0.605)
  assert ("2 evaluation(s) in a row with no eval/exact_accuracy more than "
          "0.01 above the best (0.605;") in stopping.reason()
  assert best_metric.score({"eval/loss": 1.0}, metric) is None


def test_a_metric_the_evaluation_lacks_warns_once(caplog):
  """A task whose evaluation reports no eval/loss (early stopping's
  default metric) never stops early: the first evaluation without it
  warns once, naming the metric and those reported; the count stays."""
  stopping = early_stopping.EarlyStopping(1, 0.0, None)
  with caplog.at_level(logging.WARNING):
    for _ in range(3):
      stopping.watch({"eval/exact_accuracy": 0.5, "eval/seconds": 2.0})
  assert caplog.text.count("watches eval/loss") == 1
  assert ("config.early_stopping_patience=1 watches eval/loss, which this "
          "task's evaluation does not report (it reports: "
          "eval/exact_accuracy): the run never stops early.") in caplog.text
  assert (stopping.count, stopping.exhausted) == (0, False)
  caplog.clear()
  quiet = early_stopping.EarlyStopping(0, 0.0, None)  # no early stopping
  with caplog.at_level(logging.WARNING):
    quiet.watch({"eval/exact_accuracy": 0.5})
    stopping.watch({"eval/loss": 1.0})
    stopping.watch({"eval/loss": 1.0})
  assert not caplog.text and stopping.exhausted


def _toy_config(**values):
  import toy_config  # pylint: disable=g-import-not-at-top  (registers it)
  config = toy_config.get_config()
  config = config_lib.set_values(config, {
      "total_steps": 12, "eval_every": 3, "checkpoint_every": 12,
      "keep_checkpoints": 3, "log_every": 4, **values})
  return config


def test_the_run_stops_saves_and_a_rerun_only_evaluates(tmp_path, caplog):
  """Patience 1 with a threshold no evaluation beats: the evaluation at 3
  improves on none (the first), the one at 6 does not, so the run stops at
  6, saving it although 12 is the next save; a rerun of the workdir only
  evaluates it; a larger patience trains on, the count carrying over (the
  stop at 9 counts the evaluation at 6)."""
  run = lambda patience: train.train_and_evaluate(
      _toy_config(early_stopping_patience=patience,
                  early_stopping_threshold=100.0), str(tmp_path),
      families.build_task)
  with caplog.at_level(logging.INFO):
    state, _ = run(1)
  assert int(state.step) == 6
  assert ckpt_lib.complete_steps(tmp_path / "checkpoints") == [6]
  assert ("Early stopping at step 6: 1 evaluation(s) in a row with no "
          "eval/loss more than 100 below the best (") in caplog.text
  assert "Step 6 is saved; a rerun of this workdir only evaluates it" in (
      caplog.text)
  assert ckpt_lib.step_metadata(tmp_path / "checkpoints" / "6")[
      ckpt_lib.EARLY_STOPPING]["count"] == 1
  caplog.clear()
  with caplog.at_level(logging.INFO):
    state, results = run(1)
  assert int(state.step) == 6 and "eval/loss" in results
  assert "Step 6: the run stopped early there" in caplog.text
  assert "Training from step" not in caplog.text
  assert ckpt_lib.complete_steps(tmp_path / "checkpoints") == [6]
  state, _ = run(2)
  assert int(state.step) == 9
  assert ckpt_lib.complete_steps(tmp_path / "checkpoints") == [6, 9]
  # config.best_metric: a name the task's eval step does not report is one
  # line listing those it does, before anything is compiled.
  with pytest.raises(ValueError, match=re.escape(
      "config.best_metric='eval/exact_accuracy' is not a metric this task's "
      "evaluation reports (its eval step's metrics: eval/accuracy, "
      "eval/loss); set it to one of them.")):
    train.train_and_evaluate(_toy_config(best_metric="exact_accuracy"),
                             str(tmp_path / "other"), families.build_task)
  # A resume that ranks by another metric: the steps are ranked again from
  # their eval files, and the count (at the patience: stopped) starts
  # afresh, so the run trains on to its end.
  caplog.clear()
  with caplog.at_level(logging.INFO):
    state, _ = train.train_and_evaluate(
        _toy_config(early_stopping_patience=2, early_stopping_threshold=100.0,
                    best_metric="accuracy"), str(tmp_path),
        families.build_task)
  assert int(state.step) == 12
  assert ("checkpoint 9 was ranked by eval/loss, this run ranks by "
          "eval/accuracy (higher is better, config.best_metric)") in (
              caplog.text)
  tag = {"name": "eval/accuracy", "mode": "max"}
  for step in (6, 9, 12):
    assert ckpt_lib.read_loss_record(
        tmp_path / "checkpoints" / str(step) / "metrics" / "metrics",
        ckpt_lib.EVAL_LOSS) == -ckpt_lib.read_loss_record(
            tmp_path / f"eval_{step}.json", "eval/accuracy")
    assert ckpt_lib.read_record(tmp_path / "checkpoints" / str(step) /
                                "metrics" / "metrics")["best_metric"] == tag
  assert jax.device_count() == 8


def test_a_redone_evaluation_at_resume_can_stop_the_run(tmp_path, caplog,
                                                        monkeypatch):
  """Preempted at step 6, an evaluation step, before its evaluation: the
  resumed run redoes it first, and with patience 1 that evaluation ends the
  run there, as the uninterrupted run ended (untested before); the stop is
  recorded in step 6, so a rerun only evaluates."""
  from trm.core import preemption as preemption_lib  # pylint: disable=g-import-not-at-top
  config = _toy_config(early_stopping_patience=1,
                       early_stopping_threshold=100.0)
  real = preemption_lib.PreemptionWatch.reached
  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached",
                      lambda self, step: step == 6 or real(self, step))
  with pytest.raises(train.Preempted, match=r"Preempted at step 6 "):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  monkeypatch.setattr(preemption_lib.PreemptionWatch, "reached", real)
  checkpoints = tmp_path / "checkpoints"
  assert ckpt_lib.saved_eval_owed(
      ckpt_lib.make_manager(str(checkpoints), max_to_keep=3), 6)
  with caplog.at_level(logging.INFO):
    state, _ = train.train_and_evaluate(config, str(tmp_path),
                                        families.build_task)
  assert int(state.step) == 6
  assert "Step 6: redoing the evaluation the preemption cut short" in (
      caplog.text)
  assert "Early stopping at step 6: 1 evaluation(s) in a row" in caplog.text
  assert "Training from step" not in caplog.text
  assert ckpt_lib.complete_steps(checkpoints) == [6]
  assert ckpt_lib.step_metadata(checkpoints / "6")[
      ckpt_lib.EARLY_STOPPING]["count"] == 1
  caplog.clear()
  with caplog.at_level(logging.INFO):
    state, _ = train.train_and_evaluate(config, str(tmp_path),
                                        families.build_task)
  assert int(state.step) == 6
  assert "Step 6: the run stopped early there" in caplog.text
