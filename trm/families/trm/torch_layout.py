"""Upstream TRM state_dict layout: which upstream key holds which variable.

The key/shape table of `trm.families.trm.torch_import` (see its docstring)
as code (`entries`), the abstract shapes of our variables, and the error
messages that explain a size mismatch. Used by `torch_import`.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Mapping

from flax.core import meta
import jax

from trm.core import weights_io
from trm.families.trm import model as trm_model

@dataclasses.dataclass(frozen=True)
class Entry:
  """One upstream tensor and where it lives in our variables."""
  name: str                  # upstream key under the inner model
  collection: str            # 'params' | 'buffers' | 'puzzle_emb'
  path: tuple[str, ...]      # inside the collection
  transpose: bool            # Linear: upstream [out, in], ours [in, out]
  dims: tuple[str, ...]      # what sizes each *upstream* dimension (errors)


def entries(cfg: trm_model.TRMConfig) -> list[Entry]:
  """The full mapping for `cfg`, in upstream `state_dict()` order."""
  out = [Entry("H_init", "buffers", ("H_init",), False, ("hidden",)),
         Entry("L_init", "buffers", ("L_init",), False, ("hidden",)),
         Entry("embed_tokens.embedding_weight", "params",
                ("embed_tokens", "embedding"), False, ("vocab", "hidden")),
         Entry("lm_head.weight", "params", ("lm_head", "kernel"), True,
                ("vocab", "hidden")),
         Entry("q_head.weight", "params", ("q_head", "kernel"), True,
                ("two", "hidden")),
         Entry("q_head.bias", "params", ("q_head", "bias"), False, ("two",))]
  if cfg.puzzle_emb_ndim > 0:
    out.append(Entry("puzzle_emb.weights", "puzzle_emb", ("weights",), False,
                      ("puzzles", "puzzle_dim")))
  if cfg.pos_encodings == "learned":
    out.append(Entry("embed_pos.embedding_weight", "params", ("embed_pos",),
                      False, ("tokens", "hidden")))
  for i in range(cfg.L_layers):
    up, ours = f"L_level.layers.{i}.", ("L_level", f"layers_{i}")
    if cfg.mlp_t:
      out += [Entry(up + "mlp_t.gate_up_proj.weight", "params",
                     ours + ("mlp_t", "gate_up_proj", "kernel"), True,
                     ("token_mlp2", "tokens")),
              Entry(up + "mlp_t.down_proj.weight", "params",
                     ours + ("mlp_t", "down_proj", "kernel"), True,
                     ("tokens", "token_mlp"))]
    else:
      out += [Entry(up + "self_attn.qkv_proj.weight", "params",
                     ours + ("self_attn", "qkv_proj", "kernel"), True,
                     ("qkv", "hidden")),
              Entry(up + "self_attn.o_proj.weight", "params",
                     ours + ("self_attn", "o_proj", "kernel"), True,
                     ("hidden", "hidden"))]
    out += [Entry(up + "mlp.gate_up_proj.weight", "params",
                   ours + ("mlp", "gate_up_proj", "kernel"), True,
                   ("mlp2", "hidden")),
            Entry(up + "mlp.down_proj.weight", "params",
                   ours + ("mlp", "down_proj", "kernel"), True,
                   ("hidden", "mlp"))]
  return out


def upstream_key_names(model_cfg: trm_model.TRMConfig,
                       prefix: str = "_orig_mod.model.") -> list[str]:
  """The state_dict keys upstream has for `model_cfg`, in its order."""
  return [prefix + "inner." + e.name for e in entries(model_cfg)]


@functools.lru_cache(maxsize=16)
def abstract(cfg: trm_model.TRMConfig) -> dict:
  """Our variables' shapes and dtypes, checked against the mapping."""
  model = trm_model.TRM(cfg)
  abstract = meta.unbox(jax.eval_shape(
      lambda: trm_model.init_variables(model, jax.random.PRNGKey(0))))
  ours = {(col,) + tuple(k.key for k in path)
          for col in abstract
          for path, _ in jax.tree_util.tree_flatten_with_path(
              abstract[col])[0]}
  mapped = {(e.collection,) + e.path for e in entries(cfg)}
  if ours != mapped:  # the model changed: this table must follow it
    raise NotImplementedError(
        "trm/families/trm/torch_import.py does not map every TRM variable: "
        f"unmapped {sorted(ours - mapped)}, stale {sorted(mapped - ours)}.")
  return abstract


def upstream_shape(entry: Entry, ours) -> tuple[int, ...]:
  return tuple(ours[::-1]) if entry.transpose else tuple(ours)


# ---------------------------------------------------------------- messages


def _dim_hint(label: str, got: int, want: int,
              cfg: trm_model.TRMConfig) -> str:
  """Which config field sizes a dimension, and what the checkpoint implies."""
  if label == "vocab":
    return (f"vocab_size (config.model.vocab_size={cfg.vocab_size}, from the "
            f"dataset metadata; the checkpoint has {got})")
  if label == "hidden":
    return (f"hidden_size (config.model.hidden_size={cfg.hidden_size}; the "
            f"checkpoint has {got})")
  if label == "qkv":
    implied = f"hidden_size={got // 3}" if got % 3 == 0 else "no hidden_size"
    return (f"3 * hidden_size (fused q|k|v; config.model.hidden_size="
            f"{cfg.hidden_size}; the checkpoint implies {implied})")
  if label in ("mlp", "mlp2"):
    factor = "2 * " if label == "mlp2" else ""
    return (f"{factor}swiglu_width(hidden_size, expansion) = {want} "
            f"(config.model.expansion={cfg.expansion}, hidden_size="
            f"{cfg.hidden_size}); the checkpoint has {got}: probably "
            "expansion differs")
  if label == "tokens":
    return (f"seq_len + puzzle prefix = {cfg.seq_len} + {cfg.prefix_len} "
            f"(config.model.seq_len from the dataset, puzzle_emb_len="
            f"{cfg.puzzle_emb_len}); the checkpoint has {got}: probably "
            "seq_len (another dataset) or puzzle_emb_len differs")
  if label in ("token_mlp", "token_mlp2"):
    factor = "2 * " if label == "token_mlp2" else ""
    return (f"{factor}swiglu_width(seq_len + prefix, expansion) = {want}; "
            f"the checkpoint has {got}: probably seq_len, puzzle_emb_len or "
            "expansion differs")
  if label == "puzzles":
    return (f"num_puzzle_identifiers (config.model.num_puzzle_identifiers="
            f"{cfg.num_puzzle_identifiers}, from the dataset metadata; the "
            f"checkpoint has {got}: it was trained on another dataset build)")
  if label == "puzzle_dim":
    return (f"puzzle_emb_ndim (config.model.puzzle_emb_ndim="
            f"{cfg.puzzle_emb_ndim}; the checkpoint has {got})")
  return f"fixed at {want} in TRM (the checkpoint has {got})"


def shape_error(entry: Entry, key: str, where: str, got, want,
                 cfg: trm_model.TRMConfig) -> weights_io.CheckpointError:
  hints = [f"dimension {d} is {_dim_hint(label, g, w, cfg)}"
           for d, (label, g, w) in enumerate(zip(entry.dims, got, want))
           if g != w]
  if len(got) != len(want):
    hints = [f"expected {len(want)} dimensions, got {len(got)}"]
  layout = " (upstream [out, in] Linear layout)" if entry.transpose else ""
  return weights_io.CheckpointError(
      f"Tensor {key!r} in {where} has shape {tuple(got)}; config.model "
      f"expects {tuple(want)}{layout}: " + "; ".join(hints) + ".")


def variant_hints(cfg: trm_model.TRMConfig, names: Mapping[str, Any]
                   ) -> list[str]:
  """Config switches that would explain missing / unexpected keys."""
  hints = []
  indices = {int(m.group(1)) for n in names
             if (m := re.match(r"L_level\.layers\.(\d+)\.", n))}
  if indices and max(indices) + 1 != cfg.L_layers:
    hints.append(f"the checkpoint has {max(indices) + 1} layers: set "
                 f"config.model.L_layers={max(indices) + 1} (now "
                 f"{cfg.L_layers})")
  has = lambda part: any(part in n for n in names)
  if has(".mlp_t.") and not cfg.mlp_t:
    hints.append("it is the token-MLP variant (mlp_t.*): set "
                 "config.model.mlp_t=True (upstream's Sudoku-MLP also sets "
                 "pos_encodings='none')")
  if has(".self_attn.") and cfg.mlp_t:
    hints.append("it is the attention variant (self_attn.*): set "
                 "config.model.mlp_t=False")
  if "embed_pos.embedding_weight" in names and cfg.pos_encodings != "learned":
    hints.append("it has learned position embeddings (embed_pos.*): set "
                 "config.model.pos_encodings='learned'")
  if ("embed_pos.embedding_weight" not in names
      and cfg.pos_encodings == "learned"):
    hints.append("it has no embed_pos.*: config.model.pos_encodings is "
                 "'rope' or 'none' (which one is not stored in the file)")
  if "puzzle_emb.weights" in names and cfg.puzzle_emb_ndim <= 0:
    shape = tuple(names["puzzle_emb.weights"].shape)
    hints.append(f"it has a puzzle-embedding table {shape}: set "
                 f"config.model.puzzle_emb_ndim={shape[-1]}")
  if "puzzle_emb.weights" not in names and cfg.puzzle_emb_ndim > 0:
    hints.append("it has no puzzle_emb.weights: set "
                 "config.model.puzzle_emb_ndim=0")
  return hints


def short(keys, limit=12) -> str:
  keys = sorted(keys)
  more = f" ... ({len(keys) - limit} more)" if len(keys) > limit else ""
  return ", ".join(repr(k) for k in keys[:limit]) + more
