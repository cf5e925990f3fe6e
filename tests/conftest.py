"""Test set-up: 8 forced CPU devices, set before jax initialises its backend."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Each test's command-line runs compile afresh (what they check includes
# compile-time errors); tests/core/test_compile_cache.py turns it on.
os.environ.setdefault("TRM_COMPILATION_CACHE", "off")
_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

# Test modules share fixtures by module name (`from test_train import
# tiny_config`) across the folders that mirror the package, so every test
# folder is importable from every other.
import sys  # pylint: disable=g-import-not-at-top,wrong-import-position

_TESTS = os.path.dirname(os.path.abspath(__file__))
for _dir, _, _ in os.walk(_TESTS):
  if "__pycache__" not in _dir and _dir not in sys.path:
    sys.path.insert(0, _dir)


# CI runs two processes that each take a whole file (`--dist loadfile`) as
# they come free. Given the longest files first, neither is left running a
# long file alone at the end (longest-processing-time-first scheduling):
# `tests/file_seconds.json` holds each file's seconds from a `--durations=0`
# run (refresh: `python tests/file_seconds.py LOG`); `.ci/run` passes
# `--no-loadscope-reorder` so xdist keeps this order instead of ordering
# files by their number of tests. Within a file, the order is unchanged.
import json  # pylint: disable=g-import-not-at-top,wrong-import-position


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
