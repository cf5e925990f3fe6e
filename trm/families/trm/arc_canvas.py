"""ARC canvases and augmentation names, as the ARC evaluator reads them.

Canvas encoding (upstream `build_arc_dataset.py`): 30x30 row-major, PAD=0,
EOS=1 marking the row below and the column right of the grid, colour c as
c + 2. An augmented puzzle is named `<name>|||t<tid>|||<perm>`: first colour
c becomes int(perm[c]), then dihedral transform `tid`
(`trm.data.puzzles.dihedral`) is applied; originals carry no suffix. Used by
`trm.families.trm.arc_eval` and `trm.visualize`.
"""

from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from trm.data.puzzles import dihedral

GRID_SIZE = 30
PAD_ID = 0
EOS_ID = 1
COLOR_OFFSET = 2  # Colour c is token c + 2.
NUM_COLORS = 10
SEPARATOR = "|||"
DIGEST_BYTES = 16  # Size of `grid_digest`.


# ----------------------------------------------------------------------------
# Grids.


def crop_sizes(canvases: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(rows, cols) of the grid each canvas holds, as upstream's `_crop`.

  The grid is the largest-area rectangle anchored at the top-left corner
  that holds colour tokens only (2..11): row r may keep the first w_r cells
  before its first non-colour token, a rectangle of r rows is as wide as the
  narrowest of them, and the first r reaching the largest area wins. A canvas
  starting with a non-colour token gives (0, 0).

  Args:
    canvases: [N, 900] (or [N, 30, 30]) token ids.

  Returns:
    Two int arrays [N].
  """
  g = np.asarray(canvases).reshape(-1, GRID_SIZE, GRID_SIZE)
  invalid = (g < COLOR_OFFSET) | (g >= COLOR_OFFSET + NUM_COLORS)
  # Width of each row before its first non-colour token (30 if none).
  widths = np.where(invalid.any(-1), invalid.argmax(-1), GRID_SIZE)
  widths = np.minimum.accumulate(widths, axis=1)
  areas = widths * np.arange(1, GRID_SIZE + 1)
  best = areas.argmax(1)  # First maximum, as upstream's strict `>`.
  n = np.arange(g.shape[0])
  found = areas[n, best] > 0
  rows = np.where(found, best + 1, 0)
  cols = np.where(found, widths[n, best], 0)
  return rows, cols


def crop(canvas: np.ndarray) -> np.ndarray:
  """The grid (uint8 colours 0..9, [rows, cols]) drawn on a 900-token canvas."""
  canvas = np.asarray(canvas)
  rows, cols = crop_sizes(canvas[None])
  g = canvas.reshape(GRID_SIZE, GRID_SIZE)
  return (g[:rows[0], :cols[0]].astype(np.int64) - COLOR_OFFSET).astype(
      np.uint8)


def to_canvas(grid) -> np.ndarray:
  """Encodes a grid (colours 0..9) at the top-left of a canvas, uint8 [900].

  The test-split encoding of upstream's builder (no translation): colours +2,
  EOS below and right of the grid (not on the corner cell), PAD elsewhere.
  """
  grid = np.asarray(grid, np.int64)
  if grid.ndim != 2 or grid.shape[0] > GRID_SIZE or grid.shape[1] > GRID_SIZE:
    raise ValueError(f"expected a 2-D grid of at most {GRID_SIZE}x{GRID_SIZE},"
                     f" got shape {grid.shape}")
  rows, cols = grid.shape
  canvas = np.full((GRID_SIZE, GRID_SIZE), PAD_ID, np.uint8)
  canvas[:rows, :cols] = grid + COLOR_OFFSET
  if rows < GRID_SIZE:
    canvas[rows, :cols] = EOS_ID
  if cols < GRID_SIZE:
    canvas[:rows, cols] = EOS_ID
  return canvas.reshape(-1)


def grid_digest(grid: np.ndarray) -> bytes:
  """128-bit hash of a grid's shape and colours (16 bytes)."""
  grid = np.ascontiguousarray(grid, np.uint8)
  h = hashlib.blake2b(digest_size=DIGEST_BYTES)
  h.update(np.asarray(grid.shape, "<u2").tobytes())
  h.update(grid.tobytes())
  return h.digest()


# ----------------------------------------------------------------------------
# Augmentation names.


def parse_name(name: str) -> tuple[str, int, Optional[np.ndarray]]:
  """Splits an augmented puzzle name.

  Returns:
    (original name, dihedral id, colour map or None for an original). The
    colour map holds at index c the colour that original colour c became.

  Raises:
    ValueError: a malformed suffix.
  """
  if SEPARATOR not in name:
    return name, 0, None
  parts = name.split(SEPARATOR)
  if len(parts) < 3:
    raise ValueError(f"puzzle name {name!r}: expected "
                     f"'name{SEPARATOR}t<tid>{SEPARATOR}<perm>'")
  tid_text, perm = parts[-2], parts[-1]
  if (not tid_text.startswith("t") or not tid_text[1:].isdigit()
      or int(tid_text[1:]) >= dihedral.NUM_TRANSFORMS):
    raise ValueError(f"puzzle name {name!r}: bad transform {tid_text!r}")
  if (len(perm) != NUM_COLORS or not perm.isdigit()
      or sorted(perm) != [str(c) for c in range(NUM_COLORS)]):
    raise ValueError(f"puzzle name {name!r}: colour permutation {perm!r} is "
                     f"not a permutation of 0..9")
  return parts[0], int(tid_text[1:]), np.array([int(c) for c in perm],
                                               np.uint8)


def augment(grid: np.ndarray, tid: int,
            color_map: Optional[np.ndarray]) -> np.ndarray:
  """Applies an augmentation: colour map first, then dihedral `tid`."""
  grid = np.asarray(grid, np.uint8)
  if color_map is not None:
    grid = np.asarray(color_map, np.uint8)[grid]
  return np.ascontiguousarray(dihedral.transform(grid, tid))


def inverse_augment(grid: np.ndarray, tid: int,
                    color_map: Optional[np.ndarray]) -> np.ndarray:
  """Undoes `augment(., tid, color_map)`."""
  grid = np.ascontiguousarray(dihedral.inverse_transform(
      np.asarray(grid, np.uint8), tid))
  if color_map is not None:
    grid = np.argsort(color_map).astype(np.uint8)[grid]
  return grid
