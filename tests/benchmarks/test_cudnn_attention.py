"""config.model.attention='cudnn' (cuDNN flash attention, NVIDIA GPUs only):
the configs accept it, every way in refuses it on CPU devices in one line
naming the field, and the models' cudnn branch computes what the dot path
computes (checked on the CPU with JAX's XLA implementation of the same
`jax.nn.dot_product_attention` call). GPT, Dream and TRM's attention
variants."""
from __future__ import annotations

import dataclasses
import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import config_lib
from trm.core import run_checks
from trm.families.dream import model as dream
from trm.families.gpt import model as gpt
from trm.families.trm import layers as trm_layers
from trm.families.trm import model as trm_model
from trm.nn import attention

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
GPT_TINY = gpt.GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=4,
                         n_embd=32, dtype="bfloat16", bias=False)
DREAM_TINY = dream.DreamConfig(
    vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=2, mask_token_id=63,
    pad_token_id=0, dtype="bfloat16", param_dtype="float32", remat="none")
ONE_LINE = r"config\.model\.attention='cudnn' runs on NVIDIA GPUs only"


def test_configs_accept_cudnn():
  gpt_config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"))
  with gpt_config.unlocked():
    gpt_config.model.attention = "cudnn"
    gpt_config.model.vocab_size = 50304  # 0: the dataset's, read later
  assert gpt.GPTConfig.from_config(gpt_config.model).attention == "cudnn"
  dc_config = config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"))
  with dc_config.unlocked():
    dc_config.model.attention = "cudnn"
  assert dream.DreamConfig.from_config(dc_config.model).attention == "cudnn"


@pytest.mark.parametrize("make, needle", [
    (lambda: dataclasses.replace(GPT_TINY, attention="cudnn",
                                 dtype="float32"), "config.model.dtype='float32'"),
    (lambda: dataclasses.replace(GPT_TINY, attention="cudnn", n_embd=40,
                                 n_head=4), "head dim that is a multiple of 8"),
    (lambda: dataclasses.replace(GPT_TINY, attention="cudnn", dropout=0.1),
     "has no attention dropout"),
    (lambda: dataclasses.replace(DREAM_TINY, attention="cudnn",
                                 dtype="float32"), "config.model.dtype='float32'"),
    (lambda: dataclasses.replace(GPT_TINY, attention="cuDNN"),
     "'dot', 'splash', 'splash_interpret' or 'cudnn'"),
])
def test_configs_refuse_what_cudnn_cannot_run(make, needle):
  with pytest.raises(ValueError) as err:
    make()
  assert needle in str(err.value)
  assert "\n" not in str(err.value)


def test_run_checks_refuses_cudnn_on_cpu_devices():
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char_cpu")
  run_checks.check_config(config)  # 'dot' passes
  with config.unlocked():
    config.model.attention = "cudnn"
  with pytest.raises(ValueError, match=ONE_LINE + r" \(cuDNN flash "
                     r"attention\), and this run's devices are cpu: use "
                     r"'dot'\.$"):
    run_checks.check_config(config)


def test_check_cudnn_passes_on_gpu_platforms():
  attention.check_cudnn("gpu")
  attention.check_cudnn("cuda")
  with pytest.raises(ValueError, match="devices are tpu"):
    attention.check_cudnn("tpu")


def test_models_refuse_cudnn_on_cpu_when_traced():
  cfg = dataclasses.replace(GPT_TINY, attention="cudnn")
  with pytest.raises(ValueError, match=ONE_LINE):
    jax.eval_shape(lambda: gpt.GPT(cfg).init(jax.random.key(0),
                                             jnp.zeros((1, 8), jnp.int32)))
  dcfg = dataclasses.replace(DREAM_TINY, attention="cudnn")
  # Refused while tracing: shapes stand in for the weights (nothing to
  # initialise or compile).
  params = jax.eval_shape(_dream_init(DREAM_TINY))
  with pytest.raises(ValueError, match=ONE_LINE):
    jax.eval_shape(lambda p: dream.Dream(dcfg).apply(
        {"params": p}, jnp.ones((1, 8), jnp.int32)), params)


def _dream_init(cfg):
  return lambda: nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])


@functools.lru_cache(maxsize=None)
def _dream_params(cfg):
  # Jitted: one compile instead of an op-by-op init.
  return jax.jit(_dream_init(cfg))()


def _apply(model, *args):
  """model.apply jitted: one compile, not one per operation; the attention
  call the fixture records is made while tracing, as it is eagerly."""
  return jax.jit(model.apply)(*args)


@pytest.fixture
def cudnn_call_on_xla(monkeypatch):
  """The models' cudnn branch with the platform check passed and the same
  `jax.nn.dot_product_attention` call run by JAX's XLA implementation."""
  real = jax.nn.dot_product_attention
  calls = []

  def xla(*args, implementation=None, **kwargs):
    calls.append(implementation)
    return real(*args, implementation="xla", **kwargs)

  monkeypatch.setattr(attention, "check_cudnn", lambda *a, **k: None)
  monkeypatch.setattr(jax.nn, "dot_product_attention", xla)
  return calls


def _rel(a, b):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_gpt_cudnn_branch_matches_dot(cudnn_call_on_xla):
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(GPT_TINY).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"]))()
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 50, jnp.int32)
  dot = _apply(gpt.GPT(GPT_TINY), {"params": params}, tokens)
  cudnn_model = gpt.GPT(dataclasses.replace(GPT_TINY, attention="cudnn"))
  cudnn = _apply(cudnn_model, {"params": params}, tokens)
  assert cudnn_call_on_xla == ["cudnn"] * GPT_TINY.n_layer
  assert _rel(cudnn, dot) < 2e-2
  # Causal: the first 8 positions do not see the last 8.
  changed = tokens.at[:, 8:].set((tokens[:, 8:] + 1) % 50)
  again = _apply(cudnn_model, {"params": params}, changed)
  np.testing.assert_array_equal(np.asarray(again[:, :8]),
                                np.asarray(cudnn[:, :8]))


@pytest.mark.parametrize("padded", [False, True])
def test_dream_cudnn_branch_matches_dot(cudnn_call_on_xla, padded):
  params = _dream_params(DREAM_TINY)
  tokens = jax.random.randint(jax.random.key(2), (2, 16), 1, 63, jnp.int32)
  mask = None
  if padded:  # left padding of the first row, as the sampler pads
    mask = jnp.ones((2, 16), bool).at[0, :5].set(False)
  dot = _apply(dream.Dream(DREAM_TINY), {"params": params}, tokens, mask)
  cudnn = _apply(dream.Dream(dataclasses.replace(DREAM_TINY,
                                                 attention="cudnn")),
                 {"params": params}, tokens, mask)
  assert cudnn_call_on_xla and set(cudnn_call_on_xla) == {"cudnn"}
  rows = slice(None) if not padded else (0, slice(5, None))
  assert _rel(cudnn[rows], dot[rows]) < 2e-2
  if padded:
    assert _rel(cudnn[1], dot[1]) < 2e-2


# TRM (attention variants): non-causal, no mask, RoPE'd q/k, head dim 64 in
# the paper configs (here 8).
def _trm_cfg(**kw):
  base = dict(vocab_size=7, seq_len=10, num_puzzle_identifiers=1,
              hidden_size=32, num_heads=4, L_layers=1, H_cycles=1,
              L_cycles=1, halt_max_steps=2, puzzle_emb_ndim=0,
              pos_encodings="rope", mlp_t=False, forward_dtype="bfloat16")
  base.update(kw)
  return trm_model.TRMConfig(**base)


def test_trm_config_takes_cudnn_and_refuses_what_it_cannot_run():
  assert _trm_cfg(attention="cudnn").attention == "cudnn"
  with pytest.raises(ValueError,
                     match=r"config\.model\.forward_dtype='float32'"):
    _trm_cfg(attention="cudnn", forward_dtype="float32")
  with pytest.raises(ValueError, match="head dim that is a multiple of 8"):
    _trm_cfg(attention="cudnn", hidden_size=40, num_heads=4)
  with pytest.raises(ValueError, match="use one of dot, splash, "
                     "splash_interpret, cudnn"):
    _trm_cfg(attention="flash")
  # The token-mixing MLP variant has no attention to run.
  _trm_cfg(attention="cudnn", mlp_t=True, forward_dtype="float32")
  maze = config_lib.load_config(os.path.join(ROOT, "configs", "trm_maze.py"),
                                "cpu")
  with maze.unlocked():
    maze.model.attention = "cudnn"
  with pytest.raises(ValueError, match=ONE_LINE):
    run_checks.check_config(maze)


def test_trm_refuses_cudnn_on_cpu_when_traced():
  cfg = _trm_cfg(attention="cudnn")
  with pytest.raises(ValueError, match=ONE_LINE):  # traced, not compiled
    jax.eval_shape(lambda: trm_model.init_variables(trm_model.TRM(cfg),
                                                    jax.random.key(0)))


def test_trm_cudnn_branch_matches_dot(cudnn_call_on_xla):
  x = jax.random.normal(jax.random.key(3), (2, 10, 32), jnp.bfloat16)
  rope = trm_layers.rope_tables(10, 8, 10000.0)
  dot = trm_layers.Attention(32, 4, 4, jnp.bfloat16, "dot")
  params = jax.jit(dot.init)(jax.random.key(0), x, rope)
  want = _apply(dot, params, x, rope)
  cudnn_call_on_xla.clear()  # the dot path's own calls (implementation None)
  got = _apply(trm_layers.Attention(32, 4, 4, jnp.bfloat16, "cudnn"),
               params, x, rope)
  assert cudnn_call_on_xla == ["cudnn"]
  assert _rel(got, want) < 2e-2
