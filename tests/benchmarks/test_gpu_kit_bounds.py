"""benchmarks/gpu/measure.py on the device: each measurement ends by its
own deadline, a side failing in a round loses no figure of the others, and
both sides start warm at every batch size."""
from __future__ import annotations

import collections
import json
import os
import sys
import time
import types

import pytest

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


def test_smoke_trainer_log_that_is_not_utf8_is_read_to_its_end():
  """A byte that is not UTF-8 in the trainer's output (a library's
  message) is escaped, not the end of the log: it raised
  UnicodeDecodeError and ended the smoke section."""
  measure = _measure()
  child = [sys.executable, "-c",
           "import sys; sys.stdout.buffer.write("
           "b'[1] caf\\xe9\\n[2] train/loss=1\\n'); sys.stdout.flush()"]
  code, log = measure._run_trainer(child, timeout=30)  # pylint: disable=protected-access
  assert code == 0 and log == "[1] caf\\xe9\n[2] train/loss=1\n"


def _stub_dream(measure, monkeypatch, calls):
  """The Dream section with its samplers and Dream's HF model as stand-ins
  that count their calls in `calls` ((exact | dual | torch, batch) ->
  calls): its own logic only, in a second."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sampling  # pylint: disable=g-import-not-at-top

  def lowered(variant):
    def lower(*args, **kwargs):
      del args, kwargs

      def run(params, ids, mask, key):
        del params, mask, key
        calls[(variant, ids.shape[0])] += 1
        return jnp.zeros(())
      return types.SimpleNamespace(compile=lambda: run)
    return lower

  def torch_generate(ids, **kwargs):
    del kwargs
    calls[("torch", ids.shape[0])] += 1
    return types.SimpleNamespace(sequences=ids)

  monkeypatch.setattr(sampling, "lower_generate", lowered("exact"))
  monkeypatch.setattr(cached_sampling, "lower_cached_generate",
                      lowered("dual"))
  monkeypatch.setattr(measure, "_dream_reference", lambda args: (
      types.SimpleNamespace(DreamModel=None), "a stand-in"))
  monkeypatch.setattr(measure, "_torch_dream_model", lambda *a: (
      types.SimpleNamespace(diffusion_generate=torch_generate)))
  monkeypatch.setattr(measure, "keep_trace", lambda *a, **k: None)


def test_dream_starts_warm_at_every_batch_size(tmp_path, monkeypatch):
  """One untimed call per side before the timed rounds at each batch size,
  not only the first: on the H100 ours' first batch-16 call after batch 1
  took 6.75 s and the next 5.89 s, and with two rounds the median would be
  their mean."""
  measure = _measure()
  calls = collections.Counter()
  _stub_dream(measure, monkeypatch, calls)
  args = measure.parse_args(["dream", f"--out={tmp_path}", "--smoke",
                             "--rounds=1", "--dream_batches", "1", "2"])
  measure.section_dream(args, measure.Recorder(args, "dream"),
                        measure.Budget(300))
  # Per batch size: one warm-up call and one timed round of each.
  assert calls == {(side, b): 2 for side in ("exact", "dual", "torch")
                   for b in (1, 2)}


def _stub_gpt(measure, monkeypatch, torch_iteration):
  """The GPT section with ours' iteration and nanoGPT's as stand-ins. The
  section's `gpt_speed` (of which it calls make_ours only) is a stand-in
  module too: the script defines absl flags ('config', ...) at import, as
  other benchmark scripts the same test worker may have loaded do."""

  def make_ours(config):
    del config
    return lambda iters, warmup: {"ms_per_iter": 10.0, "mfu": 0.1}

  monkeypatch.setitem(sys.modules, "gpt_speed",
                      types.SimpleNamespace(make_ours=make_ours))
  monkeypatch.setattr(measure, "_torch_gpt",
                      lambda *args: (torch_iteration, 1000))
  monkeypatch.setattr(measure, "keep_trace", lambda *a, **k: None)


def _figures(out) -> dict:
  with open(out / "figures.jsonl") as f:
    return {(r["name"], r["side"]): r for r in map(json.loads, f)}


def test_a_side_failing_in_a_gpt_round_keeps_the_figures(tmp_path,
                                                          monkeypatch):
  """The same for GPT's iterations (ours and nanoGPT's stand-ins here):
  torch failing in round 2 keeps both sides' round-1 figures and ours'
  later rounds."""
  measure = _measure()
  calls = []

  def torch_iteration():
    calls.append(1)
    if len(calls) > 1 + 2:  # the first (compiling) one and round 1's 2
      raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return 1.0

  _stub_gpt(measure, monkeypatch, torch_iteration)
  args = measure.parse_args(["gpt", f"--out={tmp_path}", "--smoke",
                             "--rounds=3"])
  measure.section_gpt(args, measure.Recorder(args, "gpt"),
                      measure.Budget(300))
  rows = _figures(tmp_path)
  ours = rows[("gpt/attention_dot/iteration/ms", "ours")]
  torch = rows[("gpt/attention_dot/iteration/ms", "torch")]
  assert ours["rounds"] == 3 and torch["rounds"] == 1, (ours, torch)


@pytest.mark.parametrize("section", ["gpt", "dream"])
def test_ours_is_measured_alone_where_torch_does_not_import(
    tmp_path, monkeypatch, section):
  """A torch that does not import (or sees no GPU) costs the torch side
  only: the section failed at once before, with none of ours' figures.
  (The TRM section's path was run by hand: 8 figures of ours.)"""
  measure = _measure()
  if section == "gpt":
    _stub_gpt(measure, monkeypatch, lambda: 1.0)
  else:
    _stub_dream(measure, monkeypatch, collections.Counter())
  monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
  args = measure.parse_args([section, f"--out={tmp_path}", "--smoke",
                             "--rounds=1"])
  rec = measure.Recorder(args, section)
  getattr(measure, f"section_{section}")(args, rec, measure.Budget(300))
  rows = _figures(tmp_path)
  timed = ("gpt/attention_dot/iteration/ms" if section == "gpt"
           else "dream/b2/exact/seconds")
  assert rows[(timed, "ours")]["value"] > 0
  assert not [key for key in rows if key[1] == "torch"]
  assert rows[(timed, "ours")]["torch"] is None


@pytest.mark.parametrize("section, tf32", [("gpt", True), ("dream", False)])
def test_torch_runs_tf32_as_its_reference_and_each_figure_says_so(
    tmp_path, monkeypatch, section, tf32):
  """nanoGPT's train.py turns TF32 on for torch's float32 matmuls and cuDNN;
  upstream TRM's pretrain.py and Dream's code leave torch's defaults
  (matmuls off). The kit left TF32 off for nanoGPT, and no figure said
  what either side ran under; ours runs at JAX's default precision, which
  is TF32 on the GPU."""
  torch = pytest.importorskip("torch")
  measure = _measure()
  matmul = torch.backends.cuda.matmul.allow_tf32
  cudnn = torch.backends.cudnn.allow_tf32
  try:
    torch.backends.cuda.matmul.allow_tf32 = not tf32  # what the kit must set
    if section == "gpt":
      _stub_gpt(measure, monkeypatch, lambda: 1.0)
    else:
      _stub_dream(measure, monkeypatch, collections.Counter())
    args = measure.parse_args([section, f"--out={tmp_path}", "--smoke",
                               "--rounds=1"])
    getattr(measure, f"section_{section}")(
        args, measure.Recorder(args, section), measure.Budget(300))
  finally:
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
  rows = _figures(tmp_path).values()
  torch_rows = [r for r in rows if r["side"] == "torch"]
  ours_rows = [r for r in rows if r["side"] == "ours"]
  assert torch_rows and ours_rows
  for row in torch_rows:
    assert row["tf32_matmul"] is tf32 and row["tf32_cudnn"] is True, row
  for row in ours_rows:
    assert row["jax_default_matmul_precision"] is None, row
    assert row["tf32_matmul"] is True, row
