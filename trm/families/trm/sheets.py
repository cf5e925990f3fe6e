"""Pictures of puzzles: Sudoku boards, mazes and ARC grids as PNG sheets.

`panels.render_sudoku`, `render_maze` and `render_arc` turn one example's
token ids (the on-disk encoding of `trm.data.puzzles`) into a PIL image;
`sample_sheet` writes one PNG with a row of (input, prediction, target)
panels per example. Prediction panels get a green frame when they equal the
target and a red one otherwise; wrong cells are marked inside (Sudoku: red
cell, maze: magenta outline, ARC: white outline when the grid has the
target's shape). `python -m trm.visualize` draws a built dataset.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
from PIL import Image
from PIL import ImageDraw

from trm.data import io as data_io
from trm.families.trm import panels

Color = panels.Color

# ----------------------------------------------------------------- Sheet
SHEET_BG: Color = (255, 255, 255)
SHEET_MARGIN = 8  # Around and between panels.
SHEET_FRAME = 3  # Frame width around every panel.
SHEET_HEADER = 24  # Column titles.
FRAME_PLAIN: Color = (210, 210, 210)
FRAME_RIGHT: Color = (0, 170, 0)
TEXT: Color = (0, 0, 0)


# ----------------------------------------------------------------------------
# Sheets.


def kind_from_metadata(metadata: Any) -> str:
  """"sudoku", "maze" or "arc" from a dataset's seq_len and vocab_size.

  Args:
    metadata: a `PuzzleDatasetMetadata`, or a mapping with `seq_len` and
      `vocab_size`.
  """
  get = (metadata.get if isinstance(metadata, dict)
         else lambda k: getattr(metadata, k))
  seq_len, vocab = get("seq_len"), get("vocab_size")
  if seq_len == 81:
    return "sudoku"
  if seq_len == 900 and vocab == 6:
    return "maze"
  if seq_len == 900 and vocab == 12:
    return "arc"
  raise ValueError(f"no picture for seq_len={seq_len}, vocab_size={vocab}; "
                   f"known: Sudoku (81), Maze (900, vocab 6), ARC (900, "
                   f"vocab 12)")


def sample_sheet(kind: str, inputs, predictions, labels, path: Optional[str],
                 max_rows: int = 8) -> Image.Image:
  """Writes one PNG with a row of (input, prediction, target) per example.

  Args:
    kind: "sudoku", "maze" or "arc".
    inputs: [N, seq_len] input token ids.
    predictions: [N, seq_len] predicted token ids, or None (no column).
    labels: [N, seq_len] target token ids, or None (no column).
    path: PNG file to write (parent directories are created); None: only
      return the image.
    max_rows: draw at most this many examples (the first ones).

  Returns:
    The sheet. Its size: width SHEET_MARGIN + columns * (panel width +
    2 * SHEET_FRAME + SHEET_MARGIN), height SHEET_HEADER + SHEET_MARGIN +
    rows * (panel height + 2 * SHEET_FRAME + SHEET_MARGIN), where the panel
    size is the largest panel's.
  """
  if kind not in panels.KINDS:
    raise ValueError(
        f"kind must be one of {panels.KINDS}, got {kind!r}")
  if max_rows < 1:
    raise ValueError(f"max_rows must be >= 1, got {max_rows}")
  inputs = np.asarray(inputs)
  n = min(len(inputs), max_rows)
  columns = [("input", inputs)]
  if predictions is not None:
    columns.append(("prediction", np.asarray(predictions)))
  if labels is not None:
    columns.append(("target", np.asarray(labels)))
  for title, array in columns:
    if len(array) < n:
      raise ValueError(f"{title}: {len(array)} rows, need {n}")

  rows = []  # rows of (image, frame colour)
  for i in range(n):
    row = []
    given = inputs[i]
    label = None if labels is None else np.asarray(labels)[i]
    for title, array in columns:
      frame = FRAME_PLAIN
      if title == "input":
        image = panels.render(kind, given)
      elif title == "prediction":
        image = panels.render(kind,
                                        array[i],
                                        givens=given,
                                        labels=label)
        if label is not None:
          frame = (FRAME_RIGHT if panels.exact_match(
              kind, array[i], label, givens=given) else panels.FRAME_WRONG)
      else:
        image = panels.render(kind, array[i], givens=given)
      row.append((image, frame))
    rows.append(row)

  panel_w = max([im.width for row in rows for im, _ in row], default=1)
  panel_h = max([im.height for row in rows for im, _ in row], default=1)
  slot_w = panel_w + 2 * SHEET_FRAME + SHEET_MARGIN
  slot_h = panel_h + 2 * SHEET_FRAME + SHEET_MARGIN
  sheet = Image.new("RGB", (SHEET_MARGIN + len(columns) * slot_w,
                            SHEET_HEADER + SHEET_MARGIN + n * slot_h),
                    SHEET_BG)
  draw = ImageDraw.Draw(sheet)
  for j, (title, _) in enumerate(columns):
    x = SHEET_MARGIN + j * slot_w
    panels.draw_centred(
        draw, (x, 0, x + panel_w + 2 * SHEET_FRAME, SHEET_HEADER), title, TEXT,
        14)
  for i, row in enumerate(rows):
    y = SHEET_HEADER + SHEET_MARGIN + i * slot_h
    for j, (image, frame) in enumerate(row):
      x = SHEET_MARGIN + j * slot_w
      draw.rectangle([x, y, x + image.width + 2 * SHEET_FRAME - 1,
                      y + image.height + 2 * SHEET_FRAME - 1], fill=frame)
      sheet.paste(image, (x + SHEET_FRAME, y + SHEET_FRAME))
  if path is not None:
    # Whole or not at all: an interrupted write leaves the old sheet.
    from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
    atomic_files.atomic_write(path, lambda f: sheet.save(f, format="PNG"))
  return sheet


def dataset_sheet(data_dir: str, split: str, out: str, num: int = 8,
                  start: int = 0, predictions_path: Optional[str] = None,
                  set_name: str = "all") -> Image.Image:
  """Renders examples start..start+num-1 of a built dataset split to `out`.

  Args:
    data_dir: dataset root (`trm.data.puzzles.format` layout).
    split: "train" or "test".
    out: PNG path.
    num: number of examples.
    start: first example.
    predictions_path: optional .npy of [N, seq_len] token ids whose row i
      is the prediction for example i of the split.
    set_name: the split's set.
  """
  from trm.data.puzzles import format as puzzle_format  # pylint: disable=g-import-not-at-top
  if num < 1 or start < 0:
    # The flags are trm.visualize's, the only caller that takes them from
    # a user.
    raise ValueError(f"--num={num}, --start={start}: need --num >= 1 and "
                     "--start >= 0")
  metadata, arrays = puzzle_format.read_split(data_dir, split, set_name,
                                              check_tokens=False)
  kind = kind_from_metadata(metadata)
  total = arrays["inputs"].shape[0]
  if start >= total:
    raise ValueError(f"--start={start} but the {split} split has {total} "
                     f"examples (0 to {total - 1}); pass a smaller --start.")
  stop = min(start + num, total)
  predictions = None
  if predictions_path:
    try:
      data_io.check_npy_size(predictions_path)
      predictions = np.load(predictions_path, allow_pickle=False)
    except (ValueError, OSError) as e:
      # np.load's own message names neither the file nor the fix.
      raise ValueError(f"{predictions_path}: not a readable .npy array of "
                       f"token ids ({e}); pass the predictions_test.npy "
                       "that trm.evaluate wrote.") from None
    if (not isinstance(predictions, np.ndarray)
        or predictions.dtype.kind not in "iu"):
      raise ValueError(f"{predictions_path}: expected integer token ids, got "
                       f"{getattr(predictions, 'dtype', type(predictions))}")
    if predictions.ndim != 2 or predictions.shape[1] != metadata.seq_len:
      raise ValueError(f"{predictions_path}: expected [N, {metadata.seq_len}]"
                       f" token ids, got shape {predictions.shape}")
    if predictions.shape[0] < stop:
      raise ValueError(f"{predictions_path}: {predictions.shape[0]} rows, "
                       f"need {stop} (row i = example i of the split)")
    # trm.evaluate writes at most one row per example; more rows are the
    # answers to another dataset or split, and would be drawn beside the
    # wrong puzzles.
    if predictions.shape[0] > total:
      raise ValueError(f"{predictions_path}: {predictions.shape[0]} rows, but "
                       f"the {split} split of {data_dir} has {total} examples"
                       " (row i = example i of the split); pass the "
                       "predictions written for this dataset and --split.")
    predictions = predictions[start:stop]
  return sample_sheet(kind, np.asarray(arrays["inputs"][start:stop]),
                      predictions, np.asarray(arrays["labels"][start:stop]),
                      out, max_rows=stop - start)
