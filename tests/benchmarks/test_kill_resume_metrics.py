"""benchmarks/reliability/kill_resume.py's metrics check: a killed and
resumed run's events files, as TensorBoard reads them, against an
uninterrupted run's. The script defines absl flags (`--seed`, `--steps`)
that other modules define too, so it is imported in a child process."""
import json
import os
import subprocess
import sys
import time

import repo

from trm.core import metrics

_COMPARE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import kill_resume
reference = kill_resume.metrics_record(sys.argv[2])
print(json.dumps({"tags": sorted(reference), "differences": [
    kill_resume.metrics_difference(kill_resume.metrics_record(d), reference)
    for d in sys.argv[3:]]}))
"""


def _write(logdir, points):
  writer = metrics.create_default_writer(str(logdir), asynchronous=False)
  for step, loss in points:
    writer.write_scalars(step, {"train/loss": loss, "eval/seconds": time.time(),
                                "timing/ms_per_step": 1.0})
  writer.close()
  time.sleep(1.1)  # a restart's file gets a later name (seconds)


def _compare(reference, *workdirs):
  out = subprocess.run(
      [sys.executable, "-c", _COMPARE,
       os.path.join(repo.ROOT, "benchmarks", "reliability"), str(reference),
       *map(str, workdirs)],
      capture_output=True, text=True, check=True, timeout=300)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_resumed_lost_and_changed_steps(tmp_path):
  _write(tmp_path / "whole", [(3, 1.0), (5, 0.9), (6, 0.8), (9, 0.7)])
  # Killed after step 6 was written, checkpoint 5: the restart writes 6
  # and 9 again (the same values, as a bit-identical resume does).
  _write(tmp_path / "killed", [(3, 1.0), (5, 0.9), (6, 0.8)])
  _write(tmp_path / "killed", [(6, 0.8), (9, 0.7)])
  _write(tmp_path / "lost", [(3, 1.0), (6, 0.8), (9, 0.7)])
  _write(tmp_path / "changed", [(3, 1.0), (5, 0.9), (6, 0.8), (9, 0.6)])
  result = _compare(tmp_path / "whole", tmp_path / "killed",
                    tmp_path / "lost", tmp_path / "changed")
  assert result["tags"] == ["train/loss"]  # timing left out
  assert result["differences"] == [
      None, "train/loss at steps [3, 6, 9], reference [3, 5, 6, 9]",
      "train/loss differs at steps [9]"]
