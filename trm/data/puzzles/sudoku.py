"""Sudoku-Extreme dataset builder (port of upstream `build_sudoku_dataset.py`).

Writes the upstream on-disk layout (see `trm.data.puzzles.format`) from one of:

  * source="hub":      `sapientinc/sudoku-extreme` CSVs from the Hugging Face
                       Hub (needs network and
                       `huggingface_hub`: `pip install -e .[hub]`),
  * source="csv":      the same CSVs already on disk (`csv_dir`),
  * source="generate": an offline generator of unique-solution puzzles with a
                       fixed number of blanks (difficulty knob). These are far
                       easier than Sudoku-Extreme; they exist so the pipeline
                       and tests run without network.

Unlike upstream (which never seeds numpy), every random choice here comes
from a `np.random.Generator` derived from `seed`, so builds are reproducible.

CLI:
  python -m trm.data.puzzles.sudoku --output_dir=data/sudoku --source=generate \
      --num_train=1000 --num_test=1000 --num_blanks=40 --num_aug=0 --seed=0
"""

import array
import time
from typing import Optional, Sequence

from absl import flags
from absl import logging
import numpy as np

from trm.core import cli
from trm.data.puzzles import builder_cli
from trm.data.puzzles import builds
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import hub
from trm.data.puzzles import seeding
from trm.data.puzzles import sudoku_generate

HF_REPO = "sapientinc/sudoku-extreme"
SPLITS = ("train", "test")
SOURCES = ("generate", "csv", "hub")
BUILD_INFO_FILE = builds.BUILD_INFO_FILE

SEQ_LEN = sudoku_generate.SEQ_LEN  # 81 cells.
VOCAB_SIZE = 11  # PAD + "0".."9": stored tokens are cell values + 1.


# ----------------------------------------------------------------------------
# Augmentation.


def shuffle_sudoku(board: np.ndarray, solution: np.ndarray,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
  """Applies one random validity-preserving transform to a board + solution.

  Same transform family and draw order as upstream's `shuffle_sudoku`:
  a permutation of the digits 1..9 (blank 0 stays 0), a transpose with
  probability 1/2, a row permutation that shuffles the 3 bands and then the 3
  rows inside each band, and likewise a column permutation over stacks. New
  cell (r, c) is old cell (row_perm[r], col_perm[c]) of the (optionally)
  transposed grid.

  Args:
    board: 81 or 9x9 values, 0 = blank.
    solution: the matching solution, same shape.
    rng: source of randomness.

  Returns:
    (board, solution) transformed, each with its input's shape and dtype.
  """
  digit_map = np.concatenate([[0], rng.permutation(9) + 1])
  transpose = rng.random() < 0.5
  bands = rng.permutation(3)
  row_perm = np.concatenate([3 * b + rng.permutation(3) for b in bands])
  stacks = rng.permutation(3)
  col_perm = np.concatenate([3 * s + rng.permutation(3) for s in stacks])

  def apply(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    grid = x.reshape(9, 9)
    if transpose:
      grid = grid.T
    grid = grid[row_perm][:, col_perm]
    return digit_map[grid].astype(x.dtype).reshape(x.shape)

  return apply(board), apply(solution)


# ----------------------------------------------------------------------------
# Upstream CSVs.

# Byte -> cell value; 255 marks a character that is not allowed.
_Q_TABLE = np.full(256, 255, np.uint8)
_Q_TABLE[ord(".")] = 0
_Q_TABLE[ord("0")] = 0  # Upstream maps "." to "0" before decoding; accept both.
_Q_TABLE[ord("1"):ord("9") + 1] = np.arange(1, 10)
_A_TABLE = _Q_TABLE.copy()
_A_TABLE[[ord("."), ord("0")]] = 255


def read_csv(path: str, min_difficulty: Optional[int] = None
             ) -> tuple[np.ndarray, np.ndarray]:
  """Reads an upstream Sudoku-Extreme CSV.

  Format: one header row (skipped unread, as upstream does), then rows
  `source,q,a,rating` with `q` 81 characters ('.' or '0' = blank, '1'..'9'),
  `a` the 81-digit solution and `rating` an integer difficulty.

  Args:
    path: the CSV file.
    min_difficulty: keep only rows with rating >= this (None: keep all).

  Returns:
    (boards, solutions), uint8 [N, 81]; 0 = blank, 1..9 = digits.

  Raises:
    ValueError: naming the file and line number of the first malformed row
      (also one whose solution is not a solved Sudoku).
  """
  # Characters are packed into one byte buffer (81 bytes a row) instead of a
  # list of arrays: the full train CSV has millions of rows.
  q_buf, a_buf = bytearray(), bytearray()
  lines = array.array("q")  # Line number of each kept row, for errors.
  with hub.csv_rows(path, "source,q,a,rating") as rows:
    for line, row in rows:
      if len(row) != 4:
        raise ValueError(f"{path}:{line}: expected 4 columns 'source,q,a,"
                         f"rating', got {len(row)}: {row!r}")
      _, q, a, rating = row
      if len(q) != 81 or len(a) != 81:
        raise ValueError(f"{path}:{line}: puzzle and solution must have 81 "
                         f"characters, got {len(q)} and {len(a)}")
      try:
        rating = int(rating)
      except ValueError:
        raise ValueError(f"{path}:{line}: rating must be an integer, got "
                         f"{rating!r}") from None
      if min_difficulty is not None and rating < min_difficulty:
        continue
      # Non-ASCII becomes "?" (one byte), so lengths stay 81 and it is
      # reported as an invalid character below.
      q_buf += q.encode("ascii", errors="replace")
      a_buf += a.encode("ascii", errors="replace")
      lines.append(line)

  boards = _Q_TABLE[np.frombuffer(bytes(q_buf), np.uint8).reshape(-1, 81)]
  solutions = _A_TABLE[np.frombuffer(bytes(a_buf), np.uint8).reshape(-1, 81)]
  bad_char = (boards == 255).any(1) | (solutions == 255).any(1)
  bad_given = ((boards != 0) & (boards != solutions)).any(1)
  # A solution that breaks the rules would be trained on and scored as the
  # answer, and no model could reach it: refuse it like a malformed row.
  bad = bad_char | bad_given | ~sudoku_generate.valid_solutions(solutions)
  if bad.any():
    k = int(np.argmax(bad))
    if bad_char[k]:
      why = ("invalid character (puzzle allows '.', '0'-'9'; solution "
             "'1'-'9')")
    elif bad_given[k]:
      why = "a given digit of the puzzle differs from the solution"
    else:
      why = ("the solution is not a solved Sudoku (a row, column or 3x3 box "
             "repeats a digit); fix or remove the row")
    raise ValueError(f"{path}:{lines[k]}: {why}")
  return boards, solutions


def download_csv(split: str, dest_dir: str) -> str:
  """Downloads `<split>.csv` of the HF dataset sapientinc/sudoku-extreme.

  See `hub.download_csv` (split: "train" or "test"; an existing file is
  reused); returns the local path; `trm.core.hub.HubUnavailable` (one
  line naming this builder's offline flags) if the download failed.
  """
  return hub.download_csv(HF_REPO, split, dest_dir, splits=SPLITS,
                          generated="puzzles")


# ----------------------------------------------------------------------------
# Dataset builder.

# Independent random streams derived from the build seed.
_STREAM_TRAIN, _STREAM_TEST, _STREAM_SUBSAMPLE, _STREAM_AUG = range(4)


def _generate_test(num_test: int, num_blanks: int, seed: int,
                   train_boards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Test puzzles from their own seed stream, none equal to a train board
  (see `seeding.generate_distinct`)."""
  return seeding.generate_distinct(
      num_test, lambda start, stop: sudoku_generate.generate_range(
          [seed, _STREAM_TEST], start, stop, num_blanks),
      lambda board: board.tobytes(), {b.tobytes() for b in train_boards},
      SEQ_LEN)


def _load_source(output_dir: str, source: str, csv_dir: Optional[str],
                 min_difficulty: Optional[int], seed: int, num_train: int,
                 num_test: int, num_blanks: int):
  """{split: (boards, solutions)} from the requested source."""
  if source == "generate":
    train = sudoku_generate.generate_puzzles(num_train, num_blanks,
                                             [seed, _STREAM_TRAIN])
    test = _generate_test(num_test, num_blanks, seed, train[0])
    return {"train": train, "test": test}
  paths = hub.csv_paths(output_dir, source, csv_dir, HF_REPO, SPLITS,
                        download_csv)
  return hub.read_csv_splits(
      paths, lambda path: read_csv(path, min_difficulty),
      "" if min_difficulty is None
      else f" with rating >= min_difficulty={min_difficulty}")


def dataset_metadata(n: int) -> puzzle_format.PuzzleDatasetMetadata:
  """Metadata of a Sudoku split with `n` original puzzles (groups); see
  `builds.one_example_metadata`."""
  return builds.one_example_metadata(VOCAB_SIZE, SEQ_LEN, n)


def _encode_split(boards: np.ndarray, solutions: np.ndarray, num_aug: int,
                  rng: np.random.Generator):
  """Upstream arrays and metadata for one split.

  Each original puzzle is a group of 1 + num_aug puzzles (original first),
  each puzzle holding one example.
  """
  n, per = len(boards), 1 + num_aug
  inputs = np.empty((n * per, SEQ_LEN), np.uint8)
  labels = np.empty((n * per, SEQ_LEN), np.uint8)
  inputs[::per] = boards
  labels[::per] = solutions
  for g in range(n):
    for a in range(1, per):
      inputs[g * per + a], labels[g * per + a] = shuffle_sudoku(
          boards[g], solutions[g], rng)
  # Token = value + 1, so 0 stays free for padding: inputs 1 = blank and
  # 2..10 = digits; labels 2..10. Every cell is supervised, givens included.
  inputs += 1
  labels += 1
  return dataset_metadata(n), builds.one_example_arrays(inputs, labels,
                                                               per)


def _check_build_args(source, csv_dir, subsample_size, num_aug, seed,
                      num_train, num_test, num_blanks,
                      min_difficulty=None) -> None:
  hub.check_source(source, SOURCES, csv_dir)
  if min_difficulty is not None and source == "generate":
    # Generated boards have no rating column to filter on: the dataset
    # would have been built unfiltered under a name that says otherwise.
    raise builds.BuildArgumentError(
        f"min_difficulty={min_difficulty} filters the CSVs' rating column "
        "(source 'csv' or 'hub'); source 'generate' has no rating: drop "
        "min_difficulty, or set num_blanks for harder generated boards")
  builds.check_build_args(
      subsample_size, (("num_aug", num_aug), ("seed", seed)),
      (("num_train", num_train), ("num_test", num_test)))
  if not 0 <= num_blanks <= sudoku_generate.MAX_BLANKS:
    raise builds.BuildArgumentError(
        f"num_blanks must be in [0, {sudoku_generate.MAX_BLANKS}], got "
        f"{num_blanks}")


def build_dataset(output_dir: str, *, source: str = "generate",
                  csv_dir: Optional[str] = None,
                  subsample_size: Optional[int] = None, num_aug: int = 0,
                  min_difficulty: Optional[int] = None, seed: int = 0,
                  num_train: int = 1000, num_test: int = 1000,
                  num_blanks: int = 40) -> str:
  """Builds a Sudoku dataset in upstream's layout under `output_dir`.

  Writes `train/` and `test/` (set "all"), `identifiers.json` and
  last `build_info.json` (the arguments: the completion mark, see
  `builds`; a rebuild in place first removes it).

  Args:
    output_dir: dataset root; existing files are overwritten.
    source: "generate" (offline generator), "csv" (CSVs in `csv_dir`) or
      "hub" (download the CSVs into `csv_dir`, default `<output_dir>/raw`).
    csv_dir: see `source`.
    subsample_size: train only; keep a random subset of this many originals
      (without replacement; no-op if not smaller than the train set).
    num_aug: train only; augmented copies per original (`shuffle_sudoku`).
    min_difficulty: csv/hub only; keep rows with rating >= this.
    seed: seeds generation, subsampling and augmentation.
    num_train, num_test, num_blanks: generate only; puzzle counts and blanks
      per puzzle. Train and test use different seed streams and test boards
      equal to a train board are replaced.

  Returns:
    `output_dir`.
  """
  _check_build_args(source, csv_dir, subsample_size, num_aug, seed, num_train,
                    num_test, num_blanks, min_difficulty)
  start = time.time()
  data = _load_source(output_dir, source, csv_dir, min_difficulty, seed,
                      num_train, num_test, num_blanks)
  data["train"] = seeding.subsample(data["train"], subsample_size, seed,
                                    _STREAM_SUBSAMPLE)

  aug_rng = seeding.stream_rng(seed, _STREAM_AUG)
  info = _build_args(source=source, csv_dir=csv_dir,
                     subsample_size=subsample_size, num_aug=num_aug,
                     min_difficulty=min_difficulty, seed=seed,
                     num_train=num_train, num_test=num_test,
                     num_blanks=num_blanks)
  counts = builds.write_dataset(
      output_dir,
      lambda split: _encode_split(*data[split],
                                  num_aug if split == "train" else 0,
                                  aug_rng),
      info, splits=SPLITS)
  logging.info("Built Sudoku dataset in %s (%s) in %.1fs: %s", output_dir,
               source, time.time() - start, counts)
  return output_dir


# All build_dataset arguments (defaults filled in), as recorded on disk.
_build_args = builds.build_args_recorder(build_dataset,
                                                "trm.data.puzzles.sudoku")


def _ignored(args: dict) -> tuple[str, ...]:
  """Recorded arguments that do not shape a build from `args["source"]`."""
  if args["source"] == "generate":
    return ("csv_dir", "min_difficulty")
  # csv / hub: the CSVs give the puzzles; hub's csv_dir is a download cache.
  return ("num_train", "num_test", "num_blanks") + (
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
                              generated="puzzles", field_prefix=field_prefix)


def ensure_from_config(output_dir: str, build_config) -> str:
  """`ensure_dataset` with the arguments of `config.data.build` (-1 and ''
  mean 'not set')."""
  return ensure_dataset(
      output_dir, field_prefix="config.data.build.",
      **builder_cli.csv_source_config(build_config),
      num_aug=build_config.num_aug,
      min_difficulty=builder_cli.unset_if_negative(
          build_config.min_difficulty),
      seed=build_config.seed, num_train=build_config.num_train,
      num_test=build_config.num_test, num_blanks=build_config.num_blanks)


# ----------------------------------------------------------------------------
# CLI.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI flags (only when run as a script, see `builder_cli`)."""
  builder_cli.define_output_dir(flag_values)
  builder_cli.define_csv_source_flags(flag_values, SOURCES, "puzzles")
  flags.DEFINE_integer("num_blanks", 40, "generate: blanks per puzzle.",
                       flag_values=flag_values)
  flags.DEFINE_integer("num_aug", 0, "Train augmentations per puzzle.",
                       flag_values=flag_values)
  builder_cli.define_optional_int(
      "subsample_size", "Train subset size (empty: all).", flag_values)
  builder_cli.define_optional_int(
      "min_difficulty", "csv/hub: minimum rating (empty: no filter).",
      flag_values)
  flags.DEFINE_integer("seed", 0, "Seed for generation, subsampling and "
                       "augmentation.", flag_values=flag_values)


def run_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """Builds the dataset described by parsed flags; returns output_dir."""
  fv = flag_values
  return build_dataset(
      fv.output_dir, source=builder_cli.source(fv, "csv_dir", "csv"),
      csv_dir=fv.csv_dir or None,
      subsample_size=builder_cli.optional_int(fv, "subsample_size"),
      num_aug=fv.num_aug,
      min_difficulty=builder_cli.optional_int(fv, "min_difficulty"),
      seed=fv.seed, num_train=fv.num_train, num_test=fv.num_test,
      num_blanks=fv.num_blanks)


def main(argv: Sequence[str]) -> None:
  builder_cli.run_main(argv, run_from_flags)


if __name__ == "__main__":
  define_flags()
  cli.run(main, compilation_cache=False)  # a builder compiles nothing
