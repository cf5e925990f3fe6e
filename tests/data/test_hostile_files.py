"""Hostile or malformed data files are one line (ValueError) naming the
file, never a traceback or a silently wrong data set: Sudoku / Maze CSVs
with a huge field or bytes that are not UTF-8; ARC JSON of the wrong shape;
a damaged tokenizer.json, or one whose ids have gaps (its token count
understates the ids it produces); a meta.json that is no object or has a
bad vocab_size; .bin tokens at or above the model's vocabulary."""
import contextlib
import json
import os
import signal

import numpy as np
import pytest

from trm.data import io as data_io
from trm.data.puzzles import arc_sources
from trm.data.puzzles import maze
from trm.data.puzzles import sudoku
from trm.data.text import preparation
from trm.data.text import text_codecs
from trm.data.text import tokenizer as tok_lib
from trm.data.text import windows

_Q = "." * 80 + "1"
_A = "1" * 81


def _csv(path, body: bytes) -> str:
  path.write_bytes(b"source,q,a,rating\n" + body)
  return str(path)


def test_a_csv_field_over_the_csv_limit_is_one_line(tmp_path):
  path = _csv(tmp_path / "train.csv", f"x,{_Q},{_A},3\nx,{'9' * 200_000},"
              f"{_A},1\n".encode())
  with pytest.raises(ValueError, match=r"train\.csv:3: not a readable CSV "
                     r"row \(field larger than field limit"):
    sudoku.read_csv(path)
  path = _csv(tmp_path / "maze.csv", f"x,{'#' * 200_000},a,1\n".encode())
  with pytest.raises(ValueError, match=r"maze\.csv:2: not a readable CSV"):
    maze.read_csv(path)


def test_a_csv_line_without_end_is_refused_before_it_is_read_whole(
    tmp_path):
  # csv's field limit applied only once the file iterator had read the
  # whole line: a 64 MiB line cost 64 MiB (a multi-GB one, the host).
  import tracemalloc  # pylint: disable=g-import-not-at-top
  path = _csv(tmp_path / "train.csv", f"x,{_Q},{_A},3\n".encode()
              + b"9" * (64 << 20))
  tracemalloc.start()
  try:
    with pytest.raises(ValueError, match=r"train\.csv:3: a line longer than "
                       r"1,048,576 characters"):
      sudoku.read_csv(path)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 16 << 20, peak
  # A line of the limit's length exactly, ending \r\n or \n, is read.
  for end in (b"\r\n", b"\n"):
    path = _csv(tmp_path / "train.csv", f"x,{_Q},{_A},3".encode() + end
                + b"x," + b"." * ((1 << 20) - 2) + end)
    with pytest.raises(ValueError, match=r"train\.csv:3: not a readable CSV"):
      sudoku.read_csv(path)  # csv's own field limit, past the line's


def test_a_csv_that_is_not_utf8_names_the_file(tmp_path):
  path = _csv(tmp_path / "train.csv", b"x,\xff\xfe" + _Q[2:].encode()
              + f",{_A},3\n".encode())
  with pytest.raises(ValueError, match=r"train\.csv: not UTF-8 text "
                     r"\(byte 0xff"):
    sudoku.read_csv(path)


def _write(path, value) -> str:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(value))
  return str(path)


_PUZZLE = {"train": [{"input": [[1]], "output": [[1]]}],
           "test": [{"input": [[1]]}]}


def test_a_concept_task_file_that_is_no_object_is_one_line(tmp_path):
  _write(tmp_path / "concept" / "a" / "t1.json", [1, 2])
  with pytest.raises(ValueError, match=r"t1\.json: expected a task object"):
    arc_sources.load_concept_dir(str(tmp_path / "concept"))


@pytest.mark.parametrize("challenges,solutions,needle", [
    ({"p": _PUZZLE}, {"p": 5}, "needs one solution per test input"),
    ({"p": dict(_PUZZLE, test=[7])}, {"p": [[[1]]]},
     r"test\[0\] must be an object"),
    ({"p": dict(_PUZZLE, test=5)}, None, "needs a non-empty 'test' list"),
])
def test_kaggle_files_of_the_wrong_shape_are_one_line(tmp_path, challenges,
                                                      solutions, needle):
  _write(tmp_path / "arc-agi_training_challenges.json", challenges)
  if solutions is not None:
    _write(tmp_path / "arc-agi_training_solutions.json", solutions)
  with pytest.raises(ValueError, match=needle):
    arc_sources.load_kaggle_files(str(tmp_path), "arc-agi", "training")


def test_an_arc_file_that_is_not_utf8_names_it(tmp_path):
  path = tmp_path / "arc-agi_training_challenges.json"
  path.write_bytes(b"\xff\xfe{}")
  with pytest.raises(ValueError, match=r"challenges\.json: not UTF-8 text"):
    arc_sources.load_kaggle_files(str(tmp_path), "arc-agi", "training")


def _gapped_tokenizer(path, top: int) -> str:
  """A WordLevel tokenizer.json of 6 tokens whose ids reach `top`."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {"a": 0, tok_lib.END_OF_TEXT: 1, tok_lib.MASK: 2, "hello": 3,
           "world": 4, "b": top}
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="a"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.save(str(path))
  return str(path)


def test_a_tokenizer_with_id_gaps_counts_its_largest_id(tmp_path):
  path = _gapped_tokenizer(tmp_path / "tokenizer.json", 60000)
  assert text_codecs.HFTokenizerCodec(path).vocab_size == 60001
  assert tok_lib.load_tokenizer(str(tmp_path)).vocab_size == 60001
  meta = preparation.prepare("hello world b a " * 40, str(tmp_path / "data"),
                             path)
  ids = np.fromfile(tmp_path / "data" / "train.bin", np.uint16)
  assert ids.max() == 60000 < meta["vocab_size"] == 60001


def test_a_tokenizer_with_ids_past_uint16_is_refused_by_name(tmp_path):
  path = _gapped_tokenizer(tmp_path / "tokenizer.json", 70000)
  with pytest.raises(ValueError, match="more than the 65536 ids"):
    preparation.prepare("hello world b " * 40, str(tmp_path / "data"), path)


def test_a_damaged_tokenizer_json_is_one_line_naming_it(tmp_path):
  path = tmp_path / "tokenizer.json"
  path.write_text('{"version": "1.0", "model": ')
  with pytest.raises(ValueError, match=r"tokenizer\.json is not a readable "
                     "tokenizer.json"):
    preparation.prepare("some text " * 40, str(tmp_path / "data"), str(path))


def _prepared(tmp_path) -> str:
  directory = str(tmp_path / "data")
  preparation.prepare("abcdefgh \n" * 200, directory, "char")
  return directory


@pytest.mark.parametrize("meta,needle", [
    ([1, 2], "holds a JSON list, not the object"),
    ({"vocab_size": "abc", "tokenizer": "char", "itos": {}},
     "vocab_size='abc' must be an integer"),
    ({"vocab_size": 70000, "tokenizer": "char", "itos": {}},
     "vocab_size=70000 must be an integer"),
])
def test_a_damaged_meta_json_is_one_line(tmp_path, meta, needle):
  directory = _prepared(tmp_path)
  with open(os.path.join(directory, preparation.META_FILE), "w") as f:
    json.dump(meta, f)
  with pytest.raises(ValueError, match=needle):
    preparation.load_meta(directory)


def test_bin_tokens_beyond_the_vocabulary_are_one_line(tmp_path):
  directory = _prepared(tmp_path)
  vocab = preparation.load_meta(directory)["vocab_size"]
  path = os.path.join(directory, windows.TRAIN_FILE)
  tokens = np.fromfile(path, np.uint16)
  windows.TokenWindows(path, 8, 4, seed=0, vocab_size=vocab)[0]  # fine
  tokens[::5] = 60000
  tokens.tofile(path)
  source = windows.TokenWindows(path, 8, 4, seed=0, vocab_size=vocab)
  with pytest.raises(ValueError, match=rf"train\.bin holds token id 60000, "
                     rf"but the model's vocabulary has {vocab} ids"):
    source[0]
  evals = windows.EvalWindows(directory, 8, 4, eval_iters=1, seed=0,
                              vocab_size=vocab)
  with pytest.raises(ValueError, match=r"train\.bin holds token id 60000"):
    evals[0]


def test_a_bin_token_beyond_the_vocabulary_is_found_before_training(
    tmp_path, monkeypatch):
  """One damaged id deep in train.bin stopped a run only at the step whose
  random window first reached it, after compiling and training up to
  there; `check_file_ids` (the GPT task's, before compiling) names it and
  its position. A file over _SCAN_TOKENS is left to each batch's check."""
  directory = _prepared(tmp_path)
  vocab = preparation.load_meta(directory)["vocab_size"]
  train, val = (os.path.join(directory, f)
                for f in (windows.TRAIN_FILE, windows.VAL_FILE))
  windows.check_file_ids([train, val], vocab)  # prepared: fine
  tokens = np.fromfile(train, np.uint16)
  tokens[1234] = vocab  # the first id past the vocabulary
  tokens.tofile(train)
  with pytest.raises(ValueError, match=(
      rf"train\.bin holds token id {vocab} at token 1234, but the model's "
      rf"vocabulary has {vocab} ids")):
    windows.check_file_ids([val, train], vocab)
  monkeypatch.setattr(windows, "_SCAN_CHUNK", 1000)  # found across chunks
  with pytest.raises(ValueError, match="at token 1234,"):
    windows.check_file_ids([windows.TokenFile(train)], vocab)
  monkeypatch.setattr(windows, "_SCAN_TOKENS", tokens.size - 1)
  windows.check_file_ids([train], vocab)  # too large to read whole


def test_negative_token_ids_are_one_line(tmp_path):
  """A TFDS token feature is signed: a negative id passed the check (only
  ids >= the vocabulary were refused) and indexed the embedding table from
  its end."""

  class Stream(windows.TokenFile):

    def __init__(self):  # pylint: disable=super-init-not-called
      self.path, self.num_tokens = "tfds:ints/train[tokens]@d", 100
      self._data = np.arange(100, dtype=np.int32) % 7
      self._data[49] = -1

    def check_length(self, block_size):
      pass

  source = windows.TokenWindows(Stream(), 99, 1, seed=0, vocab_size=7)
  with pytest.raises(ValueError, match=(
      r"tfds:ints/train\[tokens\]@d holds token id -1, but the model's "
      r"vocabulary has 7 ids")):
    source[0]


@pytest.mark.parametrize("identifiers,puzzles,needle", [
    (["<blank>", "p"], "{", r"test_puzzles\.json: not valid JSON"),
    (["<blank>", "p"], [1], r"test_puzzles\.json: expected an object"),
    (["<blank>", "p"], {"p": {"train": []}}, r"puzzle 'p' needs a 'test'"),
    (["<blank>", "p"], {"p": {"test": [{"input": [[1]]}]}},
     r"puzzle 'p' needs a 'test'"),
    (["<blank>", "p"], {"p": {"test": [{"input": [["a"]], "output": [[1]]}]}},
     r"puzzle 'p' has a grid"),
    ({"0": "p"}, {}, r"identifiers\.json: expected a JSON list"),
])
def test_arc_evaluator_dataset_files_of_the_wrong_shape_are_one_line(
    tmp_path, identifiers, puzzles, needle):
  from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
  (tmp_path / "identifiers.json").write_text(json.dumps(identifiers))
  (tmp_path / "test_puzzles.json").write_text(
      puzzles if isinstance(puzzles, str) else json.dumps(puzzles))
  with pytest.raises(ValueError, match=needle) as info:
    arc_eval.ARCEvaluator(str(tmp_path))
  assert "\n" not in str(info.value)



@contextlib.contextmanager
def _within(seconds: int):
  """A read that blocks (a FIFO with no writer) fails the test instead of
  hanging it. (An AssertionError: a TimeoutError is an OSError, which a
  reader's `except OSError` took for an unreadable file, and read on.)"""
  def stop(*_):
    raise AssertionError("blocked reading a FIFO")
  previous = signal.signal(signal.SIGALRM, stop)
  signal.alarm(seconds)
  try:
    yield
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_fifos_named_as_json_or_text_inputs_are_refused_unread(tmp_path):
  # Each blocked until a writer came: a hang, not an error.
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  from trm.data import io as data_io  # pylint: disable=g-import-not-at-top
  from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
  _write(tmp_path / "concept" / "a" / "t1.json", _PUZZLE)
  for name in ("concept/a/t2.json", "config.json", "identifiers.json",
               "input.txt"):
    os.mkfifo(tmp_path / name)
  with _within(20):
    with pytest.raises(ValueError, match=r"t2\.json is not a regular file"):
      arc_sources.load_concept_dir(str(tmp_path / "concept"))
    with pytest.raises(ValueError,
                       match=r"config\.json is not a regular file.*download"):
      weights_io.read_json(str(tmp_path / "config.json"))
    with pytest.raises(ValueError,
                       match=r"identifiers\.json is not a regular file"):
      arc_eval.ARCEvaluator(str(tmp_path))
    with pytest.raises(ValueError, match=r"input\.txt is not a regular file"):
      data_io.read_utf8(str(tmp_path / "input.txt"))


def _npy_declaring(path, dtype: str, shape: tuple) -> None:
  """A .npy whose header declares `shape` over 80 bytes of data."""
  from numpy.lib import format as npy  # pylint: disable=g-import-not-at-top
  with open(path, "wb") as f:
    npy.write_array_header_1_0(f, {"descr": dtype, "fortran_order": False,
                                   "shape": shape})
    f.write(b"\0" * 80)


@pytest.mark.parametrize("version", [(2, 0), (3, 0)])
def test_a_npy_of_a_later_header_version_declaring_too_much_is_refused(
    tmp_path, version):
  """A version 3.0 header (UTF-8) skipped the check, and np.load has none
  for the arrays it reads whole: a 200-byte file declaring 4 TiB was a
  MemoryError traceback from trm.visualize and trm.main."""
  import struct  # pylint: disable=g-import-not-at-top
  from numpy.lib import format as npy  # pylint: disable=g-import-not-at-top
  path = tmp_path / "all__puzzle_indices.npy"
  header = repr({"descr": "<i4", "fortran_order": False,
                 "shape": (2**40,)}).encode()
  header += b" " * (-(12 + len(header) + 1) % 64) + b"\n"
  with open(path, "wb") as f:
    f.write(npy.magic(*version) + struct.pack("<I", len(header)) + header)
    f.write(b"\0" * 80)
  with open(path, "rb") as f:
    assert npy.read_magic(f) == version
  with pytest.raises(ValueError, match=r"declares a int32 array of shape "
                     r"\(1099511627776,\) \(4,398,046,511,104 bytes\), but "
                     r"the file holds 80 bytes"):
    data_io.check_npy_size(str(path))
  with open(path, "wb") as f:
    npy.write_array(f, np.arange(6, dtype=np.int32), version=version)
  data_io.check_npy_size(str(path))  # a whole one passes


def test_a_npy_declaring_more_than_it_holds_is_one_line(tmp_path):
  """A dataset array or --predictions file whose header declares a TiB
  (truncated, or crafted): np.load tried to allocate it first, a
  MemoryError's traceback from trm.visualize and trm.main. A --predictions
  FIFO blocked np.load (trm.visualize hung)."""
  from trm.data.puzzles import format as puzzle_format  # pylint: disable=g-import-not-at-top
  from trm.families.trm import sheets  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=2,
                       num_aug=0, num_blanks=30)
  predictions = tmp_path / "predictions.npy"
  _npy_declaring(predictions, "<i8", (2**40, 81))
  with pytest.raises(ValueError, match=r"predictions\.npy: not a readable "
                     r".*declares a int64 array of shape \(1099511627776, 81\)"):
    sheets.dataset_sheet(data_dir, "test", str(tmp_path / "s.png"),
                         predictions_path=str(predictions))
  os.mkfifo(tmp_path / "fifo.npy")  # blocked np.load: a hang
  with _within(20), pytest.raises(ValueError, match=r"fifo\.npy is not a "
                                  "regular file"):
    sheets.dataset_sheet(data_dir, "test", str(tmp_path / "s.png"),
                         predictions_path=str(tmp_path / "fifo.npy"))
  _npy_declaring(os.path.join(data_dir, "test", "all__puzzle_indices.npy"),
                 "<i4", (2**40,))
  with pytest.raises(ValueError, match=r"all__puzzle_indices\.npy: field "
                     r"'puzzle_indices'.*holds 80 bytes after it"):
    puzzle_format.read_split(data_dir, "test")


def test_an_emptied_npy_is_one_line(tmp_path):
  """A dataset array emptied between runs (a full disk, `> file`): np.load
  raised EOFError, a traceback from trm.main's resume and trm.visualize."""
  from trm.data.puzzles import format as puzzle_format  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "sudoku")
  sudoku.build_dataset(data_dir, source="generate", num_train=2, num_test=2,
                       num_aug=0, num_blanks=30)
  os.truncate(os.path.join(data_dir, "train", "all__inputs.npy"), 0)
  with pytest.raises(ValueError, match=r"all__inputs\.npy: field 'inputs': "
                     r"not a readable .* \(it is empty \(0 bytes\)\); "
                     "rebuild the dataset"):
    puzzle_format.read_split(data_dir, "train")


def test_a_meta_pkl_declaring_a_huge_string_names_the_failure(tmp_path):
  """A meta.pkl of a few bytes declaring a 2**40-character string: the
  one line said 'cannot be read as plain data ()', an empty reason."""
  import struct  # pylint: disable=g-import-not-at-top
  path = tmp_path / "meta.pkl"
  path.write_bytes(b"\x80\x04\x8d" + struct.pack("<Q", 2**40) + b"abc")
  with pytest.raises(ValueError, match=r"meta\.pkl cannot be read as plain "
                     r"data \((MemoryError|pickle data was truncated)\)"):
    preparation.read_nanogpt_meta(str(path), "fix")


def test_a_meta_pkl_with_bool_token_ids_is_no_vocabulary(tmp_path):
  """True and False are ints equal to 1 and 0: itos {False: 'a', True:
  'b'} was taken, and meta.json got the ids "False" and "True", which
  every codec then refused as no vocabulary of a prepared data set."""
  import pickle  # pylint: disable=g-import-not-at-top
  path = tmp_path / "meta.pkl"
  path.write_bytes(pickle.dumps({"vocab_size": 2, "itos": {False: "a",
                                                           True: "b"},
                                 "stoi": {"a": False, "b": True}}))
  with pytest.raises(ValueError, match=r"meta\.pkl does not hold a character "
                     "vocabulary: fix"):
    preparation.read_nanogpt_meta(str(path), "fix")


_DEEP = "[" * 100000 + "]" * 100000  # past Python's recursion limit
_LONG_INT = "1" * 5000  # past Python's 4300-digit int conversion limit


def _deep_json_readers(tmp_path):
  """(file, reader) pairs: every JSON file the data layer reads."""
  from trm.data.puzzles import builds  # pylint: disable=g-import-not-at-top
  from trm.data.puzzles import format as puzzle_format  # pylint: disable=g-import-not-at-top
  from trm.data.text import sft  # pylint: disable=g-import-not-at-top
  directory = _prepared(tmp_path)
  puzzles = tmp_path / "puzzles"
  (puzzles / "train").mkdir(parents=True)
  for name, body in (("deep.jsonl", f'{{"prompt": {_DEEP}, "response": '
                                     '"x"}\n'),
                     ("long.jsonl", f'{{"prompt": {_LONG_INT}, "response": '
                                     '"x"}\n')):
    (tmp_path / name).write_text(body)
    yield (str(tmp_path / name),
           lambda path=str(tmp_path / name): sft.read_jsonl_pairs(path))
  meta = os.path.join(directory, preparation.META_FILE)
  yield meta, lambda: preparation.load_meta(directory)
  yield (str(puzzles / "train" / "dataset.json"),
         lambda: puzzle_format.read_split(str(puzzles), "train"))
  yield (str(puzzles / builds.BUILD_INFO_FILE),
         lambda: builds.check_recorded_args(str(puzzles), {}))
  yield (str(tmp_path / "arc.json"),
         lambda: arc_sources._read_json(str(tmp_path / "arc.json")))  # pylint: disable=protected-access


def test_json_nested_past_the_recursion_limit_is_one_line(tmp_path):
  """json's RecursionError (nesting) was a traceback from the JSONL pairs,
  meta.json, a puzzle split's dataset.json and an ARC file; a 5000-digit
  integer in a JSONL record a ValueError naming no file."""
  for path, read in _deep_json_readers(tmp_path):
    if not path.endswith(".jsonl"):
      with open(path, "w") as f:
        f.write(_DEEP)
    with pytest.raises(ValueError) as e:
      read()
    assert path in str(e.value), str(e.value)[:300]


@pytest.mark.parametrize("kind", ["fifo", "deep", "huge"])
def test_a_handed_workdirs_config_json_is_read_safely(tmp_path, kind,
                                                      monkeypatch):
  """A trm.main workdir handed to trm.generate / DiffusionLM /
  trm.evaluate: its config.json as a FIFO blocked the family check for
  ever (open waits for a writer), nested past the stack it was a
  RecursionError traceback from three readers, and past 64 MiB the family
  check read it whole (a 2 GiB sparse file: 4.4 GB resident) before the
  config's reader refused it "unread"."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  from trm.core import config_record  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  from trm.families.trm import task  # pylint: disable=g-import-not-at-top
  (tmp_path / "checkpoints").mkdir()
  path = tmp_path / "config.json"
  if kind == "fifo":
    os.mkfifo(path)
  elif kind == "deep":
    path.write_text('{"model": ' + "[" * 100000 + "]" * 100000 + "}")
  else:  # sparse: no disk taken
    with open(path, "wb") as f:
      f.truncate(65 * 2**20)
    def read_whole(*args, **kwargs):
      raise AssertionError("a config.json past 64 MiB was read whole")
    monkeypatch.setattr(json, "load", read_whole)
    monkeypatch.setattr(json, "loads", read_whole)
  with _within(10):
    inference.check_dream_workdir(str(tmp_path))  # no family said: passes
    assert task._recorded_data_dir(str(tmp_path)) == ""  # pylint: disable=protected-access
    with pytest.raises(ValueError, match=(
        r"config\.json is (not a regular file|no checkpoint JSON "
        r"\(RecursionError|68,157,440 bytes)")):
      inference._workdir_config(str(tmp_path), None)  # pylint: disable=protected-access
  if kind == "deep":
    with pytest.raises(config_record.ConfigRecordError,
                       match=r"config\.json is no config record: its JSON is "
                             "nested deeper"):
      config_record.read_file(epath.Path(path))


@pytest.mark.parametrize("reader, body, shown", [
    ("sft", '{"prompt": "p", "response": "r"}\n'
     '{"prompt": "p", "response": "r", "prompt": "q"}\n',
     r"rows\.jsonl:2: key \"prompt\""),
    ("sft", '{"messages": [{"role": "user", "content": "a", "content": "b"},'
     ' {"role": "assistant", "content": "c"}]}\n',
     r"rows\.jsonl:1: key \"content\""),
    ("loglikelihood", '{"context": "a", "continuation": "b", "context": "c"}'
     "\n", r"--loglikelihood=\S*rows\.jsonl line 1: key \"context\""),
    ("benchmark", '{"task_id": "t", "prompt": "p", "task_id": "u"}\n',
     r"--benchmark_path=\S*rows\.jsonl line 1: key \"task_id\""),
])
def test_a_jsonl_row_with_a_repeated_key_is_refused(tmp_path, reader, body,
                                                     shown):
  """Python's json keeps a repeated key's last value without a word: an
  SFT row trained on it, a request or problem was read from it. Each
  reader of users' JSONL files names the file, the line and the key."""
  from trm.data.text import sft  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "rows.jsonl")
  with open(path, "w") as f:
    f.write(body)
  read = {"sft": sft.read_jsonl_pairs,
          "loglikelihood": likelihood.read_numbered_requests,
          "benchmark": lambda p: code_eval._read_jsonl(  # pylint: disable=protected-access
              p, "--benchmark_path")}[reader]
  with pytest.raises(ValueError, match=shown + r" appears twice in one "
                     r"object \(Python's json would keep the last value "
                     r"without a word\); remove one of them\.$"):
    read(path)
