"""The 8 grid symmetries: distinct, invertible, numbered as upstream."""
import numpy as np
import pytest

from trm.data.puzzles import dihedral


def test_all_distinct_and_inverted():
  grid = np.arange(12).reshape(3, 4)
  images = {dihedral.transform(grid, t).tobytes() + bytes(
      dihedral.transform(grid, t).shape) for t in range(8)}
  assert len(images) == 8
  for t in range(8):
    np.testing.assert_array_equal(
        dihedral.inverse_transform(dihedral.transform(grid, t), t), grid)


def test_numbering():
  grid = np.array([[1, 2], [3, 4]])
  np.testing.assert_array_equal(dihedral.transform(grid, 1), [[2, 4], [1, 3]])
  np.testing.assert_array_equal(dihedral.transform(grid, 6), [[1, 3], [2, 4]])
  np.testing.assert_array_equal(dihedral.transform(grid, 7), [[4, 2], [3, 1]])
  with pytest.raises(ValueError, match="not in 0..7"):
    dihedral.transform(grid, 8)
