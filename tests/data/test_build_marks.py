"""Dataset builds mark completion last (`build_info.json` / meta.json /
TFDS's own rename), so an interrupted or re-run build is never used, and a
complete build made with other arguments is refused in one line naming
them (`trm.data.puzzles.builds`, `trm.data.text.preparation`,
`trm.data.tfds_builders`)."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import bind_mounts
import repo
import workers

from trm.data.puzzles import arc
from trm.data.puzzles import arc_writer
from trm.data.puzzles import builds
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import maze
from trm.data.puzzles import sudoku

from test_arc_data import _mini_subsets, _write_kaggle  # pylint: disable=g-import-not-at-top

ROOT = repo.ROOT
SUDOKU = dict(num_train=3, num_test=2, num_blanks=20)
MAZE = dict(num_train=2, num_test=1, min_path_length=60)


def _read_info(out):
  with open(os.path.join(out, builds.BUILD_INFO_FILE)) as f:
    return json.load(f)


def _die_at_split(monkeypatch, module, split):
  """Makes the builder's split writer raise when it reaches `split` (the
  splits before it are fully written)."""
  real = module.write_split

  def write_split(out_dir, name, *args, **kwargs):
    if name == split:
      raise KeyboardInterrupt(f"killed while writing {name}")
    return real(out_dir, name, *args, **kwargs)

  monkeypatch.setattr(module, "write_split", write_split)


def _count_builds(monkeypatch, module):
  calls = []
  real = module.build_dataset

  def counted(*args, **kwargs):
    calls.append(kwargs)
    return real(*args, **kwargs)

  monkeypatch.setattr(module, "build_dataset", counted)
  return calls


# ---------------------------------------------------------------- Sudoku


def test_sudoku_interrupted_first_build_is_never_used(tmp_path, monkeypatch):
  out = str(tmp_path / "d")
  _die_at_split(monkeypatch, puzzle_format, "test")
  with pytest.raises(KeyboardInterrupt):
    sudoku.build_dataset(out, **SUDOKU)
  monkeypatch.undo()
  # The train split is there, the completion mark is not.
  assert os.path.isfile(os.path.join(out, "train", "dataset.json"))
  assert not os.path.exists(os.path.join(out, builds.BUILD_INFO_FILE))
  assert builds.build_state(out) == "interrupted"
  assert not builds.is_built(out)
  calls = _count_builds(monkeypatch, sudoku)
  sudoku.ensure_dataset(out, **SUDOKU)
  assert len(calls) == 1  # built again, not used
  assert builds.build_state(out) == "complete"
  assert not os.path.exists(os.path.join(out, builds.BUILDING_FILE))
  assert _read_info(out)["num_train"] == 3


def test_sudoku_interrupted_rebuild_in_place_is_never_used(tmp_path,
                                                           monkeypatch):
  """A rebuild with other arguments (e.g. the CLI run again) that dies
  after its train split leaves the new train split beside the old test
  split: that mix must not pass for the old (or the new) dataset."""
  out = str(tmp_path / "d")
  sudoku.build_dataset(out, **SUDOKU)
  assert builds.build_state(out) == "complete"
  _die_at_split(monkeypatch, puzzle_format, "test")
  with pytest.raises(KeyboardInterrupt):
    sudoku.build_dataset(out, **dict(SUDOKU, num_train=5))
  monkeypatch.undo()
  assert builds.build_state(out) == "interrupted"
  # Neither the old arguments nor the new ones get the mix.
  calls = _count_builds(monkeypatch, sudoku)
  sudoku.ensure_dataset(out, **SUDOKU)
  assert len(calls) == 1
  _, train = puzzle_format.read_split(out, "train")
  assert train["inputs"].shape == (3, 81)


def test_sudoku_build_killed_by_sigkill_is_never_used(tmp_path):
  """A real kill -9 in the middle of a build (after the train split)."""
  out = str(tmp_path / "d")
  script = (
      "import os, signal\n"
      "from trm.data.puzzles import format as f, sudoku\n"
      "real = f.write_split\n"
      "def write_split(out_dir, name, *a, **k):\n"
      "  if name == 'test':\n"
      "    os.kill(os.getpid(), signal.SIGKILL)\n"
      "  return real(out_dir, name, *a, **k)\n"
      "f.write_split = write_split\n"
      f"sudoku.build_dataset({out!r}, num_train=3, num_test=2, "
      "num_blanks=20)\n")
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
  assert os.path.isfile(os.path.join(out, "train", "dataset.json"))
  assert builds.build_state(out) == "interrupted"
  with pytest.raises(FileNotFoundError):  # no half dataset for a reader
    puzzle_format.read_metadata(out, "test")
  sudoku.ensure_dataset(out, **SUDOKU)
  assert builds.build_state(out) == "complete"


def test_a_build_out_of_memory_is_one_line_and_built_again_later(
    tmp_path, monkeypatch):
  """A MemoryError mid-build (an absurd config.data.build.num_aug) reached
  trm.main as a traceback; it is one line naming the size fields, and the
  build it interrupted is built again by the next run."""
  out = str(tmp_path / "sudoku")
  real = sudoku._encode_split

  def too_big(*args):
    raise MemoryError("Unable to allocate 37.7 GiB for an array")

  monkeypatch.setattr(sudoku, "_encode_split", too_big)
  with pytest.raises(ValueError) as e:
    sudoku.ensure_dataset(out, field_prefix="config.data.build.", num_aug=7,
                          **SUDOKU)
  assert str(e.value).startswith(
      f"Building the dataset in {out} ran out of host memory (Unable to "
      "allocate 37.7 GiB for an array): config.data.build.num_train=3, "
      "config.data.build.num_test=2, config.data.build.num_aug=7. ")
  assert builds.build_state(out) == "interrupted"
  monkeypatch.setattr(sudoku, "_encode_split", real)
  sudoku.ensure_dataset(out, num_aug=7, **SUDOKU)
  assert builds.build_state(out) == "complete"


def test_sudoku_other_arguments_are_refused_in_one_line(tmp_path,
                                                        monkeypatch):
  out = str(tmp_path / "d")
  sudoku.ensure_dataset(out, **SUDOKU)
  before = {f: os.path.getmtime(os.path.join(r, f))
            for r, _, fs in os.walk(out) for f in fs}
  calls = _count_builds(monkeypatch, sudoku)
  with pytest.raises(builds.DatasetArgumentsError) as info:
    sudoku.ensure_dataset(out, **dict(SUDOKU, num_aug=2, seed=7),
                          field_prefix="config.data.build.")
  message = str(info.value)
  assert "\n" not in message and not calls
  assert "config.data.build.num_aug=2 (built with 0)" in message
  assert "config.data.build.seed=7 (built with 0)" in message
  assert "num_train" not in message and "build_info.json" in message
  assert {f: os.path.getmtime(os.path.join(r, f))
          for r, _, fs in os.walk(out) for f in fs} == before
  # Arguments that do not shape a generated build are not compared.
  sudoku.ensure_dataset(out, **dict(SUDOKU, csv_dir="elsewhere"))
  assert not calls


def test_concurrent_builds_with_other_arguments_do_not_mix(tmp_path,
                                                          monkeypatch):
  """Two builds of one directory at once (two runs started together, other
  num_aug): the second finished while the first was between its splits, and
  the first then marked the mixture complete with its own arguments."""
  out = str(tmp_path / "sudoku")
  errors = workers.overlap(
      monkeypatch, puzzle_format, "write_split",
      lambda _, split, *__: split == "train",
      lambda name: sudoku.ensure_dataset(
          out, **SUDOKU, num_aug=0 if name == "first" else 2))
  info = _read_info(out)
  for split in builds.SPLITS:
    rows = np.load(os.path.join(out, split, "all__inputs.npy")).shape[0]
    assert rows == info["counts"][split]["examples"], split
  # The second waited for the first, then refused its other num_aug.
  assert info["num_aug"] == 0 and list(errors) == ["second"]


def test_foreign_dataset_without_marks_is_used_as_it_is(tmp_path,
                                                        monkeypatch):
  """A dataset written by upstream's builders has no build_info.json."""
  out = str(tmp_path / "d")
  sudoku.build_dataset(out, **SUDOKU)
  os.remove(os.path.join(out, builds.BUILD_INFO_FILE))
  assert builds.build_state(out) == "foreign"
  calls = _count_builds(monkeypatch, sudoku)
  assert sudoku.ensure_dataset(out, **dict(SUDOKU, num_train=9)) == out
  assert not calls


# ------------------------------------------------------------------ Maze


def test_maze_interrupted_build_is_never_used_and_arguments_checked(
    tmp_path, monkeypatch):
  out = str(tmp_path / "d")
  _die_at_split(monkeypatch, puzzle_format, "test")
  with pytest.raises(KeyboardInterrupt):
    maze.build_dataset(out, **MAZE)
  monkeypatch.undo()
  assert builds.build_state(out) == "interrupted"
  calls = _count_builds(monkeypatch, maze)
  maze.ensure_dataset(out, **MAZE)
  assert len(calls) == 1 and builds.build_state(out) == "complete"
  with pytest.raises(builds.DatasetArgumentsError,
                     match=r"config\.data\.build\.aug=False \(built with "
                     r"True\)"):
    maze.ensure_dataset(out, **dict(MAZE, aug=False),
                        field_prefix="config.data.build.")
  assert len(calls) == 1


# ------------------------------------------------------------------- ARC


def test_arc_interrupted_build_is_never_used_and_arguments_checked(
    tmp_path, monkeypatch):
  kaggle_dir = _write_kaggle(tmp_path / "k", _mini_subsets())
  out = str(tmp_path / "d")
  kwargs = dict(source="kaggle", kaggle_dir=kaggle_dir,
                subsets=["training", "evaluation"], num_aug=1)
  arc.build_dataset(out, **kwargs)
  assert builds.build_state(out, arc.EXTRA_FILES) == "complete"
  # A rebuild in place dies after the train split.
  _die_at_split(monkeypatch, arc_writer, "test")
  with pytest.raises(KeyboardInterrupt):
    arc.build_dataset(out, **dict(kwargs, num_aug=2))
  monkeypatch.undo()
  assert builds.build_state(out, arc.EXTRA_FILES) == "interrupted"
  calls = _count_builds(monkeypatch, arc)
  arc.ensure_dataset(out, **kwargs)
  assert len(calls) == 1
  assert builds.build_state(out, arc.EXTRA_FILES) == "complete"
  # The same directory named by another (equivalent) path is no change.
  arc.ensure_dataset(out, **dict(kwargs, kaggle_dir=os.path.join(
      kaggle_dir, ".", "")))
  with pytest.raises(builds.DatasetArgumentsError) as info:
    arc.ensure_dataset(out, **dict(kwargs, seed=3),
                       field_prefix="config.data.build.")
  assert "config.data.build.seed=3 (built with 42)" in str(info.value)
  assert len(calls) == 1


def test_arc_source_folder_reached_through_a_bind_mount_is_no_change(
    tmp_path):
  """--kaggle_dir named through a bind mount of the folder it was built
  from (a disk mounted twice; on macOS another case of its name): the same
  input, no "built with" refusal."""
  kaggle_dir = _write_kaggle(tmp_path / "k", _mini_subsets())
  out = str(tmp_path / "d")
  kwargs = dict(source="kaggle", kaggle_dir=kaggle_dir,
                subsets=["training", "evaluation"], num_aug=1)
  arc.build_dataset(out, **kwargs)
  alias = tmp_path / "alias"
  alias.mkdir()
  kwargs["kaggle_dir"] = str(alias)
  assert bind_mounts.python(kaggle_dir, alias, (
      "import json, sys\n"
      "from trm.data.puzzles import arc\n"
      "arc.ensure_dataset(sys.argv[1], **json.loads(sys.argv[2]))\n"
      "print('kept')"), out, json.dumps(kwargs)).split() == ["kept"]
  assert builds.build_state(out, arc.EXTRA_FILES) == "complete"


# -------------------------------------------------------------- trainer


def test_trainer_refuses_a_dataset_built_with_other_arguments(tmp_path):
  from test_train import tiny_config  # pylint: disable=g-import-not-at-top
  from trm.families.trm import task as puzzle  # pylint: disable=g-import-not-at-top
  data = str(tmp_path / "data")
  small = {"data.data_dir": data, "data.build.num_train": 16,
           "data.build.num_test": 4}
  puzzle.prepare_data(tiny_config(**small), str(tmp_path))
  puzzle.prepare_data(tiny_config(**small), str(tmp_path))  # same: fine
  with pytest.raises(builds.DatasetArgumentsError) as info:
    puzzle.prepare_data(tiny_config(**dict(small, **{
        "data.build.num_train": 32})), str(tmp_path))
  message = str(info.value)
  assert "\n" not in message
  assert "config.data.build.num_train=32 (built with 16)" in message
  assert "config.data.data_dir" in message


def test_trainer_rebuilds_an_interrupted_dataset(tmp_path, monkeypatch):
  from test_train import tiny_config  # pylint: disable=g-import-not-at-top
  from trm.families.trm import task as puzzle  # pylint: disable=g-import-not-at-top
  data = str(tmp_path / "data")
  config = tiny_config(**{"data.data_dir": data, "data.build.num_train": 16,
                          "data.build.num_test": 4})
  _die_at_split(monkeypatch, puzzle_format, "test")
  with pytest.raises(KeyboardInterrupt):
    puzzle.prepare_data(config, str(tmp_path))
  monkeypatch.undo()
  assert builds.build_state(data) == "interrupted"
  puzzle.prepare_data(config, str(tmp_path))
  assert builds.build_state(data) == "complete"
  meta, _ = puzzle_format.read_split(data, "test")
  assert meta.total_groups == 4


# ------------------------------------------------------------------ TFDS


def test_tfds_interrupted_build_is_never_used_and_rebuild_checked(
    tmp_path, monkeypatch):
  pytest.importorskip("tensorflow_datasets")
  import ml_collections  # pylint: disable=g-import-not-at-top
  from trm.data import tfds_builders  # pylint: disable=g-import-not-at-top
  from trm.data.text import tfds_source  # pylint: disable=g-import-not-at-top
  from trm.data.tfds_builders import trm_tiny_shakespeare as shakespeare  # pylint: disable=g-import-not-at-top
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "input.txt").write_text("to be or not to be\n" * 600)
  data_dir = str(tmp_path / "tfds")
  real = shakespeare.TrmTinyShakespeare._generate_examples

  def dies(self, ids, codec):
    for i, example in enumerate(real(self, ids, codec)):
      if i == 1:
        raise KeyboardInterrupt("killed mid-build")
      yield example

  monkeypatch.setattr(shakespeare.TrmTinyShakespeare, "_generate_examples",
                      dies)
  with pytest.raises(KeyboardInterrupt):
    tfds_builders.build("trm_tiny_shakespeare", str(manual), data_dir)
  monkeypatch.undo()
  config = ml_collections.ConfigDict(dict(
      name="trm_tiny_shakespeare", data_dir=data_dir, split="train",
      eval_split="validation", feature="tokens"))
  with pytest.raises(FileNotFoundError, match="is not prepared"):
    tfds_source.metadata(config)
  builder = tfds_builders.build("trm_tiny_shakespeare", str(manual),
                                data_dir)
  assert builder.is_prepared()
  assert tfds_source.metadata(config)[0]["vocab_size"] > 0
  # The same arguments again: kept; another input directory: refused.
  tfds_builders.build("trm_tiny_shakespeare", str(manual), data_dir)
  other = tmp_path / "other"
  other.mkdir()
  (other / "input.txt").write_text("something else entirely\n" * 600)
  with pytest.raises(ValueError) as info:
    tfds_builders.build("trm_tiny_shakespeare", str(other), data_dir)
  assert "--manual_dir=" in str(info.value) and "\n" not in str(info.value)
  assert "already prepared with other arguments" in str(info.value)
