"""trm.nn.layer_stack: the unscanned and scanned layer layouts."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.nn import layer_stack

_KW = dict(stacked="layers", prefix="layers_", count_field="cfg.n")


def _params(n):
  return {"embed": np.ones(3, np.float32),
          **{f"layers_{i}": {"w": np.full((2, 2), i, np.float32)}
             for i in range(n)}}


def test_round_trip_keeps_values_and_host_arrays():
  params = _params(3)
  stacked = layer_stack.stack(params, 3, axis_name="layers", **_KW)
  assert sorted(stacked) == ["embed", "layers"]
  assert isinstance(stacked["layers"]["w"], np.ndarray)
  np.testing.assert_array_equal(stacked["layers"]["w"][:, 0, 0], [0, 1, 2])
  back = layer_stack.unstack({"params": stacked}, 3, scan_field="cfg.scan",
                             **_KW)["params"]
  assert jax.tree.structure(back) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_boxed_leaves_name_the_new_axis():
  boxed = {f"layers_{i}": {"w": nn.LogicallyPartitioned(
      jnp.zeros((2, 4)), ("embed", "mlp"))} for i in range(2)}
  stacked = layer_stack.stack(boxed, 2, axis_name="stack", **_KW)
  assert stacked["layers"]["w"].names == ("stack", "embed", "mlp")
  assert stacked["layers"]["w"].value.shape == (2, 2, 4)
  back = layer_stack.unstack(stacked, 2, scan_field="cfg.scan", **_KW)
  assert back["layers_1"]["w"].names == ("embed", "mlp")


def test_wrong_layout_or_depth_names_the_field():
  stacked = layer_stack.stack(_params(2), 2, axis_name="layers", **_KW)
  with pytest.raises(ValueError, match=r"cfg\.n=3"):
    layer_stack.stack(_params(2), 3, axis_name="layers", **_KW)
  with pytest.raises(ValueError, match=r"cfg\.n=3"):
    layer_stack.unstack(stacked, 3, scan_field="cfg.scan", **_KW)
  with pytest.raises(ValueError, match=r"cfg\.scan=True"):
    layer_stack.unstack(_params(2), 2, scan_field="cfg.scan", **_KW)
