"""nanoGPT model: layout, init, counts, causality, dropout, KV cache, generate,
sharding."""
from __future__ import annotations

import dataclasses
import functools
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import mfu
from trm.families.gpt import gpt_export
from trm.families.gpt import layers as gpt_layers
from trm.families.gpt import model as gpt

RULES = config_lib.default_logical_axis_rules()
TINY = gpt.GPTConfig(block_size=16, vocab_size=50, n_layer=2, n_head=4,
                     n_embd=32)


def _tokens(batch=2, length=12, seed=0, vocab=50):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab,
                            jnp.int32)


@functools.lru_cache(maxsize=None)
def _params(cfg=TINY, seed=0, std=None):
  """Init params (jitted); `std` adds N(0, std) noise to every leaf so that
  greedy decoding does not collapse onto one token as at nanoGPT's init."""
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(seed), jnp.zeros((1, 1), jnp.int32)))["params"])()
  if std is None:
    return params
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  return treedef.unflatten([x + std * jax.random.normal(k, x.shape, x.dtype)
                            for k, x in zip(keys, leaves)])


@functools.partial(jax.jit, static_argnames=("cfg",))
def _forward(cfg, params, idx):
  return gpt.GPT(cfg).apply({"params": params}, idx)


def _shapes(tree):
  return jax.tree.map(lambda x: tuple(x.shape), nn.meta.unbox(tree))


@pytest.mark.parametrize("bias", [True, False])
def test_param_names_and_shapes(bias):
  cfg = dataclasses.replace(TINY, bias=bias)
  shapes = _shapes(gpt.abstract_params(cfg))
  c, v = 32, 50

  def lin(n_in, n_out):
    return ({"kernel": (n_in, n_out), "bias": (n_out,)} if bias
            else {"kernel": (n_in, n_out)})

  ln = {"scale": (c,), "bias": (c,)} if bias else {"scale": (c,)}
  block = {"ln_1": ln, "attn": {"c_attn": lin(c, 3 * c), "c_proj": lin(c, c)},
           "ln_2": ln, "mlp": {"c_fc": lin(c, 4 * c), "c_proj": lin(4 * c, c)}}
  assert shapes == {"wte": {"embedding": (v, c)},
                    "wpe": {"embedding": (16, c)},
                    "h_0": block, "h_1": block, "ln_f": ln}
  # Every parameter has a logical name per dimension; 2-D ones are matrices.
  boxed = gpt.abstract_params(cfg)
  specs = nn.get_partition_spec(boxed)
  assert specs["wte"]["embedding"] == P("vocab", "embed")
  assert specs["wpe"]["embedding"] == P(None, "embed")
  assert specs["h_0"]["mlp"]["c_fc"]["kernel"] == P("embed", "mlp")
  assert specs["h_0"]["mlp"]["c_proj"]["kernel"] == P("mlp", "embed")
  for leaf in jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(
      x, nn.LogicallyPartitioned)):
    assert isinstance(leaf, nn.LogicallyPartitioned)
    assert len(leaf.names) == leaf.value.ndim


def test_head_size_sets_the_attention_width_apart_from_n_embd():
  # MaxText's head_dim: 4 heads of 16 in a 32-wide model (attention 64 wide).
  wide = dataclasses.replace(TINY, head_size=16)
  assert (wide.head_dim, wide.attention_width) == (16, 64)
  attn = _shapes(gpt.abstract_params(wide))["h_0"]["attn"]
  assert attn == {"c_attn": {"kernel": (32, 192), "bias": (192,)},
                  "c_proj": {"kernel": (64, 32), "bias": (32,)}}
  # head_size = n_embd // n_head is the default model, weights and values.
  same = dataclasses.replace(TINY, head_size=8)
  idx = _tokens(length=12)
  np.testing.assert_array_equal(_forward(same, _params(same), idx),
                                _forward(TINY, _params(TINY), idx))
  # The block's attention by hand: q k^T / sqrt(16) over 4 heads of 16.
  layer = gpt_layers.CausalSelfAttention(wide)
  x = jax.random.normal(jax.random.key(3), (2, 12, 32))
  p = jax.jit(lambda x: nn.meta.unbox(layer.init(jax.random.key(4), x)[
      "params"]))(x)  # jitted: one compile, not one per op
  w_attn, b_attn = p["c_attn"]["kernel"], p["c_attn"]["bias"]
  w_proj, b_proj = p["c_proj"]["kernel"], p["c_proj"]["bias"]
  q, k, v = np.split(np.asarray(x @ w_attn + b_attn), 3, axis=-1)
  q, k, v = (a.reshape(2, 12, 4, 16) for a in (q, k, v))
  scores = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(16)
  scores = np.where(np.tril(np.ones((12, 12), bool)), scores, -np.inf)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  y = np.einsum("bhts,bshd->bthd", probs, v).reshape(2, 12, 64)
  np.testing.assert_allclose(jax.jit(layer.apply)({"params": p}, x),
                             y @ w_proj + b_proj, atol=2e-5)
  # The KV cache holds heads of head_size; nanoGPT's FLOP count uses it.
  assert gpt.init_cache(wide, 2, 8)["k"].shape == (2, 2, 8, 4, 16)
  assert mfu.nanogpt_flops_per_iter(10, 2, 4, 32, 16, 1, head_size=16) == (
      6 * 10 + 12 * 2 * 4 * 16 * 16) * 16
  # A head size not dividing n_embd is fine once set; a bad one is named.
  dataclasses.replace(TINY, n_embd=30, head_size=8)
  for name in ("head_size", "mlp_size"):
    for bad in (-1, True, 2.5):
      with pytest.raises(ValueError, match=rf"config\.model\.{name}={bad}"):
        dataclasses.replace(TINY, **{name: bad})


@pytest.mark.parametrize("qkv_projection", ["fused", "separate", "grouped"])
def test_n_kv_head_is_mha_with_each_kv_head_shared(qkv_projection):
  """Grouped-query attention (MaxText's num_kv_heads): 4 query heads over
  2 key/value heads compute what the MHA model computes with each k, v
  head's weights copied to the query heads it serves (query head n reads
  kv head n // 2), fused or as three matmuls; the c_attn kernel and the KV
  cache are that much narrower, and decoding with the cache equals the
  forward."""
  gqa = dataclasses.replace(TINY, n_kv_head=2, qkv_projection=qkv_projection)
  assert (gqa.kv_heads, gqa.kv_width) == (2, 16)
  attn = _shapes(gpt.abstract_params(gqa))["h_0"]["attn"]
  assert attn["c_attn"] == {"kernel": (32, 64), "bias": (64,)}
  params = _params(dataclasses.replace(gqa, qkv_projection="auto"), std=0.3)
  idx = _tokens(length=14)
  out = _forward(gqa, params, idx)
  mha = dataclasses.replace(TINY, qkv_projection=qkv_projection)
  wide = {name: ({**layer, "attn": {
      "c_attn": jax.tree.map(lambda a: _widen_kv(gqa, a),
                             layer["attn"]["c_attn"]),
      "c_proj": layer["attn"]["c_proj"]}} if name.startswith("h_")
                 else layer) for name, layer in params.items()}
  np.testing.assert_allclose(out, _forward(mha, wide, idx), atol=1e-5)
  cache = gpt.init_cache(gqa, 2, 14)
  assert cache["k"].shape == (2, 2, 14, 2, 8)
  decode = jax.jit(lambda p, x, c, i: gpt.GPT(gqa).apply(
      {"params": p}, x, c, i, method=gpt.GPT.decode))
  first, cache = decode(params, idx[:, :9], cache, 0)
  rest, _ = decode(params, idx[:, 9:], cache, 9)
  np.testing.assert_allclose(jnp.concatenate([first, rest], axis=1), out,
                             atol=1e-5)


def _widen_kv(cfg, a):
  """c_attn's columns (kernel or bias) of an n_kv_head model as the MHA
  model's: each k, v head's columns repeated for its query heads."""
  width, kv, d = cfg.attention_width, cfg.kv_width, cfg.head_dim

  def heads(x):
    x = x.reshape(x.shape[:-1] + (cfg.kv_heads, d))
    x = np.repeat(x, cfg.n_head // cfg.kv_heads, axis=-2)
    return x.reshape(x.shape[:-2] + (width,))
  a = np.asarray(a)
  return np.concatenate([a[..., :width], heads(a[..., width:width + kv]),
                         heads(a[..., width + kv:])], axis=-1)


@pytest.mark.parametrize("n_kv_head, match", [
    (3, r"config\.model\.n_head=4 must be a multiple of config\.model\."
        r"n_kv_head=3"),
    (-1, r"config\.model\.n_kv_head=-1 must be an integer >= 0"),
    (True, r"config\.model\.n_kv_head=True")])
def test_bad_n_kv_head_names_the_field(n_kv_head, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(TINY, n_kv_head=n_kv_head)


def test_n_kv_head_in_splash_and_in_exports():
  """The Pallas kernel's GQA (interpreted) computes the dot path's causal
  attention; nanoGPT and GPT-2 files cannot hold grouped k, v (n_kv_head
  = n_head is the MHA model and exports)."""
  cfg = gpt.GPTConfig(block_size=128, vocab_size=64, n_layer=1, n_head=4,
                      n_embd=32, n_kv_head=2)
  params = _params(cfg, std=0.3)
  idx = _tokens(batch=1, length=128, vocab=64)
  np.testing.assert_allclose(
      _forward(dataclasses.replace(cfg, attention="splash_interpret"),
               params, idx), _forward(cfg, params, idx), atol=1e-5)
  with pytest.raises(ValueError, match=r"config\.model\.n_kv_head=2: "
                     "nanoGPT and Hugging Face GPT-2 have no such field"):
    gpt_export.check_exportable(cfg)
  gpt_export.check_exportable(dataclasses.replace(cfg, n_kv_head=4))


def test_mlp_size_sets_the_mlp_width_apart_from_4_n_embd():
  # MaxText's mlp_dim: a 32-wide model with a 200-wide MLP.
  wide = dataclasses.replace(TINY, mlp_size=200)
  mlp = _shapes(gpt.abstract_params(wide))["h_1"]["mlp"]
  assert mlp == {"c_fc": {"kernel": (32, 200), "bias": (200,)},
                 "c_proj": {"kernel": (200, 32), "bias": (32,)}}
  assert gpt.num_params(gpt.abstract_params(wide)) == gpt.num_params(
      gpt.abstract_params(TINY)) + 2 * 2 * (200 - 128) * 32 + 2 * (200 - 128)
  same = dataclasses.replace(TINY, mlp_size=128)  # 4 * n_embd: the default
  idx = _tokens(length=12)
  np.testing.assert_array_equal(_forward(same, _params(same), idx),
                                _forward(TINY, _params(TINY), idx))
  assert _forward(wide, _params(wide), idx).shape == (2, 12, 50)


def test_init_statistics():
  cfg = gpt.GPTConfig(block_size=256, vocab_size=2048, n_layer=4, n_head=4,
                      n_embd=256)
  params = jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"])()
  proj = 0.02 / math.sqrt(2 * cfg.n_layer)
  for i in range(cfg.n_layer):
    h = params[f"h_{i}"]
    for value, std in ((h["attn"]["c_attn"]["kernel"], 0.02),
                       (h["attn"]["c_proj"]["kernel"], proj),
                       (h["mlp"]["c_fc"]["kernel"], 0.02),
                       (h["mlp"]["c_proj"]["kernel"], proj)):
      value = np.asarray(value)  # numpy: no compile per shape
      assert abs(float(np.std(value)) / std - 1) < 0.03
      assert abs(float(np.mean(value))) < 0.05 * std
    for name in ("ln_1", "ln_2"):
      np.testing.assert_array_equal(h[name]["scale"], 1.0)
      np.testing.assert_array_equal(h[name]["bias"], 0.0)
    for bias in (h["attn"]["c_attn"]["bias"], h["mlp"]["c_proj"]["bias"]):
      np.testing.assert_array_equal(bias, 0.0)
  for table in (params["wte"]["embedding"], params["wpe"]["embedding"]):
    assert abs(float(np.std(np.asarray(table))) / 0.02 - 1) < 0.03
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))


def test_num_params_and_flops_shakespeare_char():
  cfg = gpt.GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256,
                      vocab_size=65, bias=False, dropout=0.2)
  abstract = gpt.abstract_params(cfg)
  n = gpt.num_params(abstract)
  assert n == 10_646_784  # nanoGPT prints "10.65M"
  assert gpt.num_params(abstract, non_embedding=False) == n + 256 * 384
  assert gpt.num_params({"params": abstract}) == n
  # One sequence of 256 tokens: nanoGPT's 6N + 12 L H Q T per token.
  assert mfu.nanogpt_flops_per_iter(n, 6, 6, 384, 256, 1) == (
      6 * n + 12 * 6 * 6 * 64 * 256) * 256
  # GPT-2 124M with the padded vocabulary: nanoGPT prints "123.69M".
  assert gpt.num_params(gpt.abstract_params(gpt.GPTConfig())) == 123_689_472


def test_from_config():
  mc = ml_collections.ConfigDict(dict(name="gpt", n_layer=6, n_head=6,
                                      n_embd=384, bias=False, dtype="bfloat16"))
  cfg = gpt.GPTConfig.from_config(mc)
  assert (cfg.n_layer, cfg.n_embd, cfg.bias, cfg.dtype, cfg.block_size) == (
      6, 384, False, "bfloat16", 1024)
  mc.unlocked = None
  with pytest.raises(ValueError, match=r"config\.model\.unlocked.*n_layer"):
    gpt.GPTConfig.from_config(mc)
  with pytest.raises(ValueError, match=r"n_embd=100.*n_head=6"):
    gpt.GPTConfig.from_config(dict(name="gpt", n_embd=100, n_head=6))
  with pytest.raises(ValueError, match="dtype"):
    gpt.GPTConfig(dtype="float64")
  # Sizes JAX cannot hold as int32 (a run's config.json edited to a
  # vocab_size of 2**40, read by trm.export and trm.sample; the same as a
  # --config override) failed in JAX with an OverflowError's traceback.
  for field in ("vocab_size", "n_embd", "mlp_size"):
    with pytest.raises(ValueError, match=rf"config\.model\.{field}="
                       r"1099511627776 must be .*below 2\*\*31"):
      gpt.GPTConfig(**{field: 2**40})


def test_causal():
  params = _params(std=0.3)
  idx = _tokens(length=16)
  ref = _forward(TINY, params, idx)
  assert ref.shape == (2, 16, 50) and ref.dtype == jnp.float32
  t = 9
  changed = idx.at[:, t].set((idx[:, t] + 1) % 50)
  out = _forward(TINY, params, changed)
  np.testing.assert_allclose(out[:, :t], ref[:, :t], atol=1e-6)
  assert float(jnp.max(jnp.abs(out[:, t:] - ref[:, t:]))) > 1e-3
  with pytest.raises(ValueError, match="block_size"):
    _forward(TINY, params, _tokens(length=17))


def test_dropout():
  cfg = dataclasses.replace(TINY, dropout=0.5)
  params = _params(std=0.3)  # dropout adds no parameters
  model = gpt.GPT(cfg)
  idx = _tokens()
  det = _forward(cfg, params, idx)
  np.testing.assert_allclose(det, _forward(TINY, params, idx), atol=1e-6)
  train = jax.jit(lambda p, key: model.apply(
      {"params": p}, idx, deterministic=False, rngs={"dropout": key}))
  run = lambda seed: train(params, jax.random.key(seed))
  a, b = run(0), run(1)
  np.testing.assert_array_equal(a, run(0))
  assert float(jnp.max(jnp.abs(a - det))) > 1e-2
  assert float(jnp.max(jnp.abs(a - b))) > 1e-2
  with pytest.raises(Exception, match="dropout"):  # needs the rng
    model.apply({"params": params}, idx, deterministic=False)
  # Rate 0: training mode is the deterministic function.
  zero = jax.jit(lambda p: gpt.GPT(TINY).apply({"params": p}, idx,
                                              deterministic=False))(params)
  np.testing.assert_allclose(zero, det, atol=1e-6)


def test_attention_matches_jax_reference():
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 7, 4, 8))
             for i in range(3))
  causal = jnp.tril(jnp.ones((7, 7), bool))
  ours = jax.jit(lambda q, k, v: gpt._attend(
      q, k, v, causal, lambda x, deterministic: x, False))(q, k, v)
  ref = jax.jit(functools.partial(jax.nn.dot_product_attention,
                                  is_causal=True))(q, k, v)
  np.testing.assert_allclose(ours, ref, atol=1e-6)


def _layer_norm_reference(x, scale, bias):
  x = x.astype(jnp.float32)
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) / jnp.sqrt(var + 1e-5) * scale + bias


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_norm_and_gelu_grads_match_autodiff(dtype):
  """The written-out backward passes of gpt.layer_norm and gpt.gelu equal
  autodiff of the plain formulas (torch's LayerNorm and exact GELU)."""
  x = (3.0 * jax.random.normal(jax.random.key(0), (2, 5, 16)) + 1.0).astype(
      dtype)
  scale = 1.0 + 0.1 * jax.random.normal(jax.random.key(1), (16,))
  bias = 0.1 * jax.random.normal(jax.random.key(2), (16,))
  dy = jax.random.normal(jax.random.key(3), (2, 5, 16))
  tol = dict(rtol=2e-2, atol=2e-2) if dtype == "bfloat16" else dict(
      rtol=1e-5, atol=1e-5)

  def check(ours, ref, args):
    np.testing.assert_allclose(np.asarray(ours(*args), np.float32),
                               np.asarray(ref(*args), np.float32), **tol)
    n = tuple(range(len(args)))
    got = jax.jit(jax.grad(lambda *a: jnp.sum(
        ours(*a).astype(jnp.float32) * dy), argnums=n))(*args)
    want = jax.jit(jax.grad(lambda *a: jnp.sum(
        ref(*a).astype(jnp.float32) * dy), argnums=n))(*args)
    for a, b in zip(got, want):
      assert a.dtype == b.dtype
      np.testing.assert_allclose(np.asarray(a, np.float32),
                                 np.asarray(b, np.float32), **tol)

  check(gpt.layer_norm, _layer_norm_reference, (x, scale, bias))
  exact_gelu = lambda x: jax.nn.gelu(x.astype(jnp.float32),
                                     approximate=False).astype(x.dtype)
  check(gpt.gelu, exact_gelu, (x,))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_matmul_grads_match_autodiff(dtype):
  """The written-out backward of gpt.matmul equals autodiff of jnp.dot,
  for [B, T, K] inputs and with the product rounded to the compute dtype
  as Linear does."""
  x = jax.random.normal(jax.random.key(0), (3, 5, 8)).astype(dtype)
  w = jax.random.normal(jax.random.key(1), (8, 6)).astype(dtype)
  dy = jax.random.normal(jax.random.key(2), (3, 5, 6))

  def ours(x, w):
    return jnp.sum(gpt.matmul(x, w).astype(dtype).astype(jnp.float32) * dy)

  def ref(x, w):
    y = jnp.dot(x, w, preferred_element_type=jnp.float32)
    return jnp.sum(y.astype(dtype).astype(jnp.float32) * dy)

  got = jax.jit(jax.grad(ours, argnums=(0, 1)))(x, w)
  want = jax.jit(jax.grad(ref, argnums=(0, 1)))(x, w)
  for a, b in zip(got, want):
    assert a.dtype == b.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(np.asarray(a, np.float32),
                               np.asarray(b, np.float32), rtol=1e-2 if
                               dtype == "bfloat16" else 1e-5, atol=1e-5)
  np.testing.assert_allclose(gpt.matmul(x, w), jnp.dot(
      x, w, preferred_element_type=jnp.float32), rtol=1e-6)


def test_remat_same_values_and_grads():
  """remat changes nothing, dropout masks included (same rng)."""
  params = _params(std=0.3)
  idx = _tokens()

  def loss(cfg, p):
    out = gpt.GPT(cfg).apply({"params": p}, idx, deterministic=False,
                             rngs={"dropout": jax.random.key(7)})
    return jnp.mean(out ** 2)

  plain = dataclasses.replace(TINY, dropout=0.1)
  remat = dataclasses.replace(plain, remat=True)
  l0, g0 = jax.jit(jax.value_and_grad(functools.partial(loss, plain)))(params)
  l1, g1 = jax.jit(jax.value_and_grad(functools.partial(loss, remat)))(params)
  np.testing.assert_allclose(l0, l1, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               g0, g1)
  # decode is not rematerialised but must still work on the remat model.
  logits, _ = jax.jit(lambda p: gpt.GPT(remat).apply(
      {"params": p}, idx, gpt.init_cache(remat, 2, 12), 0,
      method=gpt.GPT.decode))(params)
  np.testing.assert_allclose(logits, _forward(TINY, params, idx), atol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_remat_policy_minimal_saves_the_weight_matmuls(scan):
  """remat_policy='minimal' (MaxText's) gives full remat's values and
  gradients, and its backward recomputes none of the weight matmuls that
  full remat recomputes: c_attn, attention's c_proj and c_fc per layer (the
  MLP's c_proj output is not needed by the backward, so neither policy
  recomputes it); attention's two batched matmuls are recomputed by both.
  Before, jax's dot-saving policy saw no dots (ours are custom_vjps) and
  'minimal' recomputed as much as 'full'."""
  params = _params(std=0.3)
  idx = _tokens()
  full = dataclasses.replace(TINY, remat=True, scan_layers=scan)
  minimal = dataclasses.replace(full, remat_policy="minimal")
  if scan:
    params = gpt.stack_layers(params, TINY.n_layer)

  def loss(cfg, p):
    return jnp.mean(gpt.GPT(cfg).apply({"params": p}, idx) ** 2)

  def grad(cfg):
    return jax.value_and_grad(functools.partial(loss, cfg))

  (l0, g0), (l1, g1) = jax.jit(grad(full))(params), jax.jit(grad(minimal))(
      params)
  np.testing.assert_allclose(l0, l1, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               g0, g1)

  def dots(cfg) -> int:  # in the program's text: a scan's body once
    return jax.jit(grad(cfg)).lower(params).as_text().count(
        "stablehlo.dot_general")

  layers = 1 if scan else TINY.n_layer
  no_remat = dataclasses.replace(full, remat=False)
  assert dots(full) - dots(no_remat) == 5 * layers
  assert dots(minimal) - dots(no_remat) == 2 * layers
  with pytest.raises(ValueError, match="remat_policy='some'"):
    dataclasses.replace(full, remat_policy="some")


_OFFLOAD_ALL = "decoder_layer_input,query_proj,key_proj,value_proj"


def test_remat_policy_custom_saves_and_offloads_what_it_names():
  """remat_policy='custom' (MaxText's): full remat's values and gradients
  when it saves some names and offloads others; saving `weight_matmul`
  recomputes what 'minimal' does; keeping or offloading q, k and v spares
  the c_attn matmul's recomputation
  (4 of full's 5 recomputed dots a layer) and moves the named tensors to
  host memory (a device_put to the host per name and layer, and back),
  which 'full' never does. Scanned (the unscanned blocks take the same
  policy: test_remat_policy_minimal_saves_the_weight_matmuls)."""
  params = gpt.stack_layers(_params(std=0.3), TINY.n_layer)
  idx = _tokens()
  full = dataclasses.replace(TINY, remat=True, scan_layers=True)

  def grad(cfg):
    return jax.value_and_grad(lambda p: jnp.mean(
        gpt.GPT(cfg).apply({"params": p}, idx) ** 2))

  def dots(cfg) -> int:
    return jax.jit(grad(cfg)).lower(params).as_text().count(
        "stablehlo.dot_general")

  def to_host(cfg) -> int:
    return str(jax.make_jaxpr(grad(cfg))(params)).count(
        "devices=(MemorySpace.Host,)")

  l0, g0 = jax.jit(grad(full))(params)
  layers = 1  # a scan's body once in the program's text
  no_remat = dots(dataclasses.replace(full, remat=False))
  # Values are compiled and compared for the case that saves and offloads
  # (the compiles are this test's time); the programs of all three.
  for fields, recomputed, offloaded in (
      (dict(remat_save="query_proj, key_proj",
            remat_offload="value_proj,decoder_layer_input"), 4, 2),
      (dict(remat_save="weight_matmul"), 2, 0),
      (dict(remat_offload=_OFFLOAD_ALL), 4, 4),
      # Attention's c_proj and the MLP's c_fc outputs spare their matmuls;
      # the MLP's c_proj output is not needed by the backward.
      (dict(remat_save="out_proj,mlpwi,mlpwo"), 3, 0),
      (dict(remat_offload=_OFFLOAD_ALL + ",out_proj"), 3, 5)):
    custom = dataclasses.replace(full, remat_policy="custom", **fields)
    if "remat_offload" in fields and "remat_save" in fields:
      l1, g1 = jax.jit(grad(custom))(params)
      np.testing.assert_allclose(l1, l0, rtol=1e-6)
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                   g1, g0)
    assert dots(custom) - no_remat == recomputed * layers, fields
    assert to_host(custom) == offloaded * layers, fields
  assert to_host(full) == 0


@pytest.mark.parametrize("fields, match", [
    (dict(remat_policy="custom", remat_offload="layer_input"),
     r"remat_offload: unknown \['layer_input'\]"),
    (dict(remat_policy="full", remat_save="weight_matmul"),
     r"remat_save='weight_matmul' is read only with .*'custom'"),
    (dict(remat_policy="custom", remat_save="query_proj",
          remat_offload="key_proj,query_proj"),
     r"both name \['query_proj'\]"),
    (dict(remat_policy="custom", remat_offload=("query_proj",)),
     r"remat_offload=\('query_proj',\) must be a string"),
])
def test_bad_custom_remat_names_the_field(fields, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(TINY, remat=True, **fields)


# Two TPU compiles, 50 s on the 2-core host: the default run checks the
# offload in the program (test_remat_policy_custom_saves_and_offloads_what_
# it_names), this one its memory effect on a chip.
@pytest.mark.slow
def test_offloading_the_layer_input_moves_it_out_of_hbm():
  """A scanned, remat'd stack keeps each layer's input in HBM for the
  backward pass; offloaded, those [layers, B, T, C] bytes leave the TPU
  chip's temporaries for the host's (compiled for one v4 chip,
  libtpu's compile-only devices: XLA for CPU has no separate host
  memory)."""
  from trm.core import topology  # pylint: disable=g-import-not-at-top
  device = topology.topology_devices(topology.parse_topology("v4-8"), 1)[0]
  # Large enough that the saved inputs live in HBM, not on chip.
  sizes = dict(block_size=512, vocab_size=128, n_layer=4, n_head=4,
               n_embd=512, remat=True, scan_layers=True)
  one_chip = jax.sharding.SingleDeviceSharding(device)
  tokens = jax.ShapeDtypeStruct((16, 512), jnp.int32, sharding=one_chip)

  def memory(**fields):
    model = gpt.GPT(gpt.GPTConfig(**sizes, **fields))
    params = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one_chip),
        nn.meta.unbox(jax.eval_shape(lambda: model.init(
            jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))["params"]))
    loss = lambda p, t: model.apply({"params": p}, t).mean()  # noqa: E731
    stats = jax.jit(jax.grad(loss)).lower(params, tokens).compile(
        ).memory_analysis()
    return stats.temp_size_in_bytes, stats.host_temp_size_in_bytes

  inputs = 4 * 16 * 512 * 512 * 4   # layers x B x T x C, float32
  hbm, host = memory()
  hbm_offloaded, host_offloaded = memory(
      remat_policy="custom", remat_offload="decoder_layer_input")
  assert host == 0
  assert host_offloaded >= inputs
  assert hbm - hbm_offloaded >= 0.9 * inputs


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_low_precision_compute(dtype):
  cfg = dataclasses.replace(TINY, dtype=dtype)
  params = _params(std=0.3)
  idx = _tokens()
  out = _forward(cfg, params, idx)
  assert out.dtype == jnp.float32
  ref = _forward(TINY, params, idx)
  assert float(jnp.max(jnp.abs(out - ref))) < 0.1 * float(jnp.max(jnp.abs(ref)))
  assert gpt.init_cache(cfg, 1, 4)["k"].dtype == jnp.dtype(dtype)


def test_bfloat16_logits_are_the_float32_ones_rounded():
  # config.model.logits_dtype=bfloat16: nanoGPT's LM head under autocast.
  cfg = dataclasses.replace(TINY, dtype="bfloat16", logits_dtype="bfloat16")
  params = _params(std=0.3)
  idx = _tokens()
  out = _forward(cfg, params, idx)
  assert out.dtype == jnp.bfloat16
  wide = _forward(dataclasses.replace(cfg, logits_dtype="float32"), params,
                  idx)
  np.testing.assert_array_equal(out, wide.astype(jnp.bfloat16))
  # Sampling reads them in float32.
  tokens = gpt.generate(gpt.GPT(cfg), params, idx[:, :4], 3,
                        jax.random.key(0), temperature=0.0)
  assert tokens.shape == (2, 7)
  with pytest.raises(ValueError, match=r"config\.model\.logits_dtype"):
    dataclasses.replace(TINY, logits_dtype="int8")


def test_decode_matches_forward():
  params = _params(std=0.3)
  model = gpt.GPT(TINY)
  idx = _tokens(length=14)
  ref = _forward(TINY, params, idx)
  decode = jax.jit(lambda p, x, c, i: model.apply({"params": p}, x, c, i,
                                                  method=gpt.GPT.decode))
  cache = gpt.init_cache(TINY, 2, 14)
  assert cache["k"].shape == (2, 2, 14, 4, 8)
  pieces = []
  logits, cache = decode(params, idx[:, :5], cache, 0)      # prefill
  pieces.append(logits)
  logits, cache = decode(params, idx[:, 5:8], cache, 5)     # a chunk
  pieces.append(logits)
  for t in range(8, 14):                                    # one at a time
    logits, cache = decode(params, idx[:, t:t + 1], cache, jnp.int32(t))
    pieces.append(logits)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), ref, atol=1e-5)
  with pytest.raises(ValueError, match="block_size"):
    gpt.init_cache(TINY, 1, 17)


def _last_logits(cfg, params, ctx):
  """Logits at the last position of `ctx` (length <= block_size): right-pads
  to block_size so one compiled forward serves every length (causal, so the
  padding cannot change earlier positions)."""
  n = ctx.shape[1]
  padded = np.zeros((ctx.shape[0], cfg.block_size), np.int32)
  padded[:, :n] = ctx
  return np.asarray(_forward(cfg, params, jnp.asarray(padded)))[:, n - 1]


def _reference_generate(cfg, params, prompt, steps):
  """nanoGPT's generate loop (greedy), written plainly over the forward."""
  idx = np.asarray(prompt)
  for _ in range(steps):
    ctx = idx if idx.shape[1] <= cfg.block_size else idx[:, -cfg.block_size:]
    nxt = np.argmax(_last_logits(cfg, params, ctx), axis=-1)
    idx = np.concatenate([idx, nxt[:, None].astype(idx.dtype)], axis=1)
  return idx


@pytest.mark.parametrize("t0,steps", [(3, 10),    # fits in block_size (16)
                                      (10, 12),   # crosses block_size
                                      (20, 5),    # prompt longer than it
                                      (16, 3)])   # prompt exactly block_size
def test_generate_greedy_matches_reference(t0, steps):
  params = _params(std=0.3)
  prompt = _tokens(length=t0, seed=t0)
  out = gpt.generate(gpt.GPT(TINY), params, prompt, steps, jax.random.key(0),
                     temperature=0.0)
  assert out.shape == (2, t0 + steps) and out.dtype == jnp.int32
  ref = _reference_generate(TINY, params, prompt, steps)
  np.testing.assert_array_equal(out, ref)
  # Not a degenerate repeat of one token.
  assert len(np.unique(ref[:, t0:])) > 2


def test_sampling_probs_keeps_ties_at_the_kth_and_matches_the_draws():
  """nanoGPT's crop keeps every logit >= the k-th largest (ties keep more
  than k); sampling_probs is the softmax _sample draws from."""
  logits = jnp.array([[4.0, 2.0, 2.0, 2.0, 1.0, 0.0],
                      [1.0, 3.0, 0.5, 3.0, 3.0, -1.0]])
  probs = np.asarray(gpt.sampling_probs(logits, 0.5, top_k=2))
  np.testing.assert_array_equal(probs > 0, [[1, 1, 1, 1, 0, 0],
                                            [0, 1, 0, 1, 1, 0]])
  x = np.asarray(logits, np.float64) / 0.5
  want = np.where(probs > 0, np.exp(x - x.max(-1, keepdims=True)), 0.0)
  np.testing.assert_allclose(probs, want / want.sum(-1, keepdims=True),
                             atol=1e-7)
  n = 20000
  draws = np.asarray(gpt._sample(jnp.repeat(logits, n, axis=0),
                                 jax.random.key(5), 0.5, 2)).reshape(2, n)
  for row in range(2):
    freq = np.bincount(draws[row], minlength=6) / n
    assert np.all(freq[probs[row] == 0] == 0)
    np.testing.assert_allclose(freq, probs[row], atol=0.01)


def test_generate_top_k_and_temperature():
  params = _params(std=0.3)
  model = gpt.GPT(TINY)
  prompt = _tokens(length=4, seed=3)
  greedy = gpt.generate(model, params, prompt, 12, jax.random.key(0),
                        temperature=0.0)
  top1 = gpt.generate(model, params, prompt, 12, jax.random.key(5),
                      temperature=1.0, top_k=1)
  np.testing.assert_array_equal(top1, greedy)
  # Sampling: reproducible per key, and every token within the top 3 of the
  # logits nanoGPT would compute for its (cropped) context.
  a = gpt.generate(model, params, prompt, 12, jax.random.key(1),
                   temperature=0.8, top_k=3)
  np.testing.assert_array_equal(a, gpt.generate(
      model, params, prompt, 12, jax.random.key(1), temperature=0.8, top_k=3))
  assert not np.array_equal(a, gpt.generate(
      model, params, prompt, 12, jax.random.key(2), temperature=0.8, top_k=3))
  logits = np.asarray(_forward(TINY, params, a))
  for t in range(4, 16):
    top3 = np.argsort(-logits[:, t - 1], axis=-1)[:, :3]
    assert all(a[b, t] in top3[b] for b in range(2))
  # top_k above the vocabulary size is clamped (k = min(top_k, vocab)).
  logits = jnp.array([[0.0, 3.0, 1.0], [2.0, -1.0, 5.0]])
  np.testing.assert_array_equal(
      gpt._sample(logits, jax.random.key(0), 1e-3, 1000), [1, 2])
  np.testing.assert_array_equal(
      gpt._sample(logits, jax.random.key(0), 0.0, None), [1, 2])
  # A traced temperature under an outer jit; 0 still means greedy.
  traced = jax.jit(lambda temp: gpt.generate(
      model, params, prompt, 12, jax.random.key(0), temperature=temp))
  np.testing.assert_array_equal(traced(jnp.float32(0.0)), greedy)
  assert gpt.generate(model, params, prompt, 0, jax.random.key(0)).shape == (
      2, 4)


def test_sharded_init_and_forward_match():
  cfg = dataclasses.replace(TINY, vocab_size=64)
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  boxed = gpt.abstract_params(cfg)
  shardings = mesh_lib.tree_shardings(mesh, RULES, boxed)
  assert shardings["wte"]["embedding"].spec == P("model", "fsdp")
  assert shardings["h_0"]["attn"]["c_attn"]["kernel"].spec == P("fsdp",
                                                               "model")
  model = gpt.GPT(cfg)
  idx = _tokens(batch=4, length=16, vocab=64)
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    params = jax.jit(
        lambda: nn.meta.unbox(model.init(jax.random.key(0), idx))["params"],
        out_shardings=shardings)()
    out = jax.jit(lambda p, x: model.apply({"params": p}, x))(params, idx)
    cached = gpt.generate(model, params, idx[:, :4], 6, jax.random.key(0),
                          temperature=0.0)
  assert params["h_1"]["mlp"]["c_fc"]["kernel"].sharding.spec == P("fsdp",
                                                                   "model")
  plain = nn.meta.unbox(model.init(jax.random.key(0), idx))["params"]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7),
               params, plain)
  np.testing.assert_allclose(out, _forward(cfg, plain, idx), atol=1e-5)
  np.testing.assert_array_equal(
      cached, _reference_generate(cfg, plain, idx[:, :4], 6))


# With c_attn's bias (float32) and without it (bfloat16): the kernel's and
# the bias's column blocks, in both dtypes; (False, float32) adds no path
# and runs with -m slow.
@pytest.mark.parametrize("bias,dtype", [
    (True, "float32"),
    pytest.param(False, "float32", marks=pytest.mark.slow),
    (False, "bfloat16")])
@pytest.mark.parametrize("projection", ["separate", "grouped"])
def test_separate_and_grouped_qkv_projection_same_values_and_grads(
    bias, dtype, projection):
  """qkv_projection='separate' runs c_attn as three matmuls on its column
  blocks, 'grouped' as one matmul on its columns reordered per key/value
  head: the same parameters, logits, gradients and KV-cache decode as
  nanoGPT's one matmul and split."""
  fused = dataclasses.replace(TINY, bias=bias, dtype=dtype,
                              qkv_projection="fused")
  separate = dataclasses.replace(fused, qkv_projection=projection)
  assert _shapes(gpt.abstract_params(fused)) == _shapes(
      gpt.abstract_params(separate))
  params = _params(dataclasses.replace(TINY, bias=bias), std=0.3)
  idx = _tokens()

  def loss(cfg, p):
    return jnp.mean(gpt.GPT(cfg).apply({"params": p}, idx) ** 2)

  tol = 1e-6 if dtype == "float32" else 1e-2
  l0, g0 = jax.jit(jax.value_and_grad(functools.partial(loss, fused)))(params)
  l1, g1 = jax.jit(jax.value_and_grad(functools.partial(loss, separate)))(
      params)
  np.testing.assert_allclose(l0, l1, rtol=tol)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=tol,
                                                       atol=tol), g0, g1)
  cache = gpt.init_cache(separate, 2, 12)
  decoded, _ = jax.jit(lambda p: gpt.GPT(separate).apply(
      {"params": p}, idx, cache, 0, method=gpt.GPT.decode))(params)
  np.testing.assert_allclose(decoded, _forward(fused, params, idx),
                             rtol=tol, atol=tol)


def test_separate_qkv_projection_is_three_matmuls_and_no_split():
  """The point of 'separate': c_attn's three products are three dots in
  the compiled program, none [.., 3C] wide, so nothing splits them."""
  cfg = dataclasses.replace(TINY, qkv_projection="separate")
  params = _params()
  idx = _tokens()

  def loss(p):
    return jnp.mean(gpt.GPT(cfg).apply({"params": p}, idx) ** 2)

  lowered = jax.jit(jax.grad(loss)).lower(params)
  wide = 3 * cfg.n_embd
  assert not re.search(rf"\[\d+,{wide}\]\S* dot\(|\[\d+,\d+,{wide}\]\S* dot\(",
                       lowered.compile().as_text()), (
                           "c_attn ran as one [.., 3C] matmul")
  # XLA:GPU's dot merger (not run by XLA:CPU) would join three matmuls on
  # one operand into that one: each gets its own copy through a barrier.
  assert "optimization_barrier" in lowered.as_text()


def test_qkv_projection_auto_and_bad_values():
  assert not TINY.separate_qkv  # 'auto' off cuDNN: nanoGPT's fused matmul
  assert dataclasses.replace(TINY, qkv_projection="separate").separate_qkv
  with pytest.raises(ValueError, match=r"config\.model\.qkv_projection"):
    dataclasses.replace(TINY, qkv_projection="split")


def _grouped_under(cfg, model=1, rules=RULES):
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=-1, model=model))
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    return gpt_layers.grouped_qkv(cfg)


def test_qkv_projection_auto_is_grouped_where_the_mesh_splits_the_heads():
  """'auto' reorders c_attn's columns only under a tensor split of the
  heads that the key/value heads divide; elsewhere the reorder would copy
  the kernel for nothing."""
  gqa = dataclasses.replace(TINY, n_head=8, n_kv_head=2)
  assert not gpt_layers.grouped_qkv(TINY)  # no mesh
  assert not _grouped_under(TINY, model=1)
  assert _grouped_under(TINY, model=2) and _grouped_under(TINY, model=4)
  assert _grouped_under(gqa, model=2)
  assert not _grouped_under(gqa, model=4)  # 2 kv heads over 4: no boundary
  # Heads not split (the rules map them to no mesh axis): nanoGPT's matmul.
  unsplit = tuple((name, None if name == "heads" else axes)
                  for name, axes in RULES)
  assert not _grouped_under(TINY, model=2, rules=unsplit)
  # Chosen: 'fused' stays fused; 'grouped' is grouped anywhere; cuDNN's
  # 'auto' stays three matmuls.
  assert not _grouped_under(dataclasses.replace(TINY, qkv_projection="fused"),
                            model=2)
  assert gpt_layers.grouped_qkv(dataclasses.replace(
      TINY, qkv_projection="grouped"))
  cudnn = dataclasses.replace(TINY, attention="cudnn", dtype="bfloat16")
  assert cudnn.separate_qkv and not _grouped_under(cudnn, model=2)


@pytest.mark.parametrize("n_kv_head", [0, 4])
def test_tensor_parallel_qkv_moves_no_activations(n_kv_head):
  """Under a 4-way tensor split of the heads, nanoGPT's column order splits
  c_attn's product across q, k and v, and the step moves activations
  ([batch, length, width] pieces) between devices every layer; with 'auto'
  (grouped there) only the kernel, its bias and their gradients move (BUILD_NOTES
  "Session 98": the v5p 128B's 8 layers 53.1% -> 63.9% forecast MFU)."""
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=1, fsdp=2, model=4))
  idx = _tokens(batch=4, length=16, vocab=64)

  def moved_shapes(projection):
    cfg = dataclasses.replace(TINY, vocab_size=64, n_layer=1, n_head=8,
                              n_embd=64, n_kv_head=n_kv_head,
                              qkv_projection=projection)
    model = gpt.GPT(cfg)
    shardings = mesh_lib.tree_shardings(mesh, RULES, gpt.abstract_params(cfg))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
      params = jax.jit(lambda: nn.meta.unbox(model.init(
          jax.random.key(0), idx))["params"], out_shardings=shardings)()
      text = jax.jit(jax.grad(lambda p: jnp.mean(model.apply(
          {"params": p}, idx) ** 2))).lower(params).compile().as_text()
    return re.findall(r"= \w+\[([\d,]*)\]\S* "
                      r"(?:collective-permute|all-to-all)(?:-start)?\(", text)

  fused, grouped = moved_shapes("fused"), moved_shapes("auto")
  assert any(shape.count(",") == 2 for shape in fused), fused
  assert grouped and all(shape.count(",") <= 1 for shape in grouped), grouped


@pytest.mark.parametrize("temperature", [2e-38, 1e-45])
def test_a_temperature_past_float32s_range_samples_the_likeliest(temperature):
  """logits / 2e-38 pass float32's range: every positive logit became +inf
  and the first id among them was drawn (token 0 here, the least likely
  of the three), and a subnormal temperature (flushed to 0) made NaN.
  Both now draw the likeliest, as greedy does; the distribution at a usual
  temperature is unchanged."""
  logits = jnp.array([[10.0, 50.0, 30.0], [40.0, -5.0, 20.0]])
  for key in range(4):
    np.testing.assert_array_equal(
        gpt._sample(logits, jax.random.key(key), temperature, None), [1, 0])
  traced = jax.jit(lambda t: gpt._sample(logits, jax.random.key(0), t, None))
  np.testing.assert_array_equal(traced(jnp.float32(temperature)), [1, 0])
  np.testing.assert_allclose(
      gpt.sampling_probs(logits, 0.7),
      jax.nn.softmax(logits / 0.7, axis=-1), rtol=1e-5, atol=1e-12)
