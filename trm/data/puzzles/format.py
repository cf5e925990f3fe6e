"""Upstream TRM's on-disk puzzle dataset format (`dataset/common.py`).

A dataset directory holds one sub-directory per split (`train`, `test`) plus
`identifiers.json` (puzzle-identifier id -> name, for visualisation only):

  <out>/identifiers.json
  <out>/<split>/dataset.json            PuzzleDatasetMetadata as JSON
  <out>/<split>/<set>__inputs.npy       uint8 [n_examples, seq_len]
  <out>/<split>/<set>__labels.npy       uint8 [n_examples, seq_len]
  <out>/<split>/<set>__puzzle_identifiers.npy  int32 [n_puzzles]
  <out>/<split>/<set>__puzzle_indices.npy      int32 [n_puzzles + 1]
  <out>/<split>/<set>__group_indices.npy       int32 [n_groups + 1]

The index arrays form a CSR-like hierarchy: group g owns puzzles
`group_indices[g]:group_indices[g+1]`, puzzle p owns examples
`puzzle_indices[p]:puzzle_indices[p+1]`. Datasets written by the upstream
PyTorch builders load unchanged (their token arrays may be of another
integer dtype: upstream's Sudoku builder writes int64 when it augments);
files written here load in upstream too.
"""

import dataclasses
import json
import math
import os
from typing import Any, Mapping, Optional

import numpy as np

from trm.data import atomic_files
from trm.data import io as data_io

METADATA_FILE = "dataset.json"
IDENTIFIERS_FILE = "identifiers.json"

# Field name -> (dtype, ndim). Order is the order files are written in.
FIELDS = {
    "inputs": (np.uint8, 2),
    "labels": (np.uint8, 2),
    "puzzle_identifiers": (np.int32, 1),
    "puzzle_indices": (np.int32, 1),
    "group_indices": (np.int32, 1),
}
# Token arrays can be large (ARC: GBs), so they stay on disk; the small index
# arrays are indexed per sample and are worth holding in RAM (as upstream).
MMAP_FIELDS = ("inputs", "labels")

_BUILD_HINT = (
    "Build the data first, e.g. "
    "`python -m trm.data.puzzles.sudoku --output_dir={data_dir}` "
    "(add --source=hub or --csv_dir=DIR for the real Sudoku-Extreme CSVs).")

# Rows scanned per chunk when checking token ids of memory-mapped arrays, so a
# multi-GB file is never materialised at once.
_TOKEN_CHECK_ROWS = 1 << 16


@dataclasses.dataclass(frozen=True)
class PuzzleDatasetMetadata:
  """Mirror of upstream's pydantic `PuzzleDatasetMetadata` (same fields)."""
  pad_id: int
  ignore_label_id: Optional[int]
  blank_identifier_id: int
  vocab_size: int
  seq_len: int
  num_puzzle_identifiers: int
  total_groups: int
  mean_puzzle_examples: float
  total_puzzles: int
  sets: list[str]

  def to_json_dict(self) -> dict[str, Any]:
    """Same keys, order and types as upstream's `model_dump()`."""
    d = dataclasses.asdict(self)
    d["mean_puzzle_examples"] = float(d["mean_puzzle_examples"])
    d["sets"] = list(d["sets"])
    return d

  @classmethod
  def from_json_dict(cls, data: Any,
                     source: str = "<dict>") -> "PuzzleDatasetMetadata":
    """Validates and converts a decoded `dataset.json`.

    Args:
      data: the decoded JSON object.
      source: file name used in error messages.

    Raises:
      ValueError: on unknown/missing keys or values of the wrong type.
    """
    if not isinstance(data, dict):
      raise ValueError(f"{source}: expected a JSON object, got "
                       f"{type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown:
      raise ValueError(f"{source}: unknown metadata field(s) {unknown}; "
                       f"expected exactly {names}")
    if missing:
      raise ValueError(f"{source}: missing metadata field(s) {missing}")

    values = {}
    for name in names:
      value = data[name]
      if name == "ignore_label_id" and value is None:
        values[name] = None
      elif name == "mean_puzzle_examples":
        # pydantic dumps a float, but hand-written files may hold an int.
        if isinstance(value, bool) or not isinstance(value, (int, float)):
          raise ValueError(f"{source}: field 'mean_puzzle_examples' must be a "
                           f"number, got {value!r}")
        values[name] = float(value)
      elif name == "sets":
        if (not isinstance(value, list) or not value or
            not all(isinstance(s, str) and s for s in value)):
          raise ValueError(f"{source}: field 'sets' must be a non-empty list "
                           f"of non-empty strings, got {value!r}")
        values[name] = list(value)
      else:
        # bool is an int subclass; a boolean here is always a mistake.
        if isinstance(value, bool) or not isinstance(value, int):
          raise ValueError(f"{source}: field {name!r} must be an integer, "
                           f"got {value!r}")
        values[name] = value
    metadata = cls(**values)
    metadata.check(source)
    return metadata

  def check(self, source: str = "<metadata>") -> None:
    """Range checks on the metadata values alone."""
    for name in ("vocab_size", "seq_len", "num_puzzle_identifiers"):
      # They size the model's tables: from 2**31 on, JAX (int32 shapes)
      # failed at initialisation with an OverflowError's traceback.
      if not 1 <= getattr(self, name) < 2**31:
        raise ValueError(f"{source}: field {name!r} must be >= 1 and below "
                         f"2**31, got {getattr(self, name)}")
    for name in ("total_groups", "total_puzzles"):
      if getattr(self, name) < 0:
        raise ValueError(f"{source}: field {name!r} must be >= 0, got "
                         f"{getattr(self, name)}")
    # With num_epochs they set the run's length: NaN or inf was a
    # traceback, a negative mean a one-step run.
    if not (math.isfinite(self.mean_puzzle_examples)
            and self.mean_puzzle_examples >= 0):
      raise ValueError(f"{source}: field 'mean_puzzle_examples' must be a "
                       f"finite number >= 0, got {self.mean_puzzle_examples}")
    if not 0 <= self.pad_id < self.vocab_size:
      raise ValueError(f"{source}: field 'pad_id'={self.pad_id} is outside "
                       f"[0, vocab_size={self.vocab_size})")
    if not 0 <= self.blank_identifier_id < self.num_puzzle_identifiers:
      raise ValueError(
          f"{source}: field 'blank_identifier_id'={self.blank_identifier_id} "
          f"is outside [0, num_puzzle_identifiers="
          f"{self.num_puzzle_identifiers})")
    if len(set(self.sets)) != len(self.sets):
      raise ValueError(f"{source}: field 'sets' has duplicates: {self.sets}")


# ----------------------------------------------------------------------------
# Atomic file writes (see `trm.data.atomic_files`).


def _write_npy_atomic(path: str, array: np.ndarray) -> None:
  atomic_files.write_npy(path, array)


# ----------------------------------------------------------------------------
# Validation shared by the writer and the reader.


def _check_arrays(metadata: PuzzleDatasetMetadata, arrays: Mapping[str, Any],
                  where: str, check_tokens: bool = True,
                  any_int_tokens: bool = False) -> None:
  """Checks one set's arrays against each other and the metadata.

  Args:
    metadata: the split's metadata.
    arrays: field name -> array for one set.
    where: prefix for error messages (a directory and set name); the field's
      file name is appended.
    check_tokens: also scan inputs/labels for ids outside [0, vocab_size)
      (reads the whole token arrays).
    any_int_tokens: inputs/labels may be of any integer dtype, not only
      uint8 (upstream's Sudoku builder writes int64 when it augments).

  Raises:
    ValueError: naming the offending field.
  """
  unknown = sorted(set(arrays) - set(FIELDS))
  missing = [f for f in FIELDS if f not in arrays]
  if unknown or missing:
    raise ValueError(f"{where}: expected fields {list(FIELDS)}; unknown "
                     f"{unknown}, missing {missing}")

  def fail(field, msg):
    raise ValueError(f"{where}__{field}.npy: field {field!r}: {msg}")

  for field, (dtype, ndim) in FIELDS.items():
    a = arrays[field]
    if not isinstance(a, np.ndarray):
      fail(field, f"expected a numpy array, got {type(a).__name__}")
    any_int = any_int_tokens and field in MMAP_FIELDS
    if a.dtype != dtype and not (any_int and a.dtype.kind in "iu"):
      fail(field, f"expected dtype {np.dtype(dtype).name}"
           f"{' or another integer dtype' if any_int else ''}, got {a.dtype}")
    if a.ndim != ndim:
      fail(field, f"expected {ndim} dims, got shape {a.shape}")

  inputs, labels = arrays["inputs"], arrays["labels"]
  if inputs.shape[1] != metadata.seq_len:
    fail("inputs", f"sequence length {inputs.shape[1]} != metadata seq_len "
         f"{metadata.seq_len}")
  if labels.shape != inputs.shape:
    fail("labels", f"shape {labels.shape} != inputs shape {inputs.shape}")

  n_examples = inputs.shape[0]
  n_puzzles = arrays["puzzle_identifiers"].shape[0]
  _check_offsets(arrays["puzzle_indices"], n_puzzles, n_examples,
                 lambda msg: fail("puzzle_indices", msg), "examples")
  n_groups = arrays["group_indices"].shape[0] - 1
  _check_offsets(arrays["group_indices"], n_groups, n_puzzles,
                 lambda msg: fail("group_indices", msg), "puzzles")

  ids = arrays["puzzle_identifiers"]
  n_ids = metadata.num_puzzle_identifiers
  if ids.size and (ids.min() < 0 or ids.max() >= n_ids):
    fail("puzzle_identifiers", f"ids must lie in [0, num_puzzle_identifiers="
         f"{metadata.num_puzzle_identifiers}), got range "
         f"[{ids.min()}, {ids.max()}]")

  if check_tokens:
    for field in MMAP_FIELDS:
      low, top = _token_range(arrays[field])
      if top is not None and top >= metadata.vocab_size:
        fail(field, f"token id {top} >= metadata vocab_size "
             f"{metadata.vocab_size}")
      if low is not None and low < 0:
        fail(field, f"token id {low} < 0")


def _check_offsets(offsets: np.ndarray, n_items: int, n_children: int, fail,
                   child_name: str) -> None:
  """Checks a CSR offset array: length n_items+1, 0 .. n_children, monotone."""
  if offsets.shape[0] != n_items + 1:
    fail(f"expected length {n_items + 1}, got {offsets.shape[0]}")
  if offsets.shape[0] == 0:
    fail("must hold at least the leading 0")
  if offsets[0] != 0:
    fail(f"must start at 0, got {offsets[0]}")
  if offsets[-1] != n_children:
    fail(f"must end at the number of {child_name} ({n_children}), got "
         f"{offsets[-1]}")
  if np.any(np.diff(offsets) < 0):
    fail("must be non-decreasing")


def _token_range(tokens: np.ndarray) -> tuple[Optional[int], Optional[int]]:
  """(smallest, largest) value of a (possibly memory-mapped) array, scanned
  in chunks; (None, None) when it is empty. The smallest is only looked
  for in signed arrays (0 otherwise): the scan of a multi-GB uint8 file
  costs what it did."""
  low = top = None
  signed = tokens.dtype.kind == "i"
  for start in range(0, tokens.shape[0], _TOKEN_CHECK_ROWS):
    chunk = tokens[start:start + _TOKEN_CHECK_ROWS]
    if chunk.size:
      hi, lo = int(chunk.max()), int(chunk.min()) if signed else 0
      top = hi if top is None else max(top, hi)
      low = lo if low is None else min(low, lo)
  return low, top


# ----------------------------------------------------------------------------
# Public API.


def write_split(out_dir: str, split: str, metadata: PuzzleDatasetMetadata,
                arrays_by_set: Mapping[str, Mapping[str, np.ndarray]]) -> str:
  """Writes one split (`<out_dir>/<split>/`) in upstream's layout.

  Everything is validated before the first byte is written, and
  `dataset.json` is written last, so its presence marks a complete split.

  Args:
    out_dir: dataset root.
    split: split name, e.g. "train" or "test".
    metadata: the split's metadata; `metadata.sets` must name exactly the keys
      of `arrays_by_set`.
    arrays_by_set: set name -> {field -> array}, see `FIELDS` for the fields,
      dtypes and ranks.

  Returns:
    The split directory.

  Raises:
    ValueError: on inconsistent metadata or arrays, naming the field.
  """
  split_dir = os.path.join(out_dir, split)
  metadata.check(os.path.join(split_dir, METADATA_FILE))
  if sorted(arrays_by_set) != sorted(metadata.sets):
    raise ValueError(f"{split_dir}: arrays given for sets "
                     f"{sorted(arrays_by_set)} but metadata 'sets' is "
                     f"{metadata.sets}")
  for set_name in metadata.sets:
    _check_arrays(metadata, arrays_by_set[set_name],
                  os.path.join(split_dir, set_name))

  os.makedirs(split_dir, exist_ok=True)
  for set_name in metadata.sets:
    for field in FIELDS:
      _write_npy_atomic(os.path.join(split_dir, f"{set_name}__{field}.npy"),
                        arrays_by_set[set_name][field])
  atomic_files.write_json_atomic(os.path.join(split_dir, METADATA_FILE),
                    metadata.to_json_dict())
  return split_dir


def write_identifiers(out_dir: str, names: list[str]) -> str:
  """Writes `<out_dir>/identifiers.json` (id -> name list); returns its path."""
  if not all(isinstance(n, str) for n in names):
    raise ValueError(f"identifiers must be strings, got {names!r}")
  path = os.path.join(out_dir, IDENTIFIERS_FILE)
  atomic_files.write_json_atomic(path, list(names))
  return path


def read_metadata(data_dir: str, split: str) -> PuzzleDatasetMetadata:
  """Reads and validates `<data_dir>/<split>/dataset.json`.

  Raises:
    FileNotFoundError: the directory or file is missing (with a build hint).
    ValueError: the JSON is malformed or has unknown/missing fields.
  """
  split_dir = os.path.join(data_dir, split)
  hint = _BUILD_HINT.format(data_dir=data_dir)
  if not os.path.isdir(split_dir):
    raise FileNotFoundError(
        f"Puzzle dataset split directory {split_dir!r} does not exist. {hint}")
  path = os.path.join(split_dir, METADATA_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"Puzzle dataset metadata {path!r} does not exist (incomplete or "
        f"interrupted build?). {hint}")
  try:
    with open(path, "r", encoding="utf-8") as f:
      data = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON: {e}") from e
  except UnicodeDecodeError as e:
    # A ValueError too, but its text ("'utf-8' codec can't decode ...")
    # named no file.
    raise ValueError(f"{path}: not UTF-8 JSON (byte 0x{e.object[e.start]:02x}"
                     f" at offset {e.start}); rebuild the dataset.") from None
  except (RecursionError, ValueError) as e:  # nesting, 4300+ digit ints
    raise ValueError(f"{path}: no dataset metadata ({type(e).__name__}: "
                     f"{str(e)[:120]}); rebuild the dataset.") from None
  return PuzzleDatasetMetadata.from_json_dict(data, source=path)


def read_split(data_dir: str, split: str, set_name: str = "all",
               mmap: bool = True, check_tokens: bool = True
               ) -> tuple[PuzzleDatasetMetadata, dict[str, np.ndarray]]:
  """Loads one set of one split.

  Args:
    data_dir: dataset root (holding `<split>/dataset.json`).
    split: split name, e.g. "train" or "test".
    set_name: which set of the split (upstream always uses "all").
    mmap: memory-map inputs/labels (read-only) instead of loading them.
    check_tokens: scan inputs/labels for ids >= vocab_size. This reads the
      token files once; disable it for very large datasets.

  Returns:
    (metadata, {field: array}) with the fields of `FIELDS`.

  Raises:
    FileNotFoundError: a directory or file is missing (with a build hint).
    ValueError: metadata or arrays are malformed or mutually inconsistent.
  """
  metadata = read_metadata(data_dir, split)
  split_dir = os.path.join(data_dir, split)
  meta_path = os.path.join(split_dir, METADATA_FILE)
  if set_name not in metadata.sets:
    raise ValueError(f"{meta_path}: set {set_name!r} not in field 'sets' "
                     f"{metadata.sets}")

  arrays = {}
  for field in FIELDS:
    path = os.path.join(split_dir, f"{set_name}__{field}.npy")
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"Puzzle dataset file {path!r} does not exist (incomplete build?). "
          f"{_BUILD_HINT.format(data_dir=data_dir)}")
    mode = "r" if (mmap and field in MMAP_FIELDS) else None
    try:
      data_io.check_npy_size(path)
      arrays[field] = np.load(path, mmap_mode=mode, allow_pickle=False)
    except (ValueError, OSError) as e:
      # np.load takes any non-.npy bytes for a pickle and suggests loading
      # it unsafely; pickles are never loaded here, so that hint is dropped.
      detail = "" if "allow_pickle" in str(e) else f" ({e})"
      raise ValueError(
          f"{path}: field {field!r}: not a readable .npy array (corrupt, "
          "truncated, or holding pickled objects, which are never loaded)"
          f"{detail}; rebuild the dataset.") from e
  _check_arrays(metadata, arrays, os.path.join(split_dir, set_name),
                check_tokens=check_tokens, any_int_tokens=True)
  n_groups = arrays["group_indices"].shape[0] - 1
  if metadata.sets == [set_name] and metadata.total_groups != n_groups:
    # The split's only set: its groups are all of them. total_groups sets a
    # num_epochs run's length (0: one step; 2**62: no end).
    raise ValueError(
        f"{os.path.join(split_dir, METADATA_FILE)}: field 'total_groups'="
        f"{metadata.total_groups} != the {n_groups} groups of set "
        f"{set_name!r} ({set_name}__group_indices.npy); rebuild the dataset, "
        "or correct the field.")
  return metadata, arrays
