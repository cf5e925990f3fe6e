"""Pictures: panel sizes, colours at known cells, sheets, the CLI."""
import os
import re
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
import cli_batch
import repo
import special_files

from trm.data.puzzles import arc_grids
from trm.families.trm import arc_canvas
from trm.families.trm import sheets as vis
from trm.families.trm import panels
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import sudoku
from trm.data.puzzles import sudoku_generate

ROOT = repo.ROOT

# The refusals run `python -m trm.visualize` forked from one process that
# has imported what the tool imports before its flags are parsed
# (tests/cli_batch.py; trm.core.distributed defines the pod flags, the rest
# none): its start-up per case less. test_cli_on_a_small_sudoku_dataset
# runs the real entry point.
visualize_cli = cli_batch.serve(
    "trm.visualize", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=("trm.core.cli", "trm.core.distributed",
             "trm.families.trm.sheets"))


def _px(image, x, y):
  return image.convert("RGB").getpixel((x, y))


def _sudoku_cell(image, i, cell=panels.SUDOKU_CELL):
  """Background pixel of Sudoku cell i (clear of lines and the digit)."""
  r, c = divmod(i, 9)
  return _px(image, c * cell + 4, r * cell + 4)


def _sudoku_example():
  boards, solutions = sudoku_generate.generate_puzzles(1, 40, seed=0)
  return boards[0] + 1, solutions[0] + 1  # tokens: value + 1


def test_sudoku_board_colours():
  inputs, labels = _sudoku_example()
  image = panels.render_sudoku(inputs)
  assert image.size == (9 * panels.SUDOKU_CELL + 1,) * 2
  given = int(np.flatnonzero(inputs > 1)[0])
  blank = int(np.flatnonzero(inputs == 1)[0])
  assert _sudoku_cell(image, given) == panels.SUDOKU_GIVEN_BG
  assert _sudoku_cell(image, blank) == panels.SUDOKU_BG

  # A prediction with one wrong filled cell and one wrong given.
  prediction = labels.copy()
  wrong_filled = int(np.flatnonzero(inputs == 1)[1])
  prediction[wrong_filled] = labels[wrong_filled] % 9 + 2
  wrong_given = int(np.flatnonzero(inputs > 1)[1])
  prediction[wrong_given] = labels[wrong_given] % 9 + 2
  image = panels.render_sudoku(prediction,
                                         givens=inputs,
                                         labels=labels)
  assert _sudoku_cell(image, given) == panels.SUDOKU_GIVEN_BG
  assert _sudoku_cell(image, blank) == panels.SUDOKU_BG
  assert _sudoku_cell(image, wrong_filled) == panels.SUDOKU_WRONG_BG
  assert _sudoku_cell(image, wrong_given) == panels.SUDOKU_WRONG_BG
  # The digit is drawn: the cell holds its foreground colour somewhere.
  r, c = divmod(blank, 9)
  size = panels.SUDOKU_CELL
  cell = np.asarray(image)[r * size:(r + 1) * size, c * size:(c + 1) * size]
  assert (cell == panels.SUDOKU_FILLED_FG).all(-1).any()
  # Box lines are black, the top-left corner included.
  assert _px(image, 0, 5) == panels.SUDOKU_BOX_LINE
  assert _px(image, 3 * panels.SUDOKU_CELL,
             5) == panels.SUDOKU_BOX_LINE


def test_maze_colours():
  tokens = np.full(900, 2, np.uint8)  # open
  tokens[0:30] = 1  # top row: walls
  tokens[31], tokens[32], tokens[33] = 3, 5, 4  # S, o, G
  tokens[899] = 0  # pad
  image = panels.render_maze(tokens)
  assert image.size == (30 * panels.MAZE_CELL,) * 2

  def centre(i):
    r, c = divmod(i, 30)
    return _px(image, c * panels.MAZE_CELL + 4,
               r * panels.MAZE_CELL + 4)

  assert centre(5) == panels.MAZE_COLORS[1]
  assert centre(100) == panels.MAZE_COLORS[2]
  assert centre(31) == panels.MAZE_COLORS[3]
  assert centre(32) == panels.MAZE_COLORS[5]
  assert centre(33) == panels.MAZE_COLORS[4]
  assert centre(899) == panels.MAZE_COLORS[0]
  labels = tokens.copy()
  labels[100] = 5
  image = panels.render_maze(tokens, labels=labels)
  r, c = divmod(100, 30)
  assert _px(image, c * 8, r * 8) == panels.MAZE_WRONG  # outline
  assert _px(image, c * 8 + 4, r * 8 + 4) == panels.MAZE_COLORS[2]


def test_arc_grid_colours_and_crop():
  grid = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 0, 1]])
  canvas = arc_canvas.to_canvas(grid)
  image = panels.render_arc(canvas)
  cell = panels.ARC_CELL
  assert image.size == (3 * cell + 1, 4 * cell + 1)  # cropped to 4x3
  for r in range(4):
    for c in range(3):
      assert _px(image, c * cell + 4,
                 r * cell + 4) == panels.ARC_COLORS[grid[r, c]]
  assert _px(image, 0, 0) == panels.ARC_LINE
  # A 2-D grid draws the same picture; an empty canvas a placeholder.
  assert np.array_equal(np.asarray(panels.render_arc(grid)),
                        np.asarray(image))
  assert panels.render_arc(np.zeros(
      900, np.uint8)).size == (2 * cell + 1,) * 2
  # Wrong cells (same shape as the target) get a white outline.
  wrong = grid.copy()
  wrong[1, 2] = 9
  image = panels.render_arc(arc_canvas.to_canvas(wrong),
                                      labels=canvas)
  assert _px(image, 2 * cell + 1, 1 * cell + 1) == panels.ARC_WRONG
  assert _px(image, 2 * cell + 4,
             1 * cell + 4) == panels.ARC_COLORS[9]
  assert _px(image, 1 * cell + 1,
             1 * cell + 1) == panels.ARC_COLORS[4]


def test_arc_train_pairs_at_an_offset_are_drawn(tmp_path):
  """The train split draws a pair at a random offset (translation
  augmentation): the top-left crop found no grid there, so the sheet showed
  'no grid' panels for most train examples."""
  inp = np.array([[1, 2], [3, 4], [5, 6]])
  out = np.array([[7, 8, 9]])
  for row, col in ((5, 0), (0, 7), (11, 20), (0, 0)):
    canvases = arc_grids.encode_pair(inp, out, row, col)
    for canvas, grid in zip(canvases, (inp, out)):
      assert np.array_equal(np.asarray(panels.render("arc", canvas,
                                                     givens=canvases[0])),
                            np.asarray(panels.render_arc(grid)))
    assert np.array_equal(np.asarray(panels.render("arc", canvases[0])),
                          np.asarray(panels.render_arc(inp)))
    assert panels.exact_match("arc", canvases[1], canvases[1],
                              givens=canvases[0])
    wrong = arc_grids.encode_pair(inp, out + 1, row, col)[1]
    assert not panels.exact_match("arc", wrong, canvases[1],
                                  givens=canvases[0])
  # Both crops were empty, so a wrong answer was framed as right.
  for prediction, frame in ((canvases[1], vis.FRAME_RIGHT),
                            (wrong, panels.FRAME_WRONG)):
    sheet = vis.sample_sheet("arc", canvases[:1], [prediction],
                             canvases[1:], str(tmp_path / "s.png"))
    x = vis.SHEET_MARGIN + (sheet.width - vis.SHEET_MARGIN) // 3
    assert _px(sheet, x, vis.SHEET_HEADER + vis.SHEET_MARGIN) == frame
  # The test split's grids start at the corner: drawn as the evaluator crops.
  canvas = arc_canvas.to_canvas(inp)
  assert np.array_equal(np.asarray(panels.render("arc", canvas, givens=canvas)),
                        np.asarray(panels.render_arc(inp)))


def test_kind_from_metadata():
  assert vis.kind_from_metadata(sudoku.dataset_metadata(3)) == "sudoku"
  assert vis.kind_from_metadata({"seq_len": 900, "vocab_size": 6}) == "maze"
  assert vis.kind_from_metadata({"seq_len": 900, "vocab_size": 12}) == "arc"
  with pytest.raises(ValueError):
    vis.kind_from_metadata({"seq_len": 900, "vocab_size": 7})


def _sheet_height(rows, panel_h):
  return (vis.SHEET_HEADER + vis.SHEET_MARGIN +
          rows * (panel_h + 2 * vis.SHEET_FRAME + vis.SHEET_MARGIN))


def _sheet_width(columns, panel_w):
  return vis.SHEET_MARGIN + columns * (panel_w + 2 * vis.SHEET_FRAME +
                                       vis.SHEET_MARGIN)


def test_sudoku_sheet_rows_and_frames(tmp_path):
  boards, solutions = sudoku_generate.generate_puzzles(5, 30, seed=1)
  inputs, labels = boards + 1, solutions + 1
  predictions = labels.copy()
  predictions[1, np.flatnonzero(inputs[1] == 1)[0]] = 1  # row 1 is wrong
  path = str(tmp_path / "sub" / "sheet.png")
  sheet = vis.sample_sheet("sudoku", inputs, predictions, labels, path,
                           max_rows=3)
  with Image.open(path) as png:
    assert png.format == "PNG"
    assert png.size == sheet.size
  panel = 9 * panels.SUDOKU_CELL + 1
  assert sheet.size == (_sheet_width(3, panel), _sheet_height(3, panel))
  slot_w = panel + 2 * vis.SHEET_FRAME + vis.SHEET_MARGIN
  slot_h = slot_w

  def frame(row, col):
    return _px(sheet, vis.SHEET_MARGIN + col * slot_w + 1,
               vis.SHEET_HEADER + vis.SHEET_MARGIN + row * slot_h + 1)

  assert frame(0, 1) == vis.FRAME_RIGHT
  assert frame(1, 1) == panels.FRAME_WRONG
  assert frame(2, 1) == vis.FRAME_RIGHT
  assert frame(0, 0) == vis.FRAME_PLAIN
  assert frame(0, 2) == vis.FRAME_PLAIN
  # Without predictions: two columns, all rows when max_rows allows.
  sheet = vis.sample_sheet("sudoku", inputs, None, labels, None)
  assert sheet.size == (_sheet_width(2, panel), _sheet_height(5, panel))


def test_arc_and_maze_sheets(tmp_path):
  small, big = np.ones((2, 2), int), np.full((5, 4), 3)
  inputs = np.stack([arc_canvas.to_canvas(small), arc_canvas.to_canvas(big)])
  sheet = vis.sample_sheet("arc", inputs, np.zeros_like(inputs), inputs,
                           str(tmp_path / "arc.png"))
  cell = panels.ARC_CELL
  assert sheet.size == (_sheet_width(3, 4 * cell + 1),
                        _sheet_height(2, 5 * cell + 1))
  mazes = np.full((2, 900), 2, np.uint8)
  sheet = vis.sample_sheet("maze", mazes, mazes, mazes,
                           str(tmp_path / "maze.png"))
  assert sheet.size == (_sheet_width(3, 240), _sheet_height(2, 240))


def test_cli_on_a_small_sudoku_dataset(tmp_path, visualize_cli):
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=4,
                       num_aug=0, num_blanks=30)
  _, arrays = puzzle_format.read_split(data_dir, "test")
  predictions = np.array(arrays["labels"])
  predictions[2, 0] = 1 if predictions[2, 0] != 1 else 2
  preds_path = str(tmp_path / "preds.npy")
  np.save(preds_path, predictions)
  out = str(tmp_path / "sheet.png")
  # --out=~/sheet.png reaches the program as typed (the shell expands a ~
  # only at a word's start): it wrote <cwd>/~/sheet.png.
  result = subprocess.run(
      [sys.executable, "-m", "trm.visualize", f"--data_dir={data_dir}",
       "--split=test", "--num=3", "--out=~/sheet.png",
       f"--predictions={preds_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu", HOME=str(tmp_path)))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith(f"Wrote {out} ")
  panel = 9 * panels.SUDOKU_CELL + 1
  # Started as on a pod, process 1 leaves the drawing to process 0.
  other = str(tmp_path / "other.png")
  pod = visualize_cli.run(
      [f"--data_dir={data_dir}", f"--out={other}",
       "--coordinator_address=127.0.0.1:1", "--num_processes=2",
       "--process_id=1"],
      cwd=ROOT, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert pod.returncode == 0, pod.stderr[-3000:]
  assert "process 1: nothing to do" in pod.stdout
  assert not os.path.exists(other)
  with Image.open(out) as png:
    assert png.format == "PNG"
    assert png.size == (_sheet_width(3, panel), _sheet_height(3, panel))
  # Dataset examples only (no predictions): input and target columns.
  sheet = vis.dataset_sheet(data_dir, "test", str(tmp_path / "plain.png"),
                            num=8)
  assert sheet.size == (_sheet_width(2, panel), _sheet_height(4, panel))
  # Predictions of the wrong sequence length are refused.
  bad_path = str(tmp_path / "bad.npy")
  np.save(bad_path, predictions[:, :9])
  with pytest.raises(ValueError, match="token ids"):
    vis.dataset_sheet(data_dir, "test", str(tmp_path / "x.png"),
                      predictions_path=bad_path)


def test_predictions_with_a_row_count_other_than_the_splits(tmp_path):
  """Rows must be the split's examples: too few cannot be drawn, and more
  than the split holds are another dataset's answers, which would be drawn
  beside the wrong puzzles."""
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=4,
                       num_aug=0, num_blanks=30)
  _, arrays = puzzle_format.read_split(data_dir, "test")
  labels = np.array(arrays["labels"])
  out = str(tmp_path / "x.png")
  for rows, needle in ((2, r"2 rows, need 3"),
                       (9, r"9 rows, but the test split of .* has 4 examples"
                        r".*this dataset and --split")):
    path = str(tmp_path / f"preds{rows}.npy")
    np.save(path, np.resize(labels, (rows, labels.shape[1])))
    with pytest.raises(ValueError, match=needle):
      vis.dataset_sheet(data_dir, "test", out, num=3, predictions_path=path)
  # Fewer rows than the split (an evaluation cut short) still draw.
  path = str(tmp_path / "preds3.npy")
  np.save(path, labels[:3])
  assert vis.dataset_sheet(data_dir, "test", out, num=3,
                           predictions_path=path).size[0] > 0


def test_an_out_that_cannot_be_the_png_is_one_line(tmp_path, visualize_cli):
  """--out was first used by the final rename of the drawn sheet, which
  said '[Errno 21] Is a directory: <temporary file> -> PATH'."""
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=2,
                       num_blanks=30)
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  for out, needle, *other in (
      (tmp_path, f"--out={tmp_path}: is a directory; name the PNG file"),
      ("", "--out is given but empty: name the PNG file to write."),
      (a_file / "s.png", f"--out={a_file / 's.png'}: {a_file} is a file"),
      # The flags naming what is drawn (`check_inputs`, tested below),
      # checked before anything is read.
      (tmp_path / "s.png", "--num=100000: one sheet draws at most 200 "
       "examples", "--num=100000", "--data_dir=/nonexistent")):
    result = visualize_cli.run(
        [f"--data_dir={data_dir}", f"--out={out}", *other], cwd=ROOT,
        timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"trm.visualize: error: {needle}")


def test_an_out_over_a_file_drawn_from_is_refused(tmp_path, visualize_cli):
  """--out equal to --predictions (or a file of --data_dir) was replaced by
  the PNG: the predictions, or the dataset, lost."""
  from trm import visualize  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=2,
                       num_aug=0, num_blanks=30)
  _, arrays = puzzle_format.read_split(data_dir, "test")
  predictions = str(tmp_path / "preds.npy")
  np.save(predictions, np.array(arrays["labels"]))
  result = visualize_cli.run(
      [f"--data_dir={data_dir}", f"--predictions={predictions}",
       f"--out={predictions}"], cwd=ROOT, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"trm.visualize: error: --out={predictions} is --predictions=")
  assert np.load(predictions).shape == arrays["labels"].shape  # kept
  inputs = os.path.join(data_dir, "test", "all__inputs.npy")
  with pytest.raises(ValueError, match="is a file of --data_dir="):
    visualize.check_out(inputs, data_dir, None)
  visualize.check_out(os.path.join(data_dir, "sheet.png"), data_dir,
                      predictions)  # a new file beside them is fine


def test_an_out_over_a_file_that_is_no_png_is_refused(tmp_path):
  """--out=notes.txt (any existing file that is not an image) was replaced
  by the PNG without a word: trm.visualize has no --overwrite. An earlier
  sheet (a PNG) is still drawn over, and so is an empty file."""
  from trm import visualize  # pylint: disable=g-import-not-at-top
  notes = tmp_path / "notes.txt"
  notes.write_text("my notes")
  link = tmp_path / "link.png"
  os.symlink(notes, link)  # the PNG would replace the link, not the notes,
  for out in (notes, link):  # but the user meant the file it names
    with pytest.raises(ValueError, match="is an existing file that is not "
                       "a PNG"):
      visualize.check_out(str(out))
  assert notes.read_text() == "my notes"
  sheet = tmp_path / "sheet.png"
  from PIL import Image  # pylint: disable=g-import-not-at-top,reimported
  Image.new("RGB", (2, 2)).save(sheet)
  visualize.check_out(str(sheet))  # an earlier sheet: drawn over
  (tmp_path / "empty.png").write_bytes(b"")
  visualize.check_out(str(tmp_path / "empty.png"))


def test_an_out_that_is_a_device_or_fifo_is_refused_before_drawing(
    tmp_path):
  """--out=/dev/null (or a FIFO, or a link to one) passed every check and
  the final rename replaced it with the PNG: as root, /dev/null became a
  regular file for the whole host. Refused before anything is drawn. A
  FIFO stands in for the device."""
  from trm import visualize  # pylint: disable=g-import-not-at-top
  for out in special_files.fifo_and_link(tmp_path, "link.png"):
    with pytest.raises(ValueError, match=f"^--out={out}: is not a regular "
                       r"file \(a device, FIFO or socket\)"):
      visualize.check_out(str(out))
    assert special_files.still_fifo(out)


@pytest.mark.parametrize("data_dir, num, predictions, needle", [
    # A sheet of 100,000 Sudoku rows would want ~180 GB and an hour, a PNG
    # nothing opens.
    ("d", 100000, None, "--num=100000: one sheet draws at most 200 examples"
     " (more would be a PNG too large to open); draw the rest on further "
     "sheets with --start=200, --start=400"),
    # --data_dir=$DATA with DATA unset drew the current directory's dataset.
    ("", 8, None, "--data_dir is given but empty"),
    # Read with os: "split directory does not exist. Build the data first
    # ... --output_dir=gs://b/d".
    ("gs://b/d", 8, None, "--data_dir='gs://b/d' is an object-store path"),
    ("d", 8, "gs://b/p.npy", "--predictions='gs://b/p.npy' is an object-store"
     " path; the file is read from a local disk"),
    # --data_dir=runs/sudoku (for runs/sudoku/data) said to build a dataset
    # with --output_dir=runs/sudoku, into the run's workdir.
    ("run", 8, None, "--data_dir={run} is a trm.main workdir, not a dataset:"
     " the run's dataset is --data_dir=/d/sudoku ")])
def test_what_to_draw_is_checked_before_anything_is_read(
    tmp_path, data_dir, num, predictions, needle):
  from trm import visualize  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  (workdir / "checkpoints").mkdir(parents=True)
  (workdir / "config.json").write_text('{"data": {"data_dir": "/d/sudoku"}}')
  data_dir = str(workdir) if data_dir == "run" else data_dir
  with pytest.raises(ValueError) as error:
    visualize.check_inputs(data_dir, "test", num, predictions)
  assert str(error.value).startswith(needle.format(run=workdir)), error.value
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json"]


def test_num_and_start_refusals_name_the_flags(tmp_path):
  """They said "need num >= 1 ..." and "start=100 but ...", naming no
  flag of trm.visualize, the one caller that takes them from a user."""
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=4,
                       num_aug=0, num_blanks=30)
  out = str(tmp_path / "x.png")
  with pytest.raises(ValueError, match=re.escape(
      "--num=0, --start=0: need --num >= 1 and --start >= 0")):
    vis.dataset_sheet(data_dir, "test", out, num=0)
  with pytest.raises(ValueError, match=re.escape(
      "--start=100 but the test split has 4 examples (0 to 3); pass a "
      "smaller --start.")):
    vis.dataset_sheet(data_dir, "test", out, num=1, start=100)
  assert not os.path.exists(out)
