"""Waiting for the worker processes of a multi-process test, and the
XLA flags they start with."""
import os
import subprocess

import pytest


def wait_all(workers: list[subprocess.Popen], timeout: float) -> list[str]:
  """Each worker's combined output, once all have exited. A worker still
  running after `timeout` seconds (a collective waiting for a peer that
  died or diverged) fails the test, and every worker is killed first so
  none outlives it holding the coordinator's port or the CPUs."""
  outputs = []
  try:
    for worker in workers:
      outputs.append(worker.communicate(timeout=timeout)[0])
  except subprocess.TimeoutExpired:
    for worker in workers:
      worker.kill()
    tails = [(w.communicate()[0] or "")[-2000:] for w in workers]
    pytest.fail(f"worker processes still running after {timeout} s; their "
                "output tails:\n" + "\n----\n".join(tails))
  return outputs


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test's subprocess with `devices` CPU devices: the
  session's other flags (tests/conftest.py's optimization level) kept."""
  kept = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
          if not flag.startswith("--xla_force_host_platform_device_count")]
  return " ".join([f"--xla_force_host_platform_device_count={devices}"]
                  + kept)
