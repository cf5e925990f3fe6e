"""A GPT rerun needs no `--config.data.input` once its data is prepared: the
prepared directory is used (a URL input is not even downloaded), and the
resume check sees the same run; an input that names another text is
refused in one line naming both. The trainer's two steps that decide this
(the task's build, then the config record's resume check) run here without
training, so the test compiles nothing."""
import os

import pytest
from etils import epath
from test_gpt_task import tiny_config

from trm import families
from trm.core import config_record
from trm.core import mesh as mesh_lib

_MESH = {"mesh.data": 8, "mesh.fsdp": 1, "mesh.model": 1}


def _build(config, workdir: str):
  """What `train.train_and_evaluate` does before it restores anything."""
  ctx = mesh_lib.ShardingContext.from_config(config)
  return families.build_task(config, workdir, ctx)


def test_rerun_needs_no_input_once_prepared(tmp_path):
  data_root, workdir = tmp_path / "data", tmp_path / "run"
  workdir.mkdir()
  config = tiny_config(data_root, **_MESH)
  first_input = config.data.input
  _build(config, str(workdir))
  # The run records the text its data was prepared from.
  assert config.data.input == os.path.abspath(first_input)
  config_record.record(config, epath.Path(workdir), {}, None)

  # No input, or a URL that cannot be reached (the shakespeare configs'
  # default is one): the prepared data, and no change to the recorded run.
  for rerun_input in ("", "http://data.invalid/input.txt"):
    config = tiny_config(data_root, **_MESH)
    config.data.input = rerun_input
    _build(config, str(workdir))
    assert config.data.input == os.path.abspath(first_input)
    assert config_record.check(config, epath.Path(workdir), 2) == {}

  # A local text of another size is another input: one line naming both.
  other = tmp_path / "other.txt"
  other.write_text("a different text\n" * 50)
  config = tiny_config(data_root, **_MESH)
  config.data.input = str(other)
  with pytest.raises(ValueError) as info:
    _build(config, str(workdir))
  message = str(info.value)
  assert "\n" not in message and "config.data.input" in message
  assert os.path.abspath(first_input) in message and str(other) in message
