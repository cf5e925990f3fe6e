"""Checks a run makes before it builds anything: config values, workdir."""
from __future__ import annotations

import math
import re

import jax
import ml_collections
from etils import epath

from trm.core import loss_scale
from trm.core import tpu_flags
from trm.core import wandb_writer


class WorkdirError(OSError):
  """The workdir cannot be created or written."""


def check_config(config) -> None:
  """Rejects values that would only fail (or misbehave) deep in the run."""
  for key in ("total_steps", "eval_every", "checkpoint_every", "log_every",
              "keep_checkpoints", "data.prefetch"):
    node = config
    for name in key.split("."):
      node = node[name]
    if node <= 0:
      raise ValueError(f"config.{key}={node} must be a positive integer.")
  if config.max_consecutive_bad_steps < 0:
    raise ValueError(
        f"config.max_consecutive_bad_steps={config.max_consecutive_bad_steps} "
        "must be >= 0 (0: never stop on non-finite steps).")
  for key, value in _rate_fields(config):
    # An infinite or NaN rate makes every parameter non-finite in one step;
    # a negative one climbs the loss.
    if not math.isfinite(value) or value < 0:
      raise ValueError(f"config.{key}={value} must be a finite number >= 0.")
  wandb_writer.check_config(config)
  loss_scale.check_config(config)
  tpu_flags.parse(config.get("tpu_compiler_options", ""))


def _rate_fields(node, prefix=""):
  """(dotted key, value) of every learning rate and weight decay."""
  for key, value in node.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _rate_fields(value, f"{prefix}{key}.")
    elif (isinstance(value, (int, float)) and not isinstance(value, bool)
          and re.search(r"(^|_)lr$|learning_rate|weight_decay", key)):
      yield prefix + key, float(value)


def check_workdir(workdir: str) -> epath.Path:
  """Creates the workdir and writes a file into it (every process, since
  each writes its checkpoint shards), so an unwritable one fails now rather
  than at the first checkpoint."""
  path = epath.Path(workdir)
  probe = path / f".write_test.{jax.process_index()}"
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe.write_text("ok")
    probe.unlink()
  except Exception as e:  # pylint: disable=broad-except
    raise WorkdirError(
        f"Cannot write to the workdir {workdir!r} ({type(e).__name__}: {e}); "
        "checkpoints, metrics and config.json go there. Pass a writable "
        "--workdir.") from e
  return path
