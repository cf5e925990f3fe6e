"""Step metrics (dicts of `clu.metrics.Metric`s): accumulate and read out;
and TensorBoard summaries without TensorFlow.

CLU's `metric_writers` package imports its TensorFlow summary writer when it
is imported: TensorFlow's import takes 3-4 s of every process that writes
metrics (each worker of a pod, each `python -m trm.*`), and on a machine
without TensorFlow (a GPU image: tensorflow is hundreds of MiB) `from clu
import metric_writers` fails. `trm.core.tf_free` (run when `trm.core` is
imported) puts `TensorBoardWriter` in that writer's place: the same event
files, written with the `tensorboard` package's summary protos in
TFRecord framing of our own (`trm.core.event_records`: importing
tensorboard's writer imports its TensorFlow stub, 0.35 s of a trainer's
first writes). A local log directory is written with plain file I/O; a URL
(`gs://...`) through tensorboard's gfile, which is TensorFlow's where it is
installed (and so imports it then, as CLU's writer would).
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import posixpath
import socket
import threading
import time
from typing import Any, Mapping, Optional

import jax
import numpy as np
from absl import logging

from trm.core import event_records


def merge(a, b):
  """Merges two metric dicts (None = empty), in one compiled call."""
  if a is None:
    return b
  return _merged(a, b)


@jax.jit
def _merged(a, b):
  # One program a step: merged eagerly, each sum (two a CLU Average) is a
  # program of its own on every device of the mesh, 16 or more a TRM step,
  # which is host time on every backend and, on forced CPU devices, can
  # queue XLA:CPU past its 32 programs a device (trm/core/dispatch.py).
  return {k: a[k].merge(b[k]) for k in a}


def compute(metrics) -> dict[str, float]:
  """Host-side values; metrics with no rows yet are left out."""
  metrics = jax.device_get(metrics)
  return {k: float(m.compute()) for k, m in metrics.items()
          if int(m.count) > 0}


# --------------------------------------------------------------------------
# TensorBoard summaries without TensorFlow.


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def _hparam_value(value):
  """What TensorBoard's hparams plugin takes: bool, int, float or str."""
  if isinstance(value, (bool, np.bool_)):
    return bool(value)
  if isinstance(value, (int, np.integer)):
    return int(value)
  if isinstance(value, (float, np.floating)):
    return float(value)
  return str(value)


def _uint8(image: np.ndarray) -> np.ndarray:
  """An image as `tf.summary.image` stores it (CLU's TensorFlow writer):
  uint8 as it is, floats in [0, 1] through `tf.image.convert_image_dtype`
  with saturation (scaled by 255.5 in float32, clamped to [0, 255],
  truncated)."""
  image = np.asarray(image)
  if image.dtype == np.uint8:
    return image
  scaled = image.astype(np.float32) * np.float32(255.5)
  return np.clip(np.nan_to_num(scaled), 0, 255).astype(np.uint8)


def _png(image: np.ndarray) -> bytes:
  """[H, W, C] uint8 as PNG bytes (C = 1: grayscale)."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  if image.shape[-1] == 1:
    image = image[..., 0]
  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, format="PNG")
  return buffer.getvalue()


# Tells apart two event files one process opens in the same second.
_FILE_NUMBERS = itertools.count()


class _EventFile:
  """One TensorBoard event file: records in TFRecord framing
  (`trm.core.event_records`), the first one the file version.
  EventFileWriter, tensorboard's own, opens every path through its gfile
  and so imports TensorFlow wherever it is installed; here only a URL
  does."""

  # As tensorboard's EventFileWriter: written data reaches the file at the
  # latest this long after it was written, and at every flush().
  _FLUSH_SECONDS = 120.0

  def __init__(self, logdir: str):
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2
    # pylint: enable=g-import-not-at-top
    name = "events.out.tfevents.%010d.%s.%s.%s" % (
        time.time(), socket.gethostname(), os.getpid(), next(_FILE_NUMBERS))
    if "://" in logdir:
      from tensorboard.compat import tf  # pylint: disable=g-import-not-at-top
      tf.io.gfile.makedirs(logdir)
      self.path = posixpath.join(logdir, name)
      file = tf.io.gfile.GFile(self.path, "wb")
    else:
      os.makedirs(logdir, exist_ok=True)
      self.path = os.path.join(logdir, name)
      file = open(self.path, "wb")  # pylint: disable=consider-using-with
    self._file = file
    self._closed = False
    # CLU's asynchronous writer writes from its own thread.
    self._lock = threading.Lock()
    self._timer = None  # flushes _FLUSH_SECONDS after an unflushed write
    self._file.write(event_records.frame(event_pb2.Event(
        wall_time=time.time(), file_version="brain.Event:2",
        source_metadata=event_pb2.SourceMetadata(
            writer="trm.core.metrics.TensorBoardWriter")).SerializeToString()))
    self._file.flush()

  def add(self, event) -> None:
    with self._lock:
      self._file.write(event_records.frame(event.SerializeToString()))
      if self._timer is None:  # also when no write follows (a stall)
        self._timer = threading.Timer(self._FLUSH_SECONDS, self.flush)
        self._timer.daemon = True
        self._timer.start()

  def _flush_locked(self) -> None:
    if self._timer is not None:
      self._timer.cancel()
      self._timer = None
    if not self._closed:
      self._file.flush()

  def flush(self) -> None:
    with self._lock:
      self._flush_locked()

  def close(self) -> None:
    with self._lock:
      if not self._closed:
        self._flush_locked()
        self._closed = True
        self._file.close()


class TensorBoardWriter:
  """CLU's `SummaryWriter` (`clu.metric_writers.SummaryWriter`) without
  TensorFlow: TensorBoard event files under `logdir`, written with the
  `tensorboard` package alone. Scalars, texts, histograms, images and
  hparams are written; videos, audios and point clouds are skipped with a
  warning, as CLU's writer skips videos."""

  def __init__(self, logdir):
    self._writer = _EventFile(os.fspath(logdir))

  def _write(self, step, values) -> None:
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import event_pb2, summary_pb2
    # pylint: enable=g-import-not-at-top
    values = list(values)
    if values:
      self._writer.add(event_pb2.Event(
          wall_time=time.time(), step=int(step),
          summary=summary_pb2.Summary(value=values)))

  @staticmethod
  def _scalar(tag, value):
    """As TensorFlow's `tf.summary.scalar` (CLU's writer) writes it: a
    float32 scalar tensor for the scalars plugin, not a `simple_value`, so
    readers of either writer's files see the same events."""
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import summary_pb2, tensor_pb2
    from tensorboard.compat.proto import tensor_shape_pb2, types_pb2
    # pylint: enable=g-import-not-at-top
    return summary_pb2.Summary.Value(
        tag=tag,
        tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            tensor_content=np.asarray(value, "<f4").tobytes()),
        metadata=summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name="scalars")))

  def write_summaries(self, step: int, values: Mapping[str, Any],
                      metadata: Optional[Mapping[str, Any]] = None):
    del metadata
    scalars = {k: v for k, v in values.items() if np.ndim(v) == 0}
    if len(scalars) < len(values):
      logging.log_first_n(logging.WARNING, "TensorBoardWriter writes only "
                          "the scalars of write_summaries.", 1)
    self.write_scalars(step, scalars)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    self._write(step, (self._scalar(k, np.asarray(v).item())
                       for k, v in scalars.items()))

  def write_images(self, step: int, images: Mapping[str, Any]):
    """As `tf.summary.image` writes them (CLU's TensorFlow writer): one
    summary per key holding all its images, a string tensor [width,
    height, PNG...] for the images plugin."""
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import summary_pb2, tensor_pb2
    from tensorboard.compat.proto import tensor_shape_pb2, types_pb2
    from tensorboard.plugins.image import metadata as image_metadata
    # pylint: enable=g-import-not-at-top
    values = []
    for key, batch in images.items():
      batch = _uint8(batch)
      if batch.ndim == 3:
        batch = batch[None]
      strings = [str(batch.shape[2]).encode(), str(batch.shape[1]).encode()]
      strings += [_png(image) for image in batch]
      values.append(summary_pb2.Summary.Value(
          tag=key,
          tensor=tensor_pb2.TensorProto(
              dtype=types_pb2.DT_STRING,
              tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[
                  tensor_shape_pb2.TensorShapeProto.Dim(size=len(strings))]),
              string_val=strings),
          metadata=image_metadata.create_summary_metadata(
              display_name=None, description=None)))
    self._write(step, values)

  def write_videos(self, step: int, videos: Mapping[str, Any]):
    del step, videos
    logging.log_first_n(logging.WARNING,
                        "TensorBoardWriter does not write videos.", 1)

  def write_audios(self, step: int, audios: Mapping[str, Any], *,
                   sample_rate: int):
    del step, audios, sample_rate
    logging.log_first_n(logging.WARNING,
                        "TensorBoardWriter does not write audios.", 1)

  def write_pointcloud(self, step, point_clouds, *, point_colors=None,
                       configs=None):
    del step, point_clouds, point_colors, configs
    logging.log_first_n(logging.WARNING,
                        "TensorBoardWriter does not write point clouds.", 1)

  def write_texts(self, step: int, texts: Mapping[str, str]):
    from tensorboard.plugins.text import summary_v2 as text  # pylint: disable=g-import-not-at-top
    for key, value in texts.items():
      self._write(step, text.text_pb(key, np.array(str(value))).value)

  def write_histograms(self, step: int, arrays: Mapping[str, Any],
                       num_buckets: Optional[Mapping[str, int]] = None):
    from tensorboard.plugins.histogram import summary_v2 as histogram  # pylint: disable=g-import-not-at-top
    for key, value in arrays.items():
      buckets = None if num_buckets is None else num_buckets.get(key)
      self._write(step, histogram.histogram_pb(
          key, np.asarray(value, np.float64), buckets=buckets).value)

  def write_hparams(self, hparams: Mapping[str, Any]):
    """As the hparams plugin's `hparams_pb` writes them (CLU's TensorFlow
    writer calls it), built here from its protos: importing that function
    imports tensorboard's TensorFlow stub and the stub's gfile (boto3,
    fsspec), most of the 0.35 s that `benchmarks/speed/
    event_writer_seconds.py` measured tensorboard's writer adding to a
    trainer's first writes."""
    # pylint: disable=g-import-not-at-top
    from tensorboard.compat.proto import summary_pb2, tensor_pb2
    from tensorboard.compat.proto import tensor_shape_pb2, types_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2
    # pylint: enable=g-import-not-at-top
    flat = {k: _hparam_value(v) for k, v in _flatten(hparams).items()}
    # The plugin's default trial name: a hash of the values, so that runs
    # with equal hyperparameters fall in one group.
    group = hashlib.sha256(json.dumps(
        flat, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    start = plugin_data_pb2.SessionStartInfo(group_name=group,
                                             start_time_secs=time.time())
    for name in sorted(flat):
      value = flat[name]
      if isinstance(value, bool):
        start.hparams[name].bool_value = value
      elif isinstance(value, (int, float)):
        start.hparams[name].number_value = value
      else:
        start.hparams[name].string_value = value
    content = plugin_data_pb2.HParamsPluginData(session_start_info=start)
    self._write(0, [summary_pb2.Summary.Value(
        tag="_hparams_/session_start_info",
        # The plugin's empty float tensor: the data is in the metadata.
        tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=0)])),
        metadata=summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name="hparams",
                content=content.SerializeToString())))])

  def flush(self):
    self._writer.flush()

  def close(self):
    self._writer.close()


def summary_writer_class():
  """TensorBoardWriter as a subclass of CLU's MetricWriter interface (made
  when `clu.metric_writers` asks for it: the interface is imported by then,
  and importing it earlier would import the package, and so this module)."""
  from clu.metric_writers import interface  # pylint: disable=g-import-not-at-top

  class SummaryWriter(TensorBoardWriter, interface.MetricWriter):  # pylint: disable=abstract-method
    """CLU's `SummaryWriter` name for `TensorBoardWriter` (no TensorFlow)."""

  return SummaryWriter


def create_default_writer(logdir, *, asynchronous: bool = True):
  """CLU's default writer (log lines + TensorBoard events under `logdir`),
  TensorFlow or not."""
  from clu import metric_writers  # pylint: disable=g-import-not-at-top
  return metric_writers.create_default_writer(logdir,
                                              asynchronous=asynchronous)


# --------------------------------------------------------------------------
# Metrics as JSON lines (MaxText's metrics_file, Hugging Face's log_history).

# At the top of the workdir (config.metrics_jsonl).
JSONL_NAME = "metrics.jsonl"
EVAL_PREFIX = "eval/"


def _jsonl_records(path: str) -> list[tuple[int, str, bool]]:
  """(step, line, whether it holds an eval/ figure) of each record in
  `path` a strict JSON reader accepts; a line that is not such an object
  with an integer step (the torn last line of a killed run) is left out,
  with a warning."""
  import json  # pylint: disable=g-import-not-at-top
  records, torn = [], 0
  with open(path, encoding="utf-8", errors="replace") as f:
    for line in f:
      try:
        record = json.loads(line, parse_constant=_refuse_constant)
        step = record["step"]
        if isinstance(step, bool) or not isinstance(step, int):
          raise ValueError(step)
      except (ValueError, TypeError, KeyError):
        torn += 1
        continue
      records.append((step, line if line.endswith("\n") else line + "\n",
                      any(k.startswith(EVAL_PREFIX) for k in record)))
  if torn:
    logging.warning("%s: left out %d line(s) that were not whole JSON "
                    "records (a killed run's last write).", path, torn)
  return records


def _refuse_constant(name):
  raise ValueError(f"{name} is not JSON")


class JsonlWriter:
  """One strict JSON object per `write_scalars` call, appended to `path`:
  `{"step": N, "train/loss": ..., ...}`, NaN and Inf as null. Flushed with
  the other writers (`flush`: before each checkpoint and after each
  evaluation), so a record is on disk when the events file's is.

  A run resumed from checkpoint step S writes the steps after S again: the
  killed run's records past S are dropped first (`drop_after`), so each
  train step's record appears once. Records at S itself are kept; a
  resumed run may add to them (its compile time, an evaluation a
  preemption cut short), and a reader takes the last value of a key at a
  step. Texts, images, histograms and hparams go to TensorBoard only."""

  def __init__(self, path: str):
    self._path = path
    self._lock = threading.Lock()  # writes may come from other threads
    self._eval_steps: set[int] = set()  # steps with an evaluation record
    if os.path.exists(path):
      self._rewrite(lambda step: True)  # a torn last line would join ours
    self._file = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with

  def _rewrite(self, keep) -> int:
    """Rewrites the file whole with the records whose step `keep`s;
    returns how many were left out."""
    from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
    records = _jsonl_records(self._path)
    kept = [line for step, line, _ in records if keep(step)]
    self._eval_steps = {step for step, _, has_eval in records
                        if has_eval and keep(step)}
    with open(self._path, "rb") as f:
      before = f.read()
    after = "".join(kept).encode()
    if after != before:
      atomic_files.replace_whole(self._path, after)
    return len(records) - len(kept)

  def drop_after(self, step: int) -> None:
    """Removes the records of steps after `step` (the checkpoint a run
    resumes from: it writes those steps again)."""
    with self._lock:
      self._file.close()
      dropped = self._rewrite(lambda s: s <= step)
      self._file = open(self._path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    if dropped:
      logging.info("%s: dropped %d record(s) past step %d, written by a run "
                   "that stopped after it; they are written again.",
                   self._path, dropped, step)

  def write_scalars(self, step: int, scalars: Mapping[str, Any]):
    import json  # pylint: disable=g-import-not-at-top
    from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
    record = {"step": int(step)}
    record.update({k: np.asarray(v).item() for k, v in scalars.items()})
    line = json.dumps(atomic_files.nonfinite_as_null(record),
                      allow_nan=False)
    with self._lock:
      self._file.write(line + "\n")
      if any(k.startswith(EVAL_PREFIX) for k in record):
        self._eval_steps.add(int(step))

  def holds_eval(self, step: int) -> bool:
    """Whether the file has an evaluation record (an eval/ figure) at
    `step`."""
    with self._lock:
      return int(step) in self._eval_steps

  def write_summaries(self, step: int, values: Mapping[str, Any],
                      metadata: Optional[Mapping[str, Any]] = None):
    del metadata
    self.write_scalars(step, {k: v for k, v in values.items()
                              if np.ndim(v) == 0})

  def _skip(self, *args, **kwargs):
    del args, kwargs

  write_images = write_videos = write_audios = write_texts = _skip
  write_histograms = write_hparams = write_pointcloud = _skip

  def flush(self):
    with self._lock:
      self._file.flush()

  def close(self):
    with self._lock:
      self._file.close()
