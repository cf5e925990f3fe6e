"""Weights & Biases as a CLU metric writer, beside TensorBoard.

  --config.wandb.enabled=True [--config.wandb.project=NAME
      --config.wandb.mode=offline ...]          (`pip install -e .[wandb]`)

Process 0 logs (as it writes every metric); the run's id is kept in the
workdir (`wandb_run_id`), so a resumed run goes on in the same W&B run.
Every value is logged with its trainer step under `STEP_KEY`, which the run
plots against: the loop writes train metrics one interval late, after the
progress hook and evaluations wrote later steps, and W&B drops values logged
at a step below its own counter.
"""
from __future__ import annotations

import importlib
import json
import os
import secrets
from typing import Any, Mapping

import numpy as np
from clu import metric_writers
from etils import epath

from trm.core import cli

STEP_KEY = "trainer/step"
MODES = ("online", "offline", "disabled")
RUN_ID_FILE = "wandb_run_id"


class WandbUnavailableError(cli.UserError, RuntimeError):
  """config.wandb.enabled is set but the wandb package is not installed."""


def check_config(config) -> None:
  """One-line errors naming the field, before anything is built."""
  wandb_config = config.get("wandb")
  if wandb_config is None or not wandb_config.enabled:
    return
  if wandb_config.mode not in MODES:
    raise ValueError(f"config.wandb.mode={wandb_config.mode!r} must be one "
                     f"of {list(MODES)}.")
  if not wandb_config.project:
    raise ValueError("config.wandb.project is empty: name the W&B project "
                     "to log to (or set config.wandb.enabled=False).")
  _import_wandb()


def _import_wandb():
  try:
    return importlib.import_module("wandb")
  except ImportError as e:
    raise WandbUnavailableError(
        f"config.wandb.enabled=True but wandb cannot be imported ({e}): "
        "`pip install -e .[wandb]`, or set config.wandb.enabled=False."
    ) from None


def _run_id(workpath: epath.Path) -> str:
  """The workdir's W&B run id, created by its first run."""
  path = workpath / RUN_ID_FILE
  if path.exists():
    return path.read_text().strip()
  run_id = secrets.token_hex(4)
  path.write_text(run_id)
  return run_id


def create(config, workdir: str) -> "WandbWriter":
  """Starts (or resumes) the workdir's W&B run; call on process 0 only."""
  wandb = _import_wandb()
  settings = config.wandb
  workpath = epath.Path(workdir)
  # W&B writes its files locally: where WANDB_DIR says, else into the
  # workdir (a gs:// one leaves wandb's default, ./wandb). Passed on each
  # call: wandb keeps the settings of a process's first run.
  local_dir = os.environ.get("WANDB_DIR") or (
      None if "://" in workdir else workdir)
  run = wandb.init(
      project=settings.project, entity=settings.entity or None,
      name=settings.name or None, mode=settings.mode, dir=local_dir,
      id=_run_id(workpath), resume="allow",
      config=json.loads(config.to_json_best_effort()),
      # Leave stdout/stderr alone: wrapping them would reach into the
      # command line's one-line errors and signal handling.
      settings=wandb.Settings(console="off"))
  run.define_metric(STEP_KEY)
  run.define_metric("*", step_metric=STEP_KEY)
  return WandbWriter(run, wandb)


def _number(value) -> float:
  return float(np.asarray(value))


class WandbWriter(metric_writers.MetricWriter):
  """Logs to one W&B run (`create` starts it)."""

  def __init__(self, run, wandb_module):
    self._run, self._wandb = run, wandb_module

  def _log(self, step: int, values: Mapping[str, Any]) -> None:
    if values:
      self._run.log({STEP_KEY: int(step), **values})

  def write_scalars(self, step, scalars):
    self._log(step, {k: _number(v) for k, v in scalars.items()})

  def write_summaries(self, step, values, metadata=None):
    del metadata  # TensorBoard plugin data; W&B has no use for it
    self._log(step, {k: _number(v) if np.size(v) == 1
                     else self._wandb.Histogram(np.ravel(v))
                     for k, v in values.items()})

  def write_images(self, step, images):
    # CLU's images are [H, W, C] or a batch [N, H, W, C].
    self._log(step, {k: [self._wandb.Image(x) for x in np.asarray(v)]
                     if np.ndim(v) == 4 else self._wandb.Image(np.asarray(v))
                     for k, v in images.items()})

  def write_videos(self, step, videos):
    # CLU: [N, T, H, W, C]; W&B: [N, T, C, H, W].
    self._log(step, {k: self._wandb.Video(
        np.moveaxis(np.asarray(v), -1, 2)) for k, v in videos.items()})

  def write_audios(self, step, audios, *, sample_rate):
    # CLU: [N, samples, channels], values in [-1, 1].
    self._log(step, {k: [self._wandb.Audio(x, sample_rate=sample_rate)
                         for x in np.asarray(v)] for k, v in audios.items()})

  def write_texts(self, step, texts):
    self._log(step, dict(texts))

  def write_histograms(self, step, arrays, num_buckets=None):
    buckets = num_buckets or {}
    self._log(step, {k: self._wandb.Histogram(
        np.ravel(np.asarray(v)), num_bins=min(512, buckets.get(k, 64)))
                     for k, v in arrays.items()})

  def write_hparams(self, hparams):
    self._run.config.update(dict(hparams), allow_val_change=True)

  def flush(self):
    pass  # W&B's service process sends (or writes) the data on its own

  def close(self):
    self._run.finish()
