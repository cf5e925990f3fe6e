"""Step metrics (dicts of `clu.metrics.Metric`s): accumulate and read out."""
from __future__ import annotations

import jax


def merge(a, b):
  """Merges two metric dicts (None = empty)."""
  if a is None:
    return b
  return {k: a[k].merge(b[k]) for k in a}


def compute(metrics) -> dict[str, float]:
  """Host-side values; metrics with no rows yet are left out."""
  metrics = jax.device_get(metrics)
  return {k: float(m.compute()) for k, m in metrics.items()
          if int(m.count) > 0}
