"""`export_hf_checkpoint` with the weights sharded over two processes (2 x 4
CPU devices, gloo): the files process 0 writes equal a one-process export of
the same values, and the other process writes nothing."""
import os
import subprocess
import sys

import numpy as np
from safetensors.numpy import load_file

import workers as workers_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Builds the `:tiny` DiffuCoder's parameters from a seeded numpy draw, places
# them on an 8-device fsdp mesh spanning the processes, and exports them.
_WORKER = workers_lib.JOIN + """
import numpy as np
from flax.core import meta
from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.families.dream import hf_import
from trm.families.dream import model as dream

config = config_lib.load_config({config!r}, "tiny")
cfg = dream.DreamConfig.from_config(config.model)
ctx = mesh_lib.ShardingContext.from_config(config)
boxed, shardings = ctx.boxed_shardings(lambda: dream.abstract_params(cfg))
abstract = meta.unbox(boxed)
rng = np.random.default_rng(0)
values = jax.tree.map(
    lambda a: rng.standard_normal(a.shape).astype(np.float32), abstract)
params = jax.tree.map(
    lambda v, s: jax.make_array_from_callback(v.shape, s, lambda i: v[i]),
    values, shardings)
split = [not x.is_fully_addressable for x in jax.tree.leaves(params)]
files = hf_import.export_hf_checkpoint(params, cfg, {out!r},
                                       shard_size_bytes=200_000)
print("SPLIT", sum(split), "FILES", len(files), "PROCESS",
      jax.process_index(), flush=True)
"""


def _script(out, process_id=None, address=None):
  return _WORKER.format(config=os.path.join(ROOT, "configs",
                                            "diffucoder_7b.py"),
                        out=out, process_id=process_id, address=address)


def _tensors(directory):
  tensors = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(directory, name)))
  return tensors


def test_two_processes_export_what_one_does(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(8))
  one = str(tmp_path / "one")
  single = subprocess.run([sys.executable, "-c", _script(one)], cwd=ROOT,
                          env=env, capture_output=True, text=True,
                          timeout=300)
  assert single.returncode == 0, single.stderr[-3000:]

  two = str(tmp_path / "two")
  address = f"127.0.0.1:{workers_lib.free_port()}"
  env["XLA_FLAGS"] = workers_lib.xla_flags(4)
  workers = [subprocess.Popen(
      [sys.executable, "-c", _script(two, i, address)], cwd=ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=300)
  for worker, output in zip(workers, outputs):
    assert worker.returncode == 0, output[-3000:]
  # Some arrays really span both processes, and only process 0 wrote.
  lines = [next(line for line in out.splitlines() if line.startswith("SPLIT"))
           for out in outputs]
  assert int(lines[0].split()[1]) > 0, lines
  assert "PROCESS 0" in lines[0] and int(lines[0].split()[3]) > 1, lines
  assert "FILES 0 PROCESS 1" in lines[1], lines

  assert sorted(os.listdir(two)) == sorted(os.listdir(one))
  expected, got = _tensors(one), _tensors(two)
  assert sorted(got) == sorted(expected) and expected
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
