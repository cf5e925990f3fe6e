"""Reads and writes Dream / DiffuCoder checkpoints in the published HF layout.

The hub layout is `model-0000i-of-0000N.safetensors` + `model.safetensors.index
.json` (or one `model.safetensors`) with PyTorch `[out, in]` Linear weights in
bfloat16, plus `config.json`. Our layout (trm/families/dream/model.py): kernels
`[in, out]`, per-head q/k/v kernels `(D, heads, head_dim)` and o `(heads,
head_dim, D)` (head-major, as upstream's `.view(B, L, heads, head_dim)`), and
per-layer arrays stacked on a leading axis when the layers are scanned.

With shardings, every device shard is built by `jax.make_array_from_callback`
from only its slice of the file (`safe_open(...).get_slice`), so no host reads
the whole 15 GB. Files are read with `framework="numpy"` (safetensors 0.8
returns ml_dtypes bfloat16); nothing is unpickled.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from typing import Any, Callable

from flax.core import meta
import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from trm.families.dream import model as dream
from trm.families.dream.model import DreamConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

# config.json key -> DreamConfig field (the same names upstream).
_CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "rope_theta", "rms_norm_eps",
                  "mask_token_id", "pad_token_id")


_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_SAFETENSORS_DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32",
                       "float64": "F64"}


class CheckpointError(ValueError):
  """A checkpoint that does not match the model or the HF layout."""


@dataclasses.dataclass(frozen=True)
class _Leaf:
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


def _leaves(cfg: DreamConfig) -> list[_Leaf]:
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
  out = [_Leaf(("embed_tokens",), "model.embed_tokens.weight", "copy", False)]
  if cfg.scan_layers:
    out += [_Leaf(("layers",) + path, name, kind, True)
            for path, name, kind in layer]
  else:
    for i in range(cfg.num_hidden_layers):
      out += [_Leaf((f"layers_{i}",) + path, name.replace("{i}", str(i)), kind,
                    False) for path, name, kind in layer]
  out += [_Leaf(("norm", "scale"), "model.norm.weight", "copy", False),
          _Leaf(("lm_head", "kernel"), "lm_head.weight", "linear", False)]
  return out


def _our_shape(leaf: _Leaf, hf_shape, cfg: DreamConfig) -> tuple[int, ...]:
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


def _hf_shape(leaf: _Leaf, ours, cfg: DreamConfig) -> tuple[int, ...]:
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


def _read_slice(leaf: _Leaf, read: Callable, index: tuple[slice, ...],
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


def _to_hf(leaf: _Leaf, x: np.ndarray) -> np.ndarray:
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


def _normalize(index, shape) -> tuple[slice, ...]:
  out = []
  for s, dim in zip(tuple(index) + (slice(None),) * (len(shape) - len(index)),
                    shape):
    start, stop, step = s.indices(dim)
    if step != 1:
      raise ValueError(f"strided shard index {s} is not supported")
    out.append(slice(start, stop))
  return tuple(out)


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is not valid JSON ({e}); download it "
                          "again.") from e


def check_shard_names(weight_map: dict, directory: str, index: str) -> None:
  """Every file an index names must lie inside the checkpoint directory: a
  name like '../x' or '/abs/x' would read tensors from elsewhere."""
  root = os.path.realpath(directory)
  for file in sorted(set(weight_map.values())):
    target = os.path.realpath(os.path.join(directory, str(file)))
    if (not isinstance(file, str) or os.path.isabs(file)
        or not target.startswith(root + os.sep)):
      raise CheckpointError(
          f"{index} names the weight file {file!r}, which lies outside "
          f"{directory}; an index may only name files inside its own "
          "directory. Download the checkpoint again.")


def _read_index(path: str) -> dict:
  index = _read_json(path)
  if not isinstance(index, dict) or not isinstance(index.get("weight_map"),
                                                   dict):
    raise CheckpointError(f"{path} has no \"weight_map\" object (tensor name ->"
                          " file); download it again.")
  check_shard_names(index["weight_map"], os.path.dirname(path), path)
  return dict(index["weight_map"])


class _Files:
  """The tensors of a checkpoint directory, opened lazily, read by slice."""

  def __init__(self, directory: str, stack: contextlib.ExitStack):
    self.directory = directory
    self._stack = stack
    self._handles: dict[str, Any] = {}
    index_path = os.path.join(directory, INDEX_FILE)
    single = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
      self.weight_map = _read_index(index_path)
      self.where = f"{INDEX_FILE} in {directory}"
    elif os.path.exists(single):
      self.weight_map = {name: SINGLE_FILE
                         for name in self._open(SINGLE_FILE).keys()}
      self.where = single
    else:
      raise CheckpointError(f"{directory} has neither {INDEX_FILE} nor "
                            f"{SINGLE_FILE}.")

  def _open(self, file: str):
    if file not in self._handles:
      path = os.path.join(self.directory, file)
      if not os.path.exists(path):
        raise CheckpointError(f"{path} (named in {self.where}) is missing.")
      try:
        handle = safe_open(path, framework="numpy")
      except Exception as e:  # pylint: disable=broad-except
        raise CheckpointError(
            f"{path} is not a readable .safetensors file ({type(e).__name__}:"
            f" {e}); download it again.") from e
      self._handles[file] = self._stack.enter_context(handle)
    return self._handles[file]

  def file_of(self, name: str) -> str:
    if name not in self.weight_map:
      raise CheckpointError(f"Tensor {name!r} is missing from the checkpoint "
                            f"({self.where}).")
    return os.path.join(self.directory, self.weight_map[name])

  def dtype(self, name: str) -> str:
    """The safetensors dtype tag ('BF16', 'F32', 'I32', ...)."""
    self.file_of(name)
    return str(self._open(self.weight_map[name]).get_slice(name).get_dtype())

  def shape(self, name: str) -> tuple[int, ...]:
    self.file_of(name)
    return tuple(self._open(self.weight_map[name]).get_slice(name).get_shape())

  def read(self, name: str, slices: tuple[slice, ...]) -> np.ndarray:
    self.file_of(name)
    return np.asarray(
        self._open(self.weight_map[name]).get_slice(name)[slices])


def check_hf_config(directory: str, cfg: DreamConfig) -> dict:
  """Checks config.json against `cfg`; returns it. Errors name the field."""
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.exists(path):
    raise CheckpointError(f"{path} is missing.")
  hf = _read_json(path)
  if not isinstance(hf, dict):
    raise CheckpointError(f"{path} holds a {type(hf).__name__}, not the "
                          "model's config object.")
  for field in _CONFIG_FIELDS:
    if hf.get(field) is None:  # Qwen2 configs have no mask_token_id
      continue
    ours = getattr(cfg, field)
    ok = (math.isclose(float(hf[field]), float(ours), rel_tol=1e-9)
          if isinstance(ours, float) else hf[field] == ours)
    if not ok:
      raise CheckpointError(
          f"{path}: {field}={hf[field]!r} does not match "
          f"config.model.{field}={ours!r}.")
  # Architecture switches the port does not implement must be off.
  for field, want in (("tie_word_embeddings", False), ("rope_scaling", None),
                      ("use_sliding_window", False), ("hidden_act", "silu")):
    if field in hf and hf[field] != want and not (want is False
                                                  and hf[field] is None):
      raise CheckpointError(f"{path}: {field}={hf[field]!r} is not supported "
                            f"(expected {want!r}).")
  if hf.get("head_dim") not in (None, cfg.head_dim):
    raise CheckpointError(f"{path}: head_dim={hf['head_dim']} does not match "
                          f"config.model.hidden_size / num_attention_heads = "
                          f"{cfg.head_dim}.")
  return hf


def get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def set_path(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _tensor_specs(files: _Files, cfg: DreamConfig, abstract,
                  torch_dtype: str | None = None):
  """[(leaf, our shape, HF tensor names)] after checking that every tensor
  exists with the shape `cfg` needs, in a floating dtype, and in
  config.json's `torch_dtype` when it names one (file headers only)."""
  stored = _SAFETENSORS_DTYPES.get(str(torch_dtype)) if torch_dtype else None
  specs = []
  for leaf in _leaves(cfg):
    target = get_path(abstract, leaf.path)
    layer_shape = target.shape[1:] if leaf.per_layer else target.shape
    want = _hf_shape(leaf, layer_shape, cfg)
    names = ([leaf.hf_name.replace("{i}", str(i))
              for i in range(cfg.num_hidden_layers)]
             if leaf.per_layer else [leaf.hf_name])
    for name in names:
      got = files.shape(name)
      if got != want:
        raise CheckpointError(
            f"Tensor {name!r} in {files.file_of(name)} has shape {got}; "
            f"the model expects {want} (config.model sizes).")
      kind = files.dtype(name)
      if kind not in _FLOAT_DTYPES or (stored and kind != stored):
        raise CheckpointError(
            f"Tensor {name!r} in {files.file_of(name)} has dtype {kind}; "
            + (f"config.json says torch_dtype={torch_dtype!r} ({stored})."
               if kind in _FLOAT_DTYPES else
               "weights must be floating point (F16, BF16 or F32): an "
               "integer or bool tensor would load as garbage."))
    specs.append((leaf, target.shape, names))
  return specs


def check_hf_checkpoint(directory: str, cfg: DreamConfig) -> None:
  """Raises CheckpointError unless `directory` is an HF Dream checkpoint
  whose config.json and tensors (names and shapes, from the headers alone)
  fit `cfg`: what `load_hf_checkpoint` checks, without reading weights."""
  hf = check_hf_config(directory, cfg)
  abstract = meta.unbox(dream.abstract_params(cfg))
  with contextlib.ExitStack() as stack:
    _tensor_specs(_Files(directory, stack), cfg, abstract,
                  hf.get("torch_dtype"))


def load_hf_checkpoint(directory: str, cfg: DreamConfig, shardings=None):
  """Loads an HF Dream checkpoint into our params dict (`variables['params']`).

  shardings: None (arrays on the default device) or a pytree of
  NamedSharding with the params' structure; then each device's shard is read
  from its slice of the files only. Params have `cfg.param_dtype`.
  """
  hf = check_hf_config(directory, cfg)
  abstract = meta.unbox(dream.abstract_params(cfg))
  dtype = np.dtype(cfg.param_dtype)
  params: dict = {}
  with contextlib.ExitStack() as stack:
    files = _Files(directory, stack)
    specs = _tensor_specs(files, cfg, abstract, hf.get("torch_dtype"))

    for leaf, shape, names in specs:
      def block(index, leaf=leaf, shape=shape, names=names):
        index = _normalize(index, shape)
        if leaf.per_layer:
          layers = range(index[0].start, index[0].stop)
          parts = [_read_slice(leaf, lambda s, n=names[i]: files.read(n, s),
                               index[1:], cfg.head_dim) for i in layers]
          out = np.stack(parts) if parts else np.zeros(
              (0,) + tuple(s.stop - s.start for s in index[1:]), dtype)
        else:
          out = _read_slice(leaf, lambda s: files.read(names[0], s), index,
                            cfg.head_dim)
        return np.ascontiguousarray(out.astype(dtype))

      if shardings is None:
        value = jnp.asarray(block(tuple(slice(None) for _ in shape)))
      else:
        value = jax.make_array_from_callback(
            shape, get_path(shardings, leaf.path), block, dtype=dtype)
      set_path(params, leaf.path, value)
  return params


def hf_config_dict(cfg: DreamConfig, torch_dtype: str) -> dict:
  """config.json contents for an exported checkpoint (Dream's fields)."""
  out = {
      "architectures": ["DreamModel"],
      "model_type": "Dream",
      "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                   "AutoModel": "modeling_dream.DreamModel"},
      "hidden_act": "silu",
      "tie_word_embeddings": False,
      "rope_scaling": None,
      "use_sliding_window": False,
      "sliding_window": None,
      "attention_dropout": 0.0,
      "use_cache": False,
      "bos_token_id": cfg.pad_token_id,
      "eos_token_id": cfg.pad_token_id,
      # DiffuCoder's value (RoPE has no hard limit; Dream trained at 2048).
      "max_position_embeddings": 131072,
      "torch_dtype": torch_dtype,
  }
  out.update({field: getattr(cfg, field) for field in _CONFIG_FIELDS})
  return out


def export_hf_checkpoint(params, cfg: DreamConfig, directory: str,
                         shard_size_bytes: int = 5 * 1024**3,
                         dtype: str | None = None) -> list[str]:
  """Writes `params` in the HF layout; returns the tensor files written.

  dtype: stored dtype ('bfloat16' as on the hub, 'float32'); default the
  params' own. One file is `model.safetensors`; more are
  `model-0000i-of-0000N.safetensors` with an index. Single-host: every
  array is fetched whole.
  """
  os.makedirs(directory, exist_ok=True)
  tensors: list[tuple[str, np.ndarray]] = []
  for leaf in _leaves(cfg):
    value = np.asarray(jax.device_get(get_path(params, leaf.path)))
    out_dtype = np.dtype(dtype) if dtype else value.dtype
    if leaf.per_layer:
      items = [(leaf.hf_name.replace("{i}", str(i)), _to_hf(leaf, value[i]))
               for i in range(value.shape[0])]
    else:
      items = [(leaf.hf_name, _to_hf(leaf, value))]
    tensors += [(n, np.ascontiguousarray(x.astype(out_dtype)))
                for n, x in items]
  # HF order: embeddings, layers in order, final norm, lm_head.
  order = {name: i for i, name in enumerate(
      ["model.embed_tokens.weight"]
      + [leaf.hf_name.replace("{i}", str(i))
         for i in range(cfg.num_hidden_layers) for leaf in _leaves(
             dataclasses.replace(cfg, scan_layers=True)) if leaf.per_layer]
      + ["model.norm.weight", "lm_head.weight"])}
  tensors.sort(key=lambda t: order[t[0]])
  shards: list[list[tuple[str, np.ndarray]]] = [[]]
  size = 0
  for name, x in tensors:
    if shards[-1] and size + x.nbytes > shard_size_bytes:
      shards.append([])
      size = 0
    shards[-1].append((name, x))
    size += x.nbytes
  n = len(shards)
  if jax.process_index() != 0:
    return []
  os.makedirs(directory, exist_ok=True)
  files = ([SINGLE_FILE] if n == 1 else
           [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
  weight_map = {}
  for file, shard in zip(files, shards):
    save_file(dict(shard), os.path.join(directory, file),
              metadata={"format": "pt"})
    weight_map.update({name: file for name, _ in shard})
  if n > 1:
    with open(os.path.join(directory, INDEX_FILE), "w") as f:
      json.dump({"metadata": {"total_size": sum(x.nbytes for _, x in tensors)},
                 "weight_map": weight_map}, f, indent=2, sort_keys=True)
  stored = str(np.dtype(dtype) if dtype else tensors[0][1].dtype)
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(hf_config_dict(cfg, stored), f, indent=2)
  return files
