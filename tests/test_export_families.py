"""trm.export for GPT and TRM runs: GPT to a Hugging Face GPT-2 directory
(read by transformers' GPT2LMHeadModel) or nanoGPT's ckpt.pt (loaded
strictly by nanoGPT's GPT, our port of it), TRM to upstream's state_dict
(`step_<N>`, the EMA weights as upstream's pretrain.py saves them). Each
export's model computes what ours does on the same tokens."""
import dataclasses
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from etils import epath

import cli_batch
import repo
from test_gpt_task import tiny_config as gpt_tiny_config
from test_train import tiny_config as trm_tiny_config
from trm import families
from trm.core import checkpoint as ckpt_lib
from trm.core import config_record
from trm.core import mesh as mesh_lib
from trm.core import pipeline
from trm.core import state as state_lib
from trm.core import weights_io
from trm.families.gpt import gpt_import
from trm.families.gpt import model as gpt
from trm.families.trm import task as puzzle
from trm.families.trm import torch_import

# The sizes of the GPT the tests save, as command-line overrides of
# configs/gpt.py:shakespeare_char_cpu (test_gpt_task's tiny_config).
_GPT_FLAGS = ["--config.n_layer=2", "--config.n_head=2", "--config.n_embd=32",
              "--config.block_size=32", "--config.bias=True"]


def _perturbed(tree, seed):
  """`tree` plus noise: biases and norms leave their init (0, 1), so a
  mapping that dropped or swapped them would show."""
  leaves, treedef = jax.tree.flatten(tree)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(treedef, [
      x + 0.1 * jax.random.normal(k, x.shape, x.dtype)
      for x, k in zip(leaves, keys)])


def _adam_node(opt_state):
  import optax  # pylint: disable=g-import-not-at-top
  return next(x for x in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
              if isinstance(x, optax.ScaleByAdamState))


def _stepped_adam(opt_state):
  """AdamW's state as after 7 updates: moments that differ per tensor (the
  second ones positive)."""
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top
  node = _adam_node(opt_state)
  return gpt_steps.with_adam_state(opt_state, 7, {
      "mu": _perturbed(node.mu, 1),
      "nu": jax.tree.map(jnp.abs, _perturbed(node.nu, 2)), "count": 7})


def _save(config, workdir, step, edit):
  """A checkpoint of `edit(initial state)` at `step` and the run's
  config.json, as the loop writes them, compiling no train step."""
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = families.build_task(config, workdir, ctx)
  _, shardings = state_lib.abstract_state(task.program.init_fn, ctx)
  state = edit(state_lib.init_state(task.program.init_fn, ctx, shardings))
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"),
                                  max_to_keep=3)
  ckpt_lib.save(manager, step, state, pipeline.grain_iterator(
      task.train_source))
  manager.wait_until_finished()
  manager.close()
  config_record.record(config, epath.Path(workdir), {}, None)
  return state


def _export(*flags, check=True, server=None):
  """`python -m trm.export *flags`; from `server` (`export_cli`) when
  given: a fork of a process that has imported the tool's modules."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  if server is None:
    result = subprocess.run(
        [sys.executable, "-m", "trm.export", *flags], cwd=repo.ROOT,
        capture_output=True, text=True, timeout=300, env=env)
  else:
    result = server.run(flags, cwd=repo.ROOT, timeout=300, env=env)
  if check:
    assert result.returncode == 0, result.stderr[-3000:]
  return result


# `python -m trm.export` forked from one process that has imported what the
# tool imports (tests/cli_batch.py; none of these modules defines a flag):
# a start-up of jax, flax, torch and the families' export code per run
# less. test_gpt_to_hugging_face_computes_our_logits and the torch-less
# run start the real entry point.
export_cli = cli_batch.serve(
    "trm.export", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=("trm.core.cli", "trm.core.distributed", "trm.core.processes",
             "trm.core.mesh", "trm.core.weights_io",
             "trm.families.gpt.gpt_export", "trm.families.gpt.gpt_import",
             "trm.families.gpt.model", "trm.families.gpt.steps",
             "trm.families.trm.torch_import", "torch"))


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("gpt_export")
  config = gpt_tiny_config(root / "data", bias=True)
  workdir = str(root / "run")
  state = _save(config, workdir, 7, lambda s: s.replace(
      params=_perturbed(s.params, 0), opt_state=_stepped_adam(s.opt_state)))
  params = jax.tree.map(np.asarray, jax.device_get(nn.meta.unbox(
      state.params)))
  flags = [f"--config=configs/gpt.py:shakespeare_char_cpu",
           f"--config.data_root={root / 'data'}", *_GPT_FLAGS,
           f"--checkpoint={workdir}"]
  return gpt.GPTConfig.from_config(config.model), params, flags, root, state


def _tokens(cfg, n=24):
  return np.random.default_rng(1).integers(0, cfg.vocab_size, (2, n))


def _our_logits(cfg, params, tokens):
  return np.asarray(gpt.GPT(cfg).apply({"params": params},
                                       jnp.asarray(tokens)))


def test_gpt_to_hugging_face_computes_our_logits(gpt_run):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  cfg, params, flags, root, _ = gpt_run
  out = root / "hf"
  result = _export(*flags, f"--out={out}")
  assert "model.safetensors, config.json" in result.stdout
  # Reading a step's shapes logged Orbax's "Metadata file does not exist"
  # (a Checkpointer looks for a step's metadata inside the item) each time.
  assert "Metadata file does not exist" not in result.stderr
  read, args = gpt_import.load_hf_gpt2(str(out))  # our reader: every tensor
  assert args["vocab_size"] == cfg.vocab_size and args["block_size"] == 32
  jax.tree.map(np.testing.assert_array_equal, read, params)
  model = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
  tokens = _tokens(cfg)
  with torch.no_grad():
    theirs = model(torch.from_numpy(tokens)).logits.numpy()
  np.testing.assert_allclose(theirs, _our_logits(cfg, params, tokens),
                             rtol=1e-4, atol=1e-4)


def test_a_float16_gpt_export_that_overflows_names_the_tensor(gpt_run,
                                                              tmp_path):
  """A weight above float16's 65504 was written as Inf (numpy's warning
  only), and GPT's loaders took it."""
  from trm.families.gpt import gpt_export  # pylint: disable=g-import-not-at-top
  cfg, params, _, _, _ = gpt_run
  params = jax.tree.map(np.array, params)
  params["wte"]["embedding"][3, 4] = -7e4
  with pytest.raises(weights_io.CheckpointError,
                     match=r"Tensor 'wte.weight' has a weight of magnitude "
                     r"70000, above float16's largest value 65504.* bfloat16 "
                     "or float32"):
    gpt_export.export_hf_gpt2(params, cfg, str(tmp_path), dtype="float16")


@pytest.fixture(scope="module")
def nanogpt_export(gpt_run, export_cli):
  """The run as nanoGPT's ckpt.pt, exported once for the two tests below.
  --config's grad_clip and betas are not the run's: they shape no weight,
  and the export takes the run's own (config.json); given or not, the
  same file is written."""
  pytest.importorskip("torch")
  _, _, flags, root, _ = gpt_run
  out = root / "nanogpt"
  _export(*flags, f"--out={out}", "--format=nanogpt", "--config.grad_clip=0",
          "--config.beta2=0.5", server=export_cli)
  return out


def test_gpt_to_nanogpt_loads_strictly_and_computes_our_logits(
    gpt_run, nanogpt_export):
  torch = pytest.importorskip("torch")
  sys.path.insert(0, os.path.join(repo.ROOT, "benchmarks", "reference"))
  import nanogpt_torch  # pylint: disable=g-import-not-at-top
  cfg, params, _, _, state = gpt_run
  out = nanogpt_export
  path = str(out / "ckpt.pt")
  checkpoint = torch.load(path, map_location="cpu", weights_only=True)
  assert checkpoint["iter_num"] == 7
  assert checkpoint["config"] == {"dataset": "shakespeare_char"}
  model = nanogpt_torch.GPT(nanogpt_torch.Config(**checkpoint["model_args"]))
  model.load_state_dict(checkpoint["model"])  # strict: every key, no other
  model.eval()
  tokens = _tokens(cfg)
  with torch.no_grad():
    theirs, _ = model(torch.from_numpy(tokens), torch.from_numpy(tokens))
  np.testing.assert_allclose(theirs.numpy(), _our_logits(cfg, params, tokens),
                             rtol=1e-4, atol=1e-4)
  read, _, extras = gpt_import.load_nanogpt_checkpoint(path, optimizer=True)
  jax.tree.map(np.testing.assert_array_equal, read, params)
  # AdamW's state comes along (before: none, so nanoGPT's train.py could
  # not resume): our reader gets the run's moments back, and torch's AdamW
  # of nanoGPT's configure_optimizers takes it and steps.
  adam = _adam_node(state.opt_state)
  assert extras["adam"]["count"] == 7 and extras["best_val_loss"] == 1e9
  for key in ("mu", "nu"):
    jax.tree.map(np.testing.assert_array_equal, extras["adam"][key],
                 jax.tree.map(np.asarray, getattr(adam, key)))
  optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu")
  optimizer.load_state_dict(checkpoint["optimizer"])
  wte = model.transformer.wte.weight
  np.testing.assert_array_equal(
      optimizer.state[wte]["exp_avg"].numpy(),
      np.asarray(adam.mu["wte"]["embedding"]))
  model.train()
  _, loss = model(torch.from_numpy(tokens), torch.from_numpy(tokens))
  loss.backward()
  optimizer.step()
  assert float(optimizer.state[wte]["step"]) == 8


def test_gpt_to_nanogpt_takes_the_runs_optimizer_settings(gpt_run,
                                                         nanogpt_export):
  """--config's grad_clip and betas shape no weight: an export given other
  ones wrote a state under the run's AdamW until the optimizer state came
  along, then was refused as another model (grad_clip=0 drops a stage of
  the state's tree). The run's config.json values are used
  (`nanogpt_export` gives --config.grad_clip=0 --config.beta2=0.5)."""
  torch = pytest.importorskip("torch")
  _, _, flags, _, _ = gpt_run
  checkpoint = torch.load(str(nanogpt_export / "ckpt.pt"),
                          map_location="cpu", weights_only=True)
  recorded = config_record.read_file(epath.Path(flags[-1].split("=", 1)[1])
                                     / "config.json")
  assert checkpoint["optimizer"]["param_groups"][0]["betas"] == (
      recorded["beta1"], recorded["beta2"])
  assert recorded["beta2"] != 0.5 and recorded["grad_clip"] > 0


@pytest.mark.parametrize("scan, consume", [(False, True), (True, True),
                                           (False, False)])
def test_a_nanogpt_export_hands_torch_writable_arrays_a_leaf_at_a_time(
    monkeypatch, tmp_path, scan, consume):
  """The embeddings, norms and biases (and their AdamW moments) reached
  torch as read-only views of the JAX arrays, and torch warned (once a
  process). With `consume` (trm.export's: its last use of the trees) each
  leaf is copied to memory numpy owns and its JAX array deleted before the
  next: the copies replace the arrays rather than doubling them. Without
  it (a caller keeping its trees) the read-only ones are copied beside
  them."""
  torch = pytest.importorskip("torch")
  from trm.families.gpt import gpt_export  # pylint: disable=g-import-not-at-top
  cfg = gpt.GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8,
                      vocab_size=32, bias=True, scan_layers=scan)
  params = nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  adam = {"mu": jax.tree.map(lambda x: x * 0.5, params),
          "nu": jax.tree.map(lambda x: x * x, params), "count": 7}
  want = jax.tree.map(np.array, (params, adam["mu"], adam["nu"]))
  given = []
  real = torch.from_numpy
  monkeypatch.setattr(torch, "from_numpy", lambda a: given.append(
      a.flags.writeable) or real(a))
  path = str(tmp_path / "ckpt.pt")
  gpt_export.export_nanogpt(
      params, cfg, path, 7, adam=adam, consume=consume,
      hyper=dict(learning_rate=1e-3, beta1=0.9, beta2=0.95,
                 weight_decay=0.1))
  assert given and all(given), given
  trees = jax.tree.leaves((params, adam["mu"], adam["nu"]))
  assert [x.is_deleted() for x in trees] == [consume] * len(trees)
  read, _, extras = gpt_import.load_nanogpt_checkpoint(path, optimizer=True)
  if scan:
    read = gpt.stack_layers(read, cfg.n_layer)
    extras["adam"] = {k: gpt.stack_layers(v, cfg.n_layer) if k != "count"
                      else v for k, v in extras["adam"].items()}
  jax.tree.map(np.testing.assert_array_equal,
               (read, extras["adam"]["mu"], extras["adam"]["nu"]), want)


@pytest.mark.parametrize("flags, message", [
    (["--format=torch"], "--format=torch: a gpt run is written as hf or "
     "nanogpt"),
    (["--format=nanogpt", "--dtype=bfloat16"], "--dtype=bfloat16: "
     "--format=nanogpt stores"),
    (["--format=nanogpt", "--tokenizer=/nonexistent"], "--tokenizer: a "
     "--format=nanogpt export holds weights only"),
    (["--config.model.mlp_size=64"], "config.model.mlp_size=64: nanoGPT and "
     "Hugging Face GPT-2 have no such field"),
    # No weight shows the head count: config.json said 4 of a 2-head run.
    (["--config.n_head=4"], "config.model.n_head=4, but the run trained "
     "with 2"),
])
def test_gpt_exports_it_cannot_write_are_one_line(gpt_run, flags, message,
                                                   export_cli):
  _, _, base, root, _ = gpt_run
  result = _export(*base, f"--out={root / 'refused'}", *flags, check=False,
                   server=export_cli)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]
  assert not (root / "refused").exists()


@pytest.fixture(scope="module")
def trm_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("trm_export")
  data = str(root / "data")
  config = trm_tiny_config(**{"data.data_dir": data})
  puzzle.prepare_data(config, data)
  workdir = str(root / "run")
  # The EMA differs from the parameters, so the test sees which is written.
  state = _save(config, workdir, 5, lambda s: s.replace(
      params=_perturbed(s.params, 1), ema_params=_perturbed(s.ema_params, 2),
      puzzle_emb=_perturbed(s.puzzle_emb, 3)))
  flags = ["--config=configs/trm_sudoku.py:cpu",
           f"--config.data.data_dir={data}", "--config.model.hidden_size=32",
           "--config.model.num_heads=2", "--config.model.puzzle_emb_ndim=32",
           "--config.model.halt_max_steps=2", "--config.model.L_layers=1",
           f"--checkpoint={workdir}"]
  return config, state, flags, root


@pytest.mark.parametrize("fmt, name", [("torch", "step_5"),
                                       ("safetensors", "model.safetensors")])
def test_trm_to_upstream_writes_the_ema_weights(trm_run, fmt, name,
                                                export_cli):
  if fmt == "torch":
    pytest.importorskip("torch")
  config, state, flags, root = trm_run
  out = root / fmt
  # --step names the step read (the run's only one here; choosing among
  # several: tests/test_evaluate.py::test_step_chooses_the_checkpoint_read).
  result = _export(*flags, f"--out={out}", f"--format={fmt}", "--step=5",
                   server=export_cli)
  assert "step 5 (EMA parameters)" in result.stdout
  assert sorted(os.listdir(out)) == sorted([name, "all_config.yaml"])
  ctx = mesh_lib.ShardingContext.from_config(config)
  model = families.build_task(config, str(root / "run"), ctx).program.model
  params, buffers, puzzle_emb = torch_import.load_torch_checkpoint(
      str(out / name), model.cfg)
  # Upstream's all_config.yaml: the arch upstream builds the model from
  # (loaded strictly by its pretrain.py on CPU, session 62) and the run's
  # own settings (its config.json's, not --config's: batch 16, not 64).
  with open(out / "all_config.yaml") as f:
    written = yaml.safe_load(f)
  assert written["arch"]["name"] == ("recursive_reasoning.trm@"
                                     "TinyRecursiveReasoningModel_ACTV1")
  for field in ("hidden_size", "num_heads", "mlp_t", "pos_encodings",
                "halt_max_steps", "forward_dtype", "rms_norm_eps"):
    assert written["arch"][field] == getattr(model.cfg, field), field
  assert (written["global_batch_size"], written["lr_warmup_steps"],
          written["data_paths"]) == (16, 5, [config.data.data_dir])
  # A reader with other settings than the weights' is refused (it loaded,
  # and computed another function).
  with pytest.raises(weights_io.CheckpointError, match="arch.rms_norm_eps"):
    torch_import.load_torch_checkpoint(str(out / name), dataclasses.replace(
        model.cfg, rms_norm_eps=0.5))
  unbox = lambda t: jax.tree.map(np.asarray, jax.device_get(
      nn.meta.unbox(t)))
  for read, saved in ((params, state.ema_params), (puzzle_emb,
                                                   state.puzzle_emb)):
    jax.tree.map(np.testing.assert_array_equal, unbox(read), unbox(saved))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(
      np.asarray(a, np.float32), np.asarray(b, np.float32)),
               unbox(buffers), unbox(state.buffers))
  assert not np.array_equal(
      jax.tree.leaves(unbox(state.params))[0],
      jax.tree.leaves(unbox(state.ema_params))[0])


def test_a_trm_config_the_run_did_not_train_with_is_refused(trm_run):
  """all_config.yaml records --config's arch: one the run did not train
  with (rms_norm_eps, H_cycles: no weight shows them) would mislabel the
  weights."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from trm import export  # pylint: disable=g-import-not-at-top
  config, _, _, root = trm_run
  export.check_run_model(str(root / "run"), dict(config.model), "trm")
  for field, value, trained in (("rms_norm_eps", 0.5, "1e-05"),
                                ("H_cycles", 5, "2")):
    with pytest.raises(app.UsageError, match=(
        f"config.model.{field}={value}, but the run trained with {trained}")):
      export.check_run_model(str(root / "run"),
                             dict(config.model, **{field: value}), "trm")
  # Compared as trm.evaluate compares them (session 105's known limit: the
  # export alone refused these): an mlp_t run's unused head count and RoPE
  # base, which no function of the model reads.
  assert config.model.mlp_t
  for field, value in (("num_heads", 7), ("rope_theta", 5.0)):
    export.check_run_model(str(root / "run"),
                           dict(config.model, **{field: value}), "trm")


def test_an_out_over_the_runs_dataset_is_refused(trm_run):
  """`--out=<the run's dataset> --overwrite` replaced the dataset the
  export read with the export (its all_config.yaml naming it)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from trm import export  # pylint: disable=g-import-not-at-top
  config, _, _, root = trm_run
  data = config.data.data_dir
  for out in (data, os.path.dirname(data)):
    with pytest.raises(app.UsageError, match="contains the run's dataset"):
      export.check_out_spares_data(out, config, str(root / "run"))
  export.check_out_spares_data(os.path.join(data, "export"), config,
                               str(root / "run"))
  assert os.path.isdir(os.path.join(data, "train"))
  # Session 77: one of its folders was replaced (`--out=DATA/train
  # --overwrite` left the split holding step_5 and all_config.yaml).
  with pytest.raises(app.UsageError, match=(
      f"is a folder of the run's dataset {data} .*Export to a new")):
    export.check_out_spares_data(os.path.join(data, "train"), config,
                                 str(root / "run"))


def test_trm_export_without_its_dataset_names_the_flag(trm_run, export_cli):
  _, _, flags, root = trm_run
  flags = [f for f in flags if not f.startswith("--config.data.data_dir")]
  result = _export(*flags, f"--out={root / 'nodata'}",
                   "--config.data.data_dir=" + str(root / "elsewhere"),
                   check=False, server=export_cli)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "--config.data.data_dir=DIR" in result.stderr
  assert not (root / "nodata").exists()


def test_a_scanned_gpt_exports_what_its_unscanned_twin_does(tmp_path):
  """`scan_layers` stacks the blocks' weights on a layers axis; the export
  writes them as the h.<i> tensors of the unscanned model."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import gpt_export  # pylint: disable=g-import-not-at-top
  cfg = gpt.GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8,
                      vocab_size=40, bias=False)
  # Jitted: one compile, not one per op of the initialisers.
  params = jax.tree.map(np.asarray, nn.meta.unbox(jax.jit(gpt.GPT(cfg).init)(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]))
  params = jax.tree.map(lambda x: x + np.random.default_rng(0).standard_normal(
      x.shape).astype(x.dtype), params)
  scanned = dataclasses.replace(cfg, scan_layers=True)
  for which, c, p in (("plain", cfg, params),
                      ("scanned", scanned, gpt.stack_layers(params, 3))):
    gpt_export.export_hf_gpt2(p, c, str(tmp_path / which))
  plain, stacked = (load_file(str(tmp_path / w / "model.safetensors"))
                    for w in ("plain", "scanned"))
  assert sorted(plain) == sorted(stacked)
  assert "transformer.h.2.ln_1.bias" in plain
  for name, value in plain.items():
    np.testing.assert_array_equal(stacked[name], value, err_msg=name)


def test_a_run_of_another_family_is_named_before_its_data(gpt_run, trm_run,
                                                          export_cli):
  """A TRM config on a GPT run asked for a puzzle dataset under the GPT's
  workdir; the run's config.json names its model first."""
  _, _, gpt_flags, root, _ = gpt_run
  _, _, trm_flags, _ = trm_run
  result = _export(*[f for f in trm_flags if not f.startswith("--checkpoint")],
                   next(f for f in gpt_flags if f.startswith("--checkpoint")),
                   f"--out={root / 'mixed'}", check=False,
                   server=export_cli)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "is a config.model.name='gpt' run (its config.json), but --config " \
         "describes 'trm'" in result.stderr
  assert not (root / "mixed").exists()


def test_a_torch_format_without_torch_stops_before_the_weights(trm_run):
  """`--format=torch` (TRM's default) writes with torch.save: without torch
  the export read every weight first, then failed."""
  _, _, flags, root = trm_run
  script = ("import runpy, sys\n"
            "sys.modules['torch'] = None  # not installed\n"
            f"sys.argv = ['trm.export', *{flags!r}, "
            f"'--out={root / 'notorch'}']\n"
            "runpy.run_module('trm.export', run_name='__main__')\n")
  result = subprocess.run([sys.executable, "-c", script], cwd=repo.ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  assert ("--format=torch is written with torch.save, and PyTorch is not "
          "installed") in result.stderr
  assert "Restoring" not in result.stderr and "checkpoint.py" not in \
      result.stderr
  assert not (root / "notorch").exists()
