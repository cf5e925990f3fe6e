"""The HLO reader, trip counts and the played timeline, on hand-written
programs whose answers are known by hand."""
import pytest

from trm.core import topology
from trm.forecast import hlo
from trm.forecast import loops
from trm.forecast import network
from trm.forecast import ops
from trm.forecast import plan
from trm.forecast import timeline

# A 2x2x1 slice (v4-8's shape), no wraparound; 1e9 bytes/s per link so
# the arithmetic stays readable.
V4_8 = topology.parse_topology("v4-8")
FABRIC = network.Fabric(coords=((0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)),
                        dims=(2, 2, 1), wraps=(False, False, False),
                        link_bytes_per_second=1e9,
                        dcn_bytes_per_second=1e8, num_slices=2,
                        hop_seconds=0.0, dcn_step_seconds=0.0)

_FUSED_DOT = """
%fused_dot (p0: bf16[1024,1024], p1: bf16[1024,1024]) -> f32[1024,1024] {
  %p0 = bf16[1024,1024]{1,0} parameter(0)
  %p1 = bf16[1024,1024]{1,0} parameter(1)
  ROOT %dot.1 = f32[1024,1024]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


def _module(entry_body: str, extra: str = _FUSED_DOT) -> str:
  return ("HloModule test, is_scheduled=true, num_partitions=4\n" + extra
          + "\nENTRY %main (a: bf16[1024,1024], b: f32[256,1024]) -> "
          "f32[1024,1024] {\n" + entry_body + "\n}\n")


def test_shapes_operands_and_attributes_are_read():
  text = _module("""
  %a = bf16[1024,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %t = (f32[256,1024]{1,0}, /*index=1*/f32[1024,1024]{1,0}) tuple(%b, %b)
  ROOT %f = f32[1024,1024]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot, metadata={op_name="x(y)"}
""")
  module = hlo.parse_module(text)
  assert module.num_partitions == 4
  entry = module.entry_computation
  assert [i.opcode for i in entry.instructions] == [
      "parameter", "parameter", "tuple", "fusion"]
  assert entry.by_name["t"].result_bytes == (256 + 1024) * 1024 * 4
  assert entry.by_name["a"].result_bytes == 1024 * 1024 * 2
  assert entry.by_name["f"].operands == ("a", "a")
  assert entry.by_name["f"].called() == ["fused_dot"]
  assert entry.root.name == "f"


@pytest.mark.parametrize("attr, groups", [
    ("replica_groups={{0,1},{2,3}}", [[0, 1], [2, 3]]),
    ("replica_groups={}", [[0, 1, 2, 3]]),
    ("replica_groups=[2,2]<=[4]", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0)", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2] {'a'}", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2] {'b'}", [[0, 1], [2, 3]]),
    ("replica_groups=mesh['a'=2,'b'=1,'c'=2], device_ids=([2,2]T(1,0)) "
     "{'a'}", [[0, 1], [2, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2], device_ids=(0,2,1,3) {'b'}",
     [[0, 2], [1, 3]]),
    ("replica_groups=mesh['a'=2,'b'=2] {'a','b'}", [[0, 1, 2, 3]]),
])
def test_replica_group_forms(attr, groups):
  inst = hlo.Instruction("ar", (), "all-reduce", ("x",),
                         attr + ", use_global_device_ids=true, to_apply=%add")
  assert hlo.replica_groups(inst, 4) == groups


def _loop_module(start: int, bound: int, step: int, direction: str = "LT"):
  return f"""HloModule loop, is_scheduled=true, num_partitions=4

%body (p: (s32[], f32[1024,1024])) -> (s32[], f32[1024,1024]) {{
  %p = (s32[], f32[1024,1024]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[1024,1024]{{1,0}} get-tuple-element(%p), index=1
  %one = s32[] constant({step})
  %next = s32[] add(%i, %one)
  %y = f32[1024,1024]{{1,0}} dot(%x, %x), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %ar = f32[1024,1024]{{1,0}} all-reduce(%y), replica_groups={{{{0,1,2,3}}}}, to_apply=%add
  ROOT %out = (s32[], f32[1024,1024]{{1,0}}) tuple(%next, %ar)
}}

%cond (p: (s32[], f32[1024,1024])) -> pred[] {{
  %p = (s32[], f32[1024,1024]{{1,0}}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant({bound})
  ROOT %lt = pred[] compare(%i, %n), direction={direction}
}}

%add (a: f32[], b: f32[]) -> f32[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}}

ENTRY %main (x: f32[1024,1024]) -> (s32[], f32[1024,1024]) {{
  %x = f32[1024,1024]{{1,0}} parameter(0)
  %zero = s32[] constant({start})
  %init = (s32[], f32[1024,1024]{{1,0}}) tuple(%zero, %x)
  ROOT %w = (s32[], f32[1024,1024]{{1,0}}) while(%init), condition=%cond, body=%body
}}
"""


@pytest.mark.parametrize("start, bound, step, direction, trips", [
    (0, 7, 1, "LT", 7), (0, 48, 1, "LT", 48), (2, 10, 2, "LT", 4),
    (0, 7, 1, "LE", 8), (0, 6, 4, "LT", 2),
])
def test_trip_counts(start, bound, step, direction, trips):
  module = hlo.parse_module(_loop_module(start, bound, step, direction))
  entry = module.entry_computation
  assert loops.trip_count(module, entry, entry.by_name["w"]) == trips


def test_a_loop_body_counts_its_trip_count_times():
  """XLA's cost_analysis counts a loop body once; the reader multiplies."""
  program = timeline.Program(_loop_module(0, 7, 1), FABRIC)
  totals = program.totals()
  assert totals.flops == pytest.approx(7 * 2 * 1024**3)
  # One all-reduce per iteration over 4 chips: 2 x 3/4 of 4 MiB each.
  assert totals.ici_bytes == pytest.approx(7 * 2 * 0.75 * 4 * 2**20)
  runs = {key[0]: count for key, count in totals.collectives.items()}
  assert runs == {"all-reduce": 7}
  assert totals.unknown_loops == 0


def test_a_loop_whose_count_cannot_be_read_is_counted_once_and_reported():
  text = _loop_module(0, 7, 1).replace(
      "%zero = s32[] constant(0)", "%zero = s32[] parameter(1)")
  program = timeline.Program(text, FABRIC)
  assert program.totals().unknown_loops == 1
  assert program.totals().flops == pytest.approx(2 * 1024**3)


def test_an_instruction_broken_over_lines_stays_in_its_computation():
  """A Pallas kernel's metadata (a JSON string holding escaped quotes and
  newlines) breaks its custom-call over lines, one of which starts with
  '}'; the body must keep its real root, so the loop's count is read."""
  kernel = (
      '  %kernel = f32[1024,1024]{1,0} custom-call(%x), '
      'custom_call_target="tpu_custom_call", frontend_attributes={'
      'kernel_metadata={"xprof":"{\\"block_q\\": 512, \\"x\\": '
      '\\"}\\"\n'
      '}"\n'
      '}}, backend_config={"custom_call_config":{"body":"TUzv"}}\n')
  text = _loop_module(0, 48, 1).replace(
      "  %next = s32[] add(%i, %one)\n",
      "  %next = s32[] add(%i, %one)\n" + kernel)
  module = hlo.parse_module(text)
  body = module.computations["body"]
  assert body.root.name == "out"
  assert body.by_name["kernel"].opcode == "custom-call"
  entry = module.entry_computation
  assert loops.trip_count(module, entry, entry.by_name["w"]) == 48


def test_rows_with_unread_loops_are_flagged():
  rows = [{"slices": 1, "unknown_loops": 0}, {"slices": 2, "unknown_loops": 3}]
  warnings = plan.unread_loop_warnings(rows)
  assert len(warnings) == 1 and "2-slice row has 3 while loop" in warnings[0]


def test_a_program_with_nothing_to_time_is_a_forecast_error():
  """Before: ZeroDivisionError for its TFLOP/s (and no bound to name)."""
  text = _module("""
  %a = bf16[1024,1024]{1,0} parameter(0)
  ROOT %b = f32[256,1024]{1,0} parameter(1)""", extra="")
  with pytest.raises(plan.ForecastError, match="the 1-slice step's compiled"):
    plan.forecast_row(_compiled_row(text, 0.0), V4_8, 0.5)


def _compiled_row(text: str, model_flops: float) -> plan.CompiledRow:
  """A 1-slice row of 4 chips whose compiled program is `text`."""
  return plan.CompiledRow(
      slices=1, chips=4, mesh={"data": 4}, global_batch=8,
      model_flops=model_flops, tokens_per_example=None, compile_seconds=0.0,
      fits=True, memory_gib=0.1, program=timeline.Program(text, FABRIC))


def test_a_measured_mfu_below_the_calibration_range_is_refused():
  """Before: the fit stopped at its lowest efficiency and the table said
  the row's MFU was set to the measurement while showing another."""
  compiled = _compiled_row(_overlap_module(False), 4 * 2 * 1024**3)
  lowest = plan.forecast_row(compiled, V4_8, 1e-3)["mfu"]
  fitted = plan.calibrate(compiled, V4_8, 2 * lowest)
  assert plan.forecast_row(compiled, V4_8, fitted)["mfu"] == pytest.approx(
      2 * lowest, rel=1e-4)
  with pytest.raises(plan.ForecastError, match="--calibrate_mfu=.* is below"):
    plan.calibrate(compiled, V4_8, lowest / 10)


def test_pallas_kernels_that_declare_no_cost_are_flagged():
  """jax's splash attention declares no cost, so its FLOPs count as 0:
  before, the row said nothing (a GPT at 8,192 tokens with splash showed
  111% MFU); now the table warns."""
  call = ('  %{name} = f32[1024,1024]{{1,0}} custom-call(%a), '
          'custom_call_target="tpu_custom_call", metadata={{op_name='
          '"jit(f)/splash_mha_fwd/pallas_call"}}, backend_config={{'
          '"custom_call_config":{{"body":"TUzv"{cost}}}}}')
  text = _module("\n".join([
      "  %a = bf16[1024,1024]{1,0} parameter(0)",
      "  %b = f32[256,1024]{1,0} parameter(1)",
      call.format(name="bare", cost=""),
      call.format(name="costed", cost=', "cost_estimate":{"flops":"2000",'
                  '"bytes_accessed":"8"}'),
      "  ROOT %out = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) "
      "tuple(%bare, %costed)"]))
  totals = timeline.Program(text, FABRIC).totals()
  assert totals.undeclared_kernels == 1 and totals.flops == 2000
  row = plan.forecast_row(_compiled_row(text, 1e9), V4_8, 0.5)
  assert row["undeclared_kernels"] == 1
  text = plan.format_rows([dict(row, scaling_efficiency=1.0)], "v4-8", 0.5,
                          "--efficiency")
  assert ("WARNING: the 1-slice row calls 1 Pallas kernel(s) that declare "
          "no cost") in text


def test_the_table_states_a_sub_microsecond_dcn_latency():
  """Before: --dcn_step_us=0.4 was charged but the header said '0 us'."""
  rows = [{"slices": 1, "dcn_step_seconds": 4e-7},
          {"slices": 2, "dcn_step_seconds": 4e-7,
           "dcn_step_source": "--dcn_step_us"}]
  assert plan._dcn_step_note(rows) == (  # pylint: disable=protected-access
      ", 0.4 us per cross-slice ring step (--dcn_step_us)")


def _overlap_module(asynchronous: bool) -> str:
  if asynchronous:
    gather = """
  %ag = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(%b), replica_groups={{0,1,2,3}}, dimensions={0}
  %f = f32[1024,1024]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot
  %agd = f32[1024,1024]{1,0} all-gather-done(%ag)"""
  else:
    gather = """
  %agd = f32[1024,1024]{1,0} all-gather(%b), replica_groups={{0,1,2,3}}, dimensions={0}
  %f = f32[1024,1024]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot"""
  return _module("""
  %a = bf16[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)""" + gather + """
  ROOT %out = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%f, %agd)""")


# The dot: 2 * 1024^3 FLOPs; at 1e12 FLOP/s x 0.5 that is 4.29 ms. The
# all-gather: each chip sends 3/4 of 4 MiB over the x and y axes (one link
# each way, no wraparound): 3 MiB / 2e9 B/s = 1.57 ms.
PEAK, HBM = 1e12, 1e15
DOT_S = 2 * 1024**3 / (PEAK * 0.5)
GATHER_S = 0.75 * 4 * 2**20 / 2e9


def test_an_async_collective_overlaps_the_compute_scheduled_inside_it():
  step = timeline.Program(_overlap_module(True), FABRIC).play(PEAK, 0.5, HBM)
  hbm_s = (2 * 2 * 1024**2 + 4 * 1024**2) / HBM
  assert step.seconds == pytest.approx(max(DOT_S, hbm_s), rel=1e-6)
  assert step.bound == "compute"
  assert step.by_cause.get("ici", 0.0) == 0.0


def test_a_synchronous_collective_adds_its_time():
  step = timeline.Program(_overlap_module(False), FABRIC).play(PEAK, 0.5, HBM)
  assert step.seconds == pytest.approx(DOT_S + GATHER_S, rel=1e-3)
  assert step.by_cause["ici"] == pytest.approx(GATHER_S, rel=1e-6)


def test_a_collective_longer_than_the_overlapped_compute_is_waited_for():
  program = timeline.Program(_overlap_module(True), FABRIC)
  # At full efficiency on a 10x faster chip the dot takes 0.21 ms < 1.57.
  step = program.play(PEAK * 10, 1.0, HBM)
  assert step.seconds == pytest.approx(GATHER_S, rel=1e-3)
  assert step.bound == "ici"


def _back_to_back_module() -> str:
  return _module("""
  %a = bf16[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %ag = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) all-gather-start(%b), replica_groups={{0,1,2,3}}, dimensions={0}
  %agd = f32[1024,1024]{1,0} all-gather-done(%ag)
  %f = f32[1024,1024]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot
  ROOT %out = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%f, %agd)""")


def test_an_async_collective_awaited_at_once_is_counted_unoverlapped():
  """XLA:TPU's scheduler, short of memory, starts a collective and awaits
  it with nothing between (MaxText's v5p 32B on one slice, session 99):
  the wait is the schedule's, and the step says how much of it there is."""
  step = timeline.Program(_back_to_back_module(), FABRIC).play(PEAK, 0.5, HBM)
  assert step.by_cause["ici"] == pytest.approx(GATHER_S, rel=1e-6)
  assert step.unoverlapped_seconds == pytest.approx(GATHER_S, rel=1e-6)
  # With the dot between start and done, what is still waited for is the
  # network's, not the schedule's.
  overlapped = timeline.Program(_overlap_module(True), FABRIC).play(
      PEAK * 10, 1.0, HBM)
  assert overlapped.by_cause["ici"] > 0
  assert overlapped.unoverlapped_seconds == 0.0
  blocking = timeline.Program(_overlap_module(False), FABRIC).play(
      PEAK, 0.5, HBM)
  assert blocking.unoverlapped_seconds == 0.0


def test_unoverlapped_waits_in_a_loop_count_every_trip():
  text = _loop_module(0, 7, 1).replace(
      "%ar = f32[1024,1024]{1,0} all-reduce(%y)",
      "%ars = f32[1024,1024]{1,0} all-reduce-start(%y)").replace(
          "to_apply=%add\n", "to_apply=%add\n  %ar = f32[1024,1024]{1,0} "
          "all-reduce-done(%ars)\n")
  assert "all-reduce-done" in text
  program = timeline.Program(text, FABRIC)
  step = program.play(PEAK, 0.5, HBM)
  reduce_s = 2 * 0.75 * 4 * 2**20 / 2e9
  assert step.by_cause["ici"] == pytest.approx(7 * reduce_s, rel=1e-6)
  assert step.unoverlapped_seconds == pytest.approx(7 * reduce_s, rel=1e-6)


def test_rows_that_wait_on_unoverlapped_collectives_get_a_note():
  row = {"slices": 1, "step_seconds": 14.29, "unoverlapped_seconds": 3.87,
         "fits": True, "memory_gib": 99.68, "chip_hbm_gib": 95.74}
  (line,) = plan.unoverlapped_lines([row])
  assert line.startswith("NOTE: the 1-slice step waits 3.870 s of its "
                         "14.290 s (27%)")
  assert "short of memory (this step: 99.68 GiB of the chip's 95.74)" in line
  assert "--config.global_batch_size; GPT's --config.batch_size" in line
  assert ("Keeping the first schedule (add "
          "--xla_latency_hiding_scheduler_rerun=0 to "
          "--config.tpu_compiler_options") in line
  # With the row's own options known, the flag to copy keeps them.
  (line,) = plan.unoverlapped_lines([dict(
      row, tpu_compiler_options="--xla_enable_async_all_gather=true")])
  assert ("(--config.tpu_compiler_options='--xla_enable_async_all_gather="
          "true --xla_latency_hiding_scheduler_rerun=0'; the compile says"
          ) in line
  # Options that set the rerun already leave the batch and remat.
  (line,) = plan.unoverlapped_lines([dict(
      row, tpu_compiler_options="--xla_latency_hiding_scheduler_rerun=0")])
  assert "Keeping" not in line
  assert "memory limit. A smaller batch a chip" in line
  # A small step is not short of memory: nothing else was there to overlap.
  (line,) = plan.unoverlapped_lines([dict(row, memory_gib=0.01)])
  assert "not short of memory (0.01 GiB of the chip's 95.74)" in line
  assert "a larger batch" in line
  assert not plan.unoverlapped_lines([dict(row, unoverlapped_seconds=1.0)])
  assert not plan.unoverlapped_lines([dict(row, step_seconds=None)])


# XLA:TPU's async collective fusion (MaxText's v5e flags): one all-gather
# carried by a start fusion, a continuation fusion doing a dot beside it,
# and a done fusion, each fed the previous one's outputs.
_COLLECTIVE_FUSIONS = """
%start_comp (p0: f32[256,1024]) -> (f32[256,1024], f32[1024,1024]) {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %t = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%p0, %g)
}

%continue_comp (p0: f32[256,1024], p1: f32[1024,1024], p2: bf16[1024,1024]) -> (f32[256,1024], f32[1024,1024], f32[1024,1024]) {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  %p2 = bf16[1024,1024]{1,0} parameter(2)
  %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}
  %dot.2 = f32[1024,1024]{1,0} dot(%p2, %p2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%p0, %g, %dot.2)
}

%done_comp (p0: f32[256,1024], p1: f32[1024,1024]) -> f32[1024,1024] {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  ROOT %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}
}
"""


def _collective_fusion_module(chained: bool) -> str:
  feed, last = ("%s0, %s1", "%c0, %c1") if chained else ("%b, %z", "%b, %z")
  return _module("""
  %a = bf16[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %z = f32[1024,1024]{1,0} constant(0)
  %s = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%b), kind=kCustom, calls=%start_comp
  %s0 = f32[256,1024]{1,0} get-tuple-element(%s), index=0
  %s1 = f32[1024,1024]{1,0} get-tuple-element(%s), index=1
  %c = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) fusion(""" + feed + """, %a), kind=kCustom, calls=%continue_comp
  %c0 = f32[256,1024]{1,0} get-tuple-element(%c), index=0
  %c1 = f32[1024,1024]{1,0} get-tuple-element(%c), index=1
  %c2 = f32[1024,1024]{1,0} get-tuple-element(%c), index=2
  %d = f32[1024,1024]{1,0} fusion(""" + last + """), kind=kCustom, calls=%done_comp
  ROOT %out = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%c2, %d)""",
                 _COLLECTIVE_FUSIONS)


def test_an_async_collective_fusion_is_one_collective_overlapping_its_work():
  program = timeline.Program(_collective_fusion_module(True), FABRIC)
  step = program.play(PEAK, 0.5, HBM)
  # Started once, overlapped by the continuation's dot, waited for once.
  assert step.seconds == pytest.approx(DOT_S, rel=1e-3)
  assert step.by_cause.get("ici", 0.0) == 0.0
  assert program.totals().ici_bytes == pytest.approx(0.75 * 4 * 2**20)
  # The same fusions not fed one another are three blocking gathers (the
  # reading of a lone collective-holding fusion).
  unchained = timeline.Program(_collective_fusion_module(False), FABRIC)
  step = unchained.play(PEAK, 0.5, HBM)
  assert step.by_cause["ici"] == pytest.approx(3 * GATHER_S, rel=1e-3)
  assert unchained.totals().ici_bytes == pytest.approx(3 * 0.75 * 4 * 2**20)


# XLA:TPU also feeds a continuation what earlier chains made: here the
# second chain's continuation takes the weight the first chain gathered.
_JOINED_CHAINS = """
%continue_joined (p0: f32[256,1024], p1: f32[1024,1024], p2: bf16[1024,1024], p3: f32[1024,1024]) -> (f32[256,1024], f32[1024,1024], f32[1024,1024]) {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  %p2 = bf16[1024,1024]{1,0} parameter(2)
  %p3 = f32[1024,1024]{1,0} parameter(3)
  %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}
  %dot.3 = f32[1024,1024]{1,0} dot(%p2, %p2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %sum = f32[1024,1024]{1,0} add(%dot.3, %p3)
  ROOT %t = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%p0, %g, %sum)
}
"""


def test_a_continuation_fed_an_earlier_chains_result_stays_in_its_chain():
  program = timeline.Program(_module("""
  %a = bf16[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %s = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%b), kind=kCustom, calls=%start_comp
  %s0 = f32[256,1024]{1,0} get-tuple-element(%s), index=0
  %s1 = f32[1024,1024]{1,0} get-tuple-element(%s), index=1
  %c = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%s0, %s1, %a), kind=kCustom, calls=%continue_comp
  %c0 = f32[256,1024]{1,0} get-tuple-element(%c), index=0
  %c1 = f32[1024,1024]{1,0} get-tuple-element(%c), index=1
  %d = f32[1024,1024]{1,0} fusion(%c0, %c1), kind=kCustom, calls=%done_comp
  %t = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%b), kind=kCustom, calls=%start_comp
  %t0 = f32[256,1024]{1,0} get-tuple-element(%t), index=0
  %t1 = f32[1024,1024]{1,0} get-tuple-element(%t), index=1
  %e = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%t0, %t1, %a, %d), kind=kCustom, calls=%continue_joined
  %e0 = f32[256,1024]{1,0} get-tuple-element(%e), index=0
  %e1 = f32[1024,1024]{1,0} get-tuple-element(%e), index=1
  %e2 = f32[1024,1024]{1,0} get-tuple-element(%e), index=2
  %f = f32[1024,1024]{1,0} fusion(%e0, %e1), kind=kCustom, calls=%done_comp
  ROOT %out = (f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%e2, %f)""",
                                      _COLLECTIVE_FUSIONS + _JOINED_CHAINS), FABRIC)
  roles = program.chain_roles(program.module.entry_computation)
  assert roles == {"s": ("start", "s"), "c": ("continue", "s"),
                   "d": ("done", "s"), "t": ("start", "t"),
                   "e": ("continue", "t"), "f": ("done", "t")}
  # Two gathers, each started once and hidden behind its continuation's
  # dot. (Read as a chain starting at `e`, the second was counted twice
  # and its start fusion blocked the chip: MaxText's v5e 32B forecast
  # lost 0.72 s a step that way.)
  step = program.play(PEAK, 0.5, HBM)
  assert program.totals().ici_bytes == pytest.approx(2 * 0.75 * 4 * 2**20)
  assert step.by_cause.get("ici", 0.0) == 0.0


# XLA:TPU with `--xla_tpu_enable_async_collective_fusion_multiple_steps`
# (MaxText's v5e flags): the chain of one all-gather (`chain_id` 7) starts
# before a windowed-einsum loop, takes a step in each of the loop's 4
# iterations beside a dot, and ends after it. The fusions hand the shard and
# the gathered buffer on, aliased, and end in XLA:TPU's marker calls.
_NAMED_CHAIN = """
%named_start (p0: f32[256,1024]) -> (f32[256,1024], f32[1024,1024]) {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}, frontend_attributes={chain_id="7"}, backend_config={"async_collective_fusion_config":{"flag_start":"-1","flag_end":"-1"}}
  ROOT %m = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) custom-call(%g), custom_call_target="AsyncCollectiveStart"
}

%named_step (p0: f32[256,1024], p1: f32[1024,1024], p2: bf16[1024,1024]) -> (f32[256,1024], f32[1024,1024], f32[1024,1024], f32[1024,1024]) {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  %p2 = bf16[1024,1024]{1,0} parameter(2)
  %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}, frontend_attributes={chain_id="7"}, backend_config={"async_collective_fusion_config":{"flag_start":"2","flag_end":"8"}}
  %dot.4 = f32[1024,1024]{1,0} dot(%p2, %p2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) tuple(%p0, %p1, %g, %dot.4)
}

%named_done (p0: f32[256,1024], p1: f32[1024,1024]) -> f32[1024,1024] {
  %p0 = f32[256,1024]{1,0} parameter(0)
  %p1 = f32[1024,1024]{1,0} parameter(1)
  %g = f32[1024,1024]{1,0} all-gather(%p0), replica_groups={{0,1,2,3}}, dimensions={0}, frontend_attributes={chain_id="7"}, backend_config={"async_collective_fusion_config":{"flag_start":"2","flag_end":"8"}}
  ROOT %m = f32[1024,1024]{1,0} custom-call(%p0, %p1, %g), custom_call_target="AsyncCollectiveDone"
}

%window_body (w: (f32[256,1024], f32[1024,1024], bf16[1024,1024])) -> (f32[256,1024], f32[1024,1024], bf16[1024,1024]) {
  %w = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, bf16[1024,1024]{1,0}) parameter(0)
  %w0 = f32[256,1024]{1,0} get-tuple-element(%w), index=0
  %w1 = f32[1024,1024]{1,0} get-tuple-element(%w), index=1
  %w2 = bf16[1024,1024]{1,0} get-tuple-element(%w), index=2
  %k = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%w0, %w1, %w2), kind=kOutput, output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {}), {2}: (1, {})}, calls=%named_step
  %k0 = f32[256,1024]{1,0} get-tuple-element(%k), index=0
  %k1 = f32[1024,1024]{1,0} get-tuple-element(%k), index=1
  ROOT %next = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, bf16[1024,1024]{1,0}) tuple(%k0, %k1, %w2)
}

%window_cond (w: (f32[256,1024], f32[1024,1024], bf16[1024,1024])) -> pred[] {
  %w = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, bf16[1024,1024]{1,0}) parameter(0)
  ROOT %p = pred[] constant(true)
}
"""


def _named_chain_module(chain_id: str = "7") -> str:
  return _module("""
  %a = bf16[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %s = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}) fusion(%b), kind=kCustom, output_to_operand_aliasing={{0}: (0, {})}, calls=%named_start
  %s0 = f32[256,1024]{1,0} get-tuple-element(%s), index=0
  %s1 = f32[1024,1024]{1,0} get-tuple-element(%s), index=1
  %init = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, bf16[1024,1024]{1,0}) tuple(%s0, %s1, %a)
  %loop = (f32[256,1024]{1,0}, f32[1024,1024]{1,0}, bf16[1024,1024]{1,0}) while(%init), condition=%window_cond, body=%window_body, backend_config={"known_trip_count":{"n":"4"}}
  %l0 = f32[256,1024]{1,0} get-tuple-element(%loop), index=0
  %l1 = f32[1024,1024]{1,0} get-tuple-element(%loop), index=1
  %d = f32[1024,1024]{1,0} fusion(%l0, %l1), kind=kCustom, output_to_operand_aliasing={{}: (1, {})}, calls=%named_done
  ROOT %out = (f32[1024,1024]{1,0}) tuple(%d)""",
                 _NAMED_CHAIN.replace('chain_id="7"',
                                      f'chain_id="{chain_id}"'))


def test_a_chain_xla_names_runs_its_collective_once_across_a_loop():
  program = timeline.Program(_named_chain_module(), FABRIC)
  entry = program.module.entry_computation
  assert program.chain_roles(entry) == {"s": ("start", "s"),
                                        "d": ("done", "s")}
  assert program.chain_roles(program.module.computations["window_body"]) == {
      "k": ("continue", "s")}
  # One gather, hidden behind the loop's four dots.
  step = program.play(PEAK, 0.5, HBM)
  assert program.totals().ici_bytes == pytest.approx(0.75 * 4 * 2**20)
  assert step.seconds == pytest.approx(4 * DOT_S, rel=1e-3)
  assert step.by_cause.get("ici", 0.0) == 0.0
  # Read by data flow alone (no name), the loop's step fusion looks like a
  # lone collective: a whole gather blocking every iteration, and the start
  # and done fusions each block too.
  unnamed = timeline.Program(
      _named_chain_module().replace(', frontend_attributes={chain_id="7"}',
                                    ""), FABRIC)
  step = unnamed.play(PEAK, 0.5, HBM)
  assert step.by_cause["ici"] == pytest.approx(6 * GATHER_S, rel=1e-3)
  # A named chain without exactly one start (a malformed or unfamiliar
  # program) is left to that data-flow reading, not guessed at.
  startless = timeline.Program(
      _named_chain_module().replace('"flag_start":"-1"', '"flag_start":"2"'),
      FABRIC)
  assert startless.chain_roles(startless.module.entry_computation) == {}
  step = startless.play(PEAK, 0.5, HBM)
  assert step.by_cause["ici"] == pytest.approx(6 * GATHER_S, rel=1e-3)


def test_a_fusion_moves_no_bytes_for_what_it_hands_on_or_the_network_writes():
  module = hlo.parse_module(_named_chain_module())
  cache = {}
  body = module.computations["window_body"]
  entry = module.entry_computation
  # The step fusion reads the dot's operand and writes its product; the
  # shard and the gathered buffer pass through (aliased), the gather's
  # result is the network's.
  assert ops.instruction_cost(module, body, body.by_name["k"], cache)[1] == (
      1024 * 1024 * 2 + 1024 * 1024 * 4)
  # The start and done fusions only mark the collective.
  assert ops.instruction_cost(module, entry, entry.by_name["s"], cache) == (
      0.0, 0.0)
  assert ops.instruction_cost(module, entry, entry.by_name["d"], cache) == (
      0.0, 0.0)
  # Not aliased, a handed-on element is a copy: read and written.
  copied = hlo.parse_module(_named_chain_module().replace(
      "output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {}), {2}: (1, {})}"
      ", ", ""))
  body = copied.computations["window_body"]
  assert ops.instruction_cost(copied, body, body.by_name["k"], {})[1] == (
      1024 * 1024 * 2 + 1024 * 1024 * 4
      + 2 * (256 * 1024 * 4 + 1024 * 1024 * 4))


def test_efficiency_scales_only_the_dense_compute():
  program = timeline.Program(_overlap_module(False), FABRIC)
  fast = program.play(PEAK, 1.0, HBM).seconds
  slow = program.play(PEAK, 0.5, HBM).seconds
  assert slow - fast == pytest.approx(DOT_S / 2, rel=1e-6)


_MEGASCALE = """
  %a = bf16[1024,1024]{1,0} parameter(0)
  %b = f32[256,1024]{1,0} parameter(1)
  %tok = token[] after-all()
  %r = (f32[256,1024]{1,0}, u32[], token[]) recv(%tok), channel_id=1, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.1_0",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %s = (f32[256,1024]{1,0}, u32[], token[]) send(%b, %tok), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all-reduce.1_0",_xla_megascale_target="{1,2}x{0:3}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %f = f32[1024,1024]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot
  %sd = token[] send-done(%s), channel_id=2, is_host_transfer=true
  %rd = (f32[256,1024]{1,0}, token[]) recv-done(%r), channel_id=1, is_host_transfer=true
  ROOT %out = (f32[1024,1024]{1,0}, token[]) tuple(%f, %sd)"""


def test_a_cross_slice_all_reduce_is_dcn_traffic_of_a_ring():
  program = timeline.Program(_module(_MEGASCALE), FABRIC)
  totals = program.totals()
  # Two slices: each chip sends 2 * (2-1)/2 of its 1 MiB buffer over DCN.
  assert totals.dcn_bytes == pytest.approx(2**20)
  assert totals.ici_bytes == 0
  step = program.play(PEAK, 0.5, HBM, dcn_overlap="schedule")
  dcn_s = 2**20 / 1e8
  assert step.seconds == pytest.approx(max(DOT_S, dcn_s), rel=1e-3)
  assert step.bound == "dcn"
  assert [c["kind"] for c in _summary(totals)] == ["dcn-all-reduce"]


@pytest.mark.parametrize("slices", [2, 8, 32])
def test_a_cross_slice_ring_pays_a_latency_per_step(slices):
  """The bytes per chip level off at twice the buffer as slices are added;
  the ring's 2 (N-1) steps, each paying the DCN's latency, do not: that is
  what makes a run lose speed from 2 to 32 slices (MaxText's v5e rows)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  text = _module(_MEGASCALE.replace("{1,2}x{0:3}",
                                    f"{{0:{slices - 1}}}x{{0:3}}"))
  fabric = dataclasses.replace(FABRIC, num_slices=slices,
                               dcn_step_seconds=1e-3)
  program = timeline.Program(text, fabric)
  bytes_s = 2 * (slices - 1) / slices * 2**20 / 1e8
  step = program.play(PEAK, 0.5, HBM, dcn_overlap="none")
  assert step.by_cause["dcn"] == pytest.approx(
      bytes_s + 2 * (slices - 1) * 1e-3, rel=1e-6)
  assert program.totals().dcn_bytes == pytest.approx(bytes_s * 1e8)
  # No latency: the bytes alone, as before the constant existed.
  bare = timeline.Program(text, dataclasses.replace(fabric,
                                                    dcn_step_seconds=0.0))
  assert bare.play(PEAK, 0.5, HBM, dcn_overlap="none").by_cause[
      "dcn"] == pytest.approx(bytes_s, rel=1e-6)


def _summary(totals):
  from trm.forecast import plan  # pylint: disable=g-import-not-at-top
  return plan.collective_summary(totals)


def test_ring_times_follow_the_torus():
  # 4 chips on one axis of 4 with wraparound: a bidirectional ring (2
  # links); without: one way.
  line = dict(coords=tuple((i, 0, 0) for i in range(4)), dims=(4, 1, 1),
              link_bytes_per_second=1e9, dcn_bytes_per_second=1e9,
              num_slices=1, hop_seconds=1e-6)
  ring = network.Fabric(wraps=(True, False, False), **line)
  chain = network.Fabric(wraps=(False, False, False), **line)
  assert ring.ring_seconds(3e9, [0, 1, 2, 3]) == pytest.approx((1.5 + 2e-6,
                                                                "x"))
  assert chain.ring_seconds(3e9, [0, 1, 2, 3]) == pytest.approx((3.0 + 3e-6,
                                                                 "x"))
  # Two of the four: no ring, one link.
  assert ring.ring_seconds(1e9, [0, 1])[0] == pytest.approx(1.0 + 1e-6)
  # A group on two axes uses both.
  assert FABRIC.ring_seconds(2e9, [0, 1, 2, 3]) == pytest.approx((1.0, "xy"))


def test_a_collective_permute_moves_its_buffer_over_one_link():
  """A ring transfer sends its whole buffer one hop, over one link one way
  (plus a hop's latency); `permute_links` (a sensitivity) divides only the
  bandwidth term."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  module = hlo.parse_module(_module("""
  %b = f32[256,1024]{1,0} parameter(1)
  ROOT %p = f32[256,1024]{1,0} collective-permute(%b), channel_id=1, source_target_pairs={{0,1},{1,0},{2,3},{3,2}}"""))
  entry = module.entry_computation
  fabric = dataclasses.replace(FABRIC, hop_seconds=1e-6)
  permute = network.describe(module, entry, entry.by_name["p"], fabric)
  assert (permute.kind, permute.axes, permute.payload_bytes) == (
      "collective-permute", "x", 2**20)
  assert permute.seconds == pytest.approx(2**20 / 1e9 + 1e-6)
  wider = network.describe(module, entry, entry.by_name["p"],
                           dataclasses.replace(fabric, permute_links=4))
  assert wider.seconds == pytest.approx(2**20 / 4e9 + 1e-6)
  assert wider.traffic_bytes == permute.traffic_bytes == 2**20


def test_dcn_overlap_none_makes_the_cross_slice_reduction_block():
  program = timeline.Program(_module(_MEGASCALE), FABRIC)
  dcn_s = 2**20 / 1e8
  step = program.play(PEAK, 0.5, HBM, dcn_overlap="none")
  assert step.seconds == pytest.approx(DOT_S + dcn_s, rel=1e-3)
  assert step.by_cause["dcn"] == pytest.approx(dcn_s, rel=1e-6)
  with pytest.raises(ValueError, match="--dcn_overlap"):
    program.play(PEAK, 0.5, HBM, dcn_overlap="half")


_PARTIAL_READS = """
%fused_pick (p0: bf16[64,1000], p1: s32[64,1,2]) -> f32[64,1] {
  %p0 = bf16[64,1000]{1,0} parameter(0)
  %p1 = s32[64,1,2]{2,1,0} parameter(1)
  %c = f32[64,1000]{1,0} convert(%p0)
  %b = f32[64,1000,1]{2,1,0} bitcast(%c)
  %g = f32[64,1,1]{2,1,0} gather(%b, %p1), offset_dims={2}, collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=2, slice_sizes={1,1,1}
  ROOT %r = f32[64,1]{1,0} bitcast(%g)
}

%fused_thirds (p0: bf16[64,300]) -> (bf16[64,100], f32[64,100]) {
  %p0 = bf16[64,300]{1,0} parameter(0)
  %b = bf16[64,3,100]{2,1,0} bitcast(%p0)
  %q = bf16[64,1,100]{2,1,0} slice(%b), slice={[0:64], [0:1], [0:100]}
  %k = bf16[64,1,100]{2,1,0} slice(%b), slice={[0:64], [1:2], [0:100]}
  %qb = bf16[64,100]{1,0} bitcast(%q)
  %kf = f32[64,1,100]{2,1,0} convert(%k)
  %kb = f32[64,100]{1,0} bitcast(%kf)
  ROOT %t = (bf16[64,100]{1,0}, f32[64,100]{1,0}) tuple(%qb, %kb)
}

%inner_window (p0: bf16[64,300], i: s32[]) -> f32[64,100] {
  %p0 = bf16[64,300]{1,0} parameter(0)
  %i = s32[] parameter(1)
  %z = s32[] constant(0)
  %ninf = bf16[] constant(-inf)
  %padded = bf16[64,302]{1,0} pad(%p0, %ninf), padding=0_0x1_1
  %w = bf16[64,100]{1,0} dynamic-slice(%padded, %z, %i), dynamic_slice_sizes={64,100}
  ROOT %f = f32[64,100]{1,0} convert(%w)
}

%fused_window (p0: bf16[64,300], p1: s32[]) -> f32[64,100] {
  %p0 = bf16[64,300]{1,0} parameter(0)
  %p1 = s32[] parameter(1)
  ROOT %n = f32[64,100]{1,0} fusion(%p0, %p1), kind=kLoop, calls=%inner_window
}

%fused_all (p0: bf16[64,300]) -> (bf16[64,100], f32[64,300]) {
  %p0 = bf16[64,300]{1,0} parameter(0)
  %s = bf16[64,100]{1,0} slice(%p0), slice={[0:64], [0:100]}
  %e = f32[64,300]{1,0} convert(%p0)
  ROOT %t = (bf16[64,100]{1,0}, f32[64,300]{1,0}) tuple(%s, %e)
}
"""


@pytest.mark.parametrize("fusion, read", [
    # A gather behind a convert and a bitcast reads one logit per row.
    ("fused_pick", [64 * 2, 64 * 2 * 4]),
    # Two of three slices, one through a convert: two thirds.
    ("fused_thirds", [64 * 200 * 2]),
    # A window of a padded operand, in a nested fusion: the window's share.
    ("fused_window", [64 * 100 * 2, 4]),
    # A slice and a whole-array use: all of it.
    ("fused_all", [64 * 300 * 2]),
])
def test_a_fused_parameter_read_through_slices_costs_the_slices(fusion, read):
  module = hlo.parse_module(
      "HloModule test, is_scheduled=true, num_partitions=1\n"
      + _PARTIAL_READS + "\nENTRY %main (a: bf16[1,1]) -> bf16[1,1] {\n"
      "  ROOT %a = bf16[1,1]{1,0} parameter(0)\n}\n")
  assert ops.fused_cost(module, fusion, {}).operand_bytes == pytest.approx(
      read)


def test_a_tuple_element_operand_reads_that_element():
  # Newer XLA writes `%x#1` for element 1 of a tuple-shaped `x` instead of a
  # get-tuple-element: the fusion reads that element's bytes, and depends
  # on `x`.
  text = ("HloModule test, is_scheduled=true, num_partitions=1\n"
          "%fused_add (p0: bf16[64,128], p1: f32[64,128]) -> f32[64,128] {\n"
          "  %p0 = bf16[64,128]{1,0} parameter(0)\n"
          "  %p1 = f32[64,128]{1,0} parameter(1)\n"
          "  %c = f32[64,128]{1,0} convert(%p0)\n"
          "  ROOT %s = f32[64,128]{1,0} add(%c, %p1)\n}\n"
          "ENTRY %main (a: f32[64,128]) -> f32[64,128] {\n"
          "  %a = f32[64,128]{1,0} parameter(0)\n"
          "  %cc = (s8[1024]{0}, (bf16[64,128]{1,0}, f32[2]{0}), "
          "f32[64,128]{1,0}) custom-call(%a), custom_call_target=\"x\"\n"
          "  %nested = (bf16[64,128]{1,0}, f32[2]{0}) get-tuple-element(%cc), "
          "index=1\n"
          "  ROOT %f = f32[64,128]{1,0} fusion(%nested#0, %cc#2), kind=kLoop, "
          "calls=%fused_add\n}\n")
  module = hlo.parse_module(text)
  entry = module.entry_computation
  element = entry.by_name["cc#2"]
  assert element.opcode == "get-tuple-element"
  assert element.operands == ("cc",)
  assert [a.bytes for a in element.shape] == [64 * 128 * 4]
  assert [a.bytes for a in entry.by_name["nested#0"].shape] == [64 * 128 * 2]
  # Each element follows its tuple in the schedule.
  names = [i.name for i in entry.instructions]
  assert names.index("cc#2") == names.index("cc") + 1
  assert names.index("nested#0") == names.index("nested") + 1
  assert entry.by_name["cc"].elements[1] == (
      hlo.Array("bf16", (64, 128)), hlo.Array("f32", (2,)))
  flops, moved = ops.instruction_cost(module, entry, entry.by_name["f"], {})
  assert moved == 64 * 128 * (2 + 4 + 4)
  assert ops.instruction_cost(module, entry, entry.by_name["cc#2"], {}) == (
      0.0, 0.0)


def test_an_async_start_of_a_copy_is_charged_its_bytes():
  # XLA:GPU copies a scanned layer's weights out of the stack with an
  # async-start of a dynamic-slice fusion (on another stream): the copy
  # reads and writes one layer's slice. An async-start of a collective is
  # the network model's, not charged here.
  text = ("HloModule test, is_scheduled=true, num_partitions=2\n"
          "%fused_ds (p0: bf16[28,64,128], p1: s32[]) -> bf16[1,64,128] {\n"
          "  %p0 = bf16[28,64,128]{2,1,0} parameter(0)\n"
          "  %p1 = s32[] parameter(1)\n"
          "  %z = s32[] constant(0)\n"
          "  ROOT %ds = bf16[1,64,128]{2,1,0} dynamic-slice(%p0, %p1, %z, %z),"
          " dynamic_slice_sizes={1,64,128}\n}\n"
          "%async_copy (a0: bf16[28,64,128], a1: s32[]) -> bf16[1,64,128] {\n"
          "  %a0 = bf16[28,64,128]{2,1,0} parameter(0)\n"
          "  %a1 = s32[] parameter(1)\n"
          "  ROOT %f = bf16[1,64,128]{2,1,0} fusion(%a0, %a1), kind=kLoop, "
          "calls=%fused_ds\n}\n"
          "%sum (x: f32[], y: f32[]) -> f32[] {\n"
          "  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n"
          "  ROOT %s = f32[] add(%x, %y)\n}\n"
          "%async_reduce (r0: f32[1024]) -> f32[1024] {\n"
          "  %r0 = f32[1024]{0} parameter(0)\n"
          "  ROOT %ar = f32[1024]{0} all-reduce(%r0), replica_groups={{0,1}}, "
          "to_apply=%sum\n}\n"
          "ENTRY %main (w: bf16[28,64,128], i: s32[], g: f32[1024]) -> "
          "bf16[1,64,128] {\n"
          "  %w = bf16[28,64,128]{2,1,0} parameter(0)\n"
          "  %i = s32[] parameter(1)\n"
          "  %g = f32[1024]{0} parameter(2)\n"
          "  %start = ((bf16[28,64,128]{2,1,0}, s32[]), bf16[1,64,128]{2,1,0},"
          " u32[]) async-start(%w, %i), calls=%async_copy\n"
          "  %rs = ((f32[1024]{0}), f32[1024]{0}) async-start(%g), "
          "calls=%async_reduce\n"
          "  %rd = f32[1024]{0} async-done(%rs)\n"
          "  ROOT %done = bf16[1,64,128]{2,1,0} async-done(%start)\n}\n")
  module = hlo.parse_module(text)
  entry = module.entry_computation
  slice_bytes = 64 * 128 * 2
  assert ops.instruction_cost(module, entry, entry.by_name["start"], {}) == (
      0.0, 2 * slice_bytes + 4)  # the slice read and written, the index
  assert ops.instruction_cost(module, entry, entry.by_name["rs"], {}) == (
      0.0, 0.0)
  assert ops.instruction_cost(module, entry, entry.by_name["done"], {}) == (
      0.0, 0.0)


def _splash_call(name: str, kernel: str, scope: str, q: str, k: str,
                 metadata: str) -> str:
  """A splash kernel call as XLA:TPU prints it (q, k, v after two s8 mask
  tables; the kernel's block sizes in its xprof metadata); `k` names the
  key and value operand."""
  return (f'  %{name} = {q}{{3,2,1,0}} custom-call(%m, %m, %q, %{k}, %{k}), '
          'custom_call_target="tpu_custom_call", frontend_attributes={'
          'kernel_metadata={\n"xprof_metadata":"{' + metadata + '}"\n}}, '
          f'metadata={{op_name="jit(f)/{scope}/vmap(s)/{kernel}/{kernel}/'
          'pallas_call"}, backend_config={"custom_call_config":{"body":"T"}}')


def test_splash_calls_are_charged_by_kind_mask_blocks_and_layout():
  """Forward 2 matmuls, dq 3, dkv 4 (5 with the fused backward); a causal
  mask computes the blocks on and below the diagonal (256-blocks of a
  768-long sequence: 6 of 9), a full one all; a sequence-minor k is read
  [.., D, T]; a call outside our scopes (MaxText's) stays undeclared."""
  q = "bf16[2,4,768,64]"
  calls = [
      ("fwd", "splash_mha_fwd_residuals", "splash_causal_mask", q, "k",
       r'\"block_q\": 256, \"block_kv\": 256'),
      ("dq", "splash_mha_dq_no_residuals", "transpose(jvp(splash_full_mask))",
       q, "kt",
       r'\"block_q_dq\": 256, \"block_kv_dq\": 256, \"k_layout\": 0'),
      ("dkv", "splash_mha_dkv_no_residuals", "jvp(splash_causal_mask)", q, "k",
       r'\"block_q_dkv\": 256, \"block_kv_dkv\": 256'),
      ("fused", "splash_mha_dkv_no_residuals", "splash_causal_mask", q, "k",
       r'\"block_q_dkv\": 256, \"block_kv_dkv\": 256, '
       r'\"use_fused_bwd_kernel\": true'),
      ("theirs", "splash_mha_fwd_residuals", "flash", q, "k",
       r'\"block_q\": 256, \"block_kv\": 256'),
  ]
  body = ["  %m = s8[1,3,3]{2,1,0} parameter(0)",
          f"  %q = {q}{{3,2,1,0}} parameter(1)",
          f"  %k = {q}{{3,2,1,0}} parameter(2)",
          "  %kt = bf16[2,4,64,768]{3,2,1,0} parameter(3)"]
  body += [_splash_call(*c) for c in calls]
  body.append("  ROOT %out = (" + ", ".join(f"{q}{{3,2,1,0}}" for _ in calls)
              + ") tuple(" + ", ".join(f"%{c[0]}" for c in calls) + ")")
  text = ("HloModule test, is_scheduled=true, num_partitions=1\n"
          f"ENTRY %main (m: s8[1,3,3], q: {q}, k: {q}, "
          "kt: bf16[2,4,64,768]) -> "
          f"{q} {{\n" + "\n".join(body) + "\n}\n")
  module = hlo.parse_module(text)
  comp = module.computations[module.entry]
  flops = {i.name: ops.splash_flops(i, comp) for i in comp.instructions
           if ops.is_pallas_call(i)}
  unit = 2 * 2 * 4 * 64 * 256 * 256  # 2 x batch x heads x D x one block
  assert flops == {"fwd": 2 * 6 * unit, "dq": 3 * 9 * unit,
                   "dkv": 4 * 6 * unit, "fused": 5 * 6 * unit,
                   "theirs": None}
  # On a 256-wide MXU (v6e) S = QK^T and dP = dO V^T contract over D = 64
  # and occupy the array 4 times over; PV, dQ, dV, dK contract over a
  # 256-block and stream D: unpadded.
  padded = {i.name: ops.splash_flops(i, comp, 256) for i in comp.instructions
            if ops.is_pallas_call(i)}
  assert padded == {"fwd": 5 * 6 * unit, "dq": 9 * 9 * unit,
                    "dkv": 10 * 6 * unit, "fused": 11 * 6 * unit,
                    "theirs": None}
  assert timeline.Program(text, FABRIC).totals().undeclared_kernels == 1
  # A caller that knows the other framework's scope and mask (MaxText's
  # causal LMs, benchmarks/forecast/maxtext_program.py) has it read.
  assert ops.splash_flops(comp.instructions[-2], comp,
                          scopes={"flash": True}) == 2 * 6 * unit
  theirs = timeline.Program(text, FABRIC, splash_scopes={"flash": False})
  assert theirs.totals().undeclared_kernels == 0
  assert theirs.totals().flops == timeline.Program(
      text, FABRIC).totals().flops + 2 * 9 * unit


def test_mxu_padding_rounds_up_what_the_array_cannot_avoid():
  """The contraction always; of the two free dims the one that wastes
  less; nothing without an array (width 1, a GPU)."""
  assert ops.mxu_padding(4096, 128, 4096, 128) == 1.0
  assert ops.mxu_padding(4096, 128, 4096, 256) == 2.0   # QK^T, D = 128
  assert ops.mxu_padding(512, 512, 128, 256) == 1.0     # PV: D streamed
  assert ops.mxu_padding(128, 512, 128, 256) == 2.0     # both free dims short
  assert ops.mxu_padding(8, 64, 4096, 128) == 2.0       # contraction of 64
  assert ops.mxu_padding(100, 100, 100, 1) == 1.0


def _one_matmul(k: int, form: str) -> str:
  """A [4096, k] x [k, 4096] matmul: a dot, or a fused convolution (how
  XLA:TPU writes many of its matmuls)."""
  matmul = {"dot": "dot(%a, %b), lhs_contracting_dims={1}, "
                   "rhs_contracting_dims={0}",
            "convolution": "convolution(%a, %b), dim_labels=bf_io->bf"}[form]
  fused = (f"%fused_mm (a: bf16[4096,{k}], b: bf16[{k},4096]) -> "
           f"f32[4096,4096] {{\n  %a = bf16[4096,{k}]{{1,0}} parameter(0)\n"
           f"  %b = bf16[{k},4096]{{1,0}} parameter(1)\n"
           f"  ROOT %mm = f32[4096,4096]{{1,0}} {matmul}\n}}\n")
  return ("HloModule test, is_scheduled=true, num_partitions=1\n" + fused
          + f"ENTRY %main (a: bf16[4096,{k}], b: bf16[{k},4096]) -> "
          f"f32[4096,4096] {{\n  %a = bf16[4096,{k}]{{1,0}} parameter(0)\n"
          f"  %b = bf16[{k},4096]{{1,0}} parameter(1)\n"
          + ("  ROOT %f = f32[4096,4096]{1,0} fusion(%a, %b), kind=kOutput, "
             "calls=%fused_mm\n" if form == "convolution" else
             f"  ROOT %d = f32[4096,4096]{{1,0}} {matmul}\n") + "}\n")


@pytest.mark.parametrize("form", ["dot", "convolution"])
@pytest.mark.parametrize("k, v6e_over_v4", [(128, 2.0), (256, 1.0),
                                            (8192, 1.0)])
def test_a_matmul_is_timed_as_it_fills_the_chips_mxu(form, k, v6e_over_v4):
  """v6e's MXU is 256 x 256, v4's 128 x 128: a contraction of 128 fills
  half of v6e's array, so at equal peak it takes twice v4's time; 256 and
  more fill both. v4's time is the unpadded one (a 128-wide chip whose
  dims are multiples of 128 is charged as before), and the FLOPs MFU
  counts are the useful ones on both."""
  program = timeline.Program(_one_matmul(k, form), FABRIC)
  steps = {chip: program.play(PEAK, 0.5, HBM, mxu_width=topology.CHIPS[
      chip].mxu_width) for chip in ("v4", "v6e")}
  assert steps["v6e"].seconds == pytest.approx(v6e_over_v4
                                               * steps["v4"].seconds)
  assert steps["v4"].seconds == program.play(PEAK, 0.5, HBM).seconds
  assert steps["v4"].seconds == pytest.approx(2 * 4096**2 * k / (PEAK * 0.5))
  assert steps["v6e"].totals.flops == steps["v4"].totals.flops == (
      2 * 4096**2 * k)
  (spot,) = program.hot_spots(PEAK, 0.5, HBM, mxu_width=256)
  assert spot["seconds"] == pytest.approx(steps["v6e"].seconds)
  assert spot["flops"] == 2 * 4096**2 * k


def test_a_weight_gradient_convolutions_window_counts_into_its_contraction():
  """XLA:TPU writes a weight gradient as a convolution whose window spans
  the tokens and whose input features are the rows per chip (TRM's
  [512, 3072] gradient: 97 tokens x 24 rows): the array contracts over
  both (97 x 24 = 2328, padded to 2432 on a 128-wide MXU), not over the
  24 rows alone (5.3x idle)."""
  text = ("HloModule test, is_scheduled=true, num_partitions=1\n"
          "ENTRY %main (x: bf16[97,24,512], d: bf16[97,24,3072]) -> "
          "bf16[512,3072,1] {\n"
          "  %x = bf16[97,24,512]{2,1,0} parameter(0)\n"
          "  %d = bf16[97,24,3072]{2,1,0} parameter(1)\n"
          "  ROOT %w = bf16[512,3072,1]{1,0,2} convolution(%x, %d), "
          "window={size=97}, dim_labels=0fb_0io->bf0\n}\n")
  module = hlo.parse_module(text)
  comp = module.entry_computation
  conv = comp.instructions[-1]
  assert ops.matmul_dims(conv, comp) == (512, 97 * 24, 3072)
  assert ops.dot_flops(conv, comp) == 2 * 512 * 3072 * 97 * 24
  program = timeline.Program(text, FABRIC)
  padded = program.play(PEAK, 0.5, HBM, mxu_width=128).seconds
  assert padded == pytest.approx(
      program.play(PEAK, 0.5, HBM).seconds * 2432 / 2328)
