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

from trm.families.dream import reveal_rules
from trm.families.dream import token_draws

LogitsFn = Callable[[jax.Array, Optional[jax.Array], Optional[jax.Array]],
                    jax.Array]


class Denoiser(NamedTuple):
  """A model split at the LM head, so the sampler can apply the head to the
  positions that may be revealed only (the head is most of a small model's
  forward and all of its vocabulary-wide work).

    hidden(params, tokens [B,L] i32, mask [B,L] bool | None,
           positions [B,L] i32 | None) -> final-normed hidden [B, L, D]
    head(params, h [..., D]) -> raw logits [..., V]
    prepare(params) -> params as hidden and head take them, run once per
           sampling call before the step loop (None: as given)

  All are static jit arguments: build one Denoiser per model and reuse it.
  """
  hidden: Callable
  head: Callable
  prepare: Optional[Callable] = None


ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")
# The most denoising steps a call takes: the schedule is a host table of
# steps + 1 times (float64 while built), and each step is one call of the
# model.
MAX_STEPS = 2**20
# Hugging Face's effective default (spec §2.1); None or 0 turns top-k off.
DEFAULT_TOP_K = 50



@functools.partial(jax.jit, static_argnames=(
    "logits_fn", "mask_token_id", "max_new_tokens", "steps", "eps", "alg",
    "alg_temp", "temperature", "top_p", "top_k", "use_mask", "history",
    "window", "draw_in_chunks"))
def _generate(logits_fn, params, input_ids, attention_mask, rng, *,
              mask_token_id,
              max_new_tokens, steps, eps, alg, alg_temp, temperature, top_p,
              top_k, use_mask, history, window, draw_in_chunks=True):
  b, p = input_ids.shape
  length = p + max_new_tokens
  if isinstance(logits_fn, Denoiser) and logits_fn.prepare is not None:
    params = logits_fn.prepare(params)
  x, am, pos = reveal_rules.canvas_and_mask(
      input_ids, attention_mask if use_mask else None, max_new_tokens,
      mask_token_id)
  ratios = jnp.asarray(reveal_rules.transfer_ratios(steps, eps))
  # Only positions [window, length) can hold the mask token (the canvas,
  # unless a prompt holds it too): only they get logits and sampling.
  n = length - window

  def shifted_window(rows):
    """Dream's AR alignment: position j is predicted by the raw output j-1
    (position 0 by itself); the rows predicting [window, length)."""
    if window == 0:
      return jnp.concatenate([rows[:, :1], rows[:, :-1]], axis=1)
    return rows[:, window - 1:length - 1]

  def features(x):
    """The model's rows predicting [window, length): final hidden states
    (a Denoiser), else raw logits."""
    if isinstance(logits_fn, Denoiser):
      return shifted_window(logits_fn.hidden(params, x, am, pos))
    return shifted_window(logits_fn(x, am, pos) if params is None
                          else logits_fn(params, x, am, pos))

  def logits_at(feats, rows):
    """Logits [B, S, V] of the window positions `rows` [B, S] (or of the
    whole window when `rows` is None)."""
    if rows is not None:
      feats = jnp.take_along_axis(feats, rows[..., None], axis=1)
    if isinstance(logits_fn, Denoiser):
      # The LM head (most of a small model's forward) only where needed.
      return logits_fn.head(params, feats)
    return feats

  def step(i, carry, plan=None):
    """One denoising step; with `plan` (static sizes, the first None, and
    each step's index into them), only the (at most that size) masked
    positions of each row get logits and sampling."""
    x, hist = carry
    key = jax.random.fold_in(rng, i)
    k_tok, k_sel = jax.random.split(key)
    canvas = x[:, window:]
    mask_index = canvas == mask_token_id
    feats = features(x)
    last = i == steps - 1
    if alg == "origin":
      p_transfer = jnp.where(last, jnp.float32(1.0), ratios[i])
      reveal = mask_index & (jax.random.uniform(k_sel, (b, n)) < p_transfer)
      _, x0 = token_draws.sample_tokens(
          logits_at(feats, None), k_tok, temperature=temperature,
          top_p=top_p, top_k=top_k, conf_kind=None)
      canvas = jnp.where(reveal, x0, canvas)
    else:
      def head(size):
        """(rows, their logits, which are masked): every window position
        (rows and valid None) or, with `size`, each row's first `size`
        masked positions."""
        if size is None:
          return None, logits_at(feats, None), None
        rows = token_draws.first_true(mask_index, size)
        return (rows, logits_at(feats, rows),
                jnp.take_along_axis(mask_index, rows, axis=1))

      def draw(size):
        """(confidence, token) [B, n] of every window position; with
        `size`, drawn for each row's first `size` masked positions only
        (the others: -inf, 0)."""
        rows, logits, valid = head(size)
        conf, x0 = token_draws.sample_tokens(
            logits, k_tok, temperature=temperature,
            top_p=top_p, top_k=top_k, conf_kind=alg)
        if rows is None:
          return conf, x0
        return scattered(rows, valid, conf, x0)

      def scattered(rows, valid, conf, x0):
        """(confidence, token) [B, n] of draws [B, S] for window positions
        `rows` (-inf, 0 where none is `valid`)."""
        batch = jnp.arange(b)[:, None]
        conf = jnp.full((b, n), -jnp.inf, conf.dtype).at[batch, rows].max(
            jnp.where(valid, conf, -jnp.inf))
        x0 = jnp.zeros((b, n), jnp.int32).at[batch, rows].max(
            jnp.where(valid, x0, 0))
        return conf, x0

      def drawn_in_chunks(sizes, branch, width, chunk, padded):
        """`draw(sizes[branch])` with the head per size but the draw of
        all sizes one loop over chunks of rows
        (`token_draws.sample_rows_in_chunks`)."""
        def head_rows(size):
          rows, logits, valid = head(size)
          if rows is None:
            rows = jnp.broadcast_to(jnp.arange(n), (b, n))
            valid = jnp.ones((b, n), bool)
          pad = padded - rows.shape[1]
          return (jnp.pad(logits, ((0, 0), (0, pad), (0, 0))),
                  jnp.pad(rows, ((0, 0), (0, pad))),
                  jnp.pad(valid, ((0, 0), (0, pad))))

        logits, rows, valid = jax.lax.switch(
            branch, [functools.partial(head_rows, s) for s in sizes])
        conf, x0 = token_draws.sample_rows_in_chunks(
            logits, k_tok, width, chunk, temperature=temperature,
            top_p=top_p, top_k=top_k, conf_kind=alg)
        return scattered(rows, valid, conf, x0)

      if plan is None:
        conf, x0 = draw(None)
      else:
        # One compiled draw per static size (sizes[0] is None, the whole
        # window), chosen by the step's segment: its size holds every row's
        # masked positions as long as each reveal draws a real token; a
        # drawn <|mask|> leaves its position masked (the reference's rule),
        # and a row holding more masked positions than the size draws for
        # the whole window, or those beyond would be revealed as token 0.
        sizes, segment_of_step = plan
        widths = jnp.asarray([n if s is None else s for s in sizes])
        branch = jnp.asarray(segment_of_step)[i]
        fits = jnp.max(jnp.sum(mask_index, axis=1)) <= widths[branch]
        branch = jnp.where(fits, branch, 0)
        per_size = lambda: jax.lax.switch(  # noqa: E731
            branch, [functools.partial(draw, s) for s in sizes])
        chunk = min(s for s in sizes if s is not None)
        padded = -(-n // chunk) * chunk
        vocab = jax.eval_shape(lambda: logits_at(feats[:, :1], None)).shape[-1]
        if draw_in_chunks and token_draws.rows_drawable(
            k_tok, (b, padded, vocab)):
          # The head still runs per size (its rows as the per-size draw's),
          # but the draw is compiled once: per size it was most of the
          # compile time with top-p or top-k. Tokens are bit-identical on
          # the CPU, where that is tested; elsewhere the per-size draw.
          conf, x0 = jax.lax.platform_dependent(
              cpu=lambda: drawn_in_chunks(sizes, branch, widths[branch],
                                          chunk, padded),
              default=per_size)
        else:
          conf, x0 = per_size()
      # k from the BATCH-AVERAGE mask count, float32, truncated (as the
      # reference); exact integer quotient when counts divide evenly.
      count = jnp.sum(mask_index, dtype=jnp.int32)
      avg = jnp.where(count % b == 0, (count // b).astype(jnp.float32),
                      count.astype(jnp.float32) / b)
      k = jnp.where(last, avg.astype(jnp.int32),
                    (avg * ratios[i]).astype(jnp.int32))
      # Confidence in the logits' dtype, -inf off the mask (reference).
      full_conf = jnp.where(mask_index, conf, -jnp.inf).astype(conf.dtype)
      chosen = reveal_rules.rank_desc(
          reveal_rules.reveal_scores(full_conf, alg_temp, k_sel)) < k
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
  segments = _segments(steps, n, eps, alg, window == p)
  if len(segments) == 1:
    x, hist = jax.lax.fori_loop(0, steps, step, carry)
  else:
    # One loop over every step, not one per segment: each segment's loop
    # was a compiled copy of the whole step (the model's forward and a
    # whole-window fallback draw included), which multiplied the compile
    # time of the top-k and top-p draws; the step picks its draw instead.
    sizes = tuple(size for _, _, size in segments)  # sizes[0]: None
    segment_of_step = np.zeros(steps, np.int32)
    for j, (first, stop, _) in enumerate(segments):
      segment_of_step[first:stop] = j
    x, hist = jax.lax.fori_loop(0, steps, functools.partial(
        step, plan=(sizes, segment_of_step)), carry)
  return (x, hist) if history else x


def _segments(steps: int, n: int, eps: float, alg: str, equal_counts: bool):
  """[(first step, end step, positions per row or None)]: the loop in runs
  of steps whose masked positions per row fit a static size.

  With a confidence algorithm every row reveals the same count per step
  (rows start equal: a canvas each), so the masked count of step i is the
  host's `reveal_schedule` remainder; each halving of it (down to n/8, to
  keep compiled copies of the step few) gets its own loop, which gives the
  LM head and the sampling about 2/3 of the rows of a whole-canvas step.
  (A reveal that draws <|mask|> itself keeps more positions masked than
  the schedule's remainder: such a step draws for the whole canvas.)
  """
  if alg == "origin" or not equal_counts or n < 16:
    return [(0, steps, None)]
  left = n - np.concatenate(
      [[0], np.cumsum(reveal_rules.reveal_schedule(steps, n, eps))])
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
  use_mask = reveal_rules.needs_mask(attention_mask)
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
