"""Reads and writes TRM checkpoints in the upstream PyTorch layout.

Upstream (SamsungSAILMontreal/TinyRecursiveModels) `pretrain.py` saves
`model.state_dict()` of a `torch.compile`d `ACTLossHead` wrapping
`TinyRecursiveReasoningModel_ACTV1` (attribute `model`), which holds the inner
model (attribute `inner`), with `torch.save`; `load_checkpoint` reads it back
with `load_state_dict(..., assign=True)`. Keys are therefore

    _orig_mod.model.inner.<name>   torch.compile'd loss head (pretrain.py)
    model.inner.<name>             loss head, DISABLE_COMPILE=1
    inner.<name>                   the ACT model alone
    <name>                         the inner model alone

and all four are accepted on import (leading `_orig_mod.`, `model.` and
`inner.` components are stripped; one file must use one prefix). On export
the keys are `prefix + "inner." + <name>`.

Mapping. Sizes: D hidden_size, V vocab_size, S = seq_len + prefix_len, I =
swiglu_width(D, expansion), It = swiglu_width(S, expansion), N
num_puzzle_identifiers, P puzzle_emb_ndim (prefix_len = puzzle_emb_len, or
ceil(P / D) when that is 0, or 0 when P is 0). X = `L_level.layers.{i}` and
Y = `params/L_level/layers_{i}` for i < L_layers. Ours = collection/path in
the variables of `trm.families.trm.model.TRM`. T = transpose, cast = astype.

  upstream <name> [shape]              ours [shape]                      op
  H_init [D] (forward dtype)           buffers/H_init [D]              cast
  L_init [D] (forward dtype)           buffers/L_init [D]              cast
  embed_tokens.embedding_weight [V,D]  params/embed_tokens/embedding   copy
  lm_head.weight [V,D]                 params/lm_head/kernel [D,V]        T
  q_head.weight [2,D]                  params/q_head/kernel [D,2]         T
  q_head.bias [2]                      params/q_head/bias [2]          copy
  puzzle_emb.weights [N,P]      (a)    puzzle_emb/weights [N,P]        copy
  embed_pos.embedding_weight [S,D] (b) params/embed_pos [S,D]          copy
  X.self_attn.qkv_proj.weight [3D,D]   Y/self_attn/qkv_proj/kernel [D,3D] T
  X.self_attn.o_proj.weight [D,D]      Y/self_attn/o_proj/kernel [D,D]    T
  X.mlp_t.gate_up_proj.weight (c)      Y/mlp_t/gate_up_proj/kernel        T
      [2It,S]                            [S,2It]
  X.mlp_t.down_proj.weight [S,It] (c)  Y/mlp_t/down_proj/kernel [It,S]    T
  X.mlp.gate_up_proj.weight [2I,D]     Y/mlp/gate_up_proj/kernel [D,2I]   T
  X.mlp.down_proj.weight [D,I]         Y/mlp/down_proj/kernel [I,D]       T

  (a) only if P > 0; (b) only if pos_encodings == 'learned'; (c) replace the
  two self_attn rows when mlp_t is True.

Notes on the transforms:
  * Linear weights are `[out, in]` upstream, kernels `[in, out]` here; a
    transpose keeps the order of the output features, so the fused layouts
    carry over unchanged: qkv output features are `[q heads | k heads | v
    heads]`, each head's `head_dim` contiguous, in both (our `Attention`
    reshapes its fused projection to `[B, S, 3H, head_dim]` exactly as
    upstream's `.view`), and the first half of `gate_up_proj` is the gate in
    both. No per-head reshape is needed.
  * Params and the puzzle table are float32 in both (a checkpoint in another
    float dtype is cast to float32); H_init / L_init take
    `config.model.forward_dtype` (upstream creates them in forward_dtype, so a
    default checkpoint stores bfloat16, which is exact in float32).
  * Not stored, tolerated and ignored if present: upstream's non-persistent
    `rotary_emb.{cos,sin}_cached` (recomputed from rope_theta) and
    `puzzle_emb.{local_weights,local_ids}` (per-batch scratch).
  * A puzzle table of another size is an error here (upstream
    `load_checkpoint` silently replaces it by its row mean): the config must
    come from the same dataset build.
  * Not in the checkpoint at all, so they must come from `config.model`:
    num_heads (qkv is [3D, D] for any head count), pos_encodings 'rope' vs
    'none', rope_theta, rms_norm_eps, H_cycles, L_cycles, halt_*,
    forward_dtype.

Security: PyTorch files are read only with `torch.load(path,
map_location='cpu', weights_only=True)`; a file that needs arbitrary
unpickling is refused. `.safetensors` files (detected by content) are read
with safetensors and need no torch. torch is imported lazily, only for
`.pt`-style files; it is not a dependency of the package.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import os
import pickle
import re
from typing import Any, Mapping

from flax.core import meta
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from trm.families.trm import model as trm_model
from trm.families.dream.hf_import import CheckpointError  # one error type for importers
from trm.families.dream.hf_import import get_path, set_path

__all__ = ["CheckpointError", "load_torch_checkpoint",
           "export_torch_checkpoint", "upstream_key_names"]

# Module names upstream wraps the inner model in (see the module docstring).
_WRAPPERS = ("_orig_mod", "model", "inner")
# Upstream non-persistent buffers: never saved by upstream, ignored if present.
_IGNORED = ("rotary_emb.cos_cached", "rotary_emb.sin_cached",
            "puzzle_emb.local_weights", "puzzle_emb.local_ids")
_INSTALL_TORCH = ("pip install torch (CPU wheels suffice), or convert the "
                  "file to .safetensors, which needs no torch")


@dataclasses.dataclass(frozen=True)
class _Entry:
  """One upstream tensor and where it lives in our variables."""
  name: str                  # upstream key under the inner model
  collection: str            # 'params' | 'buffers' | 'puzzle_emb'
  path: tuple[str, ...]      # inside the collection
  transpose: bool            # Linear: upstream [out, in], ours [in, out]
  dims: tuple[str, ...]      # what sizes each *upstream* dimension (errors)


def _entries(cfg: trm_model.TRMConfig) -> list[_Entry]:
  """The full mapping for `cfg`, in upstream `state_dict()` order."""
  out = [_Entry("H_init", "buffers", ("H_init",), False, ("hidden",)),
         _Entry("L_init", "buffers", ("L_init",), False, ("hidden",)),
         _Entry("embed_tokens.embedding_weight", "params",
                ("embed_tokens", "embedding"), False, ("vocab", "hidden")),
         _Entry("lm_head.weight", "params", ("lm_head", "kernel"), True,
                ("vocab", "hidden")),
         _Entry("q_head.weight", "params", ("q_head", "kernel"), True,
                ("two", "hidden")),
         _Entry("q_head.bias", "params", ("q_head", "bias"), False, ("two",))]
  if cfg.puzzle_emb_ndim > 0:
    out.append(_Entry("puzzle_emb.weights", "puzzle_emb", ("weights",), False,
                      ("puzzles", "puzzle_dim")))
  if cfg.pos_encodings == "learned":
    out.append(_Entry("embed_pos.embedding_weight", "params", ("embed_pos",),
                      False, ("tokens", "hidden")))
  for i in range(cfg.L_layers):
    up, ours = f"L_level.layers.{i}.", ("L_level", f"layers_{i}")
    if cfg.mlp_t:
      out += [_Entry(up + "mlp_t.gate_up_proj.weight", "params",
                     ours + ("mlp_t", "gate_up_proj", "kernel"), True,
                     ("token_mlp2", "tokens")),
              _Entry(up + "mlp_t.down_proj.weight", "params",
                     ours + ("mlp_t", "down_proj", "kernel"), True,
                     ("tokens", "token_mlp"))]
    else:
      out += [_Entry(up + "self_attn.qkv_proj.weight", "params",
                     ours + ("self_attn", "qkv_proj", "kernel"), True,
                     ("qkv", "hidden")),
              _Entry(up + "self_attn.o_proj.weight", "params",
                     ours + ("self_attn", "o_proj", "kernel"), True,
                     ("hidden", "hidden"))]
    out += [_Entry(up + "mlp.gate_up_proj.weight", "params",
                   ours + ("mlp", "gate_up_proj", "kernel"), True,
                   ("mlp2", "hidden")),
            _Entry(up + "mlp.down_proj.weight", "params",
                   ours + ("mlp", "down_proj", "kernel"), True,
                   ("hidden", "mlp"))]
  return out


def upstream_key_names(model_cfg: trm_model.TRMConfig,
                       prefix: str = "_orig_mod.model.") -> list[str]:
  """The state_dict keys upstream has for `model_cfg`, in its order."""
  return [prefix + "inner." + e.name for e in _entries(model_cfg)]


@functools.lru_cache(maxsize=16)
def _abstract(cfg: trm_model.TRMConfig) -> dict:
  """Our variables' shapes and dtypes, checked against the mapping."""
  model = trm_model.TRM(cfg)
  abstract = meta.unbox(jax.eval_shape(
      lambda: trm_model.init_variables(model, jax.random.PRNGKey(0))))
  ours = {(col,) + tuple(k.key for k in path)
          for col in abstract
          for path, _ in jax.tree_util.tree_flatten_with_path(
              abstract[col])[0]}
  mapped = {(e.collection,) + e.path for e in _entries(cfg)}
  if ours != mapped:  # the model changed: this table must follow it
    raise NotImplementedError(
        "trm/families/trm/torch_import.py does not map every TRM variable: "
        f"unmapped {sorted(ours - mapped)}, stale {sorted(mapped - ours)}.")
  return abstract


def _upstream_shape(entry: _Entry, ours) -> tuple[int, ...]:
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


def _shape_error(entry: _Entry, key: str, where: str, got, want,
                 cfg: trm_model.TRMConfig) -> CheckpointError:
  hints = [f"dimension {d} is {_dim_hint(label, g, w, cfg)}"
           for d, (label, g, w) in enumerate(zip(entry.dims, got, want))
           if g != w]
  if len(got) != len(want):
    hints = [f"expected {len(want)} dimensions, got {len(got)}"]
  layout = " (upstream [out, in] Linear layout)" if entry.transpose else ""
  return CheckpointError(
      f"Tensor {key!r} in {where} has shape {tuple(got)}; config.model "
      f"expects {tuple(want)}{layout}: " + "; ".join(hints) + ".")


def _variant_hints(cfg: trm_model.TRMConfig, names: Mapping[str, Any]
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


def _short(keys, limit=12) -> str:
  keys = sorted(keys)
  more = f" ... ({len(keys) - limit} more)" if len(keys) > limit else ""
  return ", ".join(repr(k) for k in keys[:limit]) + more


# ------------------------------------------------------------------ reading


def _import_torch(purpose: str):
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"{purpose} needs PyTorch, which is not installed: "
                      f"{_INSTALL_TORCH}.") from e
  return torch


def _is_safetensors(path: str) -> bool:
  """safetensors: 8-byte little-endian header size, then a JSON header."""
  with open(path, "rb") as f:
    head = f.read(9)
  if len(head) < 9 or head[8:9] != b"{":
    return False
  return 2 <= int.from_bytes(head[:8], "little") <= os.path.getsize(path) - 8


def _torch_to_numpy(torch, t) -> np.ndarray:
  t = t.detach().cpu().contiguous()
  if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret bits
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
  return t.numpy()


def _check_torch_file(path: str) -> None:
  """`torch.save` writes a zip archive (a pickle before torch 1.6, opening
  with the pickle protocol byte 0x80); anything else is not a checkpoint, and
  torch's own error for it would blame "pickled objects"."""
  with open(path, "rb") as f:
    head = f.read(16)
  # A zip's local header opens it even when the archive is cut short (then
  # torch.load says it is unreadable, which is the right diagnosis).
  if not head.startswith((b"PK\x03\x04", b"\x80")):
    raise CheckpointError(
        f"{path} is not a PyTorch checkpoint: torch.save writes a zip archive"
        f" (or, before torch 1.6, a pickle), and this file starts with "
        f"{head!r}. Pass the .pt/.pth/.bin file that torch.save wrote, or a "
        ".safetensors file.")


def load_weights_only(path: str, purpose: str):
  """(torch, the object in `path`) read with torch.load(weights_only=True):
  tensors and plain containers only, never arbitrary pickled objects."""
  _check_torch_file(path)
  torch = _import_torch(purpose)
  try:
    return torch, torch.load(path, map_location="cpu", weights_only=True)
  except pickle.UnpicklingError as e:
    # torch's message opens with advice to retry with weights_only=False
    # (full unpickling); only its line naming the refused object is kept.
    refused = [line for line in str(e).splitlines()
               if "GLOBAL" in line or "WeightsUnpickler" in line]
    raise CheckpointError(
        f"Refusing to load {path}: torch.load(weights_only=True) rejected it "
        "because it contains pickled Python objects other than tensors and "
        "plain containers, and unpickling those can run arbitrary code. This "
        "importer never uses full pickle. If you trust the file, re-save just "
        "its state_dict (torch.save(sd, ...)) or convert it to .safetensors."
        + (f" torch: {refused[0].strip()}" if refused else "")) from e
  except Exception as e:  # corrupt / truncated / not a torch file
    raise CheckpointError(
        f"{path} is not a readable PyTorch checkpoint (torch.load with "
        f"weights_only=True failed: {type(e).__name__}: {e}).") from e


def _read_torch(path: str) -> dict[str, np.ndarray]:
  torch, obj = load_weights_only(path,
                                 f"Reading the PyTorch checkpoint {path}")
  if not isinstance(obj, Mapping):
    raise CheckpointError(
        f"{path} holds a {type(obj).__name__}, not a state_dict (a mapping of "
        "names to tensors) as upstream pretrain.py saves.")
  out = {}
  for key, value in obj.items():
    if not isinstance(key, str) or not isinstance(value, torch.Tensor):
      raise CheckpointError(
          f"{path} is not a plain state_dict: key {key!r} holds a "
          f"{type(value).__name__}, not a tensor (upstream pretrain.py saves "
          "model.state_dict() alone).")
    out[key] = _torch_to_numpy(torch, value)
  return out


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
  try:
    with safe_open(path, framework="numpy") as f:
      return {key: f.get_tensor(key) for key in f.keys()}
  except Exception as e:  # pylint: disable=broad-except
    raise CheckpointError(f"{path} is not a readable .safetensors file: "
                          f"{type(e).__name__}: {e}") from e


def _read(path: str) -> dict[str, np.ndarray]:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"TRM checkpoint {path} does not exist or is not "
                            "a file.")
  return _read_safetensors(path) if _is_safetensors(path) else _read_torch(
      path)


def _strip(key: str) -> tuple[str, str]:
  """(wrapper prefix, name under the inner model)."""
  parts = key.split(".")
  i = 0
  while i < len(parts) - 1 and parts[i] in _WRAPPERS:
    i += 1
  return "".join(p + "." for p in parts[:i]), ".".join(parts[i:])


def load_torch_checkpoint(path: str, model_cfg: trm_model.TRMConfig):
  """Reads an upstream TRM state_dict file into our variables.

  Args:
    path: a file as upstream `pretrain.py` writes it (`torch.save` of the
      state_dict; read with `weights_only=True`), or a `.safetensors` file of
      the same state_dict (any name; detected by content).
    model_cfg: our `TRMConfig`; every size must match the checkpoint.

  Returns:
    (params, buffers, puzzle_emb) as `TrainState` holds them (unboxed dicts of
    arrays on the default device): params float32, buffers {'H_init',
    'L_init'} in `model_cfg.forward_dtype`, puzzle_emb {'weights': [N, P]}
    float32 or {} when puzzle_emb_ndim is 0. Shard with `jax.device_put`.

  Raises:
    CheckpointError: not a TRM state_dict, missing / unexpected keys, a shape
      that does not match `model_cfg` (naming the key, the file, the expected
      shape and the config field that probably differs), or a file that
      `weights_only` loading refuses.
    ImportError: a PyTorch-format file and no torch installed.
  """
  cfg = model_cfg
  abstract = _abstract(cfg)
  raw = _read(path)
  if not raw:
    raise CheckpointError(f"{path} holds an empty state_dict.")

  names: dict[str, np.ndarray] = {}
  full_key: dict[str, str] = {}
  prefixes = collections.Counter()
  for key, value in raw.items():
    prefix, name = _strip(key)
    prefixes[prefix] += 1
    names[name], full_key[name] = value, key
  if not ("embed_tokens.embedding_weight" in names
          or any(n.startswith("L_level.layers.") for n in names)):
    raise CheckpointError(
        f"{path} is not an upstream TRM checkpoint: none of its {len(raw)} "
        "keys is '[_orig_mod.][model.][inner.]embed_tokens.embedding_weight' "
        f"or '...L_level.layers.*'. Its keys start: {_short(raw, 6)}.")
  if any(n.startswith("H_level.") for n in names):
    raise CheckpointError(
        f"{path} looks like an HRM checkpoint (it has H_level.* as well as "
        "L_level.*); only TRM (one shared L_level network) is supported.")
  if len(prefixes) > 1:
    raise CheckpointError(
        f"{path} mixes key prefixes {sorted(prefixes)}; expected one "
        "state_dict with a single prefix (e.g. '_orig_mod.model.inner.').")
  prefix = next(iter(prefixes))

  entries = _entries(cfg)
  expected = {e.name for e in entries}
  missing = expected - set(names)
  unexpected = set(names) - expected - set(_IGNORED)
  if missing or unexpected:
    parts = []
    if missing:
      parts.append(f"missing keys: {_short(prefix + m for m in missing)}")
    if unexpected:
      parts.append("unexpected keys: "
                   f"{_short(full_key[u] for u in unexpected)}")
    hints = _variant_hints(cfg, names)
    raise CheckpointError(
        f"{path} does not match config.model: " + "; ".join(parts) + "."
        + (" Probably " + "; ".join(hints) + "." if hints else ""))

  variables: dict[str, dict] = {"params": {}, "buffers": {}, "puzzle_emb": {}}
  for entry in entries:
    target = get_path(abstract[entry.collection], entry.path)
    value = names[entry.name]
    want = _upstream_shape(entry, target.shape)
    if tuple(value.shape) != want:
      raise _shape_error(entry, full_key[entry.name], path, value.shape, want,
                         cfg)
    if not np.issubdtype(value.dtype, np.floating) and value.dtype != \
        ml_dtypes.bfloat16:
      raise CheckpointError(
          f"Tensor {full_key[entry.name]!r} in {path} has dtype {value.dtype}"
          "; expected a floating-point tensor.")
    if entry.transpose:
      value = value.T
    value = np.ascontiguousarray(value.astype(target.dtype, copy=False))
    set_path(variables[entry.collection], entry.path, jnp.asarray(value))
  return variables["params"], variables["buffers"], variables["puzzle_emb"]


# ------------------------------------------------------------------ writing


def _to_torch(torch, x: np.ndarray):
  if x.dtype == ml_dtypes.bfloat16:
    return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
  return torch.from_numpy(x)


def export_torch_checkpoint(params, buffers, puzzle_emb,
                            model_cfg: trm_model.TRMConfig, path: str,
                            prefix: str = "_orig_mod.model.") -> list[str]:
  """Writes our variables as an upstream state_dict; returns its keys.

  Keys are `prefix + "inner." + <upstream name>` (module docstring table):
  the default `_orig_mod.model.` is what upstream `pretrain.py`'s
  `load_checkpoint` expects of its torch.compile'd model; use `model.` for
  `DISABLE_COMPILE=1` and `""` for a bare `TinyRecursiveReasoningModel_ACTV1`.
  Params and the puzzle table are written float32, H_init / L_init in
  `model_cfg.forward_dtype` (bfloat16 by default, as upstream creates them).

  `path` ending in `.safetensors` writes safetensors (no torch needed; load
  with `safetensors.torch.load_file`); any other name is written with
  `torch.save` (needs torch), the format upstream `torch.load`s. Arrays must
  be fully addressable (single host); only process 0 writes.
  """
  if prefix and not prefix.endswith("."):
    raise ValueError(f"prefix={prefix!r} must be empty or end with '.'.")
  cfg = model_cfg
  abstract = _abstract(cfg)
  ours = {"params": meta.unbox(params), "buffers": meta.unbox(buffers),
          "puzzle_emb": meta.unbox(puzzle_emb or {})}
  tensors: dict[str, np.ndarray] = {}
  for entry in _entries(cfg):
    where = "/".join((entry.collection,) + entry.path)
    try:
      value = get_path(ours[entry.collection], entry.path)
    except (KeyError, TypeError) as e:
      raise CheckpointError(f"{where} is missing from the variables to "
                            "export (do they belong to config.model?).") from e
    target = get_path(abstract[entry.collection], entry.path)
    value = np.asarray(jax.device_get(value))
    if value.shape != target.shape:
      raise CheckpointError(f"{where} has shape {value.shape}; config.model "
                            f"gives {target.shape}.")
    if entry.transpose:
      value = value.T
    dtype = target.dtype if entry.collection == "buffers" else np.float32
    tensors[prefix + "inner." + entry.name] = np.ascontiguousarray(
        value.astype(dtype))
  if jax.process_index() != 0:
    return list(tensors)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  if path.endswith(".safetensors"):
    save_file(tensors, path, metadata={"format": "pt"})
  else:
    torch = _import_torch(f"Writing the PyTorch checkpoint {path}")
    torch.save(collections.OrderedDict(
        (k, _to_torch(torch, v)) for k, v in tensors.items()), path)
  return list(tensors)
