"""benchmarks/reliability/kill_resume.py's metrics check: a killed and
resumed run's events files, as TensorBoard reads them, against an
uninterrupted run's."""
import time

import repo

from trm.core import metrics

kill_resume = repo.load_script("benchmarks", "reliability", "kill_resume.py")


def _write(logdir, points):
  writer = metrics.create_default_writer(str(logdir), asynchronous=False)
  for step, loss in points:
    writer.write_scalars(step, {"train/loss": loss, "eval/seconds": time.time(),
                                "timing/ms_per_step": 1.0})
  writer.close()
  time.sleep(1.1)  # a restart's file gets a later name (seconds)


def test_a_resumed_run_that_rewrote_its_steps_matches(tmp_path):
  _write(tmp_path / "whole", [(3, 1.0), (5, 0.9), (6, 0.8), (9, 0.7)])
  # Killed after step 6 was written, checkpoint 5: the restart writes 6
  # and 9 again (the same values, as a bit-identical resume does).
  _write(tmp_path / "killed", [(3, 1.0), (5, 0.9), (6, 0.8)])
  _write(tmp_path / "killed", [(6, 0.8), (9, 0.7)])
  whole = kill_resume.metrics_record(str(tmp_path / "whole"))
  assert list(whole) == ["train/loss"]  # timing left out
  assert kill_resume.metrics_difference(
      kill_resume.metrics_record(str(tmp_path / "killed")), whole) is None


def test_lost_and_changed_steps_are_named(tmp_path):
  _write(tmp_path / "whole", [(3, 1.0), (5, 0.9), (6, 0.8), (9, 0.7)])
  _write(tmp_path / "lost", [(3, 1.0), (6, 0.8), (9, 0.7)])
  _write(tmp_path / "changed", [(3, 1.0), (5, 0.9), (6, 0.8), (9, 0.6)])
  whole = kill_resume.metrics_record(str(tmp_path / "whole"))
  assert kill_resume.metrics_difference(
      kill_resume.metrics_record(str(tmp_path / "lost")), whole) == (
          "train/loss at steps [3, 6, 9], reference [3, 5, 6, 9]")
  assert kill_resume.metrics_difference(
      kill_resume.metrics_record(str(tmp_path / "changed")), whole) == (
          "train/loss differs at steps [9]")
