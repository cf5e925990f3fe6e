"""The HLO reader on programs XLA:TPU compiled for libtpu's compile-only
v4 devices, where the answer is known by hand."""
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
from trm.core.topology import parse_topology
from trm.core.topology import topology_devices
from trm.forecast import network
from trm.forecast import ops
from trm.forecast import timeline
from trm.nn import tpu_attention

# Compiles to compile-only TPU devices, whose executables the session's
# compilation cache cannot load back (JAX warns, then compiles again).
pytestmark = pytest.mark.usefixtures("no_compilation_cache")

V4_8 = parse_topology("v4-8")   # 4 chips, 2x2x1, per slice


def _program(fn, args, mesh, slices, out_shardings=None):
  compiled = jax.jit(fn, out_shardings=out_shardings).lower(*args).compile()
  return compiled, timeline.Program(
      compiled.as_text(), network.Fabric.for_mesh(mesh, V4_8, slices))


def _mesh(slices, data, fsdp):
  return mesh_lib.make_mesh(
      config_lib.mesh_config(data=data, fsdp=fsdp, model=1, dcn_data=slices),
      topology_devices(V4_8, slices))


@pytest.mark.parametrize("slices", [2, 4])
def test_data_parallel_dcn_bytes_are_the_ring_all_reduce_of_the_shard(slices):
  """Pure data parallelism: each slice reduces the gradient over ICI to a
  quarter per chip, the slices all-reduce those quarters over DCN."""
  mesh = _mesh(slices, data=4, fsdp=1)
  w = jax.ShapeDtypeStruct((512, 1024), jnp.float32,
                           sharding=NamedSharding(mesh, P()))
  x = jax.ShapeDtypeStruct((64 * slices, 512), jnp.float32,
                           sharding=NamedSharding(mesh, P("data")))

  def step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

  _, program = _program(step, (w, x), mesh, slices, w.sharding)
  totals = program.totals()
  shard = 512 * 1024 * 4 / 4
  assert totals.dcn_bytes == pytest.approx(2 * (slices - 1) / slices * shard)
  dcn = [k for k in totals.collectives if k[1] == "dcn"]
  assert [(k[0], k[3]) for k in dcn] == [("dcn-all-reduce", slices)]
  # Inside the slice: reduce-scatter and all-gather over the 2x2 torus.
  assert {k[2] for k in totals.collectives if k[1] == "ici"} == {"xy"}
  step_time = program.play(275e12, 0.5, 1.2e12)
  assert step_time.by_cause.get("dcn", 0) > 0


def test_a_scan_runs_its_body_trip_count_times():
  """XLA's cost_analysis counts the body once; the reader counts 12."""
  mesh = _mesh(1, data=4, fsdp=1)
  x = jax.ShapeDtypeStruct((4 * 256, 512), jnp.float32,
                           sharding=NamedSharding(mesh, P("data")))
  w = jax.ShapeDtypeStruct((12, 512, 512), jnp.float32,
                           sharding=NamedSharding(mesh, P()))

  def layers(x, w):
    return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)[0]

  compiled, program = _program(layers, (x, w), mesh, 1)
  per_layer = 2 * 256 * 512 * 512   # one chip's rows
  assert program.totals().flops == pytest.approx(12 * per_layer, rel=1e-3)
  xla = compiled.cost_analysis()
  xla = xla[0] if isinstance(xla, (list, tuple)) else xla
  assert xla["flops"] < 2 * per_layer   # the body, once
  assert program.totals().unknown_loops == 0


def test_fsdp_inside_one_slice_is_ici_only():
  """Weights split 4 ways gather over ICI (3/4 of them per chip); the
  gradient goes back as a reduce-scatter or an all-reduce; no DCN."""
  mesh = _mesh(1, data=1, fsdp=4)
  w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("fsdp")))
  x = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("fsdp")))

  def step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

  _, program = _program(step, (w, x), mesh, 1, w.sharding)
  totals = program.totals()
  assert totals.dcn_bytes == 0
  kinds = {k[0] for k in totals.collectives}
  assert "all-gather" in kinds, totals.collectives
  gathers = [k for k in totals.collectives if k[0] == "all-gather"]
  full = 1024 * 1024 * 2
  assert any(k[4] == full and k[5] == pytest.approx(0.75 * full)
             and k[3] == 4 and k[2] == "xy" for k in gathers), gathers
  step_time = program.play(275e12, 0.5, 1.2e12)
  assert step_time.by_cause.get("dcn", 0) == 0


def test_groups_map_to_the_torus_axes_of_their_mesh_axis():
  """A reduction over the mesh's `model` axis and one over `data` run on
  different torus axes of the 2x2 slice, one axis each: partition ids are
  placed through the mesh's own device order."""
  mesh = mesh_lib.make_mesh(
      config_lib.mesh_config(data=2, fsdp=1, model=2),
      topology_devices(V4_8, 1))
  x = jax.ShapeDtypeStruct((256, 256), jnp.float32,
                           sharding=NamedSharding(mesh, P("data", "model")))
  axes = {}
  for name, axis, out in (("model", 1, P("data")), ("data", 0, P("model"))):
    _, program = _program(lambda a, axis=axis: jnp.sum(a, axis=axis), (x,),
                          mesh, 1, NamedSharding(mesh, out))
    keys = [k for k in program.totals().collectives if k[1] == "ici"]
    assert len({k[2] for k in keys}) == 1, keys
    assert {k[3] for k in keys} == {2}, keys
    axes[name] = keys[0][2]
  assert len(axes["model"]) == 1 and len(axes["data"]) == 1
  assert axes["model"] != axes["data"]


@pytest.mark.parametrize("once", [False, True])
@pytest.mark.parametrize("fsdp", [1, 4], ids=["data", "fsdp"])
def test_a_weight_used_six_times_crosses_the_slices_once(once, fsdp):
  """TRM's shared network, in miniature: one bfloat16 weight applied six
  times to the rows on 2 slices. Under GSPMD alone XLA:TPU reduces each
  use's partial gradient across the slices (six DCN all-reduces, in
  bfloat16); `data_parallel.sum_over_data` sums them on each chip and
  crosses the slices once, in float32. With the weight split over the
  slice (FSDP, data across the slices), the same: the uses are summed
  per slice and cross once."""
  mesh = _mesh(2, data=4 // fsdp, fsdp=fsdp)
  ctx = mesh_lib.ShardingContext(
      mesh, mesh_lib.logical_rules(ml_collections.ConfigDict(
          dict(logical_axis_rules=config_lib.default_logical_axis_rules()))))
  w = jax.ShapeDtypeStruct((512, 512), jnp.float32, sharding=NamedSharding(
      mesh, P("fsdp" if fsdp > 1 else None)))
  x = jax.ShapeDtypeStruct((64, 512), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P(("data", "fsdp"))))

  def loss(w, x):
    h = x
    for _ in range(6):
      h = jnp.tanh(h @ w.astype(jnp.bfloat16))
    return jnp.sum(h.astype(jnp.float32))

  def body(w, x):
    return jax.grad(loss)(w, x), ()

  def step(w, x):
    grad = (data_parallel.sum_over_data(body, w, x)[0] if once
            else body(w, x)[0])
    return w - 0.1 * grad

  with ctx:
    _, program = _program(step, (w, x), mesh, 2, w.sharding)
  dcn = {k: n for k, n in program.totals().collectives.items()
         if k[1] == "dcn"}
  assert {k[0] for k in dcn} == {"dcn-all-reduce"}, dcn
  if once:
    assert sum(dcn.values()) == 1, dcn
    ((_, _, _, _, payload, _),) = dcn
    assert payload == 512 * 512 * 4 / 4   # float32, a quarter per chip
  else:
    assert sum(dcn.values()) == 6, dcn


@pytest.mark.parametrize("causal", [True, False])
def test_splash_attention_calls_are_charged_the_blocks_they_compute(causal):
  """jax's splash kernels declare no cost: before, the forecast charged
  them nothing (MaxText-shaped GPTs at 2,048 tokens lost 5-8% of their
  step). Each call of a kernel our wrapper scopes is now charged 2 x its
  matmuls x batch x heads x head dim x the query-key area of the blocks it
  computes: 3 of 4 512-blocks of a causal 1,024 x 1,024 mask, all 4 of a
  full one; forward 2 matmuls, dq 3, dkv 4."""
  device = topology_devices(V4_8, 1)[0]
  mesh = jax.sharding.Mesh(np.array([device]), ("data",))
  q = jax.ShapeDtypeStruct((2, 1024, 4, 128), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P()))

  def loss(q, k, v):
    out = tpu_attention.splash_attention(q, k, v, None, causal=causal)
    return out.astype(jnp.float32).sum()

  _, program = _program(jax.grad(loss, argnums=(0, 1, 2)), (q, q, q), mesh,
                        1)
  kinds = sorted(ops.pallas_kernel_name(inst).split("_")[2]
                 for comp in program.module.computations.values()
                 for inst in comp.instructions if ops.is_pallas_call(inst))
  assert kinds == ["dkv", "dq", "fwd"]
  totals = program.totals()
  assert totals.undeclared_kernels == 0
  area = (3 if causal else 4) * 512 * 512
  attention = 2 * (2 + 3 + 4) * 2 * 4 * 128 * area
  assert attention <= totals.flops < 1.01 * attention
