"""Checkpoint-file helpers shared by the weight importers of every family.

The importers (`trm.families.trm.torch_import`, `trm.families.gpt.gpt_import`,
`trm.families.dream.hf_import`) read PyTorch state_dicts, .safetensors files
and Hugging Face index files; this module holds what they have in common:
one error type, nested-dict paths, JSON and shard-index reading,
pickle-free reading of torch and safetensors files (float8 included), and
the refusal of quantized checkpoints.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile

from absl import logging
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from trm.data import atomic_files
from trm.data import io as data_io

class CheckpointError(ValueError):
  """A checkpoint that does not match the model or the HF layout."""


# A checkpoint's config or index JSON is kilobytes (a sharded 70B index is
# about 100 KB); anything far larger is not one, and is refused unread.
MAX_JSON_BYTES = 64 * 2**20


def read_json(path: str, fix: str = ""):
  """The JSON object in `path`, a checkpoint's config or index; each
  refusal names the file and ends in `fix` (default: download again)."""
  data_io.check_regular_file(path, fix or "download the checkpoint again")
  fix = fix or "download it again"
  size = os.path.getsize(path)
  if size > MAX_JSON_BYTES:
    raise CheckpointError(f"{path} is {size:,} bytes, no checkpoint config "
                          f"or index (at most {MAX_JSON_BYTES:,}); {fix}.")
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is not valid JSON ({e}); {fix}.") from e
  except (RecursionError, ValueError) as e:  # nesting, 4300+ digit ints
    raise CheckpointError(f"{path} is no checkpoint JSON ({type(e).__name__}"
                          f": {str(e)[:200]}); {fix}.") from None


def check_local(path: str, name: str,
                what: str = "Hugging Face weights are") -> None:
  """Refuses an object-store path (`gs://...`) for Hugging Face weights (or
  `what` else), naming the setting `name`: they are read by slice through
  the local file system on every worker (safetensors' reader takes file
  paths; Orbax, which reads gs:// for trm.main's own checkpoints, does not
  read this format, and the run's config.json and checkpoint metadata
  are read with os). Said as "no directory" before, which did not say
  what to do."""
  if "://" in str(path):
    raise CheckpointError(
        f"{name}={path!r} is an object-store path; {what} read from a local "
        "disk, on every worker. Copy the directory to the same local path "
        f"on each worker (e.g. gcloud storage cp -r {path} DIR) and pass "
        f"{name}=DIR.")


def check_shard_names(weight_map: dict, directory: str, index: str) -> None:
  """Every file an index names must be a plain name inside the checkpoint
  directory: a name like '../x' or '/abs/x' would read tensors from
  elsewhere. The check is on the names, not on where the files resolve to:
  a Hugging Face cache snapshot holds its files as symbolic links into the
  cache's blobs/ directory, and those are the checkpoint's own files."""
  if not isinstance(weight_map, dict):
    raise CheckpointError(
        f"{index}: its \"weight_map\" is a {type(weight_map).__name__}, not "
        "an object (tensor name -> file); download it again.")
  root = os.path.normpath(os.path.abspath(directory))
  for file in weight_map.values():
    if not isinstance(file, str) or not file:
      raise CheckpointError(
          f"{index} maps a tensor to {file!r}, which is not a file name; "
          "its weight_map must map tensor names to file names. Download the "
          "checkpoint again.")
  for file in sorted(set(weight_map.values())):
    target = os.path.normpath(os.path.join(root, file))
    if os.path.isabs(file) or not target.startswith(root + os.sep):
      raise CheckpointError(
          f"{index} names the weight file {file!r}, which lies outside "
          f"{directory}; an index may only name files inside its own "
          "directory. Download the checkpoint again.")


def weights_layout(directory: str, single: str, index: str,
                   warn: bool = True) -> str | None:
  """Which weight layout of a Hugging Face directory to read: `single`
  (model.safetensors) where it exists, as transformers' from_pretrained
  reads it, with a warning (if `warn`) when `index` lies beside it
  (preferring the index loaded other weights here than in transformers);
  else `index` where it exists; else None."""
  if os.path.exists(os.path.join(directory, single)):
    if warn and os.path.exists(os.path.join(directory, index)):
      logging.warning("%s holds both %s and %s; reading %s, as transformers "
                      "does (the index and the shards it names are "
                      "ignored).", directory, single, index, single)
    return single
  if os.path.exists(os.path.join(directory, index)):
    return index
  return None


def read_index(path: str) -> dict:
  index = read_json(path)
  if not isinstance(index, dict) or not isinstance(index.get("weight_map"),
                                                   dict):
    raise CheckpointError(f"{path} has no \"weight_map\" object (tensor name ->"
                          " file); download it again.")
  check_shard_names(index["weight_map"], os.path.dirname(path), path)
  return dict(index["weight_map"])

def get_path(tree, path):
  for key in path:
    tree = tree[key]
  return tree


def set_path(tree, path, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value
_INSTALL_TORCH = ("pip install torch (CPU wheels suffice), or convert the "
                  "file to .safetensors, which needs no torch")

def import_torch(purpose: str):
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"{purpose} needs PyTorch, which is not installed: "
                      f"{_INSTALL_TORCH}.") from e
  return torch


def is_safetensors(path: str) -> bool:
  """safetensors: 8-byte little-endian header size, then a JSON header.
  The size is not held to the file's: a file cut short inside its header
  is a damaged .safetensors file, which its reader names as such (it was
  called "not a PyTorch checkpoint", and told to pass a .safetensors
  file)."""
  with open(path, "rb") as f:
    head = f.read(9)
  # A torch.save zip or pickle (`check_torch_file`) never has "{" there.
  return (len(head) == 9 and head[8:9] == b"{"
          and not head.startswith((b"PK\x03\x04", b"\x80")))


# Dtypes numpy lacks, held as ml_dtypes' types: torch's name -> numpy dtype.
# Their bits are reinterpreted (torch's .numpy() refuses them).
_TORCH_VIA_BITS = {"bfloat16": np.dtype(ml_dtypes.bfloat16),
                   "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
                   "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2)}
# safetensors' float8 tags (F8_E4M3 is torch's float8_e4m3fn, as in
# safetensors.torch): safetensors' numpy reader (0.8) looks these dtypes up on
# numpy itself, which has none ("module 'numpy' has no attribute
# 'float8_e4m3fn'"), so `SafetensorsFile` reads them through the header.
FLOAT8 = {"F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
          "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2)}
# The tags safetensors' numpy reader returns (BF16 once ml_dtypes, imported
# above, has registered bfloat16 with numpy).
_NUMPY_READS = ("F64", "F32", "F16", "BF16", "I64", "U64", "I32", "U32",
                "I16", "U16", "I8", "U8", "BOOL", "C64")
_WEIGHT_DTYPES = "float32, float16, bfloat16 or float8 (e4m3fn, e5m2)"


def is_float_tag(tag: str) -> bool:
  """A safetensors dtype tag of a floating-point tensor ('F32', 'BF16',
  'F8_E4M3', ...; also the ones this loader cannot read, which `read`
  refuses by name)."""
  return tag.startswith(("F", "BF"))


def is_float(dtype) -> bool:
  """A floating-point dtype: numpy's, or ml_dtypes' bfloat16 / float8, which
  numpy does not count as np.floating."""
  dtype = np.dtype(dtype)
  return (np.issubdtype(dtype, np.floating)
          or dtype in _TORCH_VIA_BITS.values())


def torch_to_numpy(torch, t, name: str, where: str) -> np.ndarray:
  """Tensor `name` of the file `where` as numpy (bfloat16 and float8 as
  ml_dtypes' types); a dtype numpy cannot hold (complex32, float8_e8m0fnu)
  is one CheckpointError naming both."""
  t = t.detach().cpu().contiguous()
  ours = _TORCH_VIA_BITS.get(str(t.dtype).removeprefix("torch."))
  if ours is not None:
    bits = torch.int16 if ours.itemsize == 2 else torch.uint8
    return t.view(bits).numpy().view(ours)
  try:
    return t.numpy()
  except TypeError as e:  # "Got unsupported ScalarType ComplexHalf"
    raise CheckpointError(
        f"Tensor {name!r} in {where} has dtype {t.dtype}, which numpy cannot "
        f"hold; weights must be {_WEIGHT_DTYPES}: convert the checkpoint's "
        "tensors (tensor.float()) and save it again.") from e


def check_torch_file(path: str) -> bool:
  """`torch.save` writes a zip archive (a pickle before torch 1.6, opening
  with the pickle protocol byte 0x80); anything else is not a checkpoint, and
  torch's own error for it would blame "pickled objects". True for a zip."""
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
  if head.startswith(b"PK"):
    check_torch_members(path)
    return True
  return False


def check_torch_members(path: str) -> None:
  """torch.save stores its archive's members uncompressed; torch.load
  unpacks a compressed one whole into memory before it checks its size,
  so a few megabytes of deflated zeros (a zip bomb) took gigabytes, or the
  process, with no message."""
  try:
    with zipfile.ZipFile(path) as archive:
      members = archive.infolist()
  except (zipfile.BadZipFile, OSError, ValueError):
    return  # cut short or damaged: torch.load's error says it is unreadable
  for member in members:
    if member.compress_type != zipfile.ZIP_STORED:
      raise CheckpointError(
          f"{path} is no archive torch.save wrote: its member "
          f"{member.filename!r} is compressed ({member.file_size:,} bytes "
          f"packed into {member.compress_size:,}), which torch.load would "
          "unpack whole into memory first. Re-save the state_dict with "
          "torch.save, or convert it to .safetensors.")


# torch.load(weights_only=True) before torch 2.6 runs code a crafted file
# carries (CVE-2025-32434); transformers refuses those versions likewise.
SAFE_TORCH_LOAD = (2, 6)


def check_safe_torch_load(torch, path: str) -> None:
  """Refuses a torch whose weights-only unpickler a crafted file escapes
  (torch is an optional, unpinned dependency: a user may have any)."""
  version = str(torch.__version__)
  try:
    major, minor = (int(part) for part in version.split(".")[:2])
  except ValueError:
    return  # a source build's odd version: cannot tell, as transformers
  if (major, minor) < SAFE_TORCH_LOAD:
    raise CheckpointError(
        f"Refusing to load {path} with torch {version}: its "
        "torch.load(weights_only=True) can run code hidden in a crafted file "
        "(CVE-2025-32434). Upgrade torch to 2.6 or later (pip install -U "
        "torch), or convert the file to .safetensors, which needs no torch.")


def load_weights_only(path: str, purpose: str, mmap: bool = False):
  """(torch, the object in `path`) read with torch.load(weights_only=True):
  tensors and plain containers only, never arbitrary pickled objects.
  `mmap`: tensors of a zip archive (torch.save's format since 1.6) are
  mapped, not read, until used (a legacy pickle file is read whole)."""
  zipped = check_torch_file(path)
  torch = import_torch(purpose)
  check_safe_torch_load(torch, path)
  try:
    return torch, torch.load(path, map_location="cpu", weights_only=True,
                             mmap=mmap and zipped)
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


ALLOW_NONFINITE_HINT = "allow_nonfinite=True"


def nonfinite_count(array) -> int:
  """How many NaN or Inf values a floating-point array holds (0 for integer
  and bool arrays). numpy arrays, including ml_dtypes' bfloat16 and
  float8."""
  array = np.asarray(array)
  if not (is_float(array.dtype)
          or np.issubdtype(array.dtype, np.complexfloating)):
    return 0
  return int(array.size - np.count_nonzero(np.isfinite(array)))


def nonfinite_error(name: str, where: str, bad: int, total: int,
                    allow_hint: str = ALLOW_NONFINITE_HINT
                    ) -> "CheckpointError":
  """The one-line refusal of tensor `name` of `where` holding `bad` NaN or
  Inf values out of `total`."""
  return CheckpointError(
      f"Tensor {name!r} in {where} holds {bad} NaN or Inf value(s) (of "
      f"{total}): the weights are corrupt or diverged, and a model loaded "
      "from them would only produce NaN. Re-export or download the "
      f"checkpoint again, or pass {allow_hint} to load it anyway.")


def check_finite(name: str, array, where: str, allow_nonfinite: bool = False,
                 allow_hint: str = ALLOW_NONFINITE_HINT) -> None:
  """Raises CheckpointError (see `nonfinite_error`) if `array` holds NaN or
  Inf, unless `allow_nonfinite`."""
  if allow_nonfinite:
    return
  bad = nonfinite_count(array)
  if bad:
    raise nonfinite_error(name, where, bad, int(np.size(array)), allow_hint)


def check_finite_tree(tree, where: str, allow_nonfinite: bool = False,
                      allow_hint: str = ALLOW_NONFINITE_HINT,
                      prefix: str = "") -> None:
  """`check_finite` on every array of a nested dict of numpy arrays, naming
  each by its '/'-joined path."""
  if allow_nonfinite:
    return
  if isinstance(tree, dict):
    for key in tree:
      check_finite_tree(tree[key], where, allow_nonfinite, allow_hint,
                        f"{prefix}{key}/")
    return
  check_finite(prefix.rstrip("/"), tree, where, allow_nonfinite, allow_hint)


class SafetensorsFile:
  """An open .safetensors file: safetensors' numpy reader (nothing
  unpickled), plus the float8 tensors it cannot return, read from the
  byte range the file's header gives them. Use as a context manager."""

  def __init__(self, path: str):
    self.path = path
    # safe_open of a FIFO blocks until a writer opens it (a hang, not an
    # error); a directory or device is no weight file either.
    try:
      data_io.check_regular_file(path, "download the checkpoint again")
    except ValueError as e:
      raise CheckpointError(str(e)) from None
    try:
      self._handle = safe_open(path, framework="numpy")
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(
          f"{path} is not a readable .safetensors file ({type(e).__name__}: "
          f"{e}); download it again.") from e
    self.names = tuple(self._handle.keys())
    self._header = None

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    return self._handle.__exit__(*exc_info)

  def dtype(self, name: str) -> str:
    """The safetensors dtype tag ('BF16', 'F32', 'F8_E4M3', ...)."""
    return str(self._handle.get_slice(name).get_dtype())

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._handle.get_slice(name).get_shape())

  def read(self, name: str, index=None) -> np.ndarray:
    """Tensor `name`, or its `index` (a tuple of slices) only."""
    kind = self.dtype(name)
    if kind in FLOAT8:
      whole = self._float8(name, FLOAT8[kind])
      return np.array(whole if index is None else whole[index])
    if kind not in _NUMPY_READS:
      raise CheckpointError(
          f"Tensor {name!r} in {self.path} has dtype {kind}, which this "
          f"loader cannot read; weights must be {_WEIGHT_DTYPES}: convert "
          "the checkpoint's tensors and save it again.")
    if index is None:
      return self._handle.get_tensor(name)
    return np.asarray(self._handle.get_slice(name)[index])

  def _float8(self, name: str, dtype: np.dtype) -> np.ndarray:
    """A read-only memory map of float8 tensor `name` (so a slice reads
    only its own bytes); safe_open has already checked the header."""
    header, start = self._read_header()
    shape = tuple(header[name]["shape"])
    begin, end = header[name]["data_offsets"]
    size = int(np.prod(shape, dtype=np.int64))
    if end - begin != size * dtype.itemsize:
      raise CheckpointError(
          f"Tensor {name!r} in {self.path}: its header gives {end - begin} "
          f"bytes for shape {shape}; download the file again.")
    if not size:  # mmap cannot map 0 bytes
      return np.zeros(shape, dtype)
    return np.memmap(self.path, dtype=dtype, mode="r", offset=start + begin,
                     shape=(size,)).reshape(shape)

  def _read_header(self) -> tuple[dict, int]:
    """(the JSON header, where the tensor data starts)."""
    if self._header is None:
      with open(self.path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        self._header = (json.loads(f.read(size)), 8 + size)
    return self._header


def cast_for_export(name: str, value: np.ndarray, dtype) -> np.ndarray:
  """`value` (tensor `name`) as the stored `dtype`. A finite weight the
  narrower dtype cannot hold (above float16's 65504) is refused in one line
  naming the tensor, its largest magnitude, the dtype's limit and the
  dtypes that hold it: numpy stores it as Inf (float8 as NaN) with a
  warning, and every loader then refused the export as "corrupt or
  diverged"."""
  dtype = np.dtype(dtype)
  with np.errstate(over="ignore"):
    out = value.astype(dtype, copy=False)
  if out is value or not (is_float(dtype) and is_float(value.dtype)):
    return out
  # Only a dtype with fewer exponent bits (float16 from float32) overflows;
  # bfloat16 keeps float32's, so the default export pays no extra pass.
  if (ml_dtypes.finfo(dtype).maxexp >= ml_dtypes.finfo(value.dtype).maxexp
      or np.isfinite(out).all()):
    return out
  overflowed = ~np.isfinite(out) & np.isfinite(value)
  if not overflowed.any():  # NaN or Inf already: the loaders' check
    return out
  peak = float(np.max(np.abs(value[overflowed].astype(np.float64))))
  holds = [other for other in ("bfloat16", "float32")
           if float(ml_dtypes.finfo(other).max) >= peak] or ["float64"]
  raise CheckpointError(
      f"Tensor {name!r} has a weight of magnitude {peak:.6g}, above "
      f"{dtype.name}'s largest value {float(ml_dtypes.finfo(dtype).max):.6g}"
      f", so stored as {dtype.name} it would overflow (to Inf or NaN). Export"
      f" as {' or '.join(holds)} (trm.export --dtype={holds[0]}).")


# Floating dtypes by name -> their safetensors tags (what a writer stores
# and what a config.json's torch_dtype names).
SAFETENSORS_TAGS = {"float16": "F16", "bfloat16": "BF16", "float32": "F32",
                    "float64": "F64", "float8_e4m3fn": "F8_E4M3",
                    "float8_e5m2": "F8_E5M2"}


def save_safetensors_streamed(path: str, entries, arrays,
                              metadata: dict | None = None) -> int:
  """Writes a .safetensors file one tensor at a time; returns its data size.

  entries: [(name, numpy dtype, shape)] in file order, which give the
  header (written first); arrays: an iterable yielding each tensor in that
  order, each written before the next is made. safetensors' `save_file`
  takes every tensor at once, so a 7B export held all 15 GB in host memory.
  Written through `atomic_write` (a temp file renamed over `path`): a
  killed or failed write leaves no shorter file under `path`, and the file
  gets the umask's mode like any other (not `save_file`'s 0600)."""
  header = {"__metadata__": dict(metadata)} if metadata else {}
  offset = 0
  for name, dtype, shape in entries:
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    header[name] = {"dtype": SAFETENSORS_TAGS[dtype.name],
                    "shape": [int(n) for n in shape],
                    "data_offsets": [offset, offset + size]}
    offset += size
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * (-len(text) % 8)  # tensor data 8-byte aligned, as safetensors

  def write(f):
    f.write(len(text).to_bytes(8, "little"))
    f.write(text)
    values = iter(arrays)
    for name, dtype, shape in entries:
      array = np.ascontiguousarray(next(values))
      if array.dtype != np.dtype(dtype) or array.shape != tuple(shape):
        raise ValueError(f"{path}: tensor {name!r} is {array.dtype} "
                         f"{array.shape}, its header says {np.dtype(dtype)} "
                         f"{tuple(shape)}.")
      f.write(array.reshape(-1).view(np.uint8))

  atomic_files.atomic_write(path, write)
  return offset


def save_safetensors(tensors: dict, path: str, metadata: dict | None = None
                     ) -> None:
  """safetensors' `save_file`, then the file mode any other file written
  here gets (0o666 less the umask). safetensors 0.8 writes through a
  temporary file that is always 0600 (safetensors issue #782), so an
  export's weights were readable by their owner alone while its
  config.json was not: another account (a serving user, a container's
  non-root user, a colleague on a shared disk) could read the config but
  not the weights."""
  save_file(tensors, path, metadata=metadata)
  os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
  """The process's umask, read without changing it where Linux tells it
  (`os.umask` can only read it by setting it, which for that instant
  applies another mask to files other threads create)."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


def read_safetensors(path: str, allow_nonfinite: bool = False,
                     allow_hint: str = ALLOW_NONFINITE_HINT
                     ) -> dict[str, np.ndarray]:
  """Every tensor of a .safetensors file (float8 ones as ml_dtypes' types).
  A quantized checkpoint's scales are refused (`check_not_quantized`), and
  a tensor holding NaN or Inf is refused in one line naming it
  (CheckpointError), unless `allow_nonfinite`; `allow_hint` names how the
  caller's user allows it."""
  with SafetensorsFile(path) as f:
    check_not_quantized(f.names, path)
    tensors = {key: f.read(key) for key in f.names}
  for key, value in tensors.items():
    check_finite(key, value, path, allow_nonfinite, allow_hint)
  return tensors


# ------------------------------------------------------------ quantization

# What a quantized checkpoint stores beside a quantized `<module>.weight`:
# transformers' fine-grained FP8 (quant_method "fp8", DeepSeek-V3 style)
# `weight_scale_inv`; FBGEMM FP8, compressed-tensors and Quark `weight_scale`
# and `input_scale`. Without them the float8 / int8 weights are off by the
# scale, so such a file must not load as plain weights.
QUANT_SCALES = (".weight_scale_inv", ".weight_scale", ".input_scale")
_DEQUANTIZE = ("this loader reads plain (unquantized) weights only. "
               "Dequantize the checkpoint first (e.g. load it with "
               "transformers and save_pretrained a bfloat16 copy) and load "
               "that copy")


def check_quantization_config(config: dict, path: str) -> None:
  """Refuses a config.json whose `quantization_config` says the weights are
  quantized (its scales, block sizes and kernels are not implemented)."""
  quant = config.get("quantization_config")
  if quant is None:
    return
  method = quant.get("quant_method") if isinstance(quant, dict) else None
  raise CheckpointError(
      f"{path}: quantization_config (quant_method={method!r}) marks the "
      f"weights as quantized; {_DEQUANTIZE}.")


def check_not_quantized(names, where: str) -> None:
  """Refuses tensor names holding a quantization scale beside its weight
  (`QUANT_SCALES`), a quantized checkpoint even when no config says so."""
  names = set(names)
  for name in sorted(names):
    scaled = next((name[:-len(s)] + ".weight" for s in QUANT_SCALES
                   if name.endswith(s)), None)
    if scaled in names:
      raise CheckpointError(
          f"{where} holds {name!r}, the quantization scale of {scaled!r}: "
          f"the checkpoint is quantized; {_DEQUANTIZE}.")
