"""The held-out metric that ranks checkpoints and drives early stopping:
Hugging Face's `metric_for_best_model` and `greater_is_better`.

`config.best_metric` (default 'eval/loss') names one figure of a step's
evaluation (its eval_<step>.json); `config.best_metric_mode` says which way
is better: 'min', 'max', or 'auto' (the default): 'min' for a name ending
in 'loss', 'max' for one holding 'accuracy' or 'pass@' (TRM's paper metric
eval/exact_accuracy, ARC's eval/ARC/pass@2), any other name must say.

Everything that ranks steps works on the step's *score*, the metric itself
for 'min' and its negation for 'max', so lower is better everywhere: keep-N's
best step (the score is the step's Orbax metric, `checkpoint.EVAL_LOSS`),
`--step=best` and init_checkpoint=WORKDIR/checkpoints/best,
always_save_checkpoint=False's "improved", and early stopping's best. With
the defaults the score is eval/loss and the records are those of before.

A record written under another metric (a resume that changed it) is told
apart by `tag`, kept in the step's Orbax metric and custom metadata: the
run then re-ranks its checkpoints from the eval files (which hold every
metric), takes its best from them, and starts the early-stopping count
afresh (`checkpoint.rank_saved_steps`, `trm.core.train`).
"""
from __future__ import annotations

import math

DEFAULT = ("eval/loss", "min")
MODES = ("auto", "min", "max")
# The Orbax metric's and the custom metadata's key for `tag`.
TAG = "best_metric"


def _mode(name: str, mode: str) -> str | None:
  if mode != "auto":
    return mode
  if name.endswith("loss"):
    return "min"
  if "accuracy" in name or "pass@" in name:
    return "max"
  return None


def spec(config) -> tuple[str, str]:
  """(metric name, 'min' or 'max') of `config` (checked by `check_config`):
  a name without the 'eval/' prefix gets it, as Hugging Face adds 'eval_'."""
  name = config.get("best_metric", DEFAULT[0])
  if not name.startswith("eval/"):
    name = "eval/" + name
  return name, _mode(name, config.get("best_metric_mode", "auto"))


def check_config(config) -> None:
  """One line naming the field for a best_metric or best_metric_mode that
  could only fail, or silently rank wrong, later."""
  name = config.get("best_metric", DEFAULT[0])
  mode = config.get("best_metric_mode", "auto")
  if not isinstance(name, str) or not name.removeprefix("eval/"):
    raise ValueError(
        f"config.best_metric={name!r} must name a held-out metric, as in the "
        "run's eval_<step>.json (e.g. 'eval/loss', 'eval/exact_accuracy').")
  if mode not in MODES:
    raise ValueError(
        f"config.best_metric_mode={mode!r} must be 'min' (lower is better), "
        "'max' (higher is better) or 'auto' (min for a loss, max for an "
        "accuracy).")
  if spec(config)[1] is None:
    raise ValueError(
        f"config.best_metric={name!r} with best_metric_mode='auto': which "
        "way is better cannot be told from the name (auto knows '...loss' "
        "as min, '...accuracy' and 'pass@' as max); set best_metric_mode "
        "to 'min' or 'max'.")


def tag(metric: tuple[str, str]) -> dict | None:
  """What a record written under `metric` carries (None for the default:
  the records of before, which carry nothing)."""
  return None if metric == DEFAULT else {"name": metric[0],
                                         "mode": metric[1]}


def of_tag(record) -> tuple[str, str]:
  """The metric a record carrying `record` (`tag`'s; absent: None) was
  written under; something unreadable reads as no metric at all."""
  if record is None:
    return DEFAULT
  if isinstance(record, dict):
    return (str(record.get("name")), str(record.get("mode")))
  return ("?", "?")


def score(results: dict, metric: tuple[str, str]) -> float | None:
  """The step's score (lower is better) from its evaluation `results`;
  None if they hold no such number (a NaN stays NaN: it never improves)."""
  value = results.get(metric[0]) if isinstance(results, dict) else None
  if type(value) not in (int, float):
    try:
      value = float(value)  # a NumPy or JAX scalar
    except (TypeError, ValueError):
      return None
  value = float(value)
  return -value if metric[1] == "max" else value


def describe(metric: tuple[str, str]) -> str:
  return metric[0] if metric == DEFAULT else (
      f"{metric[0]} ({'higher' if metric[1] == 'max' else 'lower'} is "
      "better, config.best_metric)")


def check_reported(metric: tuple[str, str], reported, when: str) -> None:
  """One line if the task's evaluation does not report the metric;
  `reported`: the names it does."""
  if metric[0] in reported:
    return
  names = sorted(k for k in reported if k != "eval/seconds")
  raise ValueError(
      f"config.best_metric={metric[0]!r} is not a metric this task's "
      f"evaluation reports ({when}: {', '.join(names) or 'none'}); set it to "
      "one of them.")


def display(value: float, metric: tuple[str, str]) -> float:
  """The metric's own value of a score (for log lines)."""
  return -value if metric[1] == "max" and math.isfinite(value) else value
