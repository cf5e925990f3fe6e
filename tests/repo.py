"""Paths the tests share: the repository root (configs, benchmarks, data)."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(*parts: str):
  """A script of the repository (e.g. 'benchmarks', 'forecast', 'x.py')
  imported as a module named after its file."""
  path = os.path.join(ROOT, *parts)
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
