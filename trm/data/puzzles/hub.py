"""Upstream's CSV datasets on the Hugging Face Hub, shared by the builders.

The Sudoku-Extreme and Maze-Hard builders (`trm.data.puzzles.sudoku`,
`trm.data.puzzles.maze`) take their data from one of three sources: "hub" (download
`<split>.csv` of a Hub dataset with `huggingface_hub`), "csv" (the same
files already on disk) or "generate" (an offline generator,
builder-specific). This module holds what the first two have in common: the
download and its offline hint, locating the CSVs and reading their rows.
"""

import contextlib
import csv
import os
from typing import Callable, Iterator, Optional, Sequence

from trm.core import hub as core_hub
from trm.data.puzzles import builds


def offline_hint(repo: str, generated: str, field_prefix: str = "") -> str:
  """What to do without network, in the flags of the command in hand.

  Args:
    repo: the Hub dataset, e.g. "sapientinc/sudoku-extreme".
    generated: what the builder's offline generator makes ("puzzles").
    field_prefix: "" for the builder's own CLI (--source, --csv_dir);
      "config.data.build." for trm.main, whose build arguments are config
      fields (--config.data.build.source, ...).
  """
  source, csv_dir = f"--{field_prefix}source", f"--{field_prefix}csv_dir"
  return (f"build offline instead: {source}=generate for synthetic "
          f"{generated}, or {source}=csv {csv_dir}=DIR with train.csv and "
          f"test.csv of {repo} fetched elsewhere")


@contextlib.contextmanager
def offline_hint_for(field_prefix: str, repo: str, generated: str):
  """Re-raises a `HubUnavailable` from the block with the hint spelled for
  `field_prefix` (see `offline_hint`): the builder downloads with its own
  CLI's hint; the trainer's `ensure_from_config` knows its flags."""
  try:
    yield
  except core_hub.HubUnavailable as error:
    raise error.with_hint(offline_hint(repo, generated, field_prefix)
                          ) from error.__cause__


def ensure_csv_built(output_dir: str, build_dataset, recorded_args,
                     build_kwargs: dict, *, ignored, repo: str,
                     generated: str, field_prefix: str = "") -> str:
  """`builds.ensure_built` for a builder whose source is a Hub CSV, a local
  CSV directory or its generator (Sudoku, Maze): the CSV directory compared
  as a path, and a failed download's offline hint naming the fields as
  `field_prefix` spells them (e.g. 'config.data.build.')."""
  with offline_hint_for(field_prefix, repo, generated):
    return builds.ensure_built(output_dir, build_dataset, recorded_args,
                               build_kwargs, ignored=ignored,
                               path_args=("csv_dir",),
                               field_prefix=field_prefix)


def download_csv(repo: str, split: str, dest_dir: str, *,
                 splits: Sequence[str], generated: str) -> str:
  """Downloads `<split>.csv` of the Hub dataset `repo` into `dest_dir`.

  Goes through `trm.core.hub.download` (`huggingface_hub`, fast failure
  without network). An existing `<dest_dir>/<split>.csv` is reused
  (`huggingface_hub` moves a file into place only once it is complete).

  Args:
    repo: Hub dataset, e.g. "sapientinc/sudoku-extreme".
    split: one of `splits`.
    dest_dir: directory to store the file in.
    splits: the dataset's splits.
    generated: what the builder's offline generator makes ("puzzles",
      "mazes"), for the error message.

  Returns:
    Path of the local CSV.

  Raises:
    ValueError: `split` is not one of `splits`.
    trm.core.hub.HubUnavailable: the download failed (one line ending with
      the builder CLI's offline flags; see `offline_hint_for`).
  """
  if split not in splits:
    raise ValueError(f"split must be one of {splits}, got {split!r}")
  os.makedirs(dest_dir, exist_ok=True)
  filename = f"{split}.csv"
  dest = os.path.join(dest_dir, filename)
  if os.path.isfile(dest):
    return dest
  return core_hub.download(repo, filename, repo_type="dataset",
                           offline_hint=offline_hint(repo, generated),
                           local_dir=dest_dir)


def check_source(source: str, sources: Sequence[str],
                 csv_dir: Optional[str]) -> None:
  """Raises ValueError unless `source` is one of `sources` and, for "csv",
  `csv_dir` is set."""
  if source not in sources:
    raise builds.BuildArgumentError(
        f"source must be one of {sources}, got {source!r}")
  if source == "csv" and not csv_dir:
    raise builds.BuildArgumentError(
        "source='csv' needs csv_dir (--csv_dir, or config.data.build.csv_dir "
        "in trm.main) holding train.csv and test.csv")


def csv_paths(output_dir: str, source: str, csv_dir: Optional[str],
              repo: str, splits: Sequence[str],
              download: Callable[[str, str], str]) -> dict[str, str]:
  """{split: local CSV path} for source "hub" or "csv".

  Args:
    output_dir: dataset root; "hub" downloads to `<output_dir>/raw` unless
      `csv_dir` is set.
    source: "hub" (download with `download(split, dir)`) or "csv" (the files
      `<csv_dir>/<split>.csv`, which must exist).
    csv_dir: see `source`.
    repo: the Hub dataset the CSVs come from, for the error message.
    splits: the splits to locate.
    download: the builder's `download_csv`.

  Raises:
    FileNotFoundError: source "csv" and a file is missing.
  """
  if source == "hub":
    csv_dir = csv_dir or os.path.join(output_dir, "raw")
    return {split: download(split, csv_dir) for split in splits}
  paths = {split: os.path.join(csv_dir, f"{split}.csv") for split in splits}
  for path in paths.values():
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"{path} not found; the CSV directory (--csv_dir, or "
          f"config.data.build.csv_dir in trm.main) must hold train.csv and "
          f"test.csv of {repo} (or use source hub / generate)")
  return paths


def read_csv_splits(paths: dict[str, str], read: Callable[[str], tuple],
                    kept: str = "") -> dict[str, tuple]:
  """{split: read(path)} for `csv_paths`' files; ValueError naming the file
  when a split would be empty (a header-only CSV, or every row filtered
  out: `kept` says by what), as a generated split of 0 puzzles is."""
  data = {}
  for split, path in paths.items():
    data[split] = read(path)
    if not len(data[split][0]):
      raise ValueError(
          f"{path} holds no puzzle rows{kept}: the {split} split would be "
          "empty and train or evaluate nothing; pass a CSV with rows.")
  return data


# Upstream's rows are one puzzle a line (Sudoku's about 180 characters, a
# 30x30 maze's about 1,820); csv's own field limit (131,072 characters)
# applies only once a line is in memory, so a line without end is refused
# by this first.
MAX_LINE_CHARS = 1 << 20


def _bounded_lines(f, path: str) -> Iterator[str]:
  number = 0
  # Its end ("\n" or "\r\n": the file is read with newline="") aside.
  while line := f.readline(MAX_LINE_CHARS + 2):
    number += 1
    if len(line.rstrip("\r\n")) > MAX_LINE_CHARS:
      raise ValueError(
          f"{path}:{number}: a line longer than {MAX_LINE_CHARS:,} characters"
          "; upstream's CSV holds one puzzle a line. Is this the right file?")
    yield line


@contextlib.contextmanager
def csv_rows(path: str, columns: str
             ) -> Iterator[Iterator[tuple[int, list[str]]]]:
  """Opens an upstream CSV; yields its non-empty data rows as (line, row).

  The first row is a header, skipped unread (as upstream does). Use as
  `with csv_rows(path, columns) as rows: for line, row in rows: ...`; the
  file is closed when the `with` block ends.

  Args:
    path: the CSV file.
    columns: the expected columns, e.g. "source,q,a,rating", for the error
      message of an empty file.

  Raises:
    ValueError: the file is empty (no header row), is not UTF-8 text, or
      holds a row the csv module cannot read (e.g. a field over its size
      limit) or a line over MAX_LINE_CHARS, naming the file and line.
  """
  with open(path, "r", newline="", encoding="utf-8") as f:
    reader = csv.reader(_bounded_lines(f, path))

    def read_row():
      """The next row, or None at the end of the file."""
      try:
        return next(reader, None)
      except UnicodeDecodeError as e:
        raise ValueError(
            f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x}: "
            f"{e.reason}); convert the file to UTF-8 (e.g. iconv -f latin1 "
            "-t utf-8).") from None
      except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: not a readable CSV row "
                         f"({e}); expected rows '{columns}'.") from None

    def rows():
      while (row := read_row()) is not None:
        if row:
          yield reader.line_num, row

    if read_row() is None:
      raise ValueError(f"{path}: empty file; expected a header row and rows "
                       f"'{columns}'")
    yield rows()
