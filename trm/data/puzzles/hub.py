"""Upstream's CSV datasets on the Hugging Face Hub, shared by the builders.

The Sudoku-Extreme and Maze-Hard builders (`trm.data.puzzles.sudoku`,
`trm.data.puzzles.maze`) take their data from one of three sources: "hub" (download
`<split>.csv` of a Hub dataset), "csv" (the same files already on disk) or
"generate" (an offline generator, builder-specific). This module holds what
the first two have in common: the download, locating the CSVs and reading
their rows.
"""

import contextlib
import csv
import os
import shutil
import urllib.request
from typing import Callable, Iterator, Optional, Sequence

from trm.data import atomic_files

# URL of a file of a Hub dataset (plain HTTPS, no `huggingface_hub`).
HF_URL = "https://huggingface.co/datasets/{repo}/resolve/main/{filename}"


def hf_hub_download() -> Optional[Callable]:
  """`huggingface_hub.hf_hub_download`, or None when it is not installed."""
  try:
    # Optional dependency (`pip install -e .[hub]`), hence imported lazily.
    from huggingface_hub import hf_hub_download as download
  except ImportError:
    return None
  return download


def download_csv(repo: str, split: str, dest_dir: str, *,
                 splits: Sequence[str], generated: str,
                 get_hub_download: Callable[[], Optional[Callable]],
                 timeout: float = 60.0) -> str:
  """Downloads `<split>.csv` of the Hub dataset `repo` into `dest_dir`.

  Uses `huggingface_hub` when `get_hub_download()` returns its download
  function, else plain HTTPS (`HF_URL`). An existing `<dest_dir>/<split>.csv`
  is reused (plain downloads are written atomically, so an existing file is
  complete).

  Args:
    repo: Hub dataset, e.g. "sapientinc/sudoku-extreme".
    split: one of `splits`.
    dest_dir: directory to store the file in.
    splits: the dataset's splits.
    generated: what the builder's offline generator makes ("puzzles",
      "mazes"), for the error message.
    get_hub_download: returns `huggingface_hub.hf_hub_download` or None
      (see `hf_hub_download`); called only when a download is needed.
    timeout: socket timeout in seconds for the plain HTTPS path.

  Returns:
    Path of the local CSV.

  Raises:
    ValueError: `split` is not one of `splits`.
    RuntimeError: the download failed (network unreachable, HTTP error, ...).
  """
  if split not in splits:
    raise ValueError(f"split must be one of {splits}, got {split!r}")
  os.makedirs(dest_dir, exist_ok=True)
  filename = f"{split}.csv"
  dest = os.path.join(dest_dir, filename)
  if os.path.isfile(dest):
    return dest
  hub_download = get_hub_download()
  url = HF_URL.format(repo=repo, filename=filename)
  try:
    if hub_download is not None:
      return hub_download(repo_id=repo, filename=filename,
                          repo_type="dataset", local_dir=dest_dir)
    with urllib.request.urlopen(url, timeout=timeout) as response:
      atomic_files.atomic_write(
          dest, lambda f: shutil.copyfileobj(response, f, 1 << 20))
    return dest
  except Exception as e:  # Any failure here means "could not download".
    raise RuntimeError(
        f"Could not download {filename} of {repo} ({url}): the network "
        f"looks unreachable ({type(e).__name__}: {e}). Build offline instead: "
        f"--source=generate for synthetic {generated}, or fetch the CSVs "
        f"elsewhere and pass --source=csv --csv_dir=DIR.") from e


def check_source(source: str, sources: Sequence[str],
                 csv_dir: Optional[str]) -> None:
  """Raises ValueError unless `source` is one of `sources` and, for "csv",
  `csv_dir` is set."""
  if source not in sources:
    raise ValueError(f"source must be one of {sources}, got {source!r}")
  if source == "csv" and not csv_dir:
    raise ValueError("source='csv' needs csv_dir (--csv_dir, or "
                     "config.data.build.csv_dir in trm.main) holding "
                     "train.csv and test.csv")


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
    ValueError: the file is empty (no header row).
  """
  with open(path, "r", newline="") as f:
    reader = csv.reader(f)
    if next(reader, None) is None:
      raise ValueError(f"{path}: empty file; expected a header row and rows "
                       f"'{columns}'")
    yield ((reader.line_num, row) for row in reader if row)
