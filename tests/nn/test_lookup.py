"""trm.nn.lookup.take_rows: `jnp.take`'s values and gradients on a mesh,
with no collective of the whole table."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from hlo_collectives import collectives
from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.nn import lookup
from trm.nn import platform as platform_lib

_NAMES = ("vocab", "embed")
_IDS = (mesh_lib.BATCH, "activation_length")
_WHOLE_TABLE = re.compile(r"f32\[64,16\]")


def _case():
  rng = np.random.default_rng(0)
  table = jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)
  ids = rng.integers(0, 64, size=(8, 6)).astype(np.int32)
  ids[0, :3] = 5  # a token many times: its gradient rows add
  ids[5, 2] = 5
  ids[2, 1] = -1  # jnp.take: the last row
  ids[3, 4] = 70  # out of range: NaN, no gradient
  cot = jnp.asarray(rng.normal(size=(8, 6, 16)), jnp.float32)
  return table, jnp.asarray(ids), cot


def _mesh(shape):
  return jax.make_mesh(shape, mesh_lib.MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)


def _rules(update):
  return tuple((name, update.get(name, axes))
               for name, axes in config_lib.default_logical_axis_rules())


def _placed(mesh, table, ids):
  return (jax.device_put(table, NamedSharding(
              mesh, nn.logical_to_mesh_axes(_NAMES))),
          jax.device_put(ids, NamedSharding(
              mesh, nn.logical_to_mesh_axes(_IDS))))


def _loss(lookup_fn, cot):
  return lambda t, i: jnp.sum(lookup_fn(t, i).astype(jnp.float32) * cot)


# (data, fsdp, model): the width over fsdp beside a data split, over all 8
# devices, beside a model axis the table is not split over, and over a
# tuple of axes in the other order than the batch's.
_WHOLE_VOCAB = {"vocab": None}


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
@pytest.mark.parametrize("shape, rules_update", [
    ((2, 4, 1), {}), ((1, 8, 1), {}), ((2, 2, 2), _WHOLE_VOCAB),
    ((1, 2, 4), _WHOLE_VOCAB),
    ((2, 4, 1), {"embed": ("fsdp", "data")}),
    ((2, 2, 2), {"embed": ("fsdp", "data"), **_WHOLE_VOCAB})])
def test_values_and_gradients_are_jnp_takes(shape, rules_update, platform):
  """On a TPU (traced as for one, run here) the rows are looked up in
  chunks, in a loop; elsewhere in one go."""
  table, ids, cot = _case()
  want = jnp.take(table, ids, axis=0)
  want_grad = jax.grad(_loss(lambda t, i: jnp.take(t, i, axis=0), cot))(
      table, ids)
  mesh = _mesh(shape)
  with jax.set_mesh(mesh), nn.logical_axis_rules(_rules(rules_update)), \
      platform_lib.mesh_platform(platform):
    table_p, ids_p = _placed(mesh, table, ids)
    take = lambda t, i: lookup.take_rows(t, i, _NAMES)
    got = jax.jit(take)(table_p, ids_p)
    hlo = jax.jit(take).lower(table_p, ids_p).as_text()
    grad = jax.jit(jax.grad(_loss(take, cot)))(table_p, ids_p)
    bf16 = jax.jit(lambda t, i: lookup.take_rows(t, i, _NAMES,
                                                 jnp.bfloat16))(table_p, ids_p)
  assert np.isnan(want[3, 4]).all() and not np.isnan(want[2, 1]).any()
  np.testing.assert_array_equal(got, want)
  assert ("stablehlo.while" in hlo) == (platform == "tpu")
  np.testing.assert_array_equal(  # (NaN is NaN in float32's comparison)
      np.float32(bf16), np.float32(want.astype(jnp.bfloat16)))
  assert bf16.dtype == jnp.bfloat16
  # Sums of the same rows, perhaps in another order.
  np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-6)
  assert grad.sharding.is_equivalent_to(table_p.sharding, 2)


def test_no_collective_moves_the_whole_table():
  """jnp.take on the width-split table gathers it whole and all-reduces
  its whole gradient (checked, so the test can tell); take_rows moves ids
  and rows only: a gather of the ids and all-to-alls of the rows."""
  table, ids, cot = _case()
  mesh = _mesh((2, 4, 1))
  rules = config_lib.default_logical_axis_rules()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    table_p, ids_p = _placed(mesh, table, ids)
    def programs(take):
      return jax.jit(jax.grad(_loss(take, cot))).lower(
          table_p, ids_p).compile().as_text()
    plain = programs(lambda t, i: jnp.take(
        mesh_lib.constrain(t, ("vocab", None)), i, axis=0))
    ours = programs(lambda t, i: lookup.take_rows(t, i, _NAMES))
  assert [op for op, line in collectives(plain)
          if _WHOLE_TABLE.search(line)]
  moved = collectives(ours)
  assert not [op for op, line in moved if _WHOLE_TABLE.search(line)], moved
  kinds = {op for op, _ in moved}
  assert "all-to-all" in kinds, kinds
  # The ids gathered over fsdp's 4 devices: 8 / 2 data rows of 6, int32.
  assert [line for op, line in moved
          if op == "all-gather" and "s32[24]" in line], moved


@pytest.mark.parametrize("rules_update, shape", [
    ({}, None),                                  # no mesh
    ({}, (8, 1, 1)),                             # the table whole (no split)
    ({"embed": "model"}, (1, 2, 4)),             # width over a non-batch axis
    ({}, (2, 2, 2)),                             # vocabulary over model
    ({"embed": ("fsdp", "data")}, (2, 2, 2)),    # ... with the width split
    ({"vocab": "fsdp", "embed": None}, (1, 8, 1)),  # vocabulary over the batch
    ({"activation_length": "model"}, (1, 4, 2)),  # ... or over the sequence
])
def test_where_it_does_not_apply_it_says_none(rules_update, shape):
  table, ids, _ = _case()
  rules = _rules(rules_update)
  if shape is None:
    assert lookup.take_rows(table, ids, _NAMES) is None
    return
  mesh = _mesh(shape)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    seen = []
    jax.jit(lambda t, i: seen.append(lookup.take_rows(t, i, _NAMES)))(
        table, ids)
  assert seen == [None]


@pytest.mark.parametrize("tokens, columns, chunks", [
    (32768, 16, 8),    # Llama 3.1 8B on 256 chips: 16 columns a chip
    (32768, 32, 4),    # the 70B: 32
    (32768, 128, 1),   # a whole lane: one lookup
    (32768, 4096, 1),
    (10, 16, 5),       # the largest divisor up to 8
    (7, 16, 7),
    (7, 64, 1),
])
def test_rows_are_looked_up_in_chunks_that_fill_the_lanes(tokens, columns,
                                                          chunks):
  assert lookup._chunks(tokens, columns) == chunks  # pylint: disable=protected-access
