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
  watch = tmp_path / "watch.jsonl"
  monkeypatch.setitem(measure._watch, "path", str(watch))  # pylint: disable=protected-access
  args = measure.parse_args(["dream", f"--out={tmp_path}", "--smoke",
                             "--rounds=1", "--dream_batches", "1", "2"])
  measure.section_dream(args, measure.Recorder(args, "dream"),
                        measure.Budget(300))
  # Per batch size: one warm-up call and one timed round of each.
  assert calls == {(side, b): 2 for side in ("exact", "dual", "torch")
                   for b in (1, 2)}
  # Each round is on disk as it is timed; the watchdog is told each batch
  # size as it starts and each call's bound, cleared after the call.
  rounds = {(r["name"], r["side"], r["round"]) for r in _figures(
      tmp_path).values() if "round" in r}
  assert rounds == {(f"dream/b{b}/{variant}/round/seconds", side, 1)
                    for b in (1, 2) for variant, side in (
                        ("exact", "ours"), ("exact", "torch"),
                        ("dual", "ours"))}
  lines = [json.loads(line) for line in open(watch)]
  assert [line["unit"] for line in lines if "unit" in line] == ["1", "2"]
  bounds = [line["until"] for line in lines if "until" in line]
  assert len(bounds) >= 2 * 2 * 6 and bounds[-1] is None


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
  with open(tmp_path / "figures.jsonl") as f:  # each round as it was timed
    rounds = [(r["name"], r["side"], r["round"]) for r in map(json.loads, f)
              if "round" in r]
  assert rounds == [("gpt/attention_dot/iteration/round/ms", "ours", 1),
                    ("gpt/torch/iteration/round/ms", "torch", 1),
                    ("gpt/attention_dot/iteration/round/ms", "ours", 2),
                    ("gpt/attention_dot/iteration/round/ms", "ours", 3)]


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


# The watched Dream section (the child `supervise` starts), its samplers and
# Dream's HF model stand-ins as in _stub_dream; torch's third call at batch
# 1 (round 2) hangs where SIGALRM cannot stop it, as a device call would.
_DREAM_HANGS = """
import signal
import sys
import time
import types
import jax.numpy as jnp
import measure
from trm.core import mfu
from trm.families.dream import cached_sampling, model, sampling

measure.WATCH_FLOOR_S = 1.0
calls = {}


def lowered(*args, **kwargs):
  return types.SimpleNamespace(compile=lambda: lambda *a: jnp.zeros(()))


def torch_generate(ids, **kwargs):
  calls[ids.shape[0]] = calls.get(ids.shape[0], 0) + 1
  if ids.shape[0] == 1 and calls[1] == 3:
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
    time.sleep(120)
  return types.SimpleNamespace(sequences=ids)


sampling.lower_generate = lowered
cached_sampling.lower_cached_generate = lowered
measure._dream_reference = lambda args: (
    types.SimpleNamespace(DreamModel=None), "a stand-in")
measure._torch_dream_model = lambda *a: types.SimpleNamespace(
    diffusion_generate=torch_generate)
measure.keep_trace = lambda *a, **k: None
# Seconds each on a busy CPU, and not what is checked: the model's
# initialisation and the CPU's measured peak.
model.Dream = lambda cfg: types.SimpleNamespace(
    init=lambda key, x: {"params": {}})
mfu.peak_flops = lambda device, dtype: (1e9, "a stand-in")
measure.main(sys.argv[1:])
"""


def _supervise(measure, monkeypatch, driver: str, argv: list[str]) -> int:
  """measure.supervise(argv) with `driver` (Python, given the child's
  arguments) in place of the child measure.py, the watchdog's grace 1 s."""
  import subprocess  # pylint: disable=g-import-not-at-top
  popen = subprocess.Popen
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
      filter(None, [KIT, ROOT, os.environ.get("PYTHONPATH")])))
  monkeypatch.setattr(measure, "WATCH_GRACE_S", 1.0)
  monkeypatch.setattr(subprocess, "Popen", lambda command: popen(
      [command[0], "-c", driver, *command[2:]], env=env, cwd=ROOT))
  return measure.supervise(measure.parse_args(argv), argv)


# A watched section in a few lines (no JAX): each batch size is a unit,
# with one bounded call; batch 1's never returns, and SIGALRM cannot stop
# it, as a device call would not return.
_UNITS_HANG = """
import json, signal, sys, time
import measure

args = measure.parse_args(sys.argv[1:])
measure._watch["path"] = args.watch_file
for b in args.dream_batches:
  measure.watch_unit(b)
  with measure.time_limit(1.0):
    if b == 1:
      signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
      time.sleep(120)
  with open(args.out + "/figures.jsonl", "a") as f:
    f.write(json.dumps({"name": f"dream/b{b}", "budget": args.budget,
                        "argv": sys.argv[1:]}) + "\\n")
"""


def test_the_watchdog_ends_a_hung_unit_and_runs_the_next(tmp_path,
                                                          monkeypatch):
  """A call that never returns (a device hang, which SIGALRM cannot stop)
  is killed by the watchdog 1 s (here) past its bound, and only its unit
  ends: the next batch size runs in a new process with what is left of the
  budget. Before, the hang held the section until run.sh's `timeout`
  killed it, and no later unit ran."""
  measure = _measure()
  argv = ["dream", f"--out={tmp_path}", "--smoke", "--budget=60",
          "--dream_batches", "1", "2", "3"]
  start = time.monotonic()
  assert _supervise(measure, monkeypatch, _UNITS_HANG, argv) == 1
  assert time.monotonic() - start < 20
  rows = [json.loads(line) for line in open(tmp_path / "figures.jsonl")]
  assert [r["name"] for r in rows] == ["dream/b2", "dream/b3"], rows
  assert rows[0]["budget"] < 60
  assert rows[0]["argv"][-3:] == ["--dream_batches", "2", "3"]


@pytest.mark.slow
def test_a_hang_ends_its_batch_size_only_and_keeps_its_rounds(
    tmp_path, monkeypatch):
  """The same through the Dream section itself (its samplers stand-ins):
  the rounds timed before the hang are on disk, and the next batch size
  runs in a new process. Before, the figures were written after the last
  round, and the hang lost all of them."""
  measure = _measure()
  argv = ["dream", f"--out={tmp_path}", "--smoke", "--rounds=3",
          "--dream_batches", "1", "2"]
  start = time.monotonic()
  assert _supervise(measure, monkeypatch, _DREAM_HANGS, argv) == 1
  assert time.monotonic() - start < 60
  rows = [json.loads(line) for line in open(tmp_path / "figures.jsonl")]
  rounds = {(r["name"], r["side"], r["round"]) for r in rows if "round" in r}
  # Batch 1: round 1 of each, round 2 of ours' exact before torch's hung.
  assert {("dream/b1/exact/round/seconds", "ours", 1),
          ("dream/b1/exact/round/seconds", "torch", 1),
          ("dream/b1/dual/round/seconds", "ours", 1),
          ("dream/b1/exact/round/seconds", "ours", 2)} <= rounds, rounds
  assert ("dream/b1/exact/round/seconds", "torch", 2) not in rounds
  names = {(r["name"], r["side"]) for r in rows}
  assert ("dream/b1/exact/seconds", "ours") not in names  # never reached
  for side in ("ours", "torch"):  # batch 2, in the next process
    assert ("dream/b2/exact/seconds", side) in names, names
  assert all("--watch_file" not in r["command"] for r in rows)
