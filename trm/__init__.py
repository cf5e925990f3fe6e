"""Mesh-sharded training of Tiny Recursive Models (and friends) in JAX."""
import atexit as _atexit
import sys as _sys

from trm.core import cpu_threads as _cpu_threads
from trm.core import huge_pages as _huge_pages

# `python -m trm.X`: restart once with malloc on huge pages, before jax loads.
_huge_pages.restart_with_huge_pages()
# Before jax creates its CPU client: forced host devices need a pool of
# threads that their collectives cannot starve (trm/core/cpu_threads.py).
_cpu_threads.widen_cpu_pool()


@_atexit.register  # before jax loads: it then runs after jax's callbacks
def _ignore_late_stop_signals():
  cli = _sys.modules.get("trm.core.cli")
  if cli is not None:
    cli.ignore_late_stop_signals()


_LAZY = ("DiffusionLM",)


def __dir__():
  # Tab completion in a notebook lists what `__getattr__` gives, too.
  return sorted(set(globals()) | set(_LAZY))


def __getattr__(name):
  # `from trm import DiffusionLM` without importing jax at `import trm`.
  if name == "DiffusionLM":
    # On a host with no accelerator jax would otherwise start libtpu (when
    # installed) and print its E0000 TPU_WORKER_HOSTNAMES complaints; the
    # command-line tools do the same before jax loads (cli.default_to_cpu).
    from trm.core import cli  # pylint: disable=g-import-not-at-top
    cli.default_to_cpu()
    from trm.families.dream.inference import DiffusionLM  # pylint: disable=g-import-not-at-top
    return DiffusionLM
  raise AttributeError(f"module 'trm' has no attribute {name!r}")
