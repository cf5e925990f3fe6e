"""A Hugging Face Dream directory whose config.json holds sizes no model
can have: refused in one line naming the file and the field, before the
model is built or a list of its tensors is made. Plain float8 weights load;
FP8-quantized ones are refused before any weight is read."""
import builtins
import dataclasses
import json

from flax.core import meta
import jax
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from trm.core import weights_io
from trm.families.dream import hf_config
from trm.families.dream import hf_import
from trm.families.dream import model as dream

# Two layers, 64 tokens, 16 wide: every file a few kilobytes.
SIZES = dict(vocab_size=64, hidden_size=16, intermediate_size=32,
             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
CFG = dream.DreamConfig(**SIZES, mask_token_id=60, pad_token_id=0,
                        dtype="float32")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """A two-layer checkpoint as `trm.export` writes it (random weights)."""
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda a: rng.standard_normal(a.shape).astype(np.float32),
      meta.unbox(dream.abstract_params(CFG)))
  directory = tmp_path_factory.mktemp("hf")
  hf_import.export_hf_checkpoint(params, CFG, str(directory))
  return directory


def _edit_config(directory, **changes):
  path = directory / "config.json"
  config = json.loads(path.read_text())
  config.update(changes)
  path.write_text(json.dumps(config))


@pytest.fixture
def copy(exported, tmp_path):
  for f in exported.iterdir():
    (tmp_path / f.name).write_bytes(f.read_bytes())
  return tmp_path


@pytest.mark.parametrize("positions", [0, -4])
def test_max_position_embeddings_must_be_positive(copy, positions):
  # It was taken as the model's length: every prompt then "exceeded the
  # model's 0 positions", with advice to lower max_new_tokens.
  _edit_config(copy, max_position_embeddings=positions)
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"config\.json: max_position_embeddings="
                     rf"{positions} must be a positive integer"):
    hf_config.model_config_from_hf(str(copy))


def test_a_vocabulary_beyond_int32_is_refused(copy):
  # It built a config, and jax then failed inside the model's embedding
  # lookup with an OverflowError traceback.
  _edit_config(copy, vocab_size=10**12)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"config\.json describes no valid model: "
                     r"config\.model\.vocab_size=1000000000000 must be below "
                     r"2\*\*31"):
    hf_config.model_config_from_hf(str(copy))


def test_more_layers_than_the_checkpoint_holds_fail_before_listing_them(
    copy, monkeypatch):
  # num_hidden_layers=10**9 built the names of every layer's tensors (a
  # MemoryError, or the OOM killer) before the first was looked up.
  layers = 10**9
  _edit_config(copy, num_hidden_layers=layers)
  cfg = dataclasses.replace(CFG, num_hidden_layers=layers)

  def small_range(*args):
    assert len(builtins.range(*args)) <= 1000, "iterates over every layer"
    return builtins.range(*args)

  monkeypatch.setattr(hf_import, "range", small_range, raising=False)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"'model\.layers\.999999999\.input_layernorm\."
                     r"weight' is missing.*num_hidden_layers=1000000000 .*"
                     r"more layers than the checkpoint holds"):
    hf_import.check_hf_checkpoint(str(copy), cfg)


@pytest.mark.parametrize("theta", ["abc", [10000.0]])
def test_a_rope_theta_that_is_no_number_names_the_field(copy, theta):
  # Checked against config.model (a run that starts from the checkpoint),
  # float() raised "could not convert string to float" naming neither file
  # nor field, or a TypeError traceback.
  _edit_config(copy, rope_theta=theta)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"config\.json: rope_theta=.* is not a number"):
    hf_import.check_hf_checkpoint(str(copy), CFG)


@pytest.mark.parametrize("field,ours", [("rope_theta", 1e6),
                                        ("rms_norm_eps", 1e-5)])
def test_a_float_left_out_of_config_json_is_dreams_default(copy, field, ours):
  # config.json without rope_theta means Dream's 10000 (its code, and
  # trm.generate, read it so); a run starting from the checkpoint took
  # config.model's 1e6 unchecked and fine-tuned with another RoPE.
  config = json.loads((copy / "config.json").read_text())
  del config[field]
  (copy / "config.json").write_text(json.dumps(config))
  cfg = dataclasses.replace(CFG, **{field: ours})
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"config\.json: {field}=.* \(absent: Dream's "
                     rf"default\) does not match config\.model\.{field}="):
    hf_import.check_hf_checkpoint(str(copy), cfg)
  default, _ = hf_config.model_config_from_hf(str(copy))
  hf_import.check_hf_checkpoint(str(copy), default)


def test_the_dtype_key_of_newer_transformers_is_read(tmp_path):
  # transformers 4.56+ writes config.json's "torch_dtype" as "dtype"; it was
  # ignored: bfloat16 weights were loaded as float32 params (twice the
  # memory) and a file disagreeing with it went unchecked.
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda a: rng.standard_normal(a.shape).astype(np.float32),
      meta.unbox(dream.abstract_params(CFG)))
  hf_import.export_hf_checkpoint(params, CFG, str(tmp_path), dtype="bfloat16")
  config = json.loads((tmp_path / "config.json").read_text())
  config["dtype"] = config.pop("torch_dtype")
  (tmp_path / "config.json").write_text(json.dumps(config))
  cfg, _ = hf_config.model_config_from_hf(str(tmp_path))
  assert cfg.param_dtype == "bfloat16"


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_a_config_dtype_other_than_the_tensors_loads_cast(copy, caplog, key):
  # transformers loads a checkpoint whose config.json names another dtype
  # than its tensors hold (it casts every tensor to the model's dtype); it
  # was refused here: "has dtype F32; config.json says torch_dtype=
  # 'bfloat16' (BF16)". Now cast, with one warning line.
  config = json.loads((copy / "config.json").read_text())
  del config["torch_dtype"]
  (copy / "config.json").write_text(json.dumps(config))
  _edit_config(copy, **{key: "bfloat16"})
  tensors = load_file(str(copy / "model.safetensors"))
  hf_import.check_hf_checkpoint(str(copy), CFG)
  with caplog.at_level("WARNING"):
    params = hf_import.load_hf_checkpoint(str(copy), CFG)
  lines = [r.getMessage() for r in caplog.records
           if "torch_dtype" in r.getMessage()]
  assert len(lines) == 1, lines
  assert ("says torch_dtype='bfloat16' (BF16), but tensors are stored as "
          "F32 (first: 'model.embed_tokens.weight'); they are cast to the "
          "params' float32") in lines[0]
  np.testing.assert_array_equal(np.asarray(params["embed_tokens"]),
                                tensors["model.embed_tokens.weight"])


def _as_float8(directory, dtype, **extra):
  """`directory`'s model.safetensors with every tensor cast to `dtype`
  (plus `extra` tensors); returns the float8 tensors."""
  path = directory / "model.safetensors"
  tensors = {k: v.astype(dtype) for k, v in load_file(str(path)).items()}
  save_file(dict(tensors, **extra), str(path))
  return tensors


@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn,
                                   ml_dtypes.float8_e5m2])
def test_a_plain_float8_checkpoint_loads_cast_to_the_params_dtype(copy,
                                                                  dtype):
  # Refused before: "has dtype F8_E4M3; weights must be floating point
  # (F16, BF16 or F32): an integer or bool tensor would load as garbage".
  tensors = _as_float8(copy, dtype)
  _edit_config(copy, torch_dtype=np.dtype(dtype).name)
  cfg, _ = hf_config.model_config_from_hf(str(copy))
  assert cfg.param_dtype == "bfloat16"  # holds every float8 value exactly
  params = hf_import.load_hf_checkpoint(str(copy), CFG)
  np.testing.assert_array_equal(
      np.asarray(params["embed_tokens"]),
      tensors["model.embed_tokens.weight"].astype(np.float32))
  assert params["embed_tokens"].dtype == np.float32


def _no_reads(monkeypatch):
  def read(*args):
    raise AssertionError("a weight was read")
  monkeypatch.setattr(hf_import._Files, "read", read)  # pylint: disable=protected-access


def test_an_fp8_quantization_config_is_refused_before_weights_load(
    copy, monkeypatch):
  # It was ignored: the float8 weights would load without their scales.
  _as_float8(copy, ml_dtypes.float8_e4m3fn)
  _edit_config(copy, torch_dtype="bfloat16", quantization_config={
      "quant_method": "fp8", "weight_block_size": [128, 128]})
  _no_reads(monkeypatch)
  pattern = (r"config\.json: quantization_config \(quant_method='fp8'\) "
             r"marks the weights as quantized.*Dequantize the checkpoint "
             r"first")
  for load in (lambda: hf_import.load_hf_checkpoint(str(copy), CFG),
               lambda: hf_import.check_hf_checkpoint(str(copy), CFG),
               lambda: hf_config.model_config_from_hf(str(copy))):
    with pytest.raises(weights_io.CheckpointError, match=pattern):
      load()


def test_fp8_scales_without_a_quantization_config_are_refused(copy,
                                                              monkeypatch):
  # transformers' fine-grained FP8 layout: a weight_scale_inv per
  # [128, 128] block beside each float8 Linear weight. Only the unused-
  # tensor warning named them; the weights would load unscaled.
  name = "model.layers.1.mlp.down_proj"
  _as_float8(copy, ml_dtypes.float8_e4m3fn,
             **{f"{name}.weight_scale_inv": np.ones((1, 1), np.float32)})
  _no_reads(monkeypatch)
  with pytest.raises(weights_io.CheckpointError) as info:
    hf_import.load_hf_checkpoint(str(copy), CFG)
  message = str(info.value)
  assert f"holds '{name}.weight_scale_inv', the quantization scale of " \
      f"'{name}.weight'" in message and "model.safetensors" in message
  assert "\n" not in message



def test_rope_theta_inside_transformers_5_rope_parameters_is_read(copy):
  # transformers 5 writes no top-level rope_theta: it is in rope_parameters.
  # Such a config.json was read with the default base 10000 (trm.generate
  # ran another model without a word; a fine-tune from it was refused
  # "rope_theta=10000.0 (absent: Dream's default) does not match ...").
  config = json.loads((copy / "config.json").read_text())
  config.pop("rope_theta")
  config.pop("rope_scaling")
  config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6}
  (copy / "config.json").write_text(json.dumps(config))
  cfg, _ = hf_config.model_config_from_hf(str(copy))
  assert cfg.rope_theta == 1e6
  hf_import.check_hf_checkpoint(str(copy), CFG)  # CFG's base is 1e6
  with pytest.raises(weights_io.CheckpointError,
                     match=r"config\.json: rope_theta=1000000\.0 does not "
                     r"match config\.model\.rope_theta=10000\.0\.$"):
    hf_import.check_hf_checkpoint(str(copy), dataclasses.replace(
        CFG, rope_theta=1e4))
  _edit_config(copy, rope_parameters={"rope_type": "yarn", "factor": 4.0,
                                      "rope_theta": 1e6})
  for call in (lambda: hf_config.model_config_from_hf(str(copy)),
               lambda: hf_import.check_hf_checkpoint(str(copy), CFG)):
    with pytest.raises(weights_io.CheckpointError,
                       match=r"config\.json: rope_parameters=.*'yarn'.* is "
                       r"not supported \(expected the default RoPE"):
      call()


@pytest.mark.parametrize("rope_scaling, ok", [
    (None, True), ({"rope_type": "default"}, True), ({"type": "default"}, True),
    ({"rope_type": "linear", "factor": 2.0}, False),
    ({"type": "dynamic", "factor": 2.0}, False)])
def test_a_default_rope_scaling_is_plain_rope(copy, rope_scaling, ok):
  # transformers computes rope_type "default" as no scaling; it was refused
  # ("rope_scaling={'rope_type': 'default'} is not supported (expected
  # None)").
  _edit_config(copy, rope_scaling=rope_scaling)
  if ok:
    hf_import.check_hf_checkpoint(str(copy), CFG)
    return
  with pytest.raises(weights_io.CheckpointError,
                     match=r"config\.json: rope_scaling=.* is not supported"):
    hf_import.check_hf_checkpoint(str(copy), CFG)


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size",
                                   "num_attention_heads"])
def test_sizes_past_int32_are_refused_in_a_short_line(copy, field):
  # A 401-digit size reached the head-dim check and printed all its digits.
  _edit_config(copy, **{field: 10**400})
  with pytest.raises(weights_io.CheckpointError) as error:
    hf_config.model_config_from_hf(str(copy))
  assert (f"config.model.{field}=<an integer of 401 digits> must be below "
          "2**31") in str(error.value)
  assert len(str(error.value)) < 300


def test_heads_wider_than_any_model_are_refused_before_tracing(copy):
  # RoPE's host table of head_dim / 2 frequencies is built while the model
  # is traced, before any weight's shape is checked: hidden_size 2**30 took
  # 1.8 GB there (2**40: a 1 TiB MemoryError traceback).
  _edit_config(copy, hidden_size=2**30)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"config\.json describes no valid model: .*the "
                     r"head dim, 536,870,912\) must be at most 65,536"):
    hf_config.model_config_from_hf(str(copy))
  with pytest.raises(ValueError, match="must be at most 65,536"):
    dataclasses.replace(CFG, hidden_size=2**18, num_attention_heads=2)
  dataclasses.replace(CFG, hidden_size=2**17, num_attention_heads=2)


@pytest.mark.parametrize("field", ["rope_theta", "rms_norm_eps"])
def test_a_float_field_past_floats_range_is_one_line(copy, field):
  # A JSON integer float() cannot hold raised OverflowError (no ValueError,
  # so a traceback) in model_config_from_hf and in check_hf_config.
  _edit_config(copy, **{field: 10**400})
  needle = (rf"config\.json: {field}=1000000000000000000000000000000000000000"
            r"\.\.\. \(401 characters\) is not a number")
  with pytest.raises(weights_io.CheckpointError, match=needle):
    hf_config.model_config_from_hf(str(copy))
  with pytest.raises(weights_io.CheckpointError, match=needle):
    hf_import.check_hf_checkpoint(str(copy), CFG)
