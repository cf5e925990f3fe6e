"""Upstream TRM batching (`puzzle_dataset.py`) as random-access batch sources.

Training batches follow upstream's sampling exactly, but seeded end to end:
time is cut into "iterations" of `epochs_per_iter` epochs; iteration i
concatenates that many independent permutations of the groups (an RNG seeded
with seed + i), walks them, takes one random puzzle (augmentation) of each
group and a random subset of its examples until the global batch is full, and
drops the last partial batch of the iteration.

Batch k of the stream is a pure function of (dataset, seed, k), so a Grain
`MapDataset` over batch indices is checkpointable by its position (and the
data's fingerprint) alone, and every process slices the same global batch:
the data a run sees does not depend on how many processes read it.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import threading

import numpy as np

from trm.data import io as data_io
from trm.families.trm.model import IGNORE_LABEL_ID

# A split's fingerprint reads at most this many runs of this many elements
# of each array (`data_io.spread_positions`).
_FINGERPRINT_BLOCKS = 256
_FINGERPRINT_ELEMENTS = 32768


def plan_iteration(rng: np.random.Generator, group_indices, puzzle_indices,
                   epochs: int, global_batch_size: int):
  """The batches of one iteration, as (puzzle per group visit, batch starts).

  Returns `puzzles` [epochs * num_groups]: the puzzle picked at each visit of
  `group_order`, and `starts` [num_batches + 1]: batch j uses the visits
  starts[j]:starts[j+1]. A visit adds min(puzzle size, room left) examples;
  the last partial batch is dropped, as upstream.
  """
  num_groups = len(group_indices) - 1
  group_order = np.concatenate(
      [rng.permutation(num_groups) for _ in range(epochs)])
  first, sizes = group_indices[group_order], np.diff(group_indices)[group_order]
  puzzles = first + np.floor(rng.random(len(group_order)) * sizes).astype(
      np.int64)
  examples = np.diff(puzzle_indices)[puzzles]
  if np.all(examples == 1):  # Sudoku, Maze: every visit adds one example
    num_batches = len(puzzles) // global_batch_size
    return puzzles, np.arange(num_batches + 1) * global_batch_size
  # Visits whose examples cross the batch boundary are truncated, so each
  # batch starts right after the visit that filled the previous one.
  cumulative = np.cumsum(examples)
  starts, offset = [0], 0
  while True:
    end = int(np.searchsorted(cumulative, offset + global_batch_size))
    if end >= len(puzzles):
      break
    starts.append(end + 1)
    offset = int(cumulative[end])
  return puzzles, np.asarray(starts)


def batch_examples(rng: np.random.Generator, puzzles, puzzle_indices,
                   global_batch_size: int):
  """Example ids of one batch: a random subset of each visited puzzle."""
  examples, owners, size = [], [], 0
  for puzzle in puzzles:
    start = int(puzzle_indices[puzzle])
    puzzle_size = int(puzzle_indices[puzzle + 1]) - start
    take = min(puzzle_size, global_batch_size - size)
    # A puzzle of one example (or of none, which adds nothing) needs no draw.
    examples.append(start + (rng.choice(puzzle_size, take, replace=False)
                             if puzzle_size > 1 else np.zeros(take, np.int64)))
    owners.append(np.full(take, puzzle, np.int64))
    size += take
  return np.concatenate(examples), np.concatenate(owners)


class _Split:
  """Arrays of one split plus the collate shared by train and test."""

  def __init__(self, metadata, arrays, global_batch_size, process_index,
               process_count):
    if global_batch_size % process_count:
      raise ValueError(f"Global batch {global_batch_size} is not divisible by "
                       f"the {process_count} processes.")
    self.metadata = metadata
    self.arrays = arrays
    self.global_batch_size = global_batch_size
    self.local_batch_size = global_batch_size // process_count
    self.local_slice = slice(process_index * self.local_batch_size,
                             (process_index + 1) * self.local_batch_size)
    self._fingerprint = None

  def fingerprint(self) -> str:
    """A hash of the split (dataset.json and its arrays; those past
    _FINGERPRINT_BLOCKS runs by their shape and runs spread over them).
    Each process reads its rows from its own copy of the data, so the
    trainer compares it across processes (hosts with other puzzles at one
    data_dir trained on a mix of both), and a training position is saved
    with it (`trm.core.pipeline`): one saved over other puzzles does not
    continue the run."""
    if self._fingerprint is None:
      digest = hashlib.blake2b(json.dumps(
          self.metadata.to_json_dict(), sort_keys=True).encode(),
                               digest_size=8)
      for name in sorted(self.arrays):
        flat = self.arrays[name].reshape(-1)  # a view of a memmap: no read
        digest.update(f"{name}{flat.dtype.str}"
                      f"{self.arrays[name].shape}".encode())
        digest.update(np.ascontiguousarray(flat[data_io.spread_positions(
            flat.size, _FINGERPRINT_BLOCKS, _FINGERPRINT_ELEMENTS)]).data)
      self._fingerprint = digest.hexdigest()
    return self._fingerprint

  def collate(self, example_ids, puzzle_ids):
    """Local rows of a global batch, padded to the global size."""
    meta = self.metadata
    pad = self.global_batch_size - len(example_ids)
    example_ids = np.asarray(example_ids)[self.local_slice]
    puzzle_ids = np.asarray(puzzle_ids)[self.local_slice]
    # Sorted reads from the memory-mapped arrays, put back in batch order.
    order = np.argsort(example_ids, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    inputs = np.asarray(self.arrays["inputs"][example_ids[order]],
                        np.int32)[inverse]
    labels = np.asarray(self.arrays["labels"][example_ids[order]],
                        np.int32)[inverse]
    if meta.ignore_label_id is not None:
      labels[labels == meta.ignore_label_id] = IGNORE_LABEL_ID
    identifiers = self.arrays["puzzle_identifiers"][puzzle_ids].astype(np.int32)
    local_pad = self.local_batch_size - len(example_ids)
    if local_pad:  # only test batches are short (pad rows: no labels)
      assert pad >= local_pad
      inputs = np.concatenate(
          [inputs, np.full((local_pad, meta.seq_len), meta.pad_id, np.int32)])
      labels = np.concatenate(
          [labels, np.full((local_pad, meta.seq_len), IGNORE_LABEL_ID,
                           np.int32)])
      identifiers = np.concatenate(
          [identifiers, np.full((local_pad,), meta.blank_identifier_id,
                                np.int32)])
    return {"inputs": inputs, "labels": labels,
            "puzzle_identifiers": identifiers}


class TrainBatches(_Split):
  """Random-access source: item k = this process's rows of train batch k."""

  def __init__(self, metadata, arrays, *, global_batch_size: int, seed: int,
               epochs_per_iter: int, num_batches: int, process_index: int = 0,
               process_count: int = 1):
    super().__init__(metadata, arrays, global_batch_size, process_index,
                     process_count)
    self.seed = seed
    self.epochs_per_iter = epochs_per_iter
    self.num_batches = num_batches
    self._lock = threading.Lock()
    self._iteration_starts = [0]  # first batch index of each iteration
    self._cache = {}  # iteration -> its batches (most recent only)
    self._group_indices = np.asarray(arrays["group_indices"])
    self._puzzle_indices = np.asarray(arrays["puzzle_indices"])
    # A split too small for one batch is found now, before anything is
    # compiled or written, rather than at the first step.
    if len(self._iteration(0)[1]) == 1:
      raise ValueError(
          f"The training split holds {int(self._puzzle_indices[-1])} examples"
          f" in {len(self._group_indices) - 1} groups: one iteration "
          f"(config.data.epochs_per_iter={epochs_per_iter} epochs, one puzzle"
          " per group per epoch) fills no global batch of "
          f"config.global_batch_size={global_batch_size}. Raise "
          "config.data.epochs_per_iter, lower config.global_batch_size, or "
          "build more training data.")

  def __len__(self):
    return self.num_batches

  def _iteration(self, i):
    if i not in self._cache:
      rng = np.random.Generator(np.random.Philox(self.seed + i))
      self._cache = {i: plan_iteration(
          rng, self._group_indices, self._puzzle_indices, self.epochs_per_iter,
          self.global_batch_size)}
    return self._cache[i]

  def batch_plan(self, k: int):
    """(example_ids, puzzle_ids) of global batch k."""
    with self._lock:
      while self._iteration_starts[-1] <= k:
        i = len(self._iteration_starts) - 1
        num_batches = len(self._iteration(i)[1]) - 1
        if num_batches == 0:
          raise ValueError("An iteration of the training data holds no full "
                           "batch; raise config.data.epochs_per_iter.")
        self._iteration_starts.append(self._iteration_starts[-1] + num_batches)
      i = bisect.bisect_right(self._iteration_starts, k) - 1
      puzzles, starts = self._iteration(i)
    j = k - self._iteration_starts[i]
    # Example subsets come from an RNG of their own per batch, so a batch can
    # be made without making the ones before it.
    rng = np.random.Generator(np.random.Philox(key=self.seed + i,
                                               counter=[0, 0, 1, j]))
    return batch_examples(rng, puzzles[starts[j]:starts[j + 1]],
                          self._puzzle_indices, self.global_batch_size)

  def __getitem__(self, k):
    if not 0 <= k < self.num_batches:
      raise IndexError(k)
    return self.collate(*self.batch_plan(k))


class TestBatches(_Split):
  """Sequential unshuffled batches over every test example; last one padded."""

  def __init__(self, metadata, arrays, *, global_batch_size: int,
               process_index: int = 0, process_count: int = 1,
               max_batches: int = -1):
    super().__init__(metadata, arrays, global_batch_size, process_index,
                     process_count)
    self.num_examples = int(arrays["puzzle_indices"][-1])
    if not self.num_examples:
      # Every evaluation would report nothing, and a run that keeps only
      # improved checkpoints would never save one.
      raise ValueError("The test split holds no examples: rebuild the "
                       "dataset with test puzzles (e.g. config.data.build."
                       "num_test >= 1).")
    # Puzzle of each example (examples of a puzzle are contiguous).
    self._example_puzzle = np.repeat(
        np.arange(len(arrays["puzzle_indices"]) - 1),
        np.diff(arrays["puzzle_indices"]))
    n = -(-self.num_examples // global_batch_size)
    self.num_batches = n if max_batches < 0 else min(n, max_batches)
    self.partial = self.num_batches < n  # max_batches leaves examples out

  def __len__(self):
    return self.num_batches

  def __getitem__(self, k):
    if not 0 <= k < self.num_batches:
      raise IndexError(k)
    start = k * self.global_batch_size
    ids = np.arange(start, min(start + self.global_batch_size,
                               self.num_examples))
    return self.collate(ids, self._example_puzzle[ids])
