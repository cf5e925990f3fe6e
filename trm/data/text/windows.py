"""Plain-text language-modelling data in nanoGPT's format, served by Grain.

Preparation (`prepare_char`, `prepare_bpe`, or the CLI) follows nanoGPT's
`data/shakespeare_char/prepare.py` and `data/shakespeare/prepare.py`: the
first 90% of the text's characters are the training split, the last 10% the
validation split, each stored as a flat `np.uint16` token stream
(`train.bin`, `val.bin`) next to a `meta.json` (JSON rather than nanoGPT's
pickle, so reading a data directory never runs code).

    python -m trm.data.text.windows --input=PATH_OR_URL --out_dir=DIR \
        [--tokenizer=char|gpt2|PATH/tokenizer.json]

Serving (`TokenWindows`, `EvalWindows`) is nanoGPT's `get_batch` recast as a
random-access Grain source, like the other pipelines here: item k is THIS
process's rows of global batch k, and the batch is a pure function of
(seed, k). The Grain iterator's position is therefore all a checkpoint needs
to resume the exact stream, on any number of processes whose rows add up to
the same global batch.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Sequence

import numpy as np
from absl import app
from absl import flags
from absl import logging

from trm.core import cli
from trm.data import io as data_io
from trm.data.puzzles import format as puzzle_format

TINY_SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/"
                        "master/data/tinyshakespeare/input.txt")

TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
META_FILE = "meta.json"
TRAIN_FRACTION = 0.9
# The .bin files hold uint16 ids, so a vocabulary may have at most this many.
MAX_VOCAB = 2**16
# `TokenWindows` without `num_batches`: Grain needs a length, and batches are
# drawn with replacement, so any k is as good as another. 2**62 is endless in
# practice and still a valid Python/NumPy index (Grain was checked with it).
ENDLESS = 2**62
# Fourth word of the evaluation seeds, [seed, split, j, _EVAL_STREAM]. NumPy's
# SeedSequence pads short entropy with zeros, so e.g. [seed, 1] and
# [seed, 1, 0] give the same stream; training's [seed, k] has a zero fourth
# word for every k < 2**64 (seed < 2**32), hence a non-zero one here keeps
# evaluation windows apart from every training batch.
_EVAL_STREAM = 0x6576616C  # "eval"

_CLI_HINT = "python -m trm.data.text.windows --input=PATH_OR_URL --out_dir={}"


class TokenizerUnavailableError(cli.UserError, RuntimeError):
  """The requested BPE tokenizer cannot be loaded here (e.g. offline)."""


# ----------------------------------------------------------------------------
# Reading the text.


def read_text(source: str) -> str:
  """The text of a local file, or of an http(s) URL (downloaded)."""
  if source.startswith(("http://", "https://")):
    try:
      with urllib.request.urlopen(source, timeout=60) as response:
        return data_io.decode_utf8(response.read(), source)
    except (urllib.error.URLError, OSError) as e:
      raise ConnectionError(
          f"Could not download {source} ({e}). If this machine is offline, "
          "fetch the file elsewhere and pass its local path instead, e.g. "
          "--input=/path/to/input.txt.") from e
  if not os.path.isfile(source):
    raise FileNotFoundError(f"{source} does not exist: pass a text file or "
                            "an http(s) URL as the input.")
  return data_io.read_utf8(source)


# ----------------------------------------------------------------------------
# Codecs.


class CharCodec:
  """Characters <-> ids of a `prepare_char` vocabulary."""

  def __init__(self, itos):
    # meta.json keys are strings; a plain list of characters also works.
    if isinstance(itos, dict):
      itos = {int(i): ch for i, ch in itos.items()}
    else:
      itos = dict(enumerate(itos))
    self.itos = itos
    self.stoi = {ch: i for i, ch in itos.items()}
    self.vocab_size = len(itos)

  def encode(self, text: str) -> list[int]:
    try:
      return [self.stoi[ch] for ch in text]
    except KeyError as e:
      raise ValueError(
          f"Character {e.args[0]!r} is not in the {self.vocab_size}-character "
          "vocabulary of this data set; use only characters of the text it "
          "was prepared from.") from None

  def decode(self, ids) -> str:
    try:
      return "".join(self.itos[int(i)] for i in ids)
    except KeyError as e:
      raise ValueError(f"Token id {e.args[0]} is outside the "
                       f"{self.vocab_size}-character vocabulary.") from None


class TiktokenCodec:
  """tiktoken's GPT-2 BPE (what nanoGPT's data/shakespeare uses)."""

  def __init__(self, name: str = "gpt2"):
    self.encoding = _tiktoken_encoding(name)
    self.vocab_size = self.encoding.n_vocab

  def encode(self, text: str) -> list[int]:
    # encode_ordinary: special-token text such as "<|endoftext|>" is encoded
    # as ordinary text, as nanoGPT does.
    return self.encoding.encode_ordinary(text)

  def decode(self, ids) -> str:
    return self.encoding.decode([int(i) for i in ids])


class HFTokenizerCodec:
  """A Hugging Face `tokenizer.json` (e.g. from a gpt2 checkpoint dir)."""

  def __init__(self, path: str):
    path = _tokenizer_file(path)
    try:
      import tokenizers  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise TokenizerUnavailableError(
          f"Reading {path} needs the `tokenizers` package: pip install "
          "tokenizers.") from e
    self.path = path
    self.tokenizer = tokenizers.Tokenizer.from_file(path)
    self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

  def encode(self, text: str) -> list[int]:
    # No BOS/EOS templates: the text is one continuous stream, as with
    # tiktoken's encode_ordinary.
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def decode(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids],
                                 skip_special_tokens=False)


def _tiktoken_encoding(name: str):
  alternative = ("Alternatively pass tokenizer=<path to a Hugging Face "
                 "tokenizer.json> (e.g. the tokenizer.json of a gpt2 "
                 "checkpoint directory, --tokenizer=/path/to/gpt2/"
                 "tokenizer.json), which uses the `tokenizers` library and "
                 "works offline.")
  try:
    import tiktoken  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise TokenizerUnavailableError(
        f"tokenizer={name!r} needs the `tiktoken` package, which is not "
        f"installed (pip install tiktoken). {alternative}") from e
  try:
    return tiktoken.get_encoding(name)
  except Exception as e:  # pylint: disable=broad-except
    # tiktoken downloads its BPE files on first use (cached under
    # TIKTOKEN_CACHE_DIR), so offline machines fail here with a network error.
    raise TokenizerUnavailableError(
        f"tiktoken could not load the {name!r} encoding ({e}); it downloads "
        "its files on first use, so offline it needs a filled "
        f"TIKTOKEN_CACHE_DIR. {alternative}") from e


def _tokenizer_file(path: str) -> str:
  """The tokenizer.json at `path` (a file, or a directory holding one)."""
  if os.path.isdir(path):
    path = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"Tokenizer file {path} does not exist: pass tokenizer='char', "
        "'gpt2' or the path of a Hugging Face tokenizer.json.")
  return path


def _bpe_codec(tokenizer: str):
  if tokenizer == "gpt2":
    return TiktokenCodec("gpt2")
  if tokenizer == "char":
    raise ValueError("tokenizer='char' is not a BPE tokenizer: use "
                     "prepare_char.")
  if not os.path.exists(tokenizer):
    raise FileNotFoundError(
        f"tokenizer={tokenizer!r} is neither 'char', 'gpt2' nor an existing "
        "path of a Hugging Face tokenizer.json (or a directory holding one).")
  return HFTokenizerCodec(tokenizer)


def codec_from_meta(meta: dict):
  """The codec (`encode(str) -> list[int]`, `decode(ids) -> str`) that
  produced a prepared data set, from its meta.json."""
  tokenizer = meta.get("tokenizer", "char" if "itos" in meta else None)
  if tokenizer == "char":
    return CharCodec(meta["itos"])
  if tokenizer is None:
    raise ValueError("meta.json names no tokenizer and holds no character "
                     "vocabulary (itos); re-run " + _CLI_HINT.format("DIR"))
  return _bpe_codec(tokenizer)


# ----------------------------------------------------------------------------
# Preparation.


def _split_text(text: str) -> tuple[str, str]:
  n = len(text)
  if n < 2:
    raise ValueError(f"The input holds {n} characters; it needs at least 2 "
                     "(one for each split), and in practice far more.")
  cut = int(n * TRAIN_FRACTION)
  return text[:cut], text[cut:]


def _check_vocab_fits(vocab_size: int, tokenizer: str) -> None:
  if vocab_size > MAX_VOCAB:
    raise ValueError(
        f"tokenizer={tokenizer!r} has {vocab_size} tokens, more than the "
        f"{MAX_VOCAB} ids a uint16 .bin file can hold; use a smaller "
        "vocabulary (GPT-2's 50257 fits).")


def _write(out_dir: str, train_ids, val_ids, meta: dict) -> dict:
  """Writes train.bin, val.bin, then meta.json, each atomically.

  meta.json goes last and an old one is removed first, so its presence means
  that both .bin files beside it are complete and belong to it, even if an
  earlier preparation was interrupted. The token counts it records let
  `load_meta` catch .bin files replaced by hand.
  """
  os.makedirs(out_dir, exist_ok=True)
  meta_path = os.path.join(out_dir, META_FILE)
  if os.path.exists(meta_path):
    os.remove(meta_path)
  counts = {}
  for name, ids in ((TRAIN_FILE, train_ids), (VAL_FILE, val_ids)):
    array = np.asarray(ids, dtype=np.uint16)
    puzzle_format.atomic_write(os.path.join(out_dir, name), array.tofile)
    counts[name.split(".")[0] + "_tokens"] = int(array.size)
  meta = {**meta, **counts}
  puzzle_format.write_json_atomic(meta_path, meta)
  return meta


def char_splits(text: str) -> tuple[dict, list[int], list[int]]:
  """(meta, train ids, val ids) of nanoGPT's shakespeare_char preparation:
  the vocabulary is every character of the whole text, the split 90/10 by
  characters. Shared by `prepare_char` and the TFDS builder, so both give
  the same token streams."""
  train_text, val_text = _split_text(text)
  chars = sorted(set(text))
  _check_vocab_fits(len(chars), "char")
  itos = {str(i): ch for i, ch in enumerate(chars)}
  codec = CharCodec(itos)
  meta = {"vocab_size": len(chars), "itos": itos,
          "stoi": {ch: i for i, ch in enumerate(chars)}, "tokenizer": "char"}
  return meta, codec.encode(train_text), codec.encode(val_text)


def prepare_char(text: str, out_dir: str) -> dict:
  """nanoGPT's shakespeare_char preparation: one token per character.

  Returns the meta.json contents: vocab_size, itos ({"0": "\\n", ...}),
  stoi, tokenizer="char", and the train_tokens/val_tokens counts.
  """
  meta, train_ids, val_ids = char_splits(text)
  return _write(out_dir, train_ids, val_ids, meta)


def prepare_bpe(text: str, out_dir: str, tokenizer: str = "gpt2") -> dict:
  """nanoGPT's data/shakespeare preparation: BPE tokens.

  The text is split 90/10 by characters first and each part encoded on its
  own, as nanoGPT does. `tokenizer` is "gpt2" (tiktoken) or the path of a
  Hugging Face tokenizer.json (or a directory holding one), recorded as an
  absolute path so `codec_from_meta` finds it from any working directory.
  """
  codec = _bpe_codec(tokenizer)
  _check_vocab_fits(codec.vocab_size, tokenizer)
  name = "gpt2" if tokenizer == "gpt2" else os.path.abspath(codec.path)
  train_text, val_text = _split_text(text)
  return _write(out_dir, codec.encode(train_text), codec.encode(val_text),
                {"vocab_size": int(codec.vocab_size), "tokenizer": name})


def prepare(text: str, out_dir: str, tokenizer: str = "char") -> dict:
  """`prepare_char` for tokenizer="char", else `prepare_bpe`."""
  if tokenizer == "char":
    return prepare_char(text, out_dir)
  return prepare_bpe(text, out_dir, tokenizer)


def is_prepared(data_dir: str) -> bool:
  return all(os.path.isfile(os.path.join(data_dir, f))
             for f in (TRAIN_FILE, VAL_FILE, META_FILE))


def load_meta(data_dir: str) -> dict:
  """The meta.json of a prepared data directory, checked against its .bin
  files."""
  missing = [f for f in (TRAIN_FILE, VAL_FILE, META_FILE)
             if not os.path.isfile(os.path.join(data_dir, f))]
  if missing:
    raise FileNotFoundError(
        f"{data_dir} is not a prepared text data set (missing "
        f"{', '.join(missing)}); prepare it with `"
        + _CLI_HINT.format(data_dir) + "` (or give the training config an "
        "input path so training prepares it).")
  path = os.path.join(data_dir, META_FILE)
  with open(path) as f:
    try:
      meta = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON ({e}); re-run `"
                       + _CLI_HINT.format(data_dir) + "`.") from e
  for name in (TRAIN_FILE, VAL_FILE):
    expected = meta.get(name.split(".")[0] + "_tokens")
    actual = os.path.getsize(os.path.join(data_dir, name)) // 2
    if expected is not None and expected != actual:
      raise ValueError(
          f"{os.path.join(data_dir, name)} holds {actual} tokens but {path} "
          f"records {expected}: the files do not belong together; re-run `"
          + _CLI_HINT.format(data_dir) + "`.")
  return meta


def _same_tokenizer(requested: str, recorded: str) -> bool:
  if requested in ("char", "gpt2") or recorded in ("char", "gpt2"):
    return requested == recorded
  try:
    return os.path.abspath(_tokenizer_file(requested)) == recorded
  except FileNotFoundError:
    return False


def ensure_prepared(data_dir: str, input_path: str, tokenizer: str, *,
                    process_index: int | None = None,
                    timeout_s: float = 1800.0,
                    poll_s: float = 1.0) -> dict:
  """`load_meta(data_dir)`, preparing `input_path` there first if needed.

  Only process 0 (`jax.process_index()` unless `process_index` is given)
  reads and writes; the others poll until meta.json appears (it is written
  last), so `data_dir` must be on a file system all processes share, or be
  prepared beforehand on every host with the CLI.
  """
  if is_prepared(data_dir):
    meta = load_meta(data_dir)
    recorded = meta.get("tokenizer", "char")
    if tokenizer and not _same_tokenizer(tokenizer, recorded):
      logging.warning(
          "%s was prepared with tokenizer=%r, not the requested %r; using it "
          "as it is (delete it to re-prepare).", data_dir, recorded,
          tokenizer)
    return meta
  if not input_path:
    return load_meta(data_dir)  # Raises, saying how to prepare it.
  if process_index is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index()
  if process_index == 0:
    logging.info("Preparing %s from %s (tokenizer=%s).", data_dir,
                 input_path, tokenizer)
    prepare(read_text(input_path), data_dir, tokenizer or "char")
    return load_meta(data_dir)
  deadline = time.monotonic() + timeout_s
  while not is_prepared(data_dir):
    if time.monotonic() > deadline:
      raise TimeoutError(
          f"Process {process_index} waited {timeout_s:.0f}s for process 0 to "
          f"prepare {data_dir} from {input_path}. Check process 0's log; if "
          "the hosts do not share that directory, prepare it on every host "
          "first with `" + _CLI_HINT.format(data_dir) + "`.")
    time.sleep(poll_s)
  return load_meta(data_dir)


# ----------------------------------------------------------------------------
# Grain sources.


class TokenFile:
  """A uint16 token file, memory-mapped on first use.

  The memmap is dropped when pickled (Grain workers, checkpoints): pickling
  an np.memmap copies the whole array. Windows are read by fancy indexing,
  so only the pages they touch are read; those stay mapped as clean,
  reclaimable page cache.
  """

  def __init__(self, path: str):
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"{path} does not exist; prepare its directory with `"
          + _CLI_HINT.format(os.path.dirname(path) or ".") + "`.")
    size = os.path.getsize(path)
    if size % 2:
      raise ValueError(f"{path} has an odd size ({size} bytes), so it is not "
                       "a uint16 token file; re-prepare it.")
    self.path = path
    self.num_tokens = size // 2
    self._data = None

  @property
  def data(self) -> np.ndarray:
    if self._data is None:
      self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
    return self._data

  def check_length(self, block_size: int) -> None:
    if self.num_tokens < block_size + 1:
      raise ValueError(
          f"{self.path} holds {self.num_tokens} tokens, fewer than "
          f"config.block_size + 1 = {block_size + 1} that one window (inputs "
          "plus the next-token target) needs; lower config.block_size or use "
          "more text.")

  def windows(self, offsets: np.ndarray, block_size: int) -> dict:
    """{"x": data[i:i+T], "y": data[i+1:i+1+T]} for each offset, int32."""
    index = offsets[:, None] + np.arange(block_size + 1)
    rows = np.asarray(self.data[index], dtype=np.int32)
    return {"x": rows[:, :-1], "y": rows[:, 1:]}

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_data"] = None
    return state


def _check_layout(block_size: int, global_batch_size: int, seed: int,
                  process_index: int, process_count: int) -> slice:
  """This process's slice of the global rows, after checking the layout."""
  if block_size < 1:
    raise ValueError(f"config.block_size={block_size} must be positive.")
  if global_batch_size < 1:
    raise ValueError(f"Global batch size {global_batch_size} must be "
                     "positive.")
  if seed < 0:
    raise ValueError(f"seed={seed} must be non-negative (it seeds NumPy's "
                     "SeedSequence).")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} is not in "
                     f"[0, {process_count}).")
  if global_batch_size % process_count:
    raise ValueError(f"Global batch {global_batch_size} is not divisible by "
                     f"the {process_count} processes.")
  local = global_batch_size // process_count
  return slice(process_index * local, (process_index + 1) * local)


class TokenWindows:
  """nanoGPT get_batch as a random-access Grain source.

  Item k holds this process's rows of global batch k: `global_batch_size`
  window offsets drawn uniformly with replacement from [0, N - block_size)
  by `np.random.default_rng([seed, k])` (like nanoGPT's
  `torch.randint(len(data) - block_size)`), of which process p takes the
  contiguous rows [p*G/P, (p+1)*G/P). So the batches do not depend on the
  number of processes, and resuming needs only k.

  Returns {"x": int32 [G/P, block_size], "y": int32 [G/P, block_size]} with
  y the next token of each x position.

  `path` is a uint16 .bin file, or any token stream with the same methods
  as `TokenFile` (`trm.data.text.tfds_source.TokenStream`: a TFDS split), so
  the same text gives the same batches from either.
  """

  def __init__(self, path, block_size: int, global_batch_size: int,
               seed: int, process_index: int = 0, process_count: int = 1,
               num_batches: int | None = None):
    self.local_slice = _check_layout(block_size, global_batch_size, seed,
                                     process_index, process_count)
    if num_batches is not None and num_batches < 0:
      raise ValueError(f"num_batches={num_batches} must be non-negative.")
    self.file = TokenFile(path) if isinstance(path, str) else path
    self.file.check_length(block_size)
    self.path = self.file.path
    self.block_size = block_size
    self.global_batch_size = global_batch_size
    self.seed = seed
    self.process_index, self.process_count = process_index, process_count
    # Without num_batches the source is endless (see ENDLESS): training
    # stops by step count, not by running out of batches.
    self.num_batches = ENDLESS if num_batches is None else num_batches

  @property
  def num_tokens(self) -> int:
    return self.file.num_tokens

  def global_offsets(self, k: int) -> np.ndarray:
    """Window start offsets of every row of global batch k."""
    rng = np.random.default_rng([self.seed, int(k)])
    return rng.integers(0, self.file.num_tokens - self.block_size,
                        size=self.global_batch_size)

  def __len__(self) -> int:
    return self.num_batches

  def __getitem__(self, k) -> dict:
    if not 0 <= k < self.num_batches:
      raise IndexError(k)
    offsets = self.global_offsets(k)[self.local_slice]
    return self.file.windows(offsets, self.block_size)

  def __repr__(self) -> str:
    # Stable across runs (no memmap, no id): Grain's DataLoader compares it
    # when restoring. num_batches is left out so a run can be extended.
    return (f"TokenWindows(path={self.path!r}, block_size={self.block_size}, "
            f"global_batch_size={self.global_batch_size}, seed={self.seed}, "
            f"process_index={self.process_index}, "
            f"process_count={self.process_count})")


class EvalWindows:
  """nanoGPT estimate_loss batches: eval_iters batches from train.bin then
  eval_iters from val.bin.

  The offsets of item k are fixed (seeded by [seed, split, j, _EVAL_STREAM],
  apart from every training batch), so evaluations at different steps score
  the same windows and compare directly; nanoGPT draws fresh ones each time,
  which only adds noise. Returns {"x", "y", "split": int32 [G/P]}, split 0
  for train and 1 for val, with this process's rows as in `TokenWindows`.
  `streams` replaces data_dir's two files by other token streams (train,
  val), e.g. two TFDS splits; data_dir then only names them.
  """

  def __init__(self, data_dir: str, block_size: int, global_batch_size: int,
               eval_iters: int, seed: int, process_index: int = 0,
               process_count: int = 1, streams=None):
    self.local_slice = _check_layout(block_size, global_batch_size, seed,
                                     process_index, process_count)
    if eval_iters < 1:
      raise ValueError(f"eval_iters={eval_iters} must be positive.")
    streams = streams or [os.path.join(data_dir, f)
                          for f in (TRAIN_FILE, VAL_FILE)]
    self.files = [TokenFile(s) if isinstance(s, str) else s for s in streams]
    for f in self.files:
      f.check_length(block_size)
    self.data_dir = data_dir
    self.block_size = block_size
    self.global_batch_size = global_batch_size
    self.eval_iters = eval_iters
    self.seed = seed
    self.process_index, self.process_count = process_index, process_count

  def global_offsets(self, k: int) -> np.ndarray:
    split, j = divmod(int(k), self.eval_iters)
    rng = np.random.default_rng([self.seed, split, j, _EVAL_STREAM])
    return rng.integers(0, self.files[split].num_tokens - self.block_size,
                        size=self.global_batch_size)

  def __len__(self) -> int:
    return 2 * self.eval_iters

  def __getitem__(self, k) -> dict:
    if not 0 <= k < len(self):
      raise IndexError(k)
    split = int(k) // self.eval_iters
    offsets = self.global_offsets(k)[self.local_slice]
    batch = self.files[split].windows(offsets, self.block_size)
    batch["split"] = np.full(len(offsets), split, np.int32)
    return batch

  def __repr__(self) -> str:
    return (f"EvalWindows(data_dir={self.data_dir!r}, "
            f"block_size={self.block_size}, "
            f"global_batch_size={self.global_batch_size}, "
            f"eval_iters={self.eval_iters}, seed={self.seed}, "
            f"process_index={self.process_index}, "
            f"process_count={self.process_count})")


# ----------------------------------------------------------------------------
# CLI.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI flags (only when run as a script, see `builder_cli`)."""
  flags.DEFINE_string("input", TINY_SHAKESPEARE_URL,
                      "Text file or http(s) URL to prepare.",
                      flag_values=flag_values)
  flags.DEFINE_string("out_dir", None, "Directory to write train.bin, "
                      "val.bin and meta.json to.", flag_values=flag_values)
  flags.mark_flag_as_required("out_dir", flag_values=flag_values)
  flags.DEFINE_string("tokenizer", "char", "char (one token per character), "
                      "gpt2 (tiktoken) or the path of a Hugging Face "
                      "tokenizer.json.", flag_values=flag_values)


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  fv = flags.FLAGS
  text = read_text(fv.input)
  meta = prepare(text, fv.out_dir, fv.tokenizer)
  print(f"{fv.input}: {len(text):,} characters, tokenizer={meta['tokenizer']}"
        f", vocab size {meta['vocab_size']:,}")
  print(f"train: {meta['train_tokens']:,} tokens, val: "
        f"{meta['val_tokens']:,} tokens")
  print("wrote " + ", ".join(os.path.join(fv.out_dir, f)
                             for f in (TRAIN_FILE, VAL_FILE, META_FILE)))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
