"""The W&B metric writer (`trm.core.wandb_writer`), run offline: a few train
steps, then the run's own transaction log is read back."""
import glob
import importlib
import json
import os
import struct
import time
import sys

import numpy as np
import pytest

from test_train import tiny_config  # pylint: disable=g-import-not-at-top
from trm.core import cli
from trm.core import config_lib
from trm.core import wandb_writer


def _history(run_dir: str, until=lambda rows: True,
             seconds: float = 60) -> list[dict]:
  """The logged rows of an offline run's `run-<id>.wandb` file, read again
  until `until(rows)` holds (at most `seconds`): W&B's service process may
  still be writing its buffer after `run.finish()` returns (an empty read
  on a loaded CI host)."""
  deadline = time.monotonic() + seconds
  while True:
    rows = _read_history(run_dir)
    if until(rows) or time.monotonic() > deadline:
      return rows
    time.sleep(0.5)


def _read_history(run_dir: str) -> list[dict]:
  """The file's rows as written so far (a LevelDB-style log of Record
  protos: 32 KiB blocks, 7-byte record headers)."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=g-import-not-at-top
  (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
  data = open(path, "rb").read()
  assert data[:4] == b":W&B"
  block, pos, parts, rows = 32768, 7, b"", []
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # a block's zero-padded tail
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if (length == 0 and kind == 0) or pos + 7 + length > len(data):
      break  # the end, or a record still being written
    parts += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL or LAST: a whole record
      record = wandb_internal_pb2.Record()
      record.ParseFromString(parts)
      parts = b""
      if record.WhichOneof("record_type") == "history":
        rows.append({item.key or "/".join(item.nested_key):
                     json.loads(item.value_json)
                     for item in record.history.item})
  return rows


def _offline(monkeypatch, tmp_path):
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
  monkeypatch.setenv("WANDB_SILENT", "true")
  os.makedirs(tmp_path / "wandb_dir")


def test_a_short_run_logs_its_metrics_offline(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  from trm.core import train  # pylint: disable=g-import-not-at-top
  from trm import families
  _offline(monkeypatch, tmp_path)
  workdir = tmp_path / "run"
  config = tiny_config(**{
      "data.data_dir": str(tmp_path / "data"), "total_steps": 6,
      "eval_every": 6, "checkpoint_every": 6, "log_every": 3,
      "wandb.enabled": True, "wandb.mode": "offline", "wandb.name": "t"})
  _, results = train.train_and_evaluate(config, str(workdir), families.build_task)

  run_id = (workdir / wandb_writer.RUN_ID_FILE).read_text()
  (run_dir,) = glob.glob(str(tmp_path / "wandb_dir" / "wandb" /
                             f"offline-run-*-{run_id}"))
  rows = _history(run_dir, until=lambda rows: any("eval/loss" in r
                                                  for r in rows))
  step = wandb_writer.STEP_KEY
  train_steps = [r[step] for r in rows if "train/lm_loss" in r]
  assert train_steps == [3, 6], rows  # written one interval late, all kept
  assert all(np.isfinite(r["train/lm_loss"]) for r in rows
             if "train/lm_loss" in r)
  (eval_row,) = [r for r in rows if "eval/loss" in r]
  assert eval_row[step] == 6
  assert eval_row["eval/loss"] == pytest.approx(results["eval/loss"])
  saved = json.loads((workdir / "eval_6.json").read_text())
  assert eval_row["eval/loss"] == pytest.approx(saved["eval/loss"])


def test_other_kinds_of_values(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  _offline(monkeypatch, tmp_path)
  config = config_lib.load_config("configs/trm_sudoku.py", "cpu")
  config_lib.set_values(config, {"wandb.enabled": True,
                                 "wandb.mode": "offline"})
  writer = wandb_writer.create(config, str(tmp_path))
  writer.write_hparams({"num_params": 123})
  writer.write_images(1, {"sheet": np.zeros((2, 4, 4, 3), np.uint8)})
  writer.write_histograms(1, {"w": np.arange(10.0)}, {"w": 5})
  writer.write_texts(2, {"note": "hello"})
  writer.write_summaries(2, {"s": np.float32(0.5)})
  writer.close()
  (run_dir,) = glob.glob(str(tmp_path / "wandb_dir" / "wandb" /
                             "offline-run-*"))
  # One row per write; nested keys joined by /.
  rows = _history(run_dir, until=lambda rows: len(rows) >= 4)
  images, histogram, text, summary = rows
  assert images[wandb_writer.STEP_KEY] == 1 and images["sheet/count"] == 2
  assert histogram["w/_type"] == "histogram"
  assert histogram["w/values"] == [2, 2, 2, 2, 2]  # 10 values in 5 buckets
  assert text == {wandb_writer.STEP_KEY: 2, "note": "hello", **{
      k: v for k, v in text.items() if k.startswith("_")}}
  assert summary["s"] == 0.5

def test_enabled_without_wandb_is_one_clear_line(monkeypatch):
  real_import = importlib.import_module

  def no_wandb(name, *args):
    if name == "wandb":
      raise ImportError("No module named 'wandb'")
    return real_import(name, *args)

  monkeypatch.setattr(importlib, "import_module", no_wandb)
  config = config_lib.load_config("configs/gpt.py")
  config_lib.set_values(config, {"wandb_log": True})  # nanoGPT's name
  with pytest.raises(wandb_writer.WandbUnavailableError) as error:
    wandb_writer.check_config(config)
  assert cli.is_user_error(error.value)
  line = cli.one_line(error.value)
  assert "config.wandb.enabled=True" in line and ".[wandb]" in line
  config_lib.set_values(config, {"wandb_log": False})
  wandb_writer.check_config(config)  # disabled: wandb is not needed


@pytest.mark.parametrize("field,value,message", [
    ("wandb.mode", "cloud", "config.wandb.mode='cloud' must be one of"),
    ("wandb.project", "", "config.wandb.project is empty"),
])
def test_bad_settings_name_the_field(field, value, message):
  config = config_lib.load_config("configs/diffucoder_7b.py", "tiny")
  config_lib.set_values(config, {"wandb.enabled": True, field: value})
  with pytest.raises(ValueError, match=message):
    wandb_writer.check_config(config)


def test_a_project_name_wandb_refuses_names_the_field_before_any_data():
  """wandb.init refused config.wandb.project='my/proj' only after the data
  was built and the model initialised, in a line saying to disable W&B."""
  pytest.importorskip("wandb")
  config = config_lib.load_config("configs/diffucoder_7b.py", "tiny")
  config_lib.set_values(config, {"wandb.enabled": True,
                                 "wandb.mode": "offline",
                                 "wandb.project": "my/proj"})
  with pytest.raises(ValueError, match=r"config.wandb.project='my/proj' is "
                     r"no W&B project name \(.*'/'.*\); rename it"):
    wandb_writer.check_config(config)


def _fake_init(monkeypatch):
  """wandb.init recording the run ids it is given (no W&B process)."""
  import wandb  # pylint: disable=g-import-not-at-top
  ids = []

  class Run:
    def define_metric(self, *args, **kwargs):
      pass

  monkeypatch.setattr(wandb, "init", lambda **kw: ids.append(kw["id"])
                      or Run())
  return ids


@pytest.mark.parametrize("text", ["", "\n"])
def test_an_empty_run_id_file_starts_a_new_run(tmp_path, monkeypatch, text):
  """The id file is written before wandb.init, so an empty one (its write
  failed) names no W&B run: every later run of the workdir stopped in
  wandb.init ('Run ID cannot be empty')."""
  pytest.importorskip("wandb")
  ids = _fake_init(monkeypatch)
  (tmp_path / wandb_writer.RUN_ID_FILE).write_text(text)
  config = _online_config()
  config_lib.set_values(config, {"wandb.mode": "offline"})
  wandb_writer.create(config, str(tmp_path))
  assert len(ids) == 1 and len(ids[0]) == 8, ids
  assert (tmp_path / wandb_writer.RUN_ID_FILE).read_text() == ids[0]
  wandb_writer.create(config, str(tmp_path))  # resumed: the same run
  assert ids[1] == ids[0]


@pytest.mark.parametrize("content, message", [
    (b"a/b", "holds 'a/b', no W&B run id"), (b"\xff\xfe", "is no text")])
def test_a_damaged_run_id_file_is_one_line_naming_it(tmp_path, monkeypatch,
                                                     content, message):
  """An id W&B refuses stopped the run with 'wandb.init failed ...; set
  config.wandb.enabled=False', naming neither the file nor its fix."""
  pytest.importorskip("wandb")
  ids = _fake_init(monkeypatch)
  path = tmp_path / wandb_writer.RUN_ID_FILE
  path.write_bytes(content)
  config = _online_config()
  config_lib.set_values(config, {"wandb.mode": "offline"})
  with pytest.raises(wandb_writer.WandbUnavailableError) as error:
    wandb_writer.create(config, str(tmp_path))
  line = cli.one_line(error.value)
  assert f"error: {path} {message}" in line and "delete the file" in line
  assert not ids  # refused before wandb.init
  assert path.read_bytes() == content  # kept for the user to mend


# ------------------------------------------- online without network (#25)


def _online_config():
  config = config_lib.load_config("configs/diffucoder_7b.py", "tiny")
  config_lib.set_values(config, {"wandb.enabled": True,
                                 "wandb.mode": "online"})
  return config


def _no_credentials(monkeypatch, tmp_path):
  for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL",
              "WANDB_MODE"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv("NETRC", str(tmp_path / "no_netrc"))
  monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "no_wandb_config"))


def _warnings(monkeypatch):
  seen = []
  monkeypatch.setattr(wandb_writer.logging, "warning",
                      lambda msg, *args: seen.append(msg % args))
  return seen


def _closed_port() -> int:
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_online_without_credentials_logs_offline_with_one_warning(
    tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  _no_credentials(monkeypatch, tmp_path)
  seen = _warnings(monkeypatch)
  config = _online_config()
  start = time.monotonic()
  wandb_writer.check_config(config)
  assert time.monotonic() - start < 2
  assert config.wandb.mode == "offline"
  assert len(seen) == 1, seen
  assert "config.wandb.mode='online'" in seen[0]
  assert "no W&B API key" in seen[0] and "wandb sync" in seen[0]


def test_online_with_an_unreachable_server_logs_offline(tmp_path,
                                                        monkeypatch):
  pytest.importorskip("wandb")
  _no_credentials(monkeypatch, tmp_path)
  monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
  monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
  seen = _warnings(monkeypatch)
  config = _online_config()
  wandb_writer.check_config(config)
  assert config.wandb.mode == "offline"
  assert len(seen) == 1 and "is unreachable" in seen[0], seen


def test_a_hanging_network_is_bounded(tmp_path, monkeypatch):
  """A connection (or DNS lookup) that never answers: the check gives up
  after PROBE_SECONDS, never wandb.init's 90 s."""
  pytest.importorskip("wandb")
  import socket  # pylint: disable=g-import-not-at-top
  _no_credentials(monkeypatch, tmp_path)
  monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
  # A look-up that hangs (it ignores socket timeouts).
  monkeypatch.setattr(socket, "getaddrinfo",
                      lambda *args, **kwargs: time.sleep(60))
  seen = _warnings(monkeypatch)
  config = _online_config()
  start = time.monotonic()
  wandb_writer.check_config(config)
  assert time.monotonic() - start < wandb_writer.PROBE_SECONDS + 2
  assert config.wandb.mode == "offline"
  assert len(seen) == 1 and "no answer within" in seen[0], seen


def test_online_with_credentials_and_a_server_stays_online(tmp_path,
                                                           monkeypatch):
  pytest.importorskip("wandb")
  import socket  # pylint: disable=g-import-not-at-top
  _no_credentials(monkeypatch, tmp_path)
  netrc = tmp_path / "netrc"
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    host, port = server.getsockname()
    netrc.write_text(f"machine {host}:{port}\n  login user\n  password "
                     f"{'k' * 40}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("WANDB_BASE_URL", f"http://{host}:{port}")
    seen = _warnings(monkeypatch)
    config = _online_config()
    wandb_writer.check_config(config)
  assert config.wandb.mode == "online" and not seen


def test_offline_mode_is_not_probed(tmp_path, monkeypatch):
  pytest.importorskip("wandb")
  _no_credentials(monkeypatch, tmp_path)
  monkeypatch.setattr(wandb_writer, "online_problem", lambda *a: pytest.fail(
      "offline mode needs no network check"))
  config = _online_config()
  config_lib.set_values(config, {"wandb.mode": "offline"})
  wandb_writer.check_config(config)


def test_a_broken_wandb_install_is_one_line(monkeypatch):
  real_import = importlib.import_module

  def broken(name, *args):
    if name == "wandb":
      raise TypeError("Descriptors cannot be created directly.\n"
                      "If this call came from a _pb2.py file ...")
    return real_import(name, *args)

  monkeypatch.setattr(importlib, "import_module", broken)
  with pytest.raises(wandb_writer.WandbUnavailableError) as error:
    wandb_writer.check_config(_online_config())
  line = cli.one_line(error.value)
  assert "\n" not in str(error.value) and "config.wandb.enabled" in line


def test_the_trainer_checks_wandb_before_building_data(tmp_path,
                                                       monkeypatch):
  """The online check runs in check_config, before the dataset is built:
  a run whose W&B check fails stops with nothing built."""
  pytest.importorskip("wandb")
  from trm.core import train  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  order = []

  def problem(*args):
    order.append("wandb check")
    raise wandb_writer.WandbUnavailableError("stop here")

  real_build = families.build_task
  monkeypatch.setattr(wandb_writer, "online_problem", problem)
  config = tiny_config(**{"data.data_dir": str(tmp_path / "data"),
                          "wandb.enabled": True, "wandb.mode": "online"})
  with pytest.raises(wandb_writer.WandbUnavailableError):
    train.train_and_evaluate(
        config, str(tmp_path / "run"),
        lambda *a: order.append("build") or real_build(*a))
  assert order == ["wandb check"]
  assert not (tmp_path / "data").exists()
