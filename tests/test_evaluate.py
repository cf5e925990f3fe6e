"""trm.evaluate: a native workdir and the same weights exported as an
upstream PyTorch checkpoint evaluate to the trainer's own final figures."""
import copy
import json
import os
import shlex
import shutil
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest
import bind_mounts
import cli_batch

from trm import evaluate
from trm.core import train
from trm import families
from trm.families.trm import program as trm_program
from trm.families.trm import torch_import
from trm.core import config_lib
from trm.data.puzzles import builds
from trm.data.puzzles import format as puzzle_format
from trm.data.puzzles import sudoku
from trm.families.trm import sheets as visualize_sheets
from trm.families.trm import task as trm_task

from test_train import ONE_AXIS, ROOT, tiny_config  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  # The data-parallel mesh (the subject here is what is evaluated, not the
  # weights' sharding): its train and evaluation steps go into the
  # session's compilation cache, so the evaluations below load the program
  # the first compiled (the 2x2x2 mesh's are compiled afresh each time:
  # trm/core/cpu_collectives.py), and the trainer's step may come from
  # other files' tiny runs (test_train's ONE_AXIS).
  workdir = str(tmp_path_factory.mktemp("sudoku"))
  config = tiny_config(**{"data.data_dir": os.path.join(workdir, "data")},
                       **ONE_AXIS)
  state, results = train.train_and_evaluate(config, workdir, families.build_task)
  return config, workdir, state, results


def test_workdir_evaluates_to_the_trainers_figures(trained, tmp_path):
  config, workdir, _, results = trained
  ours, source = evaluate.evaluate_checkpoint(config, workdir,
                                              str(tmp_path / "eval"))
  assert source.endswith("step 12")
  for key in ("accuracy", "exact_accuracy", "lm_loss"):
    assert ours[key] == pytest.approx(results[f"eval/{key}"], rel=1e-6)
  assert (tmp_path / "eval" / "sheet.png").is_file()
  with open(tmp_path / "eval" / "eval.json") as f:
    written = json.load(f)
  assert written["exact_accuracy"] == ours["exact_accuracy"]
  # The answers, row i = test example i: the per-example figures they give
  # against the split's labels are the evaluation's own.
  predictions = np.load(written["predictions"], allow_pickle=False)
  _, arrays = puzzle_format.read_split(config.data.data_dir, "test")
  labels, inputs = np.asarray(arrays["labels"]), np.asarray(arrays["inputs"])
  assert predictions.shape == labels.shape == (32, 81)
  correct = predictions == labels
  assert correct.mean(-1).mean() == pytest.approx(ours["accuracy"], rel=1e-5)
  assert correct.all(-1).mean() == pytest.approx(ours["exact_accuracy"])
  blanks = inputs != labels
  assert correct[blanks].mean() == pytest.approx(ours["blank_accuracy"],
                                                 rel=1e-5)
  # ... and the printed trm.visualize command draws them.
  assert written["visualize"] == evaluate.visualize_command(
      config.data.data_dir, written["predictions"], str(tmp_path / "eval"))
  sheet = visualize_sheets.dataset_sheet(
      config.data.data_dir, "test", str(tmp_path / "eval" / "p.png"), num=3,
      predictions_path=written["predictions"])
  assert sheet.size == visualize_sheets.sample_sheet(
      "sudoku", inputs[:3], predictions[:3], labels[:3], None).size


def test_step_chooses_the_checkpoint_read(trained):
  """--step: the run saved steps 6 and 12 and evaluated 12 alone, so best
  is 12 (ranked by the loss the trainer saved with it); --step=6 reads 6's
  weights, not the newest ones, and the source names it."""
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  config, workdir, state, _ = trained
  assert cli.workdir_step(workdir, "best") == 12
  ctx = mesh_lib.ShardingContext.from_config(config)
  program = trm_program.build(config, ctx, puzzle_format.read_metadata(
      config.data.data_dir, "train"))
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  read, source = trm_task.load_eval_state(
      workdir, program, abstract, shardings, ctx,
      step=cli.workdir_step(workdir, 6))
  assert source.endswith("checkpoints step 6")
  newest = jax.tree.leaves(jax.device_get(state.ema_params))
  assert not all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(jax.device_get(read.ema_params)), newest))


def test_a_runs_own_dataset_is_read_not_rebuilt(trained, tmp_path,
                                                 monkeypatch):
  """data.data_dir '' and a trm.main workdir: the run's dataset (named by
  its config.json) is used in place; no builder runs, no file changes."""
  config, workdir, _, results = trained
  data_dir = config.data.data_dir
  before = {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
            for d, _, files in os.walk(data_dir) for f in files}

  def no_build(*args, **kwargs):
    raise AssertionError(f"dataset rebuilt: {args} {kwargs}")

  monkeypatch.setattr(sudoku, "build_dataset", no_build)
  # 32 examples in batches of 24: the last batch's 16 padding rows are
  # dropped from the predictions.
  unset = config_lib.set_values(copy.deepcopy(config), {
      "data.data_dir": "", "data.eval_batch_size": 24})
  out = tmp_path / "eval"
  ours, _ = evaluate.evaluate_checkpoint(unset, workdir, str(out))
  assert ours["exact_accuracy"] == pytest.approx(
      results["eval/exact_accuracy"], rel=1e-6)
  with open(out / "eval.json") as f:
    written = json.load(f)
  assert written["data_dir"] == data_dir
  predictions = np.load(written["predictions"], allow_pickle=False)
  _, arrays = puzzle_format.read_split(data_dir, "test")
  assert predictions.shape == (32, 81)
  assert (predictions == np.asarray(arrays["labels"])).mean(-1).mean() == (
      pytest.approx(ours["accuracy"], rel=1e-5))
  assert not (out / "data").exists()
  assert before == {
      os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
      for d, _, files in os.walk(data_dir) for f in files}


def test_a_runs_dataset_built_otherwise_is_never_advised_away(trained,
                                                              tmp_path):
  """The run's own dataset, built with other data.build values than the
  config given: the builder's line said "Delete DIR to rebuild it", which
  here deleted the run's training data (and evaluated another dataset).
  Now it names the run and says to keep it."""
  config, workdir, _, _ = trained
  data_dir = config.data.data_dir
  other = config_lib.set_values(copy.deepcopy(config), {
      "data.data_dir": "", "data.build.num_train": 300})
  with pytest.raises(builds.DatasetArgumentsError) as error:
    evaluate.evaluate_checkpoint(other, workdir, str(tmp_path / "eval"))
  text = str(error.value)
  assert text.startswith(f"{workdir} trained on {data_dir}, built with "
                         "other arguments than this config asks: "
                         "config.data.build.num_train=300 (built with 256)")
  assert "Delete" not in text and f"keep {data_dir}" in text
  assert os.path.isdir(data_dir)


def test_which_dataset_evaluate_reads(trained, tmp_path, monkeypatch):
  """A workdir whose config.json leaves data_dir unset trained on
  <workdir>/data; an unbuilt one, or no workdir, builds under output_dir."""
  config, _, _, _ = trained
  unset = config_lib.set_values(copy.deepcopy(config), {"data.data_dir": ""})
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  (run / "config.json").write_text(unset.to_json_best_effort())
  out = str(tmp_path / "eval")
  assert trm_task.run_data_dir(unset, str(run), out) == os.path.join(out,
                                                                     "data")
  shutil.copytree(config.data.data_dir, run / "data")
  assert trm_task.run_data_dir(unset, str(run), out) == str(run / "data")
  # An interrupted build there is not the run's dataset.
  os.remove(run / "data" / builds.BUILD_INFO_FILE)
  (run / "data" / builds.BUILDING_FILE).write_text("{}")
  assert trm_task.run_data_dir(unset, str(run), out) == os.path.join(out,
                                                                     "data")
  assert trm_task.run_data_dir(config, str(run), out) == config.data.data_dir
  assert trm_task.run_data_dir(unset, str(tmp_path / "step_12.pt"), out) == (
      os.path.join(out, "data"))


def test_upstream_pytorch_checkpoint_evaluates_the_same(trained, tmp_path):
  config, workdir, state, results = trained
  metadata = puzzle_format.read_metadata(config.data.data_dir, "train")
  model = trm_program.make_model(config.model, metadata)
  path = str(tmp_path / "step_12")
  torch_import.export_torch_checkpoint(
      jax.device_get(state.ema_params), jax.device_get(state.buffers),
      jax.device_get(state.puzzle_emb), model.cfg, path)
  ours, source = evaluate.evaluate_checkpoint(config, path,
                                              str(tmp_path / "eval"))
  assert "upstream PyTorch" in source
  assert ours["exact_accuracy"] == pytest.approx(
      results["eval/exact_accuracy"], rel=1e-6)
  assert ours["lm_loss"] == pytest.approx(results["eval/lm_loss"], rel=1e-5)


# slow: tests/test_readme_commands.py runs trm.evaluate's command line on the
# quick-start run and trm.visualize on the predictions it writes;
# test_workdir_evaluates_to_the_trainers_figures checks the figures.
@pytest.mark.slow
def test_cli_prints_the_paper_metric(trained, tmp_path):
  config, workdir, _, _ = trained
  result = subprocess.run(
      [sys.executable, "-m", "trm.evaluate",
       "--config=configs/trm_sudoku.py:cpu", f"--checkpoint={workdir}",
       f"--output_dir={tmp_path}", "--config.model.hidden_size=32",
       "--config.model.num_heads=2", "--config.model.puzzle_emb_ndim=32",
       "--config.model.halt_max_steps=2", "--config.model.L_layers=1",
       f"--config.data.data_dir={config.data.data_dir}",
       # The dataset's build arguments: other ones are refused (issue 25).
       "--config.data.build.num_train=256", "--config.data.build.num_test=32",
       "--config.data.build.num_blanks=30",
       "--config.data.eval_batch_size=16", "--config.mesh.data=2",
       "--config.mesh.fsdp=2", "--config.mesh.model=2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "paper metric exact_accuracy:" in result.stdout
  # The printed command draws the written predictions.
  command = [line for line in result.stdout.splitlines()
             if line.startswith("draw them: python -m trm.visualize ")]
  assert len(command) == 1, result.stdout
  argv = shlex.split(command[0][len("draw them: python"):])
  drawn = subprocess.run([sys.executable] + argv, cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert drawn.returncode == 0, drawn.stderr[-3000:]
  with Image.open(tmp_path / "predictions_test.png") as png:
    assert png.format == "PNG"
    assert png.size == visualize_sheets.sample_sheet(
        "sudoku", np.ones((8, 81), int), np.ones((8, 81), int),
        np.ones((8, 81), int), None).size


def test_missing_checkpoint_is_a_clear_error(trained, tmp_path):
  config, _, _, _ = trained
  with pytest.raises(FileNotFoundError, match="neither a trm.main workdir"):
    evaluate.evaluate_checkpoint(config, str(tmp_path / "nope"),
                                 str(tmp_path / "eval"))


def test_a_missing_checkpoint_is_refused_before_the_dataset(tmp_path):
  """A mistyped --checkpoint (or a FIFO) was named only after the test
  split had been built under <output_dir>/data (minutes for ARC)."""
  config = tiny_config(**{"data.data_dir": ""}, **ONE_AXIS)
  os.mkfifo(tmp_path / "fifo")
  for checkpoint in (tmp_path / "nope", tmp_path / "fifo"):
    with pytest.raises(FileNotFoundError, match="neither a trm.main workdir"):
      evaluate.evaluate_checkpoint(config, str(checkpoint),
                                   str(tmp_path / "eval"))
    assert not (tmp_path / "eval").exists()


def test_an_eval_batch_past_the_hosts_memory_is_one_line(trained, tmp_path):
  """--config.data.eval_batch_size=2**31: numpy's MemoryError traceback
  when the first batch was padded, now one line before the weights."""
  config, workdir, _, _ = trained
  config = config_lib.set_values(copy.deepcopy(config),
                                 {"data.eval_batch_size": 2**31})
  with pytest.raises(ValueError, match=r"^config\.data\.eval_batch_size="
                     r"2147483648: a batch of the test split needs [\d,.]+ "
                     r"GiB of this host's memory, more than .*; lower "
                     r"config\.data\."
                     r"eval_batch_size\.$"):
    evaluate.evaluate_checkpoint(config, workdir, str(tmp_path / "eval"))


@pytest.mark.parametrize("others_refuse", [False, True])
def test_the_eval_batch_check_holds_on_accelerators_and_refuses_together(
    monkeypatch, others_refuse):
  """The padded batch is a host array on a GPU or TPU host too; on a pod a
  process whose host fits still refuses when another's does not (alone it
  went on into abstract_state's collective and waited there)."""
  import types  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  program = types.SimpleNamespace(batch_spec={
      "inputs": jax.ShapeDtypeStruct((81,), np.int32)})
  monkeypatch.setattr(jax, "local_devices", lambda: [
      types.SimpleNamespace(platform="gpu", process_index=0)])
  monkeypatch.setattr(array_sizes, "memory_bound",
                      lambda *_: (1 << 20, "its 0.0 GiB (memory and swap)"))
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  monkeypatch.setattr(multihost_utils, "process_allgather",
                      lambda flag: np.asarray([flag, int(others_refuse)]))
  if others_refuse:
    with pytest.raises(ValueError, match="past the memory of process 1"):
      evaluate.check_eval_batch_fits(program, 2)
  else:
    evaluate.check_eval_batch_fits(program, 2)  # 648 bytes fit
  with pytest.raises(ValueError, match=r"^config\.data\.eval_batch_size="
                     r"1048576: a batch of the test split needs"):
    evaluate.check_eval_batch_fits(program, 2**20)


def test_a_model_setting_the_run_never_had_is_refused_before_the_dataset(
    trained, tmp_path):
  """--config.model.rms_norm_eps differing from the workdir's config.json
  restored (no weight shape depends on it) and evaluated another function
  without a word; an upstream checkpoint's all_config.yaml was compared."""
  config, workdir, _, _ = trained
  config = config_lib.set_values(copy.deepcopy(config),
                                 {"model.rms_norm_eps": 1e-3})
  with pytest.raises(ValueError, match=r"^--config gives config\.model\."
                     r"rms_norm_eps=0\.001, but the run trained with 1e-05 "
                     r".*config\.json\) and no weight shape depends on it.* "
                     r"Pass --config\.model\.rms_norm_eps=1e-05 "):
    evaluate.evaluate_checkpoint(config, workdir, str(tmp_path / "eval"))
  assert not (tmp_path / "eval").exists()


def test_another_datasets_config_is_refused_before_its_dataset(
    trained, tmp_path):
  """A Maze config on a Sudoku run built (downloaded) the Maze data under
  <output_dir>/data before any weight's shape refused it."""
  config, workdir, _, _ = trained
  config = config_lib.set_values(copy.deepcopy(config), {"data.name": "maze"})
  with pytest.raises(ValueError, match=(
      r"^--config gives config\.data\.name='maze', but the run trained on "
      r"'sudoku' \(.*config\.json\): its weights fit only that dataset's "
      r"puzzles\. Pass the config the run trained with "
      r"\(configs/trm_sudoku\.py for the paper's\)\.$")):
    evaluate.evaluate_checkpoint(config, workdir, str(tmp_path / "eval"))
  assert not (tmp_path / "eval").exists()


def test_an_object_store_workdir_is_refused_before_the_dataset(tmp_path):
  """A gs:// workdir went on to build (download) the run's dataset, then
  failed as "no such file"; now one line says how to copy it."""
  with pytest.raises(ValueError, match="--checkpoint='gs://b/run' is an "
                     "object-store path;.*gcloud storage cp -r"):
    evaluate.evaluate_checkpoint(None, "gs://b/run", str(tmp_path / "eval"))
  assert not (tmp_path / "eval").exists()


def test_missing_config_or_checkpoint_is_one_line():
  """Required unless --score_only rescores a samples file (no model)."""
  result = subprocess.run(
      [sys.executable, "-m", "trm.evaluate",
       "--config=configs/trm_sudoku.py:cpu"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [
      "trm.evaluate: error: --config and --checkpoint are required (or "
      "--benchmark / --score_only for code benchmarks)."]


# The --output_dir refusals run `python -m trm.evaluate` forked from one
# process that has imported what the tool imports before its flags are
# parsed (tests/cli_batch.py; it imports each at its top): its start-up of
# jax per case less. test_missing_config_or_checkpoint_is_one_line runs the
# real entry point.
evaluate_cli = cli_batch.serve(
    "trm.evaluate", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=("jax", "trm.core.cli", "trm.core.config_lib",
             "trm.core.distributed", "trm.core.weights_io", "trm.generate"))


@pytest.mark.parametrize("output_dir, message", [
    ("README.md", "--output_dir=README.md: is a file; a directory is "
     "expected."),
    ("README.md/eval", "--output_dir=README.md/eval: "),
])
def test_output_dir_under_a_file_is_one_line_naming_the_flag(output_dir,
                                                             message,
                                                             evaluate_cli):
  """Was '[Errno 17] File exists: ...' (or Errno 20), naming no flag."""
  result = evaluate_cli.run(
      ["--config=configs/trm_sudoku.py:cpu", "--checkpoint=/nonexistent",
       f"--output_dir={output_dir}"],
      cwd=ROOT, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      f"trm.evaluate: error: {message}"), lines


def _generation(**changes):
  value = dict(benchmark="humaneval", task_ids=["HumanEval/0", "HumanEval/1"],
               shots=0, num_samples=2, seed=0, batch_size=1, chat=False,
               checkpoint="runs/hf", sampler={"steps": 4, "temperature": 0.2})
  value.update(changes)
  return value


def _sample(task_id, sample):
  return json.dumps(dict(task_id=task_id, sample=sample, completion="pass",
                         generation="pass", benchmark="humaneval",
                         chat=False))


def test_resume_keeps_whole_batches_of_the_same_settings(tmp_path, capsys):
  output = str(tmp_path / "samples.jsonl")
  assert evaluate._resumed_samples(output, _generation()) == []  # none yet
  # Batches (sample j, batch n): (0, 0), (0, 1), (1, 0), (1, 1). The first
  # two are whole, the third lost its append, the fourth was cut short.
  with open(output, "w") as f:
    f.write("\n".join([_sample("HumanEval/0", 0), _sample("HumanEval/1", 0),
                        _sample("HumanEval/1", 1)[:25]]))
  with pytest.raises(ValueError, match=r"has no samples_generation\.json "
                     r"beside it"):
    evaluate._resumed_samples(output, _generation())
  evaluate._write_json_atomically(evaluate._generation_path(output),
                                  _generation())
  kept = evaluate._resumed_samples(output, _generation())
  assert [(r["task_id"], r["sample"]) for r in kept] == [
      ("HumanEval/0", 0), ("HumanEval/1", 0)]
  assert "--resume: 2 samples of 2/4 batches kept" in capsys.readouterr().out
  # Other settings are refused in one line naming the first difference.
  for changes, needle in [
      (dict(seed=1), "seed 0, this run has 1"),
      (dict(sampler={"steps": 8, "temperature": 0.2}), "sampler {'steps': 4"),
      (dict(task_ids=["HumanEval/0"]), "task_ids 2 problems, this run has 1 "
       "problems"),
      (dict(checkpoint="other"), "checkpoint 'runs/hf'")]:
    with pytest.raises(ValueError) as err:
      evaluate._resumed_samples(output, _generation(**changes))
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert "without --resume to start again" in str(err.value)
  # A bad line before the last is not an interruption: refused.
  with open(output, "w") as f:
    f.write("not json\n" + _sample("HumanEval/0", 0) + "\n")
  with pytest.raises(ValueError, match="line 1: not JSON"):
    evaluate._resumed_samples(output, _generation())


# A fresh DiffuCoder-mode run emptied an existing --output when it started
# (--score_only --output=X wrote over X): a killed rerun left part of a
# whole file. Refused before anything loads (--checkpoint does not exist:
# a load would fail otherwise), naming the file and the three choices.
def _earlier_file(path, line='{"task_id": "HumanEval/0"}\n'):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(line)
  return str(path)


def _requests(tmp_path):
  path = tmp_path / "requests.jsonl"
  path.write_text(json.dumps({"context": "a", "continuation": " b"}) + "\n")
  return str(path)


def _refusal(evaluate_cli, argv):
  result = evaluate_cli.run(argv, cwd=ROOT, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


@pytest.mark.parametrize("mode", ["benchmark", "default_dir", "loglikelihood",
                                  "score_only"])
def test_an_existing_output_is_refused_before_anything_loads(
    mode, tmp_path, evaluate_cli):
  output = tmp_path / "out" / "samples.jsonl"
  flag = "--output"
  argv = [f"--output={output}"]
  if mode == "default_dir":  # <output_dir>/humaneval_samples.jsonl
    output, flag = tmp_path / "out" / "humaneval_samples.jsonl", "--output_dir"
    argv = [f"--output_dir={output.parent}"]
  before = _earlier_file(output, '{"loglikelihood": -1.0, "is_greedy": true}\n'
                         if mode == "loglikelihood" else
                         '{"task_id": "HumanEval/0"}\n')
  if mode == "loglikelihood":
    argv += [f"--loglikelihood={_requests(tmp_path)}",
             "--checkpoint=/nonexistent"]
  elif mode == "score_only":
    argv += [f"--score_only={_earlier_file(tmp_path / 'scored.jsonl')}"]
  else:
    argv += ["--config=configs/diffucoder_7b.py:tiny", "--benchmark=humaneval",
             "--checkpoint=/nonexistent"]
  line = _refusal(evaluate_cli, argv)
  assert line == (
      f"trm.evaluate: error: {flag}: {output} holds an earlier run's output; "
      "pass --resume to go on from it, --overwrite to replace it (kept whole "
      "until the first new result replaces it), or another --output."), line
  assert open(before).read().startswith("{")  # untouched


def test_a_score_only_fifo_is_said_as_what_it_is(tmp_path, evaluate_cli):
  # It said "no such file" for a path that exists.
  fifo = tmp_path / "samples.jsonl"
  os.mkfifo(fifo)
  assert _refusal(evaluate_cli, [f"--score_only={fifo}"]) == (
      f"trm.evaluate: error: --score_only={fifo}: not a regular file (a "
      "device, FIFO or socket); pass the samples JSONL written by "
      "trm.evaluate --benchmark.")


def test_samples_past_the_hosts_memory_are_refused_before_the_weights(
    tmp_path, evaluate_cli):
  """--num_samples=2**31 went on to load the weights, then planned its
  batches until the kernel's OOM killer ended it, with no message."""
  line = _refusal(evaluate_cli, [
      "--config=configs/diffucoder_7b.py:tiny", "--benchmark=humaneval",
      "--checkpoint=/nonexistent", f"--output={tmp_path / 's.jsonl'}",
      "--num_samples=2147483648"])
  assert line.startswith(
      "trm.evaluate: error: --num_samples=2147483648: holding 2147483648 "
      "samples of each of 164 problem(s) (1024 bytes each at least) needs "
      "335,872.0 GiB of this host's memory, more than "), line
  assert line.endswith("; lower --num_samples (or --limit)."), line


@pytest.mark.parametrize("beside, what", [
    ("p_summary.json", "summary"),
    ("p_generation.json", "generation settings")])
def test_a_file_written_beside_the_samples_spares_the_inputs(
    beside, what, tmp_path, evaluate_cli):
  """`--output=p.jsonl --benchmark_path=p_summary.json`: the summary
  beside the samples is removed before the first batch, and the problems
  file went with it (session 77); likewise the generation settings."""
  problems = _earlier_file(tmp_path / beside, json.dumps(
      {"task_id": 1, "text": "x", "code": "y", "test_list": ["z"]}) + "\n")
  line = _refusal(evaluate_cli, [
      "--config=configs/diffucoder_7b.py:tiny", "--benchmark=mbpp",
      f"--benchmark_path={problems}", f"--output={tmp_path / 'p.jsonl'}",
      "--checkpoint=/nonexistent"])
  assert line == (
      f"trm.evaluate: error: --output={tmp_path / 'p.jsonl'}: its {what} "
      f"file {problems} is --benchmark_path={problems}: writing the {what} "
      "would replace it; pass another --output."), line
  assert os.path.isfile(problems)


def test_a_large_earlier_generation_file_in_an_input_folder_is_kept(
    tmp_path):
  """An earlier run's generation settings inside an input folder are
  recognised over 1 MiB (80,000 task ids; session 77 read 1 MiB and called
  them an input); a JSON object without `task_ids` stays an input."""
  folder = tmp_path / "inputs"
  output = str(folder / "p.jsonl")
  _earlier_file(folder / "p_generation.json", json.dumps(_generation(
      task_ids=[f"Task/{i:06d}" for i in range(80_000)])))
  assert os.path.getsize(folder / "p_generation.json") > 1 << 20
  inputs = {"--benchmark_path": str(folder)}
  evaluate._check_file_beside(evaluate._generation_path(output), output,
                              inputs, "generation settings", "task_ids")
  _earlier_file(folder / "p_generation.json",
                json.dumps({"ids": ["x" * 40] * 60_000}))
  with pytest.raises(ValueError, match="is a file of --benchmark_path="):
    evaluate._check_file_beside(evaluate._generation_path(output), output,
                                inputs, "generation settings", "task_ids")


@pytest.mark.parametrize("argv, needle", [
    (["--benchmark=humaneval", "--config=configs/diffucoder_7b.py:tiny",
      "--checkpoint=/nonexistent", "--resume", "--overwrite"],
     "--resume and --overwrite: --resume keeps what --output holds"),
    (["--config=configs/trm_sudoku.py:cpu", "--checkpoint=/nonexistent",
      "--overwrite"], "--overwrite: a TRM evaluation replaces eval.json"),
])
def test_overwrite_without_a_meaning_is_refused(argv, needle, tmp_path,
                                                evaluate_cli):
  line = _refusal(evaluate_cli, [*argv, f"--output={tmp_path / 'o.jsonl'}"]
                  if "--benchmark=humaneval" in argv
                  else [*argv, f"--output_dir={tmp_path}"])
  assert line.startswith(f"trm.evaluate: error: {needle}"), line


def _earlier_loglikelihoods(tmp_path, checkpoint, mc_num=128, batch_size=32):
  """(requests, output): one request, and an interrupted --loglikelihood
  run's --output of its result with the settings beside it (the defaults'
  but for `checkpoint`, `mc_num` and `batch_size`)."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  requests = _requests(tmp_path)
  output = _earlier_file(tmp_path / "ll.jsonl",
                         '{"loglikelihood": -1.0, "is_greedy": true}\n')
  pairs = [pair for _, pair in likelihood.read_numbered_requests(requests)]
  likelihood.write_settings(output, dict(
      mc_num=mc_num, batch_size=batch_size, nll_type="mc", log_type="ftb",
      sampling_eps=1e-3, seed=0, requests=requests, requests_count=1,
      requests_sha256=likelihood.requests_digest(pairs),
      checkpoint=checkpoint, complete=False))
  return requests, output


def test_resume_with_another_checkpoint_is_refused_before_it_loads(
    tmp_path, evaluate_cli):
  """Was refused only after the weights loaded. The --checkpoint directory
  holds no model: reading it would fail with another line."""
  requests, output = _earlier_loglikelihoods(tmp_path, "runs/earlier")
  checkpoint = tmp_path / "hf"
  checkpoint.mkdir()
  line = _refusal(evaluate_cli, [
      f"--loglikelihood={requests}", f"--checkpoint={checkpoint}",
      f"--output={output}", "--resume"])
  assert line == (
      f"trm.evaluate: error: --resume: {output} was computed with checkpoint "
      f"'runs/earlier', this run has '{checkpoint}': rerun with the earlier "
      "settings, or without --resume to start again."), line


class _FakeLM:
  """A DiffusionLM's loglikelihood: checks what --output holds when each
  request is scored, and is 'killed' at the second."""
  source = "runs/new"

  def __init__(self, output, earlier):
    self.output, self.earlier, self.calls = output, earlier, 0

  def loglikelihood(self, pairs, **unused_settings):
    self.calls += 1
    if self.calls == 1:  # the earlier file is still whole
      with open(self.output) as f:
        assert f.read() == self.earlier
      return [(-2.5, False)] * len(pairs)
    raise KeyboardInterrupt


def test_overwrite_keeps_the_earlier_file_until_the_first_result(tmp_path):
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  earlier = '{"loglikelihood": -1.0, "is_greedy": true}\n' * 3
  output = _earlier_file(tmp_path / "ll.jsonl", earlier)
  likelihood.write_settings(output, {"checkpoint": "runs/old"})
  lm = _FakeLM(output, earlier)
  with pytest.raises(KeyboardInterrupt):
    evaluate.score_requests(lm, [("a", " b"), ("c", " d")], {},
                            {"checkpoint": lm.source}, output, resume=False,
                            overwrite=True)
  # Killed after the first result: it alone is there, under this run's
  # settings (a --resume goes on from it).
  with open(output) as f:
    assert f.read() == likelihood.result_line(-2.5, False)
  with open(likelihood.settings_path(output)) as f:
    assert json.load(f) == {"checkpoint": "runs/new", "complete": False}
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "ll.jsonl", "ll_settings.json"]  # no temporary file left


# ------------------------------------- a kill between the writes of a start
# Each file operation (a rename or a removal) of a start or replacement of
# an output is 'killed' in turn; after each, whatever a later run reads
# must be true: a record (settings or summary) beside the output describes
# what it holds, or is gone.


class _Killed(BaseException):
  """The injected kill (a BaseException, as KeyboardInterrupt)."""


def _killed_at(monkeypatch, n):
  """Makes the `n`-th os.replace / os.remove from now raise `_Killed`
  before it acts; returns a function saying whether it was reached."""
  calls = [0]
  for name in ("replace", "remove"):
    real = getattr(os, name)

    def fake(*args, real=real, **kwargs):
      calls[0] += 1
      if calls[0] == n + 1:
        raise _Killed
      return real(*args, **kwargs)

    monkeypatch.setattr(os, name, fake)
  return lambda: calls[0] > n


def _each_kill(monkeypatch, prepare, act, check):
  """For each step of `act()` on the files `prepare()` lays out: kill it
  there, undo the fault, `check()`; then once with no kill. Returns how
  many steps were killed."""
  n = 0
  while True:
    prepare()
    with monkeypatch.context() as patch:
      reached = _killed_at(patch, n)
      try:
        act()
      except _Killed:
        pass
    check()
    if not reached():
      return n
    n += 1


def _read(path):
  return open(path).read() if os.path.exists(path) else None


def _benchmark_files(tmp_path):
  """An earlier scored run's --output, its generation settings and summary
  (paths), and (old samples text, old settings)."""
  output = str(tmp_path / "samples.jsonl")
  old = _sample("HumanEval/0", 0) + "\n" + _sample("HumanEval/0", 1) + "\n"
  old_generation = _generation(seed=7, num_samples=2)
  return output, old, old_generation


def _lay_out(output, old, old_generation):
  with open(output, "w") as f:
    f.write(old)
  evaluate._write_json_atomically(evaluate._generation_path(output),
                                  old_generation)
  evaluate._write_json_atomically(evaluate._summary_path(output),
                                  {"pass@1": 0.5, "samples_file": output})
  for name in os.listdir(os.path.dirname(output)):
    if name.endswith(".tmp"):
      os.remove(os.path.join(os.path.dirname(output), name))


def _check_samples_records(output, old, old_generation, new_generation,
                           new_samples):
  """Whichever step was killed: the old summary only beside the old
  samples; a --resume with the old settings keeps only old samples, with
  the new only new ones (or is refused: no settings)."""
  samples = _read(output)
  if os.path.exists(evaluate._summary_path(output)):
    assert samples == old, "an old summary beside new samples"
  for generation, own in ((old_generation, old),
                          (new_generation, new_samples)):
    try:
      kept = evaluate._resumed_samples(output, generation)
    except ValueError as e:
      assert "--resume:" in str(e)
      continue
    kept = "".join(json.dumps(r) + "\n" for r in kept)
    assert kept in ("", own), (generation, samples)


def test_a_kill_while_overwrite_replaces_the_samples(tmp_path, monkeypatch,
                                                      capsys):
  """--overwrite's first batch: the samples were replaced, then the
  settings; killed between, the earlier run's settings described the new
  batch (a --resume with them kept it) and its summary stayed beside it."""
  output, old, old_generation = _benchmark_files(tmp_path)
  batch = [json.loads(_sample("HumanEval/0", 0)) | {"completion": "new"}]
  new = "".join(json.dumps(r) + "\n" for r in batch)
  steps = _each_kill(
      monkeypatch, lambda: _lay_out(output, old, old_generation),
      lambda: evaluate._start_samples(output, batch, _generation(),
                                      replace=True),
      lambda: _check_samples_records(output, old, old_generation,
                                     _generation(), new))
  assert steps == 4  # summary and settings removed, samples, settings
  assert _read(output) == new and not os.path.exists(
      evaluate._summary_path(output))
  capsys.readouterr()


def test_a_kill_while_score_only_copies_into_another_output(
    tmp_path, monkeypatch, capsys):
  """--score_only=A --output=B --overwrite: B's earlier settings stayed
  beside A's samples (a --resume of B with them kept those samples); A's
  settings now come with them."""
  output, old, old_generation = _benchmark_files(tmp_path)
  source = tmp_path / "a" / "samples.jsonl"
  source.parent.mkdir()
  source.write_text(_sample("HumanEval/1", 0) + "\n")
  evaluate._write_json_atomically(evaluate._generation_path(str(source)),
                                  _generation())
  records = [json.loads(_sample("HumanEval/1", 0))]
  steps = _each_kill(
      monkeypatch, lambda: _lay_out(output, old, old_generation),
      lambda: evaluate._copy_samples(str(source), output, records),
      lambda: _check_samples_records(output, old, old_generation,
                                     _generation(), source.read_text()))
  assert steps == 4
  assert _read(output) == source.read_text()
  assert json.loads(_read(evaluate._generation_path(output))) == (
      _generation())
  capsys.readouterr()


def test_a_kill_while_overwrite_replaces_the_loglikelihoods(tmp_path,
                                                            monkeypatch):
  """--loglikelihood --overwrite's first result: written before the
  settings, it sat beside the earlier run's (a --resume with them kept
  it)."""
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  output = str(tmp_path / "ll.jsonl")
  old = likelihood.result_line(-1.0, True) * 2
  old_record = {"checkpoint": "runs/old", "seed": 1}
  new_record = {"checkpoint": "runs/old", "seed": 2}
  new = likelihood.result_line(-2.5, False)

  def prepare():
    with open(output, "w") as f:
      f.write(old)
    likelihood.write_settings(output, dict(old_record, complete=True))

  def check():
    results = _read(output)
    for record, own in ((old_record, old), (new_record, new)):
      try:
        kept = evaluate._resumed_results(output, record, 2)
      except ValueError as e:
        assert "--resume:" in str(e)
        continue
      assert "".join(kept) in ("", own), (record, results)

  steps = _each_kill(monkeypatch, prepare,
                     lambda: likelihood.start_results(output, new_record,
                                                      [new], replace=True),
                     check)
  assert steps == 3  # settings removed, results, settings
  assert _read(output) == new


def test_a_kill_while_scoring_rewrites_the_samples(tmp_path, monkeypatch,
                                                   capsys):
  """Scoring rewrote the samples with their results, then the summary;
  killed between, an earlier scoring's summary (here: of other
  completions, as after an edit and --score_only) sat beside them."""
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  from trm.families.dream import code_exec  # pylint: disable=g-import-not-at-top
  output, old, old_generation = _benchmark_files(tmp_path)
  problems = code_eval.load_humaneval()[:1]

  def score(problems, records, *unused, **unused_kw):
    # The sandbox is not the subject: each sample 'ran' and failed.
    for record in records:
      record.update(passed=False, result="failed", reason="failed")
    return list(records), {"pass@1": 0.0}

  monkeypatch.setattr(code_eval, "score_records", score)

  def act():
    records = [json.loads(line) for line in old.splitlines()]
    evaluate._score_and_report(problems, records, code_exec.Limits(), 1,
                               [1], output, {"benchmark": "humaneval"})

  def check():
    if os.path.exists(evaluate._summary_path(output)):
      summary = json.loads(_read(evaluate._summary_path(output)))
      assert (summary.get("pass@1") == 0.0) == (_read(output) != old), (
          "a summary beside samples it did not score")

  steps = _each_kill(monkeypatch, lambda: _lay_out(output, old,
                                                   old_generation),
                     act, check)
  assert steps == 3  # summary removed, samples, summary
  capsys.readouterr()


def _refusal_with(inject: str, argv: list) -> list:
  """The stderr lines of `argv` (trm.evaluate's), run in a fresh process
  after the Python `inject` (a fake put in place there only), which must
  exit 2."""
  result = subprocess.run(
      [sys.executable, "-c", inject + (
          f"import runpy, sys\nsys.argv = {argv!r}\n"
          "runpy.run_module('trm.evaluate', run_name='__main__')\n")],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  return result.stderr.strip().splitlines()


def test_resume_compares_a_hub_ids_commit_before_its_weights_download(
    tmp_path):
  """--resume with a Hub id compared the recorded commit only once the
  weights (gigabytes) had downloaded. Now the commit its config and
  tokenizer resolve to is compared first. The Hub is a fake in the run's
  process: it lays the tiny checkpoint out as a cache snapshot of another
  commit, and marks a weights download."""
  from test_generate import make_tiny_checkpoint  # pylint: disable=g-import-not-at-top
  checkpoint = make_tiny_checkpoint(tmp_path / "tiny")
  snapshots = tmp_path / "hub" / "models--org--tiny" / "snapshots"
  old, new = "a" * 40, "b" * 40
  requests, output = _earlier_loglikelihoods(
      tmp_path, str(snapshots / old), mc_num=1, batch_size=1)
  marker = tmp_path / "weights_downloaded"
  argv = ["trm.evaluate", "--checkpoint=nobody-trm-test/tiny",
          f"--loglikelihood={requests}", f"--output={output}", "--resume",
          "--mc_num=1", "--batch_size=1"]
  inject = (
      "import os, runpy, sys\n"
      "from trm.core import hub\n"
      "def snapshot(repo_id, *, allow_patterns=None, revision=None, **_):\n"
      f"  directory = os.path.join({str(snapshots)!r}, {new!r})\n"
      "  os.makedirs(directory, exist_ok=True)\n"
      "  weights = '*.safetensors' in allow_patterns\n"
      f"  if weights: open({str(marker)!r}, 'w').close()\n"
      f"  for name in os.listdir({checkpoint!r}):\n"
      "    if (name.endswith('.safetensors') <= weights\n"
      "        and not os.path.exists(os.path.join(directory, name))):\n"
      f"      os.symlink(os.path.join({checkpoint!r}, name),\n"
      "                 os.path.join(directory, name))\n"
      "  return directory\n"
      "hub.snapshot = snapshot\n")
  lines = _refusal_with(inject, argv)
  assert lines == [
      f"trm.evaluate: error: --resume: {output} was made with checkpoint "
      f"'{snapshots / old}' (commit {old}), but --checkpoint=nobody-trm-test/"
      f"tiny now resolves to '{snapshots / new}' (commit {new}) (found "
      "before its weights download): rerun without --resume to start "
      "again."], lines
  assert not marker.exists(), "the weights were downloaded first"
  assert open(output).read() == '{"loglikelihood": -1.0, "is_greedy": true}\n'
  # The same commit recorded from another cache (HF_HOME) passes the
  # check: the weights download is reached (stopped there by the fake).
  requests, output = _earlier_loglikelihoods(
      tmp_path, str(tmp_path / "other_home" / "hub" / "models--org--tiny"
                    / "snapshots" / new), mc_num=1, batch_size=1)
  stop = inject.replace(
      f"  if weights: open({str(marker)!r}, 'w').close()\n",
      "  if weights: raise ValueError('weights download reached')\n")
  assert stop != inject
  assert _refusal_with(stop, argv) == [
      "trm.evaluate: error: weights download reached"]


def test_resume_takes_one_hub_commit_from_another_cache(tmp_path):
  """A Hub id's recorded source is its cache snapshot's path: resumed under
  another HF_HOME (or with the cache moved), the same commit was refused as
  another checkpoint. The repository and commit are compared now, in each
  of the three resume checks; another commit or repository, or a moved
  local directory, is still refused."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  commit = "c" * 40
  old = f"/home/a/.cache/huggingface/hub/models--org--tiny/snapshots/{commit}"
  new = str(tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots"
            / commit)
  assert inference.same_source(old, new)
  assert inference.same_source(old + "/", new)
  assert inference.same_source("runs/hf", "runs/hf")
  for other in (new.replace(commit, "d" * 40),
                new.replace("models--org--tiny", "models--org--big"),
                new.replace("snapshots", "refs"),
                f"/data/tiny/{commit}", "/data/tiny", None):
    assert not inference.same_source(old, other), other
    assert not inference.same_source(other, old), other
  # The generation check (--benchmark --resume).
  samples = str(tmp_path / "samples.jsonl")
  evaluate._write_json_atomically(evaluate._generation_path(samples),
                                  _generation(checkpoint=old))
  open(samples, "w").close()
  assert evaluate._check_generation(samples, _generation(checkpoint=new))
  with pytest.raises(ValueError, match="was generated with checkpoint"):
    evaluate._check_generation(samples, _generation(
        checkpoint=new.replace(commit, "d" * 40)))
  # The scoring check (--loglikelihood --resume): its line is kept.
  _, output = _earlier_loglikelihoods(tmp_path, old)
  record = {k: v for k, v in json.load(open(
      os.path.splitext(output)[0] + "_settings.json")).items()
            if k != "complete"}
  assert evaluate._resumed_results(output, dict(record, checkpoint=new),
                                   1) == [
      '{"loglikelihood": -1.0, "is_greedy": true}\n']
  with pytest.raises(ValueError, match="was computed with checkpoint"):
    evaluate._resumed_results(output, dict(record, checkpoint="/data/tiny"),
                              1)


def _local_checkpoint(directory, first=0.0, norm=1.0, config="{}"):
  """A Hugging Face directory's files (no model reads them): a weight file
  larger than the fingerprint reads whole, whose big tensor starts with
  `first` and whose small one holds `norm`s, and `config` as config.json."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  directory.mkdir(parents=True)
  big = np.arange(640 * 640, dtype=np.float32).reshape(640, 640)
  big[0, 0] = first
  save_file({"big": big, "norm": np.full(8, norm, np.float32)},
            str(directory / "model.safetensors"))
  (directory / "config.json").write_text(config)
  (directory / "tokenizer.json").write_text("{}")
  return str(directory)


def test_resume_takes_a_moved_local_checkpoint_with_the_same_files(
    tmp_path):
  """A local checkpoint's recorded source is its path: moved (the same
  files under another path), it was refused as another checkpoint. The
  record now holds a fingerprint of its files, compared where the paths
  differ, in the generation and scoring checks; other files (weights,
  config), or a record written before the fingerprint, are still
  refused."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
  assert os.path.getsize(_local_checkpoint(tmp_path / "size") + "/"
                         "model.safetensors") > 2**20
  old = _local_checkpoint(tmp_path / "old")
  recorded = evaluate._expected_checkpoint(old, None)
  assert set(recorded) == {"checkpoint", "checkpoint_fingerprint"}
  moved = str(tmp_path / "elsewhere" / "moved")
  os.makedirs(os.path.dirname(moved))
  os.rename(old, moved)
  now = evaluate._expected_checkpoint(moved, None)
  assert now["checkpoint"] == moved
  assert now["checkpoint_fingerprint"] == recorded["checkpoint_fingerprint"]
  others = [_local_checkpoint(tmp_path / "weights", first=-1.0),
            _local_checkpoint(tmp_path / "norm", norm=2.0),
            _local_checkpoint(tmp_path / "config", config='{"a": 1}')]
  # The generation check (--benchmark --resume).
  samples = str(tmp_path / "samples.jsonl")
  open(samples, "w").close()
  for record, takes in ((recorded, True), ({"checkpoint": old}, False)):
    evaluate._write_json_atomically(evaluate._generation_path(samples),
                                    _generation(**record))
    if takes:
      assert evaluate._check_generation(samples, _generation(**now))
    else:  # written before the fingerprint: as it was
      with pytest.raises(ValueError, match="was generated with checkpoint"):
        evaluate._check_generation(samples, _generation(**now))
    for other in others:
      with pytest.raises(ValueError, match="was generated with checkpoint"):
        evaluate._check_generation(samples, _generation(
            **evaluate._expected_checkpoint(other, None)))
  # The scoring check (--loglikelihood --resume): its line is kept.
  _, output = _earlier_loglikelihoods(tmp_path, old)
  settings = os.path.splitext(output)[0] + "_settings.json"
  record = {k: v for k, v in json.load(open(settings)).items()
            if k != "complete"}
  likelihood.write_settings(output, dict(record, **recorded))
  assert evaluate._resumed_results(output, dict(record, **now), 1) == [
      '{"loglikelihood": -1.0, "is_greedy": true}\n']
  for other in others:
    with pytest.raises(ValueError, match="was computed with checkpoint"):
      evaluate._resumed_results(
          output, dict(record, **evaluate._expected_checkpoint(other, None)),
          1)
  # A workdir's step: its files.
  workdir = tmp_path / "run"
  for name, text in (("7/params/data", "w" * 3000), ("7/meta", "m")):
    (workdir / "checkpoints" / name).parent.mkdir(parents=True,
                                                  exist_ok=True)
    (workdir / "checkpoints" / name).write_text(text)
  first = evaluate._expected_checkpoint(str(workdir), 7)
  assert first["checkpoint"] == f"{workdir}/checkpoints step 7"
  os.rename(workdir, tmp_path / "run2")
  second = evaluate._expected_checkpoint(str(tmp_path / "run2"), 7)
  assert inference.same_source(
      first["checkpoint"], second["checkpoint"],
      first["checkpoint_fingerprint"], second["checkpoint_fingerprint"])
  (tmp_path / "run2" / "checkpoints" / "7" / "meta").write_text("n")
  assert (evaluate._expected_checkpoint(str(tmp_path / "run2"), 7)
          ["checkpoint_fingerprint"] != second["checkpoint_fingerprint"])
  # No fingerprint on either side, or one alone: the paths decide.
  assert not inference.same_source(old, moved)
  assert not inference.same_source(old, moved, None, None)
  assert not inference.same_source(
      old, moved, None, now["checkpoint_fingerprint"])


def test_a_fingerprint_reads_every_tensor_but_not_every_byte(monkeypatch,
                                                            tmp_path):
  """A 7B model's weights are 15 GB: a resume reads each tensor's first,
  middle and last block (a small tensor whole), not all of them."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  base = inference.source_fingerprint(_local_checkpoint(tmp_path / "a"))
  assert base == inference.source_fingerprint(
      _local_checkpoint(tmp_path / "b"))
  for name, change in (("first", dict(first=5.0)), ("norm", dict(norm=0.5))):
    assert base != inference.source_fingerprint(
        _local_checkpoint(tmp_path / name, **change)), name
  read = []
  real_read = inference._read_at
  monkeypatch.setattr(inference, "_read_at", lambda f, offset, size: (
      read.append(size) or real_read(f, offset, size)))
  inference.source_fingerprint(str(tmp_path / "a"))
  assert 0 < sum(read) < 100_000, sum(read)  # of 1.6 MB


def test_a_fingerprint_never_waits_on_a_fifo_nor_reads_a_claimed_header(
    monkeypatch, tmp_path):
  """The fingerprint is read before the weights, from files a user names:
  a FIFO in a workdir's step was opened and waited on forever; a
  safetensors file whose header claims most of the file, or a tensor
  whose offsets run backwards (`read(-1)`: to the end), was read whole
  into memory."""
  import threading  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  step = tmp_path / "run" / "checkpoints" / "3"
  step.mkdir(parents=True)
  (step / "meta").write_text("m")
  os.mkfifo(step / "pipe")
  found = []
  reader = threading.Thread(target=lambda: found.append(
      evaluate._expected_checkpoint(str(tmp_path / "run"), 3)), daemon=True)
  reader.start()
  reader.join(30)
  assert not reader.is_alive(), "waited on the FIFO"
  assert found[0]["checkpoint_fingerprint"]
  monkeypatch.setattr(inference, "_MAX_HEADER", 2**20, raising=False)
  size = 2 * 2**20
  claims = tmp_path / "claims"
  claims.mkdir()
  with open(claims / "model.safetensors", "wb") as f:
    f.write((size - 9).to_bytes(8, "little") + b"\0" * (size - 8))
  backwards = tmp_path / "backwards"
  backwards.mkdir()
  header = json.dumps({"t": {"dtype": "F32", "shape": [1],
                             "data_offsets": [100, 0]}}).encode()
  with open(backwards / "model.safetensors", "wb") as f:
    f.write(len(header).to_bytes(8, "little") + header
            + b"\0" * (size - 8 - len(header)))
  read = []
  real_read = inference._read_at
  monkeypatch.setattr(inference, "_read_at", lambda f, offset, size: (
      read.append(size) or real_read(f, offset, size)))
  for directory in (claims, backwards):
    read.clear()
    assert inference.source_fingerprint(str(directory))
    assert 0 <= min(read) and max(read) <= 4096, (directory, max(read))


def test_resume_loads_the_latest_step_it_compared(tmp_path):
  """--resume --step=latest compared the record with the newest complete
  step on disk, then the load chose 'latest' again: a step saved in
  between (a run still training), or a newest step that did not read, was
  loaded instead and refused only after the weights. The step compared is
  now the one the load is asked for; the load is watched in the run's
  process, which stops there (after the resume check passed)."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  for step, markers in ((10, True), (20, True), (30, False)):
    for name in ckpt_lib._COMMITTED_FILES if markers else ["state/x"]:  # pylint: disable=protected-access
      path = workdir / "checkpoints" / str(step) / name
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text("")
  requests, output = _earlier_loglikelihoods(
      tmp_path, f"{workdir / 'checkpoints'} step 20")
  argv = ["trm.evaluate", f"--checkpoint={workdir}",
          f"--loglikelihood={requests}", f"--output={output}", "--resume"]
  inject = (
      "import os, runpy, sys\n"
      "from trm import generate\n"
      "def load_model(checkpoint, holders, config=None, step=None, **_):\n"
      # A step saved after the check, before the load.
      f"  os.makedirs({str(workdir / 'checkpoints' / '40')!r})\n"
      "  raise ValueError(f'load asked for step {step!r}')\n"
      "generate.load_model = load_model\n")
  assert _refusal_with(inject, argv) == [
      "trm.evaluate: error: load asked for step 20"]
  # With no output yet there is no record to compare: the load resolves
  # 'latest' itself, going back past a newest step that does not read.
  os.rmdir(workdir / "checkpoints" / "40")
  fresh = [*argv[:-2], f"--output={tmp_path / 'fresh.jsonl'}", "--resume"]
  assert _refusal_with(inject, fresh) == [
      "trm.evaluate: error: load asked for step None"]


def test_score_only_into_the_same_file_through_a_bind_mount_keeps_settings(
    tmp_path):
  """--score_only=DATA/x.jsonl --output=ALIAS/x.jsonl, ALIAS a bind mount
  of DATA (on macOS another case of its name): the settings beside the
  output are the source's own. They were removed before the rewrite, so a
  kill there lost them."""
  source, alias = tmp_path / "data" / "x.jsonl", tmp_path / "alias"
  source.parent.mkdir()
  alias.mkdir()
  source.write_text(_sample("HumanEval/0", 0) + "\n")
  settings = evaluate._generation_path(str(source))
  evaluate._write_json_atomically(settings, _generation())
  assert bind_mounts.python(source.parent, alias, (
      "import json, sys\n"
      "from trm import evaluate\n"
      "from trm.families.dream import code_eval\n"
      "source, output = sys.argv[1:]\n"
      "records = [json.loads(line) for line in open(source)]\n"
      "def killed(*args):\n"
      "  raise KeyboardInterrupt('killed while writing the samples')\n"
      "code_eval.write_samples = killed\n"
      "try:\n"
      "  evaluate._copy_samples(source, output, records)\n"
      "except KeyboardInterrupt:\n"
      "  print('killed')"), source, alias / "x.jsonl").split() == ["killed"]
  assert json.loads(_read(settings)) == _generation()


def test_a_failed_samples_write_keeps_the_file_and_leaves_no_temporary(
    tmp_path):
  """The samples were written to <output>.tmp<pid> unsynced, then renamed:
  a failed write left that file behind (and a crash after the rename could
  leave an empty file)."""
  from trm.families.dream import code_eval  # pylint: disable=g-import-not-at-top
  output = tmp_path / "samples.jsonl"
  output.write_text(_sample("HumanEval/0", 0) + "\n")
  with pytest.raises(TypeError):
    code_eval.write_samples(str(output), [json.loads(_sample(
        "HumanEval/1", 0)), {"task_id": object()}])
  assert output.read_text() == _sample("HumanEval/0", 0) + "\n"
  assert os.listdir(tmp_path) == ["samples.jsonl"]


def test_score_only_into_a_file_of_the_same_stem_keeps_its_settings(
    tmp_path, monkeypatch, capsys):
  """--score_only=x.jsonl --output=x.json: both have x_generation.json, the
  source's own settings; killed at any step, they are still there."""
  source = tmp_path / "x.jsonl"
  source.write_text(_sample("HumanEval/0", 0) + "\n")
  settings = evaluate._generation_path(str(source))
  records = [json.loads(_sample("HumanEval/0", 0))]

  def prepare():
    evaluate._write_json_atomically(settings, _generation())

  _each_kill(monkeypatch, prepare,
             lambda: evaluate._copy_samples(str(source),
                                            str(tmp_path / "x.json"),
                                            records),
             lambda: json.loads(_read(settings)))
  assert _read(str(tmp_path / "x.json")) == source.read_text()
  capsys.readouterr()
