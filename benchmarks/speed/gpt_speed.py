r"""Time per iteration and MFU of nanoGPT's workflow on our trainer, and of
nanoGPT's PyTorch loop on the same machine.

  PYTHONPATH=. python benchmarks/speed/gpt_speed.py --rounds=5  # CPU recipe, both
  PYTHONPATH=. python benchmarks/speed/gpt_speed.py --torch=false \
      --config=configs/gpt.py:shakespeare_char           # one GPU

Ours: the task `trm.main` trains (`trm.families.gpt.task`: random windows from the
prepared tinyshakespeare, Grain, global arrays, the compiled step with
accumulation and clipping), timed as nanoGPT times it with log_interval=1:
wall time per iteration including the host's batch and a `loss` fetch every
iteration. Warm-up iterations (compilation included) are not timed; the
figure is the median over `--iters`. MFU uses nanoGPT's estimate_mfu formula
against the peak of the device in use (`trm.core.mfu.peak_flops`: a measured
matmul peak on CPU, the published peak on GPUs and TPUs).

Theirs: `benchmarks/reference/nanogpt_torch.py` (nanoGPT's loop with --compile=False,
or the user's nanoGPT checkout with --nanogpt_dir), same sizes, data and
compute dtype (a bfloat16 or float16 config.dtype runs its forward under
torch.autocast, as nanoGPT's train.py on a GPU), in the same process.

Time per iteration on a shared 2-core machine moves by 10-20% between runs
of the same program, so `--rounds` alternates the two (ours, theirs, ours,
...) and reports each round and the median over rounds.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "..", "configs",
                           "gpt.py:shakespeare_char_cpu"),
    "GPT config (configs/gpt.py variant).", lock_config=True)
_INPUT = flags.DEFINE_string(
    "input", None, "Text to prepare when config.data_root/dataset is not "
    "prepared (e.g. tinyshakespeare's input.txt).")
_ITERS = flags.DEFINE_integer("iters", 100, "Timed iterations per round.")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Alternating rounds of ours and "
                               "theirs; the summary is the median over them.")
_WARMUP = flags.DEFINE_integer("warmup", 10, "Untimed iterations first.")
_TORCH = flags.DEFINE_bool("torch", True, "Also time nanoGPT's PyTorch "
                           "loop (benchmarks/reference/nanogpt_torch.py).")
_NANOGPT_DIR = flags.DEFINE_string(
    "nanogpt_dir", None, "A karpathy/nanoGPT checkout whose model.py the "
    "PyTorch figure uses.")


def make_ours(config):
  """Builds the task and compiles its step once; returns `timed(iters,
  warmup) -> figures`, which goes on training from where the last call
  stopped."""
  import jax  # pylint: disable=g-import-not-at-top

  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import mfu  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import pipeline  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top

  ctx = mesh_lib.ShardingContext.from_config(config)
  with tempfile.TemporaryDirectory() as workdir:
    task = families.build_task(config, workdir, ctx)
  program = task.program
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  step = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                     abstract, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  batches = pipeline.grain_iterator(task.train_source, config.data.prefetch)
  peak, description = mfu.peak_flops(jax.devices()[0], config.dtype)
  # CPU devices share the machine's cores, which the measured peak covers.
  devices = 1 if jax.devices()[0].platform == "cpu" else jax.device_count()

  def timed(iters: int, warmup: int) -> dict:
    nonlocal state
    seconds = []
    for i in range(warmup + iters):
      start = time.perf_counter()
      batch = pipeline.to_global(next(batches), batch_shardings)
      state, metrics = step(state, batch)
      float(metrics["loss"].compute())  # nanoGPT's loss.item() each iteration
      if i >= warmup:
        seconds.append(time.perf_counter() - start)
    per_iter = statistics.median(seconds)
    return {"ms_per_iter": 1000 * per_iter,
            "mfu": mfu.mfu(program.flops_per_step, per_iter, devices, peak),
            "peak": description,
            "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "tokens_per_iter": config.global_batch_size * config.block_size}

  return timed


def torch_argv(config, iters: int, nanogpt_dir: str | None) -> list[str]:
  """nanogpt_torch's flags for the iteration `config` trains: the same
  model and the same sequences per iteration (micro-batches included, or
  the time ratio compares a 4-micro-batch iteration with a 1-micro-batch
  one)."""
  argv = [f"--data_dir={os.path.join(config.data_root, config.dataset)}",
          f"--iters={iters}", f"--n_layer={config.n_layer}",
          f"--n_head={config.n_head}", f"--n_embd={config.n_embd}",
          f"--block_size={config.block_size}",
          f"--batch_size={config.batch_size}",
          f"--gradient_accumulation_steps="
          f"{config.gradient_accumulation_steps}",
          f"--dropout={config.dropout}", f"--bias={config.bias}",
          # The same compute dtype (torch.autocast, as train.py's ctx).
          f"--dtype={config.dtype}"]
  if config.model.vocab_size:
    argv.append(f"--vocab_size={config.model.vocab_size}")
  if nanogpt_dir:
    argv.append(f"--nanogpt_dir={nanogpt_dir}")
  return argv


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  prepared = os.path.exists(os.path.join(config.data_root, config.dataset,
                                         "meta.json"))
  if _INPUT.value:
    with config.unlocked():
      config.data.input = _INPUT.value
  elif not prepared and (not config.data.input
                         or config.data.input.startswith("http")):
    raise app.UsageError(
        f"{os.path.join(config.data_root, config.dataset)} is not prepared: "
        "pass --input=PATH/TO/tinyshakespeare/input.txt (or prepare it with "
        "python -m trm.main first).")
  if _TORCH.value:
    try:
      import torch  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise app.UsageError("PyTorch's figure needs torch (pip install torch);"
                           " --notorch times ours only.") from None
  timed_ours = make_ours(config)
  torch_args = None
  if _TORCH.value:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "reference"))
    import nanogpt_torch  # pylint: disable=g-import-not-at-top
    torch_args = nanogpt_torch.parse_args(
        torch_argv(config, _ITERS.value, _NANOGPT_DIR.value))
  ours_ms, theirs_ms = [], []
  for round_index in range(_ROUNDS.value):
    # Compilation happened in make_ours; later rounds need less warm-up.
    ours = timed_ours(_ITERS.value, _WARMUP.value)
    ours_ms.append(ours["ms_per_iter"])
    print(f"round {round_index + 1}: trm (JAX) on {ours['device']}: "
          f"{ours['ms_per_iter']:.2f} ms/iter, mfu {100 * ours['mfu']:.2f}% "
          f"of {ours['peak']}; {ours['tokens_per_iter']} tokens/iter, "
          f"n_layer={config.n_layer} n_head={config.n_head} "
          f"n_embd={config.n_embd} block_size={config.block_size} "
          f"batch_size={config.batch_size} "
          f"grad_accum={config.gradient_accumulation_steps} "
          f"dtype={config.dtype}", flush=True)
    if torch_args is None:
      continue
    theirs = nanogpt_torch.run(torch_args)
    theirs_ms.append(theirs["ms_per_iter"])
    print(f"round {round_index + 1}: " + nanogpt_torch.report(theirs),
          flush=True)
  ours_median = statistics.median(ours_ms)
  print(f"trm (JAX): median over {len(ours_ms)} rounds {ours_median:.2f} "
        f"ms/iter (rounds: {', '.join(f'{t:.2f}' for t in ours_ms)})")
  if theirs_ms:
    theirs_median = statistics.median(theirs_ms)
    print(f"nanoGPT PyTorch: median over {len(theirs_ms)} rounds "
          f"{theirs_median:.2f} ms/iter (rounds: "
          f"{', '.join(f'{t:.2f}' for t in theirs_ms)})")
    print(f"ours / nanoGPT PyTorch time per iteration: "
          f"{ours_median / theirs_median:.2f} (per round: "
          f"{', '.join(f'{a / b:.2f}' for a, b in zip(ours_ms, theirs_ms))})")


if __name__ == "__main__":
  app.run(main)
