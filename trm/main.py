r"""Entry point, identical on every worker:

  python -m trm.main --config=configs/trm_sudoku.py:cpu --workdir=runs/sudoku \
      [--config.total_steps=500 ...]

Re-running with the same --workdir resumes from its newest checkpoint.
"""
from __future__ import annotations

import logging as logging_std
import os

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':variant'.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, logs and (by default) data.")
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries(logging_std.Filter):
  """Drops INFO chatter of Orbax's internals (every save logs ~30 lines)."""

  def filter(self, record):
    return (record.levelno >= logging_std.WARNING
            or "/orbax/" not in record.pathname)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.get_absl_handler().addFilter(_QuietLibraries())
  # Imported here so --help and flag errors do not pay for importing jax.
  import jax  # pylint: disable=g-import-not-at-top
  from trm import train  # pylint: disable=g-import-not-at-top
  jax.config.parse_flags_with_absl()
  logging.info("JAX %s, %d processes, %d devices (%s)", jax.__version__,
               jax.process_count(), jax.device_count(),
               jax.devices()[0].platform)
  workdir = _WORKDIR.value
  if not workdir.startswith("gs://"):
    workdir = os.path.abspath(workdir)
  train.train_and_evaluate(_CONFIG.value, workdir)


if __name__ == "__main__":
  app.run(main)
