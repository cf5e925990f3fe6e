"""Waiting for the worker processes of a multi-process test, and the
XLA flags they start with; two threads overlapping one piece of work."""
import os
import socket
import subprocess
import threading

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


def free_port() -> int:
  """A port for the coordinator of a test's processes."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# How a worker script starts: with `process_id` None a one-process
# reference run, else process `process_id` of 2 joined at `address` (gloo).
JOIN = """
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
process_id = {process_id!r}
if process_id is not None:
  jax.distributed.initialize({address!r}, num_processes=2,
                             process_id=process_id)
"""

# A joined worker's last lines: leave the job at once, both processes
# together, rather than in interpreter teardown (where one worker of a
# finished test once hung past its bound under CI load).
LEAVE = """
if process_id is not None:
  jax.distributed.shutdown()
"""



def overlap(monkeypatch, owner, name: str, pause_after, work) -> dict:
  """Runs `work(thread_name)` in threads 'first' and 'second', the second
  while the first is paused midway: right after a call of `owner.name`
  (patched) for which `pause_after(*args)` holds. The second has 2 s to
  finish before the first goes on. Returns {thread name: the ValueError it
  raised}."""
  paused, release = threading.Event(), threading.Event()
  real = getattr(owner, name)

  def pausing(*args, **kwargs):
    result = real(*args, **kwargs)
    if threading.current_thread().name == "first" and pause_after(*args):
      paused.set()
      release.wait(60)
    return result

  monkeypatch.setattr(owner, name, pausing)
  errors = {}

  def run():
    thread = threading.current_thread().name
    try:
      work(thread)
    except ValueError as e:
      errors[thread] = e

  first = threading.Thread(target=run, name="first")
  second = threading.Thread(target=run, name="second")
  first.start()
  assert paused.wait(60)
  second.start()
  second.join(2)  # Without a lock it does all of its work here.
  release.set()
  first.join(60)
  second.join(60)
  return errors
