"""Reveal rules of the masked-diffusion samplers: how many masked positions
each step reveals (`reveal_schedule`), the prompt + mask canvas, and the
scores whose top-k picks the positions. Shared by
`trm.families.dream.sampling` and `trm.families.dream.cached_sampling`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from trm.nn import dtypes
from trm.nn import temperature as temperature_lib


def _timesteps(steps: int, eps: float) -> np.ndarray:
  """torch.linspace(1, eps, steps+1) float32, bit-exact to torch's CPU kernel.

  torch computes step = (end - start) / (n - 1) in float32, then
  start + step*i for the first half and end - step*(n-1-i) for the rest,
  each as a fused multiply-add (one rounding): emulated here in float64,
  where the float32 product is exact. Matches torch 2.13 CPU for every
  steps in 1..1099 at eps=1e-3.
  """
  n = steps + 1
  start, end = np.float32(1.0), np.float32(eps)
  if n == 1:
    return np.array([start], np.float32)
  step = np.float64(np.float32((end - start) / np.float32(n - 1)))
  idx = np.arange(n, dtype=np.float64)
  first = np.float64(start) + step * idx
  second = np.float64(end) - step * (n - 1 - idx)
  return np.where(idx < n // 2, first, second).astype(np.float32)


def transfer_ratios(steps: int, eps: float) -> np.ndarray:
  """Per-step `1 - s/t` in float32, IEEE on the host (not a device divide)."""
  ts = _timesteps(steps, eps)
  return (np.float32(1.0) - ts[1:] / ts[:-1]).astype(np.float32)


def reveal_schedule(steps: int, max_new_tokens: int,
                    eps: float = 1e-3, first: int = 0) -> list[int]:
  """Tokens revealed at each step for an un-padded canvas (confidence algs).

  k = int(num_masked * (1 - s/t)) truncated in float32, the last step
  reveals whatever is left. With `first`, the schedule's steps from `first`
  on reveal `max_new_tokens` (Fast-dLLM's block loop: its step 0 commits
  one token by itself, steps 1.. follow the schedule).
  """
  ratios = transfer_ratios(steps, eps)
  left, out = int(max_new_tokens), []
  for i in range(first, steps):
    k = int(np.float32(left) * ratios[i]) if i < steps - 1 else left
    out.append(k)
    left -= k
  return out


def canvas_and_mask(input_ids, attention_mask, max_new_tokens: int,
                    mask_token_id: int):
  """(prompt + masked canvas [B, L], key mask [B, L] | None, positions
  [B, L] | None). With a padding mask the canvas is attended (mask tokens
  are real inputs), pads are not, and pads get position 1, as the
  reference; without one, both are None (full attention, arange)."""
  b = input_ids.shape[0]
  x = jnp.concatenate(
      [input_ids.astype(jnp.int32),
       jnp.full((b, max_new_tokens), mask_token_id, jnp.int32)], axis=1)
  if attention_mask is None:
    return x, None, None
  am = jnp.concatenate([attention_mask.astype(bool),
                        jnp.ones((b, max_new_tokens), bool)], axis=1)
  pos = jnp.cumsum(am.astype(jnp.int32), axis=-1) - 1
  return x, am, jnp.where(am, pos, 1).astype(jnp.int32)


def needs_mask(attention_mask) -> bool:
  """Host-side, as the reference's `torch.any(attention_mask == 0)`: an
  all-ones mask means full attention and default positions."""
  return attention_mask is not None and bool(
      np.any(np.asarray(attention_mask) == 0))


def reveal_scores(conf, alg_temp, key):
  """Scores whose top-k is the reveal order: the confidences, or with
  `alg_temp` the reference's multinomial(softmax(conf / alg_temp), k, no
  replacement) == top-k of conf / alg_temp + Gumbel noise (log-softmax up
  to a constant)."""
  if alg_temp is None or alg_temp == 0:
    return conf
  # In float32, rounded once (torch's bf16 tensor over a Python float).
  scaled = dtypes.rounded_to(conf.astype(jnp.float32) / jnp.float32(alg_temp),
                             conf.dtype).astype(conf.dtype)
  scores = scaled.astype(jnp.float32) + jax.random.gumbel(
      key, scaled.shape, jnp.float32)
  # An alg_temp so small that conf / alg_temp overflows (1e-38 is flushed
  # to 0 in bfloat16) tied the masked positions at +-inf, the negative
  # entropies with the revealed positions' -inf: revealed tokens were chosen
  # again and turned back into <|mask|>. Such a row ranks by confidence,
  # the limit of alg_temp -> 0 (as alg_temp=0); the reference (float32
  # quotient) picks the most confident first there too, or raises once
  # every masked quotient overflows.
  overflow = temperature_lib.overflowed_rows(conf, scaled)
  return jnp.where(overflow, conf.astype(jnp.float32), scores)


def rank_desc(scores):
  """Rank of each entry in its row, descending, ties to the lower index."""
  order = jnp.argsort(-scores, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True)
