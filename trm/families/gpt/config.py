"""nanoGPT's GPTConfig (same defaults) plus numerics; see model.py."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from trm.core import config_lib
from trm.families.gpt import norm_gpu
from trm.nn import attention as attention_lib
from trm.nn import dtypes
from trm.nn import remat as remat_lib
from trm.nn import tpu_attention

_DTYPES = ("float32", "bfloat16", "float16")
_SIZE_LIMIT = 2**31  # sizes are int32 in JAX's shapes and token ids
ATTENTION_KINDS = ("dot", "splash", "splash_interpret") + attention_lib.GPU_KINDS
QKV_PROJECTIONS = ("auto", "fused", "grouped", "separate")
NORM_KERNELS = ("xla",) + norm_gpu.KINDS
HEAD_GATHERS = ("param", "compute")


@dataclasses.dataclass(frozen=True)
class GPTConfig(dtypes.ConfigDtypes):
  """nanoGPT's GPTConfig (same defaults) plus numerics."""
  block_size: int = 1024
  vocab_size: int = 50304   # GPT-2's 50257 padded up to a multiple of 64
  n_layer: int = 12
  n_head: int = 12
  n_embd: int = 768
  # Key/value heads; 0: n_head (nanoGPT, GPT-2). Fewer is grouped-query
  # attention, as MaxText's num_kv_heads (Llama2-70B: 64 query heads
  # over 8): each k, v head serves n_head // n_kv_head query heads.
  n_kv_head: int = 0
  # Width of one attention head; 0: n_embd // n_head (nanoGPT, GPT-2). Set,
  # the attention is n_head * head_size wide apart from n_embd, as MaxText's
  # head_dim (its 52B: 32 heads of 256 in a 12288-wide model).
  head_size: int = 0
  # MLP hidden width; 0: 4 * n_embd (nanoGPT, GPT-2's n_inner). Set, as
  # MaxText's mlp_dim (its v5e 16B: 32768 in a 5120-wide model).
  mlp_size: int = 0
  dropout: float = 0.0
  bias: bool = True         # Linear and LayerNorm biases, as GPT-2
  dtype: str = "float32"        # compute dtype: float32 | bfloat16 | float16
  param_dtype: str = "float32"  # stored parameters
  remat: bool = False           # jax.checkpoint each block (memory for compute)
  remat_policy: str = "full"    # with remat, what a block saves (nn/remat.py)
  remat_save: str = ""          # 'custom': comma-separated remat.NAMES kept
  remat_offload: str = ""       # 'custom': remat.NAMES moved to host memory
  scan_layers: bool = False     # nn.scan one block (params h: [n_layer, ...])
  # The residual stream between blocks: float32 as torch.autocast keeps
  # nanoGPT's, or the compute dtype as MaxText keeps it (half the memory of
  # the activations a remat'd layer saves).
  residual_dtype: str = "float32"
  # The LM head's output: float32 (its matmul's accumulator), or bfloat16 as
  # torch.autocast's LM head hands nanoGPT's F.cross_entropy (which
  # computes in float32 either way): half the logits' memory traffic.
  logits_dtype: str = "float32"
  # dot: XLA attention with [B, H, T, T] float32 scores; splash: the Pallas
  # TPU kernel (no scores in HBM; block_size a multiple of 128, no attention
  # dropout); splash_interpret: the same kernel interpreted, for CPU tests;
  # cudnn: cuDNN's flash attention on NVIDIA GPUs (bfloat16/float16, no
  # attention dropout).
  attention: str = "dot"
  # The splash kernel's tile along the sequence, forward and backward: 0
  # picks the largest of 512, 256, 128 dividing block_size; set, a multiple
  # of 128 dividing it (MaxText's sa_block_*: its v6e runs at 8192 use 2048;
  # larger tiles mean fewer kernel steps and more VMEM).
  splash_block: int = 0
  # c_attn's q | k | v: 'fused' (nanoGPT's one [C, 3C] matmul, then split),
  # 'grouped' (one matmul against the same kernel with its columns
  # reordered per key/value head, so a tensor-parallel split of the product
  # falls on head boundaries), 'separate' (three matmuls on the column
  # blocks of the same kernel: no copies splitting one buffer into q, k
  # and v nor joining their gradients), or 'auto': separate with
  # attention='cudnn', whose kernel cannot read q, k, v in place; grouped
  # where the mesh splits the heads (layers.grouped_qkv); else fused. The
  # same weights and values in all four.
  qkv_projection: str = "auto"
  # The residual adds and the LayerNorms after them: 'xla', or 'triton'
  # (NVIDIA GPUs: one Pallas kernel per add and norm, norm_gpu.py;
  # 'triton_interpret' runs it in Pallas's interpreter, for tests).
  norm_kernel: str = "xla"
  # How the LM head gathers the FSDP-sharded tied table: 'param' gathers
  # the stored (float32) table and casts it (one gather serves a token
  # lookup that gathers too: trm.nn.lookup's fallback); 'compute' casts
  # each shard and gathers in the compute dtype. Which needs less memory
  # depends on XLA's schedule (measured, BUILD_NOTES "Another chip": v5e
  # 32B 16.42 -> 15.04 GiB per chip, v4 52B 30.56 -> 32.12; session 90).
  head_gather: str = "param"

  def __post_init__(self):
    # Below 2**31: JAX reads a larger size as an int32 and failed with an
    # OverflowError's traceback (e.g. a vocab_size of 2**40 in a run's
    # config.json edited by hand, which trm.export and trm.sample read).
    for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
          or not 0 < value < _SIZE_LIMIT):
        raise ValueError(f"config.model.{name}={value!r} must be a positive "
                         "integer (below 2**31).")
    for name, default in (("head_size", "n_embd // n_head"),
                          ("mlp_size", "4 * n_embd"), ("n_kv_head", "n_head")):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
          or not 0 <= value < _SIZE_LIMIT):
        raise ValueError(f"config.model.{name}={value!r} must be an "
                         f"integer >= 0 and below 2**31 (0: {default}).")
    if not self.head_size and self.n_embd % self.n_head:
      raise ValueError(
          f"config.model.n_embd={self.n_embd} must be divisible by "
          f"config.model.n_head={self.n_head} (head size n_embd // n_head),"
          " or config.model.head_size set.")
    if self.n_kv_head and self.n_head % self.n_kv_head:
      raise ValueError(
          f"config.model.n_head={self.n_head} must be a multiple of "
          f"config.model.n_kv_head={self.n_kv_head} (each key/value head "
          "serves the same number of query heads), or n_kv_head 0.")
    if not 0.0 <= float(self.dropout) < 1.0:
      raise ValueError(f"config.model.dropout={self.dropout!r} must be in "
                       "[0, 1).")
    for name in ("bias", "remat", "scan_layers"):
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ValueError(f"config.model.{name}={getattr(self, name)!r} must "
                         "be a bool.")
    if self.attention not in ATTENTION_KINDS:
      raise ValueError(f"config.model.attention={self.attention!r} must be "
                       "'dot', 'splash', 'splash_interpret' or 'cudnn'.")
    if self.attention == "cudnn":
      attention_lib.check_cudnn_config(dtype=self.dtype,
                                       head_dim=self.head_dim)
    elif self.attention != "dot" and self.block_size % 128:
      raise ValueError(f"config.model.attention={self.attention!r} needs "
                       "config.model.block_size to be a multiple of 128, "
                       f"not {self.block_size}; or use attention='dot'.")
    if not isinstance(self.splash_block, (int, np.integer)) or isinstance(
        self.splash_block, bool) or self.splash_block < 0:
      raise ValueError(f"config.model.splash_block={self.splash_block!r} "
                       "must be 0 or a positive multiple of 128.")
    if self.splash_block and self.attention in ("splash", "splash_interpret"):
      tpu_attention.check_length(self.block_size, self.splash_block)
    if self.attention != "dot" and float(self.dropout) > 0:
      raise ValueError(f"config.model.attention={self.attention!r} has no "
                       "attention dropout: set config.model.dropout=0.0 or "
                       "attention='dot'.")
    remat_lib.check(self.remat_policy, self.remat_save, self.remat_offload)
    if self.qkv_projection not in QKV_PROJECTIONS:
      raise ValueError(f"config.model.qkv_projection={self.qkv_projection!r}"
                       f" must be one of {QKV_PROJECTIONS}.")
    if self.head_gather not in HEAD_GATHERS:
      raise ValueError(f"config.model.head_gather={self.head_gather!r} must "
                       f"be one of {HEAD_GATHERS}.")
    if self.norm_kernel not in NORM_KERNELS:
      raise ValueError(f"config.model.norm_kernel={self.norm_kernel!r} must "
                       f"be one of {NORM_KERNELS}.")
    if self.norm_kernel != "xla" and self.residual_dtype != "float32":
      raise ValueError(f"config.model.norm_kernel={self.norm_kernel!r} keeps "
                       "the residual stream in float32: set "
                       "config.model.residual_dtype='float32', or "
                       "norm_kernel='xla'.")
    for name in ("dtype", "param_dtype", "residual_dtype", "logits_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"config.model.{name}={getattr(self, name)!r} must "
                         f"be one of {_DTYPES}.")

  @property
  def head_dim(self) -> int:
    return self.head_size or self.n_embd // self.n_head

  @property
  def separate_qkv(self) -> bool:
    """Is c_attn run as three matmuls (`qkv_projection`)?"""
    if self.qkv_projection == "auto":
      return self.attention in attention_lib.GPU_KINDS
    return self.qkv_projection == "separate"

  @property
  def checkpoint_policy(self):
    """jax.checkpoint's policy for `remat_policy` (None: save nothing)."""
    return remat_lib.checkpoint_policy(self.remat_policy, self.remat_save,
                                       self.remat_offload)

  @property
  def mlp_width(self) -> int:
    return self.mlp_size or 4 * self.n_embd

  @property
  def attention_width(self) -> int:
    """c_attn's q width and c_proj's input: n_embd unless head_size."""
    return self.n_head * self.head_dim

  @property
  def kv_heads(self) -> int:
    return self.n_kv_head or self.n_head

  @property
  def kv_width(self) -> int:
    """c_attn's k (and v) width: attention_width unless n_kv_head."""
    return self.kv_heads * self.head_dim

  @classmethod
  def from_config(cls, model_config: Mapping[str, Any]) -> "GPTConfig":
    """From `config.model` (a ConfigDict with `name='gpt'`)."""
    name = dict(model_config).get("name", "gpt")
    if name != "gpt":
      raise ValueError(f"config.model.name={name!r} is not 'gpt'.")
    return cls(**config_lib.model_kwargs(model_config, cls, "gpt"))
