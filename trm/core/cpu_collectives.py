"""Which XLA:CPU executables must be compiled in the process that runs them.

An XLA:CPU program loaded back from bytes (the persistent compilation
cache, a `trm.aot --save_compiled` step) whose collectives span more than
one group of devices can deadlock on the forced CPU devices of one process:
one device waits in a collective over its `fsdp` peers while another waits
in one over its `model` peers, and XLA aborts after 40 s (jax 0.10.2;
BUILD_NOTES, "Session 55"). The same program compiled in the process has
not deadlocked in thousands of steps, and programs whose collectives all
span one group (a data-parallel step) have been loaded from the cache in
every test run since session 31 without one. So such programs are kept out
of the cache on CPU, and a saved CPU step of that kind is refused.
TPU and GPU executables are not affected.
"""
from __future__ import annotations

import re

import numpy as np

# An HLO collective, synchronous or the start of an asynchronous one.
_COLLECTIVE = re.compile(
    r"\b(?:all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"ragged-all-to-all|collective-permute|collective-broadcast)"
    r"(?:-start)?\(")
# Its device groups: explicit ({{0,1},{2,3}}), all devices ({}), iota
# ([2,4]<=[2,4]T(1,0)), mesh axes (mesh['x'=2,'y'=4] {'y'}), or a
# permute's pairs.
_EXPLICIT = re.compile(r"replica_groups=(\{\}|\{\{[0-9,{}]*\}\})")
_IOTA = re.compile(
    r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?")
_MESH = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(\[([0-9,]+)\]"
    r"(?:T\(([0-9,]+)\))?\))? \{([^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=(\{[0-9,{}]*\})")


def _ints(text: str) -> list[int]:
  return [int(t) for t in text.split(",") if t]


def _iota(dims: str, perm: str | None) -> np.ndarray:
  """XLA's iota device list [dims]T(perm): arange, reshaped, transposed."""
  shape = _ints(dims)
  order = _ints(perm) if perm else range(len(shape))
  return np.arange(int(np.prod(shape))).reshape(shape).transpose(list(order))


def _rows(ids: np.ndarray) -> frozenset:
  return frozenset(frozenset(int(i) for i in row) for row in ids)


def _grouping(line: str):
  """One collective's device grouping, comparable across spellings: a
  frozenset of groups, "all", or (for what is not read) the line itself."""
  try:
    return _read_grouping(line)
  except ValueError:  # numbers that do not make the shape they name
    return line.strip()


def _read_grouping(line: str):
  if found := _IOTA.search(line):
    return _rows(_iota(found.group(2), found.group(3)).reshape(
        _ints(found.group(1))))
  if found := _MESH.search(line):
    return _mesh_grouping(found, line)
  if found := _EXPLICIT.search(line):
    if found.group(1) == "{}":
      return "all"
    return frozenset(frozenset(_ints(g)) for g in
                     re.findall(r"\{([0-9,]*)\}", found.group(1)[1:-1]))
  if found := _PAIRS.search(line):
    return ("pairs", found.group(1))
  return line.strip()


def _mesh_grouping(found, line: str):
  """The groups of a mesh-axes spelling. A chosen axis may be a sub-axis,
  'x':(k)m: axis x viewed as [k, m, rest] (major to minor), its middle."""
  sizes = re.findall(r"'([^']+)'=([0-9]+)", found.group(1))
  chosen = re.findall(r"'([^']+)'(?::\(([0-9]+)\)([0-9]+))?", found.group(4))
  names = [name for name, _ in sizes]
  if (len(sizes) != found.group(1).count("=") or
      len(chosen) != found.group(4).count("'") // 2 or
      not {name for name, _, _ in chosen} <= set(names)):
    return line.strip()
  shape = [int(n) for _, n in sizes]
  # The mesh's devices: in order, or as an iota.
  ids = (_iota(found.group(2), found.group(3)) if found.group(2)
         else np.arange(int(np.prod(shape))))
  # Each axis split at every sub-axis boundary named on it.
  cuts = [{1, n} for n in shape]
  for name, pre, size in chosen:
    if pre:
      axis = names.index(name)
      cuts[axis] |= {int(pre), int(pre) * int(size)}
  factors, owner = [], []  # owner: (axis, start, stop) of each factor
  for axis, n in enumerate(shape):
    points = sorted(cuts[axis])
    if points[-1] != n or any(n % p for p in points):
      return line.strip()
    for start, stop in zip(points, points[1:]):
      factors.append(stop // start)
      owner.append((axis, start, stop))
  keep = []
  for name, pre, size in chosen:
    axis = names.index(name)
    start, stop = (int(pre), int(pre) * int(size)) if pre else (
        1, shape[axis])
    keep += [i for i, (a, lo, hi) in enumerate(owner)
             if a == axis and lo >= start and hi <= stop]
  rest = [i for i in range(len(factors)) if i not in keep]
  ids = ids.reshape(factors).transpose(rest + keep)
  return _rows(ids.reshape(-1, int(np.prod([factors[i] for i in keep]))))


def device_groups(hlo_text: str) -> set:
  """The distinct device groupings the collectives of an HLO module use.
  One group of every device is "all", however spelled."""
  groupings = {_grouping(line) for line in hlo_text.splitlines()
               if _COLLECTIVE.search(line)}
  # Groups of one device communicate nothing (a psum over a size-1 axis).
  groupings = {g for g in groupings if not (
      isinstance(g, frozenset) and all(len(group) == 1 for group in g))}
  ids = {i for g in groupings if isinstance(g, frozenset)
         for group in g for i in group}
  everyone = frozenset({frozenset(ids)})
  return {"all" if g == everyone else g for g in groupings}


def deadlock_prone(platform: str, executable) -> bool:
  """True for an XLA:CPU executable whose collectives span more than one
  device grouping (see the module's docstring)."""
  if platform != "cpu":
    return False
  runtime = getattr(executable, "runtime_executable", None)  # jax's Compiled
  try:
    executable = runtime() if callable(runtime) else executable
    import jax  # pylint: disable=g-import-not-at-top
    if len(executable.local_devices()) == 1 and jax.process_count() == 1:
      return False  # one device: no collectives (and no HLO text to print)
    modules = executable.hlo_modules()
  except Exception:  # pylint: disable=broad-except
    return True  # unknown: compile it, which is never wrong
  groups = set()
  for module in modules:
    groups |= device_groups(module.to_string())
  return len(groups) > 1
