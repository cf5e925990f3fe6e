r"""Host time to build and read GPT batches: `.bin` memmap vs TFDS ArrayRecord.

  PYTHONPATH=. python benchmarks/speed/text_source_speed.py \
      --input=../shared/data/tinyshakespeare/input.txt

Builds `trm_tiny_shakespeare` (python -m trm.data.tfds_builders) and the
.bin directory (trm.data.text.windows) from the same text in a temporary directory,
checks that both give the same batches, then times `--batches` batches of
`--batch_size` x `--block_size` windows from each (`TokenWindows[k]`, what
one process's Grain iterator does per step), alternating the two over
`--rounds` and reporting the median per batch.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time

import ml_collections
import numpy as np
from absl import app
from absl import flags

from trm.data.text import preparation
from trm.data.text import windows as text
from trm.data.text import tfds_source
from trm.data import tfds_builders as tfds_build

_INPUT = flags.DEFINE_string("input", None, "Text file to build from.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per batch.")
_BLOCK = flags.DEFINE_integer("block_size", 256, "Tokens per row.")
_BATCHES = flags.DEFINE_integer("batches", 200, "Batches timed per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Alternating rounds.")
flags.mark_flag_as_required("input")


def _time(windows, batches: int) -> float:
  start = time.perf_counter()
  for k in range(batches):
    windows[k]
  return (time.perf_counter() - start) / batches


def main(argv):
  del argv
  corpus = text.read_text(_INPUT.value)
  with tempfile.TemporaryDirectory() as tmp:
    manual = tmp  # trm_tiny_shakespeare reads manual_dir/input.txt
    with open(os.path.join(tmp, "input.txt"), "w", encoding="utf-8") as f:
      f.write(corpus)
    start = time.perf_counter()
    tfds_build.build("trm_tiny_shakespeare", manual, os.path.join(tmp, "t"))
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    preparation.prepare_char(corpus, os.path.join(tmp, "bin"))
    prepare_s = time.perf_counter() - start
    config = ml_collections.ConfigDict(dict(
        name="trm_tiny_shakespeare", data_dir=os.path.join(tmp, "t"),
        split="train", eval_split="validation", feature="tokens"))
    args = (_BLOCK.value, _BATCH.value, 0)
    sources = {"bin": text.TokenWindows(os.path.join(tmp, "bin", "train.bin"),
                                        *args),
               "tfds": text.TokenWindows(tfds_source.TokenStream(config),
                                         *args)}
    for k in range(3):
      assert np.array_equal(sources["bin"][k]["x"], sources["tfds"][k]["x"])
    times = {name: [] for name in sources}
    for _ in range(_ROUNDS.value):
      for name, windows in sources.items():
        times[name].append(_time(windows, _BATCHES.value))
  print(f"{len(corpus):,} characters; build: tfds {build_s:.2f} s, "
        f".bin {prepare_s:.2f} s; batches identical")
  for name, values in times.items():
    rounds = ", ".join(f"{v * 1e3:.2f}" for v in values)
    print(f"{name}: {statistics.median(values) * 1e3:.2f} ms per "
          f"{_BATCH.value}x{_BLOCK.value} batch (rounds: {rounds})")


if __name__ == "__main__":
  app.run(main)
