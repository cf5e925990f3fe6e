"""cross_entropy_gpu: the LM head's loss as one Pallas Triton kernel (run
in Pallas's interpreter) against the XLA path, values and gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import mesh as mesh_lib
from trm.nn import cross_entropy_gpu
from trm.nn import linear
from trm.nn import losses


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
  """Blocks of 128 vocabulary entries: the 300-entry vocabularies below
  take three loop steps, the last one masked past its 44th entry."""
  monkeypatch.setitem(cross_entropy_gpu.CONSTANTS, "block", 128)


def _case(dtype, batch=2, length=8, width=16, vocab=300, scale=1.0, seed=0):
  k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
  h = jax.random.normal(k1, (batch, length, width)).astype(dtype)
  table = (scale * jax.random.normal(k2, (vocab, width))).astype(dtype)
  labels = jax.random.randint(k3, (batch, length), 0, vocab)
  # The first and last entries of the vocabulary as labels, and an ignored
  # position (zero weight).
  labels = labels.at[0, 0].set(0).at[0, 1].set(vocab - 1)
  weights = jax.random.uniform(k4, (batch, length)).at[1, 2].set(0.0)
  return h, table, labels, weights


def _xla(h, table, labels, weights, logits_dtype):
  logits = linear.matmul_to(h, table.T, logits_dtype)
  return jnp.sum(weights * losses.softmax_cross_entropy(logits, labels))


def _kernel(h, table, labels, weights, logits_dtype):
  return jnp.sum(weights * cross_entropy_gpu.linear_cross_entropy(
      h, table, labels, logits_dtype, True))


def _loss_and_grads(fn, case, logits_dtype):
  h, table, labels, weights = case
  return jax.jit(jax.value_and_grad(fn, argnums=(0, 1)),
                 static_argnums=4)(h, table, labels, weights, logits_dtype)


def _assert_close(got, want, rtol, atol_scale):
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  np.testing.assert_allclose(got, want, rtol=rtol,
                             atol=atol_scale * np.abs(want).max())


@pytest.mark.parametrize("rows", [(1,), (4,)])
def test_float32_matches_the_xla_path(monkeypatch, rows):
  monkeypatch.setitem(cross_entropy_gpu.CONSTANTS, "rows", rows)
  case = _case(jnp.float32)
  (loss, grads) = _loss_and_grads(_kernel, case, "float32")
  (want, want_grads) = _loss_and_grads(_xla, case, "float32")
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  for got, ref in zip(grads, want_grads):
    _assert_close(got, ref, 1e-5, 1e-6)


def test_per_position_losses_and_p():
  """The kernel itself: lse - logit[label] per row, and P = softmax -
  one-hot written over the logits."""
  logits = 6.0 * jax.random.normal(jax.random.key(3), (8, 300))
  labels = jnp.arange(8) * 37
  loss_and_p = jax.jit(cross_entropy_gpu._loss_and_p,  # pylint: disable=protected-access
                       static_argnums=(2, 3, 4))
  loss, log_z, p = loss_and_p(logits, labels, True, 0.0, 0.0)
  np.testing.assert_allclose(loss, losses.softmax_cross_entropy(logits, labels),
                             rtol=1e-6)
  want = jax.nn.softmax(logits) - jax.nn.one_hot(labels, 300)
  np.testing.assert_allclose(p, want, atol=1e-6)
  assert log_z is None  # written only with a z-loss, for its metric
  _, log_z, _ = loss_and_p(logits, labels, True, 0.0, 0.01)
  np.testing.assert_allclose(log_z, jax.nn.logsumexp(logits, axis=-1),
                             rtol=1e-6)


def test_large_logits_stay_finite():
  """Logits in the thousands (the running max keeps exp in range)."""
  case = _case(jnp.float32, scale=300.0, seed=4)
  loss, grads = _loss_and_grads(_kernel, case, "float32")
  want, want_grads = _loss_and_grads(_xla, case, "float32")
  assert np.isfinite(float(loss))
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  for got, ref in zip(grads, want_grads):
    assert np.isfinite(np.asarray(got)).all()
    _assert_close(got, ref, 1e-4, 1e-5)


def test_bfloat16_is_within_its_rounding():
  """bf16 operands and logits (nanoGPT's autocast head): the gradient
  rounds P where the XLA path rounds g * P, so they agree to a few ulps."""
  case = _case(jnp.bfloat16, width=64)
  loss, grads = _loss_and_grads(_kernel, case, "bfloat16")
  want, want_grads = _loss_and_grads(_xla, case, "bfloat16")
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  for got, ref in zip(grads, want_grads):
    assert got.dtype == jnp.bfloat16
    _assert_close(got, ref, 2e-2, 1e-2)


def test_ignored_positions_give_nothing():
  """A zero-weight position's label and hidden state move no gradient."""
  h, table, labels, weights = _case(jnp.float32)
  weights = weights.at[:, 3].set(0.0)
  grads = _loss_and_grads(_kernel, (h, table, labels, weights), "float32")[1]
  other = labels.at[:, 3].set((labels[:, 3] + 5) % 300)
  moved = _loss_and_grads(_kernel, (h, table, other, weights), "float32")[1]
  np.testing.assert_array_equal(grads[1], moved[1])
  np.testing.assert_array_equal(grads[0][:, 3], 0.0)


def test_same_result_over_a_mesh():
  """Per batch shard under a 4 x 2 mesh (shard_map): the one-device
  values."""
  case = _case(jnp.float32, batch=8)
  want, want_grads = _loss_and_grads(_kernel, case, "float32")
  mesh = jax.make_mesh((4, 2, 1), mesh_lib.MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  rules = (("activation_batch", ("data", "fsdp")),)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    loss, grads = _loss_and_grads(_kernel, case, "float32")
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  for got, ref in zip(grads, want_grads):
    _assert_close(got, ref, 1e-5, 1e-6)


def test_rows_that_no_setting_divides_name_the_field(monkeypatch):
  monkeypatch.setitem(cross_entropy_gpu.CONSTANTS, "rows", (4,))
  case = _case(jnp.float32, batch=1, length=6)
  with pytest.raises(ValueError, match="config.loss_kernel='triton'"):
    _loss_and_grads(_kernel, case, "float32")
