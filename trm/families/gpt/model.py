"""nanoGPT (karpathy/nanoGPT model.py) as a Flax Linen model.

The same network, initialisation and parameter count as nanoGPT's `GPT`:
learned token and position embeddings, pre-LayerNorm blocks with a fused
q/k/v projection and causal attention, an exact-GELU 4x MLP, a final
LayerNorm and an LM head tied to the token embedding (`wte.attend`; there is
no separate lm_head parameter). Optional biases (Linear and LayerNorm) follow
`cfg.bias`; dropout follows `cfg.dropout` and is active only when
`deterministic=False` (rng stream 'dropout').

Parameters are stored in `param_dtype` and annotated with logical axis names
(trm/core/mesh.py turns them into shardings). Matmuls run in `dtype`; LayerNorm,
attention scores and softmax run in float32, and the residual stream stays
float32, which is what torch.autocast does to nanoGPT (its Linear outputs
are low precision, but adding them to the float32 residual promotes back).
Logits are float32.

By default the blocks are a Python list, parameters `h_0` .. `h_{L-1}`
(nanoGPT's layout, which checkpoints and importers use). With
`cfg.scan_layers` one block is scanned over the layers with `nn.scan`
(MaxText's `scan_layers`): compile time stays flat in depth, and with
`remat` XLA holds one layer's gathered weights at a time rather than every
layer's from forward to backward. The parameters are then one tree `h`
whose leaves carry a leading [n_layer] axis named 'layers' (replicated by
the logical rules), the same numbers as `stack_layers` of the unscanned
tree; `unstack_layers` is the inverse. The weight-decay mask
(steps.decay_mask) does not count that axis, so both layouts decay nanoGPT's
groups; KV-cache decoding runs the unscanned model on unstacked weights
(see `generate`).
"""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from trm.core import mesh as mesh_lib
from trm.families.gpt.config import GPTConfig
from trm.families.gpt.layers import ACTIVATION
from trm.families.gpt.layers import Block
from trm.families.gpt.layers import Embed
from trm.families.gpt.layers import LayerNorm
from trm.families.gpt.layers import TABLE_AXES
from trm.nn import layer_stack
from trm.nn import temperature as temperature_lib
# Re-exported: the rest of this module's interface, imported from here.
from trm.families.gpt.kernels import gelu  # noqa: F401
from trm.families.gpt.kernels import layer_norm  # noqa: F401
from trm.families.gpt.layers import _attend  # noqa: F401
from trm.families.gpt.layers import CausalSelfAttention  # noqa: F401
from trm.families.gpt.layers import Linear  # noqa: F401
from trm.families.gpt.layers import MLP  # noqa: F401
from trm.nn.linear import matmul  # noqa: F401


SCANNED = "h"  # the stacked blocks' name with cfg.scan_layers
LAYERS_AXIS = "layers"  # logical name of their leading axis


class _ScanBlock(Block):
  """Block as the body of `nn.scan`: (x, deterministic) -> (x, None). A
  subclass rather than a wrapper, so the parameters stay h/ln_1, h/attn, ..."""

  def __call__(self, x, deterministic: bool = True):
    return super().__call__(x, deterministic), None


def _scanned_blocks(cfg: GPTConfig):
  """One block scanned over cfg.n_layer layers (unbound; named by setup)."""
  block = _ScanBlock
  if cfg.remat:
    # deterministic (argument 2, counting self) is a Python bool. Inside a
    # scan the loop body is not merged with its recomputation, so
    # prevent_cse's optimisation barrier only costs (as Dream does).
    block = nn.remat(block, prevent_cse=False, static_argnums=(2,),
                     policy=cfg.checkpoint_policy)
  return nn.scan(
      # Intermediates (sow, capture_intermediates) stack per layer too.
      block, variable_axes={"params": 0, "intermediates": 0},
      # Each layer draws its own init and its own dropout masks.
      split_rngs={"params": True, "dropout": True},
      # deterministic is broadcast, not scanned: it stays a Python bool.
      in_axes=(nn.broadcast,), length=cfg.n_layer,
      metadata_params={nn.PARTITION_NAME: LAYERS_AXIS})(cfg)


def _unscanned(cfg: GPTConfig) -> GPTConfig:
  return dataclasses.replace(cfg, scan_layers=False)


class GPT(nn.Module):
  """nanoGPT's GPT: tokens [B, T] -> logits [B, T, vocab] (float32)."""
  cfg: GPTConfig

  def setup(self):
    cfg = self.cfg
    self.wte = Embed(cfg.vocab_size, TABLE_AXES, cfg)
    self.wpe = Embed(cfg.block_size, (None, "embed"), cfg)
    self.drop = nn.Dropout(cfg.dropout)
    if cfg.scan_layers:
      self.h = _scanned_blocks(cfg)  # h: [n_layer, ...] leaves
    else:
      # deterministic (argument 2, counting self) is a Python bool.
      block = (nn.remat(Block, static_argnums=(2,),
                        policy=cfg.checkpoint_policy) if cfg.remat else Block)
      self.h = [block(cfg) for _ in range(cfg.n_layer)]  # h_0 .. h_{L-1}
    self.ln_f = LayerNorm(cfg)

  def hidden(self, idx, *, deterministic: bool = True):
    """Final-normed hidden states [B, T, C] in the compute dtype."""
    t = idx.shape[1]
    if t > self.cfg.block_size:
      raise ValueError(f"Cannot forward a sequence of length {t}: "
                       f"config.model.block_size is {self.cfg.block_size}.")
    x = self.wte(idx) + self.wpe.rows(0, t)[None]
    x = self.drop(x, deterministic=deterministic).astype(
        self.cfg.residual_dtype)
    x = mesh_lib.constrain(x, ACTIVATION)
    if self.cfg.norm_kernel != "xla":
      # Each residual add runs in the norm kernel after it (Block): the
      # first block adds zeros, ln_f adds the last block's MLP output.
      x = (x, jnp.zeros(x.shape, self.cfg.compute_dtype))
    if self.cfg.scan_layers:
      x, _ = self.h(x, deterministic)
    else:
      for block in self.h:
        x = block(x, deterministic)
    if self.cfg.norm_kernel != "xla":
      return self.ln_f(*x)[1]
    return self.ln_f(x)

  def logits_from_hidden(self, h, table=None):
    """The tied LM head: h [..., C] -> logits [..., vocab] in
    cfg.logits_dtype (float32 by default); `table`: `head_table()` made
    beforehand (the train step makes it once per iteration)."""
    return self.wte.attend(h, table)

  def head_table(self):
    """The LM head's [vocab, C] table in the compute dtype (the tied
    embedding), for losses that make the logits themselves."""
    return self.wte.table()

  def __call__(self, idx, *, deterministic: bool = True):
    return self.logits_from_hidden(
        self.hidden(idx, deterministic=deterministic))

  def decode_hidden(self, idx, cache, index):
    """`decode` without the LM head: (hidden [B, T, C], new cache)."""
    if self.cfg.scan_layers:
      # The unscanned model on the unstacked weights (see `generate`), as
      # a separate top-level model (parent=None), not a submodule.
      params = unstack_layers(nn.meta.unbox(self.variables["params"]),
                              self.cfg.n_layer)
      return GPT(_unscanned(self.cfg), parent=None).apply(
          {"params": params}, idx, cache, index, method=GPT.decode_hidden)
    t = idx.shape[1]
    index = jnp.asarray(index, jnp.int32)
    x = (self.wte(idx) + self.wpe.rows(index, t)[None]).astype(
        self.cfg.residual_dtype)
    x = mesh_lib.constrain(x, ACTIVATION)
    k_all, v_all = cache["k"], cache["v"]
    for i, block in enumerate(self.h):
      # Updates in place in the stacked [L, ...] cache (no re-stacking).
      x, k, v = block.decode(x, k_all[i], v_all[i], index)
      k_all = jax.lax.dynamic_update_index_in_dim(k_all, k, i, axis=0)
      v_all = jax.lax.dynamic_update_index_in_dim(v_all, v, i, axis=0)
    return self.ln_f(x), {"k": k_all, "v": v_all}

  def decode(self, idx, cache, index):
    """Incremental forward with a KV cache (no dropout).

    idx [B, T] are the tokens at absolute positions index..index+T-1
    (index: int32 scalar, may be traced; index + T must not exceed the
    cache length nor block_size, which are not checked on traced values).
    Each new token attends to every cached position <= its own. Returns
    (logits [B, T, vocab] in cfg.logits_dtype, the cache with their
    keys/values).
    """
    h, cache = self.decode_hidden(idx, cache, index)
    return self.logits_from_hidden(h), cache


def init_cache(cfg: GPTConfig, batch: int, length: int) -> dict:
  """Zero KV cache {"k", "v"}: [n_layer, batch, length, kv_heads, head_dim]."""
  if not 0 < length <= cfg.block_size:
    raise ValueError(f"KV cache length {length} must be in [1, "
                     f"config.model.block_size={cfg.block_size}].")
  shape = (cfg.n_layer, batch, length, cfg.kv_heads, cfg.head_dim)
  return {"k": jnp.zeros(shape, cfg.compute_dtype),
          "v": jnp.zeros(shape, cfg.compute_dtype)}


def abstract_params(cfg: GPTConfig):
  """Boxed (LogicallyPartitioned) ShapeDtypeStructs of the params; no alloc.
  The attention kernel holds no params, so this traces the dot path (which
  any device takes)."""
  plain = dataclasses.replace(cfg, attention="dot")
  idx = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  return jax.eval_shape(lambda t: GPT(plain).init(jax.random.key(0), t),
                        idx)["params"]


def num_params(params, non_embedding: bool = True) -> int:
  """nanoGPT's get_num_params: every parameter, less wpe if non_embedding.

  wte is counted once (it is also the LM head). Takes the params tree (boxed
  or not, arrays or ShapeDtypeStructs) or variables {"params": ...}.
  """
  params = nn.meta.unbox(params)
  if set(params) == {"params"}:
    params = params["params"]
  total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
  if non_embedding:
    total -= math.prod(params["wpe"]["embedding"].shape)
  return int(total)


# ------------------------------------------------------------- layer layouts


def stack_layers(params, n_layer: int):
  """The unscanned params (h_0 .. h_{n_layer-1}) in the scanned layout
  (cfg.scan_layers): one tree `h` whose leaves are the layers' leaves
  stacked on a new leading axis named 'layers'. Other entries are kept.
  Any tree and leaf kind `trm.nn.layer_stack` takes."""
  return layer_stack.stack(params, n_layer, stacked=SCANNED, prefix="h_",
                           axis_name=LAYERS_AXIS,
                           count_field="config.model.n_layer")


def unstack_layers(params, n_layer: int):
  """`stack_layers`'s inverse: the scanned params (`h`, leaves [n_layer,
  ...]) as h_0 .. h_{n_layer-1}; the same kinds of trees and leaves."""
  return layer_stack.unstack(params, n_layer, stacked=SCANNED, prefix="h_",
                             count_field="config.model.n_layer",
                             scan_field="config.model.scan_layers")


# One program for every layer's slices: called eagerly on weights sharded
# over a mesh, each slice would be a program of its own on every device
# (XLA:CPU takes 32 a device in flight; trm/core/dispatch.py).
_unstacked_layers = jax.jit(unstack_layers, static_argnums=1)


# ------------------------------------------------------------------ sampling


def _top_k_crop(scaled, top_k: int | None):
  """nanoGPT's crop: entries below the k-th largest of each row set to -inf
  (k = min(top_k, vocab); entries tied with the k-th are all kept)."""
  if top_k is None:
    return scaled
  k = min(int(top_k), scaled.shape[-1])
  kth = jax.lax.top_k(scaled, k)[0][..., -1:]
  return jnp.where(scaled < kth, -jnp.inf, scaled)


def sampling_probs(logits, temperature: float, top_k: int | None = None):
  """The distribution `generate` draws each token from (temperature > 0):
  softmax of the float32 logits [..., V] divided by `temperature`, after
  the top-k crop; the same pieces as the draw."""
  # Each row's largest logit moved to 0 first: a temperature past float32's
  # range made every positive logit +inf, and the first id was drawn.
  scaled = temperature_lib.shift_and_divide(logits.astype(jnp.float32),
                                            jnp.float32(temperature))
  return jax.nn.softmax(_top_k_crop(scaled, top_k), axis=-1)


def _sample(logits, key, temperature, top_k: int | None,
            vocab_limit: int | None = None):
  """One token per row from logits [B, V] (nanoGPT's recipe), in float32
  whatever config.model.logits_dtype made them; only ids below
  `vocab_limit` when given."""
  logits = logits.astype(jnp.float32)
  if vocab_limit is not None and vocab_limit < logits.shape[-1]:
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_limit, logits,
                       -jnp.inf)
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if isinstance(temperature, (int, float)) and temperature == 0:
    return greedy
  if isinstance(temperature, (int, float)):
    scaled = temperature_lib.shift_and_divide(logits,
                                              jnp.float32(temperature))
  else:  # traced: 0 still means greedy
    temperature = jnp.asarray(temperature, jnp.float32)
    scaled = temperature_lib.shift_and_divide(
        logits, jnp.where(temperature == 0, 1.0, temperature))
  sampled = jax.random.categorical(key, _top_k_crop(scaled, top_k),
                                   axis=-1).astype(jnp.int32)
  if isinstance(temperature, (int, float)):
    return sampled
  return jnp.where(temperature == 0, greedy, sampled)


def _generate(cfg: GPTConfig, params, prompt, rng, temperature,
              max_new_tokens: int, top_k: int | None,
              vocab_limit: int | None = None):
  model = GPT(cfg)
  variables = {"params": params}
  batch, t0 = prompt.shape
  bs = cfg.block_size
  total = t0 + max_new_tokens
  tokens = jnp.zeros((batch, total), jnp.int32)
  tokens = jax.lax.dynamic_update_slice_in_dim(
      tokens, prompt.astype(jnp.int32), 0, axis=1)
  if max_new_tokens == 0:
    return tokens

  def put(tokens, step, logits):
    token = _sample(logits, jax.random.fold_in(rng, step), temperature, top_k,
                    vocab_limit)
    return jax.lax.dynamic_update_slice_in_dim(tokens, token[:, None],
                                               t0 + step, axis=1)

  # Step s samples from a context of t0 + s tokens. While that fits in
  # block_size the cropped window starts at position 0, so cached keys and
  # values are exact: that holds for s <= bs - t0.
  n_cache = min(max_new_tokens, max(0, bs - t0 + 1))
  if n_cache:
    # Positions written: 0 .. t0 + n_cache - 2 (the last sampled token is
    # never fed back through the cache).
    cache = init_cache(cfg, batch, t0 + n_cache - 1)
    h, cache = model.apply(variables, prompt.astype(jnp.int32), cache, 0,
                           method=GPT.decode_hidden)
    logits = model.apply(variables, h[:, -1], method=GPT.logits_from_hidden)
    tokens = put(tokens, 0, logits)

    def cached_step(step, carry):
      tokens, cache = carry
      pos = t0 + step - 1
      last = jax.lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1)
      h, cache = model.apply(variables, last, cache, pos,
                             method=GPT.decode_hidden)
      logits = model.apply(variables, h[:, -1],
                           method=GPT.logits_from_hidden)
      return put(tokens, step, logits), cache

    tokens, _ = jax.lax.fori_loop(1, n_cache, cached_step, (tokens, cache))

  def window_step(step, tokens):
    # nanoGPT crops to the last block_size tokens and re-embeds them at
    # positions 0..bs-1, so the cache no longer applies: full forward.
    window = jax.lax.dynamic_slice_in_dim(tokens, t0 + step - bs, bs, axis=1)
    h = model.apply(variables, window, method=GPT.hidden)
    logits = model.apply(variables, h[:, -1], method=GPT.logits_from_hidden)
    return put(tokens, step, logits)

  if n_cache < max_new_tokens:
    tokens = jax.lax.fori_loop(n_cache, max_new_tokens, window_step, tokens)
  return tokens


_generate_static_temperature = jax.jit(
    _generate, static_argnames=("cfg", "temperature", "max_new_tokens",
                                "top_k", "vocab_limit"))


def generate(model: GPT, params, prompt, max_new_tokens: int, rng,
             temperature: float = 1.0, top_k: int | None = None,
             vocab_limit: int | None = None):
  """nanoGPT's GPT.generate: prompt [B, T0] -> [B, T0 + max_new_tokens].

  Each new token is drawn from the last-position logits of the context
  cropped to its last block_size tokens (re-embedded at positions 0..),
  divided by `temperature`, with logits below the k-th largest set to -inf
  when `top_k` is given (k = min(top_k, vocab)). temperature == 0 means
  greedy argmax (nanoGPT would divide by zero). Step s uses the key
  fold_in(rng, s).

  The KV cache is used while the context fits in block_size (one decode
  call for the prompt, then one per token); after that, and from the start
  for a prompt longer than block_size, each token costs a full forward over
  the last block_size tokens, which is what nanoGPT computes. Everything runs
  in compiled loops. max_new_tokens, top_k and the shapes are static; a
  Python-number temperature is static too, and a traced one is accepted
  when called under an outer jit. A scanned model (cfg.scan_layers) samples
  the same tokens as the unscanned one with the same weights.

  `vocab_limit` (static) draws only ids below it: the tokenizer's, when the
  model's vocabulary is padded past it (nanoGPT's 50304 over GPT-2's 50257),
  whose extra ids were never a target and cannot be decoded.
  """
  prompt = jnp.asarray(prompt)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt must be [batch, T0] with T0 >= 1; got shape "
                     f"{prompt.shape}.")
  if max_new_tokens < 0:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0.")
  if top_k is not None and top_k < 1:
    raise ValueError(f"top_k={top_k} must be >= 1 (or None).")
  if vocab_limit is not None and vocab_limit < 1:
    raise ValueError(f"vocab_limit={vocab_limit} must be >= 1 (or None).")
  params = nn.meta.unbox(params)
  if set(params) == {"params"}:
    params = params["params"]
  cfg = model.cfg
  if cfg.scan_layers:
    # A scanned model samples with the unscanned one on its unstacked
    # weights (one copy of the blocks for the sampling program): the same
    # decode path and numbers for both layouts, each token's cache update
    # stays in place in the [n_layer, ...] cache (a scanned decode would
    # write the cache out as the scan's stacked output), and sampling has
    # no backward pass whose memory scanning would save.
    params = _unstacked_layers(params, cfg.n_layer)
    cfg = _unscanned(cfg)
  try:  # a concrete number (Python, numpy or jax) becomes static
    temperature = float(temperature)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return _generate(cfg, params, prompt, rng, temperature,
                     int(max_new_tokens), top_k, vocab_limit)
  # NaN passes `< 0` and makes every logit NaN: each draw is then token 0.
  if not (math.isfinite(temperature) and temperature >= 0):
    raise ValueError(f"temperature={temperature} must be a finite number "
                     ">= 0.")
  return _generate_static_temperature(
      cfg, params, prompt, rng, temperature=temperature,
      max_new_tokens=int(max_new_tokens), top_k=top_k,
      vocab_limit=vocab_limit)
