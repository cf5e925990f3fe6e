"""Compute / storage dtypes of a model config, as jnp dtypes; byte sizes."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rounded_to(x, dtype):
  """`x` in float32, each value rounded once to `dtype` (as torch rounds
  its float32 arithmetic on a bf16 tensor); unchanged for float32. By
  `reduce_precision`: XLA may drop a float32 -> bf16 -> float32 round trip
  (excess precision is allowed by default), and did inside fusions."""
  x = x.astype(jnp.float32)
  if jnp.dtype(dtype) == jnp.float32:
    return x
  info = jnp.finfo(dtype)
  return jax.lax.reduce_precision(x, exponent_bits=info.nexp,
                                  mantissa_bits=info.nmant)


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
