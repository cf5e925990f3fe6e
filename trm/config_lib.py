"""Helpers shared by the config files in `configs/`."""
from __future__ import annotations

import ml_collections


def parse_variants(arg: str | None, allowed: set[str]) -> set[str]:
  """'cpu,att' -> {'cpu', 'att'}; unknown names are a clear error."""
  names = {a.strip() for a in (arg or "").split(",") if a.strip()}
  unknown = names - allowed
  if unknown:
    raise ValueError(f"Unknown config variant(s) {sorted(unknown)}; choose "
                     f"from {sorted(allowed)} (e.g. --config=FILE.py:cpu).")
  return names


def default_logical_axis_rules():
  """Logical axis -> mesh axes, ordered, first match wins.

  Batch over data x fsdp; weights' model width over fsdp (ZeRO-3 style) and
  their inner widths (MLP, heads, vocabulary) over model (tensor parallel).
  The puzzle-embedding table is split by columns: its row count (876,406 for
  ARC-AGI-1) rarely divides a mesh axis, its width (512) does, and a column
  split keeps lookups and sparse updates local to each device.
  """
  return (
      ("activation_batch", ("data", "fsdp")),
      ("activation_length", None),
      ("activation_embed", None),
      ("activation_heads", "model"),
      ("embed", "fsdp"),
      ("mlp", "model"),
      ("heads", "model"),
      ("vocab", "model"),
      ("token", None),
      ("token_mlp", "model"),
      ("puzzle", None),
      ("puzzle_embed", "fsdp"),
      ("kv_heads", None),   # 4 key/value heads (Qwen2-7B): rarely divisible
      ("head_dim", None),
      ("layers", None),     # the stacked axis of scanned layers
  )


def mesh_config(data: int = -1, fsdp: int = 1, model: int = 1,
                dcn_data: int = 1) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      data=data,      # data-parallel size inside a slice (-1: the rest)
      fsdp=fsdp,      # fully-sharded data-parallel size inside a slice
      model=model,    # tensor-parallel size inside a slice
      dcn_data=dcn_data,  # number of slices, data parallel across them
      dcn_fsdp=1,     # fsdp across slices (rarely useful)
      dcn_model=1,    # tensor parallel across slices (rarely useful)
  ))


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file, as `--config=path:arg` would give it
  (for tests, benchmarks and notebooks)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f"trm_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def set_values(config: ml_collections.ConfigDict, values: dict):
  """Sets dotted keys ({'data.path': ...}) as --config.key=value would."""
  for key, value in values.items():
    node = config
    *path, last = key.split(".")
    for name in path:
      node = node[name]
    node[last] = value
  return config
