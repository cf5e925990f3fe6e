"""Tests for trm.models: layers, the TRM forward, gradient truncation, ACT."""

import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.families.trm import layers
from trm.families.trm import model as trm

B = 8


def _cfg(**kw):
  base = dict(vocab_size=7, seq_len=6, num_puzzle_identifiers=3,
              hidden_size=32, num_heads=2, expansion=4.0, L_layers=1,
              H_cycles=2, L_cycles=2, halt_max_steps=3,
              halt_exploration_prob=0.0, puzzle_emb_ndim=32,
              puzzle_emb_len=16, pos_encodings="rope", mlp_t=False,
              forward_dtype="float32")
  base.update(kw)
  return trm.TRMConfig(**base)


_CACHE = {}


# Settings that do not change the variables; models differing only in these
# share one initialisation (each jit compile costs seconds on CPU).
_RUNTIME_KEYS = ("H_cycles", "L_cycles", "halt_max_steps",
                 "halt_exploration_prob")


def _model(**kw):
  """(model, unboxed variables) for a tiny config, initialised once."""
  structural = {k: v for k, v in kw.items() if k not in _RUNTIME_KEYS}
  key = tuple(sorted(structural.items()))
  if key not in _CACHE:
    model = trm.TRM(_cfg(**structural))
    _CACHE[key] = jax.jit(lambda: nn.meta.unbox(
        trm.init_variables(model, jax.random.PRNGKey(0))))()
  return trm.TRM(_cfg(**kw)), _CACHE[key]


def _embed_model(**kw):
  """(model, variables) initialised along the input-embedding path only."""
  model = trm.TRM(_cfg(**kw))
  inputs = jnp.zeros((1, model.cfg.seq_len), jnp.int32)
  vectors = jnp.zeros((1, max(model.cfg.puzzle_emb_ndim, 1)))
  variables = model.init(jax.random.PRNGKey(0), inputs, vectors,
                         method=trm.TRM._input_embeddings)
  return model, nn.meta.unbox(variables)


def _count(tree):
  return sum(math.prod(x.shape) for x in jax.tree.leaves(tree))


def _abstract_variables(**kw):
  model = trm.TRM(trm.TRMConfig(**kw))
  return nn.meta.unbox(jax.eval_shape(
      lambda: trm.init_variables(model, jax.random.PRNGKey(0))))


def _batch(cfg, seed=0, batch=B):
  rng = np.random.default_rng(seed)
  return {
      "inputs": jnp.asarray(rng.integers(0, cfg.vocab_size,
                                         (batch, cfg.seq_len)), jnp.int32),
      "labels": jnp.asarray(rng.integers(0, cfg.vocab_size,
                                         (batch, cfg.seq_len)), jnp.int32),
      "puzzle_identifiers": jnp.asarray(
          rng.integers(0, cfg.num_puzzle_identifiers, (batch,)), jnp.int32),
  }


def _normal(shape, seed, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale,
                     jnp.float32)


def _np_rms(x, eps=1e-5):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def _np_silu(x):
  return x / (1.0 + np.exp(-x))


def _np_swiglu(x, p):
  gate_up = x @ np.asarray(p["gate_up_proj"]["kernel"], np.float64)
  gate, up = np.split(gate_up, 2, axis=-1)
  return (_np_silu(gate) * up) @ np.asarray(p["down_proj"]["kernel"],
                                            np.float64)


# ------------------------------------------------------------ parameter counts


@pytest.mark.parametrize("kw,expected", [
    (dict(vocab_size=11, seq_len=81, num_puzzle_identifiers=1, mlp_t=True,
          pos_encodings="none"), 5_028_866),
    (dict(vocab_size=11, seq_len=81, num_puzzle_identifiers=1), 6_828_034),
    (dict(vocab_size=6, seq_len=900, num_puzzle_identifiers=1), 6_822_914),
    (dict(vocab_size=12, seq_len=900, num_puzzle_identifiers=1), 6_829_058),
    (dict(vocab_size=6, seq_len=900, num_puzzle_identifiers=1, mlp_t=True,
          pos_encodings="none"), 18_795_522),
])
def test_parameter_count_matches_upstream(kw, expected):
  variables = _abstract_variables(**kw)
  assert set(variables) == {"params", "buffers", "puzzle_emb"}
  assert _count(variables["params"]) == expected
  assert _count(variables["buffers"]) == 2 * 512
  assert variables["puzzle_emb"]["weights"].shape == (1, 512)


def test_sudoku_parameter_shapes():
  mlp = _abstract_variables(vocab_size=11, seq_len=81, num_puzzle_identifiers=1,
                            mlp_t=True, pos_encodings="none")["params"]
  att = _abstract_variables(vocab_size=11, seq_len=81,
                            num_puzzle_identifiers=1)["params"]
  shape = lambda t, *path: _get(t, path)
  assert shape(mlp, "L_level", "layers_0", "mlp_t", "gate_up_proj",
               "kernel") == (97, 1024)
  assert shape(mlp, "L_level", "layers_1", "mlp_t", "down_proj",
               "kernel") == (512, 97)
  assert shape(mlp, "L_level", "layers_0", "mlp", "gate_up_proj",
               "kernel") == (512, 3072)
  assert shape(mlp, "L_level", "layers_0", "mlp", "down_proj",
               "kernel") == (1536, 512)
  assert shape(att, "L_level", "layers_0", "self_attn", "qkv_proj",
               "kernel") == (512, 1536)
  assert shape(att, "L_level", "layers_0", "self_attn", "o_proj",
               "kernel") == (512, 512)
  assert shape(att, "embed_tokens", "embedding") == (11, 512)
  assert shape(att, "lm_head", "kernel") == (512, 11)
  assert shape(att, "q_head", "kernel") == (512, 2)
  assert shape(att, "q_head", "bias") == (2,)
  assert "layers_2" not in att["L_level"]
  assert "embed_pos" not in att


def _get(tree, path):
  for p in path:
    tree = tree[p]
  return tree.shape


def test_learned_pos_encoding_params():
  v = _abstract_variables(vocab_size=11, seq_len=81, num_puzzle_identifiers=1,
                          pos_encodings="learned")
  assert v["params"]["embed_pos"].shape == (97, 512)
  assert _count(v["params"]) == 6_828_034 + 97 * 512


# -------------------------------------------------------------------- layers


def test_swiglu_width():
  assert layers.swiglu_width(512, 4) == 1536
  assert layers.swiglu_width(97, 4) == 512
  assert layers.swiglu_width(916, 4) == 2560
  assert layers.swiglu_width(32, 4) == 256
  # Python's banker's rounding: 0.75 * 513 * 2/3 = 256.5 rounds to 256.
  assert layers.swiglu_width(513, 0.75) == 256


@pytest.mark.parametrize("std", [1.0, 0.02, 1 / math.sqrt(512)])
def test_trunc_normal_std_and_bound(std):
  x = np.asarray(layers.trunc_normal(std)(jax.random.PRNGKey(1), (200_000,)))
  assert x.dtype == np.float32
  np.testing.assert_allclose(x.std(), std, rtol=0.01)
  assert abs(x.mean()) < 0.01 * std
  bound = 2 * std / 0.87962566103423978
  assert np.abs(x).max() <= bound * (1 + 1e-6)
  assert np.abs(x).max() > 0.98 * bound  # really truncated at ±2 sigma


def test_trunc_normal_zero_std_and_dtype():
  assert not np.any(np.asarray(layers.trunc_normal(0.0)(
      jax.random.PRNGKey(0), (4, 3))))
  y = layers.trunc_normal(1.0)(jax.random.PRNGKey(0), (5,), jnp.bfloat16)
  assert y.dtype == jnp.bfloat16


def test_rms_norm_float32_math_no_scale():
  x = _normal((4, 5, 64), 0, scale=30.0)
  got = layers.rms_norm(x, 1e-5)
  np.testing.assert_allclose(np.asarray(got), _np_rms(x), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
      np.sqrt(np.mean(np.asarray(got) ** 2, -1)), 1.0, rtol=1e-4)
  # bf16 in, bf16 out, but the math is float32 (then one rounding).
  xb = x.astype(jnp.bfloat16)
  gotb = layers.rms_norm(xb, 1e-5)
  assert gotb.dtype == jnp.bfloat16
  want = jnp.asarray(_np_rms(np.asarray(xb.astype(jnp.float32))),
                     jnp.float32).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(gotb, np.float32),
                                np.asarray(want, np.float32))
  # eps is inside the square root.
  small = jnp.full((1, 4), 1e-3, jnp.float32)
  np.testing.assert_allclose(np.asarray(layers.rms_norm(small, 1e-5)),
                             1e-3 / np.sqrt(1e-6 + 1e-5), rtol=1e-5)


def _np_rope(x, theta):
  x = np.asarray(x, np.float64)
  _, seq, _, dim = x.shape
  inv = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
  freqs = np.outer(np.arange(seq), inv)
  emb = np.concatenate([freqs, freqs], -1)
  cos, sin = np.cos(emb)[None, :, None], np.sin(emb)[None, :, None]
  x1, x2 = x[..., :dim // 2], x[..., dim // 2:]
  return x * cos + np.concatenate([-x2, x1], -1) * sin


def test_apply_rope_matches_rotate_half():
  x = _normal((2, 10, 3, 8), 3)
  cos, sin = layers.rope_tables(10, 8, 10000.0)
  assert cos.shape == sin.shape == (10, 8)
  got = layers.apply_rope(x, cos, sin)
  np.testing.assert_allclose(np.asarray(got), _np_rope(x, 10000.0),
                             rtol=1e-5, atol=1e-5)
  # Position 0 is unrotated; norms are preserved.
  np.testing.assert_allclose(np.asarray(got[:, 0]), np.asarray(x[:, 0]),
                             atol=1e-6)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(got), axis=-1),
                             np.linalg.norm(np.asarray(x), axis=-1), rtol=1e-5)
  xb = x.astype(jnp.bfloat16)
  assert layers.apply_rope(xb, cos, sin).dtype == jnp.bfloat16


def test_rope_scores_depend_on_relative_position():
  q = np.broadcast_to(np.asarray(_normal((1, 1, 1, 8), 4)), (1, 12, 1, 8))
  k = np.broadcast_to(np.asarray(_normal((1, 1, 1, 8), 5)), (1, 12, 1, 8))
  cos, sin = layers.rope_tables(12, 8, 100.0)
  rq = np.asarray(layers.apply_rope(jnp.asarray(q), cos, sin))[0, :, 0]
  rk = np.asarray(layers.apply_rope(jnp.asarray(k), cos, sin))[0, :, 0]
  np.testing.assert_allclose(rq[3] @ rk[1], rq[9] @ rk[7], rtol=1e-4)
  assert abs(rq[3] @ rk[1] - rq[3] @ rk[2]) > 1e-3


def _block(mlp_t, seed=0):
  cfg = _cfg(mlp_t=mlp_t, pos_encodings="none" if mlp_t else "rope")
  block = trm.Block(cfg)
  h = _normal((3, cfg.total_len, cfg.hidden_size), seed)
  rope = (None if mlp_t else layers.rope_tables(
      cfg.total_len, cfg.hidden_size // cfg.num_heads, cfg.rope_theta))
  params = jax.jit(lambda h: nn.meta.unbox(
      block.init(jax.random.PRNGKey(seed), h, rope)))(h)
  return cfg, block, params, h, rope


def test_block_mlp_t_norms_over_tokens():
  cfg, block, params, h, rope = _block(mlp_t=True)
  p = params["params"]
  assert set(p) == {"mlp_t", "mlp"}  # no norm scales, no attention
  got = np.asarray(jax.jit(block.apply)(params, h, rope))
  t = np.swapaxes(np.asarray(h, np.float64), 1, 2)  # [B, D, S]
  t = _np_rms(t + _np_swiglu(t, p["mlp_t"]))          # over tokens
  x = np.swapaxes(t, 1, 2)
  want = _np_rms(x + _np_swiglu(x, p["mlp"]))
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
  # Normalising the token mixer over D instead gives something else.
  wrong_x = _np_rms(np.asarray(h) + np.swapaxes(
      _np_swiglu(np.swapaxes(np.asarray(h), 1, 2), p["mlp_t"]), 1, 2))
  wrong = _np_rms(wrong_x + _np_swiglu(wrong_x, p["mlp"]))
  assert np.abs(got - wrong).max() > 1e-2


def test_block_attention_matches_reference():
  cfg, block, params, h, rope = _block(mlp_t=False, seed=1)
  p = params["params"]
  assert set(p) == {"self_attn", "mlp"}
  got = np.asarray(jax.jit(block.apply)(params, h, rope))
  x = np.asarray(h, np.float64)
  bsz, seq, d = x.shape
  heads, hd = cfg.num_heads, d // cfg.num_heads
  qkv = (x @ np.asarray(p["self_attn"]["qkv_proj"]["kernel"], np.float64))
  qkv = qkv.reshape(bsz, seq, 3 * heads, hd)
  q, k, v = qkv[:, :, :heads], qkv[:, :, heads:2 * heads], qkv[:, :, 2 * heads:]
  q, k = _np_rope(q, cfg.rope_theta), _np_rope(k, cfg.rope_theta)
  scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
  probs = np.exp(scores - scores.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  attn = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(bsz, seq, d)
  attn = attn @ np.asarray(p["self_attn"]["o_proj"]["kernel"], np.float64)
  x = _np_rms(x + attn)
  want = _np_rms(x + _np_swiglu(x, p["mlp"]))
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_gpu_attention_splits_the_projection_into_three_matmuls(
    monkeypatch):
  """attention='cudnn' runs q, k and v as three matmuls on qkv_proj's
  column blocks: the same parameters, values and gradients as the fused
  projection (cuDNN's call is XLA's attention here, on a CPU), and no
  [.., 3D] product in the program."""
  from trm.nn import attention as attention_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(attention_lib, "cudnn_attention",
                      lambda q, k, v: jax.nn.dot_product_attention(q, k, v))
  x = jax.random.normal(jax.random.key(0), (2, 8, 64))
  rope = layers.rope_tables(8, 16, 10000.0)
  attn = {kernel: layers.Attention(64, 4, 4, jnp.float32, kernel)
          for kernel in ("dot", "cudnn")}
  # Jitted, and the cudnn init only traced for its shapes: one compile per
  # program instead of one per op (eager), a third of the test's time.
  params = jax.jit(attn["dot"].init)(jax.random.key(1), x, rope)
  assert (jax.tree.map(lambda a: a.shape, jax.eval_shape(
      attn["cudnn"].init, jax.random.key(1), x, rope))
          == jax.tree.map(jnp.shape, params))

  def loss(params, kernel):
    return jnp.sum(jnp.sin(attn[kernel].apply(params, x, rope)))

  grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
  want, want_grad = grad(params, "dot")
  got, got_grad = grad(params, "cudnn")
  np.testing.assert_allclose(got, want, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  text = jax.jit(lambda p: attn["cudnn"].apply(p, x, rope)).lower(
      params).as_text()
  assert "2x8x192" not in text and "16x192" not in text
  with pytest.raises(ValueError, match="do not split it"):
    layers.Linear(8, (None, None)).init(jax.random.key(0), x, [4, 3])


def test_reasoning_net_injects_once():
  cfg = _cfg(L_layers=2)
  net = trm.ReasoningNet(cfg)
  h = _normal((3, cfg.total_len, cfg.hidden_size), 2)
  inj = _normal(h.shape, 7)
  rope = layers.rope_tables(cfg.total_len, cfg.hidden_size // cfg.num_heads,
                            cfg.rope_theta)

  @jax.jit
  def run(h, inj):
    params = nn.meta.unbox(net.init(jax.random.PRNGKey(3), h, inj, rope))
    x = h + inj
    for i in range(cfg.L_layers):
      x = trm.Block(cfg).apply(
          {"params": params["params"][f"layers_{i}"]}, x, rope)
    return net.apply(params, h, inj, rope), x, params

  got, want, params = run(h, inj)
  assert set(params["params"]) == {"layers_0", "layers_1"}
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("field, value, needle", [
    ("forward_dtype", "int8", "forward_dtype='int8': use one of bfloat16"),
    ("forward_dtype", "float16", "loss scaling"),
    ("hidden_size", 0, "hidden_size=0 must be >= 1"),
    ("num_heads", 0, "num_heads=0 must be >= 1"),
    ("expansion", 0.0, "expansion=0.0 must be a finite number > 0"),
    ("expansion", 0.001, "SwiGLU no inner width"),
    ("halt_exploration_prob", 1.5, "must be in [0, 1]"),
    ("halt_exploration_prob", float("nan"), "must be in [0, 1]"),
    ("rope_theta", -1.0, "rope_theta=-1.0 must be a finite number > 0"),
    ("rms_norm_eps", float("inf"), "rms_norm_eps=inf must be a finite"),
    ("puzzle_emb_len", -1, "puzzle_emb_len=-1 must be >= 0"),
    ("puzzle_emb_ndim", -2, "puzzle_emb_ndim=-2 must be >= 0"),
])
def test_config_refuses_values_it_cannot_train(field, value, needle):
  with pytest.raises(ValueError, match=re.escape(f"config.model.{field}=")):
    _cfg(**{field: value})
  with pytest.raises(ValueError, match=re.escape(needle)):
    _cfg(**{field: value})


def test_config_refuses_a_puzzle_vector_wider_than_its_prefix():
  # 64 values do not fit 1 position of 32: before, the first trace failed
  # with "index can't contain negative values".
  with pytest.raises(ValueError, match=re.escape(
      "config.model.puzzle_emb_ndim=64 does not fit the puzzle prefix of "
      "puzzle_emb_len=1 x hidden_size=32 values: raise puzzle_emb_len to >= "
      "2, or set it to 0")):
    _cfg(puzzle_emb_ndim=64, puzzle_emb_len=1)
  # A vector that fills its prefix, or one sized by puzzle_emb_len=0, runs.
  for kw in (dict(puzzle_emb_ndim=64, puzzle_emb_len=2),
             dict(puzzle_emb_ndim=48, puzzle_emb_len=0)):
    model, variables = _embed_model(**kw)
    x = model.apply(variables, jnp.zeros((2, model.cfg.seq_len), jnp.int32),
                    jnp.ones((2, kw["puzzle_emb_ndim"])),
                    method=trm.TRM._input_embeddings)
    assert x.shape == (2, model.cfg.seq_len + 2, 32)


def test_config_refuses_an_odd_head_dim_with_rope():
  # Head dim 33 (66 / 2): before, the first trace failed with "Incompatible
  # shapes for broadcasting: shapes=[(1, 22, 2, 33), (22, 1, 34)]".
  with pytest.raises(ValueError, match=re.escape(
      "config.model.hidden_size / num_heads (the head dim, 33) must be even "
      "for pos_encodings='rope'")):
    _cfg(hidden_size=66, puzzle_emb_ndim=66)
  # Without RoPE an odd head dim is fine, and mlp_t has no attention.
  _cfg(hidden_size=66, puzzle_emb_ndim=66, pos_encodings="learned")
  _cfg(hidden_size=66, puzzle_emb_ndim=66, mlp_t=True)


def test_mlp_t_runs_whatever_the_head_count():
  # MLP-t has no attention, so upstream trains hidden_size % num_heads != 0
  # (here 32 / 3) with RoPE on; before, the config refused it.
  model, variables = _model(mlp_t=True, num_heads=3, pos_encodings="rope")
  cfg = model.cfg

  @jax.jit  # one compile, not one per op (eager): most of the test's time
  def forward(variables, inputs, vectors):
    z_H, z_L = model.apply(variables, B, method=trm.TRM.initial_z)
    return model.apply(variables, z_H, z_L, inputs, vectors)

  out = forward(variables, _batch(cfg)["inputs"],
                _normal((B, cfg.puzzle_emb_ndim), 1))
  assert all(np.isfinite(np.asarray(a, np.float32)).all()
             for a in jax.tree.leaves(out))


# --------------------------------------------------------------- TRM forward


@pytest.mark.parametrize("mlp_t,dtype", [(False, "float32"),
                                         (True, "bfloat16")])
def test_forward_shapes(mlp_t, dtype):
  model, variables = _model(mlp_t=mlp_t, forward_dtype=dtype,
                            pos_encodings="none" if mlp_t else "rope")
  cfg = model.cfg
  batch = _batch(cfg)
  vectors = _normal((B, cfg.puzzle_emb_ndim), 1)

  @jax.jit
  def forward(variables, inputs, vectors):
    z_H, z_L = model.apply(variables, B, method=trm.TRM.initial_z)
    return model.apply(variables, z_H, z_L, inputs, vectors)

  new_zH, new_zL, logits, q_halt, q_cont = forward(variables, batch["inputs"],
                                                   vectors)
  assert new_zH.shape == new_zL.shape == (B, cfg.seq_len + 16, 32)
  assert new_zH.dtype == new_zL.dtype == jnp.dtype(dtype)
  assert logits.shape == (B, cfg.seq_len, cfg.vocab_size)
  assert q_halt.shape == q_cont.shape == (B,)
  assert q_halt.dtype == q_cont.dtype == jnp.float32
  # Fresh q_head: weight 0 and bias -5 on both outputs.
  np.testing.assert_allclose(np.asarray(q_halt), -5.0)
  np.testing.assert_allclose(np.asarray(q_cont), -5.0)
  assert np.all(np.isfinite(np.asarray(logits, np.float32)))
  # Rows differ (the recursion depends on the inputs).
  assert np.abs(np.asarray(logits[0] - logits[1], np.float32)).max() > 0


def test_input_embeddings_prefix():
  model, variables = _embed_model(pos_encodings="none")
  cfg = model.cfg
  inputs = _batch(cfg)["inputs"]
  vectors = _normal((B, 32), 2)
  x = np.asarray(model.apply(variables, inputs, vectors,
                             method=trm.TRM._input_embeddings))
  scale = math.sqrt(32)
  assert x.shape == (B, 22, 32)
  np.testing.assert_allclose(x[:, 0], scale * np.asarray(vectors), rtol=1e-6)
  assert not np.any(x[:, 1:16])
  table = np.asarray(variables["params"]["embed_tokens"]["embedding"])
  np.testing.assert_allclose(x[:, 16:], scale * table[np.asarray(inputs)],
                             rtol=1e-6)


def test_input_embeddings_wide_puzzle_vector():
  model, variables = _embed_model(pos_encodings="none", puzzle_emb_ndim=48)
  inputs = _batch(model.cfg)["inputs"]
  vectors = _normal((B, 48), 3)
  x = np.asarray(model.apply(variables, inputs, vectors,
                             method=trm.TRM._input_embeddings)) / math.sqrt(32)
  np.testing.assert_allclose(x[:, 0], np.asarray(vectors[:, :32]), rtol=1e-6)
  np.testing.assert_allclose(x[:, 1, :16], np.asarray(vectors[:, 32:]),
                             rtol=1e-6)
  assert not np.any(x[:, 1, 16:]) and not np.any(x[:, 2:16])


def test_input_embeddings_learned_positions():
  model, variables = _embed_model(pos_encodings="learned")
  inputs = _batch(model.cfg)["inputs"]
  vectors = _normal((B, 32), 4)
  x = np.asarray(model.apply(variables, inputs, vectors,
                             method=trm.TRM._input_embeddings))
  table = np.asarray(variables["params"]["embed_tokens"]["embedding"])
  pos = np.asarray(variables["params"]["embed_pos"])
  tokens = np.concatenate([np.pad(np.asarray(vectors)[:, None],
                                  ((0, 0), (0, 15), (0, 0))),
                           table[np.asarray(inputs)]], 1)
  np.testing.assert_allclose(
      x, math.sqrt(32) * 0.707106781 * (tokens + pos[None]), rtol=1e-5,
      atol=1e-6)


def test_no_puzzle_embedding():
  model, variables = _embed_model(puzzle_emb_ndim=0, pos_encodings="none")
  assert "puzzle_emb" not in variables
  assert model.cfg.total_len == model.cfg.seq_len == model.cfg.prefix_len + 6
  inputs = _batch(model.cfg)["inputs"]
  x = model.apply(variables, inputs, None, method=trm.TRM._input_embeddings)
  table = np.asarray(variables["params"]["embed_tokens"]["embedding"])
  np.testing.assert_allclose(np.asarray(x),
                             math.sqrt(32) * table[np.asarray(inputs)],
                             rtol=1e-6)


def test_prefix_len_hrm_behaviour():
  assert _cfg(puzzle_emb_len=0, puzzle_emb_ndim=32).prefix_len == 1
  assert _cfg(puzzle_emb_len=0, puzzle_emb_ndim=48).prefix_len == 2
  assert _cfg(puzzle_emb_len=16).total_len == 22
  assert _cfg(puzzle_emb_ndim=0).total_len == 6


def test_init_details():
  model, variables = _model()
  p = variables["params"]
  assert not np.any(np.asarray(p["q_head"]["kernel"]))
  np.testing.assert_array_equal(np.asarray(p["q_head"]["bias"]), [-5.0, -5.0])
  assert p["q_head"]["kernel"].dtype == jnp.float32
  assert "H_init" not in p and "L_init" not in p
  buffers = variables["buffers"]
  assert set(buffers) == {"H_init", "L_init"}
  assert buffers["H_init"].shape == (32,)
  assert buffers["H_init"].dtype == jnp.float32
  assert not np.array_equal(np.asarray(buffers["H_init"]),
                            np.asarray(buffers["L_init"]))
  table = variables["puzzle_emb"]["weights"]
  assert table.shape == (3, 32) and table.dtype == jnp.float32
  assert not np.any(np.asarray(table))
  for leaf in jax.tree.leaves(p):
    assert leaf.dtype == jnp.float32
  # LeCun fan-in std on a large kernel; token embedding std 1/sqrt(D).
  kernel = np.asarray(p["L_level"]["layers_0"]["mlp"]["gate_up_proj"]["kernel"])
  np.testing.assert_allclose(kernel.std(), 1 / math.sqrt(32), rtol=0.05)
  assert np.abs(kernel).max() <= 2 / math.sqrt(32) / 0.8796 + 1e-6
  down = np.asarray(p["L_level"]["layers_0"]["mlp"]["down_proj"]["kernel"])
  np.testing.assert_allclose(down.std(), 1 / math.sqrt(256), rtol=0.05)


def test_state_init_bf16_and_std_one():
  model = trm.TRM(_cfg(hidden_size=256, num_heads=2, L_layers=1,
                       forward_dtype="bfloat16", puzzle_emb_ndim=0))
  samples = []
  for seed in range(4):
    buffers = jax.jit(lambda k: nn.meta.unbox(
        trm.init_variables(model, k))["buffers"])(jax.random.PRNGKey(seed))
    assert buffers["H_init"].dtype == jnp.bfloat16
    assert buffers["L_init"].dtype == jnp.bfloat16
    samples += [np.asarray(buffers[n], np.float32) for n in buffers]
  x = np.concatenate(samples)
  assert x.size == 2048
  np.testing.assert_allclose(x.std(), 1.0, rtol=0.06)
  assert np.abs(x).max() <= 2 / 0.8796 + 0.02
  z_H, _ = model.apply({"buffers": buffers}, 2, method=trm.TRM.initial_z)
  assert z_H.dtype == jnp.bfloat16 and z_H.shape == (2, 6, 256)
  np.testing.assert_array_equal(np.asarray(z_H[1, 3], np.float32),
                                np.asarray(buffers["H_init"], np.float32))


# ------------------------------------------------------ gradient truncation


def _reference(model, variables, z_H, z_L, inputs, vectors, truncate=True):
  """H_cycles-1 cycles without gradient, then one with, by hand."""
  cfg = model.cfg
  params = variables["params"]
  x = model.apply(variables, inputs, vectors, method=trm.TRM._input_embeddings)
  rope = layers.rope_tables(cfg.total_len, cfg.hidden_size // cfg.num_heads,
                            cfg.rope_theta)
  net = trm.ReasoningNet(cfg)
  f = lambda h, inj: net.apply({"params": params["L_level"]}, h, inj, rope)

  def cycle(z_H, z_L):
    for _ in range(cfg.L_cycles):
      z_L = f(z_L, z_H + x)
    return f(z_H, z_L), z_L

  for _ in range(cfg.H_cycles - 1):
    z_H, z_L = cycle(z_H, z_L)
  if truncate:
    z_H, z_L = jax.lax.stop_gradient(z_H), jax.lax.stop_gradient(z_L)
  z_H, z_L = cycle(z_H, z_L)
  logits = (z_H @ params["lm_head"]["kernel"])[:, cfg.prefix_len:]
  q = z_H[:, 0] @ params["q_head"]["kernel"] + params["q_head"]["bias"]
  return z_H, z_L, logits, q[:, 0], q[:, 1]


def _scalar_loss(outputs, seed=11):
  weights = [_normal(o.shape, seed + i) for i, o in enumerate(outputs)]
  return sum(jnp.sum(o * w) for o, w in zip(outputs, weights))


def test_gradient_truncation_matches_reference():
  model, variables = _model()
  cfg = model.cfg
  assert cfg.H_cycles == 2 and cfg.L_cycles == 2
  variables = jax.tree.map(lambda x: x, variables)
  # A non-zero q head so that gradients flow from q into z_H.
  variables["params"]["q_head"]["kernel"] = _normal((32, 2), 5, 0.2)
  inputs = _batch(cfg)["inputs"]
  z_H = _normal((B, cfg.total_len, 32), 6)
  z_L = _normal((B, cfg.total_len, 32), 7)
  vectors = _normal((B, 32), 8)

  def model_loss(params, vectors, z_H, z_L):
    v = dict(variables, params=params)
    return _scalar_loss(model.apply(v, z_H, z_L, inputs, vectors))

  def ref_loss(params, vectors, z_H, z_L):
    v = dict(variables, params=params)
    return _scalar_loss(_reference(model, v, z_H, z_L, inputs, vectors))

  @jax.jit
  def both(*args):
    grad = lambda f: jax.value_and_grad(f, argnums=(0, 1, 2, 3))(*args)
    return grad(model_loss), grad(ref_loss)

  (got_val, got), (want_val, want) = both(variables["params"], vectors, z_H,
                                          z_L)
  np.testing.assert_allclose(float(got_val), float(want_val), rtol=1e-5)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    scale = float(np.abs(np.asarray(w)).max())
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4,
                               atol=2e-5 * max(scale, 1.0))
  # Nothing flows into the incoming carry: the first H cycle is truncated
  # (a full backward pass would give these a non-zero gradient).
  assert not np.any(np.asarray(got[2])) and not np.any(np.asarray(got[3]))
  assert np.abs(np.asarray(got[1])).max() > 1e-3  # puzzle vectors do learn
  layer = got[0]["L_level"]["layers_0"]["self_attn"]["qkv_proj"]["kernel"]
  assert np.abs(np.asarray(layer)).max() > 1e-3


# ----------------------------------------------------------------------- ACT


def _with_q_bias(variables, halt_bias):
  variables = jax.tree.map(lambda x: x, variables)
  variables["params"]["q_head"]["bias"] = jnp.asarray([halt_bias, -5.0],
                                                      jnp.float32)
  return variables


def _carry(cfg, halted, steps, seed=0):
  batch = _batch(cfg, seed=seed, batch=len(halted))
  shape = (len(halted), cfg.total_len, cfg.hidden_size)
  return trm.Carry(z_H=_normal(shape, seed + 100),
                   z_L=_normal(shape, seed + 200),
                   steps=jnp.asarray(steps, jnp.int32),
                   halted=jnp.asarray(halted, bool), **batch)


def test_empty_carry_all_halted():
  cfg = _cfg()
  carry = trm.empty_carry(cfg, 4)
  assert carry.z_H.shape == (4, 22, 32)
  assert np.all(np.asarray(carry.halted))
  assert np.all(np.asarray(carry.labels) == -100)


def test_reset_carry_swaps_only_halted_rows():
  model, variables = _model()
  cfg = model.cfg
  halted = [True, False, True, False, False, True, False, True]
  carry = _carry(cfg, halted, [2, 1, 3, 0, 2, 1, 1, 3], seed=0)
  new = _batch(cfg, seed=1)
  reset = trm.reset_carry(model, variables, carry, new)
  h = np.asarray(halted)
  h0 = np.asarray(variables["buffers"]["H_init"])
  l0 = np.asarray(variables["buffers"]["L_init"])
  z_H, z_L = np.asarray(reset.z_H), np.asarray(reset.z_L)
  assert np.all(z_H[h] == h0) and np.all(z_L[h] == l0)
  np.testing.assert_array_equal(z_H[~h], np.asarray(carry.z_H)[~h])
  np.testing.assert_array_equal(z_L[~h], np.asarray(carry.z_L)[~h])
  np.testing.assert_array_equal(np.asarray(reset.steps),
                                np.where(h, 0, [2, 1, 3, 0, 2, 1, 1, 3]))
  for key in ("inputs", "labels", "puzzle_identifiers"):
    got = np.asarray(getattr(reset, key))
    np.testing.assert_array_equal(got[h], np.asarray(new[key])[h])
    np.testing.assert_array_equal(got[~h], np.asarray(getattr(carry, key))[~h])
  np.testing.assert_array_equal(np.asarray(reset.halted), h)


_ACT_FNS = {}


def _jit_act(model, train):
  """act_step jitted once per (config, mode)."""
  key = (model.cfg, train)
  if key not in _ACT_FNS:
    _ACT_FNS[key] = jax.jit(lambda v, c, pv, rng: trm.act_step(
        model, v, c, pv, train=train, rng=rng))
  return _ACT_FNS[key]


def test_act_step_outputs_and_steps():
  model, variables = _model()
  cfg = model.cfg
  carry = trm.reset_carry(model, variables, trm.empty_carry(cfg, B),
                          _batch(cfg))
  vectors = _normal((B, 32), 9)
  new, outputs = _jit_act(model, True)(variables, carry, vectors,
                                       jax.random.PRNGKey(0))
  z_H, z_L, logits, q_halt, q_cont = jax.jit(model.apply)(
      variables, carry.z_H, carry.z_L, carry.inputs, vectors)
  np.testing.assert_allclose(np.asarray(new.z_H), np.asarray(z_H), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(new.z_L), np.asarray(z_L), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(np.asarray(outputs["logits"]), np.asarray(logits),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(outputs["q_halt_logits"]),
                             np.asarray(q_halt), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(outputs["q_continue_logits"]),
                             np.asarray(q_cont), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(new.steps), 1)
  # q_halt = -5 < 0, halt_max_steps = 3: nobody halts at step 1.
  assert not np.any(np.asarray(new.halted))
  for key in ("inputs", "labels", "puzzle_identifiers"):
    np.testing.assert_array_equal(np.asarray(getattr(new, key)),
                                  np.asarray(getattr(carry, key)))


@pytest.mark.parametrize("halt_bias", [-5.0, 5.0])
def test_eval_runs_exactly_halt_max_steps(halt_bias):
  model, variables = _model()
  assert model.cfg.halt_max_steps == 3
  variables = _with_q_bias(variables, halt_bias)
  cfg = model.cfg
  carry = trm.reset_carry(model, variables, trm.empty_carry(cfg, B),
                          _batch(cfg))
  vectors = _normal((B, 32), 9)
  step = _jit_act(model, False)
  for i in range(1, 4):
    carry, outputs = step(variables, carry, vectors, None)
    np.testing.assert_array_equal(np.asarray(carry.steps), i)
    np.testing.assert_array_equal(np.asarray(carry.halted), i == 3)
    np.testing.assert_allclose(np.asarray(outputs["q_halt_logits"]),
                               halt_bias)


def test_train_halts_on_q_without_exploration():
  model, variables = _model()
  assert model.cfg.halt_exploration_prob == 0.0
  cfg = model.cfg
  before = [0, 1, 2, 0, 1, 2, 0, 1]
  carry = _carry(cfg, [False] * B, before)
  vectors = _normal((B, 32), 9)
  act = _jit_act(model, True)
  # q_halt > 0: every row halts at once (min_halt is 0).
  new, _ = act(_with_q_bias(variables, 5.0), carry, vectors,
               jax.random.PRNGKey(0))
  assert np.all(np.asarray(new.halted))
  np.testing.assert_array_equal(np.asarray(new.steps), np.add(before, 1))
  # q_halt < 0: only rows reaching halt_max_steps = 3 halt.
  new, _ = act(_with_q_bias(variables, -5.0), carry, vectors,
               jax.random.PRNGKey(0))
  np.testing.assert_array_equal(np.asarray(new.halted), np.equal(before, 2))


def test_train_exploration_holds_rows():
  model, variables = _model(halt_exploration_prob=1.0)
  cfg = model.cfg
  before = np.array([0, 1, 2, 1] * 4)
  carry = _carry(cfg, [False] * 16, before)
  vectors = _normal((16, 32), 9)
  act = _jit_act(model, True)
  halting = _with_q_bias(variables, 5.0)
  halted = np.stack([
      np.asarray(act(halting, carry, vectors, jax.random.PRNGKey(seed))[0]
                 .halted) for seed in range(20)])  # [seed, row]
  # min_halt is uniform in {2, 3}: step 1 is always held even though q > 0,
  # step 3 (= halt_max_steps) always halts, step 2 halts half of the time.
  assert not np.any(halted[:, before == 0])
  assert np.all(halted[:, before == 2])
  frac = halted[:, before == 1].mean()
  assert 0.3 < frac < 0.7, frac
  # Exploration never makes a row halt: with q < 0 only step 3 halts.
  new, _ = act(_with_q_bias(variables, -5.0), carry, vectors,
               jax.random.PRNGKey(0))
  np.testing.assert_array_equal(np.asarray(new.halted), before == 2)


def test_streaming_act():
  """Rows that did not halt keep their data when a new batch arrives."""
  model, variables = _model()
  cfg = model.cfg
  first, second = _batch(cfg, seed=1), _batch(cfg, seed=2)
  act = _jit_act(model, True)
  carry = trm.reset_carry(model, variables, trm.empty_carry(cfg, B), first)
  vectors = jnp.zeros((B, 32))
  for i in range(1, 3):
    carry, _ = act(variables, carry, vectors, jax.random.PRNGKey(i))
    assert not np.any(np.asarray(carry.halted))
    z_H = np.asarray(carry.z_H)
    carry = trm.reset_carry(model, variables, carry, second)
    np.testing.assert_array_equal(np.asarray(carry.inputs),
                                  np.asarray(first["inputs"]))
    np.testing.assert_array_equal(np.asarray(carry.z_H), z_H)
    np.testing.assert_array_equal(np.asarray(carry.steps), i)
  carry, _ = act(variables, carry, vectors, jax.random.PRNGKey(3))
  assert np.all(np.asarray(carry.halted))
  np.testing.assert_array_equal(np.asarray(carry.steps), 3)
  carry = trm.reset_carry(model, variables, carry, second)
  np.testing.assert_array_equal(np.asarray(carry.inputs),
                                np.asarray(second["inputs"]))
  np.testing.assert_array_equal(np.asarray(carry.steps), 0)


def test_remat_gives_identical_loss_and_gradients():
  """model.remat only trades memory for recompute."""
  results = []
  variables = None
  for remat in (False, True):
    # One block per cycle: remat wraps each block alike, and the two
    # programs compile in about half the time of two blocks'.
    cfg = trm.TRMConfig(vocab_size=11, seq_len=81, num_puzzle_identifiers=1,
                        hidden_size=32, num_heads=2, H_cycles=2, L_cycles=2,
                        L_layers=1, puzzle_emb_ndim=32,
                        forward_dtype="float32", remat=remat)
    model = trm.TRM(cfg)
    if variables is None:
      # One jitted init (eager, each took most of the test's time) serves
      # both: remat adds no variables, and the remat model's apply fails
      # if it names them otherwise.
      variables = jax.jit(lambda model=model: nn.meta.unbox(
          trm.init_variables(model, jax.random.PRNGKey(0))))()
    batch = {"inputs": jnp.arange(4 * 81).reshape(4, 81) % 11,
             "labels": jnp.ones((4, 81), jnp.int32),
             "puzzle_identifiers": jnp.zeros((4,), jnp.int32)}
    carry = trm.reset_carry(model, variables, trm.empty_carry(cfg, 4), batch)

    def loss(params):
      _, out = trm.act_step(model, {**variables, "params": params}, carry,
                            jnp.ones((4, 32)), train=False)
      return jnp.sum(out["logits"] ** 2)

    results.append(jax.jit(jax.value_and_grad(loss))(variables["params"]))
  (value, grads), (value_remat, grads_remat) = results
  np.testing.assert_allclose(value, value_remat, rtol=1e-6)
  # The recomputed forward may be fused, and so rounded, differently: an
  # element is equal up to float32 rounding of its tensor's largest terms
  # (XLA:CPU's loop emitters, tests/conftest.py, moved a 0.38 of a tensor
  # reaching 108 by 8e-6).
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_remat)):
    scale = float(np.max(np.abs(a)))
    np.testing.assert_allclose(a, b, rtol=1e-5,
                               atol=max(1e-6, 4 * 2**-23 * scale))
