"""Hostile or unusual checkpoint directories: a Hugging Face cache snapshot
(shards as symbolic links into blobs/) loads; an index whose weight_map is
not a map of file names, or that names a shard lacking the tensor, is one
line (CheckpointError), not a TypeError or a SafetensorError traceback."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

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
