"""Dream / DiffuCoder tensor mapping: HF tensor names and layouts <-> ours.

HF stores PyTorch `[out, in]` Linear weights; ours are kernels `[in, out]`,
per-head q/k/v kernels `(D, heads, head_dim)` and o `(heads, head_dim, D)`,
with per-layer arrays stacked on a leading axis when the layers are scanned
(see `trm.families.dream.hf_import`). Each of our params is a `Leaf`; its
shard is read from the HF tensors by slice (`read_slice`) and written back
by `to_hf`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from trm.families.dream.model import DreamConfig

@dataclasses.dataclass(frozen=True)
class Leaf:
  """How one of our params maps to HF tensors.

  kind: 'copy' (same layout), 'linear' (transpose), 'heads_in' (Linear
  [heads*head_dim, D] -> (D, heads, head_dim)), 'heads_bias' ([heads*head_dim]
  -> (heads, head_dim)), 'heads_out' (Linear [D, heads*head_dim] ->
  (heads, head_dim, D)).
  """
  path: tuple[str, ...]
  hf_name: str           # with '{i}' for per-layer tensors
  kind: str
  per_layer: bool


def leaves(cfg: DreamConfig) -> list[Leaf]:
  p = "model.layers.{i}."
  layer = [
      (("input_layernorm", "scale"), p + "input_layernorm.weight", "copy"),
      (("post_attention_layernorm", "scale"),
       p + "post_attention_layernorm.weight", "copy"),
      (("self_attn", "q_proj", "kernel"), p + "self_attn.q_proj.weight",
       "heads_in"),
      (("self_attn", "q_proj", "bias"), p + "self_attn.q_proj.bias",
       "heads_bias"),
      (("self_attn", "k_proj", "kernel"), p + "self_attn.k_proj.weight",
       "heads_in"),
      (("self_attn", "k_proj", "bias"), p + "self_attn.k_proj.bias",
       "heads_bias"),
      (("self_attn", "v_proj", "kernel"), p + "self_attn.v_proj.weight",
       "heads_in"),
      (("self_attn", "v_proj", "bias"), p + "self_attn.v_proj.bias",
       "heads_bias"),
      (("self_attn", "o_proj", "kernel"), p + "self_attn.o_proj.weight",
       "heads_out"),
      (("mlp", "gate_proj", "kernel"), p + "mlp.gate_proj.weight", "linear"),
      (("mlp", "up_proj", "kernel"), p + "mlp.up_proj.weight", "linear"),
      (("mlp", "down_proj", "kernel"), p + "mlp.down_proj.weight", "linear"),
  ]
  out = [Leaf(("embed_tokens",), "model.embed_tokens.weight", "copy", False)]
  if cfg.scan_layers:
    out += [Leaf(("layers",) + path, name, kind, True)
            for path, name, kind in layer]
  else:
    for i in range(cfg.num_hidden_layers):
      out += [Leaf((f"layers_{i}",) + path, name.replace("{i}", str(i)), kind,
                    False) for path, name, kind in layer]
  out += [Leaf(("norm", "scale"), "model.norm.weight", "copy", False),
          Leaf(("lm_head", "kernel"), "lm_head.weight", "linear", False)]
  return out


def our_shape(leaf: Leaf, hf_shape, cfg: DreamConfig) -> tuple[int, ...]:
  """Our per-layer shape for an HF tensor of `hf_shape`."""
  k = cfg.head_dim
  if leaf.kind == "copy":
    return tuple(hf_shape)
  if leaf.kind == "linear":
    return tuple(hf_shape[::-1])
  if leaf.kind == "heads_in":
    return (hf_shape[1], hf_shape[0] // k, k)
  if leaf.kind == "heads_bias":
    return (hf_shape[0] // k, k)
  return (hf_shape[1] // k, k, hf_shape[0])  # heads_out


def hf_shape(leaf: Leaf, ours, cfg: DreamConfig) -> tuple[int, ...]:
  """The HF shape expected for our per-layer shape `ours`."""
  if leaf.kind == "copy":
    return tuple(ours)
  if leaf.kind == "linear":
    return tuple(ours[::-1])
  if leaf.kind == "heads_in":
    return (ours[1] * ours[2], ours[0])
  if leaf.kind == "heads_bias":
    return (ours[0] * ours[1],)
  return (ours[2], ours[0] * ours[1])  # heads_out


def read_slice(leaf: Leaf, read: Callable, index: tuple[slice, ...],
                head_dim: int) -> np.ndarray:
  """Our-layout block `index` (unit-stride slices) of one per-layer tensor.

  `read(hf_slices)` returns that block of the HF tensor; only the rows and
  columns the block needs are read.
  """
  if leaf.kind == "copy":
    return read(index)
  if leaf.kind == "linear":
    return read((index[1], index[0])).T
  if leaf.kind == "heads_in":
    sd, sh, sk = index
    rows = slice(sh.start * head_dim, sh.stop * head_dim)
    block = read((rows, sd)).reshape(sh.stop - sh.start, head_dim, -1)
    return block[:, sk].transpose(2, 0, 1)
  if leaf.kind == "heads_bias":
    sh, sk = index
    rows = slice(sh.start * head_dim, sh.stop * head_dim)
    return read((rows,)).reshape(sh.stop - sh.start, head_dim)[:, sk]
  sh, sk, sd = index  # heads_out
  cols = slice(sh.start * head_dim, sh.stop * head_dim)
  block = read((sd, cols)).reshape(sd.stop - sd.start, sh.stop - sh.start,
                                   head_dim)
  return block[:, :, sk].transpose(1, 2, 0)


def to_hf(leaf: Leaf, x: np.ndarray) -> np.ndarray:
  """One per-layer array in our layout -> the HF tensor."""
  if leaf.kind == "copy":
    return x
  if leaf.kind == "linear":
    return x.T
  if leaf.kind == "heads_in":
    return x.transpose(1, 2, 0).reshape(-1, x.shape[0])
  if leaf.kind == "heads_bias":
    return x.reshape(-1)
  return x.reshape(-1, x.shape[-1]).T  # heads_out


def normalize(index, shape) -> tuple[slice, ...]:
  out = []
  for s, dim in zip(tuple(index) + (slice(None),) * (len(shape) - len(index)),
                    shape):
    start, stop, step = s.indices(dim)
    if step != 1:
      raise ValueError(f"strided shard index {s} is not supported")
    out.append(slice(start, stop))
  return tuple(out)
