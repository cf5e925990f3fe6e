"""The chunked LM-head loss over a mesh: the whole-logits loss's values and
gradients; inside its loops only the reduction of each chunk's table
gradient into the parameter's layout, or with `reduce_once` nothing (no
gather either way)."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_collectives import COLLECTIVE
from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.families.gpt import steps as gpt_steps
from trm.nn import chunked_loss


def _head(h, table):
  return h @ table.T


def _case(seed=0):
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.normal(size=(8, 12, 16)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(24, 16)) * 0.3, jnp.float32)
  y = rng.integers(0, 24, size=(8, 12)).astype(np.int32)
  y[1, :5] = -1
  return hidden, table, jnp.asarray(y)


def _loss(kind, terms=(0.1, 0.01), reduce_once=False, gather_fn=None):
  if kind == "whole":
    return lambda h, t, y: gpt_steps.cross_entropy(_head(h, t), y, *terms)[0]
  return lambda h, t, y: gpt_steps.chunked_cross_entropy(
      h, t, y, 5, _head, *terms, grad_axes=("vocab", "embed"),
      reduce_once=reduce_once, gather_fn=gather_fn)[0]


def _loop_bodies(hlo: str) -> list[str]:
  """The text of every while loop's body computation."""
  names = set(re.findall(r"body=%?([\w.\-]+)", hlo))
  bodies = []
  for name in names:
    match = re.search(r"\n%?" + re.escape(name) + r" [^\n]*\{\n(.*?)\n\}",
                      hlo, re.S)
    assert match, name
    bodies.append(match.group(1))
  return bodies


def _fsdp_mesh(model: int = 1):
  return jax.make_mesh((1, 8 // model, model), mesh_lib.MESH_AXES,
                       axis_types=(jax.sharding.AxisType.Auto,) * 3)


@pytest.mark.parametrize("model, reduce_once", [
    (1, False), (1, True), (2, False), (2, True)])
def test_over_fsdp_the_chunks_reduce_once_or_per_chunk(model, reduce_once):
  """Batch over 8 devices, the table's width over fsdp (and its vocabulary
  over 2 devices of `model`): the chunked loss (12 positions in chunks of
  5, padded) equals the whole logits' in value and gradients; the table
  enters the loops gathered (no gather inside them); each chunk's table
  gradient leaves the backward loop's body by one reduction into the
  parameter's layout, or with `reduce_once` by none (the devices' float32
  sums cross once, after the loop; with the vocabulary split it keeps the
  per-chunk reduction)."""
  hidden, table, y = _case()
  want, want_grads = jax.jit(jax.value_and_grad(_loss("whole"), (0, 1)))(
      hidden, table, y)
  rules = config_lib.default_logical_axis_rules()
  mesh = _fsdp_mesh(model)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    def place(x, names):
      return jax.device_put(x, mesh_lib.logical_sharding(mesh, rules, names))
    args = (place(hidden, ("activation_batch", None, None)),
            place(table, ("vocab", "embed")), y)
    # The table as the GPT's head makes it: gathered over its width, by
    # the loss.
    step = jax.jit(jax.value_and_grad(_loss(
        "chunked", reduce_once=reduce_once,
        gather_fn=lambda t: mesh_lib.constrain(t, ("vocab", None))), (0, 1)))
    got, grads = step(*args)
    lowered = step.lower(*args).as_text()
    hlo = step.lower(*args).compile().as_text()
  assert float(got) == pytest.approx(float(want), rel=1e-6)
  for a, b in zip(grads, want_grads):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # The gradient leaves in the parameter's layout: no gather of it.
  assert not [line for line in hlo.splitlines() if "transpose(" in line
              and re.search(r"\ball-gather(-start)?\(", line)]
  # One pass over the chunks makes the value and both gradients: each
  # chunk's logits are made once (three matmuls: logits, d hidden, d
  # table), not again for a backward pass.
  bodies = _loop_bodies(hlo)
  assert len(bodies) == 1, len(bodies)
  assert lowered.count("stablehlo.dot_general") == 3
  # Collectives of arrays (not the chunk's scalar sums) inside the loops:
  # one reduction of the chunk's table gradient (XLA:CPU writes a
  # reduce-scatter as an all-reduce and a slice), no gather.
  in_loops = sorted(m.group(1) for body in bodies for line in
                    body.splitlines() for m in COLLECTIVE.finditer(line)
                    if re.search(r"\[\d", line[:m.start()]))
  assert "all-gather" not in in_loops, in_loops
  if model == 1 and reduce_once:
    assert not in_loops, in_loops
    # The devices' sums reduce-scatter over the vocabulary (an eighth of
    # its 24 rows a device), and an all-to-all of those shares lays them
    # out as the parameter (its width over 8 devices); no whole float32
    # sum is all-reduced.
    assert [line for line in hlo.splitlines() if "f32[3,16]" in line
            and re.search(r"\breduce-scatter(-start)?\(", line)]
    assert [line for line in hlo.splitlines() if "f32[3,2]" in line
            and re.search(r"\ball-to-all(-start)?\(", line)]
    assert not [line for line in hlo.splitlines() if "f32[24,16]" in line
                and re.search(r"\ball-reduce(-start)?\(", line)]
  elif model == 1:  # (with the vocabulary split the softmax's sums cross)
    assert len(in_loops) == 1 and in_loops[0] in (
        "all-reduce", "reduce-scatter"), in_loops


@pytest.mark.parametrize("reduce_once", [False, True])
def test_weighted_tokens_with_a_vocab_last_head_over_fsdp(reduce_once):
  """DiffuCoder's layout: the head [C, vocab] (its width over fsdp), each
  token's loss weighted (1/t on masked tokens, 0 elsewhere), gathered by
  the loss (`gather_fn`): the value and gradients of the whole logits'
  weighted sum; no gather in the loops, and none of the gradient (it
  leaves in the parameter's layout)."""
  hidden, table, y = _case(1)
  table = table.T
  weights = jnp.asarray(np.random.default_rng(2).uniform(
      0.5, 3.0, y.shape) * (np.asarray(y) >= 0), jnp.float32)

  def whole(h, t):
    logits = h @ t
    ce = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
        logits, jnp.maximum(y, 0)[..., None], -1)[..., 0]
    return jnp.sum(weights * ce)

  want, want_grads = jax.jit(jax.value_and_grad(whole, (0, 1)))(hidden,
                                                                 table)
  rules = config_lib.default_logical_axis_rules()
  mesh = _fsdp_mesh()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    def place(x, names):
      return jax.device_put(x, mesh_lib.logical_sharding(mesh, rules, names))
    args = (place(hidden, ("activation_batch", None, None)),
            place(table, ("embed", "vocab")))

    def chunked(h, t):
      return chunked_loss.chunked_cross_entropy(
          h, t, y, 5, lambda x, t: x @ t, grad_axes=("embed", "vocab"),
          reduce_once=reduce_once, weights=weights,
          gather_fn=lambda t: mesh_lib.constrain(t, (None, "vocab")))[0]

    step = jax.jit(jax.value_and_grad(chunked, (0, 1)))
    got, grads = step(*args)
    hlo = step.lower(*args).compile().as_text()
  assert float(got) == pytest.approx(float(want), rel=1e-6)
  for a, b in zip(grads, want_grads):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert not any(re.search(r"\ball-gather(-start)?\(", body)
                 for body in _loop_bodies(hlo))
  gathers = [line for line in hlo.splitlines()
             if re.search(r"\ball-gather(-start)?\(", line)]
  assert gathers and not [g for g in gathers if "transpose(" in g], gathers
