"""`python -m trm.data.tfds_builders NAME --manual_dir=... --data_dir=...`:
`tfds build` for this project's builders without the `tfds` script's
import-path rules (same result: ArrayRecord under DATA_DIR/NAME/...)."""
from __future__ import annotations

import os
from typing import Sequence

from absl import app
from absl import flags

from trm.core import cli
from trm.data import tfds_builders

_MANUAL_DIR = flags.DEFINE_string(
    "manual_dir", None, "Input directory: trm_tiny_shakespeare: holds "
    "input.txt; trm_code_files: the source root.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data directory to write to (what the training "
    "config's data.tfds.data_dir names).")
_PATTERN = flags.DEFINE_string(
    "pattern", "", "trm_code_files only: glob under --manual_dir (default "
    "**/*.py; another pattern is built as config 'custom').")
flags.mark_flags_as_required(["manual_dir", "data_dir"])


def main(argv: Sequence[str]) -> None:
  if len(argv) != 2:
    raise app.UsageError("Pass one builder name, e.g. trm_tiny_shakespeare.")
  # A leading ~ reaches us as typed (`--data_dir=~/x`): a folder named '~'.
  data_dir = cli.expand_home(_DATA_DIR.value)
  builder = tfds_builders.build(argv[1], cli.expand_home(_MANUAL_DIR.value),
                                data_dir, _PATTERN.value)
  splits = ", ".join(f"{name}: {info.num_examples} records"
                     for name, info in builder.info.splits.items())
  name = argv[1] + (f"/{builder.builder_config.name}" if _PATTERN.value
                    else "")
  print(f"wrote {builder.data_dir} ({splits})")
  print(f"train from it with --config.data.source=tfds "
        f"--config.data.tfds.name={name} "
        f"--config.data.tfds.data_dir={os.path.abspath(data_dir)}")


if __name__ == "__main__":
  cli.run(main, compilation_cache=False)  # a builder compiles nothing
