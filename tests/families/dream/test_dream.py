"""Dream / DiffuCoder model: sizes, layouts, masking, scan/remat equivalence."""
import dataclasses
import functools
import importlib.util
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
import repo

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.families.dream import model as dream
from trm.families.dream import sampling as diffusion_sampling
from trm.nn import platform as platform_lib

_ROOT = repo.ROOT

# The default rules plus the names the Dream params add (all unsharded).
RULES = config_lib.default_logical_axis_rules() + (
    ("kv_heads", None), ("head_dim", None), ("layers", None))


def _config_module():
  spec = importlib.util.spec_from_file_location(
      "diffucoder_7b", os.path.join(_ROOT, "configs", "diffucoder_7b.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def tiny(**overrides):
  cfg = dream.DreamConfig.from_config(_config_module().get_config("tiny").model)
  return dataclasses.replace(cfg, **overrides)


def _tokens(batch=2, length=12, seed=0, vocab=512):
  return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab,
                            jnp.int32)


def _init(cfg, tokens=None):
  del tokens  # param shapes do not depend on them
  return _init_cached(cfg)


@functools.lru_cache(maxsize=None)
def _init_cached(cfg):
  init = jax.jit(dream.Dream(cfg).init)
  return nn.meta.unbox(init(jax.random.key(1), jnp.zeros((1, 4), jnp.int32)))


def _apply(cfg, variables, *args, method=None):
  """Jitted apply: eager scan/remat dispatch is slow on CPU."""
  return _jitted_apply(cfg, method)(variables, *args)


@functools.lru_cache(maxsize=None)
def _jitted_apply(cfg, method):
  """One jitted function per (config, method): calls with the shapes of an
  earlier call (several tests run the same forward) reuse its compile."""
  return jax.jit(lambda v, *a: dream.Dream(cfg).apply(v, *a, method=method))


def test_param_count_7b_without_allocation():
  cfg = dream.DreamConfig()
  assert dream.param_count(cfg) == 7_615_616_512
  shapes = nn.meta.unbox(dream.abstract_params(cfg))
  per_layer = sum(int(np.prod(x.shape[1:]))
                  for x in jax.tree.leaves(shapes["layers"]))
  assert per_layer == 233_057_792
  assert shapes["embed_tokens"].shape == (152064, 3584)
  assert shapes["lm_head"]["kernel"].shape == (3584, 152064)
  attn = shapes["layers"]["self_attn"]
  assert attn["q_proj"]["kernel"].shape == (28, 3584, 28, 128)
  assert attn["k_proj"]["kernel"].shape == (28, 3584, 4, 128)
  assert attn["v_proj"]["bias"].shape == (28, 4, 128)
  assert attn["o_proj"]["kernel"].shape == (28, 28, 128, 3584)
  assert "bias" not in attn["o_proj"]


def test_config_file_variants():
  module = _config_module()
  big = module.get_config("")
  assert dream.DreamConfig.from_config(big.model) == dream.DreamConfig()
  assert big.seq_len == 2048 and big.optim.lr == 1e-5
  assert (big.mesh.data, big.mesh.fsdp, big.mesh.model) == (1, -1, 1)
  with pytest.raises(ValueError, match="Unknown config variant"):
    module.get_config("huge")
  # Both size the model: together, one would silently replace the other.
  with pytest.raises(ValueError, match="one of the variants 'tiny' and '1b'"):
    module.get_config("tiny,1b")


@pytest.mark.parametrize("field,value", [
    ("num_key_value_heads", 3), ("remat", "some"), ("dtype", "float64"),
    ("remat_save", "query_proj"), ("remat_offload", "layer_input"),
    ("param_dtype", "float16"),
    ("mask_token_id", 600), ("hidden_size", 65)])
def test_config_validation_names_field(field, value):
  with pytest.raises(ValueError, match=f"config.model.{field}"):
    tiny(**{field: value})
  with pytest.raises(ValueError, match="does not know"):
    dream.DreamConfig.from_config({"name": "dream", "hidden": 3})


def test_logical_axes_and_dtypes():
  cfg = tiny()
  boxed = dream.abstract_params(cfg)
  specs = nn.get_partition_spec(boxed)
  assert tuple(specs["layers"]["self_attn"]["q_proj"]["kernel"]) == (
      "layers", "embed", "heads", "head_dim")
  assert tuple(specs["layers"]["self_attn"]["k_proj"]["kernel"]) == (
      "layers", "embed", "kv_heads", "head_dim")
  assert tuple(specs["layers"]["self_attn"]["o_proj"]["kernel"]) == (
      "layers", "heads", "head_dim", "embed")
  assert tuple(specs["layers"]["mlp"]["down_proj"]["kernel"]) == (
      "layers", "mlp", "embed")
  assert tuple(specs["embed_tokens"]) == ("vocab", "embed")
  assert tuple(specs["lm_head"]["kernel"]) == ("embed", "vocab")
  leaves = jax.tree.leaves(nn.meta.unbox(boxed))
  assert all(x.dtype == jnp.float32 for x in leaves)
  bf = nn.meta.unbox(dream.abstract_params(tiny(param_dtype="bfloat16")))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(bf))
  # Norm weights start at one.
  params = _init(cfg, _tokens())["params"]
  np.testing.assert_array_equal(params["norm"]["scale"], 1.0)
  # Compute dtype follows config.model.dtype.
  cfg16 = tiny(dtype="bfloat16")
  logits = _apply(cfg16, _init(cfg16, _tokens()), _tokens())
  assert logits.shape == (2, 12, 512) and logits.dtype == jnp.bfloat16


def test_scan_equals_unrolled():
  cfg = tiny()
  tokens = _tokens()
  variables = _init(cfg, tokens)
  scanned = _apply(cfg, variables, tokens)
  flat = tiny(scan_layers=False)
  unrolled_vars = {"params": dream.unstack_layers(variables["params"], 2)}
  assert (jax.tree.structure(unrolled_vars)
          == jax.tree.structure(_init(flat, tokens)))
  unrolled = _apply(flat, unrolled_vars, tokens)
  np.testing.assert_allclose(scanned, unrolled, atol=1e-6, rtol=1e-6)


def test_sampler_on_a_gpu_unstacks_the_layers_once_and_samples_the_same():
  """On a GPU platform the denoiser's `prepare` unstacks a scanned model's
  layers before the step loop (no per-step weight copies there); the
  tokens are those of the scanned model. Elsewhere the params pass as
  given. Traced here on the CPU with the platform set as a GPU mesh's
  ShardingContext sets it."""
  cfg = tiny()  # float32: XLA orders a scan's and a loop's sums alike
  params = _init(cfg)["params"]
  on_cpu = dream.denoiser(cfg)
  assert on_cpu.prepare is None and dream.denoiser(cfg, "tpu") is on_cpu
  with platform_lib.mesh_platform("cuda"):
    on_gpu = dream.denoiser(cfg)
  assert on_gpu.prepare is not None and on_gpu is dream.denoiser(cfg, "cuda")
  flat = on_gpu.prepare(params)
  assert "layers" not in flat and f"layers_{cfg.num_hidden_layers - 1}" in flat
  ids = _tokens(batch=2, length=6, vocab=cfg.mask_token_id)
  kwargs = dict(params=params, mask_token_id=cfg.mask_token_id,
                max_new_tokens=8, steps=4, alg="entropy", top_k=None)

  def loops(denoiser) -> int:  # while loops in the lowered sampling program
    return diffusion_sampling.lower_generate(
        denoiser, jax.ShapeDtypeStruct(ids.shape, jnp.int32), None,
        **kwargs).as_text().count("stablehlo.while")

  assert loops(on_gpu) == loops(on_cpu) - 1  # no layer scan in the steps
  scanned, unstacked = (
      diffusion_sampling.diffusion_generate(d, ids, None, rng=jax.random.key(0),
                                            **kwargs)
      for d in (on_cpu, on_gpu))
  np.testing.assert_array_equal(np.asarray(unstacked), np.asarray(scanned))


class _Gpu:
  def __init__(self, limit):
    self.limit = limit

  def memory_stats(self):
    return {"bytes_limit": self.limit}


def test_sampler_keeps_the_stack_where_two_copies_would_crowd_the_gpu(
    monkeypatch):
  cfg = tiny()
  weights = dream.param_count(cfg) * 4  # float32
  monkeypatch.setattr(jax, "local_devices", lambda: [_Gpu(3 * weights)])
  assert dream.denoiser(cfg, "cuda").prepare is None
  monkeypatch.setattr(jax, "local_devices", lambda: [_Gpu(4 * weights)])
  assert dream.denoiser(cfg, "cuda").prepare is not None
  # Spread over two GPUs, each holds half of each copy.
  monkeypatch.setattr(jax, "local_devices",
                      lambda: [_Gpu(2 * weights), _Gpu(2 * weights)])
  assert dream.denoiser(cfg, "cuda").prepare is not None


def test_remat_identical_values_and_grads():
  tokens = _tokens()
  variables = _init(tiny(), tokens)

  def loss(params, cfg):
    return jnp.mean(dream.Dream(cfg).apply({"params": params}, tokens) ** 2)

  for scan in (True, False):
    params = (variables["params"] if scan
              else dream.unstack_layers(variables["params"], 2))
    full = tiny(remat="full", scan_layers=scan)
    none = tiny(remat="none", scan_layers=scan)
    v1, g1 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, full)
    v2, g2 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, none)
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6,
                                                         rtol=1e-5), g1, g2)


def test_remat_policies_recompute_and_offload_what_they_name():
  """remat='minimal' and 'custom' (MaxText's, trm/nn/remat.py) in the
  scanned stack: 'custom' gives full remat's values and gradients while it
  keeps q and k and offloads v and the layer input; 'minimal' (or 'custom'
  keeping `weight_matmul`) recomputes only attention's two batched dots of
  full's eight recomputed dots a layer; keeping or offloading q, k and v
  spares their three projections, out_proj and mlpwi the attention output's
  and the MLP's gate and up; each offloaded tensor is one device_put to
  the host a layer."""
  tokens = _tokens()
  params = _init(tiny(), tokens)["params"]

  def grad(cfg):
    return jax.value_and_grad(lambda p: jnp.mean(
        dream.Dream(cfg).apply({"params": p}, tokens) ** 2))

  def dots(cfg) -> int:  # a scan's body appears once in the text
    return jax.jit(grad(cfg)).lower(params).as_text().count(
        "stablehlo.dot_general")

  def to_host(cfg) -> int:
    return str(jax.make_jaxpr(grad(cfg))(params)).count(
        "devices=(MemorySpace.Host,)")

  full = tiny(remat="full")
  kept_and_offloaded = tiny(remat="custom", remat_save="query_proj,key_proj",
                            remat_offload="value_proj, decoder_layer_input")
  v1, g1 = jax.jit(grad(full))(params)
  v2, g2 = jax.jit(grad(kept_and_offloaded))(params)
  np.testing.assert_allclose(v2, v1, rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6,
                                                       rtol=1e-5), g2, g1)
  no_remat = dots(tiny(remat="none"))
  assert dots(full) - no_remat == 8
  assert dots(tiny(remat="minimal")) - no_remat == 2
  assert dots(tiny(remat="custom", remat_save="weight_matmul")) - no_remat == 2
  assert dots(kept_and_offloaded) - no_remat == 5
  assert to_host(kept_and_offloaded) == 2
  assert to_host(tiny(remat="custom", remat_offload=(
      "decoder_layer_input,query_proj,key_proj,value_proj"))) == 4
  # o_proj's output spares its matmul, gate's and up's (mlpwi, one name for
  # both, as MaxText's fused MLP) theirs; down's output is not needed.
  assert dots(tiny(remat="custom", remat_save="out_proj,mlpwi,mlpwo")
              ) - no_remat == 5
  assert to_host(tiny(remat="custom", remat_offload="out_proj,mlpwi")) == 3
  assert to_host(full) == 0


def test_left_padding_matches_unpadded():
  cfg = tiny()
  real = _tokens(batch=1, length=9, seed=3)
  variables = _init(cfg, real)
  ref = _apply(cfg, variables, real)
  pad = 4
  tokens = jnp.concatenate(
      [jnp.full((1, pad), cfg.pad_token_id, jnp.int32), real], axis=1)
  mask = jnp.arange(tokens.shape[1])[None] >= pad
  # Upstream tok_idx: cumsum(mask) - 1 with pads set to 1.
  positions = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 1)
  out = _apply(cfg, variables, tokens, mask, positions)
  assert not np.isnan(np.asarray(out)).any()
  np.testing.assert_allclose(out[:, pad:], ref, atol=1e-5, rtol=1e-5)
  # A fully-masked row (all pads) stays finite.
  none = _apply(cfg, variables, tokens, jnp.zeros_like(mask), positions)
  assert np.isfinite(np.asarray(none)).all()


def test_repeat_kv_order():
  x = jnp.arange(2 * 3).reshape(1, 1, 2, 3).astype(jnp.float32)
  y = dream.repeat_kv(x, 3)
  assert y.shape == (1, 1, 6, 3)
  for n in range(6):
    np.testing.assert_array_equal(y[0, 0, n], x[0, 0, n // 3])


def test_attention_matches_naive_gqa():
  """Each q-head n attends with kv-head n // groups (repeat, not tile)."""
  cfg = tiny(num_attention_heads=4, num_key_value_heads=2)
  b, l, d, h, kv, k = 2, 6, 64, 4, 2, 16
  x = jax.random.normal(jax.random.key(0), (b, l, d))
  pos = jnp.broadcast_to(jnp.arange(l), (b, l))
  cos, sin = dream.rope_cos_sin(pos, k, cfg.rope_theta, jnp.float32)
  attn = dream.Attention(cfg)
  # Jitted: op by op, each op of init, the perturbation and apply was a
  # compile of its own.
  params = nn.meta.unbox(jax.jit(attn.init)(jax.random.key(1), x, None, cos,
                                            sin))
  p = jax.jit(lambda params: {n: jax.tree.map(
      lambda a: a + 0.1 * jax.random.normal(jax.random.key(7), a.shape), v)
                              for n, v in params.items()})(params["params"])
  out = jax.jit(attn.apply)({"params": p}, x, None, cos, sin)

  def rope(t):
    t1, t2 = t[..., :k // 2], t[..., k // 2:]
    ang = np.asarray(pos, np.float64)[..., None] * (
        1.0 / cfg.rope_theta ** (np.arange(0, k, 2) / k))
    c, s = np.cos(ang)[:, :, None], np.sin(ang)[:, :, None]
    return np.concatenate([t1 * c - t2 * s, t2 * c + t1 * s], axis=-1)

  xn = np.asarray(x, np.float64)
  proj = lambda n: (np.einsum("bld,dhk->blhk", xn, p[n]["kernel"])  # noqa
                    + np.asarray(p[n]["bias"]))
  q, kk, vv = rope(proj("q_proj")), rope(proj("k_proj")), proj("v_proj")
  heads = []
  for n in range(h):
    s = np.einsum("bqk,bsk->bqs", q[:, :, n], kk[:, :, n // (h // kv)])
    s = s / np.sqrt(k)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    heads.append(np.einsum("bqs,bsk->bqk", w, vv[:, :, n // (h // kv)]))
  ref = np.einsum("blhk,hkd->bld", np.stack(heads, 2), p["o_proj"]["kernel"])
  np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)


def test_bidirectional():
  cfg = tiny()
  tokens = _tokens(batch=1, length=10)
  variables = _init(cfg, tokens)
  a = _apply(cfg, variables, tokens)
  b = _apply(cfg, variables, tokens.at[0, -1].set((tokens[0, -1] + 1) % 512))
  assert np.abs(np.asarray(a[0, 0] - b[0, 0])).max() > 1e-4


def test_hidden_then_selected_logits():
  cfg = tiny()
  tokens = _tokens()
  variables = _init(cfg, tokens)
  full = _apply(cfg, variables, tokens)
  h = _apply(cfg, variables, tokens, method="hidden")
  assert h.shape == (2, 12, 64)
  picked = _apply(cfg, variables, h[jnp.array([0, 1]), jnp.array([3, 7])],
                       method="logits_from_hidden")
  np.testing.assert_allclose(picked, full[jnp.array([0, 1]),
                                          jnp.array([3, 7])], atol=1e-6)


def test_sharded_forward_matches():
  cfg = tiny()
  tokens = _tokens(batch=4)
  variables = _init(cfg, tokens)
  ref = _apply(cfg, variables, tokens)
  model = dream.Dream(cfg)
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  shardings = mesh_lib.tree_shardings(mesh, RULES, dream.abstract_params(cfg))
  assert shardings["layers"]["mlp"]["gate_proj"]["kernel"].spec == P(
      None, "fsdp", "model")
  params = jax.device_put(variables["params"], shardings)
  with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
    out = jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens)
  np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
