"""MFU arithmetic, published peak lookup and the measured CPU peak."""
from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from trm.core import mfu
from trm.families.gpt import model as gpt

# nanoGPT GPT-2 124M (GPTConfig defaults): vocab 50304, block 1024, 12 layers,
# 12 heads, 768 wide, bias=True. Non-embedding parameters by hand:
#   wte 50304*768 = 38,633,472 (tied with lm_head, so counted; wpe excluded)
#   per block: ln_1 1,536 + c_attn 768*2304+2304 = 1,771,776
#     + attn c_proj 768*768+768 = 590,592 + ln_2 1,536
#     + c_fc 768*3072+3072 = 2,362,368 + mlp c_proj 3072*768+768 = 2,360,064
#     = 7,087,872; * 12 = 85,054,464
#   ln_f 1,536
#   total 123,689,472 (nanoGPT prints "number of parameters: 123.69M").
GPT2_N = 123_689_472


def test_num_params_gpt2_124m():
  cfg = gpt.GPTConfig(vocab_size=50304, n_layer=12, n_head=12, n_embd=768,
                      bias=True)
  assert gpt.num_params(gpt.abstract_params(cfg)) == GPT2_N


def test_num_params_shakespeare_char():
  # config/train_shakespeare_char.py with 65 characters and bias=False:
  # 65*384 + 6*(2*384 + 384*1152 + 384*384 + 384*1536 + 1536*384) + 384.
  cfg = gpt.GPTConfig(vocab_size=65, n_layer=6, n_head=6, n_embd=384,
                      block_size=256, bias=False)
  assert gpt.num_params(gpt.abstract_params(cfg)) == 10_646_784


def test_flops_gpt2_124m():
  # flops/token = 6*123,689,472 + 12*12*12*64*1024
  #             = 742,136,832 + 113,246,208 = 855,383,040
  # per sequence *1024 = 875,912,232,960; train.py iteration = 12*40 sequences.
  flops = mfu.nanogpt_flops_per_iter(GPT2_N, 12, 12, 768, 1024, 12 * 40)
  assert flops == 875_912_232_960 * 480
  assert flops == 420_437_871_820_800


def test_flops_cpu_recipe():
  # README CPU recipe, 65 characters, bias=False: per block 2*128 (two
  # LayerNorm weights) + 12*128^2 (c_attn 3, attn c_proj 1, c_fc 4, mlp
  # c_proj 4); attention term 12 * L4 * H4 * Q32 * T64 = 393,216 per token.
  n = gpt.num_params(gpt.abstract_params(gpt.GPTConfig(
      vocab_size=65, n_layer=4, n_head=4, n_embd=128, block_size=64,
      bias=False)))
  assert n == 65 * 128 + 4 * (2 * 128 + 12 * 128 * 128) + 128
  flops = mfu.nanogpt_flops_per_iter(n, 4, 4, 128, 64, 12)
  assert flops == (6 * n + 393_216) * 64 * 12


def test_mfu_arithmetic():
  # 4.2e14 FLOPs in 2 s on 8 devices of 312e12: 2.1e14 / 2.496e15.
  assert math.isclose(mfu.mfu(4.2e14, 2.0, 8, 312e12), 2.1e14 / 2.496e15)
  assert mfu.mfu(1e12, 1.0, 1, 1e12) == 1.0
  with pytest.raises(ValueError):
    mfu.mfu(1.0, 0.0, 1, 1.0)


@pytest.mark.parametrize("kind,dtype,expected", [
    ("NVIDIA A100-SXM4-40GB", "bfloat16", 312e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
    ("NVIDIA A100 80GB PCIe", "float16", 312e12),
    ("NVIDIA A100-SXM4-40GB", "float32", 19.5e12),
    ("NVIDIA A100-SXM4-40GB", "tf32", 156e12),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12),
    ("NVIDIA H100 80GB HBM3", "float32", 67e12),
    ("NVIDIA H200", "bfloat16", 989e12),
    ("NVIDIA H100 PCIe", "bfloat16", 756e12),
    ("TPU v4", "bfloat16", 275e12),
    ("TPU v5 lite", "bfloat16", 197e12),
    ("TPU v5e", "bfloat16", 197e12),
    ("TPU v5", "bfloat16", 459e12),
    ("TPU v5p", "bfloat16", 459e12),
    ("TPU v6 lite", "bfloat16", 918e12),
    ("TPU v6 lite", "float32", 918e12),
])
def test_published_known(kind, dtype, expected):
  assert mfu.published_peak_flops(kind, dtype) == expected


@pytest.mark.parametrize("kind", [
    "cpu", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "TPU v4 lite",
    "TPU v3", "", "something new"])
def test_published_unknown(kind):
  assert mfu.published_peak_flops(kind, "bfloat16") is None


def test_published_dtype_objects_and_bad_dtype():
  assert mfu.published_peak_flops("NVIDIA H100 80GB HBM3",
                                  np.float32) == 67e12
  assert mfu.published_peak_flops("TPU v4", jax.numpy.bfloat16) == 275e12
  # TPUs publish no tf32 figure.
  assert mfu.published_peak_flops("TPU v4", "tf32") is None
  with pytest.raises(ValueError):
    mfu.published_peak_flops("TPU v4", "int8")


def test_measured_cpu_peak_positive_and_cached():
  value = mfu.measured_cpu_peak_flops(size=128, repeats=2)
  assert math.isfinite(value) and value > 0
  # Cached per (dtype, size): the second call returns the same number.
  assert mfu.measured_cpu_peak_flops(size=128, repeats=2) == value


def test_peak_flops_cpu_is_measured():
  device = jax.devices("cpu")[0]
  value, description = mfu.peak_flops(device, "float32")
  assert value == mfu.measured_cpu_peak_flops("float32")
  assert "measured CPU matmul peak" in description


class _Device:
  platform, device_kind = "gpu", "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("precision,expected", [
    (None, 494.5e12), ("tensorfloat32", 494.5e12), ("bfloat16", 494.5e12),
    ("highest", 67e12), ("float32", 67e12), ("F32_F32_F32", 67e12)])
def test_float32_on_an_nvidia_gpu_runs_against_the_tf32_peak(precision,
                                                             expected):
  """XLA:GPU multiplies float32 operands on TF32 tensor cores unless the
  precision is highest (as trm.forecast.ops charges them): dividing by the
  CUDA-core float32 peak made a float32 run's MFU read 7.4x high."""
  with jax.default_matmul_precision(precision):
    value, description = mfu.peak_flops(_Device(), "float32")
  assert value == expected, description
  assert mfu.peak_flops(_Device(), "bfloat16")[0] == 989e12
