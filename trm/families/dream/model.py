"""Dream-7B / DiffuCoder-7B: a Qwen2-shaped bidirectional transformer.

A faithful port of the HF remote code (`modeling_dream.py`): pre-norm Qwen2
blocks (q/k/v with bias, o without, SwiGLU MLP), rotate-half RoPE, GQA by
`repeat`, no causal mask, an untied lm_head. The model returns raw, unshifted
logits: the output at position i predicts token i+1, and callers shift.

Parameters carry logical axis names ('embed', 'vocab', 'heads', 'kv_heads',
'head_dim', 'mlp', 'layers'); the layers are scanned with `nn.scan` so that
compile time does not grow with depth.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.nn import attention
from trm.nn import dtypes
from trm.nn import layer_stack
from trm.nn import linear
from trm.nn import lookup
from trm.nn import masks
from trm.nn import norm
from trm.nn import platform as platform_lib
from trm.nn import remat as remat_lib
from trm.nn import rope
from trm.nn import tpu_attention
from trm.nn.attention import repeat_kv

PARAM_DTYPES = ("bfloat16", "float32")
# float16 computes only (with loss scaling); weights stay wider.
COMPUTE_DTYPES = PARAM_DTYPES + ("float16",)
_REMAT = ("none",) + remat_lib.POLICIES
ATTENTION_KINDS = tpu_attention.KINDS + attention.GPU_KINDS
MAX_HEAD_DIM = 2**16  # a sanity bound (see DreamConfig.__post_init__)
# Qwen2's `initializer_range`; imported checkpoints replace it anyway.
_INIT_STD = 0.02
ACTIVATION = ("activation_batch", "activation_length", "activation_embed")
# The token embedding's logical axes.
_TABLE_AXES = ("vocab", "embed")


@dataclasses.dataclass(frozen=True)
class DreamConfig(dtypes.ConfigDtypes):
  """Sizes and numerics; defaults are DiffuCoder-7B-Instruct's config.json."""
  vocab_size: int = 152064
  hidden_size: int = 3584
  intermediate_size: int = 18944
  num_hidden_layers: int = 28
  num_attention_heads: int = 28
  num_key_value_heads: int = 4
  rope_theta: float = 1e6
  rms_norm_eps: float = 1e-6
  mask_token_id: int = 151666
  pad_token_id: int = 151643
  dtype: str = "bfloat16"         # compute (activations)
  param_dtype: str = "float32"    # stored parameters
  remat: str = "full"             # none | full | minimal | custom: what a
                                  # block saves for backward (nn/remat.py)
  remat_save: str = ""            # custom: comma-separated names kept
  remat_offload: str = ""         # custom: names moved to host memory
  scan_layers: bool = True        # nn.scan over the layers
  attention: str = "dot"          # dot | splash (Pallas TPU) | splash_interpret
                                  # | cudnn (cuDNN flash attention, GPU)

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size",
                 "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"config.model.{name}={value!r} must be a positive "
                         "integer.")
      # Token ids and their gathers are int32; no other size comes near.
      if value >= 2**31:
        raise ValueError(
            f"config.model.{name}={config_lib.integer_text(value)} must be "
            "below 2**31" + (" (token ids are int32)." if name == "vocab_size"
                             else "."))
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f"config.model.hidden_size={self.hidden_size} must be divisible by "
          f"config.model.num_attention_heads={self.num_attention_heads}.")
    # RoPE's frequencies are a host table of head_dim / 2 built while the
    # model is traced, before any weight's shape is checked: a config.json
    # with a wrong hidden_size would cost gigabytes there (Dream's heads
    # are 128 wide; the widest in use, 256).
    if self.hidden_size // self.num_attention_heads > MAX_HEAD_DIM:
      raise ValueError(
          "config.model.hidden_size / config.model.num_attention_heads (the "
          f"head dim, {self.hidden_size // self.num_attention_heads:,}) must "
          f"be at most {MAX_HEAD_DIM:,}; check the two sizes.")
    if (self.hidden_size // self.num_attention_heads) % 2:
      raise ValueError(
          "config.model.hidden_size / config.model.num_attention_heads (the "
          f"head dim, {self.hidden_size // self.num_attention_heads}) must be "
          "even for rotate-half RoPE.")
    if self.num_attention_heads % self.num_key_value_heads:
      raise ValueError(
          f"config.model.num_attention_heads={self.num_attention_heads} must "
          "be a multiple of config.model.num_key_value_heads="
          f"{self.num_key_value_heads}.")
    for name in ("mask_token_id", "pad_token_id"):
      value = getattr(self, name)
      if not 0 <= value < self.vocab_size:
        raise ValueError(f"config.model.{name}={value} must lie in "
                         f"[0, config.model.vocab_size={self.vocab_size}).")
    for name in ("rope_theta", "rms_norm_eps"):
      value = getattr(self, name)  # NaN passes a `<= 0` test
      if not (math.isfinite(value) and value > 0):
        raise ValueError(f"config.model.{name}={value} must be a finite "
                         "positive number.")
    for name, allowed in (("dtype", COMPUTE_DTYPES),
                          ("param_dtype", PARAM_DTYPES)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"config.model.{name}={getattr(self, name)!r} must "
                         f"be one of {allowed}.")
    remat_lib.check(self.remat, self.remat_save, self.remat_offload,
                    policy_field="remat", policies=_REMAT)
    if self.attention not in ATTENTION_KINDS:
      raise ValueError(f"config.model.attention={self.attention!r} must be "
                       f"one of {ATTENTION_KINDS}.")
    if self.attention == "cudnn":
      attention.check_cudnn_config(
          dtype=self.dtype,
          head_dim=self.hidden_size // self.num_attention_heads)
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"config.model.scan_layers={self.scan_layers!r} must "
                       "be a bool.")

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @classmethod
  def from_config(cls, model_config: Mapping[str, Any]) -> "DreamConfig":
    """From `config.model` (a ConfigDict with `name='dream'`)."""
    return cls(**config_lib.model_kwargs(model_config, cls, "dream"))


def rms_norm_layer(cfg: DreamConfig, name: str | None = None):
  """Qwen2 RMSNorm: fp32 statistics, cast to the input dtype, then * weight
  (upstream multiplies after casting back, in the compute dtype)."""
  return norm.RMSNorm(cfg.rms_norm_eps, cfg.weight_dtype, name=name)


class Projection(nn.Module):
  """DenseGeneral-style projection with explicit logical axes.

  `in_shape` are the trailing input axes contracted away, `out_shape` the
  output axes; the kernel is `in_shape + out_shape`.
  """
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  in_axes: tuple[str, ...]
  out_axes: tuple[str, ...]
  use_bias: bool
  cfg: DreamConfig

  @nn.compact
  def __call__(self, x):
    dtype = self.cfg.compute_dtype
    kernel = linear.logical_param(
        self, "kernel", nn.initializers.normal(_INIT_STD),
        self.in_axes + self.out_axes, self.in_shape + self.out_shape,
        self.cfg.weight_dtype)
    n_in = len(self.in_shape)
    dims = ((tuple(range(x.ndim - n_in, x.ndim)), tuple(range(n_in))), ((), ()))
    if not self.use_bias:
      return checkpoint_name(
          jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), dims),
          remat_lib.WEIGHT_MATMUL)
    bias = linear.logical_param(self, "bias", nn.initializers.zeros,
                                self.out_axes, self.out_shape,
                                self.cfg.weight_dtype)
    # torch's Linear adds the bias inside the fp32-accumulating addmm and
    # rounds once; do the same (only q/k/v have biases, so this is cheap).
    y = jax.lax.dot_general(x.astype(dtype), kernel.astype(dtype), dims,
                            preferred_element_type=jnp.float32)
    return checkpoint_name(linear.add_bias(y, bias, dtype),
                           remat_lib.WEIGHT_MATMUL)


def rope_cos_sin(positions, head_dim: int, theta: float, dtype):
  """cos/sin [B, L, head_dim] from fp32 frequencies, cast to `dtype`.

  Halves are repeated (rotate-half convention, not interleaved); the cast to
  the activation dtype before use matches upstream (bf16 cos/sin).
  """
  return rope.cos_sin(positions, rope.inverse_frequencies(head_dim, theta),
                      dtype)


class Attention(nn.Module):
  """Bidirectional GQA self-attention (sdpa semantics, explicit softmax).

  Two extra modes serve cached decoding (`dream_cache.py`): `return_kv`
  also returns this call's keys and values ([B, L, KV, K], after RoPE,
  before the GQA repeat); with `cache=(k, v)` over the whole sequence and
  `start`, `x` is a window of it at `start`: its keys and values replace
  the cached ones there and its queries attend to the whole sequence.
  """
  cfg: DreamConfig

  @nn.compact
  def __call__(self, x, pair_mask, cos, sin, *, return_kv=False, cache=None,
               start=None):
    cfg = self.cfg
    d, h, kv, k = (cfg.hidden_size, cfg.num_attention_heads,
                   cfg.num_key_value_heads, cfg.head_dim)
    proj = lambda out_shape, out_axes, name: Projection(  # noqa: E731
        (d,), out_shape, ("embed",), out_axes, True, cfg, name=name)(x)
    q = proj((h, k), ("heads", "head_dim"), "q_proj")
    key = proj((kv, k), ("kv_heads", "head_dim"), "k_proj")
    value = proj((kv, k), ("kv_heads", "head_dim"), "v_proj")
    q, key, value = (checkpoint_name(a, name) for a, name in
                     zip((q, key, value), remat_lib.QKV_NAMES))
    # In the activation dtype, with the bf16 cos/sin, as upstream.
    q, key = rope.apply_rope(q, cos, sin), rope.apply_rope(key, cos, sin)
    new_kv = (key, value)
    if cache is not None:
      at = (0, start, 0, 0)
      key = jax.lax.dynamic_update_slice(cache[0], key.astype(cache[0].dtype),
                                         at)
      value = jax.lax.dynamic_update_slice(cache[1],
                                           value.astype(cache[1].dtype), at)
    q = mesh_lib.constrain(q, ("activation_batch", "activation_length",
                               "activation_heads", None))
    if cfg.attention == "cudnn":
      # GQA without the repeat; the pair / key mask becomes a bias.
      out = attention.cudnn_attention(q, key.astype(q.dtype),
                                      value.astype(q.dtype), pair_mask)
    elif cfg.attention != "dot" and cache is None:
      # `pair_mask` is the key mask [B, L] here (see `Dream.hidden`).
      out = tpu_attention.splash_attention(
          q * jnp.asarray(1.0 / math.sqrt(k), q.dtype), key, value,
          pair_mask, interpret=cfg.attention == "splash_interpret")
    else:
      out = _dot_attention(q, key, value, pair_mask, cfg)
    out = checkpoint_name(
        Projection((h, k), (d,), ("heads", "head_dim"), ("embed",), False,
                   cfg, name="o_proj")(out), remat_lib.OUT_PROJ)
    return (out, new_kv) if return_kv else out


def _dot_attention(q, key, value, pair_mask, cfg: DreamConfig):
  """sdpa semantics with an explicit fp32 softmax over [B, H, Lq, Lk]."""
  groups = cfg.num_attention_heads // cfg.num_key_value_heads
  # Heads-first operands: XLA:CPU runs these batched products ~4x faster
  # than einsums over the [B, L, H, K] layout (13.7 -> 3.5 ms at [4, 256, 8,
  # 32], see BUILD_NOTES); the same sums.
  return attention.dot_product_attention(
      q, repeat_kv(key, groups), repeat_kv(value, groups), pair_mask,
      probs_dtype=cfg.compute_dtype, heads_major=True)


class MLP(nn.Module):
  """down(silu(gate(x)) * up(x)), no biases."""
  cfg: DreamConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    d, f = cfg.hidden_size, cfg.intermediate_size
    gate, up = [checkpoint_name(
        Projection((d,), (f,), ("embed",), ("mlp",), False, cfg, name=name)(x),
        remat_lib.MLP_IN) for name in ("gate_proj", "up_proj")]
    return checkpoint_name(
        Projection((f,), (d,), ("mlp",), ("embed",), False, cfg,
                   name="down_proj")(nn.silu(gate) * up), remat_lib.MLP_OUT)


class DecoderLayer(nn.Module):
  """Pre-norm block; returns (x, None) so it can be the body of `nn.scan`
  (with `return_kv`, (x, (k, v)); see `Attention` for the cache modes)."""
  cfg: DreamConfig

  @nn.compact
  def __call__(self, x, pair_mask, cos, sin, *, return_kv=False, cache=None,
               start=None):
    cfg = self.cfg
    # What a remat'd block recomputes itself from; 'custom' may offload it.
    x = checkpoint_name(x, remat_lib.LAYER_INPUT)
    attn = Attention(cfg, name="self_attn")(
        rms_norm_layer(cfg, "input_layernorm")(x), pair_mask, cos, sin,
        return_kv=return_kv, cache=cache, start=start)
    attn, new_kv = attn if return_kv else (attn, None)
    x = x + attn
    x = x + MLP(cfg, name="mlp")(
        rms_norm_layer(cfg, "post_attention_layernorm")(x))
    return mesh_lib.constrain(x, ACTIVATION), new_kv


def attention_pair_mask(cfg: DreamConfig, attention_mask):
  """What the layers take as `pair_mask`: [B, 1, L, L] pairs of real tokens
  for the dot and cudnn paths, the key mask [B, L] itself for splash
  (segment ids)."""
  if attention_mask is None:
    return None
  if cfg.attention in ("splash", "splash_interpret"):
    return attention_mask.astype(bool)
  return masks.pairs(attention_mask)


def _block_class(cfg: DreamConfig):
  if cfg.remat == "none":
    return DecoderLayer
  # 'full' keeps only the block inputs (in the scan's stack) and recomputes
  # everything inside; 'minimal' and 'custom' keep or offload more.
  return nn.remat(DecoderLayer, prevent_cse=not cfg.scan_layers,
                  policy=remat_lib.checkpoint_policy(
                      cfg.remat, cfg.remat_save, cfg.remat_offload))


class Dream(nn.Module):
  """Dream/DiffuCoder LM: tokens -> raw (unshifted) logits."""
  cfg: DreamConfig

  def setup(self):
    cfg = self.cfg
    self.embed_tokens = linear.logical_param(
        self, "embed_tokens", nn.initializers.normal(_INIT_STD),
        _TABLE_AXES, (cfg.vocab_size, cfg.hidden_size),
        cfg.weight_dtype)
    block = _block_class(cfg)
    if cfg.scan_layers:
      self.layers = nn.scan(
          block, variable_axes={"params": 0}, split_rngs={"params": True},
          in_axes=(nn.broadcast, nn.broadcast, nn.broadcast),
          length=cfg.num_hidden_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})(cfg)
    else:
      self.layers = [block(cfg) for _ in range(cfg.num_hidden_layers)]
    self.norm = rms_norm_layer(cfg)
    self.lm_head = Projection((cfg.hidden_size,), (cfg.vocab_size,),
                              ("embed",), ("vocab",), False, cfg)

  def hidden(self, tokens, attention_mask=None, positions=None):
    """Final-normed hidden states [B, L, D] in the compute dtype.

    attention_mask: [B, L] bool (True = real token); pairs (i, j) attend iff
    both are real. positions: [B, L] int (default arange; for left padding
    use cumsum(mask) - 1 with pads set to 1, as upstream's tok_idx).
    """
    cfg = self.cfg
    batch, length = tokens.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32),
                                   (batch, length))
    pair_mask = attention_pair_mask(cfg, attention_mask)
    cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta,
                            cfg.compute_dtype)
    # No embedding scaling (Qwen2).
    # On a mesh, each device looks up its own columns (lookup.take_rows).
    x = lookup.take_rows(self.embed_tokens, tokens, _TABLE_AXES,
                         cfg.compute_dtype)
    if x is None:
      x = jnp.take(self.embed_tokens, tokens, axis=0).astype(cfg.compute_dtype)
    x = mesh_lib.constrain(x, ACTIVATION)
    if cfg.scan_layers:
      x, _ = self.layers(x, pair_mask, cos, sin)
    else:
      for layer in self.layers:
        x, _ = layer(x, pair_mask, cos, sin)
    return self.norm(x)

  def logits_from_hidden(self, h):
    """lm_head on hidden states [..., D] -> logits [..., V] (compute dtype)."""
    return self.lm_head(h)

  def __call__(self, tokens, attention_mask=None, positions=None):
    return self.logits_from_hidden(self.hidden(tokens, attention_mask,
                                               positions))


# The LM head kernel's logical axes ([D, V]).
HEAD_AXES = ("embed", "vocab")


def head_kernel(params):
  """The lm_head kernel [D, V] as the params hold it (its parameter
  layout), for losses that make the logits a chunk at a time."""
  return nn.meta.unbox(params["lm_head"]["kernel"])


def gather_head(kernel, cfg: DreamConfig):
  """`head_kernel` gathered over D (its vocabulary split as the rules say)
  in the compute dtype, cast where it lies first, so the gather moves
  compute-dtype bytes."""
  shard = mesh_lib.constrain(kernel.astype(cfg.compute_dtype), HEAD_AXES)
  return mesh_lib.constrain(shard, (None, HEAD_AXES[1]))


def head_logits(h, table, cfg: DreamConfig):
  """`Dream.logits_from_hidden` with its kernel given: h [..., D] @ table
  [D, V] in the compute dtype."""
  dtype = cfg.compute_dtype
  with jax.named_scope("lm_head"):  # profiles name the head's matmul
    return jax.lax.dot_general(h.astype(dtype), table.astype(dtype),
                               (((h.ndim - 1,), (0,)), ((), ())))


def unstack_layers(params, num_layers: int):
  """Scanned params (`layers`, leaves [num_layers, ...]) as the unscanned
  model's `layers_0` .. `layers_{num_layers - 1}`."""
  return layer_stack.unstack(
      params, num_layers, stacked="layers", prefix="layers_",
      count_field="config.model.num_hidden_layers",
      scan_field="config.model.scan_layers")


def denoiser(cfg: DreamConfig, platform: str | None = None):
  """The `diffusion_sampling.Denoiser` of `Dream(cfg)` (weights as the first
  argument of both halves) for `platform` (default: where programs traced
  now run, `trm.nn.platform.current()`); one object per config and
  layout, so compiled sampling loops are reused across calls.

  On a GPU a scanned model's layers are unstacked once per sampling call,
  and the steps run the unscanned model: XLA:GPU's scan copies each layer's
  weights out of the stack on every forward (cuBLAS reads a whole buffer),
  which on the compiled DiffuCoder-7B sampler was a fifth of a batch-1
  step (BUILD_NOTES "On a GPU"). The copy costs a second set of weights
  while sampling, so it is made only where the GPU's memory holds both
  with room to spare. XLA:TPU reads the slices in place."""
  platform = platform or platform_lib.current()
  unstack = (cfg.scan_layers and platform in platform_lib.GPU_PLATFORMS
             and _fits_twice(cfg))
  return _denoiser(cfg, unstack)


def _fits_twice(cfg: DreamConfig) -> bool:
  """Do two copies of the weights (spread over the GPUs) take at most half
  of one GPU's memory? True where the memory is not known (compile-only
  devices)."""
  try:
    devices = jax.local_devices()
    limit = (devices[0].memory_stats() or {}).get("bytes_limit")
  except Exception:  # pylint: disable=broad-except
    return True
  if not limit:
    return True
  weights = param_count(cfg) * jnp.dtype(cfg.weight_dtype).itemsize
  return 2 * weights / len(devices) <= 0.5 * limit


@functools.lru_cache(maxsize=None)
def _denoiser(cfg: DreamConfig, unstack: bool):
  from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top
  model = Dream(cfg)
  flat = Dream(dataclasses.replace(cfg, scan_layers=False)) if unstack else (
      model)

  def prepare(params):
    return unstack_layers(params, cfg.num_hidden_layers)

  def pick(params):  # the layout `prepare` made, or the one given
    return model if "layers" in params or not cfg.scan_layers else flat

  def hidden(params, tokens, attention_mask, positions):
    return pick(params).apply({"params": params}, tokens, attention_mask,
                              positions, method=Dream.hidden)

  def head(params, h):
    return pick(params).apply({"params": params}, h,
                              method=Dream.logits_from_hidden)

  return diffusion_sampling.Denoiser(hidden, head,
                                     prepare if unstack else None)


def init_params(cfg: DreamConfig, rng):
  """Boxed params of `Dream(cfg)`. The attention kernel holds no params, so
  init traces the dot path, which takes a one-token sequence."""
  plain = dataclasses.replace(cfg, attention="dot")
  return Dream(plain).init(rng, jnp.zeros((1, 1), jnp.int32))["params"]


def abstract_params(cfg: DreamConfig):
  """Boxed (LogicallyPartitioned) ShapeDtypeStructs of the params; no alloc."""
  return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def param_count(cfg: DreamConfig) -> int:
  """Number of parameters, from shapes only (`jax.eval_shape`)."""
  leaves = jax.tree.leaves(nn.meta.unbox(abstract_params(cfg)))
  return int(sum(math.prod(x.shape) for x in leaves))
