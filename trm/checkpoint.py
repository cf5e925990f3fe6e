"""Orbax checkpoints of the train state with the Grain iterator beside it.

Each checkpoint step holds two items: `state` (the whole TrainState: params,
optimizer, EMA, puzzle table, ACT carry) and `data_iter` (the Grain iterator
state), so a resumed run continues on exactly the data it would have seen.
Every process's iterator walks the same sequence of *global* batches (each
takes its rows), so their states are identical: one JSON file, written by the
primary process, restores onto any number of processes.
Orbax writes a step into a temporary directory and renames it when complete,
so a crash mid-save leaves the previous checkpoints as they were. Restores go
onto the shardings of the *current* mesh, whatever mesh wrote them.
"""
from __future__ import annotations

import os

import orbax.checkpoint as ocp
from absl import logging


def make_manager(directory: str, *, max_to_keep: int,
                 async_save: bool = True) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      directory,
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep, create=True,
          enable_async_checkpointing=async_save),
      item_names=("state", "data_iter"))


def save(manager: ocp.CheckpointManager, step: int, state, data_iter) -> None:
  """Starts an (async) save of `state` and the iterator position at `step`."""
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data_iter=ocp.args.JsonSave(data_iter.get_state())), force=True)


def restore_latest(manager: ocp.CheckpointManager, abstract_state, data_iter):
  """Restores the newest checkpoint onto `abstract_state`'s shardings.

  `data_iter` is moved to the saved position in place. Returns the state, or
  None when the directory holds no checkpoint.
  """
  step = manager.latest_step()
  if step is None:
    return None
  logging.info("Restoring checkpoint step %d from %s", step, manager.directory)
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state),
      data_iter=ocp.args.JsonRestore()))
  data_iter.set_state(restored["data_iter"])
  return restored["state"]



def restore_fields(directory: str, abstract_fields: dict,
                   step: int | None = None):
  """(fields, step): only the named fields of a saved train state (e.g.
  {'params': ...}; the optimizer state and ACT carry are never read), onto
  the shardings of the given abstract arrays. For sampling, evaluation and
  export, whose batch and optimizer may differ from the run's."""
  if "://" not in directory:  # Orbax reads local paths only when absolute
    directory = os.path.abspath(directory)
  manager = ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=False,
                                                      read_only=True),
      item_names=("state", "data_iter"))
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"{directory} holds no checkpoint; point at a "
                            "trm.main workdir.")
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(
          item=abstract_fields,
          restore_args=ocp.checkpoint_utils.construct_restore_args(
              abstract_fields),
          partial_restore=True)))
  return dict(restored["state"]), step
