"""nanoGPT ckpt.pt and HF GPT-2 import: parity with torch, layouts, errors."""
from __future__ import annotations

import builtins
import dataclasses
import json
import os
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import weights_io
from trm.families.gpt import model as gpt
from trm.families.gpt import gpt_import
from trm.families.gpt import gpt_layout
from trm.families.gpt import hf_gpt2_files

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

SIZES = dict(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32)
ARGS = dict(SIZES, bias=True, dropout=0.0)
CFG = gpt.GPTConfig(**ARGS)
IDS = np.random.RandomState(0).randint(0, 50, (2, 16)).astype(np.int32)


def _hf_model():
  config = transformers.GPT2Config(
      vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4,
      activation_function="gelu",  # exact, as nanoGPT (HF's default is tanh)
      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(config).eval()
  with torch.no_grad():  # move every weight off its trivial init (LN = 1, 0)
    for p in model.parameters():
      p.add_(0.2 * torch.randn_like(p))
  return model


def _nanogpt_state(hf_state, compiled=True, buffers=True):
  """nanoGPT's state_dict from HF GPT-2 tensors: Linear = Conv1D^T."""
  out = {}
  for key, value in hf_state.items():
    if key.endswith((".attn.bias", ".attn.masked_bias")):
      continue
    if key.startswith("transformer.") and key.endswith(".weight") and any(
        s in key for s in ("c_attn", "c_proj", "c_fc")):
      value = value.t()
    out[key] = value.clone().contiguous()
  if buffers:
    for i in range(SIZES["n_layer"]):
      out[f"transformer.h.{i}.attn.bias"] = torch.tril(
          torch.ones(16, 16)).view(1, 1, 16, 16)
  out["lm_head.weight"] = out["transformer.wte.weight"]
  if compiled:
    out = {"_orig_mod." + k: v for k, v in out.items()}
  return out


def _optimizer_state():
  w = torch.nn.Parameter(torch.ones(3, 2))
  opt = torch.optim.AdamW([w], lr=1e-3, betas=(0.9, 0.95))
  w.sum().backward()
  opt.step()
  return opt.state_dict()


def _save_ckpt(path, state, model_args=None, **extra):
  ckpt = {"model": state, "optimizer": _optimizer_state(),
          "model_args": dict(ARGS) if model_args is None else model_args,
          "iter_num": 250, "best_val_loss": torch.tensor(1.4697),
          "config": {"dataset": "shakespeare_char", "batch_size": 64,
                     "learning_rate": 1e-3, "compile": True}}
  ckpt.update(extra)
  torch.save(ckpt, path)
  return path


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
  """(model, logits, directory) of a tiny random GPT-2 saved as safetensors."""
  model = _hf_model()
  directory = str(tmp_path_factory.mktemp("gpt2"))
  model.save_pretrained(directory, safe_serialization=True)
  with torch.no_grad():
    logits = model(torch.from_numpy(IDS).long()).logits.numpy()
  return model, logits, directory


@pytest.fixture(scope="module")
def forward():
  return jax.jit(lambda p, x: gpt.GPT(CFG).apply({"params": p}, x))


def _assert_tree_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_hf_gpt2_parity(hf, forward):
  _, ref, directory = hf
  params, model_args = gpt_import.load_hf_gpt2(directory)
  assert model_args == ARGS
  gpt_import.check_model_args(model_args, CFG, directory)
  assert jax.tree.structure(params) == jax.tree.structure(
      nn.meta.unbox(gpt.abstract_params(CFG)))
  assert params["h_0"]["attn"]["c_attn"]["kernel"].shape == (32, 96)
  np.testing.assert_allclose(forward(params, IDS), ref, atol=1e-5, rtol=1e-5)


def test_hf_sharded_and_base_model_layouts(hf, tmp_path):
  model, _, directory = hf
  params, _ = gpt_import.load_hf_gpt2(directory)
  sharded = str(tmp_path / "sharded")
  model.save_pretrained(sharded, safe_serialization=True,
                        max_shard_size="20KB")
  assert os.path.exists(os.path.join(sharded, hf_gpt2_files.HF_INDEX))
  _assert_tree_equal(gpt_import.load_hf_gpt2(sharded)[0], params)
  base = str(tmp_path / "base")  # GPT2Model: keys without 'transformer.'
  model.transformer.save_pretrained(base, safe_serialization=True)
  _assert_tree_equal(gpt_import.load_hf_gpt2(base)[0], params)


def test_model_safetensors_beside_an_index_is_read_as_transformers_does(
    hf, forward, tmp_path):
  """A directory holding model.safetensors and an index with its shards (an
  earlier save of the other layout): transformers reads model.safetensors,
  this reader read the shards, so the two ran other weights."""
  model, ref, directory = hf
  both = tmp_path / "both"
  other = _hf_model()
  with torch.no_grad():
    for p in other.parameters():
      p.mul_(-1.0)
  other.save_pretrained(str(both), safe_serialization=True,
                        max_shard_size="20KB")
  os.symlink(os.path.join(directory, "model.safetensors"),
             both / "model.safetensors")
  with torch.no_grad():
    theirs = transformers.GPT2LMHeadModel.from_pretrained(str(both))(
        torch.from_numpy(IDS).long()).logits.numpy()
  np.testing.assert_allclose(theirs, ref, atol=1e-5, rtol=1e-5)
  params, _ = gpt_import.load_hf_gpt2(str(both))
  np.testing.assert_allclose(forward(params, IDS), theirs, atol=1e-5,
                             rtol=1e-5)


def test_nanogpt_checkpoint_parity(hf, forward, tmp_path):
  model, ref, directory = hf
  path = _save_ckpt(str(tmp_path / "ckpt.pt"),
                    _nanogpt_state(model.state_dict()))
  params, model_args, extras = gpt_import.load_nanogpt_checkpoint(path)
  assert model_args == ARGS
  assert extras["iter_num"] == 250
  assert isinstance(extras["best_val_loss"], float)
  assert extras["best_val_loss"] == pytest.approx(1.4697)
  assert extras["config"]["dataset"] == "shakespeare_char"
  _assert_tree_equal(params, gpt_import.load_hf_gpt2(directory)[0])
  np.testing.assert_allclose(forward(params, IDS), ref, atol=1e-5, rtol=1e-5)


def test_nanogpt_optimizer_state_is_checked(hf, tmp_path):
  """AdamW's state is read only on request, and one that is not nanoGPT's
  two parameter groups for this model is refused with the sizes."""
  model, _, _ = hf
  state = _nanogpt_state(model.state_dict())
  path = _save_ckpt(str(tmp_path / "ckpt.pt"), state)
  assert "adam" not in gpt_import.load_nanogpt_checkpoint(path)[2]
  with pytest.raises(weights_io.CheckpointError,
                     match=r"groups of sizes \[1\].*\[10, 18\]"):
    gpt_import.load_nanogpt_checkpoint(path, optimizer=True)
  no_optimizer = _save_ckpt(str(tmp_path / "weights.pt"), state,
                            optimizer=None)
  assert gpt_import.load_nanogpt_checkpoint(
      no_optimizer, optimizer=True)[2]["adam"] is None


def test_nanogpt_checkpoint_without_bias(tmp_path):
  """bias=False, not compiled, no tril buffers: round trip of our params."""
  cfg = dataclasses.replace(CFG, bias=False)
  ours = jax.device_get(jax.jit(lambda: nn.meta.unbox(gpt.GPT(cfg).init(
      jax.random.key(3), jnp.zeros((1, 1), jnp.int32)))["params"])())
  state = {"transformer.wte.weight": ours["wte"]["embedding"],
           "transformer.wpe.weight": ours["wpe"]["embedding"],
           "transformer.ln_f.weight": ours["ln_f"]["scale"],
           "lm_head.weight": ours["wte"]["embedding"]}
  for i in range(2):
    h = ours[f"h_{i}"]
    p = f"transformer.h.{i}."
    state.update({p + "ln_1.weight": h["ln_1"]["scale"],
                  p + "ln_2.weight": h["ln_2"]["scale"],
                  p + "attn.c_attn.weight": h["attn"]["c_attn"]["kernel"].T,
                  p + "attn.c_proj.weight": h["attn"]["c_proj"]["kernel"].T,
                  p + "mlp.c_fc.weight": h["mlp"]["c_fc"]["kernel"].T,
                  p + "mlp.c_proj.weight": h["mlp"]["c_proj"]["kernel"].T})
  state = {k: torch.from_numpy(np.array(v))
           for k, v in state.items()}
  path = _save_ckpt(str(tmp_path / "ckpt.pt"), state,
                    dict(ARGS, bias=False, dropout=0.2))
  params, model_args, _ = gpt_import.load_nanogpt_checkpoint(path)
  assert model_args["bias"] is False and model_args["dropout"] == 0.2
  gpt_import.check_model_args(model_args, cfg, path)  # dropout not compared
  _assert_tree_equal(params, ours)


def test_nanogpt_errors(hf, tmp_path):
  model, _, _ = hf
  state = _nanogpt_state(model.state_dict(), compiled=False)

  def save(name, **changes):
    s = dict(state)
    for key, value in changes.items():
      if value is None:
        s.pop(key)
      else:
        s[key] = value
    return _save_ckpt(str(tmp_path / name), s)

  bad = save("shape.pt", **{"transformer.h.1.mlp.c_fc.weight":
                            torch.zeros(128, 31)})
  with pytest.raises(ValueError,
                     match=r"shape\.pt.*'transformer\.h\.1\.mlp\.c_fc\.weight'"
                     r".*\(128, 31\).*\(128, 32\)"):
    gpt_import.load_nanogpt_checkpoint(bad)
  missing = save("missing.pt", **{"transformer.h.0.ln_2.bias": None})
  with pytest.raises(ValueError,
                     match=r"missing\.pt lacks.*transformer\.h\.0\.ln_2\.bias"):
    gpt_import.load_nanogpt_checkpoint(missing)
  extra = save("extra.pt", **{"transformer.h.2.ln_1.weight": torch.ones(32)})
  with pytest.raises(ValueError, match=r"extra\.pt.*transformer\.h\.2\.ln_1"):
    gpt_import.load_nanogpt_checkpoint(extra)
  untied = save("untied.pt", **{"lm_head.weight": torch.zeros(50, 32)})
  with pytest.raises(ValueError, match=r"untied\.pt.*lm_head\.weight.*ties"):
    gpt_import.load_nanogpt_checkpoint(untied)
  no_args = str(tmp_path / "no_args.pt")
  torch.save({"model": state}, no_args)
  with pytest.raises(ValueError, match=r"no_args\.pt is not a nanoGPT.*"
                     "model_args"):
    gpt_import.load_nanogpt_checkpoint(no_args)
  with pytest.raises(FileNotFoundError, match=r"nope\.pt"):
    gpt_import.load_nanogpt_checkpoint(str(tmp_path / "nope.pt"))


@dataclasses.dataclass
class _Opaque:
  value: int = 1


def test_nanogpt_refuses_pickled_objects(hf, tmp_path):
  model, _, _ = hf
  path = _save_ckpt(str(tmp_path / "evil.pt"),
                    _nanogpt_state(model.state_dict()), extra=_Opaque())
  with pytest.raises(ValueError, match=r"Refusing to load .*evil\.pt.*"
                     "weights_only"):
    gpt_import.load_nanogpt_checkpoint(path)


def test_hf_errors(hf, tmp_path):
  _, _, directory = hf
  with pytest.raises(FileNotFoundError, match=r"nowhere.*config\.json and "
                     r"model\.safetensors"):
    gpt_import.load_hf_gpt2(str(tmp_path / "nowhere"))
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match=r"empty.*config\.json"):
    gpt_import.load_hf_gpt2(str(empty))
  (empty / "config.json").write_text(
      open(os.path.join(directory, "config.json")).read())
  with pytest.raises(FileNotFoundError,
                     match=r"neither model\.safetensors nor"):
    gpt_import.load_hf_gpt2(str(empty))
  # config.json sizes that disagree with the tensors.
  wrong = tmp_path / "wrong"
  wrong.mkdir()
  config = json.load(open(os.path.join(directory, "config.json")))
  config["n_positions"] = 32
  (wrong / "config.json").write_text(json.dumps(config))
  os.symlink(os.path.join(directory, "model.safetensors"),
             wrong / "model.safetensors")
  with pytest.raises(ValueError, match=r"'wpe\.weight' has shape \(16, 32\);"
                     r" expected \(32, 32\)"):
    gpt_import.load_hf_gpt2(str(wrong))


def test_check_model_args_lists_every_mismatch():
  cfg = dataclasses.replace(CFG, n_layer=6, n_embd=64, bias=False,
                            dropout=0.3)
  with pytest.raises(ValueError) as e:
    gpt_import.check_model_args(ARGS, cfg, "ckpt.pt")
  msg = str(e.value)
  assert "config.model.n_layer=6 but ckpt.pt has 2" in msg
  assert "config.model.n_embd=64 but ckpt.pt has 32" in msg
  assert "config.model.bias=False but ckpt.pt has True" in msg
  assert "dropout" not in msg and "n_head" not in msg


def test_to_sharded(hf):
  _, _, directory = hf
  params, _ = gpt_import.load_hf_gpt2(directory)
  rules = config_lib.default_logical_axis_rules()
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  shardings = mesh_lib.tree_shardings(mesh, rules, gpt.abstract_params(CFG))
  placed = gpt_import.to_sharded(params, shardings, dtype="bfloat16")
  kernel = placed["h_0"]["mlp"]["c_fc"]["kernel"]
  assert kernel.dtype == jnp.bfloat16
  assert kernel.sharding == shardings["h_0"]["mlp"]["c_fc"]["kernel"]
  assert len(kernel.addressable_shards) == 8
  np.testing.assert_array_equal(
      np.asarray(kernel.astype(jnp.float32)),
      params["h_0"]["mlp"]["c_fc"]["kernel"].astype(jnp.bfloat16).astype(
          np.float32))
  same = gpt_import.to_sharded(params, shardings)
  assert same["wte"]["embedding"].dtype == jnp.float32
  # ShapeDtypeStruct targets (trm.core.state.with_shardings) give the dtype.
  abstract = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, jnp.float16, sharding=s),
      nn.meta.unbox(gpt.abstract_params(CFG)), shardings)
  half = gpt_import.to_sharded(params, abstract)
  assert half["ln_f"]["scale"].dtype == jnp.float16
  assert half["ln_f"]["scale"].sharding == shardings["ln_f"]["scale"]
  wrong = dict(params, wpe={"embedding": np.zeros((8, 32), np.float32)})
  with pytest.raises(ValueError, match=r"\['wpe'\]\['embedding'\] has shape "
                     r"\(8, 32\); the model expects \(16, 32\)"):
    gpt_import.to_sharded(wrong, abstract)
  fewer = dict(params)
  del fewer["ln_f"]
  with pytest.raises(ValueError, match="ln_f"):
    gpt_import.to_sharded(fewer, shardings)


def test_hf_integer_tensors_and_escaping_shard_names_are_refused(hf,
                                                                 tmp_path):
  _, _, directory = hf
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  tensors = load_file(os.path.join(directory, "model.safetensors"))
  bad = tmp_path / "ints"
  bad.mkdir()
  (bad / "config.json").write_text(
      open(os.path.join(directory, "config.json")).read())
  name = next(k for k in tensors if k.endswith("wpe.weight"))
  save_file(dict(tensors, **{name: tensors[name].astype(np.int32)}),
            str(bad / "model.safetensors"))
  with pytest.raises(ValueError, match=r"'wpe\.weight' has dtype int32; "
                     r"weights must be floating point \(float32, float16, "
                     r"bfloat16 or float8\)"):
    gpt_import.load_hf_gpt2(str(bad))
  escape = tmp_path / "escape"
  escape.mkdir()
  (escape / "config.json").write_text(
      open(os.path.join(directory, "config.json")).read())
  for file in ("../ints/model.safetensors", str(bad / "model.safetensors")):
    (escape / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: file for k in tensors}}))
    with pytest.raises(ValueError, match=r"names the weight file .* outside"):
      gpt_import.load_hf_gpt2(str(escape))


def _hf_copy(directory, out, **config_changes):
  """`directory`'s GPT-2 weights beside a config.json with the changes."""
  out.mkdir()
  config = json.load(open(os.path.join(directory, "config.json")))
  config.update(config_changes)
  (out / "config.json").write_text(json.dumps(config))
  os.symlink(os.path.join(directory, "model.safetensors"),
             out / "model.safetensors")
  return str(out)


@pytest.mark.parametrize("field,value", [("n_layer", "two"), ("n_embd", None),
                                         ("n_head", 4.5), ("dropout", None),
                                         ("bias", "False")])
def test_nanogpt_model_args_that_are_not_numbers_name_the_field(
    hf, tmp_path, field, value):
  # They reached int() / float(): "invalid literal for int()" naming
  # neither the file nor the field, or a TypeError traceback; 4.5 was
  # truncated to 4; bias "False" read as True (then blamed on the tensors).
  model, _, _ = hf
  path = _save_ckpt(str(tmp_path / "odd.pt"),
                    _nanogpt_state(model.state_dict()),
                    model_args=dict(ARGS, **{field: value}))
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"odd\.pt: model_args\['{field}'\]="
                     rf"{re.escape(repr(value))} is not an? "
                     r"(integer|number|bool)"):
    gpt_import.load_nanogpt_checkpoint(path)


@pytest.mark.parametrize("field,value", [("n_layer", [2]), ("n_embd", "wide"),
                                         ("n_positions", True),
                                         ("n_inner", "128"),
                                         ("layer_norm_epsilon", None)])
def test_hf_config_values_that_are_not_numbers_name_the_field(
    hf, tmp_path, field, value):
  _, _, directory = hf
  bad = _hf_copy(directory, tmp_path / "odd", **{field: value})
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"config\.json: {field}={re.escape(repr(value))} "
                     r"is not an? (integer|number)"):
    gpt_import.load_hf_gpt2(bad)


def _both_refuse(hf, tmp_path, name, change, hf_match, nanogpt_match):
  """A GPT-2 directory's config.json and a nanoGPT ckpt.pt's model_args,
  each with `change`, are refused with messages matching the patterns."""
  model, _, directory = hf
  bad = _hf_copy(directory, tmp_path / name, **change)
  with pytest.raises(weights_io.CheckpointError, match=hf_match):
    gpt_import.load_hf_gpt2(bad)
  path = _save_ckpt(str(tmp_path / f"{name}.pt"),
                    _nanogpt_state(model.state_dict()),
                    model_args=dict(ARGS, **change))
  with pytest.raises(weights_io.CheckpointError, match=nanogpt_match):
    gpt_import.load_nanogpt_checkpoint(path)


def test_more_layers_than_the_file_holds_fail_before_listing_them(
    hf, tmp_path, monkeypatch):
  # n_layer=10**9 listed every layer's tensors first: a MemoryError, or
  # the OOM killer, before any was looked up.
  def small_range(*args):
    assert len(builtins.range(*args)) <= 1000, "iterates over every layer"
    return builtins.range(*args)

  monkeypatch.setattr(gpt_layout, "range", small_range, raising=False)
  _both_refuse(hf, tmp_path, "deep", {"n_layer": 10**9},
               r"lacks 'h\.999999999\.ln_1\.weight': n_layer=1000000000 "
               r"names more layers than it holds",
               r"deep\.pt lacks 'transformer\.h\.999999999\.ln_1")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_float8_weights_load_in_both_formats(hf, tmp_path, dtype):
  # Refused before: a nanoGPT ckpt.pt as "numpy cannot hold", an HF
  # model.safetensors as "not a readable .safetensors file" (safetensors'
  # numpy reader has no float8).
  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  model, _, directory = hf
  state = {k: v.to(getattr(torch, dtype))
           for k, v in _nanogpt_state(model.state_dict(),
                                      compiled=False).items()}
  params, _, _ = gpt_import.load_nanogpt_checkpoint(
      _save_ckpt(str(tmp_path / "f8.pt"), state))
  want = state["transformer.h.0.mlp.c_fc.weight"].float().numpy().T
  got = params["h_0"]["mlp"]["c_fc"]["kernel"]
  assert got.dtype == np.dtype(dtype)
  np.testing.assert_array_equal(got.astype(np.float32), want)
  hf_dir = _hf_copy(directory, tmp_path / "hf")
  os.remove(os.path.join(hf_dir, "model.safetensors"))
  save_file({k: v.to(getattr(torch, dtype)).contiguous()
             for k, v in model.state_dict().items()
             if not k.endswith((".attn.bias", ".attn.masked_bias"))},
            os.path.join(hf_dir, "model.safetensors"))
  hf_params, _ = gpt_import.load_hf_gpt2(hf_dir)
  np.testing.assert_array_equal(
      hf_params["h_0"]["mlp"]["c_fc"]["kernel"].astype(np.float32), want)
  placed = gpt_import.to_sharded(
      hf_params, jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(
          jax.devices()[0]), hf_params), dtype="float32")
  np.testing.assert_array_equal(
      np.asarray(placed["h_0"]["mlp"]["c_fc"]["kernel"]), want)


def test_nanogpt_complex32_weights_are_one_line(hf, tmp_path):
  # numpy has no complex32: torch's tensor.numpy() raised a TypeError
  # traceback naming neither the file nor the tensor.
  model, _, _ = hf
  state = _nanogpt_state(model.state_dict(), compiled=False)
  key = "transformer.h.0.ln_1.weight"
  state[key] = state[key].to(torch.complex32)
  path = _save_ckpt(str(tmp_path / "c32.pt"), state)
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"'{re.escape(key)}' in .*c32\.pt has dtype "
                     r"torch\.complex32, which numpy cannot hold"):
    gpt_import.load_nanogpt_checkpoint(path)


def test_fp8_quantized_gpt2_is_refused_before_weights_load(hf, tmp_path,
                                                            monkeypatch):
  # A quantization_config was ignored, and scale tensors were only
  # "tensors a GPT does not have" (after every weight was read).
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  _, _, directory = hf
  configured = _hf_copy(directory, tmp_path / "configured",
                        quantization_config={"quant_method": "fp8"})
  with pytest.raises(weights_io.CheckpointError,
                     match=r"configured/config\.json: quantization_config "
                     r"\(quant_method='fp8'\) marks the weights as "
                     r"quantized.*Dequantize"):
    gpt_import.load_hf_gpt2(configured)
  scaled = _hf_copy(directory, tmp_path / "scaled")
  tensors = load_file(os.path.join(directory, "model.safetensors"))
  os.remove(os.path.join(scaled, "model.safetensors"))
  name = "transformer.h.1.mlp.c_fc"
  save_file(dict(tensors, **{f"{name}.weight_scale": np.ones(1, np.float32)}),
            os.path.join(scaled, "model.safetensors"))
  monkeypatch.setattr(weights_io.SafetensorsFile, "read",
                      lambda *a: pytest.fail("a weight was read"))
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"holds '{re.escape(name)}\.weight_scale', the "
                     rf"quantization scale of '{re.escape(name)}\.weight'"):
    gpt_import.load_hf_gpt2(scaled)


def test_n_embd_that_does_not_split_into_n_head_names_the_file(hf, tmp_path):
  # Both loaders returned it; GPTConfig then blamed config.model.n_head,
  # which `trm.sample --checkpoint=` never set, naming no file.
  _both_refuse(hf, tmp_path, "heads", {"n_head": 3},
               r"heads/config\.json: n_embd=32 is not a multiple of n_head=3",
               r"heads\.pt: model_args: n_embd=32 is not a multiple of "
               r"n_head=3")


@pytest.mark.parametrize("name", ["config.json",
                                  "model.safetensors.index.json"])
@pytest.mark.parametrize("text, message", [
    ("[" * 100000 + "]" * 100000, "is no checkpoint JSON"),
    (b"{\"n_embd\": \"\xff\"}", "is not valid JSON"),
], ids=["nested", "not_utf8"])
def test_hostile_gpt2_json_files_are_one_line(hf, tmp_path, name, text,
                                              message):
  """The HF GPT-2 reader parsed config.json and the index with a bare
  json.load: JSON nested 100,000 deep raised a RecursionError traceback
  (`trm.sample --init_from=gpt2`), with no size cap. It now reads them as
  the Dream reader does (`weights_io.read_json`)."""
  _, _, directory = hf
  copy = tmp_path / "gpt2"
  copy.mkdir()
  for file in os.listdir(directory):
    os.symlink(os.path.join(directory, file), copy / file)
  if (copy / name).exists():
    os.remove(copy / name)
  if name == hf_gpt2_files.HF_INDEX:  # an index is read without the file
    os.remove(copy / hf_gpt2_files.HF_SINGLE)
  (copy / name).write_bytes(text if isinstance(text, bytes) else
                            text.encode())
  with pytest.raises(weights_io.CheckpointError, match=message) as e:
    gpt_import.load_hf_gpt2(str(copy))
  assert name in str(e.value)


def test_nanogpt_files_of_the_wrong_container_types_are_one_line(hf,
                                                                 tmp_path):
  """A state_dict with a non-string key, or an optimizer whose 'state' is a
  list, raised AttributeError tracebacks ('int' object has no attribute
  'startswith'; 'list' object has no attribute 'get')."""
  model, _, _ = hf
  state = _nanogpt_state(model.state_dict())
  keyed = dict(state)
  keyed[0] = torch.zeros(1)
  path = _save_ckpt(str(tmp_path / "intkey.pt"), keyed)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"intkey\.pt: state_dict key 0 is a int"):
    gpt_import.load_nanogpt_checkpoint(path)
  path = _save_ckpt(str(tmp_path / "optlist.pt"), state,
                    optimizer={"state": [1, 2], "param_groups": []})
  with pytest.raises(weights_io.CheckpointError,
                     match=r"optlist\.pt: 'optimizer' is not a torch "
                           "optimizer state_dict"):
    gpt_import.load_nanogpt_checkpoint(path, optimizer=True)
