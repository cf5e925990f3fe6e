"""Maze-Hard 30x30 dataset builder (port of upstream `build_maze_dataset.py`).

Writes the upstream on-disk layout (see `trm.data.puzzles.format`) from one of:

  * source="hub":      `sapientinc/maze-30x30-hard-1k` CSVs from the Hugging
                       Face Hub (needs network; `huggingface_hub` is optional),
  * source="csv":      the same CSVs already on disk (`csv_dir`),
  * source="generate": an offline, seeded generator of 30x30 mazes whose
                       shortest start-to-goal path is at least
                       `min_path_length` moves (default 111, i.e. > 110 as in
                       Maze-Hard). Their layout differs from the upstream
                       mazes (see `generate_mazes`); they exist so the
                       pipeline and tests run without network. Each has
                       exactly one shortest path, so its label is
                       unambiguous.

Grids are 30x30 characters, row-major: '#' wall, ' ' open, 'S' start,
'G' goal; the answer is the question with the cells of the shortest path
strictly between S and G set to 'o'. Tokens follow upstream's CHARSET
"# SGo": '#'=1, ' '=2, 'S'=3, 'G'=4, 'o'=5, 0 = padding (vocabulary 6,
sequence length 900). Every cell is supervised.

Differences from upstream:
  * Augmentation is ON by default (`aug=True`): each training maze becomes a
    group of 8 puzzles, the 8 dihedral symmetries of `trm.data.puzzles.dihedral`
    (identity first), as the paper describes ("8 dihedral transformations").
    Upstream's builder has the same option but defaults it to off, so its
    README command trains on the 1,000 mazes without augmentation. Pass
    `aug=False` (`--noaug`) for upstream's default. The test split is never
    augmented, as upstream.
  * Every random choice (subsampling, generation) comes from a
    `np.random.Generator` derived from `seed`; upstream never seeds numpy.
  * Malformed CSV rows are reported with file and line instead of failing
    an assertion or a reshape.

CLI:
  python -m trm.data.puzzles.maze --output_dir=data/maze --source=generate \
      --num_train=1000 --num_test=1000 --min_path_length=111 --seed=0
"""

import collections
import csv
import functools
import time
from typing import Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from trm.core import cli
from trm.data.puzzles import builder_cli
from trm.data.puzzles import dihedral
from trm.data.puzzles import hub
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import seeding

HF_REPO = "sapientinc/maze-30x30-hard-1k"
HF_URL = hub.HF_URL.format(repo=HF_REPO, filename="{split}.csv")
SPLITS = ("train", "test")
SOURCES = ("generate", "csv", "hub")
BUILD_INFO_FILE = puzzle_format.BUILD_INFO_FILE

GRID_SIZE = 30
SEQ_LEN = GRID_SIZE * GRID_SIZE
# Upstream's character set; token id = index + 1, so 0 is free for padding.
CHARSET = "# SGo"
VOCAB_SIZE = len(CHARSET) + 1
WALL, OPEN, START, GOAL, PATH = range(1, 6)
# Maze-Hard keeps mazes whose shortest path is longer than 110 moves.
DEFAULT_MIN_PATH_LENGTH = 111
# Decoy loops opened per generated maze (see `generate_mazes`).
DEFAULT_NUM_LOOPS = 24

Seed = seeding.Seed

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


_NB = _neighbours(GRID_SIZE)


def _bfs(passable: list, source: int, count_limit: int = 0):
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
    for v in _NB[u]:
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
  dist, count = _bfs(passable, s, count_limit=2)
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
    cell = next(v for v in _NB[cell]
                if passable[v] and dist[v] == dist[cell] - 1)
    path.append(cell)
  return path[::-1]


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
  passable = [False] * SEQ_LEN
  open_nb = [0] * SEQ_LEN  # open orthogonal neighbours of each cell
  draws = rng.random(SEQ_LEN + 1).tolist()  # one per opened cell

  def open_cell(i):
    passable[i] = True
    for n in _NB[i]:
      open_nb[n] += 1

  start = int(draws.pop() * SEQ_LEN)
  open_cell(start)
  stack = [start]
  while stack:
    cell = stack[-1]
    # `cell` is open and adjacent, so a count of 1 means "only `cell`".
    options = [n for n in _NB[cell] if open_nb[n] == 1 and not passable[n]]
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
  dist[cell] = min(dist[n] for n in _NB[cell] if passable[n] and
                   dist[n] >= 0) + 1
  queue = collections.deque([cell])
  while queue:
    u = queue.popleft()
    du = dist[u] + 1
    for v in _NB[u]:
      if passable[v] and dist[v] > du:
        dist[v] = du
        queue.append(v)


def _bridges(passable: list, cell: int) -> Optional[tuple[int, int]]:
  """The two open cells a closed cell separates in a straight line, if it
  has exactly those two open neighbours; else None."""
  open_nb = [n for n in _NB[cell] if passable[n]]
  if len(open_nb) != 2:
    return None
  a, b = open_nb
  if abs(a - b) not in (2, 2 * GRID_SIZE):  # left+right or up+down only
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
  walls = [i for i in range(SEQ_LEN)
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
    cells = [i for i in range(SEQ_LEN) if passable[i]]
    start = cells[int(rng.integers(len(cells)))]
    dist_s = _bfs(passable, start)
    far = [i for i in cells if dist_s[i] >= min_path_length]
    if not far:
      continue
    goal = far[int(rng.integers(len(far)))]
    dist_g = _bfs(passable, goal)
    _add_decoy_loops(rng, passable, dist_s, dist_g, num_loops)
    question = np.where(passable, OPEN, WALL).astype(np.uint8)
    question[start], question[goal] = START, GOAL
    answer, length, num_shortest = solve(question)
    # The construction guarantees both; checked so a broken invariant can
    # never reach a dataset.
    if num_shortest != 1 or length != dist_s[goal]:
      raise AssertionError(f"generated maze has {num_shortest} shortest "
                           f"paths of length {length}, expected one of "
                           f"{dist_s[goal]}")
    return question, answer
  raise RuntimeError(
      f"no maze with a shortest path of >= {min_path_length} moves in "
      f"{max_attempts} attempts; lower min_path_length (30x30 tree mazes "
      f"rarely reach 300)")


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
  return _generate_range(seeding.entropy(seed), 0, n, min_path_length,
                         num_loops, max_attempts)


def _check_generate_args(n: int, min_path_length: int, num_loops: int):
  if n < 0:
    raise ValueError(f"n must be >= 0, got {n}")
  if not 1 <= min_path_length < SEQ_LEN:
    raise ValueError(f"min_path_length must be in [1, {SEQ_LEN - 1}], got "
                     f"{min_path_length}")
  if num_loops < 0:
    raise ValueError(f"num_loops must be >= 0, got {num_loops}")


def _generate_range(base: list[int], start: int, stop: int,
                    min_path_length: int, num_loops: int = DEFAULT_NUM_LOOPS,
                    max_attempts: int = 100
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Mazes k = start..stop-1 of the stream `base` (see `generate_mazes`)."""
  return seeding.generate_range(
      functools.partial(_generate_one, min_path_length=min_path_length,
                        num_loops=num_loops, max_attempts=max_attempts),
      base, start, stop, SEQ_LEN)


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


def _canonical_key(question: np.ndarray) -> bytes:
  """Same key for a maze and all its dihedral images."""
  return min(q.tobytes() for q in dihedral_augment(question, question)[0])


# ----------------------------------------------------------------------------
# Upstream CSVs.

CSV_HEADER = ("source", "question", "answer", "rating")


def read_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
  """Reads an upstream Maze-Hard CSV.

  Format: one header row (skipped unread, as upstream does), then rows
  `source,question,answer,rating`; `question` is 900 characters of
  "# SG" with one 'S' and one 'G', `answer` the same maze with the path
  marked 'o' (open cells only). `source` and `rating` are not used (as
  upstream).

  Args:
    path: the CSV file.

  Returns:
    (questions, answers), uint8 token ids [N, 900].

  Raises:
    ValueError: naming the file and line number of the first malformed row.
  """
  questions, answers = [], []
  with hub.csv_rows(path, ",".join(CSV_HEADER)) as rows:
    for line, row in rows:
      try:
        q, a = _parse_row(row)
      except ValueError as e:
        raise ValueError(f"{path}:{line}: {e}") from None
      questions.append(q)
      answers.append(a)
  if not questions:
    empty = np.zeros((0, SEQ_LEN), np.uint8)
    return empty, empty.copy()
  return np.stack(questions), np.stack(answers)


def _parse_row(row: list[str]) -> tuple[np.ndarray, np.ndarray]:
  """Token ids of one CSV row; ValueError (without location) if malformed."""
  if len(row) != 4:
    raise ValueError(f"expected 4 columns 'source,question,answer,rating', "
                     f"got {len(row)}")
  _, q_text, a_text, _ = row
  if len(q_text) != SEQ_LEN or len(a_text) != SEQ_LEN:
    raise ValueError(f"question and answer must have {SEQ_LEN} characters "
                     f"({GRID_SIZE}x{GRID_SIZE}), got {len(q_text)} and "
                     f"{len(a_text)}")
  for name, text, allowed in (("question", q_text, CHARSET[:4]),
                              ("answer", a_text, CHARSET)):
    bad = set(text) - set(allowed)
    if bad:
      raise ValueError(f"invalid character(s) {sorted(bad)} in the {name} "
                       f"(allowed: {allowed!r})")
  q, a = encode(q_text), encode(a_text)
  n_start, n_goal = int((q == START).sum()), int((q == GOAL).sum())
  if n_start != 1 or n_goal != 1:
    raise ValueError(f"the question needs exactly one 'S' and one 'G', got "
                     f"{n_start} and {n_goal}")
  on_path = a == PATH
  if (q[on_path] != OPEN).any():
    raise ValueError("the answer marks a path ('o') on a cell that is not "
                     "open in the question")
  if (a[~on_path] != q[~on_path]).any():
    k = int(np.flatnonzero((a != q) & ~on_path)[0])
    raise ValueError(f"the answer differs from the question at row "
                     f"{k // GRID_SIZE}, column {k % GRID_SIZE} (only path "
                     f"cells 'o' may differ)")
  return q, a


def write_csv(path: str, questions: np.ndarray, answers: np.ndarray,
              source: str = "trm.data.puzzles.maze") -> str:
  """Writes mazes as an upstream-style CSV (`read_csv` reads it back).

  The rating column holds the shortest-path length in moves (number of 'o'
  cells + 1).

  Returns:
    `path`.
  """
  questions = np.asarray(questions).reshape(-1, SEQ_LEN)
  answers = np.asarray(answers).reshape(-1, SEQ_LEN)
  if questions.shape != answers.shape:
    raise ValueError(f"questions {questions.shape} and answers "
                     f"{answers.shape} differ in shape")

  def write(f):
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for q, a in zip(questions, answers):
      writer.writerow([source, decode(q), decode(a),
                       int((a == PATH).sum()) + 1])

  puzzle_format.atomic_write(path, write, mode="w")
  return path


# Looked up at call time, so tests can replace it.
_hf_hub_download = hub.hf_hub_download


def download_csv(split: str, dest_dir: str, timeout: float = 60.0) -> str:
  """Downloads `<split>.csv` of the HF dataset sapientinc/maze-30x30-hard-1k.

  See `hub.download_csv` (split: "train" or "test"; an existing file is
  reused); returns the local path, RuntimeError if the download failed.
  """
  return hub.download_csv(HF_REPO, split, dest_dir, splits=SPLITS,
                          generated="mazes",
                          get_hub_download=_hf_hub_download, timeout=timeout)


# ----------------------------------------------------------------------------
# Dataset builder.

# Independent random streams derived from the build seed.
_STREAM_TRAIN, _STREAM_TEST, _STREAM_SUBSAMPLE = range(3)


def _generate_distinct(n: int, base: list[int], min_path_length: int,
                       seen: set) -> tuple[np.ndarray, np.ndarray]:
  """`n` mazes of the stream `base`, none equal to a dihedral image of a
  maze in `seen` or of an earlier one (`seen` is updated).

  A test maze equal to an (augmented) train maze would leak into training,
  see `seeding.generate_distinct`.
  """
  return seeding.generate_distinct(
      n,
      lambda start, stop: _generate_range(base, start, stop, min_path_length),
      _canonical_key, seen, SEQ_LEN)


def _load_source(output_dir: str, source: str, csv_dir: Optional[str],
                 seed: int, num_train: int, num_test: int,
                 min_path_length: int):
  """{split: (questions, answers)} from the requested source."""
  if source == "generate":
    seen = set()
    train = _generate_distinct(num_train, [seed, _STREAM_TRAIN],
                               min_path_length, seen)
    test = _generate_distinct(num_test, [seed, _STREAM_TEST],
                              min_path_length, seen)
    return {"train": train, "test": test}
  paths = hub.csv_paths(output_dir, source, csv_dir, HF_REPO, SPLITS,
                        download_csv)
  return {split: read_csv(path) for split, path in paths.items()}


def dataset_metadata(n: int) -> puzzle_format.PuzzleDatasetMetadata:
  """Metadata of a Maze split with `n` original mazes (groups); see
  `puzzle_format.one_example_metadata` (total_puzzles = groups, even with 8
  augmented puzzles per group, as upstream)."""
  return puzzle_format.one_example_metadata(VOCAB_SIZE, SEQ_LEN, n)


def _encode_split(questions: np.ndarray, answers: np.ndarray, aug: bool):
  """Upstream arrays and metadata for one split.

  Each original maze is a group of 8 puzzles (its dihedral images, identity
  first) with `aug`, else of 1; each puzzle holds one example. Tokens are
  stored as they are (no shift): every cell, walls included, is supervised.
  """
  n = len(questions)
  per = dihedral.NUM_TRANSFORMS if aug else 1
  inputs = np.empty((n * per, SEQ_LEN), np.uint8)
  labels = np.empty((n * per, SEQ_LEN), np.uint8)
  for g in range(n):
    if aug:
      (inputs[g * per:(g + 1) * per],
       labels[g * per:(g + 1) * per]) = dihedral_augment(questions[g],
                                                         answers[g])
    else:
      inputs[g], labels[g] = questions[g], answers[g]
  return dataset_metadata(n), puzzle_format.one_example_arrays(inputs, labels,
                                                               per)


def _check_build_args(source, csv_dir, subsample_size, seed, num_train,
                      num_test, min_path_length) -> None:
  hub.check_source(source, SOURCES, csv_dir)
  puzzle_format.check_build_args(
      subsample_size, (("seed", seed), ("num_train", num_train),
                       ("num_test", num_test)))
  if not 1 <= min_path_length < SEQ_LEN:
    raise ValueError(f"min_path_length must be in [1, {SEQ_LEN - 1}], got "
                     f"{min_path_length}")


def build_dataset(output_dir: str, *, source: str = "generate",
                  csv_dir: Optional[str] = None,
                  subsample_size: Optional[int] = None, aug: bool = True,
                  seed: int = 0, num_train: int = 1000, num_test: int = 1000,
                  min_path_length: int = DEFAULT_MIN_PATH_LENGTH) -> str:
  """Builds a Maze dataset in upstream's layout under `output_dir`.

  Writes `train/` and `test/` (set "all"), `identifiers.json` and
  `build_info.json` (the arguments, for provenance).

  Args:
    output_dir: dataset root; existing files are overwritten.
    source: "generate" (offline generator), "csv" (CSVs in `csv_dir`) or
      "hub" (download the CSVs into `csv_dir`, default `<output_dir>/raw`).
    csv_dir: see `source`.
    subsample_size: train only; keep a random subset of this many mazes
      (without replacement; no-op if not smaller than the train set).
    aug: train only; 8 dihedral images per maze. Default True (the paper);
      upstream's builder defaults to False.
    seed: seeds generation and subsampling.
    num_train, num_test, min_path_length: generate only; maze counts and the
      minimum shortest-path length in moves. Train and test use different
      seed streams, and no maze equals a dihedral image of another.

  Returns:
    `output_dir`.
  """
  _check_build_args(source, csv_dir, subsample_size, seed, num_train,
                    num_test, min_path_length)
  start = time.time()
  data = _load_source(output_dir, source, csv_dir, seed, num_train, num_test,
                      min_path_length)
  data["train"] = seeding.subsample(data["train"], subsample_size, seed,
                                    _STREAM_SUBSAMPLE)

  info = _build_args(source=source, csv_dir=csv_dir,
                     subsample_size=subsample_size, aug=aug, seed=seed,
                     num_train=num_train, num_test=num_test,
                     min_path_length=min_path_length)
  counts = puzzle_format.write_dataset(
      output_dir,
      lambda split: _encode_split(*data[split], aug=aug and split == "train"),
      info, splits=SPLITS)
  logging.info("Built Maze dataset in %s (%s) in %.1fs: %s", output_dir,
               source, time.time() - start, counts)
  return output_dir


# All build_dataset arguments (defaults filled in), as recorded on disk.
_build_args = puzzle_format.build_args_recorder(build_dataset, "trm.data.puzzles.maze")


def ensure_dataset(output_dir: str, **build_kwargs) -> str:
  """Builds the dataset unless both splits exist; returns output_dir (see
  `puzzle_format.is_built` / `warn_if_built_otherwise`)."""
  return puzzle_format.ensure_built(output_dir, build_dataset, _build_args,
                                    build_kwargs)


def ensure_from_config(output_dir: str, build_config) -> str:
  """`ensure_dataset` with the arguments of `config.data.build` (-1 and ''
  mean 'not set')."""
  return ensure_dataset(
      output_dir, **builder_cli.csv_source_config(build_config),
      aug=bool(build_config.aug), seed=build_config.seed,
      num_train=build_config.num_train, num_test=build_config.num_test,
      min_path_length=build_config.min_path_length)


# ----------------------------------------------------------------------------
# CLI.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI flags (only when run as a script, see `builder_cli`)."""
  builder_cli.define_output_dir(flag_values)
  builder_cli.define_csv_source_flags(flag_values, SOURCES, "mazes")
  flags.DEFINE_integer("min_path_length", DEFAULT_MIN_PATH_LENGTH,
                       "generate: minimum shortest-path length in moves.",
                       flag_values=flag_values)
  flags.DEFINE_bool("aug", True, "Add the 8 dihedral images of each train "
                    "maze (upstream's default is --noaug).",
                    flag_values=flag_values)
  builder_cli.define_optional_int(
      "subsample_size", "Train subset size (empty: all).", flag_values)
  flags.DEFINE_integer("seed", 0, "Seed for generation and subsampling.",
                       flag_values=flag_values)


def run_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """Builds the dataset described by parsed flags; returns output_dir."""
  fv = flag_values
  return build_dataset(
      fv.output_dir, source=builder_cli.source(fv, "csv_dir", "csv"),
      csv_dir=fv.csv_dir or None,
      subsample_size=builder_cli.optional_int(fv, "subsample_size"),
      aug=fv.aug, seed=fv.seed, num_train=fv.num_train,
      num_test=fv.num_test, min_path_length=fv.min_path_length)


def main(argv: Sequence[str]) -> None:
  builder_cli.run_main(argv, run_from_flags)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
