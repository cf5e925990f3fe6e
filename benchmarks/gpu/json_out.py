"""The kit's `--json FILE` outputs: the path checked before any work, the
file written whole or not at all (through `trm.data.atomic_files`)."""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


def check_path(parser: argparse.ArgumentParser, path: str | None) -> None:
  """`parser.error` unless `path` (if given) can be a file in an existing
  directory: said before minutes of compiles, not after them."""
  if path and (os.path.isdir(path) or not os.path.isdir(
      os.path.dirname(os.path.abspath(path)))):
    parser.error(f"--json={path}: must be a file path in an existing "
                 "directory")


def write(path: str, value) -> None:
  """`value` as indented JSON at `path`, whole or not at all."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  atomic_files.atomic_write(path, lambda f: json.dump(value, f, indent=1),
                            mode="w")
