"""Hostile or unusual checkpoint directories: a Hugging Face cache snapshot
(shards as symbolic links into blobs/) loads; an index whose weight_map is
not a map of file names, or that names a shard lacking the tensor, is one
line (CheckpointError), not a TypeError or a SafetensorError traceback.
float8 tensors read; quantized checkpoints and unreadable dtypes are one
line."""
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import linen as nn
from safetensors.numpy import load_file, save_file

from trm.core import weights_io
from trm.families.dream import hf_import
from trm.families.dream import model as dream

CFG = dream.DreamConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                        num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=1, mask_token_id=63,
                        pad_token_id=1, dtype="float32",
                        param_dtype="float32")
INDEX = hf_import.INDEX_FILE


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
  """Tiny random Dream weights in the HF layout, several shards + index."""
  params = nn.meta.unbox(dream.Dream(CFG).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  directory = str(tmp_path_factory.mktemp("hf"))
  files = hf_import.export_hf_checkpoint(params, CFG, directory,
                                         shard_size_bytes=4096)
  assert len(files) > 2 and os.path.isfile(os.path.join(directory, INDEX))
  return directory, params


def _hub_cache_snapshot(source: str, root) -> str:
  """`source`'s files laid out as huggingface_hub's cache does: each file of
  snapshots/<rev>/ a relative symbolic link to ../../blobs/<hash>."""
  blobs, snapshot = root / "blobs", root / "snapshots" / "abc123"
  blobs.mkdir(parents=True)
  snapshot.mkdir(parents=True)
  for i, name in enumerate(sorted(os.listdir(source))):
    shutil.copy(os.path.join(source, name), blobs / f"blob{i}")
    os.symlink(f"../../blobs/blob{i}", snapshot / name)
  return str(snapshot)


def test_a_hub_cache_snapshot_with_symlinked_shards_loads(sharded, tmp_path):
  directory, params = sharded
  snapshot = _hub_cache_snapshot(directory, tmp_path / "models--org--tiny")
  loaded = hf_import.load_hf_checkpoint(snapshot, CFG)
  np.testing.assert_array_equal(np.asarray(loaded["norm"]["scale"]),
                                np.asarray(params["norm"]["scale"]))


def _edited_index(directory: str, tmp_path, edit) -> str:
  copy = str(tmp_path / "hf")
  shutil.copytree(directory, copy)
  path = os.path.join(copy, INDEX)
  with open(path) as f:
    index = json.load(f)
  edit(index["weight_map"])
  with open(path, "w") as f:
    json.dump(index, f)
  return copy


def test_an_index_naming_a_shard_without_the_tensor_is_one_line(sharded,
                                                                tmp_path):
  directory, _ = sharded

  def edit(weight_map):
    name = "model.norm.weight"
    weight_map[name] = next(f for f in sorted(set(weight_map.values()))
                            if f != weight_map[name])

  bad = _edited_index(directory, tmp_path, edit)
  with pytest.raises(weights_io.CheckpointError) as info:
    hf_import.load_hf_checkpoint(bad, CFG)
  message = str(info.value)
  assert "'model.norm.weight' is not in" in message and INDEX in message
  assert "\n" not in message


@pytest.mark.parametrize("value", [["x"], 5, None, ""])
def test_an_index_mapping_a_tensor_to_no_file_name_is_one_line(
    sharded, tmp_path, value):
  directory, _ = sharded
  bad = _edited_index(directory, tmp_path,
                      lambda m: m.update({"model.norm.weight": value}))
  with pytest.raises(weights_io.CheckpointError, match="not a file name"):
    hf_import.load_hf_checkpoint(bad, CFG)


def test_a_weight_map_that_is_no_object_is_one_line(tmp_path):
  with pytest.raises(weights_io.CheckpointError, match="not an object"):
    weights_io.check_shard_names(["a.safetensors"], str(tmp_path),
                                 "index.json")


@pytest.mark.parametrize("file", ["../model.safetensors", "/etc/passwd",
                                  "sub/../../x.safetensors", "."])
def test_names_leaving_the_directory_are_still_refused(tmp_path, file):
  with pytest.raises(weights_io.CheckpointError, match="lies outside"):
    weights_io.check_shard_names({"t": file}, str(tmp_path), "index.json")


@pytest.mark.parametrize("edit,needle", [
    ({"pad_token_id": []}, "pad_token_id is missing"),
    ({"rms_norm_eps": [1]}, "rms_norm_eps=[1] is not a number"),
    ({"rope_theta": "abc"}, "rope_theta='abc' is not a number"),
    ({"mask_token_id": "x"}, "mask_token_id='x' is not an integer"),
    ({"vocab_size": True}, "vocab_size is missing or not an integer"),
    ({"num_attention_heads": 0}, "describes no valid model"),
])
def test_a_config_json_with_bad_fields_is_one_line_naming_it(
    sharded, tmp_path, edit, needle):
  from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
  directory, _ = sharded
  with open(os.path.join(directory, "config.json")) as f:
    config = json.load(f)
  config.update(edit)
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  with pytest.raises(weights_io.CheckpointError) as info:
    hf_config.model_config_from_hf(str(tmp_path))
  message = str(info.value)
  assert str(path) in message and needle in message and "\n" not in message


# ------------------------------------------------------------------ float8

F8 = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


@pytest.mark.parametrize("tag", sorted(F8))
def test_float8_safetensors_tensors_read_as_ml_dtypes(tmp_path, tag):
  # safetensors' numpy reader (0.8) fails on them ("module 'numpy' has no
  # attribute 'float8_e4m3fn'"), which was reported as an unreadable file.
  dtype = F8[tag]
  w = np.arange(-6, 6, dtype=np.float32).reshape(3, 4).astype(dtype)
  path = str(tmp_path / "w.safetensors")
  save_file({"a": np.ones(5, np.float32), "w": w,
             "scalar": np.array(1.5, dtype),
             "empty": np.zeros((0, 2), dtype)}, path)
  loaded = weights_io.read_safetensors(path)
  assert loaded["w"].dtype == dtype
  np.testing.assert_array_equal(loaded["w"], w)
  assert loaded["scalar"] == 1.5 and loaded["empty"].shape == (0, 2)
  with weights_io.SafetensorsFile(path) as f:
    assert f.dtype("w") == tag
    np.testing.assert_array_equal(
        f.read("w", (slice(1, 3), slice(0, 2))), w[1:3, :2])


@pytest.mark.parametrize("tag", sorted(F8))
def test_nan_in_a_float8_tensor_is_still_refused(tmp_path, tag):
  w = np.array([1.0, np.nan], np.float32).astype(F8[tag])
  path = str(tmp_path / "w.safetensors")
  save_file({"w": w}, path)
  with pytest.raises(weights_io.CheckpointError,
                     match="'w' in .* holds 1 NaN or Inf"):
    weights_io.read_safetensors(path)


def test_torch_float8_tensors_convert_bit_for_bit():
  torch = pytest.importorskip("torch")
  values = torch.tensor([[0.5, -1.25], [448.0, 2.0 ** -9]])
  for dtype, ours in ((torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
                      (torch.float8_e5m2, ml_dtypes.float8_e5m2)):
    got = weights_io.torch_to_numpy(torch, values.to(dtype), "w", "x.pt")
    assert got.dtype == ours
    np.testing.assert_array_equal(got.astype(np.float32),
                                  values.to(dtype).float().numpy())


def _raw_safetensors(path, dtype: str, data: bytes, shape) -> str:
  """A file whose header gives tensor 'w' the tag `dtype`, written by hand
  (numpy cannot make such a tensor for safetensors' writer)."""
  header = json.dumps({"w": {"dtype": dtype, "shape": list(shape),
                             "data_offsets": [0, len(data)]}}).encode()
  header += b" " * (-len(header) % 8)
  with open(path, "wb") as f:
    f.write(len(header).to_bytes(8, "little") + header + data)
  return str(path)


def test_a_dtype_the_loader_cannot_read_is_one_line(tmp_path):
  # F8_E8M0 (a microscaling exponent): safetensors' numpy reader raised an
  # AttributeError, reported as an unreadable file.
  path = _raw_safetensors(tmp_path / "w.safetensors", "F8_E8M0", b"\x7f\x80",
                          (2,))
  with pytest.raises(weights_io.CheckpointError) as info:
    weights_io.read_safetensors(path)
  message = str(info.value)
  assert f"Tensor 'w' in {path} has dtype F8_E8M0, which this loader " \
      "cannot read" in message and "\n" not in message


def test_quantization_scales_beside_their_weight_are_refused(tmp_path):
  path = str(tmp_path / "w.safetensors")
  save_file({"l.weight": np.ones((4, 4), ml_dtypes.float8_e4m3fn),
             "l.weight_scale_inv": np.ones((1, 1), np.float32)}, path)
  with pytest.raises(weights_io.CheckpointError,
                     match=r"holds 'l\.weight_scale_inv', the quantization "
                     r"scale of 'l\.weight': the checkpoint is quantized"):
    weights_io.read_safetensors(path)
  # A scale-like name with no weight beside it is no quantization.
  weights_io.check_not_quantized(["x.input_scale", "y.weight"], "f")


@pytest.mark.parametrize("quant", [
    {"quant_method": "fp8", "weight_block_size": [128, 128]},
    {"quant_method": "fbgemm_fp8"}, "junk"])
def test_a_quantization_config_is_refused(quant):
  with pytest.raises(weights_io.CheckpointError) as info:
    weights_io.check_quantization_config({"quantization_config": quant},
                                         "d/config.json")
  message = str(info.value)
  assert message.startswith("d/config.json: quantization_config")
  assert "Dequantize the checkpoint first" in message
  weights_io.check_quantization_config({"torch_dtype": "bfloat16"}, "x")


def test_a_sharded_float8_checkpoint_loads_by_slices(sharded, tmp_path):
  # Each shard's tensors as F8_E4M3, read through the header's offsets;
  # the sharded load cuts every device's slice from the memory map.
  directory, _ = sharded
  copy = str(tmp_path / "f8")
  shutil.copytree(directory, copy)
  expected = {}
  for name in os.listdir(copy):
    if name.endswith(".safetensors"):
      tensors = {k: v.astype(ml_dtypes.float8_e4m3fn)
                 for k, v in load_file(os.path.join(copy, name)).items()}
      save_file(tensors, os.path.join(copy, name))
      expected.update(tensors)
  config_path = os.path.join(copy, "config.json")
  with open(config_path) as f:
    config = json.load(f)
  config["torch_dtype"] = "float8_e4m3fn"
  with open(config_path, "w") as f:
    json.dump(config, f)
  loaded = hf_import.load_hf_checkpoint(copy, CFG)
  np.testing.assert_array_equal(
      np.asarray(loaded["norm"]["scale"]),
      expected["model.norm.weight"].astype(np.float32))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))
  shardings = jax.tree.map(
      lambda a: jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec(
              *(("x",) if a.ndim and a.shape[0] % 2 == 0 else ()))),
      loaded)
  split = hf_import.load_hf_checkpoint(copy, CFG, shardings)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(
      np.asarray(a), np.asarray(b)), split, loaded)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000,
                                  '{"vocab_size": ' + "9" * 5000 + "}"])
def test_a_hostile_json_is_one_error_naming_its_file(tmp_path, text):
  """JSON nested past Python's recursion limit, or an integer of more than
  4300 digits, escaped as a bare RecursionError / ValueError."""
  path = tmp_path / "config.json"
  path.write_text(text)
  with pytest.raises(weights_io.CheckpointError,
                     match=f"{path} is no checkpoint JSON"):
    weights_io.read_json(str(path))


def test_an_oversized_json_is_refused_unread(tmp_path, monkeypatch):
  path = tmp_path / "model.safetensors.index.json"
  path.write_text(json.dumps({"weight_map": {"a": "b" * 100}}))
  monkeypatch.setattr(weights_io, "MAX_JSON_BYTES", 64)
  with pytest.raises(weights_io.CheckpointError, match="bytes, no checkpoint"):
    weights_io.read_json(str(path))


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_weight_file_that_is_no_regular_file_is_one_line(sharded, tmp_path,
                                                           kind):
  """A shard (or model.safetensors) that is a FIFO hung the Dream loader
  forever: safe_open blocks until a writer opens the pipe. The index and
  config.json were already refused unread; now the weight files are too."""
  directory, _ = sharded
  copy = tmp_path / "hf"
  shutil.copytree(directory, copy)
  with open(copy / INDEX) as f:
    shard = sorted(set(json.load(f)["weight_map"].values()))[1]
  os.remove(copy / shard)
  if kind == "fifo":
    os.mkfifo(copy / shard)
    # Without the check a reader blocks in open(), holding the GIL; this
    # process opens the pipe for writing once a reader waits, so that the
    # reader goes on (to fail on the empty pipe) instead of hanging the test.
    releaser = subprocess.Popen([sys.executable, "-c", _RELEASE_READERS,
                                 str(copy / shard)])
  else:
    os.mkdir(copy / shard)
    releaser = None
  try:
    with pytest.raises(weights_io.CheckpointError,
                       match=f"{shard} is not a regular file"):
      hf_import.load_hf_checkpoint(str(copy), CFG)
  finally:
    if releaser is not None:
      releaser.kill()
      releaser.wait()


_RELEASE_READERS = """
import os, sys, time
end = time.monotonic() + 30
while time.monotonic() < end:
  try:
    os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK))
    break
  except OSError:  # ENXIO: no reader yet
    time.sleep(0.05)
"""


@pytest.mark.parametrize("version", ["2.5.1+cu121", "1.13.1"])
def test_a_torch_whose_weights_only_load_runs_code_is_refused(
    tmp_path, monkeypatch, version):
  """torch.load(weights_only=True) before torch 2.6 runs code a crafted
  file carries (CVE-2025-32434): such a torch never opens the file."""
  path = tmp_path / "model.pt"
  path.write_bytes(b"PK\x03\x04" + bytes(60))
  opened = []

  class OldTorch:
    __version__ = version

    @staticmethod
    def load(*args, **kwargs):
      opened.append(args)

  monkeypatch.setattr(weights_io, "import_torch", lambda purpose: OldTorch)
  with pytest.raises(weights_io.CheckpointError,
                     match=rf"{re.escape(str(path))} with torch {re.escape(version)}: "
                           r".*CVE-2025-32434"
                           r".*Upgrade torch to 2\.6"):
    weights_io.load_weights_only(str(path), "test")
  assert not opened


def test_a_compressed_torch_archive_is_refused_unpacked(tmp_path):
  """torch.save stores its members; torch.load unpacked a deflated one
  whole into memory before checking it (a zip bomb: here 64 MiB from
  64 KiB), so compressed members are refused before torch reads them."""
  torch = pytest.importorskip("torch")
  saved = tmp_path / "saved.pt"
  torch.save({"w": torch.zeros(4)}, saved)
  weights_io.load_weights_only(str(saved), "test")  # stored members: read
  bomb = tmp_path / "bomb.pt"
  with zipfile.ZipFile(saved) as source, zipfile.ZipFile(bomb, "w") as out:
    for member in source.infolist():
      data = source.read(member)
      if member.filename.endswith("data/0"):
        out.writestr(member.filename, bytes(64 * 2**20),
                     compress_type=zipfile.ZIP_DEFLATED)
      else:
        out.writestr(member, data)
  assert os.path.getsize(bomb) < 2**20
  with pytest.raises(weights_io.CheckpointError,
                     match=r"bomb\.pt is no archive torch\.save wrote: its "
                           r"member '[^']*data/0' is compressed \(67,108,864 "
                           r"bytes packed into"):
    weights_io.load_weights_only(str(bomb), "test")
