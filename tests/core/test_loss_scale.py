"""float16 compute with dynamic loss scaling (`trm.core.loss_scale`): against
float32 on CPU, and an overflow halves the scale and skips the update."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import config_lib
from trm.families.gpt import steps as gpt_steps
from trm.families.dream import steps as lm_steps
from trm.families.gpt import program as gpt_program
from trm.core import loss_scale


def _gpt_config(dtype, **overrides):
  c = config_lib.load_config("configs/gpt.py", "shakespeare_char_cpu")
  config_lib.set_values(c, dict(
      n_layer=2, n_head=2, n_embd=32, block_size=16, batch_size=8,
      gradient_accumulation_steps=2, warmup_iters=0, learning_rate=3e-3,
      dtype=dtype, **overrides))
  with c.unlocked():
    c.model.vocab_size = 11
  return c


def _gpt(dtype, **overrides):
  """(state, jitted step, batch) of a tiny GPT; the same weights and data
  for every dtype."""
  c = _gpt_config(dtype, **overrides)
  program = gpt_program.build(c, None)
  model = program.model
  tx = gpt_steps.make_optimizer(c)
  state = nn.meta.unbox(jax.jit(program.init_fn)())
  x = np.random.default_rng(0).integers(0, 11, (16, 16)).astype(np.int32)
  batch = {"x": jnp.asarray(x), "y": jnp.asarray((x + 3) % 11)}
  step = jax.jit(lambda s, b: gpt_steps.train_step(s, b, model=model, tx=tx,
                                                   accum_steps=2))
  return state, step, batch


def _train(state, step, batch, steps):
  losses = []
  for _ in range(steps):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"].compute()))
  return state, losses, metrics


def test_adjust_halves_on_overflow_and_doubles_after_the_interval():
  ls = loss_scale.LossScale(jnp.float32(1024.0), jnp.int32(0),
                            growth_interval=3)
  for _ in range(2):
    ls = ls.adjust(True)
  assert float(ls.scale) == 1024.0 and int(ls.good_steps) == 2
  ls = ls.adjust(True)  # the 3rd finite step in a row
  assert float(ls.scale) == 2048.0 and int(ls.good_steps) == 0
  ls = ls.adjust(True).adjust(False)
  assert float(ls.scale) == 1024.0 and int(ls.good_steps) == 0
  low = loss_scale.LossScale(jnp.float32(1.0), jnp.int32(0)).adjust(False)
  assert float(low.scale) == loss_scale.MIN_SCALE


def test_float16_gpt_follows_float32():
  s32, losses32, _ = _train(*_gpt("float32"), steps=6)
  s16, losses16, metrics = _train(*_gpt("float16"), steps=6)
  assert s32.loss_scale is None  # no scale, no extra checkpoint arrays
  np.testing.assert_allclose(losses16, losses32, rtol=1e-2)
  assert losses16[-1] < losses16[0] - 0.1  # it trains
  assert int(s16.skipped_steps) == 0
  assert float(metrics["loss_scale"].compute()) == 2.0**15
  for a, b in zip(jax.tree.leaves(s16.params), jax.tree.leaves(s32.params)):
    assert a.dtype == jnp.float32  # float32 master weights
    # AdamW moves each weight by up to ~lr per step whatever the gradient's
    # size, so a near-zero gradient of another sign moves one weight 2 lr
    # apart; on average the two runs' weights agree far closer than that.
    diff = np.abs(np.asarray(a) - np.asarray(b))
    assert diff.max() <= 2 * 3e-3 * 6 and diff.mean() < 3e-4, diff.mean()


def test_overflow_halves_the_scale_and_skips_the_update():
  # 2**24 times the loss overflows float16's backward (max 65504).
  state, step, batch = _gpt("float16", **{"loss_scale.initial": 2.0**24})
  after, metrics = step(state, batch)
  assert float(after.loss_scale.scale) == 2.0**23
  assert int(after.skipped_steps) == 1 and int(after.step) == 1
  # Weights and AdamW's moments and count stay (GradScaler skips torch's
  # optimizer.step()); only the learning-rate schedule follows the
  # iteration, as nanoGPT's get_lr(iter_num).
  schedule = gpt_steps.advance_schedule(state.opt_state)
  for a, b in zip(jax.tree.leaves((after.params, after.opt_state)),
                  jax.tree.leaves((state.params, schedule))):
    np.testing.assert_array_equal(a, b)
  assert int(metrics["skipped_steps"].compute()) == 1
  # It recovers by itself: halving until the backward fits, then training.
  state, losses, metrics = _train(after, step, batch, steps=12)
  skipped = int(state.skipped_steps)
  assert 1 < skipped < 13 and losses[-1] > 0
  assert float(state.loss_scale.scale) == 2.0**(24 - skipped)
  assert not np.array_equal(state.params["wte"]["embedding"],
                            after.params["wte"]["embedding"])


def test_growth_after_the_interval():
  state, step, batch = _gpt("float16", **{"loss_scale.initial": 256.0,
                                          "loss_scale.growth_interval": 2})
  state, _, _ = _train(state, step, batch, steps=5)
  assert int(state.skipped_steps) == 0
  assert float(state.loss_scale.scale) == 1024.0  # doubled at steps 2 and 4
  assert int(state.loss_scale.good_steps) == 1


@pytest.mark.parametrize("overrides, message", [
    ({"model.param_dtype": "bfloat16"}, "config.model.param_dtype"),
    ({"loss_scale.initial": -1.0}, "config.loss_scale.initial"),
    ({"loss_scale.initial": float("inf")}, "config.loss_scale.initial"),
    ({"loss_scale.growth_interval": 0}, "config.loss_scale.growth_interval"),
])
def test_bad_settings_name_the_field(overrides, message):
  config = _gpt_config("float16")
  config_lib.set_values(config, overrides)
  with pytest.raises(ValueError, match=message):
    loss_scale.check_config(config)
  config_lib.set_values(config, {"dtype": "bfloat16"})
  loss_scale.check_config(config)  # only float16 reads the knobs


# slow: test_float16_gpt_follows_float32 runs the same loss-scaled step code.
@pytest.mark.slow
def test_float16_diffucoder_follows_float32():
  """The masked-diffusion step (Dream / DiffuCoder), tiny config."""
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  losses = {}
  for dtype in ("float32", "float16"):
    config = config_lib.load_config("configs/diffucoder_7b.py", "tiny")
    config_lib.set_values(config, {"model.dtype": dtype,
                                   "optim.warmup_steps": 0})
    model = dream.Dream(dream.DreamConfig.from_config(config.model))
    tx = lm_steps.make_optimizer(config.optim, config.total_steps)
    init = lm_steps.make_init_fn(model, tx, 0,
                                 loss_scale.initial_state(config))
    state = nn.meta.unbox(jax.jit(init)())
    tokens = (np.arange(32)[None] + np.arange(4)[:, None]).astype(np.int32)
    batch = {"tokens": jnp.asarray(tokens),
             "maskable": jnp.asarray(np.arange(32)[None] >= 4).repeat(4, 0)}
    step = jax.jit(lambda s, b, model=model, tx=tx: lm_steps.train_step(
        s, b, model=model, tx=tx))
    state, losses[dtype], _ = _train(state, step, batch, steps=4)
  assert int(state.skipped_steps) == 0
  assert state.loss_scale is not None
  np.testing.assert_allclose(losses["float16"], losses["float32"], rtol=2e-2)
