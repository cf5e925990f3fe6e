"""A checkpoint of other shapes is named in the config's own fields."""
import os

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from trm.core import restore_check
from trm.families.gpt import model as gpt


def _gpt_params(n_embd):
  cfg = gpt.GPTConfig(n_layer=1, n_head=2, n_embd=n_embd, block_size=8,
                      vocab_size=11)
  return nn.meta.unbox(gpt.abstract_params(cfg))


def test_gpt_shape_mismatch_names_nanogpts_fields(tmp_path):
  """A GPT workdir resumed with another n_embd (allow_config_change lets
  the restore try) named TRM's fields (hidden_size, num_heads, expansion,
  puzzle_emb_ndim), which configs/gpt.py does not have."""
  saved = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), _gpt_params(32))
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(os.path.join(tmp_path, "3", "state"), {"params": saved})
  checkpointer.wait_until_finished()
  with pytest.raises(restore_check.CheckpointMismatchError) as error:
    restore_check.check(str(tmp_path), {"params": _gpt_params(64)})
  message = str(error.value)
  assert "has shape" in message and "config.n_embd" in message
  assert "hidden_size" not in message and "puzzle" not in message
