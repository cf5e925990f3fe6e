"""ARC grids: validation, augmentation (dihedral + colour map), token encoding.

Encoding: each grid is drawn on a 30x30 canvas (PAD = 0) as colour + 2
(2..11); EOS = 1 marks the row just below and the column just right of the
grid (where they fit on the canvas; the corner cell between them stays PAD).
seq_len 900, vocab 12; every cell is a label (PAD 0 is the ignored label id).

An augmented puzzle is named `<name>|||t<tid>|||<c0c1...c9>` (c = the new
colour of each old colour 0..9; tid numbered as `trm.data.puzzles.dihedral`).
Used by the builder `trm.data.puzzles.arc` and the evaluator
`trm.families.trm.arc_eval`.
"""

import hashlib
from typing import Any, Sequence

import numpy as np

from trm.data.puzzles import dihedral

GRID_SIZE = 30
SEQ_LEN = GRID_SIZE * GRID_SIZE
PAD_ID = 0
EOS_ID = 1
COLOUR_OFFSET = 2  # Colour c is token c + 2.
NUM_COLOURS = 10
VOCAB_SIZE = NUM_COLOURS + COLOUR_OFFSET  # PAD, EOS, colours 0..9.
AUG_SEPARATOR = "|||"
BLANK_NAME = "<blank>"  # identifier 0: the rows that belong to no puzzle
RETRIES_FACTOR = 5  # At most RETRIES_FACTOR * num_aug augmentation draws.
Pair = tuple[np.ndarray, np.ndarray]
# ----------------------------------------------------------------------------
# Grids, augmentation and encoding.


def grid_to_np(grid: Any, where: str = "grid") -> np.ndarray:
  """A JSON grid (list of rows of 0..9) as uint8 [h, w], validated."""
  try:
    arr = np.asarray(grid)
  except ValueError as e:  # Ragged rows.
    raise ValueError(f"{where}: not a rectangular grid: {e}") from None
  if arr.ndim != 2 or arr.size == 0:
    raise ValueError(f"{where}: expected a non-empty 2-D grid, got shape "
                     f"{arr.shape}")
  if arr.shape[0] > GRID_SIZE or arr.shape[1] > GRID_SIZE:
    raise ValueError(f"{where}: grid {arr.shape} is larger than "
                     f"{GRID_SIZE}x{GRID_SIZE}")
  if not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or (
      arr.max() >= NUM_COLOURS):
    raise ValueError(f"{where}: cells must be integers 0..9")
  return arr.astype(np.uint8)


def augment_grid(grid: np.ndarray, tid: int, mapping: np.ndarray
                 ) -> np.ndarray:
  """Recolours (`mapping[old colour]`), then applies dihedral transform tid."""
  return dihedral.transform(mapping[grid], tid)


def inverse_augment_grid(grid: np.ndarray, tid: int, mapping: np.ndarray
                         ) -> np.ndarray:
  """Undoes `augment_grid(., tid, mapping)`."""
  return np.argsort(mapping).astype(np.uint8)[
      dihedral.inverse_transform(grid, tid)]


def aug_name(name: str, tid: int, mapping: np.ndarray) -> str:
  """Upstream's name of an augmented puzzle: `name|||t<tid>|||<colours>`."""
  colours = "".join(str(int(c)) for c in mapping)
  return f"{name}{AUG_SEPARATOR}t{tid}{AUG_SEPARATOR}{colours}"


def parse_aug_name(name: str) -> tuple[str, int, np.ndarray]:
  """(original name, tid, colour map) of a puzzle name; identity if plain."""
  if AUG_SEPARATOR not in name:
    return name, 0, np.arange(NUM_COLOURS, dtype=np.uint8)
  base, tid, colours = name.split(AUG_SEPARATOR)
  mapping = np.array([int(c) for c in colours], np.uint8)
  return base, int(tid[1:]), mapping


def encode_pair(inp: np.ndarray, out: np.ndarray, row: int = 0, col: int = 0
                ) -> tuple[np.ndarray, np.ndarray]:
  """Input and output grids as two uint8 [900] token rows at offset (row, col).
  """
  rows = np.zeros((2, GRID_SIZE, GRID_SIZE), np.uint8)
  draw(rows[0], inp, row, col)
  draw(rows[1], out, row, col)
  return rows[0].reshape(SEQ_LEN), rows[1].reshape(SEQ_LEN)


def draw(canvas: np.ndarray, grid: np.ndarray, row: int, col: int) -> None:
  """Draws `grid` (colours) and its EOS border on a zeroed 30x30 canvas."""
  h, w = grid.shape
  canvas[row:row + h, col:col + w] = grid + COLOUR_OFFSET
  if row + h < GRID_SIZE:
    canvas[row + h, col:col + w] = EOS_ID
  if col + w < GRID_SIZE:
    canvas[row:row + h, col + w] = EOS_ID


def decode_grid(tokens: np.ndarray) -> np.ndarray:
  """The grid of an encoded row drawn at (0, 0) (as in the test split).

  Takes the largest top-left rectangle of colour tokens (each row scanned
  left to right up to its first non-colour token, rows top to bottom until
  one starts with a non-colour token), as upstream's evaluator crops model
  outputs. Returns colours, uint8 [h, w] (possibly empty).
  """
  canvas = np.asarray(tokens).reshape(GRID_SIZE, GRID_SIZE)
  is_colour = (canvas >= COLOUR_OFFSET) & (canvas < VOCAB_SIZE)
  best, best_shape, width = 0, (0, 0), GRID_SIZE
  for r in range(GRID_SIZE):
    bad = np.flatnonzero(~is_colour[r, :width])
    if bad.size:
      width = int(bad[0])
    if (r + 1) * width > best:
      best, best_shape = (r + 1) * width, (r + 1, width)
  h, w = best_shape
  return (canvas[:h, :w] - COLOUR_OFFSET).astype(np.uint8)


def _pair_digest(inp: np.ndarray, out: np.ndarray) -> bytes:
  h = hashlib.sha256(bytes(inp.shape))
  h.update(inp.tobytes())
  h.update(bytes(out.shape))
  h.update(out.tobytes())
  return h.digest()


def puzzle_key(pairs: Sequence[Pair]) -> bytes:
  """Identity of a puzzle as the multiset of its (input, output) grids."""
  return b"".join(sorted(_pair_digest(a, b) for a, b in pairs))


def plan_augmentations(pairs: Sequence[Pair], num_aug: int,
                       rs: np.random.RandomState
                       ) -> tuple[np.ndarray, np.ndarray]:
  """Draws up to `num_aug` distinct augmentations of one puzzle.

  Same draws and duplicate rule as upstream: per try a transform id, then a
  permutation of the colours 1..9; a try whose augmented puzzle (all its
  pairs, whatever split they go to) equals the original or an accepted one
  is dropped; at most RETRIES_FACTOR * num_aug tries.

  Returns:
    (tids uint8 [k], colour maps uint8 [k, 10]) of the k <= num_aug accepted
    augmentations, in order.
  """
  tids, maps = [], []
  if num_aug > 0:
    seen = {puzzle_key(pairs)}
    for _ in range(RETRIES_FACTOR * num_aug):
      tid = int(rs.randint(0, dihedral.NUM_TRANSFORMS))
      mapping = np.concatenate([
          np.zeros(1, np.uint8),
          rs.permutation(np.arange(1, NUM_COLOURS, dtype=np.uint8))])
      key = puzzle_key([(augment_grid(a, tid, mapping),
                         augment_grid(b, tid, mapping)) for a, b in pairs])
      if key not in seen:
        seen.add(key)
        tids.append(tid)
        maps.append(mapping)
      if len(tids) >= num_aug:
        break
  return (np.array(tids, np.uint8),
          np.array(maps, np.uint8).reshape(-1, NUM_COLOURS))
