"""Dream with a key/value cache: the model half of cached decoding.

Masked diffusion attends bidirectionally, so no cache is exact: a token
revealed anywhere changes every position's keys. Fast-dLLM's observation is
that keys and values far from the block being decoded change little between
steps, so they can be computed once per block (`encode`) and reused while
the block is decoded (`window`), which then runs the model on the block
(dual cache) or on the block and everything after it (prefix cache) only.

Both functions take the `Dream` params tree (scanned or not) and reuse the
model's own modules, so the numerics are those of `Dream.hidden`: `encode`
gives its hidden states (to float rounding: XLA fuses the two loops
differently), and so does a `window` over the whole sequence, whatever the
cache holds. Scanned params (`layers`) run as a scan over the layers;
unscanned ones (`layers_0` ...) as one block of code per layer.
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from trm.families.dream import model as dream
from trm.nn import masks


class CachedDenoiser(NamedTuple):
  """The cached-decoding view of a model (static jit argument; one per model).

    encode(params, tokens [B,L], key_mask [B,L] bool | None,
           positions [B,L]) -> (hidden [B,L,D], cache)
    window(params, tokens [B,W], positions [B,W], cache, start,
           key_mask | None) -> hidden [B,W,D] of the window at `start`
    head(params, h [..., D]) -> raw logits [..., V]
    prepare(params) -> params as the three take them, run once per sampling
           call before the block loop (None: as given)
  """
  encode: object
  window: object
  head: object
  prepare: Optional[Callable] = None


def _over_layers(params, cfg: dream.DreamConfig, body, x, per_layer=None):
  """`body(x, (layer params, per_layer[i])) -> (x, y)` over the layers:
  a scan of scanned params, else one call per layer; -> (x, ys stacked on
  a leading layer axis, or None)."""
  if "layers" in params:
    return jax.lax.scan(body, x, (params["layers"], per_layer))
  ys = []
  for i in range(cfg.num_hidden_layers):
    here = None if per_layer is None else jax.tree.map(lambda a: a[i],  # pylint: disable=cell-var-from-loop
                                                      per_layer)
    x, y = body(x, (params[f"layers_{i}"], here))
    ys.append(y)
  if ys[0] is None:
    return x, None
  return x, jax.tree.map(lambda *y: jnp.stack(y), *ys)


def _embed(params, cfg, tokens, positions):
  x = jnp.take(params["embed_tokens"], tokens, axis=0).astype(
      cfg.compute_dtype)
  cos, sin = dream.rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta,
                                cfg.compute_dtype)
  return dream.mesh_lib.constrain(x, dream.ACTIVATION), cos, sin


def _norm(params, cfg, x):
  return dream.rms_norm_layer(cfg).apply({"params": params["norm"]}, x)


def encode(cfg: dream.DreamConfig, params, tokens, key_mask, positions):
  """Full forward -> (final-normed hidden [B,L,D], (k, v) [layers,B,L,KV,K])."""
  layer = dream.DecoderLayer(cfg)
  x, cos, sin = _embed(params, cfg, tokens, positions)
  pair_mask = dream.attention_pair_mask(cfg, key_mask)

  def body(x, layer_and_none):
    return layer.apply({"params": layer_and_none[0]}, x, pair_mask, cos, sin,
                       return_kv=True)

  x, cache = _over_layers(params, cfg, body, x)
  return _norm(params, cfg, x), cache


def window(cfg: dream.DreamConfig, params, tokens, positions, cache, start,
           key_mask):
  """Hidden states [B,W,D] of the window `tokens` placed at `start`: its
  queries attend to the cached keys and values of the whole sequence, with
  the window's own fresh ones in place (the cache itself is not changed).

  The window's queries are real tokens (the decoded block and what follows
  it), so only the keys need masking: `key_mask` [B, L].
  """
  layer = dream.DecoderLayer(cfg)
  x, cos, sin = _embed(params, cfg, tokens, positions)
  pair_mask = None if key_mask is None else masks.key_padding(key_mask)

  def body(x, layer_and_cache):
    layer_params, layer_cache = layer_and_cache
    x, _ = layer.apply({"params": layer_params}, x, pair_mask, cos, sin,
                       cache=layer_cache, start=start)
    return x, None

  x, _ = _over_layers(params, cfg, body, x, cache)
  return _norm(params, cfg, x)


def cached_denoiser(cfg: dream.DreamConfig,
                    platform: str | None = None) -> CachedDenoiser:
  """The cached view of `Dream(cfg)` for `platform` (default: where programs
  traced now run); one object per config and layout, so compiled sampling
  loops are reused.

  Where `dream.denoiser` unstacks a scanned model's layers (on a GPU with
  room for two copies of the weights), so does this, once per sampling
  call: XLA:GPU's layer scan copies each layer's weights out of the stack
  at every forward, which on the H100 doubled the DiffuCoder-7B dual-cache
  sampler's time (BUILD_NOTES "Second run")."""
  return _cached_denoiser(cfg, dream.denoiser(cfg, platform))


@functools.lru_cache(maxsize=None)
def _cached_denoiser(cfg: dream.DreamConfig, exact) -> CachedDenoiser:
  """The cached view sharing `exact`'s head and layout (`prepare`)."""
  return CachedDenoiser(functools.partial(encode, cfg),
                        functools.partial(window, cfg), exact.head,
                        exact.prepare)
