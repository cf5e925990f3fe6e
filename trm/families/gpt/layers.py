"""nanoGPT's layers: LayerNorm, Linear, the tied embedding, causal
self-attention, the GELU MLP and the pre-LN block (see model.py for the
numerics)."""
from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from trm.core import mesh as mesh_lib
from trm.families.gpt.config import GPTConfig
from trm.families.gpt.kernels import gelu
from trm.families.gpt.kernels import layer_norm
from trm.families.gpt import norm_gpu
from trm.nn import attention
from trm.nn import linear
from trm.nn import lookup
from trm.nn import masks
from trm.nn import remat
from trm.nn import tpu_attention
from trm.nn.linear import matmul

_INIT_STD = 0.02
ACTIVATION = ("activation_batch", "activation_length", "activation_embed")
_HEADS = ("activation_batch", "activation_length", "activation_heads", None)
_param = linear.logical_param  # short: many calls below


class LayerNorm(nn.Module):
  """nanoGPT's LayerNorm: eps 1e-5, optional bias, in float32."""
  cfg: GPTConfig

  @nn.compact
  def __call__(self, x, delta=None):
    """LayerNorm(x) in the compute dtype; given `delta`, the residual add
    before it too: (x + delta, LayerNorm(x + delta)), in one Pallas kernel
    (cfg.norm_kernel)."""
    cfg = self.cfg
    c = x.shape[-1]
    scale = _param(self, "scale", nn.initializers.ones, ("embed",), (c,),
                   cfg.weight_dtype)
    # Without a bias parameter: a zero bias whose gradient is dropped.
    bias = (_param(self, "bias", nn.initializers.zeros, ("embed",), (c,),
                   cfg.weight_dtype) if cfg.bias
            else jnp.zeros((c,), jnp.float32))
    if delta is not None:
      return norm_gpu.add_layer_norm(
          x, delta, scale, bias, jnp.dtype(cfg.compute_dtype),
          cfg.norm_kernel == "triton_interpret")
    return layer_norm(x, scale, bias).astype(cfg.compute_dtype)


def _project(x, kernel, bias, dtype):
  """x @ kernel (+ bias) in `dtype`; operands already in `dtype`. Named
  for remat_policy='minimal', which saves it: the matmul is a custom_vjp,
  which jax's dot-saving policies do not look inside."""
  if bias is None:
    y = linear.matmul_to(x, kernel, dtype)
  else:
    # Bias added before the single rounding to `dtype`, as torch's addmm.
    y = linear.add_bias(matmul(x, kernel), bias, dtype)
  return checkpoint_name(y, remat.WEIGHT_MATMUL)


class Linear(nn.Module):
  """y = x W (+ b), W [in, out] ~ N(0, std), b zero; output in `dtype`."""
  features: int
  axes: tuple[str, str]
  std: float
  cfg: GPTConfig

  @nn.compact
  def __call__(self, x, blocks: int | tuple[int, ...] = 1, columns=None):
    """y, or with blocks > 1 the list of y's equal column blocks (or of
    blocks of the widths a tuple gives), each from its own matmul against
    that block of the kernel (and bias). `columns`, a function of an array
    whose last axis is the kernel's columns, reorders them first: y comes
    out in that order, and the kernel keeps its sharding."""
    cfg = self.cfg
    dtype = cfg.compute_dtype
    kernel = _param(self, "kernel", nn.initializers.normal(self.std),
                    self.axes, (x.shape[-1], self.features), cfg.weight_dtype)
    bias = (_param(self, "bias", nn.initializers.zeros, (self.axes[1],),
                   (self.features,), cfg.weight_dtype) if cfg.bias else None)
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    if columns is not None:
      kernel = mesh_lib.constrain(columns(kernel), self.axes)
      bias = None if bias is None else columns(bias)
    if blocks == 1:
      return _project(x, kernel, bias, dtype)
    widths = (list(blocks) if isinstance(blocks, tuple)
              else [self.features // blocks] * blocks)
    return [_project(x_i, kernel[:, c], None if bias is None else bias[c],
                     dtype)
            for x_i, c in linear.column_blocks(x, widths)]


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
    # Gathers the model-width shards (FSDP) before use where
    # lookup.take_rows does not apply: a lookup in a table split along its
    # width makes XLA's SPMD partitioner fall back to replicating the
    # result ("involuntary full rematerialization").
    return mesh_lib.constrain(self.embedding, (self.axes[0], None))

  def __call__(self, ids):
    # On a mesh, each device looks up its own columns (lookup.take_rows:
    # no whole float32 table gathered, summed or kept for the gradient).
    x = lookup.take_rows(self.embedding, ids, self.axes)
    if x is None:
      x = jnp.take(self._gatherable(), ids, axis=0)
    return x.astype(jnp.float32)

  def rows(self, start, length: int):
    """Rows start..start+length-1 (start may be traced; clamped in range)."""
    return jax.lax.dynamic_slice_in_dim(self._gatherable(), start, length,
                                        axis=0).astype(jnp.float32)

  def attend(self, x, table=None):
    """x [..., C] -> x @ table.T [..., num] in `cfg.logits_dtype` (float32:
    the matmul's accumulator; matmul in dtype). `table`: `table()` made
    beforehand, else made here.

    `matmul`'s backward rounds the logits' gradient to `dtype` before its
    two matmuls, as torch autocast's bf16 LM head gets it; autodiff of
    jnp.dot would run both as float32 x float32 (on an H100, TF32 at half
    the bf16 rate, over [B*T, vocab] operands)."""
    return tied_logits(x, self.table() if table is None else table, self.cfg)

  def table(self):
    """The whole [num, C] table in the compute dtype (`attend`'s), gathered
    as `cfg.head_gather` says (the same values either way)."""
    return gather_table(self.embedding, self.cfg, self.axes)


# The token embedding's (and tied LM head's) logical axes.
TABLE_AXES = ("vocab", "embed")


def gather_table(embedding, cfg: GPTConfig, axes=TABLE_AXES):
  """An embedding table as its parameter holds it -> the whole [num, C]
  table in the compute dtype, gathered over C as `cfg.head_gather` says:
  in the parameter's dtype, or cast where it lies first."""
  dtype = cfg.compute_dtype
  if cfg.head_gather == "param":
    return mesh_lib.constrain(embedding, (axes[0], None)).astype(dtype)
  # Pinned to the parameter's sharding first: otherwise sharding
  # propagation moves the cast after the gather again.
  shard = mesh_lib.constrain(embedding.astype(dtype), axes)
  return mesh_lib.constrain(shard, (axes[0], None))


def tied_logits(x, table, cfg: GPTConfig):
  """`Embed.attend` with its table given: x [..., C] @ table.T in
  cfg.logits_dtype, the matmul in the compute dtype."""
  return linear.matmul_to(x.astype(cfg.compute_dtype), table.T,
                          cfg.logits_dtype)


def _proj_std(cfg: GPTConfig) -> float:
  """GPT-2's scaled init of the residual projections (both c_proj)."""
  return _INIT_STD / math.sqrt(2 * cfg.n_layer)


def _attend(q, k, v, mask, dropout, deterministic: bool):
  """softmax(q k^T / sqrt(d)) v with float32 scores and softmax.

  q [B, T, H, D], k/v [B, S, KV, D] (KV divides H: each k, v head repeated
  for its H // KV query heads), mask broadcastable to [B, H, T, S]
  (True = attend). Dropout (when active) hits the probabilities, as torch's
  scaled_dot_product_attention(dropout_p=...). Without it this is what
  jax.nn.dot_product_attention computes on XLA, written out because that
  function asks for dot precisions (F16_F16_F32) that CPUs reject.
  """
  groups = q.shape[2] // k.shape[2]
  if groups > 1:
    k, v = attention.repeat_kv(k, groups), attention.repeat_kv(v, groups)
  return attention.dot_product_attention(
      q, k, v, mask,
      dropout=lambda p: dropout(p, deterministic=deterministic))


def grouped_qkv(cfg: GPTConfig) -> bool:
  """Does c_attn run with its columns per key/value head
  (`qkv_projection`)? 'auto' picks it, tracing under a mesh, where the
  rules split c_attn's columns ('heads') over mesh axes whose product
  divides the key/value heads: tensor parallelism. Elsewhere the reorder
  would be a copy of the kernel for nothing."""
  if cfg.qkv_projection != "auto" or cfg.separate_qkv:
    return cfg.qkv_projection == "grouped"
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return False
  ways = mesh_lib.logical_split(mesh, None, "heads")[1]
  return ways > 1 and cfg.kv_heads % ways == 0


def _per_kv_head(w, *, n_head: int, kv_heads: int, head_dim: int):
  """c_attn's columns [q | k | v] (last axis of w) reordered per key/value
  head: [q heads of kv head 0, k 0, v 0, q heads of kv head 1, ...]; query
  head n serves kv head n // (n_head // kv_heads), as `repeat_kv` has it."""
  lead, d = w.shape[:-1], head_dim
  q = w[..., :n_head * d].reshape(*lead, kv_heads, n_head // kv_heads, d)
  k = w[..., n_head * d:(n_head + kv_heads) * d].reshape(*lead, kv_heads, 1,
                                                          d)
  v = w[..., (n_head + kv_heads) * d:].reshape(*lead, kv_heads, 1, d)
  return jnp.concatenate([q, k, v], axis=-2).reshape(*lead, w.shape[-1])


class CausalSelfAttention(nn.Module):
  """Fused c_attn -> q | k | v, causal attention, c_proj, resid dropout."""
  cfg: GPTConfig

  def setup(self):
    cfg = self.cfg
    self.c_attn = Linear(cfg.attention_width + 2 * cfg.kv_width,
                         ("embed", "heads"), _INIT_STD, cfg)
    self.c_proj = Linear(cfg.n_embd, ("heads", "embed"), _proj_std(cfg), cfg)
    self.attn_dropout = nn.Dropout(cfg.dropout)
    self.resid_dropout = nn.Dropout(cfg.dropout)

  def _qkv(self, x):
    cfg = self.cfg
    b, t, _ = x.shape
    # nanoGPT: c_attn(x).split(n_embd, dim=2), then .view(B, T, nh, hs);
    # with n_kv_head, k and v are narrower than q.
    widths = (cfg.attention_width, cfg.kv_width, cfg.kv_width)
    if cfg.separate_qkv:
      q, k, v = self.c_attn(x, blocks=widths)
    elif grouped_qkv(cfg):
      # One matmul whose columns come per key/value head (its query heads,
      # its key, its value), so a split of them over `model` falls on head
      # boundaries: each device's product holds whole heads of q, k and v
      # and none moves. Only the kernel (and its gradient) is reordered,
      # a weight's bytes per layer and pass; nanoGPT's column order splits
      # the product across q, k and v and reshards that, activations' bytes
      # (BUILD_NOTES "Session 98").
      group = cfg.n_head // cfg.kv_heads
      y = self.c_attn(x, columns=functools.partial(
          _per_kv_head, n_head=cfg.n_head, kv_heads=cfg.kv_heads,
          head_dim=cfg.head_dim)).reshape(b, t, cfg.kv_heads, group + 2,
                                          cfg.head_dim)
      y = mesh_lib.constrain(y, _HEADS + (None,))
      q = y[:, :, :, :group].reshape(b, t, cfg.attention_width)
      k = y[:, :, :, group].reshape(b, t, cfg.kv_width)
      v = y[:, :, :, group + 1].reshape(b, t, cfg.kv_width)
    else:
      q, k, v = jnp.split(self.c_attn(x), (widths[0], widths[0] + widths[1]),
                          axis=-1)
    q, k, v = (checkpoint_name(a.reshape(b, t, heads, cfg.head_dim), name)
               for a, heads, name in zip((q, k, v), (cfg.n_head, cfg.kv_heads,
                                                     cfg.kv_heads),
                                         remat.QKV_NAMES))
    return mesh_lib.constrain(q, _HEADS), k, v

  def _out(self, y, deterministic: bool):
    b, t = y.shape[:2]
    y = checkpoint_name(self.c_proj(y.reshape(b, t, self.cfg.attention_width)),
                        remat.OUT_PROJ)
    return self.resid_dropout(y, deterministic=deterministic)

  def __call__(self, x, deterministic: bool = True):
    q, k, v = self._qkv(x)
    t = x.shape[1]
    if self.cfg.attention == "cudnn":
      # cuDNN's flash attention (GPU only: refused elsewhere, naming the
      # field); no dropout on the probabilities, which the config refuses.
      # Init's one-token call takes the dot path.
      attention.check_cudnn()
      y = (attention.cudnn_attention(q, k, v, causal=True) if t > 1 else
           _attend(q, k, v, masks.causal(t, t), self.attn_dropout,
                   deterministic))
    elif self.cfg.attention != "dot" and t % 128 == 0:
      # The Pallas kernel keeps the [T, T] scores in VMEM (no dropout on
      # them, which the config refuses); its softmax runs in float32. Its
      # tiles need T % 128 == 0: training windows are block_size (checked
      # by the config); shorter calls (init's one token) take the dot path.
      y = tpu_attention.splash_attention(
          q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype), k, v, None,
          interpret=self.cfg.attention == "splash_interpret", causal=True,
          block=self.cfg.splash_block)
    else:
      y = _attend(q, k, v, masks.causal(t, t), self.attn_dropout,
                  deterministic)
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
    y = _attend(q, k_cache.astype(q.dtype), v_cache.astype(q.dtype),
                masks.causal(t, s, index), self.attn_dropout, True)
    return self._out(y, True), k_cache, v_cache


class MLP(nn.Module):
  """c_fc (C -> 4C, or mlp_size), exact GELU, c_proj (back to C), dropout."""
  cfg: GPTConfig

  @nn.compact
  def __call__(self, x, deterministic: bool = True):
    cfg = self.cfg
    h = checkpoint_name(Linear(cfg.mlp_width, ("embed", "mlp"), _INIT_STD,
                               cfg, name="c_fc")(x), remat.MLP_IN)
    h = gelu(h)
    h = checkpoint_name(Linear(cfg.n_embd, ("mlp", "embed"), _proj_std(cfg),
                               cfg, name="c_proj")(h), remat.MLP_OUT)
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
    # What a remat'd block needs to recompute itself: a 'custom' policy
    # may keep it in HBM or on the host under this name.
    x = jax.tree.map(lambda a: checkpoint_name(a, remat.LAYER_INPUT), x)
    if self.cfg.norm_kernel != "xla":
      return self._fused_adds(x, deterministic)
    x = x + self.attn(self.ln_1(x), deterministic)
    x = x + self.mlp(self.ln_2(x), deterministic)
    return mesh_lib.constrain(x, ACTIVATION)

  def _fused_adds(self, carry, deterministic):
    """cfg.norm_kernel: carry = (x, the last block's MLP output, not yet
    added); each add runs in the kernel of the norm that reads its sum, and
    this block's last add is handed on likewise (to the next block's ln_1,
    or ln_f)."""
    x, pending = carry
    x, h = self.ln_1(x, pending)
    x, h = self.ln_2(mesh_lib.constrain(x, ACTIVATION),
                     self.attn(h, deterministic))
    x = mesh_lib.constrain(x, ACTIVATION)
    return x, mesh_lib.constrain(self.mlp(h, deterministic), ACTIVATION)

  def decode(self, x, k_cache, v_cache, index):
    y, k_cache, v_cache = self.attn.decode(self.ln_1(x), k_cache, v_cache,
                                           index)
    x = x + y
    x = x + self.mlp(self.ln_2(x), True)
    return mesh_lib.constrain(x, ACTIVATION), k_cache, v_cache
