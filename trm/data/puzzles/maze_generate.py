"""Offline, seeded generator of 30x30 mazes with one long shortest path.

The mazes exist so the Maze pipeline and tests run without network; their
layout differs from upstream's Maze-Hard mazes (see `generate_mazes`). Used by
the builder `trm.data.puzzles.maze`.
"""

import collections
import functools
from typing import Optional

import numpy as np

from trm.data.puzzles import builds
from trm.data.puzzles import maze_grid
from trm.data.puzzles import seeding

# Maze-Hard keeps mazes whose shortest path is longer than 110 moves.
DEFAULT_MIN_PATH_LENGTH = 111
# Decoy loops opened per generated maze (see `generate_mazes`).
DEFAULT_NUM_LOOPS = 24

Seed = seeding.Seed
# ----------------------------------------------------------------------------
# Offline generator.


def _carve_tree(rng: np.random.Generator) -> list:
  """Open cells forming a random tree (a "perfect" maze).

  Randomised depth-first search on the cell grid itself (no room lattice):
  a closed cell may be opened from the current cell only if none of its
  other orthogonal neighbours is open, so the open cells stay a tree (no
  cycles, no 2x2 open blocks) with corridors one cell wide. Depth-first
  growth makes long winding corridors, hence long paths.
  """
  passable = [False] * maze_grid.SEQ_LEN
  open_nb = [0] * maze_grid.SEQ_LEN  # open orthogonal neighbours of each cell
  draws = rng.random(maze_grid.SEQ_LEN + 1).tolist()  # one per opened cell

  def open_cell(i):
    passable[i] = True
    for n in maze_grid.NEIGHBOURS[i]:
      open_nb[n] += 1

  start = int(draws.pop() * maze_grid.SEQ_LEN)
  open_cell(start)
  stack = [start]
  while stack:
    cell = stack[-1]
    # `cell` is open and adjacent, so a count of 1 means "only `cell`".
    options = [
        n for n in maze_grid.NEIGHBOURS[cell]
        if open_nb[n] == 1 and not passable[n]
    ]
    if not options:
      stack.pop()
      continue
    nxt = options[int(draws.pop() * len(options))]
    open_cell(nxt)
    stack.append(nxt)
  return passable


def _relax(passable: list, dist: list, cell: int) -> None:
  """Updates exact BFS distances after `cell` was opened (distances only
  shrink; the change spreads outwards from `cell`)."""
  dist[cell] = min(dist[n]
                   for n in maze_grid.NEIGHBOURS[cell]
                   if passable[n] and dist[n] >= 0) + 1
  queue = collections.deque([cell])
  while queue:
    u = queue.popleft()
    du = dist[u] + 1
    for v in maze_grid.NEIGHBOURS[u]:
      if passable[v] and dist[v] > du:
        dist[v] = du
        queue.append(v)


def _bridges(passable: list, cell: int) -> Optional[tuple[int, int]]:
  """The two open cells a closed cell separates in a straight line, if it
  has exactly those two open neighbours; else None."""
  open_nb = [n for n in maze_grid.NEIGHBOURS[cell] if passable[n]]
  if len(open_nb) != 2:
    return None
  a, b = open_nb
  # left+right or up+down only
  if abs(a - b) not in (2, 2 * maze_grid.GRID_SIZE):
    return None
  return a, b


def _add_decoy_loops(rng: np.random.Generator, passable: list, dist_s: list,
                     dist_g: list, num_loops: int) -> int:
  """Opens up to `num_loops` walls that each close a loop, keeping the
  shortest S->G path unique and unchanged.

  A wall w between open cells a and b adds S->G routes of length
  dist_s[a] + 2 + dist_g[b] (and with a, b swapped); w is opened only when
  both are strictly longer than the current shortest path, so the path and
  its uniqueness stay as they were. `dist_s`, `dist_g` are kept exact.

  Returns:
    The number of loops opened.
  """
  goal_dist = dist_s[dist_g.index(0)]
  walls = [i for i in range(maze_grid.SEQ_LEN)
           if not passable[i] and _bridges(passable, i) is not None]
  added = 0
  for k in rng.permutation(len(walls)).tolist():
    if added == num_loops:
      break
    w = walls[k]
    pair = _bridges(passable, w)  # Re-check: earlier openings may touch w.
    if pair is None:
      continue
    a, b = pair
    if min(dist_s[a] + dist_g[b], dist_s[b] + dist_g[a]) + 2 <= goal_dist:
      continue
    passable[w] = True
    _relax(passable, dist_s, w)
    _relax(passable, dist_g, w)
    added += 1
  return added


def _generate_one(seed: Seed, min_path_length: int, num_loops: int,
                  max_attempts: int) -> tuple[np.ndarray, np.ndarray]:
  """One (question, answer) pair from its own seed; see `generate_mazes`."""
  rng = np.random.default_rng(np.random.SeedSequence(seed))
  for _ in range(max_attempts):
    passable = _carve_tree(rng)
    cells = [i for i in range(maze_grid.SEQ_LEN) if passable[i]]
    start = cells[int(rng.integers(len(cells)))]
    dist_s = maze_grid.bfs(passable, start)
    far = [i for i in cells if dist_s[i] >= min_path_length]
    if not far:
      continue
    goal = far[int(rng.integers(len(far)))]
    dist_g = maze_grid.bfs(passable, goal)
    _add_decoy_loops(rng, passable, dist_s, dist_g, num_loops)
    question = np.where(passable, maze_grid.OPEN,
                        maze_grid.WALL).astype(np.uint8)
    question[start], question[goal] = maze_grid.START, maze_grid.GOAL
    answer, length, num_shortest = maze_grid.solve(question)
    # The construction guarantees both; checked so a broken invariant can
    # never reach a dataset.
    if num_shortest != 1 or length != dist_s[goal]:
      raise AssertionError(f"generated maze has {num_shortest} shortest "
                           f"paths of length {length}, expected one of "
                           f"{dist_s[goal]}")
    return question, answer
  # The setting is out of the generator's reach, not a bug: one line naming
  # it (as config.data.build.min_path_length from trm.main), no traceback.
  raise builds.BuildArgumentError(
      f"min_path_length={min_path_length}: no maze with a shortest path "
      f"that long in {max_attempts} attempts; lower it (30x30 tree mazes "
      "rarely reach 300)")


def generate_mazes(n: int, seed: Seed,
                   min_path_length: int = DEFAULT_MIN_PATH_LENGTH,
                   num_loops: int = DEFAULT_NUM_LOOPS,
                   max_attempts: int = 100
                   ) -> tuple[np.ndarray, np.ndarray]:
  """Generates `n` random 30x30 mazes with a long, unique shortest path.

  Each maze is a random spanning tree of open cells (`_carve_tree`). A start
  S is drawn uniformly from the open cells and a goal G uniformly from the
  open cells at least `min_path_length` moves away (a new tree is drawn if
  there are none). Then up to `num_loops` walls are opened, each closing a
  loop whose route S->G is strictly longer than the shortest path: the
  maze has decoy alternatives at branch points, but its shortest path is
  still the tree path and the only shortest path.

  The label is therefore well defined: the answer marks THE shortest path,
  there is no tie to break, so a model is never penalised for choosing
  another equally short path (upstream's CSV labels come with their data;
  its mazes may contain ties). Path length is counted in moves; the answer
  has length - 1 'o' cells.

  These mazes look different from upstream's Maze-Hard (corridors one cell
  wide, no open areas), so accuracy on them says nothing about Maze-Hard.

  Maze k uses the seed (seed..., k), so results do not depend on how the
  work is split, and a larger `n` extends a smaller one.

  Args:
    n: number of mazes.
    seed: int or sequence of non-negative ints.
    min_path_length: minimum shortest-path length in moves (>= 1).
    num_loops: decoy loops opened per maze (fewer if no more qualify).
    max_attempts: fresh trees tried per maze before giving up.

  Returns:
    (questions, answers), uint8 token ids [n, 900].
  """
  _check_generate_args(n, min_path_length, num_loops)
  return generate_range(seeding.entropy(seed), 0, n, min_path_length,
                         num_loops, max_attempts)


def _check_generate_args(n: int, min_path_length: int, num_loops: int):
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  if not 1 <= min_path_length < maze_grid.SEQ_LEN:
    raise ValueError(
        f"min_path_length must be in [1, {maze_grid.SEQ_LEN - 1}], got "
        f"{min_path_length}")
  if num_loops < 0:
    raise ValueError(f"num_loops must be >= 0, got {num_loops}")


def generate_range(base: list[int], start: int, stop: int,
                    min_path_length: int, num_loops: int = DEFAULT_NUM_LOOPS,
                    max_attempts: int = 100
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Mazes k = start..stop-1 of the stream `base` (see `generate_mazes`)."""
  return seeding.generate_range(
      functools.partial(_generate_one, min_path_length=min_path_length,
                        num_loops=num_loops, max_attempts=max_attempts),
      base, start, stop, maze_grid.SEQ_LEN)
