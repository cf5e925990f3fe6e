"""trm.nn.linear: logical params, bias rounding, the custom-VJP matmul;
trm.nn.dtypes."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.nn import dtypes
from trm.nn import linear


class _Layer(nn.Module):

  @nn.compact
  def __call__(self, x):
    w = linear.logical_param(self, "kernel", nn.initializers.ones,
                             ("embed", "mlp"), (x.shape[-1], 3), jnp.float32)
    return x @ w


def test_logical_param_names_axes():
  params = _Layer().init(jax.random.key(0), jnp.ones((2, 4)))["params"]
  assert isinstance(params["kernel"], nn.LogicallyPartitioned)
  assert params["kernel"].names == ("embed", "mlp")
  assert nn.meta.unbox(params)["kernel"].shape == (4, 3)


def test_add_bias_rounds_once():
  y32 = jnp.array([1.0 + 2.0 ** -8, 256.0, -3.0], jnp.float32)
  bias = jnp.array([2.0 ** -9, 0.75, 0.1], jnp.float32)
  got = linear.add_bias(y32, bias, jnp.bfloat16)
  assert got.dtype == jnp.bfloat16
  b16 = np.asarray(bias.astype(jnp.bfloat16), np.float32)
  want = (np.asarray(y32) + b16).astype(jnp.bfloat16)
  np.testing.assert_array_equal(got, want)
  # One rounding: 1 + 2^-8 + 2^-9 rounds up to 1 + 2^-7. Rounding the
  # product first (a tie, to even: 1.0) and then the sum would give 1.0.
  assert float(got[0]) == 1.0 + 2.0 ** -7
  twice = (y32.astype(jnp.bfloat16) + bias.astype(jnp.bfloat16))
  assert float(twice[0]) == 1.0


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_value_and_grads(dtype):
  x = jax.random.normal(jax.random.key(0), (2, 3, 5)).astype(dtype)
  w = jax.random.normal(jax.random.key(1), (5, 4)).astype(dtype)
  y = linear.matmul(x, w)
  assert y.dtype == jnp.float32
  np.testing.assert_allclose(
      y, np.einsum("btk,kn->btn", np.asarray(x, np.float64),
                   np.asarray(w, np.float64)), rtol=1e-2, atol=1e-2)
  dy = jax.random.normal(jax.random.key(2), (2, 3, 4))
  f = lambda x, w: jnp.sum(linear.matmul(x, w) * dy)  # noqa: E731
  dx, dw = jax.grad(f, argnums=(0, 1))(x, w)
  assert dx.dtype == dw.dtype == jnp.dtype(dtype)
  dyn = np.asarray(dy.astype(dtype), np.float64)
  tol = 5e-2 if dtype == jnp.bfloat16 else 1e-5
  np.testing.assert_allclose(np.asarray(dx, np.float64),
                             dyn @ np.asarray(w, np.float64).T, rtol=tol,
                             atol=tol)
  np.testing.assert_allclose(
      np.asarray(dw, np.float64),
      np.einsum("btk,btn->kn", np.asarray(x, np.float64), dyn), rtol=tol,
      atol=tol)


def test_config_dtypes_mixin():

  @dataclasses.dataclass(frozen=True)
  class Cfg(dtypes.ConfigDtypes):
    dtype: str = "bfloat16"
    param_dtype: str = "float32"

  cfg = Cfg()
  assert cfg.compute_dtype == jnp.bfloat16
  assert cfg.weight_dtype == jnp.float32
  assert [f.name for f in dataclasses.fields(cfg)] == ["dtype", "param_dtype"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_matmul_to_is_matmul_rounded_with_its_gradients(dtype):
  kx, kw, kg = jax.random.split(jax.random.key(3), 3)
  x = jax.random.normal(kx, (2, 5, 24), jnp.float32).astype(dtype)
  w = jax.random.normal(kw, (24, 40), jnp.float32).astype(dtype)
  g = jax.random.normal(kg, (2, 5, 40), jnp.float32)

  def loss(f):
    return lambda x, w: (f(x, w).astype(jnp.float32) * g).sum()

  def reference(x, w):
    return linear.matmul(x, w).astype(dtype)

  def rounded(x, w):
    return linear.matmul_to(x, w, dtype)

  out = jax.jit(rounded)(x, w)
  assert out.dtype == jnp.dtype(dtype)
  np.testing.assert_array_equal(out, jax.jit(reference)(x, w))
  for got, want in zip(jax.jit(jax.grad(loss(rounded), (0, 1)))(x, w),
                       jax.jit(jax.grad(loss(reference), (0, 1)))(x, w)):
    assert got.dtype == want.dtype == jnp.dtype(dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("platform, result", [
    ("cuda", "bf16"), ("rocm", "bf16"), ("tpu", "bf16"), ("cpu", "f32")])
def test_matmul_to_asks_an_accelerator_matmul_for_the_rounded_result(
    platform, result):
  # Lowered for each platform from this CPU: on a GPU or TPU the dot itself
  # returns bfloat16 (it rounds its float32 accumulator; under tensor
  # parallelism XLA then sums bfloat16 partials); on a CPU the float32-result
  # dot its programs were measured with.
  x = jax.ShapeDtypeStruct((8, 16), jnp.bfloat16)
  w = jax.ShapeDtypeStruct((16, 32), jnp.bfloat16)
  text = jax.jit(lambda x, w: linear.matmul_to(x, w, jnp.bfloat16)).trace(
      x, w).lower(lowering_platforms=(platform,)).as_text()
  dots = [line for line in text.splitlines() if "dot_general" in line]
  assert dots and all(f"-> tensor<8x32x{result}>" in line for line in dots)


def test_tpu_sums_the_partials_of_a_split_contraction_in_the_result_dtype():
  # Tensor parallelism on TPU (libtpu's compile-only v4 chips): the
  # contraction split over `model`, each chip's partial product is
  # reduce-scattered in bfloat16, as the backward pass's are; the
  # float32-result form moved float32 partials, twice the bytes.
  import hlo_collectives  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding  # pylint: disable=g-import-not-at-top
  from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top
  from trm.core import topology  # pylint: disable=g-import-not-at-top
  devices = topology.topology_devices(topology.parse_topology("v4-8"), 1)
  mesh = jax.sharding.Mesh(np.array(devices[:4]), ("model",),
                           axis_types=(jax.sharding.AxisType.Auto,))
  x = jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P(None, "model")))
  w = jax.ShapeDtypeStruct((1024, 512), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P("model", None)))

  def moved(f):
    """The result types of the step's collectives."""
    text = jax.jit(f, out_shardings=NamedSharding(mesh, P(None, "model"))
                   ).lower(x, w).compile().as_text()
    return [shape for _, shape in hlo_collectives.results(text)]

  rounded = moved(lambda x, w: linear.matmul_to(x, w, jnp.bfloat16))
  unrounded = moved(lambda x, w: linear.matmul(x, w).astype(jnp.bfloat16))
  assert rounded and all("f32" not in shape for shape in rounded), rounded
  assert any("f32" in shape for shape in unrounded), unrounded
