"""nanoGPT's schedule, parameter groups, accumulation and estimate_loss."""
import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from trm.core import config_lib
from trm.core import state as state_lib
from trm.families.gpt import steps as gpt_steps
from trm.families.gpt import program as gpt_program


def _config(**overrides):
  c = config_lib.load_config("configs/gpt.py", "shakespeare_char_cpu")
  return config_lib.set_values(c, overrides)


def _nanogpt_lr(it, c):
  """nanoGPT train.py get_lr, written out."""
  if it < c.warmup_iters:
    return c.learning_rate * (it + 1) / (c.warmup_iters + 1)
  if it > c.lr_decay_iters:
    return c.min_lr
  ratio = (it - c.warmup_iters) / (c.lr_decay_iters - c.warmup_iters)
  coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
  return c.min_lr + coeff * (c.learning_rate - c.min_lr)


def test_schedule_is_nanogpts():
  c = _config()
  schedule = gpt_steps.learning_rate_schedule(c)
  for it in (0, 1, 50, 99, 100, 101, 1000, 1999, 2000, 2001, 5000):
    assert float(schedule(it)) == pytest.approx(_nanogpt_lr(it, c), rel=1e-5)
  assert float(schedule(0)) > 0  # non-zero at iteration 0
  constant = gpt_steps.learning_rate_schedule(_config(decay_lr=False))
  assert float(constant(1234)) == pytest.approx(1e-3)


def test_warmup_ratio_is_hugging_faces_share_of_max_iters():
  """config.warmup_ratio: warmup_iters = ceil(ratio x max_iters)."""
  by_ratio = gpt_steps.learning_rate_schedule(_config(
      warmup_ratio=0.1, warmup_iters=0, max_iters=95))
  by_iters = gpt_steps.learning_rate_schedule(_config(
      warmup_iters=10, max_iters=95))
  its = jnp.arange(0, 40)
  np.testing.assert_array_equal(by_ratio(its), by_iters(its))
  from trm.families.gpt import task as gpt_task  # pylint: disable=g-import-not-at-top
  assert gpt_task.schedule_spans_run(_config(warmup_ratio=0.1))
  assert not gpt_task.schedule_spans_run(_config())


def test_schedule_edges_nanogpt_runs_are_run(caplog):
  """lr_decay_iters < warmup_iters (warmup, then min_lr) and min_lr above
  learning_rate (a rising cosine): nanoGPT's get_lr runs both, so the
  config check lets them through and the rates are get_lr's."""
  from trm.families.gpt import task as gpt_task  # pylint: disable=g-import-not-at-top
  for overrides, said in (
      (dict(warmup_iters=10, lr_decay_iters=5), "lr_decay_iters=5 < "),
      (dict(warmup_iters=3, lr_decay_iters=12, learning_rate=1e-4,
            min_lr=1e-3), "min_lr=0.001 > config.learning_rate=0.0001")):
    c = _config(**overrides)
    caplog.clear()
    with caplog.at_level("WARNING"):
      gpt_task.check_config(c)
    assert said in caplog.text
    schedule = gpt_steps.learning_rate_schedule(c)
    for it in range(20):
      assert float(schedule(it)) == pytest.approx(_nanogpt_lr(it, c),
                                                  rel=1e-5)


@pytest.mark.parametrize("dataset", ["", " ", ".", "a/..", "../x",
                                     "/tmp/x", "a/../../x"])
def test_a_dataset_outside_data_root_is_refused(dataset):
  """data_root/<dataset> is where prepared files are written: an empty
  name wrote them into data_root itself, '../x' outside it."""
  from trm.families.gpt import task as gpt_task  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"config\.dataset=.* must name a "
                     r"directory inside config\.data_root"):
    gpt_task.check_config(_config(dataset=dataset))


def test_a_nested_dataset_name_is_taken():
  from trm.families.gpt import task as gpt_task  # pylint: disable=g-import-not-at-top
  gpt_task.check_config(_config(dataset="owt/gpt2"))


def test_weight_decay_only_on_matrices():
  params = {"wte": {"embedding": jnp.ones((5, 4))},
            "ln_f": {"scale": jnp.ones(4), "bias": jnp.zeros(4)},
            "c_fc": {"kernel": jnp.ones((4, 8)), "bias": jnp.zeros(8)}}
  mask = gpt_steps.decay_mask(params)
  assert mask == {"wte": {"embedding": True},
                  "ln_f": {"scale": False, "bias": False},
                  "c_fc": {"kernel": True, "bias": False}}
  # The decayed update of a 1-D parameter with zero gradient stays zero.
  tx = gpt_steps.make_optimizer(_config(weight_decay=0.5, grad_clip=0.0))
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(lambda g, p: tx.update(g, tx.init(p), p))(grads, params)
  assert float(jnp.abs(updates["ln_f"]["scale"]).max()) == 0.0
  assert float(jnp.abs(updates["c_fc"]["kernel"]).max()) > 0.0


def test_optimizer_matches_torch_adamw():
  torch = pytest.importorskip("torch")
  c = _config(weight_decay=0.1, grad_clip=1.0, warmup_iters=2,
              lr_decay_iters=10, learning_rate=1e-2, min_lr=1e-3)
  rng = np.random.default_rng(0)
  w = rng.normal(size=(3, 4)).astype(np.float32)
  b = rng.normal(size=(4,)).astype(np.float32)
  grads = [(rng.normal(size=(3, 4)).astype(np.float32) * 3,
            rng.normal(size=(4,)).astype(np.float32)) for _ in range(4)]
  tw, tb = torch.tensor(w, requires_grad=True), torch.tensor(b,
                                                             requires_grad=True)
  opt = torch.optim.AdamW([{"params": [tw], "weight_decay": c.weight_decay},
                           {"params": [tb], "weight_decay": 0.0}],
                          lr=1.0, betas=(c.beta1, c.beta2))
  tx = gpt_steps.make_optimizer(c)
  params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
  opt_state = tx.init(params)
  update = jax.jit(tx.update)  # one compile, not one per op
  for it, (gw, gb) in enumerate(grads):
    for group in opt.param_groups:
      group["lr"] = _nanogpt_lr(it, c)
    tw.grad, tb.grad = torch.tensor(gw), torch.tensor(gb)
    torch.nn.utils.clip_grad_norm_([tw, tb], c.grad_clip)
    opt.step()
    updates, opt_state = update({"w": jnp.asarray(gw), "b": jnp.asarray(gb)},
                                opt_state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(params["w"], tw.detach().numpy(), atol=1e-6)
  np.testing.assert_allclose(params["b"], tb.detach().numpy(), atol=1e-6)


def _small_params():
  rng = np.random.default_rng(0)
  return {"c_fc": {"kernel": jnp.asarray(rng.normal(size=(4, 6)),
                                         jnp.float32),
                   "bias": jnp.asarray(rng.normal(size=(6,)), jnp.float32)}}


def _updates(tx, params, steps=2):
  """(state, [updates]) of `steps` jitted updates of `tx` from init."""
  def run(params):
    state, out = tx.init(params), []
    for k in range(steps):
      grads = jax.tree.map(lambda p, k=k: jnp.cos(p * (k + 1)), params)
      updates, state = tx.update(grads, state, params)
      params = optax.apply_updates(params, updates)
      out.append(updates)
    return state, out
  return jax.jit(run)(params)


def test_default_optimizer_is_nanogpts_adamw_as_before():
  """config.optimizer='adamw' (the default), and a config file from before
  the field, build the step every recorded run trained with: the same
  state tree and, bit for bit, the same updates as the clipped AdamW with
  nanoGPT's decay groups written out."""
  c = _config(weight_decay=0.1, grad_clip=1.0, warmup_iters=2)
  old_file = _config(weight_decay=0.1, grad_clip=1.0, warmup_iters=2)
  with old_file.unlocked():
    del old_file["optimizer"]
  before = optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adamw(gpt_steps.learning_rate_schedule(c), b1=c.beta1,
                  b2=c.beta2, eps=1e-8, weight_decay=0.1,
                  mask=gpt_steps.decay_mask))
  params = _small_params()
  want = _updates(before, params)
  for config in (c, old_file):
    got = _updates(gpt_steps.make_optimizer(config), params)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


def test_a_skipped_step_leaves_every_optimizers_state_but_the_schedule():
  """train_step's branch for a non-finite step (`advance_schedule`), after
  one update: each choice's moments and counts stay as they were, and its
  one schedule count (what the `lr` metric reads, nanoGPT's iteration)
  moves on. (All choices in one program: one compile.)"""
  from trm.core import optimizers  # pylint: disable=g-import-not-at-top
  txs = {name: gpt_steps.make_optimizer(_config(
      optimizer=name, grad_clip=1.0, warmup_iters=3))
         for name in optimizers.CHOICES}

  def run(params):
    grads = jax.tree.map(jnp.cos, params)
    states = {name: tx.update(grads, tx.init(params), params)[1]
              for name, tx in txs.items()}
    return states, {name: gpt_steps.advance_schedule(state)
                    for name, state in states.items()}

  def rest(opt_state):  # every leaf but the schedule's count
    kind = optax.ScaleByScheduleState
    return [x for x in jax.tree.leaves(
        opt_state, is_leaf=lambda n: isinstance(n, kind))
            if not isinstance(x, kind)]

  states, skipped = jax.jit(run)(_small_params())
  schedule = gpt_steps.learning_rate_schedule(_config(warmup_iters=3))
  for name in optimizers.CHOICES:
    assert _schedule_counts(states[name]) == [1], name
    assert _schedule_counts(skipped[name]) == [2], name
    # Moments (and counts) besides the schedule.
    assert len(rest(skipped[name])) == len(rest(states[name])) > 1, name
    for a, b in zip(rest(skipped[name]), rest(states[name])):
      np.testing.assert_array_equal(a, b)
    assert float(state_lib.learning_rate(schedule, skipped[name]).value) == (
        pytest.approx(float(schedule(2)))), name


def _tiny(accum, batch_size, **overrides):
  c = _config(n_layer=2, n_head=2, n_embd=16, block_size=8,
              gradient_accumulation_steps=accum, batch_size=batch_size,
              grad_clip=0.0, **overrides)
  with c.unlocked():
    c.model.vocab_size = 11
    c.seed = 0
  program = gpt_program.build(c, None)
  model = program.model
  tx = gpt_steps.make_optimizer(c)
  # Jitted: one compile, not one per op of the init.
  state = jax.jit(program.init_fn)()
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.meta.unbox(state), model, tx


def test_gradient_accumulation_equals_one_big_batch():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 11, size=(8, 8)).astype(np.int32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray((x + 1) % 11)}
  results = []
  for accum, micro in ((1, 8), (4, 2)):
    state, model, tx = _tiny(accum, micro)
    new_state, metrics = jax.jit(
        lambda s, b, model=model, tx=tx, accum=accum: gpt_steps.train_step(
            s, b, model=model, tx=tx, accum_steps=accum))(state, batch)
    results.append((new_state.params, float(metrics["loss"].compute())))
    assert "z_loss" not in metrics  # logged only with a z-loss
  (p1, l1), (p2, l2) = results
  assert l1 == pytest.approx(l2, rel=1e-5)
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _one_iteration(state, batch, model, tx, accum, **options):
  """(new params, loss, gradient norm) of one jitted train step."""
  new_state, metrics = jax.jit(
      lambda s, b: gpt_steps.train_step(s, b, model=model, tx=tx,
                                        accum_steps=accum, **options))(
                                            state, batch)
  return (new_state.params, float(metrics["loss"].compute()),
          float(metrics["grad_norm"].compute()))


def test_bfloat16_accumulation_is_float32_parameters_gradients():
  """cast_once (GPUs): the kernels cast to bf16 once per iteration
  (`matmul_weights_in`) and the head's table made once: the
  iteration's gradient is still the mean of each micro-batch's gradient
  with respect to the float32 parameters (which the layers cast at use),
  and the update the same."""
  rng = np.random.default_rng(4)
  x = rng.integers(0, 11, size=(6, 8)).astype(np.int32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray((x + 2) % 11)}
  state, model, tx = _tiny(3, 2, dtype="bfloat16", dropout=0.0)
  cast = jax.jit(lambda p: gpt_steps.matmul_weights_in(p, jnp.bfloat16))(
      state.params)
  kinds = {jax.tree_util.keystr(k): v.dtype
           for k, v in jax.tree_util.tree_leaves_with_path(cast)}
  assert {d for k, d in kinds.items() if k.endswith("['kernel']")} == {
      jnp.dtype(jnp.bfloat16)}
  assert {d for k, d in kinds.items() if not k.endswith("['kernel']")} == {
      jnp.dtype(jnp.float32)}

  def loss(params, x, y):
    return gpt_steps.cross_entropy(model.apply({"params": params}, x), y)[0]

  def reference(params, opt_state, x, y):  # jitted: one compile
    grads = jax.tree.map(jnp.zeros_like, params)
    for k in range(3):  # micro-batch k is rows k, k + 3 (train_step's split)
      g = jax.grad(loss)(params, x[k::3], y[k::3])
      grads = jax.tree.map(lambda a, b: a + b / 3, grads, g)
    updates, _ = tx.update(grads, opt_state, params)
    return optax.tree.norm(grads), optax.apply_updates(params, updates)

  norm, want = jax.jit(reference)(state.params, state.opt_state, batch["x"],
                                  batch["y"])
  new_state, metrics = jax.jit(lambda s, b: gpt_steps.train_step(
      s, b, model=model, tx=tx, accum_steps=3, cast_once=True))(state, batch)
  assert float(metrics["grad_norm"].compute()) == pytest.approx(
      float(norm), rel=1e-6)
  for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("platform,cast_once", [
    ("gpu", True), ("cuda", True), ("tpu", False), ("cpu", False)])
def test_weights_are_cast_once_on_gpus_only(platform, cast_once):
  """program.build passes the mesh's platform on as train_step's cast_once
  (no context, as in trm.aot's and the tests' builds: in the loop)."""
  import types  # pylint: disable=g-import-not-at-top
  c = _config()
  ctx = types.SimpleNamespace(platform=platform)
  program = gpt_program.build(c, ctx, {"vocab_size": 11})
  assert program.train_step.keywords["cast_once"] is cast_once
  assert not gpt_program.build(c, None, {"vocab_size": 11}
                               ).train_step.keywords["cast_once"]


# One code path (a scan over chunks): 3 pads the positions, 8 is one chunk
# without padding; 4 (two chunks, no padding) runs with -m slow.
@pytest.mark.parametrize("chunk", [
    3, pytest.param(4, marks=pytest.mark.slow), 8])
def test_chunked_loss_equals_the_whole_logits_loss(chunk):
  """config.loss_chunk_size: the same loss and update, the [B, T, V]
  logits made a chunk at a time (3 pads the 8 positions with ignored
  targets)."""
  rng = np.random.default_rng(1)
  x = rng.integers(0, 11, size=(8, 8)).astype(np.int32)
  y = (x + 1) % 11
  y[0, :3] = -1   # ignored targets stay ignored
  batch = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
  state, model, tx = _tiny(1, 8)
  (p0, l0, g0), (p1, l1, g1) = [
      _one_iteration(state, batch, model, tx, 1, loss_chunk_size=size)
      for size in (0, chunk)]
  assert l1 == pytest.approx(l0, rel=1e-5)
  assert g1 == pytest.approx(g0, rel=1e-4)
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_bfloat16_logits_train_on_the_rounded_logits():
  """model.logits_dtype=bfloat16 (nanoGPT's autocast LM head): the loss is
  the cross-entropy of the rounded logits, near the float32 logits' one."""
  rng = np.random.default_rng(2)
  x = rng.integers(0, 11, size=(8, 8)).astype(np.int32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray((x + 1) % 11)}
  state, bf16_model, tx = _tiny(1, 8, dtype="bfloat16")
  results = []
  for logits_dtype in ("float32", "bfloat16"):
    model = bf16_model.clone(cfg=dataclasses.replace(
        bf16_model.cfg, logits_dtype=logits_dtype))
    logits = jax.jit(model.apply)({"params": state.params}, batch["x"])
    assert logits.dtype == jnp.dtype(logits_dtype)
    _, metrics = jax.jit(lambda s, b, model=model: gpt_steps.train_step(
        s, b, model=model, tx=tx, accum_steps=1))(state, batch)
    loss = float(metrics["loss"].compute())
    assert loss == pytest.approx(
        float(gpt_steps.cross_entropy(logits, batch["y"])[0]), rel=1e-6)
    results.append((loss, float(metrics["grad_norm"].compute())))
  (l32, g32), (l16, g16) = results
  assert l16 != l32 and l16 == pytest.approx(l32, rel=1e-2)
  assert g16 == pytest.approx(g32, rel=5e-2)


# float32 logits with the table made in the loop, bfloat16 logits with it
# made before (cast_once); the remaining pair of the grid runs with -m slow.
@pytest.mark.parametrize("logits_dtype,cast_once", [
    ("float32", False),
    pytest.param("float32", True, marks=pytest.mark.slow),
    ("bfloat16", True)])
def test_triton_loss_kernel_trains_as_the_xla_loss(monkeypatch, logits_dtype,
                                                   cast_once):
  """config.loss_kernel='triton' (here in Pallas's interpreter): the same
  loss and update as XLA's loss, with ignored targets and accumulation,
  the head's table made in the loop or before it (cast_once, as on a
  GPU)."""
  from trm.nn import cross_entropy_gpu  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(cross_entropy_gpu.CONSTANTS, "block", 8)  # 11 = 8 + 3
  rng = np.random.default_rng(3)
  x = rng.integers(0, 11, size=(8, 8)).astype(np.int32)
  y = (x + 1) % 11
  y[1, 2:5] = -1
  batch = {"x": jnp.asarray(x), "y": jnp.asarray(y)}
  state, model, tx = _tiny(2, 4)
  model = model.clone(cfg=dataclasses.replace(model.cfg,
                                              logits_dtype=logits_dtype))
  (p0, l0, g0), (p1, l1, g1) = [
      _one_iteration(state, batch, model, tx, 2, loss_kernel=kernel,
                     cast_once=cast_once)
      for kernel in ("xla", "triton_interpret")]
  assert l1 == pytest.approx(l0, rel=1e-6)
  if logits_dtype == "bfloat16":
    # P is rounded where the XLA path rounds g * P: one bf16 rounding apart.
    assert g1 == pytest.approx(g0, rel=2e-3)
    return
  assert g1 == pytest.approx(g0, rel=1e-5)
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("overrides,needle", [
    (dict(loss_kernel="pallas"), "config.loss_kernel='pallas': use one of"),
    (dict(loss_kernel="triton", loss_chunk_size=4),
     "set config.loss_chunk_size=0"),
])
def test_bad_loss_kernel_names_the_field(overrides, needle):
  with pytest.raises(ValueError, match=re.escape(needle)):
    gpt_program.build(_config(**overrides), None, {"vocab_size": 11})


def test_triton_loss_kernel_on_cpu_devices_is_one_line():
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"config.loss_kernel='triton' runs on NVIDIA GPUs "
                     r"only, and this mesh's devices are cpu: use 'xla', or "
                     r"'triton_interpret'"):
    mesh_lib.ShardingContext.from_config(_config(loss_kernel="triton"))


def test_bad_loss_chunk_size_names_the_field():
  c = _config(loss_chunk_size=-1)
  with pytest.raises(ValueError, match="config.loss_chunk_size"):
    gpt_program.build(c, None, {"vocab_size": 11})


@pytest.mark.parametrize("overrides, needle", [
    (dict(loss_reduce_once=1), "config.loss_reduce_once=1 has the wrong type"),
    (dict(loss_reduce_once=True), "set config.loss_chunk_size > 0"),
])
def test_bad_loss_reduce_once_names_the_field(overrides, needle):
  with pytest.raises(ValueError, match=needle):
    gpt_program.build(_config(**overrides), None, {"vocab_size": 11})


def _tiny_training(accum, micro, seed, shift):
  """A tiny model's state, a jitted train step and a batch whose targets are
  the inputs shifted by `shift` (mod 11)."""
  state, model, tx = _tiny(accum, micro, warmup_iters=0, learning_rate=1e-2)
  x = np.random.default_rng(seed).integers(
      0, 11, size=(accum * micro, 8)).astype(np.int32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray((x + shift) % 11)}
  step = jax.jit(lambda s, b: gpt_steps.train_step(s, b, model=model, tx=tx,
                                                   accum_steps=accum))
  return state, step, batch


def test_train_steps_lower_the_loss():
  state, step, batch = _tiny_training(2, 4, seed=2, shift=3)
  losses = []
  for _ in range(30):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"].compute()))
  assert losses[-1] < losses[0] - 0.5
  assert int(state.step) == 30


def _schedule_counts(opt_state):
  kind = optax.ScaleByScheduleState
  return [int(node.count) for node in jax.tree.leaves(
      opt_state, is_leaf=lambda node: isinstance(node, kind))
          if isinstance(node, kind)]


def test_nonfinite_step_is_skipped():
  """A NaN loss leaves parameters and AdamW's moments and count as they
  were (only the schedule follows the iteration), counts the skip, and the
  next finite step updates as usual."""
  state, step, batch = _tiny_training(1, 4, seed=5, shift=1)
  state, _ = step(state, batch)
  params = state.params
  bad = state.replace(params=jax.tree_util.tree_map_with_path(
      lambda path, p: p.at[0, 0].set(jnp.nan) if "c_fc" in str(path)
      and p.ndim == 2 else p, params))
  skipped, metrics = step(bad, batch)
  assert int(skipped.step) == 2
  assert int(skipped.skipped_steps) == 1
  # Zeroed: an interval's average leaves the skipped step out.
  assert int(metrics["loss"].count) == 0
  assert float(metrics["loss"].total) == 0.0
  adam = lambda s: [node for node in jax.tree.leaves(  # noqa: E731
      s.opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
                    if isinstance(node, optax.ScaleByAdamState)]
  for a, b in zip(jax.tree.leaves((skipped.params, adam(skipped))),
                  jax.tree.leaves((bad.params, adam(bad)))):
    np.testing.assert_array_equal(a, b)
  assert _schedule_counts(skipped.opt_state) == [2]
  good, _ = step(state, batch)
  assert int(good.skipped_steps) == 0
  changed = [not np.array_equal(a, b) for a, b in
             zip(jax.tree.leaves(good.params), jax.tree.leaves(params))]
  assert all(changed)


def test_float16_skipped_steps_keep_nanogpts_learning_rate():
  """nanoGPT sets get_lr(iter_num) every iteration, also across the steps
  its GradScaler skips for overflow: a float16 run whose first steps
  overflow (a loss scale of 2**24) must not warm up from where it was at
  the first update. Before, the schedule counted updates: 7 skipped steps
  left iteration 13 at get_lr(6)."""
  c = _config(n_layer=1, n_head=2, n_embd=16, block_size=8, batch_size=4,
              gradient_accumulation_steps=1, dtype="float16",
              warmup_iters=10, lr_decay_iters=100, max_iters=100,
              **{"loss_scale.initial": 2.0**24})
  with c.unlocked():
    c.model.vocab_size = 11
  program = gpt_program.build(c, None)
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  state = nn.meta.unbox(jax.jit(program.init_fn)())
  step = jax.jit(program.train_step)
  x = np.random.default_rng(0).integers(0, 11, size=(4, 8)).astype(np.int32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray((x + 1) % 11)}
  rates = []
  for _ in range(14):
    state, metrics = step(state, batch)
    rates.append(float(metrics["lr"].compute()))
  assert int(state.skipped_steps) >= 3  # the premise: overflows were skipped
  # The logged train/lr is nanoGPT's get_lr(iter_num) at every iteration,
  # skipped or not (nothing logged it before).
  np.testing.assert_allclose(rates, [_nanogpt_lr(it, c) for it in range(14)],
                             rtol=1e-6)
  # The next iteration (14) runs at get_lr(14), AdamW counted the updates.
  assert _schedule_counts(state.opt_state) == [int(state.step)] == [14]
  adam_count = [int(node.count) for node in jax.tree.leaves(
      state.opt_state,
      is_leaf=lambda n: isinstance(n, optax.ScaleByAdamState))
                if isinstance(node, optax.ScaleByAdamState)]
  assert adam_count == [14 - int(state.skipped_steps)]


def test_eval_step_splits_train_and_val_rows():
  state, model, _ = _tiny(1, 4)
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.integers(0, 11, size=(4, 8)).astype(np.int32))
  y = jnp.asarray(rng.integers(0, 11, size=(4, 8)).astype(np.int32))
  split = jnp.asarray([0, 1, 1, 0], jnp.int32)
  # Jitted (as the loop runs them): one compile each, not one per op.
  eval_step = jax.jit(functools.partial(gpt_steps.eval_step, model=model),
                      static_argnames=("label_smoothing", "z_loss"))
  metrics, outputs = eval_step(state, {"x": x, "y": y, "split": split})
  assert outputs == {}
  logits = jax.jit(model.apply)({"params": state.params}, x)
  row = np.asarray(optax.softmax_cross_entropy_with_integer_labels(
      logits, y).mean(-1))
  assert float(metrics["val_loss"].compute()) == pytest.approx(
      row[[1, 2]].mean(), rel=1e-5)
  assert float(metrics["train_loss"].compute()) == pytest.approx(
      row[[0, 3]].mean(), rel=1e-5)
  assert float(metrics["loss"].compute()) == float(
      metrics["val_loss"].compute())
  assert set(metrics) == {"loss", "val_loss", "train_loss"}  # nanoGPT's
  # With the training loss's label smoothing and z-loss, estimate_loss
  # scores them too (HF's eval_loss, MaxText's), and keeps the plain
  # cross-entropy, nanoGPT's figure, as *_cross_entropy.
  metrics, _ = eval_step(state, {"x": x, "y": y, "split": split},
                         label_smoothing=0.2, z_loss=0.05)
  log_probs = np.asarray(jax.nn.log_softmax(logits), np.float64)
  log_z = np.asarray(jax.nn.logsumexp(logits, axis=-1), np.float64)
  target = 0.8 * np.eye(11)[np.asarray(y)] + 0.2 / 11
  objective = (-(target * log_probs).sum(-1) + 0.05 * log_z**2).mean(-1)
  for name, rows in (("val", [1, 2]), ("train", [0, 3])):
    assert float(metrics[f"{name}_loss"].compute()) == pytest.approx(
        objective[rows].mean(), rel=1e-5)
    assert float(metrics[f"{name}_cross_entropy"].compute()) == pytest.approx(
        row[rows].mean(), rel=1e-5)
  assert float(metrics["loss"].compute()) == float(
      metrics["val_loss"].compute())


def test_cross_entropy_ignores_minus_one():
  logits = jnp.asarray(np.random.default_rng(4).normal(size=(1, 3, 5)),
                       jnp.float32)
  loss, count, z_term = gpt_steps.cross_entropy(logits,
                                                jnp.asarray([[1, -1, 2]]))
  assert float(z_term) == 0.0  # no z-loss
  full = optax.softmax_cross_entropy_with_integer_labels(
      logits, jnp.asarray([[1, 0, 2]]))
  assert int(count) == 2
  assert float(loss) == pytest.approx(float((full[0, 0] + full[0, 2]) / 2))


def test_config_variants_hold_nanogpts_values():
  c = config_lib.load_config("configs/gpt.py", "shakespeare_char")
  assert (c.batch_size, c.block_size, c.n_layer, c.n_head, c.n_embd,
          c.dropout, c.learning_rate, c.max_iters, c.lr_decay_iters,
          c.min_lr, c.beta2, c.warmup_iters, c.eval_interval, c.eval_iters,
          c.log_interval, c.always_save_checkpoint, c.bias,
          c.weight_decay, c.grad_clip) == (
              64, 256, 6, 6, 384, 0.2, 1e-3, 5000, 5000, 1e-4, 0.99, 100,
              250, 200, 10, False, False, 0.1, 1.0)
  cpu = config_lib.load_config("configs/gpt.py", "shakespeare_char_cpu")
  assert (cpu.block_size, cpu.batch_size, cpu.n_layer, cpu.n_head, cpu.n_embd,
          cpu.max_iters, cpu.lr_decay_iters, cpu.dropout, cpu.eval_iters,
          cpu.log_interval) == (64, 12, 4, 4, 128, 2000, 2000, 0.0, 20, 1)
  xl = config_lib.load_config("configs/gpt.py", "gpt2-xl")
  assert (xl.n_layer, xl.n_head, xl.n_embd, xl.bias, xl.model.vocab_size,
          xl.block_size) == (48, 25, 1600, True, 50257, 1024)
  big = config_lib.load_config("configs/gpt.py", "maxtext52b")
  assert (big.n_layer, big.n_head, big.n_embd, big.model.head_size,
          big.model.vocab_size, big.block_size, big.global_batch_size) == (
              32, 32, 12288, 256, 32768, 1024, 10 * 192)
  # MaxText's v5e runs: global_parameter_scale 16 .. 128 of base.yml.
  shapes = {v: (c.n_layer, c.n_head, c.n_embd, c.model.mlp_size,
                c.global_batch_size, c.mesh.model, c.block_size)
            for v in ("maxtext16b", "maxtext32b", "maxtext64b", "maxtext128b")
            for c in [config_lib.load_config("configs/gpt.py", v)]}
  assert shapes == {"maxtext16b": (32, 32, 5120, 32768, 6 * 256, 1, 2048),
                    "maxtext32b": (32, 32, 10240, 32768, 4 * 256, 1, 2048),
                    "maxtext64b": (64, 32, 10240, 32768, 2 * 256, 1, 2048),
                    "maxtext128b": (64, 64, 10240, 65536, 256, 16, 2048)}
  rules = dict(config_lib.load_config("configs/gpt.py",
                                      "maxtext128b").logical_axis_rules)
  assert rules["activation_embed"] == "model"  # base.yml's, for tensor
  default = config_lib.load_config("configs/gpt.py")
  assert (default.gradient_accumulation_steps, default.batch_size,
          default.bias, default.learning_rate, default.warmup_iters) == (
              40, 12, False, 6e-4, 2000)


def test_nanogpt_keys_drive_the_trainer_keys():
  c = _config(max_iters=123, eval_interval=7, log_interval=3, batch_size=4,
              gradient_accumulation_steps=5, n_layer=3, dropout=0.1)
  assert (c.total_steps, c.eval_every, c.checkpoint_every, c.log_every,
          c.global_batch_size, c.data.eval_batch_size) == (123, 7, 7, 3, 20, 4)
  assert (c.model.n_layer, c.model.dropout) == (3, 0.1)
  with pytest.raises(ValueError, match="config.n_layers"):
    config_lib.set_values(c, {"n_layers": 2})
  with pytest.raises(ValueError, match="Choose one variant"):
    config_lib.load_config("configs/gpt.py", "gpt2,shakespeare_char")
  assert isinstance(c, ml_collections.ConfigDict)


def test_derived_keys_set_apart_leave_their_source_alone():
  """data.eval_batch_size and checkpoint_every follow batch_size and
  eval_interval, but setting them (as --config.KEY=VALUE does) changes only
  them: before, a bare FieldReference set both, so an eval batch size of 4
  trained on micro-batches of 4."""
  c = _config(batch_size=12, eval_interval=250)
  c = config_lib.set_values(c, {"data.eval_batch_size": 4,
                                "checkpoint_every": 100})
  assert (c.batch_size, c.global_batch_size, c.data.eval_batch_size) == (
      12, 12 * c.gradient_accumulation_steps, 4)
  assert (c.eval_interval, c.eval_every, c.checkpoint_every) == (250, 250, 100)
  c = config_lib.set_values(c, {"eval_every": 50})  # an alias: both move
  assert (c.eval_interval, c.eval_every) == (50, 50)


@pytest.mark.parametrize("values, needle", [
    ({"global_batch_size": 48}, "config.global_batch_size=48 must be "
     "config.batch_size x config.gradient_accumulation_steps = 12 x 5 = 60"),
    ({"gradient_accumulation_steps": 0},
     "config.gradient_accumulation_steps=0 must be a positive integer"),
    ({"max_iters": 0}, "config.max_iters=0 must be a positive integer"),
    ({"eval_interval": -1}, "config.eval_interval=-1 must be a positive"),
    # Before: trained from random weights, the checkpoint never read.
    ({"init_checkpoint": "ckpt.pt"}, "config.init_checkpoint='ckpt.pt' is "
     "not read with config.init_from='scratch'"),
    # GPT-2 / nanoGPT weights have n_embd-wide attention (would fail later
    # in a shape error).
    ({"init_from": "resume", "init_checkpoint": "ckpt.pt",
      "model.head_size": 64}, "config.model.head_size=64 makes the "
     "attention 256 wide, but config.init_from='resume' loads"),
    ({"init_from": "gpt2", "init_checkpoint": "gpt2_dir",
      "model.mlp_size": 100}, "config.model.mlp_size=100 makes the MLP 100 "
     "wide, but config.init_from='gpt2' loads GPT-2 / nanoGPT weights whose "
     "MLP is 4 * n_embd wide"),
    ({"init_from": "gpt2", "init_checkpoint": "gpt2_dir",
      "model.n_kv_head": 2}, "config.model.n_kv_head=2 groups the keys and "
     "values, but config.init_from='gpt2' loads GPT-2 / nanoGPT weights "
     "with one key/value head per query head"),
    # The negative rate itself, not min_lr above it (which, as nanoGPT's
    # get_lr, runs: test_schedule_edges_nanogpt_runs_are_run).
    ({"learning_rate": -1e-3}, "config.learning_rate=-0.001 must be a "
     "finite number >= 0"),
])
def test_nanogpt_keys_are_named_in_config_errors(values, needle):
  """Refused by run_checks (before the mesh or any data) in nanoGPT's
  names, not the trainer keys they drive."""
  from trm.core import run_checks  # pylint: disable=g-import-not-at-top
  c = config_lib.set_values(_config(batch_size=12,
                                    gradient_accumulation_steps=5), values)
  with pytest.raises(ValueError) as error:
    run_checks.check_config(c)
  assert needle in str(error.value)



def test_label_smoothing_and_z_loss_reach_every_loss_path(monkeypatch):
  """config.label_smoothing (torch's) and config.z_loss (MaxText's
  z_loss_multiplier) reach the per-token loss of the iteration, whichever
  path makes it (traced only: the values are checked below)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from trm.nn import cross_entropy_gpu  # pylint: disable=g-import-not-at-top
  seen = []

  def spy(real):
    def call(*args):
      # (label_smoothing, z_loss), given after logits and labels (and the
      # kernel's table, dtype and interpret); None without them.
      seen.append(args[-2:] if len(args) > 2 else None)
      return real(*args)
    return call

  for module, name in ((gpt_steps.losses, "softmax_cross_entropy"),
                       (gpt_steps.losses, "softmax_cross_entropy_and_log_z"),
                       (cross_entropy_gpu, "linear_cross_entropy_and_log_z")):
    monkeypatch.setattr(module, name, spy(getattr(module, name)))
  batch = {k: jax.ShapeDtypeStruct((4, 8), jnp.int32) for k in "xy"}
  for options in (dict(), dict(loss_chunk_size=3),
                  dict(loss_kernel="triton_interpret")):
    program = gpt_program.build(_config(
        n_layer=1, n_head=2, n_embd=16, block_size=8, dropout=0.0,
        gradient_accumulation_steps=2, batch_size=2, label_smoothing=0.2,
        z_loss=0.05, **options), None, {"vocab_size": 11})
    state = nn.meta.unbox(jax.eval_shape(program.init_fn))
    del seen[:]
    jax.eval_shape(program.train_step, state, batch)
    assert seen and set(seen) == {(0.2, 0.05)}, (options, seen)
  # estimate_loss scores the same objective (HF's eval_loss, MaxText's).
  del seen[:]
  jax.eval_shape(program.eval_step, state,
                 {**batch, "split": jax.ShapeDtypeStruct((4,), jnp.int32)})
  assert (0.2, 0.05) in seen, seen


def test_label_smoothing_and_z_loss_on_every_loss(monkeypatch):
  """With both terms, the whole logits' loss is the written-out formula
  averaged over the scored targets, and the chunked logits' loss and the
  Triton kernel's (interpreted) have its value and gradients."""
  from trm.nn import cross_entropy_gpu  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(cross_entropy_gpu.CONSTANTS, "block", 8)  # 11 = 8 + 3
  rng = np.random.default_rng(6)
  hidden = jnp.asarray(rng.normal(size=(2, 8, 16)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(11, 16)), jnp.float32)
  y = rng.integers(0, 11, size=(2, 8)).astype(np.int32)
  y[0, :3] = -1
  terms = (0.2, 0.05)
  head = lambda h, t: h @ t.T  # noqa: E731
  losses = {
      "whole": lambda h, t: gpt_steps.cross_entropy(head(h, t), y, *terms),
      "chunked": lambda h, t: gpt_steps.chunked_cross_entropy(
          h, t, y, 3, head, *terms),
      "triton": lambda h, t: gpt_steps.fused_cross_entropy(
          h, t, y, "float32", True, *terms)}
  # (loss, (count, z-loss term)): the loss differentiated, the rest aux.
  losses = {name: (lambda h, t, f=f: (lambda out: (out[0], out[1:]))(f(h, t)))
            for name, f in losses.items()}
  (want, (_, want_z)), want_grads = jax.jit(jax.value_and_grad(
      losses.pop("whole"), argnums=(0, 1), has_aux=True))(hidden, table)
  # torch's cross_entropy(label_smoothing=0.2, ignore_index=-1) plus
  # MaxText's 0.05 * logsumexp**2, written out, over the scored targets.
  logits = np.asarray(hidden, np.float64) @ np.asarray(table, np.float64).T
  log_z = np.log(np.exp(logits).sum(-1))
  target = 0.8 * np.eye(11)[np.maximum(y, 0)] + 0.2 / 11
  per_token = -(target * (logits - log_z[..., None])).sum(-1) + (
      0.05 * log_z**2)
  assert float(want) == pytest.approx(per_token[y >= 0].mean(), rel=1e-5)
  # The z-loss term alone (train/z_loss, MaxText's learning/z_loss).
  assert float(want_z) == pytest.approx(
      0.05 * (log_z[y >= 0]**2).mean(), rel=1e-5)
  for name, loss in losses.items():
    (got, (_, got_z)), grads = jax.jit(jax.value_and_grad(
        loss, argnums=(0, 1), has_aux=True))(hidden, table)
    assert float(got) == pytest.approx(float(want), rel=1e-6), name
    assert float(got_z) == pytest.approx(float(want_z), rel=1e-6), name
    for a, b in zip(grads, want_grads):
      np.testing.assert_allclose(a, b, atol=1e-6, err_msg=name)
