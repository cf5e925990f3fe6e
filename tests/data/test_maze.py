"""Tests for trm.data.puzzles.maze (generator, augmentation, CSV, builder) and a few
training steps of configs/trm_maze.py:cpu on 8 CPU devices (mesh 2x2x2)."""

import collections
import json
import os

from absl import flags
import jax
import numpy as np
import pytest
import repo

from trm.families.trm import program as trm_program
from trm.core import config_lib
from trm.core import train
from trm import families
from trm.core import hub as core_hub
from trm.data.puzzles import builds
from trm.data.puzzles import dihedral
from trm.data.puzzles import maze
from trm.data.puzzles import maze_generate
from trm.data.puzzles import maze_grid
from trm.data.puzzles import format as puzzle_format

ROOT = repo.ROOT
N = maze_grid.GRID_SIZE


def _bfs(grid, source):
  """Independent BFS on a 30x30 token grid: (distance, number of shortest
  paths) per cell, -1 / 0 where unreachable."""
  dist = np.full((N, N), -1)
  count = np.zeros((N, N), np.int64)
  dist[source], count[source] = 0, 1
  queue = collections.deque([source])
  while queue:
    r, c = queue.popleft()
    for rr, cc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
      if not (0 <= rr < N and 0 <= cc < N) or grid[rr, cc] == maze_grid.WALL:
        continue
      if dist[rr, cc] < 0:
        dist[rr, cc] = dist[r, c] + 1
        queue.append((rr, cc))
      if dist[rr, cc] == dist[r, c] + 1:
        count[rr, cc] += count[r, c]
  return dist, count


def _check_solved_maze(question, answer, min_length=1):
  """Asserts `answer` marks the unique shortest S->G path of `question`;
  returns the path length in moves."""
  q, a = np.asarray(question).reshape(N, N), np.asarray(answer).reshape(N, N)
  assert set(np.unique(q)) <= {
      maze_grid.WALL, maze_grid.OPEN, maze_grid.START, maze_grid.GOAL
  }
  assert (q == maze_grid.START).sum() == 1 and (q == maze_grid.GOAL).sum() == 1
  path = a == maze_grid.PATH
  # Off the path the answer is the question; the path only covers open cells.
  np.testing.assert_array_equal(a[~path], q[~path])
  assert (q[path] == maze_grid.OPEN).all()
  start = tuple(np.argwhere(q == maze_grid.START)[0])
  goal = tuple(np.argwhere(q == maze_grid.GOAL)[0])
  dist, count = _bfs(q, start)
  length = int(dist[goal])
  assert length >= min_length
  assert count[goal] == 1  # the shortest path is unique
  assert path.sum() == length - 1
  # The marked cells chain S to G, one step at a time (so, being length - 1
  # cells, they are exactly the shortest path).
  cells = {tuple(x) for x in np.argwhere(path)}
  cur, seen = start, {start}
  for _ in range(length):
    nxt = [(cur[0] + dr, cur[1] + dc) for dr, dc in
           ((-1, 0), (1, 0), (0, -1), (0, 1))]
    nxt = [x for x in nxt if x not in seen and (x in cells or x == goal)]
    assert len(nxt) == 1, (cur, nxt)
    cur = nxt[0]
    seen.add(cur)
  assert cur == goal
  return length


# ----------------------------------------------------------------------------
# Text, solver.


def _grid(rows):
  """A 30x30 token grid from a few text rows, the rest walls."""
  text = [r.ljust(N, "#") for r in rows] + ["#" * N] * (N - len(rows))
  return maze_grid.encode("".join(text)).reshape(N, N)


def test_encode_decode_render():
  text = "# SGo" * (maze_grid.SEQ_LEN // 5)
  ids = maze_grid.encode(text)
  assert ids.dtype == np.uint8 and ids[:5].tolist() == [1, 2, 3, 4, 5]
  assert maze_grid.decode(ids) == text
  assert maze_grid.render(ids).splitlines()[0] == text[:N]
  with pytest.raises(ValueError, match="'x'"):
    maze_grid.encode("# x")
  with pytest.raises(ValueError, match="token ids"):
    maze_grid.decode(np.array([0, 1]))


def test_solve_unique_tie_and_unreachable():
  answer, length, count = maze_grid.solve(_grid(["S   G"]))
  assert (length, count) == (4, 1)
  assert maze_grid.decode(answer)[:5] == "SoooG"
  # Two equally short ways around a wall: no canonical answer.
  answer, length, count = maze_grid.solve(_grid(["S  ", " # ", "  G"]))
  assert answer is None and (length, count) == (4, 2)
  answer, length, count = maze_grid.solve(_grid(["S#G"]))
  assert answer is None and (length, count) == (-1, 0)
  with pytest.raises(ValueError, match="one start"):
    maze_grid.solve(_grid(["S S G"]))


# ----------------------------------------------------------------------------
# Generator.


def test_generated_mazes_have_a_long_unique_shortest_path():
  questions, answers = maze_generate.generate_mazes(12, seed=0)
  assert questions.shape == answers.shape == (12, maze_grid.SEQ_LEN)
  assert questions.dtype == answers.dtype == np.uint8
  lengths = [_check_solved_maze(q, a, min_length=111)
             for q, a in zip(questions, answers)]
  assert min(lengths) > 110
  for q, a in zip(questions, answers):
    solved, _, _ = maze_grid.solve(q)
    np.testing.assert_array_equal(solved, a)
  # Decoy loops: the open cells are not a tree (more moves than cells - 1).
  q = questions[0].reshape(N, N) != maze_grid.WALL
  edges = (q[1:] & q[:-1]).sum() + (q[:, 1:] & q[:, :-1]).sum()
  assert edges > q.sum() - 1


def test_generator_threshold_and_bad_arguments():
  questions, answers = maze_generate.generate_mazes(3,
                                                    seed=4,
                                                    min_path_length=200)
  for q, a in zip(questions, answers):
    _check_solved_maze(q, a, min_length=200)
  questions, answers = maze_generate.generate_mazes(3,
                                                    seed=4,
                                                    min_path_length=5,
                                                    num_loops=0)
  for q, a in zip(questions, answers):
    _check_solved_maze(q, a, min_length=5)
  with pytest.raises(ValueError, match="min_path_length"):
    maze_generate.generate_mazes(1, seed=0, min_path_length=0)
  with pytest.raises(ValueError, match="num_loops"):
    maze_generate.generate_mazes(1, seed=0, num_loops=-1)
  with pytest.raises(ValueError, match="min_path_length=800: no maze"):
    maze_generate.generate_mazes(1, seed=0, min_path_length=800, max_attempts=2)


def test_unreachable_min_path_length_is_one_line_naming_the_field(
    tmp_path, monkeypatch):
  """The builder said 'RuntimeError: no maze with a shortest path of >= 700
  moves' with a traceback."""
  monkeypatch.setattr(maze_generate.generate_range, "__defaults__",
                      (maze_generate.DEFAULT_NUM_LOOPS, 2))
  with pytest.raises(ValueError, match=r"^config\.data\.build\."
                     r"min_path_length=700: no maze"):
    maze.ensure_dataset(str(tmp_path / "m"), field_prefix="config.data.build.",
                        num_train=1, num_test=1, min_path_length=700)


def test_generation_is_deterministic():
  a = maze_generate.generate_mazes(4, seed=11)
  b = maze_generate.generate_mazes(4, seed=11)
  c = maze_generate.generate_mazes(4, seed=12)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a[0], c[0])
  # Maze k has its own seed, so a shorter run is a prefix of a longer one.
  np.testing.assert_array_equal(
      maze_generate.generate_mazes(2, seed=11)[0], a[0][:2])
  np.testing.assert_array_equal(maze_generate.generate_mazes(2, [11, 0])[0],
                                maze_generate.generate_mazes(2, (11, 0))[0])


# ----------------------------------------------------------------------------
# Augmentation.


def test_dihedral_augment_is_consistent():
  questions, answers = maze_generate.generate_mazes(2, seed=3)
  for q, a in zip(questions, answers):
    qs, as_ = maze_grid.dihedral_augment(q, a)
    assert qs.shape == as_.shape == (8, maze_grid.SEQ_LEN)
    assert qs.dtype == np.uint8
    np.testing.assert_array_equal(qs[0], q)
    np.testing.assert_array_equal(as_[0], a)
    assert len({x.tobytes() for x in qs}) == 8
    length = _check_solved_maze(q, a)
    for t in range(8):
      # Each image is a maze whose own shortest path is the image of the
      # original path, and inverting the transform gives the original back.
      assert _check_solved_maze(qs[t], as_[t]) == length
      np.testing.assert_array_equal(
          dihedral.inverse_transform(qs[t].reshape(N, N), t).reshape(-1), q)
      np.testing.assert_array_equal(
          dihedral.transform(a.reshape(N, N), t).reshape(-1), as_[t])
    assert maze_grid.canonical_key(qs[5]) == maze_grid.canonical_key(q)


# ----------------------------------------------------------------------------
# CSV.


def _write_rows(path, rows):
  path.write_text(",".join(maze.CSV_HEADER) + "\n" + "".join(rows))
  return str(path)


def _row(q, a, source="src", rating="120"):
  return f"{source},{maze_grid.decode(q)},{maze_grid.decode(a)},{rating}\n"


def test_csv_round_trip(tmp_path):
  questions, answers = maze_generate.generate_mazes(3, seed=5)
  path = maze.write_csv(str(tmp_path / "train.csv"), questions, answers)
  got_q, got_a = maze.read_csv(path)
  assert got_q.dtype == got_a.dtype == np.uint8
  np.testing.assert_array_equal(got_q, questions)
  np.testing.assert_array_equal(got_a, answers)
  with open(path) as f:
    lines = f.read().splitlines()
  assert lines[0] == "source,question,answer,rating"
  assert lines[1].endswith(f",{int((answers[0] == maze_grid.PATH).sum()) + 1}")
  # Header only: no mazes.
  got_q, _ = maze.read_csv(_write_rows(tmp_path / "empty.csv", []))
  assert got_q.shape == (0, maze_grid.SEQ_LEN)


def _corrupt(kind, q, a):
  q, a = maze_grid.decode(q), maze_grid.decode(a)
  wall = q.index("#")
  open_ = q.index(" ")
  if kind == "columns":
    return f"src,{q},{a}\n"
  if kind == "length":
    return f"src,{q[:-1]},{a},1\n"
  if kind == "char":
    return f"src,{q[:10]}x{q[11:]},{a},1\n"
  if kind == "path_in_question":
    return f"src,{q[:open_]}o{q[open_ + 1:]},{a},1\n"
  if kind == "two_starts":
    q2 = q[:open_] + "S" + q[open_ + 1:]
    a2 = a[:open_] + "S" + a[open_ + 1:]
    return f"src,{q2},{a2},1\n"
  if kind == "path_on_wall":
    return f"src,{q},{a[:wall]}o{a[wall + 1:]},1\n"
  if kind == "differs":
    return f"src,{q},{a[:wall]} {a[wall + 1:]},1\n"
  if kind == "no_path":  # e.g. an unsolvable maze: the answer marks nothing
    return f"src,{q},{q},1\n"
  if kind == "gap":
    step = a.index("o")
    return f"src,{q},{a[:step]} {a[step + 1:]},1\n"
  if kind == "stray":
    spare = a.index(" ")
    return f"src,{q},{a[:spare]}o{a[spare + 1:]},1\n"
  raise ValueError(kind)


@pytest.mark.parametrize("kind, message", [
    ("columns", "4 columns"),
    ("length", "900 characters"),
    ("char", r"invalid character.*'x'.*question"),
    ("path_in_question", r"invalid character.*'o'.*question"),
    ("two_starts", "exactly one 'S'"),
    ("path_on_wall", "not open"),
    ("differs", "differs from the question at row"),
    ("no_path", r"0 path cells 'o' are not one path .*do not connect"),
    ("gap", "do not connect them"),
    ("stray", r"are not one path from 'S' to 'G' \(S reaches G through them"),
])
def test_read_csv_malformed_row(tmp_path, kind, message):
  questions, answers = maze_generate.generate_mazes(3, seed=6)
  rows = [_row(q, a) for q, a in zip(questions, answers)]
  rows[2] = _corrupt(kind, questions[2], answers[2])
  path = _write_rows(tmp_path / "bad.csv", rows)
  # Header is line 1, so the third data row is line 4.
  with pytest.raises(ValueError, match=rf"bad\.csv:4: .*{message}"):
    maze.read_csv(path)


def test_read_csv_empty_file(tmp_path):
  path = tmp_path / "empty.csv"
  path.write_text("")
  with pytest.raises(ValueError, match="empty file"):
    maze.read_csv(str(path))


# ----------------------------------------------------------------------------
# Download (error path only; no network here).


def test_download_offline_fails_fast_in_one_line(tmp_path, monkeypatch):
  monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")
  with pytest.raises(core_hub.HubUnavailable) as e:
    maze.download_csv("train", str(tmp_path))
  msg = str(e.value)
  assert "\n" not in msg and "maze-30x30-hard-1k" in msg
  assert "--source=generate for synthetic mazes" in msg
  assert not (tmp_path / "train.csv").exists()
  with pytest.raises(core_hub.HubUnavailable) as e:
    maze.ensure_dataset(str(tmp_path / "out"), source="hub",
                        field_prefix="config.data.build.")
  assert "--config.data.build.source=csv --config.data.build.csv_dir=DIR" in (
      str(e.value))


def test_download_through_huggingface_hub_and_reuse(tmp_path, monkeypatch):
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  calls = []

  def fake_download(**kwargs):
    calls.append(kwargs)
    assert kwargs["repo_id"] == "sapientinc/maze-30x30-hard-1k"
    assert kwargs["repo_type"] == "dataset"
    path = os.path.join(kwargs["local_dir"], kwargs["filename"])
    with open(path, "wb") as f:
      f.write(b"payload")
    return path

  monkeypatch.setattr(core_hub, "unreachable", lambda url: None)
  monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
  path = maze.download_csv("test", str(tmp_path / "raw"))
  with open(path, "rb") as f:
    assert f.read() == b"payload"
  assert maze.download_csv("test", str(tmp_path / "raw")) == path
  assert len(calls) == 1  # the existing file is reused
  with pytest.raises(ValueError, match="split"):
    maze.download_csv("val", str(tmp_path))


# ----------------------------------------------------------------------------
# Builder.


def test_build_dataset_round_trip(tmp_path):
  out = str(tmp_path / "maze")
  num_train, num_test = 4, 3
  assert maze.build_dataset(out, num_train=num_train, num_test=num_test,
                            seed=1) == out

  meta, train_arrays = puzzle_format.read_split(out, "train")
  n = num_train * 8
  np.testing.assert_array_equal(train_arrays["group_indices"],
                                np.arange(0, n + 1, 8))
  np.testing.assert_array_equal(train_arrays["puzzle_indices"],
                                np.arange(n + 1))
  np.testing.assert_array_equal(train_arrays["puzzle_identifiers"],
                                np.zeros(n))
  assert train_arrays["inputs"].shape == (n, 900)
  assert meta == puzzle_format.PuzzleDatasetMetadata(
      pad_id=0, ignore_label_id=0, blank_identifier_id=0, vocab_size=6,
      seq_len=900, num_puzzle_identifiers=1, total_groups=num_train,
      mean_puzzle_examples=1.0, total_puzzles=num_train, sets=["all"])

  inputs = np.asarray(train_arrays["inputs"])
  labels = np.asarray(train_arrays["labels"])
  assert set(np.unique(inputs)) == {1, 2, 3, 4}
  assert set(np.unique(labels)) == {1, 2, 3, 4, 5}  # no 0: all supervised
  for g in range(num_train):
    q, a = inputs[g * 8], labels[g * 8]
    qs, as_ = maze_grid.dihedral_augment(q, a)
    np.testing.assert_array_equal(inputs[g * 8:(g + 1) * 8], qs)
    np.testing.assert_array_equal(labels[g * 8:(g + 1) * 8], as_)
    _check_solved_maze(q, a, min_length=111)

  test_meta, test = puzzle_format.read_split(out, "test")
  np.testing.assert_array_equal(test["group_indices"], np.arange(num_test + 1))
  assert test["inputs"].shape == (num_test, 900)  # never augmented
  assert test_meta.total_groups == test_meta.total_puzzles == num_test
  train_keys = {maze_grid.canonical_key(q) for q in inputs[::8]}
  assert not train_keys & {maze_grid.canonical_key(q) for q in test["inputs"]}

  with open(os.path.join(out, "identifiers.json")) as f:
    assert json.load(f) == ["<blank>"]
  with open(os.path.join(out, "build_info.json")) as f:
    info = json.load(f)
  assert info["builder"] == "trm.data.puzzles.maze" and info["aug"] is True
  assert info["min_path_length"] == 111 and info["seed"] == 1
  assert info["counts"]["train"] == {"groups": num_train, "examples": n}


def test_build_is_deterministic_noaug_and_subsamples(tmp_path):
  a, b, c = (str(tmp_path / x) for x in "abc")
  for out in (a, b):
    maze.build_dataset(out, num_train=3, num_test=2, seed=5, aug=False,
                       min_path_length=60)
  for split in maze.SPLITS:
    for field in puzzle_format.FIELDS:
      name = os.path.join(split, f"all__{field}.npy")
      with open(os.path.join(a, name), "rb") as fa, open(
          os.path.join(b, name), "rb") as fb:
        assert fa.read() == fb.read(), name
  _, full = puzzle_format.read_split(a, "train")
  np.testing.assert_array_equal(full["group_indices"], np.arange(4))

  maze.build_dataset(c, num_train=3, num_test=2, seed=5, aug=False,
                     min_path_length=60, subsample_size=2)
  _, sub = puzzle_format.read_split(c, "train")
  rows = {r.tobytes() for r in np.asarray(sub["inputs"])}
  assert len(rows) == 2
  assert rows <= {r.tobytes() for r in np.asarray(full["inputs"])}
  _, test = puzzle_format.read_split(c, "test")
  assert test["inputs"].shape == (2, 900)  # subsampling is train only


def test_generated_test_set_excludes_train_images():
  base = [9, maze._STREAM_TEST]
  stream, _ = maze_generate.generate_range(base, 0, 3, 60)
  train_image = dihedral.transform(stream[0].reshape(N, N), 3).reshape(-1)
  seen = {maze_grid.canonical_key(train_image)}
  test, _ = maze._generate_distinct(2, base, 60, seen)
  # The first maze of the stream is a rotated train maze: skipped, replaced.
  np.testing.assert_array_equal(test, stream[1:3])


def test_csv_without_rows_is_refused_before_writing(tmp_path):
  # A header-only CSV was built into a dataset of 0 mazes, marked complete.
  questions, answers = maze_generate.generate_mazes(1, seed=2,
                                                    min_path_length=60)
  csv_dir = tmp_path / "csv"
  csv_dir.mkdir()
  maze.write_csv(str(csv_dir / "train.csv"), questions, answers)
  _write_rows(csv_dir / "test.csv", [])
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=f"^{csv_dir / 'test.csv'} holds no "
                     "puzzle rows: the test split would be empty"):
    maze.build_dataset(out, source="csv", csv_dir=str(csv_dir))
  assert not os.path.exists(os.path.join(out, "build_info.json"))


def test_build_from_csv(tmp_path):
  questions, answers = maze_generate.generate_mazes(5,
                                                    seed=2,
                                                    min_path_length=60)
  csv_dir = tmp_path / "csv"
  maze.write_csv(str(csv_dir / "train.csv"), questions[:3], answers[:3])
  maze.write_csv(str(csv_dir / "test.csv"), questions[3:], answers[3:])
  out = str(tmp_path / "out")
  maze.build_dataset(out, source="csv", csv_dir=str(csv_dir))
  _, train_arrays = puzzle_format.read_split(out, "train")
  _, test = puzzle_format.read_split(out, "test")
  np.testing.assert_array_equal(np.asarray(train_arrays["inputs"])[::8],
                                questions[:3])
  np.testing.assert_array_equal(np.asarray(train_arrays["labels"])[::8],
                                answers[:3])
  np.testing.assert_array_equal(test["labels"], answers[3:])

  with pytest.raises(ValueError, match="csv_dir"):
    maze.build_dataset(out, source="csv")
  with pytest.raises(FileNotFoundError, match="train.csv"):
    maze.build_dataset(out, source="csv", csv_dir=str(tmp_path))
  with pytest.raises(ValueError, match="min_path_length"):
    maze.build_dataset(out, min_path_length=0)


def test_ensure_dataset_builds_once(tmp_path, monkeypatch):
  out = str(tmp_path / "d")
  kwargs = dict(num_train=2, num_test=1, min_path_length=60)
  maze.ensure_dataset(out, **kwargs)

  def fail(*args, **kwargs):
    raise AssertionError("must not rebuild")

  monkeypatch.setattr(maze, "build_dataset", fail)
  assert maze.ensure_dataset(out, **kwargs) == out
  # Other arguments are refused in one line naming them.
  with pytest.raises(builds.DatasetArgumentsError,
                     match=r"num_train=5 \(built with 2\)"):
    maze.ensure_dataset(out, **dict(kwargs, num_train=5))
  monkeypatch.undo()
  _, train_arrays = puzzle_format.read_split(out, "train")
  assert train_arrays["inputs"].shape == (16, 900)


def test_cli_flags(tmp_path):
  fv = flags.FlagValues()
  maze.define_flags(fv)
  out = str(tmp_path / "cli")
  fv(["prog", f"--output_dir={out}", "--num_train=2", "--num_test=1",
      "--min_path_length=50", "--noaug", "--subsample_size=", "--seed=3"])
  assert maze.run_from_flags(fv) == out
  meta, train_arrays = puzzle_format.read_split(out, "train")
  assert meta.total_groups == 2 and train_arrays["inputs"].shape == (2, 900)

  fv = flags.FlagValues()
  maze.define_flags(fv)
  fv(["prog", f"--output_dir={out}", "--subsample_size=x"])
  with pytest.raises(Exception, match="subsample_size"):
    maze.run_from_flags(fv)


# ----------------------------------------------------------------------------
# Config and training.


def _config(arg=None):
  return config_lib.load_config(os.path.join(ROOT, "configs", "trm_maze.py"),
                                arg)


def test_config_matches_upstream_command():
  c = _config()
  assert c.data.name == "maze" and "maze" in trm_program.BUILDERS
  # Upstream's loop: 10 iterations of the 6,510 full batches of 5k epochs
  # (not its total_steps formula's 65,104), an evaluation after each.
  assert c.global_batch_size == 768 and c.total_steps == 65100
  assert c.eval_every == 6510 and c.data.epochs_per_iter == 5000
  assert (c.model.H_cycles, c.model.L_cycles, c.model.L_layers) == (3, 4, 2)
  assert not c.model.mlp_t and c.model.pos_encodings == "rope"
  assert (c.optim.lr, c.optim.puzzle_emb_lr) == (1e-4, 1e-4)
  assert (c.optim.weight_decay, c.optim.puzzle_emb_weight_decay) == (1.0, 1.0)
  assert c.optim.ema and c.data.build.aug
  one_gpu = _config("bs128")
  assert one_gpu.global_batch_size == 128 and one_gpu.total_steps == 390620
  assert one_gpu.total_steps == 10 * one_gpu.eval_every
  assert not _config("noaug").data.build.aug
  with pytest.raises(ValueError, match="Unknown config variant"):
    _config("mlp")
  with pytest.raises(ValueError, match="one of"):
    _config("cpu,bs128")


def tiny_config(**overrides):
  config = _config("cpu")
  config.model.update(hidden_size=32, num_heads=2, puzzle_emb_ndim=32,
                      halt_max_steps=2, H_cycles=1, L_cycles=1)
  config.data.build.update(num_train=8, num_test=4, min_path_length=60)
  config.data.update(eval_batch_size=8)
  config.optim.update(warmup_steps=2)
  config.mesh.update(data=2, fsdp=2, model=2)
  config.update(global_batch_size=8, total_steps=3, eval_every=3,
                checkpoint_every=3, log_every=1)
  return config_lib.set_values(config, overrides)


# slow: the maze builder tests cover the data; test_train.py and the README test
# train the same puzzle trainer through trm.main.
@pytest.mark.slow
def test_cpu_config_trains_a_few_steps(tmp_path):
  state, results = train.train_and_evaluate(tiny_config(), str(tmp_path), families.build_task)
  assert int(state.step) == 3
  assert results and all(np.isfinite(v) for v in results.values()), results
  assert (tmp_path / "eval_3.json").exists()
  meta, _ = puzzle_format.read_split(str(tmp_path / "data"), "train")
  assert (meta.seq_len, meta.vocab_size, meta.total_groups) == (900, 6, 8)
  leaves = jax.tree.leaves(jax.device_get(state.params))
  assert all(np.isfinite(np.asarray(x)).all() for x in leaves)
