"""Sudoku puzzle generation: solution counting and an offline generator.

The generator (`generate_puzzles`) makes unique-solution puzzles with a fixed
number of blanks (the difficulty knob), checked with the bit-mask solution
counter (`count_solutions`). They are far easier than Sudoku-Extreme; they
exist so the pipeline and tests run without network. Used by the builder
`trm.data.puzzles.sudoku`.
"""

import functools
from typing import Optional, Sequence

import numpy as np

from trm.data.puzzles import builds
from trm.data.puzzles import seeding

SEQ_LEN = 81
# 17 givens is the proven minimum for a unique Sudoku, hence 81 - 17.
MAX_BLANKS = 64

Seed = seeding.Seed

# ----------------------------------------------------------------------------
# Solution counting.
#
# Cells are 0..80 in row-major order; digit d in 1..9 is the bit 1 << (d - 1).
# A search state is three lists of 9 used-digit masks (rows, columns, boxes),
# so a cell's candidates are one OR and one NOT.

_ALL = 0x1FF
_ROW = tuple(i // 9 for i in range(81))
_COL = tuple(i % 9 for i in range(81))
_BOX = tuple((i // 27) * 3 + (i % 9) // 3 for i in range(81))
_POPCOUNT = tuple(bin(m).count("1") for m in range(512))
_BIT_TO_DIGIT = {1 << d: d + 1 for d in range(9)}


def _count_from(rows: list[int], cols: list[int], boxes: list[int],
                empties: list[int], limit: int) -> int:
  """Counts completions of a partial grid, stopping once `limit` are found.

  Depth-first search that always expands the empty cell with the fewest
  candidates; a forced cell (one candidate) is filled in place without a new
  recursion level, which makes the naked-single propagation cheap. `rows`,
  `cols`, `boxes` and (as a set) `empties` are restored before returning.
  """
  placed = []
  found = 0
  while True:
    if not empties:
      found = 1
      break
    best_k, best_n, best_m = -1, 10, 0
    for k, i in enumerate(empties):
      m = _ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
      n = _POPCOUNT[m]
      if n < best_n:
        best_k, best_n, best_m = k, n, m
        if n <= 1:
          break
    if best_n == 0:
      break
    # Swap-remove: O(1), and the set of empties is all that must be restored.
    i = empties[best_k]
    empties[best_k] = empties[-1]
    empties.pop()
    r, c, b = _ROW[i], _COL[i], _BOX[i]
    if best_n == 1:
      rows[r] |= best_m
      cols[c] |= best_m
      boxes[b] |= best_m
      placed.append((i, best_m))
      continue
    m = best_m
    while m:
      bit = m & -m
      m ^= bit
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit
      found += _count_from(rows, cols, boxes, empties, limit - found)
      rows[r] ^= bit
      cols[c] ^= bit
      boxes[b] ^= bit
      if found >= limit:
        break
    empties.append(i)
    break
  for i, bit in placed:
    rows[_ROW[i]] ^= bit
    cols[_COL[i]] ^= bit
    boxes[_BOX[i]] ^= bit
    empties.append(i)
  return found


def _masks(board: Sequence[int]):
  """Unit masks and empty cells of a flat board, or None if givens clash."""
  rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
  empties = []
  for i, v in enumerate(board):
    if v == 0:
      empties.append(i)
      continue
    bit = 1 << (v - 1)
    r, c, b = _ROW[i], _COL[i], _BOX[i]
    if (rows[r] | cols[c] | boxes[b]) & bit:
      return None
    rows[r] |= bit
    cols[c] |= bit
    boxes[b] |= bit
  return rows, cols, boxes, empties


def count_solutions(board: np.ndarray, limit: int = 2) -> int:
  """Number of solutions of a Sudoku board, counted up to `limit`.

  Args:
    board: 81 (or 9x9) cell values, 0 = blank, 1..9 = given digit.
    limit: stop counting here; the default 2 answers "unique or not".

  Returns:
    min(number of solutions, limit); 0 if the givens already clash.
  """
  board = np.asarray(board).reshape(-1)
  if board.shape != (81,) or board.min() < 0 or board.max() > 9:
    raise ValueError(f"expected 81 cell values in 0..9, got {board}")
  state = _masks(board.tolist())
  if state is None:
    return 0
  return _count_from(*state, limit)


def valid_solutions(grids: np.ndarray, chunk: int = 1 << 16) -> np.ndarray:
  """[N] bool: which grids ([N, 81] values) are complete, legal Sudoku grids.

  Every row, column and 3x3 box must hold 1..9 once. Works through `chunk`
  grids at a time, so the millions of rows of a Sudoku-Extreme CSV need
  little memory.
  """
  g = np.asarray(grids).reshape(-1, 9, 9)
  ok = np.empty(len(g), bool)
  digits = np.arange(1, 10)
  for start in range(0, len(g), chunk):
    part = g[start:start + chunk]
    boxes = part.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(
        -1, 9, 9)
    units = np.concatenate([part, part.transpose(0, 2, 1), boxes], axis=1)
    ok[start:start + chunk] = (np.sort(units, axis=-1) == digits).all((1, 2))
  return ok


def is_valid_solution(grid: np.ndarray) -> bool:
  """True iff `grid` (81 or 9x9 values) is a complete, legal Sudoku grid."""
  return bool(valid_solutions(np.asarray(grid).reshape(1, 81))[0])


# ----------------------------------------------------------------------------
# Offline generator.


def _random_full_grid(rng: np.random.Generator) -> list[int]:
  """A random valid solved grid.

  The three diagonal boxes share no row, column or box, so they are filled
  with independent random permutations; the rest is completed by depth-first
  search trying digits in a random (pre-drawn, per cell) order. Completion
  from three independent boxes always exists, and the search rarely
  backtracks.
  """
  grid = [0] * 81
  for box in range(3):
    digits = rng.permutation(9) + 1
    for k in range(9):
      grid[(box * 3 + k // 3) * 9 + box * 3 + k % 3] = int(digits[k])
  orders = (rng.permuted(np.tile(np.arange(9), (81, 1)), axis=1)).tolist()
  rows, cols, boxes, empties = _masks(grid)

  def fill() -> bool:
    best, best_n, best_m = -1, 10, 0
    for i in empties:
      if grid[i]:
        continue
      m = _ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
      n = _POPCOUNT[m]
      if n < best_n:
        best, best_n, best_m = i, n, m
    if best < 0:
      return True
    r, c, b = _ROW[best], _COL[best], _BOX[best]
    for d in orders[best]:
      bit = 1 << d
      if not best_m & bit:
        continue
      grid[best] = d + 1
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit
      if fill():
        return True
      rows[r] ^= bit
      cols[c] ^= bit
      boxes[b] ^= bit
      grid[best] = 0
    return False

  if not fill():  # Cannot happen; guards against a broken invariant.
    raise AssertionError("failed to complete a Sudoku grid")
  return grid


def _remove_cells(solution: list[int], num_blanks: int,
                  rng: np.random.Generator) -> Optional[list[int]]:
  """Blanks cells of a solved grid in random order, keeping the solution unique.

  Uniqueness after blanking cell c (solution value s) is checked
  incrementally: the current puzzle P has the unique solution `solution`, so
  any other solution of P minus c must put a digit v != s at c. It is enough
  to ask, for each candidate v != s of c, whether P minus c plus (c = v) is
  solvable at all; usually c has no such candidate and nothing is searched.

  Returns:
    The board with exactly `num_blanks` blanks, or None when a full pass over
    the cells reaches a minimal puzzle (no cell can be blanked) first.
  """
  board = list(solution)
  rows, cols, boxes, _ = _masks(board)
  empties = []
  for i in rng.permutation(81).tolist():
    if len(empties) == num_blanks:
      break
    s_bit = 1 << (solution[i] - 1)
    r, c, b = _ROW[i], _COL[i], _BOX[i]
    rows[r] ^= s_bit
    cols[c] ^= s_bit
    boxes[b] ^= s_bit
    others = _ALL & ~(rows[r] | cols[c] | boxes[b]) & ~s_bit
    unique = True
    while others and unique:
      bit = others & -others
      others ^= bit
      rows[r] |= bit
      cols[c] |= bit
      boxes[b] |= bit
      unique = _count_from(rows, cols, boxes, empties, 1) == 0
      rows[r] ^= bit
      cols[c] ^= bit
      boxes[b] ^= bit
    if unique:
      board[i] = 0
      empties.append(i)
    else:
      rows[r] |= s_bit
      cols[c] |= s_bit
      boxes[b] |= s_bit
  return board if len(empties) == num_blanks else None


def _generate_one(seed: Seed, num_blanks: int, max_attempts: int):
  """One (board, solution) pair from its own seed; see `generate_puzzles`."""
  rng = np.random.default_rng(np.random.SeedSequence(seed))
  for _ in range(max_attempts):
    solution = _random_full_grid(rng)
    board = _remove_cells(solution, num_blanks, rng)
    if board is not None:
      return board, solution
  # The setting is out of the generator's reach, not a bug: one line naming
  # it (as config.data.build.num_blanks from trm.main), no traceback.
  raise builds.BuildArgumentError(
      f"num_blanks={num_blanks}: no puzzle with that many blanks and a "
      f"unique solution in {max_attempts} fresh grids; use fewer blanks "
      "(greedy blanking seldom gets past ~58)")


def generate_puzzles(n: int, num_blanks: int, seed: Seed,
                     max_attempts: int = 1000
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Generates `n` random Sudoku puzzles with unique solutions.

  Each puzzle starts from a random full grid; cells are blanked one at a
  time in random order, skipping any cell whose removal would allow a second
  solution, until `num_blanks` cells are blank. If one pass over all cells
  ends in a minimal puzzle with fewer blanks (only likely above ~50 blanks),
  that grid is discarded and a new one is drawn (retry, never "keep what was
  reached"), so every puzzle has exactly `num_blanks` blanks.

  Puzzle k uses the seed (seed..., k), so results do not depend on how the
  work is split, and a larger `n` extends a smaller one.

  Args:
    n: number of puzzles.
    num_blanks: blanks per puzzle, 0..64; the difficulty knob.
    seed: int or sequence of non-negative ints.
    max_attempts: fresh grids tried per puzzle before giving up.

  Returns:
    (boards, solutions), uint8 [n, 81]; 0 = blank, 1..9 = digits.
  """
  if not 0 <= num_blanks <= MAX_BLANKS:
    raise ValueError(f"num_blanks must be in [0, {MAX_BLANKS}], got "
                     f"{num_blanks}")
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  return generate_range(seeding.entropy(seed), 0, n, num_blanks,
                         max_attempts)


def generate_range(base: list[int], start: int, stop: int, num_blanks: int,
                    max_attempts: int = 1000) -> tuple[np.ndarray, np.ndarray]:
  """Puzzles k = start..stop-1 of the stream `base` (see `generate_puzzles`)."""
  return seeding.generate_range(
      functools.partial(_generate_one, num_blanks=num_blanks,
                        max_attempts=max_attempts), base, start, stop, SEQ_LEN)
