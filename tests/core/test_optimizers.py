"""The choice of optimizer (`trm.core.optimizers`): every family's
`make_optimizer` builds each choice, its state is sharded on a 2x2x2 mesh
(Adafactor's factored statistics too), it steps, and it is optax's."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import repo

from trm.core import config_lib
from trm.core import lm_state
from trm.core import mesh as mesh_lib
from trm.core import optimizers
from trm.core import state as state_lib
from trm.families.dream import steps as dream_steps
from trm.families.gpt import steps as gpt_steps
from trm.families.trm import optim as trm_optim
from trm.families.trm import steps as trm_steps


def _family_optimizer(family: str, name: str):
  """(tx, schedule) of `family`'s make_optimizer with optimizer `name`."""
  if family == "gpt":
    c = config_lib.load_config(f"{repo.ROOT}/configs/gpt.py",
                               "shakespeare_char_cpu")
    c = config_lib.set_values(c, dict(optimizer=name, warmup_iters=0))
    return gpt_steps.make_optimizer(c), gpt_steps.learning_rate_schedule(c)
  path = {"trm": "trm_sudoku.py", "dream": "diffucoder_7b.py"}[family]
  c = config_lib.load_config(f"{repo.ROOT}/configs/{path}",
                             "cpu" if family == "trm" else "tiny")
  c = config_lib.set_values(c, {"optim.optimizer": name, "optim.lr": 1e-2,
                                "optim.warmup_steps": 0})
  make = {"trm": trm_steps, "dream": dream_steps}[family].make_optimizer
  schedule = (trm_optim.lr_schedule(1e-2, 0, 100, c.optim.lr_min_ratio)
              if family == "trm"
              else dream_steps.learning_rate_schedule(c.optim, 100))
  return make(c.optim, 100), schedule


def _boxed_params(key):
  """A tiny model's parameters with logical axes: a 256 x 128 kernel
  (Adafactor factors its second moment: both sides >= 128), a bias and a
  norm scale (GPT's mask decays neither)."""
  k1, k2 = jax.random.split(key)
  box = nn.LogicallyPartitioned
  return {"c_fc": {"kernel": box(jax.random.normal(k1, (256, 128)) * 0.1,
                                 ("embed", "mlp")),
                   "bias": box(jnp.zeros((128,)), ("mlp",))},
          "ln_f": {"scale": box(1 + 0.1 * jax.random.normal(k2, (256,)),
                                ("embed",))}}


def _loss(params, x):
  h = jnp.tanh((x * params["ln_f"]["scale"]) @ params["c_fc"]["kernel"]
               + params["c_fc"]["bias"])
  return jnp.mean((h - 0.5) ** 2)


# (family, choice) pairs stepped together on the mesh: every choice and
# every family's make_optimizer (GPT's decay mask, DiffuCoder's clipping,
# TRM's choices other than its own).
_ON_THE_MESH = [("gpt", "adamw"), ("gpt", "adam_atan2"), ("gpt", "lion"),
                ("trm", "sgd"), ("trm", "adamw"), ("dream", "adafactor")]


def test_each_choice_steps_a_state_sharded_on_a_2x2x2_mesh():
  """Moments shaped like a parameter are sharded like it; Adafactor's row
  and column statistics (another rank) are replicated (before, they kept
  the kernel's two names and the state's shardings could not be laid
  out: "only valid for values of rank at least 2"). One jitted step with
  the state's shardings in and out (all choices in one program, one
  compile): loss finite, every parameter moved, the `lr` metric found."""
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  ctx = mesh_lib.ShardingContext(mesh, config_lib.default_logical_axis_rules())
  built = {f"{family}-{name}": _family_optimizer(family, name)
           for family, name in _ON_THE_MESH}

  def init():
    params = _boxed_params(jax.random.PRNGKey(0))
    return {key: {"params": params, "opt_state": tx.init(params)}
            for key, (tx, _) in built.items()}

  abstract, shardings = state_lib.abstract_state(init, ctx)
  state = state_lib.init_state(init, ctx, shardings)
  x = jnp.ones((4, 256))

  def step(state):
    new, out = {}, {}
    for key, (tx, schedule) in built.items():
      params, opt_state = state[key]["params"], state[key]["opt_state"]
      loss, grads = jax.value_and_grad(_loss)(params, x)
      updates, new_opt_state = tx.update(grads, opt_state, params)
      new[key] = {"params": optax.apply_updates(params, updates),
                  "opt_state": new_opt_state}
      out[key] = (loss, state_lib.learning_rate(schedule, opt_state).value)
    return new, out

  with ctx:
    new, out = jax.jit(step, in_shardings=(shardings,),
                       out_shardings=(shardings, None))(state)
  assert jax.tree.structure(abstract) == jax.tree.structure(new)
  replicated = lambda spec: all(a is None for a in spec)  # noqa: E731
  for key, (_, schedule) in built.items():
    loss, lr = out[key]
    assert np.isfinite(float(loss)), key
    assert float(lr) == pytest.approx(float(schedule(0))) and lr > 0, key
    for before, after in zip(jax.tree.leaves(state[key]["params"]),
                             jax.tree.leaves(new[key]["params"])):
      assert not np.array_equal(before, after), key
    kernel = new[key]["params"]["c_fc"]["kernel"].sharding.spec
    assert kernel == jax.sharding.PartitionSpec("fsdp", "model")
    specs = [(leaf.shape, leaf.sharding.spec)
             for leaf in jax.tree.leaves(new[key]["opt_state"])]
    if key.endswith("adafactor"):
      # The factored statistics: one per row, one per column.
      assert {(256,), (128,)} <= {shape for shape, spec in specs
                                  if replicated(spec)}, key
      assert (256, 128) not in {shape for shape, _ in specs}, key
    else:
      assert ((256, 128), kernel) in specs, key


def _grads(n):
  rng = np.random.default_rng(0)
  return [{"w": jnp.asarray(rng.normal(size=(130, 129)), jnp.float32),
           "b": jnp.asarray(rng.normal(size=(129,)), jnp.float32)}
          for _ in range(n)]


def _run(tx, params, grads):
  """params after len(grads) steps of `tx` (one jitted program)."""
  def run(params, grads):
    state = tx.init(params)
    for g in grads:
      updates, state = tx.update(g, state, params)
      params = optax.apply_updates(params, updates)
    return params
  return jax.jit(run)(params, grads)


@pytest.mark.parametrize("name", ["adafactor", "sgd", "lion"])
def test_choices_step_as_optax_on_the_same_gradients(name):
  """Without weight decay each choice is optax's own (Adafactor's factored
  130 x 129 and unfactored moments, SGD's momentum beta1); with it, the
  decay is decoupled: p <- p - lr x wd x p on top of the step."""
  schedule = lambda count: 0.01 / (1.0 + count)  # noqa: E731
  params = {"w": jnp.full((130, 129), 0.5), "b": jnp.full((129,), -0.5)}
  grads = _grads(2)
  ours = optimizers.build(name, schedule, b1=0.8, b2=0.9, eps=1e-8,
                          weight_decay=0.0, field="config.optimizer")
  theirs = {"adafactor": optax.adafactor(schedule),
            "sgd": optax.sgd(schedule, momentum=0.8),
            "lion": optax.lion(schedule, b1=0.8, b2=0.9,
                               weight_decay=0.0)}[name]
  for a, b in zip(jax.tree.leaves(_run(ours, params, grads)),
                  jax.tree.leaves(_run(theirs, params, grads))):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # Decoupled decay on the masked leaves only: one step from zero
  # gradients moves w by -lr x wd x w (SGD, Lion: their step of a zero
  # gradient is zero) and leaves b.
  decayed = optimizers.build(name, schedule, b1=0.8, b2=0.9, eps=1e-8,
                             weight_decay=0.5, field="config.optimizer",
                             mask={"w": True, "b": False})
  zero = jax.tree.map(jnp.zeros_like, params)
  after = _run(decayed, params, [zero])
  np.testing.assert_allclose(after["w"], 0.5 * (1 - 0.01 * 0.5), rtol=1e-6)
  np.testing.assert_array_equal(after["b"], params["b"])


def test_adam_atan2_elsewhere_is_trms_at_the_schedules_rate():
  """Another family's AdamATan2 (the schedule apart, for GPT's skipped
  steps) steps as TRM's, with GPT's decay mask honoured."""
  schedule = lambda count: 0.01 / (1.0 + count)  # noqa: E731
  params = {"w": jnp.full((130, 129), 0.5), "b": jnp.full((129,), -0.5)}
  grads = _grads(2)
  mask = {"w": True, "b": False}
  ours = optimizers.build("adam_atan2", schedule, b1=0.9, b2=0.95, eps=1e-8,
                          weight_decay=0.1, field="config.optimizer",
                          mask=mask)
  got = _run(ours, params, grads)
  decayed = _run(trm_optim.adam_atan2(schedule, 0.9, 0.95, 0.1), params,
                 grads)
  plain = _run(trm_optim.adam_atan2(schedule, 0.9, 0.95, 0.0), params, grads)
  np.testing.assert_allclose(got["w"], decayed["w"], rtol=1e-6)
  np.testing.assert_allclose(got["b"], plain["b"], rtol=1e-6)


@pytest.mark.parametrize("field", ["config.optimizer",
                                   "config.optim.optimizer"])
def test_an_unknown_optimizer_is_one_line_listing_the_choices(field):
  for name in ("adam", "AdamW", 3, None):
    with pytest.raises(ValueError) as error:
      optimizers.check(name, field)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"{field}={name!r} ")
    assert str(list(optimizers.CHOICES)) in message
  for name in optimizers.CHOICES:
    optimizers.check(name, field)


@pytest.mark.parametrize("family,field", [("gpt", "optimizer"),
                                          ("trm", "optim.optimizer"),
                                          ("dream", "optim.optimizer")])
def test_each_familys_config_check_refuses_an_unknown_optimizer(family,
                                                                field):
  """Checked with the family's other fields (`run_checks.check_values`,
  before the mesh, any data or compile): one line naming the field."""
  from trm import families  # pylint: disable=g-import-not-at-top
  path, variant = {"gpt": ("gpt.py", "shakespeare_char_cpu"),
                   "trm": ("trm_sudoku.py", "cpu"),
                   "dream": ("diffucoder_7b.py", "tiny")}[family]
  config = config_lib.load_config(f"{repo.ROOT}/configs/{path}", variant)
  families.check_config(config_lib.set_values(config, {field: "lion"}))
  with pytest.raises(ValueError) as error:
    families.check_config(config_lib.set_values(config, {field: "adam"}))
  assert str(error.value).startswith(f"config.{field}='adam' is not an "
                                     "optimizer offered here: use one of "
                                     "['adamw', 'adam_atan2', 'adafactor', "
                                     "'lion', 'sgd'].")
