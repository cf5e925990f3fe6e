"""benchmarks/gpu/measure.py on the device: each measurement ends by its
own deadline."""
from __future__ import annotations

import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")


def _measure():
  sys.path.insert(0, KIT)
  try:
    import measure  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  return measure


def test_smoke_trainer_is_killed_at_its_deadline_while_silent():
  """A trainer that stops printing (a long compile, a hang) is killed at
  the smoke section's deadline, not when run.sh's `timeout` kills the
  section with none of its figures written."""
  measure = _measure()
  quiet = [sys.executable, "-c",
           "import time; print('[1] up', flush=True); time.sleep(60)"]
  start = time.monotonic()
  code, log = measure._run_trainer(quiet, timeout=1.0)  # pylint: disable=protected-access
  assert time.monotonic() - start < 15
  assert code != 0 and log == "[1] up\n"
