"""XLA:TPU options of the config (`trm.core.tpu_flags`) beside the user's
LIBTPU_INIT_ARGS and XLA_FLAGS."""
import types

import numpy as np
import pytest

from trm.core import config_lib
from trm.core import tpu_flags


def _mesh(platform: str):
  """What `for_mesh` reads of a mesh: its first device's platform."""
  device = types.SimpleNamespace(platform=platform)
  return types.SimpleNamespace(devices=np.asarray([device], dtype=object))


def _config(options: str):
  config = config_lib.load_config("configs/gpt.py", None)
  config_lib.set_values(config, {"tpu_compiler_options": options})
  return config


def test_a_libtpu_init_args_flag_set_otherwise_is_one_line(monkeypatch):
  """LIBTPU_INIT_ARGS=--xla_enable_async_all_gather=false (a MaxText
  user's shell) and the config's default =true both reached the compile;
  one of them was dropped without a word."""
  monkeypatch.setenv("LIBTPU_INIT_ARGS",
                     "--xla_enable_async_all_gather=false --xla_other=1")
  with pytest.raises(ValueError) as error:
    tpu_flags.for_mesh(_config(tpu_flags.DEFAULT), _mesh("tpu"))
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(
      "LIBTPU_INIT_ARGS sets --xla_enable_async_all_gather=false where "
      "config.tpu_compiler_options sets true: both would reach"), message
  assert "xla_other" not in message
  # The same value in both, flags of the environment alone, or a mesh
  # off TPU (the options are not used there) are fine.
  monkeypatch.setenv("LIBTPU_INIT_ARGS",
                     "--xla_enable_async_all_gather=True --xla_other=1 -v")
  assert tpu_flags.for_mesh(_config(tpu_flags.DEFAULT), _mesh("tpu")) == {
      "xla_enable_async_all_gather": "true"}
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=0")
  assert tpu_flags.for_mesh(_config(""), _mesh("tpu")) == {}
  assert tpu_flags.for_mesh(_config(tpu_flags.DEFAULT), _mesh("cpu")) == {}
  monkeypatch.delenv("LIBTPU_INIT_ARGS")
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8"
                     " --xla_enable_async_all_gather=false")
  with pytest.raises(ValueError, match="^XLA_FLAGS sets --xla_enable_async_"
                     "all_gather=false where config.tpu_compiler_options"):
    tpu_flags.for_mesh(_config(tpu_flags.DEFAULT), _mesh("tpu"))
