"""norm_gpu: GPT's residual add and LayerNorm as one Pallas Triton kernel
(run in Pallas's interpreter) against the XLA path."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.families.gpt import kernels
from trm.families.gpt import model as gpt
from trm.families.gpt import norm_gpu


def _case(width, dtype, seed=0):
  k = jax.random.split(jax.random.key(seed), 6)
  x = jax.random.normal(k[0], (4, 6, width))
  delta = jax.random.normal(k[1], (4, 6, width)).astype(dtype)
  scale = 1 + 0.1 * jax.random.normal(k[2], (width,))
  bias = 0.1 * jax.random.normal(k[3], (width,))
  weights = (jax.random.normal(k[4], (4, 6, width)),
             jax.random.normal(k[5], (4, 6, width)))
  return (x, delta, scale, bias), weights


def _xla(x, delta, scale, bias, out_dtype, weights, size=lambda t: t):
  """The loss on the XLA path; `size=jnp.abs` sums every term's absolute
  value instead: the size of what the loss rounds."""
  s = x + delta
  y = kernels.layer_norm(s, scale, bias).astype(out_dtype)
  return (jnp.sum(size(s * weights[0]))
          + jnp.sum(size(y.astype(jnp.float32) * weights[1])))


def _kernel(x, delta, scale, bias, out_dtype, weights):
  s, y = norm_gpu.add_layer_norm(x, delta, scale, bias, out_dtype, True)
  return jnp.sum(s * weights[0]) + jnp.sum(y.astype(jnp.float32) * weights[1])


def _value_and_grads(fn, args, out_dtype, weights):
  return jax.jit(jax.value_and_grad(fn, argnums=(0, 1, 2, 3)),
                 static_argnums=4)(*args, out_dtype, weights)


@pytest.mark.parametrize("width,rows", [(24, (4,)), (16, (1,)), (40, (2,))])
def test_float32_matches_the_xla_path(monkeypatch, width, rows):
  """Widths that are not powers of two (masked columns), 1-4 rows per
  program; the backward's row groups too."""
  monkeypatch.setitem(norm_gpu.CONSTANTS, "rows", rows)
  args, weights = _case(width, jnp.float32)
  loss, grads = _value_and_grads(_kernel, args, jnp.float32, weights)
  want, want_grads = _value_and_grads(_xla, args, jnp.float32, weights)
  # Two float32 sums of 2 x 4 x 6 x width terms, each path in its own
  # order (XLA:CPU's follows the host's vector width: 1.05e-6 apart on an
  # AVX-512 host, session 94): the bound scales with the terms' sizes.
  terms = jax.jit(_xla, static_argnums=(4, 6))(*args, jnp.float32, weights,
                                                jnp.abs)
  assert float(loss) == pytest.approx(float(want), abs=1e-6 * float(terms))
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, rtol=1e-5,
                               atol=1e-6 * np.abs(ref).max())


def test_bfloat16_delta_and_output():
  """delta and y in bf16 (the compute dtype): delta's gradient comes back
  in bf16, the rest as the XLA path within its rounding."""
  args, weights = _case(24, jnp.bfloat16, seed=1)
  loss, grads = _value_and_grads(_kernel, args, jnp.bfloat16, weights)
  want, want_grads = _value_and_grads(_xla, args, jnp.bfloat16, weights)
  assert float(loss) == pytest.approx(float(want), rel=1e-5)
  assert grads[1].dtype == jnp.bfloat16
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(np.asarray(got, np.float32),
                               np.asarray(ref, np.float32), rtol=2e-2,
                               atol=1e-2 * np.abs(np.asarray(ref)).max())


def _tiny_gpt(**overrides):
  cfg = gpt.GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2,
                      n_embd=24, dropout=0.0, bias=True, **overrides)
  idx = jnp.asarray(np.random.default_rng(0).integers(0, 11, (4, 8)),
                    jnp.int32)
  def make(idx):  # jitted: one compile, not one per op of the init
    params = gpt.GPT(cfg).init(jax.random.key(0), idx)["params"]
    # Away from the init's unit scales and zero biases.
    return jax.tree.map(
        lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape),
        params)
  return cfg, idx, jax.jit(make)(idx)


def _model_loss_and_grads(cfg, idx, params):
  def loss(p):
    logits = gpt.GPT(cfg).apply({"params": p}, idx)
    return jnp.sum(jnp.square(logits.astype(jnp.float32)))
  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("overrides", [
    dict(dtype="float32"),
    dict(dtype="bfloat16", scan_layers=True, remat=True),
])
def test_gpt_with_the_kernel_is_gpt(overrides):
  """The whole model: each block's last add handed on to the next norm
  (and ln_f) gives the XLA path's logits and gradients, scanned and
  rematerialised layers included."""
  cfg, idx, params = _tiny_gpt(**overrides)
  want, want_grads = _model_loss_and_grads(cfg, idx, params)
  loss, grads = _model_loss_and_grads(
      dataclasses.replace(cfg, norm_kernel="triton_interpret"), idx, params)
  assert float(loss) == pytest.approx(float(want), rel=1e-5)
  for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(got, ref, rtol=1e-4,
                               atol=1e-5 * np.abs(ref).max())


def test_same_result_over_a_mesh():
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  args, weights = _case(24, jnp.float32, seed=2)
  args = (jnp.tile(args[0], (2, 1, 1)), jnp.tile(args[1], (2, 1, 1))) + args[2:]
  weights = tuple(jnp.tile(w, (2, 1, 1)) for w in weights)
  want, want_grads = _value_and_grads(_kernel, args, jnp.float32, weights)
  mesh = jax.make_mesh((4, 2, 1), mesh_lib.MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)
  with jax.set_mesh(mesh), nn.logical_axis_rules(
      (("activation_batch", ("data", "fsdp")),)):
    loss, grads = _value_and_grads(_kernel, args, jnp.float32, weights)
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  for got, ref in zip(grads, want_grads):
    np.testing.assert_allclose(got, ref, rtol=1e-5,
                               atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("overrides,needle", [
    (dict(norm_kernel="pallas"), "config.model.norm_kernel='pallas' must be"),
    (dict(norm_kernel="triton", residual_dtype="bfloat16"),
     "set config.model.residual_dtype='float32'"),
])
def test_bad_norm_kernel_names_the_field(overrides, needle):
  with pytest.raises(ValueError, match=needle):
    gpt.GPTConfig(**overrides)


def test_triton_on_cpu_devices_is_one_line():
  config = config_lib.load_config("configs/gpt.py", "shakespeare_char_cpu")
  config = config_lib.set_values(config, {"model.norm_kernel": "triton"})
  with pytest.raises(mesh_lib.MeshConfigError,
                     match=r"config.model.norm_kernel='triton' runs on NVIDIA "
                     r"GPUs only, and this mesh's devices are cpu: use 'xla'"):
    mesh_lib.ShardingContext.from_config(config)
