"""Upstream PyTorch checkpoint import/export: round trip, parity, errors.

The parity reference below is a small re-implementation of upstream TRM's
forward pass in torch, written from the TRM spec (section 1, not from upstream
code): its modules carry upstream's attribute names so that its
`state_dict()` has upstream's keys, and it shares no code with trm/models.
"""
import math
import os
import pickle
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch import nn as tnn
from torch.nn import functional as F

from trm.families.trm import torch_import
from trm.families.trm import torch_layout
from trm.families.trm import model as trm
from trm.core import weights_io
from trm.core.weights_io import CheckpointError

B = 3
PREFIXES = ("", "inner.", "model.inner.", "_orig_mod.model.inner.")


def _cfg(**kw):
  base = dict(vocab_size=10, seq_len=16, num_puzzle_identifiers=5,
              hidden_size=32, num_heads=2, expansion=4.0, L_layers=2,
              H_cycles=2, L_cycles=2, halt_max_steps=4,
              halt_exploration_prob=0.0, puzzle_emb_ndim=32,
              puzzle_emb_len=4, pos_encodings="rope", mlp_t=False,
              forward_dtype="float32")
  base.update(kw)
  return trm.TRMConfig(**base)


VARIANTS = {
    "rope": dict(),
    "learned_wide_puzzle": dict(pos_encodings="learned", puzzle_emb_ndim=48),
    "mlp_t": dict(mlp_t=True, pos_encodings="none"),
}


# ----------------------------------------------------- upstream reference


def _ref_rms(x, eps=1e-5):
  x32 = x.float()
  return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(
      x.dtype)


def _ref_width(d, expansion):
  """ceil_to_256(round(expansion * d * 2 / 3)), Python's round."""
  n = round(expansion * d * 2 / 3)
  return -(-n // 256) * 256


def _rotate_half(x):
  x1, x2 = x.chunk(2, dim=-1)
  return torch.cat((-x2, x1), dim=-1)


class _Linear(tnn.Module):
  """Upstream CastedLinear's state: weight [out, in] (+ bias)."""

  def __init__(self, fan_in, fan_out, bias=False):
    super().__init__()
    self.weight = tnn.Parameter(torch.randn(fan_out, fan_in)
                                / math.sqrt(fan_in))
    self.bias = tnn.Parameter(0.5 * torch.randn(fan_out)) if bias else None

  def forward(self, x):
    return F.linear(x, self.weight, self.bias)


class _Embedding(tnn.Module):

  def __init__(self, n, d):
    super().__init__()
    self.embedding_weight = tnn.Parameter(torch.randn(n, d) / math.sqrt(d))


class _SwiGLU(tnn.Module):

  def __init__(self, d, expansion):
    super().__init__()
    inter = _ref_width(d, expansion)
    self.gate_up_proj = _Linear(d, 2 * inter)
    self.down_proj = _Linear(inter, d)

  def forward(self, x):
    gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
    return self.down_proj(F.silu(gate) * up)


class _Attention(tnn.Module):

  def __init__(self, d, heads):
    super().__init__()
    self.heads, self.head_dim = heads, d // heads
    self.qkv_proj = _Linear(d, 3 * d)
    self.o_proj = _Linear(d, d)

  def forward(self, x, cos_sin):
    b, s, d = x.shape
    h = self.heads
    qkv = self.qkv_proj(x).view(b, s, 3 * h, self.head_dim)
    q, k, v = qkv[:, :, :h], qkv[:, :, h:2 * h], qkv[:, :, 2 * h:]
    if cos_sin is not None:
      cos, sin = cos_sin[0][:, None], cos_sin[1][:, None]  # [s, 1, hd]
      q = q * cos + _rotate_half(q) * sin
      k = k * cos + _rotate_half(k) * sin
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=False)
    return self.o_proj(out.transpose(1, 2).reshape(b, s, d))


class _Block(tnn.Module):
  """Post-norm; the mlp_t token mixer normalises over the token axis."""

  def __init__(self, cfg, tokens):
    super().__init__()
    self.mlp_t_variant = cfg.mlp_t
    if cfg.mlp_t:
      self.mlp_t = _SwiGLU(tokens, cfg.expansion)
    else:
      self.self_attn = _Attention(cfg.hidden_size, cfg.num_heads)
    self.mlp = _SwiGLU(cfg.hidden_size, cfg.expansion)

  def forward(self, h, cos_sin):
    if self.mlp_t_variant:
      t = h.transpose(1, 2)
      t = _ref_rms(t + self.mlp_t(t))
      h = t.transpose(1, 2)
    else:
      h = _ref_rms(h + self.self_attn(h, cos_sin))
    return _ref_rms(h + self.mlp(h))


class _Reasoning(tnn.Module):

  def __init__(self, cfg, tokens):
    super().__init__()
    self.layers = tnn.ModuleList(_Block(cfg, tokens)
                                 for _ in range(cfg.L_layers))

  def forward(self, h, injection, cos_sin):
    h = h + injection
    for layer in self.layers:
      h = layer(h, cos_sin)
    return h


class _PuzzleEmb(tnn.Module):

  def __init__(self, n, dim):
    super().__init__()
    self.register_buffer("weights", torch.randn(n, dim))


class _Inner(tnn.Module):
  """Upstream's inner model: states, embeddings, one shared net, heads."""

  def __init__(self, cfg):
    super().__init__()
    self.cfg = cfg
    d, p = cfg.hidden_size, cfg.puzzle_emb_ndim
    self.prefix = (0 if p <= 0 else cfg.puzzle_emb_len
                   or -(-p // d))
    self.tokens = cfg.seq_len + self.prefix
    self.register_buffer("H_init", torch.randn(d).to(torch.bfloat16))
    self.register_buffer("L_init", torch.randn(d).to(torch.bfloat16))
    self.embed_tokens = _Embedding(cfg.vocab_size, d)
    self.lm_head = _Linear(d, cfg.vocab_size)
    self.q_head = _Linear(d, 2, bias=True)
    if p > 0:
      self.puzzle_emb = _PuzzleEmb(cfg.num_puzzle_identifiers, p)
    if cfg.pos_encodings == "learned":
      self.embed_pos = _Embedding(self.tokens, d)
    self.L_level = _Reasoning(cfg, self.tokens)

  def rope(self):
    hd = self.cfg.hidden_size // self.cfg.num_heads
    inv = 1.0 / (self.cfg.rope_theta
                 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(self.tokens, dtype=torch.float32), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()

  def forward(self, inputs, puzzle_ids):
    cfg, d = self.cfg, self.cfg.hidden_size
    b = inputs.shape[0]
    x = self.embed_tokens.embedding_weight[inputs]
    if cfg.puzzle_emb_ndim > 0:
      vec = self.puzzle_emb.weights[puzzle_ids]
      vec = F.pad(vec, (0, self.prefix * d - cfg.puzzle_emb_ndim))
      x = torch.cat((vec.view(b, self.prefix, d), x), dim=1)
    if cfg.pos_encodings == "learned":
      x = 0.707106781 * (x + self.embed_pos.embedding_weight)
    x = math.sqrt(d) * x
    cos_sin = self.rope() if cfg.pos_encodings == "rope" else None
    z_H = self.H_init.float().expand(b, self.tokens, d)
    z_L = self.L_init.float().expand(b, self.tokens, d)
    for _ in range(cfg.H_cycles):
      for _ in range(cfg.L_cycles):
        z_L = self.L_level(z_L, z_H + x, cos_sin)
      z_H = self.L_level(z_H, z_L, cos_sin)
    logits = self.lm_head(z_H)[:, self.prefix:]
    q = self.q_head(z_H[:, 0]).float()
    return logits, q[..., 0], q[..., 1]


class _ACT(tnn.Module):

  def __init__(self, cfg):
    super().__init__()
    self.inner = _Inner(cfg)


class _LossHead(tnn.Module):

  def __init__(self, cfg):
    super().__init__()
    self.model = _ACT(cfg)

  def forward(self, inputs, puzzle_ids):
    return self.model.inner(inputs, puzzle_ids)


def _reference(cfg, seed=0):
  torch.manual_seed(seed)
  return _LossHead(cfg).eval()


# ----------------------------------------------------------------- helpers


def _batch(cfg, seed=0):
  rng = np.random.default_rng(seed)
  return {
      "inputs": rng.integers(0, cfg.vocab_size, (B, cfg.seq_len)).astype(
          np.int32),
      "labels": rng.integers(0, cfg.vocab_size, (B, cfg.seq_len)).astype(
          np.int32),
      "puzzle_identifiers": rng.integers(0, cfg.num_puzzle_identifiers,
                                         (B,)).astype(np.int32),
  }


def _ref_outputs(ref, batch):
  with torch.no_grad():
    out = ref(torch.tensor(batch["inputs"], dtype=torch.long),
              torch.tensor(batch["puzzle_identifiers"], dtype=torch.long))
  return [o.numpy() for o in out]


_ACT_FNS = {}


def _our_outputs(cfg, params, buffers, puzzle_emb, batch):
  """One evaluation ACT step from the initial carry."""
  if cfg not in _ACT_FNS:
    model = trm.TRM(cfg)

    def step(variables, batch):
      carry = trm.reset_carry(model, variables, trm.empty_carry(cfg, B),
                              batch)
      vectors = (model.apply(variables, carry.puzzle_identifiers,
                             method=trm.TRM.lookup_puzzle)
                 if cfg.puzzle_emb_ndim > 0 else None)
      _, out = trm.act_step(model, variables, carry, vectors, train=False)
      return out["logits"], out["q_halt_logits"], out["q_continue_logits"]

    _ACT_FNS[cfg] = jax.jit(step)
  variables = {"params": params, "buffers": buffers}
  if puzzle_emb:
    variables["puzzle_emb"] = puzzle_emb
  batch = jax.tree.map(jnp.asarray, batch)
  return [np.asarray(o) for o in _ACT_FNS[cfg](variables, batch)]


def _random_variables(cfg, seed=0):
  """Random (params, buffers, puzzle_emb) with our tree structure."""
  abstract = nn.meta.unbox(jax.eval_shape(
      lambda: trm.init_variables(trm.TRM(cfg), jax.random.PRNGKey(0))))
  rng = np.random.default_rng(seed)

  def fill(x):
    # LeCun-like scale keeps the recursion well conditioned in float32
    # (kernels are [in, out]; 2-D tables get 1/sqrt(rows), harmless).
    scale = 1.0 / math.sqrt(x.shape[0]) if x.ndim == 2 else 1.0
    return jnp.asarray(rng.normal(size=x.shape).astype(np.float32)
                       * scale).astype(x.dtype)

  variables = jax.tree.map(fill, abstract)
  return (variables["params"], variables["buffers"],
          variables.get("puzzle_emb", {}))


def _save(state_dict, path):
  torch.save(state_dict, str(path))
  return str(path)


def _with_prefix(state_dict, old, new):
  return {new + k[len(old):]: v for k, v in state_dict.items()}


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype
    np.testing.assert_array_equal(np.asarray(x, np.float32),
                                  np.asarray(y, np.float32))


# -------------------------------------------------------------- round trip


@pytest.mark.parametrize("variant,extra", [
    ("rope", dict()),
    ("mlp_t", dict()),
    ("learned_wide_puzzle", dict()),
    ("rope", dict(forward_dtype="bfloat16")),
    ("rope", dict(puzzle_emb_ndim=0)),
])
@pytest.mark.parametrize("suffix", ["step_100", "export.safetensors"])
def test_round_trip_is_exact(tmp_path, variant, extra, suffix):
  cfg = _cfg(**{**VARIANTS[variant], **extra})
  params, buffers, puzzle_emb = _random_variables(cfg)
  path = str(tmp_path / suffix)
  keys = torch_import.export_torch_checkpoint(params, buffers, puzzle_emb,
                                              cfg, path)
  assert all(k.startswith("_orig_mod.model.inner.") for k in keys)
  assert keys == torch_layout.upstream_key_names(cfg)
  got = torch_import.load_torch_checkpoint(path, cfg)
  _assert_trees_equal(got, (params, buffers, puzzle_emb))
  assert got[1]["H_init"].dtype == cfg.dtype
  if cfg.puzzle_emb_ndim == 0:
    assert got[2] == {}


def test_export_layout_and_dtypes(tmp_path):
  cfg = _cfg(forward_dtype="bfloat16")
  params, buffers, puzzle_emb = _random_variables(cfg)
  path = str(tmp_path / "ckpt")
  torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg, path,
                                       prefix="model.")
  sd = torch.load(path, map_location="cpu", weights_only=True)
  assert list(sd)[:2] == ["model.inner.H_init", "model.inner.L_init"]
  assert sd["model.inner.H_init"].dtype == torch.bfloat16
  assert sd["model.inner.lm_head.weight"].dtype == torch.float32
  w = sd["model.inner.L_level.layers.1.self_attn.qkv_proj.weight"].numpy()
  kernel = np.asarray(
      params["L_level"]["layers_1"]["self_attn"]["qkv_proj"]["kernel"])
  assert w.shape == (96, 32)
  np.testing.assert_array_equal(w, kernel.T)
  np.testing.assert_array_equal(sd["model.inner.puzzle_emb.weights"].numpy(),
                                np.asarray(puzzle_emb["weights"]))
  # Same tensors through safetensors as torch reads them.
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  st_path = str(tmp_path / "ckpt.safetensors")
  torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg,
                                       st_path, prefix="model.")
  st = load_file(st_path)
  assert sorted(st) == sorted(sd)
  for k in sd:
    assert st[k].dtype == sd[k].dtype
    assert torch.equal(st[k], sd[k])
  with pytest.raises(ValueError, match="end with '.'"):
    torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg,
                                         path, prefix="model")


# ---------------------------------------------------------------- parity


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_import_matches_reference_forward(tmp_path, variant):
  """Upstream-named state_dict -> our model gives the reference's logits."""
  cfg = _cfg(**VARIANTS[variant])
  ref = _reference(cfg, seed=1)
  sd = _with_prefix(ref.state_dict(), "", "_orig_mod.")
  assert "_orig_mod.model.inner.H_init" in sd
  assert sd["_orig_mod.model.inner.H_init"].dtype == torch.bfloat16
  assert sorted(sd) == sorted(torch_layout.upstream_key_names(cfg))
  path = _save(sd, tmp_path / "step_1")
  params, buffers, puzzle_emb = torch_import.load_torch_checkpoint(path, cfg)
  batch = _batch(cfg, seed=2)
  want = _ref_outputs(ref, batch)
  got = _our_outputs(cfg, params, buffers, puzzle_emb, batch)
  assert got[0].shape == (B, cfg.seq_len, cfg.vocab_size)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)
  # The reference is sensitive: q_halt and q_continue differ, rows differ.
  assert np.abs(want[1] - want[2]).max() > 1e-2
  assert np.abs(want[0][0] - want[0][1]).max() > 1e-2


def test_exported_checkpoint_loads_into_compiled_reference(tmp_path):
  """Our export -> upstream-style load_state_dict(assign=True) -> same logits.

  The default prefix is what a torch.compile'd loss head expects.
  """
  cfg = _cfg()
  params, buffers, puzzle_emb = _random_variables(cfg, seed=3)
  path = str(tmp_path / "step_7")
  torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg, path)
  ref = _reference(cfg, seed=0)
  compiled = torch.compile(ref)  # wraps only; never runs the compiler here
  result = compiled.load_state_dict(
      torch.load(path, map_location="cpu", weights_only=True), strict=True,
      assign=True)
  assert not result.missing_keys and not result.unexpected_keys
  batch = _batch(cfg, seed=4)
  want = _ref_outputs(ref, batch)
  got = _our_outputs(cfg, params, buffers, puzzle_emb, batch)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


def test_mlp_t_export_loads_into_uncompiled_reference(tmp_path):
  cfg = _cfg(**VARIANTS["mlp_t"])
  params, buffers, puzzle_emb = _random_variables(cfg, seed=5)
  path = str(tmp_path / "ckpt.safetensors")
  torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg, path,
                                       prefix="model.")
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  ref = _reference(cfg)
  ref.load_state_dict(load_file(path), strict=True, assign=True)
  batch = _batch(cfg, seed=6)
  for g, w in zip(_our_outputs(cfg, params, buffers, puzzle_emb, batch),
                  _ref_outputs(ref, batch)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=2e-5)


# ------------------------------------------------------ prefixes and format


def _ref_state_dict(cfg, seed=0, prefix="_orig_mod.model.inner."):
  sd = _reference(cfg, seed).model.inner.state_dict()
  return {prefix + k: v for k, v in sd.items()}


@pytest.mark.parametrize("prefix", PREFIXES)
def test_prefixes_accepted(tmp_path, prefix):
  cfg = _cfg()
  base = torch_import.load_torch_checkpoint(
      _save(_ref_state_dict(cfg), tmp_path / "a"), cfg)
  got = torch_import.load_torch_checkpoint(
      _save(_ref_state_dict(cfg, prefix=prefix), tmp_path / "b"), cfg)
  _assert_trees_equal(got, base)


def test_safetensors_of_upstream_state_dict(tmp_path):
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  base = torch_import.load_torch_checkpoint(_save(sd, tmp_path / "a.pt"), cfg)
  path = str(tmp_path / "no_suffix")  # detected by content, not by name
  save_file(sd, path)
  _assert_trees_equal(torch_import.load_torch_checkpoint(path, cfg), base)
  assert base[1]["H_init"].dtype == jnp.float32  # bf16 upstream, cast


@pytest.mark.parametrize("keep", [60, 9])
def test_a_safetensors_file_cut_inside_its_header_is_named_as_one(tmp_path,
                                                                  keep):
  # It was "is not a PyTorch checkpoint: torch.save writes a zip archive
  # ... Pass the .pt/.pth/.bin file that torch.save wrote, or a
  # .safetensors file", for what is a .safetensors file cut short.
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  cfg = _cfg()
  path = str(tmp_path / "model.safetensors")
  save_file(_ref_state_dict(cfg), path)
  with open(path, "rb") as f:
    head = f.read(keep)
  with open(path, "wb") as f:
    f.write(head)
  with pytest.raises(CheckpointError,
                     match=r"model\.safetensors is not a readable "
                     r"\.safetensors file \(.*\); download it again"):
    torch_import.load_torch_checkpoint(path, cfg)


def test_non_persistent_buffers_tolerated(tmp_path):
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  p = "_orig_mod.model.inner."
  sd[p + "rotary_emb.cos_cached"] = torch.zeros(20, 16)
  sd[p + "puzzle_emb.local_weights"] = torch.zeros(B, 32)
  torch_import.load_torch_checkpoint(_save(sd, tmp_path / "a"), cfg)


def test_learned_checkpoint_bf16_params_are_cast(tmp_path):
  cfg = _cfg(**VARIANTS["learned_wide_puzzle"])
  sd = {k: v.to(torch.bfloat16) for k, v in _ref_state_dict(cfg).items()}
  params, _, puzzle_emb = torch_import.load_torch_checkpoint(
      _save(sd, tmp_path / "a"), cfg)
  assert params["embed_pos"].dtype == jnp.float32
  assert puzzle_emb["weights"].dtype == jnp.float32
  np.testing.assert_array_equal(
      np.asarray(params["lm_head"]["kernel"]),
      sd["_orig_mod.model.inner.lm_head.weight"].float().numpy().T)


def _write_run_config(directory, **arch):
  """An all_config.yaml as upstream's pretrain.py dumps it (yaml.dump of
  its pydantic config) beside the checkpoint."""
  import yaml  # pylint: disable=g-import-not-at-top
  fields = dict(name="recursive_reasoning.trm@TinyRecursiveReasoningModel_"
                "ACTV1", loss={"name": "losses@ACTLossHead"}, H_cycles=2,
                L_cycles=2, L_layers=2, hidden_size=32, num_heads=2,
                expansion=4, puzzle_emb_ndim=32, pos_encodings="rope",
                forward_dtype="float32", mlp_t=False, puzzle_emb_len=4,
                halt_max_steps=4, no_ACT_continue=True)
  fields.update(arch)
  with open(os.path.join(directory, "all_config.yaml"), "w") as f:
    yaml.dump({"arch": fields, "global_batch_size": 768, "lr": 1e-4}, f)


def _alias_tree(levels):
  """YAML of a few hundred bytes whose arch.num_heads is, through aliases,
  a list nested `levels` deep holding 10**levels items."""
  lines = ["l0: &l0 [" + ",".join(["lol"] * 10) + "]"]
  lines += [f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 10) + "]"
            for i in range(1, levels)]
  return "\n".join(lines) + f"\narch: {{num_heads: *l{levels - 1}}}\n"


@pytest.mark.parametrize("text, why", [
    # 10**6 items here, formatted into the message whole; eight levels
    # more (still under 1 KB) took the memory or never returned.
    (_alias_tree(6), "its arch.num_heads is a list, no setting"),
    ("arch: {num_heads: " + "[" * 5000 + "]" * 5000 + "}\n",
     "RecursionError"),  # a traceback
], ids=["alias_tree", "deep"])
def test_a_hostile_all_config_yaml_is_not_compared(tmp_path, caplog, text,
                                                   why):
  (tmp_path / "all_config.yaml").write_text(text)
  with caplog.at_level("WARNING"):
    torch_import.check_run_config(str(tmp_path / "step_1"), _cfg())
  assert "all_config.yaml was not compared with config.model" in caplog.text
  assert why in caplog.text


def test_the_runs_all_config_yaml_is_compared(tmp_path, caplog):
  """No weight shape depends on puzzle_emb_len or num_heads under RoPE: a
  checkpoint of puzzle_emb_len 8 loaded silently into a config of 4 (each
  position read another puzzle row). Upstream's all_config.yaml beside the
  file says what the run had."""
  cfg = _cfg()
  path = _save(_ref_state_dict(cfg), tmp_path / "step_10")
  _write_run_config(tmp_path)
  torch_import.load_torch_checkpoint(path, cfg)  # the same config loads
  for field, theirs in (("puzzle_emb_len", 8), ("num_heads", 4),
                        ("pos_encodings", "none"), ("rms_norm_eps", 1e-6)):
    _write_run_config(tmp_path, **{field: theirs})
    with pytest.raises(CheckpointError) as info:
      torch_import.load_torch_checkpoint(path, cfg)
    message = str(info.value)
    for needle in (f"config.model.{field}=", f"arch.{field}={theirs!r}",
                   "all_config.yaml", path):
      assert needle in message, message
  # Recursion depth may change on purpose: said, then loaded.
  _write_run_config(tmp_path, H_cycles=3)
  with caplog.at_level("WARNING"):
    torch_import.load_torch_checkpoint(path, cfg)
  assert "config.model.H_cycles=2" in caplog.text
  # MLP-t has no attention: its run's num_heads is not compared.
  mlp = _cfg(**VARIANTS["mlp_t"])
  path = _save(_ref_state_dict(mlp), tmp_path / "step_20")
  _write_run_config(tmp_path, mlp_t=True, pos_encodings="none", num_heads=8)
  torch_import.load_torch_checkpoint(path, mlp)
  # A file that is no upstream config is not a reason to refuse the weights.
  (tmp_path / "all_config.yaml").write_text("[unclosed")
  torch_import.load_torch_checkpoint(path, mlp)


# ------------------------------------------------------------------ errors


def _load_error(tmp_path, sd, cfg, name="bad"):
  path = _save(sd, tmp_path / name)
  with pytest.raises(CheckpointError) as info:
    torch_import.load_torch_checkpoint(path, cfg)
  message = str(info.value)
  assert path in message
  return message


def test_missing_key(tmp_path):
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  del sd["_orig_mod.model.inner.q_head.bias"]
  message = _load_error(tmp_path, sd, cfg)
  assert "missing keys" in message
  assert "'_orig_mod.model.inner.q_head.bias'" in message


def test_unexpected_key(tmp_path):
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  sd["_orig_mod.model.inner.extra.weight"] = torch.zeros(2)
  message = _load_error(tmp_path, sd, cfg)
  assert "unexpected keys: '_orig_mod.model.inner.extra.weight'" in message


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("format", ["torch", "safetensors"])
def test_float8_checkpoint_loads_cast_to_float32(tmp_path, dtype, format):
  # Refused before: torch's .numpy() has no float8 ("numpy cannot hold"),
  # and safetensors' numpy reader failed ("is not a readable .safetensors
  # file: module 'numpy' has no attribute 'float8_e4m3fn'").
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  cfg = _cfg()
  sd = {k: v.to(dtype) for k, v in _ref_state_dict(cfg).items()}
  path = str(tmp_path / "f8")
  if format == "torch":
    torch.save(sd, path)
  else:
    save_file(sd, path)
  params, buffers, _ = torch_import.load_torch_checkpoint(path, cfg)
  assert params["lm_head"]["kernel"].dtype == jnp.float32
  np.testing.assert_array_equal(
      np.asarray(params["lm_head"]["kernel"]),
      sd["_orig_mod.model.inner.lm_head.weight"].float().numpy().T)
  np.testing.assert_array_equal(
      np.asarray(buffers["H_init"]),
      sd["_orig_mod.model.inner.H_init"].float().numpy())


def test_a_tensor_numpy_cannot_hold_is_one_line(tmp_path):
  # torch's "Got unsupported ScalarType ComplexHalf" was a TypeError
  # traceback naming neither the file nor the tensor.
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  key = "_orig_mod.model.inner.q_head.bias"
  sd[key] = sd[key].to(torch.complex32)
  message = _load_error(tmp_path, sd, cfg)
  assert f"Tensor '{key}' in " in message
  # Refused by its kind, before any tensor is read.
  assert "has dtype torch.complex32; expected a floating-point" in message
  assert "\n" not in message


@pytest.mark.parametrize("scale", ["weight_scale_inv", "weight_scale",
                                   "input_scale"])
def test_fp8_quantization_scales_are_refused(tmp_path, scale):
  # They were only "unexpected keys", as if a stray tensor: the float8
  # weights beside them are off by the scale.
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  key = "_orig_mod.model.inner.lm_head.weight"
  sd[key] = sd[key].to(torch.float8_e4m3fn)
  sd[key[:-len("weight")] + scale] = torch.ones(1, 1)
  message = _load_error(tmp_path, sd, cfg)
  assert f"'{key[:-len('weight')] + scale}', the quantization scale of " \
      f"'{key}'" in message
  assert "Dequantize the checkpoint first" in message
  assert "\n" not in message


@pytest.mark.parametrize("checkpoint,ours,key,expected,field", [
    (dict(vocab_size=12), dict(), "embed_tokens.embedding_weight", "(10, 32)",
     "vocab_size"),
    (dict(hidden_size=64), dict(), "H_init", "(32,)", "hidden_size"),
    (dict(expansion=16.0), dict(),
     "L_level.layers.0.mlp.gate_up_proj.weight", "(512, 32)", "expansion"),
    (dict(num_puzzle_identifiers=7), dict(), "puzzle_emb.weights", "(5, 32)",
     "num_puzzle_identifiers"),
    (dict(puzzle_emb_ndim=48), dict(), "puzzle_emb.weights", "(5, 32)",
     "puzzle_emb_ndim"),
    (dict(mlp_t=True, pos_encodings="none", seq_len=20),
     dict(mlp_t=True, pos_encodings="none"),
     "L_level.layers.0.mlp_t.gate_up_proj.weight", "(512, 20)", "seq_len"),
])
def test_shape_mismatch_names_key_shape_and_field(tmp_path, checkpoint, ours,
                                                  key, expected, field):
  sd = _ref_state_dict(_cfg(**checkpoint))
  message = _load_error(tmp_path, sd, _cfg(**ours))
  assert f"'_orig_mod.model.inner.{key}'" in message
  assert f"expects {expected}" in message
  assert field in message


@pytest.mark.parametrize("format", ["torch", "safetensors"])
def test_a_mismatched_file_is_refused_before_any_tensor_is_read(
    tmp_path, monkeypatch, format):
  # Every tensor was read (the file's size in memory) before the first
  # shape was compared: a mistyped config, or another model's file of
  # gigabytes, cost that much memory before its one-line refusal.
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  sd = _ref_state_dict(_cfg(hidden_size=64))
  path = str(tmp_path / "other")
  if format == "torch":
    _save(sd, path)
  else:
    save_file(sd, path)
  reads = []
  real_torch, real_file = (weights_io.torch_to_numpy,
                           weights_io.SafetensorsFile.read)
  monkeypatch.setattr(weights_io, "torch_to_numpy",
                      lambda *a: reads.append(a[2]) or real_torch(*a))
  monkeypatch.setattr(weights_io.SafetensorsFile, "read",
                      lambda self, n, *a: reads.append(n) or real_file(
                          self, n, *a))
  with pytest.raises(CheckpointError, match="expects"):
    torch_import.load_torch_checkpoint(path, _cfg())
  assert not reads
  # A matching file still reads each tensor once, and only the model's
  # (the rotary tables upstream may save are never read).
  good = _ref_state_dict(_cfg())
  good["_orig_mod.model.inner.rotary_emb.cos_cached"] = torch.zeros(16, 16)
  if format == "torch":
    _save(good, path)
  else:
    save_file(good, path)
  torch_import.load_torch_checkpoint(path, _cfg())
  assert sorted(reads) == sorted(k for k in good if "rotary" not in k)


def test_a_puzzle_table_of_other_rows_loads_for_a_new_run_only(tmp_path):
  """trm.main's init_checkpoint takes a table of another dataset (its rows
  as stored: the task starts each row at their mean, as upstream's
  load_checkpoint); trm.evaluate's read still refuses it, and another
  width is refused for both."""
  cfg = _cfg()
  sd = _ref_state_dict(_cfg(num_puzzle_identifiers=7))
  path = _save(sd, tmp_path / "other_rows")
  table = torch_import.load_torch_checkpoint(path, cfg,
                                             any_puzzle_rows=True)[2]
  key = "_orig_mod.model.inner.puzzle_emb.weights"
  np.testing.assert_array_equal(table["weights"], sd[key])
  assert "num_puzzle_identifiers" in _load_error(tmp_path, sd, cfg)
  wide = _save({**sd, key: torch.zeros(5, 48)}, tmp_path / "wide")
  with pytest.raises(CheckpointError, match=r"puzzle_emb.weights.*has shape "
                     r"\(5, 48\); config.model expects \(5, 32\)"):
    torch_import.load_torch_checkpoint(wide, cfg, any_puzzle_rows=True)


def test_variant_mismatch_hints(tmp_path):
  message = _load_error(tmp_path, _ref_state_dict(_cfg(**VARIANTS["mlp_t"])),
                        _cfg(), "a")
  assert "mlp_t=True" in message
  message = _load_error(tmp_path, _ref_state_dict(_cfg()),
                        _cfg(**VARIANTS["mlp_t"]), "b")
  assert "mlp_t=False" in message
  message = _load_error(tmp_path, _ref_state_dict(_cfg(L_layers=3)), _cfg(),
                        "c")
  assert "L_layers=3" in message
  message = _load_error(tmp_path, _ref_state_dict(_cfg()),
                        _cfg(pos_encodings="learned"), "d")
  assert "pos_encodings" in message
  message = _load_error(tmp_path, _ref_state_dict(_cfg()),
                        _cfg(puzzle_emb_ndim=0), "e")
  assert "puzzle_emb_ndim=32" in message


def test_not_a_trm_checkpoint(tmp_path):
  cfg = _cfg()
  qwen = {"model.embed_tokens.weight": torch.zeros(10, 32),
          "model.layers.0.self_attn.q_proj.weight": torch.zeros(32, 32),
          "lm_head.weight": torch.zeros(10, 32)}
  assert "not an upstream TRM checkpoint" in _load_error(tmp_path, qwen, cfg,
                                                          "a")
  hrm = _ref_state_dict(cfg)
  hrm["_orig_mod.model.inner.H_level.layers.0.mlp.down_proj.weight"] = (
      torch.zeros(32, 256))
  assert "HRM" in _load_error(tmp_path, hrm, cfg, "b")


def test_not_a_state_dict(tmp_path):
  cfg = _cfg()
  assert "not a state_dict" in _load_error(tmp_path, torch.zeros(3), cfg, "a")
  sd = _ref_state_dict(cfg)
  sd["step"] = 5
  assert "not a plain state_dict" in _load_error(tmp_path, sd, cfg, "b")
  mixed = _ref_state_dict(cfg)
  mixed["model.inner.q_head.bias"] = mixed.pop(
      "_orig_mod.model.inner.q_head.bias")
  assert "mixes key prefixes" in _load_error(tmp_path, mixed, cfg, "c")
  junk = tmp_path / "junk"
  for text in (b"this is not a checkpoint", b"model.inner.weight 0.1 0.2\n",
               b"{\"step\": 5}"):
    junk.write_bytes(text)
    with pytest.raises(CheckpointError, match=r"junk is not a PyTorch "
                       r"checkpoint: torch.save writes a zip archive .* starts"
                       r" with b'" + re.escape(text[:4].decode())):
      torch_import.load_torch_checkpoint(str(junk), cfg)
  # A torch.save archive cut short is corrupt, not "not a checkpoint".
  whole = tmp_path / "whole.pt"
  torch.save({"w": torch.zeros(64)}, str(whole))
  junk.write_bytes(whole.read_bytes()[:200])
  with pytest.raises(CheckpointError, match="not a readable PyTorch"):
    torch_import.load_torch_checkpoint(str(junk), cfg)
  with pytest.raises(FileNotFoundError, match="does not exist"):
    torch_import.load_torch_checkpoint(str(tmp_path / "nothing"), cfg)


# ---------------------------------------------------------------- security


_SIDE_EFFECTS = []


def _side_effect(tag):
  _SIDE_EFFECTS.append(tag)
  return tag


class _Payload:
  """Unpickling this calls _side_effect: stands in for arbitrary code."""

  def __reduce__(self):
    return (_side_effect, ("payload ran",))


@pytest.mark.parametrize("writer", ["torch_save", "plain_pickle"])
def test_pickled_object_is_refused(tmp_path, writer):
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  sd["_orig_mod.model.inner.payload"] = _Payload()
  path = str(tmp_path / "evil.pt")
  if writer == "torch_save":
    torch.save(sd, path)
  else:
    with open(path, "wb") as f:
      pickle.dump(sd, f)
  # torch itself refuses the file under weights_only...
  with pytest.raises(pickle.UnpicklingError):
    torch.load(path, map_location="cpu", weights_only=True)
  # ... and so do we, saying why.
  with pytest.raises(CheckpointError) as info:
    torch_import.load_torch_checkpoint(path, cfg)
  message = str(info.value)
  assert "Refusing to load" in message and path in message
  assert "weights_only=True" in message
  assert "arbitrary code" in message
  assert not _SIDE_EFFECTS


def test_without_torch(tmp_path, monkeypatch):
  cfg = _cfg()
  sd = _ref_state_dict(cfg)
  pt_path = _save(sd, tmp_path / "a.pt")
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  st_path = str(tmp_path / "a.safetensors")
  save_file(sd, st_path)
  params, buffers, puzzle_emb = _random_variables(cfg)
  monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails
  with pytest.raises(ImportError, match="pip install torch"):
    torch_import.load_torch_checkpoint(pt_path, cfg)
  with pytest.raises(ImportError, match="pip install torch"):
    torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg,
                                         str(tmp_path / "out.pt"))
  # safetensors needs no torch, in either direction.
  torch_import.load_torch_checkpoint(st_path, cfg)
  out = str(tmp_path / "out.safetensors")
  torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg, out)
  _assert_trees_equal(torch_import.load_torch_checkpoint(out, cfg),
                      (params, buffers, puzzle_emb))


def test_export_checks_variables(tmp_path):
  cfg = _cfg()
  params, buffers, puzzle_emb = _random_variables(cfg)
  with pytest.raises(CheckpointError, match="puzzle_emb/weights is missing"):
    torch_import.export_torch_checkpoint(params, buffers, {}, cfg,
                                         str(tmp_path / "a"))
  with pytest.raises(CheckpointError, match="shape"):
    torch_import.export_torch_checkpoint(params, buffers, puzzle_emb,
                                         _cfg(vocab_size=12),
                                         str(tmp_path / "b"))


def test_a_safetensors_export_follows_the_umask(tmp_path):
  """safetensors 0.8 writes through a 0600 temporary file (its issue
  #782): a .safetensors export was readable by its owner alone, where the
  torch.save one follows the umask. Both now do."""
  cfg = _cfg()
  params, buffers, puzzle_emb = _random_variables(cfg)
  old = os.umask(0o022)
  try:
    for name in ("export.safetensors", "step_1"):
      torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg,
                                           str(tmp_path / name))
  finally:
    os.umask(old)
  for name in ("export.safetensors", "step_1"):
    assert os.stat(tmp_path / name).st_mode & 0o777 == 0o644, name


def test_an_interrupted_torch_export_keeps_the_previous_file(tmp_path,
                                                             monkeypatch):
  """torch.save wrote the export in place: a writer killed mid-way left a
  truncated archive under the final name, in place of the previous
  export. It is now written beside it and renamed."""
  cfg = _cfg()
  params, buffers, puzzle_emb = _random_variables(cfg)
  path = str(tmp_path / "step_1")
  torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg, path)
  before = open(path, "rb").read()

  def killed(obj, f, *args, **kwargs):
    del obj, args, kwargs
    (f.write if hasattr(f, "write") else open(f, "wb").write)(b"PK\x03\x04")
    raise KeyboardInterrupt  # stands in for a kill mid-write

  monkeypatch.setattr(torch, "save", killed)
  with pytest.raises(KeyboardInterrupt):
    torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg,
                                         path)
  assert open(path, "rb").read() == before
  assert sorted(os.listdir(tmp_path)) == ["step_1"]


@pytest.mark.parametrize("path,variant", [("trm_sudoku.py", None),
                                          ("trm_maze.py", None),
                                          ("trm_maze.py", "bs128")])
def test_paper_run_config_names_upstreams_epochs(path, variant):
  """all_config.yaml of a paper Sudoku/Maze run says upstream's epochs=50000
  and eval_interval=5000: upstream's loop runs 10 iterations of the full
  batches 5k epochs fill (65,100 steps at 768), not its total_steps
  formula's count, so that formula read the run as 49,997 epochs with no
  eval_interval."""
  import types  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  from trm.data.puzzles import maze, sudoku  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.dirname(__file__), "..", "..", "..")
  config = config_lib.load_config(os.path.join(root, "configs", path), variant)
  meta = (sudoku if path == "trm_sudoku.py" else maze).dataset_metadata(1000)
  iteration_steps = 5000 * 1000 // config.global_batch_size  # drop-last
  assert config.total_steps == 10 * iteration_steps
  model_cfg = types.SimpleNamespace(**{
      field: config.model.get(field) for field in torch_import._ARCH_FIELDS})
  run = torch_import.run_config_dict(config, model_cfg, "/data", meta)
  assert (run["epochs"], run["eval_interval"]) == (50000, 5000)
