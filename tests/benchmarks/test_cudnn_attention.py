"""config.model.attention='cudnn' (cuDNN flash attention, NVIDIA GPUs only):
the configs accept it, every way in refuses it on CPU devices in one line
naming the field, and the models' cudnn branch computes what the dot path
computes (checked on the CPU with JAX's XLA implementation of the same
`jax.nn.dot_product_attention` call)."""
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
    gpt.GPT(cfg).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))
  dcfg = dataclasses.replace(DREAM_TINY, attention="cudnn")
  params = _dream_params(DREAM_TINY)
  with pytest.raises(ValueError, match=ONE_LINE):
    dream.Dream(dcfg).apply({"params": params}, jnp.ones((1, 8), jnp.int32))


@functools.lru_cache(maxsize=None)
def _dream_params(cfg):
  return nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])


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
  params = nn.meta.unbox(gpt.GPT(GPT_TINY).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32))["params"])
  tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 50, jnp.int32)
  dot = gpt.GPT(GPT_TINY).apply({"params": params}, tokens)
  cudnn = gpt.GPT(dataclasses.replace(GPT_TINY, attention="cudnn")).apply(
      {"params": params}, tokens)
  assert cudnn_call_on_xla == ["cudnn"] * GPT_TINY.n_layer
  assert _rel(cudnn, dot) < 2e-2
  # Causal: the first 8 positions do not see the last 8.
  changed = tokens.at[:, 8:].set((tokens[:, 8:] + 1) % 50)
  again = gpt.GPT(dataclasses.replace(GPT_TINY, attention="cudnn")).apply(
      {"params": params}, changed)
  np.testing.assert_array_equal(np.asarray(again[:, :8]),
                                np.asarray(cudnn[:, :8]))


@pytest.mark.parametrize("padded", [False, True])
def test_dream_cudnn_branch_matches_dot(cudnn_call_on_xla, padded):
  params = _dream_params(DREAM_TINY)
  tokens = jax.random.randint(jax.random.key(2), (2, 16), 1, 63, jnp.int32)
  mask = None
  if padded:  # left padding of the first row, as the sampler pads
    mask = jnp.ones((2, 16), bool).at[0, :5].set(False)
  dot = dream.Dream(DREAM_TINY).apply({"params": params}, tokens, mask)
  cudnn = dream.Dream(dataclasses.replace(DREAM_TINY, attention="cudnn")).apply(
      {"params": params}, tokens, mask)
  assert cudnn_call_on_xla and set(cudnn_call_on_xla) == {"cudnn"}
  rows = slice(None) if not padded else (0, slice(5, None))
  assert _rel(cudnn[rows], dot[rows]) < 2e-2
  if padded:
    assert _rel(cudnn[1], dot[1]) < 2e-2
