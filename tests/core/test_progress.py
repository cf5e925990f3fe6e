"""`trm.core.progress.TrainProgress`: steps/s and ETA leave out timed blocks."""
import time

import pytest

from clu import periodic_actions

from trm.core import progress


class _Recorder:
  """Keeps the scalars written to it (all ReportProgress writes)."""

  def __init__(self):
    self.scalars = []

  def write_scalars(self, step, scalars):
    self.scalars.append((step, dict(scalars)))


class _Clock:
  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


def _run(report_cls, monkeypatch, **kwargs):
  """10 steps of 0.1 s, a 5 s evaluation after step 5; the steps/s reported
  at step 10 (`every_steps=5`). `kwargs` go to `report_cls`."""
  clock = _Clock()
  monkeypatch.setattr(time, "monotonic", clock)
  writer = _Recorder()
  report = report_cls(num_train_steps=100, writer=writer, every_steps=5,
                      every_secs=None, **kwargs)
  report(0)
  for step in range(1, 11):
    clock.now += 0.1
    report(step)
    if step == 5:
      with report.timed("eval"):
        clock.now += 5.0
  rates = {step: s["steps_per_sec"] for step, s in writer.scalars
           if "steps_per_sec" in s}
  return rates, report


def test_eval_time_is_not_step_time(monkeypatch):
  rates, report = _run(progress.TrainProgress, monkeypatch)
  assert abs(rates[5] - 10.0) < 1e-6
  assert abs(rates[10] - 10.0) < 1e-6  # 5 steps in 0.5 s of training
  assert abs(report._time_per_part["eval"] - 5.0) < 1e-6  # still reported


def test_examples_per_sec_is_the_step_rate_times_the_batch(monkeypatch):
  """Nothing reported examples/s before (CLU's hook has no batch size)."""
  _, report = _run(progress.TrainProgress, monkeypatch, examples_per_step=64)
  rates = {step: s["examples_per_sec"] for step, s in report._writer.scalars}
  assert list(rates) == [5, 10]
  assert abs(rates[10] - 640.0) < 1e-6  # 5 steps of 64 in 0.5 s of training


def test_clu_counts_eval_as_step_time(monkeypatch):
  """What the subclass fixes (so the test above can tell the two apart)."""
  rates, _ = _run(periodic_actions.ReportProgress, monkeypatch)
  assert abs(rates[10] - 5 / 5.5) < 1e-6


def test_timed_before_the_first_report(monkeypatch):
  """A block before the first step (an eval_only run) changes nothing."""
  clock = _Clock()
  monkeypatch.setattr(time, "monotonic", clock)
  report = progress.TrainProgress(num_train_steps=10, every_steps=2,
                                  every_secs=None)
  with report.timed("eval"):
    clock.now += 3.0
  assert report._time_per_part["eval"] == 3.0


def test_the_report_is_a_line_of_our_own(monkeypatch):
  """'step 10/100 (10.0%), 10 steps/s, ETA 9s, 83.3% eval', never CLU's
  'Setting work unit notes: ...'."""
  from log_lines import absl_lines  # pylint: disable=g-import-not-at-top
  with absl_lines() as lines:
    _run(progress.TrainProgress, monkeypatch)
  assert not any("work unit" in line for line in lines), lines
  assert "step 5/100 (5.0%), 10 steps/s, ETA 10s" in lines
  assert "step 10/100 (10.0%), 10 steps/s, ETA 9s, 83.3% eval" in lines


def test_format_seconds():
  assert [progress.format_seconds(s) for s in (0.4, 35, 281, 3720, 183600)
          ] == ["0s", "35s", "4m41s", "1h02m", "2d03h"]
  assert (progress.progress_line(120, 1000, 3.2, {"eval": 12.0}, 100.0)
          == "step 120/1000 (12.0%), 3.2 steps/s, ETA 4m35s, 12.0% eval")
  assert progress.progress_line(7, None, 0.5, {}, 0.0) == "step 7, 0.5 steps/s"
  assert progress.progress_line(7, None, 1234.5, {}, 0.0) == (
      "step 7, 1234 steps/s")


def test_the_profile_window_traces_the_configured_steps(monkeypatch):
  """MaxText's window: `skip` steps after the run's first, `n` steps long,
  closed by a run that ends inside it; n=0 traces nothing."""
  calls, now = [], [None]  # (event, steps done when it happened)
  monkeypatch.setattr(progress.jax.profiler, "start_trace",
                      lambda logdir: calls.append(("start", now[0], logdir)))
  monkeypatch.setattr(progress.jax.profiler, "stop_trace",
                      lambda: calls.append(("stop", now[0])))

  def run(start, skip, n, end):
    calls.clear()
    window = progress.ProfileWindow("/w", start, skip, n)
    for step in range(start, end + 1):  # `start`: before the first step
      now[0] = step
      window(step)
    window.close()
    return calls

  assert run(10, 0, 2, 20) == [("start", 10, "/w"), ("stop", 12)]
  # A resume at step 10 skips its own first steps, not the run's first 10.
  assert run(10, 3, 2, 20) == [("start", 13, "/w"), ("stop", 15)]
  # A run ending inside the window closes it.
  assert run(0, 5, 10, 8) == [("start", 5, "/w"), ("stop", 8)]
  assert run(0, 1, 0, 8) == []


def test_a_profile_window_past_the_run_s_end_says_so(monkeypatch, caplog):
  """profiler_steps=5 with a skip past total_steps (a resume near the end)
  traced nothing and said nothing; MaxText refuses such a window."""
  monkeypatch.setattr(progress.jax.profiler, "start_trace",
                      lambda logdir: pytest.fail("nothing to trace"))
  window = progress.ProfileWindow("/w", 95, 5, 5, end_step=100)
  for step in range(95, 101):
    window(step)
  window.close()
  assert "Not profiling: the window starts after step 100" in caplog.text
  caplog.clear()
  progress.ProfileWindow("/w", 94, 5, 5, end_step=100)  # step 100 is traced
  progress.ProfileWindow("/w", 0, 5, 0, end_step=1)  # asked for none
  assert "Not profiling" not in caplog.text


def test_a_profile_that_cannot_start_does_not_end_the_run(monkeypatch,
                                                          caplog):
  def refuse(logdir):
    raise RuntimeError("Profile has already been started.")

  monkeypatch.setattr(progress.jax.profiler, "start_trace", refuse)
  monkeypatch.setattr(progress.jax.profiler, "stop_trace",
                      lambda: pytest.fail("no trace was started"))
  window = progress.ProfileWindow("/w", 0, 1, 2)
  for step in range(5):
    window(step)
  window.close()
  assert "Not profiling" in caplog.text and "already been started" in (
      caplog.text)
