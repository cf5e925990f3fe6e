"""Reads and writes Dream / DiffuCoder checkpoints in the published HF layout.

The hub layout is `model-0000i-of-0000N.safetensors` + `model.safetensors.index
.json` (or one `model.safetensors`) with PyTorch `[out, in]` Linear weights in
bfloat16, plus `config.json`. Our layout (trm/families/dream/model.py): kernels
`[in, out]`, per-head q/k/v kernels `(D, heads, head_dim)` and o `(heads,
head_dim, D)` (head-major, as upstream's `.view(B, L, heads, head_dim)`), and
per-layer arrays stacked on a leading axis when the layers are scanned.

With shardings, every device shard is built by `jax.make_array_from_callback`
from only its slice of the file (`weights_io.SafetensorsFile.read` with an
index: safetensors' `get_slice`, or a memory map for float8), so no host
reads the whole 15 GB. Nothing is unpickled. Plain float8 weights (F8_E4M3,
F8_E5M2) are cast to the params' dtype like the others; a quantized
checkpoint (config.json's quantization_config, or scale tensors beside the
weights) is refused before any weight is read.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
from typing import Any

from absl import logging
from flax.core import meta
import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np

from trm.core import host_arrays
from trm.core import weights_io
from trm.data import atomic_files
from trm.families.dream import hf_config
from trm.families.dream import hf_layout
from trm.families.dream import model as dream
from trm.families.dream.model import DreamConfig

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2")


class _Files:
  """The tensors of a checkpoint directory, opened lazily, read by slice."""

  def __init__(self, directory: str, stack: contextlib.ExitStack):
    self.directory = directory
    self._stack = stack
    self._handles: dict[str, Any] = {}
    layout = weights_io.weights_layout(directory, SINGLE_FILE, INDEX_FILE)
    if layout == SINGLE_FILE:
      self.weight_map = {name: SINGLE_FILE
                         for name in self._open(SINGLE_FILE).names}
      self.where = os.path.join(directory, SINGLE_FILE)
    elif layout == INDEX_FILE:
      self.weight_map = weights_io.read_index(
          os.path.join(directory, INDEX_FILE))
      self.where = f"{INDEX_FILE} in {directory}"
    else:
      raise weights_io.CheckpointError(
          f"{directory} has neither {INDEX_FILE} nor "
          f"{SINGLE_FILE}.")

  def _open(self, file: str) -> weights_io.SafetensorsFile:
    if file not in self._handles:
      path = os.path.join(self.directory, file)
      if not os.path.exists(path):
        raise weights_io.CheckpointError(
            f"{path} (named in {self.where}) is missing.")
      self._handles[file] = self._stack.enter_context(
          weights_io.SafetensorsFile(path))
    return self._handles[file]

  def file_of(self, name: str) -> str:
    if name not in self.weight_map:
      raise weights_io.CheckpointError(
          f"Tensor {name!r} is missing from the checkpoint "
          f"({self.where}).")
    return os.path.join(self.directory, self.weight_map[name])

  def _file(self, name: str) -> weights_io.SafetensorsFile:
    """The open file the index names for tensor `name`; an index naming a
    file that lacks it is one line."""
    path = self.file_of(name)
    handle = self._open(self.weight_map[name])
    if name not in handle.names:
      raise weights_io.CheckpointError(
          f"Tensor {name!r} is not in {path}, the file {self.where} names "
          "for it; download the checkpoint again.")
    return handle

  def dtype(self, name: str) -> str:
    """The safetensors dtype tag ('BF16', 'F32', 'F8_E4M3', ...)."""
    return self._file(name).dtype(name)

  def shape(self, name: str) -> tuple[int, ...]:
    return self._file(name).shape(name)

  def read(self, name: str, slices: tuple[slice, ...]) -> np.ndarray:
    return self._file(name).read(name, slices)


def _tensor_specs(files: _Files, cfg: DreamConfig, abstract):
  """[(leaf, our shape, HF tensor names)] after checking that every tensor
  exists with the shape `cfg` needs, in a floating dtype (file headers
  only). config.json's `torch_dtype` is not held against the tensors:
  transformers loads such a checkpoint, casting (`_log_cast`)."""
  # Scales beside the weights: quantized, even without a quantization_config.
  weights_io.check_not_quantized(files.weight_map, files.where)
  # The last layer first: a num_hidden_layers beyond the file's layers
  # (10**9) fails here, before a list of every layer's names is built.
  last = f"model.layers.{cfg.num_hidden_layers - 1}.input_layernorm.weight"
  if last not in files.weight_map:
    raise weights_io.CheckpointError(
        f"Tensor {last!r} is missing from the checkpoint ({files.where}): "
        f"num_hidden_layers={cfg.num_hidden_layers} (config.json / "
        "config.model) names more layers than the checkpoint holds; set it "
        "to the checkpoint's layer count.")
  specs = []
  for leaf in hf_layout.leaves(cfg):
    target = weights_io.get_path(abstract, leaf.path)
    layer_shape = target.shape[1:] if leaf.per_layer else target.shape
    want = hf_layout.hf_shape(leaf, layer_shape, cfg)
    names = ([leaf.hf_name.replace("{i}", str(i))
              for i in range(cfg.num_hidden_layers)]
             if leaf.per_layer else [leaf.hf_name])
    for name in names:
      got = files.shape(name)
      if got != want:
        raise weights_io.CheckpointError(
            f"Tensor {name!r} in {files.file_of(name)} has shape {got}; "
            f"the model expects {want} (config.model sizes).")
      kind = files.dtype(name)
      if kind not in _FLOAT_DTYPES:
        raise weights_io.CheckpointError(
            f"Tensor {name!r} in {files.file_of(name)} has dtype {kind}; "
            "weights must be floating point (F32, F16, BF16, F8_E4M3 or "
            "F8_E5M2): convert the tensors and save the checkpoint again.")
    specs.append((leaf, target.shape, names))
  return specs


def _log_cast(files: _Files, specs, torch_dtype, param_dtype) -> None:
  """One log line when config.json's `torch_dtype` is not what the tensors
  are stored in. transformers loads such a checkpoint without a word (every
  tensor is cast to the model's dtype: float32 by default, config.json's
  with dtype="auto"); the tensors are cast here too, to the params' dtype,
  and the line says so."""
  stored = weights_io.SAFETENSORS_TAGS.get(str(torch_dtype)) if torch_dtype else None
  if stored is None:
    return
  other = {}
  for _, _, names in specs:
    for name in names:
      other.setdefault(files.dtype(name), name)
  other.pop(stored, None)
  if other:
    kind, name = sorted(other.items())[0]
    logging.warning(
        "config.json in %s says torch_dtype=%r (%s), but tensors are stored "
        "as %s (first: %r); they are cast to the params' %s, as transformers "
        "casts them.", files.directory, torch_dtype, stored,
        "/".join(sorted(other)), name, np.dtype(param_dtype).name)


def _warn_unused(files: _Files, specs) -> None:
  """One warning naming the checkpoint's tensors the model does not read,
  as transformers' "Some weights ... were not used": config.json's sizes
  already match the model, so these are extras (a rotary buffer, another
  head), not layers the config left out."""
  used = {name for _, _, names in specs for name in names}
  unused = sorted(set(files.weight_map) - used)
  if unused:
    logging.warning("%d tensors in %s are not used by the model: %s%s",
                    len(unused), files.where, ", ".join(unused[:5]),
                    " ..." if len(unused) > 5 else "")


def check_hf_checkpoint(directory: str, cfg: DreamConfig) -> None:
  """Raises CheckpointError unless `directory` is an HF Dream checkpoint
  whose config.json and tensors (names and shapes, from the headers alone)
  fit `cfg`: what `load_hf_checkpoint` checks, without reading weights."""
  hf_config.check_hf_config(directory, cfg)
  abstract = meta.unbox(dream.abstract_params(cfg))
  with contextlib.ExitStack() as stack:
    _tensor_specs(_Files(directory, stack), cfg, abstract)


def load_hf_checkpoint(directory: str, cfg: DreamConfig, shardings=None):
  """Loads an HF Dream checkpoint into our params dict (`variables['params']`).

  shardings: None (arrays on the default device) or a pytree of
  NamedSharding with the params' structure; then each device's shard is read
  from its slice of the files only. Params have `cfg.param_dtype`.
  """
  hf = hf_config.check_hf_config(directory, cfg)
  abstract = meta.unbox(dream.abstract_params(cfg))
  dtype = np.dtype(cfg.param_dtype)
  params: dict = {}
  with contextlib.ExitStack() as stack:
    files = _Files(directory, stack)
    specs = _tensor_specs(files, cfg, abstract)
    _log_cast(files, specs, hf_config.stored_dtype(hf), dtype)
    _warn_unused(files, specs)

    for leaf, shape, names in specs:
      def block(index, leaf=leaf, shape=shape, names=names):
        index = hf_layout.normalize(index, shape)
        if leaf.per_layer:
          layers = range(index[0].start, index[0].stop)
          parts = [
              hf_layout.read_slice(leaf,
                                   lambda s, n=names[i]: files.read(n, s),
                                   index[1:],
                                   cfg.head_dim) for i in layers
          ]
          out = np.stack(parts) if parts else np.zeros(
              (0,) + tuple(s.stop - s.start for s in index[1:]), dtype)
        else:
          out = hf_layout.read_slice(leaf, lambda s: files.read(names[0], s),
                                     index, cfg.head_dim)
        return np.ascontiguousarray(out.astype(dtype))

      if shardings is None:
        value = jnp.asarray(block(tuple(slice(None) for _ in shape)))
      else:
        value = jax.make_array_from_callback(
            shape, weights_io.get_path(shardings, leaf.path), block,
            dtype=dtype)
      weights_io.set_path(params, leaf.path, value)
  return params


def _write_shards(plan, gathered, directory: str, shard_size_bytes: int):
  """(files, weight map, total bytes): `plan`'s tensors, taken from the
  iterator `gathered` in its order, written to shards of at most
  `shard_size_bytes` (a larger tensor alone)."""
  os.makedirs(directory, exist_ok=True)
  nbytes = lambda t: int(np.prod(t[3], dtype=np.int64)) * t[4].itemsize
  shards: list[list] = [[]]
  size = 0
  for entry in plan:
    if shards[-1] and size + nbytes(entry) > shard_size_bytes:
      shards.append([])
      size = 0
    shards[-1].append(entry)
    size += nbytes(entry)
  n = len(shards)
  files = ([SINGLE_FILE] if n == 1 else
           [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
  # A directory that held an export of the other layout keeps its index
  # or its model.safetensors (which transformers and our loader prefer):
  # either could be read in place of these weights.
  stale = os.path.join(directory, INDEX_FILE if n == 1 else SINGLE_FILE)
  if os.path.lexists(stale):
    logging.warning("Removing %s, left by an earlier export: loaders would "
                    "read it instead of the new weights.", stale)
    os.remove(stale)
  weight_map = {}
  total = 0
  for file, shard in zip(files, shards):
    total += weights_io.save_safetensors_streamed(
        os.path.join(directory, file),
        [(name, out_dtype, shape) for name, _, _, shape, out_dtype in shard],
        itertools.islice(gathered, len(shard)), metadata={"format": "pt"})
    weight_map.update({entry[0]: file for entry in shard})
  return files, weight_map, total


def export_hf_checkpoint(params, cfg: DreamConfig, directory: str,
                         shard_size_bytes: int = 5 * 1024**3,
                         dtype: str | None = None,
                         source_fields: dict | None = None) -> list[str]:
  """Writes `params` in the HF layout; returns the tensor files written.

  dtype: stored dtype ('bfloat16' as on the hub, 'float32'); default the
  params' own. source_fields: the fine-tuned checkpoint's bos/eos ids and
  position limit (`hf_config.fields_from_source`). Writes config.json and
  generation_config.json beside the tensors (Dream's
  `DreamModel.from_pretrained` reads both). One file is
  `model.safetensors`; more are `model-0000i-of-0000N.safetensors` with an
  index. Every process must
  call it (as `trm.export` does on each host): an array sharded over
  several processes is gathered one tensor at a time, and process 0, the
  only one that keeps the values, writes the files.

  The host holds one HF tensor at a time (one layer's slice of a scanned
  param): the shards are planned from the params' shapes, and each tensor
  is gathered, converted and written in turn (all of them, 15 GB for the
  7B, were held before the first file was written). Each file is written
  to a temp file and renamed, the index and configs after every shard: an
  export cut short has no index or config.json naming missing shards.
  """
  writer = jax.process_index() == 0
  # (HF name, leaf, layer or None, HF shape, stored dtype) in HF order:
  # embeddings, layers in order, final norm, lm_head.
  order = {name: i for i, name in enumerate(
      ["model.embed_tokens.weight"]
      + [leaf.hf_name.replace("{i}", str(i))
         for i in range(cfg.num_hidden_layers) for leaf in hf_layout.leaves(
             dataclasses.replace(cfg, scan_layers=True)) if leaf.per_layer]
      + ["model.norm.weight", "lm_head.weight"])}
  plan = []
  for leaf in hf_layout.leaves(cfg):
    value = weights_io.get_path(params, leaf.path)
    out_dtype = np.dtype(dtype) if dtype else np.dtype(value.dtype)
    if leaf.per_layer:
      shape = hf_layout.hf_shape(leaf, value.shape[1:], cfg)
      plan += [(leaf.hf_name.replace("{i}", str(i)), leaf, i, shape,
                out_dtype) for i in range(value.shape[0])]
    else:
      plan.append((leaf.hf_name, leaf, None,
                   hf_layout.hf_shape(leaf, value.shape, cfg), out_dtype))
  plan.sort(key=lambda t: order[t[0]])

  def values(entries):
    """Each entry's tensor in the HF layout, gathered when asked for."""
    for name, leaf, layer, _, out_dtype in entries:
      value = weights_io.get_path(params, leaf.path)
      value = host_arrays.whole(value if layer is None else value[layer])
      yield weights_io.cast_for_export(name, hf_layout.to_hf(leaf, value),
                                       out_dtype)

  gathered = values(plan)
  if not writer:  # the gathers are collective; only process 0 keeps them
    for _ in gathered:
      pass
    return []
  try:
    files, weight_map, total = _write_shards(plan, gathered, directory,
                                             shard_size_bytes)
  except Exception:
    # The other processes are still gathering (each tensor is a collective
    # all of them join): a failed write (a full disk) would leave them
    # waiting on process 0. It takes part in the rest, then raises.
    try:
      for _ in gathered:
        pass
    except Exception:  # pylint: disable=broad-except
      pass  # the gather itself failed: the first error is the one to show
    raise

  def write_json(name, value, **kwargs):
    atomic_files.atomic_write(
        os.path.join(directory, name),
        lambda f: json.dump(value, f, indent=2, **kwargs), mode="w")

  if len(files) > 1:
    write_json(INDEX_FILE, {"metadata": {"total_size": total},
                            "weight_map": weight_map}, sort_keys=True)
  write_json(hf_config.CONFIG_FILE,
             hf_config.hf_config_dict(cfg, plan[0][4].name, source_fields))
  write_json(hf_config.GENERATION_CONFIG_FILE,
             hf_config.hf_generation_config_dict(cfg, source_fields))
  return files
