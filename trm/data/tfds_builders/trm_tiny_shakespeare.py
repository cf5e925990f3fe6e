"""`trm_tiny_shakespeare`: a text file, character-level, as random-access
ArrayRecord (TFDS), built offline from a local copy.

The public `tiny_shakespeare` builder downloads its file and stores each
split as ONE example, which is no use for random windows. This one reads
`--manual_dir` (a directory holding `input.txt`; TFDS wants a directory),
tokenises it exactly as `python -m trm.data.text.windows` does
(`preparation.char_splits`: vocabulary of the whole text, first 90% train,
last 10% validation) and
stores each split's token stream in fixed-size records of CHUNK_TOKENS
tokens (the last one shorter), in order. The reader
(`trm.data.text.tfds_source.TokenStream`) puts the stream back together, so a
run fed from here draws the same batches as one fed from train.bin.

    tfds build trm/data/tfds_builders/trm_tiny_shakespeare.py \
        --manual_dir=PATH/tinyshakespeare --data_dir=DATA_DIR
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow_datasets as tfds

from trm.data import io as data_io
from trm.data.text import preparation
from trm.data.text import text_codecs
from trm.data.tfds_builders import base

# Tokens per record: a window of block_size + 1 tokens spans at most
# ceil((block_size + 1) / CHUNK_TOKENS) + 1 records, so reads stay few and
# small for nanoGPT's block sizes (256-1024).
CHUNK_TOKENS = 4096
INPUT_NAME = "input.txt"


def input_path(manual_dir) -> str:
  """manual_dir's input.txt."""
  path = os.path.join(os.fspath(manual_dir), INPUT_NAME)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path} does not exist: pass --manual_dir=DIR with DIR/{INPUT_NAME}"
        " (e.g. tinyshakespeare's input.txt, or any UTF-8 text).")
  return path


class TrmTinyShakespeare(base.OrderedArrayRecordBuilder):
  """Character-level text in fixed-size token records (nanoGPT's split)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Char tokens of trm.data.text.windows, 4096 per record."}
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      f"Pass --manual_dir=DIR with DIR/{INPUT_NAME} (tinyshakespeare's "
      "input.txt, or any UTF-8 text).")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.ordered_info(__doc__, {
        "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
        "text": tfds.features.Text(),
    # meta.json's fields (vocab_size, itos, stoi, tokenizer, counts), saved
    # as metadata.json beside the records.
    }, metadata=tfds.core.MetadataDict())

  def input_files(self, manual_dir) -> list[str]:
    """The files a build reads (`tfds_builders.build` records their hash)."""
    return [input_path(manual_dir)]

  def _split_generators(self, dl_manager):
    path = input_path(dl_manager.manual_dir)
    meta, train_ids, val_ids = preparation.char_splits(
        data_io.read_utf8(path), path)
    self.info.metadata.update(meta, train_tokens=len(train_ids),
                              val_tokens=len(val_ids))
    codec = text_codecs.CharCodec(meta["itos"])
    return {"train": self._generate_examples(train_ids, codec),
            "validation": self._generate_examples(val_ids, codec)}

  def _generate_examples(self, ids, codec):
    ids = np.asarray(ids, np.int32)
    for i, start in enumerate(range(0, len(ids), CHUNK_TOKENS)):
      chunk = ids[start:start + CHUNK_TOKENS]
      yield i, {"tokens": chunk, "text": codec.decode(chunk)}
