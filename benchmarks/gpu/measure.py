r"""The figures of issue 26, ours against PyTorch on one device, one JSON line
per figure. `benchmarks/gpu/run.sh` runs each section in its own process,
under its own `timeout`:

  python benchmarks/gpu/measure.py SECTION --out=DIR --budget=SECONDS [--smoke]

SECTION is one of
  trm    TRM train step (the paper's MLP-t Sudoku and attention Maze configs):
         ours (the trainer's jitted step) against `benchmarks/reference/trm_torch.py`
         (upstream's train_batch) with torch.compile on the forward and loss,
         as upstream's pretrain.py compiles its model; ms/step and MFU. Ours
         runs Maze's attention with cuDNN's flash attention (upstream runs
         FlashAttention; --trm_attention=dot for XLA's); JAX may take 45% of
         the GPU, and the batch is the largest both sides run, up to 768.
  gpt    GPT-2 124M train iteration (12 x 1024 tokens x 40 micro-steps, as
         nanoGPT's train.py defaults): ours (`benchmarks/speed/gpt_speed.py`'s
         task and step; attention 'cudnn', then 'dot' if the budget allows)
         against nanoGPT's loop
         (`benchmarks/reference/nanogpt_torch.py`'s model, torch.compile, bf16
         autocast, fused AdamW); tokens/s and MFU.
  dream  DiffuCoder-7B-shaped Dream with random bf16 weights, 512 prompt +
         512 new tokens at batch 1 and 16: ours exact and cache='dual'
         (attention 'cudnn', 'dot' where that does not compile) against
         the reference `diffusion_generate` (Dream's HF code, carried in
         benchmarks/gpu/wheels/dream_hf; without it the project's own
         PyTorch sampler, CPU only); new tokens/s and MFU.
  smoke  `python -m trm.main --config=configs/trm_sudoku.py:cpu` for 50
         steps (generated puzzles), SIGTERM during training, then the same
         command again: it must resume from its checkpoint and finish.

Rounds alternate ours and torch on the same device. Each figure is one JSON
line in DIR/figures.jsonl with name, value, unit, side (ours | torch),
device, jax and torch versions, dtype, batch and the command, plus the MFU
and ratio where they apply; each round's time is written as it is measured.
A section stops starting new work when its budget runs low, so a slow
device yields fewer rounds, not a killed run. trm, gpt and dream run in a
child process under a watchdog (`supervise`): a call that hangs past its
bound ends its TRM variant or Dream batch size only.
Where ours falls short of the goal (1.3x torch's throughput) in the first
round, a jax.profiler trace of a few of our steps is taken then and kept as
DIR/trace_<name>.tar.gz (if under 16 MiB; at most 5: TRM's two variants,
GPT's first attention path, Dream's exact sampler at its first batch size;
and Dream's dual-cache sampler at its first batch size, which has no
PyTorch side, always).

--smoke runs every section with tiny sizes on the CPU (JAX and torch), to
check the script end to end before device time is spent; torch.compile is
off there (minutes on 2 cores; --torch_compile=1 forces it).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import gzip
import json
import math
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHMARKS = os.path.dirname(HERE)
REPO = os.path.dirname(BENCHMARKS)
# The PyTorch ports (reference/) and the CPU timing loops (speed/) it reuses.
for _path in (REPO, os.path.join(BENCHMARKS, "reference"),
              os.path.join(BENCHMARKS, "speed")):
  if _path not in sys.path:
    sys.path.insert(0, _path)

SECTIONS = ("smoke", "trm", "gpt", "dream", "cudnn", "mixer", "gptk")
# Issue 26's goal: ours at least 1.3x torch's throughput. Where ours falls
# short (ours' time above torch's / 1.3), a trace says why.
GOAL_SPEEDUP = 1.3
TRACE_LIMIT = 16 << 20  # bytes of one trace archive
MAX_TRACES = 5          # files back from the device are limited (8)
TRM_JAX_MEMORY_FRACTION = 0.45  # of the GPU, for ours in the TRM section
# Dream: uncapped, JAX's allocator held about 60 of the H100's 80 GB after
# ours' batch-16 sampler and HF's batch 16 ran out of memory beside it
# (2026-11-27, run 2); at 0.45 both ran (run 3).
DREAM_JAX_MEMORY_FRACTION = 0.45
# Bytes per example ours' TRM step needed on the H100 (memory_gib figures of
# benchmarks/gpu/results/2026-11-27-h100: MLP-t 19.03 GiB at 384, cuDNN
# attention 17.96 GiB at 96); the batch search starts where that fits.
TRM_MEASURED_BYTES_PER_EXAMPLE = {"mlp_t": 19.03 * 2**30 / 384,
                                  "attention": 17.96 * 2**30 / 96,
                                  # offline.py's H100 compile (no GPU yet)
                                  "mlp_t_triton": 7.9 * 2**30 / 384}


class OutOfTime(Exception):
  """The section's budget ran out inside a call (see `time_limit`)."""


# The watchdog (`supervise`). SIGALRM stops Python code at its bound, but
# not a device call that never returns (a GPU hang inside
# block_until_ready or a torch sync): then `supervise`, the process that
# started this one, kills it WATCH_GRACE_S past the bound and starts the
# section's next variant in a new process. This process tells it the unit
# (TRM variant, Dream batch size) it is in and the bound of the call it is
# in, one JSON line each, in the file --watch_file names.
WATCH_GRACE_S = 20.0
WATCH_FLOOR_S = 60.0  # a call's bound: 4x its earlier time, at least this
FIRST_CALL_S = 120.0  # a call with no earlier time (Dream's warm-ups)
_watch = {"path": None, "bounds": []}


def _watch_write(**line) -> None:
  if _watch["path"]:
    with open(_watch["path"], "a") as f:
      f.write(json.dumps(line) + "\n")


def watch_unit(name) -> None:
  """Tells the watchdog that the section starts its unit `name`."""
  _watch_write(unit=str(name))


def call_bound(earlier_seconds: float | None, left: float) -> float:
  """A timed call's bound: 4x the same call's earlier time (a warm-up, the
  round before), at least WATCH_FLOOR_S, at most `left`."""
  if not earlier_seconds:
    return left
  return min(left, max(WATCH_FLOOR_S, 4 * earlier_seconds))


@contextlib.contextmanager
def time_limit(seconds: float):
  """Raises OutOfTime in the main thread after `seconds` (SIGALRM), and
  tells the watchdog the bound, for a call that SIGALRM cannot stop."""
  if seconds <= 0:
    raise OutOfTime("no time left")

  def handler(signum, frame):
    del signum, frame
    raise OutOfTime(f"over {seconds:.0f} s")

  previous = signal.signal(signal.SIGALRM, handler)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  _watch["bounds"].append(time.time() + seconds)
  _watch_write(until=_watch["bounds"][-1])
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)
    _watch["bounds"].pop()
    _watch_write(until=_watch["bounds"][-1] if _watch["bounds"] else None)


class Budget:
  """Seconds left of the section's budget, less a margin for writing out."""

  def __init__(self, seconds: float, margin: float = 5.0):
    self.end = time.monotonic() + seconds - margin

  def left(self) -> float:
    return self.end - time.monotonic()


def log(message: str) -> None:
  print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def is_oom(error: BaseException) -> bool:
  text = f"{type(error).__name__}: {error}"
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "out of memory",
                                 "OutOfMemoryError", "Out of memory"))


def json_line(row: dict) -> str:
  """One strict-JSON line: JSON has no NaN or Infinity (json.dumps would
  write them bare, which jq and other parsers reject), so a non-finite
  value (e.g. a kernel's max_rel_err of inf) is written as null, with
  `non_finite` saying which it was."""
  value = row.get("value")
  if isinstance(value, float) and not math.isfinite(value):
    row = dict(row, non_finite=str(value))
  from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
  return json.dumps(atomic_files.nonfinite_as_null(row), allow_nan=False)


class Recorder:
  """Appends figures to OUT/figures.jsonl, each with the common fields."""

  def __init__(self, args, section: str):
    import jax  # pylint: disable=g-import-not-at-top
    self.args, self.section = args, section
    self.path = os.path.join(args.out, "figures.jsonl")
    self.jax_version = jax.__version__
    self.jax_device = jax.devices()[0].device_kind
    self.platform = jax.devices()[0].platform
    try:
      import torch  # pylint: disable=g-import-not-at-top
      self.torch_version = torch.__version__
      self.torch_device = (torch.cuda.get_device_name(0)
                           if torch.cuda.is_available() else "cpu")
    except Exception:  # pylint: disable=broad-except
      # Not only ImportError: a broken install raises others (OSError on a
      # missing library); torch_device says so, and ours runs alone.
      self.torch_version, self.torch_device = None, None
    # The watchdog's file is this process's own (a child of `supervise`).
    self.command = " ".join(["python", "benchmarks/gpu/measure.py"]
                            + [a for a in sys.argv[1:]
                               if not a.startswith("--watch_file=")])
    self.count = 0
    self.traces = sum(n.startswith("trace_") for n in os.listdir(args.out))

  def figure(self, name: str, value: float, unit: str, side: str, *,
             dtype: str, batch: int, **extra) -> dict:
    """One JSON line; `extra` adds fields (mfu, ratio, sizes, ...)."""
    row = dict(name=f"{self.section}/{name}", value=float(value), unit=unit,
               side=side,
               device=self.jax_device if side == "ours" else self.torch_device,
               jax=self.jax_version, torch=self.torch_version, dtype=dtype,
               batch=int(batch), command=self.command,
               smoke=bool(self.args.smoke), **matmul_settings(side), **extra)
    with open(self.path, "a") as f:
      f.write(json_line(row) + "\n")
    self.count += 1
    shown = " ".join(f"{k} {v:.4g}" for k, v in extra.items()
                     if k in ("mfu", "ours_over_torch_time")
                     and isinstance(v, float))
    log(f"FIGURE {row['name']} [{side}] = {value:.6g} {unit} {shown}")
    return row

  def round_time(self, name: str, side: str, seconds: float, index: int, *,
                 dtype: str, batch: int, time_unit: str = "ms",
                 **extra) -> None:
    """One side's time in round `index` (from 0) of a measurement, written
    as soon as it is measured (`<name>/round/<ms|seconds>`): a hang later
    in the section loses none of the rounds before it (`pair` writes the
    medians once all rounds are in)."""
    scale = {"ms": 1e3, "s": 1.0}[time_unit]
    self.figure(f"{name}/round/{'ms' if time_unit == 'ms' else 'seconds'}",
                seconds * scale, time_unit, side, dtype=dtype, batch=batch,
                round=index + 1, **extra)

  def pair(self, name: str, ours: list[float], theirs: list[float], *,
           dtype: str, batch: int, flops: float | None, peak: float | None,
           time_unit: str = "ms", rate: tuple[str, str, float] | None = None,
           **extra) -> None:
    """Figures of one measurement, from each side's seconds per call (one
    per round): the median time and, with `rate` = (name, unit, work per
    call), work / median time; each with its side's MFU (model FLOPs per
    call `flops` over time over the device's `peak`), both sides' MFU and
    the ratio ours / torch time (above 1: ours is slower), which is also a
    figure of its own (`<name>/ours_over_torch_time`)."""
    scale = {"ms": 1e3, "s": 1.0}[time_unit]
    med = {side: statistics.median(v)
           for side, v in (("ours", ours), ("torch", theirs)) if v}
    mfu = {side: (flops / t / peak if flops and peak else None)
           for side, t in med.items()}
    ratio = med["ours"] / med["torch"] if len(med) == 2 else None
    both = dict(mfu_ours=mfu.get("ours"), mfu_torch=mfu.get("torch"),
                ours_over_torch_time=ratio, **extra)
    for side, values in (("ours", ours), ("torch", theirs)):
      if side not in med:
        continue
      common = dict(dtype=dtype, batch=batch, mfu=mfu[side],
                    rounds=len(values), **both)
      self.figure(f"{name}/{'ms' if time_unit == 'ms' else 'seconds'}",
                  med[side] * scale, time_unit, side,
                  min=min(values) * scale, max=max(values) * scale, **common)
      if rate:
        rate_name, rate_unit, work = rate
        self.figure(f"{name}/{rate_name}", work / med[side], rate_unit, side,
                    **common)
    if ratio is not None:
      self.figure(f"{name}/ours_over_torch_time", ratio, "x", "ours",
                  dtype=dtype, batch=batch, mfu=mfu["ours"], **both)


def short_of_goal(ours_seconds: float, torch_seconds: float) -> bool:
  """Is ours short of GOAL_SPEEDUP x torch's throughput?"""
  return ours_seconds * GOAL_SPEEDUP > torch_seconds


def keep_trace(rec: Recorder, name: str, run, torch_run=None,
               runs: int = 1, seconds: float | None = None) -> None:
  """Profiles `run()` with jax.profiler into OUT/trace_<name>.tar.gz; with
  `torch_run`, the same work on torch's side with torch.profiler, into the
  same archive (`torch/torch.trace.json.gz`, Chrome format, and
  `torch/meta.json` with `runs`, the steps or calls each side ran), so
  `profile_table.py --side=torch` sets the two side by side. `seconds`
  bounds both (`time_limit`: the watchdog ends a hang)."""
  if rec.traces >= MAX_TRACES:
    log(f"trace {name}: skipped ({MAX_TRACES} traces kept already)")
    return
  import jax  # pylint: disable=g-import-not-at-top
  scratch = tempfile.mkdtemp(prefix="trm_trace_")
  try:
    with (time_limit(seconds) if seconds is not None
          else contextlib.nullcontext()):
      with jax.profiler.trace(scratch):
        run()
      if torch_run is not None:
        try:
          _torch_trace(os.path.join(scratch, "torch"), torch_run, runs)
        except Exception as e:  # pylint: disable=broad-except
          log(f"trace {name}: torch's side failed ({type(e).__name__}: "
              f"{e})")
    safe = re.sub(r"[^\w.-]", "_", name)
    path = os.path.join(rec.args.out, f"trace_{safe}.tar.gz")
    with tarfile.open(path, "w:gz") as tar:
      tar.add(scratch, arcname=f"trace_{name}")
    size = os.path.getsize(path)
    if size > TRACE_LIMIT:
      os.remove(path)
      log(f"trace {name}: {size >> 20} MiB is over {TRACE_LIMIT >> 20} MiB; "
          "not kept")
    else:
      rec.traces += 1
      log(f"trace {name}: kept {path} ({size / 2**20:.1f} MiB)")
  except Exception as e:  # pylint: disable=broad-except
    log(f"trace {name}: failed ({type(e).__name__}: {e})")
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _torch_trace(directory: str, torch_run, runs: int) -> None:
  """torch.profiler's Chrome trace of `torch_run()` (its GPU kernels where
  there is a GPU), gzipped, and how many steps or calls it ran."""
  import torch  # pylint: disable=g-import-not-at-top
  os.makedirs(directory)
  activities = [torch.profiler.ProfilerActivity.CPU]
  if torch.cuda.is_available():
    activities.append(torch.profiler.ProfilerActivity.CUDA)
  with torch.profiler.profile(activities=activities) as prof:
    torch_run()
  raw = os.path.join(directory, "torch.trace.json")
  prof.export_chrome_trace(raw)
  with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as out:
    shutil.copyfileobj(f, out)
  os.remove(raw)
  with open(os.path.join(directory, "meta.json"), "w") as f:
    json.dump({"runs": runs, "torch": torch.__version__}, f)


def free_memory() -> None:
  import jax  # pylint: disable=g-import-not-at-top
  gc.collect()
  jax.clear_caches()
  try:
    import torch  # pylint: disable=g-import-not-at-top
    if torch.cuda.is_available():
      torch.cuda.empty_cache()
  except ImportError:
    pass


# TF32 for torch's float32 matmuls and cuDNN calls, per section, as each
# reference runs: nanoGPT's train.py turns both on; upstream TRM's
# pretrain.py and Dream's code set neither, so torch's defaults hold
# (matmuls off, cuDNN on). Ours runs at JAX's default matmul precision, TF32
# on an NVIDIA GPU (trm.core.mfu). Every figure records its side's setting.
TORCH_TF32 = {"trm": (False, True), "gpt": (True, True),
              "dream": (False, True)}


def matmul_settings(side: str) -> dict:
  """The float32 matmul settings `side` ran under, for its figures."""
  if side == "ours":
    import jax  # pylint: disable=g-import-not-at-top
    from trm.core import mfu as mfu_lib  # pylint: disable=g-import-not-at-top
    precision = jax.config.jax_default_matmul_precision
    # trm.core.mfu's rule for the peak: TF32 unless asked for float32.
    return {"jax_default_matmul_precision": precision,
            "tf32_matmul": str(precision).lower() not in
                           mfu_lib.FULL_FLOAT32}
  torch = sys.modules.get("torch")  # None: torch does not import
  if torch is None:
    return {}
  return {"tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
          "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32)}


def torch_device(args):
  """torch's device for the section, or None (said in the log) where torch
  does not import or sees no GPU: then ours is measured alone, rather than
  the section failing before any of ours' figures. Sets torch's TF32 as the
  section's reference does (TORCH_TF32), on the CPU too, so --smoke runs
  the same code."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except Exception as e:  # pylint: disable=broad-except
    log(f"torch: does not import ({type(e).__name__}: {str(e)[:300]}); "
        "ours is measured alone")
    return None
  if args.section in TORCH_TF32:
    matmul, cudnn = TORCH_TF32[args.section]
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    log(f"torch: TF32 for float32 matmuls {'on' if matmul else 'off'}, for "
        f"cuDNN {'on' if cudnn else 'off'}, as the {args.section} reference "
        "runs")
  if args.smoke:
    # One thread: torch's OpenMP workers spinning beside XLA's pool on a
    # small shared CPU slow both sides several-fold.
    torch.set_num_threads(1)
    return torch.device("cpu")
  if not torch.cuda.is_available():
    log("torch: sees no CUDA device; ours is measured alone (on a CPU, run "
        "with --smoke)")
    return None
  return torch.device("cuda")


def use_torch_compile(args) -> bool:
  return bool(args.torch_compile) if args.torch_compile is not None else (
      not args.smoke)


def sync(device) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  if device.type == "cuda":
    torch.cuda.synchronize()


# --------------------------------------------------------------------------
# TRM


TRM_VARIANTS = ("mlp_t_sudoku", "att_maze", "mlp_t_sudoku_triton",
                "att_maze_triton")


def _trm_variants(args):
  """(name, config file, variant, dataset metadata, global batch, attention
  kernel of ours, SwiGLU kernel of ours). The `_triton` variants run
  mlp_kernel='triton' (on the CPU, --smoke: interpreted): in the MLP-t
  step the token mixer as the Pallas Triton kernels of
  trm/families/trm/mlp_gpu.py, and in both the channel MLP as
  channel_gpu's kernel where its layout (or the mixer sweep) says so."""
  from trm.data.puzzles import maze, sudoku  # pylint: disable=g-import-not-at-top
  smoke = args.smoke
  # --smoke: configs' :cpu variant at small batches, the kernels
  # interpreted (parse_args already sets the attention to dot).
  variant = "cpu" if smoke else None
  triton = "triton_interpret" if smoke else "triton"
  mlp_t_batch, att_batch = (8, 2) if smoke else (args.trm_batch,) * 2
  variants = [("mlp_t_sudoku", "trm_sudoku.py", variant,
               sudoku.dataset_metadata(1), mlp_t_batch, "dot", "dot"),
              ("att_maze", "trm_maze.py", variant, maze.dataset_metadata(1),
               att_batch, args.trm_attention, "dot"),
              ("mlp_t_sudoku_triton", "trm_sudoku.py", variant,
               sudoku.dataset_metadata(1), mlp_t_batch, "dot", triton),
              ("att_maze_triton", "trm_maze.py", variant,
               maze.dataset_metadata(1), att_batch, args.trm_attention,
               triton)]
  # In --trm_variants' order: the first named is timed first, and it is the
  # second that a short budget cuts.
  return sorted((v for v in variants if v[0] in args.trm_variants),
                key=lambda v: args.trm_variants.index(v[0]))


def trm_config(file: str, variant, batch: int, smoke: bool,
               attention: str = "dot", mlp_kernel: str = "dot"):
  """The kit's TRM config: configs/`file` at `batch`, as measured
  (offline.py compiles the same)."""
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(os.path.join(REPO, "configs", file), variant)
  with config.unlocked():
    config.global_batch_size = batch
    config.mesh.data = 1
    config.model.attention = attention
    config.model.mlp_kernel = mlp_kernel
    if smoke:  # a smaller net than :cpu, so the CPU check takes seconds
      config.model.update(hidden_size=32, num_heads=2, puzzle_emb_ndim=32,
                          H_cycles=1, L_cycles=1, L_layers=1,
                          halt_max_steps=2)
  return config


class StepTooBig(MemoryError):
  """The compiled step needs more device memory than JAX may use."""

  def __init__(self, need: int, limit: int):
    super().__init__(f"out of memory: the step needs {need / 2**30:.1f} GiB "
                     f"of the {limit / 2**30:.1f} GiB JAX may use")
    self.need, self.limit = need, limit


def smaller_batch(batch: int, error: BaseException) -> int:
  """The next batch to try after `error` at `batch`: halved, or, when the
  compiled step said what it needs, halved until that (linear in the batch)
  fits 85% of the limit, so one more compile rather than several."""
  smaller = max(batch // 2, 1)
  if isinstance(error, StepTooBig):
    while smaller > 1 and error.need * smaller / batch > 0.85 * error.limit:
      smaller //= 2
  return smaller


def _trm_ours(config, metadata):
  """(model, state, compiled step, compile s, host batch maker, to_device,
  bytes the step needs): the trainer's mesh, state, sharding and step code
  on random batches."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import pipeline  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  from trm.families.trm import program as trm_program  # pylint: disable=g-import-not-at-top

  ctx = mesh_lib.ShardingContext.from_config(config)
  batch_size = config.global_batch_size
  program = trm_program.build(config, ctx, metadata)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  rng = np.random.default_rng(0)
  vocab, seq = metadata.vocab_size, metadata.seq_len

  def batch():
    labels = rng.integers(2, vocab, (batch_size, seq)).astype(np.int32)
    inputs = np.where(rng.random((batch_size, seq)) < 0.5, 1, labels)
    return {"inputs": inputs.astype(np.int32), "labels": labels,
            "puzzle_identifiers": np.zeros((batch_size,), np.int32)}

  start = time.perf_counter()
  step = task_lib.compile_train_step(program, ctx, batch_size, abstract,
                                     shardings)
  compile_s = time.perf_counter() - start
  limit = device_memory_limit()
  memory = step.memory_analysis()
  need = sum(getattr(memory, f"{k}_size_in_bytes", 0)
             for k in ("argument", "output", "temp"))
  if limit and need > 0.92 * limit:
    raise StepTooBig(need, limit)
  to_device = lambda host: pipeline.to_global(host, batch_shardings)  # noqa: E731
  return program.model, state, step, compile_s, batch, to_device, need


def device_memory_limit() -> int | None:
  """Bytes JAX may use on its first device (None on the CPU)."""
  import jax  # pylint: disable=g-import-not-at-top
  try:
    return (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
  except Exception:  # pylint: disable=broad-except
    return None


def _trm_batch_guess(config, metadata, batch: int) -> int:
  """The largest batch <= `batch`, halving, likely to fit the device: with
  the dot path, whose attention scores fit half of it ([B, H, T, T] float32
  probabilities and their bfloat16 copy for each layer call of the
  backward, which at Maze's 916 positions limits the batch; upstream's
  FlashAttention keeps none, and so does attention='cudnn'); otherwise
  whose step, at the bytes per example measured on the H100, fits 85% of
  what JAX may use. The compile then says what the step really needs."""
  limit = device_memory_limit()
  model = config.model
  if not limit:
    return batch
  if model.mlp_t or model.attention != "dot":
    # What ours' compiled step needed per example on the H100 (2026-11-27,
    # the configs' sizes): starting there saves the compiles of batches
    # that cannot fit (about 20 s each).
    kind = "attention"
    if model.mlp_t:
      kind = "mlp_t_triton" if model.mlp_kernel == "triton" else "mlp_t"
    per_example = TRM_MEASURED_BYTES_PER_EXAMPLE[kind]
    while batch > 1 and batch * per_example > 0.85 * limit:
      batch //= 2
    return batch
  length = metadata.seq_len + model.puzzle_emb_len
  per_example = (6 * model.num_heads * length**2 * (model.L_cycles + 1)
                 * model.L_layers)
  while batch > 1 and batch * per_example > 0.5 * limit:
    batch //= 2
  return batch


def _device_trm_class():
  """trm_torch.TorchTRM with its tensors on a device (it builds them on the
  CPU, as upstream's code does without a GPU)."""
  import torch  # pylint: disable=g-import-not-at-top
  import trm_torch  # pylint: disable=g-import-not-at-top

  class DeviceTRM(trm_torch.TorchTRM):
    """TorchTRM whose parameters, optimizer state and buffers live on
    `device`."""

    def __init__(self, *args, device, **kwargs):
      super().__init__(*args, **kwargs)
      self.device = device
      self.p = {k: v.detach().to(device).requires_grad_(True)
                for k, v in self.p.items()}
      for name in ("m", "v", "ema"):
        setattr(self, name, {k: v.to(device)
                             for k, v in getattr(self, name).items()})
      for name in ("H_init", "L_init", "table", "cos", "sin"):
        value = getattr(self, name, None)
        if value is not None:
          setattr(self, name, value.to(device))

    def initial_carry(self, batch_size):
      return {k: v.to(self.device)
              for k, v in super().initial_carry(batch_size).items()}

    def _sign_sgd(self, ids, grad, lr, wd):
      # As TorchTRM._sign_sgd, with the sums on the gradient's device.
      uniq, inverse = ids.unique(return_inverse=True)
      summed = torch.zeros(uniq.shape[0], grad.shape[1], dtype=grad.dtype,
                           device=grad.device)
      summed.scatter_add_(0, inverse.unsqueeze(-1).expand(-1, grad.shape[1]),
                          grad)
      rows = self.table[uniq]
      rows.mul_(1.0 - lr * wd).add_(torch.sign(summed), alpha=-lr)
      self.table[uniq] = rows

  return DeviceTRM


def section_trm(args, rec: Recorder, budget: Budget) -> None:
  device = torch_device(args)
  log("torch.compile: " + ("on" if use_torch_compile(args)
                            else "off (--smoke on CPU)"))
  variants = _trm_variants(args)
  args.mixer_setting = None
  if any(v[-1] != "dot" for v in variants):
    args.mixer_setting = _use_mixer_setting(args)
  for index, (name, file, variant, metadata, batch, attention,
              mlp_kernel) in enumerate(variants):
    watch_unit(name)
    # Each variant gets its share of what is left.
    share = budget.left() / (len(variants) - index)
    end = time.monotonic() + share
    left = lambda: end - time.monotonic()  # noqa: E731
    if share < 15:
      log(f"trm {name}: skipped, {share:.0f} s left")
      continue
    first_batch = batch
    # The largest batch both sides run, from upstream's 768 down: ours
    # first (a compile says what it needs), then torch at ours' batch.
    while True:
      make_config = functools.partial(trm_config, file, variant,
                                      smoke=args.smoke, attention=attention,
                                      mlp_kernel=mlp_kernel)
      guess = _trm_batch_guess(make_config(batch), metadata, batch)
      if guess < batch:
        log(f"trm {name}: batch {batch} would not fit the device's memory "
            f"(attention scores); starting at {guess}")
        batch = guess
      batch, config, ours = _trm_fit_ours(name, make_config, metadata, batch,
                                          left)
      if ours is None and attention != "dot":
        log(f"trm {name}: attention={attention} failed; timing ours with "
            "attention=dot instead")
        attention, batch = "dot", first_batch
        continue
      if ours is None and mlp_kernel != "dot":
        log(f"trm {name}: mlp_kernel={mlp_kernel} failed; timing ours with "
            "mlp_kernel=dot instead (the figures say which)")
        mlp_kernel, batch = "dot", first_batch
        continue
      if ours is None:
        break
      timed = _trm_time_pair(args, rec, name, config, metadata, batch, ours,
                             device, left)
      if timed == "torch_oom" and batch > 1:
        log(f"trm {name}: torch does not fit batch {batch}; both sides at "
            f"{batch // 2}")
        batch //= 2
        free_memory()
        continue
      break
    free_memory()


def _use_mixer_setting(args) -> str:
  """Sets the TRM kernels' constants (mlp_gpu's, channel_gpu's) to the
  `mixer` section's fastest settings when it ran earlier into the same
  --out (--mixer_setting_from=swept); returns their names, which the TRM
  figures carry."""
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  if args.mixer_setting_from == "default":
    return "default"
  swept = mixer_sweep.swept_setting(os.path.join(args.out, "figures.jsonl"))
  if swept is None:
    log("trm: no mixer sweep in this --out; the Triton kernels keep "
        "their modules' own constants")
    return "default"
  name, changes = swept
  for constant, change in changes.items():
    module = mixer_sweep.owner(constant)
    setattr(module, constant, dict(getattr(module, constant), **change))
  log(f"trm: the Triton kernels use the mixer sweep's fastest settings, "
      f"{name} ({changes or 'the modules own constants'})")
  return name


def _trm_fit_ours(name, make_config, metadata, batch, left):
  """(batch, config, ours) at the largest batch <= `batch` whose step fits
  ours' share of the device and has run once; ours = (model, state, step,
  compile_s, make_batch, to_device, bytes needed), or None on failure."""
  import jax  # pylint: disable=g-import-not-at-top
  while True:
    config = make_config(batch)
    try:
      with time_limit(left()):
        model, state, step, compile_s, make_batch, to_device, need = (
            _trm_ours(config, metadata))
        state, _ = step(state, to_device(make_batch()))
        jax.block_until_ready(state)
      return batch, config, (model, state, step, compile_s, make_batch,
                             to_device, need)
    except Exception as e:  # pylint: disable=broad-except
      free_memory()
      if is_oom(e) and batch > 1:
        smaller = smaller_batch(batch, e)
        log(f"trm {name}: batch {batch} does not fit ({type(e).__name__}: "
            f"{e}); trying {smaller}")
        batch = smaller
        continue
      log(f"trm {name}: ours failed ({type(e).__name__}: {e})")
      return batch, config, None


def _trm_time_pair(args, rec, name, config, metadata, batch, ours, device,
                   left):
  """Ours against upstream's step at `batch`, rounds alternating; returns
  'torch_oom' when torch cannot run that batch (nothing recorded then)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.core import mfu as mfu_lib  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top

  model, state, step, compile_s, make_batch, to_device, need = ours
  dtype = config.model.forward_dtype
  attention = "mlp_t" if config.model.mlp_t else config.model.attention
  flops = trm_model.train_flops_per_example(model.cfg) * batch
  peak, peak_what = mfu_lib.peak_flops(jax.devices()[0], dtype)
  log(f"trm {name}: batch {batch}, hidden {config.model.hidden_size}, "
      f"mlp_t {config.model.mlp_t}, attention {attention}, "
      f"H{config.model.H_cycles} L{config.model.L_cycles}, {dtype}; "
      f"{flops:.3e} model FLOPs/step; peak {peak_what}; ours compiled in "
      f"{compile_s:.1f} s, needs {need / 2**30:.1f} GiB")
  steps = args.steps
  batches = [make_batch() for _ in range(steps)]
  ours_batches = [to_device(b) for b in batches]
  compiled = use_torch_compile(args) and device is not None
  if device is not None:  # None: torch is unusable, ours runs alone
    import torch  # pylint: disable=g-import-not-at-top
    host = jax.device_get(state)
    table = host.puzzle_emb.get("weights") if host.puzzle_emb else None
    theirs = _device_trm_class()(model.cfg, host.params, host.buffers, table,
                                 config.optim, config.total_steps,
                                 device=device)
    del host
    eager_forward = theirs.forward_loss
    if compiled:
      theirs.forward_loss = torch.compile(eager_forward)
    torch_batches = [{k: torch.from_numpy(np.asarray(v)).to(device)
                      for k, v in b.items()} for b in batches]

  def run_ours(state):
    times = []
    for b in ours_batches:
      start = time.perf_counter()
      state, metrics = step(state, b)
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - start)
    return state, times

  def traced_steps():
    nonlocal state  # the step donates it
    state, _ = run_ours(state)

  def run_torch(carry):
    times = []
    for b in torch_batches:
      start = time.perf_counter()
      carry, _, _ = theirs.train_step(carry, b)
      sync(device)
      times.append(time.perf_counter() - start)
    return carry, times

  def warm_torch(limit):
    if device.type == "cuda":
      torch.cuda.reset_peak_memory_stats()
    with time_limit(limit):
      carry = theirs.initial_carry(batch)
      start = time.perf_counter()
      carry, _, _ = theirs.train_step(carry, torch_batches[0])
      sync(device)
      first = time.perf_counter() - start
      carry, _, _ = theirs.train_step(carry, torch_batches[1 % steps])
      sync(device)
    return carry, first

  carry, torch_ok = None, device is not None
  try:
    # torch.compile gets what is left but 15 s for an eager fallback.
    if torch_ok:
      carry, first = warm_torch(left() - (15 if compiled else 5))
  except Exception as e:  # pylint: disable=broad-except
    log(f"trm {name}: torch {'compile ' if compiled else ''}failed or ran "
        f"out of time ({type(e).__name__}: {str(e)[:300]})")
    torch_ok = False
    if is_oom(e):
      return "torch_oom"
    if compiled:
      log(f"trm {name}: timing torch eager instead")
      theirs.forward_loss, compiled = eager_forward, False
      try:
        carry, first = warm_torch(left() - 5)
        torch_ok = True
      except Exception as e2:  # pylint: disable=broad-except
        log(f"trm {name}: torch eager failed ({type(e2).__name__}: {e2})")
        if is_oom(e2):
          return "torch_oom"
  common = dict(dtype=dtype, batch=batch, attention=attention,
                mlp_kernel=config.model.mlp_kernel)
  if config.model.mlp_kernel != "dot":
    common["mixer_setting"] = args.mixer_setting
  rec.figure(f"{name}/compile_s", compile_s, "s", "ours", **common)
  rec.figure(f"{name}/memory_gib", need / 2**30, "GiB", "ours",
             what="compiled step: arguments + outputs + temporaries",
             **common)
  if torch_ok:
    rec.figure(f"{name}/first_step_s", first, "s", "torch",
               torch_compile=compiled, **common)
    if device.type == "cuda":
      rec.figure(f"{name}/memory_gib",
                 torch.cuda.max_memory_allocated() / 2**30, "GiB", "torch",
                 what="torch.cuda.max_memory_allocated",
                 torch_compile=compiled, **common)
  ours_s, torch_s = [], []  # per round: median seconds per step
  # Each side's round is bounded by 4x its round before and the variant's
  # share (`call_bound`: SIGALRM, and the watchdog for a hang), but never
  # under WATCH_FLOOR_S: the rounds ran unbounded before, and a torch.compile
  # that took its share but 15 s must not cost the figure. Each round is on
  # disk as soon as it is timed.
  earlier = {"ours": None, "torch": None}
  share_left = lambda: max(left(), WATCH_FLOOR_S)  # noqa: E731
  for r in range(args.rounds):
    if r and left() < 3 * (max(ours_s + torch_s) * steps + 1):
      break
    # A side that fails in a round (out of memory, a device error) stops;
    # the rounds timed so far are still recorded, and the next variant runs.
    try:
      with time_limit(call_bound(earlier["ours"], share_left())):
        state, t = run_ours(state)
    except Exception as e:  # pylint: disable=broad-except
      log(f"trm {name} round {r + 1}: ours failed ({type(e).__name__}: "
          f"{str(e)[:300]}); no more rounds")
      break
    earlier["ours"] = sum(t)
    ours_s.append(statistics.median(t))
    rec.round_time(f"{name}/train_step", "ours", ours_s[-1], r, **common)
    if torch_ok:
      try:
        with time_limit(call_bound(earlier["torch"], share_left())):
          carry, t = run_torch(carry)
        earlier["torch"] = sum(t)
        torch_s.append(statistics.median(t))
        rec.round_time(f"{name}/train_step", "torch", torch_s[-1], r,
                       torch_compile=compiled, **common)
      except Exception as e:  # pylint: disable=broad-except
        log(f"trm {name} round {r + 1}: torch failed ({type(e).__name__}: "
            f"{str(e)[:300]}); ours goes on alone")
        torch_ok = False
    log(f"trm {name} round {r + 1}: ours {1e3 * ours_s[-1]:.2f} ms/step"
        + (f", torch {1e3 * torch_s[-1]:.2f} ms/step" if torch_ok else ""))
    if r == 0 and torch_s and short_of_goal(ours_s[0], torch_s[0]):
      # Traced now, while the budget still holds a few steps.
      keep_trace(rec, f"trm_{name}", traced_steps,
                 torch_run=lambda: run_torch(carry), runs=steps,
                 seconds=left())
  rec.pair(f"{name}/train_step", ours_s, torch_s, flops=flops, peak=peak,
           time_unit="ms", rate=("examples_per_s", "examples/s", batch),
           torch_compile=compiled, peak_what=peak_what,
           hidden=config.model.hidden_size, mlp_t=config.model.mlp_t,
           seq_len=metadata.seq_len, **common)
  return "done"


# --------------------------------------------------------------------------
# GPT-2 124M


def _synthetic_tokens(data_dir: str, tokens: int, vocab: int = 50257) -> None:
  """A prepared nanoGPT-format dataset of uniform random GPT-2 token ids
  (speed does not depend on the text)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  os.makedirs(data_dir, exist_ok=True)
  rng = np.random.default_rng(0)
  counts = {}
  for split, n in (("train", tokens), ("val", max(tokens // 10, 4096))):
    rng.integers(0, vocab, n, dtype=np.uint16).tofile(
        os.path.join(data_dir, f"{split}.bin"))
    counts[f"{split}_tokens"] = n
  with open(os.path.join(data_dir, "meta.json"), "w") as f:
    json.dump({"vocab_size": vocab, "tokenizer": "gpt2", **counts}, f)


_SMOKE_VOCAB = 256


GPT_VARIANTS = {  # name: (model.attention, model.qkv_projection,
                 #        loss_kernel, model.norm_kernel)
    "cudnn": ("cudnn", "auto", "xla", "xla"),  # separate q, k, v matmuls
    "cudnn_fused_qkv": ("cudnn", "fused", "xla", "xla"),  # one c_attn matmul
    # Pallas Triton kernels: the loss's passes over the logits as one
    # kernel; each residual add with the LayerNorm after it; both.
    "cudnn_triton_loss": ("cudnn", "auto", "triton", "xla"),
    "cudnn_triton_norm": ("cudnn", "auto", "xla", "triton"),
    "cudnn_triton": ("cudnn", "auto", "triton", "triton"),
    "dot": ("dot", "auto", "xla", "xla"),
}


def gpt_config(args, data_root: str, variant: str):
  """The kit's GPT-2 124M config (nanoGPT's defaults), as measured, for
  one of GPT_VARIANTS."""
  attention, qkv_projection, loss_kernel, norm_kernel = GPT_VARIANTS[variant]
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(os.path.join(REPO, "configs", "gpt.py"),
                                  None)
  with config.unlocked():
    config.data_root = data_root
    config.dataset = "synthetic"
    config.data.input = ""
    config.data.tokenizer = "gpt2"
    config.model.vocab_size = 50304  # nanoGPT's padded GPT-2 vocabulary
    config.model.attention = attention
    config.model.qkv_projection = qkv_projection
    config.loss_kernel = loss_kernel
    config.model.norm_kernel = norm_kernel
    if args.smoke:
      config.update(dict(n_layer=2, n_head=2, n_embd=64, block_size=64,
                         batch_size=4, gradient_accumulation_steps=2,
                         dtype="float32"))
      config.model.vocab_size = _SMOKE_VOCAB
      # GPU-only kernels: XLA's attention, the loss in the interpreter.
      config.model.attention = "dot"
      if loss_kernel == "triton":
        config.loss_kernel = "triton_interpret"
      if norm_kernel == "triton":
        config.model.norm_kernel = "triton_interpret"
    else:
      config.gradient_accumulation_steps = args.gpt_accum
    # nanoGPT's LM head under autocast returns logits in the compute dtype
    # (F.cross_entropy then works in float32, as ours does).
    config.model.logits_dtype = config.dtype
  return config


def _torch_gpt(config, data_dir: str, device, compile_torch: bool):
  """nanoGPT train.py's iteration on `device`: returns (iteration(), model
  args, non-embedding params)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import nanogpt_torch  # pylint: disable=g-import-not-at-top

  torch.manual_seed(1337)
  model_args = dict(block_size=config.block_size,
                    vocab_size=config.model.vocab_size,
                    n_layer=config.n_layer, n_head=config.n_head,
                    n_embd=config.n_embd, dropout=0.0, bias=config.bias)
  model = nanogpt_torch.GPT(nanogpt_torch.Config(**model_args)).to(device)
  optimizer = model.configure_optimizers(
      config.weight_decay, config.learning_rate, (config.beta1, config.beta2),
      device.type)
  num_params = model.get_num_params()
  forward = torch.compile(model) if compile_torch else model
  autocast = (torch.amp.autocast(device_type="cuda", dtype=torch.bfloat16)
              if device.type == "cuda" and config.dtype == "bfloat16"
              else contextlib.nullcontext())
  train_bin = os.path.join(data_dir, "train.bin")
  block, rows = config.block_size, config.batch_size
  accum = config.gradient_accumulation_steps

  def get_batch():
    data = np.memmap(train_bin, dtype=np.uint16, mode="r")
    ix = torch.randint(len(data) - block, (rows,))
    x = torch.stack([torch.from_numpy(data[i:i + block].astype(np.int64))
                     for i in ix])
    y = torch.stack([torch.from_numpy(
        data[i + 1:i + 1 + block].astype(np.int64)) for i in ix])
    if device.type == "cuda":
      return (x.pin_memory().to(device, non_blocking=True),
              y.pin_memory().to(device, non_blocking=True))
    return x, y

  batch = [get_batch()]

  def iteration() -> float:
    for _ in range(accum):
      with autocast:
        _, loss = forward(*batch[0])
        loss = loss / accum
      batch[0] = get_batch()
      loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item() * accum

  return iteration, num_params


def section_gpt(args, rec: Recorder, budget: Budget) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  from trm.core import mfu as mfu_lib  # pylint: disable=g-import-not-at-top
  import gpt_speed  # pylint: disable=g-import-not-at-top

  device = torch_device(args)
  compile_torch = use_torch_compile(args) and device is not None
  scratch = tempfile.mkdtemp(prefix="trm_gpt_")
  data_root = os.path.join(scratch, "data")
  # The first variant before torch, the others after it, as the budget
  # allows (cuDNN's flash attention first on the GPU: nanoGPT runs torch's
  # flash SDPA).
  attentions = args.gpt_variants
  if args.smoke:
    attentions = ["dot"] + [v for v in attentions
                            if set(GPT_VARIANTS[v][2:]) != {"xla"}]
    log("gpt: attention='cudnn' is GPU-only; --smoke times 'dot' (and the "
        "variants' Triton kernels in Pallas's interpreter)")
  config = gpt_config(args, data_root, "dot")
  tokens_per_iter = (config.batch_size * config.gradient_accumulation_steps
                     * config.block_size)
  _synthetic_tokens(os.path.join(data_root, "synthetic"),
                    max(2_000_000 if not args.smoke else 50_000,
                        4 * tokens_per_iter),
                    _SMOKE_VOCAB if args.smoke else 50257)
  log(f"gpt: n_layer {config.n_layer}, n_head {config.n_head}, n_embd "
      f"{config.n_embd}, block {config.block_size}, micro-batch "
      f"{config.batch_size} x {config.gradient_accumulation_steps} "
      f"micro-steps = {tokens_per_iter} tokens/iter, {config.dtype}; "
      f"torch.compile {'on' if compile_torch else 'off (--smoke on CPU)'}")
  peak, peak_what = mfu_lib.peak_flops(jax.devices()[0], config.dtype)
  iters, warmup = args.gpt_iters, 1
  ours = {}

  def build_ours(attention):
    if budget.left() < 30:
      log(f"gpt ours attention={attention}: skipped, {budget.left():.0f} s "
          "left")
      return
    try:
      with time_limit(budget.left() - 20):
        start = time.perf_counter()
        timed = gpt_speed.make_ours(gpt_config(args, data_root, attention))
        timed(1, 1)  # compiles on the first call too
        rec.figure(f"ours_{attention}/setup_and_first_iter_s",
                   time.perf_counter() - start, "s", "ours",
                   dtype=config.dtype, batch=config.batch_size)
      ours[attention] = (timed, [])
    except Exception as e:  # pylint: disable=broad-except
      log(f"gpt ours attention={attention}: failed ({type(e).__name__}: {e})")
      free_memory()

  # Ours with the first attention path, then torch, then (budget
  # permitting) the other.
  build_ours(attentions[0])
  theirs = None
  torch_ms = []
  for compiled in ([True, False] if compile_torch else
                   [] if device is None else [False]):
    try:
      # torch.compile leaves 25 s for an eager fallback.
      with time_limit(budget.left() - (25 if compiled else 10)):
        start = time.perf_counter()
        iteration, num_params = _torch_gpt(
            config, os.path.join(data_root, "synthetic"), device, compiled)
        iteration()  # compiles
        sync(device)
        rec.figure("torch/setup_and_first_iter_s",
                   time.perf_counter() - start, "s", "torch",
                   dtype=config.dtype, batch=config.batch_size,
                   torch_compile=compiled)
        theirs, compile_torch = iteration, compiled
        break
    except Exception as e:  # pylint: disable=broad-except
      log(f"gpt torch{' compile' if compiled else ''}: failed or ran out of "
          f"time ({type(e).__name__}: {str(e)[:300]})")
      free_memory()
  for attention in attentions[1:]:
    build_ours(attention)
  flops = mfu_lib.nanogpt_flops_per_iter(
      num_params if theirs else 0, config.n_layer, config.n_head,
      config.n_embd, config.block_size,
      config.batch_size * config.gradient_accumulation_steps) if theirs else None

  def time_torch() -> float:
    times = []
    for _ in range(iters):
      start = time.perf_counter()
      theirs()
      times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)

  slowest = 0.0
  stopped = set()  # ours' variants that failed in a round
  # Each round is bounded by 4x the one before and the budget
  # (`call_bound`: SIGALRM, and the watchdog for a hang), never under
  # WATCH_FLOOR_S (the rounds ran unbounded before), and is on disk as soon
  # as it is timed.
  def bound(ms):
    return call_bound(ms and ms[-1] * iters / 1e3,
                      max(budget.left(), WATCH_FLOOR_S))

  for r in range(args.rounds):
    if r and budget.left() < 2 * slowest * (len(ours) + 1) * iters / 1e3 + 5:
      break
    line = []
    for attention, (timed, ms) in ours.items():
      if attention in stopped:
        continue
      # A side that fails in a round (out of memory, a device error) stops;
      # the rounds timed so far are still recorded.
      try:
        with time_limit(bound(ms)):
          result = timed(iters, warmup if r == 0 else 0)
      except Exception as e:  # pylint: disable=broad-except
        log(f"gpt round {r + 1}: ours {attention} failed ({type(e).__name__}"
            f": {str(e)[:300]}); no more rounds of it")
        stopped.add(attention)
        continue
      ms.append(result["ms_per_iter"])
      rec.round_time(f"attention_{attention}/iteration", "ours", ms[-1] / 1e3,
                     r, dtype=config.dtype, batch=config.batch_size)
      slowest = max(slowest, ms[-1])
      line.append(f"ours {attention} {ms[-1]:.1f} ms")
      if flops is None:
        flops = result["mfu"] * peak * result["ms_per_iter"] / 1e3
    if theirs:
      try:
        with time_limit(bound(torch_ms)):
          torch_ms.append(time_torch())
        rec.round_time("torch/iteration", "torch", torch_ms[-1] / 1e3, r,
                       dtype=config.dtype, batch=config.batch_size,
                       torch_compile=compile_torch)
        slowest = max(slowest, torch_ms[-1])
        line.append(f"torch {torch_ms[-1]:.1f} ms")
      except Exception as e:  # pylint: disable=broad-except
        log(f"gpt round {r + 1}: torch failed ({type(e).__name__}: "
            f"{str(e)[:300]}); no more rounds of it")
        theirs = None
    if not line:
      break
    log(f"gpt round {r + 1}: " + ", ".join(line) + " per iteration")
    if r == 0 and torch_ms and ours:
      # Traced now, while the budget still holds an iteration each.
      # The first variant only (cuDNN on the GPU): traces are few.
      attention, (timed, ms) = next(iter(ours.items()))
      if ms and short_of_goal(ms[0], torch_ms[0]):
        # One iteration each side (torch's meta.json says 1; time_torch
        # would run `iters`, which the table would count as one).
        keep_trace(rec, f"gpt_{attention}", lambda: timed(1, 0),  # pylint: disable=cell-var-from-loop
                   torch_run=theirs, seconds=budget.left() - 5)
  for attention, (timed, ms) in ours.items():
    if not ms:
      continue
    rec.pair(f"attention_{attention}/iteration",
             [t / 1e3 for t in ms], [t / 1e3 for t in torch_ms],
             dtype=config.dtype, batch=config.batch_size, flops=flops,
             peak=peak, time_unit="ms",
             rate=("tokens_per_s", "tokens/s", tokens_per_iter),
             attention="dot" if args.smoke else GPT_VARIANTS[attention][0],
             qkv_projection=GPT_VARIANTS[attention][1],
             loss_kernel=gpt_config(args, data_root, attention).loss_kernel,
             norm_kernel=gpt_config(args, data_root,
                                    attention).model.norm_kernel,
             torch_compile=compile_torch,
             peak_what=peak_what, block_size=config.block_size,
             accum=config.gradient_accumulation_steps,
             tokens_per_iter=tokens_per_iter,
             logits_dtype=config.model.logits_dtype)
  shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------
# Dream / DiffuCoder


def dream_cfg(args):
  """The kit's DiffuCoder-7B-shaped DreamConfig (tiny with --smoke)."""
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  if args.smoke:
    return dream.DreamConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        mask_token_id=1023, pad_token_id=0, dtype="float32",
        param_dtype="float32", remat="none")
  # configs/diffucoder_7b.py's sizes; bf16 weights for sampling. cuDNN's
  # flash attention by default (Dream's HF code runs torch's sdpa).
  return dream.DreamConfig(dtype="bfloat16", param_dtype="bfloat16",
                           remat="none", attention=args.dream_attention)


def _dream_reference(args):
  """(module, description) of Dream's HF code in args.dream_hf, or None."""
  init = os.path.join(args.dream_hf, "modeling_dream.py")
  if not os.path.isfile(init):
    return None
  import importlib  # pylint: disable=g-import-not-at-top
  parent, package = os.path.split(os.path.abspath(args.dream_hf))
  if parent not in sys.path:
    sys.path.insert(0, parent)
  module = importlib.import_module(f"{package}.modeling_dream")
  import transformers  # pylint: disable=g-import-not-at-top
  return module, (f"Dream HF code from {args.dream_hf} "
                  f"(transformers {transformers.__version__}; "
                  f"{dream_hf_digest(args.dream_hf)})")


def dream_hf_digest(directory: str) -> str:
  """Whether Dream's HF files in `directory` are the pinned copy
  (dream_hf.sha256), said in every Dream figure's `reference`: a changed
  or other copy is timed, but never passes for the pinned one."""
  import hashlib  # pylint: disable=g-import-not-at-top
  differ = []
  with open(os.path.join(HERE, "dream_hf.sha256")) as f:
    pinned = [line.split() for line in f if line.strip()]
  for digest, name in pinned:
    try:
      with open(os.path.join(directory, name), "rb") as f:
        found = hashlib.sha256(f.read()).hexdigest()
    except OSError:
      found = None
    if found != digest:
      differ.append(name)
  if not differ:
    return "sha256 as dream_hf.sha256"
  return f"NOT the pinned copy: {', '.join(differ)} differ from dream_hf.sha256"


def _torch_dream_model(reference, cfg, device):
  """Dream's DreamModel with cfg's sizes and random weights, on device."""
  import torch  # pylint: disable=g-import-not-at-top
  module = reference
  config_cls = sys.modules[module.__name__.rsplit(".", 1)[0]
                           + ".configuration_dream"].DreamConfig
  config = config_cls(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      intermediate_size=cfg.intermediate_size,
      num_hidden_layers=cfg.num_hidden_layers,
      num_attention_heads=cfg.num_attention_heads,
      num_key_value_heads=cfg.num_key_value_heads,
      rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
      max_position_embeddings=131072, mask_token_id=cfg.mask_token_id,
      pad_token_id=cfg.pad_token_id, bos_token_id=cfg.pad_token_id,
      eos_token_id=cfg.pad_token_id, tie_word_embeddings=False,
      attn_implementation="sdpa")
  # Built in the compute dtype on the device, as from_pretrained(torch_dtype=)
  # builds it (the RoPE inverse frequencies stay float32, as there).
  previous = torch.get_default_dtype()
  torch.set_default_dtype(getattr(torch, cfg.dtype))
  try:
    with torch.device(device):
      model = module.DreamModel(config)
  finally:
    torch.set_default_dtype(previous)
  return model.eval()


def section_dream(args, rec: Recorder, budget: Budget) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.core import mfu as mfu_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import cache as dream_cache  # pylint: disable=g-import-not-at-top
  from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sample_program  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top

  device = torch_device(args)
  cfg = dream_cfg(args)
  prompt, new = (32, 32) if args.smoke else (args.dream_prompt, args.dream_new)
  steps = 8 if args.smoke else args.dream_steps
  block = 8 if args.smoke else args.dream_block
  batches = args.dream_batches
  common = dict(mask_token_id=cfg.mask_token_id, max_new_tokens=new,
                alg="entropy", temperature=0.0, top_p=None, top_k=50)
  peak, peak_what = mfu_lib.peak_flops(jax.devices()[0], cfg.dtype)

  start = time.perf_counter()
  params = jax.jit(lambda key: nn.meta.unbox(dream.Dream(cfg).init(
      key, jnp.zeros((1, 4), jnp.int32))["params"]))(jax.random.key(0))
  jax.block_until_ready(params)
  log(f"dream: {dream.param_count(cfg):,} params ({cfg.dtype}), prompt "
      f"{prompt} + {new} new tokens, {steps} steps (exact: {new / steps:g} "
      f"tokens per step), dual cache blocks of {block}, alg=entropy greedy "
      f"top_k 50; ours initialised in {time.perf_counter() - start:.1f} s; "
      f"peak {peak_what}")

  reference, ref_what, torch_model = None, None, None
  try:
    found = device is not None and _dream_reference(args)
    if device is None:
      pass  # torch is unusable (torch_device said why): ours alone
    elif found:
      reference, ref_what = found
      start = time.perf_counter()
      torch_model = _torch_dream_model(reference, cfg, device)
      log(f"dream torch: {ref_what}; random weights on {device} in "
          f"{time.perf_counter() - start:.1f} s")
    elif args.smoke:
      import dream_torch_sampler as ref  # pylint: disable=g-import-not-at-top
      from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
      directory = tempfile.mkdtemp(prefix="trm_dream_")
      hf_import.export_hf_checkpoint(jax.device_get(params), cfg, directory,
                                     dtype="float32")
      torch_model = ref.qwen2_from_hf_dir(directory)
      shutil.rmtree(directory, ignore_errors=True)
      reference = ref
      ref_what = ("benchmarks/reference/dream_torch_sampler.py (the project's PyTorch "
                  "port of Dream's sampler; no Dream HF code in "
                  f"{args.dream_hf})")
      log(f"dream torch: {ref_what}")
    else:
      log(f"dream torch: skipped: no Dream HF code in {args.dream_hf} "
          "(fetch_wheels.sh DREAM_SRC=...; README.md)")
  except Exception as e:  # pylint: disable=broad-except
    log(f"dream torch: failed to build ({type(e).__name__}: {e})")
    torch_model = None

  def torch_generate(ids):
    import torch  # pylint: disable=g-import-not-at-top
    torch.manual_seed(0)
    if reference is not None and hasattr(reference, "DreamModel"):
      out = torch_model.diffusion_generate(
          torch.as_tensor(ids, dtype=torch.long, device=device),
          attention_mask=None, max_new_tokens=new, output_history=False,
          return_dict_in_generate=True, steps=steps, temperature=0.0,
          top_p=None, top_k=50, alg="entropy", alg_temp=0.0)
      sync(device)
      return out.sequences
    return reference.diffusion_generate(
        torch_model, ids, None, steps=steps, **common)

  rng = np.random.default_rng(0)
  for b in batches:
    watch_unit(b)
    if budget.left() < 20:
      log(f"dream batch {b}: skipped, {budget.left():.0f} s left")
      continue
    ids = rng.integers(1, cfg.mask_token_id, (b, prompt)).astype(np.int32)
    abstract = jax.ShapeDtypeStruct(ids.shape, jnp.int32)
    compiled, attention_of = {}, {}
    for variant in ("exact", "dual"):
      # cfg's attention first, then "dot" where that does not compile.
      for kind in dict.fromkeys((cfg.attention, "dot")):
        kind_cfg = dataclasses.replace(cfg, attention=kind)
        try:
          with time_limit(budget.left() - 10):
            start = time.perf_counter()
            if variant == "exact":
              lowered = diffusion_sampling.lower_generate(
                  dream.denoiser(kind_cfg), abstract, None, params=params,
                  steps=steps, **common)
            else:
              lowered = cached_sampling.lower_cached_generate(
                  dream_cache.cached_denoiser(kind_cfg), abstract, None,
                  params=params, cache="dual", block_length=block,
                  steps=steps, threshold=None, **common)
            compiled[variant] = lowered.compile()
            attention_of[variant] = kind
            rec.figure(f"b{b}/{variant}/compile_s",
                       time.perf_counter() - start, "s", "ours",
                       dtype=cfg.dtype, batch=b, attention=kind)
          break
        except Exception as e:  # pylint: disable=broad-except
          log(f"dream batch {b} {variant} attention={kind}: ours failed "
              f"({type(e).__name__}: {e})")
          free_memory()
    flops = {
        "exact": sample_program.sample_flops_per_call(cfg, b, prompt, new,
                                                       steps),
        "dual": sample_program.cached_flops_per_call(
            cfg, b, prompt, new, steps, "dual", block, None)}
    seconds = {("exact", "ours"): [], ("exact", "torch"): [],
               ("dual", "ours"): []}
    device_ids = jnp.asarray(ids)

    def ours(variant, seed):
      out = compiled[variant](params, device_ids, None, jax.random.key(seed))
      return jax.block_until_ready(out)

    torch_ok = torch_model is not None
    # One untimed call per side first, at every batch size: each is a new
    # executable of ours and new shapes for torch (cuBLAS plans, kernel
    # choices). Batch 16 did not start warm after batch 1 on the H100: ours'
    # first call took 6.75 s, the next 5.89 s (results/2026-11-27-h100-s39/
    # run2-log.txt), and with two rounds the median is their mean.
    # Each call is bounded (SIGALRM, and the watchdog for a hang, which
    # ends this batch size only): a first call by FIRST_CALL_S, a timed one
    # by 4x the same call's time before (`call_bound`).
    earlier = {}
    start = time.perf_counter()
    for variant, side in [(v, "ours") for v in compiled] + (
        [("exact", "torch")] if torch_ok else []):
      try:
        with time_limit(min(budget.left() - 10, FIRST_CALL_S)):
          call = time.perf_counter()
          if side == "ours":
            ours(variant, 0)
          else:
            torch_generate(ids)
          earlier[(variant, side)] = time.perf_counter() - call
      except Exception as e:  # pylint: disable=broad-except
        log(f"dream batch {b}: warm-up of {variant} {side} failed "
            f"({type(e).__name__}: {e})")
    log(f"dream batch {b}: warm-up, one untimed call per side, "
        f"{time.perf_counter() - start:.1f} s")
    for r in range(args.rounds):
      spent = max((max(v) for v in seconds.values() if v), default=0.0)
      if r and budget.left() < 2 * sum(
          max(v) for v in seconds.values() if v) + 5:
        break
      for variant, side in (("exact", "ours"), ("exact", "torch"),
                            ("dual", "ours")):
        if (side == "ours" and variant not in compiled) or (
            side == "torch" and not torch_ok):
          continue
        if budget.left() < 2 * spent + 5 and r:
          break
        try:
          with time_limit(call_bound(earlier.get((variant, side)),
                                     budget.left() - 5)):
            start = time.perf_counter()
            if side == "ours":
              ours(variant, r)
            else:
              torch_generate(ids)
            seconds[(variant, side)].append(time.perf_counter() - start)
          earlier[(variant, side)] = seconds[(variant, side)][-1]
          rec.round_time(f"b{b}/{variant}", side, earlier[(variant, side)],
                         r, dtype=cfg.dtype, batch=b, time_unit="s",
                         attention=attention_of.get(variant)
                         if side == "ours" else None)
        except Exception as e:  # pylint: disable=broad-except
          log(f"dream batch {b} {variant} {side}: failed ({type(e).__name__}"
              f": {e})")
          if side == "torch":
            torch_ok = False
          else:
            compiled.pop(variant, None)
          continue
        log(f"dream batch {b} round {r + 1} {variant} {side}: "
            f"{seconds[(variant, side)][-1]:.2f} s = "
            f"{b * new / seconds[(variant, side)][-1]:.1f} new tokens/s")
    for variant in ("exact", "dual"):
      extra = dict(prompt=prompt, new_tokens=new, steps=steps,
                   reference=ref_what, peak_what=peak_what,
                   attention=attention_of.get(variant))
      if variant == "dual":
        extra.update(cache="dual", block_length=block)
      rec.pair(f"b{b}/{variant}", seconds[(variant, "ours")],
               seconds.get((variant, "torch"), []), dtype=cfg.dtype, batch=b,
               flops=flops[variant], peak=peak, time_unit="s",
               rate=("new_tokens_per_s", "tokens/s", b * new), **extra)
    if (seconds[("exact", "torch")] and seconds[("exact", "ours")] and
        short_of_goal(statistics.median(seconds[("exact", "ours")]),
                      statistics.median(seconds[("exact", "torch")])) and
        budget.left() > 3 * max(seconds[("exact", "ours")]) + 10):
      keep_trace(rec, f"dream_b{b}_exact", lambda: ours("exact", 99),  # pylint: disable=cell-var-from-loop
                 torch_run=lambda: torch_generate(ids),  # pylint: disable=cell-var-from-loop
                 seconds=min(budget.left() - 5, FIRST_CALL_S))
    if (b == batches[0] and seconds[("dual", "ours")] and
        budget.left() > 3 * max(seconds[("dual", "ours")]) + 10):
      # The dual cache has no PyTorch side; on the H100 it ran at half the
      # exact sampler's MFU and twice its forecast, so its trace is kept.
      keep_trace(rec, f"dream_b{b}_dual", lambda: ours("dual", 98),  # pylint: disable=cell-var-from-loop
                 seconds=min(budget.left() - 5, FIRST_CALL_S))
    compiled.clear()
    free_memory()


# --------------------------------------------------------------------------
# cuDNN attention against the dot path (config.model.attention='cudnn')


def section_cudnn(args, rec: Recorder, budget: Budget) -> None:
  """GPT-2-wide and Dream-wide two-layer models, bf16: logits with
  attention='cudnn' against 'dot' (relative error), and the forward time of
  each; GPU only (--smoke records that it was skipped)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top

  if args.smoke:
    log("cudnn: GPU only; skipped with --smoke (tests/benchmarks/"
        "test_cudnn_attention.py checks the branch on the CPU)")
    return
  cases = [
      ("gpt", gpt.GPT, gpt.GPTConfig(
          block_size=1024, vocab_size=50304, n_layer=2, n_head=12, n_embd=768,
          dtype="bfloat16", bias=False), (8, 1024), None),
      ("dream", dream.Dream, dream.DreamConfig(
          vocab_size=8192, hidden_size=3584, intermediate_size=4096,
          num_hidden_layers=2, num_attention_heads=28, num_key_value_heads=4,
          mask_token_id=8191, pad_token_id=0, dtype="bfloat16",
          param_dtype="bfloat16", remat="none"), (4, 1024), 100),
  ]
  for name, module, cfg, shape, pad in cases:
    if budget.left() < 10:
      log(f"cudnn {name}: skipped, {budget.left():.0f} s left")
      continue
    try:
      with time_limit(budget.left() - 3):
        params = jax.jit(lambda key: nn.meta.unbox(module(cfg).init(  # pylint: disable=cell-var-from-loop
            key, jnp.zeros((1, 8), jnp.int32))["params"]))(jax.random.key(0))
        tokens = jax.random.randint(jax.random.key(1), shape, 1,
                                    cfg.vocab_size - 1, jnp.int32)
        args_ = (tokens,)
        if pad:  # left padding of row 0, as the samplers pad prompts
          args_ += (jnp.ones(shape, bool).at[0, :pad].set(False),)
        out, seconds = {}, {}
        for kind in ("dot", "cudnn"):
          fn = jax.jit(functools.partial(
              lambda c, p, *a: module(c).apply({"params": p}, *a),  # pylint: disable=cell-var-from-loop
              dataclasses.replace(cfg, attention=kind)))
          out[kind] = jax.block_until_ready(fn(params, *args_))
          times = []
          for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(fn(params, *args_))
            times.append(time.perf_counter() - start)
          seconds[kind] = statistics.median(times)
        rows = slice(1, None) if pad else slice(None)
        a = np.asarray(out["cudnn"][rows], np.float32)
        b = np.asarray(out["dot"][rows], np.float32)
        rel = float(np.linalg.norm(a - b) / np.linalg.norm(b))
        rec.figure(f"{name}/logits_rel_err", rel, "fraction", "ours",
                   dtype=cfg.dtype, batch=shape[0], seq=shape[1],
                   padded=bool(pad))
        for kind in ("dot", "cudnn"):
          rec.figure(f"{name}/forward_{kind}", 1e3 * seconds[kind], "ms",
                     "ours", dtype=cfg.dtype, batch=shape[0], seq=shape[1],
                     attention=kind)
    except Exception as e:  # pylint: disable=broad-except
      log(f"cudnn {name}: failed ({type(e).__name__}: {str(e)[:400]})")
      free_memory()


# --------------------------------------------------------------------------
# Smoke: trainer, checkpoints and Grain through `python -m trm.main`


_TRAIN_LOG = re.compile(r"\] \[(\d+)\] .*train/")
_RESUMED = re.compile(r"Training from step (\d+) to (\d+)")
_MS_PER_STEP = re.compile(r"\] \[(\d+)\] timing/ms_per_step=([\d.]+)")
_COMPILED = re.compile(r"Train step compiled in ([\d.]+) s")
_FINAL = re.compile(r"Final evaluation at step (\d+): .*exact_accuracy="
                    r"([\d.]+)")


def _smoke_command(args, workdir: str) -> list[str]:
  values = {"total_steps": 50, "checkpoint_every": 10, "eval_every": 50,
            "log_every": 5, "data.build.num_train": 2000,
            "data.build.num_test": 256}
  if args.smoke:  # a smaller net and run on the CPU
    values.update({"model.hidden_size": 32, "model.num_heads": 2,
                   "model.puzzle_emb_ndim": 32, "model.halt_max_steps": 2,
                   "model.H_cycles": 1, "model.L_cycles": 1,
                   "model.L_layers": 1,
                   "global_batch_size": 16, "data.eval_batch_size": 32,
                   "data.build.num_train": 256, "data.build.num_test": 32,
                   "total_steps": 12, "checkpoint_every": 3,
                   "eval_every": 12, "log_every": 1})
  return ([sys.executable, "-m", "trm.main",
           "--config=configs/trm_sudoku.py:cpu", f"--workdir={workdir}"]
          + [f"--config.{k}={v}" for k, v in values.items()])


def _run_trainer(command, *, stop_after_step=None, timeout: float):
  """Runs the trainer, echoing its log; with `stop_after_step`, sends
  SIGTERM once a train step past it is logged; kills it at `timeout`
  seconds, printing or not. Returns (exit code, log)."""
  # errors="backslashreplace": a byte that is not UTF-8 (a library's
  # message) would end the reading with UnicodeDecodeError, and with it the
  # section; escaped, it also prints on a stdout of any encoding.
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          errors="backslashreplace",
                          env=dict(os.environ, PYTHONUNBUFFERED="1"))
  # A thread reads the log, so the deadline holds while the trainer prints
  # nothing (a compile, a hang): a blocked read would outlast the section's
  # `timeout`, and run.sh's kill would lose every smoke figure.
  lines_in = queue.Queue()

  def read():
    for line in proc.stdout:
      lines_in.put(line)
    lines_in.put(None)  # the trainer closed its output

  threading.Thread(target=read, daemon=True).start()
  lines, signalled = [], False
  deadline = time.monotonic() + timeout
  while True:
    try:
      line = lines_in.get(timeout=max(deadline - time.monotonic(), 0.01))
    except queue.Empty:
      proc.kill()
      log("smoke: trainer killed at the section's deadline")
      break
    if line is None:
      break
    lines.append(line)
    sys.stdout.write("    | " + line)
    match = _TRAIN_LOG.search(line)
    if (stop_after_step is not None and not signalled and match
        and int(match.group(1)) >= stop_after_step):
      proc.send_signal(signal.SIGTERM)
      signalled = True
      log(f"smoke: SIGTERM after step {match.group(1)}")
  try:
    code = proc.wait(timeout=max(deadline - time.monotonic(), 5))
  except subprocess.TimeoutExpired:
    proc.kill()
    code = proc.wait()
  return code, "".join(lines)


def section_smoke(args, rec: Recorder, budget: Budget) -> None:
  scratch = tempfile.mkdtemp(prefix="trm_smoke_")
  workdir = os.path.join(scratch, "workdir")
  command = _smoke_command(args, workdir)
  total = int(next(c for c in command if "total_steps" in c).split("=")[1])
  log("smoke: " + " ".join(command[1:]))
  side = dict(dtype="float32", batch=int(next(
      (c for c in command if "global_batch_size" in c), "=64").split("=")[1]))
  start = time.perf_counter()
  # The first run compiles (12 s on an H100) and then trains to the kill;
  # the second only reloads: at 0.6 of 40 s the first run was killed while
  # it compiled (second GPU run).
  code, first = _run_trainer(command, stop_after_step=total // 2,
                             timeout=budget.left() * 0.7)
  rec.figure("first_run_s", time.perf_counter() - start, "s", "ours",
             exit_code=code, **side)
  rec.figure("sigterm_exit_code", code, "code", "ours", **side)
  steps = [int(m.group(1)) for m in _TRAIN_LOG.finditer(first)]
  rec.figure("first_run_last_logged_step", max(steps, default=-1), "step",
             "ours", **side)
  for m in _COMPILED.finditer(first):
    rec.figure("compile_s", float(m.group(1)), "s", "ours", **side)
  start = time.perf_counter()
  code2, second = _run_trainer(command, timeout=budget.left())
  resumed = _RESUMED.search(second)
  final = _FINAL.search(second)
  rec.figure("second_run_s", time.perf_counter() - start, "s", "ours",
             exit_code=code2, **side)
  rec.figure("resumed_from_step", int(resumed.group(1)) if resumed else -1,
             "step", "ours", **side)
  rec.figure("final_step", int(final.group(1)) if final else -1, "step",
             "ours", **side)
  if final:
    rec.figure("final_eval_exact_accuracy", float(final.group(2)), "fraction",
               "ours", **side)
  ms = [float(m.group(2)) for m in _MS_PER_STEP.finditer(first + second)]
  if ms:
    rec.figure("ms_per_step", statistics.median(ms), "ms", "ours", **side)
  events = [n for _, _, names in os.walk(workdir) for n in names
            if n.startswith("events.out.tfevents")]
  rec.figure("tensorboard_event_files", len(events), "files", "ours", **side)
  ok = (code == 0 and code2 == 0 and resumed is not None
        and int(resumed.group(1)) > 0 and final is not None
        and int(final.group(1)) == total and events)
  rec.figure("passed", float(bool(ok)), "bool", "ours", **side)
  log(f"smoke: {'PASSED' if ok else 'FAILED'} (exit codes {code}, {code2}; "
      f"resumed from {resumed.group(1) if resumed else None}; final step "
      f"{final.group(1) if final else None}; {len(events)} event files)")
  shutil.rmtree(scratch, ignore_errors=True)
  if not ok:
    raise SystemExit(1)


# --------------------------------------------------------------------------


def parse_args(argv=None):
  # No abbreviations: run.sh's check that TRM_GPU_ARGS_* leave --out and
  # --budget alone would not see --bud=.
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                              allow_abbrev=False)
  p.add_argument("section", choices=SECTIONS)
  p.add_argument("--out", required=True, help="figures.jsonl goes here")
  p.add_argument("--budget", type=float, default=120.0,
                 help="seconds for the section (it also runs under timeout)")
  p.add_argument("--smoke", action="store_true",
                 help="tiny sizes on the CPU (JAX and torch)")
  p.add_argument("--torch_compile", type=int, default=None,
                 help="1/0: force torch.compile on/off (default: on, off "
                 "with --smoke)")
  p.add_argument("--rounds", type=int, default=None,
                 help="alternating rounds at most (default 3; 2 with --smoke)")
  p.add_argument("--steps", type=int, default=None,
                 help="TRM: timed steps per round (default 5; 3 with --smoke)")
  p.add_argument("--trm_batch", type=int, default=768,
                 help="TRM: the first batch tried (the search halves it)")
  p.add_argument("--trm_variants", default="mlp_t_sudoku_triton,att_maze",
                 help="TRM: which variants, comma-separated: "
                 f"{', '.join(TRM_VARIANTS)}")
  p.add_argument("--trm_attention", default="cudnn",
                 choices=("cudnn", "dot"),
                 help="TRM attention variant: ours' kernel on the GPU "
                 "(upstream runs FlashAttention; --smoke: dot)")
  p.add_argument("--gpt_variants", default="cudnn",
                 help="GPT: ours' variants, comma-separated, timed beside "
                 f"torch in alternating rounds: {', '.join(GPT_VARIANTS)} "
                 "(--smoke: dot)")
  p.add_argument("--mixer_batch", type=int, default=384,
                 help="mixer: the MLP-t step's batch (the token mixer's "
                 "columns are batch x 512)")
  p.add_argument("--mixer_setting_from", default="swept",
                 choices=("swept", "default"),
                 help="TRM: the Triton token mixer's constants: the mixer "
                 "section's fastest setting if it ran earlier into the same "
                 "--out (swept), or mlp_gpu's own (default)")
  p.add_argument("--gpt_accum", type=int, default=40)
  p.add_argument("--gpt_iters", type=int, default=2,
                 help="GPT: timed iterations per round")
  p.add_argument("--dream_prompt", type=int, default=512)
  p.add_argument("--dream_new", type=int, default=512)
  p.add_argument("--dream_steps", type=int, default=16,
                 help="Dream: denoising steps of a 512-token canvas (the "
                 "time per step does not depend on it)")
  p.add_argument("--dream_block", type=int, default=128,
                 help="Dream cache='dual': tokens per block (with 16 steps, "
                 "4 per block: a full forward, then 3 on the block's window)")
  p.add_argument("--dream_batches", nargs="+", default=None,
                 help="Dream: batch sizes, in order (default 1 16; 2 with "
                 "--smoke)")
  p.add_argument("--dream_attention", default="cudnn",
                 choices=("cudnn", "dot"),
                 help="Dream: ours' attention on the GPU (falls back to dot "
                 "if it does not compile; --smoke: dot)")
  # Set by `supervise` for the process it watches.
  p.add_argument("--watch_file", default=None, help=argparse.SUPPRESS)
  p.add_argument("--dream_hf", default=os.path.join(HERE, "wheels",
                                                    "dream_hf"),
                 help="directory of Dream's HF code (a package)")
  args = p.parse_args(argv)
  # Checked here, before any compile: most of these are unused with --smoke,
  # so a bad one would otherwise first fail on the device.
  if not (math.isfinite(args.budget) and args.budget > 0):
    p.error(f"--budget={args.budget}: must be a positive number of seconds")
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    p.error(f"--out={args.out}: exists and is not a directory")
  for flag in ("rounds", "steps", "trm_batch", "mixer_batch", "gpt_accum",
               "gpt_iters", "dream_prompt", "dream_new", "dream_steps",
               "dream_block"):
    value = getattr(args, flag)
    if value is not None and value < 1:
      p.error(f"--{flag}={value}: must be a positive integer")
  if args.dream_batches is None:
    args.dream_batches = ["2"] if args.smoke else ["1", "16"]
  try:
    batches = [int(b) for b in args.dream_batches]
  except ValueError:
    batches = []
  if not batches or min(batches) < 1:
    p.error(f"--dream_batches {' '.join(args.dream_batches)}: must be "
            "positive integers, e.g. --dream_batches 1 16")
  args.dream_batches = batches
  args.trm_variants = list(dict.fromkeys(args.trm_variants.split(",")))
  unknown = set(args.trm_variants) - set(TRM_VARIANTS)
  if unknown:
    p.error(f"--trm_variants: unknown {sorted(unknown)}; the variants are "
            f"{', '.join(TRM_VARIANTS)}")
  args.gpt_variants = args.gpt_variants.split(",")
  unknown = set(args.gpt_variants) - set(GPT_VARIANTS)
  if unknown or not args.gpt_variants:
    p.error(f"--gpt_variants: unknown {sorted(unknown)}; the variants are "
            f"{', '.join(GPT_VARIANTS)}")
  if args.rounds is None:
    args.rounds = 2 if args.smoke else 3
  if args.steps is None:
    args.steps = 3 if args.smoke else 5
  if args.smoke:  # cuDNN's kernels are GPU-only
    args.trm_attention = args.dream_attention = "dot"
  return args


def _watched(path: str) -> dict:
  """The unit a watched section is in and the bound of its call (None:
  no call under way), from its --watch_file."""
  state = {"unit": None, "until": None}
  with open(path) as f:
    for line in f:
      try:
        state.update(json.loads(line))
      except ValueError:
        pass  # a line being written
  return state


def _watchdog(section: str, proc, path: str) -> bool:
  """Waits for `proc`; kills it (and says True) once it is WATCH_GRACE_S
  past the bound of the call it is in: a call SIGALRM did not stop."""
  while True:
    try:
      proc.wait(timeout=0.5)
      return False
    except subprocess.TimeoutExpired:
      pass
    state = _watched(path)
    if (state["until"] is not None
        and time.time() > state["until"] + WATCH_GRACE_S):
      log(f"{section} {state['unit']}: no answer {WATCH_GRACE_S:.0f} s past "
          "its call's bound (a device hang?): killed; its rounds so far are "
          "in figures.jsonl")
      proc.kill()
      proc.wait()
      return True


def supervise(args, argv: list[str]) -> int:
  """Runs the section in a child process under the watchdog. A hang (or a
  crash) ends the unit it is in, a TRM variant or a Dream batch size: the
  units after it run in a new process, in what is left of the budget, and
  the rounds measured so far are on disk already (Recorder.round_time).
  Returns the exit status: 0 only if the child ran to its end."""
  deadline = time.monotonic() + args.budget
  units = {"trm": list(args.trm_variants),
           "dream": [str(b) for b in args.dream_batches]}.get(args.section,
                                                              [])
  # The child's budget is what is left of this one's (its command, in its
  # figures, shows one --budget).
  argv = [a for a in argv if not a.startswith("--budget=")]
  fd, path = tempfile.mkstemp(prefix="trm_watch_", suffix=".jsonl")
  os.close(fd)
  status, rest = 0, units
  try:
    while True:
      command = [sys.executable, os.path.abspath(__file__), *argv,
                 f"--budget={deadline - time.monotonic():.1f}",
                 f"--watch_file={path}"]
      if rest != units:
        command += ([f"--trm_variants={','.join(rest)}"]
                    if args.section == "trm" else ["--dream_batches", *rest])
      open(path, "w").close()
      proc = subprocess.Popen(command)
      hung = _watchdog(args.section, proc, path)
      if proc.returncode == 0 and not hung:
        return status
      status = 1
      unit = _watched(path)["unit"]
      if unit not in rest or unit == rest[-1]:
        return status  # before its first unit, or after its last
      rest = rest[rest.index(unit) + 1:]
      if deadline - time.monotonic() < 20:
        log(f"{args.section}: {', '.join(rest)} not run, under 20 s left")
        return status
      log(f"{args.section}: {unit} ended (exit {proc.returncode}); "
          f"{', '.join(rest)} next, in a new process")
  finally:
    os.remove(path)


def main(argv=None) -> None:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  if args.watch_file:
    _watch["path"] = args.watch_file
  elif args.section in ("trm", "gpt", "dream"):
    # Before JAX or torch start here: the child has the device to itself.
    sys.exit(supervise(args, sys.argv[1:] if argv is None else list(argv)))
  budget = Budget(args.budget)
  if args.smoke:
    os.environ["JAX_PLATFORMS"] = "cpu"
  # JAX and torch share the GPU: neither may take it all up front.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if args.section == "trm":
    # JAX's allocator keeps what it has grown to: left uncapped, ours at
    # batch 768 held 60 of the H100's 80 GB and upstream's step ran out of
    # memory beside it (first GPU run). With the cap the batch search
    # finds the largest batch that fits each side in its half.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION",
                          str(TRM_JAX_MEMORY_FRACTION))
  if args.section == "dream":
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION",
                          str(DREAM_JAX_MEMORY_FRACTION))
  if os.environ.get("TRM_COMPILATION_CACHE", "").strip():
    # Only where asked (the tests' session cache, tests/conftest.py): the
    # device run sets none, so each compile_s figure there is a compile.
    from trm.core import compile_cache  # pylint: disable=g-import-not-at-top
    compile_cache.configure(None)
  rec = Recorder(args, args.section)
  log(f"section {args.section}: budget {args.budget:.0f} s; JAX "
      f"{rec.jax_version} on {rec.jax_device} ({rec.platform}); torch "
      f"{rec.torch_version} on {rec.torch_device}")
  if not args.smoke and rec.platform != "gpu":
    raise SystemExit(f"JAX runs on {rec.platform}, not a GPU: use --smoke")
  if args.section == "mixer":
    import mixer_sweep  # pylint: disable=g-import-not-at-top
    mixer_sweep.section_mixer(args, rec, budget, log)
  elif args.section == "gptk":
    import gpt_kernels  # pylint: disable=g-import-not-at-top
    gpt_kernels.section_gptk(args, rec, budget, log)
  else:
    {"trm": section_trm, "gpt": section_gpt, "dream": section_dream,
     "cudnn": section_cudnn, "smoke": section_smoke}[args.section](
         args, rec, budget)
  log(f"section {args.section}: {rec.count} figures")


if __name__ == "__main__":
  main()
