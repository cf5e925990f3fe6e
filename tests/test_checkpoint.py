"""Checkpoint bookkeeping (`trm.checkpoint`): the best step survives keep-N,
the run's best held-out loss travels in the checkpoint's own metadata (so a
resume after preemption knows it), and nothing non-finite is ever written.
8 CPU devices."""
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from trm import checkpoint as ckpt_lib
from trm import train

sys.path.insert(0, os.path.dirname(__file__))
from test_gpt_task import tiny_config  # pylint: disable=g-import-not-at-top


class _Iterator:
  """The part of a Grain iterator a save reads."""

  def get_state(self):
    return {"position": 0}


def _steps(directory):
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def test_keep_n_never_deletes_the_best_step(tmp_path):
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1,
                                  async_save=False)
  state = {"w": jnp.ones((4,))}
  ckpt_lib.save(manager, 10, state, _Iterator(), eval_loss=1.0,
                best_eval_loss=1.0)
  # A save on preemption: no evaluation of its own.
  ckpt_lib.save(manager, 15, state, _Iterator(), best_eval_loss=1.0)
  ckpt_lib.save(manager, 20, state, _Iterator(), eval_loss=2.0,
                best_eval_loss=1.0)
  assert _steps(tmp_path) == [10, 20]
  reopened = ckpt_lib.make_manager(str(tmp_path), max_to_keep=1)
  assert ckpt_lib.saved_best_loss(reopened, 20) == 1.0
  ckpt_lib.save(reopened, 30, state, _Iterator(), eval_loss=0.5,
                best_eval_loss=0.5)
  reopened.wait_until_finished()
  assert _steps(tmp_path) == [30]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nonfinite_state_is_never_written(tmp_path, bad):
  manager = ckpt_lib.make_manager(str(tmp_path), max_to_keep=3,
                                  async_save=False)
  good = {"w": jnp.ones((4,)), "count": jnp.int32(3)}
  ckpt_lib.save(manager, 1, good, _Iterator())
  poisoned = {"w": jnp.ones((4,)).at[2].set(bad), "count": jnp.int32(3)}
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"Not saving step 2 .* 1 leaves .*\['w'\].*"
                     r"complete steps: \[1\]"):
    ckpt_lib.save(manager, 2, poisoned, _Iterator())
  assert _steps(tmp_path) == [1]


def test_resume_after_preemption_keeps_the_best_checkpoint(
    tmp_path, monkeypatch):
  """nanoGPT's always_save_checkpoint=False with keep 1: the step saved on
  preemption must not make the resumed run forget its best loss (it used to
  read it from an eval file the preemption save does not write), or the
  next save would happen whatever the loss and delete the best step."""
  workdir = str(tmp_path / "run")
  config = tiny_config(tmp_path, learning_rate=0.0, min_lr=0.0,
                       max_iters=40, lr_decay_iters=40, eval_interval=10,
                       always_save_checkpoint=False,
                       **{"keep_checkpoints": 1})
  real_reached = train._Preemption.reached  # pylint: disable=protected-access
  monkeypatch.setattr(train._Preemption, "reached",  # pylint: disable=protected-access
                      lambda self, step: step == 15 or real_reached(self, step))
  with pytest.raises(train.Preempted, match="Preempted at step 15; saved"):
    train.train_and_evaluate(config, workdir)
  checkpoints = os.path.join(workdir, "checkpoints")
  assert _steps(checkpoints) == [10, 15]
  monkeypatch.setattr(train._Preemption, "reached", real_reached)  # pylint: disable=protected-access
  train.train_and_evaluate(config, workdir)
  # With a learning rate of 0 no later evaluation improves on step 10's: no
  # further save, and step 10 (the best) is still there.
  assert 10 in _steps(checkpoints)
  assert max(_steps(checkpoints)) == 15


def test_config_rejects_nonfinite_or_negative_rates(tmp_path):
  for key, value in (("learning_rate", float("inf")),
                     ("learning_rate", float("nan")),
                     ("min_lr", -1e-4), ("weight_decay", float("inf"))):
    config = tiny_config(tmp_path, **{key: value})
    with pytest.raises(ValueError, match=f"config.{key}=.* must be a finite"):
      train.check_config(config)
