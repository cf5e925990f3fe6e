"""The train state of the language models (Dream / DiffuCoder and GPT).

Weights, optimizer state, a base PRNG key and the skipped-step counters of
`trm.core.state.skip_nonfinite`; the loss scale only for float16 compute.
"""
from __future__ import annotations

from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp

from trm.core import state as state_lib


@flax.struct.dataclass
class LMState:
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array
  skipped_steps: jax.Array  # see `trm.core.state.skip_nonfinite`
  bad_streak: jax.Array
  # float16 compute only (`trm.core.loss_scale`); None holds no arrays, so other
  # runs' checkpoints are unchanged.
  loss_scale: Any = None


def _step_zero(params, tx, state_key, loss_scale) -> LMState:
  return LMState(step=jnp.zeros((), jnp.int32), params=params,
                 opt_state=tx.init(params), rng=state_key,
                 loss_scale=loss_scale, **state_lib.zero_counters())


def make_init_fn(init_params: Callable[[jax.Array], Any], tx, seed: int,
                 loss_scale=None):
  """() -> boxed LMState around `init_params(key)` (boxed parameters);
  `loss_scale` from `trm.core.loss_scale.initial_state` (None unless
  float16)."""

  def init():
    init_key, state_key = jax.random.split(jax.random.PRNGKey(seed))
    return _step_zero(init_params(init_key), tx, state_key, loss_scale)

  return init


def state_around_params(params, tx, seed: int, ctx, shardings,
                        loss_scale=None) -> LMState:
  """A step-0 state holding `params` (already on `shardings.params`), with
  the optimizer state created sharded beside them; `params` is donated."""
  _, state_key = jax.random.split(jax.random.PRNGKey(seed))

  def build(params):
    return _step_zero(params, tx, state_key, loss_scale)

  with ctx:
    return jax.jit(build, in_shardings=(shardings.params,),
                   out_shardings=shardings, donate_argnums=0)(params)
