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
      "xla_enable_async_all_gather": "true",
      "xla_tpu_skip_checking_windowed_einsum_users": "true"}
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=0")
  assert tpu_flags.for_mesh(_config(""), _mesh("tpu")) == {}
  assert tpu_flags.for_mesh(_config(tpu_flags.DEFAULT), _mesh("cpu")) == {}
  monkeypatch.delenv("LIBTPU_INIT_ARGS")
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8"
                     " --xla_enable_async_all_gather=false")
  with pytest.raises(ValueError, match="^XLA_FLAGS sets --xla_enable_async_"
                     "all_gather=false where config.tpu_compiler_options"):
    tpu_flags.for_mesh(_config(tpu_flags.DEFAULT), _mesh("tpu"))


@pytest.mark.parametrize("options, environ, expected", [
    ("", {}, 31.25),                                       # the chip's
    ("--xla_tpu_max_hbm_size_mib=7500", {}, 7500 / 1024),
    ("", {"LIBTPU_INIT_ARGS": "--xla_tpu_max_hbm_size_mib=4096"}, 4.0),
    ("--xla_tpu_max_hbm_size_mib=32000", {}, 31.25),       # all of it
])
def test_the_hbm_a_step_is_fitted_to(options, environ, expected):
  """The chip's HBM, or the limit XLA:TPU is given in the config or in
  LIBTPU_INIT_ARGS: what trm.aot's verdict names."""
  assert tpu_flags.hbm_limit_gib(_config(options), 31.25,
                                 environ) == expected


@pytest.mark.parametrize("value, match", [
    ("32001", "and the chip has 32000; set it from 1 to that"),
    ("0", "XLA:TPU fits the step to that many MiB"),
    ("lots", "is not a whole number of MiB"),
])
def test_an_hbm_limit_above_the_chip_or_not_a_size_is_refused(value, match):
  """A step XLA fitted to more HBM than the chip has need not fit it: no
  verdict is given for one."""
  with pytest.raises(ValueError, match=match):
    tpu_flags.hbm_limit_gib(
        _config(f"--xla_tpu_max_hbm_size_mib={value}"), 31.25, {})
