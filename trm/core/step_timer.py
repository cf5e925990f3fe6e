"""Seconds per step between log points, and MFU when the FLOPs are known."""
from __future__ import annotations

import time

import jax
from absl import logging


class StepTimer:
  """Time per step between log points, and MFU when the task knows its
  FLOPs per step (nanoGPT's estimate_mfu: a running average that starts
  after the first intervals, against the peak of the devices in use)."""

  def __init__(self, flops_per_step, compute_dtype: str):
    self._flops = flops_per_step
    self._peak = None
    if flops_per_step:
      from trm.core import mfu  # pylint: disable=g-import-not-at-top
      self._peak, description = mfu.peak_flops(jax.devices()[0],
                                               compute_dtype)
      logging.info("MFU is measured against %.3g TFLOP/s per device (%s).",
                   self._peak / 1e12, description)
    # CPU devices (even forced ones) share one machine's cores, which the
    # measured peak already covers.
    self._devices = (1 if jax.devices()[0].platform == "cpu"
                     else jax.device_count())
    self._running_mfu = None
    self._intervals = 0
    self.restart(None)

  def restart(self, step) -> None:
    self._start_time, self._start_step = time.time(), step

  def interval(self, step: int) -> dict:
    """{'timing/ms_per_step', 'timing/mfu_percent'} for the steps since the
    last call (empty for the first interval, which includes warm-up)."""
    now, start, start_step = time.time(), self._start_time, self._start_step
    self.restart(step)
    self._intervals += 1
    if start_step is None or step <= start_step:
      return {}
    seconds = (now - start) / (step - start_step)
    timing = {"timing/ms_per_step": 1000 * seconds}
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
    """nanoGPT's progress line."""
    line = f"iter {step}: loss {values.get('loss', float('nan')):.4f}"
    line += f", time {timing['timing/ms_per_step']:.2f}ms"
    if "timing/mfu_percent" in timing:
      line += f", mfu {timing['timing/mfu_percent']:.2f}%"
    logging.info(line)
