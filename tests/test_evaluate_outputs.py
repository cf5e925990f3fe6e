"""trm.evaluate's outputs (predictions_test.npy, eval.json, the code
benchmarks' *_summary.json) and the sample sheet PNG are written whole or
not at all: a write that fails part-way leaves the previous file. A
--resume whose *_generation.json is damaged or no object is one line."""
import json
import os

import numpy as np
import pytest

from trm import evaluate
from trm.families.trm import sheets


class _Boom(Exception):
  pass


def test_a_failed_eval_json_write_leaves_no_eval_json_of_other_predictions(
    tmp_path, monkeypatch):
  """The predictions are replaced first; a failure (or a kill) before the
  new eval.json kept the earlier one, whose figures described the earlier
  predictions. Now none is there: never a truncated one, never a stale
  one."""
  out = str(tmp_path)
  evaluate.write_eval_outputs(out, np.ones((2, 3), np.int32), {"acc": 1.0},
                              "ckpt", "data")
  assert set(os.listdir(out)) == {"eval.json", evaluate.PREDICTIONS_FILE}

  def dump(value, f, **kwargs):
    f.write('{"acc": 0.')  # part of the new file, then the failure
    raise _Boom()

  monkeypatch.setattr(json, "dump", dump)
  with pytest.raises(_Boom):
    evaluate.write_eval_outputs(out, np.zeros((2, 3), np.int32),
                                {"acc": 0.5}, "ckpt", "data")
  monkeypatch.undo()
  assert sorted(os.listdir(out)) == [evaluate.PREDICTIONS_FILE]  # no temp
  np.testing.assert_array_equal(
      np.load(os.path.join(out, evaluate.PREDICTIONS_FILE)),
      np.zeros((2, 3), np.int32))


def test_eval_json_is_strict_json_with_a_diverged_figure(tmp_path):
  """A NaN loss was written as Python's `NaN` token, which jq and other
  strict JSON readers refuse: null now."""
  evaluate.write_eval_outputs(str(tmp_path), np.ones((2, 3), np.int32),
                              {"loss": float("nan"), "acc": 0.5,
                               "q": [float("-inf"), 1.0]}, "ckpt", "data")
  recorded = json.loads((tmp_path / "eval.json").read_text(),
                        parse_constant=pytest.fail)
  assert (recorded["loss"], recorded["acc"], recorded["q"]) == (
      None, 0.5, [None, 1.0])


def test_a_failed_predictions_write_keeps_the_old_file(tmp_path,
                                                       monkeypatch):
  out = str(tmp_path)
  evaluate.write_eval_outputs(out, np.ones((2, 3), np.int32), {}, "c", "d")
  real_save = np.save

  def save(file, array, **kwargs):
    real_save(file, array[:1], **kwargs)
    raise _Boom()

  monkeypatch.setattr(np, "save", save)
  with pytest.raises(_Boom):
    evaluate.write_eval_outputs(out, np.zeros((2, 3), np.int32), {}, "c",
                                "d")
  monkeypatch.undo()
  kept = np.load(os.path.join(out, evaluate.PREDICTIONS_FILE))
  np.testing.assert_array_equal(kept, np.ones((2, 3), np.int32))


def test_a_failed_sheet_write_keeps_the_old_png(tmp_path, monkeypatch):
  path = str(tmp_path / "sheet.png")
  grid = np.full((1, 81), 2, np.int32)
  sheets.sample_sheet("sudoku", grid, grid, grid, path)
  before = open(path, "rb").read()
  from PIL import Image  # pylint: disable=g-import-not-at-top

  def save(self, fp, *args, **kwargs):
    if isinstance(fp, (str, os.PathLike)):
      with open(fp, "wb") as f:
        f.write(b"\x89PNG partial")
    else:
      fp.write(b"\x89PNG partial")
    raise _Boom()

  monkeypatch.setattr(Image.Image, "save", save)
  with pytest.raises(_Boom):
    sheets.sample_sheet("sudoku", grid, None, grid, path)
  monkeypatch.undo()
  assert open(path, "rb").read() == before
  assert os.listdir(tmp_path) == ["sheet.png"]


@pytest.mark.parametrize("text,needle", [
    ("[1, 2]", "a JSON list, not an object"), ("{", "not valid JSON"),
    # A RecursionError traceback before.
    ("[" * 100000, "not valid JSON")])
def test_a_damaged_generation_json_is_one_line(tmp_path, text, needle):
  output = tmp_path / "samples.jsonl"
  output.write_text("")
  (tmp_path / "samples_generation.json").write_text(text)
  with pytest.raises(ValueError) as info:
    evaluate._resumed_samples(str(output), {"seed": 0})  # pylint: disable=protected-access
  message = str(info.value)
  assert needle in message and "samples_generation.json" in message
  assert "\n" not in message


@pytest.fixture(scope="module")
def sudoku_dir(tmp_path_factory):
  from trm.data.puzzles import sudoku  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path_factory.mktemp("sudoku"))
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=4,
                       num_aug=0)
  return data_dir


@pytest.mark.parametrize("make,needle", [
    (lambda p: np.save(p, np.ones((4, 81), object), allow_pickle=True),
     "not a readable .npy array of token ids"),
    (lambda p: np.save(p, np.full((4, 81), np.nan)),
     "expected integer token ids, got float64"),
    (lambda p: open(p, "wb").write(b"not an array"),
     "not a readable .npy array of token ids"),
])
def test_a_bad_predictions_file_is_one_line_naming_it(sudoku_dir, tmp_path,
                                                      make, needle):
  path = str(tmp_path / "predictions.npy")
  make(path)
  with pytest.raises(ValueError) as info:
    sheets.dataset_sheet(sudoku_dir, "test", str(tmp_path / "s.png"), num=2,
                         predictions_path=path)
  message = str(info.value)
  assert path in message and needle in message and "\n" not in message


def test_output_paths_starting_with_a_tilde_are_in_home(tmp_path,
                                                        monkeypatch):
  """`--output=~/s.jsonl` reaches the program as typed (the shell expands a
  ~ only at a word's start): the samples went to <cwd>/~/s.jsonl, as
  trm.main's --workdir did before session 44, and --output_dir's files."""
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("HOME", str(tmp_path))
  assert evaluate.check_output_file("~/s.jsonl", "--output") == str(
      tmp_path / "s.jsonl")
  assert cli.check_output_dir("~/eval") == str(tmp_path / "eval")
  assert cli.expand_home("a/~/b") == "a/~/b"


def test_an_empty_output_is_refused_before_anything_runs():
  """--score_only=FILE --output= ran every sample in the sandbox, then
  failed renaming its temporary file to '' ([Errno 2], no flag named)."""
  for flag in ("--output", "--score_only"):
    with pytest.raises(ValueError, match=rf"^{flag} is given but empty: "
                       r"name a file \(the samples JSONL\)\.$"):
      evaluate.check_output_file("", flag)


def test_an_output_over_a_jsonl_of_the_checkpoint_is_refused(tmp_path):
  """A trm.main workdir keeps config_history.jsonl beside its checkpoints:
  `--output=WORKDIR/config_history.jsonl` replaced it with samples (any
  .jsonl there was taken for an earlier samples file). An empty file or
  one of samples is still rewritten."""
  history = tmp_path / "config_history.jsonl"
  history.write_text('{"step": 4, "accepted": false, "changed": {}}\n')
  with pytest.raises(ValueError, match="is a file of --checkpoint="):
    evaluate.check_not_an_input(str(history), {"--checkpoint": str(tmp_path)})
  for text in ("", '{"task_id": "HumanEval/0", "completion": "x"}\n'):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(text)
    evaluate.check_not_an_input(str(samples), {"--checkpoint": str(tmp_path)})
