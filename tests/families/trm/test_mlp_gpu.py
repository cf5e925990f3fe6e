"""TRM's Pallas Triton token-mixer kernels (`model.mlp_kernel='triton'`), in
Pallas's interpreter on CPU, against the XLA path
(`layers.swiglu_residual_norm`, tokens=True): forward and every gradient,
sharded over a mesh, and inside the whole TRM step. Their compile for an
H100 (no GPU needed) is `benchmarks/gpu/offline.py`'s."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.families.trm import channel_gpu
from trm.families.trm import layers
from trm.families.trm import mlp_gpu

from test_mlp_tpu import _cfg  # pylint: disable=g-import-not-at-top
from test_mlp_tpu import assert_outputs_and_grads_match  # pylint: disable=g-import-not-at-top
from test_mlp_tpu import assert_sharded_matches_one_device  # pylint: disable=g-import-not-at-top
from test_mlp_tpu import whole_trm_losses_and_grads  # pylint: disable=g-import-not-at-top

EPS = 1e-5


def _operands(seq, batch, width, inter, dtype):
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (seq, batch, width)).astype(dtype)
  w_in = (jax.random.normal(k[1], (seq, 2 * inter)) / 4).astype(dtype)
  w_out = (jax.random.normal(k[2], (inter, seq)) / 8).astype(dtype)
  dy = jax.random.normal(k[3], (seq, batch, width)).astype(dtype)
  return x, w_in, w_out, dy


def _xla(x, w_in, w_out):
  return layers.swiglu_residual_norm(x.reshape(x.shape[0], -1), w_in, w_out,
                                     EPS, True).reshape(x.shape)


def _triton(x, w_in, w_out):
  return mlp_gpu.token_mixer(x, w_in, w_out, EPS, True)


def _vjp(fn, x, w_in, w_out, dy):
  y, pull = jax.vjp(fn, x, w_in, w_out)
  return (y,) + pull(dy)


def _triton_and_xla(x, w_in, w_out, dy):
  """(y, dx, d_w_in, d_w_out) of the kernels and of the XLA path, as one
  jitted program: one compile instead of one per op (eager). Jitted afresh
  on each call, so that it traces the launch constants a test has just
  set."""
  return jax.jit(lambda *args: (_vjp(_triton, *args), _vjp(_xla, *args)))(
      x, w_in, w_out, dy)


# [S, B, D] and the inner width I. Sudoku's 97 tokens pad to 128 rows and
# I = 128 streams as two chunks of 64 (the weight gradients as four of
# 32); 9 tokens pad to 16. The forward and dx kernels take tiles of 128
# columns, the weight gradients tiles of 64: 6 x 64 = 384 columns are six
# of those in six groups of one; 40 x 32 = 1280 columns 20 tiles in 20
# groups; 36 x 64 = 2304 columns 36 tiles in 18 groups of two, so a group
# sums its tiles.
CASES = {"sudoku_rows": ((97, 6, 64), 128), "few_rows": ((9, 40, 32), 64),
         "groups_of_two": ((16, 36, 64), 64)}


def _cases(slow):
  """(dtype, case) parameters, the pairs in `slow` marked slow."""
  return [pytest.param(dtype, case, marks=[pytest.mark.slow]
                       if (dtype, case) in slow else [])
          for case in CASES for dtype in ("float32", "bfloat16")]


# `slow`: bfloat16-few_rows and float32-groups_of_two. Each dtype and each
# case still runs (float32-few_rows, bfloat16-groups_of_two, sudoku_rows in
# both): the case's tiles, chunks and groups are the same in either dtype.
FEWER = {("bfloat16", "few_rows"), ("float32", "groups_of_two")}


@pytest.mark.parametrize("dtype, case", _cases(FEWER))
def test_forward_and_gradients_match_the_xla_path(case, dtype):
  shape, inter = CASES[case]
  got, want = _triton_and_xla(*_operands(*shape, inter, jnp.dtype(dtype)))
  assert_outputs_and_grads_match(got, want, dtype)


# Each kernel's other orientation (mlp_gpu's `layout`), with its tiles and
# chunks as the mixer sweep sets them: 64 columns or 128 at 8 warps, chunks
# of 64 for the weight gradients. `few_rows`' inner width 64 is one chunk.
OTHER_LAYOUTS = {
    "_FORWARD": dict(layout="columns", tiles=(128, 64, 32, 16), warps=8),
    "_DX": dict(layout="columns", tiles=(64, 32, 16), chunk=32),
    "_GRAD": dict(layout="inner", chunk=64, tiles=(32, 16)),
}


@pytest.mark.parametrize("dtype, case", _cases(FEWER))  # as above
def test_other_layouts_match_the_xla_path(case, dtype, monkeypatch):
  for constant, change in OTHER_LAYOUTS.items():
    monkeypatch.setattr(mlp_gpu, constant,
                        dict(getattr(mlp_gpu, constant), **change))
  shape, inter = CASES[case]
  got, want = _triton_and_xla(*_operands(*shape, inter, jnp.dtype(dtype)))
  assert_outputs_and_grads_match(got, want, dtype)


# `slow`: groups_of_two, whose inner width is one block of full rows, as
# few_rows' is with a partial tile (the groups are the weight-gradient
# kernel's, which this layout does not run).
@pytest.mark.parametrize("dtype, case", _cases({("float32", "groups_of_two"),
                                               ("bfloat16", "groups_of_two")}))
def test_epilogue_layouts_match_the_xla_path(case, dtype, monkeypatch):
  """The 'epilogue' layouts of the forward and dx: the SwiGLU, and its
  gradients, as kernels in blocks of 64 inner rows (few_rows' inner width
  is one block, sudoku_rows' two), every other product and the norm by
  XLA."""
  for constant in ("_FORWARD", "_DX"):
    monkeypatch.setattr(mlp_gpu, constant,
                        dict(getattr(mlp_gpu, constant), layout="epilogue",
                             tiles=(128, 64, 32, 16)))
  shape, inter = CASES[case]
  got, want = _triton_and_xla(*_operands(*shape, inter, jnp.dtype(dtype)))
  assert_outputs_and_grads_match(got, want, dtype)


def test_an_unknown_layout_names_the_constant(monkeypatch):
  monkeypatch.setattr(mlp_gpu, "_DX", dict(mlp_gpu._DX, layout="inner"))  # pylint: disable=protected-access
  x, w_in, w_out, dy = _operands(9, 4, 32, 64, jnp.float32)
  with pytest.raises(ValueError, match=r"mlp_gpu._DX\['layout'\]='inner'"):
    _vjp(_triton, x, w_in, w_out, dy)


def test_groups_divide_the_tiles():
  assert mlp_gpu._groups(3072) == 32  # pylint: disable=protected-access
  assert mlp_gpu._groups(36) == 18  # pylint: disable=protected-access
  assert mlp_gpu._groups(7) == 7  # pylint: disable=protected-access


@pytest.mark.parametrize("layout", ["tokens", "epilogue"])
def test_sharded_over_a_mesh_matches_one_device(layout, monkeypatch):
  """Per batch shard; 'epilogue' runs XLA's dots inside the shard too."""
  for constant in ("_FORWARD", "_DX"):
    monkeypatch.setattr(mlp_gpu, constant,
                        dict(getattr(mlp_gpu, constant), layout=layout))
  assert_sharded_matches_one_device(
      _triton, *_operands(22, 8, 64, 64, jnp.float32))


# mlp_t_channel runs mlp_t's token-mixer kernels too: mlp_t alone is slow.
@pytest.mark.parametrize("mlp_t, channel", [
    pytest.param(True, "xla", marks=pytest.mark.slow), (True, "epilogue"),
    (False, "epilogue")],
                         ids=["mlp_t", "mlp_t_channel", "attention_channel"])
def test_whole_trm_step_matches_the_xla_path(mlp_t, channel, monkeypatch):
  """A TRM step with mlp_kernel='triton' (interpreted): the mlp_t token
  mixers as the GPU kernels, and the channel MLPs as XLA's or as
  channel_gpu's kernel, in the mlp_t and the attention TRM (the kernel's
  blocks small enough that the test's 4 x 8 = 32 rows take two): the same
  loss and gradients as with 'dot'."""
  monkeypatch.setattr(channel_gpu, "_CHANNEL",
                      dict(channel_gpu._CHANNEL, layout=channel, rows=16,  # pylint: disable=protected-access
                           columns=16, depth=16))
  # Both steps as one jitted program: one compile, not one per op (eager;
  # the mlp_t case's CPU time 16.6 -> 9.0 s).
  (want, want_grad), (got, got_grad) = jax.jit(
      lambda: whole_trm_losses_and_grads(
          _cfg(mlp_t=mlp_t), _cfg(mlp_t=mlp_t,
                                  mlp_kernel="triton_interpret")))()
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # The channel kernel sums over the features in steps of 16, XLA in one
  # dot: in float32 a few of the attention TRM's smallest gradients differ
  # by 2e-6.
  atol = 1e-6 if mlp_t else 1e-5
  for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


def test_config_refuses_bad_widths():
  x, w_in, w_out, _ = _operands(9, 3, 5, 64, jnp.float32)  # 15 columns
  with pytest.raises(ValueError, match=r"multiple of 16: use mlp_kernel="):
    _triton(x, w_in, w_out)
