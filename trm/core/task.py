"""What a model family hands the generic code: a Program and a Task.

A family (`trm/families/<name>/`) has two builders, looked up by
`config.model.name` in the registry (`trm/families/__init__.py`):

- `program.build(config, ctx, shapes=None) -> Program`: what to compile. The
  model, the state initialiser, the train and eval steps, the batch spec and
  the FLOPs per step. It reads no data, so `trm.aot` compiles a step for a
  TPU slice from a CPU host with the trainer's own code (as MaxText's
  compile-only path reuses its training builders). `shapes` are the data's
  sizes where the model depends on them (TRM's vocabulary and puzzle count).
- `task.build(config, workdir, ctx) -> Task`: what to feed. It prepares and
  reads the data, then adds sources, the initial state and evaluation hooks
  to the family's Program.

The loop in `trm/core/train.py` sees only these records.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class BatchField:
  """One key of a batch: its per-example shape, dtype and logical axes."""
  shape: tuple            # per example (the batch dimension comes first)
  dtype: Any
  axes: tuple             # logical names of every dimension, batch first
  eval_only: bool = False  # in evaluation batches only (e.g. GPT's split id)


def batch_shardings(spec: dict[str, BatchField], ctx) -> dict:
  """Batch key -> NamedSharding, from the logical axes of the spec."""
  return {k: ctx.sharding(f.axes) for k, f in spec.items()}


def abstract_batch(spec: dict[str, BatchField], global_batch_size: int,
                   shardings: dict) -> dict:
  """ShapeDtypeStructs of one global train batch (what a step compiles for)."""
  return {k: jax.ShapeDtypeStruct((global_batch_size, *f.shape),
                                  np.dtype(f.dtype), sharding=shardings[k])
          for k, f in spec.items() if not f.eval_only}


def compile_train_step(program: "Program", ctx, global_batch_size: int,
                       abstract_state, state_shardings,
                       compiler_options=None):
  """The program's train step, jitted with the state's shardings in and out
  and the state donated, compiled ahead of time for one global batch
  (with `compiler_options`: `trm.core.tpu_flags.for_mesh`)."""
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  shardings = batch_shardings(program.batch_spec, ctx)
  with ctx:
    return state_lib.compile_step(
        program.train_step, abstract_state, state_shardings,
        abstract_batch(program.batch_spec, global_batch_size, shardings),
        compiler_options)


@dataclasses.dataclass(frozen=True)
class Program:
  """What to compile for one family; built without reading any data."""
  model: Any
  init_fn: Callable[[], Any]  # () -> state whose leaves carry logical names
  train_step: Callable        # (state, batch) -> (state, metrics)
  eval_step: Callable         # (state, batch) -> (metrics, outputs dict)
  batch_spec: dict            # key -> BatchField
  # Model FLOPs of one train step (MFU in the logs, aot's estimate).
  flops_per_step: Optional[float] = None
  compute_dtype: str = "float32"  # the peak that MFU divides by
  # () -> the same Program with loops unrolled, for XLA's cost analysis,
  # which counts a loop body once (TRM's recursion); None = no loops.
  cost_twin: Optional[Callable[[], "Program"]] = None
  # Tokens in one example, for tokens/s (language models); None: examples.
  tokens_per_example: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Task:
  """A Program plus what feeds it."""
  program: Program
  # Random access: item k is this process's rows of global batch k.
  train_source: Any
  # Sequence of this process's rows of each evaluation batch.
  eval_source: Any
  # (ctx, shardings) -> state, for a run that starts from weights other
  # than init_fn's (e.g. a published checkpoint); None = init_fn.
  initial_state: Optional[Callable] = None
  # () -> a fresh per-evaluation hook with `update(batch, outputs)` (global
  # arrays) and `result(save_dir) -> dict` (collective: every process calls
  # it), for metrics beyond the step's averages (ARC voting, sample sheets).
  make_eval_hook: Optional[Callable[[], Any]] = None
  # The names of the metrics that hook's `result` reports (config.best_metric
  # is checked against them, and the eval step's, before anything
  # compiles); None = not known before it runs (checked at the first
  # evaluation).
  eval_hook_metrics: Optional[tuple] = None
  # The best evaluation loss of the run initial_state continues (nanoGPT's
  # best_val_loss), for saving on improvement; None = no earlier evaluation.
  initial_best_loss: Optional[float] = None
