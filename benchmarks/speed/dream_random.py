"""The random Dream of the speed benchmarks (vocab 16384, hidden 256, 4
layers, 8 query / 2 key-value heads, intermediate 1024, float32), shared by
the scripts beside this file (imported after they set XLA's flags)."""
from __future__ import annotations


def random_dream(head_scale: float):
  """(DreamConfig, params): the init's weights, the LM head multiplied by
  `head_scale` (peaked predictions, as a trained model's)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top

  cfg = dream.DreamConfig(
      vocab_size=16384, hidden_size=256, intermediate_size=1024,
      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
      mask_token_id=16383, pad_token_id=0, dtype="float32",
      param_dtype="float32", remat="none")
  params = nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * head_scale
  return cfg, params
