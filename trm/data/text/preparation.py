"""Preparing a plain-text data directory in nanoGPT's format, and reading it.

The first 90% of the text's characters are the training split, the last 10%
the validation split, each stored as a flat `np.uint16` token stream
(`train.bin`, `val.bin`) next to a `meta.json` (JSON rather than nanoGPT's
pickle, so reading a data directory never runs code). Served by
`trm.data.text.windows`, which also holds the CLI.

A directory nanoGPT's own prepare.py scripts wrote (train.bin, val.bin and,
for characters, meta.pkl, without meta.json) is read as nanoGPT reads it:
meta.pkl's vocabulary (unpickled as plain data only: a pickle that names
any code is refused), or without one GPT-2's BPE with nanoGPT's vocabulary
of 50304. It is never prepared over.
"""

import json
import os
import pickle

import numpy as np

from trm.core import cli
from trm.data import atomic_files
from trm.data import io as data_io
from trm.data.text import text_codecs

TRAIN_FILE = "train.bin"
VAL_FILE = "val.bin"
META_FILE = "meta.json"
TRAIN_FRACTION = 0.9
# The .bin files hold uint16 ids, so a vocabulary may have at most this many.
MAX_VOCAB = 2**16

CLI_HINT = "python -m trm.data.text.windows --input=PATH_OR_URL --out_dir={}"
# nanoGPT's vocabulary file (data/shakespeare_char/prepare.py); without
# one its data is GPT-2's BPE (50257 ids), and its train.py gives a model
# trained from scratch 50304 (padded to a multiple of 64).
NANOGPT_META_FILE = "meta.pkl"
GPT2_VOCAB = 50257
NANOGPT_VOCAB = 50304
# Present while `_write` writes: .bin files beside it are no nanoGPT
# directory but an interrupted preparation.
_PREPARING = ".preparing"


def _is_itos(itos) -> bool:
  """A character vocabulary as meta.json holds it ({"0": "\\n", ...}), or a
  plain list of its characters."""
  if isinstance(itos, dict):
    return bool(itos) and all(
        isinstance(i, str) and i.isdecimal() and isinstance(ch, str)
        for i, ch in itos.items())
  return (isinstance(itos, (list, str)) and bool(itos)
          and all(isinstance(ch, str) for ch in itos))


def codec_from_meta(meta: dict, source: str = META_FILE):
  """The codec (`encode(str) -> list[int]`, `decode(ids) -> str`) that
  produced a prepared data set, from its meta.json (`source`, named in
  errors)."""
  tokenizer = meta.get("tokenizer", "char" if "itos" in meta else None)
  if tokenizer is not None and not isinstance(tokenizer, str):
    raise ValueError(f"{source}: tokenizer={tokenizer!r} must be 'char', "
                     "'gpt2' or a tokenizer.json path; re-run "
                     + CLI_HINT.format("DIR"))
  if tokenizer == "char":
    # A file edited by hand: a missing or malformed vocabulary gave a
    # KeyError's or TypeError's traceback, or one only once a sampled id
    # was decoded.
    if not _is_itos(meta.get("itos")):
      raise ValueError(f"{source}: tokenizer='char' needs itos, a non-empty "
                       'object of token ids to characters ({"0": "\\n", '
                       "...}); re-run " + CLI_HINT.format("DIR"))
    return text_codecs.CharCodec(meta["itos"])
  if tokenizer is None and meta.get("nanogpt"):
    # nanoGPT's sample.py cannot decode them either (it needs itos).
    raise ValueError(
        f"the data's meta.pkl records only vocab_size={meta.get('vocab_size')}"
        " (token ids of your own), no tokenizer to encode --start or decode "
        "samples with: pass --data_dir=DIR with the meta.json of a prepared "
        "text data set whose ids these are.")
  if tokenizer is None:
    raise ValueError("meta.json names no tokenizer and holds no character "
                     "vocabulary (itos); re-run " + CLI_HINT.format("DIR"))
  return text_codecs.bpe_codec(tokenizer)


# ----------------------------------------------------------------------------
# Preparation.


def universal_newlines(text: str) -> str:
  """`text` with CRLF and lone CR line ends as LF: what nanoGPT's
  prepare.py scripts read, since they open input.txt in text mode (Python's
  universal newlines). Without it a file saved with Windows line ends
  would gain a '\r' token and different ids."""
  return text.replace("\r\n", "\n").replace("\r", "\n")


def _split_text(text: str, source: str = "") -> tuple[str, str]:
  n = len(text)
  if n < 2:
    raise ValueError(f"{source or 'The input'} holds {n} characters; it needs"
                     " at least 2 (one for each split), and in practice far "
                     "more: pass a larger text.")
  cut = int(n * TRAIN_FRACTION)
  return text[:cut], text[cut:]


def _check_vocab_fits(vocab_size: int, tokenizer: str) -> None:
  if vocab_size > MAX_VOCAB:
    raise ValueError(
        f"tokenizer={tokenizer!r} has {vocab_size} tokens, more than the "
        f"{MAX_VOCAB} ids a uint16 .bin file can hold; use a smaller "
        "vocabulary (GPT-2's 50257 fits).")


def _source_fields(source: str) -> dict:
  """What meta.json records about the input: `input` (a URL, or a local
  file's absolute path) and, for a local file, `input_bytes` and
  `input_digest` (`data_io.file_digest`)."""
  if not source:
    return {}
  if "://" in source:
    return {"input": source}
  fields = {"input": os.path.abspath(source)}
  if os.path.isfile(source):
    fields["input_bytes"] = os.path.getsize(source)
    fields["input_digest"] = data_io.file_digest(source)
  return fields


def _same_local_text(input_path: str, meta: dict) -> bool | None:
  """Whether the local file `input_path` holds the text meta.json records
  (its size, then its digest where one is recorded: directories prepared
  before it was kept compare sizes only); None when there is nothing to
  compare (no local file, no recorded size)."""
  size = meta.get("input_bytes")
  if (not input_path or _is_url(input_path) or size is None
      or not os.path.isfile(input_path)):
    return None
  if os.path.getsize(input_path) != size:
    return False
  recorded = meta.get("input_digest")
  return recorded is None or data_io.file_digest(input_path) == recorded


def _write(out_dir: str, train_ids, val_ids, meta: dict) -> dict:
  """Writes train.bin, val.bin, then meta.json, each atomically.

  meta.json is the completion mark: it goes last and an old one is removed
  first, so its presence means that both .bin files beside it are complete
  and belong to it, even if an earlier preparation was interrupted. It
  records the arguments that made them (tokenizer, input); the token counts
  it records let `load_meta` catch .bin files replaced by hand.
  """
  os.makedirs(out_dir, exist_ok=True)
  meta_path = os.path.join(out_dir, META_FILE)
  marker = os.path.join(out_dir, _PREPARING)
  open(marker, "w").close()
  if os.path.exists(meta_path):
    os.remove(meta_path)
  counts = {}
  for name, ids in ((TRAIN_FILE, train_ids), (VAL_FILE, val_ids)):
    array = np.asarray(ids, dtype=np.uint16)
    atomic_files.atomic_write(os.path.join(out_dir, name), array.tofile)
    counts[name.split(".")[0] + "_tokens"] = int(array.size)
  meta = {**meta, **counts}
  atomic_files.write_json_atomic(meta_path, meta)
  os.remove(marker)
  return meta


def char_splits(text: str, source: str = ""
                ) -> tuple[dict, list[int], list[int]]:
  """(meta, train ids, val ids) of nanoGPT's shakespeare_char preparation:
  the vocabulary is every character of the whole text, the split 90/10 by
  characters, after CRLF / CR line ends become LF (`universal_newlines`).
  Shared by `prepare_char` and the TFDS builder, so both give the same
  token streams; `source` (the input's path) names it in errors."""
  text = universal_newlines(text)
  train_text, val_text = _split_text(text, source)
  chars = sorted(set(text))
  _check_vocab_fits(len(chars), "char")
  itos = {str(i): ch for i, ch in enumerate(chars)}
  codec = text_codecs.CharCodec(itos)
  meta = {"vocab_size": len(chars), "itos": itos,
          "stoi": {ch: i for i, ch in enumerate(chars)}, "tokenizer": "char"}
  return meta, codec.encode(train_text), codec.encode(val_text)


def prepare_char(text: str, out_dir: str, source: str = "") -> dict:
  """nanoGPT's shakespeare_char preparation: one token per character.

  Returns the meta.json contents: vocab_size, itos ({"0": "\\n", ...}),
  stoi, tokenizer="char", the train_tokens/val_tokens counts and, when
  `source` (the input's path or URL) is given, `input` / `input_bytes`.
  """
  meta, train_ids, val_ids = char_splits(text, source)
  return _write(out_dir, train_ids, val_ids,
                {**meta, **_source_fields(source)})


def prepare_bpe(text: str, out_dir: str, tokenizer: str = "gpt2",
                source: str = "", tokenizer_flag: str = "--tokenizer") -> dict:
  """nanoGPT's data/shakespeare preparation: BPE tokens.

  The text (line ends as LF, `universal_newlines`) is split 90/10 by
  characters first and each part encoded on its own, as nanoGPT does.
  `tokenizer` is "gpt2" (tiktoken) or the path of a Hugging Face
  tokenizer.json (or a directory holding one), recorded as an
  absolute path so `codec_from_meta` finds it from any working directory.
  `tokenizer_flag` spells the tokenizer's flag in errors (e.g. tiktoken
  offline).
  """
  codec = text_codecs.bpe_codec(tokenizer, tokenizer_flag)
  _check_vocab_fits(codec.vocab_size, tokenizer)
  name = "gpt2" if tokenizer == "gpt2" else os.path.abspath(codec.path)
  train_text, val_text = _split_text(universal_newlines(text), source)
  meta = {"vocab_size": int(codec.vocab_size), "tokenizer": name,
          **_source_fields(source)}
  if name != "gpt2":
    # The file at that path may be replaced later (another model's
    # tokenizer.json): its ids would then mean other text.
    meta["tokenizer_digest"] = data_io.file_digest(codec.path)
  if name == "gpt2" or codec.vocab_size == GPT2_VOCAB:
    # GPT-2's BPE (tiktoken's, or a gpt2 download's tokenizer.json): the
    # model nanoGPT's train.py makes for it has 50304 ids, 50257 padded to
    # a multiple of 64 for speed; the data's ids stay GPT-2's 50257.
    meta["model_vocab_size"] = NANOGPT_VOCAB
  return _write(out_dir, codec.encode(train_text), codec.encode(val_text),
                meta)


def prepare(text: str, out_dir: str, tokenizer: str = "char",
            source: str = "", tokenizer_flag: str = "--tokenizer") -> dict:
  """`prepare_char` for tokenizer="char", else `prepare_bpe`; `source` (the
  input's path or URL) is recorded in meta.json."""
  if tokenizer == "char":
    return prepare_char(text, out_dir, source)
  return prepare_bpe(text, out_dir, tokenizer, source, tokenizer_flag)


def _has(data_dir: str, *names: str) -> bool:
  return all(os.path.isfile(os.path.join(data_dir, f)) for f in names)


def _nanogpt_dir(data_dir: str) -> bool:
  """train.bin and val.bin without meta.json, not left by an interrupted
  preparation of ours: nanoGPT's prepare.py wrote them."""
  return (_has(data_dir, TRAIN_FILE, VAL_FILE)
          and not _has(data_dir, META_FILE)
          and not os.path.exists(os.path.join(data_dir, _PREPARING)))


def is_prepared(data_dir: str) -> bool:
  """Prepared here (meta.json), or by nanoGPT's prepare.py."""
  return _has(data_dir, TRAIN_FILE, VAL_FILE, META_FILE) or _nanogpt_dir(
      data_dir)


class _PlainData(pickle.Unpickler):
  """Unpickles dicts, strings and numbers only: naming any class or
  function (which is how a pickle runs code) is refused."""

  def find_class(self, module, name):
    raise pickle.UnpicklingError(f"it names {module}.{name}")


def read_nanogpt_meta(path: str, fix: str, vocab_only: bool = False
                      ) -> dict:
  """meta.json's vocabulary fields of nanoGPT's char-level meta.pkl
  ({'vocab_size', 'itos', 'stoi'}, as its sample.py reads it), unpickled
  as plain data only: no code in the file runs. A ValueError naming `path`
  and ending in `fix` otherwise.

  With `vocab_only` (training), a meta.pkl holding only {'vocab_size': N}
  is taken too, as nanoGPT's train.py reads nothing else (a data set of
  its user's own token ids): {'vocab_size': N} and no tokenizer.
  """
  try:
    with open(path, "rb") as f:
      meta = _PlainData(f).load()
  except Exception as e:  # pylint: disable=broad-except
    # A MemoryError (a length of 2**40 declared in a few bytes) has no
    # text: its name says what happened.
    raise ValueError(f"{path} cannot be read as plain data "
                     f"({' '.join(str(e).split()) or type(e).__name__}): "
                     f"{fix}.") from None
  if not isinstance(meta, dict):
    meta = {}  # refused below, as a meta.pkl without a vocabulary
  itos, vocab = meta.get("itos"), meta.get("vocab_size")
  if (vocab_only and "itos" not in meta and not isinstance(vocab, bool)
      and isinstance(vocab, int) and 0 < vocab <= MAX_VOCAB):
    return {"vocab_size": vocab}
  # type(...) is int: True and False are ints equal to 1 and 0, and became
  # the ids "True" and "False" in meta.json.
  if not (isinstance(itos, dict) and itos
          and all(type(i) is int and isinstance(ch, str)  # pylint: disable=unidiomatic-typecheck
                  for i, ch in itos.items())
          and sorted(itos) == list(range(len(itos)))
          and meta.get("vocab_size") == len(itos)):
    raise ValueError(f"{path} does not hold a character vocabulary: {fix}.")
  return {"vocab_size": len(itos),
          "itos": {str(i): ch for i, ch in sorted(itos.items())},
          "stoi": {ch: i for i, ch in sorted(itos.items())},
          "tokenizer": "char"}


def _nanogpt_meta(data_dir: str) -> dict:
  """meta.json's fields for a directory nanoGPT's prepare.py wrote."""
  path = os.path.join(data_dir, NANOGPT_META_FILE)
  counts = {name.split(".")[0] + "_tokens":
            os.path.getsize(os.path.join(data_dir, name)) // 2
            for name in (TRAIN_FILE, VAL_FILE)}
  # The text it was prepared from is unknown: the directory stands for it
  # (config.json records it as data.input, so a rerun that passes no input,
  # or another, is the same run).
  counts["input"] = os.path.abspath(data_dir)
  if not os.path.isfile(path):
    # nanoGPT's train.py and sample.py: no meta.pkl means GPT-2's BPE. Its
    # ids are the data's vocabulary (what a model must cover: GPT-2's own
    # weights have 50257); model_vocab_size is what a new model gets.
    return {"vocab_size": GPT2_VOCAB, "model_vocab_size": NANOGPT_VOCAB,
            "tokenizer": "gpt2", "nanogpt": True, **counts}
  fix = ("it must be the meta.pkl of nanoGPT's data/shakespeare_char/"
         "prepare.py ({'vocab_size', 'itos', 'stoi'}), or hold "
         f"{{'vocab_size': N}} (N <= {MAX_VOCAB}) alone for token ids of your "
         "own; re-run that, or prepare the text here with `"
         + CLI_HINT.format(data_dir) + "`")
  return {**read_nanogpt_meta(path, fix, vocab_only=True), "nanogpt": True,
          **counts}


def read_meta_json(path: str, fix: str) -> dict:
  """The JSON object in `path` (a meta.json, or a TFDS build's
  metadata.json holding its fields); a ValueError naming `path` and ending
  in `fix` otherwise."""
  with open(path, encoding="utf-8") as f:
    try:
      meta = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{path} is not valid JSON ({e}); {fix}.") from e
    except (RecursionError, ValueError) as e:  # nesting, 4300+ digit ints
      raise ValueError(f"{path} is not the JSON object that preparation "
                       f"writes ({type(e).__name__}: {str(e)[:120]}); "
                       f"{fix}.") from None
  if not isinstance(meta, dict):
    raise ValueError(f"{path} holds a JSON {type(meta).__name__}, not the "
                     f"object that preparation writes; {fix}.")
  return meta


def resolve_tokenizer(meta: dict, directory: str) -> dict:
  """`meta` with a relative tokenizer path made absolute against
  `directory`, the folder of the meta.json that names it. Preparation
  records an absolute path; a hand-written or moved meta.json's relative
  one was read against the working directory, so a tokenizer.json there
  (another model's) decoded the ids as other text without a word."""
  tokenizer = meta.get("tokenizer")
  if (isinstance(tokenizer, str) and tokenizer not in ("char", "gpt2")
      and tokenizer and not os.path.isabs(tokenizer)):
    return {**meta, "tokenizer": os.path.join(os.path.abspath(directory),
                                              tokenizer)}
  return meta


def check_vocab_fields(meta: dict, path: str, fix: str) -> None:
  """meta.json's vocab_size and model_vocab_size (where present) are
  integers in [1, MAX_VOCAB], the ids of a uint16 .bin file (and of the
  TFDS builders' token records, which record them in their metadata.json):
  a GPT is sized by them, and a hand-edited 2**40 failed in JAX's
  compilation with a traceback (10**8: out of memory, "reduce the batch")."""
  for field in ("vocab_size", "model_vocab_size"):
    vocab = meta.get(field)
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(
        vocab, int) or not 0 < vocab <= MAX_VOCAB):
      raise ValueError(f"{path}: {field}={vocab!r} must be an integer in "
                       f"[1, {MAX_VOCAB}] (the ids of a uint16 .bin file); "
                       f"{fix}.")


def load_meta(data_dir: str) -> dict:
  """The meta.json of a prepared data directory, checked against its .bin
  files (for a nanoGPT-prepared directory, its fields from meta.pkl)."""
  if _nanogpt_dir(data_dir):
    return _nanogpt_meta(data_dir)
  missing = [f for f in (TRAIN_FILE, VAL_FILE, META_FILE)
             if not os.path.isfile(os.path.join(data_dir, f))]
  if missing:
    raise FileNotFoundError(
        f"{data_dir} is not a prepared text data set (missing "
        f"{', '.join(missing)}); prepare it with `"
        + CLI_HINT.format(data_dir) + "` (or give the training config an "
        "input path so training prepares it).")
  path = os.path.join(data_dir, META_FILE)
  fix = "re-run `" + CLI_HINT.format(data_dir) + "`"
  meta = resolve_tokenizer(read_meta_json(path, fix), data_dir)
  check_vocab_fields(meta, path, fix)
  for name in (TRAIN_FILE, VAL_FILE):
    expected = meta.get(name.split(".")[0] + "_tokens")
    actual = os.path.getsize(os.path.join(data_dir, name)) // 2
    if expected is not None and expected != actual:
      raise ValueError(
          f"{os.path.join(data_dir, name)} holds {actual} tokens but {path} "
          f"records {expected}: the files do not belong together; re-run `"
          + CLI_HINT.format(data_dir) + "`.")
  return meta


def records_token_count(path: str) -> bool:
  """Whether `path` is a train.bin or val.bin whose count of uint16 ids the
  meta.json beside it records (as `_write` does), so its width is known:
  `load_meta` refuses a size that differs from the count. False for
  nanoGPT's directories and bare files (nothing recorded)."""
  directory, name = os.path.split(path)
  directory = directory or "."
  if name not in (TRAIN_FILE, VAL_FILE) or not _has(directory, META_FILE):
    return False
  return load_meta(directory).get(name.split(".")[0] + "_tokens") is not None


def check_prepared_args(data_dir: str, meta: dict, input_path: str,
                        tokenizer: str,
                        field_prefix: str = "config.data.") -> None:
  """Raises ValueError (one line naming the field) when the prepared
  directory was made with another tokenizer than `tokenizer`, or from a
  local input file of another size than `input_path` now has. An empty
  `tokenizer` / `input_path`, a URL, or a meta.json that records no input
  is not compared."""
  path = os.path.join(data_dir, META_FILE)
  fix = (f"delete {data_dir} to prepare it again, or point config.data_root"
         "/config.dataset at another directory")
  recorded = meta.get("tokenizer", "char")
  # A nanoGPT BPE directory records no tokenizer: GPT-2's is nanoGPT's guess
  # (and ours), not a preparation's argument to hold config.data.tokenizer to.
  inferred = meta.get("nanogpt") and "itos" not in meta
  if tokenizer and not inferred and not same_tokenizer(tokenizer, recorded):
    raise ValueError(
        f"{data_dir} was prepared with tokenizer={recorded!r} (recorded in "
        f"{path}), but {field_prefix}tokenizer={tokenizer!r}: set "
        f"{field_prefix}tokenizer={recorded!r}, or {fix}.")
  digest = meta.get("tokenizer_digest")
  if (tokenizer not in ("", "char", "gpt2") and digest is not None
      and os.path.isfile(recorded)
      and data_io.file_digest(recorded) != digest):
    raise ValueError(
        f"{data_dir} was prepared with tokenizer={recorded!r} (recorded in "
        f"{path}), but that file has changed since (its digest differs): "
        "the prepared ids are another tokenizer's. Put that tokenizer.json "
        f"back, or {fix}.")
  size = meta.get("input_bytes")
  if _same_local_text(input_path, meta) is False:
    held = os.path.getsize(input_path)
    # The same size: its digest differs (another text of that length, or
    # the prepared file edited in place since).
    how = (f"holds {held} bytes" if held != size else
           "holds other bytes of that size")
    raise ValueError(
        f"{data_dir} was prepared from {meta.get('input')} ({size} bytes, "
        f"recorded in {path}), but {field_prefix}input={input_path!r} {how}"
        f": another text. Set {field_prefix}input to the prepared text (or "
        f"'' to use the prepared data), or {fix}.")
  recorded_input = meta.get("input") or ""
  if (_is_url(input_path) and _is_url(recorded_input)
      and input_path != recorded_input):
    raise ValueError(
        f"{data_dir} was prepared from {recorded_input} (recorded in {path}),"
        f" but {field_prefix}input={input_path!r}: another source. Set "
        f"{field_prefix}input={recorded_input!r} (or '' to use the prepared "
        f"data), or {fix}.")


def _is_url(source: str) -> bool:
  return "://" in (source or "")


def same_input(input_path: str, meta: dict) -> bool:
  """Whether `input_path` names the text a prepared directory records
  (`meta`): the same URL, the same local file, or a local file of the
  recorded size and digest (a copy). An empty input, or a record without
  one, counts as the same."""
  recorded = meta.get("input")
  if not input_path or not recorded:
    return True
  if _is_url(input_path) or _is_url(recorded):
    return input_path == recorded
  if os.path.abspath(input_path) == recorded:
    return True
  return bool(_same_local_text(input_path, meta))


def same_tokenizer(requested: str, recorded: str) -> bool:
  if requested in ("char", "gpt2") or recorded in ("char", "gpt2"):
    return requested == recorded
  try:
    return cli.same_file(text_codecs.tokenizer_file(requested), recorded)
  except FileNotFoundError:
    return False
