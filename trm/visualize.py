"""Pictures of puzzles: Sudoku boards, mazes and ARC grids as PNG sheets.

`render_sudoku`, `render_maze` and `render_arc` turn one example's token ids
(the on-disk encoding of `trm.data`) into a PIL image; `sample_sheet` writes
one PNG with a row of (input, prediction, target) panels per example.
Prediction panels get a green frame when they equal the target and a red one
otherwise; wrong cells are marked inside (Sudoku: red cell, maze: magenta
outline, ARC: white outline when the grid has the target's shape).

CLI (examples of a built dataset, optionally with model predictions saved as
a [N, seq_len] .npy of token ids, row i = example i of the split):

  python -m trm.visualize --data_dir=data/sudoku --split=test --num=8 \
      --out=sheet.png [--predictions=preds.npy]
"""
from __future__ import annotations

import functools
import os
from typing import Any, Optional, Sequence

from absl import app
from absl import flags
import numpy as np
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFont

from trm.families.trm import arc_eval
from trm.core import cli

KINDS = ("sudoku", "maze", "arc")
Color = tuple[int, int, int]

# ---------------------------------------------------------------- Sudoku
SUDOKU_CELL = 32  # Board image: 9 * SUDOKU_CELL + 1 pixels square.
SUDOKU_BG: Color = (255, 255, 255)  # A cell the model filled in.
SUDOKU_GIVEN_BG: Color = (222, 222, 222)  # A given of the puzzle.
SUDOKU_WRONG_BG: Color = (255, 190, 190)  # A cell that differs from the label.
SUDOKU_GIVEN_FG: Color = (0, 0, 0)
SUDOKU_FILLED_FG: Color = (20, 80, 200)
SUDOKU_WRONG_FG: Color = (190, 0, 0)
SUDOKU_LINE: Color = (150, 150, 150)
SUDOKU_BOX_LINE: Color = (0, 0, 0)

# ------------------------------------------------------------------ Maze
MAZE_SIZE = 30
MAZE_CELL = 8  # Maze image: 30 * MAZE_CELL pixels square.
# Upstream's CHARSET "# SGo" as token ids 1..5, 0 = pad (trm.data.puzzles.maze).
MAZE_COLORS: dict[int, Color] = {
    0: (128, 128, 128),  # pad
    1: (40, 40, 40),  # "#" wall
    2: (255, 255, 255),  # " " open
    3: (0, 170, 0),  # "S" start
    4: (220, 30, 30),  # "G" goal
    5: (30, 110, 255),  # "o" path
}
MAZE_UNKNOWN: Color = (255, 255, 0)  # any other id
MAZE_WRONG: Color = (255, 0, 255)  # outline of a cell that differs

# ------------------------------------------------------------------- ARC
ARC_CELL = 12  # A h x w grid is (w * ARC_CELL + 1) x (h * ARC_CELL + 1).
# The standard ARC palette, colours 0..9.
ARC_COLORS: tuple[Color, ...] = (
    (0, 0, 0),  # 0 black
    (0, 116, 217),  # 1 blue
    (255, 65, 54),  # 2 red
    (46, 204, 64),  # 3 green
    (255, 220, 0),  # 4 yellow
    (170, 170, 170),  # 5 grey
    (240, 18, 190),  # 6 magenta
    (255, 133, 27),  # 7 orange
    (127, 219, 255),  # 8 light blue
    (135, 12, 37),  # 9 maroon
)
ARC_LINE: Color = (85, 85, 85)
ARC_WRONG: Color = (255, 255, 255)
ARC_EMPTY: Color = (200, 200, 200)  # panel of a canvas holding no grid

# ----------------------------------------------------------------- Sheet
SHEET_BG: Color = (255, 255, 255)
SHEET_MARGIN = 8  # Around and between panels.
SHEET_FRAME = 3  # Frame width around every panel.
SHEET_HEADER = 24  # Column titles.
FRAME_PLAIN: Color = (210, 210, 210)
FRAME_RIGHT: Color = (0, 170, 0)
FRAME_WRONG: Color = (220, 0, 0)
TEXT: Color = (0, 0, 0)


@functools.lru_cache(maxsize=None)
def _font(size: int):
  try:
    return ImageFont.load_default(size=size)
  except (TypeError, OSError):  # Pillow without FreeType: bitmap font.
    return ImageFont.load_default()


def _draw_centred(draw: ImageDraw.ImageDraw, box, text: str, fill: Color,
                  size: int) -> None:
  font = _font(size)
  left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
  x0, y0, x1, y1 = box
  draw.text(((x0 + x1 - (right - left)) / 2 - left,
             (y0 + y1 - (bottom - top)) / 2 - top), text, fill=fill,
            font=font)


def _tokens(tokens, size: int, what: str) -> np.ndarray:
  tokens = np.asarray(tokens).reshape(-1)
  if tokens.shape != (size,):
    raise ValueError(f"{what}: expected {size} token ids, got shape "
                     f"{np.shape(tokens)}")
  return tokens.astype(np.int64)


# ----------------------------------------------------------------------------
# Panels.


def render_sudoku(tokens, givens=None, labels=None,
                  cell: int = SUDOKU_CELL) -> Image.Image:
  """A Sudoku board (81 token ids, digit d = token d + 1, 1 = blank).

  Args:
    tokens: the board to draw.
    givens: the puzzle's input tokens; its digits are drawn as givens (grey
      background, black digit), other digits as filled in (blue). Default:
      `tokens` itself (an input board).
    labels: the solution's tokens; cells differing from it are drawn red.
    cell: cell size in pixels.

  Returns:
    An RGB image of 9 * cell + 1 pixels square.
  """
  tokens = _tokens(tokens, 81, "sudoku")
  givens = tokens if givens is None else _tokens(givens, 81, "sudoku givens")
  wrong = (np.zeros(81, bool) if labels is None
           else tokens != _tokens(labels, 81, "sudoku labels"))
  size = 9 * cell + 1
  image = Image.new("RGB", (size, size), SUDOKU_BG)
  draw = ImageDraw.Draw(image)
  for i in range(81):
    r, c = divmod(i, 9)
    box = (c * cell, r * cell, (c + 1) * cell, (r + 1) * cell)
    is_given = 2 <= givens[i] <= 10
    if wrong[i]:
      bg, fg = SUDOKU_WRONG_BG, SUDOKU_WRONG_FG
    elif is_given:
      bg, fg = SUDOKU_GIVEN_BG, SUDOKU_GIVEN_FG
    else:
      bg, fg = SUDOKU_BG, SUDOKU_FILLED_FG
    draw.rectangle(box, fill=bg)
    if 2 <= tokens[i] <= 10:
      _draw_centred(draw, box, str(tokens[i] - 1), fg, int(cell * 0.6))
    elif tokens[i] != 1:  # pad or out-of-vocabulary: shown as "?"
      _draw_centred(draw, box, "?", fg, int(cell * 0.6))
  for k in range(10):
    if k % 3:
      draw.line([(k * cell, 0), (k * cell, size - 1)], fill=SUDOKU_LINE)
      draw.line([(0, k * cell), (size - 1, k * cell)], fill=SUDOKU_LINE)
  for k in range(0, 10, 3):  # Box lines: 2 px, inside the board.
    x = min(k * cell, size - 2)
    draw.rectangle([x, 0, x + 1, size - 1], fill=SUDOKU_BOX_LINE)
    draw.rectangle([0, x, size - 1, x + 1], fill=SUDOKU_BOX_LINE)
  return image


def render_maze(tokens, labels=None, cell: int = MAZE_CELL) -> Image.Image:
  """A 30x30 maze (token ids: 1 wall, 2 open, 3 start, 4 goal, 5 path).

  Cells differing from `labels` (when given) get a magenta outline. Returns
  an RGB image of 30 * cell pixels square.
  """
  n = MAZE_SIZE * MAZE_SIZE
  tokens = _tokens(tokens, n, "maze")
  wrong = (np.zeros(n, bool) if labels is None
           else tokens != _tokens(labels, n, "maze labels"))
  palette = np.array([MAZE_COLORS.get(t, MAZE_UNKNOWN) for t in range(256)],
                     np.uint8)
  grid = palette[np.clip(tokens, 0, 255)].reshape(MAZE_SIZE, MAZE_SIZE, 3)
  pixels = np.repeat(np.repeat(grid, cell, 0), cell, 1)
  image = Image.fromarray(np.ascontiguousarray(pixels), "RGB")
  if wrong.any():
    draw = ImageDraw.Draw(image)
    for i in np.flatnonzero(wrong):
      r, c = divmod(int(i), MAZE_SIZE)
      draw.rectangle([c * cell, r * cell, (c + 1) * cell - 1,
                      (r + 1) * cell - 1], outline=MAZE_WRONG)
  return image


def render_arc(grid, labels=None, cell: int = ARC_CELL) -> Image.Image:
  """An ARC grid in the standard palette.

  Args:
    grid: a flat 900-token canvas (cropped as the evaluator does,
      `trm.families.trm.arc_eval.crop`) or a 2-D grid of colours 0..9 (other values are
      drawn white).
    labels: the target, same forms; when it has the same shape, differing
      cells get a white outline.
    cell: cell size in pixels.

  Returns:
    An RGB image of (w * cell + 1) x (h * cell + 1) pixels with 1-px grid
    lines, or a grey (2 * cell + 1)-pixel square when the canvas holds no
    grid.
  """
  grid = _arc_grid(grid)
  rows, cols = grid.shape
  if grid.size == 0:
    size = 2 * cell + 1
    image = Image.new("RGB", (size, size), ARC_EMPTY)
    ImageDraw.Draw(image).line([(0, 0), (size - 1, size - 1)],
                               fill=FRAME_WRONG)
    return image
  palette = np.array(ARC_COLORS + ((255, 255, 255),) * 246, np.uint8)
  grid = np.clip(grid, 0, 255)
  pixels = np.empty((rows * cell + 1, cols * cell + 1, 3), np.uint8)
  pixels[...] = ARC_LINE
  body = np.repeat(np.repeat(palette[grid], cell, 0), cell, 1)
  mask = np.ones((cell, cell), bool)
  mask[0, :] = mask[:, 0] = False  # Grid line on each cell's top/left.
  mask = np.tile(mask, (rows, cols))
  pixels[:-1, :-1][mask] = body[mask]
  image = Image.fromarray(pixels, "RGB")
  if labels is not None:
    target = _arc_grid(labels)
    if target.shape == grid.shape:
      draw = ImageDraw.Draw(image)
      for r, c in zip(*np.nonzero(target != grid)):
        draw.rectangle([c * cell + 1, r * cell + 1, (c + 1) * cell - 1,
                        (r + 1) * cell - 1], outline=ARC_WRONG)
  return image


def _arc_grid(grid) -> np.ndarray:
  """A flat 900-token canvas, cropped; or a 2-D grid of colours, as is."""
  grid = np.asarray(grid)
  if grid.ndim == 1:
    if grid.size != arc_eval.GRID_SIZE ** 2:
      raise ValueError(f"arc: expected a 900-token canvas, got shape "
                       f"{grid.shape}")
    return arc_eval.crop(grid).astype(np.int64)
  if grid.ndim != 2:
    raise ValueError(f"arc: expected a canvas or a 2-D grid, got shape "
                     f"{grid.shape}")
  return grid.astype(np.int64)


def render(kind: str, tokens, givens=None, labels=None) -> Image.Image:
  """`render_<kind>` of one example (`givens` is used by Sudoku only)."""
  if kind == "sudoku":
    return render_sudoku(tokens, givens=givens, labels=labels)
  if kind == "maze":
    return render_maze(tokens, labels=labels)
  if kind == "arc":
    return render_arc(tokens, labels=labels)
  raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _exact_match(kind: str, prediction, label) -> bool:
  if kind == "arc":
    a, b = _arc_grid(prediction), _arc_grid(label)
    return a.shape == b.shape and bool(np.all(a == b))
  return bool(np.array_equal(np.asarray(prediction).reshape(-1),
                             np.asarray(label).reshape(-1)))


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
  if kind not in KINDS:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
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

  panels = []  # rows of (image, frame colour)
  for i in range(n):
    row = []
    given = inputs[i]
    label = None if labels is None else np.asarray(labels)[i]
    for title, array in columns:
      frame = FRAME_PLAIN
      if title == "input":
        image = render(kind, given)
      elif title == "prediction":
        image = render(kind, array[i], givens=given, labels=label)
        if label is not None:
          frame = (FRAME_RIGHT if _exact_match(kind, array[i], label)
                   else FRAME_WRONG)
      else:
        image = render(kind, array[i], givens=given)
      row.append((image, frame))
    panels.append(row)

  panel_w = max([im.width for row in panels for im, _ in row], default=1)
  panel_h = max([im.height for row in panels for im, _ in row], default=1)
  slot_w = panel_w + 2 * SHEET_FRAME + SHEET_MARGIN
  slot_h = panel_h + 2 * SHEET_FRAME + SHEET_MARGIN
  sheet = Image.new("RGB", (SHEET_MARGIN + len(columns) * slot_w,
                            SHEET_HEADER + SHEET_MARGIN + n * slot_h),
                    SHEET_BG)
  draw = ImageDraw.Draw(sheet)
  for j, (title, _) in enumerate(columns):
    x = SHEET_MARGIN + j * slot_w
    _draw_centred(draw, (x, 0, x + panel_w + 2 * SHEET_FRAME, SHEET_HEADER),
                  title, TEXT, 14)
  for i, row in enumerate(panels):
    y = SHEET_HEADER + SHEET_MARGIN + i * slot_h
    for j, (image, frame) in enumerate(row):
      x = SHEET_MARGIN + j * slot_w
      draw.rectangle([x, y, x + image.width + 2 * SHEET_FRAME - 1,
                      y + image.height + 2 * SHEET_FRAME - 1], fill=frame)
      sheet.paste(image, (x + SHEET_FRAME, y + SHEET_FRAME))
  if path is not None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    sheet.save(path, format="PNG")
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
    raise ValueError(f"need num >= 1 and start >= 0, got {num}, {start}")
  metadata, arrays = puzzle_format.read_split(data_dir, split, set_name,
                                              check_tokens=False)
  kind = kind_from_metadata(metadata)
  total = arrays["inputs"].shape[0]
  if start >= total:
    raise ValueError(f"start={start} but the split has {total} examples")
  stop = min(start + num, total)
  predictions = None
  if predictions_path:
    predictions = np.load(predictions_path, allow_pickle=False)
    if predictions.ndim != 2 or predictions.shape[1] != metadata.seq_len:
      raise ValueError(f"{predictions_path}: expected [N, {metadata.seq_len}]"
                       f" token ids, got shape {predictions.shape}")
    if predictions.shape[0] < stop:
      raise ValueError(f"{predictions_path}: {predictions.shape[0]} rows, "
                       f"need {stop} (row i = example i of the split)")
    predictions = predictions[start:stop]
  return sample_sheet(kind, np.asarray(arrays["inputs"][start:stop]),
                      predictions, np.asarray(arrays["labels"][start:stop]),
                      out, max_rows=stop - start)


# ----------------------------------------------------------------------------
# CLI.

_DATA_DIR = _SPLIT = _SET = _NUM = _START = _OUT = _PREDICTIONS = None


def define_flags() -> None:
  """Defines the command-line flags; only when run as a program."""
  global _DATA_DIR, _SPLIT, _SET, _NUM, _START, _OUT, _PREDICTIONS
  _DATA_DIR = flags.DEFINE_string("data_dir", None, "Dataset root.")
  _SPLIT = flags.DEFINE_string("split", "test", "Split to draw.")
  _SET = flags.DEFINE_string("set", "all", "Set of the split.")
  _NUM = flags.DEFINE_integer("num", 8, "Number of examples (rows).")
  _START = flags.DEFINE_integer("start", 0, "First example.")
  _OUT = flags.DEFINE_string("out", "sheet.png", "Output PNG.")
  _PREDICTIONS = flags.DEFINE_string(
      "predictions", None, ".npy of [N, seq_len] predicted token ids; row i "
      "is example i of the split.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  sheet = dataset_sheet(_DATA_DIR.value, _SPLIT.value, _OUT.value,
                        num=_NUM.value, start=_START.value,
                        predictions_path=_PREDICTIONS.value,
                        set_name=_SET.value)
  print(f"Wrote {_OUT.value} ({sheet.width}x{sheet.height})")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["data_dir"])
  cli.run(main)
