"""`trm.core.config_lib`'s checks of --config overrides."""
from absl import flags
from ml_collections import config_flags
import pytest

from test_train import ROOT  # pylint: disable=g-import-not-at-top
from trm.core import config_lib


def _parsed(*overrides):
  argv = ["prog", f"--config={ROOT}/configs/gpt.py:shakespeare_char_cpu",
          *overrides]
  flag_values = flags.FlagValues()
  # ml_collections finds the overrides in `sys_argv` (default: sys.argv).
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)
  flag_values(argv)
  return flag_values


@pytest.mark.parametrize("overrides, needle", [
    (("--config.max_iters=5", "--config.total_steps=3"),
     "--config.max_iters=5 and --config.total_steps=3 set the same field"),
    (("--config.model.n_layer=2", "--config.n_layer=4"),
     "--config.model.n_layer=2 and --config.n_layer=4 set the same field"),
    (("--config.wandb_log=False", "--config.wandb.enabled=True"),
     "config.wandb_log and config.wandb.enabled"),
])
def test_two_names_of_one_field_with_different_values_are_refused(
    overrides, needle):
  # Before: the later flag silently won (max_iters=5 trained 3 steps).
  message = config_lib._conflicting_aliases(_parsed(*overrides))  # pylint: disable=protected-access
  assert message is not None and needle in message, message


@pytest.mark.parametrize("overrides", [
    ("--config.max_iters=5", "--config.total_steps=5"),  # the same value
    ("--config.total_steps=5", "--config.total_steps=3"),  # one name: last wins
    # A derived field (eval_interval * 1) set apart: the two stay separate.
    ("--config.checkpoint_every=100", "--config.eval_interval=50"),
])
def test_agreeing_or_separate_overrides_pass(overrides):
  flag_values = _parsed(*overrides)
  assert config_lib._conflicting_aliases(flag_values) is None  # pylint: disable=protected-access


def test_an_optional_config_left_out_passes():
  # trm.generate's --config is optional: unparsed, it has no overrides.
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                  lock_config=True, sys_argv=["prog"])
  flag_values(["prog"])
  assert config_lib._conflicting_aliases(flag_values) is None  # pylint: disable=protected-access


def _trm_main_error(monkeypatch, capsys, flag) -> str:
  """trm.main's one line (exit 2) for the GPT CPU config and `flag`."""
  argv = ["trm.main", f"--config={ROOT}/configs/gpt.py:shakespeare_char_cpu",
          flag]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
  monkeypatch.setattr(flags, "FLAGS", flag_values)
  with pytest.raises(SystemExit) as stop:
    config_lib.parse_flags(argv)
  assert stop.value.code == 2
  return capsys.readouterr().err


@pytest.mark.parametrize("flag, needle", [
    # absl's own line suggested --log_dir, its logging directory.
    ("--out_dir=out-shakespeare-char",
     "Unknown command line flag 'out_dir': nanoGPT's out_dir is "
     "--workdir=DIR here"),
    ("--max_iters=2000", "set it with --config.max_iters=VALUE"),
    ("--compile=False", "drop nanoGPT's compile"),
    ("--config.device=cpu", "JAX_PLATFORMS=cpu keeps it on the CPU"),
])
def test_nanogpt_flags_name_what_replaces_them(monkeypatch, capsys, flag,
                                               needle):
  assert needle in _trm_main_error(monkeypatch, capsys, flag)


@pytest.mark.parametrize("flag, needle", [
    # Before: "the config has no field 'steps'", and nothing on what to set.
    ("--config.steps=10", "(the run's length in steps is config.total_steps"),
    ("--max_steps=10", "Unknown command line flag 'max_steps': the run's "
     "length in steps is config.total_steps here"),
    ("--config.save_total_limit=2", "config.keep_checkpoints keeps"),
    ("--config.keep_ckpt_steps=1000", "config.keep_checkpoint_every is "
     "big_vision's keep_ckpt_steps"),
    ("--config.ici_tensor_parallelism=4", "config.mesh.model"),
    ("--config.dataset_type=synthetic", "config.data.source"),
    ("--config.base_output_directory=gs://b", "--workdir=DIR"),
    ("--config.data_shuffle_seed=3", "config.data_seed is MaxText's"),
    ("--config.z_loss_multiplier=1e-4", "config.z_loss is MaxText's"),
])
def test_maxtext_hf_and_big_vision_names_name_what_replaces_them(
    monkeypatch, capsys, flag, needle):
  assert needle in _trm_main_error(monkeypatch, capsys, flag)
