"""TRM's train state: weights, optimizer, EMA, puzzle table and ACT carry.

The ACT carry lives in the state because upstream's streaming ACT keeps each
row's recursion going across steps; its batch axes are sharded like data.
"""
from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from trm.core.state import zero_counters
from trm.families.trm import model as trm_model


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
  skipped_steps: jax.Array  # int32: steps whose update was skipped (NaN/Inf)
  bad_streak: jax.Array    # int32: consecutive skipped steps up to `step`

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
        rng=state_key, **zero_counters())

  return init
