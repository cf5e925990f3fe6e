"""The PyTorch step `benchmarks/speed/trm_speed.py` times against ours computes the
same thing: same losses, parameters, EMA, puzzle table and carry after two
train steps from the same weights (tiny configs, float32, no exploration)."""
import os
import sys

import jax
from flax import traverse_util
import numpy as np
import pytest
import repo

from trm.core import config_lib

ROOT = repo.ROOT
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "reference"))
import train_step_speed  # pylint: disable=g-import-not-at-top,wrong-import-position
import trm_speed  # pylint: disable=g-import-not-at-top,wrong-import-position


def _flat(tree):
  return {k: np.asarray(v)
          for k, v in traverse_util.flatten_dict(tree, sep="/").items()}


@pytest.mark.parametrize("variant, mesh, reduce_once", [
    # `slow`: the same step on a mesh that splits weights too (below) meets
    # torch, and the data-only mesh's step is the tiny trainer's
    # (tests/core/test_multihost.py: one process against two).
    pytest.param("cpu", None, True, marks=pytest.mark.slow),
    ("cpu,att", None, True),
    # Weights split too: the step maps over the data-parallel row groups.
    ("cpu", dict(data=2, fsdp=2, model=2), True),
    ("cpu", dict(data=2, fsdp=2, model=2), False)],   # GSPMD's reductions
    ids=["mlp", "att", "mlp-data-fsdp-model", "mlp-gspmd"])
def test_torch_step_matches_ours(variant, mesh, reduce_once):
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "trm_sudoku.py"), variant)
  with config.unlocked():
    config.reduce_gradients_once = reduce_once
    if mesh:
      config.mesh.update(mesh)
    config.model.update(hidden_size=32, num_heads=2, puzzle_emb_ndim=32,
                        halt_max_steps=3, halt_exploration_prob=0.0)
    # Full learning rates from step 1, so the updates are large enough to
    # show; sign-like AdamATan2 steps make a mismatch show as ~lr.
    config.optim.update(warmup_steps=1, lr=1e-3, puzzle_emb_lr=1e-2)
    config.global_batch_size = 8
  model, state, step_fn, _, make_batch = train_step_speed.build(config)
  theirs = trm_speed.make_torch(model, state, config)
  carry = theirs.initial_carry(8)
  for _ in range(2):
    batch = make_batch(device=False)
    state, metrics = step_fn(state, batch)
    carry, loss, torch_metrics = theirs.train_step(
        carry, trm_speed.to_torch(batch))
    np.testing.assert_allclose(float(metrics["loss"].total), float(loss),
                               rtol=2e-5)
    np.testing.assert_allclose(float(metrics["lm_loss"].total),
                               float(torch_metrics["lm_loss"]), rtol=2e-5)
  state = jax.device_get(state)
  ours, ema = _flat(state.params), _flat(state.ema_params)
  for name, value in theirs.params_numpy().items():
    # A gradient element near 0 can take the other sign in either float32
    # program; AdamATan2 then moves it by up to 2 lr the other way. Whole
    # tensors agree far more closely.
    np.testing.assert_allclose(ours[name], value, atol=1e-4, err_msg=name)
    assert np.abs(ours[name] - value).mean() < 1e-6, name
    torch_ema = theirs.ema[name].detach().numpy()
    torch_ema = torch_ema.T if name.endswith("kernel") else torch_ema
    np.testing.assert_allclose(ema[name], torch_ema, atol=1e-5, err_msg=name)
  np.testing.assert_allclose(state.puzzle_emb["weights"],
                             theirs.table.numpy(), atol=1e-6)
  np.testing.assert_allclose(state.carry.z_H, carry["z_H"].numpy(),
                             atol=1e-4)
  np.testing.assert_array_equal(state.carry.halted, carry["halted"].numpy())
