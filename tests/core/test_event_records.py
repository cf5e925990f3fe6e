"""trm.core.event_records (TFRecord framing) and the hparams summary that
trm.core.metrics builds itself: the same bytes as tensorboard's own."""
from __future__ import annotations

import glob
import struct

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_v2

from trm.core import event_records
from trm.core import metrics


def test_crc32c_check_value():
  # CRC-32C's published check value (RFC 3720's polynomial on "123456789").
  assert event_records.crc32c(b"123456789") == 0xE3069283
  assert event_records.crc32c(b"") == 0


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 255, 4096])
def test_masked_crc32c_as_tensorboard(size):
  data = np.random.default_rng(size).integers(0, 256, size, np.uint8)
  data = data.tobytes()
  assert (event_records.masked_crc32c(data)
          == pywrap_tensorflow.masked_crc32c(data))


def test_frame_layout():
  data = b"\x00event\xff" * 5
  framed = event_records.frame(data)
  assert len(framed) == 8 + 4 + len(data) + 4
  (length,) = struct.unpack("<Q", framed[:8])
  assert length == len(data)
  assert struct.unpack("<I", framed[8:12])[0] == (
      pywrap_tensorflow.masked_crc32c(framed[:8]))
  assert framed[12:-4] == data
  assert struct.unpack("<I", framed[-4:])[0] == (
      pywrap_tensorflow.masked_crc32c(data))


def _events(logdir):
  (path,) = glob.glob(str(logdir / "events.out.tfevents.*"))
  # tensorboard's reader checks each record's CRCs.
  return [event_pb2.Event.FromString(raw) for raw in
          event_file_loader.RawEventFileLoader(path).Load()]


def test_hparams_as_the_plugin_writes_them(tmp_path):
  hparams = {"model": {"hidden_size": np.int64(64), "mlp_t": True},
             "lr": np.float32(0.5), "name": "sudoku", "steps": 3,
             "rules": ("batch", "data")}
  writer = metrics.TensorBoardWriter(tmp_path)
  writer.write_hparams(hparams)
  writer.close()
  first, event = _events(tmp_path)
  assert first.file_version == "brain.Event:2"
  (value,) = event.summary.value
  content = plugin_data_pb2.HParamsPluginData.FromString(
      value.metadata.plugin_data.content)
  # The plugin's own summary for the same values at the same start time.
  flat = {"model.hidden_size": 64, "model.mlp_t": True, "lr": 0.5,
          "name": "sudoku", "steps": 3, "rules": "('batch', 'data')"}
  (expected,) = hparams_v2.hparams_pb(
      flat, start_time_secs=content.session_start_info.start_time_secs).value
  # The hparams map's serialized order varies from process to process
  # (protobuf's map hashing), so the content compares parsed.
  assert content == plugin_data_pb2.HParamsPluginData.FromString(
      expected.metadata.plugin_data.content)
  assert content.session_start_info.hparams["model.mlp_t"].bool_value
  value.metadata.plugin_data.content = b""
  expected.metadata.plugin_data.content = b""
  assert value.SerializeToString() == expected.SerializeToString()
  assert event.step == 0


def test_hparams_of_another_trial_have_another_group(tmp_path):
  groups = []
  for lr in (0.1, 0.2):
    logdir = tmp_path / str(lr)
    writer = metrics.TensorBoardWriter(logdir)
    writer.write_hparams({"lr": lr})
    writer.close()
    (value,) = _events(logdir)[1].summary.value
    groups.append(plugin_data_pb2.HParamsPluginData.FromString(
        value.metadata.plugin_data.content).session_start_info.group_name)
  assert groups[0] != groups[1]
