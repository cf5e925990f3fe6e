"""The kit's JSON files: `--json FILE` outputs (the path checked before any
work, the file written whole or not at all through `trm.data.atomic_files`)
and the JSON-lines figures files it reads back (`read_lines`)."""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def _atomic_files():
  """trm.data.atomic_files, from this checkout."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  return atomic_files


def check_path(parser: argparse.ArgumentParser, path: str | None) -> None:
  """`parser.error` unless `path` (if given) can be a file in an existing
  directory: said before minutes of compiles, not after them."""
  if path and (os.path.isdir(path) or not os.path.isdir(
      os.path.dirname(os.path.abspath(path)))):
    parser.error(f"--json={path}: must be a file path in an existing "
                 "directory")
  if path and _atomic_files().is_special(path):
    # Taken, the JSON's write was refused only after the minutes of
    # compiles (`atomic_files.atomic_write`).
    parser.error(f"--json={path}: must be a file path, not a device or "
                 "FIFO")


def read_lines(path: str, script: str, flag: str | None = None) -> list:
  """The JSON objects of a JSON-lines file (a kit figures.jsonl), one a
  line; blank lines are skipped. A line that is not a JSON object stops
  the script with one line naming the file (as --flag=path when `flag` is
  given) and the line: SystemExit, as the kit's other input errors."""
  where = f"{script}: {flag}={path}" if flag else f"{script}: {path}"
  rows = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except ValueError as e:
        raise SystemExit(f"{where}: line {number} is not a JSON figure "
                         f"({e})") from None
      if not isinstance(row, dict):
        raise SystemExit(f"{where}: line {number} is not a JSON figure (a "
                         f"{type(row).__name__}, not an object)")
      rows.append(row)
  return rows


def write(path: str, value) -> None:
  """`value` as indented JSON at `path`, whole or not at all."""
  _atomic_files().atomic_write(path, lambda f: json.dump(value, f, indent=1),
                            mode="w")
