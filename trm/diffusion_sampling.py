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


def _sample_tokens(logits, key, *, temperature, top_p, top_k, conf_kind):
  """Reference `sample_tokens` over the last axis -> (confidence, x0).

  Everything stays in the logits' dtype (bf16 for the real model) because
  the reference never upcasts; only the categorical draw runs in float32.
  """
  dtype = logits.dtype
  fmin = jnp.finfo(dtype).min
  if temperature > 0:
    logits = logits / jnp.asarray(temperature, dtype)
  if top_p is not None and top_p < 1:
    # Sort descending (stable: ties keep the lower vocab id first), drop the
    # tail past top_p, shifted right so the top token always survives.
    order = jnp.argsort(-logits, axis=-1, stable=True)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    cum = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
    remove = cum > jnp.asarray(top_p, cum.dtype)
    remove = jnp.concatenate(
        [jnp.zeros_like(remove[..., :1]), remove[..., :-1]], axis=-1)
    remove = jnp.put_along_axis(jnp.zeros_like(remove), order, remove,
                                axis=-1, inplace=False)
    logits = jnp.where(remove, fmin, logits)
  if top_k is not None:
    kk = min(int(top_k), logits.shape[-1])
    kth = jax.lax.top_k(logits, kk)[0][..., -1:]
    logits = jnp.where(logits < kth, fmin, logits)
  probs = jax.nn.softmax(logits, axis=-1)
  if temperature > 0:
    x0 = jax.random.categorical(key, jnp.log(probs.astype(jnp.float32)),
                                axis=-1)
    conf = jnp.take_along_axis(probs, x0[..., None], axis=-1)[..., 0]
  else:
    conf, x0 = jnp.max(probs, axis=-1), jnp.argmax(probs, axis=-1)
  if conf_kind == "topk_margin":
    top2 = jax.lax.top_k(probs, 2)[0]
    conf = top2[..., 0] - top2[..., 1]
  elif conf_kind == "entropy":
    conf = jnp.sum(probs * jnp.log(probs + jnp.asarray(1e-10, dtype)),
                   axis=-1)
  return conf, x0.astype(jnp.int32)


def _rank_desc(scores):
  """Rank of each entry in its row, descending, ties to the lower index."""
  order = jnp.argsort(-scores, axis=-1, stable=True)
  return jnp.argsort(order, axis=-1, stable=True)


@functools.partial(jax.jit, static_argnames=(
    "logits_fn", "mask_token_id", "max_new_tokens", "steps", "eps", "alg",
    "alg_temp", "temperature", "top_p", "top_k", "use_mask", "history"))
def _generate(logits_fn, params, input_ids, attention_mask, rng, *,
              mask_token_id,
              max_new_tokens, steps, eps, alg, alg_temp, temperature, top_p,
              top_k, use_mask, history):
  b, p = input_ids.shape
  length = p + max_new_tokens
  x = jnp.concatenate(
      [input_ids.astype(jnp.int32),
       jnp.full((b, max_new_tokens), mask_token_id, jnp.int32)], axis=1)
  if use_mask:
    # The canvas is attended (mask tokens are real inputs), pads are not;
    # pads get position 1 as in the reference.
    am = jnp.concatenate([attention_mask.astype(bool),
                          jnp.ones((b, max_new_tokens), bool)], axis=1)
    pos = jnp.cumsum(am.astype(jnp.int32), axis=-1) - 1
    pos = jnp.where(am, pos, 1).astype(jnp.int32)
  else:
    am, pos = None, None
  ratios = jnp.asarray(_transfer_ratios(steps, eps))

  def step(i, carry):
    x, hist = carry
    key = jax.random.fold_in(rng, i)
    k_tok, k_sel = jax.random.split(key)
    mask_index = x == mask_token_id
    if isinstance(logits_fn, Denoiser):
      raw = logits_fn.head(params, logits_fn.hidden(params, x, am, pos))
    else:
      raw = (logits_fn(x, am, pos) if params is None
             else logits_fn(params, x, am, pos))
    # Dream's AR alignment: position j is predicted by the raw output j-1.
    logits = jnp.concatenate([raw[:, :1], raw[:, :-1]], axis=1)
    last = i == steps - 1
    if alg == "origin":
      p_transfer = jnp.where(last, jnp.float32(1.0), ratios[i])
      reveal = mask_index & (jax.random.uniform(k_sel, (b, length))
                             < p_transfer)
      _, x0 = _sample_tokens(logits, k_tok, temperature=temperature,
                             top_p=top_p, top_k=top_k, conf_kind=None)
      x = jnp.where(reveal, x0, x)
    else:
      conf, x0 = _sample_tokens(logits, k_tok, temperature=temperature,
                                top_p=top_p, top_k=top_k, conf_kind=alg)
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
      if alg_temp is None or alg_temp == 0:
        scores = full_conf
      else:
        # multinomial(softmax(conf/alg_temp), k, no replacement) ==
        # top-k of conf/alg_temp + Gumbel noise (log-softmax up to a constant).
        scores = (full_conf / jnp.asarray(alg_temp, full_conf.dtype)
                  ).astype(jnp.float32)
        scores = scores + jax.random.gumbel(k_sel, scores.shape, jnp.float32)
      chosen = _rank_desc(scores) < k
      # As the reference: a chosen unmasked position would get mask_id (only
      # possible when rows hold different mask counts; keep them equal).
      x = jnp.where(chosen, jnp.where(mask_index, x0, mask_token_id), x)
    if history:
      hist = hist.at[i].set(x)
    return x, hist

  hist = jnp.zeros((steps if history else 0, b, length), jnp.int32)
  x, hist = jax.lax.fori_loop(0, steps, step, (x, hist))
  return (x, hist) if history else x


def diffusion_generate(logits_fn: LogitsFn, input_ids, attention_mask=None,
                       *, mask_token_id: int, max_new_tokens: int,
                       steps: int = 512, eps: float = 1e-3,
                       alg: str = "origin", alg_temp: Optional[float] = None,
                       temperature: float = 0.0, top_p: Optional[float] = None,
                       top_k: Optional[int] = None, rng=None,
                       return_history: bool = False, params=None):
  """Dream `diffusion_generate` -> sequences [B, P + max_new_tokens].

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
  # Host-side decision, as the reference's `torch.any(attention_mask == 0)`:
  # an all-ones mask means full attention and default positions.
  use_mask = attention_mask is not None and bool(
      np.any(np.asarray(attention_mask) == 0))
  am = jnp.asarray(attention_mask, bool) if use_mask else None
  return _generate(
      logits_fn, params, input_ids, am, rng, **_static_kwargs(
          mask_token_id=mask_token_id, max_new_tokens=max_new_tokens,
          steps=steps, eps=eps, alg=alg, alg_temp=alg_temp,
          temperature=temperature, top_p=top_p, top_k=top_k,
          use_mask=use_mask, history=return_history))


def _static_kwargs(*, mask_token_id, max_new_tokens, steps, eps, alg,
                   alg_temp, temperature, top_p, top_k, use_mask, history):
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
      top_k=None if top_k is None else int(top_k), use_mask=bool(use_mask),
      history=bool(history))


def lower_generate(logits_fn: LogitsFn, input_ids, attention_mask=None, *,
                   mask_token_id: int, max_new_tokens: int, steps: int = 512,
                   eps: float = 1e-3, alg: str = "origin",
                   alg_temp: Optional[float] = None, temperature: float = 0.0,
                   top_p: Optional[float] = None, top_k: Optional[int] = None,
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
          use_mask=attention_mask is not None, history=return_history))


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
