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
