"""Maze-Hard 30x30 dataset builder (port of upstream `build_maze_dataset.py`).

Writes the upstream on-disk layout (see `trm.data.puzzles.format`) from one of:

  * source="hub":      `sapientinc/maze-30x30-hard-1k` CSVs from the Hugging
                       Face Hub (needs network and
                       `huggingface_hub`: `pip install -e .[hub]`),
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

import csv
import time
from typing import Optional, Sequence

from absl import flags
from absl import logging
import numpy as np

from trm.core import cli
from trm.data import atomic_files
from trm.data.puzzles import builder_cli
from trm.data.puzzles import builds
from trm.data.puzzles import dihedral
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import hub
from trm.data.puzzles import maze_generate
from trm.data.puzzles import maze_grid
from trm.data.puzzles import seeding

HF_REPO = "sapientinc/maze-30x30-hard-1k"
SPLITS = ("train", "test")
SOURCES = ("generate", "csv", "hub")
BUILD_INFO_FILE = builds.BUILD_INFO_FILE


# ----------------------------------------------------------------------------
# Upstream CSVs.

CSV_HEADER = ("source", "question", "answer", "rating")


def read_csv(path: str) -> tuple[np.ndarray, np.ndarray]:
  """Reads an upstream Maze-Hard CSV.

  Format: one header row (skipped unread, as upstream does), then rows
  `source,question,answer,rating`; `question` is 900 characters of
  "# SG" with one 'S' and one 'G', `answer` the same maze with the path
  marked 'o' (open cells only; the 'o' cells lead from S to G one after
  another, so an unsolvable maze has no valid row). `source` and `rating`
  are not used (as upstream).

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
    empty = np.zeros((0, maze_grid.SEQ_LEN), np.uint8)
    return empty, empty.copy()
  return np.stack(questions), np.stack(answers)


def _parse_row(row: list[str]) -> tuple[np.ndarray, np.ndarray]:
  """Token ids of one CSV row; ValueError (without location) if malformed."""
  if len(row) != 4:
    raise ValueError(f"expected 4 columns 'source,question,answer,rating', "
                     f"got {len(row)}")
  _, q_text, a_text, _ = row
  if len(q_text) != maze_grid.SEQ_LEN or len(a_text) != maze_grid.SEQ_LEN:
    raise ValueError(
        f"question and answer must have {maze_grid.SEQ_LEN} characters "
        f"({maze_grid.GRID_SIZE}x{maze_grid.GRID_SIZE}), got {len(q_text)} and "
        f"{len(a_text)}")
  for name, text, allowed in (("question", q_text, maze_grid.CHARSET[:4]),
                              ("answer", a_text, maze_grid.CHARSET)):
    bad = set(text) - set(allowed)
    if bad:
      raise ValueError(f"invalid character(s) {sorted(bad)} in the {name} "
                       f"(allowed: {allowed!r})")
  q, a = maze_grid.encode(q_text), maze_grid.encode(a_text)
  n_start, n_goal = int((q == maze_grid.START).sum()), int(
      (q == maze_grid.GOAL).sum())
  if n_start != 1 or n_goal != 1:
    raise ValueError(f"the question needs exactly one 'S' and one 'G', got "
                     f"{n_start} and {n_goal}")
  on_path = a == maze_grid.PATH
  if (q[on_path] != maze_grid.OPEN).any():
    raise ValueError("the answer marks a path ('o') on a cell that is not "
                     "open in the question")
  if (a[~on_path] != q[~on_path]).any():
    k = int(np.flatnonzero((a != q) & ~on_path)[0])
    raise ValueError(
        f"the answer differs from the question at row "
        f"{k // maze_grid.GRID_SIZE}, column {k % maze_grid.GRID_SIZE} "
        f"(only path cells 'o' may differ)")
  # The label must be a path: the 'o' cells, one after another, lead from S
  # to G. An answer with no path (an unsolvable maze) or with stray or
  # missing 'o' cells would be trained on and scored as the solution.
  start, goal = int(np.flatnonzero(q == maze_grid.START)[0]), int(
      np.flatnonzero(q == maze_grid.GOAL)[0])
  on_route = (on_path | (q == maze_grid.START) | (q == maze_grid.GOAL))
  moves = maze_grid.bfs(on_route.tolist(), start)[goal]
  n = int(on_path.sum())
  if moves != n + 1:
    how = ("they do not connect them" if moves < 0 else
           f"S reaches G through them in {moves} moves, not {n + 1}")
    raise ValueError(f"the answer's {n} path cells 'o' are not one path "
                     f"from 'S' to 'G' ({how})")
  return q, a


def write_csv(path: str, questions: np.ndarray, answers: np.ndarray,
              source: str = "trm.data.puzzles.maze") -> str:
  """Writes mazes as an upstream-style CSV (`read_csv` reads it back).

  The rating column holds the shortest-path length in moves (number of 'o'
  cells + 1).

  Returns:
    `path`.
  """
  questions = np.asarray(questions).reshape(-1, maze_grid.SEQ_LEN)
  answers = np.asarray(answers).reshape(-1, maze_grid.SEQ_LEN)
  if questions.shape != answers.shape:
    raise ValueError(f"questions {questions.shape} and answers "
                     f"{answers.shape} differ in shape")

  def write(f):
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for q, a in zip(questions, answers):
      writer.writerow([source, maze_grid.decode(q), maze_grid.decode(a),
                       int((a == maze_grid.PATH).sum()) + 1])

  atomic_files.atomic_write(path, write, mode="w")
  return path


def download_csv(split: str, dest_dir: str) -> str:
  """Downloads `<split>.csv` of the HF dataset sapientinc/maze-30x30-hard-1k.

  See `hub.download_csv` (split: "train" or "test"; an existing file is
  reused); returns the local path; `trm.core.hub.HubUnavailable` (one
  line naming this builder's offline flags) if the download failed.
  """
  return hub.download_csv(HF_REPO, split, dest_dir, splits=SPLITS,
                          generated="mazes")


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
      n, lambda start, stop: maze_generate.generate_range(
          base, start, stop, min_path_length), maze_grid.canonical_key, seen,
      maze_grid.SEQ_LEN)


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
  return hub.read_csv_splits(paths, read_csv)


def dataset_metadata(n: int) -> puzzle_format.PuzzleDatasetMetadata:
  """Metadata of a Maze split with `n` original mazes (groups); see
  `builds.one_example_metadata` (total_puzzles = groups, even with 8
  augmented puzzles per group, as upstream)."""
  return builds.one_example_metadata(maze_grid.VOCAB_SIZE, maze_grid.SEQ_LEN, n)


def _encode_split(questions: np.ndarray, answers: np.ndarray, aug: bool):
  """Upstream arrays and metadata for one split.

  Each original maze is a group of 8 puzzles (its dihedral images, identity
  first) with `aug`, else of 1; each puzzle holds one example. Tokens are
  stored as they are (no shift): every cell, walls included, is supervised.
  """
  n = len(questions)
  per = dihedral.NUM_TRANSFORMS if aug else 1
  inputs = np.empty((n * per, maze_grid.SEQ_LEN), np.uint8)
  labels = np.empty((n * per, maze_grid.SEQ_LEN), np.uint8)
  for g in range(n):
    if aug:
      (inputs[g * per:(g + 1) * per],
       labels[g * per:(g + 1) * per]) = maze_grid.dihedral_augment(
           questions[g], answers[g])
    else:
      inputs[g], labels[g] = questions[g], answers[g]
  return dataset_metadata(n), builds.one_example_arrays(inputs, labels,
                                                               per)


def _check_build_args(source, csv_dir, subsample_size, seed, num_train,
                      num_test, min_path_length) -> None:
  hub.check_source(source, SOURCES, csv_dir)
  builds.check_build_args(
      subsample_size, (("seed", seed),),
      (("num_train", num_train), ("num_test", num_test)))
  if not 1 <= min_path_length < maze_grid.SEQ_LEN:
    raise builds.BuildArgumentError(
        f"min_path_length must be in [1, {maze_grid.SEQ_LEN - 1}], got "
        f"{min_path_length}")


def build_dataset(
    output_dir: str,
    *,
    source: str = "generate",
    csv_dir: Optional[str] = None,
    subsample_size: Optional[int] = None,
    aug: bool = True,
    seed: int = 0,
    num_train: int = 1000,
    num_test: int = 1000,
    min_path_length: int = maze_generate.DEFAULT_MIN_PATH_LENGTH) -> str:
  """Builds a Maze dataset in upstream's layout under `output_dir`.

  Writes `train/` and `test/` (set "all"), `identifiers.json` and
  last `build_info.json` (the arguments: the completion mark, see
  `builds`; a rebuild in place first removes it).

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
  counts = builds.write_dataset(
      output_dir,
      lambda split: _encode_split(*data[split], aug=aug and split == "train"),
      info, splits=SPLITS)
  logging.info("Built Maze dataset in %s (%s) in %.1fs: %s", output_dir,
               source, time.time() - start, counts)
  return output_dir


# All build_dataset arguments (defaults filled in), as recorded on disk.
_build_args = builds.build_args_recorder(build_dataset, "trm.data.puzzles.maze")


def _ignored(args: dict) -> tuple[str, ...]:
  """Recorded arguments that do not shape a build from `args["source"]`."""
  if args["source"] == "generate":
    return ("csv_dir",)
  # csv / hub: the CSVs give the mazes; hub's csv_dir is a download cache.
  return ("num_train", "num_test", "min_path_length") + (
      ("csv_dir",) if args["source"] == "hub" else ())


def ensure_dataset(output_dir: str, *, field_prefix: str = "",
                   **build_kwargs) -> str:
  """Builds the dataset unless a complete one is there; returns output_dir.

  An interrupted build is built again; a complete one built with other
  arguments is refused in one line naming them (spelled `field_prefix` +
  name, e.g. 'config.data.build.num_aug'), and so is a failed download
  (`hub.ensure_csv_built`).
  """
  return hub.ensure_csv_built(output_dir, build_dataset, _build_args,
                              build_kwargs, ignored=_ignored, repo=HF_REPO,
                              generated="mazes", field_prefix=field_prefix)


def ensure_from_config(output_dir: str, build_config) -> str:
  """`ensure_dataset` with the arguments of `config.data.build` (-1 and ''
  mean 'not set')."""
  return ensure_dataset(
      output_dir, field_prefix="config.data.build.",
      **builder_cli.csv_source_config(build_config),
      aug=bool(build_config.aug), seed=build_config.seed,
      num_train=build_config.num_train, num_test=build_config.num_test,
      min_path_length=build_config.min_path_length)


# ----------------------------------------------------------------------------
# CLI.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI flags (only when run as a script, see `builder_cli`)."""
  builder_cli.define_output_dir(flag_values)
  builder_cli.define_csv_source_flags(flag_values, SOURCES, "mazes")
  flags.DEFINE_integer("min_path_length", maze_generate.DEFAULT_MIN_PATH_LENGTH,
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
  cli.run(main, compilation_cache=False)  # a builder compiles nothing
