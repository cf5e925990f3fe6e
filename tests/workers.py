"""Waiting for the worker processes of a multi-process test."""
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
