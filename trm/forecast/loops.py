"""Trip counts of the compiled program's while loops.

A scan over layers, TRM's cycles, gradient accumulation and XLA's own
windowed-einsum loops all compile to `while` with a counter: the
condition compares a tuple element with a constant, the body adds a
constant to it, and the loop's initial tuple holds its start. A loop whose
count cannot be read this way is counted once and reported.
"""
from __future__ import annotations

import json
import math
import re

from trm.forecast import hlo

_FLIP = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE",
         "EQ": "EQ"}


def _constant(text: str) -> int | None:
  match = re.fullmatch(r"\s*(-?\d+)\s*", text)
  return int(match.group(1)) if match else None


def _fused(module: hlo.Module, inst: hlo.Instruction):
  """The computation a fusion runs, or None."""
  called = [c for c in inst.called() if c in module.computations]
  return module.computations[called[0]] if called else None


class _Resolver:
  """Follows an instruction back to an integer constant or to a tuple
  element of a computation's parameter."""

  def __init__(self, module: hlo.Module):
    self.module = module

  def value(self, comp: hlo.Computation, name: str, depth: int = 0):
    """('const', int) | ('param', tuple index) | None."""
    inst = comp.by_name.get(name)
    if inst is None or depth > 32:
      return None
    if inst.opcode == "constant":
      value = _constant(inst.operand_text)
      return ("const", value) if value is not None else None
    if inst.opcode in ("copy", "convert", "bitcast", "reshape") and (
        inst.operands):
      return self.value(comp, inst.operands[0], depth + 1)
    if inst.opcode == "get-tuple-element" and inst.operands:
      index = int(inst.attr("index") or 0)
      source = comp.by_name.get(inst.operands[0])
      if source is None:
        return None
      if source.opcode == "parameter":
        return ("param", index)
      if source.opcode == "tuple" and index < len(source.operands):
        return self.value(comp, source.operands[index], depth + 1)
      return None
    if inst.opcode == "fusion":
      # A fused computation that only forwards or compares: follow its root
      # through the fusion parameters back to the fusion's operands.
      inner = _fused(self.module, inst)
      if inner is None:
        return None
      result = self.value(inner, inner.root.name, depth + 1)
      if result and result[0] == "fparam" and result[1] < len(inst.operands):
        return self.value(comp, inst.operands[result[1]], depth + 1)
      return result if result and result[0] == "const" else None
    if inst.opcode == "parameter" and comp.instructions and not comp.is_entry:
      number = _constant(inst.operand_text)
      return ("fparam", number) if number is not None else None
    return None

  def compare(self, comp: hlo.Computation, name: str, depth: int = 0):
    """(direction, counter tuple index, bound) of the loop condition."""
    inst = comp.by_name.get(name)
    if inst is None or depth > 8:
      return None
    if inst.opcode == "fusion":
      inner = _fused(self.module, inst)
      if inner is None:
        return None
      root = inner.root
      if root.opcode != "compare" or len(root.operands) != 2:
        return None
      sides = []
      for operand in root.operands:
        value = self.value(inner, operand)
        if value and value[0] == "fparam" and value[1] < len(inst.operands):
          value = self.value(comp, inst.operands[value[1]])
        sides.append(value)
      return self._oriented(root.attr("direction"), sides)
    if inst.opcode == "compare" and len(inst.operands) == 2:
      sides = [self.value(comp, o) for o in inst.operands]
      return self._oriented(inst.attr("direction"), sides)
    return None

  @staticmethod
  def _oriented(direction, sides):
    if not direction or None in sides:
      return None
    (kind0, v0), (kind1, v1) = sides
    if kind0 == "param" and kind1 == "const":
      return direction, v0, v1
    if kind1 == "param" and kind0 == "const":
      return _FLIP[direction], v1, v0
    return None


def _known_trip_count(inst: hlo.Instruction) -> int | None:
  config = inst.attr("backend_config")
  if not config:
    return None
  try:
    parsed = json.loads(config)
  except ValueError:
    return None
  known = parsed.get("known_trip_count") if isinstance(parsed, dict) else None
  if isinstance(known, dict) and "n" in known:
    return int(known["n"])
  return None


def trip_count(module: hlo.Module, comp: hlo.Computation,
               loop: hlo.Instruction) -> int | None:
  """Iterations of `loop` (a while in `comp`), or None if unreadable."""
  known = _known_trip_count(loop)
  if known is not None:
    return known
  resolver = _Resolver(module)
  condition = module.computations.get((loop.attr("condition") or "")
                                      .lstrip("%"))
  body = module.computations.get((loop.attr("body") or "").lstrip("%"))
  if condition is None or body is None or not loop.operands:
    return None
  test = resolver.compare(condition, condition.root.name)
  if test is None:
    return None
  direction, index, bound = test
  init_tuple = comp.by_name.get(loop.operands[0])
  if init_tuple is None or init_tuple.opcode != "tuple" or index >= len(
      init_tuple.operands):
    return None
  start = resolver.value(comp, init_tuple.operands[index])
  step = _step(resolver, body, index)
  if start is None or start[0] != "const" or step in (None, 0):
    return None
  start = start[1]
  if direction == "LT":
    count = math.ceil((bound - start) / step)
  elif direction == "LE":
    count = math.floor((bound - start) / step) + 1
  elif direction == "GT":
    count = math.ceil((start - bound) / -step)
  elif direction == "GE":
    count = math.floor((start - bound) / -step) + 1
  elif direction == "NE":
    count = (bound - start) // step if (bound - start) % step == 0 else None
  else:
    return None
  return max(int(count), 0) if count is not None else None


def _step(resolver: _Resolver, body: hlo.Computation, index: int):
  """The constant the body adds to tuple element `index`."""
  root = body.root
  if root.opcode != "tuple" or index >= len(root.operands):
    return None
  update = body.by_name.get(root.operands[index])
  seen = 0
  while update is not None and update.opcode in ("copy", "convert",
                                                 "bitcast") and seen < 8:
    update = body.by_name.get(update.operands[0])
    seen += 1
  if update is None:
    return None
  if update.opcode == "fusion":
    inner = _fused(resolver.module, update)
    if inner is None:
      return None
    return _add_step(resolver, inner, inner.root, index, body, update)
  return _add_step(resolver, body, update, index, None, None)


def _add_step(resolver, comp, inst, index, outer, fusion):
  if inst.opcode not in ("add", "subtract") or len(inst.operands) != 2:
    return None
  sides = []
  for operand in inst.operands:
    value = resolver.value(comp, operand)
    if value and value[0] == "fparam" and fusion is not None and (
        value[1] < len(fusion.operands)):
      value = resolver.value(outer, fusion.operands[value[1]])
    sides.append(value)
  if None in sides:
    return None
  consts = [v for k, v in sides if k == "const"]
  counters = [v for k, v in sides if k == "param"]
  if len(consts) != 1 or counters != [index]:
    return None
  return consts[0] if inst.opcode == "add" else -consts[0]
