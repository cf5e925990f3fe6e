"""Gradients reduced over the data-parallel devices once per step
(`trm.core.data_parallel`), on the 8 CPU devices."""
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trm.core import config_lib
from trm.core import data_parallel
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.core import task as task_lib
from trm.forecast import hlo
from trm.families.gpt import program as gpt_program
from trm.families.gpt import steps as gpt_steps
from trm.families.trm import layers as trm_layers

RULES = config_lib.default_logical_axis_rules()


def _ctx(data, fsdp=1, model=1, dcn_data=1, rules=RULES):
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(
      data=data, fsdp=fsdp, model=model, dcn_data=dcn_data))
  return mesh_lib.ShardingContext(mesh, mesh_lib.logical_rules(
      ml_collections.ConfigDict(dict(logical_axis_rules=rules))))


def _one_device(rules=RULES):
  return mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=1),
                         devices=jax.devices()[:1]), rules)


@pytest.mark.parametrize("sizes, axes", [
    (dict(data=8), ("data",)),
    (dict(data=2, dcn_data=4), ("data",)),   # across and inside slices
    (dict(data=2, fsdp=4), ("data",)),       # fsdp also splits weights
    (dict(data=1, fsdp=8), ()),
    (dict(data=1, fsdp=1, model=8), ()),
])
def test_data_parallel_axes_split_the_batch_and_no_weight(sizes, axes):
  ctx = _ctx(**sizes)
  assert data_parallel.data_parallel_axes(ctx.mesh, ctx.rules) == axes


def test_an_axis_a_weight_rule_names_is_not_data_parallel():
  rules = tuple(RULES) + (("extra_weight_axis", "data"),)
  ctx = _ctx(data=8, rules=rules)
  assert data_parallel.data_parallel_axes(ctx.mesh, ctx.rules) == ()


def test_the_first_batch_rule_wins_even_when_it_is_none():
  """As flax reads the rules: a first 'activation_batch' rule of None
  leaves the batch whole, so no axis is data-parallel."""
  rules = (("activation_batch", None),) + tuple(RULES)
  ctx = _ctx(data=8, rules=rules)
  assert data_parallel.data_parallel_axes(ctx.mesh, ctx.rules) == ()


def test_rules_without_drops_the_axes_everywhere():
  rules = (("activation_batch", ("data", "fsdp")), ("embed", "fsdp"),
           ("mlp", "model"), ("x", ("data",)), ("y", None))
  assert data_parallel.rules_without(rules, {"data", "fsdp"}) == (
      ("activation_batch", None), ("embed", None), ("mlp", "model"),
      ("x", None), ("y", None))


def _grad_step(ctx, uses):
  """A weight applied `uses` times to the rows (as TRM's shared network
  is), its gradient through `sum_over_data`; (jitted step, w, x)."""
  w = jax.random.normal(jax.random.key(0), (16, 16)) / 4
  x = jax.random.normal(jax.random.key(1), (32, 16))

  def loss(w, x):
    h = x
    for _ in range(uses):
      h = jnp.tanh(mesh_lib.constrain(h, (mesh_lib.BATCH, None)) @ w)
    return jnp.sum(h ** 2), h

  def body(whole, rows):
    (value, h), grad = jax.value_and_grad(loss, has_aux=True)(whole, rows)
    return (value, grad), h

  shardings = (NamedSharding(ctx.mesh, P()),
               NamedSharding(ctx.mesh, P("data")))
  jitted = jax.jit(lambda w, x: data_parallel.sum_over_data(body, w, x),
                   in_shardings=shardings)

  def step(w, x, lower=False):
    with ctx:  # traced under the mesh and rules, as the trainer's steps
      return jitted.lower(w, x).compile() if lower else jitted(w, x)
  return step, w, x


def test_the_step_is_the_whole_batchs_and_reduces_once():
  """Same loss, gradient and per-row output as on one device; the
  compiled step holds one all-reduce (of the loss and the gradient,
  combined), not one per use."""
  ctx = _ctx(data=8)
  step, w, x = _grad_step(ctx, uses=6)
  (value, grad), h = step(w, x)
  (value1, grad1), h1 = _grad_step(_one_device(), uses=6)[0](w, x)
  np.testing.assert_allclose(value, value1, rtol=1e-5)
  np.testing.assert_allclose(grad, grad1, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(h, h1, rtol=1e-5, atol=1e-6)
  assert h.sharding.spec[0] == "data"
  text = step(w, x, lower=True).as_text()
  assert len(re.findall(r" all-reduce\(", text)) == 1


def _across_data(text, data):
  """Collectives of a compiled 8-device program (devices ordered data
  major) whose groups span several data-parallel indices, as
  {(in a loop body, opcode): count}."""
  module = hlo.parse_module(text)
  per_index = module.num_partitions // data
  in_loops = set()

  def walk(name, in_loop):
    for instruction in module.computations[name].instructions:
      body = (instruction.attr("body") or "").lstrip("%")
      for called in instruction.called():
        if called in module.computations:
          inside = in_loop or (instruction.opcode == "while"
                               and called == body)
          if inside:
            in_loops.add(called)
          walk(called, inside)

  walk(module.entry, False)
  found = {}
  for name, computation in module.computations.items():
    for instruction in computation.instructions:
      if not re.fullmatch(r"(all-reduce|reduce-scatter|all-gather|"
                          r"all-to-all|collective-permute)(-start)?",
                          instruction.opcode):
        continue
      groups = (hlo.source_target_pairs(instruction)
                if "permute" in instruction.opcode else
                hlo.replica_groups(instruction, module.num_partitions))
      if any(len({d // per_index for d in g}) > 1 for g in groups):
        key = (name in in_loops, instruction.opcode)
        found[key] = found.get(key, 0) + 1
  return found


def test_a_mesh_that_splits_weights_sums_each_groups_uses_once():
  """fsdp x model x data: the body runs under GSPMD (XLA's partitioner
  aborts on a step manual over data only), mapped over the data-parallel
  groups of rows; the same result as one device, and the uses' partial
  gradients cross the data axis in one all-reduce."""
  ctx = _ctx(data=2, fsdp=2, model=2)
  step, w, x = _grad_step(ctx, uses=3)
  (value, grad), h = step(w, x)
  ref = jax.value_and_grad(
      lambda w: jnp.sum(jnp.tanh(jnp.tanh(jnp.tanh(x @ w) @ w) @ w) ** 2))(w)
  np.testing.assert_allclose(value, ref[0], rtol=1e-5)
  np.testing.assert_allclose(grad, ref[1], rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(h, _grad_step(_one_device(), uses=3)[0](w, x)[1],
                             rtol=1e-5, atol=1e-6)
  assert _across_data(step(w, x, lower=True).as_text(), 2) == {
      (False, "all-reduce"): 1}


def test_bfloat16_token_mixing_runs_in_row_groups_on_cpu():
  """TRM's token mixer (`swiglu_residual_norm`, tokens on axis 0) in
  bfloat16, forward and backward, mapped over the row groups of a
  weight-splitting mesh: the group axis lands before the contracted one,
  a dot XLA:CPU cannot run in bfloat16 (the step failed at run time);
  `linear.widened_on_cpu` gives the one-device result."""
  tokens, width, inner = 16, 8, 12
  keys = jax.random.split(jax.random.key(0), 3)
  w_in = (jax.random.normal(keys[0], (tokens, 2 * inner)) / 4).astype(
      jnp.bfloat16)
  w_out = (jax.random.normal(keys[1], (inner, tokens)) / 4).astype(
      jnp.bfloat16)
  x = jax.random.normal(keys[2], (32, tokens, width)).astype(jnp.bfloat16)

  def body(w, rows):
    def loss(w):
      h = rows.swapaxes(0, 1).reshape(tokens, -1)   # [S, rows * width]
      y = trm_layers.swiglu_residual_norm(h, *w, 1e-5, True)
      return jnp.sum(y.astype(jnp.float32) ** 2)
    value, grad = jax.value_and_grad(loss)(w)
    return (value, grad), rows

  def run(ctx):
    with ctx:
      return jax.jit(lambda w, x: data_parallel.sum_over_data(body, w, x)[0])(
          (w_in, w_out), x)

  value, grads = run(_ctx(data=2, fsdp=2, model=2))
  value1, grads1 = run(_one_device())
  np.testing.assert_allclose(value, value1, rtol=1e-5)
  for a, b in zip(grads, grads1):
    # Each group's partial is rounded to bfloat16 before the groups' sum,
    # the whole gradient once on one device: a few bfloat16 steps apart.
    np.testing.assert_allclose(np.asarray(a, np.float32),
                               np.asarray(b, np.float32),
                               atol=0.05 * float(np.abs(b).max()))


def _gpt(ctx, accum, rows=32, dropout=0.0, ignored=0, reduce_once=True,
         **loss_terms):
  c = config_lib.load_config("configs/gpt.py", "shakespeare_char_cpu")
  config_lib.set_values(c, dict(
      n_layer=2, n_head=2, n_embd=16, block_size=8, dropout=dropout,
      gradient_accumulation_steps=accum, batch_size=rows // accum,
      grad_clip=0.0, reduce_gradients_once=reduce_once, **loss_terms))
  with c.unlocked():
    c.model.vocab_size = 11
    c.seed = 0
  program = gpt_program.build(c, ctx, {"vocab_size": 11})
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  step = task_lib.compile_train_step(program, ctx, rows, abstract, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  x = np.random.default_rng(0).integers(0, 11, (rows, 8)).astype(np.int32)
  y = (x + 1) % 11
  y[:ignored, 2:] = -1  # targets F.cross_entropy ignores, on some rows
  batch = {k: jax.device_put(v, batch_shardings[k])
           for k, v in (("x", x), ("y", y))}
  return state, step, batch


# The one-device iterations by their options: several tests compare their
# meshes' iteration with the same one (building and compiling it again cost
# a few seconds each).
_ONE_DEVICE = {}


def _gpt_on_eight_and_one(mesh=None, **options):
  """One iteration of the same GPT on 8 devices (data-parallel, or the
  `mesh` sizes) and on one: (the 8-device step, its new state and
  metrics, the one device's)."""
  state, step, batch = _gpt(_ctx(**(mesh or dict(data=8))), accum=4,
                            **options)
  new_state, metrics = step(state, batch)
  key = tuple(sorted(options.items()))
  if key not in _ONE_DEVICE:
    state1, step1, batch1 = _gpt(_one_device(), accum=4, **options)
    _ONE_DEVICE[key] = step1(state1, batch1)
  return step, (new_state, metrics), _ONE_DEVICE[key]


def _assert_same_iteration(got, want, params=True):
  (new_state, metrics), (new1, metrics1) = got, want
  assert metrics.keys() == metrics1.keys()
  for name in ("loss", "z_loss"):
    if name in metrics:
      assert float(metrics[name].compute()) == pytest.approx(
          float(metrics1[name].compute()), rel=1e-5), name
  if params:
    for a, b in zip(jax.tree.leaves(new_state.params),
                    jax.tree.leaves(new1.params)):
      np.testing.assert_allclose(a, b, atol=2e-6)


def test_gpt_accumulation_reduces_gradients_after_the_micro_steps():
  """nanoGPT's micro-batches on a data-parallel mesh: no all-reduce in
  the accumulation loop (GSPMD alone reduced every gradient in every
  micro-step), and the iteration is the one-device iteration."""
  step, got, want = _gpt_on_eight_and_one()
  text = step.as_text()
  assert "while" in text and " all-reduce(" in text
  assert (True, "all-reduce") not in _across_data(text, 8)
  _assert_same_iteration(got, want)


def test_gpt_micro_batches_smaller_than_the_mesh_keep_gspmd():
  """A micro-batch of 4 rows on 8 devices cannot be split per device:
  GSPMD's step, reducing in the loop, as before."""
  state, step, batch = _gpt(_ctx(data=8), accum=4, rows=16)
  assert (True, "all-reduce") in _across_data(step.as_text(), 8)
  _, metrics = step(state, batch)
  assert np.isfinite(float(metrics["loss"].compute()))


def test_gpt_dropout_draws_do_not_depend_on_the_mesh():
  """With dropout the micro-batch loop stays GSPMD's: its masks are the
  one-device step's, so the iteration is the same on 8 devices as on one
  (per-device draws made it depend on the mesh)."""
  _, got, want = _gpt_on_eight_and_one(dropout=0.2)
  _assert_same_iteration(got, want, params=False)


def test_gpt_ignored_targets_on_some_devices_keep_the_one_device_mean():
  """Targets of -1 on the first device's rows only: each micro-batch's
  loss is still the mean over all its scored targets (each device's mean
  weighed by its count), not the mean of the devices' means. With label
  smoothing and a z-loss (per-token terms, the same mean) as well."""
  _, got, want = _gpt_on_eight_and_one(ignored=4, label_smoothing=0.1,
                                       z_loss=1e-2)
  _assert_same_iteration(got, want)
  # The z-loss term alone (train/z_loss), a part of the loss.
  z_term = float(got[1]["z_loss"].compute())
  assert 0 < z_term < float(got[1]["loss"].compute())


# data-fsdp-model splits over fsdp too: data-fsdp alone is slow.
@pytest.mark.parametrize("mesh", [
    pytest.param(dict(data=2, fsdp=4), marks=pytest.mark.slow),
    dict(data=2, fsdp=2, model=2)], ids=["data-fsdp", "data-fsdp-model"])
def test_gpt_accumulation_on_a_weight_splitting_mesh_crosses_data_once(
    mesh):
  """With fsdp (and model) also > 1 the micro-batch loop stays GSPMD's,
  mapped over the data-parallel groups: no collective in the loop spans
  the data axis (GSPMD alone all-reduced gradients over it in every
  micro-step), and the iteration is the one-device iteration."""
  step, got, want = _gpt_on_eight_and_one(mesh)
  across = _across_data(step.as_text(), mesh["data"])
  assert not [k for k in across if k[0]]
  assert across.get((False, "all-reduce"))
  _assert_same_iteration(got, want)


@pytest.mark.parametrize("mesh", [dict(data=8), dict(data=2, fsdp=4)],
                         ids=["data", "data-fsdp"])
def test_reduce_gradients_once_false_keeps_gspmds_reductions(mesh):
  """`config.reduce_gradients_once=False`: the micro-batch loop is
  GSPMD's, reducing over the data axis in every micro-step, with the same
  iteration."""
  step, got, want = _gpt_on_eight_and_one(mesh, reduce_once=False)
  assert (True, "all-reduce") in _across_data(step.as_text(), mesh["data"])
  _assert_same_iteration(got, want)
