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
from jax.extend import random as jax_random_ext
import jax.numpy as jnp
import numpy as np

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
  more rows than one draw holds: `sample_rows_in_chunks`).

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


# Drawing a block of rows in chunks with the noise of the whole block.
#
# With jax_threefry_partitionable (the default since jax 0.5), a threefry
# key's random bits for a shape are, at each element, the hash of the key
# with the element's row-major index in that shape (`iota_2x32_shape`): so
# the noise `jax.random.categorical` adds to rows [first, first + c) of a
# [..., rows, W] draw is the hash of those rows' indices in the whole
# block. A `_ROWS` key is the threefry key plus (first, rows): its random
# bits for a [..., c, W] shape are those indices' hashes, and
# `jax.random.categorical` turns them into the same floats as for the
# block (its bits-to-float code is jax's own, untouched).


def _rows_bits(key, bit_width, shape):
  """random_bits of a `_ROWS` key (k1, k2, first, rows) for [..., c, W]."""
  if bit_width != 32 or len(shape) < 2:
    raise NotImplementedError("_ROWS keys draw float32 [..., rows, W] only")
  *lead, chunk, width = shape
  k1, k2, first, rows = (key[j] for j in range(4))
  u32 = jnp.uint32
  lead_index = jnp.arange(int(np.prod(lead)), dtype=u32).reshape(
      tuple(lead) + (1, 1))
  row = first + jnp.arange(chunk, dtype=u32)[:, None]
  index = ((lead_index * rows + row) * u32(width)
           + jnp.arange(width, dtype=u32))
  # Blocks hold fewer than 2**32 entries (`rows_drawable`): the index's
  # high word is 0.
  hi, k1, k2 = (jnp.broadcast_to(v, shape).astype(u32)
                for v in (u32(0), k1, k2))
  bits1, bits2 = jax_random_ext.threefry2x32_p.bind(k1, k2, hi, index)
  return bits1 ^ bits2


def _no_key_op(*_):
  raise NotImplementedError("a _ROWS key only draws (random_bits)")


_ROWS = jax_random_ext.define_prng_impl(
    key_shape=(4,), seed=_no_key_op, split=_no_key_op,
    random_bits=_rows_bits, fold_in=_no_key_op, name="threefry2x32_rows",
    tag="fry_rows")


def _threefry_data(key):
  """The uint32[2] data of a threefry key (typed or raw), else None."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    impl = jax.random.key_impl(key)
    data = jax.random.key_data(key)
  else:
    impl, data = jax.config.jax_default_prng_impl, key
  name = getattr(impl, "name", impl)
  return data if name == "threefry2x32" and data.shape == (2,) else None


def rows_drawable(key, shape) -> bool:
  """Whether `sample_rows_in_chunks` draws logits of `shape` [..., R, V]
  with `key` exactly as `sample_tokens` draws their first rows: a threefry
  key, partitionable threefry bits, blocks under 2**32 entries."""
  return (_threefry_data(key) is not None
          and bool(jax.config.jax_threefry_partitionable)
          and len(shape) >= 2 and int(np.prod(shape)) < 2 ** 32)


def sample_rows_in_chunks(logits, key, rows, chunk: int, *, temperature,
                          top_p, top_k, conf_kind):
  """`sample_tokens(logits[..., :rows, :], key, ...)` for a traced `rows`,
  written to rows [0, rows) of (confidence, x0) [..., R] (the rest are
  not to be read), drawn `chunk` rows at a time (R a multiple of chunk).

  Why: one compiled draw serves every row count, where `sample_tokens` on
  each static count compiles the filters and the draw once per count.
  Each chunk takes its rows' part of the block's noise (`_ROWS`), and
  whether the candidates suffice is decided over all `rows`, as
  `sample_tokens` decides it over its block: the chunks are drawn from the
  candidates, and again from the whole vocabulary if any row needed it.
  `rows_drawable(key, logits.shape)` must hold.
  """
  total = logits.shape[-2]
  if total % chunk or not rows_drawable(key, logits.shape):
    raise ValueError(f"cannot draw {logits.shape} in chunks of {chunk}")
  data = _threefry_data(key).astype(jnp.uint32)
  rows = jnp.asarray(rows, jnp.int32)

  def part(c):
    """The chunk's logits and its `_finish`, with its rows' noise."""
    noise = jax.random.wrap_key_data(jnp.concatenate(
        [data, jnp.stack([c * chunk, rows]).astype(jnp.uint32)]), impl=_ROWS)
    return (jax.lax.dynamic_slice_in_dim(logits, c * chunk, chunk, axis=-2),
            functools.partial(_finish, key=noise, temperature=temperature,
                              conf_kind=conf_kind))

  def chunks(body, carry):
    return jax.lax.fori_loop(0, (rows + chunk - 1) // chunk, body, carry)

  def put(c, buffers, drawn):
    return tuple(jax.lax.dynamic_update_slice_in_dim(buf, d, c * chunk, -1)
                 for buf, d in zip(buffers, drawn))

  def vocabulary(c, out, kth=None):
    part_logits, finish = part(c)
    if kth is not None:  # the k-th largest the candidates found: exact
      kth = jax.lax.dynamic_slice_in_dim(kth, c * chunk, chunk, -1)
    f = _Filter(*_scaled(part_logits, temperature=temperature, top_p=top_p),
                kth, None, None, None)
    return put(c, out, _on_vocabulary(f, finish, top_p))

  shapes = jax.eval_shape(
      lambda: sample_tokens(logits[..., :chunk, :], key,
                            temperature=temperature, top_p=top_p,
                            top_k=top_k, conf_kind=conf_kind))
  out = tuple(jnp.zeros(logits.shape[:-1], s.dtype) for s in shapes)
  if not top_k and not _uses_top_p(top_p):
    return chunks(vocabulary, out)

  def candidates(c, carry):
    out, kth, ok = carry
    part_logits, finish = part(c)
    f = _filter(part_logits, temperature=temperature, top_p=top_p,
                top_k=top_k)
    in_rows = c * chunk + jnp.arange(chunk) < rows
    ok &= jnp.all(f.ok | ~in_rows)
    if top_k:
      kth = jax.lax.dynamic_update_slice_in_dim(kth, f.kth, c * chunk, -1)
    return put(c, out, _on_candidates(f, finish, top_p)), kth, ok

  kth = jnp.zeros(logits.shape[:-1], jnp.int32)
  out, kth, ok = chunks(candidates, (out, kth, jnp.bool_(True)))
  return jax.lax.cond(ok, lambda: out, lambda: chunks(
      lambda c, out: vocabulary(c, out, kth if top_k else None), out))
