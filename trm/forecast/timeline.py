"""One step of the compiled program, played in its scheduled order.

The program is what XLA:TPU (or XLA:GPU) runs on each chip: its
instructions in the order the scheduler fixed. The time model, per
instruction:

* compute (fusions, dots, copies, ...): the longer of its dense FLOPs at
  `efficiency` x the chip's peak and its HBM bytes at the chip's HBM
  bandwidth (a roofline per instruction, not per program); the FLOPs of
  a matmul as it occupies the chip's MXU (`mxu_width`: its dims rounded
  up where the array cannot avoid padding, ops.mxu_padding), while the
  totals and MFU keep the useful FLOPs;
* a collective's start hands it to its network (ICI or DCN), which runs
  one collective at a time per resource at the time `network` gives; the
  matching done waits for it. What the compiler scheduled between the two
  overlaps it; a synchronous collective blocks. XLA:TPU's async collective
  fusions (a start fusion, continuation fusions, a done fusion, each
  holding the collective) are one such start/done pair; a lone fusion
  holding a collective blocks;
* a move between HBM and host memory (a remat policy's offloaded
  tensors, ops.host_transfer) runs on the chip's host link, one queue per
  direction at the fabric's host bandwidth; an async one overlaps what is
  scheduled before its done, as a collective does;
* a while loop runs its body trip-count times: the first iterations are
  played, the rest repeat the last one;
* a conditional takes its longer branch (the update, not the skip).

Every wait is charged to what it waited for, so the step splits into
compute, HBM, ICI, DCN and host seconds; the largest names the bound.
Waits on an asynchronous collective with nothing computed since its start
are also summed apart (`Step.unoverlapped_seconds`): exposure the
schedule chose, which XLA:TPU's scheduler does when a step is short of
memory.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import re

from trm.forecast import hlo
from trm.forecast import loops
from trm.forecast import network
from trm.forecast import ops

PLAYED_ITERATIONS = 3   # iterations of a loop played before repeating


@dataclasses.dataclass
class Totals:
  """Per chip, per step, loops multiplied out."""
  flops: float = 0.0
  hbm_bytes: float = 0.0
  ici_bytes: float = 0.0
  dcn_bytes: float = 0.0
  host_bytes: float = 0.0   # to and from host memory, both directions
  # (kind, network, axes, group size, payload bytes, traffic bytes) -> runs
  # per step
  collectives: collections.Counter = dataclasses.field(
      default_factory=collections.Counter)
  unknown_loops: int = 0   # loops whose trip count could not be read
  # Pallas kernel calls that declare no cost and are not read otherwise
  # (splash attention outside our scopes, ops.splash_flops): XLA cannot see
  # inside them, so their FLOPs count as 0.
  undeclared_kernels: int = 0

  def add(self, other: "Totals", times: float = 1.0):
    self.flops += other.flops * times
    self.hbm_bytes += other.hbm_bytes * times
    self.ici_bytes += other.ici_bytes * times
    self.dcn_bytes += other.dcn_bytes * times
    self.host_bytes += other.host_bytes * times
    for key, count in other.collectives.items():
      self.collectives[key] += count * times
    self.unknown_loops += other.unknown_loops
    self.undeclared_kernels += other.undeclared_kernels


@dataclasses.dataclass(frozen=True)
class HostTransfer:
  """One move over the chip's host link (what `_State` queues)."""
  direction: str          # to_host | from_host
  bytes: float
  seconds: float          # 0 where the fabric prices no host link
  network: str = "host"

  @property
  def resource(self) -> str:
    return "host:" + self.direction


@dataclasses.dataclass
class Step:
  seconds: float
  by_cause: dict          # compute | hbm | ici | dcn -> seconds on the path
  totals: Totals
  # Of by_cause's network seconds, those spent waiting on asynchronous
  # collectives that the schedule started and awaited with no compute
  # between (`_State.wait`): exposure the program chose, not the network.
  unoverlapped_seconds: float = 0.0

  @property
  def bound(self) -> str:
    return max(self.by_cause, key=self.by_cause.get)


class Program:
  """A parsed compiled program on a fabric, ready to be played."""

  def __init__(self, text: str, fabric: network.Fabric,
               kernel_flops: dict | None = None,
               splash_scopes: dict | None = None):
    self.module = hlo.parse_module(text)
    self.text = text
    self.fabric = fabric
    # {(Pallas kernel name, result dims): FLOPs per call}, for kernels
    # whose lowering drops their declared cost (Pallas's Triton backend).
    self.kernel_flops = kernel_flops or {}
    # {op_name scope: causal?} of splash attention calls made outside our
    # own scopes (another framework's program), read as ours are.
    self.splash_scopes = splash_scopes or {}
    self._fused: dict = {}
    self._costs: dict = {}
    self._collectives: dict = {}
    self._trips: dict = {}
    self._totals: dict = {}
    self._chains: dict = {}
    self._named_chains: dict | None = None
    self._fused_collectives: dict = {}
    self._host: dict = {}

  def on_fabric(self, fabric: network.Fabric) -> "Program":
    """The same program on another fabric (e.g. another DCN latency),
    without parsing it again: what does not depend on the fabric (costs,
    trip counts, chains) is shared, the collectives are described anew."""
    other = copy.copy(self)
    other.fabric = fabric
    other._collectives, other._fused_collectives, other._totals = {}, {}, {}
    other._host = {}
    return other

  # ------------------------------------------------------------ static
  def cost(self, comp, inst) -> tuple[float, float]:
    key = (comp.name, inst.name)
    if key not in self._costs:
      declared = (ops.pallas_cost(inst)
                  or self._declared_flops(comp, inst)
                  or ops.gpu_library_cost(inst, comp))
      self._costs[key] = declared or ops.instruction_cost(
          self.module, comp, inst, self._fused)
    return self._costs[key]

  def time_flops(self, comp, inst, mxu_width: int) -> float:
    """The FLOPs the time model charges an instruction on a chip whose MXU
    is `mxu_width` wide: `cost`'s, with its dots, convolutions and splash
    attention calls padded to the array (ops.mxu_padding); a kernel's
    declared FLOPs as declared. Width 1: `cost`'s."""
    flops = self.cost(comp, inst)[0]
    if mxu_width <= 1 or not flops:
      return flops
    key = (comp.name, inst.name, mxu_width)
    if key not in self._costs:
      padded = None
      if ops.pallas_cost(inst) is None and self.declared_flops(inst) is None:
        padded = ops.splash_flops(inst, comp, mxu_width,
                                  self.splash_scopes)
        if padded is None and ops.gpu_library_cost(inst, comp) is None:
          padded = flops + ops.mxu_padding_flops(self.module, comp, inst,
                                                 mxu_width, self._fused)
      self._costs[key] = flops if padded is None else padded
    return self._costs[key]

  def declared_flops(self, inst) -> float | None:
    """A Pallas kernel call's FLOPs from `kernel_flops`, or None."""
    name = ops.pallas_kernel_name(inst)
    if name is None:
      return None
    return self.kernel_flops.get(
        (name, tuple(tuple(a.dims) for a in inst.shape)))

  def _kernel_flops(self, comp, inst) -> float | None:
    """A Pallas kernel call's FLOPs where it declares none: from
    `kernel_flops`, or read from a splash attention call (ops.splash_flops)."""
    flops = self.declared_flops(inst)
    return (ops.splash_flops(inst, comp, scopes=self.splash_scopes)
            if flops is None else flops)

  def _declared_flops(self, comp, inst) -> tuple[float, float] | None:
    """(`_kernel_flops`, the call's operand and result bytes), or None."""
    flops = self._kernel_flops(comp, inst)
    if flops is None:
      return None
    return float(flops), ops.instruction_cost(self.module, comp, inst,
                                              self._fused)[1]

  def host_transfer(self, comp, inst) -> HostTransfer | None:
    key = (comp.name, inst.name)
    if key not in self._host:
      moved = ops.host_transfer(inst, comp)
      rate = self.fabric.host_bytes_per_second
      self._host[key] = None if moved is None else HostTransfer(
          moved[0], moved[1], moved[1] / rate if rate > 0 else 0.0)
    return self._host[key]

  def collective(self, comp, inst) -> network.Collective | None:
    key = (comp.name, inst.name)
    if key not in self._collectives:
      self._collectives[key] = network.describe(self.module, comp, inst,
                                                self.fabric)
    return self._collectives[key]

  def fused_collectives(self, inst) -> list[network.Collective]:
    """Collectives inside a fusion (XLA:TPU's collective fusions)."""
    if id(inst) not in self._fused_collectives:
      self._fused_collectives[id(inst)] = self._find_fused_collectives(inst)
    return self._fused_collectives[id(inst)]

  def _nested_collectives(self, inst):
    """(the fused computation, a collective instruction in it or in a fusion
    nested in it) for each collective a fusion holds."""
    if inst.opcode != "fusion":
      return
    for called in inst.called():
      if called in self.module.computations:
        for nested in ops.fused_cost(self.module, called, self._fused
                                     ).collectives:
          yield self.module.computations[called], nested

  def _find_fused_collectives(self, inst) -> list[network.Collective]:
    out = []
    for inner, nested in self._nested_collectives(inst):
      owner = next((c for c in self.module.computations.values()
                    if nested.name in c.by_name
                    and c.by_name[nested.name] is nested), inner)
      described = self.collective(owner, nested)
      if described is not None:
        out.append(described)
    return out

  def chain_roles(self, comp) -> dict[str, tuple[str, str]]:
    """XLA:TPU's async collective fusions in `comp`: fusion name ->
    (start | continue | done, the chain's start).

    With `--xla_tpu_enable_async_collective_fusion` one collective is carried
    by several custom fusions: an `async-collective-start`, continuation
    fusions doing other work beside it, and an `async-collective-done`,
    each holding the collective and fed the previous one's outputs through
    get-tuple-elements. A chain is found by that data flow: the first
    collective-holding fusion starts the collective once, the last waits
    for it. A fusion no other one continues stays a blocking collective.
    A continuation is also fed results of earlier chains (the weight a
    finished chain gathered, a product of an earlier continuation): it
    continues the chain most of its operands come from, its carried state
    (one operand per element); with no such majority it starts a chain.

    Where XLA:TPU names the chain (`chain_id` on the fused collectives, with
    `--xla_tpu_enable_async_collective_fusion_multiple_steps`), that name
    decides instead, across computations: a chain may start before a
    windowed-einsum loop, continue in the loop's body (each iteration a
    step of the one collective) and end after it. Its start is the member
    whose collective is not a continuation step (`flag_start` -1); its done
    the last member scheduled in the start's computation."""
    if comp.name in self._chains:
      return self._chains[comp.name]
    named = self._named_chain_roles()
    carriers = {i.name for i in comp.instructions
                if i.opcode == "fusion" and self.fused_collectives(i)
                and (comp.name, i.name) not in named}

    def producer(name):
      inst = comp.by_name.get(name)
      while (inst is not None and inst.opcode in ("get-tuple-element",
                                                  "bitcast")
             and inst.operands):
        inst = comp.by_name.get(inst.operands[0])
      return inst

    head_of, members = {}, collections.defaultdict(list)
    for inst in comp.instructions:  # scheduled order
      if inst.name not in carriers:
        continue
      votes = collections.Counter(
          head_of[source.name] for source in map(producer, inst.operands)
          if source is not None and source.name in head_of).most_common(2)
      head = (votes[0][0] if votes and (len(votes) == 1
                                        or votes[0][1] > votes[1][1])
              else inst.name)
      head_of[inst.name] = head
      members[head].append(inst.name)
    roles = {name: role for (where, name), role in named.items()
             if where == comp.name}
    for head, names in members.items():
      if len(names) > 1:
        roles.update({name: ("continue", head) for name in names[1:-1]})
        roles[head] = ("start", head)
        roles[names[-1]] = ("done", head)
    self._chains[comp.name] = roles
    return roles

  def _named_chain_roles(self) -> dict:
    """(computation, fusion) -> role, for chains XLA:TPU named
    (`chain_roles`); chains without one start and one done in one
    computation are left to the data-flow rule."""
    if self._named_chains is not None:
      return self._named_chains
    members = collections.defaultdict(list)   # chain id -> members
    for comp in self.module.computations.values():
      for inst in comp.instructions:
        for _, nested in self._nested_collectives(inst):
          chain = nested.frontend_attribute("chain_id")
          if chain is not None:
            flag = re.search(r'"flag_start"\s*:\s*"?(-?\d+)', nested.attrs)
            members[chain].append(
                (comp, inst, flag is not None and int(flag.group(1)) < 0))
            break
    roles = {}
    for chain in members.values():
      starts = [(comp, inst) for comp, inst, first in chain if first]
      if len(starts) != 1:
        continue
      home, start = starts[0]
      order = {i.name: k for k, i in enumerate(home.instructions)}
      local = sorted((inst for comp, inst, _ in chain if comp is home),
                     key=lambda i: order[i.name])
      if len(local) < 2 or local[0] is not start:
        continue
      for comp, inst, _ in chain:
        roles[(comp.name, inst.name)] = ("continue", start.name)
      roles[(home.name, start.name)] = ("start", start.name)
      roles[(home.name, local[-1].name)] = ("done", start.name)
    self._named_chains = roles
    return roles

  def trips(self, comp, inst) -> int | None:
    key = (comp.name, inst.name)
    if key not in self._trips:
      self._trips[key] = loops.trip_count(self.module, comp, inst)
    return self._trips[key]

  def totals(self, name: str | None = None) -> Totals:
    """FLOPs, bytes and collectives of one run of a computation."""
    name = name or self.module.entry
    if name in self._totals:
      return self._totals[name]
    comp = self.module.computations[name]
    total = Totals()
    for inst in comp.instructions:
      if inst.opcode == "while":
        trips = self.trips(comp, inst)
        if trips is None:
          total.unknown_loops += 1
        total.add(self.totals(inst.attr("body").lstrip("%")),
                  1 if trips is None else trips)
        continue
      if inst.opcode == "conditional":
        branches = [self.totals(b) for b in inst.called()
                    if b in self.module.computations]
        if branches:
          total.add(max(branches, key=lambda t: (t.flops, t.hbm_bytes)))
        continue
      if inst.opcode == "call":
        for called in inst.called():
          if called in self.module.computations:
            total.add(self.totals(called))
        continue
      flops, moved = self.cost(comp, inst)
      total.flops += flops
      total.hbm_bytes += moved
      transfer = self.host_transfer(comp, inst)
      if transfer is not None:
        total.host_bytes += transfer.bytes
      if (ops.is_pallas_call(inst) and ops.pallas_cost(inst) is None
          and self._kernel_flops(comp, inst) is None):
        total.undeclared_kernels += 1
      described = [self.collective(comp, inst)]
      if inst.opcode == "fusion" and self.chain_roles(comp).get(
          inst.name, ("start",))[0] == "start":  # a chain counts once
        described += self.fused_collectives(inst)
      for c in described:
        if c is None:
          continue
        if c.network == "dcn":
          total.dcn_bytes += c.traffic_bytes
        else:
          total.ici_bytes += c.traffic_bytes
        total.collectives[(c.kind, c.network, c.axes, c.group_size,
                           c.payload_bytes, c.traffic_bytes)] += 1
    self._totals[name] = total
    return total

  # ------------------------------------------------------------ played
  def play(self, peak_flops: float, efficiency: float,
           hbm_bytes_per_second: float, dcn_overlap: str = "none",
           mxu_width: int = 1) -> Step:
    """The step's time with dense compute at `efficiency` x peak, matmuls
    padded to a `mxu_width`-wide MXU (`time_flops`; 1: no padding, as for
    a GPU).

    dcn_overlap: 'schedule' plays cross-slice collectives as the program
    schedules them (whatever runs between a send and its done overlaps it);
    'none' makes each block the chip for its whole time, as runtimes that
    start the cross-slice reduction only after the backward pass did
    (PaLM's Pathways, MaxText's 2023 v4 runs; BUILD_NOTES)."""
    if dcn_overlap not in ("schedule", "none"):
      raise ValueError(f"--dcn_overlap={dcn_overlap!r}: choose schedule or "
                       "none.")
    state = _State()
    state.dcn_blocks = dcn_overlap == "none"
    rates = (peak_flops * efficiency, hbm_bytes_per_second, mxu_width)
    self._play(self.module.entry_computation, state, rates)
    end = max([state.now] + list(state.pending.values()))
    if end > state.now:
      state.charge(end - state.now, "dcn")
    return Step(end, dict(state.by_cause), self.totals(),
                state.unoverlapped)

  def _play(self, comp, state, rates):
    for inst in comp.instructions:
      opcode = inst.opcode
      if opcode == "while":
        self._play_loop(comp, inst, state, rates)
      elif opcode == "conditional":
        self._play_branches(inst, state, rates)
      elif opcode == "call":
        for called in inst.called():
          if called in self.module.computations:
            self._play(self.module.computations[called], state, rates)
      elif (opcode in ops.ASYNC_DONES or opcode in ("send-done", "recv-done")
            or (opcode in ops.HOST_DONES and ops.touches_host(inst, comp))):
        state.wait(inst.operands[0] if inst.operands else None)
      elif opcode == "recv":
        state.pending_alias[inst.name] = _rendezvous(inst)
      elif (transfer := self.host_transfer(comp, inst)) is not None:
        if opcode.endswith("-start"):
          state.start(inst.name, transfer, None)
        else:
          state.block(transfer)
      else:
        described = self.collective(comp, inst)
        if described is not None and (opcode in ops.ASYNC_STARTS
                                      or opcode in ("async-start", "send")):
          if described.network == "dcn" and state.dcn_blocks:
            state.block(described)
          else:
            state.start(inst.name, described, _rendezvous(inst))
          continue
        moved = self.cost(comp, inst)[1]
        flops = self.time_flops(comp, inst, rates[2])
        if flops or moved:
          compute_s = flops / rates[0]
          memory_s = moved / rates[1]
          state.charge(max(compute_s, memory_s),
                       "compute" if compute_s >= memory_s else "hbm")
        blocking = [described] if described is not None else []
        if opcode == "fusion":
          role, head = self.chain_roles(comp).get(inst.name, ("alone", ""))
          if role == "alone":
            blocking += self.fused_collectives(inst)
          elif role == "start":
            for k, fused in enumerate(self.fused_collectives(inst)):
              state.start(_chain_name(head, k), fused, None)
          elif role == "done":
            for k in range(len(self.fused_collectives(comp.by_name[head]))):
              state.wait(_chain_name(head, k))
        for c in blocking:
          state.block(c)

  def _play_loop(self, comp, inst, state, rates):
    body = self.module.computations.get((inst.attr("body") or "").lstrip("%"))
    trips = self.trips(comp, inst)
    trips = 1 if trips is None else trips
    if body is None or trips <= 0:
      return
    played = min(trips, PLAYED_ITERATIONS)
    last = None
    for _ in range(played):
      before = state.snapshot()
      self._play(body, state, rates)
      last = before
    remaining = trips - played
    if remaining and last is not None:
      state.repeat_since(last, remaining)

  def _play_branches(self, inst, state, rates):
    outcomes = []
    for name in inst.called():
      if name not in self.module.computations:
        continue
      branch = state.copy()
      self._play(self.module.computations[name], branch, rates)
      outcomes.append(branch)
    if outcomes:
      state.adopt(max(outcomes, key=lambda s: s.now))

  # ------------------------------------------------------------ where
  def instruction_times(self, peak_flops: float, efficiency: float,
                        hbm_bytes_per_second: float, mxu_width: int = 1):
    """Yields (instruction, roofline seconds per run, HBM bytes per run,
    FLOPs per run, runs per step) for every compute instruction a step
    runs: loops count their trip counts, a conditional its costlier
    branch. Network time is not included. The seconds charge the MXU's
    padding (`time_flops`), the FLOPs are the useful ones."""
    rates = (peak_flops * efficiency, hbm_bytes_per_second)

    def walk(comp, times):
      for inst in comp.instructions:
        if inst.opcode == "while":
          body = self.module.computations.get(
              (inst.attr("body") or "").lstrip("%"))
          if body is not None:
            yield from walk(body, times * (self.trips(comp, inst) or 1))
          continue
        if inst.opcode in ("conditional", "call"):
          called = [self.module.computations[c] for c in inst.called()
                    if c in self.module.computations]
          if inst.opcode == "conditional" and called:
            called = [max(called, key=lambda c: (
                self.totals(c.name).flops, self.totals(c.name).hbm_bytes))]
          for c in called:
            yield from walk(c, times)
          continue
        flops, moved = self.cost(comp, inst)
        if not (flops or moved):
          continue
        yield (inst, max(self.time_flops(comp, inst, mxu_width) / rates[0],
                         moved / rates[1]), moved, flops, times)

    yield from walk(self.module.entry_computation, 1)

  def hot_spots(self, peak_flops: float, efficiency: float,
                hbm_bytes_per_second: float, top: int = 20,
                mxu_width: int = 1) -> list[dict]:
    """The compute instructions' roofline time per step, summed by what the
    model code called them (`op_name` metadata, transforms stripped, last
    three scopes) and instruction kind, largest first: which part of the
    model a step's time goes to (`instruction_times`, summed)."""
    spots: dict = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for inst, seconds, moved, flops, times in self.instruction_times(
        peak_flops, efficiency, hbm_bytes_per_second, mxu_width):
      spot = spots[(op_label(inst), instruction_kind(inst))]
      spot[0] += seconds * times
      spot[1] += moved * times
      spot[2] += flops * times
      spot[3] += times
    ranked = sorted(spots.items(), key=lambda item: -item[1][0])[:top]
    return [{"op": op, "kind": kind, "seconds": v[0], "hbm_bytes": v[1],
             "flops": v[2], "runs": v[3]} for (op, kind), v in ranked]


# Scopes of an op_name that say how, not where: jit and autodiff transforms,
# control flow, remat.
_TRANSFORM_SCOPE = re.compile(
    r"^(jit|jvp|transpose|vmap|pjit|remat|checkpoint|rematted_computation|"
    r"while|body|cond|closed_call|branch_\d+_fun)(\(.*\))?$")


def instruction_kind(inst: hlo.Instruction) -> str:
  """A fusion's kind (kLoop, kInput, kCustom, ...), else the opcode."""
  return (inst.attr("kind") if inst.opcode == "fusion" else None
          ) or inst.opcode


def op_label(inst: hlo.Instruction, depth: int = 3) -> str:
  """The model-code name of an instruction: its `op_name` metadata with
  jit/autodiff/control-flow scopes dropped, last `depth` scopes; the
  opcode when it has none."""
  match = re.search(r'op_name="([^"]*)"', inst.attrs)
  if not match:
    return inst.opcode
  scopes = [s for s in match.group(1).split("/")
            if s and not _TRANSFORM_SCOPE.match(s)]
  return "/".join(scopes[-depth:]) or inst.opcode


def _rendezvous(inst: hlo.Instruction) -> str | None:
  return inst.frontend_attribute("_xla_host_transfer_rendezvous")


def _chain_name(start: str, k: int) -> str:
  """The k-th collective an async collective fusion starts."""
  # `|` cannot occur in an HLO name (`#` can: `%x#1` is x's element 1).
  return start if k == 0 else f"{start}|{k}"


class _State:
  """Clock of the compute stream, queues of the networks, and what every
  started collective finishes at."""

  def __init__(self):
    self.now = 0.0
    self.free = collections.defaultdict(float)     # resource -> free at
    self.pending: dict[str, float] = {}            # start name -> end
    self.network_of: dict[str, str] = {}    # start name -> ici|dcn|host
    self.rendezvous: dict[str, str] = {}           # rendezvous -> start
    self.pending_alias: dict[str, str | None] = {}  # recv -> rendezvous
    self.by_cause = collections.defaultdict(float)
    self.dcn_blocks = False   # cross-slice collectives block the chip
    self.work_at: dict[str, float] = {}    # start name -> `work` at start
    self.unoverlapped = 0.0   # waits with no work since their start

  @property
  def work(self) -> float:
    """Seconds the chip has computed (or moved HBM bytes) so far."""
    return self.by_cause.get("compute", 0.0) + self.by_cause.get("hbm", 0.0)

  def charge(self, seconds: float, cause: str):
    if seconds > 0:
      self.now += seconds
      self.by_cause[cause] += seconds

  def start(self, name, collective, rendezvous):
    begin = max(self.now, self.free[collective.resource])
    end = begin + collective.seconds
    self.free[collective.resource] = end
    self.pending[name] = end
    self.network_of[name] = collective.network
    self.work_at[name] = self.work
    if rendezvous:
      self.rendezvous[rendezvous] = name

  def wait(self, name):
    if name in self.pending_alias:
      name = self.rendezvous.get(self.pending_alias[name])
    if name is None or name not in self.pending:
      return
    end = self.pending.pop(name)
    idle = self.work_at.pop(name, None) == self.work
    if end > self.now:
      if idle:
        self.unoverlapped += end - self.now
      self.charge(end - self.now, self.network_of.get(name, "ici"))

  def block(self, collective):
    begin = max(self.now, self.free[collective.resource])
    end = begin + collective.seconds
    self.free[collective.resource] = end
    if end > self.now:
      self.charge(end - self.now, collective.network)

  def snapshot(self):
    return (self.now, dict(self.by_cause), dict(self.free),
            dict(self.pending), self.unoverlapped)

  def repeat_since(self, snapshot, times: int):
    """The span since `snapshot` (one loop iteration) happens `times` more:
    the clock, its causes, and what the iteration started move on."""
    now, causes, free, pending, unoverlapped = snapshot
    seconds = (self.now - now) * times
    self.now += seconds
    self.unoverlapped += (self.unoverlapped - unoverlapped) * times
    for cause in list(self.by_cause):
      self.by_cause[cause] += (self.by_cause[cause] - causes.get(cause, 0.0)
                               ) * times
    for key, value in self.free.items():
      if free.get(key) != value:
        self.free[key] = value + seconds
    for key, value in self.pending.items():
      if pending.get(key) != value:
        self.pending[key] = value + seconds

  def copy(self) -> "_State":
    other = _State()
    other.now = self.now
    other.free = collections.defaultdict(float, self.free)
    other.pending = dict(self.pending)
    other.network_of = dict(self.network_of)
    other.rendezvous = dict(self.rendezvous)
    other.pending_alias = dict(self.pending_alias)
    other.by_cause = collections.defaultdict(float, self.by_cause)
    other.dcn_blocks = self.dcn_blocks
    other.work_at = dict(self.work_at)
    other.unoverlapped = self.unoverlapped
    return other

  def adopt(self, other: "_State"):
    self.__dict__.update(other.__dict__)
