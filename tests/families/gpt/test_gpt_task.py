"""GPT through the training loop (`trm.families.gpt.task`): nanoGPT's workflow on
tinyshakespeare at toy sizes, 8 CPU devices as mesh 2x2x2: the loss falls,
checkpoints follow always_save_checkpoint, eval_only and init_from work, a
run resumes, and trm.sample prints text from the workdir."""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import repo

from trm.core import task as task_lib
from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import train
from trm import families

ROOT = repo.ROOT
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare",
                           "input.txt")


_CORPUS = []  # this process's stand-in corpus, written once


def corpus_path(tmp_root) -> str:
  """tinyshakespeare where the checkout has ../shared/data; otherwise a
  stand-in written by `_stand_in_corpus`, so the tests still run on a bare
  clone. The stand-in goes in a folder of its own: written into
  `tmp_root` (often the run's data_root), it failed where data_root did
  not exist yet, and some tests check that nothing else made it."""
  del tmp_root  # kept for the callers; the stand-in is per process
  if os.path.isfile(SHAKESPEARE):
    return SHAKESPEARE
  if not _CORPUS:
    folder = tempfile.mkdtemp(prefix="trm_test_corpus_")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "corpus.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write(_stand_in_corpus())
    _CORPUS.append(path)
  return _CORPUS[0]


def _stand_in_corpus(chars: int = 300_000) -> str:
  """A play-shaped text drawn from a fixed seed: speakers' names in
  capitals, then lines of words drawn with Zipf-like weights, so that
  letters are as unevenly frequent as in a play and the held-out tail has
  the training text's distribution. It was this repository's own Python
  sources until session 92; they change with every commit, and one
  commit's held-out tail (another part of the code than the training
  text) made the held-out loss rise between evaluations. Every printable
  character appears (a prompt such as 'ROMEO:' or 'To be' encodes)."""
  import random  # pylint: disable=g-import-not-at-top
  import string  # pylint: disable=g-import-not-at-top
  rng = random.Random(92)
  words = ("the and to of a my in you is that it not with me be your his "
           "this but he for have so will what thy all her do shall by no "
           "we are our as if on lord good now come love sir more than "
           "them then well there how let she upon here may say go king "
           "night day heart death hand eyes make speak know time fair "
           "sweet heaven friend honour noble brother father blood").split()
  weights = [1 / (rank + 1) for rank in range(len(words))]
  names = ("ROMEO", "JULIET", "KING", "QUEEN", "NURSE", "FRIAR", "DUKE",
           "FIRST CITIZEN", "MESSENGER")
  parts = [string.ascii_letters + string.digits + string.punctuation
           + " \n\n"]
  size = len(parts[0])
  while size < chars:
    lines = []
    for _ in range(rng.randint(1, 4)):
      line = " ".join(rng.choices(words, weights, k=rng.randint(4, 10)))
      lines.append(line[0].upper() + line[1:] + rng.choice(",.;!?:"))
    speech = rng.choice(names) + ":\n" + "\n".join(lines) + "\n\n"
    parts.append(speech)
    size += len(speech)
  return "".join(parts)


def tiny_config(data_root, **overrides):
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char_cpu")
  config.mesh.update(data=2, fsdp=2, model=2)
  config.data.input = corpus_path(data_root)
  values = dict(data_root=str(data_root), n_layer=2, n_head=2, n_embd=32,
                block_size=32, batch_size=8, gradient_accumulation_steps=2,
                max_iters=60, lr_decay_iters=60, warmup_iters=5,
                eval_interval=30, eval_iters=4, log_interval=10,
                learning_rate=3e-3)
  values.update(overrides)
  return config_lib.set_values(config, values)


# The short runs below keep tiny_config's lr_decay_iters (60): their steps
# all fall in the warmup (5 iterations), where the rate does not depend on
# it, and the train step is then the program `trained` compiled (a cache
# hit, not a compile of its own).
SHORT = dict(max_iters=4, eval_interval=2)
# A learning rate of 0 (all rates 0 whatever the schedule's lengths): the
# loss never improves on the first evaluation.
FROZEN = dict(learning_rate=0.0, min_lr=0.0, lr_decay_iters=20,
              always_save_checkpoint=False)


def _eval(workdir, step):
  with open(os.path.join(workdir, f"eval_{step}.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_root):
  workdir = str(tmp_path_factory.mktemp("gpt"))
  config = tiny_config(data_root, always_save_checkpoint=True)
  _, results = train.train_and_evaluate(config, workdir, families.build_task)
  return workdir, results


def test_loss_falls_and_both_splits_are_evaluated(trained, data_root):
  workdir, results = trained
  first, last = _eval(workdir, 30), _eval(workdir, 60)
  assert {"eval/loss", "eval/val_loss", "eval/train_loss"} <= set(last)
  assert last["eval/loss"] == last["eval/val_loss"]
  assert last["eval/val_loss"] == pytest.approx(results["eval/val_loss"])
  with open(os.path.join(workdir, "config.json")) as f:
    vocab = json.load(f)["model"]["vocab_size"]
  with open(corpus_path(data_root), encoding="utf-8") as f:
    assert vocab == len(set(f.read()))  # 65 for tinyshakespeare
  # Untrained: ln(vocab); the char model learns letter frequencies fast.
  assert last["eval/train_loss"] < np.log(vocab) - 0.8, last
  assert last["eval/val_loss"] < first["eval/val_loss"]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["30",
                                                                      "60"]
  # --step=best (trm.sample, trm.export): the lower held-out loss's step.
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  assert cli.workdir_step(workdir, "best") == 60
  # The dataset was prepared from the text, nanoGPT-style.
  prepared = os.path.join(data_root, "shakespeare_char")
  assert sorted(os.listdir(prepared)) == ["meta.json", "train.bin", "val.bin"]


def test_mfu_step_time_and_tokens_per_second_are_logged(trained):
  workdir, _ = trained
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top,line-too-long
  events = event_accumulator.EventAccumulator(workdir, size_guidance={
      event_accumulator.TENSORS: 0})
  events.Reload()
  tags = set(events.Tags()["tensors"])
  assert "timing/ms_per_step" in tags, tags
  # Tokens/s (none was logged): 16 sequences (8 x 2 micro-batches) of 32
  # tokens per step over the step's time, and per device over the 8.
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  def by_step(tag):
    return {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
            for e in events.Tensors(tag)}
  ms, tokens = by_step("timing/ms_per_step"), by_step("timing/tokens_per_sec")
  per_device = by_step("timing/tokens_per_sec_per_device")
  assert tokens and set(tokens) == set(ms) == set(per_device), (tokens, ms)
  for step, value in tokens.items():
    assert value == pytest.approx(16 * 32 * 1000 / ms[step], rel=1e-5)
    assert per_device[step] == pytest.approx(value / 8, rel=1e-6)


def test_eval_only_evaluates_without_training(trained, data_root, tmp_path):
  workdir, results = trained
  config = tiny_config(data_root, eval_only=True, init_from="resume")
  state, again = train.train_and_evaluate(config, workdir, families.build_task)
  assert int(state.step) == 60
  assert again["eval/val_loss"] == pytest.approx(results["eval/val_loss"],
                                                 rel=1e-5)


def test_resume_needs_a_checkpoint(data_root, tmp_path):
  config = tiny_config(data_root, init_from="resume")
  with pytest.raises(ValueError, match="init_from='resume'"):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


@pytest.mark.parametrize("overrides, message", [
    (dict(init_from="gpt3"), "config.init_from"),
    (dict(init_from="gpt2"), "config.init_checkpoint"),
    (dict(dtype="float64"), "config.dtype"),
    (dict(dtype="float16", **{"model.param_dtype": "bfloat16"}),
     "config.model.param_dtype"),
    (dict(batch_size=6), "batch_size=6 must be a positive multiple"),
    # Named as nanoGPT's key, which is what to change: global_batch_size
    # (6 x 1) is derived from it, and refused when set apart.
    (dict(batch_size=6, gradient_accumulation_steps=1),
     r"^config\.batch_size=6 must be a positive multiple"),
    (dict(dataset="nowhere"), "nowhere"),
])
def test_bad_config_fails_before_training(data_root, tmp_path, overrides,
                                          message):
  config = tiny_config(data_root, **overrides)
  if "dataset" in overrides:
    config.data.input = ""  # not prepared, and nothing to prepare it from
  with pytest.raises(Exception, match=message):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


# slow: tests/core/test_loss_scale.py runs the float16 GPT step with its scale
# updates; the scale is part of the train state every resume test restores.
@pytest.mark.slow
def test_float16_trains_checkpoints_and_resumes_its_loss_scale(data_root,
                                                               tmp_path):
  config = tiny_config(data_root, dtype="float16", max_iters=10,
                       lr_decay_iters=20, eval_interval=10, **{
                           "loss_scale.growth_interval": 4})
  state, results = train.train_and_evaluate(config, str(tmp_path), families.build_task)
  assert np.isfinite(results["eval/loss"])
  scale = float(state.loss_scale.scale)
  assert int(state.skipped_steps) == 0 and scale == 2.0**15 * 4  # grew twice
  config = tiny_config(data_root, dtype="float16", max_iters=12,
                       lr_decay_iters=20, eval_interval=10, **{
                           "loss_scale.growth_interval": 4})
  resumed, _ = train.train_and_evaluate(config, str(tmp_path), families.build_task)
  assert int(resumed.step) == 12
  # Restored (2 steps since the last growth at step 8), then 2 more: grown.
  assert float(resumed.loss_scale.scale) == scale * 2


def _frozen_config(data_root):
  return tiny_config(data_root, max_iters=20, eval_interval=10,
                     eval_at_start=False, **FROZEN)


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory, data_root):
  """A finished 20-step run at a learning rate of 0, always_save_checkpoint
  False: its workdir (tests that go on with it copy it first)."""
  workdir = tmp_path_factory.mktemp("frozen")
  train.train_and_evaluate(_frozen_config(data_root), str(workdir),
                           families.build_task)
  return workdir


def test_checkpoint_only_on_improvement(frozen_run):
  # A learning rate of 0 never improves after the first evaluation (without
  # the one of the starting weights, step 10's).
  assert os.listdir(os.path.join(frozen_run, "checkpoints")) == ["10"]


def test_the_starting_weights_are_evaluated_first(data_root, tmp_path):
  """nanoGPT evaluates at iteration 0 (a baseline, not saved); so does a
  GPT run (config.eval_at_start), which trains the same steps for it. Its
  loss is the best to beat for always_save_checkpoint=False, as nanoGPT's
  best_val_loss: a rate of 0 never beats it, and nothing is saved."""
  runs = {}
  for at_start in (True, False):
    workdir = str(tmp_path / str(at_start))
    runs[at_start] = train.train_and_evaluate(
        tiny_config(data_root, eval_at_start=at_start, **SHORT), workdir,
        families.build_task)[1]
    assert os.path.exists(os.path.join(workdir, "eval_0.json")) == at_start
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
        "2", "4"]
  first = _eval(str(tmp_path / "True"), 0)
  assert {"eval/train_loss", "eval/val_loss"} <= set(first)
  assert first["eval/val_loss"] > runs[True]["eval/val_loss"]
  assert runs[True]["eval/val_loss"] == runs[False]["eval/val_loss"]
  workdir = str(tmp_path / "still")
  train.train_and_evaluate(tiny_config(data_root, **FROZEN, **SHORT), workdir,
                           families.build_task)
  assert not os.listdir(os.path.join(workdir, "checkpoints"))


def test_a_resume_with_a_shorter_block_size_names_the_crop(data_root,
                                                          tmp_path):
  """A workdir resumed with a smaller block_size was refused as a config
  change whose fix, allow_config_change, then failed on the position
  table's shape. nanoGPT crops the table on resume, but its AdamW state
  keeps the old shape and its first step fails; the refusal now names the
  route that crops both (its ckpt.pt, then init_from=resume), which trains."""
  workdir = str(tmp_path / "run")
  short = dict(SHORT, max_iters=2, eval_at_start=False)
  train.train_and_evaluate(tiny_config(data_root, **short), workdir,
                           families.build_task)
  for allow in (False, True):
    with pytest.raises(ValueError, match=(
        r"config.block_size=16 is smaller than the 32 that the run in .* "
        r"was trained with: .*--format=nanogpt`, then --config.init_from="
        r"resume --config.init_checkpoint=DIR/ckpt.pt")):
      train.train_and_evaluate(
          tiny_config(data_root, block_size=16, allow_config_change=allow,
                      **short), workdir, families.build_task)
  pytest.importorskip("torch")
  # `trm.export --format=nanogpt`'s writer, in this process (a `python -m
  # trm.export` process cost more than the rest of the test; the command
  # line itself is tests/test_export.py's).
  from trm import export  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "nanogpt")
  config = tiny_config(data_root, **short)
  write, _ = export._gpt_writer(  # pylint: disable=protected-access
      config, workdir, mesh_lib.ShardingContext.from_config(config),
      "nanogpt", None)
  write(out)
  state, results = train.train_and_evaluate(
      tiny_config(data_root, block_size=16, init_from="resume",
                  init_checkpoint=os.path.join(out, "ckpt.pt"),
                  **dict(short, max_iters=4)), str(tmp_path / "cropped"),
      families.build_task)
  assert state.params["wpe"]["embedding"].shape == (16, 32)
  assert int(state.step) == 4 and np.isfinite(results["eval/loss"])


def test_a_rerun_after_an_unsaved_last_step_is_finished(
    frozen_run, data_root, tmp_path, monkeypatch):
  """always_save_checkpoint=False left the last step (20, no better) unsaved;
  the same command again trained steps 11-20 again, on every rerun. It is a
  finished run now: it evaluates its newest checkpoint (here the best),
  compiling no step."""
  import shutil  # pylint: disable=g-import-not-at-top
  config = _frozen_config(data_root)
  tmp_path = tmp_path / "run"
  shutil.copytree(frozen_run, tmp_path)

  def no_training(*args, **kwargs):
    raise AssertionError("the finished run compiled its train step")

  monkeypatch.setattr(task_lib, "compile_train_step", no_training)
  state, results = train.train_and_evaluate(config, str(tmp_path),
                                            families.build_task)
  assert int(state.step) == 10 and "eval/loss" in results
  assert os.listdir(os.path.join(tmp_path, "checkpoints")) == ["10"]
  # The same figures at step 10 again: TensorBoard holds them once (before,
  # every rerun added a second point at that step).
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert [e.step for e in events.Tensors("eval/loss")] == [10, 20]
  # A longer run trains on from the best checkpoint, as before.
  monkeypatch.undo()
  config.max_iters = 30
  state, _ = train.train_and_evaluate(config, str(tmp_path),
                                      families.build_task)
  assert int(state.step) == 30


def test_a_better_last_step_killed_while_saving_is_trained_again(
    data_root, tmp_path, monkeypatch):
  """always_save_checkpoint=False: the last step improved, its
  eval_<step>.json was written and the run was killed while saving it. The
  rerun took the record for an unsaved step that did not improve: it ended
  on the older checkpoint (step 2 and its worse loss as the final
  evaluation), logging that step 4's loss was not below the best."""
  config = tiny_config(data_root, always_save_checkpoint=False,
                       eval_at_start=False, **SHORT)
  real_save = train.ckpt_lib.save

  class Killed(Exception):
    pass

  def killed_at_4(manager, step, *args, **kwargs):
    if step == 4:
      raise Killed(step)  # as a SIGKILL during the save
    return real_save(manager, step, *args, **kwargs)

  monkeypatch.setattr(train.ckpt_lib, "save", killed_at_4)
  with pytest.raises(Killed):
    train.train_and_evaluate(config, str(tmp_path), families.build_task)
  monkeypatch.undo()
  assert os.listdir(os.path.join(tmp_path, "checkpoints")) == ["2"]
  recorded = _eval(str(tmp_path), 4)["eval/loss"]
  assert recorded < _eval(str(tmp_path), 2)["eval/loss"]  # the premise
  state, results = train.train_and_evaluate(config, str(tmp_path),
                                            families.build_task)
  assert int(state.step) == 4 and results["eval/loss"] == recorded
  assert sorted(os.listdir(os.path.join(tmp_path, "checkpoints"))) == [
      "2", "4"]


def sample_two(workdir, *flags):
  """`trm.sample` from a workdir: two samples that continue 'ROMEO:'."""
  result = subprocess.run(
      [sys.executable, "-m", "trm.sample", f"--workdir={workdir}",
       "--start=ROMEO:", "--num_samples=2", "--max_new_tokens=40",
       "--top_k=5", *flags],
      capture_output=True, text=True, cwd=ROOT, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-2000:]
  samples = result.stdout.split("---------------")
  assert len(samples) == 3, result.stdout
  for sample in samples[:2]:
    assert sample.strip().startswith("ROMEO:")
    assert len(sample.strip()) >= len("ROMEO:") + 30
  return result


def test_sample_prints_text_from_the_workdir(trained):
  """... of the checkpoint --step names (30; 60 is the newest)."""
  workdir, _ = trained
  stderr = sample_two(workdir, "--step=30").stderr
  assert "tokens/s" in stderr
  assert f"weights: {workdir} step 30\n" in stderr


@pytest.mark.parametrize("edit", [{"data_root": 5}, {"data": 5}])
def test_sample_names_a_config_json_whose_data_fields_were_edited(
    trained, tmp_path, edit):
  """trm.sample's default data directory comes from the run's config.json:
  edited by hand (data_root a number, data no object) it was a TypeError's
  or AttributeError's traceback after the weights had been read."""
  import shutil  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from trm import sample  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  shutil.copytree(trained[0], workdir)
  record = json.loads((workdir / "config.json").read_text())
  (workdir / "config.json").write_text(json.dumps({**record, **edit}))
  ctx = mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=1),
                         devices=jax.devices()[:1]),
      config_lib.default_logical_axis_rules())
  with pytest.raises(ValueError, match=r"config\.json: data_root, dataset "
                     "and data.source / data.tfds name no data directory"):
    sample.load_model("resume", str(workdir), None, ctx)


def test_sample_rejects_a_missing_workdir(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "trm.sample", f"--workdir={tmp_path}"],
      capture_output=True, text=True, cwd=ROOT, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode != 0
  assert "config.json" in result.stderr


def test_start_file(tmp_path):
  from trm import sample  # pylint: disable=g-import-not-at-top
  prompt = tmp_path / "p.txt"
  prompt.write_text("To be")
  assert sample.read_start(f"FILE:{prompt}") == "To be"
  assert sample.read_start("plain") == "plain"
  with pytest.raises(FileNotFoundError, match="nope.txt"):
    sample.read_start("FILE:nope.txt")


def test_init_from_gpt2_adopts_its_shapes_and_evaluates_like_torch(
    data_root, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from trm.data.text import windows as text  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=128, n_positions=64, n_embd=32, n_layer=3, n_head=4,
      activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
      attn_pdrop=0.0)).eval()
  hf_dir = tmp_path / "gpt2"
  hf.save_pretrained(hf_dir, safe_serialization=True)
  # The config asks for 2 layers and block 32: the checkpoint's 3 layers
  # win, and its 64 positions are cropped to 32 (crop_block_size).
  config = tiny_config(data_root, init_from="gpt2",
                       init_checkpoint=str(hf_dir), eval_only=True,
                       eval_iters=2)
  workdir = tmp_path / "run"
  _, results = train.train_and_evaluate(config, str(workdir), families.build_task)
  with open(workdir / "config.json") as f:
    recorded = json.load(f)
  assert (recorded["n_layer"], recorded["n_embd"], recorded["bias"],
          recorded["block_size"]) == (3, 32, True, 32)
  windows = text.EvalWindows(os.path.join(data_root, "shakespeare_char"),
                             32, config.data.eval_batch_size, 2, config.seed)
  losses = {0: [], 1: []}
  with torch.no_grad():
    for k in range(len(windows)):
      batch = windows[k]
      out = hf(torch.tensor(batch["x"], dtype=torch.long),
               labels=None).logits
      loss = torch.nn.functional.cross_entropy(
          out.reshape(-1, 128), torch.tensor(batch["y"],
                                            dtype=torch.long).reshape(-1))
      losses[int(batch["split"][0])].append(float(loss))
  assert results["eval/val_loss"] == pytest.approx(np.mean(losses[1]),
                                                   abs=1e-4)
  assert results["eval/train_loss"] == pytest.approx(np.mean(losses[0]),
                                                     abs=1e-4)


def test_resume_from_a_nanogpt_checkpoint_continues_its_run(data_root,
                                                            tmp_path):
  """init_from='resume' with nanoGPT's ckpt.pt continues that run: its
  weights, AdamW moments, iteration and best validation loss carry over,
  and our next iteration equals the next iteration of nanoGPT's loop."""
  torch = pytest.importorskip("torch")
  import jax  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(ROOT, "benchmarks", "reference"))
  import nanogpt_torch  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import pipeline  # pylint: disable=g-import-not-at-top
  from trm.data.text import windows as text  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import gpt_import  # pylint: disable=g-import-not-at-top

  ckpt_path = str(tmp_path / "ckpt.pt")
  config = tiny_config(data_root, init_from="resume",
                       init_checkpoint=ckpt_path,
                       gradient_accumulation_steps=1, grad_clip=1.0,
                       weight_decay=0.1)
  vocab = text.ensure_prepared(os.path.join(str(data_root), config.dataset),
                               config.data.input, "char")["vocab_size"]
  model_args = dict(n_layer=2, n_head=2, n_embd=32, block_size=32,
                    bias=False, vocab_size=vocab, dropout=0.0)
  torch.manual_seed(0)
  model = nanogpt_torch.GPT(nanogpt_torch.Config(**model_args))
  optimizer = model.configure_optimizers(
      config.weight_decay, config.learning_rate, (config.beta1, config.beta2),
      "cpu")
  rng = np.random.default_rng(0)

  def batch():
    x = rng.integers(0, vocab, size=(8, 32))
    return x, np.roll(x, -1, axis=1)

  def torch_iteration(it, x, y):  # nanoGPT train.py's loop body
    for group in optimizer.param_groups:
      group["lr"] = nanogpt_torch.nanogpt_lr(
          it, config.learning_rate, config.warmup_iters,
          config.lr_decay_iters, config.min_lr)
    _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

  def save(path, iter_num):
    torch.save({"model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "model_args": model_args, "iter_num": iter_num,
                "best_val_loss": torch.tensor(2.5), "config": {}}, path)

  for it in range(3):
    torch_iteration(it, *batch())
  save(ckpt_path, 3)

  ctx = mesh_lib.ShardingContext.from_config(config)
  # Only AdamW takes up its AdamW state: another config.optimizer is one
  # line, before any data or compile (it would have dropped the moments).
  lion = tiny_config(data_root, init_from="resume", init_checkpoint=ckpt_path,
                     gradient_accumulation_steps=1, optimizer="lion")
  with pytest.raises(ValueError) as error:
    families.build_task(lion, str(tmp_path / "lion"), ctx)
  assert str(error.value).startswith(
      f"config.optimizer='lion' cannot take up the AdamW state of nanoGPT "
      f"checkpoint {ckpt_path} (iter 3, ")
  assert str(error.value).endswith(
      "which config.init_from='resume' continues: set "
      "config.optimizer='adamw' to continue that run.")
  task = families.build_task(config, str(tmp_path / "run"), ctx)
  assert task.initial_best_loss == pytest.approx(2.5)
  abstract, shardings = state_lib.abstract_state(task.program.init_fn, ctx)
  state = task.initial_state(ctx, shardings)
  assert int(state.step) == 3
  step = task_lib.compile_train_step(task.program, ctx,
                                     config.global_batch_size, abstract,
                                     shardings)
  x, y = batch()
  state, _ = step(state, pipeline.to_global(
      {"x": x.astype(np.int32), "y": y.astype(np.int32)},
      task_lib.batch_shardings(task.program.batch_spec, ctx)))
  torch_iteration(3, x, y)
  save(str(tmp_path / "after.pt"), 4)
  want, _, extras = gpt_import.load_nanogpt_checkpoint(
      str(tmp_path / "after.pt"), optimizer=True)
  assert extras["adam"]["count"] == 4
  got = jax.device_get(state.params)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=2e-6)


@pytest.mark.parametrize("field, value, needle", [
    ("model.head_gather", "bogus", "config.model.head_gather"),
    ("model.residual_dtype", "float64", "config.model.residual_dtype"),
    ("loss_kernel", "bogus", "config.loss_kernel"),
    ("n_embd", 33, "config.model.n_embd=33 must be divisible"),
])
def test_a_bad_model_field_stops_before_the_data_is_prepared(
    tmp_path, field, value, needle):
  # Before: refused only once the text was prepared (and GPT-2 weights read,
  # with init_from='gpt2*').
  config = tiny_config(tmp_path / "data", **{field: value})
  config.mesh.update(data=-1, fsdp=1, model=1)
  ctx = mesh_lib.ShardingContext.from_config(config)
  with pytest.raises(ValueError, match=needle):
    families.build_task(config, str(tmp_path / "run"), ctx)
  assert not (tmp_path / "data").exists()


def test_a_damaged_token_id_deep_in_train_bin_stops_before_compiling(
    tmp_path):
  """It stopped the run only at the step whose random window first read it
  (168 steps into a shakespeare_char_cpu run), after compiling."""
  from trm.data.text import preparation  # pylint: disable=g-import-not-at-top
  config = tiny_config(tmp_path / "data")
  config.mesh.update(data=-1, fsdp=1, model=1)
  config.data.input = ""
  directory = str(tmp_path / "data" / config.dataset)
  preparation.prepare("abcdefgh \n" * 2000, directory, "char")
  path = os.path.join(directory, "train.bin")
  tokens = np.fromfile(path, np.uint16)
  tokens[len(tokens) // 2] = 60000
  tokens.tofile(path)
  ctx = mesh_lib.ShardingContext.from_config(config)
  with pytest.raises(ValueError, match=(
      rf"train\.bin holds token id 60000 at token {len(tokens) // 2}, ")):
    families.build_task(config, str(tmp_path / "run"), ctx)
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_synthetic_data_trains_with_no_dataset(tmp_path):
  # MaxText's dataset_type=synthetic: a step benchmarked on a pod with no
  # data prepared or read. Before, data.source took only 'bin' or 'tfds'.
  config = tiny_config(tmp_path / "data", **{"data.source": "synthetic",
                                             "data.input": ""})
  config.mesh.update(data=-1, fsdp=1, model=1)
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = families.build_task(config, str(tmp_path / "run"), ctx)
  assert not (tmp_path / "data").exists()
  assert config.model.vocab_size == 50304  # nanoGPT's, no meta.json
  batch = task.train_source[3]
  assert batch["x"].shape == (16, 32) and batch["x"].dtype == np.int32
  np.testing.assert_array_equal(batch["x"][:, 1:], batch["y"][:, :-1])
  assert 0 <= batch["x"].min() and batch["y"].max() < 50304
  assert len(np.unique(batch["x"])) > 400  # ids spread over the vocabulary
  np.testing.assert_array_equal(task.train_source[3]["x"], batch["x"])
  val = task.eval_source[len(task.eval_source) - 1]
  assert val["split"][0] == 1 and val["x"].shape == (8, 32)
  assert task.train_source.fingerprint() != task.eval_source.fingerprint()


def test_data_seed_moves_the_data_and_not_the_initial_weights(tmp_path):
  # Hugging Face's data_seed, MaxText's data_shuffle_seed: another data
  # order from the same initial weights. Before, config.seed drew both.
  import jax  # pylint: disable=g-import-not-at-top

  def build(**seeds):
    config = tiny_config(tmp_path / "data", **{
        "data.source": "synthetic", "data.input": "",
        "model.vocab_size": 64, "n_layer": 1, **seeds})
    config.mesh.update(data=-1, fsdp=1, model=1)
    ctx = mesh_lib.ShardingContext.from_config(config)
    return families.build_task(config, str(tmp_path / "run"), ctx)

  default, same, other = (build(), build(data_seed=1337),
                          build(data_seed=7))
  for source in ("train_source", "eval_source"):
    first = getattr(default, source)[0]["x"]
    # -1 (the default) follows config.seed=1337: the recorded runs' data.
    np.testing.assert_array_equal(getattr(same, source)[0]["x"], first)
    assert not np.array_equal(getattr(other, source)[0]["x"], first)
  moved = build(seed=5, data_seed=1337)
  np.testing.assert_array_equal(moved.train_source[0]["x"],
                                default.train_source[0]["x"])
  params = [jax.tree.leaves(jax.jit(task.program.init_fn)().params)
            for task in (default, other)]
  for a, b in zip(*params):
    np.testing.assert_array_equal(a, b)


def test_num_epochs_derives_max_iters_from_the_tokens(data_root, tmp_path):
  """config.num_epochs: max_iters (and total_steps, tied to it) become the
  batches of batch x block_size tokens that many passes over train.bin
  hold, before the schedule and the data's length read them. Before, the
  field did not exist."""
  config = tiny_config(data_root, num_epochs=0.25)
  config.mesh.update(data=-1, fsdp=1, model=1)
  task = families.build_task(config, str(tmp_path),
                             mesh_lib.ShardingContext.from_config(config))
  tokens = task.train_source.file.num_tokens
  expected = -(-tokens // (4 * 16 * 32))  # a quarter of the tokens, rounded up
  assert config.max_iters == config.total_steps == expected
  assert len(task.train_source) == expected

