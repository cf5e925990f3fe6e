"""Logits over a sampling temperature, safe when the quotient would overflow.

A temperature so small that a logit over it passes the float range turns
every positive logit into +inf (and 0 / 0 into NaN): the softmax is then NaN
and a categorical draw returns id 0, not the likeliest token. Both helpers
keep the likeliest token at logit 0 in that case, which is greedy.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from trm.nn import dtypes


def shift_and_divide(logits, temperature):
  """logits / temperature with each row's largest finite logit moved to 0
  first: the same softmax, but the likeliest stays at 0 (also where a
  subnormal temperature is flushed to 0) and the rest fall towards -inf."""
  finite_max = jnp.max(jnp.where(jnp.isfinite(logits), logits, -jnp.inf),
                       axis=-1, keepdims=True)
  shifted = logits - jnp.where(jnp.isfinite(finite_max), finite_max,
                               jnp.zeros((), logits.dtype))
  # A -inf (a masked id: GPT's vocab_limit) stays -inf: XLA divides by a
  # temperature as a product with its reciprocal, which a temperature of
  # 2**126 or more flushes to 0, and -inf x 0 is NaN, which the draw took
  # (trm.sample --temperature=1e38 drew ids past the tokenizer's).
  return jnp.where(shifted == 0, jnp.zeros((), logits.dtype),
                   jnp.where(jnp.isneginf(shifted), shifted,
                             shifted / temperature))


def overflowed_rows(values, scaled):
  """[..., 1]: whether a row of `scaled` (values over a temperature) holds
  an inf or NaN where `values` was finite: the quotient left the range."""
  return jnp.any(~jnp.isfinite(scaled) & jnp.isfinite(values), axis=-1,
                 keepdims=True)


def divide_unless_overflow(logits, temperature, wide: bool = False):
  """logits / temperature as written (a reference's own rounding, e.g. in
  bfloat16), except in rows where that quotient leaves the float range
  (a finite logit becomes inf or NaN): those rows get `shift_and_divide`.
  With `wide` the quotient is taken in float32 and rounded once to the
  logits' dtype, as torch divides a bf16 tensor by a Python float.
  The extra pass over the vocabulary runs only when some row overflows."""
  if wide:
    scaled = dtypes.rounded_to(logits.astype(jnp.float32) / temperature,
                               logits.dtype).astype(logits.dtype)
    temperature = jnp.asarray(temperature, logits.dtype)
  else:
    scaled = logits / temperature
  overflow = overflowed_rows(logits, scaled)
  return jax.lax.cond(
      jnp.any(overflow),
      lambda: jnp.where(overflow, shift_and_divide(logits, temperature),
                        scaled),
      lambda: scaled)
