"""Text codecs: one token per character, or BPE (tiktoken GPT-2 or a Hugging
Face tokenizer.json). Used by `trm.data.text.preparation`."""

import os

from trm.core import cli

class TokenizerUnavailableError(cli.UserError, RuntimeError):
  """The requested BPE tokenizer cannot be loaded here (e.g. offline)."""


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

  def __init__(self, name: str = "gpt2", tokenizer_flag: str = "--tokenizer"):
    self.encoding = _tiktoken_encoding(name, tokenizer_flag)
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
    path = tokenizer_file(path)
    try:
      import tokenizers  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise TokenizerUnavailableError(
          f"Reading {path} needs the `tokenizers` package: pip install "
          "tokenizers.") from e
    self.path = path
    from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    self.tokenizer = tok_lib.read_tokenizer_file(
        path, "pass the tokenizer.json of a Hugging Face download")
    # One more than the largest id, not the number of tokens: ids may have
    # gaps, and the .bin files and the model must hold the largest.
    self.vocab_size = tok_lib.id_span(self.tokenizer)

  def encode(self, text: str) -> list[int]:
    # No BOS/EOS templates: the text is one continuous stream, as with
    # tiktoken's encode_ordinary, which reads special-token text in a
    # corpus ("<|endoftext|>") as text: add_special_tokens=False alone
    # still maps it to the special id (GPT-2's tokenizer.json and
    # tokenizer='gpt2' gave other ids).
    from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    return tok_lib.encode_ids(self.tokenizer, text,
                              special_names_are_text=True)

  def encode_allowing_special(self, text: str) -> list[int]:
    """`encode`, but special-token text is the special token (as tiktoken's
    `allowed_special`: nanoGPT's sample.py encodes --start so)."""
    from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    return tok_lib.encode_ids(self.tokenizer, text,
                              special_names_are_text=False)

  def decode(self, ids) -> str:
    return self.tokenizer.decode([int(i) for i in ids],
                                 skip_special_tokens=False)


def _tiktoken_encoding(name: str, tokenizer_flag: str = "--tokenizer"):
  """tiktoken's encoding `name`; one line naming `tokenizer_flag` (how the
  command in hand spells the tokenizer) when it cannot be loaded."""
  alternative = (f"Alternatively pass {tokenizer_flag}=/path/to/gpt2/"
                 "tokenizer.json (the tokenizer.json of a Hugging Face gpt2 "
                 "download), which uses the `tokenizers` library and works "
                 "offline.")
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
    reason = " ".join(str(e).split())[:200]
    raise TokenizerUnavailableError(
        f"tiktoken could not load the {name!r} encoding ({type(e).__name__}: "
        f"{reason}); it downloads its files on first use, so offline it "
        f"needs a filled TIKTOKEN_CACHE_DIR. {alternative}") from e


def tokenizer_file(path: str) -> str:
  """The tokenizer.json at `path` (a file, or a directory holding one)."""
  if os.path.isdir(path):
    path = os.path.join(path, "tokenizer.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"Tokenizer file {path} does not exist: pass tokenizer='char', "
        "'gpt2' or the path of a Hugging Face tokenizer.json.")
  return path


def bpe_codec(tokenizer: str, tokenizer_flag: str = "--tokenizer"):
  """The BPE codec of `tokenizer` ("gpt2" or a tokenizer.json path);
  `tokenizer_flag` spells its flag in errors."""
  if tokenizer == "gpt2":
    return TiktokenCodec("gpt2", tokenizer_flag)
  if tokenizer == "char":
    raise ValueError("tokenizer='char' is not a BPE tokenizer: use "
                     "prepare_char.")
  if not os.path.exists(tokenizer):
    raise FileNotFoundError(
        f"tokenizer={tokenizer!r} is neither 'char', 'gpt2' nor an existing "
        "path of a Hugging Face tokenizer.json (or a directory holding one).")
  return HFTokenizerCodec(tokenizer)
