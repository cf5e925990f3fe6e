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
