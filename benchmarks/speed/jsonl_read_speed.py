"""What refusing repeated JSON keys costs an SFT file's read.

`trm.data.text.sft.read_jsonl_pairs` parses each row with
`trm.data.io.json_record` (one decoder whose object hook refuses a key seen
twice in an object). This script writes a JSONL file of --rows rows (three
in four prompt/response pairs, one in four a three-turn `messages`
conversation), then times the whole read with that parser and with plain
`json.loads` in its place (what the reader did before session 77),
alternating rounds, best of --repeats per round:

  PYTHONPATH=. python benchmarks/speed/jsonl_read_speed.py --rows=100000
"""
from __future__ import annotations

import json
import os
import random
import tempfile
import time

from absl import app, flags

from trm.data import io as data_io
from trm.data.text import sft

_ROWS = flags.DEFINE_integer("rows", 100_000, "rows in the generated file")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "alternating rounds")
_REPEATS = flags.DEFINE_integer("repeats", 5, "reads per side per round")


def _write(path: str, rows: int) -> int:
  rng = random.Random(0)
  words = ["def", "return", "x", "value", "for", "in", "range", "print",
           "if", "else", "list", "self", "data", "import", "numpy", "="]
  text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
  with open(path, "w", encoding="utf-8") as f:
    for i in range(rows):
      if i % 4 == 3:
        row = {"messages": [
            {"role": "user", "content": text(60)},
            {"role": "assistant", "content": text(40)},
            {"role": "user", "content": text(30)}]}
        row["messages"].append({"role": "assistant", "content": text(80)})
      else:
        row = {"prompt": text(80), "response": text(120)}
      f.write(json.dumps(row) + "\n")
  return os.path.getsize(path)


def _best(path: str, parse, repeats: int) -> float:
  saved = data_io.json_record
  data_io.json_record = parse
  try:
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      pairs = sft.read_jsonl_pairs(path)
      best = min(best, time.perf_counter() - start)
    assert pairs, "no rows read"
    return best
  finally:
    data_io.json_record = saved


def main(argv):
  del argv
  print(f"load average: {os.getloadavg()}")
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "rows.jsonl")
    size = _write(path, _ROWS.value)
    print(f"{_ROWS.value} rows, {size / 2**20:.1f} MiB")
    sides = {"json.loads (before)": json.loads,
             "json_record (refuses repeats)": data_io.json_record}
    results = {name: [] for name in sides}
    for round_index in range(_ROUNDS.value):
      order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
      for name in order:
        results[name].append(_best(path, sides[name], _REPEATS.value))
    for name, times in results.items():
      print(f"{name:32s} " + "  ".join(f"{t:.3f} s" for t in times))
    before, after = (min(v) for v in results.values())
    print(f"best: {before:.3f} s -> {after:.3f} s ({after / before:.2f}x)")
  print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
  app.run(main)
