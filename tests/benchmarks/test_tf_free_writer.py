"""trm.core.metrics without TensorFlow: `clu.metric_writers` imports, and
its default writer writes TensorBoard event files with the tensorboard
package (checked in a process where `import tensorflow` fails, as on the
GPU image)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# The repository first, then whatever path the tests run with.
_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    filter(None, [ROOT, os.environ.get("PYTHONPATH")])))

_WRITE = textwrap.dedent("""
    import sys
    sys.modules["tensorflow"] = None  # `import tensorflow` now fails
    import numpy as np
    import trm  # installs the TF-free writer (trm.core.tf_free)
    from clu import periodic_actions  # imports clu.metric_writers
    from trm.core import metrics
    from clu import metric_writers
    writer = metrics.create_default_writer(sys.argv[1], asynchronous=True)
    writer.write_hparams({"model": {"hidden_size": 64, "mlp_t": True},
                          "lr": 1e-4, "name": "sudoku"})
    for step in (1, 2):
      writer.write_scalars(step, {"train/loss": 3.0 - step,
                                  "eval/exact": np.float32(0.25 * step)})
    writer.flush()
    # What a trainer writes (hparams, scalars) imports neither tensorboard's
    # summary package nor its TensorFlow stub (0.30-0.35 s of a process's
    # first writes, session 83).
    print("TB_SUMMARY", sorted(m for m in sys.modules if m.startswith(
        ("tensorboard.summary", "tensorboard.compat.tensorflow_stub"))))
    writer.write_texts(2, {"note": "resumed"})
    writer.write_histograms(2, {"weights": np.arange(10.0)})
    writer.write_images(2, {"sheet": np.zeros((4, 5, 3), np.uint8)})
    writer.close()
    summary = sys.modules["clu.metric_writers.summary_writer"]
    print("TF_FREE", summary.TRM_TF_FREE, metric_writers.SummaryWriter.__mro__[1].__name__)
    print("TF_MODULE", sys.modules["tensorflow"])
    """)


def test_metric_writer_without_tensorflow(tmp_path):
  logdir = tmp_path / "logs"
  proc = subprocess.run(
      [sys.executable, "-c", _WRITE, str(logdir)], cwd=ROOT, env=_ENV,
      capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "TF_FREE True TensorBoardWriter" in proc.stdout
  assert "TF_MODULE None" in proc.stdout
  assert "TB_SUMMARY []" in proc.stdout, proc.stdout
  assert "TensorFlow" not in proc.stderr, proc.stderr  # no warning now

  events = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
  events.Reload()
  # Scalars as TensorFlow writes them: float32 tensors (session 43; they
  # were simple_values, which readers of tensors did not see).
  assert _tensor_scalars(events, "train/loss") == [(1, 2.0), (2, 1.0)]
  assert _tensor_scalars(events, "eval/exact") == [(1, 0.25), (2, 0.5)]
  tags = events.Tags()
  assert not tags["scalars"]
  assert {"note", "weights", "_hparams_/session_start_info", "train/loss",
          "eval/exact", "sheet"} <= set(tags["tensors"])
  assert _plugin(events, "sheet") == "images"
  note = events.Tensors("note")[0].tensor_proto.string_val
  assert note == [b"resumed"]


def _plugin(events, tag):
  return events.SummaryMetadata(tag).plugin_data.plugin_name


def _tensor_scalars(events, tag):
  return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
          for e in events.Tensors(tag)]


# One process per side writes what the comparisons below read: the same
# scalars and the same images through CLU's TensorFlow writer ("tensorflow":
# CLU imported before trm is, so it keeps its TensorFlow writer) and through
# ours ("tf_free"). Ours' process first writes every kind of summary to a
# local log directory through trm.core.metrics, and says whether anything
# it wrote imported TensorFlow (before reading the events back, which
# tensorboard may do with TensorFlow).
_SIDE = textwrap.dedent("""
    import glob, sys
    import numpy as np
    out, side = sys.argv[1], sys.argv[2]
    if side == "tensorflow":
      # Imported before trm is: CLU keeps its TensorFlow writer.
      from clu import metric_writers
      assert "tensorflow" in sys.modules
    import trm
    from clu import metric_writers
    print("WRITER", metric_writers.SummaryWriter.__module__)
    if side == "tf_free":
      from trm.core import metrics
      writer = metrics.create_default_writer(out + "/local",
                                             asynchronous=True)
      writer.write_hparams({"lr": 1e-4})
      writer.write_scalars(1, {"train/loss": 2.0})
      writer.write_texts(1, {"note": "x"})
      writer.write_histograms(1, {"weights": np.arange(4.0)})
      writer.write_images(1, {"sheet": np.zeros((2, 2, 3), np.uint8)})
      writer.close()
    writer = metric_writers.create_default_writer(out + "/scalars",
                                                  asynchronous=False)
    writer.write_scalars(3, {"train/loss": 1.25, "eval/steps": 7})
    writer.close()
    writer = metric_writers.create_default_writer(out + "/images",
                                                  asynchronous=False)
    rng = np.random.default_rng(0)
    writer.write_images(5, {
        "floats": rng.random((2, 4, 5, 3)).astype(np.float32) * 1.2 - 0.1,
        "gray": (rng.random((3, 2, 1)) * 255).astype(np.uint8)})
    writer.close()
    print("TF_IMPORTED", "tensorflow" in sys.modules)
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.proto import event_pb2
    for path in sorted(glob.glob(out + "/scalars/events*")):
      for raw in event_file_loader.RawEventFileLoader(path).Load():
        for value in event_pb2.Event.FromString(raw).summary.value:
          print("VALUE", value.SerializeToString().hex())
    """)


@pytest.fixture(scope="module")
def side_run(tmp_path_factory):
  """side -> (log directory, stdout) of _SIDE's process for that side, run
  once for the tests below (two processes for three tests, not five)."""
  runs = {}

  def run(side):
    if side not in runs:
      out = tmp_path_factory.mktemp(side)
      proc = subprocess.run(
          [sys.executable, "-c", _SIDE, str(out), side], cwd=ROOT, env=_ENV,
          capture_output=True, text=True, timeout=300, check=False)
      assert proc.returncode == 0, proc.stderr[-4000:]
      writer = ("clu.metric_writers.tf.summary_writer"
                if side == "tensorflow" else "trm.core.metrics")
      assert f"WRITER {writer}\n" in proc.stdout, proc.stdout
      runs[side] = out, proc.stdout
    return runs[side]
  return run


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="compares with CLU's TensorFlow writer")
def test_scalars_are_written_as_tensorflow_writes_them(side_run):
  """The same scalars through CLU's TensorFlow writer and through ours:
  the same summary values, byte for byte."""
  values = {}
  for side in ("tensorflow", "tf_free"):
    _, stdout = side_run(side)
    values[side] = sorted(line for line in stdout.splitlines()
                          if line.startswith("VALUE"))
  assert len(values["tensorflow"]) == 2
  assert values["tf_free"] == values["tensorflow"]


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                    reason="compares with CLU's TensorFlow writer")
def test_images_are_written_as_tensorflow_writes_them(side_run):
  """Images through CLU's TensorFlow writer and ours: one summary per key
  with all its images (ours wrote a tag per image, `floats/image/0`, ...),
  the same metadata, and the same pixels (ours rounded floats where
  TensorFlow truncates: 1 level off on a fifth of the pixels)."""
  import io  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  read = {}
  for side in ("tensorflow", "tf_free"):
    logdir = str(side_run(side)[0] / "images")
    events = event_accumulator.EventAccumulator(
        logdir, size_guidance={"tensors": 0, "images": 0})
    events.Reload()
    assert not events.Tags()["images"]
    read[side] = {}
    for tag in events.Tags()["tensors"]:
      (event,) = events.Tensors(tag)
      strings = tensor_util.make_ndarray(event.tensor_proto)
      pixels = [np.asarray(Image.open(io.BytesIO(png))) for png in strings[2:]]
      read[side][tag] = (event.step, list(strings[:2]), pixels,
                         events.SummaryMetadata(tag).SerializeToString())
  assert sorted(read["tensorflow"]) == ["floats", "gray"]
  assert sorted(read["tf_free"]) == sorted(read["tensorflow"])
  for tag, (step, dims, pixels, metadata) in read["tensorflow"].items():
    ours = read["tf_free"][tag]
    assert (ours[0], ours[1], ours[3]) == (step, dims, metadata)
    assert len(ours[2]) == len(pixels)
    for a, b in zip(ours[2], pixels):
      np.testing.assert_array_equal(a, b)


def test_a_local_log_directory_does_not_import_tensorflow(side_run):
  """Where TensorFlow is installed too (CLU's writer imported it, 3-4 s of
  every process's start): a local log directory is written without it
  (every kind of summary, then the scalars and images above)."""
  out, stdout = side_run("tf_free")
  assert "TF_IMPORTED False" in stdout, stdout
  events = event_accumulator.EventAccumulator(
      str(out / "local"), size_guidance={"tensors": 0, "images": 0})
  events.Reload()
  assert _tensor_scalars(events, "train/loss") == [(1, 2.0)]
  assert _plugin(events, "sheet") == "images"


def test_a_url_log_directory_goes_through_gfile(tmp_path):
  """A log directory given as a URL (gs://... on a pod) is opened through
  tensorboard's gfile, TensorFlow's where it is installed; file:// here."""
  import trm  # pylint: disable=g-import-not-at-top,unused-import
  from trm.core import metrics  # pylint: disable=g-import-not-at-top
  writer = metrics.TensorBoardWriter(f"file://{tmp_path}/logs")
  writer.write_scalars(4, {"eval/loss": 0.5})
  writer.close()
  events = event_accumulator.EventAccumulator(
      str(tmp_path / "logs"), size_guidance={"tensors": 0})
  events.Reload()
  assert _tensor_scalars(events, "eval/loss") == [(4, 0.5)]


_IMPORT_ALL = textwrap.dedent("""
    import importlib, sys

    class NoTensorFlow:  # as if it were not installed
      def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
          raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

    sys.meta_path.insert(0, NoTensorFlow())
    bad = []
    for name in sys.argv[1:]:
      try:
        importlib.import_module(name)
      except Exception as e:  # pylint: disable=broad-except
        bad.append(f"{name}: {type(e).__name__}: {e}")
    print("BAD", bad)
    """)


def test_every_module_imports_without_tensorflow():
  """Modules that import CLU's writers (progress through periodic_actions,
  wandb_writer, and run_checks through it) failed without TensorFlow when
  imported before trm.core.metrics: `python -m trm.aot` did under the GPU
  image's packages (session 43). Every module of trm/ is imported with
  TensorFlow unfindable. One process imports all modules whose flags are
  defined only when they run as a program (`define_flags`): the order does
  not matter, since `import trm` installs the TensorFlow-free writer first.
  Modules that define absl flags on import each take a process of their
  own (trm.main and trm.sample both define --workdir)."""
  library, entries = [], []
  for root, _, files in os.walk(os.path.join(ROOT, "trm")):
    for file in sorted(files):
      if not file.endswith(".py") or file == "__main__.py":
        continue
      path = os.path.join(root, file)
      name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
      name = name.removesuffix(".__init__")
      with open(path) as f:
        source = f.read()
      flags_on_import = ("flags.DEFINE" in source
                         and "def define_flags" not in source)
      if flags_on_import and name not in ("trm.core.cli",
                                          "trm.core.distributed"):
        entries.append([name])
      else:
        library.append(name)
  assert {"trm.core.progress", "trm.core.wandb_writer", "trm.aot"} <= set(
      library)
  assert ["trm.main"] in entries and ["trm.sample"] in entries
  env = dict(_ENV, TRM_NO_HUGE_PAGES="1")
  procs = [subprocess.Popen([sys.executable, "-c", _IMPORT_ALL, *names],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for names in [library] + entries]
  for names, proc in zip([library] + entries, procs):
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-4000:]
    assert "BAD []" in out, (names, out[-4000:])


def test_a_write_reaches_the_file_without_a_later_write(tmp_path,
                                                         monkeypatch):
  """The last metrics before a stall (a hang, a long save) are on disk
  within the flush period even when nothing is written after them."""
  import time  # pylint: disable=g-import-not-at-top
  import trm  # pylint: disable=g-import-not-at-top,unused-import
  from trm.core import metrics  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(metrics._EventFile, "_FLUSH_SECONDS", 0.2)  # pylint: disable=protected-access
  writer = metrics.TensorBoardWriter(str(tmp_path))
  writer.write_scalars(7, {"train/loss": 1.5})
  deadline = time.monotonic() + 30
  events = []
  while not events and time.monotonic() < deadline:
    time.sleep(0.2)
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={"tensors": 0})
    accumulator.Reload()
    if "train/loss" in accumulator.Tags()["tensors"]:
      events = _tensor_scalars(accumulator, "train/loss")
  writer.close()
  assert events == [(7, 1.5)]
