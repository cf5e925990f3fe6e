"""Writes tests/file_seconds.json (seconds per test file, which
tests/conftest.py uses to hand CI's two processes the longest files first)
from the output of `pytest --durations=0`:

  python -m pytest -q -n 2 --dist loadfile --durations=0 tests > LOG
  python tests/file_seconds.py LOG
"""
import collections
import json
import os
import re
import sys

_LINE = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+?\.py)::")


def main(log_path: str) -> None:
  seconds = collections.Counter()
  with open(log_path, encoding="utf-8") as f:
    for line in f:
      match = _LINE.match(line)
      if match:
        seconds[match.group(2)] += float(match.group(1))
  if not seconds:
    sys.exit(f"{log_path}: no `--durations=0` lines found")
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "file_seconds.json")
  with open(out, "w", encoding="utf-8") as f:
    json.dump({k: round(v, 1) for k, v in sorted(seconds.items())}, f,
              indent=1)
    f.write("\n")
  print(f"{out}: {len(seconds)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
  main(sys.argv[1])
