"""Mesh-sharded training of Tiny Recursive Models (and friends) in JAX."""


def __getattr__(name):
  # `from trm import DiffusionLM` without importing jax at `import trm`.
  if name == "DiffusionLM":
    from trm.families.dream.inference import DiffusionLM  # pylint: disable=g-import-not-at-top
    return DiffusionLM
  raise AttributeError(f"module 'trm' has no attribute {name!r}")
