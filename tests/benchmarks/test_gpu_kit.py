"""benchmarks/gpu: the wheel list, and `run.sh OUT --smoke` end to end on the
CPU (every section with tiny sizes; the install step as a pip dry run for
the GPU image's CPython 3.12 against the fetched wheels)."""
from __future__ import annotations

import collections
import importlib
import json
import math
import os
import re
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")
WHEELS = os.path.join(KIT, "wheels")
KEYS = {"name", "value", "unit", "side", "device", "jax", "torch", "dtype",
        "batch", "command"}


def _pins() -> dict[str, tuple[str, str]]:
  """wheels.txt: name -> (version, marker)."""
  pins = {}
  with open(os.path.join(KIT, "wheels.txt")) as f:
    for line in f:
      spec, _, marker = line.partition("#")
      spec = spec.strip()
      if not spec:
        continue
      name, sep, version = spec.partition("==")
      assert sep and re.fullmatch(r"[\w.]+", version), line
      pins[name.lower().replace("_", "-")] = (version, marker.strip())
  return pins


def test_wheels_txt_pins_setup_py_versions_and_no_tensorflow():
  pins = _pins()
  with open(os.path.join(ROOT, "setup.py")) as f:
    setup = f.read()
  for name in ("ml-collections", "clu", "grain", "tensorflow-datasets"):
    assert f'"{name}=={pins[name][0]}"' in setup, name
  assert not [n for n in pins if n.startswith("tensorflow")
              and n not in ("tensorflow-datasets", "tensorflow-metadata")]
  assert pins["transformers"][0].startswith("4.51.")
  assert {n for n, (_, m) in pins.items() if m == "hf"} == {
      "transformers", "tokenizers", "huggingface-hub"}
  assert set(m for _, m in pins.values()) <= {"", "hf", "sdist", "floor"}


def test_wheels_sha256_hashes_one_wheel_per_pin_and_each_sdist():
  """wheels.sha256 (what check_wheels.sh checks) changes with wheels.txt:
  a wheel per pin at its version, and the source archive of each
  '# sdist' pin."""
  def normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()
  wheels, archives = {}, {}
  with open(os.path.join(KIT, "wheels.sha256")) as f:
    for line in f:
      if not line.strip() or line.startswith("#"):
        continue
      file = re.fullmatch(r"[0-9a-f]{64}  ([^/\s]+)", line.rstrip("\n"))[1]
      if file.endswith(".whl"):
        name, version = file.split("-")[:2]
        assert normal(name) not in wheels, f"two wheels of {name}"
        wheels[normal(name)] = version
      else:
        name, version = re.fullmatch(r"(.+)-([^-]+)\.(?:tar\.gz|zip)",
                                     file).groups()
        archives[normal(name)] = version
  pins = {normal(name): pin for name, pin in _pins().items()}
  assert wheels == {name: version for name, (version, _) in pins.items()}
  assert archives == {name: version for name, (version, marker)
                      in pins.items() if marker == "sdist"}


def _run_smoke(tmp_path, sections):
  out = tmp_path / "out"
  env = dict(os.environ, TRM_GPU_INSTALL="dry",
             TRM_GPU_SCRATCH=str(tmp_path / "scratch"))
  proc = subprocess.run(
      ["bash", os.path.join(KIT, "run.sh"), str(out), "--smoke",
       f"--only={sections}"], cwd=ROOT,
      env=env, capture_output=True, text=True, timeout=840, check=False)
  log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
  with open(out / "figures.jsonl") as f:
    rows = [json.loads(line) for line in f]
  return rows, log, out


# The whole kit runs with `-m slow` only. The smoke section (trm.main
# trained, SIGTERM'd and resumed) is tests/core/test_cli.py's and
# test_reliability.py's path, the TensorFlow-free writer
# test_tf_free_writer.py's; the other sections run the reference ports and
# steps that test_trm_speed_parity.py, test_diffusion_sampling.py's PyTorch
# loop and test_gpt_task.py's nanoGPT resume run, and
# test_cudnn_attention.py the cuDNN branch; the kit's pins are checked above.
@pytest.mark.parametrize("sections", [
    pytest.param("trm,gpt,dream,cudnn", marks=pytest.mark.slow),
    pytest.param("smoke,trm,gpt,dream,cudnn", marks=pytest.mark.slow)])
def test_run_sh_smoke_writes_figures(tmp_path, sections):
  rows, log, out = _run_smoke(tmp_path, sections)

  # The install step ran as a dry run for CPython 3.12 manylinux.
  n_site = sum(1 for _, m in _pins().values() if m != "hf")
  assert re.search(r"install: protobuf [\d.]+ (>=|<) 6\.33\.5", log)
  assert "--dry-run --only-binary=:all: --python-version 3.12" in log
  if os.path.isdir(WHEELS) and any(n.endswith(".whl")
                                   for n in os.listdir(WHEELS)):
    assert re.search(r"install: \d+ wheels in .* as wheels.sha256 says", log)
    assert f"install: site: all {n_site} pins resolved (dry run)" in log
    assert "install: hf: all 3 pins resolved (dry run)" in log
  else:  # CI: benchmarks/gpu/wheels is not in git
    assert "install: wheels FAILED (no " in log
  assert "install: project: trm (dry run)" in log

  for row in rows:
    assert KEYS <= row.keys(), row
    assert row["side"] in ("ours", "torch"), row
    assert isinstance(row["value"], float) and math.isfinite(row["value"])
    assert row["smoke"] is True
    assert row["command"].startswith("python benchmarks/gpu/measure.py ")
  figures = {(r["name"], r["side"]): r for r in rows}
  for section in ("trm", "gpt", "dream") + (
      ("smoke",) if "smoke" in sections else ()):
    assert any(name.startswith(section + "/") for name, _ in figures), section

  if "smoke" in sections:
    # The trainer was stopped by SIGTERM, resumed from its checkpoint and
    # finished; metrics reached TensorBoard files.
    assert figures[("smoke/passed", "ours")]["value"] == 1.0
    assert figures[("smoke/sigterm_exit_code", "ours")]["value"] == 0
    assert figures[("smoke/resumed_from_step", "ours")]["value"] > 0
    assert figures[("smoke/tensorboard_event_files", "ours")]["value"] >= 1

  # Side by side: both sides' time, MFU and the ratio on every figure.
  for name in ("trm/mlp_t_sudoku_triton/train_step", "trm/att_maze/train_step",
               "gpt/attention_dot/iteration", "dream/b2/exact"):
    unit = "seconds" if name.startswith("dream") else "ms"
    ours, torch = figures[(f"{name}/{unit}", "ours")], figures[
        (f"{name}/{unit}", "torch")]
    ratio = figures[(f"{name}/ours_over_torch_time", "ours")]
    assert ratio["value"] == pytest.approx(ours["value"] / torch["value"])
    for row in (ours, torch, ratio):
      assert row["mfu_ours"] > 0 and row["mfu_torch"] > 0, row
      assert row["ours_over_torch_time"] == pytest.approx(ratio["value"])
    assert ours["mfu"] == ours["mfu_ours"] and torch["mfu"] == torch[
        "mfu_torch"]
    assert ours["device"] == "cpu" and torch["device"] == "cpu"
  assert figures[("gpt/attention_dot/iteration/tokens_per_s", "ours")]
  # The Triton token mixer ran, in Pallas's interpreter on the CPU.
  assert figures[("trm/mlp_t_sudoku_triton/train_step/ms", "ours")][
      "mlp_kernel"] == "triton_interpret"
  for name in ("mlp_t_sudoku_triton", "att_maze"):  # what ours' step needs
    assert figures[(f"trm/{name}/memory_gib", "ours")]["value"] > 0
  assert figures[("dream/b2/dual/new_tokens_per_s", "ours")]["value"] > 0
  # Files that come back from the device: at most 8, none deeper.
  assert len(os.listdir(out)) <= 8
  assert {"figures.jsonl", "log.txt"} <= set(os.listdir(out))
  # Ours' optimized programs, which offline.py --replay plays.
  with tarfile.open(out / "hlo_after_optimizations.tar.gz") as tar:
    names = tar.getnames()
    assert any("train_step" in n for n in names), names
    assert any("generate" in n for n in names), names
    assert all(n.endswith("after_optimizations.txt") for n in names), names
    step = next(n for n in names if "train_step" in n)
    tar.extract(step, tmp_path / "hlo")
  sys.path.insert(0, KIT)
  try:
    import offline  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  row = offline.replay(str(tmp_path / "hlo" / step), "h100", 0.6, 5)
  assert row["forecast_ms"] > 0 and row["hot_spots"]


def test_batch_search_jumps_to_the_batch_the_compiled_step_fits():
  sys.path.insert(0, KIT)
  try:
    import measure  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  gib = 1 << 30
  # The first H100 run: ours' MLP-t step at 768 needed more than the 40 GiB
  # JAX had; linear in the batch, 384 fits 85% of 36 GiB.
  assert measure.smaller_batch(768, measure.StepTooBig(60 * gib, 36 * gib)) == 384
  assert measure.smaller_batch(768, measure.StepTooBig(100 * gib, 36 * gib)) == 192
  assert measure.smaller_batch(768, measure.StepTooBig(200 * gib, 36 * gib)) == 96
  # An allocator's error says nothing of the size: halve.
  assert measure.smaller_batch(768, MemoryError("RESOURCE_EXHAUSTED")) == 384
  assert measure.smaller_batch(2, measure.StepTooBig(100 * gib, gib)) == 1
  assert measure.is_oom(measure.StepTooBig(2 * gib, gib))




# Run in a process of its own with one CPU device (the kit's TRM configs
# put the step on one device); `measure` is imported from the kit. One run
# holds every recovery the two tests below check (each variant's compiles
# cost more than its rounds): ours' cuDNN attention and Triton token mixer
# refused off a GPU, upstream's step out of memory above batch 2, and then
# out of memory in its second round. The attention variant starts at batch
# 4 and halves; the MLP-t one starts at 2 (the same halving again cost a
# compile of ours' step at 4).
_TRM_RECOVERY_DRIVER = """
import sys
import measure
import torch
from trm.data.puzzles import maze, sudoku

args = measure.parse_args(["trm", "--out=" + sys.argv[1], "--smoke",
                           "--rounds=2", "--steps=2"])
measure._trm_variants = lambda args: [
    ("att_maze", "trm_maze.py", "cpu", maze.dataset_metadata(1), 4, "cudnn",
     "dot"),
    ("mlp_t_sudoku_triton", "trm_sudoku.py", "cpu",
     sudoku.dataset_metadata(1), 2, "dot", "triton")]
measure.keep_trace = lambda *args, **kwargs: None
device_trm = measure._device_trm_class()
smoke_config = measure.trm_config


def cudnn_in_bfloat16(*args, **kwargs):
  # :cpu computes in float32, which cuDNN's check refuses first; in
  # bfloat16 it is the GPU-only refusal that sends the kit to dot.
  config = smoke_config(*args, **kwargs)
  if config.model.attention == "cudnn":
    with config.unlocked():
      config.model.forward_dtype = "bfloat16"
  return config


measure.trm_config = cudnn_in_bfloat16


class RunsOutAboveTwoAndAfterTheFirstRound(device_trm):
  steps = 0

  def train_step(self, carry, batch):
    rows = batch["inputs"].shape[0]
    print("torch step at batch", rows, flush=True)
    if rows > 2:
      raise torch.cuda.OutOfMemoryError(
          "CUDA out of memory. Tried to allocate 2.00 GiB")
    self.steps += 1
    if self.steps > 4:  # 2 warm-up steps and round 1's 2
      raise torch.cuda.OutOfMemoryError(
          "CUDA out of memory. Tried to allocate 2.00 GiB")
    return super().train_step(carry, batch)


measure._device_trm_class = lambda: RunsOutAboveTwoAndAfterTheFirstRound
measure.section_trm(args, measure.Recorder(args, "trm"), measure.Budget(900))
"""


@pytest.fixture(scope="module")
def trm_recovery(tmp_path_factory):
  """(log, figures.jsonl rows in order) of _TRM_RECOVERY_DRIVER's run."""
  pytest.importorskip("torch")
  import workers  # pylint: disable=g-import-not-at-top
  out = tmp_path_factory.mktemp("trm_recovery")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      filter(None, [KIT, ROOT, os.environ.get("PYTHONPATH")])),
             JAX_PLATFORMS="cpu", XLA_FLAGS=workers.xla_flags(1))
  # The session's compilation cache (tests/conftest.py), as measure.py's
  # main turns it on: the driver and the run.sh test compile the same
  # steps at batch 2.
  driver = ("from trm.core import compile_cache\n"
            "compile_cache.configure(None)\n" + _TRM_RECOVERY_DRIVER)
  proc = subprocess.run([sys.executable, "-c", driver, str(out)],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=600, check=False)
  log = proc.stdout + proc.stderr
  assert proc.returncode == 0, log[-6000:]
  with open(out / "figures.jsonl") as f:
    return log, [json.loads(line) for line in f]


def test_trm_section_falls_back_to_dot_and_halves_when_torch_runs_out(
    trm_recovery):
  """The TRM section's recoveries, on the CPU: ours' cuDNN attention or
  Triton token mixer failing (refused off a GPU) is timed with 'dot'
  instead, and upstream's step running out of memory at a batch ours runs
  halves both sides' batch rather than losing the figure."""
  log, rows = trm_recovery
  assert re.search(r"trm att_maze: ours failed \(\w+: .*cuDNN", log), log
  assert "attention=cudnn failed; timing ours with attention=dot" in log
  assert "torch does not fit batch 4; both sides at 2" in log, log
  tried = [int(b) for b in re.findall(r"torch step at batch (\d+)", log)]
  # The attention variant tries 4 once, then 2; the MLP-t one starts at 2.
  assert tried[0] == 4 and tried.count(4) == 1 and set(tried) == {2, 4}, tried
  assert log.count("torch does not fit batch") == 1, log
  rows = {(r["name"], r["side"]): r for r in rows}
  for side in ("ours", "torch"):
    step = rows[("trm/att_maze/train_step/ms", side)]
    assert step["batch"] == 2 and step["attention"] == "dot", step
  assert rows[("trm/att_maze/memory_gib", "ours")]["batch"] == 2
  assert "mlp_kernel=triton failed; timing ours with mlp_kernel=dot" in log
  step = rows[("trm/mlp_t_sudoku_triton/train_step/ms", "ours")]
  assert step["mlp_kernel"] == "dot" and step["batch"] == 2, step


def test_a_side_failing_in_a_trm_round_keeps_the_figures(trm_recovery):
  """Upstream's step failing in the second round (out of memory, a device
  error) stops torch's rounds only: the rounds timed so far are recorded
  and the next variant runs; it lost both before."""
  log, rows = trm_recovery
  assert "round 2: torch failed (OutOfMemoryError" in log, log[-6000:]
  names = ("att_maze", "mlp_t_sudoku_triton")
  figures = {(r["name"], r["side"]): r for r in rows}
  for name in names:
    ours = figures[(f"trm/{name}/train_step/ms", "ours")]
    torch = figures[(f"trm/{name}/train_step/ms", "torch")]
    assert ours["rounds"] == 2 and torch["rounds"] == 1, (ours, torch)
    assert ours["ours_over_torch_time"] > 0
  # Each round as it was timed.
  rounds = [(r["name"], r["side"], r["round"]) for r in rows if "round" in r]
  assert rounds == [(f"trm/{name}/train_step/round/ms", side, r)
                    for name in names
                    for side, r in (("ours", 1), ("torch", 1), ("ours", 2))]


def test_sections_run_in_the_order_asked_with_their_own_arguments(tmp_path):
  # A rerun on the device names its sections and their arguments, e.g. one
  # TRM variant at a known batch before GPT (second H100 run).
  out = tmp_path / "out"
  env = dict(os.environ, TRM_GPU_INSTALL="0", PYTHON=sys.executable,
             TRM_GPU_SCRATCH=str(tmp_path / "scratch"),
             TRM_GPU_ARGS_TRM="--trm_variants=att_maze --trm_batch=2 "
             "--rounds=1 --steps=1")
  proc = subprocess.run(
      ["bash", os.path.join(KIT, "run.sh"), str(out), "--smoke",
       "--only=trm,nonsense"], cwd=ROOT, env=env, capture_output=True,
      text=True, timeout=600, check=False)
  log = (out / "log.txt").read_text()
  assert proc.returncode != 0  # the unknown section is a failure
  assert ("section nonsense: unknown (smoke, trm, gpt, dream, cudnn, mixer, "
          "gptk)" in log)
  assert "failed: nonsense" in log
  with open(out / "figures.jsonl") as f:
    names = {json.loads(line)["name"] for line in f}
  assert "trm/att_maze/train_step/ms" in names
  assert not [n for n in names if n.startswith("trm/mlp_t_sudoku/")]
  batches = {json.loads(line)["batch"] for line in
             open(out / "figures.jsonl") if "train_step" in line}
  assert batches == {2}


def _kit_module(name: str):
  """A module of benchmarks/gpu (which is not a package)."""
  sys.path.insert(0, KIT)
  try:
    return importlib.import_module(name)
  finally:
    sys.path.remove(KIT)


def _smoke_section(tmp_path, monkeypatch, section: str) -> dict:
  """measure.py `section` --smoke on the CPU: its figures by name. Run in
  this process, as measure.py's main runs it (a process of its own cost
  ~3 s of imports; measure.py's main and run.sh's call of it are
  test_sections_run_in_the_order_asked_with_their_own_arguments')."""
  monkeypatch.syspath_prepend(KIT)
  measure = importlib.import_module("measure")
  module = importlib.import_module({"mixer": "mixer_sweep",
                                    "gptk": "gpt_kernels"}[section])
  args = measure.parse_args([section, "--smoke", f"--out={tmp_path}",
                             "--budget=900"])
  rec = measure.Recorder(args, section)
  getattr(module, f"section_{section}")(args, rec, measure.Budget(args.budget),
                                        measure.log)
  assert rec.count, section
  with open(tmp_path / "figures.jsonl") as f:
    return {r["name"]: r for r in map(json.loads, f)}


def test_mixer_section_sweeps_the_triton_constants(tmp_path, monkeypatch):
  """`--only=mixer` on the CPU: the token mixer's kernels interpreted at
  tiny sizes in every setting of each kernel (mixer_sweep.KERNELS), each
  timed beside the XLA path and checked against it."""
  rows = _smoke_section(tmp_path, monkeypatch, "mixer")
  sys.path.insert(0, KIT)
  try:
    import mixer_sweep  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  for kind in ("forward", "train", "channel"):
    assert rows[f"mixer/xla/{kind}/ms"]["value"] > 0
  chosen = {}
  for kernel, _, settings in mixer_sweep.KERNELS:
    if kernel == "grad" and mixer_sweep._dx_does_the_weight_gradients(chosen):
      # dx's 'epilogue' computes the weight gradients: grad is not swept.
      assert not [n for n in rows if n.startswith("mixer/grad/")]
      continue
    for name, _ in settings:
      row = rows[f"mixer/{kernel}/{name}/ms"]
      assert row["value"] > 0, (kernel, name)
      assert row["program"] == {"forward": "forward",
                                "channel": "channel"}.get(kernel, "train")
      # Traced anew (jit keyed on a reused function would run the first
      # setting's kernels under every name).
      assert row["first_call_s"] > 0.01, (kernel, name)
      if (kernel, name) == ("channel", "default"):  # XLA's, timed once
        assert row["value"] == rows["mixer/xla/channel/ms"]["value"]
      if kernel == "channel":  # the channel MLP's own inner width
        assert row["inter"] == rows["mixer/xla/channel/ms"]["inter"] == 64
      # Each kernel is tuned with the earlier kernels at their best.
      assert row["earlier"] == chosen, (kernel, name)
      # bf16, relative to the largest value: a wrong setting shows here.
      assert rows[f"mixer/{kernel}/{name}/max_rel_err"]["value"] < 0.02
    chosen[kernel] = min(
        (name for name, _ in settings),
        key=lambda n, k=kernel: rows[f"mixer/{k}/{n}/ms"]["value"])
  # The trm section after it would compile with each kernel's fastest.
  name, changes = mixer_sweep.swept_setting(str(tmp_path / "figures.jsonl"))
  assert name == " ".join(f"{k}={v}" for k, v in chosen.items())
  assert changes == mixer_sweep._changes(chosen)


def test_gptk_section_times_gpts_kernels_beside_xla(tmp_path, monkeypatch):
  """`gptk` on the CPU: GPT's loss and norm kernels interpreted at tiny
  sizes under each setting of gpt_kernels.GPT_SETTINGS, each timed beside
  the XLA path it replaces and checked against it."""
  rows = _smoke_section(tmp_path, monkeypatch, "gptk")
  gpt_kernels = _kit_module("gpt_kernels")
  for kernel, settings in gpt_kernels.GPT_SETTINGS.items():
    assert rows[f"gptk/{kernel}/xla/ms"]["value"] > 0
    for i, setting in enumerate(settings):
      name = gpt_kernels.setting_name(setting)
      assert rows[f"gptk/{kernel}/{name}/ms"]["value"] > 0, (kernel, name)
      assert rows[f"gptk/{kernel}/{name}/ms"]["default"] == (i == 0)
      # Traced anew under each setting (a reused jit would not recompile).
      assert rows[f"gptk/{kernel}/{name}/ms"]["first_call_s"] > 0.01
      assert rows[f"gptk/{kernel}/{name}/max_rel_err"]["value"] < 0.02


def _mixer_rows(path, times: dict, errors: dict):
  with open(path, "w") as f:
    f.write(json.dumps({"name": "trm/x/ms", "value": 0.001}) + "\n")
    for name, ms in times.items():
      f.write(json.dumps({"name": f"mixer/{name}/ms", "value": ms}) + "\n")
      f.write(json.dumps({"name": f"mixer/{name}/max_rel_err",
                          "value": errors.get(name, 0.004)}) + "\n")


def test_a_setting_with_nan_results_is_never_chosen(monkeypatch):
  """max() passes over a NaN: a fast setting whose results hold NaNs must
  score an infinite error, and a NaN error must not pass the bound."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  monkeypatch.syspath_prepend(KIT)
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  want = [np.array([[1.0, 2.0]]), np.array([3.0])]
  assert mixer_sweep._max_rel_err(want, want) == 0.0
  got = [np.array([[1.0, np.nan]]), np.array([3.0])]
  assert mixer_sweep._max_rel_err(got, want) == float("inf")
  got = [np.array([[1.0, 2.0]]), np.array([np.inf])]
  assert mixer_sweep._max_rel_err(got, want) == float("inf")
  names = [name for name, _ in mixer_sweep.KERNELS[0][2]]
  values = {f"forward/{names[0]}/ms": 1.0,
            f"forward/{names[0]}/max_rel_err": 0.01,
            f"forward/{names[1]}/ms": 0.5,
            f"forward/{names[1]}/max_rel_err": float("nan"),
            f"forward/{names[2]}/ms": 0.4,
            f"forward/{names[2]}/max_rel_err": float("inf")}
  assert mixer_sweep._best(values, "forward") == names[0]


def test_swept_setting_is_the_fastest_correct_one(tmp_path, monkeypatch):
  """The TRM section takes each kernel's fastest setting whose results
  match XLA's; a fast but wrong one, an untimed kernel and other sections'
  figures are passed over; without a sweep the kernels keep their
  constants."""
  monkeypatch.syspath_prepend(KIT)
  import measure  # pylint: disable=g-import-not-at-top
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  from trm.families.trm import mlp_gpu  # pylint: disable=g-import-not-at-top
  figures = tmp_path / "figures.jsonl"
  assert mixer_sweep.swept_setting(str(figures)) is None
  forward = [name for name, _ in mixer_sweep.KERNELS[0][2]]
  dx = [name for name, _ in mixer_sweep.KERNELS[1][2]]
  _mixer_rows(figures, {"xla/forward": 0.1, f"forward/{forward[0]}": 3.0,
                        f"forward/{forward[1]}": 1.0,
                        f"forward/{forward[2]}": 2.0,
                        f"dx/{dx[0]}": 5.0, f"dx/{dx[1]}": 4.0},
              errors={f"forward/{forward[1]}": 0.3})
  name, changes = mixer_sweep.swept_setting(str(figures))
  assert name == f"forward={forward[2]} dx={dx[1]}"
  assert changes == {"_FORWARD": mixer_sweep.KERNELS[0][2][2][1],
                     "_DX": mixer_sweep.KERNELS[1][2][1][1]}

  args = measure.parse_args(["trm", f"--out={tmp_path}"])
  before = {c: getattr(mlp_gpu, c) for c in ("_FORWARD", "_DX", "_GRAD")}
  for constant, value in before.items():
    monkeypatch.setattr(mlp_gpu, constant, value)
  assert measure._use_mixer_setting(args) == name
  for constant, change in changes.items():
    assert getattr(mlp_gpu, constant) == dict(before[constant], **change)
    assert getattr(mlp_gpu, constant) != before[constant]
  assert mlp_gpu._GRAD == before["_GRAD"]
  args = measure.parse_args(["trm", f"--out={tmp_path}",
                             "--mixer_setting_from=default"])
  assert measure._use_mixer_setting(args) == "default"
  args = measure.parse_args(["trm", f"--out={tmp_path / 'none'}"])
  assert measure._use_mixer_setting(args) == "default"


def test_trm_variants_are_checked():
  sys.path.insert(0, KIT)
  try:
    import measure  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  args = measure.parse_args(["trm", "--out=x", "--trm_variants=att_maze"])
  assert args.trm_variants == ["att_maze"]
  args = measure.parse_args(["trm", "--out=x",
                             "--trm_variants=mlp_t_sudoku_triton"])
  (variant,) = measure._trm_variants(args)  # pylint: disable=protected-access
  config = measure.trm_config(*variant[1:3], variant[4], False,
                              *variant[5:])
  assert (config.model.mlp_t, config.model.mlp_kernel) == (True, "triton")
  with pytest.raises(SystemExit):
    measure.parse_args(["trm", "--out=x", "--trm_variants=att_maze,mlp"])
  # Timed in the order named (it was the module's own order, whatever the
  # flag said: the default's mlp_t_sudoku_triton ran second, so a short
  # budget cut it rather than att_maze), each once.
  args = measure.parse_args(["trm", "--out=x", "--trm_variants="
                             "mlp_t_sudoku_triton,att_maze,mlp_t_sudoku,"
                             "att_maze"])
  assert [v[0] for v in measure._trm_variants(args)] == [  # pylint: disable=protected-access
      "mlp_t_sudoku_triton", "att_maze", "mlp_t_sudoku"]


def test_gpt_variants_are_checked_and_set_the_model():
  sys.path.insert(0, KIT)
  try:
    import measure  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  args = measure.parse_args(["gpt", "--out=x"])
  assert args.gpt_variants == ["cudnn"]
  args = measure.parse_args(["gpt", "--out=x",
                             "--gpt_variants=cudnn,cudnn_fused_qkv"])
  models = [measure.gpt_config(args, "/nonexistent", v).model
            for v in args.gpt_variants]
  # The A/B of c_attn: three matmuls (auto, with cuDNN) against nanoGPT's one.
  assert [(m.attention, m.qkv_projection) for m in models] == [
      ("cudnn", "auto"), ("cudnn", "fused")]
  # The Pallas kernels' variants: on the GPU 'triton', in --smoke the
  # interpreter (with XLA's attention).
  for smoke, kind in ((False, "triton"), (True, "triton_interpret")):
    args = measure.parse_args(
        ["gpt", "--out=x", "--gpt_variants=cudnn_triton"]
        + (["--smoke"] if smoke else []))
    config = measure.gpt_config(args, "/nonexistent", "cudnn_triton")
    assert (config.loss_kernel, config.model.norm_kernel) == (kind, kind)
    assert config.model.attention == ("dot" if smoke else "cudnn")
  with pytest.raises(SystemExit):
    measure.parse_args(["gpt", "--out=x", "--gpt_variants=cudnn,flash"])


@pytest.mark.parametrize("mlp_t, attention, limit_gib, first, kernel", [
    (True, "dot", 35.6, 384, "dot"),  # the H100 at 45%: 768 needed 33.4 GiB
    # The token mixer's Triton kernels keep no [2I, M] projection: 7.9 GiB
    # at 384 in the H100 compile, so upstream's 768 fits.
    (True, "dot", 35.6, 768, "triton"),
    (False, "cudnn", 35.6, 96, "dot"),   # 192 needed 33.7 GiB there
    (False, "cudnn", 63.5, 192, "dot"),  # an H200 at 45%
    (False, "cudnn", None, 768, "dot"),  # the CPU: the compile decides
])
def test_trm_batch_search_starts_where_the_measured_step_fits(
    monkeypatch, mlp_t, attention, limit_gib, first, kernel):
  import types  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, KIT)
  try:
    import measure  # pylint: disable=g-import-not-at-top
  finally:
    sys.path.remove(KIT)
  monkeypatch.setattr(measure, "device_memory_limit",
                      lambda: limit_gib and int(limit_gib * 2**30))
  config = types.SimpleNamespace(model=types.SimpleNamespace(
      mlp_t=mlp_t, attention=attention, mlp_kernel=kernel))
  assert measure._trm_batch_guess(config, None, 768) == first  # pylint: disable=protected-access


def _sweep_on_a_clock(monkeypatch, seconds_per_call: float, budget_s: float):
  """(mixer_sweep, the names of its figures) of the sweep run with every
  timing (compile included) taking `seconds_per_call` of `budget_s`."""
  import types  # pylint: disable=g-import-not-at-top
  monkeypatch.syspath_prepend(KIT)
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  clock = [0.0]

  def timed(fn, operands, seconds):
    del fn, operands, seconds
    clock[0] += seconds_per_call
    return None, 0.1, 1e-3
  monkeypatch.setattr(mixer_sweep, "_timed", timed)
  monkeypatch.setattr(mixer_sweep, "_max_rel_err", lambda got, want: 0.0)
  budget = types.SimpleNamespace(left=lambda: budget_s - clock[0])
  figures = []
  rec = types.SimpleNamespace(
      figure=lambda name, *a, **k: figures.append(name))
  args = types.SimpleNamespace(smoke=True, mixer_batch=4)
  mixer_sweep.section_mixer(args, rec, budget, lambda message: None)
  return mixer_sweep, figures


def test_mixer_sweep_shares_its_budget_between_the_kernels(monkeypatch):
  """Each kernel gets a share of the section's budget by its number of
  settings: with every compile and timing taking 10 s of a 150 s budget,
  the forward's settings stop at their share and dx and the weight
  gradients are still timed (without shares the weight gradients would
  get one setting)."""
  mixer_sweep, figures = _sweep_on_a_clock(monkeypatch, 10, 150)
  timed_settings = collections.Counter(
      name.split("/")[0] for name in figures
      if name.endswith("/ms") and not name.startswith("xla/")
      and name != "channel/default/ms")
  sizes = {kernel: len(settings) for kernel, _, settings in
           mixer_sweep.KERNELS}
  assert set(timed_settings) == set(sizes), timed_settings
  assert timed_settings["forward"] < sizes["forward"], timed_settings
  assert timed_settings["grad"] >= 2, timed_settings
  # The XLA path's three programs, then 10 s per setting; the channel's
  # XLA setting reuses the XLA figures (no time) and is always recorded.
  assert sum(timed_settings.values()) == (150 - 30) // 10
  assert "channel/default/ms" in figures


def test_the_channel_sweep_always_records_xla(monkeypatch):
  """With the budget spent before the channel MLP's turn, its XLA setting
  is still recorded (free: the XLA path's figures) and no kernel of it is
  timed, so none can be chosen without XLA's time beside it."""
  _, figures = _sweep_on_a_clock(monkeypatch, 40, 150)
  channel = [n for n in figures if n.startswith("channel/")
             and n.endswith("/ms")]
  assert channel == ["channel/default/ms"], figures


def test_grad_is_not_swept_after_an_epilogue_dx(monkeypatch):
  """dx's 'epilogue' settings compute the weight gradients with cuBLAS, so
  the grad kernel's settings would time the same program."""
  monkeypatch.syspath_prepend(KIT)
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  dx = dict(dict((k, s) for k, _, s in mixer_sweep.KERNELS)["dx"])
  epilogue = [n for n, change in dx.items()
              if change.get("layout") == "epilogue"]
  assert epilogue
  for name in dx:
    assert mixer_sweep._dx_does_the_weight_gradients({"dx": name}) == (
        name in epilogue)
  assert not mixer_sweep._dx_does_the_weight_gradients({})
