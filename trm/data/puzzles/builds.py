"""How a puzzle builder records, checks and (re)builds a dataset.

A build marks itself complete LAST: `build_info.json` (its arguments, defaults
filled in, plus the counts) is written atomically after every other file.
While a build runs, `.building.json` (the same arguments) marks the directory
as in progress; it is written FIRST, before the old completion mark and the
old splits' `dataset.json` are removed, and removed after the new
`build_info.json` is in place (`begin_build` / `finish_build`). So:

  * `build_info.json` present: a complete build with those arguments;
  * `.building.json` without `build_info.json`: an interrupted build, never
    used (`ensure_built` builds again);
  * neither, but both splits' `dataset.json`: a dataset written elsewhere
    (e.g. by upstream's builders), used as it is.

`ensure_built` compares a complete build's recorded arguments with the ones
asked for and refuses, in one line naming the differing fields, when they
differ (`DatasetArgumentsError`): an existing dataset is never silently
used for other arguments, nor silently replaced. `write_dataset` writes a
whole in-memory dataset; `one_example_*` lay out the one-example-puzzle
datasets (Sudoku, Maze). Used by the builders of `trm.data.puzzles`; the
file format itself is `trm.data.puzzles.format`.
"""

import functools
import inspect
import json
import os
from typing import Callable, Iterable, Mapping, Optional, Sequence

from absl import logging
import numpy as np

from trm.core import cli
from trm.data import atomic_files
from trm.data.puzzles import format as puzzle_format

# ----------------------------------------------------------------------------
# What a builder records about a build (`build_info.json`), so a dataset
# directory built with other arguments is noticed.

BUILD_INFO_FILE = "build_info.json"   # completion mark, written last
BUILDING_FILE = ".building.json"      # in-progress mark, written first
SPLITS = ("train", "test")


class DatasetArgumentsError(ValueError):
  """A complete dataset on disk was built with other arguments: `differences`
  names them (empty when the record itself is unreadable), `record` is
  its build_info.json."""

  def __init__(self, message: str, differences: str = "", record: str = ""):
    super().__init__(message)
    self.differences, self.record = differences, record


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


class BuildArgumentError(ValueError):
  """A build argument out of range; the message starts with its name, so
  `ensure_built` can spell it as the caller does (config.data.build.*)."""


def check_build_args(subsample_size: Optional[int],
                     non_negative: Sequence[tuple[str, int]] = (),
                     positive: Sequence[tuple[str, int]] = ()) -> None:
  """Raises ValueError unless `subsample_size` is None or >= 1, every
  (name, value) of `non_negative` is >= 0 and every one of `positive` (the
  split sizes: an empty split trains or evaluates nothing) >= 1."""
  if subsample_size is not None and subsample_size < 1:
    raise BuildArgumentError(
        f"subsample_size must be >= 1, got {subsample_size}")
  for name, value in non_negative:
    if value < 0:
      raise BuildArgumentError(f"{name} must be >= 0, got {value}")
  for name, value in positive:
    if value < 1:
      raise BuildArgumentError(f"{name} must be >= 1 (an empty split), got "
                               f"{value}")


# ----------------------------------------------------------------------------
# Marking a build in progress and complete.


def _json_safe(value):
  return json.loads(json.dumps(value))


def begin_build(output_dir: str, build_args_: dict) -> None:
  """Marks `output_dir` as being (re)built: writes `.building.json`, then
  removes the completion mark and every split's `dataset.json`, so that
  neither this code nor a reader of upstream's format takes a half-written
  directory for a dataset. Call before writing any dataset file."""
  os.makedirs(output_dir, exist_ok=True)
  atomic_files.write_json_atomic(os.path.join(output_dir, BUILDING_FILE),
                                 _json_safe(build_args_))
  for path in [os.path.join(output_dir, BUILD_INFO_FILE)] + [
      os.path.join(output_dir, split, puzzle_format.METADATA_FILE)
      for split in SPLITS]:
    if os.path.lexists(path):
      os.remove(path)


def finish_build(output_dir: str, info: dict) -> None:
  """Marks the build complete: `build_info.json` (atomically, last), then
  drops the in-progress mark."""
  atomic_files.write_json_atomic(os.path.join(output_dir, BUILD_INFO_FILE),
                                 info)
  building = os.path.join(output_dir, BUILDING_FILE)
  if os.path.lexists(building):
    os.remove(building)


def _files_present(output_dir: str, extra_files=()) -> bool:
  files = [os.path.join(split, puzzle_format.METADATA_FILE)
           for split in SPLITS]
  return all(os.path.isfile(os.path.join(output_dir, f))
             for f in files + list(extra_files))


def build_state(output_dir: str, extra_files=()) -> str:
  """'complete', 'interrupted', 'foreign' (files of a dataset but no marks
  of ours: built elsewhere) or 'absent'. See the module docstring."""
  info = os.path.isfile(os.path.join(output_dir, BUILD_INFO_FILE))
  building = os.path.lexists(os.path.join(output_dir, BUILDING_FILE))
  files = _files_present(output_dir, extra_files)
  if info and files:
    return "complete"
  if info or building:
    return "interrupted"
  return "foreign" if files else "absent"


def is_built(output_dir: str, extra_files=()) -> bool:
  """A dataset that may be used: complete (`build_info.json`, written last)
  or written elsewhere (both splits' `dataset.json`, no marks of ours); an
  interrupted build is not."""
  return build_state(output_dir, extra_files) in ("complete", "foreign")


def _same_value(name: str, built, wanted, path_args: Iterable[str]) -> bool:
  if built == wanted:
    return True
  if (name in path_args and isinstance(built, str)
      and isinstance(wanted, str)):
    return cli.same_file(built, wanted)
  # JSON turns tuples into lists.
  if isinstance(built, list) and isinstance(wanted, (list, tuple)):
    return built == list(wanted)
  return False


def differing_args(built: Mapping, wanted: Mapping, derived=("counts",),
                   ignored=(), path_args=()) -> list[str]:
  """Names of the arguments whose recorded and wanted values differ (keys in
  `derived` are outputs, those in `ignored` do not shape the data)."""
  skip = set(derived) | set(ignored)
  names = sorted((set(built) | set(wanted)) - skip)
  return [n for n in names
          if not _same_value(n, built.get(n), wanted.get(n), path_args)]


def check_recorded_args(output_dir: str, wanted: dict, derived=("counts",),
                        ignored=(), path_args=(),
                        field_prefix: str = "") -> None:
  """Raises DatasetArgumentsError (one line naming the fields) unless the
  complete dataset in `output_dir` was built with `wanted`."""
  path = os.path.join(output_dir, BUILD_INFO_FILE)
  try:
    with open(path) as f:
      built = json.load(f)
  except (OSError, ValueError, RecursionError) as e:  # RecursionError: nesting
    raise DatasetArgumentsError(
        f"{path} is not readable JSON ({str(e)[:200]}); delete {output_dir} "
        "to rebuild the dataset.") from None
  if not isinstance(built, dict):
    raise DatasetArgumentsError(
        f"{path} holds no build arguments; delete {output_dir} to rebuild "
        "the dataset.")
  wanted = _json_safe(wanted)
  differ = differing_args(built, wanted, derived, ignored, path_args)
  if not differ:
    return
  shown = ", ".join(f"{field_prefix}{n}={wanted.get(n)!r} (built with "
                    f"{built.get(n)!r})" for n in differ)
  elsewhere = ("another config.data.data_dir" if field_prefix
               else "another directory")
  raise DatasetArgumentsError(
      f"Dataset {output_dir} was built with other arguments than asked: "
      f"{shown} (recorded in {path}). Delete {output_dir} to rebuild it, set "
      f"those arguments to the recorded values, or use {elsewhere}.",
      differences=shown, record=path)


def ensure_built(output_dir: str, build_dataset: Callable,
                 recorded_args: Callable[..., dict], build_kwargs: dict,
                 extra_files=(), derived=("counts",), ignored=(),
                 path_args=(), field_prefix: str = "") -> str:
  """A builder's `ensure_dataset`: builds unless a complete (or foreign)
  dataset is there; returns output_dir.

  A complete build whose recorded arguments differ from `build_kwargs`
  raises DatasetArgumentsError naming the fields (nothing is changed on
  disk); an interrupted one is built again.

  Args:
    output_dir: dataset root.
    build_dataset: the builder's `build_dataset(output_dir, **build_kwargs)`.
    recorded_args: `build_kwargs` -> the arguments as recorded on disk (see
      `build_args_recorder`).
    build_kwargs: the build arguments.
    extra_files: more files a complete build has (see `build_state`).
    derived: recorded keys that are outputs, not arguments.
    ignored: `recorded_args` -> names of arguments that do not shape this
      build (e.g. a CSV directory when generating), or a sequence of names.
    path_args: arguments compared as paths (`cli.same_file`: links
      resolved, one folder reached two ways).
    field_prefix: how the caller spells the arguments in messages, e.g.
      'config.data.build.'.
  """
  with atomic_files.dir_lock(output_dir):  # state, then build: one build at a time
    return _ensure_built(output_dir, build_dataset, recorded_args,
                         build_kwargs, extra_files, derived, ignored,
                         path_args, field_prefix)


# The arguments that set how many examples a build holds in memory.
SIZE_ARGS = ("num_train", "num_test", "num_aug", "aug", "subsample_size")


def out_of_memory(error: MemoryError, output_dir: str, build_kwargs: dict,
                  prefix: str) -> BuildArgumentError:
  """One line for a build that asked for more host memory than there is
  (an absurd num_aug or num_test: numpy's MemoryError had no line of ours,
  a traceback), naming the size arguments as `prefix` spells them
  ('--' on a builder's command line, 'config.data.build.' in trm.main).
  The interrupted build's mark makes the next run build it again."""
  sizes = ", ".join(f"{prefix}{k}={build_kwargs[k]!r}" for k in SIZE_ARGS
                    if build_kwargs.get(k) is not None)
  why = " ".join(str(error).split()) or "MemoryError"
  return BuildArgumentError(
      f"Building the dataset in {output_dir} ran out of host memory ({why})"
      f"{': ' + sizes if sizes else ''}. Ask for fewer examples (lower "
      "num_aug, num_train / num_test, or set subsample_size), or build it on"
      " a host with more memory.")


def _ensure_built(output_dir, build_dataset, recorded_args, build_kwargs,
                  extra_files, derived, ignored, path_args, field_prefix):
  state = build_state(output_dir, extra_files)
  if state == "interrupted":
    logging.warning("%s holds an interrupted or damaged build (no complete "
                    "%s); building it again.", output_dir, BUILD_INFO_FILE)
  if state in ("absent", "interrupted"):
    try:
      return build_dataset(output_dir, **build_kwargs)
    except BuildArgumentError as e:
      if not field_prefix:
        raise
      raise BuildArgumentError(f"{field_prefix}{e}") from None
    except MemoryError as e:
      raise out_of_memory(e, output_dir, build_kwargs, field_prefix) from None
  if state == "foreign":
    logging.info("Using the dataset in %s as it is: it has no %s (built "
                 "elsewhere, e.g. by upstream's builders), so its build "
                 "arguments are not checked.", output_dir, BUILD_INFO_FILE)
    return output_dir
  wanted = recorded_args(**build_kwargs)
  skip = ignored(wanted) if callable(ignored) else ignored
  check_recorded_args(output_dir, wanted, derived, skip, path_args,
                      field_prefix)
  return output_dir


def write_dataset(output_dir: str, encode_split: Callable[[str], tuple],
                  build_info: dict, identifiers: Sequence[str] = ("<blank>",),
                  splits: Sequence[str] = ("train", "test")) -> dict:
  """Writes a whole dataset held in memory, split by split.

  Marks the build in progress (`begin_build`), writes each split
  (`encode_split(split)` -> (metadata, arrays by set), in the order of
  `splits`), then `identifiers.json`, and marks it complete with
  `build_info.json` (`build_info` plus the counts) last (`finish_build`).

  Returns:
    {split: {"groups": ..., "examples": ...}}, as recorded under "counts".
  """
  with atomic_files.dir_lock(output_dir):
    begin_build(output_dir, build_info)
    counts = {}
    for split in splits:
      metadata, arrays_by_set = encode_split(split)
      puzzle_format.write_split(output_dir, split, metadata, arrays_by_set)
      counts[split] = {
          "groups": metadata.total_groups,
          "examples": sum(int(arrays["inputs"].shape[0])
                          for arrays in arrays_by_set.values())}
    puzzle_format.write_identifiers(output_dir, list(identifiers))
    finish_build(output_dir, {**build_info, "counts": counts})
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
