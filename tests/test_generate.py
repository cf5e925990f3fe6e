"""trm.generate end to end on a tiny random checkpoint (HF layout)."""
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import app
from tokenizers import Tokenizer, models, pre_tokenizers
import cli_batch
import repo

from trm.core import config_lib
from trm import generate
from trm.data.text import tokenizer as tok_lib
from trm.families.dream import model as dream
from trm.families.dream import hf_import

ROOT = repo.ROOT


def _tiny_config():
  return config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")


def make_tiny_checkpoint(directory, logit_scale: float = 1.0) -> str:
  """Random tiny weights exported as safetensors + a matching tokenizer
  (words w0..w499, unknown text -> w0) in `directory`. `logit_scale`
  multiplies the final norm's scale, so the logits: at 1 the random model's
  distributions are near-uniform, and positions' confidences can tie to
  within float32 rounding."""
  config = _tiny_config()
  model = dream.Dream(dream.DreamConfig.from_config(config.model))
  params = nn.meta.unbox(model.init(jax.random.key(0),
                                    jnp.zeros((1, 4), jnp.int32))["params"])
  params["norm"]["scale"] = params["norm"]["scale"] * logit_scale
  hf_import.export_hf_checkpoint(params, model.cfg, str(directory))
  # Ids 0..499 are words; the specials follow so <|mask|> lands on 500.
  vocab = {f"w{i}": i for i in range(500)}
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
  tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer.add_special_tokens([tok_lib.MASK, tok_lib.END_OF_TEXT,
                                tok_lib.IM_START, tok_lib.IM_END,
                                tok_lib.DLM_PAD])
  tokenizer.save(os.path.join(str(directory), "tokenizer.json"))
  return str(directory)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_ckpt"))


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
       "--alg=entropy", "--num_return_sequences=2",
       # The API's third compute dtype (the flag offered two).
       "--dtype=float16"],
      cwd=ROOT, capture_output=True, text=True,
      timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  # Each prompt's completions together, as Hugging Face returns them.
  assert [l for l in result.stdout.splitlines() if l.startswith("===")] == [
      "=== w3 w4 w5 [1/2]", "=== w3 w4 w5 [2/2]", "=== w9 [1/2]",
      "=== w9 [2/2]"]
  assert "batch 4, 8 new tokens" in result.stdout
  assert "tokens/s" in result.stdout


def test_cli_rejects_a_prompt_longer_than_the_context(checkpoint,
                                                      generate_cli):
  result = generate_cli.run(
      ["--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={checkpoint}",
       "--prompt=" + " ".join(["w1"] * 130), "--max_new_tokens=8"],
      cwd=ROOT, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2
  assert "Traceback" not in result.stderr
  assert ("trm.generate: error: max_new_tokens=8: the longest prompt (130 "
          "tokens) plus the new tokens exceed the model's 128 positions"
          in result.stderr)


# ------------------------------------------------------------ Python API


@pytest.fixture(scope="module")
def lm(checkpoint):
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  return DiffusionLM.from_pretrained(checkpoint, dtype="float32")


def test_from_pretrained_reads_the_model_from_config_json(lm):
  want = dream.DreamConfig.from_config(_tiny_config().model)
  for field in ("vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "rope_theta", "rms_norm_eps",
                "mask_token_id", "pad_token_id"):
    assert getattr(lm.cfg, field) == getattr(want, field), field
  assert lm.tokenizer.mask_id == lm.cfg.mask_token_id


def test_from_pretrained_reads_transformers_dtype_spellings(checkpoint,
                                                           tmp_path):
  """dtype= as transformers users write it ('bf16', torch.bfloat16,
  'torch.float16', jnp types; 'auto' and None: the stored dtype) was
  refused as "config.json describes no valid model: config.model.dtype=
  'bf16'", blaming the checkpoint for the argument; a bad dtype,
  param_dtype or attention is now named before any read."""
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  for dtype, want in (("bf16", "bfloat16"), ("torch.float16", "float16"),
                      (jnp.float32, "float32"), ("Auto", None), (None, None)):
    assert inference.check_dtype(dtype, "dtype", dream.COMPUTE_DTYPES) == want
  for dtype, want in (("torch.bfloat16", "bfloat16"),
                      ("auto", "float32")):  # the tensors are float32
    lm = DiffusionLM.from_pretrained(checkpoint, dtype=dtype,
                                     param_dtype="fp32")
    assert (lm.cfg.dtype, lm.cfg.param_dtype) == (want, "float32"), dtype
  missing = str(tmp_path / "never_read")
  for kwargs, message in (
      (dict(dtype="bogus"), "dtype='bogus': pass one of bfloat16, float32, "
       "float16 (or 'auto'"),
      (dict(dtype="torch.int8"), "dtype='torch.int8': pass one of"),
      (dict(param_dtype="fp16"), "param_dtype='fp16': pass one of bfloat16, "
       "float32 (or"),
      (dict(attention="flash"), "attention='flash': pass one of dot, ")):
    with pytest.raises(ValueError) as info:
      DiffusionLM.from_pretrained(missing, **kwargs)
    assert str(info.value).startswith(message), str(info.value)
    assert "config.json" not in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(mesh="fsdp"), "mesh='fsdp' is a str: pass a jax.sharding.Mesh"),
    (dict(config={"seq_len": 64}), "config={'seq_len': 64} is a dict: pass "
     "an ml_collections config"),
    (dict(tokenizer=3), "tokenizer=3 is a int: pass a directory or 'bytes'"),
])
def test_from_pretrained_argument_types_are_named(checkpoint, kwargs,
                                                  message):
  """A mesh, config or tokenizer of the wrong type was an AttributeError
  or TypeError from deep inside ('str' object has no attribute 'devices');
  now a TypeError naming the argument, before any read."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  with pytest.raises(inference.ArgumentTypeError) as info:
    inference.DiffusionLM.from_pretrained(checkpoint, **kwargs)
  assert str(info.value).startswith(message), str(info.value)


def test_encode_reads_a_string_as_one_prompt(lm):
  """lm.encode("w1 w2") encoded each character as a prompt: [[0], [0], [],
  [0], [0]]."""
  assert lm.encode("w1 w2") == lm.encode(["w1 w2"]) == [[1, 2]]
  with pytest.raises(TypeError, match=r"prompts is bytes"):
    lm.encode(b"w1")


def test_from_pretrained_with_a_config_of_seq_len_only(checkpoint):
  """A config with no mesh or logical_axis_rules was an AttributeError
  ("'logical_axis_rules'"); the defaults serve for what it lacks."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  lm = DiffusionLM.from_pretrained(
      checkpoint, dtype="float32",
      config=ml_collections.ConfigDict({"seq_len": 64}))
  assert lm.max_positions == 64
  assert lm.rules == tuple(config_lib.default_logical_axis_rules())


def test_from_pretrained_on_a_mesh_the_user_built(checkpoint):
  """mesh= from jax.make_mesh (Explicit axes) failed in generate with a
  ShardingTypeError from the embedding's gather; a mesh of other axis
  names was a KeyError: 'model'."""
  from jax.sharding import AxisType, Mesh  # pylint: disable=g-import-not-at-top
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"^mesh= has axes \('x',\), but the "
                     r"logical-axis rules place arrays on \('data', 'fsdp', "
                     r"'model'\)"):
    DiffusionLM.from_pretrained(checkpoint, dtype="float32", mesh=Mesh(
        np.array(jax.devices()), ("x",)))
  mesh = jax.make_mesh((1, jax.device_count(), 1), ("data", "fsdp", "model"))
  lm = DiffusionLM.from_pretrained(checkpoint, dtype="float32", mesh=mesh)
  assert lm.mesh.axis_types == (AxisType.Auto,) * 3
  assert lm.mesh.devices.tolist() == mesh.devices.tolist()
  assert len(lm.generate("w1 w2", max_new_tokens=2)) == 1


def test_chat_prompts_are_stripped_as_diffucoders_readme_does(checkpoint):
  """DiffuCoder's README and inference_demo.py put `query.strip()` in the
  template; a prompt with a trailing newline or spaces (a line of a
  --batch_file, text read from a file) gave other tokens than theirs."""
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  lm = DiffusionLM.from_pretrained(checkpoint, dtype="float32",
                                   tokenizer="bytes")  # spaces are tokens
  want = lm.tokenizer.encode(
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
      "<|im_start|>user\nWrite fib.\n<|im_end|>\n<|im_start|>assistant\n")
  assert lm.encode([" Write fib.\n", "Write fib.  "], chat=True) == [want] * 2
  # A system message replaces the default one, as in the chat template
  # (<|im_start|>system\n{content}<|im_end|>\n), kept as given.
  assert lm.encode(["Write fib. "], chat=True, system=" Be brief.") == [
      lm.tokenizer.encode(
          "<|im_start|>system\n Be brief.<|im_end|>\n"
          "<|im_start|>user\nWrite fib.\n<|im_end|>\n<|im_start|>assistant\n")]
  # Without the template the text is the model's to continue, as given.
  assert lm.encode(["Write fib. "]) == [lm.tokenizer.encode("Write fib. ")]


def test_batches_left_padding_and_batch_size_agree(lm):
  # Batches of 3, 2 and 1 rows: three programs (every prompt buckets to 64
  # tokens), the batch of 2 the pair's below and test_hugging_face_
  # spellings_return_sequences_and_history's.
  prompts = ["w3 w4 w5", "w9", "w1 w2 w6"]
  kw = dict(max_new_tokens=6, steps=3)
  together = lm.generate(prompts, return_tokens=True, **kw)
  assert isinstance(together.completions, list) and len(together.tokens) == 3
  # Fixed-size batches (the last one padded) give the same tokens.
  split = lm.generate(prompts, batch_size=2, return_tokens=True, **kw)
  np.testing.assert_array_equal(split.tokens, together.tokens)
  # Equal-length prompts alone or together: the same completion (the reveal
  # count is the batch average, equal for equal canvases).
  alone = lm.generate(["w3 w4 w5"], return_tokens=True, **kw)
  pair = lm.generate(["w3 w4 w5", "w1 w2 w6"], return_tokens=True, **kw)
  np.testing.assert_array_equal(alone.tokens[0], pair.tokens[0])
  assert lm.generate("w3 w4 w5", **kw) == [together.completions[0]]


def test_chat_history_and_timings(lm):
  out = lm.generate(["w5"], chat=True, max_new_tokens=4, steps=4,
                    return_history=True)
  chat_ids = lm.tokenizer.encode(tok_lib.chat_prompt("w5"))
  assert out.prompt_len == len(chat_ids)
  np.testing.assert_array_equal(out.tokens[0, :out.prompt_len], chat_ids)
  assert out.history.shape == (4, 1, out.prompt_len + 4)
  np.testing.assert_array_equal(out.history[-1], out.tokens)
  assert lm.timings["run_seconds"] > 0 and lm.timings["new_tokens"] == 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.5), "temperature=-0.5: must be a finite number"),
    (dict(temperature=float("nan")), "temperature=nan"),
    (dict(top_p=1.5), "top_p=1.5: must lie in [0, 1]"),
    (dict(top_p=-0.1), "top_p=-0.1"),
    (dict(eps=1.5), "eps=1.5: must lie in [0, 1]"),
    (dict(eps=-0.1), "eps=-0.1"),
    # Truthy strings and numbers applied the template or returned tokens.
    (dict(chat="no"), "chat='no': must be True or False."),
    (dict(return_tokens=1), "return_tokens=1: must be True or False."),
    (dict(return_dict_in_generate="True"),
     "return_dict_in_generate='True': must be True or False."),
    (dict(top_k=-1), "top_k=-1: must be an integer >= 0"),
    (dict(steps=0), "steps=0: must be an integer >= 1"),
    (dict(max_new_tokens=0), "max_new_tokens=0"),
    (dict(max_new_tokens=200000), "exceed the model's 131072 positions"),
    (dict(alg="best"), "alg='best'"),
    (dict(system="Be brief."), "system: a system message belongs to the "
     "chat template; pass chat=True with it."),
    (dict(batch_size=0), "batch_size=0"),
    (dict(num_return_sequences=0), "num_return_sequences=0: must be >= 1 "
     "(completions per prompt)"),
    (dict(cache="full"), "cache='full': must be one of"),
    (dict(cache="dual", block_length=3), "block_length=3: must divide"),
    (dict(cache="dual", block_length=4, threshold=2.0),
     "threshold=2.0: must lie in (0, 1]"),
    (dict(cache="prefix", block_length=4, return_history=True),
     "return_history: not "
     "available with cache"),
    (dict(threshold=0.9), "threshold=0.9: cached block decoding only"),
    (dict(fast_dllm=True), "fast_dllm=True: cached block decoding only"),
    (dict(fast_dllm="yes"), "fast_dllm='yes': cached block decoding only"),
    (dict(cache="dual", block_length=4, steps=4, fast_dllm="yes"),
     "fast_dllm='yes': must be True or False"),
    (dict(cache="dual", block_length=2, steps=2, fast_dllm=True),
     "steps=2: with fast_dllm, give at least 2 steps per block (4)"),
])
def test_api_bad_settings_are_one_clear_line(lm, kwargs, message):
  with pytest.raises(ValueError) as info:
    lm.generate(["w1"], **{"max_new_tokens": 4, **kwargs})
  assert message in str(info.value) and "\n" not in str(info.value)


# slow: test_cli_cached_decoding_compiles_once_and_prints_both_times runs
# the cached sampler end to end and tests/families/dream/
# test_cached_sampling.py checks its tokens.
@pytest.mark.slow
def test_api_cached_decoding(lm):
  """The cache agrees with the exact sampler on every prompt token, fills
  the canvas, and is timed like the exact one."""
  prompts = ["w3 w4 w5", "w9"]
  exact = lm.generate(prompts, max_new_tokens=8, return_tokens=True)
  for kwargs in (dict(cache="dual", threshold=0.9),
                 dict(cache="prefix", steps=4)):
    out = lm.generate(prompts, max_new_tokens=8, block_length=4,
                      return_tokens=True, **kwargs)
    assert out.tokens.shape == exact.tokens.shape
    np.testing.assert_array_equal(out.tokens[:, :out.prompt_len],
                                  exact.tokens[:, :exact.prompt_len])
    assert not np.any(out.tokens == lm.cfg.mask_token_id)
    assert lm.timings["compile_seconds"] > 0


def test_api_empty_prompt_list(lm):
  with pytest.raises(ValueError, match="prompts is empty"):
    lm.generate([])


# -------------------------------------------------------------- CLI errors


def _cli(*flags, timeout=300):
  return subprocess.run([sys.executable, "-m", "trm.generate", *flags],
                        cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


# `python -m trm.generate` for the refusal cases and the cached decoding
# run, forked from one process that has imported what the tool imports
# (tests/cli_batch.py): ~20 start-ups of jax, flax and the Dream model
# less. test_cli_generates_for_a_batch (and the slow CRLF run) start the
# real entry point.
generate_cli = cli_batch.serve(
    "trm.generate", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=("trm.core.cli", "trm.core.distributed", "trm.data.io",
             "trm.families.dream.inference",
             "trm.families.dream.cached_sampling"))


def _refusal(server, *flags, timeout=300):
  """What `_cli(*flags)` gives, from `server` (`generate_cli`)."""
  return server.run(flags, cwd=ROOT, timeout=timeout,
                    env=dict(os.environ, JAX_PLATFORMS="cpu"))


def test_cli_cached_decoding_compiles_once_and_prints_both_times(
    checkpoint, generate_cli):
  """Cached decoding from the command line, one chat prompt with a system
  message: one completion, the cache's rule, the compile and generation
  times apart. One run (a fork of `generate_cli`; the real entry point is
  test_cli_generates_for_a_batch's) where two runs checked the cache line
  and the times apart."""
  result = generate_cli.run(
      [f"--checkpoint={checkpoint}", "--prompt=w3 w4", "--max_new_tokens=8",
       "--chat", "--system=w5 w6", "--cache=dual", "--block_length=4",
       "--threshold=0.9"],
      cwd=ROOT, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "dual cache, blocks of 4, threshold 0.9: " in result.stdout
  assert "compile" in result.stdout and "generation" in result.stdout
  assert result.stdout.count("=== ") == 1
  # Orbax's INFO chatter (~30 lines per restore) is filtered as in trm.main.
  assert "Read Metadata" not in result.stderr, result.stderr[-3000:]


@pytest.mark.parametrize("flag, message", [
    ("--temperature=-1", "temperature=-1.0: must be a finite number >= 0"),
    ("--top_p=1.5", "top_p=1.5: must lie in [0, 1]"),
    ("--top_k=-3", "top_k=-3: must be an integer >= 0"),
    ("--steps=-2", "steps=-2: must be an integer >= 1"),
    ("--max_new_tokens=200000", "exceed the model's"),
    ("--threshold=0.9", "threshold=0.9: parallel decoding needs --cache"),
    ("--cache=dual --block_length=3", "block_length=3: must divide "
     "max_new_tokens=256"),
    ("--cache=prefix --threshold=1.5", "threshold=1.5: must lie in (0, 1]"),
    ("--fast_dllm", "fast_dllm: Fast-dLLM's block rules need --cache"),
    ("--cache=dual --fast_dllm --alg=maskgit_plus",
     "alg='maskgit_plus': with fast_dllm, fixed steps rank by entropy"),
])
def test_cli_bad_settings_are_one_line(checkpoint, flag, message,
                                      generate_cli):
  result = _refusal(generate_cli, f"--checkpoint={checkpoint}", "--prompt=w3",
                    *flag.split())
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and message in errors[0], errors


@pytest.mark.parametrize("flag, message", [
    ("--batch_size=0", "batch_size=0: must be >= 1"),
    ("--seed=-1", "seed=-1: must lie in [0, 4294967295]"),
    # Past the host's memory (session 105's audit: refused only once the
    # weights had loaded).
    ("--num_return_sequences=1099511627776",
     "--num_return_sequences=1099511627776: 1099511627776 rows (prompts x "
     "completions) of at least 257 tokens needs"),
    ("--batch_size=1099511627776", "--batch_size=1099511627776: 1 rows "
     "padded to 1099511627776 (whole batches) of at least 257 tokens needs"),
    # Only its mesh and rules were read, without a word.
    ("--config=configs/trm_sudoku.py:cpu", "--config describes a "
     "config.model.name='trm' model; DiffuCoder/Dream checkpoints take a "
     "'dream' config"),
    ("--tokenizer=", "--tokenizer is given but empty: pass a directory "
     "with tokenizer.json or 'bytes'"),
])
def test_cli_batch_size_and_seed_are_checked_before_the_weights(checkpoint,
                                                                flag,
                                                                message,
                                                                generate_cli):
  """Both were refused by DiffusionLM.generate, once the weights had
  loaded (minutes for a 7B checkpoint)."""
  result = _refusal(generate_cli, f"--checkpoint={checkpoint}", "--prompt=w3",
                    flag)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "weights:" not in result.stdout
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and message in errors[0], errors


def test_a_config_of_another_family_is_refused_by_its_registered_package(
    monkeypatch):
  """A TRM or GPT config handed to the Dream tools was read for its mesh
  alone; a name registered for the Dream package itself passes."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  monkeypatch.setitem(families._FAMILIES, "my_dream", "trm.families.dream")  # pylint: disable=protected-access
  config = lambda name: ml_collections.ConfigDict({"model": {"name": name}})
  for name in ("dream", "my_dream"):
    inference.check_config_family(config(name))
  inference.check_config_family(ml_collections.ConfigDict({"seq_len": 8}))
  for name in ("trm", "gpt", "no_such_family"):
    with pytest.raises(ValueError, match=rf"^config describes a config\."
                       rf"model\.name='{name}' model; DiffuCoder/Dream"):
      inference.check_config_family(config(name))


def test_cli_bad_batch_files(checkpoint, tmp_path, generate_cli):
  latin = tmp_path / "latin1.txt"
  latin.write_bytes(b"w1 w2\nw3 \xe9\n")
  result = _refusal(generate_cli, f"--checkpoint={checkpoint}",
                    f"--batch_file={latin}")
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert ("latin1.txt: not UTF-8 text: byte 0xe9 at offset 9 (line 2)"
          in result.stderr)
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n")
  result = _refusal(generate_cli, f"--checkpoint={checkpoint}",
                    f"--batch_file={empty}")
  assert result.returncode == 2 and "holds no prompts" in result.stderr


@pytest.mark.parametrize("edit, message", [
    ("int32", "has dtype I32; weights must be floating point"),
    ("shape", "has shape"),
])
def test_cli_checkpoint_not_matching_its_config_json(checkpoint, tmp_path,
                                                     edit, message,
                                                     generate_cli):
  import json  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  directory = tmp_path / "ckpt"
  shutil.copytree(checkpoint, directory)
  weights = str(directory / "model.safetensors")
  tensors = load_file(weights)
  config = json.loads((directory / "config.json").read_text())
  if edit == "int32":
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(
        np.int32)
  else:
    config["intermediate_size"] = config["intermediate_size"] * 2
  save_file(tensors, weights)
  (directory / "config.json").write_text(json.dumps(config))
  result = _refusal(generate_cli, f"--checkpoint={directory}", "--prompt=w3")
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and message in errors[0], errors


# ------------------------------------------ inputs that parse (issue 25)


def test_a_batch_file_that_is_a_directory_is_named_as_such(tmp_path):
  """--batch_file=<a directory> said there was no such file."""
  with pytest.raises(ValueError, match=f"{tmp_path} is not a regular file "
                     r"\(a directory, FIFO or device\); name a file"):
    generate.read_prompts(None, str(tmp_path))
  with pytest.raises(app.UsageError, match="no such file"):
    generate.read_prompts(None, str(tmp_path / "nothing.txt"))


def test_crlf_batch_file_gives_the_same_prompts_as_lf(tmp_path):
  lf = tmp_path / "lf.txt"
  lf.write_bytes(b"w3 w4 w5\nw9\n\nw1 w2\n")
  crlf = tmp_path / "crlf.txt"
  crlf.write_bytes(b"w3 w4 w5\r\nw9\r\n\r\nw1 w2\r\n")
  bom = tmp_path / "bom.txt"
  bom.write_bytes(b"\xef\xbb\xbfw3 w4 w5\r\nw9\r\n\r\nw1 w2")
  want = ["w3 w4 w5", "w9", "w1 w2"]
  assert generate.read_prompts(None, str(lf)) == want
  assert generate.read_prompts(None, str(crlf)) == want
  assert generate.read_prompts(None, str(bom)) == want
  assert not any("\r" in p for p in generate.read_prompts(None, str(crlf)))


# slow: test_crlf_batch_file_gives_the_same_prompts_as_lf (above) reads a
# CRLF file; test_cli_generates_for_a_batch runs the CLI on a batch file.
@pytest.mark.slow
def test_cli_crlf_batch_file_samples_like_lf(tmp_path, checkpoint):
  outs = []
  for name, data in (("lf.txt", b"w3 w4 w5\nw9\n"),
                     ("crlf.txt", b"w3 w4 w5\r\nw9\r\n")):
    (tmp_path / name).write_bytes(data)
    result = _cli(f"--checkpoint={checkpoint}",
                  f"--batch_file={tmp_path / name}", "--max_new_tokens=4",
                  "--steps=2")
    assert result.returncode == 0, result.stderr[-3000:]
    outs.append([l for l in result.stdout.splitlines()
                 if not l.startswith("device:")])
  assert outs[0] == outs[1] and "=== w9" in outs[1]


def _other_family_workdir(tmp_path, name):
  workdir = tmp_path / f"{name}_run"
  (workdir / "checkpoints").mkdir(parents=True)
  (workdir / "config.json").write_text(
      '{"model": {"name": "%s"}, "seq_len": 64}' % name)
  return str(workdir)


@pytest.mark.parametrize("family, display, command", [
    ("gpt", "GPT", "python -m trm.sample --workdir="),
    ("trm", "TRM (puzzle)", "python -m trm.evaluate --config=CONFIG "
     "--checkpoint="),
])
def test_cli_on_another_familys_workdir_names_it_and_its_command(
    tmp_path, family, display, command, generate_cli):
  workdir = _other_family_workdir(tmp_path, family)
  result = _refusal(generate_cli, f"--checkpoint={workdir}", "--prompt=w3")
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr[-3000:]
  assert f"holds a {display} train state" in errors[0]
  assert f"config.model.name='{family}'" in errors[0]
  assert command + workdir in errors[0]


def test_api_on_another_familys_workdir(tmp_path):
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  workdir = _other_family_workdir(tmp_path, "gpt")
  with pytest.raises(restore_check.CheckpointMismatchError,
                     match="python -m trm.sample"):
    DiffusionLM.from_pretrained(workdir)


@pytest.mark.parametrize("record, needle", [
    ({"model": 5}, "model=5, seq_len=None"),
    ({"model": {"name": "dream"}, "seq_len": "abc"}, "seq_len='abc'")])
def test_api_on_a_workdir_with_a_hand_edited_config_json(tmp_path, record,
                                                         needle):
  """A run's config.json edited by hand: a `model` that is no object gave
  a TypeError's traceback, a seq_len of text int()'s error naming no
  file."""
  import json  # pylint: disable=g-import-not-at-top
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  (tmp_path / "checkpoints" / "1").mkdir(parents=True)
  (tmp_path / "config.json").write_text(json.dumps(record))
  with pytest.raises(ValueError, match=needle) as info:
    DiffusionLM.from_pretrained(str(tmp_path), tokenizer="bytes")
  assert str(info.value).startswith(str(tmp_path / "config.json"))


def _nan_copy(checkpoint, tmp_path, name="model.layers.1.mlp.up_proj.weight",
              value=np.nan):
  import shutil  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  directory = tmp_path / "nan_ckpt"
  shutil.copytree(checkpoint, directory)
  weights = str(directory / "model.safetensors")
  tensors = load_file(weights)
  tensors[name] = tensors[name].copy()
  tensors[name].flat[[3, 5]] = value
  save_file(tensors, weights)
  return str(directory)


@pytest.mark.parametrize("name, value", [
    ("model.layers.1.mlp.up_proj.weight", np.nan),
    ("model.embed_tokens.weight", np.inf)])
def test_nonfinite_safetensors_are_refused_naming_the_tensor(
    checkpoint, tmp_path, name, value):
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  directory = _nan_copy(checkpoint, tmp_path, name, value)
  with pytest.raises(weights_io.CheckpointError) as info:
    DiffusionLM.from_pretrained(directory, dtype="float32")
  message = str(info.value)
  assert "\n" not in message
  assert f"Tensor {name!r}" in message and "2 NaN or Inf" in message
  assert "allow_nonfinite=True" in message
  lm = DiffusionLM.from_pretrained(directory, dtype="float32",
                                   allow_nonfinite=True)
  assert lm.cfg.vocab_size > 0


def test_cli_nonfinite_safetensors_is_one_line(checkpoint, tmp_path,
                                              generate_cli):
  directory = _nan_copy(checkpoint, tmp_path)
  result = _refusal(generate_cli, f"--checkpoint={directory}", "--prompt=w3")
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr[-3000:]
  assert "'model.layers.1.mlp.up_proj.weight'" in errors[0]
  assert "--allow_nonfinite" in errors[0]


# ------------------------------------------- Python API argument types


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(prompts=[1, "w3"]), TypeError, "prompts[0] is a int"),
    (dict(prompts=["w3", None]), TypeError, "prompts[1] is a NoneType"),
    (dict(prompts=b"w3"), TypeError, "prompts is bytes"),
    (dict(prompts=7), TypeError, "prompts is a int"),
    (dict(prompts={"a": "w3"}), TypeError, "prompts is a dict"),
    (dict(batch_size=2.0), TypeError, "batch_size=2.0 is a float"),
    (dict(batch_size=True), TypeError, "batch_size=True is a bool"),
    (dict(batch_size="2"), TypeError, "batch_size='2' is a str"),
    (dict(batch_size=0), ValueError, "batch_size=0: must be >= 1"),
    (dict(seed=1.5), TypeError, "seed=1.5 is a float"),
    (dict(seed=False), TypeError, "seed=False is a bool"),
    (dict(seed="0"), TypeError, "seed='0' is a str"),
    (dict(seed=-1), ValueError, "seed=-1: must lie in [0, 4294967295]"),
    (dict(seed=2**32), ValueError, "seed=4294967296: must lie in"),
    (dict(prompts=["w3", "w4"], batch_size=1, seed=2**32 - 1), ValueError,
     "seed=4294967295: must lie in [0, 4294967294]"),
    (dict(num_return_sequences=2.0), TypeError,
     "num_return_sequences=2.0 is a float"),
    (dict(num_return_sequences=True), TypeError,
     "num_return_sequences=True is a bool"),
    # Two rows of one prompt, one per batch: seeds seed and seed + 1.
    (dict(num_return_sequences=2, batch_size=1, seed=2**32 - 1), ValueError,
     "seed=4294967295: must lie in [0, 4294967294]"),
    # More batches than seeds: the count is named, not an empty seed range.
    (dict(num_return_sequences=2**40, batch_size=1), ValueError,
     "1099511627776 sequences (prompts x num_return_sequences) in batches of "
     "batch_size=1 make 1099511627776 batches, more than the 4294967296 "
     "seeds"),
    (dict(max_new_tokens=True), ValueError, "max_new_tokens=True"),
    (dict(top_k=False), ValueError, "top_k=False"),
    (dict(cache="dual", block_length=True), ValueError,
     "block_length=True: must be an integer >= 1"),
])
def test_api_argument_types_are_one_error_before_any_compute(
    lm, monkeypatch, kwargs, error, message):
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  for name in ("encode", "compile"):
    monkeypatch.setattr(lm, name, lambda *a, n=name, **k: pytest.fail(
        f"{n} ran before the argument check"))
  kwargs = {"prompts": ["w3"], "max_new_tokens": 4, **kwargs}
  with pytest.raises(error) as info:
    lm.generate(kwargs.pop("prompts"), **kwargs)
  assert message in str(info.value) and "\n" not in str(info.value)
  if error is TypeError:  # shown as one line by the command line too
    assert isinstance(info.value, inference.ArgumentTypeError)


def test_num_return_sequences_beyond_host_memory_is_one_line(lm,
                                                            monkeypatch):
  """The prompts' rows repeated num_return_sequences times: numpy's
  MemoryError or OverflowError traceback, now one ValueError naming it."""
  monkeypatch.setattr(lm, "compile", lambda *a, **k: pytest.fail(
      "compiled for rows that cannot exist"))
  for copies in (2**50, 2**62, 2**70):
    with pytest.raises(ValueError, match=rf"^num_return_sequences={copies}: "
                       rf"{copies} rows \(prompts x completions\) of at "
                       r"least \d+ tokens needs [\d,.]+ GiB of this host's "
                       r"memory, more than .*; lower num_return_sequences "
                       r"\(or pass fewer prompts\)\.$"):
      lm.generate("w3", max_new_tokens=4, num_return_sequences=copies)


def test_a_batch_size_beyond_host_memory_is_one_line(lm, monkeypatch):
  """One prompt padded to a batch of batch_size rows: --batch_size=2**31
  was numpy's MemoryError traceback, now one ValueError naming it."""
  monkeypatch.setattr(lm, "compile", lambda *a, **k: pytest.fail(
      "compiled for rows that cannot exist"))
  for size in (2**31, 2**50, 2**62, 2**70):
    with pytest.raises(ValueError, match=rf"^batch_size={size}: 1 rows "
                       rf"padded to {size} \(whole batches\) of at least "
                       r"\d+ tokens needs [\d,.]+ GiB of this host's memory, "
                       r"more than .*; lower batch_size \(1 fills one "
                       r"batch\)\.$"):
      lm.generate("w3", max_new_tokens=4, batch_size=size)


def test_the_row_check_agrees_over_the_processes_the_model_spans(
    monkeypatch):
  """DiffusionLM.generate's row check agreed over every process of the
  job: a model on one host's mesh, generating on that host alone, would
  have waited in the agreement (session 106's review). One agreement for
  both of its checks, over the processes given."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  gathers = []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(multihost_utils, "process_allgather",
                      lambda flag: gathers.append(int(flag)) or np.zeros(2))
  inference.check_rows_fit(3, 2, 4, 16, processes={0})  # this host alone
  assert gathers == []
  inference.check_rows_fit(3, 2, 4, 16)  # padded: still one agreement
  assert gathers == [0]


def test_api_accepts_integer_like_seeds_and_batches(lm):
  # Sampled (temperature 1), so a seed wrapped in seed + n would show;
  # the program num_return_sequences' test below reuses.
  kw = dict(max_new_tokens=4, steps=2, temperature=1.0)
  a = lm.generate(["w3", "w4", "w5", "w6"], batch_size=np.int64(2),
                  seed=np.int32(2**31 - 1), **kw)
  b = lm.generate(("w3", "w4", "w5", "w6"), batch_size=2, seed=2**31 - 1,
                  **kw)
  assert a == b


@pytest.mark.parametrize("cache", [
    {},
    # slow: a second compile (~5 s of CPU); the rows are expanded before
    # either sampler is chosen.
    pytest.param(dict(cache="dual", block_length=4), marks=pytest.mark.slow),
])
def test_num_return_sequences_rows_are_hugging_faces_and_reproducible(lm,
                                                                      cache):
  """Hugging Face's `num_return_sequences` (Dream's `diffusion_generate`
  repeats each prompt with `repeat_interleave`): each prompt's copies
  together, each its own draw (copies share a batch here), the same rows
  again for a fixed seed. Batches of 2 rows at the settings of
  test_api_accepts_integer_like_seeds_and_batches: its program, no
  compile of its own."""
  prompts = ["w3 w4 w5", "w9"]
  spelled = ["w3 w4 w5", "w3 w4 w5", "w9", "w9"]
  kw = dict(max_new_tokens=4, steps=2, temperature=1.0, seed=3,
            batch_size=2, return_tokens=True, **cache)
  two = lm.generate(prompts, num_return_sequences=2, **kw)
  assert len(two.completions) == 4 and two.tokens.shape[0] == 4
  assert lm.timings["new_tokens"] == 16
  np.testing.assert_array_equal(two.tokens, lm.generate(spelled, **kw).tokens)
  assert not np.array_equal(two.tokens[0], two.tokens[1])
  assert not np.array_equal(two.tokens[2], two.tokens[3])
  again = lm.generate(prompts, num_return_sequences=2, **kw)
  np.testing.assert_array_equal(again.tokens, two.tokens)
  assert again.completions == two.completions
  # --num_return_sequences and the seed's range are checked before the
  # weights load, as the API checks them.
  holders = lambda **v: {k: type("Flag", (), {"value": x})()  # noqa: E731
                         for k, x in dict(batch_size=1, seed=2**32 - 2,
                                          **v).items()}
  generate.check_batch_and_seed(holders(num_return_sequences=2), 1)
  with pytest.raises(ValueError, match=r"^num_return_sequences=0: must be"):
    generate.check_batch_and_seed(holders(num_return_sequences=0), 1)
  with pytest.raises(ValueError, match=r"^seed=4294967294: must lie in"):
    generate.check_batch_and_seed(holders(num_return_sequences=3), 1)


def test_steps_zero_is_refused_as_the_api_refuses_it():
  """`--steps=0` used to fall back to one token per step."""
  from trm import generate  # pylint: disable=g-import-not-at-top

  class Flag:
    def __init__(self, value):
      self.value = value

  values = dict(max_new_tokens=16, steps=0, alg="entropy", alg_temp=0.0,
                temperature=0.0, top_p=None, top_k=50, cache=None,
                block_length=32, threshold=None)
  with pytest.raises(ValueError, match="steps"):
    generate.sampler_settings({k: Flag(v) for k, v in values.items()})
  values["steps"] = None
  settings = generate.sampler_settings({k: Flag(v) for k, v in values.items()})
  assert settings["steps"] == 16


def test_an_empty_prompt_is_named():
  """--prompt= said 'Give exactly one of --prompt and --batch_file'."""
  with pytest.raises(app.UsageError, match="--prompt is empty"):
    generate.read_prompts("", None)


def test_non_utf8_prompts_are_one_line_naming_them(generate_cli):
  """A non-UTF-8 byte in --prompt (Python reads it as a lone surrogate) or
  a prompt holding a lone surrogate was a TypeError traceback from the
  tokenizer; --prompt is now refused before any weight is read."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"prompts\[1\] is not UTF-8 text "
                     r"\(byte 0xff at character 2\)"):
    inference.check_prompts(["w1", "w2\udcff"])
  with pytest.raises(ValueError, match="lone surrogate U\\+D800"):
    inference.check_prompts("\ud800")
  # The byte reaches the child as `python -m` decodes argv (os.fsdecode).
  result = generate_cli.run(
      ["--checkpoint=/nonexistent", b"--prompt=w1 \xff"], cwd=ROOT,
      timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [
      "trm.generate: error: --prompt is not UTF-8 text (byte 0xff at "
      "character 3); pass UTF-8 text."]


# ------------------------------------------- prompt buckets, HF spellings


@pytest.fixture(scope="module")
def confident_lm(lm):
  """The tiny model with logits 30x as large. Greedy sampling orders the
  positions by confidence; the random model's near-uniform distributions
  put several positions' entropies within a few float32 ulps (6.22672 +-
  2e-6 on one CPU), so any change in rounding, such as a longer padded
  row's reduction order, may reorder them. `lm`'s weights, the final
  norm's scale times 30 (what make_tiny_checkpoint's logit_scale=30
  writes), on its mesh: no second checkpoint to write and read."""
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top

  def scaled(path, x):
    final_norm = jax.tree_util.keystr(path).startswith("['norm']['scale']")
    return x * 30.0 if final_norm else x

  params = jax.tree_util.tree_map_with_path(scaled, lm.params)
  assert not all(a is b for a, b in zip(jax.tree.leaves(params),
                                        jax.tree.leaves(lm.params)))
  return DiffusionLM(lm.cfg, params, lm.tokenizer, mesh=lm.mesh,
                     rules=lm.rules, max_positions=lm.max_positions,
                     source=lm.source)


def test_prompt_buckets_give_the_unbucketed_outputs(confident_lm):
  """Bucketed prompts (left-padded to a multiple of 64, the padding masked
  and cut off again) give the tokens, history and completions of the
  unbucketed batch, for a batch and for a single prompt."""
  lm = confident_lm
  prompts = ["w3 w4 w5", "w9", "w7 w8 w1 w2 w6"]
  # A batch greedily, one prompt sampled (the draws are shaped by the canvas).
  for batch, kw in ((prompts, dict()),
                    (prompts[:1], dict(temperature=0.7, top_p=0.9))):
    plain = lm.generate(batch, max_new_tokens=8, steps=8, prompt_bucket=1,
                        return_history=True, **kw)
    bucketed = lm.generate(batch, max_new_tokens=8, steps=8,
                           return_history=True, **kw)
    assert bucketed.prompt_len == plain.prompt_len
    np.testing.assert_array_equal(bucketed.tokens, plain.tokens)
    np.testing.assert_array_equal(bucketed.history, plain.history)
    assert bucketed.completions == plain.completions


def test_prompt_lengths_in_one_bucket_share_a_program(lm):
  kw = dict(max_new_tokens=5, steps=5)  # a setting no other test compiles
  lm.generate("w1 w2", **kw)
  assert lm.timings["compile_seconds"] > 0
  lm.generate("w1 w2 w3 w4 w5 w6 w7", **kw)
  assert lm.timings["compile_seconds"] == 0.0  # same 64-token bucket
  lm.generate(" ".join(["w1"] * 64), **kw)  # fills it: no padding at all
  assert lm.timings["compile_seconds"] == 0.0
  lm.generate("w1 w2 w3", prompt_bucket=1, **kw)
  assert lm.timings["compile_seconds"] > 0  # its own width
  with pytest.raises(ValueError, match=r"prompt_bucket=0: must be an "
                     r"integer >= 1"):
    lm.generate("w1", prompt_bucket=0, **kw)


def test_a_program_compiled_ahead_is_the_one_generate_runs(lm):
  """`compile` keyed its program by the settings as given, so one built
  ahead with generate's defaults left out was compiled again by
  `generate`; and it compiled unchecked settings (temperature=-1)."""
  lm.compile(2, 64, padded=True, max_new_tokens=7)  # no other test's setting
  lm.generate(["w1 w2", "w3"], max_new_tokens=7)
  assert lm.timings["compile_seconds"] == 0.0
  with pytest.raises(ValueError, match=r"^temperature=-1: must be a finite"):
    lm.compile(2, 64, padded=True, max_new_tokens=7, temperature=-1)


def test_hugging_face_spellings_return_sequences_and_history(lm):
  prompts = ["w3 w4 w5", "w9"]
  kw = dict(max_new_tokens=6, steps=3)
  ours = lm.generate(prompts, return_history=True, **kw)
  hf = lm.generate(prompts, return_dict_in_generate=True, output_history=True,
                   **kw)
  np.testing.assert_array_equal(hf.sequences, ours.tokens)
  np.testing.assert_array_equal(hf.history, ours.history)
  # As DreamModelOutput.history: x after each step, the last one final.
  assert hf.history.shape == (3, 2, hf.prompt_len + 6)
  np.testing.assert_array_equal(hf.history[-1], hf.sequences)
  assert (hf.history[0] == lm.cfg.mask_token_id).sum() > (
      hf.history[-1] == lm.cfg.mask_token_id).sum()
  plain = lm.generate(prompts, return_dict_in_generate=True, **kw)
  assert plain.history is None
  np.testing.assert_array_equal(plain.sequences, ours.tokens)
  assert lm.generate(prompts, **kw) == ours.completions


# ------------------------------------- from_pretrained: paths, Hub ids, names


def test_from_pretrained_tells_paths_from_hub_ids(tmp_path, monkeypatch):
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  missing = str(tmp_path / "no" / "such" / "dir")
  with pytest.raises(FileNotFoundError) as info:
    DiffusionLM.from_pretrained(missing)
  message = str(info.value)
  assert message.startswith(f"path={missing}: no such directory (and not "
                            "a Hugging Face Hub id") and "\n" not in message
  afile = tmp_path / "weights.bin"
  afile.write_text("x")
  with pytest.raises(NotADirectoryError, match=r"path=.*weights.bin: is a "
                     "file"):
    DiffusionLM.from_pretrained(str(afile))
  # A gs:// workdir (trm.generate and trm.evaluate --benchmark) was "no
  # such directory", which did not say what to do.
  with pytest.raises(ValueError, match=r"path='gs://b/run' is an "
                     "object-store path;.* gcloud storage cp -r gs://b/run "
                     "DIR"):
    DiffusionLM.from_pretrained("gs://b/run")
  # 'org/name' goes to the Hub; offline, one line names the argument and
  # how to download it elsewhere.
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(FileNotFoundError) as info:
    DiffusionLM.from_pretrained("nobody-trm-test/no-such-model")
  message = str(info.value)
  assert "\n" not in message
  assert "could not download nobody-trm-test/no-such-model" in message
  assert ("huggingface-cli download nobody-trm-test/no-such-model "
          "--local-dir DIR) and pass path=DIR") in message


def test_a_hub_id_downloads_its_weights_after_the_checks_at_one_commit(
    checkpoint, tmp_path, monkeypatch):
  """A Hub id's weights (gigabytes) were downloaded before the request's
  checks ran. Now its config and tokenizer come first, the checks and
  before_weights run, then the weights of the commit those files came
  from (a branch moved in between must not pair them with other weights).
  The Hub is a fake: a cache that a download fills with what was asked."""
  from trm import DiffusionLM  # pylint: disable=g-import-not-at-top
  from trm.core import hub  # pylint: disable=g-import-not-at-top
  commit = "0123456789abcdef0123456789abcdef01234567"
  snapshot = tmp_path / "models--org--tiny" / "snapshots" / commit
  snapshot.mkdir(parents=True)
  calls = []

  def fake_snapshot(repo_id, *, allow_patterns=None, revision=None,
                    **unused):
    calls.append((repo_id, "*.safetensors" in allow_patterns, revision))
    for name in os.listdir(checkpoint):
      weights = name.endswith(".safetensors")
      if weights <= ("*.safetensors" in allow_patterns):
        if not (snapshot / name).exists():
          os.symlink(os.path.join(checkpoint, name), snapshot / name)
    return str(snapshot)

  def before_weights(tok, cfg, positions):
    del tok, cfg, positions
    calls.append("checks")
    assert not [n for n in os.listdir(snapshot) if n.endswith(
        ".safetensors")], "weights were downloaded before the checks"

  monkeypatch.setattr(hub, "snapshot", fake_snapshot)
  lm = DiffusionLM.from_pretrained("org/tiny", before_weights=before_weights)
  assert calls == [("org/tiny", False, None), "checks",
                   ("org/tiny", True, commit)]
  assert lm.source == str(snapshot)
  # A refusal in the checks downloads no weight.
  calls.clear()
  for name in os.listdir(snapshot):
    if name.endswith(".safetensors"):
      os.remove(snapshot / name)

  def refuse(*unused):
    calls.append("checks")
    raise ValueError("refused")

  with pytest.raises(ValueError, match="^refused$"):
    DiffusionLM.from_pretrained("org/tiny", before_weights=refuse)
  assert calls == [("org/tiny", False, None), "checks"]


def test_a_hugging_face_cache_folder_reads_its_snapshot(checkpoint,
                                                        tmp_path):
  """HF_HOME/hub/models--org--name (refs/ and snapshots/, the files as
  links into blobs/) was read as a checkpoint: "holds no tokenizer.json:
  pass tokenizer=...". Its snapshot of refs/main (or of `revision`) is
  read instead; a revision it lacks is named with the snapshots held."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  repo_dir = tmp_path / "hub" / "models--org--tiny"
  commit = "0123456789abcdef0123456789abcdef01234567"
  snapshot = repo_dir / "snapshots" / commit
  snapshot.mkdir(parents=True)
  (repo_dir / "blobs").mkdir()
  (repo_dir / "refs").mkdir()
  (repo_dir / "refs" / "main").write_text(commit)
  for name in os.listdir(checkpoint):
    os.symlink(os.path.join(checkpoint, name), repo_dir / "blobs" / name)
    os.symlink(os.path.join("..", "..", "blobs", name), snapshot / name)
  assert inference.resolve_checkpoint(str(repo_dir)) == str(snapshot)
  assert inference.resolve_checkpoint(str(repo_dir),
                                      revision=commit) == str(snapshot)
  assert inference.resolve_checkpoint(str(snapshot)) == str(snapshot)
  with pytest.raises(FileNotFoundError) as info:
    inference.resolve_checkpoint(str(repo_dir), revision="v2")
  assert str(info.value) == (
      f"path={repo_dir} is a Hugging Face cache folder with no snapshot of "
      f"revision 'v2' (snapshots: {commit}); pass path={repo_dir}/snapshots/"
      "<commit> or its Hub id ('org/name').")


@pytest.mark.parametrize("ref", ["fifo", "", "../../..", "a/b"])
def test_a_cache_folders_ref_that_names_no_snapshot_is_refused(tmp_path,
                                                               ref):
  """refs/main as a FIFO hung the reader for ever (its open waited for a
  writer); an empty ref resolved to the snapshots folder itself, and one
  with a path in it to a folder outside snapshots/."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  repo_dir = tmp_path / "models--org--tiny"
  (repo_dir / "snapshots" / "0123").mkdir(parents=True)
  (repo_dir / "refs").mkdir()
  main = repo_dir / "refs" / "main"
  if ref == "fifo":
    os.mkfifo(main)
  else:
    main.write_text(ref + "\n")
  with pytest.raises(FileNotFoundError) as info:
    inference.resolve_checkpoint(str(repo_dir))
  if ref == "fifo":  # read as no ref: 'main' is then a snapshot's name
    start = (f"path={repo_dir} is a Hugging Face cache folder with no "
             "snapshot of revision 'main' (snapshots: 0123); pass")
  else:
    start = (f"path={repo_dir} is a Hugging Face cache folder whose {main} "
             f"names no snapshot ({ref!r}); pass")
  assert str(info.value).startswith(start), info.value


def test_api_errors_name_arguments_and_the_cli_names_flags(checkpoint,
                                                           tmp_path):
  """The same check words its message for the caller: `path=`/`tokenizer=`
  from Python, `--checkpoint=`/`--tokenizer=` from the command line."""
  import shutil  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  bare = tmp_path / "no_tokenizer"
  shutil.copytree(checkpoint, bare)
  (bare / "tokenizer.json").unlink()
  with pytest.raises(FileNotFoundError) as info:
    inference.DiffusionLM.from_pretrained(str(bare))
  api = str(info.value)
  assert api.startswith(f"path={bare} holds no tokenizer.json: pass "
                        "tokenizer=<a directory")
  assert "tokenizer=bytes" in api and "--" not in api
  with pytest.raises(FileNotFoundError) as info:
    inference.DiffusionLM.from_pretrained(str(bare),
                                          names=inference.CLI_NAMES)
  assert str(info.value).startswith(f"--checkpoint={bare} holds no "
                                    "tokenizer.json: pass --tokenizer=<a")
  with pytest.raises(FileNotFoundError, match=r"^path=\S+: no such"):
    inference.DiffusionLM.from_pretrained(str(tmp_path / "gone"))
  with pytest.raises(FileNotFoundError, match=r"^--checkpoint=\S+: no such"):
    inference.DiffusionLM.from_pretrained(str(tmp_path / "gone"),
                                          names=inference.CLI_NAMES)



def test_api_checkpoint_step_errors_name_checkpoint_step(tmp_path,
                                                         checkpoint):
  """`DiffusionLM.from_pretrained(checkpoint_step=...)` answered with the
  tools' flag ("--step=5: ...", "Pass --step=latest", "e.g. --step=2000"),
  which a Python caller never passed; the tools still say --step."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  for step in (10, 20):  # steps without a held-out loss: 'best' ranks none
    os.makedirs(tmp_path / "checkpoints" / str(step))
  (tmp_path / "config.json").write_text(_tiny_config().to_json())
  workdir = str(tmp_path)
  messages = {}
  for step, error, start in (
      (5, FileNotFoundError, "checkpoint_step=5: "),
      ("best", ckpt_lib.CheckpointError, "checkpoint_step='best': no "
       "checkpoint of"),
      ("x", ValueError, "checkpoint_step='x': 'x' is none of latest, best "
       "or a step number (e.g. checkpoint_step=2000).")):
    with pytest.raises(error) as info:
      inference.DiffusionLM.from_pretrained(workdir, checkpoint_step=step)
    message = messages[step] = str(info.value)
    assert message.startswith(start) and "--" not in message, message
    assert "\n" not in message
  assert ("Pass checkpoint_step='latest' or checkpoint_step=<one of"
          in messages["best"])
  with pytest.raises(FileNotFoundError, match=r"^--step=5: .* best or "
                     r"latest\.$"):
    inference.DiffusionLM.from_pretrained(workdir, checkpoint_step=5,
                                          names=inference.CLI_NAMES)
  # Hugging Face weights: the value is parsed as for a workdir ('Latest'
  # was refused there, 'x' said it chooses among a workdir's steps).
  with pytest.raises(ValueError, match=r"^checkpoint_step='x': 'x' is none "
                     "of latest, best"):
    inference.DiffusionLM.from_pretrained(checkpoint, checkpoint_step="x")
  assert inference.DiffusionLM.from_pretrained(
      checkpoint, checkpoint_step="Latest").source == checkpoint

def test_a_workdirs_tokenizer_without_tokenizer_json_names_that_argument(
    tmp_path):
  """trm.generate --checkpoint=WORKDIR --tokenizer=DIR (DIR without
  tokenizer.json) said 'point --checkpoint at a DiffuCoder/Dream
  directory'; the fix is another --tokenizer."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  os.makedirs(tmp_path / "run" / "checkpoints" / "3")
  os.makedirs(tmp_path / "empty")
  (tmp_path / "run" / "config.json").write_text(_tiny_config().to_json())
  for names, spelled in ((inference.API_NAMES, "tokenizer"),
                         (inference.CLI_NAMES, "--tokenizer")):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json not found: "
                       rf"point {spelled} at a DiffuCoder/Dream directory"):
      inference.DiffusionLM.from_pretrained(
          str(tmp_path / "run"), tokenizer=str(tmp_path / "empty"),
          names=names)


def test_a_run_without_a_tokenizer_names_the_argument_to_pass(tmp_path):
  """A run that read no tokenizer (data.source='synthetic'): the error
  said 'pass tokenizer=.' to trm.generate too, whose flag is
  --tokenizer."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  os.makedirs(tmp_path / "checkpoints" / "3")
  config = config_lib.set_values(_tiny_config(), {
      "data.source": "synthetic", "data.tokenizer": "",
      "init_checkpoint": ""})
  (tmp_path / "config.json").write_text(config.to_json())
  for names, spelled in ((inference.API_NAMES, "tokenizer="),
                         (inference.CLI_NAMES, "--tokenizer=")):
    with pytest.raises(ValueError, match=r"names no tokenizer \(data\."
                       rf"tokenizer, init_checkpoint\); pass {spelled}<a "
                       "directory with tokenizer.json, or 'bytes'>"):
      inference.DiffusionLM.from_pretrained(str(tmp_path), names=names)


def test_dir_of_trm_lists_diffusion_lm():
  """Tab completion (`trm.<TAB>`, dir(trm)) did not offer DiffusionLM,
  which module __getattr__ gives."""
  import trm  # pylint: disable=g-import-not-at-top
  assert "DiffusionLM" in dir(trm)


def test_from_trm_import_starts_no_libtpu_on_a_cpu_host():
  """`from trm import DiffusionLM` then jax: no libtpu E0000 lines (with
  libtpu installed, jax would start it on a host without a TPU)."""
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  import glob  # pylint: disable=g-import-not-at-top
  if any(glob.glob(p) for p in cli.ACCELERATOR_FILES):
    pytest.skip("this host has an accelerator")
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_PLATFORMS", "JAX_FORCE_TPU_INIT")}
  result = subprocess.run(
      [sys.executable, "-c", "from trm import DiffusionLM\nimport jax\n"
       "print(jax.devices()[0].platform)"], cwd=ROOT, capture_output=True,
      text=True, timeout=120, env=env)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip() == "cpu"
  assert "E0000" not in result.stderr and "TPU_WORKER" not in result.stderr
