"""GPT with `model.scan_layers`: one block scanned over the layers (params
`h` [n_layer, ...]). The same numbers as the unscanned model on stacked
weights, the same init, parameter count, weight-decay groups, imports,
sampling (trm.sample on a scanned workdir) and a refused layout switch."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import repo
from jax.sharding import PartitionSpec as P

from trm import families
from trm.core import config_lib
from trm.core import config_record
from trm.core import mesh as mesh_lib
from trm.core import train
from trm.families.gpt import model as gpt
from trm.families.gpt import steps as gpt_steps
from trm.nn import tpu_attention

from test_gpt_task import sample_two  # pylint: disable=g-import-not-at-top
from test_gpt_task import tiny_config  # pylint: disable=g-import-not-at-top

ROOT = repo.ROOT
RULES = config_lib.default_logical_axis_rules()
TINY = gpt.GPTConfig(block_size=16, vocab_size=64, n_layer=3, n_head=4,
                     n_embd=32)


def _scanned(cfg, **overrides):
  return dataclasses.replace(cfg, scan_layers=True, **overrides)


def _tokens(batch=2, length=12, seed=0, vocab=64):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab,
                            jnp.int32)


@functools.lru_cache(maxsize=None)
def _params(cfg=TINY, std=0.3):
  """Unscanned init params plus N(0, std) noise, so that every weight
  (LayerNorms and biases too) differs between layers and from its init."""
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"])()
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return treedef.unflatten([x + std * jax.random.normal(k, x.shape, x.dtype)
                            for k, x in zip(keys, leaves)])


def _boxed_shapes(tree):
  return jax.tree.map(lambda x: (tuple(x.value.shape), tuple(x.names)), tree,
                      is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))


def test_config_field_is_a_validated_bool():
  assert gpt.GPTConfig().scan_layers is False
  with pytest.raises(ValueError, match=r"config\.model\.scan_layers=1 "):
    gpt.GPTConfig(scan_layers=1)
  cfg = gpt.GPTConfig.from_config(dict(name="gpt", scan_layers=True))
  assert cfg.scan_layers is True


def test_scanned_layout_is_the_stacked_unscanned_layout():
  """params/h/... with a leading [n_layer] axis named 'layers' (replicated
  by the rules), exactly stack_layers of the unscanned tree."""
  scanned = gpt.abstract_params(_scanned(TINY))
  assert set(scanned) == {"wte", "wpe", "h", "ln_f"}
  assert _boxed_shapes(scanned) == _boxed_shapes(
      gpt.stack_layers(gpt.abstract_params(TINY), TINY.n_layer))
  kernel = scanned["h"]["mlp"]["c_fc"]
  assert kernel["kernel"].value.shape == (3, 32, 128)
  specs = nn.get_partition_spec(scanned)
  assert specs["h"]["mlp"]["c_fc"]["kernel"] == P("layers", "embed", "mlp")
  assert specs["h"]["ln_1"]["scale"] == P("layers", "embed")
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  shardings = mesh_lib.tree_shardings(mesh, RULES, scanned)
  assert shardings["h"]["mlp"]["c_fc"]["kernel"].spec == P(None, "fsdp",
                                                            "model")


def test_stack_and_unstack_round_trip():
  params = jax.device_get(_params())  # numpy leaves
  stacked = gpt.stack_layers(params, 3)
  assert isinstance(stacked["h"]["attn"]["c_attn"]["kernel"], np.ndarray)
  np.testing.assert_array_equal(stacked["h"]["attn"]["c_attn"]["kernel"][2],
                                params["h_2"]["attn"]["c_attn"]["kernel"])
  assert stacked["wte"] is params["wte"]
  back = gpt.unstack_layers(stacked, 3)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  # jax arrays, variables {"params": ...} and ShapeDtypeStructs.
  on_device = gpt.stack_layers({"params": _params()}, 3)["params"]
  assert isinstance(on_device["h"]["ln_2"]["scale"], jax.Array)
  jax.tree.map(np.testing.assert_array_equal, on_device, stacked)
  abstract = jax.eval_shape(lambda: _params())
  assert jax.tree.map(lambda x: x.shape, gpt.stack_layers(abstract, 3)) == (
      jax.tree.map(np.shape, stacked))
  # Boxed: the layers axis is named, and unstacking drops the name.
  boxed = gpt.abstract_params(TINY)
  assert _boxed_shapes(gpt.unstack_layers(gpt.stack_layers(boxed, 3), 3)) == (
      _boxed_shapes(boxed))
  # The wrong layout or depth is an error naming the config field.
  with pytest.raises(ValueError, match=r"config\.model\.n_layer=4"):
    gpt.stack_layers(params, 4)
  with pytest.raises(ValueError, match="unscanned layout"):
    gpt.stack_layers(stacked, 3)
  with pytest.raises(ValueError, match=r"config\.model\.n_layer=2"):
    gpt.unstack_layers(stacked, 2)
  with pytest.raises(ValueError, match="scan_layers=True"):
    gpt.unstack_layers(params, 3)


# Two cases cover each value of both options (the scanned body with and
# without remat, with and without biases); the other two pairs run with -m
# slow.
@pytest.mark.parametrize("bias, remat", [
    (True, False), (False, True),
    pytest.param(False, False, marks=pytest.mark.slow),
    pytest.param(True, True, marks=pytest.mark.slow)])
def test_scanned_forward_and_grads_equal_unscanned(bias, remat):
  """Logits and gradients of the scanned model on stacked weights equal the
  unscanned model's (dropout 0, training mode)."""
  plain = dataclasses.replace(TINY, bias=bias, remat=remat)
  scanned = _scanned(plain)
  params = _params(dataclasses.replace(TINY, bias=bias))
  idx, targets = _tokens(), _tokens(seed=1)

  def loss(cfg, p):
    logits = gpt.GPT(cfg).apply({"params": p}, idx, deterministic=False,
                                rngs={"dropout": jax.random.key(3)})
    return gpt_steps.cross_entropy(logits, targets)[0], logits

  grad = lambda cfg: jax.jit(jax.value_and_grad(
      functools.partial(loss, cfg), has_aux=True))
  (l0, logits0), g0 = grad(plain)(params)
  (l1, logits1), g1 = grad(scanned)(gpt.stack_layers(params, 3))
  np.testing.assert_allclose(logits1, logits0, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  g1 = gpt.unstack_layers(g1, 3)
  assert jax.tree.structure(g1) == jax.tree.structure(g0)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4,
                                                       atol=1e-6), g1, g0)


def test_scanned_dropout_is_static_and_remat_safe():
  """Dropout in a scanned model: a Python-bool `deterministic` under jit,
  masks reproducible per key, and remat recomputes the same masks."""
  cfg = _scanned(TINY, dropout=0.3)
  params = gpt.stack_layers(_params(), 3)
  idx = _tokens()

  def loss(cfg, p, key):
    out = gpt.GPT(cfg).apply({"params": p}, idx, deterministic=False,
                             rngs={"dropout": key})
    return jnp.mean(out ** 2)

  plain = jax.jit(jax.value_and_grad(functools.partial(loss, cfg)))
  remat = jax.jit(jax.value_and_grad(functools.partial(
      loss, dataclasses.replace(cfg, remat=True))))
  l0, g0 = plain(params, jax.random.key(0))
  l1, g1 = remat(params, jax.random.key(0))
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               g1, g0)
  assert float(plain(params, jax.random.key(1))[0]) != float(l0)
  det = jax.jit(lambda p: gpt.GPT(cfg).apply({"params": p}, idx))(params)
  assert abs(float(jnp.mean(det ** 2)) - float(l0)) > 1e-4


def test_dropout_masks_differ_between_layers():
  """Each scanned layer draws its own dropout masks: two layers with the
  same weights still drop different units of their residual branches."""
  cfg = _scanned(dataclasses.replace(TINY, n_layer=2), dropout=0.5)
  base = jax.device_get(_params())
  same = {k: v for k, v in base.items() if not k.startswith("h_")}
  same.update(h_0=base["h_0"], h_1=base["h_0"])
  # The outputs of the Dropout modules, stacked over the layers: zero
  # exactly where a unit was dropped.
  _, state = jax.jit(lambda p: gpt.GPT(cfg).apply(
      {"params": p}, _tokens(), deterministic=False,
      rngs={"dropout": jax.random.key(0)},
      capture_intermediates=lambda mdl, _: isinstance(mdl, nn.Dropout),
      mutable=["intermediates"]))(gpt.stack_layers(same, 2))
  stacks = [m for m in jax.tree.leaves(state["intermediates"]["h"])
            if m.shape[1:] == (2, 12, 32)]  # [layers, B, T, C]
  assert len(stacks) == 2  # attention's and the MLP's residual dropout
  for stack in stacks:
    assert stack.shape[0] == 2
    dropped = np.asarray(stack) == 0
    assert 0.4 < dropped.mean() < 0.6
    assert (dropped[0] != dropped[1]).mean() > 0.3


def test_init_statistics_match_the_unscanned_init():
  """Each scanned layer gets nanoGPT's init: N(0, 0.02), GPT-2's scaled
  c_proj, ones and zeros; the layers are independent draws."""
  cfg = gpt.GPTConfig(block_size=256, vocab_size=2048, n_layer=4, n_head=4,
                      n_embd=256, scan_layers=True)
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"])()
  proj = 0.02 / math.sqrt(2 * cfg.n_layer)
  h = params["h"]
  for value, std in ((h["attn"]["c_attn"]["kernel"], 0.02),
                     (h["attn"]["c_proj"]["kernel"], proj),
                     (h["mlp"]["c_fc"]["kernel"], 0.02),
                     (h["mlp"]["c_proj"]["kernel"], proj)):
    assert value.shape[0] == cfg.n_layer
    value = np.asarray(value)  # numpy: no compile per shape
    for i in range(cfg.n_layer):
      assert abs(float(np.std(value[i])) / std - 1) < 0.03
      assert abs(float(np.mean(value[i]))) < 0.05 * std
    assert not np.allclose(value[0], value[1])
  for name in ("ln_1", "ln_2"):
    np.testing.assert_array_equal(h[name]["scale"], 1.0)
    np.testing.assert_array_equal(h[name]["bias"], 0.0)
  for bias in (h["attn"]["c_attn"]["bias"], h["attn"]["c_proj"]["bias"],
               h["mlp"]["c_fc"]["bias"], h["mlp"]["c_proj"]["bias"]):
    np.testing.assert_array_equal(bias, 0.0)
  for table in (params["wte"]["embedding"], params["wpe"]["embedding"]):
    assert abs(float(np.std(np.asarray(table))) / 0.02 - 1) < 0.03


def test_num_params_is_the_same_in_both_layouts():
  cfg = gpt.GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256,
                      vocab_size=65, bias=False)
  for non_embedding in (True, False):
    counts = {scan: gpt.num_params(gpt.abstract_params(
        dataclasses.replace(cfg, scan_layers=scan)), non_embedding)
              for scan in (False, True)}
    assert counts[True] == counts[False]
  assert counts[False] == 10_646_784 + 256 * 384  # nanoGPT's 10.65M + wpe


@pytest.mark.parametrize("bias", [True, False])
def test_decay_mask_selects_the_same_tensors(bias):
  """nanoGPT's groups in both layouts: a stack of LayerNorm scales or
  biases is 2-D but not decayed; stacked kernels are."""
  cfg = dataclasses.replace(TINY, bias=bias)
  plain = nn.meta.unbox(gpt.abstract_params(cfg))
  scanned = nn.meta.unbox(gpt.abstract_params(_scanned(cfg)))
  mask = gpt_steps.decay_mask(plain)
  stacked_mask = gpt_steps.decay_mask(scanned)
  for i in range(cfg.n_layer):
    assert mask[f"h_{i}"] == stacked_mask["h"]
  assert {k: v for k, v in mask.items() if not k.startswith("h_")} == {
      k: v for k, v in stacked_mask.items() if k != "h"}
  assert stacked_mask["h"]["ln_1"]["scale"] is False
  assert stacked_mask["h"]["mlp"]["c_fc"]["kernel"] is True
  if bias:
    assert stacked_mask["h"]["attn"]["c_attn"]["bias"] is False
  # AdamW with weight decay, zero gradients: only the matrices move.
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char_cpu")
  config = config_lib.set_values(config, dict(weight_decay=0.5,
                                              grad_clip=0.0))
  tx = gpt_steps.make_optimizer(config)
  params = gpt.stack_layers(_params(cfg), cfg.n_layer)
  zeros = jax.tree.map(jnp.zeros_like, params)
  # Jitted: one compile, not one per op and parameter shape.
  updates, _ = jax.jit(lambda g, p: tx.update(g, tx.init(p), p))(zeros, params)
  assert float(jnp.abs(updates["h"]["ln_2"]["scale"]).max()) == 0.0
  assert float(jnp.abs(updates["h"]["mlp"]["c_proj"]["kernel"]).min()) > 0.0


# (10, 12) decodes through the same scanned cache: (3, 10) is slow.
@pytest.mark.parametrize("t0,steps", [
    pytest.param(3, 10, marks=pytest.mark.slow), (10, 12)])
def test_generate_and_decode_with_a_scanned_model(t0, steps):
  """Sampling a scanned model gives the unscanned model's tokens (the KV
  cache while the context fits, full forwards after it)."""
  params = _params()
  stacked = gpt.stack_layers(params, 3)
  scanned = _scanned(TINY)
  prompt = _tokens(length=t0, seed=t0)
  want = gpt.generate(gpt.GPT(TINY), params, prompt, steps,
                      jax.random.key(0), temperature=0.0)
  got = gpt.generate(gpt.GPT(scanned), stacked, prompt, steps,
                     jax.random.key(0), temperature=0.0)
  np.testing.assert_array_equal(got, want)
  assert len(np.unique(np.asarray(want)[:, t0:])) > 2
  sampled = [gpt.generate(gpt.GPT(cfg), p, prompt, steps, jax.random.key(4),
                          temperature=0.9, top_k=5)
             for cfg, p in ((TINY, params), (scanned, stacked))]
  np.testing.assert_array_equal(sampled[1], sampled[0])
  # GPT.decode on the scanned model (stacked weights) equals its forward.
  idx = _tokens(length=t0)
  logits, cache = jax.jit(lambda p: gpt.GPT(scanned).apply(
      {"params": p}, idx, gpt.init_cache(scanned, 2, 16), 0,
      method=gpt.GPT.decode))(stacked)
  assert cache["k"].shape == (3, 2, 16, 4, 8)
  forward = jax.jit(lambda p: gpt.GPT(scanned).apply({"params": p}, idx))
  np.testing.assert_allclose(logits, forward(stacked), atol=1e-5)


def test_generate_unstacks_a_sharded_scanned_model_in_one_call(monkeypatch):
  """Called eagerly on weights sharded over 8 devices, each layer's slices
  would be a program of their own on every device (XLA:CPU takes 32 a
  device in flight): generate unstacks them inside one compiled call."""
  from trm.nn import layer_stack  # pylint: disable=g-import-not-at-top
  traced = []
  plain = layer_stack._layer  # pylint: disable=protected-access

  def spy(leaf, i):
    traced.append(isinstance(leaf, jax.core.Tracer))
    return plain(leaf, i)

  monkeypatch.setattr(layer_stack, "_layer", spy)
  gpt._unstacked_layers.clear_cache()  # pylint: disable=protected-access
  mesh = jax.make_mesh((8,), ("fsdp",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  params = _params()
  stacked = jax.tree.map(
      lambda x: jax.device_put(x, jax.sharding.NamedSharding(
          mesh, P(*(None,) * (x.ndim - 1), "fsdp")
          if x.shape[-1] % 8 == 0 else P())),
      gpt.stack_layers(params, 3))
  prompt = _tokens(length=4)
  got = gpt.generate(gpt.GPT(_scanned(TINY)), stacked, prompt, 3,
                     jax.random.key(0), temperature=0.0)
  assert traced and all(traced)
  want = gpt.generate(gpt.GPT(TINY), params, prompt, 3, jax.random.key(0),
                      temperature=0.0)
  np.testing.assert_array_equal(got, want)


# ----------------------------------------------------- the training task


def _with_scan(config, scan_layers: bool):
  with config.unlocked():
    config.model.scan_layers = scan_layers
  return config


def _initial_state(config, workdir):
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  ctx = mesh_lib.ShardingContext.from_config(config)
  task = families.build_task(config, str(workdir), ctx)
  _, shardings = state_lib.abstract_state(task.program.init_fn, ctx)
  return task, ctx, jax.device_get(task.initial_state(ctx, shardings))


def test_init_from_a_nanogpt_checkpoint_stacks_weights_and_moments(
    tmp_path_factory):
  """init_from='resume' with nanoGPT's ckpt.pt into a scanned model: the
  weights and AdamW moments are the unscanned model's, stacked, and the
  logits are the same."""
  torch = pytest.importorskip("torch")
  sys.path.insert(0, os.path.join(ROOT, "benchmarks", "reference"))
  import nanogpt_torch  # pylint: disable=g-import-not-at-top
  from trm.data.text import windows as text  # pylint: disable=g-import-not-at-top

  tmp = tmp_path_factory.mktemp("import")
  data_root = tmp_path_factory.mktemp("data")
  ckpt = str(tmp / "ckpt.pt")
  configs = {scan: _with_scan(tiny_config(
      data_root, init_from="resume", init_checkpoint=ckpt, n_layer=3,
      gradient_accumulation_steps=1, weight_decay=0.1), scan)
             for scan in (False, True)}
  vocab = text.ensure_prepared(
      os.path.join(str(data_root), configs[False].dataset),
      configs[False].data.input, "char")["vocab_size"]
  args = dict(n_layer=3, n_head=2, n_embd=32, block_size=32, bias=True,
              vocab_size=vocab, dropout=0.0)
  torch.manual_seed(0)
  model = nanogpt_torch.GPT(nanogpt_torch.Config(**args))
  optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
  x = torch.randint(0, vocab, (4, 32))
  for _ in range(2):
    _, loss = model(x, torch.roll(x, -1, 1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
  torch.save({"model": model.state_dict(), "optimizer":
              optimizer.state_dict(), "model_args": args, "iter_num": 2,
              "best_val_loss": torch.tensor(3.0), "config": {}}, ckpt)

  states = {scan: _initial_state(config, tmp / f"run{scan}")
            for scan, config in configs.items()}
  plain, scanned = states[False][2], states[True][2]
  assert int(scanned.step) == int(plain.step) == 2
  assert plain.params["h_0"]["ln_1"]["scale"].shape == (32,)
  assert scanned.params["h"]["ln_1"]["scale"].shape == (3, 32)
  jax.tree.map(np.testing.assert_array_equal, scanned.params,
               gpt.stack_layers(plain.params, 3))

  def adam(state):
    is_adam = lambda node: isinstance(node, optax.ScaleByAdamState)
    return next(node for node in jax.tree.leaves(state.opt_state,
                                                 is_leaf=is_adam)
                if is_adam(node))

  for moment in ("mu", "nu"):
    ours = getattr(adam(scanned), moment)
    theirs = getattr(adam(plain), moment)
    assert float(np.abs(theirs["h_2"]["mlp"]["c_fc"]["kernel"]).max()) > 0
    jax.tree.map(np.testing.assert_array_equal, ours,
                 gpt.stack_layers(theirs, 3))
  idx = np.asarray(_tokens(batch=2, length=32, vocab=vocab))
  logits = {scan: np.asarray(jax.jit(task.program.model.apply)(
      {"params": state.params}, idx))
            for scan, (task, _, state) in states.items()}
  np.testing.assert_allclose(logits[True], logits[False], rtol=1e-5,
                             atol=1e-5)


def test_init_from_gpt2_stacks_its_weights(tmp_path_factory):
  pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tmp = tmp_path_factory.mktemp("gpt2")
  data_root = tmp_path_factory.mktemp("data")
  hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
      vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4,
      activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
      attn_pdrop=0.0)).eval()
  hf.save_pretrained(tmp / "hf", safe_serialization=True)
  states = {scan: _initial_state(_with_scan(tiny_config(
      data_root, init_from="gpt2", init_checkpoint=str(tmp / "hf")), scan),
                                 tmp / f"run{scan}")
            for scan in (False, True)}
  plain, scanned = states[False][2].params, states[True][2].params
  jax.tree.map(np.testing.assert_array_equal, scanned,
               gpt.stack_layers(plain, 2))
  idx = np.asarray(_tokens(batch=2, length=32, vocab=128))
  logits = [np.asarray(jax.jit(states[scan][0].program.model.apply)(
      {"params": states[scan][2].params}, idx)) for scan in (False, True)]
  np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)


_SHORT = dict(max_iters=4, lr_decay_iters=4, warmup_iters=2, eval_interval=4,
              eval_iters=1, always_save_checkpoint=True)


@pytest.fixture(scope="module")
def scanned_run(tmp_path_factory):
  """A 4-step scanned run with a checkpoint."""
  data_root = tmp_path_factory.mktemp("data")
  workdir = str(tmp_path_factory.mktemp("scanned"))
  config = _with_scan(tiny_config(data_root, **_SHORT), True)
  state, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert state.params["h"]["attn"]["c_attn"]["kernel"].shape == (2, 32, 96)
  return workdir, data_root


# slow: test_generate_and_decode_with_a_scanned_model samples a scanned model.
@pytest.mark.slow
def test_sample_from_a_scanned_workdir(scanned_run):
  workdir, _ = scanned_run
  sample_two(workdir)


def test_sample_loads_the_stacked_checkpoint(scanned_run):
  """trm.sample's loader restores the stacked params; they sample as the
  unscanned model on the unstacked weights."""
  from trm import sample  # pylint: disable=g-import-not-at-top
  workdir, _ = scanned_run
  ctx = mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=1),
                         devices=jax.devices()[:1]), RULES)
  cfg, params, _, _ = sample.load_model("resume", workdir, None, ctx)
  assert cfg.scan_layers and params["h"]["ln_1"]["scale"].shape == (2, 32)
  prompt = np.ones((2, 3), np.int32)
  with ctx:
    got = gpt.generate(gpt.GPT(cfg), params, prompt, 8, jax.random.key(0),
                       temperature=0.8, top_k=5)
    want = gpt.generate(gpt.GPT(dataclasses.replace(cfg, scan_layers=False)),
                        gpt.unstack_layers(params, 2), prompt, 8,
                        jax.random.key(0), temperature=0.8, top_k=5)
  np.testing.assert_array_equal(got, want)


def test_a_scanned_run_resumes_but_not_unscanned(scanned_run):
  workdir, data_root = scanned_run
  config = _with_scan(tiny_config(data_root, **_SHORT), False)
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.model\.scan_layers: True -> False"):
    train.train_and_evaluate(config, workdir, families.build_task)
  config.allow_config_change = True  # cannot accept a layout change
  with pytest.raises(config_record.ConfigChangedError,
                     match=r"config\.model\.scan_layers"):
    train.train_and_evaluate(config, workdir, families.build_task)
  _with_scan(config, True)
  config.allow_config_change = False
  state, _ = train.train_and_evaluate(config, workdir, families.build_task)
  assert int(state.step) == 4  # resumed the finished run


def test_a_run_recorded_before_scan_layers_resumes(tmp_path_factory):
  """A run whose config.json predates model.scan_layers resumes with the
  default (False): the layout it was trained in."""
  data_root = tmp_path_factory.mktemp("data")
  workdir = tmp_path_factory.mktemp("old")
  config = _with_scan(tiny_config(data_root, **_SHORT), False)
  train.train_and_evaluate(config, str(workdir), families.build_task)
  record = json.loads((workdir / "config.json").read_text())
  del record["model"]["scan_layers"]
  (workdir / "config.json").write_text(json.dumps(record))
  longer = dict(_SHORT, max_iters=6)  # longer is harmless
  config = _with_scan(tiny_config(data_root, **longer), False)
  state, _ = train.train_and_evaluate(config, str(workdir),
                                      families.build_task)
  assert int(state.step) == 6 and "h_1" in state.params
  history = (workdir / config_record.HISTORY).read_text()
  assert "scan_layers" not in history and "max_iters" in history


# ---------------------------------------------------------- residual dtype


def test_residual_dtype_is_validated():
  with pytest.raises(ValueError, match="config.model.residual_dtype"):
    dataclasses.replace(TINY, residual_dtype="int8")


def test_head_gather_is_validated():
  with pytest.raises(ValueError, match=r"config.model.head_gather='bf16' "
                     r"must be one of \('param', 'compute'\)"):
    dataclasses.replace(TINY, head_gather="bf16")


@pytest.mark.parametrize("scan", [False, True])
def test_a_bfloat16_residual_stream_carries_bfloat16_between_blocks(scan):
  """MaxText's numerics: the blocks pass bfloat16 on, so a remat'd layer
  saves half the bytes; the logits stay close to the float32 stream's."""
  cfg = dataclasses.replace(TINY, dtype="bfloat16", scan_layers=scan)
  low = dataclasses.replace(cfg, residual_dtype="bfloat16")
  params = _params()
  if scan:
    params = gpt.stack_layers(params, TINY.n_layer)
  tokens = _tokens()
  ref = jax.jit(gpt.GPT(cfg).apply)({"params": params}, tokens)
  out = jax.jit(gpt.GPT(low).apply)({"params": params}, tokens)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref, atol=0.15, rtol=0.05)
  assert not np.array_equal(out, ref)


# -m slow (two TPU compiles, about a minute): the bfloat16 residual path is
# run by test_a_bfloat16_residual_stream_carries_bfloat16_between_blocks in
# the default run; this one checks its memory effect on a v4 chip.
@pytest.mark.slow
def test_a_bfloat16_residual_stream_halves_what_remat_saves():
  """With remat each scanned layer saves its input: [B, T, C] per layer in
  the residual dtype, so the gradient's temporaries shrink by half of
  that. Compiled for one TPU v4 chip (libtpu's compile-only devices): XLA
  for CPU computes bfloat16 in float32 buffers."""
  from trm.core import topology  # pylint: disable=g-import-not-at-top
  device = topology.topology_devices(topology.parse_topology("v4-8"), 1)[0]
  # Large enough that the saved activations live in HBM, not on chip.
  sizes = dict(block_size=512, vocab_size=64, n_layer=4, n_head=8,
               n_embd=512, dtype="bfloat16", remat=True, scan_layers=True)
  one_chip = jax.sharding.SingleDeviceSharding(device)
  tokens = jax.ShapeDtypeStruct((16, 512), jnp.int32, sharding=one_chip)

  def temporaries(residual):
    model = gpt.GPT(gpt.GPTConfig(residual_dtype=residual, **sizes))
    params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one_chip),
        nn.meta.unbox(jax.eval_shape(lambda: model.init(
            jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"]))
    loss = lambda p, t: model.apply({"params": p}, t).mean()  # noqa: E731
    compiled = jax.jit(jax.grad(loss)).lower(params, tokens).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  saved_f32 = 4 * 16 * 512 * 512 * 4   # layers x B x T x C x 4 bytes
  assert temporaries("float32") - temporaries("bfloat16") >= 0.45 * saved_f32


# ---------------------------------------------------------- splash attention


def test_splash_attention_is_causal_attention():
  """model.attention='splash' (here its interpreted twin, on CPU): the
  Pallas kernel gives the dot path's logits and gradients."""
  cfg = gpt.GPTConfig(block_size=128, vocab_size=64, n_layer=2, n_head=2,
                      n_embd=64)
  splash = dataclasses.replace(cfg, attention="splash_interpret")
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"])()
  tokens = _tokens(batch=2, length=128)

  def loss(model):
    return lambda p: model.apply({"params": p}, tokens).mean()

  # Jitted: the interpreted kernel op by op is far slower to run.
  ref, ref_grads = jax.jit(jax.value_and_grad(loss(gpt.GPT(cfg))))(params)
  out, grads = jax.jit(jax.value_and_grad(loss(gpt.GPT(splash))))(params)
  np.testing.assert_allclose(out, ref, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-3)
  # Position 0 sees only itself: changing a later token leaves its logits.
  forward = jax.jit(lambda t: gpt.GPT(splash).apply({"params": params}, t))
  logits = forward(tokens)
  changed = forward(tokens.at[:, 5].set((tokens[:, 5] + 1) % 64))
  np.testing.assert_array_equal(logits[:, :5], changed[:, :5])
  assert not np.allclose(logits[:, 5:], changed[:, 5:])


def test_splash_block_sets_the_kernels_tile(monkeypatch):
  """config.model.splash_block: the kernel runs in that tile (here 128 of
  a 256 window, where the default would take 256) and still gives the dot
  path's logits."""
  cfg = gpt.GPTConfig(block_size=256, vocab_size=64, n_layer=1, n_head=2,
                      n_embd=64)
  tiles = []
  sizes = tpu_attention.splash.BlockSizes

  def recording(**kw):
    tiles.append(kw["block_q"])
    return sizes(**kw)
  monkeypatch.setattr(tpu_attention.splash, "BlockSizes", recording)
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"])()
  tokens = _tokens(batch=1, length=256)
  ref = jax.jit(lambda p: gpt.GPT(cfg).apply({"params": p}, tokens))(params)
  for block, tile in ((0, 256), (128, 128)):
    model = gpt.GPT(dataclasses.replace(
        cfg, attention="splash_interpret", splash_block=block))
    out = jax.jit(lambda p, m=model: m.apply({"params": p}, tokens))(params)
    assert tiles[-1] == tile
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("fields, match", [
    (dict(attention="flash"), "config.model.attention='flash'"),
    (dict(attention="splash", dropout=0.1, block_size=128),
     "config.model.dropout=0.0"),
    (dict(attention="splash"), "block_size to be a multiple of 128"),
    (dict(attention="splash", block_size=512, splash_block=100),
     "splash_block=100 must be a multiple of 128"),
    (dict(attention="splash", block_size=512, splash_block=384),
     "divides the sequence length 512"),
    (dict(attention="splash", block_size=512, splash_block=-128),
     "splash_block=-128 must be 0 or a positive multiple of 128"),
    (dict(splash_block=True), "splash_block=True must be 0 or a positive"),
])
def test_bad_attention_settings_name_the_field(fields, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(TINY, **fields)
