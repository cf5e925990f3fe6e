"""trm/core/metrics.py: a step's metric dict merges in one compiled call."""
import jax
import jax.numpy as jnp
import numpy as np
from clu import metrics as clu_metrics
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from trm.core import metrics as metrics_lib
from trm.core import state as state_lib


def _metrics(names, scale, sharding):
  return {name: clu_metrics.Average(
      total=jax.device_put(jnp.float32(scale * (i + 1)), sharding),
      count=jax.device_put(jnp.int32(i + 2), sharding))
          for i, name in enumerate(names)}


def test_merge_runs_every_metric_inside_one_compiled_call(monkeypatch):
  # Eager merges are two programs a metric on every device (XLA:CPU queues
  # them against its 32 programs a device; trm/core/dispatch.py). The cache
  # is emptied so the call is traced here even where another test (or a
  # rerun) merged the same names.
  metrics_lib._merged.clear_cache()  # pylint: disable=protected-access
  seen = []
  plain = clu_metrics.Average.merge

  def spy(self, other):
    seen.append(isinstance(self.total, jax.core.Tracer))
    return plain(self, other)

  monkeypatch.setattr(clu_metrics.Average, "merge", spy)
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  replicated = NamedSharding(mesh, P())
  names = [f"test_merge_metric_{i}" for i in range(12)]
  a = _metrics(names, 1.0, replicated)
  b = _metrics(names, 10.0, replicated)
  merged = metrics_lib.merge(a, b)
  assert seen == [True] * len(names)
  assert metrics_lib.merge(None, b) is b
  for i, name in enumerate(names):
    np.testing.assert_allclose(float(merged[name].total), 11.0 * (i + 1))
    assert int(merged[name].count) == 2 * (i + 2)
    assert merged[name].total.sharding.is_equivalent_to(replicated, 0)
  # A second merge of the same names reuses the compiled call.
  seen.clear()
  again = metrics_lib.merge(merged, b)
  assert not seen
  np.testing.assert_allclose(float(again[names[0]].total), 21.0)


def test_counters_merge_as_the_trainer_has_them():
  # The trainer's "lr" is a Counter: the newer value, or the larger one
  # with keep_max (a field jit must keep static).
  mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
  replicated = NamedSharding(mesh, P())

  def counters(value):
    value = jax.device_put(jnp.float32(value), replicated)
    one = jax.device_put(jnp.int32(1), replicated)
    return {"lr": state_lib.Counter(value, one),
            "peak": state_lib.Counter(value, one, keep_max=True)}

  merged = metrics_lib.merge(counters(3.0), counters(2.0))
  assert float(merged["lr"].value) == 2.0
  assert float(merged["peak"].value) == 3.0
  assert merged["peak"].keep_max and not merged["lr"].keep_max
  assert metrics_lib.compute(merged) == {"lr": 2.0, "peak": 3.0}
