"""Tests for trm.core.mesh: mesh construction, config errors, logical sharding."""

import logging
import math
import os
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P
import repo

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.families.trm import state as trm_state
from trm.families.trm import steps
from trm.families.trm import model as trm

RULES = config_lib.default_logical_axis_rules()
_CONFIG_FILE = os.path.join(repo.ROOT, "configs",
                            "trm_sudoku.py")


def _mesh(**kw):
  return mesh_lib.make_mesh(config_lib.mesh_config(**kw))


def _load_sudoku_config(arg):
  return config_lib.load_config(_CONFIG_FILE, arg)


def test_eight_cpu_devices():
  assert jax.device_count() == 8


# ------------------------------------------------------------------ make_mesh


def test_make_mesh_2x2x2():
  mesh = _mesh(data=2, fsdp=2, model=2)
  assert mesh.axis_names == ("data", "fsdp", "model")
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "model": 2}
  assert mesh.axis_types == (AxisType.Auto,) * 3
  assert sorted(d.id for d in mesh.devices.flat) == list(range(8))


@pytest.mark.parametrize("kw,expected", [
    (dict(data=-1, model=2), (4, 1, 2)),
    (dict(data=2, fsdp=-1, model=1), (2, 4, 1)),
    (dict(data=1, fsdp=2, model=-1), (1, 2, 4)),
    (dict(data=-1), (8, 1, 1)),
])
def test_make_mesh_resolves_minus_one(kw, expected):
  mesh = _mesh(**kw)
  assert tuple(mesh.shape[a] for a in mesh_lib.MESH_AXES) == expected
  assert mesh.axis_types == (AxisType.Auto,) * 3


def test_mesh_shapes_dcn():
  cfg = config_lib.mesh_config(data=-1, fsdp=2, model=1, dcn_data=2)
  ici, dcn = mesh_lib.mesh_shapes(cfg, 8)
  assert ici == (2, 2, 1)
  assert dcn == (2, 1, 1)


def test_make_mesh_dcn_data_is_outermost():
  mesh = _mesh(data=-1, fsdp=2, model=1, dcn_data=2)
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}
  ids = np.vectorize(lambda d: d.id)(mesh.devices)
  # Slice 0 (devices 0-3) holds data rows 0-1, slice 1 (4-7) rows 2-3.
  assert set(ids[:2].ravel()) == {0, 1, 2, 3}
  assert set(ids[2:].ravel()) == {4, 5, 6, 7}


def test_make_mesh_dcn_with_ici_data():
  mesh = _mesh(data=2, fsdp=1, model=2, dcn_data=2)
  assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "model": 2}


def test_make_mesh_explicit_devices():
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=-1),
                            devices=jax.devices()[:4])
  assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "model": 1}


# --------------------------------------------------------------------- errors


@pytest.mark.parametrize("kw,needles", [
    (dict(data=2, fsdp=2, model=1), ["mesh.data", "4 devices", "8"]),
    (dict(data=-1, fsdp=-1), ["config.mesh.data", "config.mesh.fsdp", "-1"]),
    (dict(data=-1, fsdp=3), ["mesh.fsdp", "does not divide"]),
    (dict(data=0, fsdp=1), ["config.mesh.data=0"]),
    (dict(data=-1, model=-2), ["config.mesh.model=-2"]),
    (dict(data=8, fsdp=1, model=0), ["config.mesh.model=0"]),
])
def test_make_mesh_errors_name_the_field(kw, needles):
  with pytest.raises(mesh_lib.MeshConfigError) as err:
    _mesh(**kw)
  for needle in needles:
    assert needle in str(err.value)


def test_device_only_kernels_on_cpu_devices_name_the_field():
  mesh = _mesh()
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"config.model.mlp_kernel='pallas' runs on TPU "
                     r"only, and this mesh's devices are cpu.*"
                     r"'pallas_interpret'"):
    mesh_lib.check_tpu_kernels(mesh, attention="dot", mlp_kernel="pallas")
  with pytest.raises(mesh_lib.MeshConfigError, match="attention='splash'"):
    mesh_lib.check_tpu_kernels(mesh, attention="splash")
  # XLA's path and the interpreter run anywhere (trm.aot's TPU meshes pass:
  # tests/test_aot.py compiles the kernels).
  mesh_lib.check_tpu_kernels(mesh, attention="splash_interpret",
                             mlp_kernel="pallas_interpret")
  mesh_lib.check_tpu_kernels(mesh, attention="dot", mlp_kernel="dot")
  # The GPU-only kernel likewise (mlp_gpu's Triton token mixer).
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"config.model.mlp_kernel='triton' runs on NVIDIA "
                     r"GPUs only, and this mesh's devices are cpu.*"
                     r"'triton_interpret'"):
    mesh_lib.check_tpu_kernels(mesh, mlp_kernel="triton")
  mesh_lib.check_tpu_kernels(mesh, mlp_kernel="triton_interpret")


def test_mesh_config_error_is_value_error():
  assert issubclass(mesh_lib.MeshConfigError, ValueError)


def test_dcn_not_dividing_devices():
  with pytest.raises(mesh_lib.MeshConfigError, match="dcn"):
    _mesh(data=-1, dcn_data=3)


def test_dcn_zero():
  cfg = config_lib.mesh_config(data=-1)
  cfg.dcn_model = 0
  with pytest.raises(mesh_lib.MeshConfigError, match="dcn_model=0"):
    mesh_lib.make_mesh(cfg)


def test_dcn_leaves_wrong_ici_product():
  # 2 slices of 4 devices each, but the ICI sizes ask for 8 per slice.
  with pytest.raises(mesh_lib.MeshConfigError, match="mesh.data"):
    _mesh(data=2, fsdp=2, model=2, dcn_data=2)


@pytest.mark.parametrize("batch", [6, 2, 0, -4])
def test_check_batch_size_not_divisible(batch):
  mesh = _mesh(data=2, fsdp=2, model=2)
  with pytest.raises(mesh_lib.MeshConfigError) as err:
    mesh_lib.check_batch_size(batch, mesh, RULES)
  assert "config.global_batch_size" in str(err.value)
  assert "4" in str(err.value)


def test_check_batch_size_names_custom_field():
  mesh = _mesh(data=2, fsdp=2, model=2)
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"config\.data\.eval_batch_size=10"):
    mesh_lib.check_batch_size(10, mesh, RULES, field="data.eval_batch_size")


def test_check_batch_size_ok():
  mesh = _mesh(data=2, fsdp=2, model=2)
  for batch in (4, 8, 768):
    mesh_lib.check_batch_size(batch, mesh, RULES)
  # The model axis does not split the batch: 2 is fine on data=1,fsdp=2.
  mesh_lib.check_batch_size(2, _mesh(data=1, fsdp=2, model=4), RULES)


def test_logical_rules_unknown_axis():
  cfg = types.SimpleNamespace(logical_axis_rules=(
      ("embed", "fsdp"), ("mlp", ("model", "tensor"))))
  with pytest.raises(mesh_lib.MeshConfigError) as err:
    mesh_lib.logical_rules(cfg)
  msg = str(err.value)
  assert "logical_axis_rules[1]" in msg and "'tensor'" in msg
  assert "'mlp'" in msg


def test_logical_rules_malformed_pair():
  cfg = types.SimpleNamespace(logical_axis_rules=(("embed", "fsdp", "x"),))
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"logical_axis_rules\[0\]"):
    mesh_lib.logical_rules(cfg)


@pytest.mark.parametrize("rule", [
    ("embed", 5),             # was TypeError: 'int' object is not iterable
    ("embed", [["fsdp"]]),    # was TypeError: unhashable type: 'list'
    ("embed", ("fsdp", None)), (5, "fsdp"), (None, "fsdp"), 5])
def test_logical_rules_not_of_strings_name_the_rule(rule):
  """A --config.logical_axis_rules entry of other types was a traceback."""
  cfg = types.SimpleNamespace(logical_axis_rules=(("mlp", "model"), rule))
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"logical_axis_rules\[1\]=.* must be a pair"):
    mesh_lib.logical_rules(cfg)


def test_logical_rules_are_hashable_tuples():
  cfg = types.SimpleNamespace(logical_axis_rules=[
      ["activation_batch", ["data", "fsdp"]], ["embed", "fsdp"],
      ["token", None]])
  rules = mesh_lib.logical_rules(cfg)
  assert rules == (("activation_batch", ("data", "fsdp")), ("embed", "fsdp"),
                   ("token", None))
  hash(rules)


def test_logical_rules_default_round_trip():
  cfg = types.SimpleNamespace(logical_axis_rules=RULES)
  assert mesh_lib.logical_rules(cfg) == RULES


def test_a_mesh_that_misses_a_slice_counts_its_devices_per_slice():
  # Before: "has 2 devices but 4 are available" on 8 devices, no word of
  # the slices.
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"has 2 devices but 4 are available in each of "
                     r"the 2 slices \(config\.mesh\.dcn_\* multiply to 2; 8 "
                     r"devices in all\)"):
    mesh_lib.mesh_shapes(config_lib.mesh_config(data=2, dcn_data=2), 8)
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"multiply to 3, which does not divide the 4 devices"
                     r" available in each of the 2 slices"):
    mesh_lib.mesh_shapes(config_lib.mesh_config(data=-1, fsdp=3,
                                                dcn_data=2), 8)
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"has 3 devices but 8 are available; set"):
    mesh_lib.mesh_shapes(config_lib.mesh_config(data=3), 8)


@pytest.mark.parametrize("sizes", [dict(data=8), dict(data=8, dcn_data=4),
                                   dict(data=-1, fsdp=3, dcn_data=3)])
def test_a_slice_count_mismatch_is_named_before_the_ici_sizes(sizes):
  """On two 8-device slices, data=8 without dcn_data=2 was refused as "has 8
  devices but 16 are available" (and with dcn_data=4 as 4 devices in each
  of 4 slices): the sizes were counted per slice of the config's."""
  devices = [types.SimpleNamespace(slice_index=i // 8, platform="tpu")
             for i in range(16)]
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"^The devices span 2 slice\(s\) but config\."
                     r"mesh\.dcn_\* multiply to \d; set "
                     r"--config\.mesh\.dcn_data=2\.$"):
    mesh_lib.make_mesh(config_lib.mesh_config(**sizes), devices)


def test_rules_that_leave_names_out_are_refused():
  """--config.logical_axis_rules replaces the whole list: one rule given on
  the command line left the batch and every other array replicated (no
  data parallelism on a data=4, fsdp=2 mesh), silently."""
  config = _load_sudoku_config("cpu")
  config.mesh.update(data=1, fsdp=-1)
  mesh_lib.ShardingContext.from_config(config)  # the defaults cover all
  config.logical_axis_rules = (("embed", "fsdp"),)
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"config\.logical_axis_rules has no rule for "
                     r"'activation_batch', .*'layers': .* \(the batch too: "
                     r"no data parallelism\)\. An override replaces"):
    mesh_lib.ShardingContext.from_config(config)
  # A name mapped to None is covered (replicated on purpose).
  config.logical_axis_rules = tuple(
      (name, None if name == "mlp" else axes) for name, axes in RULES)
  mesh_lib.ShardingContext.from_config(config)


# ------------------------------------------------------------ rule resolution


def test_first_matching_rule_wins():
  mesh = _mesh(data=2, fsdp=2, model=2)
  rules = (("embed", "fsdp"), ("embed", "model"), ("mlp", "model"))
  assert mesh_lib.logical_sharding(mesh, rules, ("embed",)).spec == P("fsdp")
  rules = (("embed", "model"), ("embed", "fsdp"))
  assert mesh_lib.logical_sharding(mesh, rules, ("embed",)).spec == P("model")


def test_default_rules_resolution():
  mesh = _mesh(data=2, fsdp=2, model=2)
  spec = lambda *names: mesh_lib.logical_sharding(mesh, RULES, names).spec
  assert spec("embed", "mlp") == P("fsdp", "model")
  assert spec("mlp", "embed") == P("model", "fsdp")
  assert spec("activation_batch", "activation_length",
              "activation_embed") == P(("data", "fsdp"), None, None)
  assert spec("token", "token_mlp") == P(None, "model")
  assert spec("puzzle", "puzzle_embed") == P(None, "fsdp")
  assert spec("vocab", "embed") == P("model", "fsdp")


def test_batch_parallelism():
  mesh = _mesh(data=2, fsdp=2, model=2)
  assert mesh_lib.batch_parallelism(mesh, RULES) == 4
  assert mesh_lib.batch_parallelism(
      mesh, (("activation_batch", "data"),
             ("activation_batch", ("data", "fsdp")))) == 2
  assert mesh_lib.batch_parallelism(mesh, (("activation_batch", None),)) == 1
  assert mesh_lib.batch_parallelism(_mesh(data=-1), RULES) == 8
  assert mesh_lib.batch_parallelism(_mesh(data=1, fsdp=1, model=-1),
                                    RULES) == 1


def test_fit_spec_drops_non_dividing_axes():
  mesh = _mesh(data=2, fsdp=2, model=2)
  fit = mesh_lib.fit_spec
  assert fit(P("model", "fsdp"), (11, 32), mesh) == P(None, "fsdp")
  assert fit(P(("data", "fsdp")), (6,), mesh) == P("data")
  assert fit(P(("data", "fsdp"), None), (8, 3), mesh) == P(("data", "fsdp"),
                                                           None)
  assert fit(P("fsdp"), (4, 5), mesh) == P("fsdp", None)


# --------------------------------------------------- parameters on a 2x2x2 mesh


def _tiny_cfg(mlp_t):
  return trm.TRMConfig(
      vocab_size=11, seq_len=6, num_puzzle_identifiers=4, hidden_size=32,
      num_heads=2, expansion=4.0, L_layers=1, H_cycles=2, L_cycles=2,
      halt_max_steps=2, puzzle_emb_ndim=32, puzzle_emb_len=16,
      pos_encodings="none" if mlp_t else "rope", mlp_t=mlp_t,
      forward_dtype="float32")


def _optim_config():
  return ml_collections.ConfigDict(dict(
      lr=1e-3, lr_min_ratio=1.0, warmup_steps=10, beta1=0.9, beta2=0.95,
      weight_decay=0.1, puzzle_emb_lr=1e-2, puzzle_emb_weight_decay=0.1,
      ema=True, ema_rate=0.99))


_STATES = {}


def _sharded_state(mlp_t):
  """(mesh, abstract state, state) on a (2, 2, 2) mesh, built once."""
  if mlp_t not in _STATES:
    mesh = _mesh(data=2, fsdp=2, model=2)
    model = trm.TRM(_tiny_cfg(mlp_t))
    tx = steps.make_optimizer(_optim_config(), total_steps=100)
    init_fn = trm_state.make_init_fn(model, tx, batch_size=8, seed=0)
    ctx = mesh_lib.ShardingContext(mesh, RULES)
    abstract, shardings = state_lib.abstract_state(init_fn, ctx)
    state = state_lib.init_state(init_fn, ctx, shardings)
    _STATES[mlp_t] = (mesh, abstract, state)
  return _STATES[mlp_t]


def _specs(tree):
  return jax.tree.map(lambda x: x.sharding.spec, tree)


@pytest.mark.parametrize("mlp_t", [False, True])
def test_param_shardings_follow_rules(mlp_t):
  mesh, _, state = _sharded_state(mlp_t)
  params = state.params
  layer = params["L_level"]["layers_0"]
  spec = lambda x: x.sharding.spec
  assert spec(layer["mlp"]["gate_up_proj"]["kernel"]) == P("fsdp", "model")
  assert spec(layer["mlp"]["down_proj"]["kernel"]) == P("model", "fsdp")
  if mlp_t:
    assert "self_attn" not in layer
    # [total_len=22, 2*256]: the token axis is never split.
    assert layer["mlp_t"]["gate_up_proj"]["kernel"].shape == (22, 512)
    assert spec(layer["mlp_t"]["gate_up_proj"]["kernel"]) == P(None, "model")
    assert spec(layer["mlp_t"]["down_proj"]["kernel"]) == P("model", None)
  else:
    assert "mlp_t" not in layer
    assert spec(layer["self_attn"]["qkv_proj"]["kernel"]) == P("fsdp", "model")
    assert spec(layer["self_attn"]["o_proj"]["kernel"]) == P("model", "fsdp")
  # Vocabulary 11 does not divide model=2: that dimension is replicated.
  assert spec(params["embed_tokens"]["embedding"]) == P(None, "fsdp")
  assert spec(params["lm_head"]["kernel"]) == P("fsdp", None)
  assert spec(params["q_head"]["kernel"]) == P("fsdp", None)
  assert spec(state.puzzle_emb["weights"]) == P(None, "fsdp")
  assert spec(state.buffers["H_init"]) == P("fsdp")
  for leaf in jax.tree.leaves(params):
    assert leaf.sharding.mesh.shape == mesh.shape


@pytest.mark.parametrize("mlp_t", [False, True])
def test_optimizer_and_ema_shardings_match_params(mlp_t):
  _, _, state = _sharded_state(mlp_t)
  params = _specs(state.params)
  assert _specs(state.opt_state.mu) == params
  assert _specs(state.opt_state.nu) == params
  assert _specs(state.ema_params) == params
  assert state.opt_state.count.sharding.spec == P()
  assert state.step.sharding.spec == P()


@pytest.mark.parametrize("mlp_t", [False, True])
def test_abstract_state_matches_real_state(mlp_t):
  _, abstract, state = _sharded_state(mlp_t)
  flat_a, tree_a = jax.tree.flatten(abstract)
  flat_s, tree_s = jax.tree.flatten(state)
  assert tree_a == tree_s
  for a, s in zip(flat_a, flat_s):
    assert a.shape == s.shape and a.dtype == s.dtype
    assert a.sharding.spec == s.sharding.spec


@pytest.mark.parametrize("mlp_t", [False, True])
def test_carry_sharded_over_batch(mlp_t):
  _, _, state = _sharded_state(mlp_t)
  carry = state.carry
  assert carry.z_H.shape == (8, 22, 32)
  assert carry.z_H.sharding.spec == P(("data", "fsdp"), None, None)
  assert carry.z_L.sharding.spec == P(("data", "fsdp"), None, None)
  assert carry.inputs.sharding.spec == P(("data", "fsdp"), None)
  assert carry.labels.sharding.spec == P(("data", "fsdp"), None)
  assert carry.steps.sharding.spec == P(("data", "fsdp"))
  assert carry.halted.sharding.spec == P(("data", "fsdp"))
  assert carry.puzzle_identifiers.sharding.spec == P(("data", "fsdp"))
  assert carry.z_H.addressable_shards[0].data.shape == (2, 22, 32)
  assert bool(np.all(np.asarray(carry.halted)))
  assert np.all(np.asarray(carry.labels) == trm.IGNORE_LABEL_ID)


@pytest.mark.parametrize("mlp_t", [False, True])
def test_each_device_holds_only_its_shard(mlp_t):
  _, _, state = _sharded_state(mlp_t)
  gate_up = state.params["L_level"]["layers_0"]["mlp"]["gate_up_proj"]["kernel"]
  assert gate_up.shape == (32, 512)
  shards = gate_up.addressable_shards
  assert len(shards) == 8
  assert all(s.data.shape == (16, 256) for s in shards)
  # Each (fsdp, model) block is held by the 2 devices of the data axis.
  blocks = {tuple((sl.start or 0) for sl in s.index) for s in shards}
  assert blocks == {(0, 0), (0, 256), (16, 0), (16, 256)}
  full = np.asarray(gate_up)
  for s in shards:
    np.testing.assert_array_equal(np.asarray(s.data), full[s.index])
  embed = state.params["embed_tokens"]["embedding"]
  assert embed.addressable_shards[0].data.shape == (11, 16)
  mu = state.opt_state.mu["L_level"]["layers_0"]["mlp"]["gate_up_proj"]
  mu = mu["kernel"]
  assert mu.addressable_shards[0].data.shape == (16, 256)
  table = state.puzzle_emb["weights"]
  assert table.addressable_shards[0].data.shape == (4, 16)


@pytest.mark.parametrize("mlp_t", [False, True])
def test_sharded_init_values(mlp_t):
  """The sharded initialiser gives the same values as a plain init."""
  _, _, state = _sharded_state(mlp_t)
  model = trm.TRM(_tiny_cfg(mlp_t))
  init_key, _ = jax.random.split(jax.random.PRNGKey(0))
  variables = jax.jit(
      lambda: nn.meta.unbox(trm.init_variables(model, init_key)))()
  for got, want in zip(jax.tree.leaves(state.params),
                       jax.tree.leaves(variables["params"])):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-6)
  np.testing.assert_array_equal(np.asarray(state.buffers["H_init"]),
                                np.asarray(variables["buffers"]["H_init"]))
  assert not np.any(np.asarray(state.puzzle_emb["weights"]))
  for m in jax.tree.leaves(state.opt_state.mu):
    assert not np.any(np.asarray(m))


# -------------------------------------------------------------- sudoku config


def test_sudoku_cpu_config_mesh():
  config = _load_sudoku_config("cpu")
  mesh = mesh_lib.make_mesh(config.mesh)
  assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "model": 1}
  rules = mesh_lib.logical_rules(config)
  assert rules == RULES
  mesh_lib.check_batch_size(config.global_batch_size, mesh, rules)
  mesh_lib.check_batch_size(config.data.eval_batch_size, mesh, rules,
                            field="data.eval_batch_size")
  assert mesh_lib.batch_parallelism(mesh, rules) == 8


def test_sudoku_paper_config_mesh():
  config = _load_sudoku_config(None)
  mesh = mesh_lib.make_mesh(config.mesh)
  assert math.prod(mesh.shape.values()) == 8
  mesh_lib.check_batch_size(config.global_batch_size, mesh,
                            mesh_lib.logical_rules(config))
  assert config.global_batch_size == 768


def test_sharding_context_entered_by_two_threads_at_once():
  """One object entered by two threads at once (two `DiffusionLM.generate`
  calls from a thread pool share its context): each thread's `with` must
  leave its own mesh and rules. A shared stack popped the other thread's
  contexts, failing with 'Token ... was created in a different Context'
  and leaving the mesh set in the thread that exited first."""
  import threading  # pylint: disable=g-import-not-at-top
  from trm.nn import platform as platform_lib  # pylint: disable=g-import-not-at-top
  ctx = mesh_lib.ShardingContext(_mesh(data=1, fsdp=-1, model=1), RULES)
  a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
  errors, after = [], {}

  def run(name, entered, wait_for, then):
    try:
      with ctx:
        entered.set()
        wait_for.wait(10)
      rules = nn.get_logical_axis_rules()
      after[name] = (rules, platform_lib._MESH_PLATFORM.get())  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      errors.append(f"{name}: {type(e).__name__}: {e}")
    finally:
      if then is not None:
        then.set()

  # A enters, B enters, A leaves, then B leaves.
  a = threading.Thread(target=run, args=("a", a_in, b_in, a_out))
  b = threading.Thread(target=run, args=("b", b_in, a_out, None))
  a.start()
  a_in.wait(10)
  b.start()
  a.join(20)
  b.join(20)
  assert not errors, errors
  assert after == {"a": ((), None), "b": ((), None)}


def test_parameters_left_whole_on_a_weight_splitting_mesh_are_warned(caplog):
  """MaxText's assert_params_sufficiently_sharded (sharding_tolerance 2%),
  as a warning: none was given before, whatever the rules left whole."""
  mesh = _mesh(data=2, fsdp=2, model=2)

  def param(shape, *spec):
    return jax.ShapeDtypeStruct(shape, np.float32, sharding=(
        jax.sharding.NamedSharding(mesh, P(*spec))))

  split = {"kernel": param((64, 64), "fsdp", "model"),
           "scale": param((64,), "fsdp")}  # whole along model
  # Each device: 64 * 64 / 4 + 64 / 2 elements, 1040 were all split.
  excess, names = mesh_lib.replicated_params(split, mesh)
  assert excess == pytest.approx(1056 / 1040 - 1) and names == ["['scale']"]
  assert mesh_lib.warn_if_params_replicated(split, mesh) < 0.02
  assert "not split" not in caplog.text
  # An override that mapped 'mlp' to None: the kernel is whole over model.
  whole = {**split, "kernel": param((64, 64), "fsdp", None)}
  with caplog.at_level(logging.WARNING):
    assert mesh_lib.warn_if_params_replicated(whole, mesh) == 1.0
  assert "Each device holds 100.0% more of the parameters" in caplog.text
  assert "fsdp=2, model=2" in caplog.text and "['kernel']" in caplog.text
  # A mesh that splits no weights (data parallel only) has nothing to warn of.
  assert mesh_lib.replicated_params(whole, _mesh(data=8)) == (0.0, [])
  # 1.5% of the elements whole on 8 weight-splitting devices is 10.8% more
  # on each (MaxText stops it); the share of elements let it pass unsaid.
  wide = _mesh(data=1, fsdp=4, model=2)
  caplog.clear()
  table = {"kernel": jax.ShapeDtypeStruct((1000, 64), np.float32, sharding=(
               jax.sharding.NamedSharding(wide, P("fsdp", "model")))),
           "table": jax.ShapeDtypeStruct((1000,), np.float32, sharding=(
               jax.sharding.NamedSharding(wide, P())))}
  with caplog.at_level(logging.WARNING):
    assert mesh_lib.warn_if_params_replicated(table, wide) == pytest.approx(
        9000 / 8125 - 1)
  assert "Each device holds 10.8% more" in caplog.text and "['table']" in (
      caplog.text)


def test_heads_the_model_axis_does_not_divide_are_one_named_line():
  """Two heads on model=8 trained with only the replicated-weights warning
  and XLA's rematerialization lines: none named the heads or the mesh
  field. Cross-slice factors and the rules' other axes are named too."""
  mesh = _mesh(data=1, fsdp=1, model=8)
  line = mesh_lib.unsplit_heads({"n_head": 2}, mesh, RULES)
  assert line.startswith(
      "config.model.n_head=2 is not a multiple of config.mesh.model=8, over "
      "which config.logical_axis_rules split the attention heads "
      "('activation_heads' -> model): XLA pads the 2 heads to 8 (6 of "
      "padding)")
  assert line.endswith("Use a mesh.model that divides n_head (1, 2), or map "
                       "'activation_heads' to None.")
  assert "\n" not in line
  # Heads the split divides, and rules that keep the heads whole: no line.
  assert mesh_lib.unsplit_heads({"n_head": 16}, mesh, RULES) is None
  whole = tuple((n, None if n == "activation_heads" else a) for n, a in RULES)
  assert mesh_lib.unsplit_heads({"n_head": 2}, mesh, whole) is None
  # model=4 within each of 2 slices: the split is 8, named as the config
  # sets it.
  config = config_lib.mesh_config(data=1, fsdp=1, model=4)
  config.dcn_model = 2
  line = mesh_lib.unsplit_heads({"num_heads": 12}, mesh_lib.make_mesh(config),
                                RULES, config)
  assert line.startswith("config.model.num_heads=12 is not a multiple of "
                         "config.mesh.model=4 x config.mesh.dcn_model=2")
  assert "pads the 12 heads to 16 (4 of padding)" in line
  # Only sizes a mesh of these 8 devices can take (3 and 6 divide the
  # heads, not the devices).
  assert "Use mesh.model, mesh.dcn_model whose product divides num_heads " \
      "(1, 2, 4)" in line
  # Heads split over fsdp and model (an override; the batch over data
  # alone, as the default batch rule takes fsdp first): both sizes named.
  both = tuple((n, {"activation_heads": ("fsdp", "model"),
                    "activation_batch": "data"}.get(n, a)) for n, a in RULES)
  line = mesh_lib.unsplit_heads({"num_attention_heads": 6},
                                _mesh(data=2, fsdp=2, model=2), both)
  assert "not a multiple of config.mesh.fsdp=2 x config.mesh.model=2" in line
  # model=-1 takes the devices left: the line names the size it took.
  config = config_lib.mesh_config(data=1, fsdp=1, model=-1)
  line = mesh_lib.unsplit_heads({"n_head": 6}, mesh_lib.make_mesh(config),
                                RULES, config)
  assert line.startswith("config.model.n_head=6 is not a multiple of "
                         "config.mesh.model=8 (-1: the devices left), ")
  assert "divides n_head (1, 2), or" in line


@pytest.mark.parametrize("taken_by, axes", [
    ("activation_batch", ("data", "fsdp", "model")),
    ("activation_length", "model")])
def test_heads_whose_model_axis_another_activation_axis_takes_are_whole(
    taken_by, axes):
  """Rules that split the batch or the sequence over model (sequence
  parallelism) leave the heads whole in the attention's constraint (a mesh
  axis splits one dimension, the first to claim it): nothing to warn."""
  rules = tuple((n, axes if n == taken_by else a) for n, a in RULES)
  assert mesh_lib.unsplit_heads({"n_head": 2}, _mesh(data=1, fsdp=1,
                                                     model=8), rules) is None


# ------------------------------------------------------------ per_batch_shard
@pytest.mark.parametrize("shape, rules", [
    # The batch over fsdp alone: the sum reduce-scatters over fsdp into
    # the width.
    ((1, 8, 1), (("activation_batch", ("data", "fsdp")), ("embed", "fsdp"),
                 ("vocab", "model"))),
    # A tuple entry (fsdp major, data minor), both batch axes.
    ((2, 4, 1), (("activation_batch", ("data", "fsdp")),
                 ("embed", ("fsdp", "data")), ("vocab", None))),
    # Batch over data x fsdp, the width over fsdp, the vocabulary over
    # model (no batch there: each device keeps its own slice).
    ((2, 2, 2), (("activation_batch", ("data", "fsdp")), ("embed", "fsdp"),
                 ("vocab", "model"))),
    # An entry mixing a batch axis and another (summed, then sliced).
    ((2, 2, 2), (("activation_batch", ("data", "fsdp")),
                 ("embed", ("model", "fsdp")), ("vocab", None))),
    # The batch not split at all: each device slices the same sum.
    ((1, 1, 8), (("activation_batch", None), ("embed", "model"),
                 ("vocab", None))),
])
def test_per_batch_shard_lays_a_sum_out_as_its_names_say(shape, rules):
  """A summed output given logical names leaves laid out as they say, with
  the values of the whole sum (against a sum made without the mesh)."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 3, 8)).astype(np.float32)
  w = rng.normal(size=(24, 8)).astype(np.float32)

  def fn(x, w):  # per rows: a [24, 8] sum and the rows' own outputs
    return jnp.einsum("btc,vc->vc", x, w), x * 2.0

  want = jnp.einsum("btc,vc->vc", x, w)
  mesh = jax.make_mesh(shape, mesh_lib.MESH_AXES,
                       axis_types=(AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    xs = jax.device_put(x, mesh_lib.logical_sharding(
        mesh, rules, ("activation_batch", None, None)))

    @jax.jit
    def run(x, w):
      return mesh_lib.per_batch_shard(fn, (x,), (w,), batch_axis=0,
                                      reduce_outputs=(0,),
                                      reduced_layouts={0: ("vocab", "embed")})

    total, doubled = run(xs, jnp.asarray(w))
  spec = mesh_lib.logical_sharding(mesh, rules, ("vocab", "embed")).spec
  assert total.sharding.is_equivalent_to(
      jax.sharding.NamedSharding(mesh, spec), 2), (total.sharding, spec)
  np.testing.assert_allclose(np.asarray(total), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(doubled), x * 2.0)


def test_per_batch_shard_refuses_a_layout_for_an_unsummed_output():
  mesh = jax.make_mesh((1, 8, 1), mesh_lib.MESH_AXES,
                       axis_types=(AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    with pytest.raises(ValueError, match="reduced_layouts names output 1"):
      mesh_lib.per_batch_shard(lambda x: (x, x), (np.ones((8, 2)),), (),
                               batch_axis=0, reduce_outputs=(0,),
                               reduced_layouts={1: ("embed", None)})
