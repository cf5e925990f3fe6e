"""Reading users' text files with errors that name the file and the place."""
from __future__ import annotations

import hashlib
import io
import json
import os

import numpy as np


def check_regular_file(path: str, fix: str = "") -> None:
  """A ValueError naming `path` when it exists but is no regular file: a
  FIFO or a device named where a file belongs would block the read (or
  never end); a directory would fail with a bare IsADirectoryError."""
  if os.path.exists(path) and not os.path.isfile(path):
    raise ValueError(f"{path} is not a regular file (a directory, FIFO or "
                     "device); name a file" + (f"; {fix}" if fix else "")
                     + ".")


def check_npy_size(path: str) -> None:
  """A ValueError when the .npy file `path`'s header declares more data
  than the file holds (truncated, or crafted): np.load would first try to
  allocate all of it, and a header of a few bytes can ask for TiBs (a
  MemoryError's traceback), or that is no regular file (a FIFO blocked
  np.load), or is empty (np.load's EOFError). Callers name the file, as
  for np.load's own errors; a header it cannot parse is left to np.load."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  check_regular_file(path)  # a FIFO would block the read (np.load's too)
  if os.path.getsize(path) == 0:  # np.load's EOFError was a traceback
    raise ValueError("it is empty (0 bytes)")
  with open(path, "rb") as f:
    try:
      version = np.lib.format.read_magic(f)
      if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(
            f, max_header_size=1 << 20)
      elif version in ((2, 0), (3, 0)):
        # 3.0 is 2.0's layout with a UTF-8 header (field names aside, the
        # same text): np.load has no such check there, and a 200-byte file
        # declaring 4 TiB was a MemoryError traceback.
        length = int.from_bytes(f.read(4), "little")
        if length > 1 << 20:
          return
        header = length.to_bytes(4, "little") + f.read(length)
        shape, _, dtype = np.lib.format.read_array_header_2_0(
            io.BytesIO(header), max_header_size=1 << 20)
      else:
        return
    except (ValueError, SyntaxError, UnicodeDecodeError):
      return
    held = os.fstat(f.fileno()).st_size - f.tell()
  declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
  if declared > held:
    raise ValueError(f"its header declares a {dtype} array of shape "
                     f"{shape} ({declared:,} bytes), but the file holds "
                     f"{held:,} bytes after it (truncated or damaged)")


def decode_utf8(data: bytes, path: str, fix: str = "") -> str:
  """`data` as UTF-8; a ValueError naming `path` and the byte offset of the
  first invalid byte otherwise (Python's own error names neither)."""
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise ValueError(
        f"{path}: not UTF-8 text: byte 0x{data[e.start]:02x} at offset "
        f"{e.start} (line {line}) is invalid ({e.reason}). Convert the file "
        "to UTF-8 (e.g. iconv -f latin1 -t utf-8)" + (f"; {fix}" if fix else "")
        + ".") from None


def read_utf8(path: str, fix: str = "") -> str:
  """The whole of a local text file, strictly UTF-8 (see `decode_utf8`)."""
  check_regular_file(path, fix)
  with open(path, "rb") as f:
    return decode_utf8(f.read(), path, fix)


class RepeatedKey(ValueError):
  """A JSON object holding one key twice (`json_record`); `key` is it."""

  def __init__(self, key: str):
    shown = json.dumps(key)
    if len(shown) > 60:
      shown = shown[:56] + '..."'
    super().__init__(f"key {shown} appears twice in one object (Python's "
                     "json would keep the last value without a word); "
                     "remove one of them")
    self.key = key


def refuse_repeated_keys(pairs):
  """json's object_pairs_hook: a dict, or `RepeatedKey` for a key given
  twice."""
  record = dict(pairs)
  if len(record) != len(pairs):
    seen = set()
    for key, _ in pairs:
      if key in seen:
        raise RepeatedKey(key)
      seen.add(key)
  return record


_RECORD_DECODER = json.JSONDecoder(object_pairs_hook=refuse_repeated_keys)


def json_record(line: str):
  """json.loads(line) for a line of a user's JSONL file, but an object
  (at any depth) holding a key twice raises `RepeatedKey` (json.loads
  keeps the last value without a word, and a run trained on it). One
  decoder for every line (json.loads with a hook builds one a call)."""
  if line.startswith("\ufeff"):
    return json.loads(line)  # json's own "Unexpected UTF-8 BOM" error
  return _RECORD_DECODER.decode(line)


def split_lines(text: str) -> list[str]:
  """The lines of a text written on any system: CRLF (Windows) and CR line
  ends count as LF, and a leading byte-order mark is dropped, so a file
  saved by a Windows editor reads the same. Only these (unlike
  str.splitlines, which also splits at form feeds and U+2028)."""
  text = text.removeprefix("\ufeff")
  return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def files_sha256(paths, root: str) -> str:
  """SHA-256 of files' names (relative to `root`) and contents, in the
  order given: what a build read, to tell whether its inputs changed."""
  digest = hashlib.sha256()
  for path in paths:
    digest.update(os.path.relpath(path, root).encode() + b"\0")
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    digest.update(b"\0")
  return digest.hexdigest()


# `file_digest` hashes a file whole up to this size; a larger one by its
# size and _DIGEST_BLOCKS blocks of _DIGEST_BLOCK_BYTES spread over it
# (256 MiB read, not GBs on every start).
_DIGEST_WHOLE_BYTES = 1 << 30
_DIGEST_BLOCKS = 256
_DIGEST_BLOCK_BYTES = 1 << 20


def file_digest(path: str) -> str:
  """A SHA-256 of a file's size and bytes (of spread blocks of them past
  _DIGEST_WHOLE_BYTES): whether a text is the one a directory was prepared
  from, where its size alone took another text of the same length (a
  generated corpus, an edit in place) for it."""
  stat = os.stat(path)
  key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns, stat.st_ino)
  if key not in _digests:  # a start compares it more than once
    _digests[key] = _file_digest(path, stat.st_size)
  return _digests[key]


_digests = {}


def _file_digest(path: str, size: int) -> str:
  digest = hashlib.sha256(f"{size}\0".encode())
  with open(path, "rb") as f:
    if size <= _DIGEST_WHOLE_BYTES:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    else:
      for start in np.linspace(0, size - _DIGEST_BLOCK_BYTES,
                               _DIGEST_BLOCKS).astype(np.int64):
        f.seek(int(start))
        digest.update(f.read(_DIGEST_BLOCK_BYTES))
  return digest.hexdigest()


def spread_positions(n: int, blocks: int, block: int) -> np.ndarray:
  """What a fingerprint of `n` items reads: every position when n <=
  blocks * block, else `blocks` runs of `block` consecutive positions
  spread evenly over [0, n) (hashing a multi-GB file on every start would
  take minutes; other data differs in those runs or the length all but
  surely)."""
  if n <= blocks * block:
    return np.arange(n)
  starts = np.linspace(0, n - block, blocks).astype(np.int64)
  return (starts[:, None] + np.arange(block)).ravel()
