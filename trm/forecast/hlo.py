"""The text of a compiled (optimized, scheduled) HLO module, read into
computations of instructions in their scheduled order.

`compiled.as_text()` after XLA:TPU's passes is what a chip runs: fusions,
windowed-einsum loops, async collective start/done pairs, and the
megascale send/recv pairs that carry cross-slice (DCN) collectives. Only
what the forecast needs is read: shapes (element type and dimensions),
opcodes, operand names, called computations and the attributes of
collectives, convolutions and dots.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

# Bytes per element. Sub-byte types round up to what a buffer holds.
_ELEMENT_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
    "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4,
    "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1,
    "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3": 1,
    "f8e3m4": 1, "f4e2m1fn": 0.5, "f8e8m0fnu": 1, "token": 0, "opaque": 0,
}
# An array type and its layout, if printed: f32[16,2048]{1,0:T(8,128)S(5)}.
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^{}]*\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# XLA:TPU's memory space of pinned host memory (a layout's `S(5)`): where a
# remat policy's offloaded tensors live, moved over the host link.
HOST_MEMORY_SPACE = 5
_COMMENT = re.compile(r"/\*.*?\*/")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([^\s(]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_ASSIGN = re.compile(r"^\s*(ROOT\s+)?%?([^\s=]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][a-z0-9\-]*)\(")


@dataclasses.dataclass(frozen=True)
class Array:
  dtype: str
  dims: tuple[int, ...]
  memory_space: int = 0   # the layout's S(n); 0: HBM

  @property
  def on_host(self) -> bool:
    return self.memory_space == HOST_MEMORY_SPACE

  @property
  def elements(self) -> int:
    return math.prod(self.dims)

  @property
  def bytes(self) -> float:
    return self.elements * _ELEMENT_BYTES.get(self.dtype, 4)


def parse_shape(text: str) -> tuple[Array, ...]:
  """Every array of a (possibly tuple) shape, in order."""
  out = []
  for dtype, dims, layout in _ARRAY.findall(text):
    if dtype in _ELEMENT_BYTES:
      space = _MEMORY_SPACE.search(layout.split(":", 1)[-1]) if ":" in (
          layout) else None
      out.append(Array(dtype, tuple(int(d) for d in dims.split(",") if d),
                       int(space.group(1)) if space else 0))
  return tuple(out)


def _unquoted(text: str, start: int = 0):
  """(index, character) of `text` from `start`, skipping string literals
  (which may hold escaped quotes and brackets)."""
  quoted = escaped = False
  for i in range(start, len(text)):
    ch = text[i]
    if quoted:
      if escaped:
        escaped = False
      elif ch == "\\":
        escaped = True
      elif ch == '"':
        quoted = False
    elif ch == '"':
      quoted = True
    else:
      yield i, ch


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start]."""
  pairs = {"(": ")", "{": "}", "[": "]"}
  stack = []
  for i, ch in _unquoted(text, start):
    if ch in pairs:
      stack.append(pairs[ch])
    elif stack and ch == stack[-1]:
      stack.pop()
      if not stack:
        return i + 1
  raise ValueError(f"unbalanced brackets in HLO text: {text[start:start + 80]!r}")


@dataclasses.dataclass
class Instruction:
  name: str
  shape: tuple[Array, ...]
  opcode: str
  operands: tuple[str, ...]
  attrs: str
  is_root: bool = False
  operand_text: str = ""   # raw, e.g. a constant's literal
  # A tuple result's top-level elements, each its arrays (empty for an
  # array result).
  elements: tuple[tuple[Array, ...], ...] = ()

  @property
  def result_bytes(self) -> float:
    return sum(a.bytes for a in self.shape)

  def attr(self, key: str) -> str | None:
    """The raw value of `key=...` (a bracket group or a token), or None."""
    match = re.search(r"(?:^|[,\s])" + re.escape(key) + r"=", self.attrs)
    if not match:
      return None
    start = match.end()
    if start < len(self.attrs) and self.attrs[start] in "{([":
      return self.attrs[start:_balanced(self.attrs, start)]
    if start < len(self.attrs) and self.attrs[start] == '"':
      end = self.attrs.index('"', start + 1)
      return self.attrs[start + 1:end]
    end = re.search(r"[,\s]|$", self.attrs[start:]).start() + start
    return self.attrs[start:end]

  def called(self) -> list[str]:
    """Computations this instruction runs (fusion bodies, loop bodies,
    branches, reducers)."""
    names = []
    for key in ("calls", "to_apply", "body", "condition",
                "true_computation", "false_computation"):
      value = self.attr(key)
      if value:
        names.extend(n.lstrip("%") for n in re.split(r"[,{}\s]+", value) if n)
    branches = self.attr("branch_computations")
    if branches:
      names.extend(n.lstrip("%") for n in re.split(r"[,{}\s]+", branches)
                   if n)
    return names

  def frontend_attribute(self, key: str) -> str | None:
    block = self.attr("frontend_attributes") or ""
    match = re.search(re.escape(key) + r'="([^"]*)"', block)
    return match.group(1) if match else None


@dataclasses.dataclass
class Computation:
  name: str
  instructions: list[Instruction]
  is_entry: bool = False

  def __post_init__(self):
    self.by_name = {i.name: i for i in self.instructions}

  @property
  def root(self) -> Instruction:
    for instruction in self.instructions:
      if instruction.is_root:
        return instruction
    return self.instructions[-1]


@dataclasses.dataclass
class Module:
  computations: dict[str, Computation]
  entry: str
  num_partitions: int

  @property
  def entry_computation(self) -> Computation:
    return self.computations[self.entry]


def _parse_instruction(line: str) -> Instruction | None:
  match = _ASSIGN.match(line)
  if not match:
    return None
  is_root, name, rest = bool(match.group(1)), match.group(2), match.group(3)
  rest = rest.strip()
  if rest.startswith("("):
    end = _balanced(rest, 0)
  else:
    end = rest.find(" ")
    if end < 0:
      return None
  # A layout may follow an array shape: f32[2]{0:T(128)}.
  shape_text = rest[:end]
  tail = rest[end:]
  op = _OPCODE.match(tail)
  if not op:
    return None
  opcode = op.group(1)
  open_paren = op.end() - 1
  close = _balanced(tail, open_paren)
  operand_text = tail[open_paren + 1:close - 1]
  operands = tuple(re.findall(r"%([^\s,()]+)", operand_text))
  attrs = tail[close:].lstrip(", ")
  return Instruction(name, parse_shape(shape_text), opcode, operands, attrs,
                     is_root, operand_text, _tuple_elements(shape_text))


def _tuple_elements(shape_text: str) -> tuple[tuple[Array, ...], ...]:
  """The top-level elements of a tuple shape `(a, (b, c), d)`, each parsed;
  () for an array shape."""
  if not shape_text.startswith("("):
    return ()
  elements, depth, start = [], 0, 1
  for i, ch in _unquoted(shape_text):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
      if depth == 0:
        elements.append(shape_text[start:i])
        break
    elif ch == "," and depth == 1:
      elements.append(shape_text[start:i])
      start = i + 1
  return tuple(parse_shape(e) for e in elements if e.strip())


def _with_tuple_reads(instructions: list[Instruction]) -> list[Instruction]:
  """Newer XLA prints a use of a tuple's element k as the operand `%x#k`
  instead of a separate get-tuple-element. Each such operand becomes a
  get-tuple-element instruction named `x#k` (free, like the one it
  replaces), placed after `x`, so shapes, bytes and data flow read it as
  they read the older text."""
  by_base: dict[str, dict[str, int]] = {}  # x -> {"x#k": k}
  for inst in instructions:
    for operand in inst.operands:
      base, sep, index = operand.rpartition("#")
      if sep and index.isdigit():
        by_base.setdefault(base, {})[operand] = int(index)
  if not by_base:
    return instructions
  out = []
  for inst in instructions:
    out.append(inst)
    for operand, index in sorted(by_base.get(inst.name, {}).items(),
                                 key=lambda x: x[1]):
      shape = (inst.elements[index] if index < len(inst.elements)
               else (inst.shape[index:index + 1] if not inst.elements
                     else ()))
      out.append(Instruction(operand, shape, "get-tuple-element",
                             (inst.name,), f"index={index}",
                             operand_text=f"%{inst.name}"))
  return out


def _open_depth(text: str) -> int:
  """Brackets opened and not closed in `text`, outside string literals."""
  return sum(1 if ch in "({[" else -1 for _, ch in _unquoted(text)
             if ch in "({[)}]")


def parse_module(text: str) -> Module:
  """Reads `compiled.as_text()`; raises ValueError when it has no ENTRY."""
  computations: dict[str, Computation] = {}
  entry = None
  current_name, current, is_entry = None, [], False
  header = re.search(r"num_partitions=(\d+)", text.split("\n", 1)[0])
  lines = iter(text.splitlines())
  for raw in lines:
    line = _COMMENT.sub("", raw)
    if current_name is not None and not line.startswith("}"):
      # A Pallas kernel's metadata can break an instruction over several
      # lines; a line that ends inside brackets continues on the next.
      depth = _open_depth(line)
      while depth > 0:
        more = next(lines, None)
        if more is None:
          break
        line += " " + more
        depth = _open_depth(line)
    if current_name is None:
      match = _HEADER.match(line)
      if match:
        current_name, current = match.group(2), []
        is_entry = bool(match.group(1))
      continue
    if line.startswith("}"):
      computations[current_name] = Computation(
          current_name, _with_tuple_reads(current), is_entry)
      if is_entry:
        entry = current_name
      current_name = None
      continue
    instruction = _parse_instruction(line)
    if instruction is not None:
      current.append(instruction)
  if entry is None:
    raise ValueError("the HLO text has no ENTRY computation (is it "
                     "compiled.as_text() of a compiled program?)")
  return Module(computations, entry,
                int(header.group(1)) if header else 1)


# ----------------------------------------------------------- replica groups


def _iota_groups(spec: str) -> list[list[int]] | None:
  """`[G,S]<=[dims]T(perm)` (XLA's iota replica-group list) -> groups."""
  match = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
  if not match:
    return None
  shape = [int(x) for x in match.group(1).split(",")]
  dims = [int(x) for x in match.group(2).split(",")]
  ids = np.arange(math.prod(dims)).reshape(dims)
  if match.group(3):
    ids = ids.transpose([int(x) for x in match.group(3).split(",")])
  ids = ids.reshape(-1, shape[-1])
  return ids.tolist()


def _device_order(text: str, count: int) -> np.ndarray | None:
  """`[2,2]T(1,0)` (an iota reshaped and transposed) or `0,2,1,3`."""
  text = text.strip()
  match = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
  if match:
    dims = [int(x) for x in match.group(1).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if match.group(2):
      ids = ids.transpose([int(x) for x in match.group(2).split(",")])
    ids = ids.reshape(-1)
  elif re.fullmatch(r"[\d,\s]+", text):
    ids = np.asarray([int(x) for x in text.split(",") if x.strip()])
  else:
    return None
  return ids if ids.size == count else None


def _mesh_groups(spec: str) -> list[list[int]] | None:
  """`mesh['a'=2,'b'=4][, device_ids=(ORDER)] {'b'}` (XLA's mesh-axes
  form) -> groups: the mesh's devices (row-major, or in ORDER), grouped
  along the listed axes. A sub-axis ('b':(1)2) counts as its whole axis."""
  match = re.fullmatch(r"mesh\[([^\]]*)\]\s*(?:,\s*device_ids=\((.*)\))?"
                       r"\s*\{([^}]*)\}", spec.strip())
  if not match:
    return None
  axes = re.findall(r"'([^']+)'=(\d+)", match.group(1))
  names = [a for a, _ in axes]
  sizes = [int(s) for _, s in axes]
  count = math.prod(sizes)
  ids = np.arange(count)
  if match.group(2):
    ids = _device_order(match.group(2), count)
    if ids is None:
      return None
  ids = ids.reshape(sizes)
  chosen = re.findall(r"'([^']+)'", match.group(3))
  if any(c not in names for c in chosen):
    return None
  inner = [names.index(c) for c in chosen]
  outer = [i for i in range(len(names)) if i not in inner]
  grouped = ids.transpose(outer + inner).reshape(
      -1, math.prod(sizes[i] for i in inner) if inner else 1)
  return grouped.tolist()


def replica_groups(instruction: Instruction,
                   num_partitions: int) -> list[list[int]]:
  """The device groups of a collective, as partition ids (an empty list
  in the text means one group of every partition)."""
  # The value runs to the next attribute: explicit {{0,1},{2,3}}, iota
  # [2,4]<=[8]T(1,0), or mesh['x'=2,'y'=4][, device_ids=(...)] {'y'}.
  match = re.search(r"replica_groups=(mesh\[[^\]]*\]\s*(?:,\s*device_ids="
                    r"\((?:[^()]|\([^()]*\))*\))?\s*\{[^}]*\})",
                    instruction.attrs)
  if not match:
    match = re.search(r"replica_groups=(.*?)(?:, [a-z_]+=|$)",
                      instruction.attrs)
  text = match.group(1) if match else None
  if text is None or text.strip() in ("{}", "{{}}"):
    return [list(range(num_partitions))]
  text = text.strip()
  if text.startswith("{"):
    groups = [[int(x) for x in g.split(",") if x.strip()]
              for g in re.findall(r"\{([\d,\s]*)\}", text[1:-1])]
    groups = [g for g in groups if g]
    return groups or [list(range(num_partitions))]
  for reader in (_iota_groups, _mesh_groups):
    groups = reader(text)
    if groups is not None:
      return groups
  raise ValueError(f"{instruction.name}: unreadable replica_groups {text!r}")


def source_target_pairs(instruction: Instruction) -> list[tuple[int, int]]:
  text = instruction.attr("source_target_pairs") or ""
  return [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)\}", text)]
