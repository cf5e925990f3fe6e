"""The train state: built abstract-first, sharded by the logical rules.

`abstract_state` evaluates the initialiser with `jax.eval_shape`, reads the
logical axis names the model put on every variable (and, for TRM, the batch
axes of the ACT carry), and turns them into shardings with the config's rules.
`init_state` then runs the initialiser under `jit(out_shardings=...)`, so every
array is born on its devices and no host ever holds the full state.
`skip_nonfinite` is the update guard every family's train step ends with.
"""
from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics

from trm.core import array_sizes


# The skipped-step counters (see `skip_nonfinite`). Checkpoints written
# before they existed lack them; a resume starts them at 0
# (`trm.core.checkpoint.restore_latest`).
COUNTER_FIELDS = ("skipped_steps", "bad_streak")


def zero_counters() -> dict:
  """The skipped-step counters of a fresh state (see `skip_nonfinite`)."""
  return {name: jnp.zeros((), jnp.int32) for name in COUNTER_FIELDS}


def all_finite(*trees) -> jax.Array:
  """Scalar bool: every element of every floating leaf is finite."""
  leaves = [x for x in jax.tree.leaves(trees)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not leaves:
    return jnp.asarray(True)
  return jnp.stack([jnp.isfinite(x).all() for x in leaves]).all()


@flax.struct.dataclass
class Counter(clu_metrics.Metric):
  """A step counter as a metric: merging keeps the newer value, or the
  larger with `keep_max` (no division, unlike clu's `LastValue`)."""
  value: jax.Array
  count: jax.Array  # 1: `trm.families.trm.losses.compute` leaves out metrics with 0
  keep_max: bool = flax.struct.field(pytree_node=False, default=False)

  def merge(self, other: "Counter") -> "Counter":
    if self.keep_max:
      return other.replace(value=jnp.maximum(self.value, other.value))
    return other

  def compute(self):
    return self.value


def learning_rate(schedule, opt_state) -> Counter | None:
  """The `lr` metric: `schedule` at the count the optimizer's own schedule
  reads (optax's `ScaleByScheduleState`, else the state's `count`, as
  AdamATan2's), before this step's update, so the logged rate is the one
  the step's update used (upstream TRM's train/lr, nanoGPT's
  get_lr(iter_num)); the interval's last step's, as those logs show. None
  for an optimizer that keeps no step count (e.g. a plain `optax.sgd`
  swapped in by a benchmark): there is no rate of its schedule to log."""
  def is_schedule(node):
    return isinstance(node, optax.ScaleByScheduleState)

  found = [n for n in jax.tree.leaves(opt_state, is_leaf=is_schedule)
           if is_schedule(n)]
  # getattr on a state without the field finds e.g. tuple.count, a method.
  count = found[0].count if found else getattr(opt_state, "count", None)
  if not hasattr(count, "dtype"):
    return None
  return Counter(jnp.asarray(schedule(count), jnp.float32),
                 jnp.ones((), jnp.int32))


def add_learning_rate(metrics: dict, schedule, opt_state) -> None:
  """metrics["lr"] = `learning_rate`, unless there is no schedule (None) or
  no rate of it to log."""
  lr = None if schedule is None else learning_rate(schedule, opt_state)
  if lr is not None:
    metrics["lr"] = lr


def skip_nonfinite(state, new_state, metrics: dict, ok, guarded=()):
  """The update guard both model families' train steps end with.

  `ok` is `all_finite(loss, gradients)`; the new state's fields outside
  `guarded` must be finite as well. When either fails the step's update
  is dropped: every field keeps its value from `state` (parameters,
  optimizer state, EMA, puzzle table, ACT carry), except `step`, which
  advances so the data order stays that of a clean run. Fields named in
  `guarded` are taken from `new_state` as they are: the step already left
  them unchanged when not `ok` (cheaper than a select over a large table).
  The step's metrics are zeroed (averages over an interval leave it out), and
  `skipped_steps` (total) and `bad_streak` (consecutive, 0 after a good
  step) count it in the state. Two metrics report them: `skipped_steps` and
  `max_bad_streak`, the longest run of skipped steps an interval reached,
  which the loop reads with the metrics it fetches anyway (no host sync).
  A float16 state's `loss_scale` (`trm.core.loss_scale`) follows the same
  verdict, and is reported as the `loss_scale` metric.
  """
  # A finite gradient can still give non-finite weights (a huge learning
  # rate, an overflow): the step is then skipped too, so nothing non-finite
  # is ever kept (and so never saved).
  ok = jnp.logical_and(ok, all_finite(new_state.replace(
      **{name: None for name in guarded})))
  kept = jax.tree.map(lambda new, old: jnp.where(ok, new, old),
                      new_state, state.replace(**{
                          name: getattr(new_state, name) for name in guarded}))
  bad = jnp.logical_not(ok).astype(jnp.int32)
  kept = kept.replace(step=state.step + 1,
                      skipped_steps=state.skipped_steps + bad,
                      bad_streak=(state.bad_streak + 1) * bad)
  metrics = jax.tree.map(lambda x: jnp.where(ok, x, jnp.zeros_like(x)),
                         metrics)
  one = jnp.ones((), jnp.int32)
  metrics["skipped_steps"] = Counter(kept.skipped_steps, one)
  metrics["max_bad_streak"] = Counter(kept.bad_streak, one, keep_max=True)
  loss_scale = getattr(state, "loss_scale", None)  # float16 runs only
  if loss_scale is not None:
    # Adjusted by the same verdict, skipped step or not (an overflow halves
    # it; that is how the next step recovers).
    kept = kept.replace(loss_scale=loss_scale.adjust(ok))
    metrics["loss_scale"] = Counter(kept.loss_scale.scale, one)
  return kept, metrics


def with_shardings(abstract, shardings):
  """ShapeDtypeStructs of an unboxed abstract tree, carrying `shardings`
  (what ahead-of-time lowering and Orbax restores take)."""
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
      abstract, shardings)


def abstract_state(init_fn, ctx):
  """(abstract unboxed state with shardings, shardings tree); `ctx` a
  `mesh.ShardingContext`."""
  boxed, shardings = ctx.boxed_shardings(lambda: jax.eval_shape(init_fn))
  abstract = nn.meta.unbox(boxed)
  # Before anything lowers: an initialiser drawing 2**64 random values
  # failed there with JAX's NotImplementedError traceback.
  array_sizes.check_abstract(abstract, "The model's state",
                             "lower the config's model sizes (width, "
                             "vocabulary, sequence length)")
  placed = with_shardings(abstract, shardings)
  array_sizes.check_host_memory(
      placed, "The model's state (parameters and optimizer moments)",
      "lower the config's model sizes (width, vocabulary, puzzle "
      "identifiers), or shard it over more hosts or an accelerator")
  return placed, shardings


def init_state(init_fn, ctx, shardings):
  """Runs the initialiser with every array born sharded."""
  with ctx:
    lowered = jax.jit(lambda: nn.meta.unbox(init_fn()),
                      out_shardings=shardings).lower()
    # Compiled before the train step: an absurd width or vocabulary ended
    # here in XLA's CHECK abort, before compile_step could name it.
    array_sizes.check_lowered(lowered, "The model's initialisation",
                              "lower the config's model sizes (width, "
                              "vocabulary, sequence length)")
    return lowered.compile()()


def compile_step(step_fn, abstract_state, state_shardings, abstract_batch,
                 compiler_options=None):
  """`step_fn(state, batch) -> (state, metrics)` jitted with the state's
  shardings in and out and the state donated, compiled ahead of time for an
  abstract batch whose leaves carry their shardings. `compiler_options`:
  XLA options for this backend (`trm.core.tpu_flags`).

  Call inside the `mesh.ShardingContext` (`with ctx:`).
  """
  batch_shardings = jax.tree.map(lambda x: x.sharding, abstract_batch)
  lowered = jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings),
                    out_shardings=(state_shardings, None),
                    donate_argnums=0).lower(abstract_state, abstract_batch)
  array_sizes.check_lowered(lowered, "The train step",
                            "lower the config's sequence length, batch or "
                            "width")
  return lowered.compile(compiler_options or None)


def eval_step(eval_fn, state_shardings, batch_shardings):
  """`eval_fn(state, batch) -> (metrics, outputs)` jitted with the state's
  and the batch's shardings; each batch shape it meets is lowered, its
  arrays' sizes checked (`array_sizes`), then compiled, once. A plain
  `jax.jit` compiled on the first call: an eval step that alone holds an
  absurd array (`eval_only`, or a finished run, builds no train step to
  refuse it first) ended in XLA's CHECK abort."""
  jitted = jax.jit(eval_fn, in_shardings=(state_shardings, batch_shardings))
  compiled = {}

  def step(state, batch):
    leaves, structure = jax.tree.flatten(batch)
    key = (structure, tuple((x.shape, x.dtype) for x in leaves))
    if key not in compiled:
      lowered = jitted.lower(state, batch)
      array_sizes.check_lowered(lowered, "The eval step",
                                "lower the config's sequence length or eval "
                                "batch size")
      step_fn = lowered.compile()
      array_sizes.check_program_host_memory(
          step_fn, array_sizes.program_devices(step_fn), "The eval step",
          "lower the eval batch size or the config's sequence length, or "
          "run on an accelerator")
      compiled[key] = step_fn
    return compiled[key](state, batch)

  return step
