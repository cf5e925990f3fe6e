"""The model families, by name: `config.model.name` -> the family's package.

A family package holds `program.py` (what to compile: `build(config, ctx,
shapes=None) -> Program`, plus `DISPLAY_NAME` and `owns_state(paths)`) and
`task.py` (what to feed: `build(config, workdir, ctx) -> Task`); see
`trm/core/task.py`. Optional hooks: in program.py, `data_shapes(config,
overrides)` (shapes for `trm.aot` without reading data) and
`check_sample_settings` / `build_sampler(config, ctx, settings)` (`trm.aot
--mode=sample`), `SIZE_FIELDS` (the config fields that set the tensor
shapes, named when a checkpoint's shapes differ) and
`attention_heads(model_config)` ({config.model field: head count} of the
heads its attention splits as 'activation_heads'; `warn_if_heads_unsplit`);
in task.py,
`load_eval_state` (`trm.evaluate`), `check_config(config)` (the family's
own fields, checked before the mesh or any data is built) and
`COUNTS_EPOCHS = True` (its build derives config.total_steps from
config.num_epochs, `config_lib.total_steps_from_epochs`; other families
refuse num_epochs).

Packages are imported only when asked for, so naming a family costs nothing.
"""
from __future__ import annotations

import functools
import importlib
from types import ModuleType

from absl import logging

_FAMILIES = {
    "trm": "trm.families.trm",      # Tiny Recursive Model on puzzles
    "dream": "trm.families.dream",  # DiffuCoder / Dream masked diffusion
    "gpt": "trm.families.gpt",      # nanoGPT's GPT-2
}


def register(name: str, package: str) -> None:
  """Adds a family (e.g. from a config file or a test): `package` is the
  import path of a folder with program.py and task.py."""
  if name in _FAMILIES and _FAMILIES[name] != package:
    raise ValueError(f"Model family {name!r} is already registered as "
                     f"{_FAMILIES[name]!r}.")
  _FAMILIES[name] = package


def names() -> list[str]:
  return sorted(_FAMILIES)


def package(name: str) -> str | None:
  """The import path of family `name`'s package (None: none registered)."""
  return _FAMILIES.get(name)


def _module(name: str, part: str) -> ModuleType:
  if name not in _FAMILIES:
    raise ValueError(f"config.model.name={name!r} is not a known model "
                     f"family; known: {', '.join(map(repr, names()))}.")
  module = f"{_FAMILIES[name]}.{part}"
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if not e.name or not module.startswith(e.name):
      raise  # the family's own code misses a dependency
    raise ValueError(
        f"Model family {name!r} is registered as package "
        f"{_FAMILIES[name]!r}, but {module} cannot be imported ({e}): check "
        "the package path given to families.register and PYTHONPATH.") from e


def program(name: str) -> ModuleType:
  """The family's program module (what to compile)."""
  return _module(name, "program")


def task(name: str) -> ModuleType:
  """The family's task module (what to feed)."""
  return _module(name, "task")


def check_config(config) -> None:
  """The family's own config checks, if it has any (one-line ValueErrors
  naming the field, in the family's own names: nanoGPT's max_iters, not the
  trainer's total_steps it is tied to)."""
  check = getattr(task(config.model.name), "check_config", None)
  if check is not None:
    check(config)


def unsplit_heads(config, ctx) -> str | None:
  """The line `trm.core.mesh.unsplit_heads` gives for the family's attention
  heads (its program's `attention_heads`) on `ctx`'s mesh and rules, or
  None (also for a family without the hook)."""
  heads = getattr(program(config.model.name), "attention_heads", None)
  if heads is None:
    return None
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  return mesh_lib.unsplit_heads(heads(config.model), ctx.mesh, ctx.rules,
                                config.mesh)


def warn_if_heads_unsplit(config, ctx) -> str | None:
  """Logs `unsplit_heads`'s line, once a process, and returns it: `trm.main`
  after the task has adopted a checkpoint's shapes, `trm.aot` (one
  compile per slice count, --forecast's rows) after the family's program,
  whose own refusals (Dream's replicated weights) come first. Before it a
  mesh.model wider than the heads said only what XLA and the
  replicated-weights warning say, neither naming the heads."""
  message = unsplit_heads(config, ctx)
  if message:
    _warn_once(message)
  return message


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
  logging.warning("%s", message)


def build_task(config, workdir: str, ctx):
  """The Task of `config.model.name` (what `trm.main` hands the loop)."""
  return task(config.model.name).build(config, workdir, ctx)


def _program_of_state(paths) -> ModuleType | None:
  """The program module of the family whose train state has these tensor
  paths ('params/...', 'carry/...'), or None when none claims them."""
  for name in names():
    module = program(name)
    if module.owns_state(paths):
      return module
  return None


def name_of_state(paths) -> str | None:
  """The display name of the family whose train state has these tensor
  paths, or None when none claims them."""
  module = _program_of_state(paths)
  return module.DISPLAY_NAME if module is not None else None


def size_fields_of_state(paths) -> str | None:
  """The config fields that set the tensor shapes of the family whose train
  state has these paths (its program's optional SIZE_FIELDS, in the names
  its config files use), or None."""
  return getattr(_program_of_state(paths), "SIZE_FIELDS", None)


def display_name(name: str) -> str:
  return program(name).DISPLAY_NAME
