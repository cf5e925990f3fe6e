"""`trm.core.config_lib`'s checks of --config overrides."""
import re

from absl import flags
import ml_collections
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


@pytest.mark.parametrize("overrides, needle", [
    (("--config.num_epochs=2", "--config.max_iters=5"),
     "--config.max_iters=5 and config.num_epochs=2.0 both set the run's "
     "length"),
    (("--config.total_steps=5", "--config.num_epochs=0.5"),
     "--config.total_steps=5 and config.num_epochs=0.5 both set"),
    (("--config.num_epochs=2",), None),  # the config file's steps: replaced
    (("--config.num_epochs=0", "--config.max_iters=5"), None),  # off
])
def test_num_epochs_with_a_step_count_override_is_refused(overrides, needle):
  # Before: no config.num_epochs (HF's num_train_epochs) at all.
  message = config_lib._epochs_and_steps(_parsed(*overrides))  # pylint: disable=protected-access
  assert message == needle if needle is None else needle in message, message


_BIG = "1" + "0" * 400


@pytest.mark.parametrize("override, needle", [
    (f"--config.seed={_BIG}", "--config.seed: <an integer of 401 digits> is "
     "outside the 64-bit integer range"),
    ("--config.max_iters=-9223372036854775809",
     "--config.max_iters: -9223372036854775809 is outside"),
    (f"--config.lr_mults=(('.*', {_BIG}),)",
     "--config.lr_mults: <an integer of 401 digits>"),
    ("--config.seed=9223372036854775807", None),  # range checks follow
    ("--config.learning_rate=1e400", None),  # inf: the field's own check
])
def test_integers_past_int64_are_refused_with_the_flag(override, needle):
  # float() of a 401-digit seed, step count or size raised OverflowError
  # tracebacks in the trainer's own checks and schedules.
  message = config_lib._integers_past_int64(_parsed(override))  # pylint: disable=protected-access
  assert message == needle if needle is None else needle in message, message


def test_num_epochs_rounds_up_to_whole_steps():
  """ceil(num_epochs x steps per epoch), without float noise (0.1 x 30
  batches is 3 steps, not 4); nanoGPT's max_iters follows total_steps."""
  config = ml_collections.ConfigDict({"num_epochs": 0.1, "max_iters": 600})
  config.total_steps = config.get_ref("max_iters")
  config.lock()
  config_lib.total_steps_from_epochs(config, 30, "30 batches")
  assert (config.total_steps, config.max_iters) == (3, 3)
  config.num_epochs = 2.5
  config_lib.total_steps_from_epochs(config, 4.2, "4.2 batches")
  assert config.total_steps == 11


@pytest.mark.parametrize("values, needle", [
    ({"num_epochs": True}, "config.num_epochs=True must be a finite number"),
    ({"num_epochs": "2"}, "config.num_epochs='2' must be a finite number"),
    ({"num_epochs": float("inf")}, "config.num_epochs=inf must be a finite"),
    ({"num_epochs": 1.0, "compiled_step": "step.bin"},
     "config.num_epochs=1 with config.compiled_step: the step compiled ahead"),
    # A family whose task derives no total_steps (the tests' toy).
    ({"num_epochs": 1.0, "model": {"name": "toy"}},
     "config.num_epochs=1: model family 'toy' does not count epochs"),
])
def test_bad_num_epochs_values_are_one_line(values, needle):
  import toy_config  # pylint: disable=g-import-not-at-top,unused-import  (registers it)
  from trm.core import run_checks  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict({"data": {"source": "files"}, **values})
  with pytest.raises(ValueError, match="^" + re.escape(needle)):
    run_checks.check_epochs(config)


def test_an_optional_config_left_out_passes():
  # trm.generate's --config is optional: unparsed, it has no overrides.
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                  lock_config=True, sys_argv=["prog"])
  flag_values(["prog"])
  assert config_lib._conflicting_aliases(flag_values) is None  # pylint: disable=protected-access


def test_flag_values_reads_absls_spellings():
  """The --config and --flagfile checks read a flag as absl does: `--f=V`,
  `-f=V`, `--f V`, none past `--`, not `--f.key=V`."""
  argv = ["prog", "--config=a", "-config=b", "--config", "c",
          "--config.total_steps=3", "--configs=x", "--", "--config=d"]
  assert list(config_lib._flag_values(argv, "config")) == ["a", "b", "c"]  # pylint: disable=protected-access
  assert not list(config_lib._flag_values(["prog", "--config"], "config"))  # pylint: disable=protected-access


_GPT_CPU = f"--config={ROOT}/configs/gpt.py:shakespeare_char_cpu"


def _trm_main_flags(monkeypatch, argv):
  """trm.main's --config and --workdir, defined for `argv` (ml_collections
  reads its flagfiles then, for the overrides they name) in flags that
  stand in for absl's."""
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values,
                                  lock_config=True, sys_argv=argv)
  flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
  monkeypatch.setattr(flags, "FLAGS", flag_values)
  return flag_values


def test_a_flagfile_still_gives_the_config_and_its_overrides(monkeypatch,
                                                            tmp_path):
  """parse_flags reads --flagfile's lines itself (to check a --config named
  there before absl's parse): the file's --config, its overrides and the
  other flags still reach the parse."""
  flagfile = tmp_path / "flags"
  flagfile.write_text(f"# the run's flags\n{_GPT_CPU}\n"
                      "--config.total_steps=7\n--workdir=/tmp/run\n")
  argv = ["trm.main", f"--flagfile={flagfile}"]
  flag_values = _trm_main_flags(monkeypatch, argv)
  assert config_lib.parse_flags(argv) == ["trm.main"]
  assert (flag_values.config.model.name, flag_values.config.total_steps,
          flag_values.workdir) == ("gpt", 7, "/tmp/run")


def _trm_main_error(monkeypatch, capsys, flag) -> str:
  """trm.main's one line (exit 2) for the GPT CPU config and `flag`."""
  argv = ["trm.main", _GPT_CPU, flag]
  _trm_main_flags(monkeypatch, argv)
  with pytest.raises(SystemExit) as stop:
    config_lib.parse_flags(argv)
  assert stop.value.code == 2
  return capsys.readouterr().err


def test_a_flagfile_from_a_pipe_is_one_line_saying_to_use_a_file(
    monkeypatch, capsys):
  """ml_collections reads a flagfile when --config is defined and absl
  again when it parses: a shell's `--flagfile=<(...)` gave its flags to the
  first reader only ("Unknown command line flag 'config.total_steps'")."""
  import os  # pylint: disable=g-import-not-at-top
  read, write = os.pipe()
  os.write(write, b"--config.total_steps=7\n")
  os.close(write)
  try:
    error = _trm_main_error(monkeypatch, capsys, f"--flagfile=/dev/fd/{read}")
  finally:
    os.close(read)
  assert (f"error: --flagfile=/dev/fd/{read}: a pipe (such as a shell's "
          "<(...)) or FIFO; its flags are read twice") in error, error


def test_a_flagfile_that_reads_the_same_twice_passes(monkeypatch):
  """/dev/null (a common "no extra flags" default) is no regular file, but
  reads the same each time: refused by the pipe check at first (session
  106's review)."""
  argv = ["trm.main", _GPT_CPU, "--flagfile=/dev/null", "--workdir=/tmp/run"]
  flag_values = _trm_main_flags(monkeypatch, argv)
  assert config_lib.parse_flags(argv) == ["trm.main"]
  assert flag_values.workdir == "/tmp/run"


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
    # Before: "runs are measured in steps" (no epochs here then).
    ("--config.num_train_epochs=3", "the passes over the training data are "
     "config.num_epochs here"),
    ("--config.keep_ckpt_steps=1000", "config.keep_checkpoint_every is "
     "big_vision's keep_ckpt_steps"),
    ("--config.ici_tensor_parallelism=4", "config.mesh.model"),
    ("--config.dataset_type=synthetic", "config.data.source"),
    ("--config.base_output_directory=gs://b", "--workdir=DIR"),
    ("--config.data_shuffle_seed=3", "config.data_seed is MaxText's"),
    ("--config.z_loss_multiplier=1e-4", "config.z_loss is MaxText's"),
    ("--config.metric_for_best_model=accuracy", "config.best_metric (e.g. "),
])
def test_maxtext_hf_and_big_vision_names_name_what_replaces_them(
    monkeypatch, capsys, flag, needle):
  assert needle in _trm_main_error(monkeypatch, capsys, flag)


def test_integer_text_names_a_long_integers_digits_even_past_strs_limit():
  assert config_lib.integer_text(-12) == "-12"
  assert config_lib.integer_text(10**30 - 1) == "9" * 30
  assert config_lib.integer_text(-10**30) == "<an integer of 31 digits>"
  assert config_lib.integer_text(2**31, max_digits=5) == (
      "<an integer of 10 digits>")
  # str() raises ValueError past 4,300 digits (Python 3.11's limit).
  assert config_lib.integer_text(10**5000) == (
      "<an integer of about 5,000 digits>")
