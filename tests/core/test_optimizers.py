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


def _family_optimizer(family: str, name: str, **mults):
  """(tx, schedule) of `family`'s make_optimizer with optimizer `name` and
  `mults` (lr_mults, wd_mults: config.optim's, GPT's config's)."""
  if family == "gpt":
    c = config_lib.load_config(f"{repo.ROOT}/configs/gpt.py",
                               "shakespeare_char_cpu")
    c = config_lib.set_values(c, dict(optimizer=name, warmup_iters=0,
                                      **mults))
    return gpt_steps.make_optimizer(c), gpt_steps.learning_rate_schedule(c)
  path = {"trm": "trm_sudoku.py", "dream": "diffucoder_7b.py"}[family]
  c = config_lib.load_config(f"{repo.ROOT}/configs/{path}",
                             "cpu" if family == "trm" else "tiny")
  c = config_lib.set_values(c, {"optim.optimizer": name, "optim.lr": 1e-2,
                                "optim.warmup_steps": 0,
                                **{f"optim.{k}": v for k, v in mults.items()}})
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


# A frozen bias (first match wins over the kernel's pattern), a kernel at
# half the rate, the norm scale untouched.
_LR_MULTS = (("c_fc/bias", 0.0), ("c_fc/.*", 0.5))


def test_lr_mults_zero_freezes_a_parameter_bit_identically():
  """Each family's make_optimizer (TRM's own AdamATan2, build's choices
  at GPT's and DiffuCoder's; all in one jitted program), its state made from boxed
  parameters: after a step the parameter an lr multiplier of 0 names
  is bit-identical (no step, no decay: TRM decays every weight by 1.0),
  the others moved. Before, config.optim.lr_mults (GPT: config.lr_mults)
  was no field."""
  txs = [_family_optimizer(family, name, lr_mults=_LR_MULTS)[0]
         for family, name in (("trm", "adam_atan2"), ("gpt", "adamw"),
                              ("dream", "adafactor"))]
  boxed = _boxed_params(jax.random.PRNGKey(0))
  before = nn.unbox(boxed)

  def run(opt_states):
    out = []
    for tx, opt_state in zip(txs, opt_states):
      grads = jax.grad(_loss)(before, jnp.ones((4, 256)))
      updates, _ = tx.update(grads, opt_state, before)
      out.append(optax.apply_updates(before, updates))
    return out

  for params in jax.jit(run)([nn.unbox(tx.init(boxed)) for tx in txs]):
    np.testing.assert_array_equal(params["c_fc"]["bias"],
                                  before["c_fc"]["bias"])
    assert not np.array_equal(params["c_fc"]["kernel"],
                              before["c_fc"]["kernel"])
    assert not np.array_equal(params["ln_f"]["scale"],
                              before["ln_f"]["scale"])


def test_a_half_lr_multiplier_halves_an_sgd_step_exactly():
  """SGD without momentum: the kernel's update is exactly half the plain
  step, the unmatched scale's is the plain step bit for bit."""
  schedule = lambda count: 0.1  # noqa: E731
  params = {"c_fc": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))},
            "ln_f": {"scale": jnp.ones((3,))}}
  grads = jax.tree.map(
      lambda p: jnp.linspace(-1.0, 1.0, p.size).reshape(p.shape), params)
  plain, scaled = (optimizers.build(
      "sgd", schedule, b1=0.0, b2=0.0, eps=0.0, weight_decay=0.0,
      field="config.optimizer", lr_mults=mults) for mults in ((), _LR_MULTS))
  want, _ = plain.update(grads, plain.init(params), params)
  got, _ = scaled.update(grads, scaled.init(params), params)
  np.testing.assert_array_equal(got["c_fc"]["kernel"],
                                0.5 * want["c_fc"]["kernel"])
  np.testing.assert_array_equal(got["ln_f"]["scale"], want["ln_f"]["scale"])
  np.testing.assert_array_equal(got["c_fc"]["bias"], 0.0)


def test_wd_mults_scale_the_decoupled_decay():
  """Every choice (one jitted program), from zero gradients (each
  choice's step is then zero): one step moves a decayed leaf by
  -lr x wd x mult x p: w doubled, v unmatched (1.0), u at 0 not decayed,
  b outside the family's mask not decayed whatever its multiplier. The
  optimizer's state tree is the one without multipliers (a checkpoint
  restores either way)."""
  schedule = lambda count: 0.01  # noqa: E731
  params = {"w": jnp.full((130, 129), 0.5), "v": jnp.full((3,), 2.0),
            "u": jnp.full((3,), 1.0), "b": jnp.full((129,), -0.5)}
  mask = {"w": True, "v": True, "u": True, "b": False}
  build = lambda name, mults: optimizers.build(  # noqa: E731
      name, schedule, b1=0.8, b2=0.9, eps=1e-8, weight_decay=0.5,
      field="config.optimizer", mask=mask, wd_mults=mults)
  txs = [build(name, (("w", 2.0), ("u|b", 0.0)))
         for name in optimizers.CHOICES]
  zero = jax.tree.map(jnp.zeros_like, params)

  def run(params):
    return [optax.apply_updates(
        params, tx.update(zero, tx.init(params), params)[0]) for tx in txs]

  for name, tx, after in zip(optimizers.CHOICES, txs, jax.jit(run)(params)):
    np.testing.assert_allclose(after["w"], 0.5 * (1 - 0.01 * 0.5 * 2.0),
                               rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(after["v"], 2.0 * (1 - 0.01 * 0.5),
                               rtol=1e-6, err_msg=name)
    np.testing.assert_array_equal(after["u"], params["u"], err_msg=name)
    np.testing.assert_array_equal(after["b"], params["b"], err_msg=name)
    assert (jax.tree.structure(tx.init(params))
            == jax.tree.structure(build(name, ()).init(params))), name


def test_multipliers_on_a_2x2x2_mesh():
  """GPT's AdamW with a frozen norm scale and a doubled kernel decay, its
  state laid out from logical axes and stepped under jit with the state's
  shardings: the multipliers are static per leaf, the shardings those
  without them, the frozen leaf bit-identical."""
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  ctx = mesh_lib.ShardingContext(mesh, config_lib.default_logical_axis_rules())
  tx, _ = _family_optimizer("gpt", "adamw", lr_mults=(("ln_f/.*", 0.0),),
                            wd_mults=(("c_fc/kernel", 2.0),))
  plain, _ = _family_optimizer("gpt", "adamw")

  def init(tx):
    params = _boxed_params(jax.random.PRNGKey(0))
    return {"params": params, "opt_state": tx.init(params)}

  _, shardings = state_lib.abstract_state(lambda: init(tx), ctx)
  _, plain_shardings = state_lib.abstract_state(lambda: init(plain), ctx)
  assert shardings == plain_shardings
  state = state_lib.init_state(lambda: init(tx), ctx, shardings)

  def step(state):
    params = state["params"]
    grads = jax.grad(_loss)(params, jnp.ones((4, 256)))
    updates, opt_state = tx.update(grads, state["opt_state"], params)
    return {"params": optax.apply_updates(params, updates),
            "opt_state": opt_state}

  with ctx:
    new = jax.jit(step, in_shardings=(shardings,),
                  out_shardings=shardings)(state)
  np.testing.assert_array_equal(new["params"]["ln_f"]["scale"],
                                state["params"]["ln_f"]["scale"])
  assert not np.array_equal(new["params"]["c_fc"]["kernel"],
                            state["params"]["c_fc"]["kernel"])
  assert new["params"]["c_fc"]["kernel"].sharding.spec == (
      jax.sharding.PartitionSpec("fsdp", "model"))


@pytest.mark.parametrize("mults,message", [
    ("ln_f", "config.optim.lr_mults='ln_f' is not a tuple of (regex, "
     "multiplier) pairs"),
    ((("ln_f", 0.0, 1),), "config.optim.lr_mults[0]=('ln_f', 0.0, 1) is not "
     "a (regex, multiplier) pair"),
    ((("ln_f", 1.0), ("c_fc/(kernel", 0.5)), "config.optim.lr_mults[1]: "
     "'c_fc/(kernel' is not a regular expression (missing ), unterminated "
     "subpattern at position 5)"),
    ((("ln_f", "0.5"),), "config.optim.lr_mults[0]: the multiplier '0.5' of "
     "'ln_f' is not a finite number >= 0"),
    ((("ln_f", True),), "config.optim.lr_mults[0]: the multiplier True"),
    ((("ln_f", -1.0),), "config.optim.lr_mults[0]: the multiplier -1.0"),
    ((("ln_f", float("nan")),), "config.optim.lr_mults[0]: the multiplier "
     "nan")])
def test_a_bad_multiplier_is_one_line_naming_the_field(mults, message):
  """Refused where the optimizer is built (before any compile)."""
  with pytest.raises(ValueError) as error:
    optimizers.build("adamw", lambda count: 0.1, b1=0.9, b2=0.95, eps=1e-8,
                     weight_decay=0.0, field="config.optim.optimizer",
                     lr_mults=mults)
  assert "\n" not in str(error.value)
  assert str(error.value).startswith(message)


def test_a_pattern_matching_no_parameter_is_one_line_naming_it():
  """As big_vision refuses it: a typo (or a pattern an earlier one took
  every match of) names the pattern and how names are written, when the
  state is laid out (abstractly, before the step compiles)."""
  boxed = _boxed_params(jax.random.PRNGKey(0))
  for mults, bad in (((("ln_f/scale", 0.5), ("/ln_f/scale", 0.0)), 1),
                     ((("c_fc/.*", 0.5), ("c_fc/bias", 0.0)), 1),
                     ((("mlp/.*", 0.0),), 0)):
    tx = optimizers.build("sgd", lambda count: 0.1, b1=0.0, b2=0.0, eps=0.0,
                          weight_decay=0.0, field="config.optimizer",
                          wd_mults=mults, mults_field="config")
    with pytest.raises(ValueError) as error:
      jax.eval_shape(tx.init, boxed)
    assert str(error.value) == (
        f"config.wd_mults[{bad}]: {mults[bad][0]!r} matches no parameter "
        "(not one an earlier pattern took): mend or drop it. Names are "
        "'/'-joined, without a leading '/', e.g. ['c_fc/bias', "
        "'c_fc/kernel', 'ln_f/scale'].")


@pytest.mark.parametrize("family,field", [("gpt", "lr_mults"),
                                          ("trm", "optim.wd_mults"),
                                          ("dream", "optim.lr_mults")])
def test_each_familys_config_check_refuses_a_bad_multiplier(family, field):
  """With the family's other checks (before the mesh, data or compile)."""
  from trm import families  # pylint: disable=g-import-not-at-top
  path, variant = {"gpt": ("gpt.py", "shakespeare_char_cpu"),
                   "trm": ("trm_sudoku.py", "cpu"),
                   "dream": ("diffucoder_7b.py", "tiny")}[family]
  config = config_lib.load_config(f"{repo.ROOT}/configs/{path}", variant)
  families.check_config(config_lib.set_values(config,
                                              {field: (("a.*", 0.5),)}))
  with pytest.raises(ValueError) as error:
    families.check_config(config_lib.set_values(config, {field: (("(", 1),)}))
  assert str(error.value).startswith(f"config.{field}[0]: '(' is not a "
                                     "regular expression")
