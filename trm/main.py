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

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, optionally with ':variant'.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory for checkpoints, logs and (by default) data.")
_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "true", "false"],
    "Call jax.distributed.initialize(): 'auto' does so on a multi-host TPU "
    "pod or when --coordinator_address is given.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (CPU/GPU clusters; "
    "TPU pods find it themselves).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Number of processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's index in the job.")
flags.mark_flags_as_required(["config", "workdir"])


def _on_multihost_tpu() -> bool:
  """Cloud TPU VMs name every worker of the slice in TPU_WORKER_HOSTNAMES."""
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  slices = int(os.environ.get("MEGASCALE_NUM_SLICES", "1") or 1)
  return len([h for h in hosts.split(",") if h.strip()]) > 1 or slices > 1


def initialize_distributed(jax) -> None:
  """Joins the multi-process job before anything touches devices."""
  wanted = _DISTRIBUTED.value
  if wanted == "false" or (wanted == "auto" and not _COORDINATOR.value
                           and not _on_multihost_tpu()):
    return
  if _COORDINATOR.value and (_NUM_PROCESSES.value is None
                             or _PROCESS_ID.value is None):
    raise app.UsageError("--coordinator_address needs --num_processes and "
                         "--process_id.")
  if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
    # CPU processes exchange collectives over gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(
      coordinator_address=_COORDINATOR.value,
      num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value,
      initialization_timeout=300)


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
    workdir = os.path.abspath(os.path.expanduser(workdir))
  try:
    train.train_and_evaluate(_CONFIG.value, workdir, families.build_task)
  except train.Preempted as e:  # a clean stop: the scheduler restarts us
    logging.warning("%s", e)
    sys.stderr.write(f"trm.main: {e}\n")
    sys.exit(cli.EXIT_CODES.get(e.signum, 0))


if __name__ == "__main__":
  cli.run(main)
