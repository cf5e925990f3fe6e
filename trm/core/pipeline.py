"""Grain pipelines that yield globally sharded `jax.Array` batches.

Each process reads only its rows of every global batch (see
`puzzle_dataset`), Grain prefetches them on background threads, and
`jax.make_array_from_process_local_data` assembles the global array sharded
on the batch axes. The Grain iterator's state (a position) is what the
checkpoint stores next to the model.
"""
from __future__ import annotations

import grain
import jax
import numpy as np


class _AtLeast:
  """`source`, counted as at least `length` items (those past its own end
  raise its IndexError)."""

  def __init__(self, source, length: int):
    self.source, self.length = source, length

  def __len__(self):
    return max(len(self.source), self.length)

  def __getitem__(self, k):
    return self.source[k]


def grain_iterator(source, prefetch: int = 2, num_threads: int = 1,
                   min_length: int = 0):
  """A checkpointable iterator over a random-access source. `min_length`:
  positions up to it restore (a run resumed past a lowered
  config.total_steps, whose training source is that long, reads nothing
  more but must restore its position)."""
  if len(source) < min_length:
    source = _AtLeast(source, min_length)
  dataset = grain.MapDataset.source(source)
  return iter(dataset.to_iter_dataset(
      grain.ReadOptions(num_threads=num_threads,
                        prefetch_buffer_size=prefetch)))


def to_global(local_batch: dict[str, np.ndarray], shardings: dict):
  """Process-local numpy rows -> global arrays (batch axis sharded)."""
  return {k: jax.make_array_from_process_local_data(shardings[k], v)
          for k, v in local_batch.items()}
