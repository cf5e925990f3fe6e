"""Stopping early on SIGTERM, Ctrl-C or a TPU preemption notice.

The loop asks `PreemptionWatch.reached(step)` once per step; when it says
yes, the loop saves the current step and raises `Preempted` (`trm.main`
exits 0, and the scheduler's rerun with the same workdir resumes).
"""
from __future__ import annotations

import os
import signal
import threading
import time

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from trm.core import cli


class Preempted(Exception):
  """Training stopped early on SIGTERM or a preemption notice, after saving
  a checkpoint at `step` (rerun with the same workdir to resume)."""

  def __init__(self, step: int, checkpoint: str | None,
               signum: int = signal.SIGTERM, checkpoints_off: bool = False):
    self.step, self.checkpoint, self.signum = step, checkpoint, signum
    # With checkpoints off there is nothing to resume from: a rerun trains
    # from the start (the line promised a resume).
    super().__init__(
        f"Preempted at step {step} ({signal.Signals(signum).name}); "
        + ("no checkpoint saved (config.checkpoint_every=0): a rerun trains "
           "from the start again." if checkpoints_off else
           (f"saved {checkpoint}." if checkpoint else "no checkpoint saved.")
           + " Rerun with the same --workdir to resume."))


def _preemption_notifier_installed() -> bool:
  """Whether JAX's preemption sync manager (and with it XLA's SIGTERM
  handler) is running; otherwise a SIGTERM would kill the process."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  return distributed.global_state.preemption_sync_manager is not None


class PreemptionWatch:
  """When to stop early. Multi-process jobs use JAX's preemption sync point
  (`manager.reached_preemption`): JAX's own SIGTERM handler tells the
  coordination service, which picks a step every process reaches; Ctrl-C
  (SIGINT) is passed to that handler as a SIGTERM, so it stops at the next
  step too. A single process installs SIGTERM and SIGINT handlers for the
  loop's lifetime that set a flag read each step. Several processes without
  the preemption service agree on the flag only every `agree_every` steps:
  agreeing is an all-gather that waits for the steps in flight (4.0-6.2 ms
  a call on 2 CPU processes over gloo, besides the lost overlap; JAX's sync
  point costs microseconds until a notice), too dear for every step. A
  second signal exits at once, skipping the save (the
newest complete checkpoint stays)."""

  def __init__(self, manager, agree_every: int):
    self._manager, self._agree_every = manager, agree_every
    self._sync = (jax.process_count() > 1
                  and jax.config.jax_enable_preemption_service)
    self._previous = None
    self.signal_time, self.signum = None, signal.SIGTERM

  def __enter__(self):
    if threading.current_thread() is not threading.main_thread():
      logging.warning("Training outside the main thread: SIGTERM will not "
                      "save a checkpoint before exiting.")
      return self
    # With the preemption service JAX's own handler takes SIGTERM; Ctrl-C
    # is still ours (it stopped one process unsaved, its peers in their
    # next collective).
    self._previous = {signum: signal.signal(signum, self._on_signal)
                      for signum in ((signal.SIGINT,) if self._sync else
                                     (signal.SIGTERM, signal.SIGINT))}
    cli.startup_watch(False)
    return self

  def __exit__(self, *unused_exc):
    if self._previous is not None:
      for signum, handler in self._previous.items():
        signal.signal(signum, handler)
      self._previous = None
      cli.startup_watch(True)

  def _on_signal(self, signum, unused_frame):
    if self.signal_time is None:
      self.signal_time, self.signum = time.time(), signum
      if self._sync and _preemption_notifier_installed():
        # To JAX's SIGTERM handler: the coordination service then stops
        # every process at the next step, where the flag alone waited for
        # the next all-gather, up to `agree_every` steps (55 s at 200).
        os.kill(os.getpid(), signal.SIGTERM)
      return
    cli.exit_now(signum, "the checkpoint save was skipped; the newest "
                 "complete checkpoint on disk is kept.")

  def pending(self) -> bool:
    """Whether a signal has arrived, for stopping work inside a step (an
    evaluation) early. One process only: several would have to agree
    first, which `reached` does at step boundaries."""
    return (not self._sync and jax.process_count() == 1
            and self.signal_time is not None)

  def reached(self, step: int) -> bool:
    """Called once per step, with the same steps on every process."""
    if self._sync and self._manager.reached_preemption(step):
      return True
    if jax.process_count() == 1:
      return self.signal_time is not None
    if step % self._agree_every:
      return False
    return any_process(self.signal_time is not None)


def any_process(flag: bool) -> bool:
  """Whether `flag` holds on any process: how every process agrees to stop
  (a signal, early stopping) at the same step. Collective: every process
  calls it at the same step."""
  if jax.process_count() == 1:
    return bool(flag)
  return bool(np.any(multihost_utils.process_allgather(np.int32(flag))))
