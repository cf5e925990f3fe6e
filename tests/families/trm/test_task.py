"""The puzzle task's evaluation hook (`trm.families.trm.task.EvalHook`)."""
import numpy as np
from PIL import Image

from trm.data.puzzles import dataset as puzzle_dataset
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import sudoku
from trm.families.trm import sheets
from trm.families.trm import task


def test_sheet_leaves_out_the_padding_rows_of_a_short_batch(tmp_path):
  """3 test puzzles in a batch of 8: the 5 padding rows (no labels, and the
  puzzles' own identifier 0) are not drawn as 5 wrong answers."""
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=3,
                       num_blanks=30)
  meta, arrays = puzzle_format.read_split(data_dir, "test")
  batch = puzzle_dataset.TestBatches(meta, arrays, global_batch_size=8)[0]
  hook = task.EvalHook(data_dir, "sudoku", arc=False, sheet_rows=8)
  hook.update(batch, {"predictions": np.maximum(batch["labels"], 0),
                      "q_halt_logits": np.zeros(8, np.float32)})
  hook.result(str(tmp_path))
  inputs, predictions, labels = hook.sheet
  assert len(inputs) == len(predictions) == len(labels) == 3
  np.testing.assert_array_equal(inputs, arrays["inputs"][:3])
  expected = sheets.sample_sheet("sudoku", inputs, predictions, labels, None)
  with Image.open(tmp_path / "sheet.png") as png:
    assert png.size == expected.size
