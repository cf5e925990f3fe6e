"""The host stays a bounded number of calls ahead; unbounded, XLA:CPU's
multi-device collectives deadlock and abort the process."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
import repo

from trm.core import dispatch


def _depth_benchmark(*args):
  """benchmarks/reliability/cpu_dispatch_depth.py's line for one depth: 3,000
  data-parallel steps on 8 CPU devices, in a fresh process."""
  run = subprocess.run(
      [sys.executable, os.path.join(repo.ROOT, "benchmarks", "reliability",
                                    "cpu_dispatch_depth.py"),
       "--steps=3000", *args], capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  return run.stdout.strip().splitlines()[-1]


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


def test_a_long_unread_loop_on_8_cpu_devices_finishes():
  line = _depth_benchmark("--depths=2")
  assert line.startswith("depth 2: finished in"), line


# `slow` (11-27 s, a 5 s collective timeout in a fresh process): the
# default run keeps the bound's own test above, which runs the same loop
# through the product's path; this one shows only why the bound exists.
@pytest.mark.slow
def test_without_the_bound_the_same_loop_deadlocks():
  """The reason for the bound, on this host: XLA aborts the process."""
  line = _depth_benchmark("--depths=none", "--collective_timeout=5")
  if "finished" in line:
    pytest.skip("this host's XLA:CPU pool kept up with 3000 queued steps")
  assert "XLA's collective timeout (5 s)" in line, line
