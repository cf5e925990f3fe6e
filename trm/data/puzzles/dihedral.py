"""The 8 symmetries of a square grid, numbered as upstream TRM/HRM number
them (`dataset/common.py`), so augmentation names and evaluator inversions
interchange with upstream datasets.

  0 identity        4 left-right flip
  1 rot90 (ccw)     5 up-down flip
  2 rot180          6 transpose (main diagonal)
  3 rot270          7 anti-diagonal reflection (rot90, then left-right flip)
"""
from __future__ import annotations

import numpy as np

NUM_TRANSFORMS = 8
# INVERSE[t] undoes transform t (rotations by 90 and 270 undo each other;
# the others are their own inverses).
INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)


def transform(grid: np.ndarray, tid: int) -> np.ndarray:
  """Applies symmetry `tid` to a 2-D grid."""
  if tid == 0:
    return grid
  if tid in (1, 2, 3):
    return np.rot90(grid, k=tid)
  if tid == 4:
    return np.fliplr(grid)
  if tid == 5:
    return np.flipud(grid)
  if tid == 6:
    return grid.T
  if tid == 7:
    return np.fliplr(np.rot90(grid, k=1))
  raise ValueError(f"Dihedral transform id {tid} is not in 0..7.")


def inverse_transform(grid: np.ndarray, tid: int) -> np.ndarray:
  return transform(grid, INVERSE[tid])
