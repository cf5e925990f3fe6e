"""trm.generate end to end on a tiny random checkpoint (HF layout)."""
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from trm import config_lib
from trm import generate
from trm import tokenizer as tok_lib
from trm.models import dream, get_model, hf_import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny_config():
  return config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """Random tiny weights exported as safetensors + a matching tokenizer."""
  directory = tmp_path_factory.mktemp("tiny_ckpt")
  config = _tiny_config()
  model = get_model(config.model)
  assert isinstance(model, dream.Dream)
  params = nn.meta.unbox(model.init(jax.random.key(0),
                                    jnp.zeros((1, 4), jnp.int32))["params"])
  hf_import.export_hf_checkpoint(params, model.cfg, str(directory))
  # Ids 0..499 are words; the specials follow so <|mask|> lands on 500.
  vocab = {f"w{i}": i for i in range(500)}
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.add_special_tokens([tok_lib.MASK, tok_lib.END_OF_TEXT,
                                tok_lib.IM_START, tok_lib.IM_END,
                                tok_lib.DLM_PAD])
  tokenizer.save(str(directory / "tokenizer.json"))
  return str(directory)


def test_left_pad():
  ids, mask = generate.left_pad([[5, 6, 7], [8]], pad_id=1, max_len=10)
  np.testing.assert_array_equal(ids, [[5, 6, 7], [1, 1, 8]])
  np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1]])
  with pytest.raises(ValueError, match="A prompt has 3 tokens"):
    generate.left_pad([[5, 6, 7]], pad_id=1, max_len=2)


def test_cli_generates_for_a_batch(tmp_path, checkpoint):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("w3 w4 w5\nw9\n")
  result = subprocess.run(
      [sys.executable, "-m", "trm.generate",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={checkpoint}",
       f"--batch_file={prompts}", "--max_new_tokens=8", "--steps=4",
       "--alg=entropy"], cwd=ROOT, capture_output=True, text=True,
      timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.count("=== ") == 2
  assert "tokens/s" in result.stdout


def test_cli_rejects_a_prompt_longer_than_the_context(checkpoint):
  result = subprocess.run(
      [sys.executable, "-m", "trm.generate",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={checkpoint}",
       "--prompt=" + " ".join(["w1"] * 130), "--max_new_tokens=8"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode != 0
  assert "A prompt has 130 tokens" in result.stderr
