"""trm.core.metrics without TensorFlow: `clu.metric_writers` imports, and
its default writer writes TensorBoard event files with the tensorboard
package (checked in a process where `import tensorflow` fails, as on the
GPU image)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tensorboard.backend.event_processing import event_accumulator

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_WRITE = textwrap.dedent("""
    import sys
    sys.modules["tensorflow"] = None  # `import tensorflow` now fails
    import numpy as np
    from trm.core import metrics  # first, as the trainer imports it
    from clu import metric_writers
    writer = metrics.create_default_writer(sys.argv[1], asynchronous=True)
    writer.write_hparams({"model": {"hidden_size": 64, "mlp_t": True},
                          "lr": 1e-4, "name": "sudoku"})
    for step in (1, 2):
      writer.write_scalars(step, {"train/loss": 3.0 - step,
                                  "eval/exact": np.float32(0.25 * step)})
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
      [sys.executable, "-c", _WRITE, str(logdir)], cwd=ROOT, env=dict(
          os.environ, PYTHONPATH=ROOT), capture_output=True, text=True,
      timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "TF_FREE True TensorBoardWriter" in proc.stdout
  assert "TF_MODULE None" in proc.stdout
  warnings = [line for line in proc.stderr.splitlines()
              if "TensorFlow is not installed" in line]
  assert len(warnings) == 1, proc.stderr

  events = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={"scalars": 0, "tensors": 0, "images": 0})
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
      (1, 2.0), (2, 1.0)]
  assert [(e.step, e.value) for e in events.Scalars("eval/exact")] == [
      (1, 0.25), (2, 0.5)]
  tags = events.Tags()
  assert "sheet" in tags["images"]
  assert {"note", "weights", "_hparams_/session_start_info"} <= set(
      tags["tensors"])
  note = events.Tensors("note")[0].tensor_proto.string_val
  assert note == [b"resumed"]
