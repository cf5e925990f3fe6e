"""How a puzzle builder records, checks and (re)builds a dataset.

`build_info.json` holds a build's arguments, so a dataset directory built with
other arguments is noticed (`ensure_built` only warns, never rebuilds);
`write_dataset` writes a whole in-memory dataset; `one_example_*` lay out the
one-example-puzzle datasets (Sudoku, Maze). Used by the builders of
`trm.data.puzzles`; the file format itself is `trm.data.puzzles.format`.
"""

import functools
import inspect
import json
import os
from typing import Callable, Optional, Sequence

from absl import logging
import numpy as np

from trm.data import atomic_files
from trm.data.puzzles import format as puzzle_format

# ----------------------------------------------------------------------------
# What a builder records about a build (`build_info.json`), so a dataset
# directory built with other arguments is noticed.

BUILD_INFO_FILE = "build_info.json"


def build_args(signature, builder: str, **build_kwargs) -> dict:
  """All of a builder's `build_dataset(output_dir, ...)` arguments, defaults
  filled in, as recorded on disk."""
  bound = signature.bind("", **build_kwargs)
  bound.apply_defaults()
  args = dict(bound.arguments)
  del args["output_dir"]
  return {"builder": builder, **args}


def build_args_recorder(build_dataset: Callable, builder: str
                        ) -> Callable[..., dict]:
  """`build_args` bound to `build_dataset`'s signature and `builder`.

  The signature is captured now, so the recorder describes the real builder
  even if the name `build_dataset` is later rebound (e.g. wrapped or
  patched).
  """
  return functools.partial(build_args, inspect.signature(build_dataset),
                           builder)


def check_build_args(subsample_size: Optional[int],
                     non_negative: Sequence[tuple[str, int]] = ()) -> None:
  """Raises ValueError unless `subsample_size` is None or >= 1 and every
  (name, value) of `non_negative` is >= 0."""
  if subsample_size is not None and subsample_size < 1:
    raise ValueError(f"subsample_size must be >= 1, got {subsample_size}")
  for name, value in non_negative:
    if value < 0:
      raise ValueError(f"{name} must be >= 0, got {value}")


def is_built(output_dir: str, extra_files=()) -> bool:
  """Both splits' `dataset.json` (each written last) and `extra_files`
  exist."""
  files = [
      os.path.join(split, puzzle_format.METADATA_FILE)
      for split in ("train", "test")
  ]
  return all(os.path.isfile(os.path.join(output_dir, f))
             for f in files + list(extra_files))


def warn_if_built_otherwise(output_dir: str, wanted: dict,
                            derived=("counts",)) -> None:
  """An existing dataset is never rebuilt; a differing recorded build (keys
  in `derived` are outputs, not arguments) only warns."""
  try:
    with open(os.path.join(output_dir, BUILD_INFO_FILE)) as f:
      built = json.load(f)
  except (OSError, ValueError):
    return
  built = {k: v for k, v in built.items() if k not in derived}
  if built != wanted:
    logging.warning("Using existing dataset %s built with %s, not the "
                    "requested %s; delete it to rebuild.", output_dir, built,
                    wanted)


def ensure_built(output_dir: str, build_dataset: Callable,
                 recorded_args: Callable[..., dict], build_kwargs: dict,
                 extra_files=(), derived=("counts",)) -> str:
  """A builder's `ensure_dataset`: builds unless `is_built`; returns
  output_dir.

  Args:
    output_dir: dataset root.
    build_dataset: the builder's `build_dataset(output_dir, **build_kwargs)`.
    recorded_args: `build_kwargs` -> the arguments as recorded on disk (see
      `build_args_recorder`); only called for an existing dataset.
    build_kwargs: the build arguments.
    extra_files: see `is_built`.
    derived: see `warn_if_built_otherwise`.
  """
  if not is_built(output_dir, extra_files):
    return build_dataset(output_dir, **build_kwargs)
  warn_if_built_otherwise(output_dir, recorded_args(**build_kwargs),
                          derived)
  return output_dir


def write_dataset(output_dir: str, encode_split: Callable[[str], tuple],
                  build_info: dict, identifiers: Sequence[str] = ("<blank>",),
                  splits: Sequence[str] = ("train", "test")) -> dict:
  """Writes a whole dataset held in memory, split by split.

  Writes each split (`encode_split(split)` -> (metadata, arrays by set), in
  the order of `splits`), then `identifiers.json` and `build_info.json`
  (`build_info` plus the counts).

  Returns:
    {split: {"groups": ..., "examples": ...}}, as recorded under "counts".
  """
  counts = {}
  for split in splits:
    metadata, arrays_by_set = encode_split(split)
    puzzle_format.write_split(output_dir, split, metadata, arrays_by_set)
    counts[split] = {
        "groups": metadata.total_groups,
        "examples": sum(int(arrays["inputs"].shape[0])
                        for arrays in arrays_by_set.values())}
  puzzle_format.write_identifiers(output_dir, list(identifiers))
  atomic_files.write_json_atomic(os.path.join(output_dir, BUILD_INFO_FILE),
                    {**build_info, "counts": counts})
  return counts


# ----------------------------------------------------------------------------
# Datasets of one-example puzzles (Sudoku, Maze): one set "all", every puzzle
# holds one example, every group the same number of puzzles, and the blank
# puzzle identifier is the only one.


def one_example_metadata(
    vocab_size: int, seq_len: int,
    num_groups: int) -> puzzle_format.PuzzleDatasetMetadata:
  """Metadata of a split of `num_groups` groups of one-example puzzles.

  PAD is 0 and also the ignored label id. `total_puzzles` holds the number
  of *groups*, not puzzles, as upstream's Sudoku and Maze builders store it
  (even with augmented puzzles in each group). Kept so the files match
  upstream's; upstream only uses it to weight mean_puzzle_examples when
  merging datasets, which stays correct because every puzzle has exactly one
  example, and nothing here reads it.
  """
  return puzzle_format.PuzzleDatasetMetadata(
      pad_id=0,
      ignore_label_id=0,
      blank_identifier_id=0,
      vocab_size=vocab_size,
      seq_len=seq_len,
      num_puzzle_identifiers=1,
      total_groups=num_groups,
      mean_puzzle_examples=1.0,
      total_puzzles=num_groups,
      sets=["all"],
  )


def one_example_arrays(inputs: np.ndarray, labels: np.ndarray,
                       group_size: int) -> dict[str, dict[str, np.ndarray]]:
  """{"all": arrays} of one-example puzzles, `group_size` per group.

  Args:
    inputs, labels: uint8 [n_puzzles, seq_len], group by group.
    group_size: puzzles per group; must divide n_puzzles.
  """
  n_puzzles = inputs.shape[0]
  return {"all": {
      "inputs": inputs,
      "labels": labels,
      "puzzle_identifiers": np.zeros(n_puzzles, np.int32),
      "puzzle_indices": np.arange(n_puzzles + 1, dtype=np.int32),
      "group_indices": np.arange(0, n_puzzles + 1, group_size,
                                 dtype=np.int32),
  }}
