"""Maze grids: text <-> tokens, shortest-path solving, dihedral images.

Grids are 30x30 characters, row-major: '#' wall, ' ' open, 'S' start,
'G' goal, 'o' path. Tokens follow upstream's CHARSET "# SGo": '#'=1, ' '=2,
'S'=3, 'G'=4, 'o'=5, 0 = padding. Used by the builder `trm.data.puzzles.maze`
and its generator `trm.data.puzzles.maze_generate`.
"""

import collections
from typing import Optional

import numpy as np

from trm.data.puzzles import dihedral

GRID_SIZE = 30
SEQ_LEN = GRID_SIZE * GRID_SIZE
# Upstream's character set; token id = index + 1, so 0 is free for padding.
CHARSET = "# SGo"
VOCAB_SIZE = len(CHARSET) + 1
WALL, OPEN, START, GOAL, PATH = range(1, 6)

# Character byte -> token id; 0 marks a character that is not allowed.
_TOKEN_OF_BYTE = np.zeros(256, np.uint8)
_TOKEN_OF_BYTE[[ord(ch) for ch in CHARSET]] = np.arange(1, len(CHARSET) + 1)
_BYTE_OF_TOKEN = np.frombuffer(("?" + CHARSET).encode("ascii"), np.uint8)

# ----------------------------------------------------------------------------
# Text <-> tokens.


def encode(text: str) -> np.ndarray:
  """A maze string (characters of CHARSET) as uint8 token ids, same length."""
  ids = _TOKEN_OF_BYTE[np.frombuffer(text.encode("ascii", errors="replace"),
                                     np.uint8)]
  if ids.size and not ids.all():
    bad = text[int(np.argmin(ids))]
    raise ValueError(f"character {bad!r} is not in CHARSET {CHARSET!r}")
  return ids


def decode(tokens: np.ndarray) -> str:
  """Token ids (any shape, flattened row-major) as a maze string."""
  tokens = np.asarray(tokens).reshape(-1)
  if tokens.size and (tokens.min() < 1 or tokens.max() > len(CHARSET)):
    raise ValueError(f"token ids must lie in 1..{len(CHARSET)}")
  return _BYTE_OF_TOKEN[tokens].tobytes().decode("ascii")


def render(tokens: np.ndarray) -> str:
  """A 30x30 grid of token ids as 30 lines of text (for printing)."""
  text = decode(tokens)
  return "\n".join(text[r * GRID_SIZE:(r + 1) * GRID_SIZE]
                   for r in range(GRID_SIZE))


# ----------------------------------------------------------------------------
# Grid graph. Cells are 0..899 in row-major order; moves are the 4
# orthogonal steps.


def _neighbours(size: int) -> tuple[tuple[int, ...], ...]:
  out = []
  for i in range(size * size):
    r, c = divmod(i, size)
    out.append(tuple(j for j, ok in ((i - size, r > 0),
                                     (i + size, r < size - 1),
                                     (i - 1, c > 0),
                                     (i + 1, c < size - 1)) if ok))
  return tuple(out)


NEIGHBOURS = _neighbours(GRID_SIZE)


def bfs(passable: list, source: int, count_limit: int = 0):
  """Distances (moves; -1 = unreachable) from `source` over passable cells.

  With `count_limit` > 0 also returns the number of shortest paths to each
  cell, capped at `count_limit`.
  """
  dist = [-1] * SEQ_LEN
  count = [0] * SEQ_LEN
  dist[source], count[source] = 0, 1
  queue = collections.deque([source])
  while queue:
    u = queue.popleft()
    du, cu = dist[u] + 1, count[u]
    for v in NEIGHBOURS[u]:
      if not passable[v]:
        continue
      if dist[v] < 0:
        dist[v], count[v] = du, cu
        queue.append(v)
      elif count_limit and dist[v] == du:
        count[v] = min(count[v] + cu, count_limit)
  return (dist, count) if count_limit else dist


def _check_shape(tokens: np.ndarray) -> np.ndarray:
  tokens = np.asarray(tokens).reshape(-1)
  if tokens.shape != (SEQ_LEN,):
    raise ValueError(f"expected {SEQ_LEN} cells ({GRID_SIZE}x{GRID_SIZE}), "
                     f"got {tokens.size}")
  return tokens


def solve(question: np.ndarray) -> tuple[Optional[np.ndarray], int, int]:
  """Shortest S->G path of a maze, by breadth-first search.

  Args:
    question: 900 (or 30x30) token ids with exactly one START and one GOAL.

  Returns:
    (answer, length, num_shortest): `length` is the number of moves (-1 if G
    is unreachable) and `num_shortest` the number of distinct shortest paths,
    capped at 2. `answer` is the question with the path interior set to PATH
    when the shortest path is unique, else None (no canonical answer).
  """
  q = _check_shape(question)
  starts, goals = np.flatnonzero(q == START), np.flatnonzero(q == GOAL)
  if len(starts) != 1 or len(goals) != 1:
    raise ValueError(f"a maze needs one start and one goal, got "
                     f"{len(starts)} and {len(goals)}")
  s, g = int(starts[0]), int(goals[0])
  passable = (q != WALL).tolist()
  dist, count = bfs(passable, s, count_limit=2)
  if dist[g] < 0:
    return None, -1, 0
  if count[g] > 1:
    return None, dist[g], count[g]
  answer = q.astype(np.uint8).copy()
  for cell in _trace_back(passable, dist, g)[1:-1]:
    answer[cell] = PATH
  return answer.reshape(np.shape(question)), dist[g], 1


def _trace_back(passable: list, dist: list, goal: int) -> list[int]:
  """Cells of a shortest path from the BFS source to `goal` (source first).

  Follows strictly decreasing distance; when the path is unique every step
  has exactly one choice.
  """
  path = [goal]
  cell = goal
  while dist[cell] > 0:
    cell = next(v for v in NEIGHBOURS[cell]
                if passable[v] and dist[v] == dist[cell] - 1)
    path.append(cell)
  return path[::-1]


# ----------------------------------------------------------------------------
# Augmentation.


def dihedral_augment(question: np.ndarray, answer: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
  """The 8 dihedral images of a maze and its answer, upstream's order.

  Args:
    question, answer: 900 (or 30x30) token ids.

  Returns:
    (questions, answers), each [8, 900] with the dtype of the input; row t
    is `dihedral.transform(grid, t)`, so row 0 is the original.
  """
  q = _check_shape(question).reshape(GRID_SIZE, GRID_SIZE)
  a = _check_shape(answer).reshape(GRID_SIZE, GRID_SIZE)
  qs = np.stack([dihedral.transform(q, t).reshape(-1)
                 for t in range(dihedral.NUM_TRANSFORMS)])
  as_ = np.stack([dihedral.transform(a, t).reshape(-1)
                  for t in range(dihedral.NUM_TRANSFORMS)])
  return qs, as_


def canonical_key(question: np.ndarray) -> bytes:
  """Same key for a maze and all its dihedral images."""
  return min(q.tobytes() for q in dihedral_augment(question, question)[0])
