"""What to compile: a two-layer MLP classifier over 8 features."""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from clu import metrics as clu_metrics

from trm.core import lm_state
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.core.task import BatchField, Program

DISPLAY_NAME = "toy MLP"
FEATURES, CLASSES = 8, 4


def owns_state(paths) -> bool:
  return any(p.startswith("params/toy_hidden") for p in paths)


class ToyMLP(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.lecun_normal()
    h = nn.Dense(self.hidden, name="toy_hidden", kernel_init=(
        nn.with_logical_partitioning(init, ("embed", "mlp"))))(x)
    return nn.Dense(CLASSES, name="toy_out", kernel_init=(
        nn.with_logical_partitioning(init, ("mlp", "embed"))))(nn.relu(h))


def _loss(params, model, batch):
  logits = model.apply({"params": params}, batch["x"])
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"])
  return losses.mean(), (logits.argmax(-1) == batch["y"]).mean()


def train_step(state, batch, *, model, tx):
  (loss, accuracy), grads = jax.value_and_grad(_loss, has_aux=True)(
      state.params, model, batch)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  new_state = state.replace(step=state.step + 1, opt_state=opt_state,
                            params=optax.apply_updates(state.params, updates))
  metrics = {"loss": clu_metrics.Average(total=loss, count=jnp.int32(1)),
             "accuracy": clu_metrics.Average(total=accuracy,
                                             count=jnp.int32(1))}
  return state_lib.skip_nonfinite(state, new_state, metrics,
                                  state_lib.all_finite(loss, grads))


def eval_step(state, batch, *, model):
  loss, accuracy = _loss(state.params, model, batch)
  return {"loss": clu_metrics.Average(total=loss, count=jnp.int32(1)),
          "accuracy": clu_metrics.Average(total=accuracy,
                                          count=jnp.int32(1))}, {}


def build(config, ctx, shapes=None) -> Program:
  del ctx, shapes
  model = ToyMLP(config.model.hidden)
  tx = optax.adam(config.optim.lr)
  features = jnp.zeros((1, FEATURES), jnp.float32)
  return Program(
      model=model,
      init_fn=lm_state.make_init_fn(
          lambda key: model.init(key, features)["params"], tx, config.seed),
      train_step=functools.partial(train_step, model=model, tx=tx),
      eval_step=functools.partial(eval_step, model=model),
      batch_spec={"x": BatchField((FEATURES,), np.float32,
                                  (mesh_lib.BATCH, None)),
                  "y": BatchField((), np.int32, (mesh_lib.BATCH,))},
      flops_per_step=6.0 * config.global_batch_size * config.model.hidden
      * (FEATURES + CLASSES))
