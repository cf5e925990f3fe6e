"""XLA:TPU compiler options from the config, as MaxText passes its
LIBTPU_INIT_ARGS: `config.tpu_compiler_options = "--flag=value ..."`.

They go to `jit(...).lower(...).compile(compiler_options=...)` of the train
step, on TPU meshes only (XLA:CPU and XLA:GPU reject TPU flags by name), so
`trm.main` on a pod and `trm.aot`'s compile-only devices build the same
program. A flag that the user's LIBTPU_INIT_ARGS or XLA_FLAGS sets to
another value is refused there (`check_environment`), naming both.
"""
from __future__ import annotations

import os
import re

FIELD = "config.tpu_compiler_options"
# Where a user's XLA flags come from: libtpu's own, read when it starts
# (MaxText passes its flags there), and XLA's.
ENVIRONMENT = ("LIBTPU_INIT_ARGS", "XLA_FLAGS")
# XLA:TPU turns an all-gather feeding a matmul into a collective matmul (a
# "windowed einsum" loop that never holds the gathered operand) only where
# the matmul's users pass a check that XLA:GPU skips by default. On two or
# more slices that check refused the collective matmuls of a tensor-parallel
# step's backward: the gathered activations' layout then spread to the
# scanned layers' saved outputs, which XLA copied whole (v5p 128B on 2 x
# v5p-256: 107.48 against 94.62 GiB per chip on one slice, 43.1% against
# 53.3% forecast MFU; the 256B refused on 2 x v5p-1024; BUILD_NOTES
# "Session 97"). One-slice programs compiled the same with or without it.
COLLECTIVE_MATMUL_USERS = "--xla_tpu_skip_checking_windowed_einsum_users=true"
# MaxText's v4 runs (configs/v4/22b.sh): FSDP all-gathers overlap compute.
DEFAULT = f"--xla_enable_async_all_gather=true {COLLECTIVE_MATMUL_USERS}"
_TOKEN = re.compile(r"--([A-Za-z0-9_]+)=(\S+)")


def parse(text: str) -> dict[str, str]:
  """'--a=1 --b=true' -> {'a': '1', 'b': 'true'}; anything else is an
  error naming the field."""
  if not isinstance(text, str):
    raise ValueError(f"{FIELD}={text!r} must be a string of --flag=value "
                     "options.")
  options = {}
  for token in text.split():
    match = _TOKEN.fullmatch(token)
    if not match:
      raise ValueError(
          f"{FIELD}: {token!r} is not --flag=value (e.g. {DEFAULT!r}); "
          "environment settings such as TPU_MEGACORE belong in the "
          "environment, not here.")
    options[match.group(1)] = match.group(2)
  return options


def _flags_in(text: str) -> list[tuple[str, str]]:
  """The --flag=value tokens of an environment variable, in order (its
  other tokens are libtpu's business, not refused here)."""
  return [m.group(1, 2) for m in map(_TOKEN.fullmatch, text.split()) if m]


def _same(value: str) -> str:
  """A flag's value as XLA reads it: true/True/1 are one boolean."""
  return {"1": "true", "0": "false"}.get(value.lower(), value.lower())


def check_environment(options: dict[str, str], environ=None) -> None:
  """Refuses a flag that LIBTPU_INIT_ARGS (MaxText's way to pass them) or
  XLA_FLAGS sets to another value than `options`: the train step's compile
  was given both, and one of them was dropped without a word."""
  environ = os.environ if environ is None else environ
  for variable in ENVIRONMENT:
    conflicts = []
    for name, value in _flags_in(environ.get(variable, "")):
      if name in options and _same(options[name]) != _same(value):
        conflicts.append(f"--{name}={value} where {FIELD} sets "
                         f"{options[name]}")
    if conflicts:
      raise ValueError(
          f"{variable} sets {'; '.join(conflicts)}: both would reach the "
          f"train step's compile. Put the value wanted in {FIELD} "
          f"(--config.tpu_compiler_options='...') and leave it out of "
          f"{variable}.")


def for_mesh(config, mesh) -> dict[str, str]:
  """The options to compile with on this mesh: none off TPU."""
  options = parse(config.get("tpu_compiler_options", ""))
  if mesh.devices.flat[0].platform != "tpu":
    return {}
  check_environment(options)
  return options


# XLA:TPU's HBM a chip for the compile, in MiB (the chip's by default):
# a step is fitted to it or refused.
HBM_LIMIT = "xla_tpu_max_hbm_size_mib"


def hbm_limit_gib(config, chip_gib: float, environ=None) -> float:
  """The HBM a chip a TPU compile of this config fits its step to: the
  chip's, or less where `config.tpu_compiler_options` (or LIBTPU_INIT_ARGS)
  sets HBM_LIMIT. One above the chip is refused: a step XLA fitted to it
  need not fit the chip."""
  environ = os.environ if environ is None else environ
  limit = parse(config.get("tpu_compiler_options", "")).get(HBM_LIMIT)
  if limit is None:
    limit = next((value for name, value in _flags_in(
        environ.get("LIBTPU_INIT_ARGS", "")) if name == HBM_LIMIT), None)
  if limit is None:
    return chip_gib
  try:
    mib = int(limit)
  except ValueError:
    raise ValueError(f"{FIELD}: --{HBM_LIMIT}={limit} is not a whole "
                     "number of MiB.") from None
  if not 0 < mib <= chip_gib * 1024:
    raise ValueError(
        f"--{HBM_LIMIT}={limit}: XLA:TPU fits the step to that many MiB of "
        f"HBM, and the chip has {chip_gib * 1024:.0f}; set it from 1 to "
        "that, or leave it out for the chip's own.")
  return mib / 1024
