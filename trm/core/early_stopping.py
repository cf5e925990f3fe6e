"""Early stopping: Hugging Face's EarlyStoppingCallback over the held-out
loss (`eval/loss`), or config.best_metric, the figure that ranks checkpoints
for keeping (`trm.core.best_metric`: its score, lower is better, is what
is counted here, so a 'max' metric improves by rising more than the
threshold).

`config.early_stopping_patience` evaluations in a row that do not improve
on the best loss so far by more than `config.early_stopping_threshold`
stop the run (0: never, the default). As there, the best is that of every
earlier evaluation, and an evaluation improves when it is below the best by
more than the threshold (a NaN loss never does). The count and the best
travel with every checkpoint (`checkpoint.EARLY_STOPPING` in its
metadata), so a preempted
run resumes counting where it was (Hugging Face saves its callback's
counter in trainer_state.json likewise).

Unlike Hugging Face, where the stop holds for one run only (a resume
trains on to its next evaluation), the stop is the run's end: the stop
step is saved, and a rerun of the workdir finds its count at the patience
and only evaluates, as a finished run does. Raising the patience (or
setting it to 0) trains on from there, the count carrying on.
"""
from __future__ import annotations

import math

from absl import logging

from trm.core import best_metric as best_metric_lib


class EarlyStopping:
  """Counts evaluations without improvement; `exhausted` once they reach
  the patience."""

  def __init__(self, patience: int, threshold: float, best: float | None,
               count: int = 0, metric=best_metric_lib.DEFAULT):
    self.patience, self.threshold = patience, threshold
    self.metric = metric
    self.best = math.inf if best is None else best
    self.count = count
    self.warned = False  # `watch`: an evaluation without the metric

  @classmethod
  def resumed(cls, config, record, best: float | None) -> "EarlyStopping":
    """The run's counter: from a checkpoint's `record` (`record()`), else
    starting at `best` (the best loss the run knows) with no evaluation
    counted."""
    if isinstance(record, dict) and type(record.get("count")) is int:
      saved = record.get("best")
      best = float(saved) if type(saved) in (int, float) else best
      count = max(record["count"], 0)
    else:
      count = 0
    return cls(config.get("early_stopping_patience", 0),
               config.get("early_stopping_threshold", 0.0), best, count,
               best_metric_lib.spec(config))

  def watch(self, results: dict, counts: bool = True) -> None:
    """`update` with the score of an evaluation's `results`. One that lacks
    the metric changes nothing; with a patience set the first such one
    warns, naming the metrics reported, as the run then cannot stop early
    (config.best_metric's other names are refused before: eval/loss is the
    one a task may not report)."""
    score = best_metric_lib.score(results, self.metric)
    if score is None and self.patience and not self.warned:
      self.warned = True
      reported = sorted(k for k in results if k != "eval/seconds")
      logging.warning(
          "config.early_stopping_patience=%d watches %s, which this task's "
          "evaluation does not report (it reports: %s): the run never stops "
          "early. Set config.best_metric to one of those, or the patience "
          "to 0.", self.patience, self.metric[0],
          ", ".join(reported) or "none")
    self.update(score, counts)

  def update(self, loss: float | None, counts: bool = True) -> None:
    """One evaluation's held-out loss (None: the task reports none, nothing
    changes). `counts=False`: the starting weights' evaluation
    (config.eval_at_start), which sets the best only."""
    if loss is None:
      return
    loss = float(loss)
    if counts:
      self.count = 0 if loss < self.best - self.threshold else self.count + 1
    if loss < self.best:
      self.best = loss

  @property
  def exhausted(self) -> bool:
    return bool(self.patience) and self.count >= self.patience

  def record(self) -> dict:
    """What a checkpoint keeps (JSON: an infinite best is null)."""
    return {"best": self.best if math.isfinite(self.best) else None,
            "count": self.count}

  def reason(self) -> str:
    """Why the run stops, for the log line."""
    name, mode = self.metric
    best = best_metric_lib.display(self.best, self.metric)
    return (f"{self.count} evaluation(s) in a row with no {name} more "
            f"than {self.threshold:g} {'above' if mode == 'max' else 'below'}"
            f" the best ({best:.6g}; "
            f"config.early_stopping_patience={self.patience})")
