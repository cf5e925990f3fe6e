"""Dream's program checks (trm.families.dream.program)."""
import dataclasses

import jax
import pytest

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.families.dream import model as dream
from trm.families.dream import program as dream_program


def _context(model: int):
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=1, fsdp=1,
                                                   model=model),
                            jax.devices()[:model])
  return mesh_lib.ShardingContext(mesh,
                                  config_lib.default_logical_axis_rules())


@pytest.mark.parametrize("overrides, model, message", [
    # The 7B: 7 divides its 28 query heads, not the MLP or vocabulary.
    ({}, 7, "config.mesh.model=7 does not divide config.model."
     "intermediate_size=18944: the gate/up/down projections would be "
     "replicated on every device of that split; choose a size (product) "
     "from 1, 2, 4 (these divide each of num_attention_heads=28, "
     "intermediate_size=18944, vocab_size=152064)."),
    (dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=64,
          intermediate_size=128, vocab_size=514, mask_token_id=500,
          pad_token_id=256), 4,
     "config.mesh.model=4 does not divide config.model.vocab_size=514: the "
     "embedding and LM head would be replicated on every device of that "
     "split; choose a size (product) from 1, 2 (these divide each of "
     "num_attention_heads=4, intermediate_size=128, vocab_size=514)."),
])
def test_a_model_axis_not_dividing_the_mlp_or_vocabulary_is_refused(
    overrides, model, message):
  """`tree_shardings` replicates what an axis does not divide: mesh.model=7
  on the 7B split its heads but kept the MLP and the vocabulary-wide
  weights (6.8 of its 7.6B parameters) whole on each of the 7 devices."""
  cfg = dataclasses.replace(dream.DreamConfig(), **overrides)
  with pytest.raises(mesh_lib.MeshConfigError) as error:
    dream_program.check_heads_fit(cfg, _context(model))
  assert str(error.value) == message
  # The sizes it names pass.
  dream_program.check_heads_fit(cfg, _context(2))


def test_an_fsdp_size_not_dividing_the_width_is_one_warning(caplog):
  """mesh.fsdp=-1 on 6 devices: 6 does not divide the 7B's 3,584 wide
  'embed' axis, so every weight matrix stayed whole on every device
  without a word. Warned (not refused: a replicated model still samples)."""
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=1, fsdp=-1, model=1),
                            jax.devices()[:6])
  ctx = mesh_lib.ShardingContext(mesh, config_lib.default_logical_axis_rules())
  dream_program._warn_once.cache_clear()  # pylint: disable=protected-access
  dream_program.check_heads_fit(dream.DreamConfig(), ctx)
  dream_program.check_heads_fit(dream.DreamConfig(), ctx)  # once only
  assert [r.getMessage() for r in caplog.records] == [
      "config.mesh.fsdp=6 does not divide config.model.hidden_size=3584: the "
      "weights split over it stay whole on each of its 6 devices, 28.37 GiB "
      "of weights per device (training keeps optimizer state beside each); a "
      "size that divides it (1, 2, 4) splits them."]
  caplog.clear()
  dream_program.check_heads_fit(dream.DreamConfig(), _context(4))
  assert not caplog.records
