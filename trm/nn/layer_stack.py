"""Two layouts of a model's repeated layers, and the moves between them.

Unscanned: one subtree per layer, `<prefix>0` .. `<prefix>{n-1}` (the
reference checkpoints' layout). Scanned (`nn.scan`): one subtree `stacked`
whose leaves are the layers' leaves stacked on a new leading axis. GPT
(`h_0..` / `h`) and Dream (`layers_0..` / `layers`) both use these.

Leaves may be numpy or jax arrays, ShapeDtypeStructs or boxed
(`nn.LogicallyPartitioned`) values, whose new leading axis gets the logical
name `axis_name`; numpy stays numpy (imported weights stay on the host). A
params tree or variables `{"params": ...}` is taken.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def _is_boxed(x) -> bool:
  return isinstance(x, nn.LogicallyPartitioned)


def _stack(leaves, axis_name: str):
  """One [n, ...] leaf from the layers' leaves (all of one kind)."""
  first = leaves[0]
  if _is_boxed(first):  # as nn.scan's metadata_params name the new axis
    return first.replace(value=_stack([x.value for x in leaves], axis_name),
                         names=(axis_name,) + tuple(first.names))
  if isinstance(first, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct((len(leaves),) + tuple(first.shape),
                                first.dtype)
  if isinstance(first, (np.ndarray, np.generic)):
    return np.stack(leaves)
  return jnp.stack(leaves)


def _layer(leaf, i: int):
  """Layer i of a [n, ...] leaf."""
  if _is_boxed(leaf):
    return leaf.replace(value=_layer(leaf.value, i),
                        names=tuple(leaf.names)[1:])
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(tuple(leaf.shape[1:]), leaf.dtype)
  return leaf[i]


def layer_names(params, prefix: str) -> list[str]:
  """The unscanned layers' keys in `params`, in layer order."""
  return sorted((k for k in params if k.startswith(prefix)
                 and k[len(prefix):].isdigit()),
                key=lambda k: int(k[len(prefix):]))


def stack(params, n: int, *, stacked: str, prefix: str, axis_name: str,
          count_field: str):
  """The unscanned layers `<prefix>0..` as one stacked subtree `stacked`;
  other entries are kept. `count_field` names the config field holding n
  (for the error a wrong layout gets)."""
  if set(params) == {"params"}:
    return {"params": stack(params["params"], n, stacked=stacked,
                            prefix=prefix, axis_name=axis_name,
                            count_field=count_field)}
  names = [f"{prefix}{i}" for i in range(n)]
  found = layer_names(params, prefix)
  if stacked in params or found != names:
    raise ValueError(
        f"stacking layers takes the unscanned layout {prefix}0 .. "
        f"{prefix}{n - 1} ({count_field}={n}); the params have "
        f"{found + ([stacked] if stacked in params else [])}.")
  out = {k: v for k, v in params.items() if k not in names}
  out[stacked] = jax.tree.map(lambda *leaves: _stack(leaves, axis_name),
                              *(params[name] for name in names),
                              is_leaf=_is_boxed)
  return out


def unstack(params, n: int, *, stacked: str, prefix: str, count_field: str,
            scan_field: str):
  """`stack`'s inverse: the subtree `stacked` (leaves [n, ...]) as layers
  `<prefix>0 .. <prefix>{n-1}`; the same kinds of trees and leaves.
  `scan_field` names the config field that selects the scanned layout."""
  if set(params) == {"params"}:
    return {"params": unstack(params["params"], n, stacked=stacked,
                              prefix=prefix, count_field=count_field,
                              scan_field=scan_field)}
  if stacked not in params or layer_names(params, prefix):
    raise ValueError(
        f"unstacking layers takes the scanned layout ({scan_field}=True: "
        f"one stacked {stacked!r}); the params have {sorted(params)}.")
  layers = params[stacked]
  for path, leaf in jax.tree_util.tree_flatten_with_path(
      nn.meta.unbox(layers))[0]:
    if tuple(leaf.shape[:1]) != (n,):
      raise ValueError(
          f"params {stacked}{jax.tree_util.keystr(path)} has shape "
          f"{tuple(leaf.shape)}; {count_field}={n} layers stack on its "
          "first axis.")
  out = {k: v for k, v in params.items() if k != stacked}
  for i in range(n):
    out[f"{prefix}{i}"] = jax.tree.map(lambda leaf, i=i: _layer(leaf, i),
                                       layers, is_leaf=_is_boxed)
  return out
