"""XLA:CPU programs whose collectives span several device groups are
compiled where they run, never loaded back (`trm.core.cpu_collectives`):
the persistent compilation cache keeps them out, and a saved step of that
kind is refused. Loaded back, such a program deadlocked (BUILD_NOTES,
"Session 55"). 8 CPU devices."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import serialize_executable
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trm.core import compiled_step
from trm.core import cpu_collectives
from test_train import ROOT  # pylint: disable=g-import-not-at-top


def _mesh():
  return jax.make_mesh((2, 4), ("fsdp", "model"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _summed(mesh, axes):
  """A compiled program that sums over each of `axes` in turn."""
  def body(x):
    for axis in axes:
      x = jax.lax.psum(jnp.tanh(x), axis)
    return x
  f = jax.shard_map(body, mesh=mesh, in_specs=P("fsdp", "model"),
                    out_specs=P(), check_vma=False)
  x = jax.device_put(np.ones((8, 16), np.float32),
                     NamedSharding(mesh, P("fsdp", "model")))
  return jax.jit(f).lower(x).compile(), x


def test_device_groups_read_every_spelling():
  hlo = textwrap.dedent("""
      %a = f32[4] all-reduce(f32[4] %p), replica_groups={{0,1},{2,3}}, to_apply=%add
      %b = f32[8] all-gather(f32[4] %p), replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}
      %c = f32[4] all-reduce-start(f32[4] %p), replica_groups={}, to_apply=%add
      %d = f32[4] collective-permute(f32[4] %p), source_target_pairs={{0,1},{1,0}}
      %e = f32[4] add(f32[4] %a, f32[4] %c)
      %f = (f32[4], s32[]) all-reduce(%e, %i), replica_groups=mesh['x'=2,'y'=2] {'y'}, use_global_device_ids=true
      %g = f32[4] all-reduce(f32[4] %e), replica_groups=mesh['x'=2,'y'=2] {'x'}, to_apply=%add
      %h = f32[4] all-reduce(f32[4] %e), replica_groups=mesh['x'=1,'y'=4,'z'=1] {'y'}, to_apply=%add
      %k = f32[4] all-reduce(f32[4] %e), replica_groups=[1,4]<=[4], to_apply=%add
      %l = f32[4] all-gather(%e), replica_groups=mesh['x'=2,'y'=2], device_ids=([2,2]T(1,0)) {'x'}, dimensions={0}
  """)
  by_rows = frozenset({frozenset({0, 1}), frozenset({2, 3})})
  by_columns = frozenset({frozenset({0, 2}), frozenset({1, 3})})
  # Three spellings of one grouping (the mesh's devices in another order
  # for %l), two of another, four of every device, and a permute.
  assert cpu_collectives.device_groups(hlo) == {
      by_rows, by_columns, "all", ("pairs", "{{0,1},{1,0}}")}
  assert cpu_collectives.device_groups("%e = f32[4] add(%a, %b)") == set()
  # A sub-axis, 'x':(k)m: axis x as [k, m, rest], its middle part. Here
  # the positions 0-3 of 'x' in pairs {0,1} and {2,3}.
  sub = ("%s = f32[4] all-to-all(%p, %q), replica_groups=mesh['x'=4,'y'=2] "
         "{'x':(2)2}")
  assert cpu_collectives.device_groups(sub) == {frozenset({
      frozenset({0, 2}), frozenset({1, 3}), frozenset({4, 6}),
      frozenset({5, 7})})}
  # Beside the whole axis and the other sub-axis: three groupings, not one.
  assert len(cpu_collectives.device_groups("\n".join((
      sub, sub.replace("(2)2", "(1)2"), sub.replace(":(2)2", ""))))) == 3
  # Groups of one device communicate nothing: not a grouping.
  assert cpu_collectives.device_groups(
      "%n = f32[4] all-reduce(%e), replica_groups={{0},{1},{2},{3}}\n"
      "%o = f32[4] all-reduce(%n), replica_groups=[1,4]<=[4]") == {"all"}
  # Numbers that make no shape are kept as written: never equal to another.
  bad = "%z = f32[8] all-gather(%p), replica_groups=[2,2]<=[4]T(1,0)"
  assert cpu_collectives.device_groups(bad) == {bad}


def test_collectives_over_two_groups_are_deadlock_prone_on_cpu_only():
  mesh = _mesh()
  two, _ = _summed(mesh, ("fsdp", "model"))
  one, _ = _summed(mesh, ("model", "model"))
  assert cpu_collectives.deadlock_prone("cpu", two)
  assert not cpu_collectives.deadlock_prone("cpu", one)
  assert not cpu_collectives.deadlock_prone("tpu", two)
  assert not cpu_collectives.deadlock_prone(
      "cpu", jax.jit(jnp.tanh).lower(jnp.ones(4)).compile())


def test_a_saved_cpu_step_over_two_groups_is_refused():
  mesh = _mesh()
  for axes, refused in ((("fsdp", "model"), True), (("model",), False)):
    compiled, x = _summed(mesh, axes)
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    if refused:
      with pytest.raises(compiled_step.CompiledStepError,
                         match="deadlock when loaded from a file"):
        compiled_step.load("step.bin", payload, in_tree, out_tree)
    else:
      loaded = compiled_step.load("step.bin", payload, in_tree, out_tree)
      np.testing.assert_array_equal(loaded(x), compiled(x))


_PROGRAM = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from trm.core import compile_cache

    compile_cache.configure(sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **kw: hits.append(1)
        if event == "/jax/compilation_cache/cache_hits" else None)
    mesh = jax.make_mesh((2, 4), ("fsdp", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = jax.device_put(np.ones((8, 16), np.float32),
                       NamedSharding(mesh, P("fsdp", "model")))
    counts = {}
    for name, axes in (("one_group", ("model",)), ("two_groups", ("fsdp", "model"))):
      def body(x, axes=axes):
        for _ in range(40):  # long enough to compile that JAX caches it
          for axis in axes:
            x = jax.lax.psum(jnp.tanh(x @ x.T @ x), axis)
        return x
      f = jax.shard_map(body, mesh=mesh, in_specs=P("fsdp", "model"),
                        out_specs=P(), check_vma=False)
      counts[name], results = [], []
      for _ in range(2):  # a new jit of the same program: compiled again?
        before = len(hits)
        results.append(np.asarray(jax.jit(lambda x, f=f: f(x))(x)))
        counts[name].append(len(hits) - before)
      np.testing.assert_array_equal(*results)
    print(json.dumps(counts))
""")


def test_the_cache_keeps_two_group_cpu_programs_out(tmp_path):
  script = tmp_path / "program.py"
  script.write_text(_PROGRAM)
  cache = tmp_path / "cache"
  environ = dict(os.environ, JAX_PLATFORMS="cpu")

  def run():
    result = subprocess.run([sys.executable, str(script), str(cache)],
                            cwd=ROOT, env=environ, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])

  # Within one process the second jit of each is a hit: the one-group
  # program loaded from the disk, the other the executable this process
  # compiled (kept in memory, never written).
  assert run() == {"one_group": [0, 1], "two_groups": [0, 1]}
  entries = os.listdir(cache)
  assert len([e for e in entries if "cache" in e]) == 1, entries
  # The second run loads the one-group program and compiles the other.
  assert run() == {"one_group": [1, 1], "two_groups": [0, 1]}


def test_the_guard_stands_when_our_cache_is_off(tmp_path):
  # JAX's own JAX_COMPILATION_CACHE_DIR turns JAX's cache on regardless.
  program = ("from trm.core import compile_cache\n"
             "assert compile_cache.configure('off') is None\n"
             "from jax._src import compilation_cache as jax_cache\n"
             "print(getattr(jax_cache.get_executable_and_time, "
             "'_trm_guard', False))\n")
  environ = dict(os.environ, JAX_PLATFORMS="cpu",
                 JAX_COMPILATION_CACHE_DIR=str(tmp_path))
  result = subprocess.run([sys.executable, "-c", program], cwd=ROOT,
                          env=environ, capture_output=True, text=True,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ["True"]
