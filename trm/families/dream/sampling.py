"""Masked-diffusion sampling for Dream / DiffuCoder, compiled end to end.

A port of the reference `DreamGenerationMixin._sample` (Dream
generation_utils.py), model-agnostic: the model enters as

  logits_fn(tokens [B,L] int32, attention_mask [B,L] bool | None,
            positions [B,L] int32 | None) -> raw logits [B,L,V]

with RAW (unshifted) logits: the output at position i predicts token i+1
(Dream keeps its Qwen AR alignment); the sampler does the shift. When a mask
is given it is the 2-D key/query validity mask; the MODEL must build the
pairwise mask `m[:, None, :] & m[:, :, None]` (a pad row attends nothing,
nobody attends pads) and use `finfo.min`, not -inf, so pad rows are not NaN.
`None` means full bidirectional attention and positions `arange(L)`.

The whole denoising loop is one `jax.jit` with a `lax.fori_loop` over the
steps: the per-step reveal count k is data-dependent, so the top-k is done
by ranking (positions whose confidence rank < k) instead of dynamic shapes.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

LogitsFn = Callable[[jax.Array, Optional[jax.Array], Optional[jax.Array]],
                    jax.Array]


class Denoiser(NamedTuple):
  """A model split at the LM head, so the sampler can apply the head to the
  positions that may be revealed only (the head is most of a small model's
  forward and all of its vocabulary-wide work).

    hidden(params, tokens [B,L] i32, mask [B,L] bool | None,
           positions [B,L] i32 | None) -> final-normed hidden [B, L, D]
    head(params, h [..., D]) -> raw logits [..., V]

  Both are static jit arguments: build one Denoiser per model and reuse it.
  """
  hidden: Callable
  head: Callable
ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# Hugging Face's effective default (spec §2.1); None or 0 turns top-k off.
DEFAULT_TOP_K = 50


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


def _transfer_ratios(steps: int, eps: float) -> np.ndarray:
  """Per-step `1 - s/t` in float32, IEEE on the host (not a device divide)."""
  ts = _timesteps(steps, eps)
  return (np.float32(1.0) - ts[1:] / ts[:-1]).astype(np.float32)


def reveal_schedule(steps: int, max_new_tokens: int,
                    eps: float = 1e-3) -> list[int]:
  """Tokens revealed at each step for an un-padded canvas (confidence algs).

  k = int(num_masked * (1 - s/t)) truncated in float32, the last step
  reveals whatever is left.
  """
  ratios = _transfer_ratios(steps, eps)
  left, out = int(max_new_tokens), []
  for i in range(steps):
    k = int(np.float32(left) * ratios[i]) if i < steps - 1 else left
    out.append(k)
    left -= k
  return out


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


def _first_true(mask, n: int):
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
  chosen = _first_true(above | (tied & (tied_rank < room)), k_blocks)
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
  probs = jnp.exp(values.astype(jnp.float32) - log_norm[..., None])
  keys = _order_keys(values)
  target = jnp.float32(top_p)
  # Smallest key t whose strictly-larger mass is <= top_p: bisection on the
  # complement (largest t with mass(keys >= t) > top_p, plus one step).
  mass_ge = lambda m: jnp.sum(jnp.where(m, probs, 0.0), axis=-1)  # noqa: E731
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
  return greater | (tie & (mass_greater + tie_before <= target))


def _finish(values, ids, keep, key, *, temperature, conf_kind):
  """softmax over the kept `values`, then the token and its confidence."""
  dtype = values.dtype
  if keep is not None:
    values = jnp.where(keep, values, jnp.finfo(dtype).min)
  probs = jax.nn.softmax(values, axis=-1)
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
    conf = top1 - jnp.max(others, axis=-1)
  elif conf_kind == "entropy":
    conf = jnp.sum(probs * jnp.log(probs + jnp.asarray(1e-10, dtype)),
                   axis=-1)
  x0 = jnp.take_along_axis(ids, j[..., None], axis=-1)[..., 0]
  return conf, x0.astype(jnp.int32)


def _sample_tokens(logits, key, *, temperature, top_p, top_k, conf_kind):
  """Reference `sample_tokens` over the last axis -> (confidence, x0).

  Everything stays in the logits' dtype (bf16 for the real model) because
  the reference never upcasts; only the categorical draw and top-p's mass run
  in float32. No sort over the vocabulary: with top_k the k-th largest value
  is found exactly among a few candidate blocks (`_candidates`) and the
  softmax, draw and confidence run on those candidates only (every other
  entry's probability is exactly 0); top-p alone tries the 64 largest first
  and uses the whole vocabulary only when they do not cover top_p.
  """
  dtype = logits.dtype
  vocab = logits.shape[-1]
  if temperature > 0:
    logits = logits / jnp.asarray(temperature, dtype)
  finish = functools.partial(_finish, key=key, temperature=temperature,
                             conf_kind=conf_kind)
  use_top_p = top_p is not None and top_p < 1
  log_norm = (jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
              if use_top_p else None)
  all_ids = jnp.broadcast_to(jnp.arange(vocab, dtype=jnp.int32), logits.shape)
  if top_k:
    values, ids, kth, complete = _candidates(logits, min(int(top_k), vocab))

    def keep(values):
      kept = _order_keys(values) >= kth[..., None]
      if use_top_p:  # top-p acts first in the reference, on the full softmax
        kept &= _top_p_keep(values, log_norm, top_p)
      return kept

    return jax.lax.cond(jnp.all(complete),
                        lambda: finish(values, ids, keep(values)),
                        lambda: finish(logits, all_ids, keep(logits)))
  if not use_top_p:
    return finish(logits, all_ids, None)
  values, ids, kth, complete = _candidates(
      logits, min(_TOP_P_CANDIDATES, vocab))
  top = _order_keys(values) >= kth[..., None]
  # Every entry outside complete candidates ranks after all of `top`: if
  # `top` alone holds more than top_p, they are all removed.
  covered = complete & (jnp.sum(
      jnp.where(top, jnp.exp(values.astype(jnp.float32)
                             - log_norm[..., None]), 0.0),
      axis=-1) > jnp.float32(top_p))
  return jax.lax.cond(
      jnp.all(covered),
      lambda: finish(values, ids, _top_p_keep(values, log_norm, top_p)),
      lambda: finish(logits, all_ids, _top_p_keep(logits, log_norm, top_p)))


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
  scores = (conf / jnp.asarray(alg_temp, conf.dtype)).astype(jnp.float32)
  return scores + jax.random.gumbel(key, scores.shape, jnp.float32)


def _rank_desc(scores):
  """Rank of each entry in its row, descending, ties to the lower index."""
  order = jnp.argsort(-scores, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True)


@functools.partial(jax.jit, static_argnames=(
    "logits_fn", "mask_token_id", "max_new_tokens", "steps", "eps", "alg",
    "alg_temp", "temperature", "top_p", "top_k", "use_mask", "history",
    "window"))
def _generate(logits_fn, params, input_ids, attention_mask, rng, *,
              mask_token_id,
              max_new_tokens, steps, eps, alg, alg_temp, temperature, top_p,
              top_k, use_mask, history, window):
  b, p = input_ids.shape
  length = p + max_new_tokens
  x, am, pos = canvas_and_mask(input_ids, attention_mask if use_mask else None,
                               max_new_tokens, mask_token_id)
  ratios = jnp.asarray(_transfer_ratios(steps, eps))
  # Only positions [window, length) can hold the mask token (the canvas,
  # unless a prompt holds it too): only they get logits and sampling.
  n = length - window

  def shifted_window(rows):
    """Dream's AR alignment: position j is predicted by the raw output j-1
    (position 0 by itself); the rows predicting [window, length)."""
    if window == 0:
      return jnp.concatenate([rows[:, :1], rows[:, :-1]], axis=1)
    return rows[:, window - 1:length - 1]

  def logits_at(x, rows):
    """Logits [B, S, V] for the window positions `rows` [B, S] (or for the
    whole window when `rows` is None)."""
    if isinstance(logits_fn, Denoiser):
      # The LM head (most of a small model's forward) only where needed.
      h = shifted_window(logits_fn.hidden(params, x, am, pos))
      if rows is not None:
        h = jnp.take_along_axis(h, rows[..., None], axis=1)
      return logits_fn.head(params, h)
    raw = shifted_window(logits_fn(x, am, pos) if params is None
                         else logits_fn(params, x, am, pos))
    return raw if rows is None else jnp.take_along_axis(
        raw, rows[..., None], axis=1)

  def step(i, carry, size=None):
    """One denoising step; with `size`, only the (at most `size`) masked
    positions of each row get logits and sampling."""
    x, hist = carry
    key = jax.random.fold_in(rng, i)
    k_tok, k_sel = jax.random.split(key)
    canvas = x[:, window:]
    mask_index = canvas == mask_token_id
    rows = None if size is None else _first_true(mask_index, size)
    logits = logits_at(x, rows)
    last = i == steps - 1
    if alg == "origin":
      p_transfer = jnp.where(last, jnp.float32(1.0), ratios[i])
      reveal = mask_index & (jax.random.uniform(k_sel, (b, n)) < p_transfer)
      _, x0 = _sample_tokens(logits, k_tok, temperature=temperature,
                             top_p=top_p, top_k=top_k, conf_kind=None)
      canvas = jnp.where(reveal, x0, canvas)
    else:
      conf, x0 = _sample_tokens(logits, k_tok, temperature=temperature,
                                top_p=top_p, top_k=top_k, conf_kind=alg)
      if rows is not None:  # back to window positions; unmasked stay -inf
        batch = jnp.arange(b)[:, None]
        valid = jnp.take_along_axis(mask_index, rows, axis=1)
        conf = jnp.full((b, n), -jnp.inf, conf.dtype).at[batch, rows].max(
            jnp.where(valid, conf, -jnp.inf))
        x0 = jnp.zeros((b, n), jnp.int32).at[batch, rows].max(
            jnp.where(valid, x0, 0))
      # k from the BATCH-AVERAGE mask count, float32, truncated (as the
      # reference); exact integer quotient when counts divide evenly.
      count = jnp.sum(mask_index, dtype=jnp.int32)
      avg = jnp.where(count % b == 0, (count // b).astype(jnp.float32),
                      count.astype(jnp.float32) / b)
      k = jnp.where(last, avg.astype(jnp.int32),
                    (avg * ratios[i]).astype(jnp.int32))
      # Confidence in the logits' dtype, -inf off the mask (reference).
      full_conf = jnp.where(mask_index, conf.astype(logits.dtype),
                            -jnp.inf).astype(logits.dtype)
      chosen = _rank_desc(reveal_scores(full_conf, alg_temp, k_sel)) < k
      # As the reference: a chosen unmasked position would get mask_id (only
      # possible when rows hold different mask counts; keep them equal).
      canvas = jnp.where(chosen, jnp.where(mask_index, x0, mask_token_id),
                         canvas)
    x = jnp.concatenate([x[:, :window], canvas], axis=1)
    if history:
      hist = hist.at[i].set(x)
    return x, hist

  hist = jnp.zeros((steps if history else 0, b, length), jnp.int32)
  carry = (x, hist)
  for first, stop, size in _segments(steps, n, eps, alg, window == p):
    carry = jax.lax.fori_loop(first, stop, functools.partial(step, size=size),
                              carry)
  x, hist = carry
  return (x, hist) if history else x


def _segments(steps: int, n: int, eps: float, alg: str, equal_counts: bool):
  """[(first step, end step, positions per row or None)]: the loop in runs
  of steps whose masked positions per row fit a static size.

  With a confidence algorithm every row reveals the same count per step
  (rows start equal: a canvas each), so the masked count of step i is the
  host's `reveal_schedule` remainder; each halving of it (down to n/8, to
  keep compiled copies of the step few) gets its own loop, which gives the
  LM head and the sampling about 2/3 of the rows of a whole-canvas step.
  """
  if alg == "origin" or not equal_counts or n < 16:
    return [(0, steps, None)]
  left = n - np.concatenate([[0], np.cumsum(reveal_schedule(steps, n, eps))])
  out, first, size = [], 0, n
  while first < steps:
    smaller = size // 2
    # The first step whose masked count fits the next halving.
    fits = np.nonzero(left[first:steps] <= smaller)[0] if size > n // 8 else []
    stop = first + int(fits[0]) if len(fits) else steps
    if stop > first:
      out.append((first, stop, None if size == n else size))
    first, size = stop, smaller
  return out


def diffusion_generate(logits_fn: LogitsFn, input_ids, attention_mask=None,
                       *, mask_token_id: int, max_new_tokens: int,
                       steps: int = 512, eps: float = 1e-3,
                       alg: str = "origin", alg_temp: Optional[float] = None,
                       temperature: float = 0.0, top_p: Optional[float] = None,
                       top_k: Optional[int] = DEFAULT_TOP_K, rng=None,
                       return_history: bool = False, params=None):
  """Dream `diffusion_generate` -> sequences [B, P + max_new_tokens].

  `top_k` defaults to 50, what Hugging Face's `diffusion_generate` runs with
  when the caller passes none (the generation config's legacy default, spec
  §2.1); `top_k=None` or `0` turns it off.

  Output is prompt + canvas, no EOS handling (see `split_completion`). With
  `return_history` also returns x after every step, [steps, B, L]. Rows must
  hold equal mask counts (left-pad the prompts), as in the reference.
  `logits_fn` is a static jit argument: pass the same function object to
  reuse the compiled loop. With `params` (a pytree, e.g. sharded model
  weights) it is called as `logits_fn(params, tokens, mask, positions)` and
  the weights enter the compiled loop as arguments, not as constants.
  """
  if rng is None:
    rng = jax.random.key(0)
  input_ids = jnp.asarray(input_ids, jnp.int32)
  use_mask = needs_mask(attention_mask)
  am = jnp.asarray(attention_mask, bool) if use_mask else None
  return _generate(
      logits_fn, params, input_ids, am, rng, **_static_kwargs(
          mask_token_id=mask_token_id, max_new_tokens=max_new_tokens,
          steps=steps, eps=eps, alg=alg, alg_temp=alg_temp,
          temperature=temperature, top_p=top_p, top_k=top_k,
          use_mask=use_mask, history=return_history,
          window=_window(input_ids, mask_token_id)))


def _window(input_ids, mask_token_id: int) -> int:
  """First position that may hold the mask token: the canvas, unless a prompt
  holds the mask token itself (the reference fills those too)."""
  if isinstance(input_ids, jax.core.Tracer):
    return 0
  prompt_masks = np.asarray(input_ids) == mask_token_id
  return 0 if prompt_masks.any() else int(input_ids.shape[1])


def _static_kwargs(*, mask_token_id, max_new_tokens, steps, eps, alg,
                   alg_temp, temperature, top_p, top_k, use_mask, history,
                   window):
  """Checked, normalised static arguments of `_generate` (one cache key per
  setting whatever the caller's number types)."""
  if alg not in ALGS:
    raise ValueError(f"Unknown alg: {alg}")
  if steps < 1 or max_new_tokens < 1:
    raise ValueError("steps and max_new_tokens must be >= 1")
  return dict(
      mask_token_id=int(mask_token_id), max_new_tokens=int(max_new_tokens),
      steps=int(steps), eps=float(eps), alg=alg,
      alg_temp=None if alg_temp is None else float(alg_temp),
      temperature=float(temperature),
      top_p=None if top_p is None else float(top_p),
      top_k=int(top_k) if top_k else None, use_mask=bool(use_mask),
      history=bool(history), window=int(window))


def lower_generate(logits_fn: LogitsFn, input_ids, attention_mask=None, *,
                   mask_token_id: int, max_new_tokens: int, steps: int = 512,
                   eps: float = 1e-3, alg: str = "origin",
                   alg_temp: Optional[float] = None, temperature: float = 0.0,
                   top_p: Optional[float] = None,
                   top_k: Optional[int] = DEFAULT_TOP_K,
                   rng=None, return_history: bool = False, params=None):
  """`jax.stages.Lowered` of the program `diffusion_generate` runs, for
  abstract arguments (`jax.ShapeDtypeStruct`s, with shardings if wanted):
  ahead-of-time compilation without allocating the weights.

  Arguments as `diffusion_generate`, except that `attention_mask` is used as
  given: pass one (a left-padded batch) for the padding-mask program, None
  for the all-ones one. `rng` defaults to an abstract key.
  """
  if rng is None:
    rng = jax.eval_shape(lambda: jax.random.key(0))
  return _generate.lower(
      logits_fn, params, input_ids, attention_mask, rng, **_static_kwargs(
          mask_token_id=mask_token_id, max_new_tokens=max_new_tokens,
          steps=steps, eps=eps, alg=alg, alg_temp=alg_temp,
          temperature=temperature, top_p=top_p, top_k=top_k,
          use_mask=attention_mask is not None, history=return_history,
          window=input_ids.shape[1]))


def split_completion(tokens, stop_ids: Sequence[int]) -> list[list[int]]:
  """Cuts each completion [B, N] at its first id in `stop_ids`.

  Pass the completion part only (`sequences[:, P:]`) and the caller's stop
  ids: eos for Base, `<|dlm_pad|>` and `<|im_end|>` for Instruct.
  """
  stops = set(int(s) for s in stop_ids)
  out = []
  for row in np.asarray(tokens).tolist():
    cut = next((j for j, t in enumerate(row) if t in stops), len(row))
    out.append([int(t) for t in row[:cut]])
  return out
