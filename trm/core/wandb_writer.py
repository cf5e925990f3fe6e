"""Weights & Biases as a CLU metric writer, beside TensorBoard.

  --config.wandb.enabled=True [--config.wandb.project=NAME
      --config.wandb.mode=offline ...]          (`pip install -e .[wandb]`)

`check_config` runs before any data is built: wandb missing (or failing to
import) stops the run in one line naming config.wandb.enabled; in online
mode, process 0 looks for an API key (WANDB_API_KEY, an identity token, or
`wandb login`'s netrc entry) and probes the W&B host (behind a proxy, the
proxy) with a TCP connection bounded to `PROBE_SECONDS`
(`trm.core.net_probe`).
Without either, the run logs offline instead (config.wandb.mode becomes
'offline', one warning says so and how to upload the files later with
`wandb sync`), rather than hanging in wandb.init for its 90-second timeout
or stopping with its traceback.

Process 0 logs (as it writes every metric); the run's id is kept in the
workdir (`wandb_run_id`), so a resumed run goes on in the same W&B run.
Every value is logged with its trainer step under `STEP_KEY`, which the run
plots against: the loop writes train metrics one interval late, after the
progress hook and evaluations wrote later steps, and W&B drops values logged
at a step below its own counter.
"""
from __future__ import annotations

import configparser
import importlib
import json
import netrc
import os
import secrets
from typing import Any, Mapping, Optional
from urllib.parse import urlsplit

from absl import logging
import numpy as np
from clu import metric_writers
from etils import epath

from trm.core import cli
from trm.core import net_probe
from trm.data import atomic_files

STEP_KEY = "trainer/step"
MODES = ("online", "offline", "disabled")
RUN_ID_FILE = "wandb_run_id"
DEFAULT_BASE_URL = "https://api.wandb.ai"
# The longest the online check may take (a TCP connection to the W&B host,
# DNS included).
PROBE_SECONDS = 5.0

# Set when the online check fell back to offline but the config could not
# be changed (a frozen config): `create` then logs offline all the same.
_forced_offline = False


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
  wandb = _import_wandb()
  try:
    # W&B's own rules (no '/', '#', '?', '%', ':', '\\'; at most 128
    # characters): wandb.init refused such a name only after the data was
    # built and the model initialised, saying to disable W&B.
    wandb.Settings(project=wandb_config.project)
  except Exception as e:  # pylint: disable=broad-except  # its UsageError
    raise ValueError(f"config.wandb.project={wandb_config.project!r} is "
                     f"no W&B project name ({' '.join(str(e).split())}); "
                     "rename it.") from None
  global _forced_offline
  _forced_offline = False
  if wandb_config.mode != "online" or not _is_main_process():
    return
  problem = online_problem()
  if problem is None:
    return
  logging.warning(
      "config.wandb.mode='online' but %s: logging to W&B offline instead "
      "(the run's files go under %s; upload them later with `wandb sync "
      "DIR`). Set config.wandb.mode='offline' to skip this check, or "
      "config.wandb.enabled=False.", problem,
      os.environ.get("WANDB_DIR") or "the workdir's wandb/")
  try:
    wandb_config.mode = "offline"
  except Exception:  # pylint: disable=broad-except  # a frozen config
    _forced_offline = True


def _is_main_process() -> bool:
  try:
    import jax  # pylint: disable=g-import-not-at-top
    return jax.process_index() == 0
  except Exception:  # pylint: disable=broad-except
    return True


def _import_wandb():
  try:
    return importlib.import_module("wandb")
  except Exception as e:  # pylint: disable=broad-except
    # ImportError, or a broken install (e.g. a protobuf mismatch).
    raise WandbUnavailableError(
        f"config.wandb.enabled=True but wandb cannot be imported "
        f"({type(e).__name__}: {' '.join(str(e).split())[:200]}): "
        "`pip install -e .[wandb]`, or set config.wandb.enabled=False."
    ) from None


def base_url() -> str:
  """The W&B server: WANDB_BASE_URL, else `wandb login --host`'s setting,
  else the public cloud."""
  if os.environ.get("WANDB_BASE_URL"):
    return os.environ["WANDB_BASE_URL"]
  config_dir = os.environ.get("WANDB_CONFIG_DIR") or os.path.join(
      os.path.expanduser("~"), ".config", "wandb")
  parser = configparser.ConfigParser()
  try:
    parser.read(os.path.join(config_dir, "settings"))
    return parser.get("default", "base_url", fallback="") or DEFAULT_BASE_URL
  except (configparser.Error, OSError, UnicodeDecodeError):
    return DEFAULT_BASE_URL


def _netrc_path() -> str:
  """The netrc file `wandb login` writes (as wandb finds it)."""
  if os.environ.get("NETRC"):
    return os.path.expanduser(os.environ["NETRC"])
  for name in ("~/.netrc", "~/_netrc"):
    if os.path.exists(os.path.expanduser(name)):
      return os.path.expanduser(name)
  return os.path.expanduser("~/.netrc")


def has_credentials(url: Optional[str] = None) -> bool:
  """An API key or identity token W&B would use for `url`, found without
  the network."""
  if os.environ.get("WANDB_API_KEY") or os.environ.get(
      "WANDB_IDENTITY_TOKEN_FILE"):
    return True
  host = urlsplit(url or base_url()).netloc
  try:
    return bool(host and netrc.netrc(_netrc_path()).authenticators(host))
  except (OSError, netrc.NetrcParseError):
    return False


def reachable(url: str, timeout: Optional[float] = None) -> Optional[str]:
  """None if a TCP connection to `url`'s host (or the proxy to it) opens
  within `timeout` seconds (default `PROBE_SECONDS`; DNS included), else
  why not."""
  timeout = PROBE_SECONDS if timeout is None else timeout
  problem = net_probe.probe(url, timeout, shared=True)
  if problem is None:
    return None
  named = (f"proxy URL {problem.proxy!r} (from the environment's *_PROXY)"
           if problem.proxy else f"W&B host URL {url!r}")
  if problem.kind == "bad_url":
    return f"the {named} is no URL ({problem.detail})"
  if problem.kind == "no_host":
    return f"the {named} names no host"
  if problem.kind == "bad_port":
    return f"the {named} has a bad port"
  via = f" (its proxy {problem.proxy!r})" if problem.proxy else ""
  return (f"{problem.host}:{problem.port}{via} is unreachable "
          f"({problem.detail})")


def online_problem(timeout: Optional[float] = None) -> Optional[str]:
  """Why W&B cannot log online from here (no credentials, no network), or
  None. Takes at most `timeout` seconds (default `PROBE_SECONDS`)."""
  url = base_url()
  try:
    urlsplit(url)
  except ValueError as e:  # WANDB_BASE_URL="http://[::1": a traceback
    return f"the W&B host URL {url!r} is no URL ({e})"
  if not has_credentials(url):
    return ("no W&B API key is set up (WANDB_API_KEY, or `wandb login` "
            f"for {urlsplit(url).netloc or url})")
  problem = reachable(url, timeout)
  return None if problem is None else f"the W&B server {problem}"


def _run_id(workpath: epath.Path, wandb) -> str:
  """The workdir's W&B run id, created by its first run."""
  path = workpath / RUN_ID_FILE
  try:
    run_id = path.read_text().strip() if path.exists() else ""
  except UnicodeDecodeError as e:
    raise WandbUnavailableError(
        f"{path} is no text ({e.reason} at byte {e.start}), so no W&B run "
        "id: write the id of the W&B run to go on with there, or delete the "
        "file to start a new one.") from None
  if not run_id:
    # None yet, or an empty file (the first write failed: a full disk), and
    # so no W&B run to go on with (wandb.init comes after the write). An
    # empty id had every later run of the workdir stop in wandb.init.
    run_id = secrets.token_hex(4)
    atomic_files.replace_whole(path, run_id)
    return run_id
  try:
    wandb.Settings(run_id=run_id)  # W&B's own rules for an id
  except Exception as e:  # pylint: disable=broad-except  # its UsageError
    raise WandbUnavailableError(
        f"{path} holds {run_id[:100]!r}, no W&B run id "
        f"({' '.join(str(e).split())}): write the id of the W&B run to go "
        "on with there, or delete the file to start a new one.") from None
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
  mode = "offline" if _forced_offline else settings.mode
  run_id = _run_id(workpath, wandb)

  def init(mode):
    return wandb.init(
        project=settings.project, entity=settings.entity or None,
        name=settings.name or None, mode=mode, dir=local_dir,
        id=run_id, resume="allow",
        config=json.loads(config.to_json_best_effort()),
        # Leave stdout/stderr alone: wrapping them would reach into the
        # command line's one-line errors and signal handling.
        settings=wandb.Settings(console="off"))

  def failed(mode, e):
    return WandbUnavailableError(
        f"wandb.init failed in config.wandb.mode={mode!r} "
        f"({type(e).__name__}: {' '.join(str(e).split())[:300]}); set "
        "config.wandb.enabled=False to train without W&B.")

  try:
    run = init(mode)
  except Exception as e:  # pylint: disable=broad-except
    if mode != "online":
      raise failed(mode, e) from None
    # Passed the check but failed all the same (credentials refused, the
    # server erring): the metrics still go somewhere.
    logging.warning(
        "wandb.init failed online (%s: %s): logging to W&B offline instead; "
        "upload the files later with `wandb sync DIR`.", type(e).__name__,
        " ".join(str(e).split())[:300])
    try:
      run = init("offline")
    except Exception as e2:  # pylint: disable=broad-except
      raise failed("offline", e2) from None
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
