"""The time model's host link: a remat policy's offloaded tensors move
between HBM and host memory (XLA:TPU's memory space S(5)) on the chip's
PCIe link, not as HBM traffic, and the step waits for them only where the
schedule does not hide them."""
import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from trm.core import topology
from trm.forecast import hlo
from trm.forecast import network
from trm.forecast import ops
from trm.forecast import plan
from trm.forecast import timeline

LAYERS, ROWS, WIDTH = 8, 1024, 512
SLOT = ROWS * WIDTH * 4   # one layer's offloaded input, float32


def _layer(x, w):
  x = checkpoint_name(x, "layer_input")
  return jnp.tanh(x @ w) + x


def _grad(policy):
  def loss(ws, x):
    body = jax.checkpoint(_layer, policy=policy, prevent_cse=False)
    y, _ = jax.lax.scan(lambda c, w: (body(c, w), None), x, ws)
    return jnp.sum(y ** 2)
  return jax.grad(loss)


@pytest.fixture(scope="module")
def programs():
  """The scanned toy's gradient for one v4 chip, with the layer input
  recomputed from HBM (full remat) and offloaded to the host."""
  device = topology.topology_devices(topology.parse_topology("v4-8"), 1)[0]
  one_chip = jax.sharding.SingleDeviceSharding(device)
  ws = jax.ShapeDtypeStruct((LAYERS, WIDTH, WIDTH), jnp.float32,
                            sharding=one_chip)
  x = jax.ShapeDtypeStruct((ROWS, WIDTH), jnp.float32, sharding=one_chip)
  offload = jax.checkpoint_policies.save_and_offload_only_these_names(
      names_which_can_be_saved=[], names_which_can_be_offloaded=[
          "layer_input"], offload_src="device", offload_dst="pinned_host")
  out = {}
  for name, policy in (("full", None), ("offload", offload)):
    compiled = jax.jit(_grad(policy)).lower(ws, x).compile()
    out[name] = (compiled.as_text(), compiled.memory_analysis())
  return out


def _program(text, host_rate):
  fabric = network.Fabric(((0, 0, 0),), (1, 1, 1), (False,) * 3, 45e9, 1e9,
                          1, host_bytes_per_second=host_rate)
  return timeline.Program(text, fabric)


def _play(program):
  chip = topology.CHIPS["v4"]
  return program.play(chip.peak_bf16_tflops * 1e12, 0.5, chip.hbm_gbps * 1e9,
                      "none", chip.mxu_width)


def test_offloaded_inputs_cross_the_host_link_not_hbm(programs):
  full_text, _ = programs["full"]
  text, memory = programs["offload"]
  assert memory.host_temp_size_in_bytes >= LAYERS * SLOT
  assert "S(5)" in text and "S(5)" not in full_text
  program = _program(text, 16e9)
  # Every layer's input goes out once and comes back once.
  assert program.totals().host_bytes == pytest.approx(2 * LAYERS * SLOT)
  assert _program(full_text, 16e9).totals().host_bytes == 0
  # The host buffer (LAYERS slots) is not charged as HBM traffic: before,
  # each layer's write into it counted the whole stack.
  full_hbm = _program(full_text, 16e9).totals().hbm_bytes
  assert program.totals().hbm_bytes < full_hbm + 4 * LAYERS * SLOT


def test_a_slow_host_link_is_waited_for_and_a_fast_one_hidden(programs):
  text, _ = programs["offload"]
  slow = _play(_program(text, 1e9))      # 1 GB/s: 67 ms of transfers
  fast = _play(_program(text, 1e15))
  unpriced = _play(_program(text, 0.0))
  moved = 2 * LAYERS * SLOT
  assert slow.by_cause.get("host", 0.0) >= 0.5 * moved / 1e9
  assert slow.bound == "host"
  assert fast.by_cause.get("host", 0.0) < 1e-6
  assert unpriced.by_cause.get("host", 0.0) == 0.0
  assert slow.seconds > fast.seconds >= unpriced.seconds * 0.999


def test_a_row_reports_its_host_traffic_and_memory(programs):
  text, memory = programs["offload"]
  program = _program(text, 16e9)
  row = plan.forecast_row(plan.CompiledRow(
      slices=1, chips=1, mesh={}, global_batch=1, model_flops=1e9,
      tokens_per_example=None, compile_seconds=1.0, fits=True,
      memory_gib=0.1, program=program,
      host_memory_gib=memory.host_temp_size_in_bytes / 2**30),
      topology.parse_topology("v4-8"), 0.5)
  assert row["host_bytes"] == pytest.approx(2 * LAYERS * SLOT)
  assert row["host_link_bytes_per_second"] == 16e9
  line, = plan.host_offload_lines([row])
  assert line.startswith("host offload: the 1-slice row moves 0.0")
  assert "0.02 GiB held there" in line and "at 16 GB/s a direction" in line
  assert plan.host_offload_lines([dict(row, host_bytes=0.0)]) == []


def test_host_moves_are_read_from_layouts():
  """Each way XLA:TPU moves a tensor to or from S(5), as printed."""
  text = """HloModule m, entry_computation_layout={()->f32[4,8]{1,0}}

ENTRY %main () -> f32[4,8] {
  %buf = f32[16,4,8]{2,1,0:T(8,128)S(5)} custom-call(), custom_call_target="AllocateBuffer"
  %x = f32[1,4,8]{2,1,0:T(8,128)} constant({...})
  %i = s32[] constant(3)
  %z = s32[] constant(0)
  %dus = ((f32[16,4,8]{2,1,0:T(8,128)S(5)}, f32[1,4,8]{2,1,0:T(8,128)}, s32[], s32[], s32[]), f32[16,4,8]{2,1,0:T(8,128)S(5)}, u32[]{:S(2)}) dynamic-update-slice-start(%buf, %x, %i, %z, %z)
  %dusd = f32[16,4,8]{2,1,0:T(8,128)S(5)} dynamic-update-slice-done(%dus)
  %ds = ((f32[16,4,8]{2,1,0:T(8,128)S(5)}, s32[], s32[], s32[]), f32[2,4,8]{2,1,0:T(8,128)}, u32[]{:S(2)}) dynamic-slice-start(%dusd, %i, %z, %z), dynamic_slice_sizes={2,4,8}
  %dsd = f32[2,4,8]{2,1,0:T(8,128)} dynamic-slice-done(%ds)
  %y = f32[4,8]{1,0:T(8,128)} constant({...})
  %out = (f32[4,8]{1,0:T(8,128)S(5)}, f32[4,8]{1,0:T(8,128)}, u32[]) copy-start(%y)
  %outd = f32[4,8]{1,0:T(8,128)S(5)} copy-done(%out)
  %back = f32[4,8]{1,0:T(8,128)} copy(%outd)
  ROOT %r = f32[4,8]{1,0:T(8,128)} add(%back, %y)
}
"""
  module = hlo.parse_module(text)
  comp = module.entry_computation
  moves = {i.name: ops.host_transfer(i, comp) for i in comp.instructions}
  assert moves["dus"] == ("to_host", 4 * 8 * 4)
  assert moves["ds"] == ("from_host", 2 * 4 * 8 * 4)
  assert moves["out"] == ("to_host", 4 * 8 * 4)
  assert moves["back"] == ("from_host", 4 * 8 * 4)
  assert {k for k, v in moves.items() if v} == {"dus", "ds", "out", "back"}
  cache = {}
  for name in ("buf", "dus", "dusd", "ds", "dsd", "out", "outd", "back"):
    # The host buffer's allocation and every move cost the chip no HBM
    # traffic (dynamic-slice-done writes its slice: none either, the DMA
    # does); the add reads and writes HBM as before.
    assert ops.instruction_cost(module, comp, comp.by_name[name],
                                cache) == (0.0, 0.0), name
  assert ops.instruction_cost(module, comp, comp.by_name["r"], cache)[1] > 0
  assert hlo.parse_shape("f32[2]{0:T(128)S(5)}")[0].on_host
  assert not hlo.parse_shape("f32[2]{0:T(128)S(3)}")[0].on_host
  assert hlo.parse_shape("f32[2]")[0].memory_space == 0
