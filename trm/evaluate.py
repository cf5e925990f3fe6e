r"""Evaluate a TRM checkpoint on its dataset's test split.

  python -m trm.evaluate --config=configs/trm_arc.py:arc1 \
      --checkpoint=runs/arc1 --output_dir=runs/arc1-eval
  python -m trm.evaluate --config=configs/trm_sudoku.py \
      --checkpoint=upstream/step_65100 --output_dir=runs/sudoku-eval

--checkpoint is a `trm.main` workdir (its newest checkpoint; the EMA
weights when the config uses EMA) or an upstream PyTorch TRM checkpoint
(`state_dict` file, or the same tensors as .safetensors; read with
`torch.load(weights_only=True)`). The config must describe the run that
produced it (sizes, cycles, dataset). Prints the paper's metric (exact
accuracy for Sudoku and Maze, pass@2 for ARC) and writes every metric to
`<output_dir>/eval.json`, with ARC's `submission.json` and a sample sheet.
"""
from __future__ import annotations

import json
import os

from absl import app, flags
from ml_collections import config_flags

from trm import cli
from trm import config_lib

# The number each paper table reports, per dataset builder.
PAPER_METRIC = {"sudoku": "exact_accuracy", "maze": "exact_accuracy",
                "arc": "ARC/pass@2"}


def load_state(checkpoint: str, task, abstract, shardings, mesh, rules):
  """(train state, description) from a workdir or an upstream file."""
  import jax  # pylint: disable=g-import-not-at-top
  from trm import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm import state as state_lib  # pylint: disable=g-import-not-at-top
  saved = os.path.join(checkpoint, "checkpoints")
  names = ("params", "ema_params", "buffers", "puzzle_emb")
  if os.path.isdir(saved):
    fields, step = ckpt_lib.restore_fields(
        saved, {k: getattr(abstract, k) for k in names},
        family="TRM (puzzle)")
    state = state_lib.init_state(task.init_fn, mesh, rules, shardings)
    return state.replace(**fields), f"{saved} step {step}"
  if not os.path.isfile(checkpoint):
    raise FileNotFoundError(
        f"--checkpoint={checkpoint} is neither a trm.main workdir (with a "
        "checkpoints/ directory) nor an upstream PyTorch checkpoint file.")
  from trm.models import torch_import  # pylint: disable=g-import-not-at-top
  params, buffers, puzzle_emb = torch_import.load_torch_checkpoint(
      checkpoint, task.model.cfg)
  state = state_lib.init_state(task.init_fn, mesh, rules, shardings)
  state = state.replace(
      params=jax.device_put(params, shardings.params),
      ema_params=jax.device_put(params, shardings.ema_params),
      buffers=jax.device_put(buffers, shardings.buffers),
      puzzle_emb=jax.device_put(puzzle_emb, shardings.puzzle_emb))
  return state, f"{checkpoint} (upstream PyTorch)"


def evaluate_checkpoint(config, checkpoint: str, output_dir: str):
  """(metrics, where the weights came from); collective on every process."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from trm import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm import tasks  # pylint: disable=g-import-not-at-top
  from trm import train  # pylint: disable=g-import-not-at-top

  if config.model.name != "trm":
    raise ValueError(f"config.model.name={config.model.name!r}: trm.evaluate "
                     "evaluates TRM checkpoints; DiffuCoder runs report "
                     "their held-out loss in trm.main.")
  os.makedirs(output_dir, exist_ok=True)
  mesh = mesh_lib.make_mesh(config.mesh)
  rules = mesh_lib.logical_rules(config)
  mesh_lib.check_batch_size(config.data.eval_batch_size, mesh, rules,
                            "data.eval_batch_size")
  task = tasks.build(config, output_dir, mesh, rules)
  abstract, shardings = state_lib.abstract_state(task.init_fn, mesh, rules)
  state, source = load_state(checkpoint, task, abstract, shardings, mesh,
                             rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    eval_step = jax.jit(task.eval_step,
                        in_shardings=(shardings, task.batch_shardings))
    results = train.evaluate(eval_step, state, task.eval_source,
                             task.batch_shardings, task.make_eval_hook(),
                             output_dir)
  results = {k: float(v) for k, v in results.items()}
  if jax.process_index() == 0:
    with open(os.path.join(output_dir, "eval.json"), "w") as f:
      json.dump(dict(results, checkpoint=source), f, indent=1)
  return results, source


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  results, source = evaluate_checkpoint(config, _CHECKPOINT.value,
                                        _OUTPUT_DIR.value)
  metric = PAPER_METRIC.get(config.data.name)
  print(f"checkpoint: {source}")
  for key in sorted(results):
    print(f"{key}: {results[key]:.4f}")
  if metric in results:
    print(f"paper metric {metric}: {100 * results[metric]:.2f}%")


def define_flags():
  global _CONFIG, _CHECKPOINT, _OUTPUT_DIR
  _CONFIG = config_flags.DEFINE_config_file("config", None, "TRM config.",
                                            lock_config=True)
  _CHECKPOINT = flags.DEFINE_string(
      "checkpoint", None, "trm.main workdir, or an upstream PyTorch TRM "
      "checkpoint file.")
  _OUTPUT_DIR = flags.DEFINE_string(
      "output_dir", "runs/evaluate", "Where eval.json, submission.json and "
      "sheet.png go (and the dataset, when config.data.data_dir is '').")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "checkpoint"])
  cli.run(main)
