"""DiffuCoder / Dream tokenizer from a checkpoint directory's tokenizer.json,
or from the slow tokenizer's vocab.json and merges.txt, which is all the
published DiffuCoder and Dream repositories hold (their DreamTokenizer is
Qwen2's slow tokenizer; `_from_slow_files` builds the same encoder from them).

Qwen2 byte-level BPE plus Dream's special tokens. The ids come from the file
itself (`<|mask|>` is 151666 and `<|dlm_pad|>` 151667 in the published
checkpoints) and are checked to exist, so a tokenizer from another model
fails here with the token's name rather than producing garbage later.
"""
from __future__ import annotations

import dataclasses
import os

from tokenizers import Tokenizer

from trm.data import io as data_io

MASK = "<|mask|>"
DLM_PAD = "<|dlm_pad|>"
END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SYSTEM_PROMPT = "You are a helpful assistant."


def encode_ids(tokenizer: Tokenizer, text: str, *,
               special_names_are_text: bool) -> list[int]:
  """`text`'s ids without BOS/EOS templates; special-token names in it
  ("<|endoftext|>") as their characters, or as the special tokens, for
  this call only (the tokenizer's `encode_special_tokens` is put back)."""
  previous = tokenizer.encode_special_tokens
  tokenizer.encode_special_tokens = special_names_are_text
  try:
    return tokenizer.encode(text, add_special_tokens=False).ids
  finally:
    tokenizer.encode_special_tokens = previous


def id_span(tokenizer: Tokenizer) -> int:
  """One more than the largest token id of a `tokenizers.Tokenizer`: what a
  model's vocabulary must cover. Not `get_vocab_size()`, which counts the
  tokens: a tokenizer.json whose ids have gaps (e.g. {"a": 0, "b": 60000})
  has 2 tokens but encodes "b" as 60000."""
  ids = tokenizer.get_vocab(with_added_tokens=True).values()
  return max(max(ids, default=-1) + 1,
             tokenizer.get_vocab_size(with_added_tokens=True))


@dataclasses.dataclass(frozen=True)
class DreamTokenizer:
  tokenizer: Tokenizer
  mask_id: int
  eos_id: int               # <|endoftext|>, also the pad id
  dlm_pad_id: int | None    # Instruct / cpGRPO checkpoints only
  im_end_id: int | None

  def encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text, add_special_tokens=False).ids

  def encode_text(self, text: str) -> list[int]:
    """`text` with special-token names in it ("<|mask|>" quoted in a source
    file) encoded as the characters they are: as ids, the mask token would
    be clean data the model learns to output, "<|endoftext|>" a document
    break. For documents; `encode` parses the chat template's tokens."""
    return encode_ids(self.tokenizer, text, special_names_are_text=True)

  @property
  def vocab_size(self) -> int:
    """One more than the largest id it can produce (see `id_span`)."""
    return id_span(self.tokenizer)

  def decode(self, ids) -> str:
    return self.tokenizer.decode(list(ids), skip_special_tokens=False)

  def stop_ids(self) -> list[int]:
    """Where a completion ends, as the reference callers split it."""
    return [i for i in (self.eos_id, self.dlm_pad_id, self.im_end_id)
            if i is not None]


@dataclasses.dataclass(frozen=True)
class ByteTokenizer:
  """Bytes as tokens, for small models trained from scratch on CPU.

  Ids 0-255 are the UTF-8 bytes, then <|endoftext|>, <|dlm_pad|> and
  <|im_end|>; <|mask|> is the model's mask id (above them). Text is
  encoded literally: a chat template is just more bytes.
  """
  mask_id: int
  eos_id: int = 256
  dlm_pad_id: int | None = 257
  im_end_id: int | None = 258

  def __post_init__(self):
    if self.mask_id <= 258:
      raise ValueError(f"config.model.mask_token_id={self.mask_id} collides "
                       "with the byte tokenizer's ids 0-258; use an id above "
                       "258.")

  @property
  def vocab_size(self) -> int:
    return self.mask_id + 1

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  encode_text = encode  # special-token names are bytes like any text

  def decode(self, ids) -> str:
    names = {self.eos_id: END_OF_TEXT, self.dlm_pad_id: DLM_PAD,
             self.im_end_id: IM_END, self.mask_id: MASK}
    out, run = [], bytearray()
    for i in ids:
      i = int(i)
      if i < 256:
        run.append(i)
        continue
      out.append(run.decode("utf-8", errors="replace"))
      run = bytearray()
      out.append(names.get(i, f"<|{i}|>"))
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)

  def stop_ids(self) -> list[int]:
    return [self.eos_id, self.dlm_pad_id, self.im_end_id]


def chat_prompt(query, system: str = SYSTEM_PROMPT) -> str:
  """The Instruct prompt as DiffuCoder's README builds it by hand, the
  query stripped of surrounding whitespace (`query.strip()`, also
  inference_demo.py's): fine-tuning rows and generation both build their
  prompt here, so a query's trailing newline or space never reaches the
  template as more tokens in one and not the other. `query` may also be
  a conversation's turns (`chat_pieces`).

  Note the newline before the user turn's <|im_end|>, which
  `apply_chat_template` would not add; the model was prompted this way.
  """
  return "".join(text for text, _ in chat_pieces(query, system))


def chat_pieces(query, system: str = SYSTEM_PROMPT):
  """`chat_prompt` as [(text, is_content)]: the template's own pieces and
  the turns' contents, in order, up to the assistant header the response
  follows. `query` is one user turn (a string) or the turns before the
  response, [(role, content)] with roles "system" (first only: it replaces
  `system`, as a conversation's system message replaces the template's
  default), "user" (stripped, as a query) and "assistant"."""
  turns = [("user", query)] if isinstance(query, str) else list(query)
  if turns and turns[0][0] == "system":
    system, turns = turns[0][1], turns[1:]
  pieces = [(f"{IM_START}system\n", False), (system, True),
            (f"{IM_END}\n", False)]
  for role, content in turns:
    if role == "user":
      pieces += [(f"{IM_START}user\n", False), (content.strip(), True),
                 (f"\n{IM_END}\n", False)]
    else:
      pieces += [(f"{IM_START}{role}\n", False), (content, True),
                 (f"{IM_END}\n", False)]
  return pieces + [(f"{IM_START}assistant\n", False)]


def chat_prompt_ids(tokenizer, query) -> list[int]:
  """`chat_prompt(query)`'s ids, a special token's name inside the turns
  ("<|mask|>" in a question about Dream) encoded as text (`encode_text`):
  the fine-tuning rows and generation both take their prompt from here,
  so a name the rows learned as text is not a mask to fill, or an end,
  when the model is prompted. Only the template's own names are tokens."""
  pieces = chat_pieces(query)
  if all(tokenizer.encode_text(text) == tokenizer.encode(text)
         for text, content in pieces if content):
    # No special name in it: the whole template in one piece, as the
    # reference tokenizes the rendered chat (pieces can merge otherwise).
    return tokenizer.encode("".join(text for text, _ in pieces))
  return [i for text, content in pieces for i in (
      tokenizer.encode_text(text) if content else tokenizer.encode(text))]


def from_spec(spec: str, model_cfg, what: str = "--checkpoint"):
  """The tokenizer a config names: 'bytes', or a directory with
  tokenizer.json; checked against the model's mask id and vocabulary.
  `what` is the flag or config field to point at another directory."""
  if spec == "bytes":
    tokenizer = ByteTokenizer(mask_id=model_cfg.mask_token_id)
  else:
    tokenizer = load_tokenizer(spec, what)
  return check_against_model(tokenizer, model_cfg, spec)


def check_against_model(tokenizer, model_cfg, spec: str):
  """The tokenizer, once its mask id and size fit the model."""
  if tokenizer.mask_id != model_cfg.mask_token_id:
    raise ValueError(f"The tokenizer ({spec}) has <|mask|> = "
                     f"{tokenizer.mask_id} but config.model.mask_token_id="
                     f"{model_cfg.mask_token_id}; they must agree.")
  if tokenizer.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"The tokenizer ({spec}) has {tokenizer.vocab_size} ids,"
                     f" more than config.model.vocab_size="
                     f"{model_cfg.vocab_size}.")
  return tokenizer


# The slow tokenizer's files: Qwen2's byte-level BPE vocabulary and merges
# (the special tokens come from added_tokens.json / tokenizer_config.json).
SLOW_FILES = ("vocab.json", "merges.txt")


def has_tokenizer(directory: str) -> bool:
  """Whether `directory` holds what `load_tokenizer` reads: tokenizer.json,
  or the slow tokenizer's `SLOW_FILES`."""
  return os.path.isfile(os.path.join(directory, "tokenizer.json")) or all(
      os.path.isfile(os.path.join(directory, f)) for f in SLOW_FILES)


# Qwen2's pre-tokenizer split (its slow tokenizer's regular expression):
# English contractions, letters with one leading non-letter, single digits,
# punctuation runs with their trailing newlines, newline runs, spaces.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
                r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|"
                r"\s+")
# Where the slow tokenizer's special tokens are listed (their ids and flags).
_ADDED_FILES = ("added_tokens.json", "tokenizer_config.json")
_SLOW_LIMIT = 64 << 20  # bytes per file; the 7B's vocab.json is 2.8 MB


# tokenizer.json holds the whole vocabulary and merges: DiffuCoder's is 7 MB,
# the largest vocabularies in use about 35 MB. The library reads it whole
# (twice its size in memory) before any parse error.
_FAST_LIMIT = 256 << 20


def _check_size(path: str) -> None:
  if os.path.getsize(path) > _SLOW_LIMIT:
    raise ValueError(f"{path} is over {_SLOW_LIMIT >> 20} MiB")


def read_tokenizer_file(path: str, fix: str) -> Tokenizer:
  """`tokenizers`' Tokenizer from the tokenizer.json at `path`, refused in
  one ValueError naming it and ending in `fix` when it is no file, is past
  256 MiB (unread) or does not parse."""
  data_io.check_regular_file(path, fix)
  size = os.path.getsize(path)
  if size > _FAST_LIMIT:
    raise ValueError(f"{path} is {size:,} bytes, no tokenizer.json (at most "
                     f"{_FAST_LIMIT:,}); {fix}.")
  try:
    return Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except
    # The tokenizers library raises a bare Exception for a damaged file.
    raise ValueError(f"{path} is not a readable tokenizer.json "
                     f"({' '.join(str(e).split())}); {fix}.") from None


def _from_slow_files(directory: str) -> Tokenizer:
  """Qwen2's byte-level BPE built from the slow tokenizer's files with the
  `tokenizers` library, as `Qwen2TokenizerFast` encodes (and so as
  `Qwen2Tokenizer`, of which Dream's DreamTokenizer is a copy): NFC, the
  split above, bytes mapped to characters, BPE without an unknown token;
  the added tokens from `added_tokens.json` and `tokenizer_config.json`'s
  `added_tokens_decoder` (special or not, as there)."""
  from tokenizers import AddedToken, Regex  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers  # pylint: disable=g-import-not-at-top
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  vocab_path, merges_path = (os.path.join(directory, f) for f in SLOW_FILES)
  try:
    for path in (vocab_path, merges_path):
      _check_size(path)
    tokenizer = Tokenizer(models.BPE.from_file(
        vocab_path, merges_path, unk_token=None, fuse_unk=False,
        byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated",
                             invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    added = {}  # id -> AddedToken's fields
    for name in _ADDED_FILES:
      path = os.path.join(directory, name)
      if not os.path.isfile(path):
        continue
      record = weights_io.read_json(path)
      if name == "added_tokens.json":  # names and ids only: special tokens
        for content, index in dict(record).items():
          added.setdefault(int(index), {"content": str(content)})
      else:
        for index, entry in dict(record.get("added_tokens_decoder")
                                 or {}).items():
          added[int(index)] = {"content": str(entry["content"]), **{
              k: bool(entry[k]) for k in ("special", "normalized", "lstrip",
                                          "rstrip", "single_word")
              if k in entry}}
  except Exception as e:  # the tokenizers library raises a bare Exception
    raise ValueError(
        f"{directory}: {' and '.join(SLOW_FILES)} (with "
        f"{' / '.join(_ADDED_FILES)}) are not a readable Qwen2 tokenizer "
        f"({type(e).__name__}: {e}); use the files of the Hugging Face "
        "download.") from e
  for index in sorted(added):
    fields = {"special": True, "normalized": False, **added[index]}
    content = fields["content"]
    if tokenizer.token_to_id(content) is None:
      (tokenizer.add_special_tokens if fields["special"]
       else tokenizer.add_tokens)([AddedToken(**fields)])
    if tokenizer.token_to_id(content) != index:
      raise ValueError(
          f"{directory}: added token {content!r} is id {index} in its files "
          f"but would be {tokenizer.token_to_id(content)} (the ids must "
          "follow vocab.json without gaps, as the download's do).")
  return tokenizer


def load_tokenizer(directory: str,
                   what: str = "--checkpoint") -> DreamTokenizer:
  """`directory`'s tokenizer.json, or else the slow tokenizer's files (a
  DiffuCoder/Dream download); `what` (a flag or config field) is named as
  the fix when neither is there."""
  path = os.path.join(directory, "tokenizer.json")
  if os.path.isfile(path):
    tokenizer = read_tokenizer_file(
        path, "use the file of the Hugging Face download")
  elif has_tokenizer(directory):
    tokenizer = _from_slow_files(directory)
    path = os.path.join(directory, SLOW_FILES[0])
  else:
    raise FileNotFoundError(
        f"{path} not found: point {what} at a DiffuCoder/Dream "
        "directory that holds tokenizer.json, or vocab.json and merges.txt "
        "(the Hugging Face download).")

  def token_id(token: str, required: bool) -> int | None:
    found = tokenizer.token_to_id(token)
    if found is None and required:
      raise ValueError(f"{path} has no {token} token, so it is not a "
                       "DiffuCoder/Dream tokenizer (masked diffusion needs "
                       f"{MASK}); use the checkpoint's own tokenizer.json.")
    return found

  return DreamTokenizer(tokenizer=tokenizer, mask_id=token_id(MASK, True),
                        eos_id=token_id(END_OF_TEXT, True),
                        dlm_pad_id=token_id(DLM_PAD, False),
                        im_end_id=token_id(IM_END, False))
