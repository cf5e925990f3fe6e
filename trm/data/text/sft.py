"""Fine-tuning data for masked-diffusion LMs: JSONL pairs and code files.

Each row is `seq_len` tokens plus a `maskable` mask (what the noise may mask
and the loss scores):
  * prompt/response JSONL: prompt, then response, then `<|dlm_pad|>` up to
    `seq_len` (DiffuCoder-Instruct's recipe: pads are ordinary, maskable
    tokens, so the model learns where a completion ends). The prompt is never
    masked.
  * code files: documents joined with EOS and cut into `seq_len` windows
    (packing); every token is maskable except the first of a window, which
    has nothing before it to predict it from.

`SFTBatches` serves them like the puzzle pipeline: batch k is a pure function
of (rows, seed, k) and each process takes its rows of the global batch.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os

import numpy as np
from absl import logging

from trm.data import io as data_io


_JSON_TYPES = {bool: "a boolean", int: "a number",
               float: "a number", list: "an array", dict: "an object"}


# A JSONL record's conversation, as dllm's SFT rows (and the Hugging Face
# chat datasets they come from) hold it.
MESSAGES = "messages"
_ROLES = ("system", "user", "assistant")


def conversation_pair(messages, where: str):
  """(turns before the response, response) from a `messages` list of
  {"role", "content"} objects, as dllm's `default_sft_map_fn` splits it:
  the last message, an assistant's, is the response the loss scores;
  everything before it (a first system message, user and earlier
  assistant turns) is the prompt, never masked. `where` names the record
  ("sft.jsonl:3") in errors."""
  fix = (f"{where}: \"{MESSAGES}\" must be a list of {{\"role\": ..., "
         "\"content\": ...} objects (roles system, user, assistant) "
         "ending with the assistant's response")
  if not isinstance(messages, list) or not messages:
    raise ValueError(f"{fix}, got {json.dumps(messages)[:40]}.")
  turns = []
  for i, message in enumerate(messages):
    if (not isinstance(message, dict) or message.get("role") not in _ROLES
        or not isinstance(message.get("content"), str)):
      raise ValueError(f"{fix}; message {i} is "
                       f"{json.dumps(message)[:60]}.")
    if message["role"] == "system" and i:
      raise ValueError(f"{fix}; a system message only comes first "
                       f"(message {i} is one).")
    turns.append((message["role"], message["content"]))
  if turns[-1][0] != "assistant":
    raise ValueError(f"{fix}; the last message is a {turns[-1][0]}'s, so "
                     "there is no response to learn.")
  return tuple(turns[:-1]), turns[-1][1]


def read_jsonl_pairs(path: str, prompt_key: str = "prompt",
                     response_key: str = "response",
                     what: str = "data.path", line_numbers=None):
  """[(prompt, response)] from a JSONL file, with line-numbered errors;
  `what` is the config field that named the file. A record holding
  "messages" is a conversation (`conversation_pair`: its prompt is then a
  tuple of (role, content) turns), any other a prompt/response pair. Each
  pair's line number is appended to the list `line_numbers`, if given
  (blank lines are skipped, so the pairs' indices are not their lines)."""
  pairs = []
  if not os.path.isfile(path):
    # A directory or FIFO exists: "does not exist" sent users looking for
    # a typo.
    state = ("is not a regular file (a directory, FIFO or device)"
             if os.path.exists(path) else "does not exist")
    raise FileNotFoundError(f"{path} {state}: set config.{what} to a "
                            "JSONL file of prompt/response pairs.")
  # A byte-order mark (Windows editors, PowerShell) is no part of line 1,
  # as for the other text files read here (`data_io.split_lines`).
  text = data_io.read_utf8(path).removeprefix("\ufeff")
  # Split on newlines only: JSON strings may hold U+2028 and the like.
  for line_number, line in enumerate(text.split("\n"), 1):
    if not line.strip():
      continue
    try:
      record = data_io.json_record(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{line_number}: not valid JSON ({e}).") from e
    except data_io.RepeatedKey as e:
      raise ValueError(f"{path}:{line_number}: {e}.") from None
    except (RecursionError, ValueError) as e:
      # Nesting past Python's recursion limit (a RecursionError's
      # traceback), an integer of 4300+ digits (a line naming no file).
      raise ValueError(f"{path}:{line_number}: not a record ("
                       f"{type(e).__name__}: {str(e)[:120]}).") from None
    if not isinstance(record, dict):
      raise ValueError(f"{path}:{line_number}: expected a JSON object "
                       f"{{\"{prompt_key}\": ..., \"{response_key}\": ...}}, "
                       f"got a {type(record).__name__}.")
    if MESSAGES in record:
      pairs.append(conversation_pair(record[MESSAGES],
                                     f"{path}:{line_number}"))
      if line_numbers is not None:
        line_numbers.append(line_number)
      continue
    missing = [k for k in (prompt_key, response_key) if k not in record]
    if missing:
      raise ValueError(f"{path}:{line_number}: missing key(s) {missing}; "
                       f"set the data.prompt_key / data.response_key names "
                       f"(or give a \"{MESSAGES}\" list).")
    # Strings only: str() would turn null into "None" and a list into its
    # repr, and train on that.
    for key in (prompt_key, response_key):
      value = record[key]
      if not isinstance(value, str):
        shown = json.dumps(value)[:40]
        if value is not None:  # null names itself ("got null null")
          shown = f"{_JSON_TYPES.get(type(value), 'a value')} {shown}"
        raise ValueError(f"{path}:{line_number}: \"{key}\" must be a "
                         f"string, got {shown}.")
    pairs.append((record[prompt_key], record[response_key]))
    if line_numbers is not None:
      line_numbers.append(line_number)
  if not pairs:
    raise ValueError(f"{path} holds no examples; write one JSON object "
                     f"{{\"{prompt_key}\": ..., \"{response_key}\": ...}} "
                     "per line.")
  return pairs


def drop_unusable(pairs, token_pairs, names, seq_len: int, source: str):
  """(token_pairs, names) without the examples dllm drops: an empty (or
  blank) response, which has nothing to learn, and a prompt longer than
  `seq_len` tokens. A prompt exactly `seq_len` long is kept with nothing
  scored, as dllm keeps it (its filter is `prompt_len <= max_length`; the
  row's labels are all -100). The count is logged once; dropping every
  example is an error naming `source`."""
  empty = {i for i, (_, response) in enumerate(pairs) if not response.strip()}
  long = {i for i, (prompt, _) in enumerate(token_pairs)
          if len(prompt) > seq_len} - empty
  dropped = empty | long
  if not dropped:
    return token_pairs, names
  why = (f"{len(empty)} with an empty response, {len(long)} whose prompt "
         f"is longer than seq_len={seq_len}")
  first = names[min(dropped)]
  if len(dropped) == len(pairs):
    raise ValueError(
        f"{source}: all {len(pairs)} examples are dropped ({why}; the "
        f"first: {first}); give each a response and a prompt of at most "
        "seq_len tokens, or raise seq_len.")
  logging.warning("%s: %d of %d examples dropped, as dllm drops them (%s; "
                  "the first: %s).", source, len(dropped), len(pairs), why,
                  first)
  kept = [i for i in range(len(pairs)) if i not in dropped]
  return [token_pairs[i] for i in kept], [names[i] for i in kept]


def pair_rows(token_pairs, seq_len: int, pad_id: int, source: str = "data",
              names=None):
  """(tokens [N, L] int32, maskable [N, L] bool) from (prompt, response) ids.

  Responses longer than the room left are cut (a prompt of exactly
  `seq_len` tokens keeps none: its row scores nothing, as dllm's); a prompt
  longer than `seq_len` is an error naming the example: `names[i]` (e.g.
  "sft.jsonl:7"), or without names its index in `source` (`read_rows`
  drops such examples first: `drop_unusable`). The prompt, or
  without one the first token, is never maskable.
  """
  tokens = np.full((len(token_pairs), seq_len), pad_id, np.int32)
  maskable = np.zeros((len(token_pairs), seq_len), bool)
  for i, (prompt, response) in enumerate(token_pairs):
    if len(prompt) > seq_len:
      where = (f"{source}: example {i}" if names is None
               else f"{names[i]}: the example")
      raise ValueError(
          f"{where} has a {len(prompt)}-token prompt, longer than "
          f"seq_len={seq_len}; raise seq_len or shorten the prompt.")
    response = list(response)[:seq_len - len(prompt)]
    row = list(prompt) + response
    tokens[i, :len(row)] = row
    # Without a prompt the first token stays unmasked, as in packed rows:
    # it has no position before it to be predicted from (the logit shift),
    # so masked it would only be noise, never learned.
    maskable[i, max(len(prompt), 1):] = True
  return tokens, maskable


def _check_no_link_cycle(pattern: str, what: str) -> None:
  """A ValueError when the directories that `pattern`'s `**` walks hold a
  link back to one of their own ancestors: glob follows links into
  directories, so it would list the tree below again and again (one such
  link: every file ~40 times, until the path has too many links to
  resolve; two: 2**40 paths, a hang). Looked for in glob's own walk of
  the directories, which stops at the first cycle."""
  parts = pattern.split(os.sep)
  if "**" not in parts:
    return  # no recursion: bounded
  # The directories up to the last `**` (a trailing separator: directories
  # only), walked from where the first `**` starts.
  last = len(parts) - 1 - parts[::-1].index("**")
  start = parts.index("**")
  real = {}

  def resolved(path: str) -> str:
    if path not in real:
      real[path] = os.path.realpath(path or ".")
    return real[path]

  for directory in glob.iglob(os.sep.join(parts[:last + 1]) + os.sep,
                              recursive=True):
    names = directory.rstrip(os.sep).split(os.sep)
    if len(names) <= start:
      continue  # the walk's root itself
    here = resolved(os.sep.join(names))
    for i in range(start, len(names)):
      ancestor = os.sep.join(names[:i]) or (os.sep if pattern.startswith(
          os.sep) else "")
      if resolved(ancestor) == here:
        raise ValueError(
            f"{pattern!r} ({what}): {os.sep.join(names)} is a link back to "
            f"{ancestor or '.'} (a directory cycle), so the glob's ** would "
            "list the same files again and again without end; remove that "
            f"link, or set {what} to a glob that leaves it out.")


def code_file_paths(pattern: str, what: str = "data.path"):
  """The files matching a glob (recursive `**` allowed), sorted: the order
  of the documents, so the TFDS code builder keeps it too. Each file once:
  a path through a link to a file or directory already listed (a venv's
  lib64 -> lib) is left out, as its rows would repeat training rows (and
  could be held out as evaluation rows), and so is a hard link or bind
  mount of one (the same file); a link cycle is refused."""
  _check_no_link_cycle(pattern, what)
  paths = sorted(p for p in glob.glob(pattern, recursive=True)
                 if os.path.isfile(p))
  if not paths:
    raise FileNotFoundError(f"No files match {pattern!r}; set {what} to a "
                            "glob such as 'src/**/*.py'.")
  ids = {p: _file_id(p) for p in paths}
  first = {}
  for path in paths:
    first.setdefault(ids[path], path)
  unique = [p for p in paths if first[ids[p]] == p]
  if len(unique) < len(paths):
    again = next(p for p in paths if first[ids[p]] != p)
    logging.warning(
        "%s=%r: %d of its %d files are links to (or mounts of) files "
        "already matched (e.g. %s, the same file as %s); each is read once.",
        what, pattern, len(paths) - len(unique), len(paths), again,
        first[ids[again]])
  return unique


def _file_id(path: str):
  """Which file `path` is, however reached: through a link, a hard link or
  a bind mount (a folder mounted twice under the glob's root), which its
  resolved path does not show."""
  try:
    stat = os.stat(path)
  except OSError:  # gone since the glob: its resolved path, as before
    return os.path.realpath(path)
  return stat.st_dev, stat.st_ino


def read_code_file(path: str, what: str = "data.path") -> str:
  return data_io.read_utf8(path, fix=f"or narrow {what}'s glob to text files")


def read_code_files(pattern: str, what: str = "data.path"):
  """Texts of the files matching a glob (recursive `**` allowed), sorted;
  `what` is the config field that gave the glob."""
  return [read_code_file(path, what)
          for path in code_file_paths(pattern, what)]


def packed_rows(documents, seq_len: int, eos_id: int):
  """Documents joined with EOS, cut into full windows (the tail is dropped)."""
  stream = []
  for doc in documents:
    stream.extend(doc)
    stream.append(eos_id)
  count = len(stream) // seq_len
  if count == 0:
    raise ValueError(f"The documents hold {len(stream)} tokens, fewer than "
                     f"one row of seq_len={seq_len}.")
  tokens = np.asarray(stream[:count * seq_len], np.int32).reshape(count,
                                                                  seq_len)
  maskable = np.ones_like(tokens, bool)
  maskable[:, 0] = False
  return tokens, maskable


def _rows_fingerprint(tokens, maskable) -> str:
  digest = hashlib.blake2b(digest_size=8)
  for array in (tokens, maskable):
    array = np.ascontiguousarray(array)
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.data)
  return digest.hexdigest()


class SFTBatches:
  """Random-access source: item k = this process's rows of batch k.

  Epoch e visits the rows in a permutation seeded by (seed, e); batches do
  not cross epochs (the rows left over are dropped).
  """

  def __init__(self, tokens, maskable, *, global_batch_size: int, seed: int,
               num_batches: int, process_index: int = 0,
               process_count: int = 1, source: str = ""):
    if len(tokens) < global_batch_size:
      # `source` says where the rows came from (`row_sources`).
      of = f" of {source}" if source else ""
      raise ValueError(f"{len(tokens)} rows{of} cannot fill one global batch"
                       f" of config.global_batch_size={global_batch_size}; "
                       "add rows or lower config.global_batch_size.")
    if global_batch_size % process_count:
      raise ValueError(f"Global batch {global_batch_size} is not divisible by"
                       f" the {process_count} processes.")
    self.tokens, self.maskable = tokens, maskable
    self.global_batch_size = global_batch_size
    self.seed, self.num_batches = seed, num_batches
    local = global_batch_size // process_count
    self.local_slice = slice(process_index * local, (process_index + 1) * local)
    self.batches_per_epoch = len(tokens) // global_batch_size
    self._fingerprint = None

  def __len__(self):
    return self.num_batches

  def fingerprint(self) -> str:
    """A hash of every row (the same on every process, which the trainer
    checks): the order of an epoch depends on all of them, so a
    checkpointed position is only valid over these rows
    (`trm.core.pipeline` checks it on restore)."""
    if self._fingerprint is None:
      self._fingerprint = _rows_fingerprint(self.tokens, self.maskable)
    return self._fingerprint

  def __getitem__(self, k):
    if not 0 <= k < self.num_batches:
      raise IndexError(k)
    epoch, j = divmod(k, self.batches_per_epoch)
    order = np.random.Generator(np.random.Philox(key=self.seed + epoch)
                                ).permutation(len(self.tokens))
    rows = order[j * self.global_batch_size:(j + 1) * self.global_batch_size]
    rows = rows[self.local_slice]
    return {"tokens": self.tokens[rows], "maskable": self.maskable[rows]}


def synthetic_rows(first_row: int, count: int, seq_len: int,
                   vocab_size: int, mask_token_id: int, split: int):
  """(tokens, maskable) of synthetic rows first_row .. first_row + count - 1
  of stream `split` (0: training, 1: held out): token j of row r is
  `windows.hashed_ids` of position r * seq_len + j, drawn from the
  vocabulary without <|mask|> (data that held it would be a blank to
  fill, not a token to learn); every position but the first is maskable,
  as in packed code rows."""
  from trm.data.text import windows  # pylint: disable=g-import-not-at-top
  index = (np.arange(first_row, first_row + count, dtype=np.uint64)[:, None]
           * np.uint64(seq_len) + np.arange(seq_len, dtype=np.uint64))
  tokens = windows.hashed_ids(index, split, vocab_size - 1)
  tokens += tokens >= mask_token_id  # the ids above <|mask|> move up one
  maskable = np.ones_like(tokens, bool)
  maskable[:, 0] = False
  return tokens, maskable


class SyntheticBatches:
  """`SFTBatches` with no data behind it (config.data.source='synthetic',
  MaxText's dataset_type=synthetic): batch k is synthetic rows k *
  global_batch_size .. of stream 0 (`synthetic_rows`), so a pod's step speed
  and memory can be measured with no tokenizer, file or download. The
  tokens follow no language: the loss only shows that the step runs."""

  def __init__(self, *, global_batch_size: int, seq_len: int,
               vocab_size: int, mask_token_id: int, num_batches: int,
               process_index: int = 0, process_count: int = 1):
    if global_batch_size % process_count:
      raise ValueError(f"Global batch {global_batch_size} is not divisible by"
                       f" the {process_count} processes.")
    self.global_batch_size, self.num_batches = global_batch_size, num_batches
    self.row_args = (seq_len, vocab_size, mask_token_id, 0)
    self.local = global_batch_size // process_count
    self.offset = process_index * self.local

  def __len__(self):
    return self.num_batches

  def fingerprint(self) -> str:
    return "synthetic-{}-{}-{}-{}".format(*self.row_args)

  def __getitem__(self, k):
    if not 0 <= k < self.num_batches:
      raise IndexError(k)
    tokens, maskable = synthetic_rows(
        k * self.global_batch_size + self.offset, self.local, *self.row_args)
    return {"tokens": tokens, "maskable": maskable}


class SFTEvalBatches:
  """Held-out rows in order, in full global batches (a short tail is left
  out); item k = this process's rows of eval batch k, with their indices."""

  def __init__(self, tokens, maskable, *, global_batch_size: int,
               max_batches: int = -1, process_index: int = 0,
               process_count: int = 1, source: str = "",
               more: str = "hold out more rows (data.eval_rows)"):
    self._set_batches(len(tokens), global_batch_size, max_batches,
                      process_index, process_count, source, more)
    self.tokens, self.maskable = tokens, maskable

  def _set_batches(self, num_rows: int, global_batch_size: int,
                   max_batches: int, process_index: int, process_count: int,
                   source: str, more: str) -> None:
    """self.count: the eval batches `num_rows` held-out rows fill (at most
    `max_batches`; -1: all; one line if they fill none), and this
    process's share of each."""
    self.global_batch_size = global_batch_size
    self.local = global_batch_size // process_count
    self.offset = process_index * self.local
    count = num_rows // global_batch_size
    if count == 0:
      # `source` and `more`: where the rows came from and how to get more
      # (`row_sources`): data.eval_rows means nothing beside data.eval_path.
      of = f" ({source})" if source else ""
      raise ValueError(f"{num_rows} held-out rows{of} cannot fill one "
                       "eval batch of config.data.eval_batch_size="
                       f"{global_batch_size}; {more} or lower "
                       "config.data.eval_batch_size.")
    self.count = count if max_batches < 0 else min(count, max_batches)
    left_out = num_rows - count * global_batch_size
    if left_out and self.count == count:  # not cut by max_batches anyway
      logging.warning(
          "%d held-out rows fill %d eval batches of config.data."
          "eval_batch_size=%d: the last %d are left out of every evaluation."
          " Hold out a multiple of it (data.eval_rows) to evaluate them all.",
          num_rows, count, global_batch_size, left_out)

  def __len__(self):
    return self.count

  def fingerprint(self) -> str:
    """A hash of the held-out rows (the trainer checks that every process
    holds the same)."""
    return _rows_fingerprint(self.tokens, self.maskable)

  def _rows(self, start: int):
    """(tokens, maskable) of held-out rows start .. start + local - 1."""
    rows = slice(start, start + self.local)
    return self.tokens[rows], self.maskable[rows]

  def __getitem__(self, k):
    if not 0 <= k < self.count:
      raise IndexError(k)
    start = k * self.global_batch_size + self.offset
    tokens, maskable = self._rows(start)
    # "row": each row's index among the held-out rows, which seeds its noise
    # (`trm.families.dream.steps.eval_step`).
    return {"tokens": tokens, "maskable": maskable,
            "row": np.arange(start, start + self.local, dtype=np.int32)}


class SyntheticEvalBatches(SFTEvalBatches):
  """`SFTEvalBatches` of config.data.eval_rows synthetic rows of stream 1
  (`synthetic_rows`; config.data.source='synthetic'), made a batch at a
  time: made whole up front, a large eval_rows was numpy's MemoryError (or
  the host's memory) before anything ran."""

  def __init__(self, num_rows: int, *, seq_len: int, vocab_size: int,
               mask_token_id: int, global_batch_size: int,
               max_batches: int = -1, process_index: int = 0,
               process_count: int = 1):
    # Below 2**31: each row's index, which seeds its noise, is an int32
    # ("row").
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or not (
        0 < num_rows < 2**31):
      raise ValueError(f"config.data.eval_rows={num_rows!r} must be a "
                       "positive integer below 2**31 (the synthetic "
                       "held-out rows).")
    self._set_batches(num_rows, global_batch_size, max_batches,
                      process_index, process_count,
                      "config.data.source='synthetic'",
                      "raise config.data.eval_rows")
    self.row_args = (seq_len, vocab_size, mask_token_id, 1)
    self.num_rows = num_rows

  def fingerprint(self) -> str:
    return "synthetic-eval-{}-{}-{}-{}-{}".format(self.num_rows,
                                                  *self.row_args)

  def _rows(self, start: int):
    return synthetic_rows(start, self.local, *self.row_args)


def chat_pair_ids(pairs, tokenizer, chat: bool):
  """[(prompt ids, response ids)]: with `chat`, the prompt (a query, or a
  conversation's turns before the response) in the ChatML template and
  the response closed by <|im_end|>, as the Instruct model was fine-tuned.

  A special token's name inside a prompt or response ("<|mask|>" in code
  about Dream) is encoded as text, as in code files (`encode_text`): read
  as the token, <|mask|> would be clean data the model learns to output
  (and, in a prompt, a blank it is asked to fill), <|endoftext|> or
  <|im_end|> an end inside the answer. Only the template's own names are
  tokens.
  """
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  close = [tokenizer.im_end_id] if chat and tokenizer.im_end_id is not None \
      else []
  ids = []
  for prompt, response in pairs:
    # A query, or a conversation's turns, in the template as generation
    # builds it (a user turn stripped, as the query is).
    prompt_ids = (tok_lib.chat_prompt_ids(tokenizer, prompt) if chat
                  else tokenizer.encode_text(prompt))
    ids.append((prompt_ids, tokenizer.encode_text(response) + close))
  return ids


SOURCES = ("files", "tfds", "synthetic")  # config.data.source


def check_source(data_config) -> str:
  """config.data.source, one of `SOURCES` ('files' where the config
  predates the field)."""
  source = data_config.get("source", "files")
  if source not in SOURCES:
    raise ValueError(f"config.data.source={source!r} must be 'files' "
                     "(data.path), 'tfds' (data.tfds) or 'synthetic' (random "
                     "token rows, no data: for timing a mesh).")
  return source


def _from_tfds(data_config) -> bool:
  return check_source(data_config) == "tfds"


def read_rows(data_config, tokenizer, seq_len: int, path_key: str = "path",
              split_key: str = "split"):
  """(tokens, maskable) for data_config[path_key] (a file or glob) in the
  config's format, or, with data.source='tfds', for the split named by
  data.tfds[split_key]."""
  tfds = _from_tfds(data_config)
  path, what = data_config[path_key], f"data.{path_key}"
  if tfds:
    from trm.data.text import tfds_source  # pylint: disable=g-import-not-at-top
    path = f"tfds:{data_config.tfds.name}/{data_config.tfds[split_key]}"
  if data_config.format == "jsonl":
    if data_config.prompt_key == data_config.response_key:
      # Each row would train on its prompt copied as its response.
      raise ValueError(
          f"config.data.prompt_key and config.data.response_key are both "
          f"{data_config.prompt_key!r}: name the prompt's field and the "
          "response's, two different ones.")
    if tfds:
      pairs = [tuple(row) for row in tfds_source.texts(
          data_config.tfds, split_key,
          {data_config.prompt_key: "config.data.prompt_key",
           data_config.response_key: "config.data.response_key"})]
      names = [f"{path} record {i}" for i in range(len(pairs))]
    else:
      # Named by line, as the reader's own errors: an index is no line once
      # the file has blank lines, and off by one from an editor's count.
      lines = []
      pairs = read_jsonl_pairs(path, data_config.prompt_key,
                               data_config.response_key, what, lines)
      names = [f"{path}:{n}" for n in lines]
      if not data_config.chat:
        turns = next((i for i, (prompt, _) in enumerate(pairs)
                      if not isinstance(prompt, str)), None)
        if turns is not None:
          raise ValueError(
              f"{names[turns]}: a \"{MESSAGES}\" conversation needs the "
              "chat template; set config.data.chat=True.")
    pad_id = (tokenizer.dlm_pad_id if tokenizer.dlm_pad_id is not None
              else tokenizer.eos_id)
    token_pairs, names = drop_unusable(
        pairs, chat_pair_ids(pairs, tokenizer, data_config.chat), names,
        seq_len, f"config.{what}={path}" if not tfds else path)
    return pair_rows(token_pairs, seq_len, pad_id, source=path, names=names)
  if data_config.format == "code":
    if tfds:
      texts = [row[0] for row in tfds_source.texts(
          data_config.tfds, split_key,
          {data_config.tfds.feature: "config.data.tfds.feature"})]
    else:
      texts = read_code_files(path, what)
    # Documents are text: EOS comes only from packing.
    documents = [tokenizer.encode_text(text) for text in texts]
    return packed_rows(documents, seq_len, tokenizer.eos_id)
  raise ValueError(f"config.data.format={data_config.format!r} is not known; "
                   "use 'jsonl' (prompt/response pairs) or 'code' (files).")


def row_sources(data_config) -> tuple[str, str, str]:
  """(where the training rows come from, where the held-out rows do, how to
  get more held-out rows), as the config names them, for messages."""
  if _from_tfds(data_config):
    train = f"config.data.tfds.split={data_config.tfds.split!r}"
    held = data_config.tfds.eval_split and (
        f"config.data.tfds.eval_split={data_config.tfds.eval_split!r}")
  else:
    train = f"config.data.path={data_config.path}"
    held = data_config.eval_path and (
        f"config.data.eval_path={data_config.eval_path}")
  if held:
    return train, held, "add rows to it"
  return (train, f"the last config.data.eval_rows={data_config.eval_rows} "
          f"rows of {train}", "hold out more rows (data.eval_rows)")


def train_and_eval_rows(data_config, tokenizer, seq_len: int):
  """Training and held-out rows: `eval_path`'s (data.tfds.eval_split's), or
  the last `eval_rows` rows of `path` (of data.tfds.split)."""
  tfds = _from_tfds(data_config)
  if not tfds and not data_config.path:
    raise ValueError("config.data.path is empty: set it to a JSONL file of "
                     "prompt/response pairs or a glob of code files.")
  tokens, maskable = read_rows(data_config, tokenizer, seq_len)
  if data_config.tfds.eval_split if tfds else data_config.eval_path:
    return (tokens, maskable), read_rows(data_config, tokenizer, seq_len,
                                         "eval_path", "eval_split")
  held = data_config.eval_rows
  if not 0 < held < len(tokens):
    where = (f"data.tfds.split={data_config.tfds.split!r}" if tfds
             else data_config.path)
    instead = "data.tfds.eval_split" if tfds else "data.eval_path"
    raise ValueError(f"config.data.eval_rows={held} must be positive and "
                     f"below the {len(tokens)} rows of {where}, or set "
                     f"config.{instead}.")
  return ((tokens[:-held], maskable[:-held]),
          (tokens[-held:], maskable[-held:]))
