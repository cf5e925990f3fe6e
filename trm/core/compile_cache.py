"""JAX's persistent compilation cache, on by default for every `python -m
trm.*` command: a second run of the same program (the same model, shapes,
mesh and flags) loads its executables instead of compiling them again.

Where: `--compilation_cache=DIR`, else $TRM_COMPILATION_CACHE, else
$XDG_CACHE_HOME/trm/jax (~/.cache/trm/jax). `off` (flag or variable) turns
it off. JAX evicts the least recently used entries beyond
`--compilation_cache_max_gb` (default 2), so the directory never grows
without bound. On CPU, a program whose collectives span several device
groups is never written (`trm.core.cpu_collectives`: loaded back, it can
deadlock); the process that compiled it keeps it in memory instead.
"""
from __future__ import annotations

import collections
import os
import sys
import threading

from trm.core import cpu_collectives

ENV = "TRM_COMPILATION_CACHE"
OFF = ("off", "none", "0", "false", "no")
DEFAULT_MAX_GB = 2.0
# Compiles shorter than this are not worth a file (jax's default is 1 s;
# the tiny CPU programs of a sampling loop add up to seconds).
MIN_COMPILE_SECONDS = 0.2


def default_dir() -> str:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return os.path.join(base, "trm", "jax")


def resolve(setting: str | None) -> str | None:
  """The cache directory for a flag value (None: unset), or None if off."""
  # Blank (e.g. `TRM_COMPILATION_CACHE=" "`) is unset: it was a directory
  # named ' ' in the current one.
  value = (setting or "").strip() or os.environ.get(ENV, "").strip()
  if value.lower() in OFF:
    return None
  return os.path.abspath(os.path.expanduser(value or default_dir()))


def configure(setting: str | None, max_gb: float = DEFAULT_MAX_GB
              ) -> str | None:
  """Turns the cache on (before the first compile); returns its directory,
  or None when it is off or cannot be made (said in one line)."""
  if not 0 < max_gb < float("inf"):  # inf: int() raised OverflowError
    raise ValueError(f"--compilation_cache_max_gb={max_gb}: must be a "
                     "finite number > 0 (turn the cache off with "
                     "--compilation_cache=off).")
  # Also when off here: JAX's own JAX_COMPILATION_CACHE_DIR may turn it on.
  _keep_deadlock_prone_cpu_programs_out()
  path = resolve(setting)
  if path is None:
    return None
  try:
    os.makedirs(path, exist_ok=True)
    if not os.access(path, os.W_OK):
      raise PermissionError(f"{path} is not writable")
  except OSError as error:
    sys.stderr.write(f"warning: compilation cache off: cannot use {path} "
                     f"({error}); set --compilation_cache=DIR or {ENV}.\n")
    return None
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs",
                    MIN_COMPILE_SECONDS)
  if _has_filelock():
    jax.config.update("jax_compilation_cache_max_size",
                      int(max_gb * 2**30))
  else:
    # JAX bounds the cache with file locks; with a bound set and no
    # `filelock` it fails every cache read (one warning per compile), so
    # the cache would never hit.
    sys.stderr.write(f"warning: compilation cache {path} has no size bound "
                     "(JAX needs the filelock package for "
                     "--compilation_cache_max_gb: pip install filelock).\n")
  return path


# The executables of such programs that this process compiled, by cache
# key, most recently used last: a second jit of the same program here (a
# run restarted in the same process, a notebook's second call) runs the
# executable compiled for the first instead of compiling it again. It is
# the same object, never bytes loaded back, so the deadlock above does not
# apply. Bounded: each holds its compiled code.
_IN_PROCESS_MAX = 32
_in_process: "collections.OrderedDict[str, tuple]" = collections.OrderedDict()
_in_process_lock = threading.Lock()  # JAX may compile on several threads


def _keep_deadlock_prone_cpu_programs_out() -> None:
  """Wraps JAX's cache read and write so that an XLA:CPU program whose
  collectives span several device groups is compiled, never loaded
  (`trm.core.cpu_collectives`); this process keeps its own in memory
  (`_in_process`). Done once per process; a JAX without these functions
  is left as it is."""
  try:
    from jax._src import compilation_cache as jax_cache  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  read = getattr(jax_cache, "get_executable_and_time", None)
  write = getattr(jax_cache, "put_executable_and_time", None)
  if read is None or write is None or getattr(read, "_trm_guard", False):
    return

  def get_executable_and_time(cache_key, compile_options, backend, *args,
                              **kwargs):
    with _in_process_lock:
      kept = _in_process.get(cache_key)
      if kept is not None and kept[0] is backend:  # not a client since closed
        _in_process.move_to_end(cache_key)
        return kept[1], kept[2]
    executable, seconds = read(cache_key, compile_options, backend, *args,
                               **kwargs)
    if executable is not None and cpu_collectives.deadlock_prone(
        getattr(backend, "platform", ""), executable):
      return None, None  # an entry from before this guard: compile instead
    return executable, seconds

  def put_executable_and_time(cache_key, module_name, executable, backend,
                              *args, **kwargs):
    if cpu_collectives.deadlock_prone(getattr(backend, "platform", ""),
                                      executable):
      seconds = args[0] if args else kwargs.get("compile_time", 0)
      with _in_process_lock:
        _in_process[cache_key] = (backend, executable, seconds)
        _in_process.move_to_end(cache_key)
        while len(_in_process) > _IN_PROCESS_MAX:
          _in_process.popitem(last=False)
      return None
    return write(cache_key, module_name, executable, backend, *args,
                 **kwargs)

  get_executable_and_time._trm_guard = True  # pylint: disable=protected-access
  jax_cache.get_executable_and_time = get_executable_and_time
  jax_cache.put_executable_and_time = put_executable_and_time


def _has_filelock() -> bool:
  try:
    import filelock  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return False
  return True


def size_bytes(path: str) -> int:
  total = 0
  for root, _, files in os.walk(path):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except OSError:
        pass
  return total
