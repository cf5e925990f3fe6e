"""The train state: built abstract-first, sharded by the logical rules.

`abstract_state` evaluates the initialiser with `jax.eval_shape`, reads the
logical axis names the model put on every variable (and the batch axes of the
ACT carry), and turns them into shardings with the config's rules.
`init_state` then runs the initialiser under `jit(out_shardings=...)`, so every
array is born on its devices and no host ever holds the full state.
"""
from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from trm import mesh as mesh_lib
from trm.models import trm as trm_model


@flax.struct.dataclass
class TrainState:
  step: jax.Array          # int32 scalar: optimizer updates done
  params: Any              # AdamATan2-trained weights
  opt_state: Any
  ema_params: Any          # EMA of params; used for evaluation
  buffers: Any             # H_init / L_init (fixed)
  puzzle_emb: Any          # {'weights': [N, D]} sign-SGD table, or {}
  carry: trm_model.Carry   # streaming-ACT carry, persists across steps
  rng: jax.Array           # base PRNG key; step keys are fold_in(rng, step)

  def variables(self, params=None):
    return {"params": self.params if params is None else params,
            "buffers": self.buffers, "puzzle_emb": self.puzzle_emb}


def _box_carry(carry: trm_model.Carry) -> trm_model.Carry:
  return jax.tree.map(lambda x, names: nn.LogicallyPartitioned(x, names),
                      carry, trm_model.CARRY_AXES,
                      is_leaf=lambda x: isinstance(x, tuple))


def make_init_fn(model: trm_model.TRM, tx: optax.GradientTransformation,
                 batch_size: int, seed: int):
  """A function () -> boxed TrainState (leaves carry logical axis names)."""

  def init():
    key = jax.random.PRNGKey(seed)
    init_key, state_key = jax.random.split(key)
    variables = trm_model.init_variables(model, init_key)
    params = variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params,
        opt_state=tx.init(params),
        ema_params=jax.tree.map(lambda x: x, params),
        buffers=variables["buffers"],
        puzzle_emb=variables.get("puzzle_emb", {}),
        carry=_box_carry(trm_model.empty_carry(model.cfg, batch_size)),
        rng=state_key)

  return init


def abstract_state(init_fn, mesh, rules):
  """(abstract unboxed state with shardings, shardings tree)."""
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init_fn)
  shardings = mesh_lib.tree_shardings(mesh, rules, boxed)
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      nn.meta.unbox(boxed), shardings)
  return abstract, shardings


def init_state(init_fn, mesh, rules, shardings) -> TrainState:
  """Runs the initialiser with every array born sharded."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return jax.jit(lambda: nn.meta.unbox(init_fn()),
                   out_shardings=shardings)()


def compile_step(step_fn, abstract_state, state_shardings, abstract_batch):
  """`step_fn(state, batch) -> (state, metrics)` jitted with the state's
  shardings in and out and the state donated, compiled ahead of time for an
  abstract batch whose leaves carry their shardings.

  Call inside `jax.set_mesh(mesh)` and `nn.logical_axis_rules(rules)`.
  """
  batch_shardings = jax.tree.map(lambda x: x.sharding, abstract_batch)
  return jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings),
                 out_shardings=(state_shardings, None),
                 donate_argnums=0).lower(abstract_state,
                                         abstract_batch).compile()
