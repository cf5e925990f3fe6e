"""Panels of `trm.visualize`: one example's token ids as a PIL image.

`render_sudoku`, `render_maze` and `render_arc` (dispatched by `render`) draw
a Sudoku board, a maze or an ARC grid from the on-disk encoding of
`trm.data`; with labels, wrong cells are marked inside (Sudoku: red cell,
maze: magenta outline, ARC: white outline when the grid has the target's
shape).
"""

from __future__ import annotations

import functools

import numpy as np
from PIL import Image
from PIL import ImageDraw
from PIL import ImageFont

from trm.families.trm import arc_canvas

KINDS = ("sudoku", "maze", "arc")
Color = tuple[int, int, int]
FRAME_WRONG: Color = (220, 0, 0)  # Also the sheet's frame of a wrong panel.

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

@functools.lru_cache(maxsize=None)
def _font(size: int):
  try:
    return ImageFont.load_default(size=size)
  except (TypeError, OSError):  # Pillow without FreeType: bitmap font.
    return ImageFont.load_default()


def draw_centred(draw: ImageDraw.ImageDraw, box, text: str, fill: Color,
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
      draw_centred(draw, box, str(tokens[i] - 1), fg, int(cell * 0.6))
    elif tokens[i] != 1:  # pad or out-of-vocabulary: shown as "?"
      draw_centred(draw, box, "?", fg, int(cell * 0.6))
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
      `trm.families.trm.arc_canvas.crop`) or a 2-D grid of colours 0..9
      (other values are drawn white).
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
    if grid.size != arc_canvas.GRID_SIZE ** 2:
      raise ValueError(f"arc: expected a 900-token canvas, got shape "
                       f"{grid.shape}")
    return arc_canvas.crop(grid).astype(np.int64)
  if grid.ndim != 2:
    raise ValueError(f"arc: expected a canvas or a 2-D grid, got shape "
                     f"{grid.shape}")
  return grid.astype(np.int64)


def _arc_to_corner(canvases, givens):
  """ARC canvases moved up and left by the offset of `givens`' grid.

  The train split draws each pair at a random offset (upstream's
  translation augmentation; the same for input and output), with PAD above
  and left of it, where the top-left crop finds no grid. The test split's
  grids start at the corner, so nothing moves there and the sheet's crop is
  the evaluator's.
  """
  size = arc_canvas.GRID_SIZE
  g = np.asarray(givens)
  if g.ndim != 1 or g.size != size ** 2:
    return canvases
  used = g.reshape(size, size) != arc_canvas.PAD_ID
  if not used.any():
    return canvases
  r0, c0 = int(used.any(1).argmax()), int(used.any(0).argmax())
  moved = []
  for canvas in canvases:
    c = None if canvas is None else np.asarray(canvas)
    if c is not None and c.ndim == 1 and c.size == size ** 2 and (r0 or c0):
      shifted = np.full((size, size), arc_canvas.PAD_ID, c.dtype)
      shifted[:size - r0, :size - c0] = c.reshape(size, size)[r0:, c0:]
      c = shifted.reshape(-1)
    moved.append(c)
  return moved


def render(kind: str, tokens, givens=None, labels=None) -> Image.Image:
  """`render_<kind>` of one example (`givens`: the input, which Sudoku
  draws from and which places an ARC train pair's grids)."""
  if kind == "sudoku":
    return render_sudoku(tokens, givens=givens, labels=labels)
  if kind == "maze":
    return render_maze(tokens, labels=labels)
  if kind == "arc":
    tokens, labels = _arc_to_corner(
        (tokens, labels), tokens if givens is None else givens)
    return render_arc(tokens, labels=labels)
  raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def exact_match(kind: str, prediction, label, givens=None) -> bool:
  if kind == "arc":
    if givens is not None:
      prediction, label = _arc_to_corner((prediction, label), givens)
    a, b = _arc_grid(prediction), _arc_grid(label)
    return a.shape == b.shape and bool(np.all(a == b))
  return bool(np.array_equal(np.asarray(prediction).reshape(-1),
                             np.asarray(label).reshape(-1)))
