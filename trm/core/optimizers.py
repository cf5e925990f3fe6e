"""The choice of optimizer (TRM's and DiffuCoder's config.optim.optimizer,
GPT's config.optimizer): MaxText's `opt_type`, Hugging Face's `optim`,
big_vision's `optax_name`.

Every choice keeps its family's schedule, gradient clipping and weight
decay: decoupled, as AdamW's (each step multiplies a decayed parameter by
1 - lr x weight_decay, on the parameters the family's mask names), also for
Adafactor and SGD, whose optax forms decay otherwise or not at all.

The family's schedule is the rate optax's `ScaleByScheduleState` counts
(AdamATan2's own count in TRM's default, as before), so the `lr` metric
(`trm.core.state.learning_rate`) and GPT's skipped steps
(`gpt.steps.advance_schedule`) find it in every choice.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import optax

from trm.families.trm import optim as trm_optim

# The names `build` takes: AdamW (optax.adamw, torch.optim.AdamW's),
# AdamATan2 (TRM's, no epsilon), Adafactor (optax.adafactor's defaults,
# T5X's and big_vision's: factored second moments, no momentum), Lion
# (optax.lion), SGD (momentum beta1, nesterov off).
CHOICES = ("adamw", "adam_atan2", "adafactor", "lion", "sgd")


def check(name, field: str) -> None:
  """One line (ValueError) naming `field` unless `name` is a choice."""
  if not isinstance(name, str) or name not in CHOICES:
    raise ValueError(
        f"{field}={name!r} is not an optimizer offered here: use one of "
        f"{list(CHOICES)}.")


def build(name: str, schedule, *, b1: float, b2: float, eps: float,
          weight_decay: float, field: str,
          mask=None) -> optax.GradientTransformation:
  """The optimizer `name` at the rate `schedule(count)` (optax's 0-based
  count of updates applied). `b1`: AdamW's, AdamATan2's and Lion's first
  beta, SGD's momentum; `b2`: their second beta (SGD and Adafactor read
  neither: Adafactor keeps optax's decay_rate 0.8, T5X's); `eps`: AdamW's.
  `mask` (a tree like the parameters, or a function of them): the
  parameters weight decay applies to (None: all). `field` names the
  config field in the error of an unknown name."""
  check(name, field)
  if name == "adamw":
    tx = optax.adamw(schedule, b1=b1, b2=b2, eps=eps,
                     weight_decay=weight_decay, mask=mask)
  elif name == "adam_atan2":
    # At rate 1, then scaled by the schedule: the same step (AdamATan2's
    # update is linear in its rate), with the schedule's count apart from
    # AdamATan2's bias-correction count, so a skipped step can move the
    # one without the other (GPT's iterations).
    tx = optax.chain(
        trm_optim.adam_atan2(1.0, b1=b1, b2=b2, weight_decay=weight_decay,
                             mask=mask),
        optax.scale_by_learning_rate(schedule, flip_sign=False))
  elif name == "adafactor":
    # optax.adafactor without its rate, its sign flipped back, then
    # decoupled weight decay and the rate: its own weight_decay_rate is not
    # multiplied by the rate (TRM's weight_decay=1.0 would zero every
    # weight in one step).
    tx = optax.chain(optax.adafactor(learning_rate=None), optax.scale(-1.0),
                     optax.add_decayed_weights(weight_decay, mask),
                     optax.scale_by_learning_rate(schedule))
  elif name == "lion":
    tx = optax.lion(schedule, b1=b1, b2=b2, weight_decay=weight_decay,
                    mask=mask)
  else:  # sgd: decayed after the momentum, as AdamW after its moments
    tx = optax.chain(optax.trace(decay=b1, nesterov=False),
                     optax.add_decayed_weights(weight_decay, mask),
                     optax.scale_by_learning_rate(schedule))
  return with_param_axes(tx)


def with_param_axes(tx: optax.GradientTransformation):
  """`tx` whose state, made from logically boxed parameters (the state
  builders' `tx.init`), keeps a parameter's logical axes only on arrays of
  its rank: moments like the parameters (AdamW's, Lion's) are sharded like
  them; Adafactor's factored row and column statistics (one axis fewer)
  and its placeholders are replicated (they kept the parameter's names,
  which no sharding of theirs can follow)."""

  def is_box(node):
    return isinstance(node, nn.Partitioned)

  def fit(node):
    if is_box(node) and len(node.names) != node.value.ndim:
      return node.value
    return node

  return tx._replace(
      init=lambda params: jax.tree.map(fit, tx.init(params), is_leaf=is_box))
