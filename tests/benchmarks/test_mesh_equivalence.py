"""benchmarks/reliability/mesh_equivalence.py runs and its figures say what
they should: the GPT step on a 2x2x2 mesh of 8 CPU devices equals the
one-device step within float32 rounding, and a mesh the trainer refuses is
reported as refused."""
import os
import re
import subprocess
import sys

import repo


def test_a_sharded_gpt_step_equals_one_device():
  result = subprocess.run(
      [sys.executable, "benchmarks/reliability/mesh_equivalence.py",
       "--family=gpt", "--sgd", "--steps=1", "--meshes=2,2,2;3,1,1"],
      cwd=repo.ROOT, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8"))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  sharded = next(l for l in lines if l.startswith("mesh 2,2,2:"))
  metrics, params = (float(x) for x in re.search(
      r"metrics max rel (\S+) .*params max diff / update (\S+) ",
      sharded).groups())
  assert metrics < 1e-5 and params < 1e-4, sharded
  refused = next(l for l in lines if l.startswith("mesh 3,1,1:"))
  assert "refused: MeshConfigError" in refused, refused
