"""Tests for trm.data.puzzles.dataset (upstream batching) and pipeline."""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from trm.core import task as task_lib
from trm.families.trm import program as trm_program
from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import pipeline
from trm.data.puzzles import dataset as pd
from trm.data.puzzles import format as pf
from trm.data.puzzles import sudoku

IGN = -100
PAD_ID = 3
SEQ_LEN = 4


def _write(root, split, groups, seed=0):
  """A dataset whose groups hold puzzles of the given example counts.

  `groups` is a list of groups, each a list of per-puzzle example counts.
  Example e has inputs[e, 0] = e + 1 (so rows can be traced back); labels
  are random with about a quarter equal to the ignore id 0. Puzzle p has
  identifier p + 1 (0 is the blank identifier).
  """
  counts = [c for g in groups for c in g]
  n_examples, n_puzzles = sum(counts), len(counts)
  assert n_examples < 250
  rng = np.random.default_rng(seed)
  inputs = rng.integers(0, 250, (n_examples, SEQ_LEN)).astype(np.uint8)
  inputs[:, 0] = np.arange(1, n_examples + 1)
  labels = rng.integers(1, 250, (n_examples, SEQ_LEN)).astype(np.uint8)
  labels[rng.random(labels.shape) < 0.25] = 0
  arrays = {
      "inputs": inputs, "labels": labels,
      "puzzle_identifiers": np.arange(1, n_puzzles + 1, dtype=np.int32),
      "puzzle_indices": np.concatenate([[0], np.cumsum(counts)]).astype(
          np.int32),
      "group_indices": np.concatenate(
          [[0], np.cumsum([len(g) for g in groups])]).astype(np.int32),
  }
  metadata = pf.PuzzleDatasetMetadata(
      pad_id=PAD_ID, ignore_label_id=0, blank_identifier_id=0,
      vocab_size=256, seq_len=SEQ_LEN, num_puzzle_identifiers=n_puzzles + 1,
      total_groups=len(groups), mean_puzzle_examples=n_examples / n_puzzles,
      total_puzzles=n_puzzles, sets=["all"])
  pf.write_split(str(root), split, metadata, {"all": arrays})
  return pf.read_split(str(root), split)


# 10 groups of 1-3 single-example puzzles (augmentations), as Sudoku/Maze.
SINGLE = [[1] * (1 + g % 3) for g in range(10)]
# 9 groups of puzzles with 1-3 examples each (as ARC).
MULTI = [[1 + (g + p) % 3 for p in range(1 + g % 3)] for g in range(9)]


@pytest.fixture(name="single")
def fixture_single(tmp_path):
  return _write(tmp_path, "train", SINGLE)


@pytest.fixture(name="multi")
def fixture_multi(tmp_path):
  return _write(tmp_path, "train", MULTI, seed=1)


def _group_of(arrays, puzzles):
  return np.searchsorted(arrays["group_indices"], puzzles, side="right") - 1


def _plan(arrays, seed, epochs, batch):
  rng = np.random.Generator(np.random.Philox(seed))
  return pd.plan_iteration(rng, np.asarray(arrays["group_indices"]),
                           np.asarray(arrays["puzzle_indices"]), epochs, batch)


def _train(metadata, arrays, **kw):
  args = dict(global_batch_size=4, seed=7, epochs_per_iter=3, num_batches=21)
  args.update(kw)
  return pd.TrainBatches(metadata, arrays, **args)


# ------------------------------------------------------------ plan_iteration


def test_plan_iteration_deterministic_per_seed(single):
  _, arrays = single
  a, b, c = (_plan(arrays, s, 3, 4) for s in (5, 5, 6))
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[0], c[0])


def test_plan_iteration_visits_every_group_each_epoch(single):
  _, arrays = single
  puzzles, starts = _plan(arrays, 0, 3, 4)
  assert len(puzzles) == 30
  groups = _group_of(arrays, puzzles)
  for epoch in range(3):
    assert sorted(groups[10 * epoch:10 * (epoch + 1)]) == list(range(10))
  # Full batches only: 30 visits -> 7 batches of 4, 2 visits dropped.
  np.testing.assert_array_equal(starts, np.arange(8) * 4)


def test_plan_iteration_picks_random_puzzle_of_group(single):
  _, arrays = single
  seen = set()
  for seed in range(30):
    puzzles, _ = _plan(arrays, seed, 1, 4)
    groups = _group_of(arrays, puzzles)
    gi = arrays["group_indices"]
    assert np.all((puzzles >= gi[groups]) & (puzzles < gi[groups + 1]))
    seen.update(puzzles.tolist())
  assert seen == set(range(len(arrays["puzzle_identifiers"])))


def test_plan_iteration_multi_example_truncation(multi):
  _, arrays = multi
  sizes = np.diff(arrays["puzzle_indices"])
  puzzles, starts = _plan(arrays, 3, 4, 5)
  assert starts[0] == 0 and np.all(np.diff(starts) >= 1)
  examples = sizes[puzzles]
  for j in range(len(starts) - 1):
    visits = examples[starts[j]:starts[j + 1]]
    # The batch is full with its last visit and not before it.
    assert visits.sum() >= 5 and visits[:-1].sum() < 5
  # What is left after the last batch does not fill one.
  assert examples[starts[-1]:].sum() < 5


# ---------------------------------------------------------------- TrainBatches


def test_train_batches_follow_the_plan_across_iterations(single):
  metadata, arrays = single
  source = _train(metadata, arrays)
  assert len(source) == 21
  owners = np.concatenate([source.batch_plan(k)[1] for k in range(21)])
  expected = np.concatenate([_plan(arrays, 7 + i, 3, 4)[0][:28]
                             for i in range(3)])
  np.testing.assert_array_equal(owners, expected)
  for k in range(21):
    batch = source[k]
    example_ids, puzzle_ids = source.batch_plan(k)
    assert batch["inputs"].shape == (4, SEQ_LEN)
    assert all(v.dtype == np.int32 for v in batch.values())
    np.testing.assert_array_equal(batch["inputs"][:, 0], example_ids + 1)
    np.testing.assert_array_equal(batch["puzzle_identifiers"], puzzle_ids + 1)
    np.testing.assert_array_equal(
        example_ids, arrays["puzzle_indices"][puzzle_ids])
  with pytest.raises(IndexError):
    source[21]
  with pytest.raises(IndexError):
    source[-1]


def test_train_batches_iteration_visits_each_group_epochs_times(single):
  metadata, arrays = single
  source = _train(metadata, arrays, global_batch_size=5, epochs_per_iter=2,
                  num_batches=8)
  # 20 visits per iteration = 4 full batches of 5: nothing dropped.
  for i in range(2):
    owners = np.concatenate([source.batch_plan(4 * i + j)[1]
                             for j in range(4)])
    groups = _group_of(arrays, owners)
    assert np.all(np.bincount(groups, minlength=10) == 2)


def test_train_batches_random_access_and_seed(single):
  metadata, arrays = single
  a, b = _train(metadata, arrays), _train(metadata, arrays)
  late = {k: a[k] for k in (15, 3, 20)}  # out of order, across iterations
  for k in range(21):
    batch = b[k]
    if k in late:
      for key in batch:
        np.testing.assert_array_equal(batch[key], late[k][key])
  c = _train(metadata, arrays, seed=8)
  assert any(not np.array_equal(b[k]["inputs"], c[k]["inputs"])
             for k in range(5))


def test_train_batches_multi_example_puzzles(multi):
  metadata, arrays = multi
  pi = arrays["puzzle_indices"]
  source = _train(metadata, arrays, global_batch_size=5, epochs_per_iter=4,
                  num_batches=6)
  puzzles, starts = _plan(arrays, 7, 4, 5)
  assert len(starts) - 1 >= 6
  truncated = 0
  for j in range(6):
    example_ids, owners = source.batch_plan(j)
    assert len(example_ids) == 5
    visits = puzzles[starts[j]:starts[j + 1]]
    sizes = pi[visits + 1] - pi[visits]
    takes = np.append(sizes[:-1], 5 - sizes[:-1].sum())
    assert 0 < takes[-1] <= sizes[-1]
    truncated += takes[-1] < sizes[-1]
    np.testing.assert_array_equal(owners, np.repeat(visits, takes))
    # Each example belongs to its puzzle; a visit never repeats an example.
    assert np.all((example_ids >= pi[owners]) & (example_ids < pi[owners + 1]))
    offset = 0
    for take in takes:
      chunk = example_ids[offset:offset + take]
      assert len(set(chunk.tolist())) == take
      offset += take
    batch = source[j]
    np.testing.assert_array_equal(batch["inputs"][:, 0], example_ids + 1)
    np.testing.assert_array_equal(batch["puzzle_identifiers"], owners + 1)
  assert truncated > 0  # the data really exercises the boundary


def test_a_puzzle_without_examples_adds_nothing_to_a_batch(tmp_path):
  """The format allows a puzzle of 0 examples (upstream's loader samples
  none from it). Its visit added the next puzzle's first example with no
  owner: batch 1 held example ids [4, 3, 4] for puzzle ids [5, 5], so
  example 3 (puzzle 4's) was trained with puzzle 5's identifier."""
  metadata, arrays = _write(tmp_path, "train", [[1, 0], [2], [0], [1, 1]])
  pi = arrays["puzzle_indices"]
  source = _train(metadata, arrays, global_batch_size=2, epochs_per_iter=8,
                  num_batches=12)
  for j in range(12):
    example_ids, owners = source.batch_plan(j)
    assert len(example_ids) == len(owners) == 2
    assert np.all((example_ids >= pi[owners]) & (example_ids < pi[owners + 1]))
    batch = source[j]
    np.testing.assert_array_equal(batch["inputs"][:, 0], example_ids + 1)
    np.testing.assert_array_equal(batch["puzzle_identifiers"], owners + 1)


def test_train_batches_ignore_label(single):
  metadata, arrays = single
  source = _train(metadata, arrays)
  for k in range(3):
    example_ids, _ = source.batch_plan(k)
    raw = np.asarray(arrays["labels"])[example_ids].astype(np.int32)
    labels = source[k]["labels"]
    np.testing.assert_array_equal(labels, np.where(raw == 0, IGN, raw))
    assert not np.any(labels == 0)


def test_no_ignore_label_keeps_zeros(single):
  metadata, arrays = single
  meta = pf.PuzzleDatasetMetadata(**{**metadata.__dict__,
                                     "ignore_label_id": None})
  source = _train(meta, arrays)
  example_ids, _ = source.batch_plan(0)
  np.testing.assert_array_equal(
      source[0]["labels"], np.asarray(arrays["labels"])[example_ids])


@pytest.mark.parametrize("data", ["single", "multi"])
def test_process_slices_concatenate(data, request):
  metadata, arrays = request.getfixturevalue(data)
  full = _train(metadata, arrays, global_batch_size=8, num_batches=4,
                epochs_per_iter=4)
  parts = [_train(metadata, arrays, global_batch_size=8, num_batches=4,
                  epochs_per_iter=4, process_index=p, process_count=2)
           for p in range(2)]
  for k in range(4):
    want = full[k]
    got = [part[k] for part in parts]
    assert got[0]["inputs"].shape == (4, SEQ_LEN)
    for key in want:
      np.testing.assert_array_equal(
          np.concatenate([g[key] for g in got]), want[key])


def test_batch_not_divisible_by_processes(single):
  metadata, arrays = single
  with pytest.raises(ValueError, match="divisible"):
    _train(metadata, arrays, global_batch_size=5, process_count=2)


def test_iteration_without_full_batch(single):
  """Found when the source is built (before any compile), with both
  counts and the flags to change."""
  metadata, arrays = single
  with pytest.raises(ValueError, match=r"holds 19 examples in 10 groups.*"
                     r"config.global_batch_size=64. Raise "
                     r"config.data.epochs_per_iter"):
    _train(metadata, arrays, global_batch_size=64, epochs_per_iter=1)


# ----------------------------------------------------------------- TestBatches


@pytest.fixture(name="test_split")
def fixture_test_split(tmp_path):
  # 13 examples in 7 puzzles.
  return _write(tmp_path, "test", [[2, 1], [3], [1, 2, 2], [2]], seed=2)


@pytest.mark.parametrize("batch", [4, 8])
def test_test_batches_cover_every_example_in_order(test_split, batch):
  metadata, arrays = test_split
  source = pd.TestBatches(metadata, arrays, global_batch_size=batch)
  assert source.num_examples == 13
  assert len(source) == -(-13 // batch)
  batches = [source[k] for k in range(len(source))]
  with pytest.raises(IndexError):
    source[len(source)]
  inputs = np.concatenate([b["inputs"] for b in batches])
  labels = np.concatenate([b["labels"] for b in batches])
  ids = np.concatenate([b["puzzle_identifiers"] for b in batches])
  assert inputs.shape == (len(source) * batch, SEQ_LEN)
  np.testing.assert_array_equal(inputs[:13], arrays["inputs"])
  raw = np.asarray(arrays["labels"], np.int32)
  np.testing.assert_array_equal(labels[:13], np.where(raw == 0, IGN, raw))
  owner = np.repeat(np.arange(7), np.diff(arrays["puzzle_indices"]))
  np.testing.assert_array_equal(ids[:13], owner + 1)
  # Padding rows: pad token, no labels, the blank identifier.
  assert np.all(inputs[13:] == PAD_ID)
  assert np.all(labels[13:] == IGN)
  assert np.all(ids[13:] == metadata.blank_identifier_id)
  assert all(b["inputs"].dtype == np.int32 for b in batches)


@pytest.mark.parametrize("batch", [4, 8])
def test_test_batches_process_slices(test_split, batch):
  metadata, arrays = test_split
  full = pd.TestBatches(metadata, arrays, global_batch_size=batch)
  parts = [pd.TestBatches(metadata, arrays, global_batch_size=batch,
                          process_index=p, process_count=2) for p in range(2)]
  for k in range(len(full)):
    got = [part[k] for part in parts]
    for key, want in full[k].items():
      assert got[0][key].shape[0] == got[1][key].shape[0] == batch // 2
      np.testing.assert_array_equal(np.concatenate([g[key] for g in got]),
                                    want)


def test_test_batches_max_batches(test_split):
  metadata, arrays = test_split
  assert len(pd.TestBatches(metadata, arrays, global_batch_size=4,
                            max_batches=2)) == 2
  assert len(pd.TestBatches(metadata, arrays, global_batch_size=4,
                            max_batches=10)) == 4


def test_an_empty_test_split_is_refused(test_split):
  """Prebuilt or converted data with no test examples: every evaluation
  would report nothing."""
  metadata, arrays = test_split
  empty = dict(arrays, puzzle_indices=np.zeros(1, np.int32),
               group_indices=np.zeros(1, np.int32),
               puzzle_identifiers=np.zeros(0, np.int32),
               inputs=arrays["inputs"][:0], labels=arrays["labels"][:0])
  with pytest.raises(ValueError, match="The test split holds no examples"):
    pd.TestBatches(metadata, empty, global_batch_size=4)


# ------------------------------------------------------------------ pipeline


def _assert_batches_equal(a, b):
  assert set(a) == set(b)
  for key in a:
    np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]))


def test_grain_iterator_matches_indexing(single):
  metadata, arrays = single
  source = _train(metadata, arrays)
  it = pipeline.grain_iterator(source, prefetch=2)
  for k in range(len(source)):
    _assert_batches_equal(next(it), source[k])
  with pytest.raises(StopIteration):
    next(it)


def test_grain_iterator_state_resumes(single):
  metadata, arrays = single
  source = _train(metadata, arrays)
  it = pipeline.grain_iterator(source, prefetch=2)
  for _ in range(9):  # crosses into the second iteration (7 batches each)
    next(it)
  state = it.get_state()
  after = [next(it) for _ in range(3)]
  _assert_batches_equal(after[0], source[9])
  # A fresh iterator (and a fresh source) restored from the state.
  resumed = pipeline.grain_iterator(_train(metadata, arrays), prefetch=1)
  resumed.set_state(state)
  for want in after:
    _assert_batches_equal(next(resumed), want)
  # Restoring an early state rewinds.
  it.set_state(pipeline.grain_iterator(source).get_state())
  _assert_batches_equal(next(it), source[0])


def test_puzzle_sources_name_their_data(tmp_path, single):
  """Each process reads its rows from its own copy of the puzzles: two
  hosts with other puzzles at one data_dir (here: one label changed, or
  another test split) trained and evaluated on a mix of both, exit 0. The
  trainer compares the sources' fingerprints across processes, and a
  training position saved over other puzzles is refused on restore."""
  metadata, arrays = single
  other = dict(arrays, labels=np.array(arrays["labels"]))
  other["labels"][5, 2] ^= 1
  train = [_train(metadata, arrays, process_index=p, process_count=2)
           for p in range(2)]
  assert train[0].fingerprint() == train[1].fingerprint()  # not per process
  assert train[0].fingerprint() != _train(metadata, other).fingerprint()
  test_meta, test_arrays = _write(tmp_path / "a", "test", SINGLE)
  other_meta, other_test = _write(tmp_path / "b", "test", SINGLE, seed=1)
  assert (pd.TestBatches(test_meta, test_arrays, global_batch_size=4)
          .fingerprint() != pd.TestBatches(other_meta, other_test,
                                           global_batch_size=4).fingerprint())
  # A resume over other puzzles would not continue the stream it trained on.
  saved = pipeline.grain_iterator(train[0])
  next(saved)
  with pytest.raises(ValueError, match="not what it was trained on"):
    pipeline.grain_iterator(_train(metadata, other)).set_state(
        saved.get_state())


def test_to_global_shards_batch(single):
  metadata, arrays = single
  ctx = mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2)),
      config_lib.default_logical_axis_rules())
  spec = trm_program.batch_spec(SEQ_LEN)
  shardings = task_lib.batch_shardings(spec, ctx)
  batch = _train(metadata, arrays, global_batch_size=8, num_batches=2,
                 epochs_per_iter=4)[1]
  out = pipeline.to_global(batch, shardings)
  assert set(out) == {"inputs", "labels", "puzzle_identifiers"}
  assert out["inputs"].sharding.spec == P(("data", "fsdp"), None)
  assert out["labels"].sharding.spec == P(("data", "fsdp"), None)
  assert out["puzzle_identifiers"].sharding.spec == P(("data", "fsdp"))
  for key, value in out.items():
    assert value.shape == batch[key].shape and value.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(value), batch[key])
    assert len(value.addressable_shards) == 8
    assert value.addressable_shards[0].data.shape[0] == 2
  # The 2 devices along 'model' hold the same rows.
  shards = out["inputs"].addressable_shards
  rows = {tuple(s.index[0].indices(8)) for s in shards}
  assert len(rows) == 4
  abstract = task_lib.abstract_batch(spec, 8, shardings)
  for key in out:
    assert abstract[key].shape == out[key].shape
    assert abstract[key].sharding == out[key].sharding


# ------------------------------------------------------------ generated Sudoku


def test_generated_sudoku_batches(tmp_path):
  sudoku.build_dataset(str(tmp_path), source="generate", num_train=12,
                       num_test=5, num_aug=2, num_blanks=30, seed=0)
  metadata, arrays = pf.read_split(str(tmp_path), "train")
  assert metadata.total_groups == 12
  assert len(arrays["puzzle_identifiers"]) == 36  # 12 groups of 1 + 2 aug
  source = pd.TrainBatches(metadata, arrays, global_batch_size=8, seed=0,
                           epochs_per_iter=2, num_batches=3)
  owners = np.concatenate([source.batch_plan(k)[1] for k in range(3)])
  groups = _group_of(arrays, owners)
  assert sorted(groups[:12]) == list(range(12))  # first epoch: each group once
  batch = source[0]
  assert batch["inputs"].shape == (8, 81)
  assert batch["inputs"].min() >= 1 and batch["inputs"].max() <= 10
  # Givens are kept in the label; labels are digits (2..10), none ignored.
  assert batch["labels"].min() >= 2
  given = batch["inputs"] > 1
  np.testing.assert_array_equal(batch["inputs"][given], batch["labels"][given])
  test_meta, test_arrays = pf.read_split(str(tmp_path), "test")
  test = pd.TestBatches(test_meta, test_arrays, global_batch_size=4)
  assert len(test) == 2
  assert np.all(test[1]["inputs"][1:] == test_meta.pad_id)
  assert np.all(test[1]["labels"][1:] == IGN)
