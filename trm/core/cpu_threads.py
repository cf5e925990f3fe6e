"""Enough XLA:CPU threads for the forced host devices' collectives.

On forced host devices (`--xla_force_host_platform_device_count=N`, the
tests' and a laptop's 8-device meshes) XLA:CPU runs each device's part of a
multi-device program on one shared pool, sized max(cores, N), and each
collective blocks its thread until all N parts arrive. The next program's
parts may take the threads that the running one's last parts wait for; then
no part can finish, and after 40 s XLA aborts the process ("Termination
timeout ... Expected 8 threads to join the rendezvous, but only 7 of them
arrived"). On a 2-core host with 8 devices that is a pool of 8: 3,000
unread data-parallel steps abort every time, and the trainer's loop, two
steps in flight, did about once in a CI run under load. A pool of 2N
finished every such loop (BUILD_NOTES, "Session 101").

XLA reads the pool's size from PJRT_NPROC (or NPROC) when jax creates its
CPU client, so this must run before the first jax operation: `import trm`
does it. A PJRT_NPROC the user set is kept.
"""
from __future__ import annotations

import os
import re

ENV = "PJRT_NPROC"
# PJRT_NPROC as this module last set it: a process started by one that set
# it (a test's workers) may force another device count, and gets its own.
OURS_ENV = "TRM_PJRT_NPROC"

_DEVICE_COUNT_FLAG = re.compile(
    r"(?:^|\s)--xla_force_host_platform_device_count=(\S+)")


def forced_cpu_devices(environ) -> int:
  """The CPU device count jax will create from the environment:
  JAX_NUM_CPU_DEVICES when set, else XLA_FLAGS' last
  --xla_force_host_platform_device_count, else 1."""
  text = environ.get("JAX_NUM_CPU_DEVICES", "").strip()
  if not text or not text.lstrip("-").isdigit() or int(text) < 0:
    found = _DEVICE_COUNT_FLAG.findall(environ.get("XLA_FLAGS", ""))
    text = found[-1] if found else "1"
  try:
    return max(int(text), 1)
  except ValueError:  # XLA itself refuses such a flag, with its own message
    return 1


def pool_threads(devices: int, cores: int) -> int:
  """Threads for `devices` forced CPU devices on `cores` cores: room for
  two programs' parts at once (the running one and the next)."""
  return max(cores, 2 * devices)


def widen_cpu_pool(environ=None, cores: int | None = None) -> int | None:
  """Sets PJRT_NPROC for the forced CPU devices, unless the user set it
  (or NPROC); returns the value it set. With one device XLA's own size is
  kept (an inherited value of ours is removed)."""
  environ = os.environ if environ is None else environ
  devices = forced_cpu_devices(environ)
  ours = environ.get(OURS_ENV)
  if "NPROC" in environ or (ENV in environ and environ[ENV] != ours):
    return None  # the user's
  if devices <= 1:
    if ours is not None:
      environ.pop(ENV, None)
      environ.pop(OURS_ENV, None)
    return None
  threads = pool_threads(devices, cores or os.cpu_count() or 1)
  environ[ENV] = environ[OURS_ENV] = str(threads)
  return threads
