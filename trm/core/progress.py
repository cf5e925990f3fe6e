"""Progress reports whose steps/s and ETA count training time only.

CLU's `ReportProgress` divides the steps since its last report by the wall
time since then, evaluation and checkpoint saves included, so the rate
dropped (and the ETA jumped) after every evaluation. `TrainProgress.timed`
pauses that clock instead: the time spent inside the block still shows in
the report's breakdown ("12.0% eval"), but not in steps/s, the ETA, or the
every-`every_secs` cadence.
"""
from __future__ import annotations

import contextlib
import time

import jax
from clu import periodic_actions


class TrainProgress(periodic_actions.ReportProgress):
  """`ReportProgress` with `timed` blocks left out of the step rate."""

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
