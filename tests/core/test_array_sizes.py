"""Arrays no machine holds are refused before XLA compiles (and aborts)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec
import pytest

from trm.core import array_sizes
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib


def test_largest_array_reads_shapes_and_element_sizes():
  text = ("%0 = stablehlo.add %a, %b : tensor<2x3xf32>\n"
          "%1 = stablehlo.convert %0 : (tensor<2x3xf32>) -> "
          "tensor<4x1000xbf16>\n%2 = ... tensor<8xi1> tensor<i32>")
  assert array_sizes.largest_array(text) == ([4, 1000], "bf16", 8000)
  assert array_sizes.largest_array("tensor<i32>") is None


def _scores(x):  # [b, L, d] -> the [b, L, L] attention-like product
  return jnp.einsum("bld,bmd->blm", x, x).sum()


def test_a_lowered_program_with_an_absurd_array_is_refused():
  lowered = jax.jit(_scores).lower(
      jax.ShapeDtypeStruct((4, 10**9, 8), jnp.float32))
  with pytest.raises(ValueError, match=r"The train step holds an array of "
                     r"\[4, 1000000000, 1000000000\] f32 \(1.42e\+04 PiB\), "
                     r"more than any machine holds .*; lower the length\.$"):
    array_sizes.check_lowered(lowered, "The train step", "lower the length")
  small = jax.jit(_scores).lower(jax.ShapeDtypeStruct((4, 64, 8),
                                                      jnp.float32))
  array_sizes.check_lowered(small, "The train step", "lower the length")


def test_compile_step_refuses_it_before_xla_aborts_the_process():
  """`--config.block_size=1000000000` ended trm.aot (and trm.main) in
  XLA's CHECK abort, exit 134, with a C++ stack trace."""
  mesh = jax.make_mesh((1,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = NamedSharding(mesh, PartitionSpec())
  state = {"w": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=replicated)}
  batch = jax.ShapeDtypeStruct((4, 10**9, 8), jnp.float32,
                               sharding=replicated)
  step = lambda s, b: (s, {"loss": _scores(b * s["w"])})
  with pytest.raises(ValueError, match="The train step holds an array of "
                     r"\[4, 1000000000, 1000000000\] f32"):
    state_lib.compile_step(step, state, {"w": replicated}, batch)


def test_init_state_refuses_it_before_xla_aborts_the_process():
  """The initialiser is compiled before the train step: an absurd
  `model.hidden_size=2**30` ended trm.main there in XLA's CHECK abort
  (exit 134) before compile_step's check ran. (2 PiB here: the old code
  compiled it and failed allocating, not aborting the test run.)"""
  mesh = jax.make_mesh((1,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = NamedSharding(mesh, PartitionSpec())
  init = lambda: {"w": jnp.zeros((2**26, 2**23), jnp.float32)}
  with pytest.raises(ValueError, match=r"The model's initialisation holds "
                     r"an array of \[67108864, 8388608\] f32 \(2 PiB\)"):
    state_lib.init_state(init, mesh_lib.ShardingContext(mesh, ()),
                         {"w": replicated})


def test_abstract_state_refuses_it_before_anything_lowers():
  """`model.hidden_size=2**31` (a [2**31, 11453246464] kernel drawn at
  random) ended trm.main in JAX's "random bits array of size exceeding 2
  ** 64" NotImplementedError traceback while the initialiser lowered."""
  mesh = jax.make_mesh((1,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  init = lambda: {"w": jax.nn.initializers.lecun_normal()(
      jax.random.key(0), (2**31, 11453246464), jnp.float32)}
  with pytest.raises(ValueError, match=re.escape(
      "The model's state holds an array of [2147483648, 11453246464] "
      "float32 (8.74e+04 PiB), more than any machine holds; lower the "
      "config's model sizes")):
    state_lib.abstract_state(init, mesh_lib.ShardingContext(mesh, ()))
  small = lambda: {"w": jnp.zeros((4, 8), jnp.float32)}
  abstract, _ = state_lib.abstract_state(small,
                                         mesh_lib.ShardingContext(mesh, ()))
  assert abstract["w"].shape == (4, 8)


def test_a_state_past_the_hosts_memory_is_refused_on_cpu_devices(
    monkeypatch):
  """A TRM whose state needed 65 GiB on a 23.5 GiB host was ended by the
  kernel's OOM killer with no message, and a handed dataset's 2**31-row
  puzzle table hung the start-up. Every copy counts: the CPU devices share
  the host's memory."""
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 2**20)
  devices = jax.devices()
  mesh = jax.make_mesh((len(devices),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = NamedSharding(mesh, PartitionSpec())
  split = NamedSharding(mesh, PartitionSpec("data"))
  rows = 64 * len(devices)  # 64 KiB a row in float32

  def tree(sharding, n=rows):
    return {"w": jax.ShapeDtypeStruct((n, 16384), jnp.float32,
                                      sharding=sharding)}
  # Split over the devices: rows x 64 KiB in all, 4 MiB per device set.
  with pytest.raises(ValueError, match=re.escape(
      f"The state needs {rows * 2**16 / 2**30:,.1f} GiB on this host's "
      f"{len(devices)} CPU device(s), which share its 0.0 GiB (memory and "
      "swap); lower it.")):
    array_sizes.check_host_memory(tree(split), "The state", "lower it")
  array_sizes.check_host_memory(tree(split, 8), "The state", "lower it")
  if len(devices) > 1:  # replicated: a copy per device counts
    with pytest.raises(ValueError, match="needs"):
      array_sizes.check_host_memory(tree(replicated, 16 // len(devices) + 1),
                                    "The state", "lower it")

  class Tpu:
    platform = "tpu"

  class OnTpu:
    device_set = {Tpu()}
    addressable_devices = device_set

    def shard_shape(self, shape):
      return shape
  # trm.aot's compile-only TPU devices: XLA's compile is the verdict there.
  import types  # pylint: disable=g-import-not-at-top
  on_tpu = types.SimpleNamespace(shape=(rows, 16384), dtype=jnp.float32,
                                 sharding=OnTpu())
  array_sizes.check_host_memory([on_tpu], "The state", "lower it")


def test_eval_step_refuses_it_before_xla_aborts_the_process():
  """train.py and trm.evaluate compiled the eval step with a plain jax.jit
  on its first call, unchecked: an `eval_only` run (no train step built
  to refuse the sizes first) ended in XLA's CHECK abort, exit 134
  (probes/eval_step_abort.py). Each batch shape is now lowered, checked
  and compiled once."""
  mesh = jax.make_mesh((1,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = NamedSharding(mesh, PartitionSpec())
  traced = []

  def eval_fn(state, batch):  # [b, L, 8] -> [b, L, L] scores
    traced.append(batch["x"].shape)
    length = 10**9 if batch["x"].shape[1] == 1 else batch["x"].shape[1]
    x = jnp.broadcast_to(batch["x"][:, :1], (4, length, 8)) * state["w"]
    return {"loss": _scores(x)}, {}

  step = state_lib.eval_step(eval_fn, {"w": replicated}, {"x": replicated})
  state = {"w": jax.device_put(jnp.ones((8,), jnp.float32), replicated)}
  tiny = {"x": jax.device_put(jnp.ones((4, 1, 8), jnp.float32), replicated)}
  with pytest.raises(ValueError, match=r"^The eval step holds an array of "
                     r"\[4, 1000000000, 1000000000\] f32 .*; lower the "
                     r"config's sequence length or eval batch size\.$"):
    step(state, tiny)
  small = {"x": jax.device_put(jnp.ones((4, 3, 8), jnp.float32), replicated)}
  for _ in range(2):  # compiled once for its shape
    metrics, _ = step(state, small)
    assert float(metrics["loss"]) == 4 * 3 * 3 * 8
  assert traced == [(4, 1, 8), (4, 3, 8)]


def test_a_typed_prng_key_in_the_state_is_sized_not_a_type_error(
    monkeypatch):
  """np.dtype(key<fry>) raises TypeError: a state holding a new-style key
  (jax.random.key) would have stopped abstract_state with it."""
  tree = jax.eval_shape(lambda: {"rng": jax.random.key(0),
                                 "w": jnp.zeros((4,), jnp.bfloat16)})
  array_sizes.check_abstract(tree, "The model's state", "lower it")
  keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), 8))
  monkeypatch.setattr(array_sizes, "LIMIT_BYTES", 64)  # 8 keys of 8 bytes
  with pytest.raises(ValueError, match=re.escape("[8] key<fry>")):
    array_sizes.check_abstract(keys, "The model's state", "lower it")


def test_a_compiled_steps_memory_counts_each_cpu_device_less_donations(
    monkeypatch):
  import types  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 10 * 2**30)
  devices = jax.local_devices()
  memory = types.SimpleNamespace(
      argument_size_in_bytes=2**30, output_size_in_bytes=2**30,
      alias_size_in_bytes=2**30, temp_size_in_bytes=10 * 2**30 // len(
          devices) - 2**30)
  compiled = types.SimpleNamespace(memory_analysis=lambda: memory)
  # Arguments + outputs - the donated outputs + temporaries: 10 GiB in all.
  array_sizes.check_program_host_memory(compiled, devices, "The step",
                                        "lower it")
  memory.alias_size_in_bytes -= 1
  with pytest.raises(ValueError, match=re.escape(
      f"The step needs 10.0 GiB on this host's {len(devices)} CPU device(s)"
  )):
    array_sizes.check_program_host_memory(compiled, devices, "The step",
                                          "lower it")
  # Another process's devices hold their own host's memory; an
  # accelerator's is XLA's to refuse.
  other = [types.SimpleNamespace(process_index=jax.process_index() + 1,
                                 platform="cpu")]
  array_sizes.check_program_host_memory(compiled, other, "The step",
                                        "lower it")
  # Fields a backend leaves out, or None, count as 0.
  array_sizes.check_program_host_memory(
      types.SimpleNamespace(memory_analysis=lambda: types.SimpleNamespace(
          temp_size_in_bytes=None)), devices, "The step", "lower it")
  tpu = [types.SimpleNamespace(process_index=jax.process_index(),
                               platform="tpu")]
  array_sizes.check_program_host_memory(compiled, tpu, "The step",
                                        "lower it")


def test_an_eval_step_past_the_hosts_memory_is_one_line_before_it_runs(
    monkeypatch):
  # As the train step's (tests/core/test_train.py): XLA:CPU's allocation of
  # the temporaries failed at the first call with a JaxRuntimeError.
  mesh = jax.make_mesh((1,), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))
  replicated = NamedSharding(mesh, PartitionSpec())

  def eval_fn(state, batch):  # a [4096, 4096] temporary: 64 MiB
    x = batch["x"][:, None] * batch["x"][None, :] * state["w"]
    return {"loss": jnp.sum(jnp.sin(x))}, {}

  step = state_lib.eval_step(eval_fn, {"w": replicated}, {"x": replicated})
  state = {"w": jax.device_put(jnp.ones((), jnp.float32), replicated)}
  batch = {"x": jax.device_put(jnp.ones((4096,), jnp.float32), replicated)}
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 2**20)
  for given in (batch, {"x": np.ones((4096,), np.float32)}):  # or the host's
    with pytest.raises(ValueError, match=r"^The eval step needs .* GiB on "
                       r"this host's 1 CPU device\(s\) .*; lower the eval "
                       r"batch size or the config's sequence length, or "
                       r"run on an accelerator\.$"):
      step(state, given)
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 2**40)
  assert float(step(state, batch)[0]["loss"]) == pytest.approx(
      4096 * 4096 * float(jnp.sin(1.0)), rel=1e-3)


def test_the_memory_bound_is_the_lowest_of_the_host_and_the_process_limits(
    monkeypatch):
  import resource  # pylint: disable=g-import-not-at-top
  limits = {resource.RLIMIT_AS: resource.RLIM_INFINITY,
            resource.RLIMIT_DATA: resource.RLIM_INFINITY}
  monkeypatch.setattr(resource, "getrlimit",
                      lambda kind: (limits[kind], resource.RLIM_INFINITY))
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 10 * 2**30)
  mapped = {}
  monkeypatch.setattr(array_sizes, "process_mapped_bytes", lambda: mapped)
  assert array_sizes.memory_bound() == (
      10 * 2**30, "its 10.0 GiB (memory and swap)")
  limits[resource.RLIMIT_AS] = 6 * 2**30
  assert array_sizes.memory_bound() == (
      6 * 2**30, "this process's 6.0 GiB address-space limit (ulimit -v)")
  limits[resource.RLIMIT_DATA] = 3 * 2**30
  assert array_sizes.memory_bound() == (
      3 * 2**30, "this process's 3.0 GiB data-segment limit (ulimit -d)")
  # What the process maps already counts against each limit (a program
  # just under the limit as set failed at its first run).
  mapped.update({"VmSize:": 2 * 2**30, "VmData:": 2**29})
  assert array_sizes.memory_bound() == (
      5 * 2**29, "the 2.5 GiB this process has left under its 3.0 GiB "
      "data-segment limit (ulimit -d; it maps 0.5 GiB already)")
  limits[resource.RLIMIT_DATA] = 5 * 2**30
  assert array_sizes.memory_bound() == (
      4 * 2**30, "the 4.0 GiB this process has left under its 6.0 GiB "
      "address-space limit (ulimit -v; it maps 2.0 GiB already)")
  mapped["VmSize:"] = 7 * 2**30  # past the limit already: nothing left
  assert array_sizes.memory_bound()[0] == 0
  mapped.clear()
  limits[resource.RLIMIT_DATA] = 3 * 2**30
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: None)
  assert array_sizes.memory_bound()[0] == 3 * 2**30
  limits[resource.RLIMIT_AS] = limits[resource.RLIMIT_DATA] = (
      resource.RLIM_INFINITY)
  assert array_sizes.memory_bound() is None


_UNDER_ULIMIT = r"""
import resource, sys
import jax, jax.numpy as jnp
from trm.core import array_sizes
# A 16000 x 16000 float32 table sorted: a 1 GiB temporary, never run.
compiled = jax.jit(lambda x: jnp.sort(x[:, None] * x[None, :], axis=1)[:, 0]
                   ).lower(jax.ShapeDtypeStruct((16000,), jnp.float32)
                           ).compile()
memory = compiled.memory_analysis()
program = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           + memory.temp_size_in_bytes)
mapped = array_sizes.process_mapped_bytes()["VmSize:"]
# Above the program as set, below it with what the process maps already
# (about 1.4 GiB on our host, 0.5 with MALLOC_ARENA_MAX=1), then above
# both.
for limit in (program + mapped // 2, program + mapped + 2**30):
  resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
  try:
    array_sizes.check_program_host_memory(compiled, jax.devices(),
                                          "The program", "lower it")
    print("fits")
  except ValueError as e:
    print(e)
"""


def test_a_program_past_what_the_ulimit_v_leaves_is_refused_before_it_runs():
  # Under `ulimit -v` below the program (and not below the host's memory),
  # trm.sample's and the trainer's first call failed in XLA:CPU ("Out of
  # memory allocating", a JaxRuntimeError traceback or exit 134); until
  # session 106 also a program under the limit as set but past what the
  # process had left of it (as the first limit here).
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  host = array_sizes.host_memory_bytes()
  if host is not None and host < 8 * 2**30:
    pytest.skip("the program must fit the host's memory and not the limit")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)  # one device
  run = subprocess.run([sys.executable, "-c", _UNDER_ULIMIT], env=env,
                       capture_output=True, text=True, timeout=300,
                       check=False)
  assert run.returncode == 0, run.stdout + run.stderr[-2000:]
  assert re.fullmatch(
      r"The program needs 1\.\d GiB on this host's 1 CPU device\(s\) "
      r"\(XLA's memory analysis: .* GiB of temporaries a device\), which "
      r"share the \d+\.\d GiB this process has left under its \d+\.\d GiB "
      r"address-space limit \(ulimit -v; it maps \d+\.\d GiB already "
      r"besides the program's arguments\); lower it\.\nfits\n",
      run.stdout), run.stdout


def test_arrays_already_made_are_not_counted_twice(monkeypatch):
  """A program's arguments (the state, the weights) are in what the process
  maps when it is checked: counted there and again in XLA's analysis, a
  program that ran under the limit was refused (session 106's review)."""
  import resource  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(resource, "getrlimit", lambda kind: (
      6 * 2**30 if kind == resource.RLIMIT_AS else resource.RLIM_INFINITY,
      resource.RLIM_INFINITY))
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 2**40)
  monkeypatch.setattr(array_sizes, "process_mapped_bytes",
                      lambda: {"VmSize:": 4 * 2**30, "VmData:": 3 * 2**30})
  # 2.5 GiB of arguments already made, 1.5 GiB of runtime: 2.5 GiB fits.
  assert array_sizes.host_refusal(5 * 2**29, "P", "f", 1,
                                  resident=5 * 2**29) is None
  assert array_sizes.host_refusal(5 * 2**29, "P", "f", 1) == (
      "P needs 2.5 GiB on this host's 1 CPU device(s), which share the 2.0 "
      "GiB this process has left under its 6.0 GiB address-space limit "
      "(ulimit -v; it maps 4.0 GiB already); f.")


# A 2-process job (one CPU device each) whose process 1 has too little
# memory (its bound patched); both check the model's state and a compiled
# program spanning both.
_TWO_HOSTS = r"""
import sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize("127.0.0.1:" + sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec
from trm.core import array_sizes
if jax.process_index() == 1:
  array_sizes.memory_bound = lambda *_: (1024, "its 0.0 GiB (memory and swap)")
mesh = jax.make_mesh((2,), ("data",),
                     axis_types=(jax.sharding.AxisType.Auto,))
sharded = NamedSharding(mesh, PartitionSpec("data"))
state = jax.ShapeDtypeStruct((4096,), jnp.float32, sharding=sharded)
compiled = jax.jit(lambda x: x * 2, in_shardings=sharded,
                   out_shardings=sharded).lower(state).compile()
for what, check in (
    ("state", lambda: array_sizes.check_host_memory(
        {"w": state}, "The state", "lower it")),
    ("program", lambda: array_sizes.check_program_host_memory(
        compiled, array_sizes.program_devices(compiled), "The step",
        "lower it"))):
  try:
    check()
    print(what, "fits", flush=True)
  except ValueError as e:
    print(what, "refused:", e, flush=True)
jax.distributed.shutdown()
"""


def test_a_host_short_of_memory_stops_every_process_of_the_job():
  # Before, only the short host's process raised; the others went on into
  # the first step's collectives and waited there until it was reported
  # lost (about a minute, then JAX's abort).
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import workers as workers_lib  # pylint: disable=g-import-not-at-top
  from test_train import ROOT  # pylint: disable=g-import-not-at-top
  port = str(workers_lib.free_port())
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=workers_lib.xla_flags(1))
  procs = [subprocess.Popen(
      [sys.executable, "-c", _TWO_HOSTS, port, str(i)], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
      for i in range(2)]
  outputs = workers_lib.wait_all(procs, timeout=120)
  lines = [[l for l in out.splitlines() if l.startswith(("state", "program"))]
           for out in outputs]
  assert lines[1] == [
      "state refused: The state needs 0.0 GiB on this host's 1 CPU "
      "device(s), which share its 0.0 GiB (memory and swap); lower it.",
      "program refused: The step needs 0.0 GiB on this host's 1 CPU "
      "device(s) (XLA's memory analysis: 0.0 GiB of temporaries a device), "
      "which share its 0.0 GiB (memory and swap); lower it."], (
          outputs[1][-2000:])
  assert lines[0] == [
      f"{what} refused: The {name} is past the memory of process 1's host "
      "(1 of 2 processes refused it; their error lines give the figures); "
      "lower it." for what, name in (("state", "state"), ("program", "step"))
  ], outputs[0][-2000:]
