"""XLA:CPU's pool gets twice the forced devices' threads, before jax starts,
unless the user chose its size."""
import os
import subprocess
import sys

import repo

from trm.core import cpu_threads


def _env(**values):
  return {k: str(v) for k, v in values.items()}


def test_the_device_count_is_read_as_jax_reads_it():
  flags = "--xla_foo=1 --xla_force_host_platform_device_count=4"
  assert cpu_threads.forced_cpu_devices(_env(XLA_FLAGS=flags)) == 4
  # XLA takes a repeated flag's last value; JAX_NUM_CPU_DEVICES wins.
  assert cpu_threads.forced_cpu_devices(
      _env(XLA_FLAGS=flags + " --xla_force_host_platform_device_count=16")
  ) == 16
  assert cpu_threads.forced_cpu_devices(
      _env(XLA_FLAGS=flags, JAX_NUM_CPU_DEVICES=6)) == 6
  # jax's default -1 (unset) leaves it to the flag.
  assert cpu_threads.forced_cpu_devices(
      _env(XLA_FLAGS=flags, JAX_NUM_CPU_DEVICES=-1)) == 4
  # jax reads it with int(): "+8" is 8; what int() refuses, jax refuses.
  assert cpu_threads.forced_cpu_devices(
      _env(XLA_FLAGS=flags, JAX_NUM_CPU_DEVICES="+8")) == 8
  assert cpu_threads.forced_cpu_devices(
      _env(XLA_FLAGS=flags, JAX_NUM_CPU_DEVICES="--8")) == 4
  assert cpu_threads.forced_cpu_devices({}) == 1
  assert cpu_threads.forced_cpu_devices(
      _env(XLA_FLAGS="--xla_force_host_platform_device_count=x")) == 1


def test_the_pool_holds_two_programs_on_every_device():
  assert cpu_threads.pool_threads(8, cores=2) == 16
  assert cpu_threads.pool_threads(8, cores=64) == 64
  assert cpu_threads.pool_threads(1, cores=2) == 2


def test_widen_sets_ours_keeps_the_users_and_follows_a_new_device_count():
  eight = "--xla_force_host_platform_device_count=8"
  environ = _env(XLA_FLAGS=eight)
  assert cpu_threads.widen_cpu_pool(environ, cores=2) == 16
  assert environ["PJRT_NPROC"] == "16"
  # A child process that inherits it with 4 devices sizes its own.
  environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
  assert cpu_threads.widen_cpu_pool(environ, cores=2) == 8
  assert environ["PJRT_NPROC"] == "8"
  # With one device XLA's own size comes back.
  environ["XLA_FLAGS"] = ""
  assert cpu_threads.widen_cpu_pool(environ, cores=2) is None
  assert "PJRT_NPROC" not in environ
  # The user's PJRT_NPROC is kept as it is, whatever its size.
  users = _env(XLA_FLAGS=eight, PJRT_NPROC=3)
  assert cpu_threads.widen_cpu_pool(users, cores=2) is None
  assert users == _env(XLA_FLAGS=eight, PJRT_NPROC=3)
  # NPROC is a floor: a smaller pool is the one that deadlocks.
  assert cpu_threads.widen_cpu_pool(_env(XLA_FLAGS=eight, NPROC=3),
                                    cores=2) == 16
  assert cpu_threads.widen_cpu_pool(_env(XLA_FLAGS=eight, NPROC=40),
                                    cores=2) == 40
  # A one-device child that sets NPROC gets it: ours would shadow it.
  child = _env(NPROC=3, PJRT_NPROC=16, TRM_PJRT_NPROC=16)
  assert cpu_threads.widen_cpu_pool(child, cores=2) is None
  assert child == _env(NPROC=3)
  # No forced devices: nothing is set.
  empty = {}
  assert cpu_threads.widen_cpu_pool(empty, cores=2) is None and not empty


# In a fresh process with 8 forced devices: XLA's intra-op pool threads
# (named tf_XLAEigen), which PJRT_NPROC sizes like the client's pool.
_EIGEN_THREADS = """
import collections, os
{imports}
jax.numpy.ones(8).block_until_ready()
names = collections.Counter(
    open(f"/proc/self/task/{{t}}/comm").read().strip()
    for t in os.listdir("/proc/self/task"))
print(names["tf_XLAEigen"], jax.device_count())
"""


def _fresh_process(imports):
  env = {k: v for k, v in os.environ.items()
         if k not in ("PJRT_NPROC", "NPROC", cpu_threads.OURS_ENV)}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=repo.ROOT,
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  return subprocess.run(
      [sys.executable, "-c", _EIGEN_THREADS.format(imports=imports)],
      env=env, capture_output=True, text=True, timeout=120)


def test_import_trm_gives_xla_the_threads_before_jax_makes_its_client():
  """XLA reads the variable: its pool has the threads, and jax its 8
  devices."""
  run = _fresh_process("import trm, jax")
  assert run.returncode == 0, run.stderr[-2000:]
  expected = cpu_threads.pool_threads(8, os.cpu_count())
  assert run.stdout.split() == [str(expected), "8"]
  assert "RuntimeWarning" not in run.stderr


def test_import_trm_after_jax_made_its_client_warns():
  run = _fresh_process("import jax; jax.devices(); import trm")
  assert run.returncode == 0, run.stderr[-2000:]
  # XLA's own pool, and a warning that says what to do.
  assert run.stdout.split() == [str(max(os.cpu_count(), 8)), "8"]
  assert "jax created its CPU client before `import trm`" in run.stderr
  assert "PJRT_NPROC=" in run.stderr
