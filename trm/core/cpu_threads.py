"""Enough XLA:CPU threads for the forced host devices' collectives.

On forced host devices (`--xla_force_host_platform_device_count=N`, the
tests' and a laptop's 8-device meshes) XLA:CPU runs each device's part of a
multi-device program on one shared pool, sized max(cores, N), and each
collective blocks its thread until all N parts arrive. XLA runs one such
program at a time and assumes N threads are enough for it. They are not
when the host dispatches ahead: a device takes at most 32 programs in
flight, and the dispatch of one more waits for a slot on a pool thread of
each device, holding N threads. The running program then has too few
threads for its N parts, no part can finish, and XLA aborts the process
after about a minute (20 s to a warning, 40 s more: "Termination timeout
... Expected 2 threads to join the rendezvous, but only 1 of them
arrived"). So a pool of 2N is what one dispatching thread needs: N for the
running program and N for a parked dispatch (derived from XLA's PjRt CPU
client, read in a newer XLA than jaxlib 0.10.2 pins; BUILD_NOTES, "Session
102"). On the 2-core host with 8 devices XLA's pool is 8: a loop kept 32
or 33 steps ahead aborted in 9 of 9 runs and one kept 31 ahead finished 6
of 6; with 16 threads the loop that never waits finished every run
(BUILD_NOTES, "Sessions 101 and 102"). By that reading the train and eval
loops, about six programs a device in flight (trm/core/dispatch.py), need
only XLA's own N threads; this pool covers the loops a user writes too.

XLA reads the pool's size from PJRT_NPROC (or NPROC) when jax creates its
CPU client, so this must run before the first jax operation: `import trm`
does it, and warns when it comes too late. A PJRT_NPROC the user set is
kept. The same size applies to XLA:CPU's intra-op (Eigen) pool. On the
2-core host the larger pools cost a TRM of hidden size 256 on a 2x2x2 mesh
about 10% a step, and the test suite's tiny models nothing measurable
(BUILD_NOTES, "Session 101"): a run that never aborts is worth more on a
CPU mesh, which is for trying sharding, not for speed.
"""
from __future__ import annotations

import os
import re
import sys
import warnings

ENV = "PJRT_NPROC"
# PJRT_NPROC as this module last set it: a process started by one that set
# it (a test's workers) may force another device count, and gets its own.
OURS_ENV = "TRM_PJRT_NPROC"

_DEVICE_COUNT_FLAG = re.compile(
    r"(?:^|\s)--xla_force_host_platform_device_count=(\S+)")


def _int(text):
  try:
    return int(text)
  except (TypeError, ValueError):
    return None


def forced_cpu_devices(environ) -> int:
  """The CPU device count jax will create from the environment: a
  non-negative JAX_NUM_CPU_DEVICES (read as jax reads it, with int()), else
  XLA_FLAGS' last --xla_force_host_platform_device_count, else 1."""
  count = _int(environ.get("JAX_NUM_CPU_DEVICES"))
  if count is None or count < 0:
    found = _DEVICE_COUNT_FLAG.findall(environ.get("XLA_FLAGS", ""))
    count = _int(found[-1]) if found else 1
  return max(count or 1, 1)  # XLA refuses a flag it cannot read, itself


def pool_threads(devices: int, cores: int) -> int:
  """Threads for `devices` forced CPU devices on `cores` cores: room for
  the running program's parts and for a dispatch parked at XLA's limit of
  32 programs a device."""
  return max(cores, 2 * devices)


def _cpu_client_exists() -> bool:
  """Whether jax has already created its backends (then PJRT_NPROC is read
  already). Does not import jax."""
  jax = sys.modules.get("jax")
  if jax is None:
    return False
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return bool(xla_bridge.backends_are_initialized())
  except (ImportError, AttributeError):  # another jax: cannot tell
    return False


def widen_cpu_pool(environ=None, cores: int | None = None) -> int | None:
  """Sets PJRT_NPROC for the forced CPU devices and returns it; None where
  the user set PJRT_NPROC or there is one device (then an inherited value
  of ours is removed, for XLA's own size or the user's NPROC). NPROC, XLA's
  other name for it (and Google CI's core reservation), counts as a floor:
  a smaller pool is what deadlocks. In this process (`environ` None), warns
  when jax created its CPU client before: the setting then reaches only
  the processes it starts."""
  in_process = environ is None
  environ = os.environ if environ is None else environ
  ours = environ.get(OURS_ENV)
  if ENV in environ and environ[ENV] != ours:
    return None  # the user's
  devices = forced_cpu_devices(environ)
  if devices <= 1:
    if ours is not None:
      environ.pop(ENV, None)
      environ.pop(OURS_ENV, None)
    return None
  floor = _int(environ.get("NPROC")) or 0
  had = _int(environ.get(ENV)) or floor
  threads = max(pool_threads(devices, cores or os.cpu_count() or 1), floor)
  environ[ENV] = environ[OURS_ENV] = str(threads)
  if in_process and had < threads and _cpu_client_exists():
    warnings.warn(
        f"jax created its CPU client before `import trm`, with XLA's own "
        f"thread pool: with {devices} forced CPU devices a loop 32 "
        "programs ahead parks its next dispatch on the threads the "
        "running program's collectives need, and XLA then aborts the "
        "process after about a minute ('Termination timeout'). Import trm "
        f"before jax's first operation, or set PJRT_NPROC={threads} "
        "before it.",
        RuntimeWarning, stacklevel=2)
  return threads
