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
config.update(dict(gradient_accumulation_steps=4, bias=True, dropout=0.1,
                   dtype="bfloat16"))
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
  # PyTorch timed float32 whatever config.dtype ours computed in.
  assert args["dtype"] == "bfloat16"
  assert (args["n_layer"], args["n_head"], args["n_embd"],
          args["block_size"], args["iters"]) == (4, 4, 128, 64, 7)
  assert args["data_dir"] == os.path.join(args["data_root"],
                                          "shakespeare_char")


def test_torch_computes_in_the_dtype_asked(tmp_path):
  """--dtype=bfloat16 runs the forward under torch.autocast (train.py's
  ctx), float16 also through a GradScaler: the same seed's first loss moves
  by the rounding, and the MFU divides by that dtype's peak."""
  pytest.importorskip("torch")
  nanogpt_torch = repo.load_script("benchmarks", "reference",
                                   "nanogpt_torch.py")
  text = tmp_path / "input.txt"
  text.write_text("".join(chr(97 + (i * 7) % 26) for i in range(4000)))
  common = dict(iters=1, warmup_iters_timing=0, threads=1, n_layer=1,
                n_head=2, n_embd=32, block_size=16, batch_size=4,
                peak_size=64, data_dir=str(tmp_path / "d"), input=str(text))
  results = {dtype: nanogpt_torch.run(dict(common, dtype=dtype))
             for dtype in ("float32", "bfloat16", "float16")}
  base = results["float32"]["first_loss"]
  for dtype in ("bfloat16", "float16"):
    result = results[dtype]
    assert result["first_loss"] != base
    assert result["first_loss"] == pytest.approx(base, abs=0.05)
    assert f"CPU {dtype} matmul peak" in result["peak_description"]
    assert f"dtype={dtype}" in nanogpt_torch.report(result)
