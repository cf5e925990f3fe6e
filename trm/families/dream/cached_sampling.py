"""Cached block decoding for masked-diffusion LMs: opt-in and approximate.

After Fast-dLLM (Wu et al., 2025): the canvas is decoded block by block,
left to right. Each block starts with one full forward, which refreshes the
key/value cache and already reveals tokens of the block; the block's other
steps run the model on a window only, against the cached keys and values:

  cache="prefix"  the window is the block and everything after it (the
                  prompt and decoded blocks come from the cache);
  cache="dual"    the window is the block alone (the masked suffix comes
                  from the cache too; it is refreshed at the next block).

Each window starts one position before its block, because Dream predicts
position j from the output at j - 1. Two reveal rules:

  threshold=None  fixed steps: `steps / blocks` per block, revealing the
                  reference's linspace schedule of the block's tokens by
                  `alg` confidence (the first step is the full forward);
  threshold=t     parallel decoding: every masked block position whose
                  token probability is >= t, and at least the most
                  confident one per row, until the block is done; the step
                  count then follows the model's confidence. Should the
                  model draw <|mask|> itself (which leaves the position
                  masked), step block_length reveals all that is left, as
                  the exact sampler's last step, where Fast-dLLM loops
                  forever.

With `fast_dllm=True` the block rules are Fast-dLLM's own
(`generation_utils_block.py`, NVlabs/Fast-dLLM 24cc59e), so that its
results can be reproduced token for token: the refresh forward commits the
block's first token by the token draw alone (nothing else is revealed
there), the windows start at the block (its first row stands in for itself,
that token being decoded already), fixed steps rank by entropy and reveal
`int(masked * (1 - s/t))` from the schedule's step 1 on. Two of its
behaviours are refused rather than copied: fixed steps need two steps per
block (with one, Fast-dLLM leaves the block masked after its first token),
and `alg` must be 'entropy' (it ranks by entropy whatever `alg` says). Its
threshold rule reads row 0 only (so batched rows follow the first row's
choices); ours applies it to every row, which is the same at batch 1.

The exact sampler is `diffusion_sampling.diffusion_generate`; this one trades
exactness for speed (BUILD_NOTES.md has the measured agreement).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from trm.families.dream import reveal_rules
from trm.families.dream import sampling as ds
from trm.families.dream import token_draws

CACHES = ("prefix", "dual")
ALGS = ("maskgit_plus", "topk_margin", "entropy")


def check_needs_cache(cached: bool, threshold: Optional[float], fast_dllm,
                      *, cli: bool) -> None:
  """`threshold` and `fast_dllm` are rules of cached block decoding, which
  the exact sampler would silently ignore: without a cache they are one
  ValueError, spelled for the caller (`cli`: the --flags of trm.generate,
  trm.evaluate and trm.aot; else `DiffusionLM.generate`'s arguments)."""
  if cached or (threshold is None and not fast_dllm):
    return
  if threshold is not None:
    setting, needs = f"threshold={threshold!r}", "parallel decoding needs"
  else:
    setting = "fast_dllm" if cli else f"fast_dllm={fast_dllm!r}"
    needs = "Fast-dLLM's block rules need"
  if cli:
    raise ValueError(f"--{setting}: {needs} --cache=dual or --cache=prefix.")
  raise ValueError(f"{setting}: cached block decoding only; {needs} "
                   "cache='dual' or cache='prefix'.")


def check_cached_settings(*, cache: str, block_length: int,
                          threshold: Optional[float], max_new_tokens: int,
                          steps: Optional[int], alg: str,
                          fast_dllm: bool = False) -> int:
  """One ValueError naming the argument; returns the steps per block
  (0 with a threshold)."""
  if not isinstance(fast_dllm, (bool, np.bool_)):
    raise ValueError(f"fast_dllm={fast_dllm!r}: must be True or False.")
  if cache not in CACHES:
    raise ValueError(f"cache={cache!r}: must be one of {CACHES} (or unset "
                     "for the exact sampler).")
  # A bool is no block length (True ran blocks of one token).
  if (not isinstance(block_length, (int, np.integer))
      or isinstance(block_length, (bool, np.bool_)) or block_length < 1):
    raise ValueError(f"block_length={block_length!r}: must be an integer "
                     ">= 1.")
  if max_new_tokens % block_length:
    raise ValueError(f"block_length={block_length}: must divide "
                     f"max_new_tokens={max_new_tokens}.")
  if threshold is not None:
    if not 0 < threshold <= 1:
      raise ValueError(f"threshold={threshold!r}: must lie in (0, 1] (or be "
                       "unset for fixed steps per block).")
    return 0
  if alg not in ALGS:
    raise ValueError(f"alg={alg!r}: cached decoding ranks by confidence; use "
                     f"one of {ALGS}.")
  blocks = max_new_tokens // block_length
  if steps % blocks:
    raise ValueError(f"steps={steps}: must be a multiple of the number of "
                     f"blocks ({blocks} = max_new_tokens / block_length).")
  if fast_dllm and alg != "entropy":
    raise ValueError(f"alg={alg!r}: with fast_dllm, fixed steps rank by "
                     "entropy as Fast-dLLM's block loop does whatever its "
                     "alg; pass alg='entropy'.")
  if fast_dllm and steps // blocks < 2 and block_length > 1:
    raise ValueError(f"steps={steps}: with fast_dllm, give at least 2 steps "
                     f"per block ({2 * blocks}); with one, Fast-dLLM's block "
                     "loop decodes only each block's first token and leaves "
                     "the rest masked.")
  return steps // blocks


@functools.partial(jax.jit, static_argnames=(
    "model", "mask_token_id", "max_new_tokens", "block_length", "steps",
    "cache", "threshold", "alg", "alg_temp", "temperature", "top_p", "top_k",
    "use_mask", "eps", "fast_dllm"))
def _generate(model, params, input_ids, attention_mask, rng, *,
              mask_token_id, max_new_tokens, block_length, steps, cache,
              threshold, alg, alg_temp, temperature, top_p, top_k, use_mask,
              eps, fast_dllm):
  b, p = input_ids.shape
  length = p + max_new_tokens
  if model.prepare is not None:
    params = model.prepare(params)
  x, key_mask, pos = reveal_rules.canvas_and_mask(
      input_ids, attention_mask if use_mask else None, max_new_tokens,
      mask_token_id)
  if pos is None:  # windows slice the positions: make them explicit
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
  conf_kind = alg if threshold is None else "maskgit_plus"
  if fast_dllm:  # step 0 commits one token; the schedule's step 1 on, the rest
    schedule = [1] + reveal_rules.reveal_schedule(
        max(steps, 1), block_length - 1, eps, first=1)
  else:
    schedule = reveal_rules.reveal_schedule(max(steps, 1), block_length, eps)
  counts = jnp.asarray(schedule, jnp.int32)
  block_ids = jnp.arange(block_length)
  # Where each window starts, before the block: ours one position before it
  # (Dream predicts position j from the output at j - 1); Fast-dLLM's at it.
  lead = 0 if fast_dllm else 1

  def reveal(x, h, start, key, count, last=False):
    """Sample the block at `start` from hidden rows h [B, block, D] (row j
    predicts block position j) and reveal by the rule (with a threshold
    and `last`, every masked position)."""
    k_tok, k_sel = jax.random.split(key)
    block = jax.lax.dynamic_slice_in_dim(x, start, block_length, axis=1)
    masked = block == mask_token_id
    conf, x0 = token_draws.sample_tokens(
        model.head(params, h), k_tok, temperature=temperature, top_p=top_p,
        top_k=top_k, conf_kind=conf_kind)
    conf = jnp.where(masked, conf, -jnp.inf)
    if threshold is None:
      scores = reveal_rules.reveal_scores(conf, alg_temp, k_sel)
      chosen = masked & (reveal_rules.rank_desc(scores) < count)
    else:
      best = jnp.argmax(conf, axis=-1)[:, None]
      chosen = masked & ((conf.astype(jnp.float32) >= threshold)
                         | (block_ids == best) | last)
    block = jnp.where(chosen, x0, block)
    return jax.lax.dynamic_update_slice_in_dim(x, block, start, axis=1)

  def commit_first(x, h, start, key):
    """Fast-dLLM's refresh step: the block's first token, drawn from the
    row predicting it (h [B, 1, D]), whatever its confidence."""
    _, x0 = token_draws.sample_tokens(
        model.head(params, h), key, temperature=temperature, top_p=top_p,
        top_k=top_k, conf_kind="maskgit_plus")
    return jax.lax.dynamic_update_slice_in_dim(
        x, x0.astype(x.dtype), start, axis=1)

  def decode_block(x, start, key, width):
    """All steps of the block at `start`; windows of `width` positions."""
    hidden, kv = model.encode(params, x, key_mask, pos)
    rows = jax.lax.dynamic_slice_in_dim(hidden, start - 1, block_length, 1)
    if fast_dllm:
      x = commit_first(x, rows[:, :1], start, jax.random.fold_in(key, 0))
    else:
      x = reveal(x, rows, start, jax.random.fold_in(key, 0), counts[0])

    def cached_step(x, i):
      at = start - lead
      tokens = jax.lax.dynamic_slice_in_dim(x, at, width, axis=1)
      positions = jax.lax.dynamic_slice_in_dim(pos, at, width, axis=1)
      h = model.window(params, tokens, positions, kv, at, key_mask)
      if fast_dllm:  # row 0 (the decoded first token) stands for itself
        h = jnp.concatenate([h[:, :1], h[:, :block_length - 1]], axis=1)
      return reveal(x, h[:, :block_length], start,
                    jax.random.fold_in(key, i), counts[i],
                    last=i >= block_length)

    if threshold is None:
      return jax.lax.fori_loop(1, steps, lambda i, x: cached_step(x, i), x)

    def unfinished(carry):
      # Every step reveals one masked position at least, so a block is done
      # before step block_length, unless a token drawn is <|mask|> itself:
      # nothing changes then, and (greedy) the same step repeats forever,
      # as in Fast-dLLM's loop. Step block_length reveals every position
      # left, as the exact sampler's last step does, and ends the block.
      x, i = carry
      block = jax.lax.dynamic_slice_in_dim(x, start, block_length, 1)
      return jnp.any(block == mask_token_id) & (i <= block_length)

    x, _ = jax.lax.while_loop(
        unfinished, lambda c: (cached_step(c[0], c[1]), c[1] + 1), (x, 1))
    return x

  blocks = max_new_tokens // block_length
  if cache == "dual":  # one window width: one compiled block, looped
    return jax.lax.fori_loop(
        0, blocks, lambda j, x: decode_block(
            x, p + j * block_length, jax.random.fold_in(rng, j),
            block_length + lead), x)
  for j in range(blocks):  # the prefix window shrinks block by block
    start = p + j * block_length
    x = decode_block(x, start, jax.random.fold_in(rng, j),
                     length - start + lead)
  return x


def static_settings(*, mask_token_id: int, max_new_tokens: int,
                    cache: str = "dual", block_length: int = 32,
                    threshold: Optional[float] = 0.9,
                    steps: Optional[int] = None, eps: float = 1e-3,
                    alg: str = "entropy", alg_temp: Optional[float] = None,
                    temperature: float = 0.0, top_p: Optional[float] = None,
                    top_k: Optional[int] = ds.DEFAULT_TOP_K,
                    use_mask: bool = False, fast_dllm: bool = False) -> dict:
  """Checked, normalised static arguments of `_generate` (one compiled
  program per setting whatever the caller's number types)."""
  steps = max_new_tokens if steps is None else steps
  per_block = check_cached_settings(
      cache=cache, block_length=block_length, threshold=threshold,
      max_new_tokens=max_new_tokens, steps=steps, alg=alg,
      fast_dllm=fast_dllm)
  return dict(
      mask_token_id=int(mask_token_id), max_new_tokens=int(max_new_tokens),
      block_length=int(block_length), steps=int(per_block), cache=cache,
      threshold=None if threshold is None else float(threshold), alg=alg,
      alg_temp=None if alg_temp is None else float(alg_temp),
      temperature=float(temperature),
      top_p=None if top_p is None else float(top_p),
      top_k=int(top_k) if top_k else None, use_mask=bool(use_mask),
      eps=float(eps), fast_dllm=bool(fast_dllm))


def cached_generate(model, input_ids, attention_mask=None, *, params,
                    rng=None, **settings):
  """Cached block decoding -> sequences [B, P + max_new_tokens].

  `model` is a `dream_cache.CachedDenoiser` (a static jit argument: reuse
  the object). `settings` are those of `static_settings`: the sampling
  arguments of `diffusion_generate` plus `cache`, `block_length` and
  `threshold`, and `fast_dllm` (Fast-dLLM's block rules, see the module
  docstring); `steps` (default max_new_tokens) only counts with
  `threshold=None`. Prompts must be non-empty (the first block is predicted
  from the prompt's last output).
  """
  input_ids = jnp.asarray(input_ids, jnp.int32)
  if input_ids.shape[1] < 1:
    raise ValueError("cached decoding needs prompts of at least one token.")
  use_mask = reveal_rules.needs_mask(attention_mask)
  return _generate(
      model, params, input_ids,
      jnp.asarray(attention_mask, bool) if use_mask else None,
      jax.random.key(0) if rng is None else rng,
      **static_settings(use_mask=use_mask, **settings))


def lower_cached_generate(model, input_ids, attention_mask=None, *, params,
                          rng=None, **settings):
  """`jax.stages.Lowered` of `cached_generate` for abstract arguments (as
  `diffusion_sampling.lower_generate`: pass a mask for the padded program)."""
  if rng is None:
    rng = jax.eval_shape(lambda: jax.random.key(0))
  return _generate.lower(
      model, params, input_ids, attention_mask, rng,
      **static_settings(use_mask=attention_mask is not None, **settings))
