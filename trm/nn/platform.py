"""Which platform the program being traced will run on.

Usually the default backend's; but compile-only devices (libtpu's TPU
topologies, XLA:GPU's deviceless compile) are traced in a CPU process for
another platform. `ShardingContext` enters `mesh_platform` with its mesh's
devices' platform, so code that picks a kernel or a layout per platform
(cuDNN attention's check, Dream's sampler on GPU) asks `current()`.
"""
from __future__ import annotations

import contextlib
import contextvars

import jax

GPU_PLATFORMS = ("gpu", "cuda")
_MESH_PLATFORM = contextvars.ContextVar("trm_mesh_platform", default=None)


@contextlib.contextmanager
def mesh_platform(platform: str):
  """Programs traced inside run on `platform`."""
  token = _MESH_PLATFORM.set(platform)
  try:
    yield
  finally:
    _MESH_PLATFORM.reset(token)


def current() -> str:
  """The active mesh's platform, else the default backend's."""
  return _MESH_PLATFORM.get() or jax.default_backend()
