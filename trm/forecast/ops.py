"""What one HLO instruction costs on its own: the dense FLOPs of its dots
and convolutions, the HBM bytes it moves, and, for a collective, what it
sends and to whom. XLA:GPU's library calls (cuBLAS matmuls, cuDNN's
fused attention) are read from their backend configs.

XLA's `cost_analysis()` gives one total per program and counts a loop body
once, so the forecast reads the scheduled program itself
(`trm.forecast.program` multiplies by trip counts).
"""
from __future__ import annotations

import dataclasses
import math
import re

from trm.forecast import hlo

# Instructions that move no data of their own.
FREE = frozenset({
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast",
    "after-all", "partition-id", "replica-id", "opt-barrier",
    "add-dependency", "domain", "iota", "copy-start", "copy-done",
    "slice-start", "slice-done", "send-done", "recv", "recv-done",
    "all-gather-done", "all-reduce-done", "collective-permute-done",
    "async-done", "async-update", "while", "conditional", "call",
})
# Collectives: synchronous form, async start, and what its done is called.
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all",
               "ragged-all-to-all", "collective-permute",
               "collective-broadcast")
ASYNC_STARTS = {"all-gather-start": "all-gather",
                "all-reduce-start": "all-reduce",
                "collective-permute-start": "collective-permute"}
ASYNC_DONES = ("all-gather-done", "all-reduce-done",
               "collective-permute-done", "async-done")


# Moves between HBM and host memory (hlo.HOST_MEMORY_SPACE): synchronous,
# or the start of an async one whose done waits for it.
_HOST_MOVES = ("copy", "dynamic-slice", "dynamic-update-slice")
HOST_DONES = ("copy-done", "dynamic-slice-done", "dynamic-update-slice-done")


def host_transfer(inst: hlo.Instruction, comp: hlo.Computation
                  ) -> tuple[str, float] | None:
  """('to_host' | 'from_host', bytes) of an instruction that moves data
  between HBM and the host's memory over the host link (PCIe): XLA:TPU
  writes a remat policy's offloaded tensor into a host buffer with a
  dynamic-update-slice (one layer's slot of a scanned stack) or a copy, and
  reads it back with a dynamic-slice or a copy; None for anything else."""
  opcode = inst.opcode
  base = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
  if base not in _HOST_MOVES or not inst.shape:
    return None
  operands = _operand_shapes(inst, comp)
  source = operands[0][0] if operands and operands[0] else None
  if source is None:
    return None
  if base == "dynamic-update-slice":
    if source.on_host and len(operands) > 1:
      return "to_host", float(sum(a.bytes for a in operands[1]))
    return None
  if base == "dynamic-slice":
    if not source.on_host:
      return None
    sizes = _dims(inst.attr("dynamic_slice_sizes"))
    return "from_host", float(math.prod(sizes) * source.bytes
                              / max(source.elements, 1))
  if source.on_host:
    return "from_host", float(source.bytes)
  if inst.shape[0].on_host:
    return "to_host", float(source.bytes)
  return None


def touches_host(inst: hlo.Instruction, comp: hlo.Computation) -> bool:
  """Is any array of its result or operands in host memory?"""
  return any(a.on_host for a in inst.shape) or any(
      a.on_host for shape in _operand_shapes(inst, comp) for a in shape)


def _operand_shapes(inst: hlo.Instruction, comp: hlo.Computation):
  out = []
  for name in inst.operands:
    source = comp.by_name.get(name)
    out.append(source.shape if source is not None else ())
  return out


def _dims(attr: str | None) -> list[int]:
  return [int(x) for x in re.findall(r"\d+", attr or "")]


def dot_flops(inst: hlo.Instruction, comp: hlo.Computation) -> float:
  """2 x output elements x contracted size (dot), or x kernel input
  features x window taps that do not land in a dilation hole
  (convolution; XLA writes batched matmuls as dilated convolutions)."""
  if not inst.shape:
    return 0.0
  out = inst.shape[0].elements
  operands = _operand_shapes(inst, comp)
  if inst.opcode == "dot":
    lhs = operands[0][0].dims if operands and operands[0] else ()
    contracted = math.prod(lhs[d] for d in _dims(
        inst.attr("lhs_contracting_dims")) if d < len(lhs))
    return 2.0 * out * contracted
  if inst.opcode == "convolution":
    labels = inst.attr("dim_labels") or ""
    match = re.fullmatch(r"([^_]+)_([^-]+)->(.+)", labels)
    if not match or len(operands) < 2 or not operands[0] or not operands[1]:
      return 0.0
    lhs_labels, kernel_labels, out_labels = match.groups()
    lhs, kernel = operands[0][0].dims, operands[1][0].dims
    out_dims = inst.shape[0].dims
    features = kernel[kernel_labels.index("i")] if "i" in kernel_labels else 1
    window = inst.attr("window") or ""
    taps = 1.0
    for d, size in enumerate(_x_list(window, "size")):
      digit = str(d)
      if digit not in lhs_labels or digit not in out_labels:
        taps *= size
        continue
      taps *= _valid_taps(
          lhs[lhs_labels.index(digit)], out_dims[out_labels.index(digit)],
          size, _x_at(window, "stride", d, 1), _pads(window, d),
          _x_at(window, "lhs_dilate", d, 1), _x_at(window, "rhs_dilate", d, 1))
    return 2.0 * out * features * taps
  return 0.0


def mxu_padding(m: int, k: int, n: int, width: int) -> float:
  """How many times its FLOPs an [m, k] x [k, n] matmul occupies a
  `width` x `width` MXU (>= 1; 1 for width <= 1, no array).

  The array holds a k x n tile of one operand (the stationary one) and
  streams the other's m rows through it: a contraction k that is not a
  multiple of the width leaves rows of the array idle whichever operand
  is stationary, so k is always rounded up. Of m and n the compiler may
  make either the stationary side; counted conservatively, the
  orientation that wastes less is taken (the streamed side is not padded
  to the width). A dim here is the product of the dims it flattens (a
  contraction over heads x 128 counts as one of 8192): only what cannot be
  laid out in whole tiles is padded. On a 128-wide chip dims that are
  multiples of 128 give exactly 1."""
  if width <= 1 or min(m, k, n) <= 0:
    return 1.0

  def up(x):
    return -(-x // width) * width

  return up(k) / k * min(up(m) / m, up(n) / n)


def matmul_dims(inst: hlo.Instruction, comp: hlo.Computation
                ) -> tuple[int, int, int] | None:
  """(m, k, n) of one of a dot's or convolution's matmuls (per batch
  element, per feature group; a convolution's output positions counted
  into m, its window taps into k with the input features), or None where
  the shapes cannot be read.

  Why taps count into k: XLA:TPU writes weight gradients as convolutions
  whose window spans the tokens and whose input features are the batch
  (TRM's [512, 3072] gradient: a window of 97 tokens over 24 rows per
  chip); charged as 97 passes contracting over 24, a 128-wide array would
  be 5.3x idle, which the compiler, choosing that form, would not have
  chosen. Folding the taps into the contraction is the layout that wastes
  less, as for a dot's free dims."""
  operands = _operand_shapes(inst, comp)
  if not inst.shape or len(operands) < 2 or not operands[0] or not (
      operands[1]):
    return None
  lhs, rhs = operands[0][0].dims, operands[1][0].dims
  if inst.opcode == "dot":
    lhs_used = set(_dims(inst.attr("lhs_contracting_dims"))) | set(
        _dims(inst.attr("lhs_batch_dims")))
    rhs_used = set(_dims(inst.attr("rhs_contracting_dims"))) | set(
        _dims(inst.attr("rhs_batch_dims")))
    k = math.prod(lhs[d] for d in _dims(inst.attr("lhs_contracting_dims"))
                  if d < len(lhs))
    m = math.prod(s for d, s in enumerate(lhs) if d not in lhs_used)
    n = math.prod(s for d, s in enumerate(rhs) if d not in rhs_used)
    return m, k, n
  match = re.fullmatch(r"([^_]+)_([^-]+)->(.+)", inst.attr("dim_labels")
                       or "")
  if inst.opcode != "convolution" or not match:
    return None
  kernel_labels = match.group(2)
  if "i" not in kernel_labels or "o" not in kernel_labels:
    return None
  groups = max(1, int(inst.attr("feature_group_count") or 1)) * max(
      1, int(inst.attr("batch_group_count") or 1))
  outputs = rhs[kernel_labels.index("o")]
  n = max(1, outputs // groups)
  m = inst.shape[0].elements // max(outputs, 1)
  return m, math.prod(rhs) // max(outputs, 1), n


def _valid_taps(size, out_size, window, stride, pads, lhs_dilate,
                rhs_dilate) -> float:
  """Window taps per output position that land on input data, not on
  padding or a dilation hole (XLA writes batched and grouped matmuls as
  convolutions whose other taps multiply zeros)."""
  extent = (size - 1) * lhs_dilate + 1
  valid = 0
  for o in range(out_size):
    for k in range(window):
      p = o * stride + k * rhs_dilate - pads[0]
      if 0 <= p < extent and p % lhs_dilate == 0:
        valid += 1
  return valid / max(out_size, 1)


def _x_at(window: str, key: str, index: int, default: int) -> int:
  values = _x_list(window, key)
  return values[index] if index < len(values) else default


def _pads(window: str, index: int) -> tuple[int, int]:
  match = re.search(r"\bpad=([\d_x-]+)", window)
  if not match:
    return (0, 0)
  parts = match.group(1).split("x")
  if index >= len(parts):
    return (0, 0)
  lo, hi = parts[index].split("_")
  return int(lo), int(hi)


def _x_list(window: str, key: str) -> list[int]:
  match = re.search(r"\b" + key + r"=([\dx]+)", window)
  return [int(x) for x in match.group(1).split("x")] if match else []


@dataclasses.dataclass
class FusedCost:
  flops: float
  # Per fusion operand: how many of its bytes the fused code reads (a
  # parameter read only through slices, gathers, and one-to-one ops such as
  # bitcasts and converts in front of them, reads only what they take; the
  # buffer a dynamic-update-slice writes into in place is not read).
  operand_bytes: list[float] | None = None
  # Bytes written: the result, or only the updates of in-place updates.
  result_bytes: float | None = None
  collectives: tuple = ()
  # Root tuple element -> the parameter it hands through unchanged (XLA:TPU's
  # async collective fusions pass the buffers of their chain along).
  passed_through: dict = dataclasses.field(default_factory=dict)
  # (FLOPs, (m, k, n) or None) of each dot and convolution inside, nested
  # fusions' included: what `mxu_padding_flops` pads to a chip's MXU.
  matmuls: tuple = ()


# Ops whose every output element reads one element of their operand (and
# only that): a slice of their result reads the same share of the operand.
_ONE_TO_ONE = frozenset({
    "bitcast", "reshape", "convert", "copy", "transpose", "bitcast-convert",
    "negate", "abs", "exponential", "log", "sqrt", "rsqrt", "tanh",
    "logistic", "sign", "floor", "ceil", "not", "cosine", "sine"})
_SLICES = ("slice", "dynamic-slice", "gather")


def _read_fractions(comp: hlo.Computation, users: dict, nested_fraction):
  """instruction -> the share of its elements the fused code reads: 1 when
  any use reads it all, else the sum over its uses of the slices taken
  (through one-to-one ops such as a bitcast or a convert, pads, and nested
  fusions: `nested_fraction(fusion, operand index)`), capped at 1."""
  memo: dict[str, float] = {}
  roots = {comp.root.name} | (set(comp.root.operands)
                              if comp.root.opcode == "tuple" else set())

  def fraction(inst: hlo.Instruction) -> float:
    if inst.name in memo:
      return memo[inst.name]
    memo[inst.name] = 1.0  # a cycle cannot occur; be safe anyway
    elements = sum(a.elements for a in inst.shape)
    total = 1.0 if inst.name in roots else 0.0
    for use in users.get(inst.name, []):
      if total >= 1.0:
        break
      if use.opcode in _SLICES and use.operands[0] == inst.name and elements:
        taken = sum(a.elements for a in use.shape) / elements
        total += min(1.0, taken) * fraction(use)
      elif use.opcode in _ONE_TO_ONE and len(use.operands) == 1:
        total += fraction(use)
      elif use.opcode == "pad" and use.operands[0] == inst.name and elements:
        # Every element of a pad's result is its operand's or the padding:
        # a slice of the result reads at most as many of the operand's.
        padded = sum(a.elements for a in use.shape)
        total += min(1.0, fraction(use) * padded / elements)
      elif use.opcode == "fusion" and use.operands.count(inst.name) == 1:
        total += nested_fraction(use, use.operands.index(inst.name))
      else:
        total = 1.0
    memo[inst.name] = min(1.0, total)
    return memo[inst.name]

  return fraction


def fused_cost(module: hlo.Module, name: str, cache: dict) -> FusedCost:
  """FLOPs and byte rules of a fused (or called) computation."""
  if name in cache:
    return cache[name]
  comp = module.computations[name]
  flops, collectives, matmuls = 0.0, [], []
  users: dict[str, list[hlo.Instruction]] = {}
  for inst in comp.instructions:
    for operand in inst.operands:
      users.setdefault(operand, []).append(inst)
    if inst.opcode in ("dot", "convolution"):
      matmuls.append((dot_flops(inst, comp), matmul_dims(inst, comp)))
      flops += matmuls[-1][0]
    elif inst.opcode in COLLECTIVES:
      collectives.append(inst)
    for called in inst.called():
      if called in module.computations and inst.opcode in ("fusion", "call"):
        inner = fused_cost(module, called, cache)
        flops += inner.flops
        collectives.extend(inner.collectives)
        matmuls.extend(inner.matmuls)
  params = sorted((i for i in comp.instructions if i.opcode == "parameter"),
                  key=lambda i: int(re.findall(r"\d+", i.operand_text)[0]
                                    if re.findall(r"\d+", i.operand_text)
                                    else 0))
  root = comp.root
  roots = ([comp.by_name[o] for o in root.operands if o in comp.by_name]
           if root.opcode == "tuple" else [root])
  operand_bytes = []
  in_place = set()

  def nested_fraction(fusion: hlo.Instruction, index: int) -> float:
    called = [c for c in fusion.called() if c in module.computations]
    inner = fused_cost(module, called[0], cache) if called else None
    if inner is None or inner.operand_bytes is None or index >= len(
        inner.operand_bytes):
      return 1.0
    whole = sum(a.bytes for a in comp.by_name[fusion.operands[index]].shape)
    return min(1.0, inner.operand_bytes[index] / whole) if whole else 1.0

  read_fraction = _read_fractions(comp, users, nested_fraction)
  for param in params:
    uses = users.get(param.name, [])
    if uses and all(u.opcode == "dynamic-update-slice"
                    and u.operands[0] == param.name for u in uses):
      operand_bytes.append(0.0)
      in_place.update(u.name for u in uses)
    elif uses and all(_network_or_root(u, root, users) for u in uses):
      # Only a collective reads it (the network's DMA, timed by the
      # network model) or the fusion hands it on unchanged.
      operand_bytes.append(0.0)
    else:
      operand_bytes.append(sum(a.bytes for a in param.shape)
                           * read_fraction(param))
  passed_through = {}
  result_bytes = None
  sources = [_through_bitcasts(r, comp) for r in roots]
  if in_place or any(_network_only(source) or source.opcode == "parameter"
                     for source in sources):
    result_bytes = 0.0
    for index, (r, source) in enumerate(zip(roots, sources)):
      if r.name in in_place:
        update = comp.by_name.get(r.operands[1])
        result_bytes += 2 * (update.result_bytes if update else 0.0)
      elif _network_only(source):
        pass  # the network writes it
      elif source.opcode == "parameter" and root.opcode == "tuple":
        passed_through[index] = params.index(source)
      else:
        result_bytes += r.result_bytes
  cost = FusedCost(flops, operand_bytes, result_bytes, tuple(collectives),
                   passed_through, tuple(matmuls))
  cache[name] = cost
  return cost


# XLA:TPU's async collective fusions end in one of these custom calls: it
# hands the collective's buffers on (aliased) and moves no data itself.
_COLLECTIVE_MARKERS = ('custom_call_target="AsyncCollectiveStart"',
                       'custom_call_target="AsyncCollectiveDone"')


def _network_only(inst: hlo.Instruction) -> bool:
  """A collective, or the custom call marking an async collective's start
  or done: what it writes, the network writes."""
  return inst.opcode in COLLECTIVES or (
      inst.opcode == "custom-call"
      and any(m in inst.attrs for m in _COLLECTIVE_MARKERS))


def _through_bitcasts(inst: hlo.Instruction, comp: hlo.Computation
                      ) -> hlo.Instruction:
  while inst.opcode == "bitcast" and inst.operands[0] in comp.by_name:
    inst = comp.by_name[inst.operands[0]]
  return inst


def _network_or_root(use: hlo.Instruction, root: hlo.Instruction,
                     users: dict) -> bool:
  """Whether a use of a fused value moves no bytes through the compute:
  a collective's, the root tuple's, or a bitcast's whose uses are too."""
  if _network_only(use) or (use is root and use.opcode == "tuple"):
    return True
  uses = users.get(use.name, [])
  return use.opcode == "bitcast" and bool(uses) and all(
      _network_or_root(u, root, users) for u in uses)


def _aliased_outputs(inst: hlo.Instruction) -> set[int]:
  """The tuple elements of a result that share an operand's buffer."""
  aliasing = inst.attr("output_to_operand_aliasing") or ""
  return {int(i) for i in re.findall(r"\{(\d+)[^}]*\}\s*:", aliasing)}


def instruction_cost(module: hlo.Module, comp: hlo.Computation,
                     inst: hlo.Instruction, cache: dict
                     ) -> tuple[float, float]:
  """(dense FLOPs, HBM bytes) of one instruction run once."""
  if inst.opcode == "async-start":
    return _async_work_cost(module, inst, cache)
  if inst.opcode in FREE or inst.opcode in ASYNC_STARTS or inst.opcode == (
      "send"):
    return 0.0, 0.0
  if host_transfer(inst, comp) is not None or (
      inst.opcode in HOST_DONES and touches_host(inst, comp)):
    return 0.0, 0.0  # the host link's DMA, not the chip's (timeline)
  operand_shapes = _operand_shapes(inst, comp)
  # Host buffers (a stack of offloaded tensors, its allocation) are not
  # HBM traffic.
  read = [sum(a.bytes for a in shape if not a.on_host)
          for shape in operand_shapes]
  written = sum(a.bytes for a in inst.shape if not a.on_host)
  flops = 0.0
  if inst.opcode in ("dot", "convolution"):
    flops = dot_flops(inst, comp)
  elif inst.opcode in ("fusion", "custom-call") and inst.called():
    called = [c for c in inst.called() if c in module.computations]
    if called:
      fused = fused_cost(module, called[0], cache)
      flops = fused.flops
      if fused.operand_bytes is not None and len(fused.operand_bytes) == len(
          read):
        read = [min(r, f) for r, f in zip(read, fused.operand_bytes)]
      if fused.result_bytes is not None:
        written = fused.result_bytes
        aliased = _aliased_outputs(inst)
        for index, param in fused.passed_through.items():
          if index not in aliased and param < len(read):
            # Handed through to a buffer of its own: copied.
            copied = sum(a.bytes for a in operand_shapes[param])
            written += copied
            read[param] = max(read[param], copied)
  elif inst.opcode == "dynamic-update-slice" and len(operand_shapes) > 1:
    update = sum(a.bytes for a in operand_shapes[1])
    read, written = [update], update
  elif inst.opcode in ("dynamic-slice", "slice"):
    read = [written]
  return flops, sum(read) + written


def mxu_padding_flops(module: hlo.Module, comp: hlo.Computation,
                      inst: hlo.Instruction, width: int, cache: dict
                      ) -> float:
  """The FLOPs by which an instruction's dots and convolutions (its own,
  or those of the fusion or call it runs) occupy a `width`-wide MXU beyond
  their useful FLOPs (`mxu_padding` of each; 0 for any other instruction):
  the time model adds them to `instruction_cost`'s, which MFU counts."""
  if inst.opcode in ("dot", "convolution"):
    matmuls = [(dot_flops(inst, comp), matmul_dims(inst, comp))]
  elif inst.opcode in ("fusion", "custom-call") and inst.called():
    called = [c for c in inst.called() if c in module.computations]
    if not called:
      return 0.0
    matmuls = fused_cost(module, called[0], cache).matmuls
  else:
    return 0.0
  # Added to the useful FLOPs, so that a program whose matmuls fill the
  # array is charged exactly what it was before.
  return sum(f * (mxu_padding(*dims, width) - 1.0)
             for f, dims in matmuls if dims)


def _async_work_cost(module: hlo.Module, inst: hlo.Instruction,
                     cache: dict) -> tuple[float, float]:
  """An `async-start` of computation, not of a collective (the network
  model times those): XLA:GPU runs, e.g., the copy of a scanned layer's
  weights out of the stack this way, on another stream. It moves bytes
  through the same HBM as the work it overlaps, so it is charged its
  computation's cost where it starts."""
  called = [c for c in inst.called() if c in module.computations]
  if not called:
    return 0.0, 0.0
  comp = module.computations[called[0]]
  if comp.root.opcode in COLLECTIVES:
    return 0.0, 0.0
  flops = moved = 0.0
  for inner in comp.instructions:
    f, m = instruction_cost(module, comp, inner, cache)
    flops, moved = flops + f, moved + m
  return flops, moved


def pallas_cost(inst: hlo.Instruction) -> tuple[float, float] | None:
  """A Pallas kernel's declared (FLOPs, bytes), if it declares them."""
  if inst.opcode != "custom-call":
    return None
  flops = re.search(r'"flops"\s*:\s*"?(\d+)', inst.attrs)
  moved = re.search(r'"bytes_accessed"\s*:\s*"?(\d+)', inst.attrs)
  if not flops and not moved:
    return None
  return (float(flops.group(1)) if flops else 0.0,
          float(moved.group(1)) if moved else 0.0)


def is_pallas_call(inst: hlo.Instruction) -> bool:
  """A Pallas kernel call: Mosaic's TPU custom call, or one named so."""
  return inst.opcode == "custom-call" and (
      'custom_call_target="tpu_custom_call"' in inst.attrs
      or pallas_kernel_name(inst) is not None)


def pallas_kernel_name(inst: hlo.Instruction) -> str | None:
  """The name a Pallas kernel call was given (its op_name ends in
  '<name>/pallas_call', or in 'transpose(jvp(<name>))/pallas_call' where
  autodiff traced it), or None for any other instruction."""
  if inst.opcode != "custom-call":
    return None
  match = re.search(r'op_name="[^"]*?([\w.-]+)\)*/pallas_call"',
                    inst.attrs)
  return match.group(1) if match else None


# jax's splash attention kernels (Pallas, TPU) declare no cost. Matmuls per
# computed block of each: the forward forms S = QK^T and O = PV; dq
# recomputes S and forms dP = dO V^T and dQ = dS K; dkv recomputes S and
# forms dV = P^T dO, dP and dK = dS^T Q; a fused backward does both. Each
# as (m, k, n) of the block: "q" its query rows, "k" its key columns, "d"
# the head dim (S and dP contract over d: padded on a 256-wide MXU when d
# is 128; the others contract over a block and may keep d streamed).
_S, _PV, _PTDO = "qdk", "qkd", "kqd"
_SPLASH_MATMULS = {"fwd": (_S, _PV), "dq": (_S, _S, _PV),
                   "dkv": (_S, _PTDO, _S, _PTDO),
                   "dkv_fused": (_S, _PTDO, _S, _PTDO, _PV)}


def _splash_scopes() -> dict:
  """{op_name scope: causal?} of the scopes trm/nn/tpu_attention.py names
  its kernel calls by."""
  from trm.nn import tpu_attention  # pylint: disable=g-import-not-at-top
  return {tpu_attention.SCOPE_CAUSAL: True, tpu_attention.SCOPE_FULL: False}


def _metadata_int(attrs: str, key: str) -> int | None:
  match = re.search(r'\\?"' + key + r'\\?"\s*:\s*(\d+)', attrs)
  return int(match.group(1)) if match else None


def splash_flops(inst: hlo.Instruction, comp: hlo.Computation,
                 mxu_width: int = 1,
                 scopes: dict | None = None) -> float | None:
  """The FLOPs of one call of jax's splash attention kernel, or None for
  any other instruction, or a call whose mask is unknown (not inside one
  of `trm.nn.tpu_attention`'s scopes, e.g. MaxText's, nor of `scopes`:
  {op_name scope: causal?} the caller knows the mask of).

  2 x matmuls x (batch x heads) x head_dim x the query-key area of the
  blocks the kernel computes: every block under a full mask; under a
  causal one the blocks holding a query at or after a key (a block on the
  diagonal is computed whole, as the kernel does). Shapes come from the
  call's first three floating operands (q, k, v), blocks from the kernel's
  xprof metadata. With `mxu_width` > 1 each block's matmuls count as they
  occupy that MXU (`mxu_padding`): the time model's charge, not MFU's."""
  name = pallas_kernel_name(inst)
  if name is None or not name.startswith(("splash_mha_", "splash_mqa_")):
    return None
  kind = name.split("_")[2]
  op_name = re.search(r'op_name="([^"]*)"', inst.attrs)
  scopes = {**_splash_scopes(), **(scopes or {})}
  # The scope is a path component, or wrapped where autodiff traced it:
  # '.../attn/splash_causal_mask/vmap(...)', 'jvp(splash_causal_mask)/...',
  # 'transpose(jvp(splash_causal_mask))/...'.
  causal = next((c for scope, c in scopes.items() if op_name and re.search(
      r"[/(]" + scope + r"[)/]", op_name.group(1))), None)
  if causal is None or kind not in ("fwd", "dq", "dkv"):
    return None
  floats = [shape[0].dims for shape in _operand_shapes(inst, comp)
            if shape and shape[0].dtype in ("bf16", "f32", "f16")
            and len(shape[0].dims) >= 2]
  if len(floats) < 2:
    return None
  q, k = list(floats[0]), list(floats[1])
  for layout_key, dims in (("q_layout", q), ("k_layout", k)):
    if _metadata_int(inst.attrs, layout_key) == 0:  # sequence minor
      dims[-1], dims[-2] = dims[-2], dims[-1]
  q_len, head_dim, k_len = q[-2], q[-1], k[-2]
  suffix = {"fwd": "", "dq": "_dq", "dkv": "_dkv"}[kind]
  block_q = _metadata_int(inst.attrs, "block_q" + suffix) or q_len
  block_k = _metadata_int(inst.attrs, "block_kv" + suffix) or k_len
  if kind == "dkv" and re.search(r'use_fused_bwd_kernel\\?"\s*:\s*true',
                                 inst.attrs):
    kind = "dkv_fused"
  area = 0.0   # of the blocks computed, each times its matmuls' padding
  for start_q in range(0, q_len, block_q):
    rows = min(block_q, q_len - start_q)
    for start_k in range(0, k_len, block_k):
      if causal and start_k > start_q + rows - 1:
        break
      cols = min(block_k, k_len - start_k)
      size = {"q": rows, "k": cols, "d": head_dim}
      area += rows * cols * sum(
          mxu_padding(*(size[c] for c in matmul), mxu_width)
          for matmul in _SPLASH_MATMULS[kind])
  return 2.0 * math.prod(q[:-2]) * head_dim * area


# XLA:GPU's library calls whose work `gpu_library_cost` reads.
CUBLAS_PREFIX = "__cublas$"
CUDNN_ATTENTION_PREFIX = "__cudnn$fmha"
# A float32 x float32 cuBLAS matmul, in bf16-matmul FLOPs: XLA:GPU runs it
# on TF32 tensor cores (half the bf16 rate on A100 and H100) unless the
# precision is HIGHEST (CUDA cores: about 1/15 of the bf16 rate on both).
F32_MATMUL_WEIGHT = {"DEFAULT": 2.0, "HIGH": 2.0, "HIGHEST": 15.0}
# Matmuls of one cuDNN flash-attention call: forward S = QK^T and O = PV;
# backward recomputes S and forms dV, dP, dQ and dK.
_ATTENTION_MATMULS = {"forward": 2, "backward": 5}


def _json_list(attrs: str, key: str) -> list[int] | None:
  match = re.search(r'"' + key + r'"\s*:\s*\[([^\]]*)\]', attrs)
  return ([int(x) for x in re.findall(r"\d+", match.group(1))]
          if match else None)


def gpu_library_cost(inst: hlo.Instruction, comp: hlo.Computation
                     ) -> tuple[float, float] | None:
  """(FLOPs, HBM bytes) of a cuBLAS matmul or cuDNN attention custom-call,
  or None for anything else. Bytes: the operands read and the results
  written, less the scratch workspace (s8/u8) the call also returns.

  A matmul's FLOPs are 2 x output elements x the lhs contracting size
  (its `gemm_backend_config`), times `F32_MATMUL_WEIGHT` for float32
  operands, so that the FLOPs are what bf16 tensor-core time they take; an
  attention call's are 2 x matmuls x B x H x Tq x Tk x head dim, from the
  [B, H, Tq, Tk] score shape cuDNN records, halved for a causal mask (cuDNN
  skips the masked blocks)."""
  if inst.opcode != "custom-call":
    return None
  target = inst.attr("custom_call_target") or ""
  if not target.startswith((CUBLAS_PREFIX, CUDNN_ATTENTION_PREFIX)):
    return None
  results = [a for a in inst.shape if a.dtype not in ("s8", "u8")]
  operands = _operand_shapes(inst, comp)
  moved = (sum(a.bytes for a in results)
           + sum(a.bytes for shape in operands for a in shape))
  if not results or not operands or not operands[0]:
    return 0.0, moved
  lhs = operands[0][0].dims
  if target.startswith(CUBLAS_PREFIX):
    contracting = _json_list(inst.attrs, "lhs_contracting_dimensions") or []
    contracted = math.prod(lhs[d] for d in contracting if d < len(lhs))
    weight = 1.0
    if all(shape and shape[0].dtype == "f32" for shape in operands[:2]):
      precision = re.search(r'"operand_precision"\s*:\s*\[\s*"(\w+)"',
                            inst.attrs)
      weight = F32_MATMUL_WEIGHT.get(precision.group(1) if precision
                                     else "DEFAULT", 2.0)
    return 2.0 * weight * results[0].elements * contracted, moved
  scores = re.search(r'"intermediate_tensor_shape"\s*:\s*\{[^}]*?'
                     r'"dimensions"\s*:\s*\[([^\]]*)\]', inst.attrs)
  if not scores or not lhs:
    return 0.0, moved
  score_elements = math.prod(int(x) for x in re.findall(r"\d+",
                                                         scores.group(1)))
  kind = "backward" if "Backward" in target else "forward"
  causal = re.search(r'"mask_type"\s*:\s*"CAUSAL"', inst.attrs) is not None
  flops = (2.0 * _ATTENTION_MATMULS[kind] * score_elements * lhs[-1]
           * (0.5 if causal else 1.0))
  return flops, moved
