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

Per-parameter multipliers (`with_multipliers`; big_vision's
config.lr_mults / wd_mults, Hugging Face's parameter groups): ordered
(regex, multiplier) pairs matched against each parameter's '/'-joined
name; the first that matches wins, and an unmatched parameter keeps 1.0.
An lr multiplier scales the parameter's whole update (its decay too), 0
freezing it; a wd multiplier scales its decoupled decay alone.
"""
from __future__ import annotations

import math
import numbers
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
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
          weight_decay: float, field: str, mask=None, lr_mults=(),
          wd_mults=(), mults_field: str = "config.optim"
          ) -> optax.GradientTransformation:
  """The optimizer `name` at the rate `schedule(count)` (optax's 0-based
  count of updates applied). `b1`: AdamW's, AdamATan2's and Lion's first
  beta, SGD's momentum; `b2`: their second beta (SGD and Adafactor read
  neither: Adafactor keeps optax's decay_rate 0.8, T5X's); `eps`: AdamW's.
  `mask` (a tree like the parameters, or a function of them): the
  parameters weight decay applies to (None: all). `field` names the
  config field in the error of an unknown name. `lr_mults`, `wd_mults`:
  `with_multipliers`'s, named `{mults_field}.lr_mults` and `.wd_mults` in
  their errors."""
  check(name, field)
  return with_param_axes(with_multipliers(
      lambda decay: _choice(name, schedule, b1=b1, b2=b2, eps=eps,
                            weight_decay=decay, mask=mask),
      schedule, weight_decay=weight_decay, mask=mask, lr_mults=lr_mults,
      wd_mults=wd_mults, field=mults_field))


def _choice(name: str, schedule, *, b1: float, b2: float, eps: float,
            weight_decay: float, mask) -> optax.GradientTransformation:
  """`build`'s optimizer `name`, without multipliers or boxed axes."""
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
  return tx


_EXAMPLE = "e.g. (('.*/bias', 0.0), ('embed/.*', 0.1))"


def multipliers(pairs, field: str) -> tuple[tuple[re.Pattern, float], ...]:
  """The compiled (regex, multiplier) pairs of config `field`
  (config.optim.lr_mults or wd_mults); one line (ValueError) naming the
  field for anything else: no sequence of pairs, a pattern that is no
  regular expression, a multiplier that is no finite number >= 0."""
  if isinstance(pairs, (str, bytes)) or not isinstance(pairs, (tuple, list)):
    raise ValueError(f"{field}={pairs!r} is not a tuple of (regex, "
                     f"multiplier) pairs: give one, {_EXAMPLE}, or ().")
  compiled = []
  for i, pair in enumerate(pairs):
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
        or not isinstance(pair[0], str)):
      raise ValueError(f"{field}[{i}]={pair!r} is not a (regex, multiplier) "
                       f"pair: give {_EXAMPLE}.")
    pattern, mult = pair
    try:
      regex = re.compile(pattern)
    except re.error as e:
      raise ValueError(f"{field}[{i}]: {pattern!r} is not a regular "
                       f"expression ({e}): mend it, {_EXAMPLE}.") from None
    if (isinstance(mult, bool) or not isinstance(mult, numbers.Real)
        or not math.isfinite(mult) or mult < 0):
      raise ValueError(f"{field}[{i}]: the multiplier {mult!r} of "
                       f"{pattern!r} is not a finite number >= 0: give one "
                       "(0 freezes, 1 leaves the parameter as it was).")
    compiled.append((regex, float(mult)))
  return tuple(compiled)


def check_multipliers(section, field: str) -> None:
  """`multipliers`' one line for a bad `{field}.lr_mults` or `.wd_mults`
  of config `section` (config.optim; GPT's config itself), with the
  family's other checks, before any data or compile."""
  for key in ("lr_mults", "wd_mults"):
    multipliers(section.get(key, ()), f"{field}.{key}")


def _is_box(node) -> bool:
  return isinstance(node, nn.Partitioned)


def _key_name(key) -> str:
  for attr in ("key", "idx", "name"):  # DictKey, SequenceKey, GetAttrKey
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def param_names(params) -> list[str]:
  """Each leaf's '/'-joined name (a boxed leaf, as `tx.init` sees the
  parameters, is named as its value), in the order of jax.tree.leaves."""
  paths = jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_box)[0]
  return ["/".join(_key_name(key) for key in path) for path, _ in paths]


def leaf_multipliers(params, rules, field: str):
  """A tree like `params` of each leaf's multiplier (Python floats: static,
  whatever the sharding): the first of `rules` (`multipliers`) whose regex
  matches the leaf's whole name, else 1.0. A pattern that decides no
  leaf's multiplier is a mistake (a typo, a renamed module): one line
  naming it, as big_vision refuses it."""
  names = param_names(params)
  chosen, decided = [], set()
  for name in names:
    mult = 1.0
    for i, (regex, value) in enumerate(rules):
      if regex.fullmatch(name):
        mult = value
        decided.add(i)
        break
    chosen.append(mult)
  for i, (regex, _) in enumerate(rules):
    if i not in decided:
      raise ValueError(
          f"{field}[{i}]: {regex.pattern!r} matches no parameter (not one "
          "an earlier pattern took): mend or drop it. Names are '/'-joined, "
          f"without a leading '/', e.g. {names[:3]}.")
  treedef = jax.tree.structure(params, is_leaf=_is_box)
  return jax.tree.unflatten(treedef, chosen)


def schedule_count(opt_state):
  """The count the optimizer's schedule reads before this step's update:
  optax's `ScaleByScheduleState`, else the state's own (AdamATan2's)."""
  def is_schedule(node):
    return isinstance(node, optax.ScaleByScheduleState)

  found = [n for n in jax.tree.leaves(opt_state, is_leaf=is_schedule)
           if is_schedule(n)]
  return found[0].count if found else opt_state.count


def with_multipliers(make, schedule, *, weight_decay: float, mask, lr_mults,
                     wd_mults, field: str) -> optax.GradientTransformation:
  """`make(weight_decay)` (an optimizer at `schedule`, decoupled decay on
  the parameters `mask` names) with per-parameter multipliers: config
  `{field}.lr_mults` scales a parameter's whole update (0: frozen, its
  update zero as optax.set_to_zero's, though its moments still follow its
  gradients), `{field}.wd_mults` its decay, lr x weight_decay x mult x p.
  Both () (the default): `make(weight_decay)` itself, every step as before.
  With wd_mults, `make(0.0)`'s state tree is `make(weight_decay)`'s (the
  decay is stateless), so checkpoints restore either way."""
  lr_field, wd_field = f"{field}.lr_mults", f"{field}.wd_mults"
  lr_rules = multipliers(lr_mults, lr_field)
  wd_rules = multipliers(wd_mults, wd_field)
  if not lr_rules and not wd_rules:
    return make(weight_decay)
  tx = make(0.0 if wd_rules else weight_decay)

  def init(params):
    # Checked here too, when the state is first laid out (before compiling).
    leaf_multipliers(params, lr_rules, lr_field)
    leaf_multipliers(params, wd_rules, wd_field)
    return tx.init(params)

  def update(grads, state, params=None):
    rate = schedule(schedule_count(state)) if wd_rules else None
    updates, state = tx.update(grads, state, params)
    if wd_rules:
      decays = leaf_multipliers(params, wd_rules, wd_field)
      decayed = jax.tree.map(lambda _: True, params)
      if mask is not None:
        decayed = mask(params) if callable(mask) else mask

      def decay(u, p, mult, on):
        if not on or mult == 0 or weight_decay == 0:
          return u
        return (u - (rate * (weight_decay * mult)) * p).astype(u.dtype)

      updates = jax.tree.map(decay, updates, params, decays, decayed)
    if lr_rules:
      updates = jax.tree.map(
          lambda u, mult: jnp.zeros_like(u) if mult == 0 else
          (u if mult == 1 else (u * mult).astype(u.dtype)),
          updates, leaf_multipliers(updates, lr_rules, lr_field))
    return updates, state

  return optax.GradientTransformation(init, update)


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
