"""benchmarks/gpu/mixer_forecast.py's part that needs no CUDA plugin: the
third H100 run's mixer figures it sets beside its forecasts."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")
sys.path.insert(0, KIT)
import mixer_forecast  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def test_the_third_runs_figures_are_read_at_batch_384():
  got = mixer_forecast.measured_ms(os.path.join(
      KIT, "results", "2026-11-27-h100-s39", "run1-figures.jsonl"))
  assert got == pytest.approx({
      ("XLA path", "forward"): 0.8599, ("XLA path", "train"): 2.2576,
      ("tokens (mlp_gpu's defaults)", "forward"): 0.6653}, abs=1e-4)
  assert set(name for name, _ in got) <= set(mixer_forecast.SETTINGS) | {
      "XLA path"}


def test_other_batches_and_figures_are_passed_over(tmp_path):
  path = tmp_path / "figures.jsonl"
  rows = [{"name": "mixer/xla/forward/ms", "value": 9.0, "batch": 768},
          {"name": "mixer/xla/train/ms", "value": 2.0, "batch": 384},
          {"name": "trm/x/ms", "value": 1.0, "batch": 384}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert mixer_forecast.measured_ms(str(path)) == {("XLA path", "train"): 2.0}


def test_a_missing_figures_file_is_one_line_before_any_compile(tmp_path):
  with pytest.raises(SystemExit, match=r"--measured=.*nope.jsonl: no such"):
    mixer_forecast.main([f"--measured={tmp_path / 'nope.jsonl'}"])


@pytest.mark.parametrize("batch", [0, -384])
def test_a_batch_that_is_no_positive_count_is_refused_before_any_compile(
    batch, capsys):
  """--batch=0 printed a forecast header for 'batch 0' and went on to
  compile token mixers of no rows."""
  with pytest.raises(SystemExit) as e:
    mixer_forecast.main([f"--batch={batch}"])
  assert e.value.code == 2
  assert f"--batch={batch}: must be a positive integer" in (
      capsys.readouterr().err)
