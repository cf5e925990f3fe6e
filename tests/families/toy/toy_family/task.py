"""What to feed: synthetic rows whose class is the argmax of 4 features."""
from __future__ import annotations

import jax
import numpy as np

from trm.core.task import Task
from toy_family import program as toy_program


class Batches:
  """Item k: this process's rows of global batch k (deterministic)."""

  def __init__(self, global_batch_size: int, num_batches: int, seed: int):
    self.rows = global_batch_size // jax.process_count()
    self.num_batches, self.seed = num_batches, seed

  def __len__(self):
    return self.num_batches

  def __getitem__(self, k):
    rng = np.random.default_rng((self.seed, k, jax.process_index()))
    x = rng.normal(size=(self.rows, toy_program.FEATURES)).astype(np.float32)
    return {"x": x, "y": x[:, :toy_program.CLASSES].argmax(-1).astype(
        np.int32)}


def build(config, workdir: str, ctx) -> Task:
  del workdir
  return Task(
      program=toy_program.build(config, ctx),
      train_source=Batches(config.global_batch_size, config.total_steps,
                           config.seed),
      eval_source=Batches(config.data.eval_batch_size, 2, config.seed + 1))
