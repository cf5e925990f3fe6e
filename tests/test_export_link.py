"""trm.export's --out may be a symbolic link to a directory: the export goes
through the link into that directory, and the link stays (issue 25)."""
import os

import pytest
from absl import app

from trm import export


def _fake_export(staging):
  os.makedirs(staging)
  for name in ("config.json", "model.safetensors"):
    with open(os.path.join(staging, name), "w") as f:
      f.write(name)


@pytest.mark.parametrize("target_state", ["empty", "absent", "full"])
def test_export_goes_through_a_link_to_a_directory(tmp_path, target_state):
  target = tmp_path / "real" / "hf"
  if target_state != "absent":
    target.mkdir(parents=True)
  else:
    (tmp_path / "real").mkdir()
  if target_state == "full":
    (target / "model-00001-of-00002.safetensors").write_text("old")
  link = tmp_path / "link"
  os.symlink(target, link)
  overwrite = target_state == "full"
  export.check_out_dir(str(link), None, overwrite)
  out = export.resolve_out(str(link) + os.sep)
  assert out == os.path.realpath(target)
  staging = export.staging_dir(out)
  assert os.path.dirname(staging) == os.path.dirname(out)
  _fake_export(staging)
  export.swap_in(staging, out)
  assert os.path.islink(link)  # the link stays and shows the export
  assert sorted(os.listdir(link)) == ["config.json", "model.safetensors"]
  assert sorted(os.listdir(target)) == ["config.json", "model.safetensors"]
  assert sorted(os.listdir(tmp_path / "real")) == ["hf"]  # no leftovers
  assert sorted(os.listdir(tmp_path)) == ["link", "real"]


def test_a_non_empty_linked_directory_still_needs_overwrite(tmp_path):
  target = tmp_path / "hf"
  target.mkdir()
  (target / "keep.txt").write_text("x")
  os.symlink(target, tmp_path / "link")
  with pytest.raises(app.UsageError, match="is not empty"):
    export.check_out_dir(str(tmp_path / "link"), None, False)


def test_a_plain_out_is_unchanged(tmp_path):
  out = str(tmp_path / "hf")
  assert export.resolve_out(out + os.sep) == out


def test_config_json_claims_remote_code_only_when_copied(tmp_path):
  """An export's config.json names Dream's remote code in `auto_map` only
  when --tokenizer's directory brought both files; without them
  `transformers` would look for files that are not there."""
  import json  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  cfg = dream.DreamConfig(
      vocab_size=512, hidden_size=64, intermediate_size=128,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      mask_token_id=500, pad_token_id=256)
  written = hf_config.hf_config_dict(cfg, "float32")
  assert "auto_map" not in written
  (tmp_path / "config.json").write_text(json.dumps(written))
  assert not export.link_remote_code(str(tmp_path), ["tokenizer.json",
                                                     "modeling_dream.py"])
  assert "auto_map" not in json.loads((tmp_path / "config.json").read_text())
  assert export.link_remote_code(
      str(tmp_path), ["tokenizer.json", "configuration_dream.py",
                      "modeling_dream.py"])
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["auto_map"] == {
      "AutoConfig": "configuration_dream.DreamConfig",
      "AutoModel": "modeling_dream.DreamModel"}
  assert config["hidden_size"] == 64  # the rest kept


def test_a_link_that_loops_is_refused_first(tmp_path):
  """--out a -> b -> a: the whole export was written, then the rename onto
  the link failed ('Not a directory')."""
  os.symlink("b", tmp_path / "a")
  os.symlink("a", tmp_path / "b")
  with pytest.raises(app.UsageError, match="symbolic link that loops"):
    export.check_out_dir(str(tmp_path / "a"), None, False)
  os.symlink(tmp_path / "absent" / "hf", tmp_path / "dangling")
  export.check_out_dir(str(tmp_path / "dangling"), None, False)  # allowed
