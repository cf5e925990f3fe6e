"""Tests for trm.data.puzzles.format (upstream's on-disk dataset layout)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from trm.data.puzzles import format as pf


def _toy(n_groups=3, per_group=2, examples_per_puzzle=2, seq_len=5, vocab=7,
         num_ids=4):
  """Small consistent metadata + arrays for one set named "all"."""
  n_puzzles = n_groups * per_group
  n_examples = n_puzzles * examples_per_puzzle
  rng = np.random.default_rng(0)
  arrays = {
      "inputs": rng.integers(0, vocab, (n_examples, seq_len), dtype=np.uint8),
      "labels": rng.integers(0, vocab, (n_examples, seq_len), dtype=np.uint8),
      "puzzle_identifiers": (np.arange(n_puzzles) % num_ids).astype(np.int32),
      "puzzle_indices": np.arange(0, n_examples + 1, examples_per_puzzle,
                                  dtype=np.int32),
      "group_indices": np.arange(0, n_puzzles + 1, per_group, dtype=np.int32),
  }
  metadata = pf.PuzzleDatasetMetadata(
      pad_id=0, ignore_label_id=0, blank_identifier_id=0, vocab_size=vocab,
      seq_len=seq_len, num_puzzle_identifiers=num_ids, total_groups=n_groups,
      mean_puzzle_examples=float(examples_per_puzzle),
      total_puzzles=n_puzzles, sets=["all"])
  return metadata, arrays


def _rewrite_json(path, **changes):
  with open(path) as f:
    data = json.load(f)
  data.update(changes)
  with open(path, "w") as f:
    json.dump(data, f)


def test_metadata_fields_match_upstream():
  names = [f.name for f in dataclasses.fields(pf.PuzzleDatasetMetadata)]
  assert names == [
      "pad_id", "ignore_label_id", "blank_identifier_id", "vocab_size",
      "seq_len", "num_puzzle_identifiers", "total_groups",
      "mean_puzzle_examples", "total_puzzles", "sets"]
  metadata, _ = _toy()
  with pytest.raises(dataclasses.FrozenInstanceError):
    metadata.pad_id = 1


@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip(tmp_path, mmap):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  got_meta, got = pf.read_split(str(tmp_path), "train", mmap=mmap)
  assert got_meta == metadata
  assert set(got) == set(pf.FIELDS)
  for field, (dtype, _) in pf.FIELDS.items():
    assert got[field].dtype == dtype, field
    np.testing.assert_array_equal(got[field], arrays[field])
    # Only token arrays are memory-mapped; index arrays live in RAM.
    assert isinstance(got[field], np.memmap) == (
        mmap and field in pf.MMAP_FIELDS), field
  # Temp files were all renamed into place.
  assert sorted(os.listdir(tmp_path / "train")) == sorted(
      ["dataset.json"] + [f"all__{f}.npy" for f in pf.FIELDS])


def test_mmap_is_read_only(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  _, got = pf.read_split(str(tmp_path), "train")
  with pytest.raises(ValueError):
    got["inputs"][0, 0] = 1


def test_write_identifiers(tmp_path):
  path = pf.write_identifiers(str(tmp_path), ["<blank>", "a", "b"])
  assert path == str(tmp_path / "identifiers.json")
  with open(path) as f:
    assert json.load(f) == ["<blank>", "a", "b"]
  with pytest.raises(ValueError):
    pf.write_identifiers(str(tmp_path), ["<blank>", 3])


def test_reads_upstream_written_dataset(tmp_path):
  """A split written the way upstream does: pydantic model_dump + np.save."""
  metadata, arrays = _toy(n_groups=4, per_group=1, examples_per_puzzle=1)
  split = tmp_path / "test"
  split.mkdir()
  # Exactly what `json.dump(metadata.model_dump(), f)` produces upstream.
  (split / "dataset.json").write_text(
      '{"pad_id": 0, "ignore_label_id": 0, "blank_identifier_id": 0, '
      '"vocab_size": 7, "seq_len": 5, "num_puzzle_identifiers": 4, '
      '"total_groups": 4, "mean_puzzle_examples": 1.0, "total_puzzles": 4, '
      '"sets": ["all"]}')
  for field, value in arrays.items():
    np.save(split / f"all__{field}.npy", value)
  got_meta, got = pf.read_split(str(tmp_path), "test")
  assert got_meta.mean_puzzle_examples == 1.0
  assert got_meta.sets == ["all"]
  assert got_meta.total_groups == 4
  np.testing.assert_array_equal(got["inputs"], arrays["inputs"])
  # Our serialisation has the same keys, order and value types.
  assert list(metadata.to_json_dict()) == list(
      json.loads((split / "dataset.json").read_text()))


def test_reads_upstream_int64_tokens(tmp_path):
  """Upstream's Sudoku builder with --num-aug (the paper's command) writes
  int64 inputs and labels (its digit map is int64); they load as uint8 ones
  do. Token ids outside [0, vocab_size) or a non-integer dtype are still
  one line naming the file."""
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  for field in ("inputs", "labels"):
    np.save(tmp_path / "train" / f"all__{field}.npy",
            arrays[field].astype(np.int64))
  _, got = pf.read_split(str(tmp_path), "train")
  assert got["inputs"].dtype == got["labels"].dtype == np.int64
  np.testing.assert_array_equal(got["labels"], arrays["labels"])
  bad = arrays["inputs"].astype(np.int64)
  bad[1, 2] = -3
  for value, needle in ((bad, r"all__inputs\.npy: field 'inputs': token id -3"
                         r" < 0"),
                        (arrays["inputs"].astype(np.float32),
                         r"all__inputs\.npy: .*uint8 or another integer "
                         r"dtype, got float32")):
    np.save(tmp_path / "train" / "all__inputs.npy", value)
    with pytest.raises(ValueError, match=needle):
      pf.read_split(str(tmp_path), "train")


def test_ignore_label_id_may_be_null(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  _rewrite_json(tmp_path / "train" / "dataset.json", ignore_label_id=None,
                mean_puzzle_examples=2)
  got_meta, _ = pf.read_split(str(tmp_path), "train")
  assert got_meta.ignore_label_id is None
  assert isinstance(got_meta.mean_puzzle_examples, float)


def test_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    pf.read_split(str(tmp_path / "nope"), "train")
  msg = str(e.value)
  assert str(tmp_path / "nope" / "train") in msg
  assert "python -m trm.data.puzzles.sudoku --output_dir=" in msg


def test_missing_metadata_file(tmp_path):
  (tmp_path / "train").mkdir()
  with pytest.raises(FileNotFoundError, match="dataset.json") as e:
    pf.read_split(str(tmp_path), "train")
  assert "python -m trm.data.puzzles.sudoku" in str(e.value)


def test_a_dataset_json_that_is_not_utf8_names_the_file(tmp_path):
  # json's UnicodeDecodeError is a ValueError, so the trainer printed its
  # one line, but that named neither file nor fix.
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  path = tmp_path / "train" / "dataset.json"
  path.write_bytes(b"\xff\xfe" + path.read_bytes())
  with pytest.raises(ValueError) as e:
    pf.read_split(str(tmp_path), "train")
  assert str(path) in str(e.value) and "not UTF-8" in str(e.value)
  assert "rebuild the dataset" in str(e.value)


def test_missing_npy_file(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  os.remove(tmp_path / "train" / "all__labels.npy")
  with pytest.raises(FileNotFoundError, match="all__labels.npy") as e:
    pf.read_split(str(tmp_path), "train")
  assert "python -m trm.data.puzzles.sudoku" in str(e.value)


def test_unknown_and_missing_metadata_keys(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  path = tmp_path / "train" / "dataset.json"
  _rewrite_json(path, extra_field=1)
  with pytest.raises(ValueError, match=r"dataset\.json.*extra_field"):
    pf.read_split(str(tmp_path), "train")

  data = metadata.to_json_dict()
  del data["total_puzzles"]
  path.write_text(json.dumps(data))
  with pytest.raises(ValueError, match=r"dataset\.json.*total_puzzles"):
    pf.read_split(str(tmp_path), "train")


@pytest.mark.parametrize("field,value", [
    ("seq_len", "5"), ("vocab_size", 2.5), ("sets", []),
    ("ignore_label_id", True), ("mean_puzzle_examples", "1")])
def test_bad_metadata_value_types(tmp_path, field, value):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  _rewrite_json(tmp_path / "train" / "dataset.json", **{field: value})
  with pytest.raises(ValueError, match=field):
    pf.read_split(str(tmp_path), "train")


@pytest.mark.parametrize("change, needle", [
    ({"total_groups": 0}, r"field 'total_groups'=0 != the 3 groups of set "
     r"'all'"),
    ({"total_groups": 2**62}, r"field 'total_groups'=4611686018427387904 "),
    ({"mean_puzzle_examples": -5.0}, r"'mean_puzzle_examples' must be a "
     r"finite number >= 0, got -5\.0"),
    ({"mean_puzzle_examples": float("nan")}, r"got nan"),
    ({"mean_puzzle_examples": float("inf")}, r"got inf"),
])
def test_the_epoch_fields_must_agree_with_the_arrays(tmp_path, change,
                                                     needle):
  """total_groups and mean_puzzle_examples set a num_epochs run's length:
  0 groups or a negative mean trained one step, 2**62 groups without end,
  NaN and inf were errors naming no file, or a traceback."""
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  _rewrite_json(tmp_path / "train" / "dataset.json", **change)
  with pytest.raises(ValueError, match=r"train.dataset\.json: .*" + needle):
    pf.read_split(str(tmp_path), "train")


@pytest.mark.parametrize("field", ["vocab_size", "num_puzzle_identifiers"])
def test_metadata_sizes_past_int32_are_refused(tmp_path, field):
  """They size the model's embedding tables: a dataset.json edited to 2**40
  passed, and training failed in JAX with an OverflowError's traceback."""
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  _rewrite_json(tmp_path / "train" / "dataset.json", **{field: 2**40})
  with pytest.raises(ValueError, match=rf"dataset\.json: field '{field}' "
                     r"must be >= 1 and below 2\*\*31, got 1099511627776"):
    pf.read_split(str(tmp_path), "train")


def test_metadata_inconsistent_with_arrays(tmp_path):
  metadata, arrays = _toy(seq_len=5, vocab=7)
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  path = tmp_path / "train" / "dataset.json"

  _rewrite_json(path, seq_len=6)
  with pytest.raises(ValueError, match=r"all__inputs\.npy.*seq_len"):
    pf.read_split(str(tmp_path), "train")

  _rewrite_json(path, seq_len=5, vocab_size=3)  # Tokens go up to 6.
  with pytest.raises(ValueError, match=r"all__inputs\.npy.*vocab_size"):
    pf.read_split(str(tmp_path), "train")
  # The (possibly slow) token scan can be skipped.
  pf.read_split(str(tmp_path), "train", check_tokens=False)

  _rewrite_json(path, vocab_size=7, num_puzzle_identifiers=2)
  with pytest.raises(ValueError, match=r"puzzle_identifiers"):
    pf.read_split(str(tmp_path), "train")

  _rewrite_json(path, num_puzzle_identifiers=4, sets=["other"])
  with pytest.raises(ValueError, match=r"'all'.*sets"):
    pf.read_split(str(tmp_path), "train")


def test_index_arrays_out_of_range_on_read(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  bad = arrays["puzzle_indices"].copy()
  bad[-1] += 1  # Points past the last example.
  np.save(tmp_path / "train" / "all__puzzle_indices.npy", bad)
  with pytest.raises(ValueError, match=r"all__puzzle_indices\.npy"):
    pf.read_split(str(tmp_path), "train")


def test_pickled_npy_is_rejected(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  np.save(tmp_path / "train" / "all__group_indices.npy",
          np.array([{"a": 1}], dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match=r"all__group_indices\.npy"):
    pf.read_split(str(tmp_path), "train")


@pytest.mark.parametrize("field,mutate", [
    ("inputs", lambda a: a.astype(np.int32)),
    ("labels", lambda a: a[:-1]),
    ("puzzle_identifiers", lambda a: a.astype(np.int64)),
    ("puzzle_indices", lambda a: a[::-1].copy()),
    ("group_indices", lambda a: np.array([0, 3, 2, 6], np.int32)),
    ("group_indices", lambda a: a[:-1]),
])
def test_write_validates_before_writing(tmp_path, field, mutate):
  metadata, arrays = _toy()
  arrays[field] = mutate(arrays[field])
  with pytest.raises(ValueError, match=field):
    pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  assert not (tmp_path / "train").exists()


def test_write_rejects_wrong_sets_and_seq_len(tmp_path):
  metadata, arrays = _toy(seq_len=5)
  with pytest.raises(ValueError, match="sets"):
    pf.write_split(str(tmp_path), "train", metadata, {"other": arrays})
  wrong = dataclasses.replace(metadata, seq_len=4)
  with pytest.raises(ValueError, match="seq_len"):
    pf.write_split(str(tmp_path), "train", wrong, {"all": arrays})
  wrong = dataclasses.replace(metadata, vocab_size=3)
  with pytest.raises(ValueError, match="vocab_size"):
    pf.write_split(str(tmp_path), "train", wrong, {"all": arrays})


def test_overwrite_is_atomic_replace(tmp_path):
  metadata, arrays = _toy()
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  arrays["inputs"] = np.zeros_like(arrays["inputs"])
  pf.write_split(str(tmp_path), "train", metadata, {"all": arrays})
  _, got = pf.read_split(str(tmp_path), "train")
  assert not got["inputs"].any()
  assert not [n for n in os.listdir(tmp_path / "train") if n.endswith(".tmp")]
