"""Seeded random streams shared by the dataset builders.

Unlike upstream (which never seeds numpy), every random choice of a builder
comes from a `np.random.Generator` derived from its build seed, one
independent stream per purpose (`stream_rng`). Generated puzzles are drawn
one seed each (`generate_range`), so results do not depend on how the work
is split and a larger count extends a smaller one.
"""

from typing import Callable, Hashable, Optional, Sequence, Union

import numpy as np

Seed = Union[int, Sequence[int]]

# (seed entropy) -> (input, label) of one generated puzzle.
GenerateOne = Callable[[list[int]], tuple[Sequence[int], Sequence[int]]]


def entropy(seed: Seed) -> list[int]:
  """A seed (int or sequence of non-negative ints) as SeedSequence entropy."""
  return [int(seed)] if np.isscalar(seed) else [int(s) for s in seed]


def stream_rng(seed: int, stream: int) -> np.random.Generator:
  """The generator of random stream `stream` of the build seed `seed`."""
  return np.random.default_rng(np.random.SeedSequence([seed, stream]))


def subsample(arrays: tuple[np.ndarray, ...], size: Optional[int],
              seed: int, stream: int) -> tuple[np.ndarray, ...]:
  """The same random `size` rows (without replacement) of equally long
  arrays, drawn from `stream_rng(seed, stream)`.

  Returns `arrays` unchanged when `size` is None or not smaller than them.
  """
  n = len(arrays[0])
  if size is None or size >= n:
    return arrays
  idx = stream_rng(seed, stream).choice(n, size, replace=False)
  return tuple(a[idx] for a in arrays)


def generate_range(generate_one: GenerateOne, base: list[int], start: int,
                   stop: int, width: int) -> tuple[np.ndarray, np.ndarray]:
  """Puzzles k = start..stop-1 of the stream `base`.

  Puzzle k is `generate_one(base + [k])`, an (input, label) pair of `width`
  values each.

  Returns:
    (inputs, labels), uint8 [max(stop - start, 0), width].
  """
  n = max(stop - start, 0)
  inputs = np.zeros((n, width), np.uint8)
  labels = np.zeros((n, width), np.uint8)
  for j in range(n):
    inputs[j], labels[j] = generate_one(base + [start + j])
  return inputs, labels


def generate_distinct(n: int, generate_range_fn: Callable,
                      key: Callable[[np.ndarray], Hashable], seen: set,
                      width: int) -> tuple[np.ndarray, np.ndarray]:
  """`n` puzzles of a stream whose inputs' keys are not in `seen`.

  A collision is astronomically unlikely but would leak a test puzzle into
  training, so a puzzle whose `key(input)` is in `seen` (or equals an
  earlier one's) is dropped and replaced by further puzzles of the same
  stream. `seen` is updated with the keys of the puzzles returned.

  Args:
    n: number of puzzles.
    generate_range_fn: (start, stop) -> (inputs, labels) of puzzles
      start..stop-1 of the stream (see `generate_range`).
    key: identity of a puzzle's input.
    seen: keys to avoid; updated.
    width: values per input / label.

  Returns:
    (inputs, labels), uint8 [n, width].
  """
  inputs, labels = [], []
  next_k = 0
  while len(inputs) < n:
    stop = next_k + n - len(inputs)
    xs, ys = generate_range_fn(next_k, stop)
    next_k = stop
    for x, y in zip(xs, ys):
      k = key(x)
      if k not in seen:
        seen.add(k)
        inputs.append(x)
        labels.append(y)
  return (np.array(inputs, np.uint8).reshape(-1, width),
          np.array(labels, np.uint8).reshape(-1, width))
