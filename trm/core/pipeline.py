"""Grain pipelines that yield globally sharded `jax.Array` batches.

Each process reads only its rows of every global batch (see
`puzzle_dataset`), Grain prefetches them on background threads, and
`jax.make_array_from_process_local_data` assembles the global array sharded
on the batch axes. The Grain iterator's state (a position) is what the
checkpoint stores next to the model. A source that names its data
(`fingerprint()`: `sft.SFTBatches`, whose order depends on every row,
`text.TokenWindows` and the puzzles' `TrainBatches`) has that name saved
beside the position, and a
position saved over other data is refused on restore: resuming it would
not continue the stream (repeating and skipping rows).
"""
from __future__ import annotations

from absl import logging
import grain
import jax
import numpy as np

# The key of the data's fingerprint in a saved iterator state.
DATA_KEY = "data_fingerprint"


class _AtLeast:
  """`source`, counted as at least `length` items (those past its own end
  raise its IndexError)."""

  def __init__(self, source, length: int):
    self.source, self.length = source, length

  def __len__(self):
    return max(len(self.source), self.length)

  def __getitem__(self, k):
    return self.source[k]


class _NamedDataIterator:
  """A Grain iterator whose state also holds its source's fingerprint, and
  which refuses a state saved over other data (see the module doc)."""

  def __init__(self, iterator, fingerprint, allow_data_change: bool):
    self._iterator = iterator
    self._fingerprint = fingerprint  # called once, when first needed
    self._name = None
    self._allow_data_change = allow_data_change

  def _data_name(self) -> str:
    if self._name is None:
      self._name = self._fingerprint()
    return self._name

  def __iter__(self):
    return self

  def __next__(self):
    return next(self._iterator)

  def get_state(self) -> dict:
    return {**self._iterator.get_state(), DATA_KEY: self._data_name()}

  def set_state(self, state: dict) -> None:
    state = dict(state)
    saved = state.pop(DATA_KEY, None)  # None: saved before it was kept
    if saved is not None and saved != self._data_name():
      problem = (f"the training data (config.data's files) is not what it "
                 f"was trained on (data fingerprint {self._data_name()}, "
                 f"saved {saved}), so its position does not continue the "
                 "stream it trained on (rows would repeat, others be "
                 "skipped)")
      if not self._allow_data_change:
        raise ValueError(f"{problem}; set config.allow_config_change=True "
                         "to go on with these rows anyway")
      logging.warning("Resuming although %s (config.allow_config_change).",
                      problem)
    self._iterator.set_state(state)


def grain_iterator(source, prefetch: int = 2, num_threads: int = 1,
                   min_length: int = 0, allow_data_change: bool = False):
  """A checkpointable iterator over a random-access source. `min_length`:
  positions up to it restore (a run resumed past a lowered
  config.total_steps, whose training source is that long, reads nothing
  more but must restore its position). A source with `fingerprint()` has it
  checked on restore; `allow_data_change` makes a mismatch a warning."""
  fingerprint = getattr(source, "fingerprint", None)
  if len(source) < min_length:
    source = _AtLeast(source, min_length)
  dataset = grain.MapDataset.source(source)
  iterator = iter(dataset.to_iter_dataset(
      grain.ReadOptions(num_threads=num_threads,
                        prefetch_buffer_size=prefetch)))
  if fingerprint is None:
    return iterator
  return _NamedDataIterator(iterator, fingerprint, allow_data_change)


def _process_rows(sharding, shape) -> np.ndarray | None:
  """Where the sources' global row i lands, or None if at i.

  Process p's source reads rows [p*L, (p+1)*L) of each global batch, and
  `jax.make_array_from_process_local_data` lays them out over the rows
  p's devices hold, in order. A mesh whose devices do not hold the rows in
  process order (the batch over ('fsdp', 'data'), fsdp across slices, a
  TPU mesh that orders hosts otherwise) put them elsewhere: batches were
  permuted against one process's, and trm.evaluate's predictions file
  paired example i with another example's prediction."""
  rows, held = shape[0], {}
  for device, index in sharding.devices_indices_map(tuple(shape)).items():
    held.setdefault(device.process_index, set()).update(
        range(rows)[index[0]])
  if len(held) < 2:
    return None
  placed = np.concatenate([sorted(held[p]) for p in sorted(held)])
  if len(placed) != rows or (placed == np.arange(rows)).all():
    return None  # in order (or rows on several processes: mesh.py refuses)
  return placed


_REORDERS = {}  # (sharding, shape) -> a jitted gather, or None


def to_global(local_batch: dict[str, np.ndarray], shardings: dict):
  """Process-local numpy rows -> global arrays (batch axis sharded), with
  the global batch's rows in the sources' order (`_process_rows`)."""
  batch = {}
  for k, v in local_batch.items():
    sharding = shardings[k]
    array = jax.make_array_from_process_local_data(sharding, v)
    key = (sharding, array.shape)
    if key not in _REORDERS:
      placed = _process_rows(sharding, array.shape)
      _REORDERS[key] = None if placed is None else jax.jit(
          lambda x, placed=placed: x[placed], out_shardings=sharding)
    batch[k] = array if _REORDERS[key] is None else _REORDERS[key](array)
  return batch
