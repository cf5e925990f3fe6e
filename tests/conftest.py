"""Test set-up: 8 forced CPU devices, set before jax initialises its backend."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Both xdist workers may load libtpu for compile-only devices; without this
# (trm.aot sets it too, but a test file need not import it first) the
# second one fails on libtpu's lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# `import trm` sizes XLA:CPU's pool for those 8 devices (PJRT_NPROC, which
# subprocesses inherit and resize for their own count): in XLA's own pool
# of 8 a loop 32 programs a device ahead parks its next dispatch on the
# threads the running program needs, and the CI lost workers to aborts of
# that kind (BUILD_NOTES, "Session 101" and "Session 102").
import trm  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
# The tests' programs are tiny: compiling them, not running them, takes the
# time. XLA:CPU without LLVM's optimizations compiles them faster
# (tests/families/gpt/test_gpt_model.py: 121 -> 79 s on the 2-core host;
# the whole CI: BUILD_NOTES "CI time"). Tests compare programs compiled
# alike, or within tolerances, and none times a program. Another level:
# set --xla_backend_optimization_level in XLA_FLAGS. Subprocesses inherit
# it (tests/workers.py's xla_flags for those that choose a device count).
if "--xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# XLA:CPU's older loop emitters compile the tests' programs in half the
# time of its fusion emitters (tests/families/gpt/test_gpt_steps.py's 172
# compiles: 60.9 -> 27.9 s; BUILD_NOTES "Session 81"), for the same
# elementwise math. Only on the jaxlib setup.py pins: XLA aborts every
# process on an XLA_FLAGS name it does not know, and a later XLA may drop
# this one. Set the flag yourself to choose.
from jaxlib import version as _jaxlib_version  # pylint: disable=g-import-not-at-top,wrong-import-position

if (_jaxlib_version.__version__ == "0.10.2"
    and "--xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]):
  os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"

# One persistent compilation cache for the whole session: both xdist workers
# and every `python -m trm.*` a test runs (TRM_COMPILATION_CACHE). Many
# tests compile the same tiny programs in separate processes (the tiny
# trainer of test_train, test_reliability, test_config_record,
# test_checkpoint and test_cli: 353 s -> 297 s for those five files). The
# controller makes the directory before it starts the workers, which
# inherit it; it is removed at the end. A cache hit is the executable the
# same program compiled to, so results do not change; tests that count
# compiles turn it off (test_compiled_step.py), and test_compile_cache.py
# uses its own. TRM_TEST_COMPILATION_CACHE=off: every test compiles afresh.
import tempfile  # pylint: disable=g-import-not-at-top,wrong-import-position

_CACHE_ENV = "TRM_TEST_COMPILATION_CACHE"
if _CACHE_ENV not in os.environ:
  os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="trm_test_jax_cache_")
  os.environ[_CACHE_ENV + "_OWNER"] = str(os.getpid())
_CACHE = os.environ[_CACHE_ENV]
if _CACHE.lower() == "off":
  os.environ["TRM_COMPILATION_CACHE"] = "off"
else:
  os.environ["TRM_COMPILATION_CACHE"] = _CACHE
  from trm.core import compile_cache as _compile_cache  # pylint: disable=g-import-not-at-top,wrong-import-position
  _compile_cache.configure(_CACHE)

# Test modules share fixtures by module name (`from test_train import
# tiny_config`) across the folders that mirror the package, so every test
# folder is importable from every other.
import sys  # pylint: disable=g-import-not-at-top,wrong-import-position

_TESTS = os.path.dirname(os.path.abspath(__file__))
for _dir, _, _ in os.walk(_TESTS):
  if "__pycache__" not in _dir and _dir not in sys.path:
    sys.path.insert(0, _dir)

# Under the test command's --capture=sys, each xdist worker's descriptors 1
# and 2 (XLA's own messages) go to a file of its own: a failed test's report
# gets its part, and the summary prints it if the worker crashes
# (tests/worker_stderr.py).
import worker_stderr  # pylint: disable=g-import-not-at-top,wrong-import-position

worker_stderr.redirect_if_worker()


# CI runs two processes that each take a whole file (`--dist loadfile`) as
# they come free. Given the longest files first, neither is left running a
# long file alone at the end (longest-processing-time-first scheduling):
# `tests/file_seconds.json` holds each file's seconds from a `--durations=0`
# run (refresh: `python tests/file_seconds.py LOG`); `.ci/run` passes
# `--no-loadscope-reorder` so xdist keeps this order instead of ordering
# files by their number of tests. Within a file, the order is unchanged.
import json  # pylint: disable=g-import-not-at-top,wrong-import-position

import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


def pytest_collection_modifyitems(session, config, items):  # pylint: disable=unused-argument
  path = os.path.join(_TESTS, "file_seconds.json")
  if not os.path.exists(path):
    return
  with open(path, encoding="utf-8") as f:
    seconds = json.load(f)
  unknown = 30.0  # a new file: in the middle, until the table is refreshed
  order = {}
  for item in items:
    name = item.nodeid.split("::")[0]
    order.setdefault(name, (-seconds.get(name, unknown), len(order)))
  items.sort(key=lambda item: order[item.nodeid.split("::")[0]])


def pytest_unconfigure(config):  # pylint: disable=unused-argument
  if os.environ.get(_CACHE_ENV + "_OWNER") == str(os.getpid()):
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(_CACHE, ignore_errors=True)
  worker_stderr.unconfigure()


def pytest_configure(config):
  worker_stderr.configure(config)


def pytest_runtest_logreport(report):
  worker_stderr.record(report)


def pytest_runtest_logstart(nodeid, location):  # pylint: disable=unused-argument
  worker_stderr.phase_start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):  # pylint: disable=unused-argument
  report = yield
  worker_stderr.attach(report)
  return report


def pytest_terminal_summary(terminalreporter):
  worker_stderr.summarize(terminalreporter)


@pytest.fixture
def no_compilation_cache(monkeypatch):
  """The session's persistent compilation cache off for a test, in-process
  and for the commands it runs: for tests that count compiles, and for
  compiles to compile-only TPU devices (their executables cannot be loaded
  back: JAX warns and compiles again)."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("TRM_COMPILATION_CACHE", "off")
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  yield
  jax.config.update("jax_enable_compilation_cache", True)
  compilation_cache.reset_cache()
