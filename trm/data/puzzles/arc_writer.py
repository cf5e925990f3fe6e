"""ARC builder passes: plan the augmentations, then stream a split to disk.

Memory: the augmented grids are never all held at once. A first pass
(`plan`) keeps only the accepted transform ids and colour maps of each
puzzle; a second pass (`write_split`) re-applies them group by group and
streams the encoded examples into the .npy files in chunks. Used by
`trm.data.puzzles.arc`.
"""

import dataclasses
import math
import os
import shutil
import time
from typing import Optional

from absl import logging
import numpy as np

from trm.core import cli
from trm.data import atomic_files
from trm.data.puzzles import arc_grids
from trm.data.puzzles import builds
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import seeding

# Encoded rows buffered before each write of the token files.
_CHUNK_ROWS = 4096
_SUBSAMPLE_STREAM = 1
# ----------------------------------------------------------------------------
# Dataset builder.


@dataclasses.dataclass
class _Group:
  """One original puzzle: its examples per split and planned augmentations."""
  name: str
  train: list  # [(input, output)] going to the train split.
  test: list   # [(input, output)] going to the test split ([] if none).
  tids: Optional[np.ndarray] = None
  maps: Optional[np.ndarray] = None

  @property
  def num_puzzles(self) -> int:
    return 1 + len(self.tids)

  def puzzle_names(self) -> list[str]:
    return [self.name] + [arc_grids.aug_name(self.name, int(t), m)
                          for t, m in zip(self.tids, self.maps)]


def subsample(subsets, size: Optional[int], seed: int):
  """At most `size` puzzles of each subset, kept in their original order."""
  if size is None:
    return subsets
  rng = seeding.stream_rng(seed, _SUBSAMPLE_STREAM)
  result = []
  for subset, puzzles in subsets:
    if size < len(puzzles):
      keep = set(rng.choice(len(puzzles), size, replace=False).tolist())
      puzzles = {k: v for i, (k, v) in enumerate(puzzles.items()) if i in keep}
    result.append((subset, puzzles))
  return result


# Distinct augmentations of a puzzle: a dihedral transform times a
# permutation of the colours 1..9, less the identity.
MAX_AUGMENTATIONS = 8 * math.factorial(arc_grids.NUM_COLOURS - 1) - 1


def check_size(output_dir: str, subsets, test_sets, num_aug: int) -> None:
  """Refuses, before any augmentation is drawn, a build that cannot finish:
  more augmentations than exist, a split past the int32 indices of
  upstream's format, or more bytes than the disk holds if every asked
  augmentation is found (planning an absurd `num_aug` took hours before
  the write failed)."""
  if num_aug > MAX_AUGMENTATIONS:
    raise builds.BuildArgumentError(
        f"num_aug={num_aug} is more than the {MAX_AUGMENTATIONS} distinct "
        "augmentations a puzzle has (8 dihedral transforms x 9! colour "
        "permutations, less the original); upstream's builds use 1000")
  examples = {"train": 0, "test": 0}
  for subset, puzzles in subsets:
    for puzzle in puzzles.values():
      for kind, pairs in puzzle.items():
        to_test = subset in test_sets and kind == "test"
        examples["test" if to_test else "train"] += len(pairs)
  examples = {split: n * (1 + num_aug) for split, n in examples.items()}
  for split, n in examples.items():
    if n >= 2**31:
      raise builds.BuildArgumentError(
          f"num_aug={num_aug} asks for up to {n} {split} examples, past the "
          "int32 indices of the dataset format (2**31); lower num_aug or "
          "set subsample_size")
  # Inputs and labels, one byte per cell each.
  size = sum(examples.values()) * 2 * arc_grids.SEQ_LEN
  try:
    free = shutil.disk_usage(cli.nearest_existing(output_dir)).free
  except OSError:
    return
  if size > free:
    raise builds.BuildArgumentError(
        f"num_aug={num_aug} asks for up to {size / 2**30:.1f} GiB of "
        f"examples in {output_dir}, where {free / 2**30:.1f} GiB are free; "
        "lower num_aug, set subsample_size, or build on a larger disk")


def plan(subsets, test_sets, num_aug: int, rs: np.random.RandomState):
  """Groups (shuffled per subset, as upstream) and the test puzzles."""
  groups, test_puzzles = [], {}
  for subset, puzzles in subsets:
    items = list(puzzles.items())
    rs.shuffle(items)
    is_test = subset in test_sets
    start = time.time()
    for name, puzzle in items:
      where = f"{subset}/{name}"
      train, test = [], []
      for kind, pairs in puzzle.items():
        dest = test if (is_test and kind == "test") else train
        dest.extend(
            (arc_grids.grid_to_np(p["input"], f"{where} {kind} input"),
             arc_grids.grid_to_np(p["output"], f"{where} {kind} output"))
            for p in pairs)
      if is_test:
        test_puzzles[name] = puzzle
      group = _Group(name, train, test)
      group.tids, group.maps = arc_grids.plan_augmentations(
          train + test, num_aug, rs)
      if group.num_puzzles < num_aug + 1:
        logging.info("Puzzle %s: only %d distinct augmentations.", where,
                     group.num_puzzles - 1)
      groups.append(group)
    logging.info("Planned %d puzzles of subset %s in %.1fs.", len(items),
                 subset, time.time() - start)
  return groups, test_puzzles


def _write_npy_header(f, shape) -> None:
  np.lib.format.write_array_header_1_0(f, {
      "descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
      "fortran_order": False, "shape": tuple(shape)})


def write_split(out_dir: str, split: str, groups: list, identifier_map: dict,
                 num_identifiers: int, translate: bool,
                 rs: np.random.RandomState
                 ) -> puzzle_format.PuzzleDatasetMetadata:
  """Streams one split's examples to disk; returns its metadata."""
  split_dir = os.path.join(out_dir, split)
  os.makedirs(split_dir, exist_ok=True)
  examples_of = (lambda g: g.train) if split == "train" else (lambda g: g.test)
  sizes = np.array([len(examples_of(g)) for g in groups], np.int64)
  puzzles_per_group = np.array([g.num_puzzles for g in groups], np.int64)
  group_indices = np.concatenate([[0], np.cumsum(puzzles_per_group)])
  examples_per_puzzle = np.repeat(sizes, puzzles_per_group)
  puzzle_indices = np.concatenate([[0], np.cumsum(examples_per_puzzle)])
  n_examples, n_puzzles = int(puzzle_indices[-1]), int(group_indices[-1])
  if max(n_examples, n_puzzles) >= 2**31:
    raise ValueError(f"{split}: {n_examples} examples do not fit int32 "
                     f"indices; use fewer augmentations")
  identifiers = np.array(
      [identifier_map[n] for g in groups for n in g.puzzle_names()], np.int32)

  def stream(f_inputs, f_labels):
    _write_npy_header(f_inputs, (n_examples, arc_grids.SEQ_LEN))
    _write_npy_header(f_labels, (n_examples, arc_grids.SEQ_LEN))
    buf = np.zeros((2, _CHUNK_ROWS, arc_grids.GRID_SIZE, arc_grids.GRID_SIZE),
                   np.uint8)
    row, written = 0, 0
    for g in groups:
      pairs = examples_of(g)
      transforms = [None] + list(zip(g.tids.tolist(), g.maps))
      for transform in transforms:
        untranslated = rs.randint(0, len(pairs))
        for k, (inp, out) in enumerate(pairs):
          if transform is not None:
            inp = arc_grids.augment_grid(inp, *transform)
            out = arc_grids.augment_grid(out, *transform)
          if translate and k != untranslated:
            r = rs.randint(
                0, arc_grids.GRID_SIZE - max(inp.shape[0], out.shape[0]) + 1)
            c = rs.randint(
                0, arc_grids.GRID_SIZE - max(inp.shape[1], out.shape[1]) + 1)
          else:
            r = c = 0
          arc_grids.draw(buf[0, row], inp, r, c)
          arc_grids.draw(buf[1, row], out, r, c)
          row += 1
          if row == _CHUNK_ROWS:
            f_inputs.write(buf[0].tobytes())
            f_labels.write(buf[1].tobytes())
            buf[:] = 0
            written += row
            row = 0
    f_inputs.write(buf[0, :row].tobytes())
    f_labels.write(buf[1, :row].tobytes())
    if written + row != n_examples:  # Cannot happen; guards the header.
      raise AssertionError(f"wrote {written + row} rows, expected "
                           f"{n_examples}")

  path = lambda field: os.path.join(split_dir, f"all__{field}.npy")
  atomic_files.atomic_write(
      path("inputs"), lambda fi: atomic_files.atomic_write(
          path("labels"), lambda fl: stream(fi, fl)))
  for field, array in (("puzzle_identifiers", identifiers),
                       ("puzzle_indices", puzzle_indices.astype(np.int32)),
                       ("group_indices", group_indices.astype(np.int32))):
    atomic_files.write_npy(path(field), array)

  metadata = puzzle_format.PuzzleDatasetMetadata(
      pad_id=arc_grids.PAD_ID,
      ignore_label_id=arc_grids.PAD_ID,
      blank_identifier_id=0,
      vocab_size=arc_grids.VOCAB_SIZE,
      seq_len=arc_grids.SEQ_LEN,
      num_puzzle_identifiers=num_identifiers,
      total_groups=len(groups),
      mean_puzzle_examples=n_examples / max(n_puzzles, 1),
      total_puzzles=n_puzzles,
      sets=["all"])
  meta_path = os.path.join(split_dir, puzzle_format.METADATA_FILE)
  atomic_files.write_json_atomic(meta_path, metadata.to_json_dict())
  try:  # Validates the files just written (token ids are valid by design).
    puzzle_format.read_split(out_dir, split, check_tokens=False)
  except Exception:
    os.remove(meta_path)
    raise
  return metadata
