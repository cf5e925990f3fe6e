"""benchmarks/speed/startup.py: the resume it times is one the trainer
accepts."""
import ast
import os

from etils import epath

from trm.core import config_lib
from trm.core import config_record

import repo


def _config(script, flags):
  """The script's CONFIG with its `--config.KEY=VALUE` flags set."""
  path, variant = script.CONFIG.split(":")
  config = config_lib.load_config(os.path.join(repo.ROOT, path), variant)
  values = {}
  for flag in flags:
    key, value = flag.removeprefix("--config.").split("=", 1)
    values[key] = ast.literal_eval(value)
  return config_lib.set_values(config, values)


def test_the_resume_it_times_is_accepted(tmp_path):
  """DiffuCoder's cosine spans total_steps, so the resume two steps past
  the tiny run was refused as a change of how the run trains: the
  README's `python benchmarks/speed/startup.py --rounds=3` stopped at its
  first resume, before printing a row."""
  script = repo.load_script("benchmarks", "speed", "startup.py")
  trained = _config(script, script.TRAIN_FLAGS)
  (tmp_path / config_record.RECORD).write_text(trained.to_json_best_effort())
  resume = _config(script, script.RESUME_FLAGS)
  diff = config_record.check(resume, epath.Path(tmp_path),
                             script.TRAINED_STEPS)
  assert diff["total_steps"] == [script.TRAINED_STEPS,
                                 script.TRAINED_STEPS + 2]
