"""TFRecord framing for TensorBoard event files, standard library only.

Each record is: its length (uint64, little-endian), the masked CRC-32C of
those 8 bytes (uint32), the data, the masked CRC-32C of the data (uint32).
tensorboard's own `RecordWriter` does the same, but importing it imports
the whole `tensorboard.summary` package, its TensorFlow stub and the
stub's gfile (boto3, fsspec): with the hparams plugin's summary function,
0.30-0.35 s of a process's first writes on the 2-core host
(benchmarks/speed/event_writer_seconds.py), for a dozen lines of framing.
"""
from __future__ import annotations

import struct

_CASTAGNOLI = 0x82F63B78  # CRC-32C's polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8  # TFRecord's mask: rotate right by 15, add this


def _table() -> tuple[int, ...]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (_CASTAGNOLI if crc & 1 else 0)
    table.append(crc)
  return tuple(table)


_TABLE = _table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli) of `data`, as iSCSI and TFRecord use it."""
  crc = 0xFFFFFFFF
  table = _TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """The CRC TFRecord stores: masked so that a record holding CRCs of its
  own does not checksum to a fixed pattern."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
  """`data` as one TFRecord record."""
  header = struct.pack("<Q", len(data))
  return b"".join((header, struct.pack("<I", masked_crc32c(header)), data,
                   struct.pack("<I", masked_crc32c(data))))
