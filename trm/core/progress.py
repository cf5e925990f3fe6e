"""Progress reports whose steps/s and ETA count training time only.

CLU's `ReportProgress` divides the steps since its last report by the wall
time since then, evaluation and checkpoint saves included, so the rate
dropped (and the ETA jumped) after every evaluation. `TrainProgress.timed`
pauses that clock instead: the time spent inside the block still shows in
the report's breakdown ("12.0% eval"), but not in steps/s, the ETA, or the
every-`every_secs` cadence.

The report is a log line of its own, "step 120/1000 (12.0%), 3.2 steps/s,
ETA 4m35s, 12.0% eval" (CLU's sets a work unit's notes, which a local run
logs as "Setting work unit notes: ..."), plus the `steps_per_sec` and
`uptime` scalars at that step, and `examples_per_sec` (steps/s times the
examples each step trains on) when the examples per step are given.
"""
from __future__ import annotations

import contextlib
import time

import jax
from absl import logging
from clu import periodic_actions


def format_seconds(seconds: float) -> str:
  """4m41s, 1h02m, 35s, 2d03h: two units at most."""
  seconds = max(0, int(round(seconds)))
  days, rest = divmod(seconds, 86400)
  hours, rest = divmod(rest, 3600)
  minutes, secs = divmod(rest, 60)
  if days:
    return f"{days}d{hours:02d}h"
  if hours:
    return f"{hours}h{minutes:02d}m"
  if minutes:
    return f"{minutes}m{secs:02d}s"
  return f"{secs}s"


def progress_line(step: int, total: int | None, steps_per_sec: float,
                  parts: dict[str, float], uptime: float) -> str:
  """'step 120/1000 (12.0%), 3.2 steps/s, ETA 4m35s, 12.0% eval'; `parts`
  are the seconds spent in timed blocks, shown as shares of `uptime`."""
  line = f"step {step}"
  if total:
    line += f"/{total} ({100 * step / total:.1f}%)"
  rate = (f"{steps_per_sec:.0f}" if steps_per_sec >= 100
          else f"{steps_per_sec:.3g}")  # 1234, 16.2, 3.2, 0.5
  line += f", {rate} steps/s"
  if total and steps_per_sec > 0:
    line += f", ETA {format_seconds((total - step) / steps_per_sec)}"
  if uptime > 0:
    line += "".join(f", {100 * seconds / uptime:.1f}% {name}"
                    for name, seconds in sorted(parts.items()))
  return line


class TrainProgress(periodic_actions.ReportProgress):
  """`ReportProgress` with `timed` blocks left out of the step rate, and
  its report as a log line of our own."""

  def __init__(self, *, examples_per_step: int | None = None, **kwargs):
    super().__init__(**kwargs)
    self._examples_per_step = examples_per_step

  def _apply(self, step: int, t: float):
    steps_per_sec = (step - self._previous_step) / (t - self._previous_time)
    uptime = time.monotonic() - self._t0
    logging.info("%s", progress_line(step, self._num_train_steps,
                                     steps_per_sec, self._time_per_part,
                                     uptime))
    if self._writer is not None:
      scalars = {"steps_per_sec": steps_per_sec, "uptime": uptime}
      if self._examples_per_step:
        scalars["examples_per_sec"] = steps_per_sec * self._examples_per_step
      self._writer.write_scalars(step, scalars)

  @contextlib.contextmanager
  def timed(self, name: str, barrier=None):  # pylint: disable=arguments-renamed
    """Leaves the block's wall time out of the step rate.

    `barrier` (e.g. the train state) is waited for before the clock stops,
    so train steps still running on the devices (dispatched ahead) count as
    training, not as part of the block. Wall time of the Python statements
    is measured (CLU's version measures on a side thread): every block timed
    here fetches its results before it ends anyway.
    """
    if barrier is not None:
      jax.block_until_ready(barrier)
    start = time.monotonic()
    try:
      yield
    finally:
      seconds = time.monotonic() - start
      self._time_per_part[name] += seconds
      if self._previous_time is not None:  # no report yet: nothing to pause
        self._previous_time += seconds


class ProfileWindow:
  """A `jax.profiler` trace of `num_steps` train steps, once per run, as
  MaxText's `profiler=xplane` takes it: `skip_steps` steps after the run's
  first (compilation and warm-up are not in it), on process 0, into
  `<logdir>/plugins/profile/<time>/` where TensorBoard's profile tab reads
  it. The host runs ahead of the devices, so the trace ends only once the
  last traced step is done (`barrier`). `num_steps=0`: no trace. A window
  that starts at or past `end_step` (the run's last step) traces nothing,
  and says so (MaxText refuses it)."""

  def __init__(self, logdir: str, start_step: int, skip_steps: int,
               num_steps: int, end_step: int | None = None):
    self._logdir = logdir
    self._first = start_step + skip_steps  # steps done when it starts
    self._last = self._first + num_steps
    self._enabled = num_steps > 0
    self._running = False
    if self._enabled and end_step is not None and self._first >= end_step:
      # profiler_steps asked for a trace; none would come, without a word.
      logging.warning(
          "Not profiling: the window starts after step %d "
          "(skip_first_n_steps_for_profiler=%d from step %d), and the run "
          "ends at step %d; lower skip_first_n_steps_for_profiler.",
          self._first, skip_steps, start_step, end_step)
      self._enabled = False

  def __call__(self, step: int, barrier=None) -> None:
    """After each train step; `step` counts the steps done."""
    if not self._enabled:
      return
    if step == self._first and not self._running:
      if barrier is not None:  # the steps before the window stay out of it
        jax.block_until_ready(barrier)
      try:
        jax.profiler.start_trace(self._logdir)
      except Exception as e:  # pylint: disable=broad-except
        # A trace must never end a run (another trace already running, a
        # log directory the profiler cannot write), as CLU's Profile.
        logging.warning("Not profiling: jax.profiler.start_trace(%r) failed: "
                        "%s: %s", self._logdir, type(e).__name__, e)
        self._enabled = False
        return
      self._running = True
      logging.info("Profiling steps %d to %d into %s/plugins/profile.",
                   self._first + 1, self._last, self._logdir)
    elif step == self._last and self._running:
      self.close(barrier)

  def close(self, barrier=None) -> None:
    """Ends a trace still running (also a run that stops inside the
    window)."""
    if not self._running:
      return
    self._running = False
    try:
      if barrier is not None:
        jax.block_until_ready(barrier)
    finally:
      try:
        jax.profiler.stop_trace()
        logging.info("Profile written to %s/plugins/profile.", self._logdir)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("The profile of %s was not written: %s: %s",
                        self._logdir, type(e).__name__, e)
