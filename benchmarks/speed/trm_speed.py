r"""TRM train step: ours (jitted) against upstream's PyTorch step, same CPU.

  PYTHONPATH=. python benchmarks/speed/trm_speed.py --config=cpu --rounds=5
  PYTHONPATH=. python benchmarks/speed/trm_speed.py --config=mlp_t --batch=8 \
      --rounds=3 --steps=3
  PYTHONPATH=. python benchmarks/speed/trm_speed.py --config=att --batch=8

Both sides get the same config (configs/trm_sudoku.py with `:cpu`, nothing,
or `:att`), the same random Sudoku-shaped batches and the same initial
weights: ours are initialised by the trainer, then copied into
`trm_torch.TorchTRM` (upstream's train_batch written from the spec). Rounds
alternate ours / torch because this shared 2-core VM drifts by 10-20%; the
1-minute load average is printed before each round. Each side runs two
untimed warm-up steps first; our compile time is reported apart.

It also states the ceiling: the step's model FLOPs (analytic, as `trm.aot`
counts them) over each side's median time, against the best float32 GEMM
rate either library reaches on this machine with the same threads
(`--peak_n`-square matmuls), and what a given speed-up over torch would
require of that rate.
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no accelerator probing here
import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
import torch  # pylint: disable=g-import-not-at-top,wrong-import-position

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "reference"))
import train_step_speed  # pylint: disable=g-import-not-at-top,wrong-import-position
import trm_torch  # pylint: disable=g-import-not-at-top,wrong-import-position

from trm.core import config_lib  # pylint: disable=g-import-not-at-top,wrong-import-position

_VARIANTS = {"cpu": "cpu", "mlp_t": None, "att": "att"}
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def make_config(name, batch, dtype):
  config = config_lib.load_config(
      os.path.join(_ROOT, "configs", "trm_sudoku.py"), _VARIANTS[name])
  with config.unlocked():
    config.global_batch_size = batch
    config.model.forward_dtype = dtype
    config.mesh.data = 1  # one CPU device, as the trainer runs here
  return config


def make_torch(model, state, config):
  host = jax.device_get(state)
  table = host.puzzle_emb.get("weights") if host.puzzle_emb else None
  return trm_torch.TorchTRM(model.cfg, host.params, host.buffers, table,
                            config.optim, config.total_steps)


def to_torch(batch):
  return {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--config", choices=sorted(_VARIANTS), default="cpu")
  p.add_argument("--batch", type=int, default=None,
                 help="global batch (default 64 for cpu, 8 otherwise)")
  p.add_argument("--dtype", default="float32", help="forward dtype")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--steps", type=int, default=10, help="timed steps a round")
  p.add_argument("--threads", type=int, default=os.cpu_count())
  p.add_argument("--peak_n", type=int, default=2048,
                 help="side of the square matmuls that measure peak GEMM")
  p.add_argument("--trace", default="", help="also profile 3 of our steps "
                 "into this directory and print op time by kind")
  args = p.parse_args()
  batch_size = args.batch or (64 if args.config == "cpu" else 8)
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  config = make_config(args.config, batch_size, args.dtype)
  model, state, step_fn, compile_s, make_batch = train_step_speed.build(
      config)
  theirs = make_torch(model, state, config)
  carry = theirs.initial_carry(batch_size)
  batches = [make_batch(device=False) for _ in range(args.steps + 2)]
  ours_batches = [{k: jax.device_put(v) for k, v in b.items()}
                  for b in batches]
  torch_batches = [to_torch(b) for b in batches]

  def run_ours(state, timed):
    times = []
    for b in ours_batches[:2] if not timed else ours_batches[2:]:
      start = time.perf_counter()
      state, metrics = step_fn(state, b)
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - start)
    return state, times

  def run_torch(carry, timed):
    times = []
    for b in torch_batches[:2] if not timed else torch_batches[2:]:
      start = time.perf_counter()
      carry, _, _ = theirs.train_step(carry, b)
      times.append(time.perf_counter() - start)
    return carry, times

  state, _ = run_ours(state, timed=False)
  carry, _ = run_torch(carry, timed=False)
  print(f"config {args.config} ({config.model.forward_dtype}), batch "
        f"{batch_size}, hidden {config.model.hidden_size}, mlp_t "
        f"{config.model.mlp_t}, H{config.model.H_cycles} "
        f"L{config.model.L_cycles}; torch {torch.__version__} "
        f"{torch.get_num_threads()} threads, jax {jax.__version__}")
  print(f"our compile: {compile_s:.1f} s")
  ours, theirs_ms, loads = [], [], []
  for r in range(args.rounds):
    loads.append(os.getloadavg()[0])
    state, t_ours = run_ours(state, timed=True)
    carry, t_torch = run_torch(carry, timed=True)
    ours.append(1e3 * statistics.median(t_ours))
    theirs_ms.append(1e3 * statistics.median(t_torch))
    print(f"round {r + 1}: load {loads[-1]:.2f}  ours {ours[-1]:.1f} ms/step"
          f"  torch {theirs_ms[-1]:.1f} ms/step  ratio "
          f"{theirs_ms[-1] / ours[-1]:.2f}", flush=True)
  m_ours, m_torch = statistics.median(ours), statistics.median(theirs_ms)
  print(f"ours  ms/step median {m_ours:.1f} (min {min(ours):.1f} - max "
        f"{max(ours):.1f})")
  print(f"torch ms/step median {m_torch:.1f} (min {min(theirs_ms):.1f} - max "
        f"{max(theirs_ms):.1f})")
  print(f"speed-up (torch / ours, medians): {m_torch / m_ours:.2f}x; load "
        f"{min(loads):.2f}-{max(loads):.2f}")
  flops = trm_flops_per_step(model, batch_size)
  peak = peak_gemm_gflops(args.peak_n, args.dtype)
  print_ceiling(flops, m_ours, m_torch, peak)
  if args.trace:
    with jax.profiler.trace(args.trace, create_perfetto_trace=True):
      run_ours(state, timed=True)
    print_op_time(args.trace, steps=len(ours_batches) - 2)


def trm_flops_per_step(model, batch_size) -> float:
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top
  return trm_model.train_flops_per_example(model.cfg) * batch_size


def peak_gemm_gflops(n, dtype: str, calls=10) -> dict:
  """GFLOP/s of an [n, n] x [n, n] matmul: jax's as the trainer's MFU
  measures it (`trm.core.mfu`), torch's with the same threads."""
  from trm.core import mfu  # pylint: disable=g-import-not-at-top
  rates = {"jax": mfu.measured_cpu_peak_flops(dtype, size=n) / 1e9}
  t = torch.randn(n, n).to(getattr(torch, dtype))
  for _ in range(2):
    t @ t
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    t @ t
    times.append(time.perf_counter() - start)
  rates["torch"] = 2 * n**3 / min(times) / 1e9
  return rates


def print_ceiling(flops, ours_ms, torch_ms, peak):
  best = max(peak.values())
  print(f"model FLOPs per step {flops:.3e}; peak GEMM "
        f"on this machine: jax {peak['jax']:.1f}, torch {peak['torch']:.1f} "
        f"GFLOP/s")
  for side, ms in (("ours", ours_ms), ("torch", torch_ms)):
    rate = flops / (ms / 1e3) / 1e9
    print(f"  {side:5s} {rate:6.1f} GFLOP/s = {100 * rate / best:4.1f}% "
          f"of the peak GEMM rate")
  for factor in (1.5, 2.0):
    need = factor * flops / (torch_ms / 1e3) / 1e9
    print(f"  {factor}x torch's speed needs {need:.1f} GFLOP/s = "
          f"{100 * need / best:.0f}% of the peak GEMM rate")


def print_op_time(trace_dir, steps):
  """Sums the trace's per-op durations by kind (the name without its
  numeric suffix: ynn_fusion = YNNPACK dot fusions, dot_general = other
  dots), per step."""
  path = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"),
                   recursive=True)[0]
  with gzip.open(path) as f:
    events = json.load(f)["traceEvents"]
  kinds = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") == "X" and not name.startswith("$") and not any(
        w in name for w in ("Thunk", "ThreadPool", "PjitFunction", "while")):
      kinds[re.sub(r"\.\d+$", "", name)] += e.get("dur", 0) / 1e3 / steps
  print(f"op time per step {sum(kinds.values()):.1f} ms (load "
        f"{os.getloadavg()[0]:.2f}); by kind:")
  for name, ms in kinds.most_common(8):
    print(f"  {ms:8.1f} ms  {name}")


if __name__ == "__main__":
  main()
