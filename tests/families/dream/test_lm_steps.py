"""DiffuCoder fine-tuning step on the tiny config, sharded 2x2x2."""
import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo

from trm.core import config_lib
from trm.core import dispatch
from trm.families.dream import loss as diffusion_loss
from trm.families.dream import model as dream
from trm.families.dream import steps as lm_steps
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.core import task as task_lib
from trm.families.dream import program as dream_program

ROOT = repo.ROOT


def _setup(mesh=(2, 2, 2), config_overrides=None, **model_overrides):
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")
  config.model.update(model_overrides)
  config.mesh.update(dict(zip(("data", "fsdp", "model"), mesh)))
  config.optim.update(lr=3e-3, warmup_steps=5)
  config.update({"seq_len": 32, "global_batch_size": 8,
                 **(config_overrides or {})})
  ctx = mesh_lib.ShardingContext.from_config(config)
  program = dream_program.build(config, ctx)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  return config, ctx, program, abstract, shardings, state


def test_loss_falls_pad_row_frozen_and_state_sharded():
  """Also: config.gradient_accumulation_steps=2 gives the first step's
  update and metrics (same noise, the loss divided by the whole batch's
  masked tokens: DiffuLLaMA's per-token mean), and MFU and tokens/s count
  the whole step's rows."""
  config, ctx, program, abstract, shardings, state = _setup()
  model = program.model
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  step = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                     abstract, shardings)
  pad = model.cfg.pad_token_id
  pad_row = np.asarray(state.params["embed_tokens"][pad])
  # A learnable toy language: each row counts up from a random start; the
  # first 4 tokens are a never-masked prompt; the pad token appears too.
  rng = np.random.default_rng(0)

  def make_batch(prompt=4):
    start = rng.integers(2, 10, (8, 1))
    tokens = (start + np.arange(32)[None]).astype(np.int32)
    tokens[:, -3:] = pad
    maskable = np.broadcast_to(np.arange(32)[None] >= prompt, tokens.shape)
    return {k: jax.device_put(v, batch_shardings[k]) for k, v in
            {"tokens": tokens, "maskable": maskable}.items()}

  # The first step, kept to compare with the accumulated one: its rows
  # hold different masked counts (a micro-batch mean would differ).
  first_batch = make_batch(np.arange(2, 26, 3)[:, None])
  initial = jax.tree.map(jnp.copy, state)  # `step` donates the state
  state, first_metrics = step(state, first_batch)
  first = jax.tree.map(np.asarray, state.params)

  @jax.jit
  def fixed_noise_loss(params, batch):
    noisy, masked, t = diffusion_loss.add_noise(
        jax.random.PRNGKey(7), batch["tokens"], batch["maskable"],
        model.cfg.mask_token_id)
    hidden = model.apply({"params": params}, noisy, method="hidden")
    return diffusion_loss.shifted_masked_loss(
        hidden, dream.gather_head(dream.head_kernel(params), model.cfg),
        functools.partial(dream.head_logits, cfg=model.cfg),
        batch["tokens"], masked, t)[0]

  # A learnable toy language: each row counts up from a random start; the
  # first 4 tokens are a never-masked prompt; the pad token appears too.
  # 20 steps: the fixed-noise loss is then ~0.50x its start (0.69x after 10,
  # 0.10x after 60, the count this test ran before).
  steps = 20
  eval_batch = make_batch()
  with ctx:
    before = float(fixed_noise_loss(initial.params, eval_batch))
    bound = dispatch.DispatchBound()  # many unread steps deadlock XLA:CPU
    for _ in range(steps - 1):
      state, metrics = step(state, make_batch())
      bound(metrics)  # not the state: it is donated to the next step
    after = float(fixed_noise_loss(state.params, eval_batch))
  assert np.isfinite(float(metrics["loss"].compute()))
  # The logged train/lr: the rate of the last step's update (schedule count
  # steps - 1).
  np.testing.assert_allclose(
      float(metrics["lr"].compute()),
      float(lm_steps.learning_rate_schedule(config.optim,
                                            config.total_steps)(steps - 1)),
      rtol=1e-6)
  assert after < 0.7 * before, (before, after)
  assert int(state.step) == steps
  np.testing.assert_array_equal(
      np.asarray(state.params["embed_tokens"][pad]), pad_row)
  assert state.params["embed_tokens"].sharding.spec == \
      jax.sharding.PartitionSpec("model", "fsdp")
  mu = state.opt_state[1][0].mu["embed_tokens"]
  assert mu.sharding.spec == state.params["embed_tokens"].sharding.spec

  split = config_lib.set_values(config.copy_and_resolve_references(),
                                {"gradient_accumulation_steps": 2})
  split_program = dream_program.build(split, ctx)
  assert split_program.flops_per_step == program.flops_per_step == (
      lm_steps.train_flops_per_example(model.cfg, 32) * 8)
  split_step = task_lib.compile_train_step(
      split_program, ctx, split.global_batch_size, abstract, shardings)
  # One more loop than the one-batch step's (layers, loss chunks): the
  # micro-batches'.
  assert split_step.as_text().count(" while(") == (
      step.as_text().count(" while(") + 1)
  with ctx:
    accumulated, metrics = split_step(initial, first_batch)
  for name in ("loss", "masked_tokens", "grad_norm"):
    np.testing.assert_allclose(float(metrics[name].compute()),
                               float(first_metrics[name].compute()),
                               rtol=1e-5, err_msg=name)
  # AdamW's first update is lr * g / (|g| + eps): g's float32 rounding
  # moves it by far less than this.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      np.asarray(a), b, rtol=0, atol=1e-6), accumulated.params, first)

  # The eval step in micro-batches no larger than the train step's (16
  # held-out rows, 4 per train micro-batch: 4 of them, each split over the
  # 4 data-parallel devices) is the whole batch's eval step.
  from trm.core import accumulation  # pylint: disable=g-import-not-at-top
  assert split.data.eval_batch_size == 16
  assert accumulation.eval_steps_of(split, ctx) == 4
  assert accumulation.eval_steps_of(split) == 4  # no mesh: one device
  assert accumulation.eval_steps_of(config, ctx) == 1  # no accumulation
  assert accumulation.eval_steps_of(config_lib.set_values(
      split.copy_and_resolve_references(),
      {"data.eval_batch_size": 12}), ctx) == 3
  eval_batch = {"tokens": np.concatenate([first_batch["tokens"]] * 2),
                "maskable": np.concatenate([first_batch["maskable"]] * 2),
                "row": np.arange(16, dtype=np.int32)}
  eval_batch = {k: jax.device_put(v, batch_shardings[k])
                for k, v in eval_batch.items()}
  with ctx:
    lowered = [jax.jit(p.eval_step).lower(accumulated, eval_batch)
               for p in (program, split_program)]
    whole, micro = (lowering.compile()(accumulated, eval_batch)[0]
                    for lowering in lowered)
  # One more loop than the whole batch's eval step: the micro-batches'.
  loops = [lowering.as_text().count("stablehlo.while") for lowering in lowered]
  assert loops[1] == loops[0] + 1, loops
  for name in ("loss", "masked_tokens"):
    np.testing.assert_allclose(float(micro[name].compute()),
                               float(whole[name].compute()), rtol=1e-6,
                               err_msg=name)


def test_loss_reduce_once_takes_the_same_step():
  """config.loss_reduce_once over data 2 x fsdp 4 (the vocabulary whole on
  each device, so the per-device sums apply): the step's loss and
  parameters are the per-chunk reduction's; a 20-position sequence in
  chunks of 8 pads its last chunk."""
  results = []
  for reduce_once in (False, True):
    config, ctx, program, abstract, shardings, state = _setup(
        mesh=(2, 4, 1), config_overrides=dict(loss_reduce_once=reduce_once,
                                              loss_chunk_size=8, seq_len=20))
    batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
    step = task_lib.compile_train_step(program, ctx, config.global_batch_size,
                                       abstract, shardings)
    tokens = np.random.default_rng(3).integers(
        2, 60, (8, 20)).astype(np.int32)
    maskable = np.broadcast_to(np.arange(20)[None] >= 3, tokens.shape)
    batch = {k: jax.device_put(v, batch_shardings[k]) for k, v in
             {"tokens": tokens, "maskable": maskable}.items()}
    state, metrics = step(state, batch)
    results.append((float(metrics["loss"].compute()),
                    float(metrics["grad_norm"].compute()),
                    jax.tree.map(np.asarray, state.params)))
  (loss_a, norm_a, params_a), (loss_b, norm_b, params_b) = results
  assert abs(loss_a - loss_b) < 1e-5
  # (Adam's update barely moves with the gradient's scale; its norm does.)
  assert norm_b == pytest.approx(norm_a, rel=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-6),
               params_a, params_b)


def test_flops_formula_matches_xla_cost_analysis():
  """Unscanned layers and one loss chunk: XLA counts every FLOP."""
  config, _, program, _, _, _ = _setup(scan_layers=False, remat="none")
  model = program.model
  params = nn.meta.unbox(jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32))))
  batch = 4

  def loss(params, tokens):
    from trm.families.dream import loss as diffusion_loss  # pylint: disable=g-import-not-at-top
    hidden = model.apply(params, tokens, method="hidden")
    return diffusion_loss.shifted_masked_loss(
        hidden, dream.head_kernel(params["params"]),
        functools.partial(dream.head_logits, cfg=model.cfg), tokens,
        jnp.ones(tokens.shape, bool), jnp.ones((batch,)),
        chunk_size=config.seq_len,
        gather_fn=functools.partial(dream.gather_head, cfg=model.cfg))[0]

  compiled = jax.jit(jax.grad(loss)).lower(
      params, jax.ShapeDtypeStruct((batch, config.seq_len), jnp.int32)
  ).compile()
  ours = lm_steps.train_flops_per_example(model.cfg, config.seq_len) * batch
  xla = compiled.cost_analysis()["flops"]
  assert abs(xla - ours) / ours < 0.2, (xla, ours)


def test_eval_rows_draw_their_own_noise_whatever_the_batching():
  """Each held-out row's t and mask come from its index: batches of equal
  rows differ, and the figure does not depend on the eval batch size."""
  from trm.core import pipeline  # pylint: disable=g-import-not-at-top
  from trm.data.text import sft  # pylint: disable=g-import-not-at-top
  config, ctx, program, _, shardings, state = _setup()
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  with ctx:
    eval_step = jax.jit(program.eval_step,
                        in_shardings=(shardings, batch_shardings))
  # 16 copies of one row: any difference between batches is the noise's.
  tokens = np.tile((np.arange(32) % 200).astype(np.int32), (16, 1))
  maskable = np.ones_like(tokens, bool)
  maskable[:, 0] = False

  def masked_counts(batch_size):
    source = sft.SFTEvalBatches(tokens, maskable,
                                global_batch_size=batch_size)
    with ctx:
      return [float(eval_step(state, pipeline.to_global(
          source[k], batch_shardings))[0]["masked_tokens"].compute())
              for k in range(len(source))]

  by_8 = masked_counts(8)
  assert by_8[0] != by_8[1], by_8  # one key for all batches: equal
  assert sum(by_8) == sum(masked_counts(16))


def test_warmup_ratio_warms_up_over_a_share_of_the_run():
  """config.optim.warmup_ratio (Hugging Face's): ceil(0.1 x 95) = 10
  warmup steps, as warmup_steps=10."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  optim = dict(lr=1.0, warmup_steps=0, warmup_ratio=0.1)
  by_ratio, by_steps = [
      lm_steps.learning_rate_schedule(ml_collections.ConfigDict(o), 95)
      for o in (optim, dict(optim, warmup_steps=10, warmup_ratio=0.0))]
  steps = jnp.arange(0, 40)
  np.testing.assert_array_equal(by_ratio(steps), by_steps(steps))
  assert float(by_ratio(5)) == 0.5


def test_default_optimizer_is_clipped_adamw_as_before():
  """config.optim.optimizer='adamw' (the default), and a config from before
  the field, build the clipped AdamW every recorded run trained with: the
  same state tree and, bit for bit, the same update."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  old = dict(lr=1e-2, warmup_steps=2, beta1=0.9, beta2=0.999, eps=1e-8,
             weight_decay=0.1, grad_clip_norm=1.0)
  schedule = lm_steps.learning_rate_schedule(ml_collections.ConfigDict(old),
                                             20)
  before = optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1))
  params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
  grads = {"w": jnp.cos(params["w"]) * 3}

  def step(tx):
    return jax.jit(tx.update)(grads, tx.init(params), params)

  want = step(before)
  for optim in (old, dict(old, optimizer="adamw")):
    got = step(lm_steps.make_optimizer(ml_collections.ConfigDict(optim), 20))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)
