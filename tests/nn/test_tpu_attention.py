"""The Pallas splash attention path, in interpret mode on CPU, against the
plain dot path: forward, gradients, padding, and sharded over a mesh."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.families.dream import model as dream
from trm.nn import tpu_attention

CFG = dream.DreamConfig(
    vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, mask_token_id=60,
    pad_token_id=0, dtype="float32", remat="none")
SPLASH = dataclasses.replace(CFG, attention="splash_interpret")


@pytest.fixture(scope="module")
def params():
  return nn.meta.unbox(jax.jit(dream.Dream(CFG).init)(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])


def _batch(length=128):
  tokens = jax.random.randint(jax.random.key(1), (2, length), 0, 60)
  mask = np.ones((2, length), bool)
  mask[0, :37] = False  # a left-padded row
  positions = np.where(mask, np.cumsum(mask, -1) - 1, 1)
  return tokens, jnp.asarray(mask), jnp.asarray(positions)


def _loss(cfg, params, tokens, mask, positions):
  logits = dream.Dream(cfg).apply({"params": params}, tokens, mask, positions)
  real = mask[..., None].astype(jnp.float32)
  return jnp.sum(jax.nn.log_softmax(logits) * real) / jnp.sum(real)


def _jitted(fn, cfg):
  # One compile per program: op by op, each op of the model compiled alone.
  return jax.jit(functools.partial(fn, cfg))


def _apply(cfg, params, tokens, mask, positions):
  return dream.Dream(cfg).apply({"params": params}, tokens, mask, positions)


def test_forward_and_gradients_match_the_dot_path(params):
  tokens, mask, positions = _batch()
  want, want_grad = _jitted(jax.value_and_grad(_loss, argnums=1), CFG)(
      params, tokens, mask, positions)
  got, got_grad = _jitted(jax.value_and_grad(_loss, argnums=1), SPLASH)(
      params, tokens, mask, positions)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6)
  # Real rows agree position by position, unpadded too.
  for m in (mask, None):
    full = _jitted(_apply, CFG)(params, tokens, m, positions)
    fast = _jitted(_apply, SPLASH)(params, tokens, m, positions)
    rows = np.asarray(mask) if m is not None else np.ones(mask.shape, bool)
    np.testing.assert_allclose(np.asarray(fast)[rows],
                               np.asarray(full)[rows], atol=2e-5)


def test_sharded_over_a_mesh(params):
  """Batch over data x fsdp, heads over model: shard_map per shard."""
  tokens, mask, positions = _batch()
  want = dream.Dream(CFG).apply({"params": params}, tokens, mask, positions)
  rules = config_lib.default_logical_axis_rules()
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=1, fsdp=2, model=2),
                            jax.devices()[:4])
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    got = jax.jit(lambda p, t, m, q: dream.Dream(SPLASH).apply(
        {"params": p}, t, m, q))(params, tokens, mask, positions)
  rows = np.asarray(mask)
  np.testing.assert_allclose(np.asarray(got)[rows], np.asarray(want)[rows],
                             atol=2e-5)


def test_clear_errors():
  with pytest.raises(ValueError, match="multiple of 128, got 100"):
    tpu_attention.check_length(100)
  with pytest.raises(ValueError, match="config.model.attention='flash'"):
    dataclasses.replace(CFG, attention="flash")
