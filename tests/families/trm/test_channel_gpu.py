"""TRM's channel MLP as a Pallas Triton GEMM with the SwiGLU in its
epilogue (`channel_gpu`, `_CHANNEL['layout']='epilogue'`), in Pallas's
interpreter on CPU, against the XLA path (`layers.swiglu_residual_norm`,
tokens=False): forward and every gradient, and over a mesh; inside the
whole TRM step in test_mlp_gpu.py. Its compile for an H100 is
`benchmarks/gpu/kernel_report.py`'s."""

import jax
import jax.numpy as jnp
import pytest

from trm.families.trm import channel_gpu
from trm.families.trm import layers

from test_mlp_tpu import _vjp  # pylint: disable=g-import-not-at-top
from test_mlp_tpu import assert_outputs_and_grads_match  # pylint: disable=g-import-not-at-top
from test_mlp_tpu import assert_sharded_matches_one_device  # pylint: disable=g-import-not-at-top

EPS = 1e-5


@pytest.fixture
def epilogue(monkeypatch):
  """The kernel's small launch constants, so the tiny shapes below still
  take several row, column and depth blocks."""
  monkeypatch.setattr(channel_gpu, "_CHANNEL",
                      dict(channel_gpu._CHANNEL, layout="epilogue", rows=32,  # pylint: disable=protected-access
                           columns=16, depth=16))


def _operands(seq, batch, width, inter, dtype):
  k = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(k[0], (seq, batch, width)).astype(dtype)
  w_in = (jax.random.normal(k[1], (width, 2 * inter)) / 4).astype(dtype)
  w_out = (jax.random.normal(k[2], (inter, width)) / 8).astype(dtype)
  dy = jax.random.normal(k[3], (seq, batch, width)).astype(dtype)
  return x, w_in, w_out, dy


def _xla(x, w_in, w_out):
  return layers.swiglu_residual_norm(x, w_in, w_out, EPS, False)


def _triton(x, w_in, w_out):
  return channel_gpu.channel_mlp(x, w_in, w_out, EPS, 1, True)


def _triton_and_xla(x, w_in, w_out, dy):
  """(y, dx, d_w_in, d_w_out) of the kernel and of the XLA path, as one
  jitted program: one compile instead of one per op (eager). Jitted afresh
  on each call, so that it traces the launch constants a test has set."""
  return jax.jit(lambda *args: (_vjp(_triton, *args), _vjp(_xla, *args)))(
      x, w_in, w_out, dy)


# [S, B, D] and the inner width I, with blocks of 32 rows, 16 columns and
# depth 16: 97 x 2 = 194 rows are six full row blocks and a partial one
# (masked); 9 x 2 = 18 rows one partial block; 16 x 4 = 64 rows two full
# ones. D = 64 is four depth steps; I = 48 three column blocks per half.
CASES = {"partial_rows": ((97, 2, 64), 48), "one_partial_block": ((9, 2, 32), 16),
         "whole_blocks": ((16, 4, 64), 48)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_and_gradients_match_the_xla_path(case, dtype, epilogue):
  del epilogue
  shape, inter = CASES[case]
  got, want = _triton_and_xla(*_operands(*shape, inter, jnp.dtype(dtype)))
  assert_outputs_and_grads_match(got, want, dtype)


def test_the_sweep_sizes_compile_in_the_interpreter(monkeypatch):
  """The default blocks (128 rows, 64 columns, depth 64) on shapes they
  divide, with a partial last row block."""
  monkeypatch.setattr(channel_gpu, "_CHANNEL",
                      dict(channel_gpu._CHANNEL, layout="epilogue"))  # pylint: disable=protected-access
  got, want = _triton_and_xla(*_operands(97, 2, 128, 128, jnp.bfloat16))
  assert_outputs_and_grads_match(got, want, "bfloat16")


def test_sharded_over_a_mesh_matches_one_device(epilogue):
  del epilogue
  assert_sharded_matches_one_device(
      _triton, *_operands(22, 8, 64, 48, jnp.float32))


def test_layout_and_widths_are_checked(monkeypatch):
  monkeypatch.setattr(channel_gpu, "_CHANNEL",
                      dict(channel_gpu._CHANNEL, layout="fused"))  # pylint: disable=protected-access
  with pytest.raises(ValueError, match=r"channel_gpu._CHANNEL\['layout'\]"):
    channel_gpu.use_kernel()
  monkeypatch.setattr(channel_gpu, "_CHANNEL",
                      dict(channel_gpu._CHANNEL, layout="epilogue"))  # pylint: disable=protected-access
  x, w_in, w_out, _ = _operands(9, 2, 40, 32, jnp.float32)   # D = 40
  with pytest.raises(ValueError, match=r"hidden size \(40\) to be a multiple"):
    _triton(x, w_in, w_out)
