"""`python -m trm.data.tfds_builders NAME --manual_dir=... --data_dir=...`:
`tfds build` for this project's builders without the `tfds` script's
import-path rules (same result: ArrayRecord under DATA_DIR/NAME/...)."""
from __future__ import annotations

import os
from typing import Sequence

from absl import app
from absl import flags

from trm import cli

_MANUAL_DIR = flags.DEFINE_string(
    "manual_dir", None, "Input: trm_tiny_shakespeare: a directory with "
    "input.txt or the text file; trm_code_files: the source root.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory to write to (what the training "
    "config's data.tfds.data_dir names).")
_PATTERN = flags.DEFINE_string(
    "pattern", "", "trm_code_files only: glob under --manual_dir (default "
    "**/*.py; another pattern is built as config 'custom').")
flags.mark_flags_as_required(["manual_dir", "data_dir"])


def build(name: str, manual_dir: str, data_dir: str, pattern: str = ""):
  """Prepares builder `name` into `data_dir`; returns the builder."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from trm.data import tfds_builders  # pylint: disable=g-import-not-at-top
  if name not in tfds_builders.BUILDERS:
    raise ValueError(f"Unknown builder {name!r}; this project has "
                     f"{sorted(tfds_builders.BUILDERS)}.")
  if not os.path.exists(manual_dir):
    raise FileNotFoundError(f"--manual_dir={manual_dir} does not exist.")
  kwargs = {}
  if pattern:
    if name != "trm_code_files":
      raise ValueError("--pattern applies to trm_code_files only.")
    kwargs["config"] = tfds_builders.trm_code_files.CodeFilesConfig(
        name="custom", pattern=pattern)
  builder = tfds_builders.BUILDERS[name](data_dir=data_dir, **kwargs)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


def main(argv: Sequence[str]) -> None:
  if len(argv) != 2:
    raise app.UsageError("Pass one builder name, e.g. trm_tiny_shakespeare.")
  builder = build(argv[1], _MANUAL_DIR.value, _DATA_DIR.value,
                  _PATTERN.value)
  splits = ", ".join(f"{name}: {info.num_examples} records"
                     for name, info in builder.info.splits.items())
  print(f"wrote {builder.data_dir} ({splits})")


if __name__ == "__main__":
  cli.run(main)
