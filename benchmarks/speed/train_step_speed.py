r"""Train-step speed and first-step compile time for a TRM config.

  python benchmarks/speed/train_step_speed.py --config=configs/trm_sudoku.py:cpu
  python benchmarks/speed/train_step_speed.py --config=configs/trm_sudoku.py \
      --config.global_batch_size=16 --steps=3

Uses the trainer's own mesh, state, sharding and step code on random
Sudoku-shaped batches (vocab 11, 81 cells, 1 puzzle id), so it needs no
dataset. Prints the device, compile seconds, steps/s and examples/s.
"""
import time

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.core import pipeline
from trm.core import task as task_lib
from trm.data.puzzles import sudoku
from trm.families.trm import program as trm_program

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.",
                                          lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps (after 2 warm-up).")

SUDOKU = sudoku.dataset_metadata(1)


def build(config):
  """(model, initial state, compiled train step, compile seconds, batch
  maker) from the trainer's own mesh, state, sharding and step code."""
  ctx = mesh_lib.ShardingContext.from_config(config)
  batch_size = config.global_batch_size
  ctx.check_batch_size(batch_size)
  program = trm_program.build(config, ctx, SUDOKU)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  batch_shardings = task_lib.batch_shardings(program.batch_spec, ctx)

  rng = np.random.default_rng(0)
  def batch(device=True):
    labels = rng.integers(2, 11, (batch_size, 81)).astype(np.int32)
    inputs = np.where(rng.random((batch_size, 81)) < 0.5, 1, labels)
    host = {"inputs": inputs.astype(np.int32), "labels": labels,
            "puzzle_identifiers": np.zeros((batch_size,), np.int32)}
    return pipeline.to_global(host, batch_shardings) if device else host

  start = time.time()
  step_fn = task_lib.compile_train_step(program, ctx, batch_size, abstract,
                                        shardings)
  compile_seconds = time.time() - start
  return program.model, state, step_fn, compile_seconds, batch


def main(_):
  config = _CONFIG.value
  batch_size = config.global_batch_size
  mesh = mesh_lib.make_mesh(config.mesh)
  _, state, step_fn, compile_seconds, batch = build(config)
  for _ in range(2):
    state, metrics = step_fn(state, batch())
  jax.block_until_ready(metrics)
  batches = [batch() for _ in range(_STEPS.value)]
  start = time.time()
  for b in batches:
    state, metrics = step_fn(state, b)
  jax.block_until_ready((state, metrics))
  seconds = time.time() - start
  device = jax.devices()[0]
  print(f"device: {jax.device_count()} x {device.device_kind} "
        f"({device.platform})")
  print(f"model: hidden {config.model.hidden_size}, mlp_t "
        f"{config.model.mlp_t}, H_cycles {config.model.H_cycles}, L_cycles "
        f"{config.model.L_cycles}; global batch {batch_size}; mesh "
        f"{dict(mesh.shape)}")
  print(f"compile_seconds: {compile_seconds:.1f}")
  print(f"steps_per_second: {_STEPS.value / seconds:.3f}")
  print(f"examples_per_second: {_STEPS.value * batch_size / seconds:.1f}")


if __name__ == "__main__":
  app.run(main)
