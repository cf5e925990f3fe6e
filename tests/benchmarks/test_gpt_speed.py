"""benchmarks/speed/gpt_speed.py: nanoGPT's PyTorch loop is timed on the
iteration ours trains."""
import json
import os
import subprocess
import sys

import pytest
import repo

# In a process of its own: the script defines absl flags ('config', ...)
# at import, as other benchmark scripts the same test worker may have
# loaded do.
_PROBE = """
import json, os, sys
sys.path.insert(0, os.path.join({root!r}, "tests"))
import repo
from trm.core import config_lib
script = repo.load_script("benchmarks", "speed", "gpt_speed.py")
nanogpt_torch = repo.load_script("benchmarks", "reference", "nanogpt_torch.py")
config = config_lib.load_config(
    os.path.join(repo.ROOT, "configs", "gpt.py"), "shakespeare_char_cpu")
config.update(dict(gradient_accumulation_steps=4, bias=True, dropout=0.1))
config.model.vocab_size = 96
args = nanogpt_torch.parse_args(script.torch_argv(config, 7, None))
print(json.dumps(dict(vars(args), global_batch_size=config.global_batch_size,
                      data_root=config.data_root)))
"""


def test_torch_times_the_same_iteration_as_ours():
  """Micro-batches, bias, dropout and the vocabulary reach nanogpt_torch:
  with gradient_accumulation_steps=4 PyTorch timed one micro-batch per
  iteration (768 tokens against our 3,072) and the printed time ratio
  compared the two."""
  pytest.importorskip("torch")
  result = subprocess.run(
      [sys.executable, "-c", _PROBE.format(root=repo.ROOT)], cwd=repo.ROOT,
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  args = json.loads(result.stdout.strip().splitlines()[-1])
  assert args["gradient_accumulation_steps"] == 4
  assert args["batch_size"] * args["gradient_accumulation_steps"] == (
      args["global_batch_size"])
  assert (args["bias"], args["dropout"], args["vocab_size"]) == (True, 0.1,
                                                                 96)
  assert (args["n_layer"], args["n_head"], args["n_embd"],
          args["block_size"], args["iters"]) == (4, 4, 128, 64, 7)
  assert args["data_dir"] == os.path.join(args["data_root"],
                                          "shakespeare_char")
