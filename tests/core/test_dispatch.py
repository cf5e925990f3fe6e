"""The host stays a bounded number of calls ahead; unbounded, XLA:CPU's
multi-device collectives deadlock and abort the process unless its pool has
the threads `import trm` gives it (trm/core/cpu_threads.py)."""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import repo

from trm.core import dispatch


def _depth_benchmark(*args, steps=3000, lines=1):
  """benchmarks/reliability/cpu_dispatch_depth.py's last line (or last
  `lines` lines, one a depth): `steps` steps on 8 CPU devices
  (data-parallel unless `--mesh` says otherwise), in a fresh process."""
  run = subprocess.run(
      [sys.executable, os.path.join(repo.ROOT, "benchmarks", "reliability",
                                    "cpu_dispatch_depth.py"),
       f"--steps={steps}", *args], capture_output=True, text=True,
      timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  found = run.stdout.strip().splitlines()[-lines:]
  return found[0] if lines == 1 else found


def test_keeps_at_most_max_in_flight_unfinished_calls():
  bound = dispatch.DispatchBound(max_in_flight=2)
  step = jax.jit(lambda x: x @ x / 64.0)
  x, markers = jnp.ones((64, 64)), []
  for _ in range(10):
    x = bound(step(x))
    markers.append(x)
    assert len(bound) <= 2
    # Everything but the newest two has finished by the time the call returns.
    assert all(m.is_ready() for m in markers[:-2])


def test_outputs_pass_through_and_bad_depth_is_refused():
  bound = dispatch.DispatchBound(1)
  outputs = {"loss": 1.5, "metrics": (jnp.zeros(2), "text")}
  assert bound(outputs) is outputs
  assert bound(3.0) == 3.0 and len(bound) == 1   # no array: nothing to wait on
  with pytest.raises(ValueError, match="max_in_flight=0 must be >= 1"):
    dispatch.DispatchBound(0)


# The 2x2x2 loop (a small program after each step, as the trainer's metrics
# merge): unbounded, it aborted in XLA's own pool of 8 in 5 of 5 runs on the
# idle 2-core host (the slow test below); the data-parallel one (`--mesh=8`)
# finished there on a fast day, so it shows nothing either way.
def test_a_long_unread_loop_on_8_cpu_devices_finishes():
  # XLA's own pool (8 threads for 8 devices on this host): the bound alone.
  line = _depth_benchmark("--depths=2", "--pool_threads=8", "--mesh=2x2x2",
                          "--collective_timeout=5", steps=1000)
  assert line.startswith("pool 8, depth 2: finished in"), line


def test_with_the_pool_import_trm_sets_an_unbounded_loop_finishes():
  """Without the bound, the queued steps finish in the pool that `import
  trm` sizes. The collective timeout is 5 s, so a deadlock fails in
  seconds."""
  line = _depth_benchmark("--depths=none", "--mesh=2x2x2",
                          "--collective_timeout=5", steps=1000)
  assert re.fullmatch(r"pool \d+, depth none: finished in [0-9.]+ s",
                      line), line


# `slow` (11-27 s, a 5 s collective timeout in a fresh process): the test
# above runs the same loop with the product's pool; this one shows only
# why that pool and the bound exist.
@pytest.mark.slow
def test_without_the_bound_in_xlas_own_pool_the_same_loop_deadlocks():
  """The reason for both, on this host: XLA aborts the process."""
  line = _depth_benchmark("--depths=none", "--collective_timeout=5",
                          "--pool_threads=8", "--mesh=2x2x2", steps=1000)
  if "finished" in line:
    pytest.skip("this host's XLA:CPU pool kept up with 1000 queued steps")
  assert "XLA's collective timeout (5 s)" in line, line


# `slow` (about 25 s): XLA:CPU's limit of 32 programs in flight a device,
# which cpu_threads.py and dispatch.py derive their numbers from. In XLA's
# own pool of 8 a loop of one program a step kept 31 steps ahead never
# parks a dispatch; 32 ahead, the 33rd call's dispatch waits for a slot on
# the threads the running step needs. The loop that never waits tells a
# host that keeps up (skip) from a changed limit (fail).
@pytest.mark.slow
def test_in_xlas_own_pool_31_steps_ahead_finish_and_32_abort():
  below, at, unbounded = _depth_benchmark(
      "--mesh=2x2x2", "--eager_ops=0", "--depths=31,32,none",
      "--pool_threads=8", "--collective_timeout=5", steps=1000, lines=3)
  assert below.startswith("pool 8, depth 31: finished in"), below
  if "finished" in at and "finished" in unbounded:
    pytest.skip("this host's XLA:CPU pool kept up with 1000 queued steps")
  assert "XLA's collective timeout (5 s)" in unbounded, unbounded
  assert "XLA's collective timeout (5 s)" in at, (
      f"32 steps ahead finished where the unbounded loop aborted: XLA's "
      f"limit of 32 programs a device has changed ({at})")
