"""Compute / storage dtypes of a model config, as jnp dtypes; byte sizes."""
from __future__ import annotations

import jax.numpy as jnp


def nbytes(*arrays) -> int:
  """Bytes of these arrays (or shape/dtype structs) together."""
  return sum(a.size * jnp.dtype(a.dtype).itemsize for a in arrays)


class ConfigDtypes:
  """Mixin for (frozen dataclass) configs with string fields `dtype` (the
  compute dtype of activations and matmuls) and `param_dtype` (stored
  parameters)."""
  dtype: str
  param_dtype: str

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)
