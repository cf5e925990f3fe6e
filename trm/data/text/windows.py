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

import hashlib
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
from trm.core import hub as core_hub
from trm.data import atomic_files
from trm.data import io as data_io
from trm.data.text import preparation

# The prepared files (written by `trm.data.text.preparation`), as the
# trainers name them.
TRAIN_FILE = preparation.TRAIN_FILE
VAL_FILE = preparation.VAL_FILE

# Socket timeout of a URL input's download, seconds.
URL_TIMEOUT_S = 30.0
TINY_SHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/"
                        "master/data/tinyshakespeare/input.txt")

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
# A token stream's fingerprint reads at most this many blocks of this many
# tokens (16 MiB of a uint16 file).
_FINGERPRINT_BLOCKS = 256
_FINGERPRINT_TOKENS = 32768
# A .bin file of up to this many tokens (1 GiB) has its ids checked whole
# before compilation (`check_file_ids`; tenths of a second from the page
# cache); a larger one (OpenWebText's 9B tokens: minutes on every start and
# host) only batch by batch (`_check_ids`). Read in chunks of _SCAN_CHUNK.
_SCAN_TOKENS = 2**29
_SCAN_CHUNK = 2**24
# `TokenFile` reads this many leading (even, odd) id pairs to tell a file of
# 32- or 64-bit ids from uint16 ones; shorter files are not judged.
_DTYPE_PAIRS = 32768
_DTYPE_PAIRS_MIN = 1024


# ----------------------------------------------------------------------------
# Reading the text.


def _download(url: str, input_flag: str) -> bytes:
  """The bytes at `url`; one line naming `input_flag` when that fails. A
  host that does not resolve or answer fails within seconds
  (`trm.core.hub.unreachable`), not after the socket timeout."""
  hint = (f"if this machine is offline, fetch the file elsewhere and pass "
          f"its local path instead: {input_flag}=/path/to/input.txt")
  why_not = core_hub.unreachable(url)
  if why_not is not None:
    raise ConnectionError(f"Could not download {url}: {why_not}; {hint}.")
  try:
    with urllib.request.urlopen(url, timeout=URL_TIMEOUT_S) as response:
      return response.read()
  except (urllib.error.URLError, OSError) as e:
    reason = " ".join(str(getattr(e, "reason", e)).split())
    raise ConnectionError(f"Could not download {url} ({type(e).__name__}: "
                          f"{reason}); {hint}.") from e


def read_text(source: str, input_flag: str = "--input") -> str:
  """The text of a local file, or of an http(s) URL (downloaded).

  `input_flag` is how the command in hand spells the input (the CLI's
  --input; trm.main's --config.data.input), named by the error when a URL
  cannot be downloaded.
  """
  if source.startswith(("http://", "https://")):
    return data_io.decode_utf8(_download(source, input_flag), source)
  if not os.path.isfile(source):
    # A directory or FIFO was said not to exist.
    what = ("is not a regular file (a directory, FIFO or device)"
            if os.path.exists(source) else "does not exist")
    raise FileNotFoundError(f"{source} {what}: pass a text file or an "
                            f"http(s) URL as the input ({input_flag}).")
  return data_io.read_utf8(source)


def ensure_prepared(data_dir: str, input_path: str, tokenizer: str, *,
                    process_index: int | None = None,
                    timeout_s: float = 1800.0,
                    poll_s: float = 1.0,
                    field_prefix: str = "config.data.",
                    dir_field: str = "config.data_root/config.dataset"
                    ) -> dict:
  """`load_meta(data_dir)`, preparing `input_path` there first if needed.

  A prepared directory is used as it is: `input_path` is then not read (a
  rerun needs no input, and no network for a URL). An input that provably
  names another text (a local file of another size, another URL) is
  refused in one line naming both; one that may be a copy (a URL where a
  local file was prepared, say) is logged and the prepared data used.

  Only process 0 (`jax.process_index()` unless `process_index` is given)
  reads and writes; the others poll until meta.json appears (it is written
  last), so `data_dir` must be on a file system all processes share, or be
  prepared beforehand on every host with the CLI. `field_prefix` spells the
  config fields in messages (trm.main's `config.data.`), `dir_field` the
  ones that name `data_dir`.
  """
  # A remote one (read as missing, or prepared into a local "gs:"), a file
  # or a link loop: one line naming dir_field.
  atomic_files.check_dir_or_absent(data_dir, dir_field)
  if preparation.is_prepared(data_dir):
    return _prepared(data_dir, input_path, tokenizer, field_prefix)
  if not input_path:
    return preparation.load_meta(data_dir)  # Raises, saying how to prepare it.
  if process_index is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index()
  if process_index == 0:
    # One preparation of data_dir at a time: two runs started together
    # would otherwise mix their .bin files under one meta.json.
    with atomic_files.dir_lock(data_dir, dir_field):
      if preparation.is_prepared(data_dir):  # by the run that held the lock
        return _prepared(data_dir, input_path, tokenizer, field_prefix)
      logging.info("Preparing %s from %s (tokenizer=%s).", data_dir,
                   input_path, tokenizer)
      preparation.prepare(read_text(input_path, f"--{field_prefix}input"),
                          data_dir, tokenizer or "char", source=input_path,
                          tokenizer_flag=f"--{field_prefix}tokenizer")
      return preparation.load_meta(data_dir)
  deadline = time.monotonic() + timeout_s
  while not preparation.is_prepared(data_dir):
    if time.monotonic() > deadline:
      raise TimeoutError(
          f"Process {process_index} waited {timeout_s:.0f}s for process 0 to "
          f"prepare {data_dir} from {input_path}. Check process 0's log; if "
          "the hosts do not share that directory, prepare it on every host "
          "first with `" + preparation.CLI_HINT.format(data_dir) + "`.")
    time.sleep(poll_s)
  return preparation.load_meta(data_dir)


def _prepared(data_dir: str, input_path: str, tokenizer: str,
              field_prefix: str) -> dict:
  """`ensure_prepared` of a prepared directory."""
  meta = preparation.load_meta(data_dir)
  # Prepared with other arguments: refused in one line naming the field.
  preparation.check_prepared_args(data_dir, meta, input_path, tokenizer,
                                  field_prefix)
  if meta.get("nanogpt") and input_path:
    logging.warning(
        "Using %s as nanoGPT's prepare.py wrote it (no meta.json); "
        "%sinput=%r is not read (delete %s to prepare it from that "
        "instead).", data_dir, field_prefix, input_path, data_dir)
  elif not preparation.same_input(input_path, meta):
    logging.warning(
        "Using %s as prepared from %s; %sinput=%r is not read (delete %s "
        "to prepare it from that instead).", data_dir, meta.get("input"),
        field_prefix, input_path, data_dir)
  return meta


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
          + preparation.CLI_HINT.format(os.path.dirname(path) or ".") + "`.")
    size = os.path.getsize(path)
    if size % 2:
      raise ValueError(f"{path} has an odd size ({size} bytes), so it is not "
                       "a uint16 token file; re-prepare it.")
    self.path = path
    self.num_tokens = size // 2
    self._data = None
    self._check_not_wider_ids()

  def _check_not_wider_ids(self) -> None:
    """Refuses a file of 32- or 64-bit ids (np.int32 / int64 `tofile`), which
    read as uint16 put a 0 in every second position: the model would train
    on that silently (as nanoGPT's memmap would). The ids alone cannot tell
    such a file from a text whose lowest id is every second token (single
    characters, one a line): a file whose uint16 count meta.json records
    (our preparation's) is never refused here, its size being checked
    against that count instead; others are, when id 0 fills every second
    position of their first _DTYPE_PAIRS pairs."""
    if preparation.records_token_count(self.path):
      return
    pairs = min(self.num_tokens // 2, _DTYPE_PAIRS)
    if pairs < _DTYPE_PAIRS_MIN:
      return
    head = np.asarray(self.data[:2 * pairs]).reshape(pairs, 2)
    if head[:, 0].any() and not head[:, 1].any():
      raise ValueError(
          f"{self.path} reads as uint16 token ids with a 0 at every second "
          "position: it holds 32- or 64-bit ids (written from an int32/int64"
          " array). The .bin files hold uint16 ids, as nanoGPT's: write "
          "them with np.asarray(ids, np.uint16).tofile(path), or prepare "
          "the text with `" + preparation.CLI_HINT.format(
              os.path.dirname(self.path) or ".") + "` (its meta.json records"
          " the token counts, so uint16 ids whose lowest is every second "
          "one are read as they are).")

  @property
  def data(self) -> np.ndarray:
    if self._data is None:
      self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
    return self._data

  def first_id_from(self, vocab_size: int) -> tuple[int, int] | None:
    """(position, id) of the file's first token id >= `vocab_size`, or
    None; None unread for a file over _SCAN_TOKENS tokens."""
    if self.num_tokens > _SCAN_TOKENS:
      return None
    for start in range(0, self.num_tokens, _SCAN_CHUNK):
      chunk = np.asarray(self.data[start:start + _SCAN_CHUNK])
      if int(chunk.max()) >= vocab_size:
        at = int(np.argmax(chunk >= vocab_size))
        return start + at, int(chunk[at])
    return None

  def check_length(self, block_size: int) -> None:
    if self.num_tokens < block_size + 1:
      raise ValueError(
          f"{self.path} holds {self.num_tokens} tokens, fewer than "
          f"config.block_size + 1 = {block_size + 1} that one window (inputs "
          "plus the next-token target) needs; lower config.block_size or use "
          "more text.")

  def fingerprint(self) -> str:
    """A hash of the token stream: the whole of it up to _FINGERPRINT_BLOCKS
    blocks of _FINGERPRINT_TOKENS, else its length and that many blocks
    spread evenly over it (reading a 17 GB train.bin on every start and
    host would take minutes; another text differs in those blocks or the
    length all but surely). Read as int64 values, so a TFDS split holding
    the same stream as a .bin file hashes the same."""
    n = self.num_tokens
    index = data_io.spread_positions(n, _FINGERPRINT_BLOCKS,
                                     _FINGERPRINT_TOKENS)
    digest = hashlib.blake2b(str(n).encode(), digest_size=8)
    digest.update(np.asarray(self.data[index], np.int64).tobytes())
    return digest.hexdigest()

  def windows(self, offsets: np.ndarray, block_size: int) -> dict:
    """{"x": data[i:i+T], "y": data[i+1:i+1+T]} for each offset, int32."""
    index = offsets[:, None] + np.arange(block_size + 1)
    rows = np.asarray(self.data[index], dtype=np.int32)
    return {"x": rows[:, :-1], "y": rows[:, 1:]}

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_data"] = None
    return state


class SyntheticTokens:
  """A token stream with no file behind it (`config.data.source=
  'synthetic'`, MaxText's dataset_type=synthetic): token i of stream `split`
  is a 64-bit hash of (split, i) modulo `vocab_size`, so a mesh's step speed
  and memory can be measured with no dataset prepared, downloaded or read
  (a pod's workers need nothing but the code). The tokens follow no
  language: the loss says nothing about the model. Same methods as
  `TokenFile`; the stream is 2**40 tokens long, so windows rarely repeat."""

  num_tokens = 2**40

  def __init__(self, vocab_size: int, split: int):
    if vocab_size < 1:
      raise ValueError(f"vocab_size={vocab_size} must be positive.")
    self.vocab_size, self.split = int(vocab_size), int(split)
    # Named by messages and the sources' reprs (Grain compares them on
    # restore, so it holds no id or address).
    self.path = f"synthetic:{('train', 'val')[self.split]}"

  def check_length(self, block_size: int) -> None:
    del block_size  # every window fits in 2**40 tokens

  def fingerprint(self) -> str:
    return f"synthetic-{self.split}-{self.vocab_size}"

  def windows(self, offsets: np.ndarray, block_size: int) -> dict:
    """As `TokenFile.windows`: {"x", "y"} int32 [rows, block_size]."""
    index = (np.asarray(offsets, np.uint64)[:, None]
             + np.arange(block_size + 1, dtype=np.uint64))
    rows = hashed_ids(index, self.split, self.vocab_size)
    return {"x": rows[:, :-1], "y": rows[:, 1:]}


def hashed_ids(index: np.ndarray, split: int, vocab_size: int) -> np.ndarray:
  """int32 token ids in [0, vocab_size), one per uint64 position in `index`:
  splitmix64's finaliser of the position, a stream apart per `split` (the
  synthetic data of `SyntheticTokens` and DiffuCoder's `sft.
  SyntheticBatches`)."""
  # uint64 arithmetic wraps, as the hash wants.
  h = index + np.uint64(0x9E3779B97F4A7C15 * (split + 1) % 2**64)
  h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  h ^= h >> np.uint64(31)
  return (h % np.uint64(vocab_size)).astype(np.int32)


def check_file_ids(streams, vocab_size: int) -> None:
  """Refuses, before compilation, a .bin file among `streams` (paths or
  token streams) holding an id >= `vocab_size`, naming its position. Its
  batches' own check (`_check_ids`) found one only when a random window
  reached it: a damaged id stopped the run at some step, after compiling
  and training up to there. Files over _SCAN_TOKENS tokens and other
  streams (TFDS splits, synthetic ids) are left to that check."""
  for stream in streams:
    if isinstance(stream, str):
      stream = TokenFile(stream)
    found = (stream.first_id_from(vocab_size)
             if isinstance(stream, TokenFile) else None)
    if found is not None:
      at, token = found
      raise ValueError(_id_error(stream.path, token, vocab_size,
                                 f" at token {at}"))


def _id_error(path: str, top: int, vocab_size: int, where: str = "") -> str:
  """The one line of a token id outside the model's vocabulary."""
  fix = ("re-prepare it with `" + preparation.CLI_HINT.format(
      os.path.dirname(path) or ".") + "`" if os.path.isfile(path)
         else "rebuild the data set")
  return (f"{path} holds token id {top}{where}, but the model's vocabulary "
          f"has {vocab_size} ids (config.model.vocab_size): the data was not "
          f"prepared with this data set's tokenizer, or is damaged; {fix}.")


def _check_ids(batch: dict, vocab_size: int | None, path: str) -> dict:
  """`batch`, once every token id in it is below `vocab_size` (None: not
  checked). An id the model has no embedding row for would only turn the
  loss into NaN (or, clamped, train on the wrong token), steps later and
  far from the file that holds it."""
  if vocab_size is not None and batch["x"].size:
    top = int(max(batch["x"].max(), batch["y"].max()))
    # A negative id (a signed TFDS token feature; .bin ids are unsigned)
    # was read from the end of the embedding table.
    low = int(min(batch["x"].min(), batch["y"].min()))
    if low < 0:
      top = low
    if not 0 <= top < vocab_size:
      raise ValueError(_id_error(path, top, vocab_size))
  return batch


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
               num_batches: int | None = None,
               vocab_size: int | None = None):
    self.local_slice = _check_layout(block_size, global_batch_size, seed,
                                     process_index, process_count)
    # Every batch's ids are checked against it (None: not checked).
    self.vocab_size = vocab_size
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
    self._fingerprint = None

  @property
  def num_tokens(self) -> int:
    return self.file.num_tokens

  def fingerprint(self) -> str:
    """The token stream's (`TokenFile.fingerprint`): checked across
    processes and on restore (`trm.core.pipeline`)."""
    if self._fingerprint is None:
      self._fingerprint = self.file.fingerprint()
    return self._fingerprint

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
    return _check_ids(self.file.windows(offsets, self.block_size),
                      self.vocab_size, self.path)

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
               process_count: int = 1, streams=None,
               vocab_size: int | None = None):
    self.local_slice = _check_layout(block_size, global_batch_size, seed,
                                     process_index, process_count)
    self.vocab_size = vocab_size  # as TokenWindows'
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

  def fingerprint(self) -> str:
    """Both streams' (`TokenFile.fingerprint`), for the check across
    processes."""
    return "+".join(f.fingerprint() for f in self.files)

  def __getitem__(self, k) -> dict:
    if not 0 <= k < len(self):
      raise IndexError(k)
    split = int(k) // self.eval_iters
    offsets = self.global_offsets(k)[self.local_slice]
    batch = _check_ids(self.files[split].windows(offsets, self.block_size),
                       self.vocab_size, self.files[split].path)
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
  flags.DEFINE_bool("overwrite", False, "Replace a dataset --out_dir already "
                    "holds (nanoGPT's, or one prepared here from another "
                    "input or tokenizer).", flag_values=flag_values)


def _check_out_dir(out_dir: str, source: str, tokenizer: str) -> None:
  """A UsageError when `out_dir` holds a prepared dataset this preparation
  would replace: nanoGPT's train.bin / val.bin (hours of openwebtext's
  preparation), or ours from another input or tokenizer. Ours from the
  same input and tokenizer is prepared again."""
  if not preparation.is_prepared(out_dir):
    return
  meta_path = os.path.join(out_dir, preparation.META_FILE)
  if not os.path.isfile(meta_path):
    held = "nanoGPT's train.bin and val.bin (no meta.json)"
  else:
    try:
      meta = preparation.read_meta_json(meta_path, "")
    except (OSError, ValueError):
      meta = {}
    recorded = (meta.get("input"), meta.get("tokenizer"))
    wanted_input = source if "://" in source else os.path.abspath(source)
    tokenizers = {tokenizer, os.path.abspath(tokenizer),
                  os.path.abspath(os.path.join(tokenizer, "tokenizer.json"))}
    if recorded[0] == wanted_input and recorded[1] in tokenizers:
      return
    held = (f"a dataset prepared from {recorded[0]!r} with tokenizer "
            f"{recorded[1]!r}")
  raise app.UsageError(
      f"--out_dir={out_dir} already holds {held}; pass --overwrite to "
      "replace it, or another --out_dir.")


def main(argv: Sequence[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  fv = flags.FLAGS
  # A leading ~ reaches us as typed (`--out_dir=~/x`): a folder named '~'.
  fv.input = cli.expand_home(fv.input)
  fv.out_dir = cli.expand_home(fv.out_dir)
  fv.tokenizer = cli.expand_home(fv.tokenizer)
  text = read_text(fv.input)
  # Not mixed with another's files.
  with atomic_files.dir_lock(fv.out_dir, "--out_dir"):
    if not fv.overwrite:
      _check_out_dir(fv.out_dir, fv.input, fv.tokenizer)
    meta = preparation.prepare(text, fv.out_dir, fv.tokenizer,
                               source=fv.input)
  print(f"{fv.input}: {len(text):,} characters, tokenizer={meta['tokenizer']}"
        f", vocab size {meta['vocab_size']:,}")
  print(f"train: {meta['train_tokens']:,} tokens, val: "
        f"{meta['val_tokens']:,} tokens")
  print("wrote " + ", ".join(
      os.path.join(fv.out_dir, f)
      for f in (TRAIN_FILE, VAL_FILE, preparation.META_FILE)))


if __name__ == "__main__":
  define_flags()
  cli.run(main, compilation_cache=False)  # a builder compiles nothing
