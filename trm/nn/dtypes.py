"""Compute / storage dtypes of a model config, as jnp dtypes."""
from __future__ import annotations

import jax.numpy as jnp


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
