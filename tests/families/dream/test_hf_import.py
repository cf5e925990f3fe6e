"""HF checkpoint import/export: logits parity with transformers' Qwen2."""
import copy
import dataclasses
import json
import os
import re

import jax
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from flax.core import meta

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import weights_io
from trm.families.dream import model as dream
from trm.families.dream import hf_config
from trm.families.dream import hf_import
from trm.families.dream import hf_layout

RULES = config_lib.default_logical_axis_rules() + (
    ("kv_heads", None), ("head_dim", None), ("layers", None))

CFG = dream.DreamConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, mask_token_id=500,
                        pad_token_id=1, dtype="float32")


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
  """A tiny random Qwen2 (Dream's state_dict layout) saved in several shards."""
  torch.manual_seed(0)
  config = transformers.Qwen2Config(
      vocab_size=CFG.vocab_size, hidden_size=CFG.hidden_size,
      intermediate_size=CFG.intermediate_size,
      num_hidden_layers=CFG.num_hidden_layers,
      num_attention_heads=CFG.num_attention_heads,
      num_key_value_heads=CFG.num_key_value_heads,
      rope_theta=CFG.rope_theta, rms_norm_eps=CFG.rms_norm_eps,
      pad_token_id=CFG.pad_token_id, tie_word_embeddings=False,
      torch_dtype="float32", attn_implementation="sdpa")
  model = transformers.Qwen2ForCausalLM(config).eval()
  with torch.no_grad():  # random non-trivial biases and norm weights
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  directory = str(tmp_path_factory.mktemp("hf"))
  model.save_pretrained(directory, safe_serialization=True,
                        max_shard_size="60KB")
  return model, directory


def _torch_logits(model, tokens, mask=None, positions=None):
  tokens = torch.tensor(np.asarray(tokens), dtype=torch.long)
  b, l = tokens.shape
  m = (torch.ones(b, l, dtype=torch.bool) if mask is None
       else torch.tensor(np.asarray(mask)))
  # Dream passes a 4-D bool mask [B, 1, L, L] straight to sdpa: pairwise.
  mask4 = m[:, None, :, None] & m[:, None, None, :]
  kwargs = {}
  if positions is not None:
    kwargs["position_ids"] = torch.tensor(np.asarray(positions),
                                          dtype=torch.long)
  with torch.no_grad():
    return model(input_ids=tokens, attention_mask=mask4,
                 **kwargs).logits.float().numpy()


def _ours(params, tokens, mask=None, positions=None, cfg=CFG):
  fn = jax.jit(lambda p, *a: dream.Dream(cfg).apply({"params": p}, *a))
  return np.asarray(fn(params, tokens, mask, positions))


def test_checkpoint_is_sharded(hf_model):
  _, directory = hf_model
  files = [f for f in os.listdir(directory) if f.endswith(".safetensors")]
  assert len(files) >= 3
  assert os.path.exists(os.path.join(directory, hf_import.INDEX_FILE))


def test_logits_parity_bidirectional(hf_model):
  model, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  tokens = np.random.RandomState(0).randint(0, 512, (2, 11)).astype(np.int32)
  ref = _torch_logits(model, tokens)
  # The 4-D mask really makes torch bidirectional: the default is causal.
  with torch.no_grad():
    causal = model(input_ids=torch.tensor(tokens, dtype=torch.long)).logits
  assert np.abs(causal.numpy() - ref).max() > 1e-2
  np.testing.assert_allclose(_ours(params, tokens), ref, atol=1e-5, rtol=1e-5)


def test_bfloat16_tracks_torch_bfloat16(hf_model):
  """bf16 compute (bf16 cos/sin, norm cast before weight) tracks torch bf16.

  Not bit-exact (different kernels), but closer to torch's bf16 run than
  that run is to float32.
  """
  model, directory = hf_model
  tokens = np.random.RandomState(2).randint(0, 512, (2, 64)).astype(np.int32)
  ref32 = _torch_logits(model, tokens)
  ref16 = _torch_logits(copy.deepcopy(model).to(torch.bfloat16), tokens)
  for param_dtype in ("float32", "bfloat16"):
    cfg = dataclasses.replace(CFG, dtype="bfloat16", param_dtype=param_dtype)
    params = hf_import.load_hf_checkpoint(directory, cfg)
    ours = _ours(params, tokens, cfg=cfg).astype(np.float32)
    assert np.abs(ours - ref16).max() < 1e-2
    assert np.abs(ours - ref16).mean() < np.abs(ref16 - ref32).mean()


def test_logits_parity_left_padded(hf_model):
  model, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  rng = np.random.RandomState(1)
  tokens = rng.randint(0, 512, (3, 10)).astype(np.int32)
  mask = np.ones((3, 10), bool)
  mask[1, :3] = False
  mask[2, :6] = False
  tokens[~mask] = CFG.pad_token_id
  positions = np.where(mask, np.cumsum(mask, axis=1) - 1, 1).astype(np.int32)
  ref = _torch_logits(model, tokens, mask, positions)
  ours = _ours(params, tokens, mask, positions)
  assert np.isfinite(ours).all()
  # Real positions must agree; torch's fully-masked pad rows are undefined.
  np.testing.assert_allclose(ours[mask], ref[mask], atol=1e-5, rtol=1e-5)


def test_unscanned_layout_loads(hf_model):
  model, directory = hf_model
  cfg = dataclasses.replace(CFG, scan_layers=False)
  params = hf_import.load_hf_checkpoint(directory, cfg)
  tokens = np.arange(9, dtype=np.int32)[None] * 7
  np.testing.assert_allclose(_ours(params, tokens, cfg=cfg),
                             _torch_logits(model, tokens), atol=1e-5,
                             rtol=1e-5)


def test_sharded_load_matches(hf_model):
  _, directory = hf_model
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2))
  shardings = mesh_lib.tree_shardings(mesh, RULES,
                                      dream.abstract_params(CFG))
  sharded = hf_import.load_hf_checkpoint(directory, CFG, shardings)
  plain = hf_import.load_hf_checkpoint(directory, CFG)
  q = sharded["layers"]["self_attn"]["q_proj"]["kernel"]
  assert q.sharding == shardings["layers"]["self_attn"]["q_proj"]["kernel"]
  assert not q.is_fully_replicated
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a),
                                                          np.asarray(b)),
               sharded, plain)


def test_sharded_load_reads_only_slices(hf_model, monkeypatch):
  _, directory = hf_model
  mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=1, fsdp=8, model=1))
  shardings = mesh_lib.tree_shardings(mesh, RULES,
                                      dream.abstract_params(CFG))
  reads = []
  original = hf_import._Files.read

  def spy(self, name, slices):
    out = original(self, name, slices)
    reads.append((name, out.size))
    return out

  monkeypatch.setattr(hf_import._Files, "read", spy)
  hf_import.load_hf_checkpoint(directory, CFG, shardings)
  # The embedding [512, 64] is split 8 ways on 'embed': each read is 1/8.
  sizes = {s for n, s in reads if n == "model.embed_tokens.weight"}
  assert sizes == {512 * 64 // 8}


def test_export_round_trip(hf_model, tmp_path):
  model, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  files = hf_import.export_hf_checkpoint(params, CFG, str(tmp_path),
                                         shard_size_bytes=50_000)
  assert len(files) > 1
  again = hf_import.load_hf_checkpoint(str(tmp_path), CFG)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), params,
               again)
  # The exported tensors are exactly the original HF state_dict.
  state = model.state_dict()
  exported = {}
  for f in files:
    exported.update(load_file(os.path.join(tmp_path, f)))
  assert set(exported) == set(state)
  for name, value in state.items():
    np.testing.assert_array_equal(exported[name], value.numpy())
  config = json.load(open(os.path.join(tmp_path, "config.json")))
  assert config["mask_token_id"] == 500 and config["model_type"] == "Dream"
  # bfloat16 export (the hub's dtype) loads back within bf16 rounding.
  bf = tmp_path / "bf16"
  hf_import.export_hf_checkpoint(params, CFG, str(bf), dtype="bfloat16")
  assert os.path.exists(bf / "model.safetensors")
  back = hf_import.load_hf_checkpoint(str(bf), CFG)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-2,
                                                       atol=1e-2),
               params, back)


def test_a_float16_export_that_overflows_names_the_tensor(hf_model,
                                                          tmp_path):
  """A float32 weight above float16's 65504 was stored as Inf, and every
  loader then refused the export as "corrupt or diverged"; a float16
  export that fits loads back within float16's rounding."""
  _, directory = hf_model
  params = jax.tree.map(np.array, hf_import.load_hf_checkpoint(directory,
                                                               CFG))
  hf_import.export_hf_checkpoint(params, CFG, str(tmp_path / "fits"),
                                 dtype="float16")
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3,
                                                       atol=1e-4),
               params, hf_import.load_hf_checkpoint(str(tmp_path / "fits"),
                                                    CFG))
  params["layers"]["mlp"]["down_proj"]["kernel"][1, 3, 5] = 1e5
  with pytest.raises(weights_io.CheckpointError, match=(
      r"Tensor 'model.layers.1.mlp.down_proj.weight' has a weight of "
      r"magnitude 100000, above float16's largest value 65504, .*Export as "
      r"bfloat16 or float32")):
    hf_import.export_hf_checkpoint(params, CFG, str(tmp_path / "over"),
                                   dtype="float16")


def test_export_writes_a_generation_config(hf_model, tmp_path):
  """Dream's remote code loads a directory with `DreamModel.from_pretrained`
  (hub and dllm alike), which reads generation_config.json through
  `DreamGenerationConfig.from_pretrained`: where the file is missing, it
  raises, so an export without --tokenizer could not be loaded by
  upstream's code. The export writes one with config.json's special ids."""
  _, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  hf_import.export_hf_checkpoint(params, CFG, str(tmp_path))
  generation = transformers.GenerationConfig.from_pretrained(str(tmp_path))
  config = json.load(open(tmp_path / "config.json"))
  assert (generation.pad_token_id == generation.bos_token_id
          == generation.eos_token_id == config["pad_token_id"] == 1)
  assert generation.mask_token_id == config["mask_token_id"] == 500


def test_export_keeps_the_source_checkpoints_bos_eos_and_positions(
    hf_model, tmp_path):
  """Our config holds no bos/eos ids, so an export wrote both equal to the
  pad id and DiffuCoder's 131072 positions whatever the checkpoint had
  (Dream-Coder's bos is not its pad). The fields of the checkpoint a run
  was fine-tuned from (`trm.export --tokenizer=DIR`'s config.json) go into
  config.json and generation_config.json."""
  _, directory = hf_model
  source = tmp_path / "source"
  source.mkdir()
  (source / "config.json").write_text(json.dumps(
      {"bos_token_id": 3, "eos_token_id": [4, 5],
       "max_position_embeddings": 4096, "pad_token_id": 1}))
  fields = hf_config.fields_from_source(str(source), CFG)
  assert fields == {"bos_token_id": 3, "eos_token_id": [4, 5],
                    "max_position_embeddings": 4096}
  params = hf_import.load_hf_checkpoint(directory, CFG)
  out = tmp_path / "out"
  hf_import.export_hf_checkpoint(params, CFG, str(out), source_fields=fields)
  config = json.load(open(out / "config.json"))
  generation = json.load(open(out / "generation_config.json"))
  for written in (config, generation):
    assert written["bos_token_id"] == 3 and written["eos_token_id"] == [4, 5]
    assert written["pad_token_id"] == 1  # ours, not the source's
  assert config["max_position_embeddings"] == 4096
  # The model's own fields are never taken from the source.
  assert config["vocab_size"] == CFG.vocab_size
  # Without a config.json in the directory: the defaults, as before.
  assert hf_config.fields_from_source(str(tmp_path / "out" / "none"),
                                      CFG) == {}


@pytest.mark.parametrize("kind", ["directory", "broken link"])
def test_a_source_config_that_is_no_file_is_refused(tmp_path, kind):
  """A directory or a dangling link named config.json was read as 'missing'
  (a FileNotFoundError) or skipped, leaving bos = eos = pad unannounced."""
  path = tmp_path / "config.json"
  if kind == "directory":
    path.mkdir()
  else:
    os.symlink(tmp_path / "gone.json", path)
  with pytest.raises(weights_io.CheckpointError,
                     match="config.json is not a regular file"):
    hf_config.fields_from_source(str(tmp_path), CFG)


@pytest.mark.parametrize("field,value", [
    ("bos_token_id", 10**6), ("eos_token_id", -1), ("eos_token_id", []),
    ("eos_token_id", [2, "x"]), ("bos_token_id", True),
    ("max_position_embeddings", 0), ("max_position_embeddings", 1.5)])
def test_a_source_field_out_of_range_is_refused(tmp_path, field, value):
  (tmp_path / "config.json").write_text(json.dumps({field: value}))
  with pytest.raises(weights_io.CheckpointError,
                     match=f"config.json: {field}="):
    hf_config.fields_from_source(str(tmp_path), CFG)


def _copy_single(directory, tmp_path, edit):
  """The checkpoint as one model.safetensors, with `edit` applied."""
  tensors = {}
  for f in os.listdir(directory):
    if f.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(directory, f)))
  edit(tensors)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  with open(tmp_path / "config.json", "w") as f:
    json.dump(config, f)
  return str(tmp_path)


def test_single_file_loads(hf_model, tmp_path):
  model, directory = hf_model
  single = _copy_single(directory, tmp_path, lambda t: None)
  params = hf_import.load_hf_checkpoint(single, CFG)
  tokens = np.arange(6, dtype=np.int32)[None] * 3
  np.testing.assert_allclose(_ours(params, tokens),
                             _torch_logits(model, tokens), atol=1e-5,
                             rtol=1e-5)


def test_missing_tensor_error(hf_model, tmp_path):
  _, directory = hf_model
  name = "model.layers.1.self_attn.k_proj.bias"
  bad = _copy_single(directory, tmp_path, lambda t: t.pop(name))
  with pytest.raises(weights_io.CheckpointError, match=name.replace(".",
                                                                    r"\.")):
    hf_import.load_hf_checkpoint(bad, CFG)


def test_unused_tensors_are_named_in_a_warning(hf_model, tmp_path, caplog):
  model, directory = hf_model
  extra = "model.layers.0.self_attn.rotary_emb.inv_freq"

  def edit(t):
    t[extra] = np.ones(8, np.float32)

  single = _copy_single(directory, tmp_path, edit)
  with caplog.at_level("WARNING"):
    params = hf_import.load_hf_checkpoint(single, CFG)
  assert f"1 tensors in {single}" in caplog.text
  assert extra in caplog.text
  tokens = np.arange(6, dtype=np.int32)[None] * 3  # the rest loads as before
  np.testing.assert_allclose(_ours(params, tokens),
                             _torch_logits(model, tokens), atol=1e-5,
                             rtol=1e-5)


def test_misshaped_tensor_error(hf_model, tmp_path):
  _, directory = hf_model
  name = "model.layers.0.mlp.up_proj.weight"

  def edit(t):
    t[name] = t[name][:, :32].copy()

  bad = _copy_single(directory, tmp_path, edit)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"up_proj\.weight.*model\.safetensors.*\(128, 32\)"):
    hf_import.load_hf_checkpoint(bad, CFG)


def test_config_mismatch_error(hf_model):
  _, directory = hf_model
  with pytest.raises(weights_io.CheckpointError,
                     match=r"num_key_value_heads=2.*config\.model\."
                           r"num_key_value_heads=1"):
    hf_import.load_hf_checkpoint(
        directory, dataclasses.replace(CFG, num_key_value_heads=1))


@pytest.mark.parametrize("file", ["../model.safetensors", "/etc/passwd",
                                  "sub/../../x.safetensors"])
def test_index_shard_names_must_stay_inside_the_directory(tmp_path, file):
  index = tmp_path / "model.safetensors.index.json"
  index.write_text(json.dumps({"weight_map": {
      "model.norm.weight": "model-00001-of-00002.safetensors",
      "lm_head.weight": file}}))
  with pytest.raises(weights_io.CheckpointError,
                     match=r"names the weight file .* outside"):
    weights_io.read_index(str(index))  # pylint: disable=protected-access


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_exported_weights_are_as_readable_as_the_config(hf_model, tmp_path,
                                                        umask):
  """safetensors 0.8 writes each file through a temporary one that is
  always 0600 (its issue #782), so an export's weights could be read by
  their owner alone while config.json, written with open(), followed the
  umask: another account (a serving user, a container's non-root user)
  saw the directory but could not read the weights. Every file of an
  export now has the umask's mode."""
  _, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  old = os.umask(umask)
  try:
    files = hf_import.export_hf_checkpoint(params, CFG, str(tmp_path),
                                           shard_size_bytes=50_000)
  finally:
    os.umask(old)
  assert len(files) > 1
  modes = {name: os.stat(tmp_path / name).st_mode & 0o777
           for name in os.listdir(tmp_path)}
  assert modes == {name: 0o666 & ~umask for name in modes}, modes


@pytest.mark.parametrize("field,value,message", [
    ("mask_token_id", 7, "mask_token_id=7, but config.model.mask_token_id=500"),
    ("pad_token_id", 10**6, "pad_token_id=1000000 is not token"),
    ("eos_token_id", [1, 10**6], "eos_token_id=[1, 1000000] is not token"),
    ("bos_token_id", "x", "bos_token_id='x' is not token"),
])
def test_a_source_generation_config_that_disagrees_is_refused(
    tmp_path, field, value, message):
  """`trm.export --tokenizer=DIR` copies DIR's generation_config.json over
  the export's own, and Dream's diffusion_generate takes its mask id from
  that file: one naming mask id 7 made Dream's code fill the canvas with
  token 7 while config.json (and our loaders) said 500. Its pad id need
  only be a token id: a download may pad with another token than its
  config.json says, and must still export."""
  good = {"bos_token_id": 1, "eos_token_id": [1, 3], "pad_token_id": 1,
          "mask_token_id": 500, "temperature": 0.2}
  for pad in (1, 2):  # the model's is 1
    (tmp_path / "generation_config.json").write_text(
        json.dumps(dict(good, pad_token_id=pad)))
    hf_config.check_source_generation_config(str(tmp_path), CFG)  # fits
  (tmp_path / "generation_config.json").write_text(
      json.dumps(dict(good, **{field: value})))
  with pytest.raises(weights_io.CheckpointError,
                     match=re.escape(f"generation_config.json: {message}")):
    hf_config.check_source_generation_config(str(tmp_path), CFG)


def test_no_source_generation_config_is_nothing_to_check(tmp_path):
  hf_config.check_source_generation_config(str(tmp_path), CFG)
  (tmp_path / "generation_config.json").write_text("[1]")
  with pytest.raises(weights_io.CheckpointError, match="holds a list"):
    hf_config.check_source_generation_config(str(tmp_path), CFG)


@pytest.mark.parametrize("first_shard, second_shard", [(50_000, None),
                                                       (None, 50_000)])
def test_an_export_over_one_of_the_other_layout_is_what_loads(
    hf_model, tmp_path, first_shard, second_shard):
  """export_hf_checkpoint into a directory holding an earlier sharded
  export left that export's index beside the new model.safetensors: our
  loader (which prefers the index) read the OLD weights, under the new
  config.json. The other way round, the old model.safetensors stayed and
  transformers (which prefers it) would read the old weights."""
  _, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  other = jax.tree.map(lambda x: x + 1.0, params)
  kw = lambda size: {} if size is None else {"shard_size_bytes": size}
  hf_import.export_hf_checkpoint(params, CFG, str(tmp_path),
                                 **kw(first_shard))
  hf_import.export_hf_checkpoint(other, CFG, str(tmp_path),
                                 **kw(second_shard))
  back = hf_import.load_hf_checkpoint(str(tmp_path), CFG)
  jax.tree.map(np.testing.assert_array_equal, back, other)
  if second_shard is None:
    assert not os.path.exists(tmp_path / hf_import.INDEX_FILE)
  else:
    assert not os.path.exists(tmp_path / hf_import.SINGLE_FILE)


def test_export_holds_one_tensor_at_a_time(tmp_path):
  """export_hf_checkpoint converted every tensor and held them all (15 GB
  for the 7B) before writing the first file; now each is gathered,
  converted and written in turn. numpy reports its buffers to tracemalloc,
  so the export's peak allocation is measured against the tensors' total."""
  import tracemalloc  # pylint: disable=g-import-not-at-top
  cfg = dataclasses.replace(CFG, hidden_size=128, intermediate_size=512,
                            num_hidden_layers=16)
  rng = np.random.default_rng(0)
  params = jax.tree.map(
      lambda a: rng.standard_normal(a.shape).astype(np.float32),
      meta.unbox(dream.abstract_params(cfg)))
  total = sum(x.nbytes for x in jax.tree.leaves(params))
  # The largest HF tensors: the embedding and lm_head, 512 x 128 float32
  # (each MLP matrix, 128 x 512, is as large).
  largest = cfg.vocab_size * cfg.hidden_size * 4
  tracemalloc.start()
  try:
    files = hf_import.export_hf_checkpoint(params, cfg, str(tmp_path),
                                           shard_size_bytes=total // 3)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert len(files) > 1
  assert peak < max(4 * largest, total // 8), (peak, largest, total)
  back = hf_import.load_hf_checkpoint(str(tmp_path), cfg)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def test_an_export_cut_short_leaves_no_file_that_looks_complete(
    hf_model, tmp_path, monkeypatch):
  """A failure while the second shard is written (a full disk, a kill)
  leaves the first shard whole, no part of the second under its name, and
  no index or config.json claiming a checkpoint."""
  _, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  real = hf_layout.to_hf
  calls = []

  def failing(leaf, x):
    calls.append(leaf)
    if len(calls) == 3:  # the second shard's second tensor
      raise OSError(28, "No space left on device")
    return real(leaf, x)

  monkeypatch.setattr(hf_layout, "to_hf", failing)
  out = tmp_path / "out"
  with pytest.raises(OSError, match="No space left"):
    hf_import.export_hf_checkpoint(params, CFG, str(out),
                                   shard_size_bytes=50_000)
  names = sorted(os.listdir(out))  # no temp file either
  assert names == [n for n in names if re.fullmatch(
      r"model-\d{5}-of-\d{5}\.safetensors", n)], names
  for name in names:  # the shards written are whole
    load_file(str(out / name))


def test_model_safetensors_beside_an_index_is_read_as_transformers_does(
    hf_model, tmp_path, caplog):
  """transformers' from_pretrained reads model.safetensors when a directory
  holds it and an index; the index was read here, so the same directory
  loaded other weights in each."""
  model, directory = hf_model
  both = tmp_path / "both"
  both.mkdir()
  for f in os.listdir(directory):
    (both / f).write_bytes(open(os.path.join(directory, f), "rb").read())
  single = {name: value.numpy() + 1.0
            for name, value in model.state_dict().items()}
  save_file(single, str(both / hf_import.SINGLE_FILE))
  with caplog.at_level("WARNING"):
    params = hf_import.load_hf_checkpoint(str(both), CFG)
  np.testing.assert_array_equal(np.asarray(params["embed_tokens"]),
                                single["model.embed_tokens.weight"])
  assert (f"holds both {hf_import.SINGLE_FILE} and {hf_import.INDEX_FILE}; "
          f"reading {hf_import.SINGLE_FILE}, as transformers does"
          in caplog.text)
  config = json.loads((both / "config.json").read_text())
  config["model_type"] = "qwen2"
  (both / "config.json").write_text(json.dumps(config))
  theirs = transformers.Qwen2ForCausalLM.from_pretrained(str(both))
  np.testing.assert_array_equal(theirs.model.embed_tokens.weight.detach()
                                .numpy(), single["model.embed_tokens.weight"])


def test_a_failed_write_still_takes_part_in_every_gather(hf_model, tmp_path,
                                                          monkeypatch):
  """Each tensor is gathered by a collective every process joins, and
  process 0 writes between gathers: a write failing there (a full disk)
  must not leave the other processes waiting in the next gather. Process 0
  takes part in the rest, then raises."""
  from trm.core import host_arrays  # pylint: disable=g-import-not-at-top
  _, directory = hf_model
  params = hf_import.load_hf_checkpoint(directory, CFG)
  gathers = []
  real_whole = host_arrays.whole
  monkeypatch.setattr(host_arrays, "whole",
                      lambda x: gathers.append(1) or real_whole(x))
  real_save = weights_io.save_safetensors_streamed

  def save(path, entries, arrays, metadata=None):
    if "00002" in path:
      next(iter(arrays))
      raise OSError(28, "No space left on device")
    return real_save(path, entries, arrays, metadata)

  monkeypatch.setattr(weights_io, "save_safetensors_streamed", save)
  with pytest.raises(OSError, match="No space left"):
    hf_import.export_hf_checkpoint(params, CFG, str(tmp_path / "out"),
                                   shard_size_bytes=50_000)
  tensors = 3 + 12 * CFG.num_hidden_layers  # embed, norm, lm_head, layers
  assert len(gathers) == tensors
