"""The exporters with the weights sharded over two processes (2 x 4 CPU
devices, gloo): the files process 0 writes equal a one-process export of the
same values, and the other process writes nothing. DiffuCoder's Hugging
Face export, GPT's Hugging Face GPT-2 and nanoGPT ones."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import workers as workers_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# For each family: builds its parameters from a seeded numpy draw, places
# them on an 8-device fsdp mesh spanning the processes, and exports them to
# out/<family>. Both families in one process (one start-up, one join).
_WORKER = workers_lib.JOIN + """
import os
import numpy as np
from flax.core import meta
from trm.core import config_lib
from trm.core import mesh as mesh_lib

for family, (config, variant, overrides) in {models!r}.items():
  out = os.path.join({out!r}, family)
  config = config_lib.load_config(config, variant)
  config = config_lib.set_values(config, overrides)
  ctx = mesh_lib.ShardingContext.from_config(config)
  if family == "dream":
    from trm.families.dream import hf_import
    from trm.families.dream import model as dream
    cfg = dream.DreamConfig.from_config(config.model)
    abstract_params = dream.abstract_params
    export = lambda params: hf_import.export_hf_checkpoint(
        params, cfg, out, shard_size_bytes=200_000)
  else:
    from trm.families.gpt import gpt_export
    from trm.families.gpt import model as gpt
    cfg = gpt.GPTConfig.from_config(config.model)
    abstract_params = gpt.abstract_params
    export = lambda params: (
        gpt_export.export_hf_gpt2(params, cfg, out) +
        gpt_export.export_nanogpt(params, cfg, out + "/ckpt.pt", 3))
  boxed, shardings = ctx.boxed_shardings(lambda: abstract_params(cfg))
  abstract = meta.unbox(boxed)
  rng = np.random.default_rng(0)
  values = jax.tree.map(
      lambda a: rng.standard_normal(a.shape).astype(np.float32), abstract)
  params = jax.tree.map(
      lambda v, s: jax.make_array_from_callback(v.shape, s, lambda i: v[i]),
      values, shardings)
  split = [not x.is_fully_addressable for x in jax.tree.leaves(params)]
  files = export(params)
  print("SPLIT", sum(split), "FILES", len(files), "PROCESS",
        jax.process_index(), "FAMILY", family, flush=True)
"""
# family -> (config file, variant, overrides): the weights split over fsdp.
_MODELS = {
    "dream": ("diffucoder_7b.py", "tiny", {}),
    "gpt": ("gpt.py", "shakespeare_char_cpu", {
        "model.vocab_size": 65, "bias": True, "mesh.data": 1,
        "mesh.fsdp": 8}),
}


def _script(families, out, process_id=None, address=None):
  models = {f: (os.path.join(ROOT, "configs", _MODELS[f][0]), *_MODELS[f][1:])
            for f in families}
  return _WORKER.format(models=models, out=out, process_id=process_id,
                        address=address)


def _tensors(directory):
  tensors = {}
  for name in sorted(os.listdir(directory)):
    if name.endswith(".safetensors"):
      tensors.update(load_file(os.path.join(directory, name)))
    elif name.endswith(".pt"):
      import torch  # pylint: disable=g-import-not-at-top
      state = torch.load(os.path.join(directory, name), weights_only=True)
      tensors.update({f"{name}:{k}": v.numpy()
                      for k, v in state["model"].items()})
  return tensors


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """Every family exported by one process (8 devices) into one/<family>,
  then by 2 processes x 4 into two/<family>: (one, two, the 2 processes'
  outputs). GPT's export needs torch: without it only Dream's runs."""
  families = [f for f in sorted(_MODELS)
              if f != "gpt" or importlib.util.find_spec("torch")]
  tmp_path = tmp_path_factory.mktemp("export")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(8))
  one = str(tmp_path / "one")
  single = subprocess.run([sys.executable, "-c", _script(families, one)],
                          cwd=ROOT,
                          env=env, capture_output=True, text=True,
                          timeout=300)
  assert single.returncode == 0, single.stderr[-3000:]

  two = str(tmp_path / "two")
  address = f"127.0.0.1:{workers_lib.free_port()}"
  env["XLA_FLAGS"] = workers_lib.xla_flags(4)
  workers = [subprocess.Popen(
      [sys.executable, "-c", _script(families, two, i, address)], cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=300)
  for worker, output in zip(workers, outputs):
    assert worker.returncode == 0, output[-3000:]
  return one, two, outputs


@pytest.mark.parametrize("family", sorted(_MODELS))
def test_two_processes_export_what_one_does(exported, family):
  if family == "gpt":
    pytest.importorskip("torch")
  one, two, outputs = exported
  one, two = os.path.join(one, family), os.path.join(two, family)
  # Some arrays really span both processes, and only process 0 wrote.
  lines = [next(line for line in out.splitlines()
                if line.startswith("SPLIT") and line.endswith(
                    f" FAMILY {family}")) for out in outputs]
  assert int(lines[0].split()[1]) > 0, lines
  assert "PROCESS 0" in lines[0] and int(lines[0].split()[3]) > 1, lines
  assert "FILES 0 PROCESS 1" in lines[1], lines

  assert sorted(os.listdir(two)) == sorted(os.listdir(one))
  expected, got = _tensors(one), _tensors(two)
  assert sorted(got) == sorted(expected) and expected
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
