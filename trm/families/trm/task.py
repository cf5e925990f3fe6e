"""TRM on puzzle datasets (Sudoku): upstream's data, ACT step and evaluation."""
from __future__ import annotations

import functools
import importlib
import os

import jax

from trm.core import state as state_lib
from trm.families.trm import steps
from trm.core import pipeline
from trm.data.puzzles import dataset as puzzle_dataset
from trm.data.puzzles import format as puzzle_format
from trm.models import get_model
from trm.core.task import Task

# Dataset builders (modules of trm/data/) a config can name.
BUILDERS = ("sudoku", "maze", "arc")


def _data_dir(config, workdir: str) -> str:
  data_dir = config.data.data_dir or os.path.join(workdir, "data")
  if "://" in data_dir:
    raise ValueError(
        f"Dataset directory {data_dir!r} is remote, but datasets are memory-"
        "mapped from local disk: set --config.data.data_dir to a local path "
        "(each worker builds or copies its own).")
  return data_dir


def prepare_data(config, workdir: str) -> str:
  """Builds the dataset named by the config when its directory has none.

  `config.data.name` names a builder module in `trm/data/` whose
  `ensure_from_config(data_dir, build_config)` builds the dataset from
  `config.data.build` unless the directory already holds one.
  """
  data_dir = _data_dir(config, workdir)
  if config.data.name not in BUILDERS:
    raise ValueError(f"config.data.name={config.data.name!r} has no builder; "
                     f"known: {sorted(BUILDERS)}.")
  builder = importlib.import_module(f"trm.data.puzzles.{config.data.name}")
  builder.ensure_from_config(data_dir, config.data.build)
  return data_dir


def _eval_step(state, batch, *, model, use_ema: bool):
  metrics, predictions, q_halt_logits = steps.eval_step(
      state, batch, model=model, use_ema=use_ema)
  return metrics, {"predictions": predictions, "q_halt_logits": q_halt_logits}


class EvalHook:
  """Per evaluation: ARC voting and pass@K (ARC datasets; `submission.json`
  beside the sheet) and a PNG sheet of the first rows (input, prediction,
  target)."""

  def __init__(self, data_dir: str, kind: str, arc: bool, sheet_rows: int):
    from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
    self.kind, self.sheet_rows = kind, sheet_rows
    self.evaluator = arc_eval.ARCEvaluator(data_dir) if arc else None
    self.rows = arc_eval.addressable_rows
    self.sheet = None

  def update(self, batch, outputs) -> None:
    if self.evaluator is None and not self.sheet_rows:
      return
    inputs = self.rows(batch["inputs"])
    predictions = self.rows(outputs["predictions"])
    if self.evaluator is not None:
      self.evaluator.update(self.rows(batch["puzzle_identifiers"]), inputs,
                            predictions, self.rows(outputs["q_halt_logits"]))
    if self.sheet is None and self.sheet_rows and jax.process_index() == 0:
      n = self.sheet_rows
      self.sheet = (inputs[:n], predictions[:n], self.rows(batch["labels"])[:n])

  def result(self, save_dir) -> dict:
    results = {}
    if self.evaluator is not None:
      results = self.evaluator.result(save_dir)
    if self.sheet is not None and save_dir:
      from trm import visualize  # pylint: disable=g-import-not-at-top
      visualize.sample_sheet(self.kind, *self.sheet,
                             os.path.join(save_dir, "sheet.png"),
                             max_rows=self.sheet_rows)
    return results


def visualize_kind(metadata):
  """'sudoku', 'maze' or 'arc'; None for datasets with no picture."""
  from trm import visualize  # pylint: disable=g-import-not-at-top
  try:
    return visualize.kind_from_metadata(metadata)
  except ValueError:
    return None


def build(config, workdir: str, mesh, rules) -> Task:
  if config.data.epochs_per_iter <= 0:
    raise ValueError(f"config.data.epochs_per_iter={config.data.epochs_per_iter}"
                     " must be a positive integer.")
  data_dir = prepare_data(config, workdir)
  train_meta, train_arrays = puzzle_format.read_split(data_dir, "train")
  test_meta, test_arrays = puzzle_format.read_split(data_dir, "test")
  if (test_meta.seq_len, test_meta.vocab_size) != (train_meta.seq_len,
                                                   train_meta.vocab_size):
    raise ValueError(f"{data_dir}: train and test splits disagree on seq_len "
                     "or vocab_size; rebuild the dataset.")
  process = dict(process_index=jax.process_index(),
                 process_count=jax.process_count())
  train_source = puzzle_dataset.TrainBatches(
      train_meta, train_arrays, global_batch_size=config.global_batch_size,
      seed=config.seed, epochs_per_iter=config.data.epochs_per_iter,
      num_batches=config.total_steps, **process)
  test_source = puzzle_dataset.TestBatches(
      test_meta, test_arrays, global_batch_size=config.data.eval_batch_size,
      max_batches=config.data.max_eval_batches, **process)
  batch_shardings = pipeline.batch_shardings(mesh, rules)

  model = get_model(config.model, train_meta)
  tx = steps.make_optimizer(config.optim, config.total_steps)
  kind = visualize_kind(train_meta)
  return Task(
      model=model, train_source=train_source, eval_source=test_source,
      batch_shardings=batch_shardings,
      abstract_batch=pipeline.abstract_batch(
          config.global_batch_size, train_meta.seq_len, batch_shardings),
      init_fn=state_lib.make_init_fn(model, tx, config.global_batch_size,
                                     config.seed),
      train_step=functools.partial(
          steps.train_step, model=model, tx=tx, optim_config=config.optim,
          total_steps=config.total_steps,
          global_batch_size=config.global_batch_size),
      eval_step=functools.partial(_eval_step, model=model,
                                  use_ema=config.optim.ema),
      make_eval_hook=functools.partial(
          EvalHook, data_dir, kind, arc=config.data.name == "arc",
          sheet_rows=config.data.eval_sheet_rows if kind else 0))
