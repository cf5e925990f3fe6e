"""What the training loop trains, chosen by `config.model.name`.

The loop in `trm/core/train.py` is the same for every model family; a task module
supplies the parts that differ as one plain `Task` record: the data sources,
the model, the state initialiser and the step functions. A task module has a
single entry point, `build(config, workdir, mesh, rules) -> Task`, which
validates the family's config keys and reads its data before anything is
compiled.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


@dataclasses.dataclass(frozen=True)
class Task:
  model: Any
  # Random access: item k is this process's rows of global batch k.
  train_source: Any
  # Sequence of this process's rows of each evaluation batch.
  eval_source: Any
  batch_shardings: dict       # batch key -> NamedSharding
  abstract_batch: dict        # ShapeDtypeStructs of one global train batch
  init_fn: Callable[[], Any]  # () -> state whose leaves carry logical names
  train_step: Callable        # (state, batch) -> (state, metrics)
  eval_step: Callable         # (state, batch) -> (metrics, outputs dict)
  # (mesh, rules, shardings) -> state, for a run that starts from weights
  # other than init_fn's (e.g. a published checkpoint); None = init_fn.
  initial_state: Optional[Callable] = None
  # () -> a fresh per-evaluation hook with `update(batch, outputs)` (global
  # arrays) and `result(save_dir) -> dict` (collective: every process calls
  # it), for metrics beyond the step's averages (ARC voting, sample sheets).
  make_eval_hook: Optional[Callable[[], Any]] = None
  # Model FLOPs of one train step (for MFU in the logs); None = not logged.
  flops_per_step: Optional[float] = None
  # The best evaluation loss of the run initial_state continues (nanoGPT's
  # best_val_loss), for saving on improvement; None = no earlier evaluation.
  initial_best_loss: Optional[float] = None


def build(config, workdir: str, mesh, rules) -> Task:
  name = config.model.name
  if name == "trm":
    from trm.families.trm import task as puzzle  # pylint: disable=g-import-not-at-top
    return puzzle.build(config, workdir, mesh, rules)
  if name == "dream":
    from trm.core.task import diffusion_lm  # pylint: disable=g-import-not-at-top
    return diffusion_lm.build(config, workdir, mesh, rules)
  if name == "gpt":
    from trm.core.task import gpt  # pylint: disable=g-import-not-at-top
    return gpt.build(config, workdir, mesh, rules)
  raise ValueError(f"config.model.name={name!r} has no training task; "
                   "known: 'trm', 'dream', 'gpt'.")
