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

The layers are not scanned: every 2-D parameter is a weight matrix, so the
optimizer's `ndim >= 2` weight-decay mask gives nanoGPT's decay groups.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trm.core import mesh as mesh_lib

_DTYPES = ("float32", "bfloat16", "float16")
_INIT_STD = 0.02
_LN_EPS = 1e-5
_SQRT_HALF = 1.0 / math.sqrt(2.0)
ACTIVATION = ("activation_batch", "activation_length", "activation_embed")
_HEADS = ("activation_batch", "activation_length", "activation_heads", None)


@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """nanoGPT's GPTConfig (same defaults) plus numerics."""
  block_size: int = 1024
  vocab_size: int = 50304   # GPT-2's 50257 padded up to a multiple of 64
  n_layer: int = 12
  n_head: int = 12
  n_embd: int = 768
  dropout: float = 0.0
  bias: bool = True         # Linear and LayerNorm biases, as GPT-2
  dtype: str = "float32"        # compute dtype: float32 | bfloat16 | float16
  param_dtype: str = "float32"  # stored parameters
  remat: bool = False           # jax.checkpoint each block (memory for compute)

  def __post_init__(self):
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
          or value <= 0):
        raise ValueError(f"config.model.{name}={value!r} must be a positive "
                         "integer.")
    if self.n_embd % self.n_head:
      raise ValueError(
          f"config.model.n_embd={self.n_embd} must be divisible by "
          f"config.model.n_head={self.n_head} (head size n_embd // n_head).")
    if not 0.0 <= float(self.dropout) < 1.0:
      raise ValueError(f"config.model.dropout={self.dropout!r} must be in "
                       "[0, 1).")
    for name in ("bias", "remat"):
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ValueError(f"config.model.{name}={getattr(self, name)!r} must "
                         "be a bool.")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"config.model.{name}={getattr(self, name)!r} must "
                         f"be one of {_DTYPES}.")

  @property
  def head_dim(self) -> int:
    return self.n_embd // self.n_head

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self):
    return jnp.dtype(self.param_dtype)

  @classmethod
  def from_config(cls, model_config: Mapping[str, Any]) -> "GPTConfig":
    """From `config.model` (a ConfigDict with `name='gpt'`)."""
    kwargs = dict(model_config)
    name = kwargs.pop("name", "gpt")
    if name != "gpt":
      raise ValueError(f"config.model.name={name!r} is not 'gpt'.")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
      raise ValueError(
          f"{', '.join('config.model.' + k for k in unknown)}: not known to "
          f"model 'gpt'; known fields: {', '.join(known)}.")
    return cls(**kwargs)


def _param(module, name, init, axes, shape, dtype):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape,
                      dtype)


@jax.custom_vjp
def layer_norm(x, scale, bias):
  """(x - mean) / sqrt(var + 1e-5) * scale + bias over the last axis, in
  float32 (x in any dtype; returns float32).

  The backward pass is written out, keeping only x and each row's mean and
  1/std from the forward pass: autodiff keeps x - mean and the normalised x
  as well, two more activations written and read per LayerNorm. At
  nanoGPT's small sizes on CPU such elementwise passes cost as much as the
  matmuls.
  """
  return _layer_norm_fwd(x, scale, bias)[0]


def _layer_norm_stats(x32):
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  return mean, jax.lax.rsqrt(var + _LN_EPS)


def _layer_norm_fwd(x, scale, bias):
  x32 = x.astype(jnp.float32)
  mean, inv_std = _layer_norm_stats(x32)
  y = (x32 - mean) * inv_std * scale.astype(jnp.float32)
  y = y + bias.astype(jnp.float32)
  return y, (x, mean, inv_std, scale, bias)


def _layer_norm_bwd(residuals, dy):
  x, mean, inv_std, scale, bias = residuals
  rows = tuple(range(x.ndim - 1))
  x_hat = (x.astype(jnp.float32) - mean) * inv_std
  d_scale = jnp.sum(dy * x_hat, axis=rows)
  d_bias = jnp.sum(dy, axis=rows)
  d_xhat = dy * scale.astype(jnp.float32)
  dx = inv_std * (d_xhat - jnp.mean(d_xhat, axis=-1, keepdims=True)
                  - x_hat * jnp.mean(d_xhat * x_hat, axis=-1, keepdims=True))
  return (dx.astype(x.dtype), d_scale.astype(scale.dtype),
          d_bias.astype(bias.dtype))


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nn.Module):
  """nanoGPT's LayerNorm: eps 1e-5, optional bias, in float32."""
  cfg: GPTConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    c = x.shape[-1]
    scale = _param(self, "scale", nn.initializers.ones, ("embed",), (c,),
                   cfg.weight_dtype)
    if cfg.bias:
      bias = _param(self, "bias", nn.initializers.zeros, ("embed",), (c,),
                    cfg.weight_dtype)
      return layer_norm(x, scale, bias).astype(cfg.compute_dtype)
    # Without a bias parameter: a zero bias whose gradient is dropped.
    return layer_norm(x, scale, jnp.zeros((c,), jnp.float32)).astype(
        cfg.compute_dtype)


@jax.custom_vjp
def matmul(x, w):
  """x [..., K] @ w [K, N] accumulated in float32 (x, w in one dtype).

  The same product and gradients as jnp.dot; the backward pass is written
  out so that the weight gradient is dy^T x followed by a transpose of the
  small [N, K] result. Left to autodiff, XLA's CPU backend lays the weight
  gradient out as x^T dy with dy physically transposed, and fuses that
  transpose with everything that produces dy: for the residual projections
  dy is the residual-stream gradient, a chain of adds through every later
  block, so each transpose recomputed the whole chain in a cache-hostile
  order (about a quarter of a shakespeare_char_cpu step). On TPU and GPU
  both forms compile to the same dots.
  """
  return jnp.dot(x, w, preferred_element_type=jnp.float32)


def _matmul_fwd(x, w):
  return matmul(x, w), (x, w)


def _matmul_bwd(residuals, dy):
  x, w = residuals
  # dy arrives in float32; callers round the product to x.dtype, so this
  # cast is exact. Like autodiff of jnp.dot, the gradients come out of the
  # dots in the operands' dtype.
  dy = dy.astype(x.dtype)
  dx = jnp.dot(dy, w.T)
  dw_t = jnp.dot(dy.reshape(-1, dy.shape[-1]).T, x.reshape(-1, x.shape[-1]))
  return dx, dw_t.T.astype(w.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


class Linear(nn.Module):
  """y = x W (+ b), W [in, out] ~ N(0, std), b zero; output in `dtype`."""
  features: int
  axes: tuple[str, str]
  std: float
  cfg: GPTConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    dtype = cfg.compute_dtype
    kernel = _param(self, "kernel", nn.initializers.normal(self.std),
                    self.axes, (x.shape[-1], self.features), cfg.weight_dtype)
    if not cfg.bias:
      return matmul(x.astype(dtype), kernel.astype(dtype)).astype(dtype)
    bias = _param(self, "bias", nn.initializers.zeros, (self.axes[1],),
                  (self.features,), cfg.weight_dtype)
    # Bias added before the single rounding to `dtype`, as torch's addmm.
    y = matmul(x.astype(dtype), kernel.astype(dtype))
    return (y + bias.astype(dtype).astype(jnp.float32)).astype(dtype)


class Embed(nn.Module):
  """Embedding table [num, C] ~ N(0, 0.02); `attend` is the tied LM head."""
  num_embeddings: int
  axes: tuple[str | None, str]
  cfg: GPTConfig

  def setup(self):
    self.embedding = _param(self, "embedding",
                            nn.initializers.normal(_INIT_STD), self.axes,
                            (self.num_embeddings, self.cfg.n_embd),
                            self.cfg.weight_dtype)

  def _gatherable(self):
    # Gathers the model-width shards (FSDP) before use: a lookup in a table
    # split along its width makes XLA's SPMD partitioner fall back to
    # replicating the result ("involuntary full rematerialization").
    return mesh_lib.constrain(self.embedding, (self.axes[0], None))

  def __call__(self, ids):
    return jnp.take(self._gatherable(), ids, axis=0).astype(jnp.float32)

  def rows(self, start, length: int):
    """Rows start..start+length-1 (start may be traced; clamped in range)."""
    return jax.lax.dynamic_slice_in_dim(self._gatherable(), start, length,
                                        axis=0).astype(jnp.float32)

  def attend(self, x):
    """x [..., C] -> x @ table.T [..., num] in float32 (matmul in dtype)."""
    dtype = self.cfg.compute_dtype
    return jnp.dot(x.astype(dtype), self._gatherable().astype(dtype).T,
                   preferred_element_type=jnp.float32)


@jax.custom_vjp
def gelu(x):
  """Exact GELU, x * Phi(x), as torch's nn.GELU(): 0.5 x (1 + erf(x / sqrt 2)),
  evaluated in float32 and returned in x's dtype.

  jax.nn.gelu(approximate=False) goes through erfc, whose two-branch
  expansion made the backward pass on CPU twice as slow. The backward pass
  is written out from x alone (the derivative is Phi(x) + x phi(x)); on
  CPU, shakespeare_char_cpu steps take about 1 ms (3%) less than with
  autodiff's version of the same formula.
  """
  x32 = x.astype(jnp.float32)
  return (0.5 * x32 * (1.0 + jax.lax.erf(x32 * _SQRT_HALF))).astype(x.dtype)


def _gelu_fwd(x):
  return gelu(x), x


def _gelu_bwd(x, dy):
  x32 = x.astype(jnp.float32)
  cdf = 0.5 * (1.0 + jax.lax.erf(x32 * _SQRT_HALF))
  pdf = jnp.exp(-0.5 * jnp.square(x32)) * (1.0 / math.sqrt(2.0 * math.pi))
  return ((dy.astype(jnp.float32) * (cdf + x32 * pdf)).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def _proj_std(cfg: GPTConfig) -> float:
  """GPT-2's scaled init of the residual projections (both c_proj)."""
  return _INIT_STD / math.sqrt(2 * cfg.n_layer)


def _attend(q, k, v, mask, dropout, deterministic: bool):
  """softmax(q k^T / sqrt(d)) v with float32 scores and softmax.

  q [B, T, H, D], k/v [B, S, H, D], mask broadcastable to [B, H, T, S]
  (True = attend). Dropout (when active) hits the probabilities, as torch's
  scaled_dot_product_attention(dropout_p=...). Without it this is what
  jax.nn.dot_product_attention computes on XLA, written out because that
  function asks for dot precisions (F16_F16_F32) that CPUs reject.
  """
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  scores = scores * jnp.float32(1.0 / math.sqrt(q.shape[-1]))
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1)
  probs = dropout(probs, deterministic=deterministic)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v)


class CausalSelfAttention(nn.Module):
  """Fused c_attn -> q | k | v, causal attention, c_proj, resid dropout."""
  cfg: GPTConfig

  def setup(self):
    cfg = self.cfg
    self.c_attn = Linear(3 * cfg.n_embd, ("embed", "heads"), _INIT_STD, cfg)
    self.c_proj = Linear(cfg.n_embd, ("heads", "embed"), _proj_std(cfg), cfg)
    self.attn_dropout = nn.Dropout(cfg.dropout)
    self.resid_dropout = nn.Dropout(cfg.dropout)

  def _qkv(self, x):
    cfg = self.cfg
    b, t, _ = x.shape
    # nanoGPT: c_attn(x).split(n_embd, dim=2), then .view(B, T, nh, hs).
    q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
    q, k, v = (a.reshape(b, t, cfg.n_head, cfg.head_dim) for a in (q, k, v))
    return mesh_lib.constrain(q, _HEADS), k, v

  def _out(self, y, deterministic: bool):
    b, t = y.shape[:2]
    y = self.c_proj(y.reshape(b, t, self.cfg.n_embd))
    return self.resid_dropout(y, deterministic=deterministic)

  def __call__(self, x, deterministic: bool = True):
    q, k, v = self._qkv(x)
    t = x.shape[1]
    causal = jnp.tril(jnp.ones((t, t), bool))
    y = _attend(q, k, v, causal, self.attn_dropout, deterministic)
    return self._out(y, deterministic)

  def decode(self, x, k_cache, v_cache, index):
    """New tokens at positions index.. attend to the cache; returns the
    output and the updated caches [B, S, H, D]."""
    q, k, v = self._qkv(x)
    t, s = x.shape[1], k_cache.shape[1]
    k_cache = jax.lax.dynamic_update_slice_in_dim(
        k_cache, k.astype(k_cache.dtype), index, axis=1)
    v_cache = jax.lax.dynamic_update_slice_in_dim(
        v_cache, v.astype(v_cache.dtype), index, axis=1)
    q_pos = index + jnp.arange(t, dtype=jnp.int32)
    mask = jnp.arange(s, dtype=jnp.int32)[None, :] <= q_pos[:, None]
    y = _attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype), mask,
                self.attn_dropout, True)
    return self._out(y, True), k_cache, v_cache


class MLP(nn.Module):
  """c_fc (C -> 4C), exact GELU, c_proj (4C -> C), dropout."""
  cfg: GPTConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.cfg
    h = Linear(4 * cfg.n_embd, ("embed", "mlp"), _INIT_STD, cfg,
               name="c_fc")(x)
    h = gelu(h)
    h = Linear(cfg.n_embd, ("mlp", "embed"), _proj_std(cfg), cfg,
               name="c_proj")(h)
    return nn.Dropout(cfg.dropout)(h, deterministic=deterministic)


class Block(nn.Module):
  """Pre-LN block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""
  cfg: GPTConfig

  def setup(self):
    self.ln_1 = LayerNorm(self.cfg)
    self.attn = CausalSelfAttention(self.cfg)
    self.ln_2 = LayerNorm(self.cfg)
    self.mlp = MLP(self.cfg)

  def __call__(self, x, deterministic: bool = True):
    x = x + self.attn(self.ln_1(x), deterministic)
    x = x + self.mlp(self.ln_2(x), deterministic)
    return mesh_lib.constrain(x, ACTIVATION)

  def decode(self, x, k_cache, v_cache, index):
    y, k_cache, v_cache = self.attn.decode(self.ln_1(x), k_cache, v_cache,
                                           index)
    x = x + y
    x = x + self.mlp(self.ln_2(x), True)
    return mesh_lib.constrain(x, ACTIVATION), k_cache, v_cache


class GPT(nn.Module):
  """nanoGPT's GPT: tokens [B, T] -> logits [B, T, vocab] (float32)."""
  cfg: GPTConfig

  def setup(self):
    cfg = self.cfg
    self.wte = Embed(cfg.vocab_size, ("vocab", "embed"), cfg)
    self.wpe = Embed(cfg.block_size, (None, "embed"), cfg)
    self.drop = nn.Dropout(cfg.dropout)
    # deterministic (argument 2, counting self) is a Python bool.
    block = nn.remat(Block, static_argnums=(2,)) if cfg.remat else Block
    self.h = [block(cfg) for _ in range(cfg.n_layer)]  # h_0 .. h_{L-1}
    self.ln_f = LayerNorm(cfg)

  def hidden(self, idx, *, deterministic: bool = True):
    """Final-normed hidden states [B, T, C] in the compute dtype."""
    t = idx.shape[1]
    if t > self.cfg.block_size:
      raise ValueError(f"Cannot forward a sequence of length {t}: "
                       f"config.model.block_size is {self.cfg.block_size}.")
    x = self.wte(idx) + self.wpe.rows(0, t)[None]
    x = self.drop(x, deterministic=deterministic)
    x = mesh_lib.constrain(x, ACTIVATION)
    for block in self.h:
      x = block(x, deterministic)
    return self.ln_f(x)

  def logits_from_hidden(self, h):
    """The tied LM head: h [..., C] -> float32 logits [..., vocab]."""
    return self.wte.attend(h)

  def __call__(self, idx, *, deterministic: bool = True):
    return self.logits_from_hidden(
        self.hidden(idx, deterministic=deterministic))

  def decode_hidden(self, idx, cache, index):
    """`decode` without the LM head: (hidden [B, T, C], new cache)."""
    t = idx.shape[1]
    index = jnp.asarray(index, jnp.int32)
    x = self.wte(idx) + self.wpe.rows(index, t)[None]
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
    (logits [B, T, vocab] float32, the cache with their keys/values).
    """
    h, cache = self.decode_hidden(idx, cache, index)
    return self.logits_from_hidden(h), cache


def init_cache(cfg: GPTConfig, batch: int, length: int) -> dict:
  """Zero KV cache {"k", "v"}: [n_layer, batch, length, n_head, head_dim]."""
  if not 0 < length <= cfg.block_size:
    raise ValueError(f"KV cache length {length} must be in [1, "
                     f"config.model.block_size={cfg.block_size}].")
  shape = (cfg.n_layer, batch, length, cfg.n_head, cfg.head_dim)
  return {"k": jnp.zeros(shape, cfg.compute_dtype),
          "v": jnp.zeros(shape, cfg.compute_dtype)}


def abstract_params(cfg: GPTConfig):
  """Boxed (LogicallyPartitioned) ShapeDtypeStructs of the params; no alloc."""
  idx = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  return jax.eval_shape(lambda t: GPT(cfg).init(jax.random.key(0), t),
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


# ------------------------------------------------------------------ sampling


def _sample(logits, key, temperature, top_k: int | None):
  """One token per row from float32 logits [B, V] (nanoGPT's recipe)."""
  greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  if isinstance(temperature, (int, float)) and temperature == 0:
    return greedy
  if isinstance(temperature, (int, float)):
    scaled = logits / jnp.float32(temperature)
  else:  # traced: 0 still means greedy
    temperature = jnp.asarray(temperature, jnp.float32)
    scaled = logits / jnp.where(temperature == 0, 1.0, temperature)
  if top_k is not None:
    k = min(int(top_k), logits.shape[-1])
    kth = jax.lax.top_k(scaled, k)[0][:, -1:]
    scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
  sampled = jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)
  if isinstance(temperature, (int, float)):
    return sampled
  return jnp.where(temperature == 0, greedy, sampled)


def _generate(cfg: GPTConfig, params, prompt, rng, temperature,
              max_new_tokens: int, top_k: int | None):
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
    token = _sample(logits, jax.random.fold_in(rng, step), temperature, top_k)
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
                                "top_k"))


def generate(model: GPT, params, prompt, max_new_tokens: int, rng,
             temperature: float = 1.0, top_k: int | None = None):
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
  when called under an outer jit.
  """
  prompt = jnp.asarray(prompt)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f"prompt must be [batch, T0] with T0 >= 1; got shape "
                     f"{prompt.shape}.")
  if max_new_tokens < 0:
    raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0.")
  if top_k is not None and top_k < 1:
    raise ValueError(f"top_k={top_k} must be >= 1 (or None).")
  params = nn.meta.unbox(params)
  if set(params) == {"params"}:
    params = params["params"]
  try:  # a concrete number (Python, numpy or jax) becomes static
    temperature = float(temperature)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return _generate(model.cfg, params, prompt, rng, temperature,
                     int(max_new_tokens), top_k)
  if temperature < 0:
    raise ValueError(f"temperature={temperature} must be >= 0.")
  return _generate_static_temperature(
      model.cfg, params, prompt, rng, temperature=temperature,
      max_new_tokens=int(max_new_tokens), top_k=top_k)
