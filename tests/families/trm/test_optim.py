"""Tests for trm.families.trm.optim: LR schedule, AdamATan2, sparse SignSGD, EMA."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import flax.linen as nn
import hlo_collectives
import optax
import pytest
from jax.sharding import PartitionSpec as P

from trm.families.trm.optim import (AdamATan2State, adam_atan2, ema_update, lr_schedule,
                       sparse_sign_sgd_update)

# ---------------------------------------------------------------- schedule


def test_schedule_first_step_and_warmup_boundary():
  fn = lr_schedule(1e-4, warmup_steps=2000, total_steps=65104, min_ratio=1.0)
  # optax count 0 is upstream step 1: base / warmup.
  np.testing.assert_allclose(float(fn(0)), 1e-4 / 2000, rtol=1e-6)
  np.testing.assert_allclose(float(fn(1)), 2e-4 / 2000, rtol=1e-6)
  np.testing.assert_allclose(float(fn(1998)), 1e-4 * 1999 / 2000, rtol=1e-6)
  # s = 2000 is no longer "s < warmup": full LR.
  np.testing.assert_allclose(float(fn(1999)), 1e-4, rtol=1e-6)


def test_schedule_constant_after_warmup_with_min_ratio_one():
  fn = lr_schedule(1e-2, warmup_steps=2000, total_steps=65104, min_ratio=1.0)
  for count in [1999, 2000, 30000, 65103, 100000]:
    np.testing.assert_allclose(float(fn(count)), 1e-2, rtol=1e-6)


def test_schedule_cosine():
  base, warm, total, mr = 2.0, 10, 110, 0.1
  fn = lr_schedule(base, warm, total, mr)
  expected = {
      10: base,  # progress 0
      35: base * (mr + (1 - mr) * 0.5 * (1 + math.cos(math.pi * 0.25))),
      60: base * (mr + (1 - mr) * 0.5),  # progress 0.5
      110: base * mr,  # progress 1
  }
  for s, lr in expected.items():
    np.testing.assert_allclose(float(fn(s - 1)), lr, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(float(fn(4)), base * 5 / 10, rtol=1e-6)


def test_schedule_traced_and_vectorised():
  fn = lr_schedule(1.0, 4, 20, 0.5)
  counts = jnp.arange(8, dtype=jnp.int32)
  got = np.asarray(jax.jit(jax.vmap(fn))(counts))
  want = [0.25, 0.5, 0.75, 1.0]
  for s in range(5, 9):
    p = (s - 4) / 16
    want.append(0.5 + 0.5 * 0.5 * (1 + math.cos(math.pi * p)))
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got.dtype == np.float32


# ---------------------------------------------------------------- AdamATan2


def _np_adam_atan2(p, grads, lrs, b1, b2, wd):
  """Float64 per-element reference of imoneoi's AdamATan2 kernel."""
  p = np.asarray(p, np.float64).copy()
  m = np.zeros_like(p)
  v = np.zeros_like(p)
  traj = []
  for t, (g, lr) in enumerate(zip(grads, lrs), start=1):
    g = np.asarray(g, np.float64)
    p *= 1.0 - lr * wd
    m = m + (1.0 - b1) * (g - m)
    v = v + (1.0 - b2) * (g * g - v)
    p -= lr / (1.0 - b1**t) * np.arctan2(m, np.sqrt(v) / np.sqrt(1.0 - b2**t))
    traj.append(p.copy())
  return traj


def test_adam_atan2_scalar_first_step_by_hand():
  # p = 1, g = 0.5, lr = 0.1, wd = 0.1, betas (0.9, 0.95), t = 1:
  #   decay:   p = 1 * (1 - 0.1 * 0.1)                 = 0.99
  #   m = 0.1 * 0.5 = 0.05;  v = 0.05 * 0.25           = 0.0125
  #   step size = lr / (1 - 0.9) = 0.1 / 0.1           = 1.0
  #   denom = sqrt(0.0125) / sqrt(1 - 0.95) = sqrt(0.25) = 0.5
  #   atan2(0.05, 0.5) = atan(0.1)                     = 0.09966865249116204
  #   p = 0.99 - 1.0 * 0.09966865249116204             = 0.890331347508838
  opt = adam_atan2(0.1, b1=0.9, b2=0.95, weight_decay=0.1)
  params = jnp.float32(1.0)
  state = opt.init(params)
  updates, state = opt.update(jnp.float32(0.5), state, params)
  new_p = optax.apply_updates(params, updates)
  np.testing.assert_allclose(float(updates), -0.01 - 0.09966865249116204,
                             rtol=1e-6)
  np.testing.assert_allclose(float(new_p), 0.890331347508838, rtol=1e-6)
  np.testing.assert_allclose(float(state.mu), 0.05, rtol=1e-6)
  np.testing.assert_allclose(float(state.nu), 0.0125, rtol=1e-6)
  assert int(state.count) == 1 and state.count.dtype == jnp.int32


@pytest.mark.parametrize("use_schedule", [False, True])
def test_adam_atan2_matches_numpy_reference(use_schedule):
  rng = np.random.default_rng(0)
  b1, b2, wd = 0.9, 0.95, 0.1
  p0 = {"w": rng.normal(size=(3, 4)).astype(np.float32),
        "b": rng.normal(size=(4,)).astype(np.float32)}
  grads = [{"w": rng.normal(size=(3, 4)).astype(np.float32),
            "b": rng.normal(size=(4,)).astype(np.float32)} for _ in range(4)]
  grads[2]["b"][1] = 0.0  # A zero gradient after nonzero ones.
  if use_schedule:
    lr = lr_schedule(0.05, warmup_steps=3, total_steps=10, min_ratio=0.2)
    lrs = [float(lr(c)) for c in range(4)]
  else:
    lr = 0.05
    lrs = [0.05] * 4
  opt = adam_atan2(lr, b1=b1, b2=b2, weight_decay=wd)

  @jax.jit
  def step(params, state, g):
    updates, state = opt.update(g, state, params)
    return optax.apply_updates(params, updates), state

  params = jax.tree.map(jnp.asarray, p0)
  state = opt.init(params)
  for k in range(4):
    params, state = step(params, state, jax.tree.map(jnp.asarray, grads[k]))
    for name in ("w", "b"):
      ref = _np_adam_atan2(p0[name], [g[name] for g in grads[:k + 1]],
                           lrs[:k + 1], b1, b2, wd)[-1]
      np.testing.assert_allclose(np.asarray(params[name]), ref, rtol=1e-6,
                                 atol=1e-6)
  assert int(state.count) == 4


def test_adam_atan2_gradient_scale_invariance():
  rng = np.random.default_rng(1)
  params = jnp.asarray(rng.normal(size=(16,)).astype(np.float32))
  grads = [jnp.asarray(rng.normal(size=(16,)).astype(np.float32))
           for _ in range(3)]
  opt = adam_atan2(1e-3, weight_decay=0.1)

  def run(scale):
    p, s = params, opt.init(params)
    out = []
    for g in grads:
      u, s = opt.update(g * scale, s, p)
      p = optax.apply_updates(p, u)
      out.append(np.asarray(u))
    return out

  for a, b in zip(run(1.0), run(1000.0)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_adam_atan2_zero_grad_and_zero_lr():
  opt = adam_atan2(0.0, weight_decay=0.1)
  params = jnp.ones((3,))
  updates, _ = opt.update(jnp.zeros((3,)), opt.init(params), params)
  # atan2(0, 0) = 0 and lr = 0 (upstream constructs with lr=0): no NaN, no move.
  assert np.all(np.asarray(updates) == 0.0)
  opt = adam_atan2(0.1, weight_decay=0.0)
  updates, _ = opt.update(jnp.zeros((3,)), opt.init(params), params)
  assert np.all(np.asarray(updates) == 0.0)


def test_adam_atan2_requires_params_and_state_is_pytree():
  opt = adam_atan2(0.1)
  params = {"a": jnp.zeros((2,)), "b": jnp.zeros((3, 2))}
  state = opt.init(params)
  assert isinstance(state, AdamATan2State)
  assert jax.tree.structure(state.mu) == jax.tree.structure(params)
  assert len(jax.tree.leaves(state)) == 5
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.nu))
  with pytest.raises(ValueError):
    opt.update(params, state)


def test_adam_atan2_sharded_jit_keeps_param_sharding():
  ref = _np_adam_atan2(np.arange(32.0).reshape(8, 4), [np.ones((8, 4))], [0.1],
                       0.9, 0.95, 0.1)[-1]
  # Explicit-axis meshes need the mesh set around jit; Auto ones do not.
  for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    sharding = jax.sharding.NamedSharding(mesh,
                                          jax.sharding.PartitionSpec("data"))
    with jax.set_mesh(mesh):
      params = jax.device_put(jnp.arange(32.0).reshape(8, 4), sharding)
      grads = jax.device_put(jnp.ones((8, 4)), sharding)
      opt = adam_atan2(0.1, weight_decay=0.1)
      state = jax.jit(opt.init)(params)

      @jax.jit
      def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

      new_p, state = step(params, state, grads)
    assert state.mu.sharding.is_equivalent_to(sharding, 2)
    assert new_p.sharding.is_equivalent_to(sharding, 2)
    np.testing.assert_allclose(np.asarray(new_p), ref, rtol=1e-6)


# ---------------------------------------------------------------- SignSGD


def test_sparse_sign_sgd_by_hand():
  table = jnp.asarray(np.arange(15, dtype=np.float32).reshape(5, 3))
  ids = jnp.asarray([1, 3, 1, 4], jnp.int32)
  row_grads = jnp.asarray(np.array([
      [1.0, -2.0, 0.5],    # id 1
      [0.0, 0.0, 0.0],     # id 3: zero grad, sign(0) = 0 -> decay only
      [-3.0, 1.0, -0.5],   # id 1 again: summed with row 0 -> [-2, -1, 0]
      [0.1, -0.1, 0.0],    # id 4
  ], np.float32))
  lr, wd = 0.1, 0.5  # decay factor 1 - 0.05 = 0.95
  new = np.asarray(sparse_sign_sgd_update(table, ids, row_grads, lr, wd))
  want = np.arange(15, dtype=np.float32).reshape(5, 3).copy()
  want[1] = [3 * 0.95 + 0.1, 4 * 0.95 + 0.1, 5 * 0.95]  # sign [-1, -1, 0]
  want[3] = [9 * 0.95, 10 * 0.95, 11 * 0.95]
  want[4] = [12 * 0.95 - 0.1, 13 * 0.95 + 0.1, 14 * 0.95]
  # Rows 0 and 2 are untouched: no decay either.
  np.testing.assert_allclose(new, want, rtol=1e-6)
  assert np.array_equal(new[0], [0, 1, 2]) and np.array_equal(new[2], [6, 7, 8])


def _sign_sgd_problem(seed, n, num_ids, lr=0.01, wd=0.1, d=6, b=32):
  """(table, ids, row_grads, lr, wd, the updated table from a dense float64
  gradient): ids drawn from the first `num_ids` rows, so many repeat."""
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(n, d)).astype(np.float32)
  ids = rng.integers(0, num_ids, size=(b,)).astype(np.int32)
  row_grads = rng.normal(size=(b, d)).astype(np.float32)
  dense = np.zeros((n, d), np.float64)
  np.add.at(dense, ids, row_grads.astype(np.float64))
  want = table.astype(np.float64).copy()
  touched = np.unique(ids)
  want[touched] = (want[touched] * (1 - lr * wd)
                   - lr * np.sign(dense[touched]))
  return table, ids, row_grads, lr, wd, want


def test_sparse_sign_sgd_matches_dense_reference_jit():
  table, ids, row_grads, lr, wd, want = _sign_sgd_problem(2, 50, 10)
  fn = jax.jit(sparse_sign_sgd_update)
  got = fn(jnp.asarray(table), jnp.asarray(ids), jnp.asarray(row_grads),
           jnp.float32(lr), jnp.float32(wd))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)


def test_sparse_sign_sgd_has_no_dense_gradient():
  n, d, b = 1000, 8, 4
  jaxpr = jax.make_jaxpr(sparse_sign_sgd_update)(
      jnp.zeros((n, d)), jnp.zeros((b,), jnp.int32), jnp.zeros((b, d)),
      0.1, 0.1)
  big = [e.primitive.name for e in jaxpr.jaxpr.eqns
         for v in e.outvars if v.aval.shape and v.aval.shape[0] == n]
  # Only the final scatter into the table produces an [N, D] array.
  assert big == ["scatter"], big


@pytest.mark.parametrize("table_spec", [P(), P("data")])
def test_sparse_sign_sgd_on_a_mesh_all_reduces_the_row_sums(table_spec):
  """Ids and gradients split over 8 devices as the train step splits its
  batch (logical 'activation_batch'), the table whole on each or split by
  rows: the same rows as the dense reference, and the duplicates' sums are
  partial sums all-reduced; no float row is all-gathered (only the int
  ids are). An async all-gather of the gradient rows cost ARC-1's v4-8
  step 7.8-15 GiB (tests/families/trm/test_paper_steps_on_v4_8.py)."""
  # 12 ids over 32 rows on 8 devices: duplicates across devices.
  table, ids, row_grads, lr, wd, want = _sign_sgd_problem(3, 64, 12)
  mesh = jax.make_mesh((8,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  rows = jax.sharding.NamedSharding(mesh, P("data"))
  whole = jax.sharding.NamedSharding(mesh, table_spec)
  step = jax.jit(sparse_sign_sgd_update,
                 in_shardings=(whole, rows, rows, None, None),
                 out_shardings=whole)
  with jax.set_mesh(mesh), nn.logical_axis_rules(
      [("activation_batch", "data")]):
    args = (jax.device_put(table, whole), jax.device_put(ids, rows),
            jax.device_put(row_grads, rows), jnp.float32(lr),
            jnp.float32(wd))
    hlo = step.lower(*args).compile().as_text()
    got = step(*args)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
  moved = hlo_collectives.results(hlo)
  floats = [op for op, shape in moved if "f32[" in shape]
  assert "all-reduce" in floats and "all-gather" not in floats, moved


# ---------------------------------------------------------------- EMA


def test_ema_update_values():
  ema = {"a": jnp.asarray([1.0, 2.0]), "b": jnp.asarray(4.0)}
  params = {"a": jnp.asarray([3.0, 5.0]), "b": jnp.asarray(0.0)}
  out = jax.jit(ema_update)(ema, params, 0.9)
  np.testing.assert_allclose(np.asarray(out["a"]), [1.2, 2.3], rtol=1e-6)
  np.testing.assert_allclose(float(out["b"]), 3.6, rtol=1e-6)
  # No bias correction: from zeros, one step gives (1 - decay) * params.
  zeros = jax.tree.map(jnp.zeros_like, params)
  out = ema_update(zeros, params, 0.999)
  np.testing.assert_allclose(np.asarray(out["a"]), [0.003, 0.005], rtol=1e-5)


def test_warmup_ratio_warms_up_over_a_share_of_the_run():
  """config.optim.warmup_ratio (Hugging Face's): ceil(ratio x total_steps)
  warmup steps, in the optimizer and both rates of the train step; a
  warmup set both ways is refused in one line, before anything is built."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  from trm.core import run_checks  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  from trm.families.trm import task as trm_task  # pylint: disable=g-import-not-at-top
  optim = ml_collections.ConfigDict(dict(
      lr=1.0, lr_min_ratio=1.0, warmup_steps=0, warmup_ratio=0.1, beta1=0.9,
      beta2=0.95, weight_decay=0.0))
  assert config_lib.warmup_steps(optim, 95) == 10  # ceil(9.5)
  assert config_lib.warmup_steps(dict(warmup_steps=7), 95) == 7
  # The first update is at a tenth of the peak, as with warmup_steps=10 (a
  # warmup of 0 steps: the peak).
  params, grads = {"w": jnp.zeros(3)}, {"w": jnp.ones(3)}
  first = [tx.update(grads, tx.init(params), params)[0]["w"]
           for tx in (trm_steps.make_optimizer(optim, 95),
                      trm_steps.make_optimizer(ml_collections.ConfigDict(
                          dict(optim, warmup_steps=10, warmup_ratio=0.0)),
                                               95))]
  np.testing.assert_array_equal(first[0], first[1])
  assert 0 < -float(first[0][0]) < 0.2
  # A longer resume would stretch the warmup: refused by config_record.
  assert trm_task.schedule_spans_run(ml_collections.ConfigDict(
      dict(optim=optim)))
  config = ml_collections.ConfigDict(dict(total_steps=95, optim=optim))
  config.optim.warmup_steps = 2000
  with pytest.raises(ValueError, match=r"^config\.optim\.warmup_ratio=0\.1 "
                     r"and config\.optim\.warmup_steps=2000 both set the "
                     r"warmup: set warmup_steps=0 to warm up over "
                     r"ceil\(warmup_ratio x total_steps\) = 10 steps"):
    run_checks.check_warmup(config)


def test_default_optimizer_is_upstreams_adam_atan2_as_before():
  """config.optim.optimizer='adam_atan2' (the default), and a config from
  before the field, build upstream's AdamATan2 itself (its state, not a
  chain; the `lr` metric reads its count), bit for bit as every recorded
  run trained; another choice is built with the same schedule."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.families.trm import steps as trm_steps  # pylint: disable=g-import-not-at-top
  old = dict(lr=1e-2, lr_min_ratio=0.5, warmup_steps=2, beta1=0.9,
             beta2=0.95, weight_decay=0.1)
  schedule = lr_schedule(1e-2, 2, 20, 0.5)
  params = {"w": jnp.linspace(-1.0, 1.0, 6).reshape(2, 3)}
  grads = {"w": jnp.cos(params["w"])}

  def step(tx):
    state = tx.init(params)
    return jax.jit(tx.update)(grads, state, params)

  want_updates, want_state = step(adam_atan2(schedule, b1=0.9, b2=0.95,
                                             weight_decay=0.1))
  for optim in (old, dict(old, optimizer="adam_atan2")):
    updates, state = step(trm_steps.make_optimizer(
        ml_collections.ConfigDict(optim), 20))
    assert isinstance(state, AdamATan2State)
    for a, b in zip(jax.tree.leaves((updates, state)),
                    jax.tree.leaves((want_updates, want_state))):
      np.testing.assert_array_equal(a, b)
  lion = trm_steps.make_optimizer(
      ml_collections.ConfigDict(dict(old, optimizer="lion")), 20)
  assert float(state_lib.learning_rate(schedule, lion.init(params)).value) \
      == pytest.approx(float(schedule(0)))
