"""Keeps the host a bounded number of compiled calls ahead of the devices.

JAX dispatches asynchronously, so a loop that never reads a result queues
every call it makes. On a chip that costs only memory. XLA:CPU, though,
takes at most 32 programs in flight a device, and on forced host devices
(`--xla_force_host_platform_device_count`, the tests' 8-device meshes) the
dispatch of one more parks on the threads the running program's collectives
need; after about a minute XLA aborts the process ("Termination timeout
... Exiting to ensure a consistent program state"; trm/core/cpu_threads.py
has the mechanism). `benchmarks/reliability/cpu_dispatch_depth.py` shows
the limit on the 2-core host: in XLA's own pool, a 2x2x2 loop kept 31
steps ahead finished 6 of 6 runs and one kept 32 or 33 ahead aborted 9 of
9 (BUILD_NOTES.md, "Session 102").

Two calls in flight keep a chip busy (the next step waits in the queue while
one runs) and stay far below that limit, so the train and eval loops use
two on every backend, with each step's metrics merged in one compiled call
(trm/core/metrics.py): about six programs a device in flight (the last
three merges, two steps and the next; the bound waits on a step, not on
its merge). `import trm` also sizes the pool for a loop with no bound
(cpu_threads.py); the bound stays, as a chip's queue holds memory.
"""
from __future__ import annotations

import collections

import jax

MAX_IN_FLIGHT = 2


class DispatchBound:
  """Call it with each compiled call's outputs; it returns them, first
  waiting for the oldest call still recorded once more than `max_in_flight`
  are. The outputs it keeps must not be donated to a later call (a step's
  metrics, not its state)."""

  def __init__(self, max_in_flight: int = MAX_IN_FLIGHT):
    if max_in_flight < 1:
      raise ValueError(f"max_in_flight={max_in_flight} must be >= 1.")
    self.max_in_flight = max_in_flight
    self._pending = collections.deque()

  def __call__(self, outputs):
    # One array per call is enough: a call's outputs are all written by the
    # same program on every device.
    marker = next((x for x in jax.tree.leaves(outputs)
                   if isinstance(x, jax.Array)), None)
    if marker is not None:
      self._pending.append(marker)
    while len(self._pending) > self.max_in_flight:
      self._pending.popleft().block_until_ready()
    return outputs

  def __len__(self) -> int:
    return len(self._pending)

  def unfinished(self) -> int:
    """How many of the recorded calls are still running or queued (calls
    finish in order, so these are the newest)."""
    return sum(not x.is_ready() for x in self._pending)
