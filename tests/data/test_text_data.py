"""nanoGPT-format text data: preparation, codecs, Grain window sources."""
import json
import os
import pickle
import subprocess
import sys
import threading
import types
import urllib.error

import grain
import numpy as np
import pytest
import repo
import workers

from trm.data import atomic_files
from trm.data.text import preparation
from trm.data.text import text_codecs
from trm.data.text import windows as text_lib

_SHAKESPEARE = os.path.join(repo.ROOT, "..", "shared",
                            "data", "tinyshakespeare", "input.txt")
_SAMPLE = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
           "All:\nSpeak, speak.\n") * 20


def _token_file(path, values):
  np.asarray(values, np.uint16).tofile(path)
  return str(path)


@pytest.fixture
def data_dir(tmp_path):
  """train.bin = 0..999, val.bin = 2000..2299: a window shows its split."""
  _token_file(tmp_path / "train.bin", np.arange(1000))
  _token_file(tmp_path / "val.bin", np.arange(2000, 2300))
  return tmp_path


# ----------------------------------------------------------------------------
# Preparation and codecs.


@pytest.mark.skipif(not os.path.isfile(_SHAKESPEARE),
                    reason="tinyshakespeare input.txt not available")
def test_prepare_char_tiny_shakespeare_matches_nanogpt(tmp_path):
  text = text_lib.read_text(_SHAKESPEARE)
  assert len(text) == 1_115_394
  meta = preparation.prepare_char(text, str(tmp_path))
  assert meta["vocab_size"] == 65
  assert (meta["train_tokens"], meta["val_tokens"]) == (1_003_854, 111_540)
  assert meta["tokenizer"] == "char" and meta["itos"]["0"] == "\n"
  assert meta["stoi"]["A"] == 13
  # meta.json is JSON and equals the returned dict; nothing else was left.
  assert preparation.load_meta(str(tmp_path)) == meta
  assert sorted(os.listdir(tmp_path)) == ["meta.json", "train.bin",
                                          "val.bin"]
  train = np.fromfile(tmp_path / "train.bin", np.uint16)
  val = np.fromfile(tmp_path / "val.bin", np.uint16)
  assert (train.size, val.size) == (1_003_854, 111_540)
  codec = preparation.codec_from_meta(meta)
  assert codec.decode(train) + codec.decode(val) == text


def test_prepare_char_reads_line_ends_as_nanogpt(tmp_path):
  """nanoGPT's prepare.py opens input.txt in text mode, so CRLF and lone CR
  line ends are LF to it: no '\r' token, the ids of the LF text (found by
  benchmarks/parity/upstream_nanogpt.py against its prepare.py)."""
  path = tmp_path / "input.txt"
  path.write_bytes(b"ab\r\nb\ra\n\r\nba\n")
  meta = preparation.prepare_char(text_lib.read_text(str(path)),
                                  str(tmp_path / "d"))
  assert meta["itos"] == {"0": "\n", "1": "a", "2": "b"}
  # "ab\nb\na\n\nba\n": 11 characters, int(11 * 0.9) = 9 for training.
  assert (meta["train_tokens"], meta["val_tokens"]) == (9, 2)
  ids = np.concatenate([np.fromfile(tmp_path / "d" / f, np.uint16)
                        for f in ("train.bin", "val.bin")])
  np.testing.assert_array_equal(ids, [1, 2, 0, 2, 0, 1, 0, 0, 2, 1, 0])


def test_prepare_char_split_and_roundtrip(tmp_path):
  meta = preparation.prepare_char(_SAMPLE, str(tmp_path / "d"))
  cut = int(len(_SAMPLE) * 0.9)
  codec = preparation.codec_from_meta(preparation.load_meta(str(tmp_path /
                                                                "d")))
  assert isinstance(codec, text_codecs.CharCodec)
  assert meta["vocab_size"] == len(set(_SAMPLE)) == codec.vocab_size
  train = np.fromfile(tmp_path / "d" / "train.bin", np.uint16)
  np.testing.assert_array_equal(train, codec.encode(_SAMPLE[:cut]))
  assert codec.decode(codec.encode("hear me speak.\n")) == "hear me speak.\n"
  # A list of characters works as itos too.
  assert text_codecs.CharCodec(sorted(set(_SAMPLE))).encode("a") == \
      codec.encode("a")
  with pytest.raises(ValueError, match=r"Character 'Z' is not in the "
                     r"\d+-character vocabulary"):
    codec.encode("Zebra")
  with pytest.raises(ValueError, match="Token id 999 is outside"):
    codec.decode([999])


def test_interrupted_prepare_leaves_no_meta(tmp_path, monkeypatch):
  out = str(tmp_path)
  preparation.prepare_char(_SAMPLE, out)
  assert preparation.is_prepared(out)
  real = atomic_files.atomic_write

  def dies_in_val(path, write_fn, mode="wb"):
    if path.endswith("val.bin"):
      def half_then_die(f):
        f.write(b"\0\0" * 10)
        raise KeyboardInterrupt
      write_fn = half_then_die
    return real(path, write_fn, mode)

  monkeypatch.setattr(atomic_files, "atomic_write", dies_in_val)
  with pytest.raises(KeyboardInterrupt):
    preparation.prepare_char(_SAMPLE + "!", out)
  # The old meta.json went first, so the half-updated directory does not
  # look prepared (nor, marked as being prepared, like nanoGPT's), and no
  # temp file is left.
  assert not preparation.is_prepared(out)
  assert sorted(os.listdir(tmp_path)) == [".preparing", "train.bin",
                                          "val.bin"]
  with pytest.raises(FileNotFoundError, match="missing meta.json"):
    preparation.load_meta(out)


def test_concurrent_prepares_of_one_directory_do_not_mix(tmp_path,
                                                        monkeypatch):
  """Two runs preparing one data directory at once from other texts (of
  one length): the second finished while the first was between train.bin
  and val.bin, and the first's meta.json then described the second's
  train.bin (another vocabulary: every id read as another character)."""
  out = str(tmp_path / "data")
  texts = {"first": tmp_path / "first.txt", "second": tmp_path / "second.txt"}
  texts["first"].write_text(_SAMPLE)
  texts["second"].write_text(_SAMPLE.upper())
  errors = workers.overlap(
      monkeypatch, atomic_files, "atomic_write",
      lambda path, *_: path.endswith("train.bin"),
      lambda name: text_lib.ensure_prepared(out, str(texts[name]), "char",
                                            process_index=0))
  meta = preparation.load_meta(out)
  codec = preparation.codec_from_meta(meta)
  train = np.fromfile(os.path.join(out, "train.bin"), np.uint16)
  assert codec.decode(train) == _SAMPLE[:len(train)]
  # The second waited for the first, then was refused as a rerun with
  # another text is (the same length, other bytes), the data untouched.
  assert list(errors) == ["second"]
  assert "holds other bytes of that size: another text" in str(
      errors["second"])


def test_an_empty_input_is_named(tmp_path):
  # It said "The input holds 0 characters" without naming which file.
  empty = tmp_path / "input.txt"
  empty.write_text("")
  with pytest.raises(ValueError, match=f"^{empty} holds 0 characters.*pass "
                     "a larger text"):
    text_lib.ensure_prepared(str(tmp_path / "d"), str(empty), "char",
                             process_index=0)
  assert not preparation.is_prepared(str(tmp_path / "d"))


def test_load_meta_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match=(
      r"missing train.bin, val.bin, meta.json.*python -m trm.data.text.windows "
      r"--input=PATH_OR_URL --out_dir=")):
    preparation.load_meta(str(tmp_path))
  preparation.prepare_char(_SAMPLE, str(tmp_path))
  _token_file(tmp_path / "val.bin", [1, 2, 3])
  with pytest.raises(ValueError, match="val.bin holds 3 tokens but"):
    preparation.load_meta(str(tmp_path))


def test_read_text_errors(tmp_path, monkeypatch):
  (tmp_path / "a.txt").write_text("héllo")
  assert text_lib.read_text(str(tmp_path / "a.txt")) == "héllo"
  with pytest.raises(FileNotFoundError, match="nope.txt does not exist"):
    text_lib.read_text(str(tmp_path / "nope.txt"))
  # A directory (or FIFO) was said not to exist.
  os.mkfifo(tmp_path / "fifo")
  for name in ("", "fifo"):
    with pytest.raises(FileNotFoundError, match=(
        f"^{tmp_path / name} is not a regular file \\(a directory, FIFO or "
        "device\\): pass a text file")):
      text_lib.read_text(str(tmp_path / name))
  (tmp_path / "latin1.txt").write_bytes("to be\nor n\xf6t".encode("latin1"))
  with pytest.raises(ValueError, match=r"latin1.txt: not UTF-8 text: byte "
                     r"0xf6 at offset 10 \(line 2\)"):
    text_lib.read_text(str(tmp_path / "latin1.txt"))

  def offline(*args, **kwargs):
    raise urllib.error.URLError("Temporary failure in name resolution")

  monkeypatch.setattr(text_lib.urllib.request, "urlopen", offline)
  with pytest.raises(ConnectionError, match=(
      "Could not download https://example.com/x.txt.*local path")):
    text_lib.read_text("https://example.com/x.txt")


def _tiny_bpe(path, special_tokens=()):
  """A byte-level BPE tokenizer.json trained on a few strings."""
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(
      add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=300, show_progress=False, special_tokens=list(special_tokens),
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator([_SAMPLE, "speak hear proceed"], trainer=trainer)
  tok.save(str(path))
  return tok


def test_prepare_bpe_with_tokenizer_json(tmp_path):
  tok = _tiny_bpe(tmp_path / "tokenizer.json")
  out = str(tmp_path / "bpe")
  # A directory holding tokenizer.json works as well as the file.
  meta = preparation.prepare_bpe(_SAMPLE, out, tokenizer=str(tmp_path))
  assert meta["tokenizer"] == str(tmp_path / "tokenizer.json")
  assert meta["vocab_size"] == tok.get_vocab_size() <= 300
  assert "model_vocab_size" not in meta  # not GPT-2's: the model fits it
  cut = int(len(_SAMPLE) * 0.9)
  train = np.fromfile(os.path.join(out, "train.bin"), np.uint16)
  val = np.fromfile(os.path.join(out, "val.bin"), np.uint16)
  assert (meta["train_tokens"], meta["val_tokens"]) == (train.size, val.size)
  assert train.size < cut  # Merges happened.
  codec = preparation.codec_from_meta(preparation.load_meta(out))
  assert codec.decode(train) == _SAMPLE[:cut]
  assert codec.decode(val) == _SAMPLE[cut:]
  assert codec.decode(codec.encode("hear me")) == "hear me"
  with pytest.raises(FileNotFoundError, match="neither 'char', 'gpt2'"):
    preparation.prepare_bpe(_SAMPLE, out, tokenizer=str(tmp_path / "no.json"))


def test_a_relative_tokenizer_in_meta_json_is_read_beside_it(
    tmp_path, monkeypatch):
  """A hand-written (or moved) meta.json naming its tokenizer.json
  relative to itself: it was read against the working directory, where
  another tokenizer.json decoded the ids as other text without a word."""
  data = tmp_path / "data"
  data.mkdir()
  _tiny_bpe(data / "tokenizer.json")
  preparation.prepare_bpe(_SAMPLE, str(data),
                          tokenizer=str(data / "tokenizer.json"))
  meta = json.loads((data / "meta.json").read_text())
  meta["tokenizer"] = "tokenizer.json"
  (data / "meta.json").write_text(json.dumps(meta))
  other = tmp_path / "elsewhere"
  other.mkdir()
  _tiny_bpe(other / "tokenizer.json", ["<|x|>"])  # other ids
  monkeypatch.chdir(other)
  loaded = preparation.load_meta(str(data))
  assert loaded["tokenizer"] == str(data / "tokenizer.json")
  train = np.fromfile(data / "train.bin", np.uint16)
  codec = preparation.codec_from_meta(loaded)
  assert codec.decode(train) == _SAMPLE[:int(len(_SAMPLE) * 0.9)]


def test_a_tokenizer_json_replaced_since_preparation_is_refused(tmp_path):
  """The tokenizer was compared by its path alone: another tokenizer.json
  put at that path (another model's) trained and sampled the prepared ids
  as if they were its own."""
  path = tmp_path / "tok" / "tokenizer.json"
  path.parent.mkdir()
  _tiny_bpe(path)
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = str(tmp_path / "bpe")
  meta = text_lib.ensure_prepared(out, str(src), str(path), process_index=0)
  assert text_lib.ensure_prepared(out, str(src), str(path),
                                  process_index=0) == meta
  _tiny_bpe(path, special_tokens=["<|another|>"])  # other ids
  with pytest.raises(ValueError, match=(
      f"was prepared with tokenizer='{path}' .* but that file has changed "
      "since")):
    text_lib.ensure_prepared(out, str(src), str(path), process_index=0)


def test_the_prepared_tokenizer_json_reached_another_way_is_the_same(
    tmp_path):
  """A tokenizer.json is the prepared one however it is reached (a hard
  link here; a bind mount or another case on macOS alike): it was refused
  as "prepared with tokenizer=... (another path)"."""
  path = tmp_path / "tok" / "tokenizer.json"
  path.parent.mkdir()
  _tiny_bpe(path)
  (tmp_path / "other").mkdir()
  os.link(path, tmp_path / "other" / "tokenizer.json")
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = str(tmp_path / "bpe")
  meta = text_lib.ensure_prepared(out, str(src), str(path), process_index=0)
  assert text_lib.ensure_prepared(
      out, str(src), str(tmp_path / "other" / "tokenizer.json"),
      process_index=0) == meta


def test_tokenizer_json_reads_special_token_text_as_text(tmp_path):
  """GPT-2's tokenizer.json (the offline stand-in for tokenizer='gpt2')
  encodes "<|endoftext|>" in the text as ordinary text, as tiktoken's
  encode_ordinary does for nanoGPT: not as the special token's id."""
  tok = _tiny_bpe(tmp_path / "tokenizer.json", ["<|endoftext|>"])
  eot = tok.token_to_id("<|endoftext|>")
  text = "First doc.<|endoftext|>Second doc.\n" * 30
  out = str(tmp_path / "bpe")
  preparation.prepare_bpe(text, out, tokenizer=str(tmp_path))
  ids = np.concatenate([np.fromfile(os.path.join(out, f), np.uint16)
                        for f in ("train.bin", "val.bin")])
  assert eot not in ids
  codec = preparation.codec_from_meta(preparation.load_meta(out))
  pieces = codec.encode("<|endoftext|>")
  assert len(pieces) > 1 and eot not in pieces
  assert codec.decode(codec.encode(text)) == text


def gpt2_standin_encoding():
  """A tiktoken encoding for tiktoken's 'gpt2' (whose files need the
  network once): bytes, GPT-2's split pattern, a few merges, and
  <|endoftext|> as its last id (263 of 264)."""
  tiktoken = pytest.importorskip("tiktoken")
  ranks = {bytes([b]): b for b in range(256)}
  for merge in (b"ea", b"pe", b"spe", b"ak", b"speak", b"ci", b" s"):
    ranks[merge] = len(ranks)
  return tiktoken.Encoding(
      "gpt2-standin",
      pat_str=(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+"""
               r"""| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""),
      mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})


def gpt2_sized_tokenizer_json(path) -> str:
  """A word-level tokenizer.json with GPT-2's 50257 ids (t0 .. t50255 and
  <|endoftext|>): a stand-in for a gpt2 download's, whose files are not
  here."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  vocab = {f"t{i}": i for i in range(50256)}
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
  tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tokenizer.add_special_tokens(["<|endoftext|>"])
  tokenizer.save(str(path))
  return str(path)


def test_gpt2_bpe_data_gives_a_new_model_nanogpts_50304_ids(tmp_path):
  """nanoGPT's data/shakespeare/prepare.py (tiktoken's GPT-2 BPE) writes
  no meta.pkl, so its train.py gives the model 50304 ids (50257 padded to
  a multiple of 64). The same text prepared here with GPT-2's BPE
  recorded only the data's 50257, and trm.main built a 50257-id model."""
  from trm.families.gpt import task as gpt_task  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  tokenizer = gpt2_sized_tokenizer_json(tmp_path / "tokenizer.json")
  text = " ".join(f"t{i % 997}" for i in range(3000))
  data = tmp_path / "data" / "bpe"
  meta = preparation.prepare_bpe(text, str(data), tokenizer=tokenizer)
  assert meta["vocab_size"] == 50257  # the data's ids
  config = config_lib.load_config("configs/gpt.py", "shakespeare_char_cpu")
  config_lib.set_values(config, {
      "data_root": str(tmp_path / "data"), "dataset": "bpe",
      "data.input": "", "data.tokenizer": tokenizer, "n_layer": 1,
      "n_head": 2, "n_embd": 16, "block_size": 8, "batch_size": 8,
      "eval_iters": 1})
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  gpt_task.build(config, str(tmp_path / "run"),
                 mesh_lib.ShardingContext.from_config(config))
  assert config.model.vocab_size == 50304


def test_prepare_bpe_with_tiktoken(tmp_path, monkeypatch):
  """tokenizer='gpt2' goes through tiktoken's get_encoding, here of a
  stand-in (`gpt2_standin_encoding`)."""
  tiktoken = pytest.importorskip("tiktoken")
  encoding = gpt2_standin_encoding()
  asked = []
  monkeypatch.setattr(tiktoken, "get_encoding",
                      lambda name: asked.append(name) or encoding)
  out = str(tmp_path / "bpe")
  meta = preparation.prepare_bpe(_SAMPLE, out, tokenizer="gpt2")
  assert asked == ["gpt2"]
  assert meta["tokenizer"] == "gpt2"
  assert meta["vocab_size"] == encoding.n_vocab == 264
  # A new model gets nanoGPT's 50304 ids for GPT-2's BPE, as its train.py
  # gives data/shakespeare (prepared by tiktoken, no meta.pkl).
  assert preparation.load_meta(out)["model_vocab_size"] == 50304
  cut = int(len(_SAMPLE) * 0.9)
  train = np.fromfile(os.path.join(out, "train.bin"), np.uint16)
  val = np.fromfile(os.path.join(out, "val.bin"), np.uint16)
  assert train.size < cut  # Merges happened.
  codec = preparation.codec_from_meta(preparation.load_meta(out))
  assert codec.decode(train) == _SAMPLE[:cut]
  assert codec.decode(val) == _SAMPLE[cut:]
  # encode_ordinary, as nanoGPT: special-token text is plain text.
  ids = codec.encode("speak<|endoftext|>")
  assert len(ids) > 2 and codec.decode(ids) == "speak<|endoftext|>"


def test_gpt2_without_tiktoken_says_what_to_do(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tiktoken", None)  # import fails
  with pytest.raises(text_codecs.TokenizerUnavailableError,
                     match=r"needs the `tiktoken` package.*tokenizer.json"):
    preparation.prepare_bpe(_SAMPLE, str(tmp_path))
  with pytest.raises(text_codecs.TokenizerUnavailableError):
    preparation.codec_from_meta({"tokenizer": "gpt2", "vocab_size": 50257})
  assert not os.listdir(tmp_path)


def test_gpt2_offline_and_vocab_limit(tmp_path, monkeypatch):
  def offline(name):
    raise ConnectionError("no network")

  fake = types.SimpleNamespace(get_encoding=offline)
  monkeypatch.setitem(sys.modules, "tiktoken", fake)
  with pytest.raises(text_codecs.TokenizerUnavailableError,
                     match=r"could not load the 'gpt2' encoding \(ConnectionError: "
                     r"no network\).*TIKTOKEN_CACHE_DIR.*--tokenizer=.*"
                     r"tokenizer.json"):
    preparation.prepare_bpe(_SAMPLE, str(tmp_path))

  class Huge:
    n_vocab = 100_000

    def encode_ordinary(self, s):
      return [ord(c) for c in s]

  fake.get_encoding = lambda name: Huge()
  with pytest.raises(ValueError, match="100000 tokens, more than the 65536"):
    preparation.prepare_bpe(_SAMPLE, str(tmp_path))
  Huge.n_vocab = 50257
  meta = preparation.prepare_bpe(_SAMPLE, str(tmp_path))
  assert meta["tokenizer"] == "gpt2" and meta["vocab_size"] == 50257


def test_ensure_prepared(tmp_path):
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = str(tmp_path / "d")
  with pytest.raises(FileNotFoundError, match="python -m trm.data.text.windows"):
    text_lib.ensure_prepared(out, "", "char")
  meta = text_lib.ensure_prepared(out, str(src), "char", process_index=0)
  assert meta["vocab_size"] == len(set(_SAMPLE))
  # meta.json records the arguments that made the directory.
  assert meta["input"] == str(src) and meta["tokenizer"] == "char"
  assert meta["input_bytes"] == len(_SAMPLE.encode("utf-8"))
  # Prepared: no input needed, nothing is prepared again.
  assert text_lib.ensure_prepared(out, "", "char") == meta
  assert text_lib.ensure_prepared(out, str(src), "char") == meta
  # Another tokenizer, or another local text, is refused in one line naming
  # the field; the directory is left as it was.
  before = {f: (tmp_path / "d" / f).read_bytes() for f in os.listdir(out)}
  with pytest.raises(ValueError) as info:
    text_lib.ensure_prepared(out, str(src), "gpt2")
  assert ("prepared with tokenizer='char'" in str(info.value)
          and "config.data.tokenizer='gpt2'" in str(info.value))
  other = tmp_path / "other.txt"
  other.write_text(_SAMPLE * 2)
  with pytest.raises(ValueError) as info:
    text_lib.ensure_prepared(out, str(other), "char")
  assert "config.data.input=" in str(info.value)
  assert "\n" not in str(info.value)
  assert {f: (tmp_path / "d" / f).read_bytes()
          for f in os.listdir(out)} == before


def test_another_text_of_the_same_size_is_not_taken_for_the_prepared_one(
    tmp_path):
  """The input was compared by its size alone: a text of the same length
  (another seed's generated corpus, or the prepared file edited in place)
  trained on the old tokens without a word. A copy is still the text."""
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = str(tmp_path / "d")
  meta = text_lib.ensure_prepared(out, str(src), "char", process_index=0)
  before = {f: (tmp_path / "d" / f).read_bytes() for f in os.listdir(out)}
  copy = tmp_path / "copy.txt"
  copy.write_text(_SAMPLE)
  assert text_lib.ensure_prepared(out, str(copy), "char",
                                  process_index=0) == meta
  same_size = tmp_path / "other.txt"
  same_size.write_text(_SAMPLE[::-1])
  for other in (same_size, src):
    if other == src:  # edited in place, its length kept
      src.write_text(_SAMPLE[::-1])
    with pytest.raises(ValueError) as info:
      text_lib.ensure_prepared(out, str(other), "char", process_index=0)
    assert (f"config.data.input='{other}' holds other bytes of that size: "
            "another text") in str(info.value)
  assert {f: (tmp_path / "d" / f).read_bytes()
          for f in os.listdir(out)} == before


def test_a_directory_nanogpt_prepared_is_read_as_nanogpt_reads_it(
    tmp_path, monkeypatch):
  """nanoGPT's prepare.py writes train.bin, val.bin and (characters)
  meta.pkl, no meta.json: that vocabulary is used (or, without meta.pkl,
  GPT-2's BPE and nanoGPT's 50304), and the directory is neither prepared
  over nor its input downloaded."""
  chars = sorted(set(_SAMPLE))
  stoi = {ch: i for i, ch in enumerate(chars)}
  cut = int(len(_SAMPLE) * 0.9)
  d = tmp_path / "shakespeare_char"
  d.mkdir()
  _token_file(d / "train.bin", [stoi[c] for c in _SAMPLE[:cut]])
  _token_file(d / "val.bin", [stoi[c] for c in _SAMPLE[cut:]])
  with open(d / "meta.pkl", "wb") as f:  # as nanoGPT's prepare.py dumps it
    pickle.dump({"vocab_size": len(chars), "stoi": stoi,
                 "itos": dict(enumerate(chars))}, f)
  before = {f: (d / f).read_bytes() for f in os.listdir(d)}
  monkeypatch.setattr(text_lib, "read_text", None)  # nothing is read
  meta = text_lib.ensure_prepared(str(d), text_lib.TINY_SHAKESPEARE_URL,
                                  "char", process_index=0)
  assert {f: (d / f).read_bytes() for f in os.listdir(d)} == before
  assert meta["vocab_size"] == len(chars) and meta["tokenizer"] == "char"
  codec = preparation.codec_from_meta(meta)
  assert codec.decode(np.fromfile(d / "val.bin", np.uint16)) == \
      _SAMPLE[cut:]
  # data/openwebtext or data/shakespeare: no meta.pkl, GPT-2's BPE.
  os.remove(d / "meta.pkl")
  # Its ids are GPT-2's 50257 (GPT-2's weights fit); a new model gets 50304.
  assert text_lib.ensure_prepared(str(d), "", "char") == {
      "vocab_size": 50257, "model_vocab_size": 50304, "tokenizer": "gpt2",
      "nanogpt": True, "train_tokens": cut, "val_tokens": len(_SAMPLE) - cut,
      "input": str(d)}
  # A meta.pkl that names code is refused unread.
  with open(d / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": 1, "itos": {0: "a"}, "x": os.getcwd}, f)
  with pytest.raises(ValueError, match=(
      r"meta.pkl cannot be read as plain data \(it names posix.getcwd\): it "
      r"must be the meta.pkl of nanoGPT's data/shakespeare_char/prepare.py")):
    preparation.load_meta(str(d))


def test_a_nanogpt_meta_pkl_of_vocab_size_alone_trains(tmp_path):
  """nanoGPT's train.py reads only meta.pkl's vocab_size, so a data set of
  one's own token ids ships {'vocab_size': N} (nanoGPT issues #141, #401):
  it trains there, with a model of N ids. It was refused here ("does not
  hold a character vocabulary"). Sampling has no tokenizer for it (nor has
  nanoGPT's sample.py): one line."""
  d = tmp_path / "custom"
  d.mkdir()
  ids = np.random.default_rng(0).integers(0, 1000, 400)
  _token_file(d / "train.bin", ids[:300])
  _token_file(d / "val.bin", ids[300:])
  with open(d / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": 1000}, f)
  meta = text_lib.ensure_prepared(str(d), "", "char")
  assert meta == {"vocab_size": 1000, "nanogpt": True, "train_tokens": 300,
                  "val_tokens": 100, "input": str(d)}
  windows = text_lib.TokenWindows(str(d / "train.bin"), 8, 4, seed=0,
                                  vocab_size=meta["vocab_size"])
  assert int(windows[0]["x"].max()) < 1000
  with pytest.raises(ValueError, match=(
      r"^the data's meta.pkl records only vocab_size=1000 \(token ids of "
      r"your own\), no tokenizer")):
    preparation.codec_from_meta(meta)
  # Still plain data and a usable size only (a pickled int was a TypeError,
  # "argument of type 'int' is not iterable").
  for bad in ({"vocab_size": True}, {"vocab_size": 2**16 + 1}, {}, 5):
    with open(d / "meta.pkl", "wb") as f:
      pickle.dump(bad, f)
    with pytest.raises(ValueError, match="does not hold a character "
                       "vocabulary"):
      preparation.load_meta(str(d))


@pytest.mark.parametrize("kind", ["file", "link_loop", "link_to_file"])
def test_a_data_dir_that_is_no_directory_is_one_line(tmp_path, kind):
  """os.makedirs said only "[Errno 17] File exists" of a file or a link
  loop where the data directory belongs."""
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = tmp_path / "d"
  if kind == "file":
    out.write_text("x")
  elif kind == "link_loop":
    out.symlink_to("d")
  else:
    out.symlink_to(src)
  with pytest.raises(NotADirectoryError) as e:
    text_lib.ensure_prepared(str(out), str(src), "char", process_index=0)
  assert str(e.value).startswith(
      f"{out} (config.data_root/config.dataset) is a ")
  assert "not a directory" in str(e.value)
  assert src.read_text() == _SAMPLE  # a link to the input: untouched


@pytest.mark.parametrize("with_input", [True, False])
def test_a_remote_data_dir_is_one_line_and_nothing_local(
    tmp_path, monkeypatch, with_input):
  """config.data_root=gs://...: with an input it was prepared into a local
  directory "gs:" (the run trained on it, rc 0), without one it was said
  to lack train.bin; .bin data is memory-mapped from local disk."""
  monkeypatch.chdir(tmp_path)
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  with pytest.raises(ValueError, match=(
      "^gs://bucket/data/sc \\(config.data_root/config.dataset\\) is a "
      "remote path, but datasets are prepared on")):
    text_lib.ensure_prepared("gs://bucket/data/sc",
                             str(src) if with_input else "", "char",
                             process_index=0)
  assert not os.path.exists(tmp_path / "gs:")


def test_data_paths_under_home_are_expanded_as_the_workdir_is(
    tmp_path, monkeypatch):
  """`--config.data_root=~/data` reached trm.main as typed (the shell
  expands a leading ~ only): the data was prepared into a folder named '~'
  in the current one, and the run went on (rc 0)."""
  import configs.gpt  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from trm.core import cli  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  monkeypatch.setenv("HOME", str(tmp_path))
  config = configs.gpt.get_config("shakespeare_char_cpu")
  config.data_root = "~/data"
  config.data.input = "~/input.txt"
  config.data.tfds.data_dir = "~"
  config.wandb_run_name = "a~/b"  # not a path under home: kept
  cli.expand_home_paths(config)
  assert config.data_root == str(tmp_path / "data")
  assert config.data.input == str(tmp_path / "input.txt")
  assert config.data.tfds.data_dir == str(tmp_path)
  assert config.wandb.name == config.wandb_run_name == "a~/b"


def test_a_dangling_data_dir_link_is_prepared_where_it_points(tmp_path):
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  (tmp_path / "d").symlink_to("target")
  text_lib.ensure_prepared(str(tmp_path / "d"), str(src), "char",
                           process_index=0)
  assert (tmp_path / "target" / "meta.json").is_file()


def test_ensure_prepared_other_processes_wait(tmp_path):
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = str(tmp_path / "d")
  with pytest.raises(TimeoutError, match="waited 0s for process 0"):
    text_lib.ensure_prepared(out, str(src), "char", process_index=1,
                             timeout_s=0.2, poll_s=0.05)
  assert not os.path.exists(out)  # Process 1 never writes.
  result = {}
  waiter = threading.Thread(target=lambda: result.update(
      text_lib.ensure_prepared(out, str(src), "char", process_index=1,
                               timeout_s=30, poll_s=0.02)))
  waiter.start()
  meta = text_lib.ensure_prepared(out, str(src), "char", process_index=0)
  waiter.join(30)
  assert result == meta


def test_cli(tmp_path):
  src = tmp_path / "input.txt"
  src.write_text(_SAMPLE)
  out = tmp_path / "d"
  proc = subprocess.run(
      [sys.executable, "-m", "trm.data.text.windows", f"--input={src}",
       f"--out_dir={out}"], capture_output=True, text=True, check=True,
      cwd=repo.ROOT)
  cut = int(len(_SAMPLE) * 0.9)
  assert f"vocab size {len(set(_SAMPLE))}" in proc.stdout
  assert f"train: {cut:,} tokens" in proc.stdout
  assert "meta.json" in proc.stdout
  assert json.loads((out / "meta.json").read_text())["tokenizer"] == "char"


def test_cli_never_prepares_over_another_dataset_unless_told(tmp_path):
  """`--out_dir` holding nanoGPT's train.bin / val.bin (hours of
  openwebtext's preparation) or ours from another input was overwritten
  without a word; the same input and tokenizer are prepared again."""
  src, other = tmp_path / "input.txt", tmp_path / "other.txt"
  src.write_text(_SAMPLE)
  other.write_text(_SAMPLE[::-1])
  nano = tmp_path / "nano"
  nano.mkdir()
  (nano / "train.bin").write_bytes(b"\1\0" * 50)
  (nano / "val.bin").write_bytes(b"\1\0" * 5)

  def prepare(out, source, *flags):
    return subprocess.run(
        [sys.executable, "-m", "trm.data.text.windows", f"--input={source}",
         f"--out_dir={out}", *flags], capture_output=True, text=True,
        cwd=repo.ROOT)

  refused = prepare(nano, src)
  assert refused.returncode == 2
  assert (f"--out_dir={nano} already holds nanoGPT's train.bin and val.bin "
          "(no meta.json); pass --overwrite to replace it, or another "
          "--out_dir.") in refused.stderr
  assert (nano / "train.bin").read_bytes() == b"\1\0" * 50
  ours = tmp_path / "ours"
  assert prepare(ours, src).returncode == 0
  assert prepare(ours, src).returncode == 0  # the same input: again
  refused = prepare(ours, other)
  assert refused.returncode == 2
  assert f"already holds a dataset prepared from {str(src)!r}" in (
      refused.stderr)
  assert prepare(ours, other, "--overwrite").returncode == 0
  assert json.loads((ours / "meta.json").read_text())["input"] == str(other)


def test_cli_expands_a_leading_tilde(tmp_path):
  """`--out_dir=~/sc` reached the CLI as typed (the shell expands a ~ only
  at the start of a word): a folder named '~' in the current one."""
  home = tmp_path / "home"
  home.mkdir()
  (home / "input.txt").write_text(_SAMPLE)
  subprocess.run(
      [sys.executable, "-m", "trm.data.text.windows", "--input=~/input.txt",
       "--out_dir=~/sc"], capture_output=True, text=True, check=True,
      cwd=tmp_path, env=dict(os.environ, HOME=str(home), PYTHONPATH=(
          os.pathsep.join([str(repo.ROOT), os.environ.get("PYTHONPATH", "")]))))
  assert (home / "sc" / "meta.json").is_file()
  assert not (tmp_path / "~").exists()


# ----------------------------------------------------------------------------
# Grain sources.


def test_token_windows_deterministic_and_shifted(data_dir):
  path = str(data_dir / "train.bin")
  src = text_lib.TokenWindows(path, block_size=8, global_batch_size=6, seed=3)
  batch = src[5]
  assert batch["x"].shape == batch["y"].shape == (6, 8)
  assert batch["x"].dtype == np.int32
  np.testing.assert_array_equal(batch["y"][:, :-1], batch["x"][:, 1:])
  # train.bin holds 0..999, so a window's first token is its offset.
  offsets = src.global_offsets(5)
  np.testing.assert_array_equal(batch["x"][:, 0], offsets)
  np.testing.assert_array_equal(batch["y"][:, -1], offsets + 8)
  again = text_lib.TokenWindows(path, 8, 6, seed=3)[5]
  np.testing.assert_array_equal(again["x"], batch["x"])
  assert not np.array_equal(src[6]["x"], batch["x"])
  assert not np.array_equal(
      text_lib.TokenWindows(path, 8, 6, seed=4)[5]["x"], batch["x"])
  # Offsets cover [0, N - block) and never beyond.
  all_offsets = np.concatenate([src.global_offsets(k) for k in range(400)])
  assert all_offsets.min() == 0 and all_offsets.max() == 1000 - 8 - 1
  assert len(src) == text_lib.ENDLESS
  assert len(text_lib.TokenWindows(path, 8, 6, 3, num_batches=7)) == 7
  with pytest.raises(IndexError):
    text_lib.TokenWindows(path, 8, 6, 3, num_batches=7)[7]


def test_token_windows_process_slices_make_the_global_batch(data_dir):
  path = str(data_dir / "train.bin")
  whole = text_lib.TokenWindows(path, 16, 8, seed=0)[2]
  parts = [text_lib.TokenWindows(path, 16, 8, seed=0, process_index=p,
                                 process_count=2)[2] for p in range(2)]
  assert parts[0]["x"].shape == (4, 16)
  for key in ("x", "y"):
    np.testing.assert_array_equal(
        np.concatenate([p[key] for p in parts]), whole[key])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_a_bin_of_wider_ids_is_refused(tmp_path, dtype):
  """A prepare script of one's own that forgets dtype=np.uint16
  (`np.array(ids).tofile`, int64) writes ids that read as uint16 with a 0
  at every second position: trm.main (as nanoGPT's memmap) trained on
  that silently (a char run's loss fell to 3.42, every second target
  '\\n'). Refused now, before the step is compiled."""
  ids = np.random.default_rng(0).integers(1, 65, 5000)
  path = str(tmp_path / "train.bin")
  np.asarray(ids, dtype).tofile(path)
  with pytest.raises(ValueError, match=(
      "train.bin reads as uint16 token ids with a 0 at every second "
      "position: it holds 32- or 64-bit ids")):
    text_lib.TokenWindows(path, 8, 4, seed=0)
  _token_file(path, ids)  # the same ids as uint16 are read
  assert text_lib.TokenWindows(path, 8, 4, seed=0)[0]["x"].shape == (4, 8)


def test_a_prepared_text_whose_lowest_id_is_every_second_one_is_read(
    tmp_path):
  """One character a line: '\\n' (id 0) at every second position, as a
  file of 32-bit ids reads. The width check refused the preparation's own
  uint16 files (its fix said to prepare them again); their count in
  meta.json settles the width, and a wider file put in their place is
  still refused, by that count."""
  rng = np.random.default_rng(0)
  text = "".join(c + "\n" for c in rng.choice(list("ACGT"), 5000))
  out = str(tmp_path / "d")
  preparation.prepare_char(text, out)
  path = os.path.join(out, "train.bin")
  batch = text_lib.TokenWindows(path, 8, 4, seed=0)[0]
  assert batch["x"].shape == (4, 8)
  ids = np.fromfile(path, np.uint16)
  assert not ids[1::2].any() and ids[::2].all()  # the pattern refused before
  ids.astype(np.int32).tofile(path)
  with pytest.raises(ValueError, match="train.bin holds 18000 tokens but .*"
                     "meta.json records 9000"):
    text_lib.TokenWindows(path, 8, 4, seed=0)


def test_token_windows_pickle_and_repr(data_dir):
  path = str(data_dir / "train.bin")
  src = text_lib.TokenWindows(path, 8, 4, seed=1, process_index=1,
                              process_count=2)
  first = src[0]  # Opens the memmap.
  blob = pickle.dumps(src)
  assert len(blob) < 1000  # The 2000-byte token array is not in it.
  clone = pickle.loads(blob)
  np.testing.assert_array_equal(clone[0]["x"], first["x"])
  assert repr(clone) == repr(src) == (
      f"TokenWindows(path={path!r}, block_size=8, global_batch_size=4, "
      "seed=1, process_index=1, process_count=2)")


def test_token_windows_in_grain_resumes(data_dir):
  src = text_lib.TokenWindows(str(data_dir / "train.bin"), 8, 4, seed=7)

  def make():
    return iter(grain.MapDataset.source(src).to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=2)))

  it = make()
  for k in range(3):
    np.testing.assert_array_equal(next(it)["x"], src[k]["x"])
  state = it.get_state()
  expected = [next(it) for _ in range(3)]
  resumed = make()
  resumed.set_state(state)
  for batch in expected:
    got = next(resumed)
    for key in ("x", "y"):
      np.testing.assert_array_equal(got[key], batch[key])


def test_token_windows_name_their_stream(data_dir, monkeypatch):
  """A position saved over one train.bin is refused over another (a
  re-prepared text); the fingerprint reads a long file at evenly spread
  blocks only, and sees a change in them or in the length."""
  from trm.core import pipeline  # pylint: disable=g-import-not-at-top
  path = data_dir / "train.bin"

  def replace(values):
    # A new file renamed into place, as preparation writes: the old one
    # may still be mapped by an earlier source.
    os.replace(_token_file(data_dir / "new.bin", values), path)
    return str(path)

  def windows():
    return text_lib.TokenWindows(str(path), 8, 4, seed=7, vocab_size=4000)

  first = pipeline.grain_iterator(windows(), prefetch=0)
  next(first)
  state = first.get_state()
  pipeline.grain_iterator(windows(), prefetch=0).set_state(state)  # same
  replace(np.arange(1000)[::-1])
  with pytest.raises(ValueError, match=r"^the training data \(config.data's "
                     r"files\) is not what it was trained on"):
    pipeline.grain_iterator(windows(), prefetch=0).set_state(state)
  # Long files: blocks of 10 tokens at 4 places (0, 330, 660, 990).
  monkeypatch.setattr(text_lib, "_FINGERPRINT_BLOCKS", 4)
  monkeypatch.setattr(text_lib, "_FINGERPRINT_TOKENS", 10)
  def fingerprint(values):
    return text_lib.TokenFile(replace(values)).fingerprint()
  tokens = np.arange(1000)
  sampled = fingerprint(tokens)
  tokens[335] = 7  # inside a block
  assert fingerprint(tokens) != sampled
  tokens[335], tokens[500] = 335, 7  # between blocks: not read
  assert fingerprint(tokens) == sampled
  assert fingerprint(tokens[:999]) != sampled

def test_token_windows_errors(data_dir):
  path = str(data_dir / "val.bin")  # 300 tokens
  with pytest.raises(ValueError, match=(
      r"val.bin holds 300 tokens, fewer than config.block_size \+ 1 = 301")):
    text_lib.TokenWindows(path, 300, 4, seed=0)
  assert text_lib.TokenWindows(path, 299, 4, seed=0)[0]["x"][0, 0] == 2000
  with pytest.raises(ValueError, match="Global batch 6 is not divisible by "
                     "the 4 processes"):
    text_lib.TokenWindows(path, 8, 6, seed=0, process_count=4)
  with pytest.raises(FileNotFoundError, match="missing.bin does not exist"):
    text_lib.TokenWindows(str(data_dir / "missing.bin"), 8, 4, seed=0)
  (data_dir / "odd.bin").write_bytes(b"abc")
  with pytest.raises(ValueError, match="odd size"):
    text_lib.TokenWindows(str(data_dir / "odd.bin"), 1, 1, seed=0)


def test_eval_windows(data_dir):
  ev = text_lib.EvalWindows(str(data_dir), block_size=8, global_batch_size=4,
                            eval_iters=3, seed=0)
  assert len(ev) == 6
  for k in range(6):
    batch = ev[k]
    split = int(k >= 3)
    np.testing.assert_array_equal(batch["split"], [split] * 4)
    assert batch["split"].dtype == np.int32
    # Train windows come from 0..999, val windows from 2000..2299.
    assert ((batch["x"] >= 2000) == bool(split)).all()
    np.testing.assert_array_equal(batch["y"][:, :-1], batch["x"][:, 1:])
  # Fixed per k, and apart from the training batches of the same seed.
  again = text_lib.EvalWindows(str(data_dir), 8, 4, 3, seed=0)
  np.testing.assert_array_equal(again[1]["x"], ev[1]["x"])
  train = text_lib.TokenWindows(str(data_dir / "train.bin"), 8, 4, seed=0)
  assert not any(np.array_equal(train[k]["x"], ev[j]["x"])
                 for k in range(4) for j in range(3))
  halves = [text_lib.EvalWindows(str(data_dir), 8, 4, 3, seed=0,
                                 process_index=p, process_count=2)[4]
            for p in range(2)]
  np.testing.assert_array_equal(
      np.concatenate([h["x"] for h in halves]), ev[4]["x"])
  assert len(pickle.dumps(ev)) < 1000
  with pytest.raises(ValueError, match=r"val.bin holds 300 tokens"):
    text_lib.EvalWindows(str(data_dir), 400, 4, 3, seed=0)
