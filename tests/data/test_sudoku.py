"""Tests for trm.data.puzzles.sudoku (generator, augmentation, CSV reader, builder)."""

import itertools
import json
import os

from absl import flags
import numpy as np
import pytest

from trm.core import hub as core_hub
from trm.data.puzzles import builds
from trm.data.puzzles import hub
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import sudoku
from trm.data.puzzles import sudoku_generate

# A well-known valid solved grid, used where a fixed grid is handy.
_GRID = np.array([
    [5, 3, 4, 6, 7, 8, 9, 1, 2],
    [6, 7, 2, 1, 9, 5, 3, 4, 8],
    [1, 9, 8, 3, 4, 2, 5, 6, 7],
    [8, 5, 9, 7, 6, 1, 4, 2, 3],
    [4, 2, 6, 8, 5, 3, 7, 9, 1],
    [7, 1, 3, 9, 2, 4, 8, 5, 6],
    [9, 6, 1, 5, 3, 7, 2, 8, 4],
    [2, 8, 7, 4, 1, 9, 6, 3, 5],
    [3, 4, 5, 2, 8, 6, 1, 7, 9],
], np.uint8).reshape(81)


def _valid(grid):
  """Independent check: every row, column and box holds 1..9 exactly once."""
  g = np.asarray(grid).reshape(9, 9)
  units = [g[r] for r in range(9)] + [g[:, c] for c in range(9)]
  units += [g[r:r + 3, c:c + 3].ravel() for r in (0, 3, 6) for c in (0, 3, 6)]
  return all(sorted(u.tolist()) == list(range(1, 10)) for u in units)


def _brute_force_count(board):
  """Solutions of a board with few blanks, by trying every digit combination."""
  blanks = np.flatnonzero(board == 0)
  count = 0
  for digits in itertools.product(range(1, 10), repeat=len(blanks)):
    g = board.copy()
    g[blanks] = digits
    count += _valid(g)
  return count


# ----------------------------------------------------------------------------
# Solution counting and generation.


def test_count_solutions_basic_cases():
  assert _valid(_GRID) and sudoku_generate.is_valid_solution(_GRID)
  assert sudoku_generate.count_solutions(_GRID) == 1
  assert sudoku_generate.count_solutions(np.zeros(81, np.uint8)) == 2
  assert sudoku_generate.count_solutions(np.zeros(81, np.uint8), limit=5) == 5
  clash = _GRID.copy()
  clash[1] = clash[0]  # Two equal digits in row 0.
  assert sudoku_generate.count_solutions(clash) == 0
  assert not sudoku_generate.is_valid_solution(clash)


def test_count_solutions_matches_brute_force():
  rng = np.random.default_rng(0)
  for k in range(12):
    board = _GRID.copy()
    board[rng.choice(81, 4 if k < 2 else 3, replace=False)] = 0
    assert sudoku_generate.count_solutions(
        board, limit=10) == _brute_force_count(board)


def test_count_solutions_finds_exactly_two():
  """Blanking an unavoidable rectangle (2 rows, 2 columns, 2 boxes) leaves two
  solutions."""
  _, solutions = sudoku_generate.generate_puzzles(10, 0, seed=3)
  found = 0
  for s in solutions[:3]:
    g = s.reshape(9, 9)
    for r1, r2 in [(r, r2) for r in range(9) for r2 in range(r + 1, 9)
                   if r // 3 == r2 // 3]:
      for c1, c2 in [(c, c2) for c in range(9) for c2 in range(c + 1, 9)
                     if c // 3 != c2 // 3]:
        if g[r1, c1] == g[r2, c2] and g[r1, c2] == g[r2, c1]:
          board = g.copy()
          board[[r1, r1, r2, r2], [c1, c2, c1, c2]] = 0
          assert sudoku_generate.count_solutions(board, limit=10) == 2
          if not found:  # Brute force is slow; once is enough.
            assert _brute_force_count(board.ravel()) == 2
          found += 1
  assert found > 0


@pytest.mark.parametrize("num_blanks", [0, 1, 40, 55])
def test_generated_puzzles_are_unique_and_consistent(num_blanks):
  n = 25 if num_blanks <= 40 else 5
  boards, solutions = sudoku_generate.generate_puzzles(n, num_blanks, seed=7)
  assert boards.shape == solutions.shape == (n, 81)
  assert boards.dtype == solutions.dtype == np.uint8
  assert ((boards == 0).sum(axis=1) == num_blanks).all()
  for board, solution in zip(boards, solutions):
    assert _valid(solution)
    givens = board != 0
    np.testing.assert_array_equal(board[givens], solution[givens])
    assert sudoku_generate.count_solutions(board, limit=3) == 1


def test_generation_is_deterministic():
  a = sudoku_generate.generate_puzzles(10, 40, seed=11)
  b = sudoku_generate.generate_puzzles(10, 40, seed=11)
  c = sudoku_generate.generate_puzzles(10, 40, seed=12)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a[1], c[1])
  # Puzzle k has its own seed, so a shorter run is a prefix of a longer one.
  prefix = sudoku_generate.generate_puzzles(4, 40, seed=11)
  np.testing.assert_array_equal(prefix[0], a[0][:4])
  # Sequence seeds (used by the builder for separate streams) work too.
  np.testing.assert_array_equal(
      sudoku_generate.generate_puzzles(3, 40, [11, 0])[0],
      sudoku_generate.generate_puzzles(3, 40, (11, 0))[0])


def test_generate_rejects_bad_arguments():
  with pytest.raises(ValueError, match="num_blanks"):
    sudoku_generate.generate_puzzles(1, 65, seed=0)
  with pytest.raises(ValueError, match="num_blanks=64: no puzzle with that "
                     "many blanks"):
    sudoku_generate.generate_puzzles(1, 64, seed=0, max_attempts=2)


def test_unreachable_num_blanks_is_one_line_naming_the_field(tmp_path,
                                                             monkeypatch):
  """Greedy blanking cannot reach 64 blanks: the builder said
  'RuntimeError: could not reach 64 blanks' with a traceback (after 1000
  fresh grids; 2 here)."""
  monkeypatch.setattr(sudoku_generate.generate_puzzles, "__defaults__", (2,))
  with pytest.raises(ValueError, match=r"^config\.data\.build\.num_blanks=64"
                     r": no puzzle with that many blanks"):
    sudoku.ensure_dataset(str(tmp_path / "s"),
                          field_prefix="config.data.build.", num_train=1,
                          num_test=1, num_blanks=64)


# ----------------------------------------------------------------------------
# Augmentation.


def _reference_shuffle(board, solution, rng):
  """Upstream's transform written out cell by cell, from the same draws."""
  digit_map = [0] + list(rng.permutation(9) + 1)
  transpose = rng.random() < 0.5
  bands = rng.permutation(3)
  row_perm = [3 * b + k for b in bands for k in rng.permutation(3)]
  stacks = rng.permutation(3)
  col_perm = [3 * s + k for s in stacks for k in rng.permutation(3)]

  def apply(x):
    g = x.reshape(9, 9)
    if transpose:
      g = g.T
    return np.array([[digit_map[g[row_perm[r], col_perm[c]]]
                      for c in range(9)] for r in range(9)]).reshape(81)

  return apply(board), apply(solution), digit_map, transpose


def test_shuffle_matches_reference_and_keeps_validity():
  boards, solutions = sudoku_generate.generate_puzzles(5, 45, seed=0)
  transposes = set()
  for seed in range(40):
    board, solution = boards[seed % 5], solutions[seed % 5]
    new_b, new_s = sudoku.shuffle_sudoku(board, solution,
                                         np.random.default_rng(seed))
    ref_b, ref_s, digit_map, transpose = _reference_shuffle(
        board, solution, np.random.default_rng(seed))
    transposes.add(transpose)
    np.testing.assert_array_equal(new_b, ref_b)
    np.testing.assert_array_equal(new_s, ref_s)
    # The digit map fixes the blank and is a bijection on 1..9.
    assert digit_map[0] == 0 and sorted(digit_map[1:]) == list(range(1, 10))
    assert new_b.dtype == board.dtype and new_b.shape == board.shape
    assert _valid(new_s)
    givens = new_b != 0
    assert (new_b == 0).sum() == (board == 0).sum()
    np.testing.assert_array_equal(new_b[givens], new_s[givens])
    assert sudoku_generate.count_solutions(new_b) == 1
    # Same permutation of digit counts: equal digits stay equal.
    assert sorted(np.bincount(new_b, minlength=10)[1:]) == sorted(
        np.bincount(board, minlength=10)[1:])
  assert transposes == {True, False}  # Both branches were exercised.
  # 9x9 inputs keep their shape.
  b9, s9 = sudoku.shuffle_sudoku(boards[0].reshape(9, 9),
                                 solutions[0].reshape(9, 9),
                                 np.random.default_rng(0))
  assert b9.shape == s9.shape == (9, 9)


# ----------------------------------------------------------------------------
# CSV reader.

_CSV_HEADER = "source,question,answer,rating\n"


def _csv_row(board, solution, rating, source="src"):
  q = "".join("." if v == 0 else str(v) for v in board)
  a = "".join(str(v) for v in solution)
  return f"{source},{q},{a},{rating}\n"


def _write_csv(path, rows):
  path.write_text(_CSV_HEADER + "".join(rows))
  return str(path)


def test_read_csv_and_min_difficulty(tmp_path):
  boards, solutions = sudoku_generate.generate_puzzles(3, 30, seed=0)
  ratings = [0, 5, 12]
  path = _write_csv(tmp_path / "train.csv",
                    [_csv_row(b, s, r) for b, s, r in
                     zip(boards, solutions, ratings)])
  got_b, got_s = sudoku.read_csv(path)
  assert got_b.dtype == got_s.dtype == np.uint8
  np.testing.assert_array_equal(got_b, boards)
  np.testing.assert_array_equal(got_s, solutions)
  got_b, got_s = sudoku.read_csv(path, min_difficulty=5)
  np.testing.assert_array_equal(got_b, boards[1:])
  np.testing.assert_array_equal(got_s, solutions[1:])
  got_b, _ = sudoku.read_csv(path, min_difficulty=100)
  assert got_b.shape == (0, 81)


@pytest.mark.parametrize("bad_row,message", [
    ("src,123,456,1\n", "81 characters"),
    ("src,only,three\n", "4 columns"),
    (None, "rating"),
    ("x", "character"),
    ("given", "differs"),
    ("rules", "not a solved Sudoku"),
    ("ones", "not a solved Sudoku"),
])
def test_read_csv_malformed_row(tmp_path, bad_row, message):
  boards, solutions = sudoku_generate.generate_puzzles(3, 30, seed=0)
  rows = [_csv_row(b, s, 1) for b, s in zip(boards, solutions)]
  if bad_row is None:
    bad_row = _csv_row(boards[2], solutions[2], "hard")
  elif bad_row == "x":
    bad_row = rows[2].replace(".", "x", 1)
  elif bad_row == "given":
    wrong = boards[2].copy()
    k = int(np.flatnonzero(wrong)[0])
    wrong[k] = wrong[k] % 9 + 1
    bad_row = _csv_row(wrong, solutions[2], 1)
  elif bad_row == "rules":  # two cells of a row swapped: columns repeat
    wrong = _GRID.copy()
    wrong[[0, 1]] = wrong[[1, 0]]
    bad_row = _csv_row(np.zeros(81, np.uint8), wrong, 1)
  elif bad_row == "ones":
    bad_row = _csv_row(np.zeros(81, np.uint8), np.ones(81, np.uint8), 1)
  rows[2] = bad_row
  path = _write_csv(tmp_path / "bad.csv", rows)
  # Header is line 1, so the third data row is line 4.
  with pytest.raises(ValueError, match=rf"bad\.csv:4: .*{message}"):
    sudoku.read_csv(path)


# ----------------------------------------------------------------------------
# Download (error path only; no network here).


def test_download_offline_fails_fast_in_one_line(tmp_path, monkeypatch):
  # An unresolvable Hub host is "no network": one line naming the builder's
  # offline flags, no retries.
  monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
  with pytest.raises(core_hub.HubUnavailable) as e:
    sudoku.download_csv("train", str(tmp_path))
  msg = str(e.value)
  assert "\n" not in msg and "hub.invalid does not resolve" in msg
  assert msg.endswith(hub.offline_hint(sudoku.HF_REPO, "puzzles"))
  assert "--source=generate" in msg and "--csv_dir=DIR" in msg
  assert not (tmp_path / "train.csv").exists()
  # The builder surfaces the same error; the trainer's spelling of the
  # build arguments replaces the CLI's flags.
  with pytest.raises(core_hub.HubUnavailable, match="--source=generate"):
    sudoku.build_dataset(str(tmp_path / "out"), source="hub")
  with pytest.raises(core_hub.HubUnavailable) as e:
    sudoku.ensure_dataset(str(tmp_path / "out2"), source="hub",
                          field_prefix="config.data.build.")
  assert "--config.data.build.source=generate" in str(e.value)
  assert " --source=" not in str(e.value)


def test_download_goes_through_huggingface_hub(tmp_path, monkeypatch):
  import huggingface_hub  # pylint: disable=g-import-not-at-top

  def fake_download(**kwargs):
    assert kwargs["repo_id"] == "sapientinc/sudoku-extreme"
    assert kwargs["filename"] == "test.csv"
    assert kwargs["repo_type"] == "dataset"
    path = os.path.join(kwargs["local_dir"], kwargs["filename"])
    with open(path, "w") as f:
      f.write(_CSV_HEADER)
    return path

  monkeypatch.setattr(core_hub, "unreachable", lambda url: None)
  monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
  path = sudoku.download_csv("test", str(tmp_path / "raw"))
  assert path == str(tmp_path / "raw" / "test.csv")


def test_download_reuses_existing_file(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")  # never asked
  (tmp_path / "train.csv").write_text(_CSV_HEADER)
  assert sudoku.download_csv("train", str(tmp_path)) == str(
      tmp_path / "train.csv")
  with pytest.raises(ValueError, match="split"):
    sudoku.download_csv("val", str(tmp_path))


# ----------------------------------------------------------------------------
# Builder.


def _boards_of(arrays):
  """Original-value boards (tokens - 1) of a split, one row per example."""
  return np.asarray(arrays["inputs"]).astype(np.int64) - 1


def test_build_dataset_round_trip(tmp_path):
  out = str(tmp_path / "sudoku")
  num_train, num_test, num_aug, num_blanks = 12, 8, 3, 30
  assert sudoku.build_dataset(out, num_train=num_train, num_test=num_test,
                              num_aug=num_aug, num_blanks=num_blanks,
                              seed=1) == out

  meta, train = puzzle_format.read_split(out, "train")
  per = 1 + num_aug
  n = num_train * per
  np.testing.assert_array_equal(train["group_indices"],
                                np.arange(0, n + 1, per))
  np.testing.assert_array_equal(train["puzzle_indices"], np.arange(n + 1))
  np.testing.assert_array_equal(train["puzzle_identifiers"], np.zeros(n))
  assert train["inputs"].shape == train["labels"].shape == (n, 81)
  assert meta == puzzle_format.PuzzleDatasetMetadata(
      pad_id=0, ignore_label_id=0, blank_identifier_id=0, vocab_size=11,
      seq_len=81, num_puzzle_identifiers=1, total_groups=num_train,
      mean_puzzle_examples=1.0, total_puzzles=num_train, sets=["all"])

  # Encoding: inputs 1 = blank, 2..10 = digits; labels 2..10.
  inputs, labels = _boards_of(train), np.asarray(train["labels"]) - 1
  assert set(np.unique(train["inputs"])) <= set(range(1, 11))
  assert set(np.unique(train["labels"])) <= set(range(2, 11))
  for board, solution in zip(inputs, labels):
    assert _valid(solution)
    assert (board == 0).sum() == num_blanks
    np.testing.assert_array_equal(board[board != 0], solution[board != 0])
  # Each group: the original first, then distinct augmentations of it.
  for g in range(num_train):
    group = inputs[g * per:(g + 1) * per]
    assert len({b.tobytes() for b in group}) == per
    counts = sorted(np.bincount(group[0], minlength=10)[1:])
    for b in group[1:]:
      assert sorted(np.bincount(b, minlength=10)[1:]) == counts

  test_meta, test = puzzle_format.read_split(out, "test")
  np.testing.assert_array_equal(test["group_indices"], np.arange(num_test + 1))
  np.testing.assert_array_equal(test["puzzle_indices"],
                                np.arange(num_test + 1))
  assert test_meta.total_groups == test_meta.total_puzzles == num_test
  # Train originals and test puzzles are disjoint.
  train_set = {b.tobytes() for b in inputs}
  assert not train_set & {b.tobytes() for b in _boards_of(test)}

  with open(os.path.join(out, "identifiers.json")) as f:
    assert json.load(f) == ["<blank>"]
  with open(os.path.join(out, "build_info.json")) as f:
    info = json.load(f)
  assert info["source"] == "generate" and info["seed"] == 1
  assert info["num_blanks"] == num_blanks and info["num_aug"] == num_aug
  assert info["counts"]["train"] == {"groups": num_train, "examples": n}


def test_build_is_deterministic_and_subsamples(tmp_path):
  a, b, c = (str(tmp_path / x) for x in "abc")
  for out in (a, b):
    sudoku.build_dataset(out, num_train=10, num_test=4, num_aug=1, seed=5)
  for split in sudoku.SPLITS:
    for field in puzzle_format.FIELDS:
      name = os.path.join(split, f"all__{field}.npy")
      with open(os.path.join(a, name), "rb") as fa, open(
          os.path.join(b, name), "rb") as fb:
        assert fa.read() == fb.read(), name

  sudoku.build_dataset(c, num_train=10, num_test=4, subsample_size=4, seed=5)
  _, full = puzzle_format.read_split(a, "train")
  _, sub = puzzle_format.read_split(c, "train")
  assert sub["inputs"].shape == (4, 81)
  originals = {r.tobytes() for r in np.asarray(full["inputs"])[::2]}
  sub_rows = {r.tobytes() for r in np.asarray(sub["inputs"])}
  assert len(sub_rows) == 4 and sub_rows <= originals
  # Subsampling is train only.
  _, test = puzzle_format.read_split(c, "test")
  assert test["inputs"].shape == (4, 81)


def test_generated_test_set_excludes_train_boards():
  base = [9, sudoku._STREAM_TEST]
  stream, _ = sudoku_generate.generate_range(base, 0, 4, 20)
  test_boards, _ = sudoku._generate_test(3, 20, 9, train_boards=stream[:1])
  # The colliding first puzzle of the test stream is skipped and replaced.
  np.testing.assert_array_equal(test_boards, stream[1:4])


def test_build_from_csv(tmp_path):
  boards, solutions = sudoku_generate.generate_puzzles(6, 35, seed=2)
  csv_dir = tmp_path / "csv"
  csv_dir.mkdir()
  _write_csv(csv_dir / "train.csv",
             [_csv_row(b, s, r) for b, s, r in
              zip(boards[:4], solutions[:4], [0, 3, 7, 9])])
  _write_csv(csv_dir / "test.csv",
             [_csv_row(b, s, r) for b, s, r in
              zip(boards[4:], solutions[4:], [1, 8])])
  out = str(tmp_path / "out")
  sudoku.build_dataset(out, source="csv", csv_dir=str(csv_dir),
                       min_difficulty=3, num_aug=2)
  _, train = puzzle_format.read_split(out, "train")
  _, test = puzzle_format.read_split(out, "test")
  np.testing.assert_array_equal(_boards_of(train)[::3], boards[1:4])
  np.testing.assert_array_equal(np.asarray(train["labels"])[::3] - 1,
                                solutions[1:4])
  np.testing.assert_array_equal(_boards_of(test), boards[5:])

  with pytest.raises(ValueError, match="csv_dir"):
    sudoku.build_dataset(out, source="csv")
  with pytest.raises(FileNotFoundError, match="train.csv"):
    sudoku.build_dataset(out, source="csv", csv_dir=str(tmp_path))


def test_csv_without_rows_is_refused_before_writing(tmp_path):
  # A header-only CSV (or a min_difficulty above every rating) was built
  # into a dataset of 0 puzzles and marked complete.
  boards, solutions = sudoku_generate.generate_puzzles(2, 35, seed=2)
  csv_dir = tmp_path / "csv"
  csv_dir.mkdir()
  _write_csv(csv_dir / "train.csv", [_csv_row(boards[0], solutions[0], 5)])
  _write_csv(csv_dir / "test.csv", [])
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=f"^{csv_dir / 'test.csv'} holds no "
                     "puzzle rows: the test split would be empty"):
    sudoku.build_dataset(out, source="csv", csv_dir=str(csv_dir))
  _write_csv(csv_dir / "test.csv", [_csv_row(boards[1], solutions[1], 5)])
  with pytest.raises(ValueError, match=r"train.csv holds no puzzle rows with "
                     r"rating >= min_difficulty=6: the train split"):
    sudoku.ensure_dataset(out, source="csv", csv_dir=str(csv_dir),
                          min_difficulty=6)
  assert not builds.is_built(out)


def test_ensure_dataset_builds_once(tmp_path, monkeypatch):
  out = str(tmp_path / "d")
  sudoku.ensure_dataset(out, num_train=3, num_test=2, num_blanks=20)
  _, train = puzzle_format.read_split(out, "train")
  assert train["inputs"].shape == (3, 81)

  def fail(*args, **kwargs):
    raise AssertionError("must not rebuild")

  monkeypatch.setattr(sudoku, "build_dataset", fail)
  assert sudoku.ensure_dataset(out, num_train=3, num_test=2,
                               num_blanks=20) == out
  # Different arguments are refused in one line naming them; the dataset
  # is never clobbered.
  with pytest.raises(builds.DatasetArgumentsError) as info:
    sudoku.ensure_dataset(out, num_train=5, num_test=2, num_blanks=20,
                          field_prefix="config.data.build.")
  assert "config.data.build.num_train=5 (built with 3)" in str(info.value)
  assert "num_test" not in str(info.value) and "\n" not in str(info.value)
  monkeypatch.undo()

  # An incomplete dataset (no test/dataset.json) is rebuilt.
  os.remove(os.path.join(out, "test", "dataset.json"))
  sudoku.ensure_dataset(out, num_train=3, num_test=4, num_blanks=20)
  _, test = puzzle_format.read_split(out, "test")
  assert test["inputs"].shape == (4, 81)


def test_cli_flags(tmp_path):
  fv = flags.FlagValues()
  sudoku.define_flags(fv)
  out = str(tmp_path / "cli")
  fv(["prog", f"--output_dir={out}", "--num_train=4", "--num_test=2",
      "--num_blanks=25", "--num_aug=1", "--subsample_size=", "--seed=3",
      "--min_difficulty="])
  assert sudoku.run_from_flags(fv) == out
  meta, train = puzzle_format.read_split(out, "train")
  assert meta.total_groups == 4 and train["inputs"].shape == (8, 81)

  fv = flags.FlagValues()
  sudoku.define_flags(fv)
  fv(["prog", f"--output_dir={out}", "--subsample_size=x"])
  with pytest.raises(Exception, match="subsample_size"):
    sudoku.run_from_flags(fv)


def test_min_difficulty_with_generated_boards_is_refused(tmp_path):
  """Generated boards carry no rating: min_difficulty was dropped without a
  word and the unfiltered dataset built as asked for."""
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match="min_difficulty=20 filters the CSVs' "
                     "rating column .* source 'generate' has no rating"):
    sudoku.build_dataset(out, source="generate", min_difficulty=20,
                         num_train=2, num_test=2)
  assert not os.path.exists(out)


@pytest.mark.parametrize("variant", ["mlp", "att"])
def test_paper_config_stops_where_upstream_does(variant):
  """Upstream's loop (pretrain.py) runs epochs / eval_interval = 10
  iterations of the 6,510 full batches of 5k epochs each, an evaluation
  after each: 65,100 steps (its checkpoint step_65100). Its total_steps
  formula, 65,104, is never reached; run to it we trained 4 steps more and
  evaluated the 423k test puzzles an eleventh time."""
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.load_config(
      os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                   "trm_sudoku.py"), variant)
  assert (c.total_steps, c.eval_every, c.data.epochs_per_iter) == (
      65100, 6510, 5000)
  assert c.checkpoint_every == c.eval_every
