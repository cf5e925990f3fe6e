"""TRM's fused Pallas SwiGLU kernels (mlp_t's token mixer and the channel
MLP), in interpret mode on CPU, against the XLA path
(`layers.swiglu_residual_norm`): forward, every gradient, sharded over a
mesh, inside the whole TRM (with splash attention too), and compiled for a
v4 chip, where they must move fewer HBM bytes than the XLA path."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import topology
from trm.families.trm import layers
from trm.families.trm import model as trm
from trm.families.trm import mlp_tpu

EPS = 1e-5


def _operands(tokens, seq, batch, width, dtype, inter=256):
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (seq, batch, width)).astype(dtype)
  features = seq if tokens else width
  w_in = (jax.random.normal(k[1], (features, 2 * inter)) / 4).astype(dtype)
  w_out = (jax.random.normal(k[2], (inter, features)) / 8).astype(dtype)
  dy = jax.random.normal(k[3], (seq, batch, width)).astype(dtype)
  return x, w_in, w_out, dy


def _xla(tokens):
  def fn(x, w_in, w_out):
    flat = x.reshape(x.shape[0], -1) if tokens else x.reshape(-1, x.shape[-1])
    return layers.swiglu_residual_norm(flat, w_in, w_out, EPS,
                                       tokens).reshape(x.shape)
  return fn


def _pallas(tokens, interpret=True):
  # Sequence-major [S, B, D] for both: the batch is axis 1.
  return lambda x, w_in, w_out: mlp_tpu.swiglu_norm(  # noqa: E731
      x, w_in, w_out, EPS, tokens, 1, interpret)


def _vjp(fn, x, w_in, w_out, dy):
  y, pull = jax.vjp(fn, x, w_in, w_out)
  return (y,) + pull(dy)


# (tokens, shape [S, B, D]). Token mixer: 16 x 128 = 2048 columns, two
# forward tiles, and in the backward two halves of two tiles each, so the
# weight gradients accumulate; 16 x 25 = 400 columns, tiles of 128 whose
# last one reaches past the columns (masked), two halves in the backward.
# Channel MLP: 22 x 15 = 330 rows, tiles of 256 and 64 rows whose last one
# reaches past the rows, one half of 6 tiles.
CASES = {"tokens": (True, (22, 16, 128)), "tokens_ragged": (True, (22, 16, 25)),
         "channels": (False, (22, 15, 64))}


def _jitted_vjp(fn, *args):
  # One compile per path: op by op, the XLA path compiled each of its ops
  # (~4 s a case on the 2-core host).
  return jax.jit(functools.partial(_vjp, fn))(*args)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_and_gradients_match_the_xla_path(case, dtype):
  tokens, shape = CASES[case]
  x, w_in, w_out, dy = _operands(tokens, *shape, jnp.dtype(dtype))
  want = _jitted_vjp(_xla(tokens), x, w_in, w_out, dy)
  got = _jitted_vjp(_pallas(tokens), x, w_in, w_out, dy)
  assert_outputs_and_grads_match(got, want, dtype)


def assert_outputs_and_grads_match(got, want, dtype: str):
  """(y, dx, d_w_in, d_w_out) of a kernel against the XLA path's: same
  dtypes and shapes, values within 1e-5 of their scale in float32 and two
  bf16 ulps in bfloat16."""
  for name, a, b in zip(("y", "dx", "d_w_in", "d_w_out"), got, want):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    scale = np.abs(b).max()
    if dtype == "float32":
      np.testing.assert_allclose(a, b, atol=1e-5 * scale, err_msg=name)
    else:  # a bf16 ulp is 2^-8 of the value: allow two
      np.testing.assert_allclose(a, b, rtol=2 ** -7, atol=2 ** -7 * scale,
                                 err_msg=name)


def assert_sharded_matches_one_device(fn, x, w_in, w_out, dy):
  """(y, dx, d_w_in, d_w_out) of `fn` jitted over a 2x2x2 mesh, the batch
  split, against the same on one device."""
  want = _vjp(fn, x, w_in, w_out, dy)
  ctx = mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2)),
      config_lib.default_logical_axis_rules())
  with ctx:
    got = jax.jit(functools.partial(_vjp, fn))(x, w_in, w_out, dy)
  for a, b in zip(got, want):
    # The split batch sums the weight gradients in another order: float32
    # rounding of the largest entries (|33| here), not of each one, bounds
    # the difference (a 0.21 entry once differed by 1.3e-5 under CI's load).
    np.testing.assert_allclose(a, b, rtol=1e-5,
                               atol=1e-6 * max(1.0, float(np.abs(b).max())))


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "channels"])
def test_sharded_over_a_mesh_matches_one_device(tokens):
  assert_sharded_matches_one_device(
      _pallas(tokens), *_operands(tokens, 22, 8, 64, jnp.float32))


def _cfg(**kw):
  base = dict(vocab_size=7, seq_len=6, num_puzzle_identifiers=3,
              hidden_size=64, num_heads=2, L_layers=1, H_cycles=2,
              L_cycles=2, halt_max_steps=3, halt_exploration_prob=0.0,
              puzzle_emb_ndim=64, puzzle_emb_len=2, pos_encodings="none",
              mlp_t=True, forward_dtype="float32")
  return trm.TRMConfig(**{**base, **kw})


def whole_trm_losses_and_grads(reference_cfg, kernel_cfg):
  """(loss, grads) of one TRM step for each config, on the same weights
  and batch: 4 x 64 = 256 token-mixer columns."""
  batch = 4
  model = trm.TRM(reference_cfg)
  variables = nn.meta.unbox(trm.init_variables(model, jax.random.key(0),
                                               batch))
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(1, 7, (batch, 6)), jnp.int32)
  vectors = jnp.asarray(rng.normal(size=(batch, 64)), jnp.float32)

  def loss(params, net):
    z_H, z_L = net.apply(variables, batch, method=trm.TRM.initial_z)
    _, _, logits, q_halt, _ = net.apply({**variables, "params": params}, z_H,
                                        z_L, inputs, vectors)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 1]) + jnp.mean(q_halt)

  return [jax.value_and_grad(loss)(variables["params"], trm.TRM(cfg))
          for cfg in (reference_cfg, kernel_cfg)]


# (False, "dot") is slow: "attention_splash" runs the attention TRM through
# the same comparison.
@pytest.mark.parametrize("mlp_t, attention", [
    (True, "dot"), pytest.param(False, "dot", marks=pytest.mark.slow),
    (False, "splash_interpret")],
                         ids=["mlp_t", "attention", "attention_splash"])
def test_whole_trm_step_matches_the_xla_path(mlp_t, attention):
  """Every TPU kernel of a TRM layer against the XLA path: the SwiGLUs, and
  (attention_splash) the splash attention on 8 tokens padded to 128."""
  # Both steps as one jitted program: one compile, not one per op (eager).
  (want, want_grad), (got, got_grad) = jax.jit(
      lambda: whole_trm_losses_and_grads(
          _cfg(mlp_t=mlp_t), _cfg(mlp_t=mlp_t, mlp_kernel="pallas_interpret",
                                  attention=attention)))()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # Splash's online softmax sums in another order: 5e-6 off at most here.
  # The attention TRM's gradients through XLA alone move by up to 2.5e-6
  # between XLA:CPU's settings (the tests' loop emitters at optimization
  # level 0 against the defaults), so 1e-6 is below float32's noise there.
  atol = 1e-6 if mlp_t else 1e-5
  for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


def test_bad_kernel_names():
  with pytest.raises(ValueError, match="config.model.mlp_kernel='fused': use"):
    _cfg(mlp_kernel="fused")
  with pytest.raises(ValueError, match="config.model.attention='flash': use"):
    _cfg(attention="flash")


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "channels"])
def test_v4_program_moves_fewer_bytes_and_keeps_no_projection(tokens):
  """One SwiGLU block's forward and backward at the paper's sizes (97
  tokens, width 512, inner widths 512 and 1536) on one v4 chip: the kernels
  move fewer HBM bytes than XLA's fusions, and the residuals drop the
  [.., 2I] projection."""
  devices = topology.topology_devices(topology.parse_topology("v4-8"), 1)
  sharding = jax.sharding.SingleDeviceSharding(devices[0])
  # Batch 128: both backward grids split into two halves, so each half's
  # weight-gradient partial must fit VMEM beside the weights.
  seq, batch, width = 97, 128, 512
  features, inter = (seq, 512) if tokens else (width, 1536)

  def arg(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.bfloat16, sharding=sharding)

  args = (arg(seq, batch, width), arg(features, 2 * inter),
          arg(inter, features), arg(seq, batch, width))
  figures = {}
  for name, fn in (("xla", _xla(tokens)),
                   ("pallas", _pallas(tokens, interpret=False))):
    compiled = jax.jit(functools.partial(_vjp, fn)).lower(*args).compile()
    _, hbm_bytes = topology.step_cost(compiled)
    residuals = jax.eval_shape(lambda x, a, b: jax.vjp(fn, x, a, b)[1],
                               *args[:3])
    weights = {args[1].shape, args[2].shape}
    figures[name] = (hbm_bytes, max(r.size for r in jax.tree.leaves(
        residuals) if r.shape not in weights))
  xla_bytes, xla_largest = figures["xla"]
  pallas_bytes, pallas_largest = figures["pallas"]
  slices = batch * (width if tokens else seq)
  assert xla_largest == 2 * inter * slices     # the projection is kept
  assert pallas_largest == seq * batch * width  # x-sized residuals only
  assert 0 < pallas_bytes < 0.6 * xla_bytes, figures
