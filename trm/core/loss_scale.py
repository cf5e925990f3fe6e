"""Dynamic loss scaling for float16 compute (GPT and DiffuCoder / Dream).

float16 keeps 5 exponent bits: gradients below ~6e-8 flush to zero. The
step multiplies the loss by `scale` before differentiating, so the backward
pass runs on values `scale` times larger, and divides the gradients by it
(in float32, on the float32 master weights' gradients) before clipping and
the optimizer. As PyTorch's GradScaler: a step whose gradients overflow
(Inf/NaN) is skipped and halves the scale; `growth_interval` finite steps
in a row double it. Skipped steps are counted by `trm.core.state.skip_nonfinite`,
as every non-finite step is (`skipped_steps`, `max_bad_streak`, and the
`max_consecutive_bad_steps` stop).

bfloat16 and float32 runs carry no scale (`LMState.loss_scale` is None, so
their checkpoints hold the same arrays as before).
"""
from __future__ import annotations

import math

import flax
import jax
import jax.numpy as jnp

FACTOR = 2.0  # growth and (inverted) backoff, as GradScaler's defaults
# Bounds: below 1 scaling no longer helps with overflow (a step overflowing
# unscaled is a real NaN, the bad-step stop's business); 2**24 keeps the
# scaled float32 loss far from float32's range.
MIN_SCALE, MAX_SCALE = 1.0, 2.0**24


@flax.struct.dataclass
class LossScale:
  scale: jax.Array       # float32: the loss is multiplied by it
  good_steps: jax.Array  # int32: finite steps since the scale last changed
  growth_interval: int = flax.struct.field(pytree_node=False, default=2000)

  def adjust(self, ok) -> "LossScale":
    """The scale after a step: halved if not `ok`, doubled after
    `growth_interval` finite steps in a row."""
    good = jnp.where(ok, self.good_steps + 1, 0)
    grow = good >= self.growth_interval
    scale = jnp.where(ok, jnp.where(grow, self.scale * FACTOR, self.scale),
                      self.scale / FACTOR)
    return self.replace(
        scale=jnp.clip(scale, MIN_SCALE, MAX_SCALE).astype(jnp.float32),
        good_steps=jnp.where(grow, 0, good).astype(jnp.int32))


def enabled(config) -> bool:
  """float16 compute is what needs a scale."""
  return config.model.get("dtype") == "float16"


def check_config(config) -> None:
  """One-line errors naming the field; only float16 runs read the knobs."""
  if not enabled(config):
    return
  if config.model.get("param_dtype", "float32") != "float32":
    raise ValueError(
        f"config.model.param_dtype={config.model.param_dtype!r} must be "
        "'float32' with config.model.dtype='float16': the optimizer updates "
        "float32 master weights (float16 ones lose small updates).")
  initial = config.loss_scale.initial
  if (not isinstance(initial, (int, float)) or not math.isfinite(initial)
      or not MIN_SCALE <= initial <= MAX_SCALE):
    raise ValueError(f"config.loss_scale.initial={initial} must be a number "
                     f"in [{MIN_SCALE:g}, {MAX_SCALE:g}] (2**15 = 32768.0 is"
                     " usual).")
  interval = config.loss_scale.growth_interval
  if isinstance(interval, bool) or not isinstance(interval, int) or (
      interval <= 0):
    raise ValueError(f"config.loss_scale.growth_interval={interval} must be "
                     "a positive integer.")


def initial_state(config) -> LossScale | None:
  """The scale a new float16 run starts with; None for other dtypes."""
  if not enabled(config):
    return None
  check_config(config)
  return LossScale(scale=jnp.asarray(config.loss_scale.initial, jnp.float32),
                   good_steps=jnp.zeros((), jnp.int32),
                   growth_interval=config.loss_scale.growth_interval)


def scale_loss(loss_scale: LossScale | None, loss):
  return loss if loss_scale is None else loss * loss_scale.scale


def unscale(loss_scale: LossScale | None, grads):
  """Float32 gradients of the unscaled loss (exact: the scale is a power of
  two as long as `initial` is)."""
  if loss_scale is None:
    return grads
  inverse = 1.0 / loss_scale.scale
  return jax.tree.map(lambda g: g.astype(jnp.float32) * inverse, grads)
