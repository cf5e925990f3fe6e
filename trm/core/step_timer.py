"""Seconds per step between log points, MFU when the FLOPs are known, and
tokens/s (all devices, and per device as MaxText logs it) for language
models."""
from __future__ import annotations

import contextlib
import time

import jax
from absl import logging


class StepTimer:
  """Time per step between log points, and MFU when the task knows its
  FLOPs per step (nanoGPT's estimate_mfu: a running average that starts
  after the first intervals, against the peak of the devices in use).

  The loop dispatches ahead (`trm.core.dispatch`), so an interval ends at
  the newest step known to have finished when `interval` is called, not at
  the step just dispatched: after an evaluation or a save the devices start
  idle and the next steps dispatch without waiting, and counting them as
  done made the interval after every evaluation read 2.4 ms instead of
  ~37 ms (MFU 114%) on the CPU recipe.
  """

  def __init__(self, flops_per_step, compute_dtype: str,
               tokens_per_step: int | None = None):
    self._flops = flops_per_step
    self._tokens = tokens_per_step
    self._peak = None
    if flops_per_step:
      from trm.core import mfu  # pylint: disable=g-import-not-at-top
      self._peak, description = mfu.peak_flops(jax.devices()[0],
                                               compute_dtype)
      logging.info("MFU is measured against %.3g TFLOP/s per device (%s).",
                   self._peak / 1e12, description)
    # Tokens/s per device divides by every device of the job (MaxText's
    # Tokens/s/device), CPU ones included; MFU does not divide by CPU
    # devices (even forced ones): they share one machine's cores, which the
    # measured peak already covers.
    self._all_devices = jax.device_count()
    self._devices = (1 if jax.devices()[0].platform == "cpu"
                     else self._all_devices)
    self._running_mfu = None
    self._intervals = 0
    self._mark = None  # (time, newest step known finished); None: warm-up
    self._seconds = 0.0  # measured since the last reported interval
    self._steps = 0

  def _measure_to(self, now: float, done: int) -> None:
    start, start_done = self._mark
    if done > start_done:  # else none finished since: the time runs on
      self._seconds += now - start
      self._steps += done - start_done
      self._mark = (now, done)

  @contextlib.contextmanager
  def paused(self, step: int):
    """A block whose time is not step time, entered with the devices idle
    (the caller waited for the state): the steps up to `step` are measured
    to its start, and measuring goes on from its end."""
    if self._mark is not None:
      self._measure_to(time.time(), step)
    try:
      yield
    finally:
      if self._mark is not None:  # warm-up (compilation) still ends later
        self._mark = (time.time(), step)

  def interval(self, step: int, unfinished: int = 0) -> dict:
    """{'timing/ms_per_step', 'timing/mfu_percent', 'timing/tokens_per_sec',
    'timing/tokens_per_sec_per_device'} for the steps finished
    since the last call, `unfinished` of the `step` dispatched still running
    or queued (`DispatchBound.unfinished`). Empty for the first interval,
    which includes warm-up, and while no step finished since the last."""
    now = time.time()
    done = step - unfinished
    if self._mark is None:
      self._mark = (now, done)
      self._intervals += 1
      return {}
    self._measure_to(now, done)
    if not self._steps:
      return {}
    seconds = self._seconds / self._steps
    self._seconds, self._steps = 0.0, 0
    self._intervals += 1
    timing = {"timing/ms_per_step": 1000 * seconds}
    if self._tokens:
      per_second = self._tokens / seconds
      timing["timing/tokens_per_sec"] = per_second
      timing["timing/tokens_per_sec_per_device"] = (
          per_second / self._all_devices)
    if self._flops:
      from trm.core import mfu  # pylint: disable=g-import-not-at-top
      value = 100 * mfu.mfu(self._flops, seconds, self._devices, self._peak)
      if self._intervals > 5:  # as nanoGPT: skip the first iterations
        self._running_mfu = (value if self._running_mfu is None
                             else 0.9 * self._running_mfu + 0.1 * value)
      if self._running_mfu is not None:
        timing["timing/mfu_percent"] = self._running_mfu
    return timing

  def log(self, step: int, values: dict, timing: dict) -> None:
    """nanoGPT's progress line, then tokens/s (MaxText's figure)."""
    line = f"iter {step}: loss {values.get('loss', float('nan')):.4f}"
    line += f", time {timing['timing/ms_per_step']:.2f}ms"
    if "timing/mfu_percent" in timing:
      line += f", mfu {timing['timing/mfu_percent']:.2f}%"
    if "timing/tokens_per_sec" in timing:
      line += (f", {timing['timing/tokens_per_sec']:.0f} tokens/s "
               f"({timing['timing/tokens_per_sec_per_device']:.0f} per "
               "device)")
    logging.info(line)
