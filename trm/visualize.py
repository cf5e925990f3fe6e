"""Draw examples of a built puzzle dataset as a PNG sheet, optionally with
model predictions saved as a [N, seq_len] .npy of token ids (row i = example
i of the split); the drawing is `trm/families/trm/sheets.py`. `trm.evaluate`
writes its model's answers to the test split as
`<output_dir>/predictions_test.npy` and prints the command that draws them:

  python -m trm.visualize --data_dir=data/sudoku --split=test --num=8 \
      --out=sheet.png [--predictions=runs/sudoku-eval/predictions_test.npy]

It uses no accelerator. Started as on a pod (the same command on every
worker, with --process_id), process 0 alone draws; without that flag each
worker draws the same sheet (written atomically, so shared storage ends up
with one whole file).
"""
from __future__ import annotations

import os
from typing import Sequence

from absl import app
from absl import flags

from trm.core import cli
from trm.data import atomic_files
from trm.families.trm.sheets import dataset_sheet


# ----------------------------------------------------------------------------
# CLI.

_DATA_DIR = _SPLIT = _SET = _NUM = _START = _OUT = _PREDICTIONS = None


def define_flags() -> None:
  """Defines the command-line flags; only when run as a program."""
  global _DATA_DIR, _SPLIT, _SET, _NUM, _START, _OUT, _PREDICTIONS
  _DATA_DIR = flags.DEFINE_string("data_dir", None, "Dataset root.")
  _SPLIT = flags.DEFINE_string("split", "test", "Split to draw.")
  _SET = flags.DEFINE_string("set", "all", "Set of the split.")
  _NUM = flags.DEFINE_integer(
      "num", 8, f"Number of examples (rows), at most {MAX_NUM} a sheet.")
  _START = flags.DEFINE_integer("start", 0, "First example.")
  _OUT = flags.DEFINE_string("out", "sheet.png", "Output PNG.")
  _PREDICTIONS = flags.DEFINE_string(
      "predictions", None, ".npy of [N, seq_len] predicted token ids; row i "
      "is example i of the split (trm.evaluate writes <output_dir>/"
      "predictions_test.npy).")


# The most examples one sheet draws. At 3 columns, 200 rows of the largest
# panels (30 x 30 ARC grids) are 85M pixels, under the 89M past which PIL
# (and viewers built on it) refuse to open a PNG as a decompression bomb;
# 400 Sudoku rows took 730 MB and 16 s, so --num=100000 of its test split
# would want ~180 GB and over an hour.
MAX_NUM = 200


def check_inputs(data_dir: str, split: str, num: int,
                 predictions: str | None) -> None:
  """The flags naming what is drawn, checked before anything is read."""
  if num > MAX_NUM:
    raise ValueError(f"--num={num}: one sheet draws at most {MAX_NUM} "
                     "examples (more would be a PNG too large to open); "
                     f"draw the rest on further sheets with --start={MAX_NUM},"
                     f" --start={2 * MAX_NUM}, ...")
  if not data_dir:  # --data_dir=$DATA with DATA unset
    raise ValueError("--data_dir is given but empty (it drew the dataset of "
                     "the current directory): name the dataset root.")
  # The dataset is memory-mapped and the .npy read with os: an object-store
  # path was "split directory does not exist. Build the data first ...
  # --output_dir=gs://...".
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  weights_io.check_local(data_dir, "--data_dir", "datasets are")
  if "://" in (predictions or ""):
    raise ValueError(
        f"--predictions={predictions!r} is an object-store path; the file "
        "is read from a local disk: copy it (e.g. gcloud storage cp "
        f"{predictions} FILE) and pass --predictions=FILE.")
  # --data_dir=<a trm.main workdir> (runs/sudoku for runs/sudoku/data) was
  # told to build a dataset into the workdir; it is told where the run's
  # dataset is.
  if not os.path.isdir(os.path.join(data_dir, split)) and (
      os.path.isfile(os.path.join(data_dir, "config.json"))
      and os.path.isdir(os.path.join(data_dir, "checkpoints"))):
    # pylint: disable-next=g-import-not-at-top,protected-access
    from trm.families.trm.task import _recorded_data_dir
    run_data = _recorded_data_dir(data_dir) or os.path.join(data_dir, "data")
    raise ValueError(f"--data_dir={data_dir} is a trm.main workdir, not a "
                     f"dataset: the run's dataset is --data_dir={run_data} "
                     "(its config.json's data.data_dir, else <workdir>/data).")


def check_out(path: str, data_dir: str | None = None,
              predictions: str | None = None) -> None:
  """--out can become the PNG: checked before drawing (the final rename
  said '[Errno 21] Is a directory: <temporary file> -> PATH'), and it is
  none of the files drawn from (the --predictions .npy, a file of
  --data_dir), which the PNG replaced."""
  if not path:  # e.g. --out=$PNG with PNG unset
    raise ValueError("--out is given but empty: name the PNG file to write.")
  if "://" in path:  # an object store: written whole by its own client
    return
  if path.endswith(os.sep) or os.path.isdir(path):
    raise ValueError(f"--out={path}: is a directory; name the PNG file to "
                     "write in it.")
  if atomic_files.is_special(path):
    # The final rename replaced it: --out=/dev/null, as root, left a
    # regular file in place of the host's /dev/null.
    raise ValueError(f"--out={path}: is not a regular file (a device, FIFO "
                     "or socket), which the PNG would replace; name a file.")
  if os.path.isfile(path):
    if predictions and os.path.isfile(predictions) and os.path.samefile(
        path, predictions):
      raise ValueError(f"--out={path} is --predictions={predictions}: the "
                       "PNG would replace the predictions; name another "
                       "file.")
    if data_dir and cli.within(path, data_dir) and not (
        os.path.realpath(path).endswith(".png")):
      raise ValueError(f"--out={path} is a file of --data_dir={data_dir}: "
                       "the PNG would replace it; name another file.")
    # There is no --overwrite: an earlier sheet (a PNG) is drawn over, any
    # other file (notes.txt, a results .json) was replaced without a word.
    if not _png_or_empty(path):
      raise ValueError(f"--out={path} is an existing file that is not a PNG "
                       "(not an earlier sheet): the PNG would replace it; "
                       "name another file, or remove it first.")
  cli.check_writable_ancestor(path, "--out")


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_or_empty(path: str) -> bool:
  """Whether the file at `path` is a PNG image or empty."""
  try:
    with open(path, "rb") as f:
      head = f.read(len(_PNG_SIGNATURE))
  except OSError:  # unreadable: its rename is the writer's to report
    return True
  return not head or head == _PNG_SIGNATURE


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  process = flags.FLAGS["process_id"].value
  if process:  # no devices are needed, so the job is not joined
    print(f"process {process}: nothing to do (process 0 draws {_OUT.value})")
    return
  check_inputs(_DATA_DIR.value, _SPLIT.value, _NUM.value,
               _PREDICTIONS.value)
  out = cli.expand_home(_OUT.value)
  check_out(out, _DATA_DIR.value, _PREDICTIONS.value)
  sheet = dataset_sheet(_DATA_DIR.value, _SPLIT.value, out,
                        num=_NUM.value, start=_START.value,
                        predictions_path=_PREDICTIONS.value,
                        set_name=_SET.value)
  print(f"Wrote {out} ({sheet.width}x{sheet.height})")


# A stop signal exits 143 (SIGTERM) with this line, not trm.main's 0.
STOPPED_LINE = ("{tool}: stopped by {name} before the sheet was written (a "
                "sheet already at --out is kept whole); run it again.")


if __name__ == "__main__":
  # The pod flags every entry point takes, so one command serves all workers.
  from trm.core import distributed  # pylint: disable=g-import-not-at-top,unused-import
  define_flags()
  flags.mark_flags_as_required(["data_dir"])
  # It compiles nothing: configuring the compilation cache imported jax.
  cli.run(main, compilation_cache=False, stopped_line=STOPPED_LINE)
