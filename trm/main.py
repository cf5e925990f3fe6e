r"""Entry point, identical on every worker:

  python -m trm.main --config=configs/trm_sudoku.py:cpu --workdir=runs/sudoku \
      [--config.total_steps=500 ...]

Re-running with the same --workdir resumes from its newest checkpoint. On
SIGTERM (or a TPU preemption notice) the run saves a checkpoint at the
current step and exits with status 0.
"""
from __future__ import annotations

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from trm.core import cli
from trm.core import config_lib
from trm.core import distributed

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':variant'.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, logs and (by default) data.")
flags.mark_flags_as_required(["config", "workdir"])
# The start-up every entry point shares (tests call it by this name).
initialize_distributed = distributed.initialize_distributed


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value.strip():
    # os.path.abspath('') is the current directory: checkpoints, logs and
    # config.json would land wherever the command was started.
    raise app.UsageError("--workdir is empty: pass the run's directory, "
                         "e.g. --workdir=runs/sudoku")
  # Imported here so --help and flag errors do not pay for importing jax.
  import jax  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import train  # pylint: disable=g-import-not-at-top
  jax.config.parse_flags_with_absl()
  initialize_distributed(jax)
  logging.info("JAX %s, %d processes, %d devices (%s)", jax.__version__,
               jax.process_count(), jax.device_count(),
               jax.devices()[0].platform)
  workdir = _WORKDIR.value
  if "://" not in workdir:
    # `--workdir=~/x` reaches us unexpanded (the shell expands a leading ~
    # only): a folder named '~' in the current one, which a later
    # `rm -rf ~` would miss badly.
    workdir = os.path.abspath(cli.expand_home(workdir))
  cli.expand_home_paths(_CONFIG.value)
  try:
    train.train_and_evaluate(_CONFIG.value, workdir, families.build_task)
  except train.Preempted as e:  # a clean stop: the scheduler restarts us
    logging.warning("%s", e)
    sys.stderr.write(f"trm.main: {e}\n")
    sys.exit(cli.EXIT_CODES.get(e.signum, 0))


if __name__ == "__main__":
  cli.run(main)
