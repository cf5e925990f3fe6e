"""Per-position token draws of the masked-diffusion samplers.

Temperature, top-k and top-p sampling over the vocabulary (top-k without a
full sort: the candidates come from the vocabulary blocks with the largest
maxima), plus the confidence of each draw that the reveal rules rank. Used by
`trm.families.dream.sampling` and `trm.families.dream.cached_sampling`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from trm.nn import dtypes
from trm.nn import temperature as temperature_lib

# Vocabulary blocks for the sort-free top-k: the k-th largest value lies in
# the k blocks with the largest maxima (see `_candidates`).
_BLOCK = 16
# Top-p without top-k first tries this many candidates; it falls back to the
# whole vocabulary only when they do not hold `top_p` of the mass.
_TOP_P_CANDIDATES = 64


def _order_keys(x):
  """int32 keys whose order is the order of the float32 values of `x`."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
  return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def _bisect_keys(keys, count_fn, target):
  """Per row, the largest key t (between the row's min and max key) with
  count_fn(keys >= t) >= target, by bisection: 32 passes, no sort.

  count_fn maps the bool mask [..., n] to [...] and must grow as t falls.
  """
  lo = jnp.min(keys, axis=-1)
  hi = jnp.max(keys, axis=-1)

  def body(_, bounds):
    lo, hi = bounds
    # Ceil of the midpoint without int32 overflow.
    mid = (lo >> 1) + (hi >> 1) + ((lo & 1) | (hi & 1))
    ok = count_fn(keys >= mid[..., None]) >= target
    return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid - 1)

  lo, _ = jax.lax.fori_loop(0, 32, body, (lo, hi))
  return lo


def _kth_largest_key(keys, k: int):
  """Key of the k-th largest entry of each row (ties counted)."""
  return _bisect_keys(keys, lambda m: jnp.sum(m, axis=-1, dtype=jnp.int32), k)


def first_true(mask, n: int):
  """Indices of the first n True entries of each row (ascending)."""
  flat = mask.reshape(-1, mask.shape[-1])
  idx = jax.vmap(lambda row: jnp.nonzero(row, size=n, fill_value=0)[0])(flat)
  return idx.reshape(mask.shape[:-1] + (n,))


def _candidates(logits, k: int):
  """(values [..., k*B], vocabulary ids [..., k*B], kth key [...], complete
  [...]): the k blocks of B entries with the largest maxima, in vocabulary
  order (padding: the dtype's finfo.min, id 0), the key of each row's k-th
  largest entry, and whether the blocks hold every entry >= it.

  Why the k-th largest is exact: the k largest block maxima are k entries,
  so the k-th largest entry is at least the k-th largest block maximum M;
  every entry above M sits in a chosen block, and each chosen block whose
  maximum equals M (ties broken by index) adds at least one entry equal to
  M, so the chosen blocks hold at least k entries >= the k-th largest and
  fewer than k above it. Only when the k-th largest equals M and more blocks
  than chosen reach M can an entry equal to it lie outside (`complete`
  False): callers then use the whole vocabulary.
  """
  vocab = logits.shape[-1]
  fmin = jnp.finfo(logits.dtype).min
  blocks = -(-vocab // _BLOCK)
  padded = jnp.pad(logits, [(0, 0)] * (logits.ndim - 1)
                   + [(0, blocks * _BLOCK - vocab)], constant_values=fmin)
  tiles = padded.reshape(logits.shape[:-1] + (blocks, _BLOCK))
  k_blocks = min(k, blocks)
  block_max = _order_keys(jnp.max(tiles, axis=-1))
  bound = _kth_largest_key(block_max, k_blocks)[..., None]
  above = block_max > bound
  # Blocks equal to the boundary, lowest index first, fill up to k_blocks.
  tied = block_max == bound
  room = k_blocks - jnp.sum(above, axis=-1, keepdims=True, dtype=jnp.int32)
  tied_rank = jnp.cumsum(tied, axis=-1, dtype=jnp.int32) - 1
  chosen = first_true(above | (tied & (tied_rank < room)), k_blocks)
  values = jnp.take_along_axis(tiles, chosen[..., None], axis=-2)
  ids = chosen[..., None] * _BLOCK + jnp.arange(_BLOCK, dtype=jnp.int32)
  shape = logits.shape[:-1] + (k_blocks * _BLOCK,)
  ids = ids.reshape(shape)
  values = values.reshape(shape)
  kth = _kth_largest_key(_order_keys(values), min(k, vocab))
  reaching = jnp.sum(block_max >= bound, axis=-1, dtype=jnp.int32)
  complete = (reaching <= k_blocks) | (kth > bound[..., 0])
  return values, jnp.where(ids < vocab, ids, 0), kth, complete


def _top_p_keep(values, log_norm, top_p: float):
  """Reference top-p on `values` (holding every entry the kept set can
  reach), with probabilities exp(v - log_norm) of the whole vocabulary: keep
  an entry iff the mass ranked before it (larger values, then equal values
  of lower vocabulary index, i.e. a stable descending sort) is <= top_p."""
  # The reference's softmax and cumulative sum round each probability and
  # each running mass to the logits' dtype (torch computes bf16 ones in
  # float32 and rounds once); in float32 the roundings change nothing.
  probs = dtypes.rounded_to(
      jnp.exp(values.astype(jnp.float32) - log_norm[..., None]),
      values.dtype)
  keys = _order_keys(values)
  target = jnp.float32(top_p)
  # Smallest key t whose strictly-larger mass is <= top_p: bisection on the
  # complement (largest t with mass(keys >= t) > top_p, plus one step).
  mass_ge = lambda m: dtypes.rounded_to(  # noqa: E731
      jnp.sum(jnp.where(m, probs, 0.0), axis=-1), values.dtype)
  below = _bisect_keys(keys, lambda m: mass_ge(m) > target, True)
  # `below` is the largest key whose inclusive mass exceeds top_p (or the
  # row's minimum when none does): entries above it are kept outright.
  exceeds = mass_ge(keys >= below[..., None]) > target
  boundary = jnp.where(exceeds, below, jnp.iinfo(jnp.int32).min)[..., None]
  greater = keys > boundary
  mass_greater = jnp.sum(jnp.where(greater, probs, 0.0), axis=-1,
                         keepdims=True)
  tie = keys == boundary
  tie_before = jnp.cumsum(jnp.where(tie, probs, 0.0), axis=-1) - jnp.where(
      tie, probs, 0.0)
  before = dtypes.rounded_to(mass_greater + tie_before, values.dtype)
  return greater | (tie & (before <= target))


def _kept_probs(values, keep):
  """softmax over the kept `values` (the others: the dtype's finfo.min, so
  probability exactly 0), in float32 and rounded once to the values' dtype,
  as torch's softmax of a bf16 tensor (jax's bf16 softmax rounds the
  exponentials and the sum too: 4 in 5 bf16 probabilities differed)."""
  if keep is not None:
    values = jnp.where(keep, values, jnp.finfo(values.dtype).min)
  probs = jax.nn.softmax(values.astype(jnp.float32), axis=-1)
  return dtypes.rounded_to(probs, values.dtype).astype(values.dtype)


def _finish(values, ids, keep, key, *, temperature, conf_kind):
  """softmax over the kept `values`, then the token and its confidence."""
  dtype = values.dtype
  probs = _kept_probs(values, keep)
  if temperature > 0:
    j = jax.random.categorical(key, jnp.log(probs.astype(jnp.float32)),
                               axis=-1)
    conf = jnp.take_along_axis(probs, j[..., None], axis=-1)[..., 0]
  else:
    conf, j = jnp.max(probs, axis=-1), jnp.argmax(probs, axis=-1)
  if conf_kind == "topk_margin":
    first = jnp.argmax(probs, axis=-1)
    top1 = jnp.max(probs, axis=-1)
    others = jnp.where(jnp.arange(probs.shape[-1]) == first[..., None],
                       -jnp.inf, probs)
    margin = top1.astype(jnp.float32) - jnp.max(others, axis=-1)
    conf = dtypes.rounded_to(margin, dtype).astype(dtype)
  elif conf_kind == "entropy":
    # Each op rounded to the dtype, the sum accumulated in float32 (torch's
    # bf16 arithmetic; 1e-10 is added as a float32, not rounded first).
    log_probs = dtypes.rounded_to(jnp.log(dtypes.rounded_to(
        probs.astype(jnp.float32) + jnp.float32(1e-10), dtype)), dtype)
    terms = dtypes.rounded_to(probs.astype(jnp.float32) * log_probs, dtype)
    conf = dtypes.rounded_to(jnp.sum(terms, axis=-1), dtype).astype(dtype)
  x0 = jnp.take_along_axis(ids, j[..., None], axis=-1)[..., 0]
  return conf, x0.astype(jnp.int32)


def sample_tokens(logits, key, *, temperature, top_p, top_k, conf_kind):
  """Reference `sample_tokens` over the last axis -> (confidence, x0).

  Everything stays in the logits' dtype (bf16 for the real model) because
  the reference never upcasts; only the categorical draw and top-p's mass run
  in float32. No sort over the vocabulary: with top_k the k-th largest value
  is found exactly among a few candidate blocks (`_candidates`) and the
  softmax, draw and confidence run on those candidates only (every other
  entry's probability is exactly 0); top-p alone tries the 64 largest first
  and uses the whole vocabulary only when they do not cover top_p.
  """
  finish = functools.partial(_finish, key=key, temperature=temperature,
                             conf_kind=conf_kind)
  return _filtered(logits, finish, temperature=temperature, top_p=top_p,
                   top_k=top_k)


def token_probs(logits, *, temperature, top_p, top_k):
  """The distribution `sample_tokens` draws from: [..., vocab] float
  probabilities of the temperature-scaled, top-p then top-k filtered
  logits (exactly 0 outside the kept set), computed by the same code path
  (the candidate blocks' softmax scattered back to vocabulary ids).
  temperature 0 (greedy) scales nothing."""
  vocab = logits.shape[-1]

  def dense(values, ids, keep):
    probs = _kept_probs(values, keep)
    flat_p = probs.reshape(-1, probs.shape[-1])
    flat_i = ids.reshape(-1, ids.shape[-1])
    rows = jnp.arange(flat_p.shape[0])[:, None]
    out = jnp.zeros((flat_p.shape[0], vocab), probs.dtype)
    return out.at[rows, flat_i].add(flat_p).reshape(
        logits.shape[:-1] + (vocab,))

  return _filtered(logits, dense, temperature=temperature, top_p=top_p,
                   top_k=top_k)


class _Filter(NamedTuple):
  """The reference's top-p then top-k on a block of rows, before the draw
  (apart from it so that the whole-vocabulary fallback can be decided over
  more rows than one draw holds).

  logits: temperature-scaled; log_norm: their float32 logsumexp (top-p
  only); kth: each row's k-th largest key (top-k only); values, ids: the
  candidate blocks (None when there are none); ok [...]: whether a row's
  candidates hold every entry its kept set can reach.
  """
  logits: jax.Array
  log_norm: Optional[jax.Array]
  kth: Optional[jax.Array]
  values: Optional[jax.Array]
  ids: Optional[jax.Array]
  ok: Optional[jax.Array]


def _scaled(logits, *, temperature, top_p):
  """(temperature-scaled logits, their float32 logsumexp when top-p
  filters, else None)."""
  if temperature > 0:
    # The reference's division, except in a row where it overflows (a
    # temperature near 0: every positive logit inf, the softmax NaN, and
    # token 0 drawn): there the likeliest token is drawn, as greedy.
    # torch divides a bf16 tensor by a Python float in float32 and rounds
    # the quotient once; dividing by the temperature rounded to bf16 (0.3
    # is 0.30078125 there) moved a third of the logits by a unit.
    logits = temperature_lib.divide_unless_overflow(
        logits, jnp.float32(temperature), wide=True)
  log_norm = (jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
              if _uses_top_p(top_p) else None)
  return logits, log_norm


def _uses_top_p(top_p) -> bool:
  return top_p is not None and top_p < 1


def _filter(logits, *, temperature, top_p, top_k) -> _Filter:
  """Temperature, then the candidates where they are exact (see
  `sample_tokens`)."""
  dtype = logits.dtype
  vocab = logits.shape[-1]
  logits, log_norm = _scaled(logits, temperature=temperature, top_p=top_p)
  if top_k:
    values, ids, kth, complete = _candidates(logits, min(int(top_k), vocab))
    return _Filter(logits, log_norm, kth, values, ids, complete)
  if log_norm is None:
    return _Filter(logits, None, None, None, None, None)
  values, ids, kth, complete = _candidates(
      logits, min(_TOP_P_CANDIDATES, vocab))
  top = _order_keys(values) >= kth[..., None]
  # Every entry outside complete candidates ranks after all of `top`: if
  # `top` alone holds more than top_p, they are all removed.
  top_probs = dtypes.rounded_to(
      jnp.exp(values.astype(jnp.float32) - log_norm[..., None]), dtype)
  top_mass = dtypes.rounded_to(
      jnp.sum(jnp.where(top, top_probs, 0.0), axis=-1), dtype)
  covered = complete & (top_mass > jnp.float32(top_p))
  return _Filter(logits, log_norm, None, values, ids, covered)


def _keep(values, f: _Filter, top_p):
  """The kept entries among `values` (candidates or the whole vocabulary),
  None when nothing is filtered."""
  kept = None
  if f.kth is not None:
    kept = _order_keys(values) >= f.kth[..., None]
  if f.log_norm is not None:  # top-p acts first in the reference, on the
    top = _top_p_keep(values, f.log_norm, top_p)  # full softmax
    kept = top if kept is None else kept & top
  return kept


def _on_candidates(f: _Filter, finish, top_p):
  return finish(f.values, f.ids, _keep(f.values, f, top_p))


def _on_vocabulary(f: _Filter, finish, top_p):
  all_ids = jnp.broadcast_to(
      jnp.arange(f.logits.shape[-1], dtype=jnp.int32), f.logits.shape)
  return finish(f.logits, all_ids, _keep(f.logits, f, top_p))


def _filtered(logits, finish, *, temperature, top_p, top_k):
  """`finish(values, ids, keep)` on the temperature-scaled logits after the
  reference's top-p then top-k, over candidate blocks where that is exact
  (see `sample_tokens`); finish's outputs must not depend on how many
  candidates there are (both branches of the cond)."""
  f = _filter(logits, temperature=temperature, top_p=top_p, top_k=top_k)
  if f.ok is None:
    return _on_vocabulary(f, finish, top_p)
  return jax.lax.cond(jnp.all(f.ok),
                      lambda: _on_candidates(f, finish, top_p),
                      lambda: _on_vocabulary(f, finish, top_p))

