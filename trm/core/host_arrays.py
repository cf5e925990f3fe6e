"""Whole numpy values of jax arrays, on a pod as on one host."""
from __future__ import annotations

import jax
from jax.experimental import multihost_utils
import numpy as np


def whole(x) -> np.ndarray:
  """The whole value of `x` as numpy, on every process. `jax.device_get`
  refuses an array sharded over several processes ("spans non-addressable
  devices"): such an array is gathered from all of them, a collective, so
  every process must call this for the same arrays in the same order (an
  array replicated onto every process is read here, without one)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if x.is_fully_replicated and x.addressable_shards:
      return np.asarray(x.addressable_shards[0].data)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def put(value, sharding) -> jax.Array:
  """`value` (the same numpy array on every process) as one array with
  `sharding`, each process placing its own shards: `jnp.asarray` would put
  it on one device, which a compiled program expecting the array split
  over devices (of several processes, even) refuses."""
  value = np.asarray(value)
  return jax.make_array_from_callback(value.shape, sharding,
                                      lambda index: value[index])
