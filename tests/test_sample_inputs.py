"""trm.sample with inputs that are wrong but parse (issue 25): weights
holding NaN or Inf, a --start file with CRLF line ends, a workdir of
another model family."""
import json
import os
import subprocess
import sys

import numpy as np
import cli_batch
import pytest
import repo
from safetensors.numpy import load_file, save_file

from trm import sample
from trm.core import weights_io
from trm.data.text import preparation

ROOT = repo.ROOT


def write_tiny_gpt2(directory, vocab=64, positions=16, width=32, layers=2,
                    heads=4) -> str:
  """A random GPT-2 in the Hugging Face layout (Conv1D [in, out] weights,
  tied head), written without transformers."""
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(0)
  d = width
  t = {"wte.weight": rng.normal(0, .02, (vocab, d)),
       "wpe.weight": rng.normal(0, .02, (positions, d)),
       "ln_f.weight": np.ones(d), "ln_f.bias": np.zeros(d)}
  for i in range(layers):
    p = f"h.{i}."
    t.update({
        p + "ln_1.weight": np.ones(d), p + "ln_1.bias": np.zeros(d),
        p + "ln_2.weight": np.ones(d), p + "ln_2.bias": np.zeros(d),
        p + "attn.c_attn.weight": rng.normal(0, .02, (d, 3 * d)),
        p + "attn.c_attn.bias": np.zeros(3 * d),
        p + "attn.c_proj.weight": rng.normal(0, .02, (d, d)),
        p + "attn.c_proj.bias": np.zeros(d),
        p + "mlp.c_fc.weight": rng.normal(0, .02, (d, 4 * d)),
        p + "mlp.c_fc.bias": np.zeros(4 * d),
        p + "mlp.c_proj.weight": rng.normal(0, .02, (4 * d, d)),
        p + "mlp.c_proj.bias": np.zeros(d)})
  save_file({k: v.astype(np.float32) for k, v in t.items()},
            os.path.join(directory, "model.safetensors"))
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({"vocab_size": vocab, "n_positions": positions,
               "n_layer": layers, "n_head": heads, "n_embd": width,
               "activation_function": "gelu"}, f)
  return str(directory)


# `python -m trm.sample` forked from one process that has imported what it
# imports (tests/cli_batch.py): a start-up of jax and the GPT family per
# run less. tests/families/gpt/test_gpt_task.py's `samples` runs the real
# entry point.
sample_cli = cli_batch.serve(
    "trm.sample", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=("trm.core.cli", "trm.core.config_lib", "trm.core.distributed",
             "trm.core.config_record", "trm.core.mesh", "trm.core.weights_io",
             "trm.data.io", "trm.data.text.preparation",
             "trm.data.text.text_codecs", "trm.families.gpt.gpt_import",
             "trm.families.gpt.model", "trm.families.gpt.task",
             "trm.nn.platform"))


def _sample(server, *flags):
  """`python -m trm.sample *flags`'s result (`server`: `sample_cli`)."""
  return server.run(flags, cwd=ROOT, timeout=300,
                    env=dict(os.environ, JAX_PLATFORMS="cpu"))


@pytest.fixture(name="gpt2_nan")
def _gpt2_nan(tmp_path):
  directory = write_tiny_gpt2(tmp_path / "gpt2")
  path = os.path.join(directory, "model.safetensors")
  tensors = load_file(path)
  tensors["h.1.mlp.c_fc.weight"][0, :3] = [np.nan, np.inf, -np.inf]
  save_file(tensors, path)
  data = tmp_path / "data"
  preparation.prepare_char("to be or not to be, that is the question\n" * 4,
                           str(data))
  return directory, str(data)


def test_nonfinite_weights_are_one_line_naming_the_tensor(gpt2_nan, sample_cli):
  directory, data = gpt2_nan
  flags = ("--init_from=gpt2", f"--checkpoint={directory}",
           f"--data_dir={data}", "--num_samples=1", "--max_new_tokens=2",
           "--start=to")
  result = _sample(sample_cli, *flags)
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr[-3000:]
  assert "h_1/mlp/c_fc" in errors[0] and "3 NaN or Inf" in errors[0]
  assert "--allow_nonfinite" in errors[0]
  allowed = _sample(sample_cli, *flags, "--allow_nonfinite")
  assert allowed.returncode == 0, allowed.stderr[-3000:]


def test_check_finite_names_the_tensor():
  tree = {"wte": {"embedding": np.zeros((4, 2), np.float32)},
          "h_0": {"attn": {"kernel": np.array([[1.0, np.nan]])}},
          "ids": np.array([1, 2], np.int32)}
  with pytest.raises(weights_io.CheckpointError,
                     match=r"'h_0/attn/kernel' in W holds 1 NaN"):
    sample.check_finite(tree, "W")
  tree["h_0"]["attn"]["kernel"][0, 1] = 0
  sample.check_finite(tree, "W")


def test_start_file_with_crlf_reads_as_lf(tmp_path):
  lf, crlf = tmp_path / "lf.txt", tmp_path / "crlf.txt"
  lf.write_bytes(b"ROMEO:\nBut soft!\n")
  crlf.write_bytes(b"\xef\xbb\xbfROMEO:\r\nBut soft!\r\n")
  assert sample.read_start(f"FILE:{crlf}") == sample.read_start(f"FILE:{lf}")
  assert sample.read_start(f"FILE:{lf}") == "ROMEO:\nBut soft!\n"


def test_a_start_file_that_is_a_directory_is_named_as_such(tmp_path):
  """--start=FILE:<a directory> said the directory did not exist."""
  with pytest.raises(ValueError, match=f"{tmp_path} is not a regular file "
                     r"\(a directory, FIFO or device\); name a file"):
    sample.read_start(f"FILE:{tmp_path}")
  with pytest.raises(FileNotFoundError, match="nothing.txt does not exist"):
    sample.read_start(f"FILE:{tmp_path}/nothing.txt")


@pytest.mark.parametrize("family, command", [
    ("dream", "python -m trm.generate --checkpoint="),
    ("trm", "python -m trm.evaluate --config=CONFIG --checkpoint=")])
def test_workdir_of_another_family_names_its_command(tmp_path, family,
                                                     command):
  (tmp_path / "config.json").write_text(
      json.dumps({"model": {"name": family}}))
  with pytest.raises(ValueError) as info:
    sample.run_config(str(tmp_path))
  message = str(info.value)
  assert f"config.model.name='{family}'" in message
  assert command + str(tmp_path) in message and "\n" not in message


@pytest.mark.parametrize("text, needle", [
    ("[1]", "holds a JSON list, not a config record"),
    ('{"model": "gpt"}', "its 'model' is 'gpt', not the config.model object"),
    ('{"model": {"name": "gpt"', "is not valid JSON"),
    (b'{"model": {"name": "g\xffpt"}}', "is not UTF-8 text")])
def test_a_hand_edited_config_json_is_one_line_naming_it(tmp_path, text,
                                                          needle):
  """A workdir's config.json that is not the object trm.main records gave
  an AttributeError's traceback (or, damaged, JSON's error without the
  file's name)."""
  path = tmp_path / "config.json"
  if isinstance(text, bytes):
    path.write_bytes(text)
  else:
    path.write_text(text)
  with pytest.raises(ValueError, match=needle) as info:
    sample.run_config(str(tmp_path))
  assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("attention, platform, used", [
    ("cudnn", "cuda", "cudnn"), ("cudnn", "gpu", "cudnn"),
    ("cudnn", "cpu", "dot"), ("cudnn", "tpu", "dot"),
    ("splash", "tpu", "splash"), ("splash", "cuda", "dot"),
    ("splash_interpret", "cpu", "dot"), ("dot", "tpu", "dot")])
def test_a_run_samples_with_its_kernel_where_that_kernel_runs(
    attention, platform, used):
  assert sample.attention_here(attention, platform) == used


@pytest.mark.parametrize("flag, message", [
    ("--temperature=nan", "--temperature=nan: must be a finite number >= 0"),
    ("--top_k=-1", "--top_k=-1: must be >= 0")])
def test_bad_sampling_flags_are_one_line_before_the_weights(tmp_path, flag,
                                                            message,
                                                            sample_cli):
  """NaN passed `< 0` and sampled token 0 at every step (exit 0)."""
  directory = write_tiny_gpt2(tmp_path / "gpt2")
  result = _sample(sample_cli, "--init_from=gpt2", f"--checkpoint={directory}",
                   "--num_samples=1", "--max_new_tokens=2", "--start=a",
                   flag)
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]
  assert "weights:" not in result.stderr


@pytest.mark.parametrize("seed", [2**63, -2**63 - 1, 10**20])
def test_a_seed_past_64_bits_is_one_line_before_the_weights(tmp_path, seed):
  """jax.random.key takes an int64: --seed=10**20 ended the run after the
  weights were read with numpy's OverflowError traceback."""
  from absl import app  # pylint: disable=g-import-not-at-top
  with pytest.raises(app.UsageError, match=f"--seed={seed}: must fit in 64 "
                     "bits"):
    # No weights at --checkpoint: reading them would be another error.
    _samples_of(None, "--init_from=gpt2", f"--checkpoint={tmp_path}",
                f"--seed={seed}")


def test_an_empty_tokenizer_is_one_line_before_the_weights(tmp_path):
  """--tokenizer= was taken as unset (tiktoken's download, offline an
  error about a flag that was given)."""
  from absl import app  # pylint: disable=g-import-not-at-top
  with pytest.raises(app.UsageError, match="^--tokenizer is given but "
                     "empty: pass GPT-2's tokenizer.json"):
    _samples_of(None, "--init_from=gpt2", f"--checkpoint={tmp_path}",
                "--tokenizer=")


def test_generate_refuses_a_nan_temperature():
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  cfg = gpt.GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4,
                      vocab_size=8)
  with pytest.raises(ValueError, match="temperature=nan must be a finite"):
    gpt.generate(gpt.GPT(cfg), {}, np.zeros((1, 1), np.int32), 2, None,
                 temperature=float("nan"))


def test_a_prompt_outside_the_models_vocabulary_is_one_line(tmp_path,
                                                            sample_cli):
  """A tokenizer larger than the model (here meta.json's 16 characters for
  a 10-token GPT-2) gave prompt ids past the embedding table: JAX's gather
  filled them with NaN and trm.sample printed token 0 for every position,
  with exit 0. Now one line names the ids and --data_dir."""
  directory = write_tiny_gpt2(tmp_path / "gpt2", vocab=10)
  data = tmp_path / "data"
  preparation.prepare_char("abcdefghijklmno\n" * 4, str(data))
  result = _sample(sample_cli, "--init_from=gpt2", f"--checkpoint={directory}",
                   f"--data_dir={data}", "--num_samples=1",
                   "--max_new_tokens=2", "--start=no", "--temperature=0")
  assert result.returncode == 2, result.stderr[-3000:]
  assert "Traceback" not in result.stderr
  assert ("--start encodes to token id 15, but the model's vocabulary has "
          "10 ids") in result.stderr
  assert f"the meta.json of {data}, with 16 ids" in result.stderr


class _Encoded(Exception):
  """Stops trm.sample once --start is encoded, carrying the ids."""


def test_start_endoftext_is_gpt2s_end_of_text_token(tmp_path, monkeypatch):
  """nanoGPT's sample.py encodes --start with GPT-2's BPE and
  allowed_special={"<|endoftext|>"}, so --start="<|endoftext|>" (its
  suggestion for unconditional samples) is the one end-of-text token.
  trm.sample used encode_ordinary, data preparation's: ordinary tokens of
  its characters, another prompt. (tiktoken's files need the
  network, so the stand-in encoding of test_text_data takes its place.)"""
  import tiktoken  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from test_text_data import gpt2_standin_encoding  # pylint: disable=g-import-not-at-top
  encoding = gpt2_standin_encoding()
  eot = encoding.eot_token
  monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)

  def encoded(prompt, *args):
    raise _Encoded(np.asarray(prompt)[0].tolist())

  monkeypatch.setattr(sample, "check_prompt_ids", encoded)
  directory = write_tiny_gpt2(tmp_path / "gpt2", vocab=encoding.n_vocab)
  for start, want in [("<|endoftext|>", [eot]),
                      ("speak<|endoftext|>", encoding.encode_ordinary(
                          "speak") + [eot])]:
    with flagsaver.flagsaver():
      flags.FLAGS(["trm.sample", "--init_from=gpt2",
                   f"--checkpoint={directory}", f"--start={start}",
                   "--num_samples=1", "--max_new_tokens=2"])
      with pytest.raises(_Encoded) as ids:
        sample.main(["trm.sample"])
    assert ids.value.args[0] == want, start


@pytest.mark.parametrize("name, text, needle", [
    ("meta.json", {"vocab_size": 15, "tokenizer": "char"},
     "meta.json: tokenizer='char' needs itos"),
    ("meta.json", {"vocab_size": 15, "tokenizer": "char", "itos": {"0": 5}},
     "meta.json: tokenizer='char' needs itos"),
    ("meta.json", {"vocab_size": 15, "tokenizer": 5},
     "meta.json: tokenizer=5 must be"),
    ("metadata.json", [1], "metadata.json holds a JSON list"),
    ("metadata.json", '{"tokenizer": ', "metadata.json is not valid JSON"),
    ("metadata.json", {"tokenizer": "char", "itos": None},
     "metadata.json: tokenizer='char' needs itos")])
def test_a_hand_edited_vocabulary_file_is_one_line_naming_it(tmp_path, name,
                                                             text, needle):
  """A --data_dir whose meta.json (or TFDS metadata.json) holds no usable
  vocabulary gave a KeyError's, TypeError's or AttributeError's traceback
  (JSON's error without the file's name, for a damaged metadata.json), or
  sampled, its ids then failing to decode."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  directory = write_tiny_gpt2(tmp_path / "gpt2")
  data = tmp_path / "data"
  if name == "meta.json":
    preparation.prepare_char("to be or not\n" * 8, str(data))
    counts = json.loads((data / name).read_text())
    text = {**text, **{k: counts[k] for k in ("train_tokens", "val_tokens")}}
  else:
    data.mkdir()
  (data / name).write_text(text if isinstance(text, str) else
                           json.dumps(text))
  with flagsaver.flagsaver():
    flags.FLAGS(["trm.sample", "--init_from=gpt2",
                 f"--checkpoint={directory}", f"--data_dir={data}",
                 "--start=to", "--num_samples=1", "--max_new_tokens=2"])
    with pytest.raises(ValueError, match=needle) as info:
      sample.main(["trm.sample"])
  assert str(data / name) in str(info.value)


class _RunsCode:
  """Unpickling it would call print: a meta.pkl that runs code."""

  def __reduce__(self):
    return (print, ("code ran",))


def test_nanogpts_meta_pkl_is_read_as_its_sample_py_reads_it(tmp_path,
                                                             sample_cli):
  """nanoGPT's char-level data directory holds meta.pkl, not meta.json:
  --data_dir named it as 'not a prepared text data set', and a ckpt.pt's
  own data/<dataset> fell back to GPT-2's BPE (whose ids the model does
  not have; offline, an error naming a --tokenizer flag trm.sample lacks).
  Its characters now sample as the meta.json of the same text does; a
  pickle holding anything but plain data is refused unrun."""
  import pickle  # pylint: disable=g-import-not-at-top
  directory = write_tiny_gpt2(tmp_path / "gpt2", vocab=64)
  text = "to be or not to be, that is the question\n" * 4
  prepared = tmp_path / "prepared"
  preparation.prepare_char(text, str(prepared))
  chars = sorted(set(text))  # nanoGPT's shakespeare_char/prepare.py
  nanogpt = tmp_path / "nanogpt"
  nanogpt.mkdir()
  with open(nanogpt / "meta.pkl", "wb") as f:
    pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)),
                 "stoi": {c: i for i, c in enumerate(chars)}}, f)
  flags = ("--init_from=gpt2", f"--checkpoint={directory}", "--start=to be",
           "--num_samples=1", "--max_new_tokens=6", "--temperature=0")
  want = _sample(sample_cli, *flags, f"--data_dir={prepared}")
  got = _sample(sample_cli, *flags, f"--data_dir={nanogpt}")
  assert got.returncode == 0, got.stderr[-3000:]
  assert got.stdout == want.stdout and got.stdout.startswith("to be")
  with open(nanogpt / "meta.pkl", "wb") as f:
    pickle.dump({"itos": _RunsCode()}, f)
  bad = _sample(sample_cli, *flags, f"--data_dir={nanogpt}")
  assert bad.returncode == 2, bad.stderr[-3000:]
  assert "code ran" not in bad.stdout + bad.stderr
  errors = [l for l in bad.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and (
      f"{nanogpt}/meta.pkl cannot be read as plain data (it names "
      "builtins.print)") in errors[0], bad.stderr[-3000:]


def test_a_gpt2_download_samples_with_its_own_tokenizer_json(tmp_path,
                                                             sample_cli):
  """--init_from=gpt2 without a meta.json took GPT-2's BPE from tiktoken,
  which downloads its files: offline, every GPT-2 download failed with a
  hint naming a --tokenizer flag trm.sample does not have, though the
  download holds tokenizer.json (here a tiny one: 'a'..'z' are 1..26)."""
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  directory = write_tiny_gpt2(tmp_path / "gpt2", vocab=64)
  vocab = {chr(ord("a") + i): i + 1 for i in range(26)}
  tokenizer = Tokenizer(models.WordLevel(dict(vocab, **{"?": 0}),
                                         unk_token="?"))
  tokenizer.save(os.path.join(directory, "tokenizer.json"))
  result = _sample(sample_cli, "--init_from=gpt2", f"--checkpoint={directory}",
                   "--start=a", "--num_samples=1", "--max_new_tokens=3",
                   "--temperature=0")
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"using {directory}/tokenizer.json" in result.stderr
  assert result.stdout.startswith("a")


def test_start_endoftext_through_a_tokenizer_json_is_its_special_token(
    tmp_path):
  """Data preparation reads special-token text in a corpus as text (as
  tiktoken's encode_ordinary); --start="<|endoftext|>" through a GPT-2
  download's tokenizer.json is still the end-of-text token, as nanoGPT's
  sample.py encodes it (allowed_special), not its characters."""
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  from trm.data.text import text_codecs  # pylint: disable=g-import-not-at-top
  vocab = {ch: i for i, ch in enumerate("<|endoftx>")}
  tokenizer = Tokenizer(models.WordLevel(dict(vocab, **{"?": 10}),
                                         unk_token="?"))
  tokenizer.add_special_tokens(["<|endoftext|>"])
  path = str(tmp_path / "tokenizer.json")
  tokenizer.save(path)
  codec = text_codecs.HFTokenizerCodec(path)
  eot = tokenizer.token_to_id("<|endoftext|>")
  assert eot not in codec.encode("<|endoftext|>")  # data: plain text
  assert sample.encode_start(codec, "<|endoftext|>") == [eot]
  assert eot not in codec.encode("<|endoftext|>")  # and it stays so


def test_a_gpt2_bpe_model_samples_offline_with_tokenizer(tmp_path, sample_cli):
  """A model whose data is GPT-2's BPE (no meta.json; a run on nanoGPT's
  openwebtext or on data prepared with tokenizer=gpt2) samples through
  tiktoken, which downloads its files: offline the error said
  "Alternatively pass --tokenizer=/path/to/gpt2/tokenizer.json", a flag
  trm.sample did not have ("Unknown command line flag 'tokenizer'"). It
  has now, for GPT-2's BPE only."""
  from test_text_data import gpt2_sized_tokenizer_json  # pylint: disable=g-import-not-at-top
  directory = write_tiny_gpt2(tmp_path / "gpt2", vocab=50257, layers=1)
  json_path = gpt2_sized_tokenizer_json(tmp_path / "tokenizer.json")
  flags = ("--init_from=gpt2", f"--checkpoint={directory}",
           "--start=t5 t7", "--num_samples=1", "--max_new_tokens=3",
           "--temperature=0")
  result = _sample(sample_cli, *flags, f"--tokenizer={json_path}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith("t5 t7 t")
  # Given, it is used before a download's own tokenizer.json (here one of
  # other words, which would not encode "t5").
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  Tokenizer(models.WordLevel({"a": 0, "?": 1}, unk_token="?")).save(
      os.path.join(directory, "tokenizer.json"))
  again = _sample(sample_cli, *flags, f"--tokenizer={json_path}")
  assert again.returncode == 0 and again.stdout == result.stdout
  os.remove(os.path.join(directory, "tokenizer.json"))
  # Not GPT-2's ids, or not a GPT-2 BPE model: one line each.
  small = tmp_path / "small.json"
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  Tokenizer(models.WordLevel({"a": 0, "?": 1}, unk_token="?")).save(
      str(small))
  data = tmp_path / "data"
  preparation.prepare_char("to be or not to be\n" * 4, str(data))
  for extra, needle in (
      ((f"--tokenizer={small}",), "has 2 ids, not GPT-2's 50257"),
      ((f"--tokenizer={json_path}", f"--data_dir={data}"),
       "but the model's tokenizer is 'char'")):
    bad = _sample(sample_cli, *flags, *extra)
    errors = [l for l in bad.stderr.splitlines() if "error:" in l]
    assert bad.returncode == 2 and len(errors) == 1, bad.stderr[-3000:]
    assert needle in errors[0], errors[0]


def test_a_vocabulary_padded_past_the_tokenizer_samples_decodable_ids(
    tmp_path, monkeypatch, capsys):
  """nanoGPT gives a GPT-2 BPE model 50304 ids over the tokenizer's 50257.
  The 47 extra ids are never targets, but an early checkpoint draws them,
  and tiktoken cannot decode them: trm.sample (as nanoGPT's sample.py)
  generated everything, then died with "KeyError: 'Invalid token for
  decoding: 292'". Now only the tokenizer's ids are drawn. (A random
  GPT-2 of 300 ids over the 264-id tiktoken stand-in: most of 80 draws
  would land past 264 at least once.)"""
  import tiktoken  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from test_text_data import gpt2_standin_encoding  # pylint: disable=g-import-not-at-top
  encoding = gpt2_standin_encoding()
  monkeypatch.setattr(tiktoken, "get_encoding", lambda name: encoding)
  directory = write_tiny_gpt2(tmp_path / "gpt2", vocab=300)
  with flagsaver.flagsaver():
    flags.FLAGS(["trm.sample", "--init_from=gpt2",
                 f"--checkpoint={directory}", "--start=speak",
                 "--num_samples=2", "--max_new_tokens=40",
                 "--temperature=1.0", "--top_k=0"])
    sample.main(["trm.sample"])
  out = capsys.readouterr().out
  assert out.count("---------------") == 2 and out.startswith("speak")


def _samples_of(capsys, *flag_values):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  with flagsaver.flagsaver():
    flags.FLAGS(["trm.sample", *flag_values])
    sample.main(["trm.sample"])
  return capsys.readouterr().out.split("---------------\n")[:-1]


def test_batch_size_draws_every_sample_in_batches(tmp_path, capsys):
  """--num_samples rows were one batch, each holding a KV cache of the
  whole block: 1,000 GPT-2 samples wanted 75 GB. --batch_size draws them
  in batches of one compiled program; greedy samples are those of one
  batch, and sampled ones differ between batches (each its own key)."""
  directory = write_tiny_gpt2(tmp_path / "gpt2")
  data = tmp_path / "data"
  preparation.prepare_char("to be or not to be, that is the question\n" * 4,
                           str(data))
  common = ("--init_from=gpt2", f"--checkpoint={directory}",
            f"--data_dir={data}", "--start=to", "--max_new_tokens=12")
  greedy = ("--temperature=0", "--num_samples=3")
  one_batch = _samples_of(capsys, *common, *greedy)
  batches = _samples_of(capsys, *common, *greedy, "--batch_size=2")
  assert len(one_batch) == 3 and batches == one_batch
  drawn = _samples_of(capsys, *common, "--temperature=1.0", "--top_k=0",
                      "--num_samples=3", "--batch_size=1")
  assert len(drawn) == 3 and len(set(drawn)) == 3, drawn


def test_a_workdir_given_as_checkpoint_names_workdir(tmp_path):
  """--checkpoint=<a trm.main workdir> said 'nanoGPT checkpoint DIR does
  not exist or is not a file'."""
  from absl import app  # pylint: disable=g-import-not-at-top
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(app.UsageError, match=f"--checkpoint={tmp_path} is a "
                     f"trm.main workdir, not nanoGPT's ckpt.pt: pass "
                     f"--workdir={tmp_path}"):
    _samples_of(None, f"--checkpoint={tmp_path}")


class JaxRuntimeError(RuntimeError):  # what cli.out_of_memory knows
  pass


def _out_of_memory(*args, **kwargs):
  raise JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating "
                         "34000001024 bytes.")


def _tiny_gpt2_and_chars(tmp_path):
  """A tiny GPT-2 download and a character data set for its prompts."""
  directory = write_tiny_gpt2(tmp_path / "gpt2")
  data = tmp_path / "data"
  preparation.prepare_char("to be or not to be\n" * 4, str(data))
  return directory, data


def test_out_of_memory_names_batch_size(tmp_path, monkeypatch):
  """--num_samples=10000000 (all at once by default) ran out of memory
  with the trainer's line: reduce config.global_batch_size, turn on
  config.model.remat, ... none of which trm.sample takes."""
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(gpt, "generate", _out_of_memory)
  directory, data = _tiny_gpt2_and_chars(tmp_path)
  with pytest.raises(ValueError, match=r"out of memory drawing 3 samples at "
                     r"once \(RESOURCE_EXHAUSTED: .*\): each holds a KV "
                     r"cache of the whole 16-token block and its 2 new "
                     r"tokens; pass a smaller --batch_size \(samples drawn "
                     r"at once\) or fewer --max_new_tokens"):
    _samples_of(None, "--init_from=gpt2", f"--checkpoint={directory}",
                f"--data_dir={data}", "--start=to", "--num_samples=3",
                "--max_new_tokens=2")


def test_negative_batch_size_is_refused(tmp_path, sample_cli):
  result = _sample(sample_cli, "--init_from=gpt2", f"--checkpoint={tmp_path}",
                   "--batch_size=-1")
  assert result.returncode != 0
  assert "--batch_size=-1: must be >= 0" in result.stderr, result.stderr


@pytest.mark.parametrize("flag", ["--data_dir", "--tokenizer"])
def test_an_object_store_data_dir_or_tokenizer_is_refused(tmp_path, flag):
  """--data_dir=gs://... was "not a prepared text data set ...; prepare it
  with ... --out_dir=gs://...", which sampling would not read either (it
  reads with os); now one line before the weights, as for --workdir."""
  with pytest.raises(weights_io.CheckpointError,
                     match=f"{flag}='gs://b/x' is an object-store path; "
                     ".* read from a local disk"):
    _samples_of(None, "--init_from=gpt2", f"--checkpoint={tmp_path}",
                f"{flag}=gs://b/x")


@pytest.mark.parametrize("flag, args", [
    ("--workdir", ("resume", "gs://b/run", None)),
    ("--checkpoint", ("resume", None, "gs://b/out/ckpt.pt")),
    ("--checkpoint", ("gpt2", None, "gs://b/gpt2"))])
def test_an_object_store_path_is_refused_naming_the_flag(flag, args):
  """A pod run's workdir is a gs:// bucket (README); trm.sample said its
  config.json "does not exist", as if it were no trm.main run. It now says
  what trm.generate, trm.evaluate and trm.export say: copy it to a local
  disk."""
  with pytest.raises(weights_io.CheckpointError,
                     match=f"{flag}='gs://b/.*' is an object-store path; "
                     ".* read from a local disk"):
    sample.load_model(*args, ctx=None)


def test_a_start_character_outside_the_vocabulary_names_start():
  """The character codec's refusal named no flag: the text was --start's."""
  from absl import app  # pylint: disable=g-import-not-at-top
  from trm.data.text import text_codecs  # pylint: disable=g-import-not-at-top
  codec = text_codecs.CharCodec(list("ab\n"))
  assert sample.encode_start(codec, "ba") == [1, 0]
  with pytest.raises(app.UsageError, match=r"^--start: Character 'z' is "
                     "not in the 3-character vocabulary"):
    sample.encode_start(codec, "abz")


def test_the_prompt_batch_is_never_built_on_the_host(tmp_path, monkeypatch):
  """All --num_samples at once were a host array of that many prompt rows
  (a list of them first): --num_samples=10**9 stopped in a MemoryError
  traceback before the out-of-memory line. The program repeats one row."""
  import tracemalloc  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  seen = {}

  def out_of_memory(model, params, prompt, *args, **kwargs):
    seen["shape"] = prompt.shape
    seen["peak"] = tracemalloc.get_traced_memory()[1]
    _out_of_memory()

  monkeypatch.setattr(gpt, "generate", out_of_memory)
  directory, data = _tiny_gpt2_and_chars(tmp_path)
  tracemalloc.start()
  try:
    with pytest.raises(ValueError, match=r"out of memory drawing 4000000 "
                       r"samples at once"):
      _samples_of(None, "--init_from=gpt2", f"--checkpoint={directory}",
                  f"--data_dir={data}", "--start=to be", "--num_samples=4000000",
                  "--max_new_tokens=2")
  finally:
    tracemalloc.stop()
  assert seen["shape"] == (4000000, 5)
  # The old host batch: 4e6 x 5 int32 (80 MB) and a list of 4e6 rows.
  assert seen["peak"] < 40 * 2**20, seen["peak"]


def test_a_sample_past_int32_positions_is_one_line_before_the_weights(
    tmp_path):
  """--max_new_tokens=3000000000 ended, once the weights were read, in
  jax's OverflowError traceback: token positions are int32."""
  from absl import app  # pylint: disable=g-import-not-at-top
  with pytest.raises(app.UsageError, match=r"^--max_new_tokens=3000000000: "
                     r"a sample holds at most 2147483647 tokens, its "
                     r"prompt's included"):
    # No weights at --checkpoint: reading them would be another error.
    _samples_of(None, "--init_from=gpt2", f"--checkpoint={tmp_path}",
                "--max_new_tokens=3000000000")


def _tiny_samples(tmp_path, *flag_values):
  """`_samples_of` two new tokens a sample of a tiny GPT-2 prompted
  'to'."""
  directory, data = _tiny_gpt2_and_chars(tmp_path)
  return _samples_of(None, "--init_from=gpt2", f"--checkpoint={directory}",
                     f"--data_dir={data}", "--start=to", "--max_new_tokens=2",
                     *flag_values)


def test_samples_no_machine_holds_are_one_line_before_tracing(tmp_path):
  """--num_samples=2**62 (all at once by default) ended in JAX's
  NotImplementedError traceback ("random bits array of size exceeding
  2 ** 64") while the sampler was traced."""
  with pytest.raises(ValueError, match=r"^The sampling program for "
                     r"4611686018427387904 samples at once holds an array of "
                     r"\[4611686018427387904, 64\] float32 .* more than any "
                     r"machine holds; pass a smaller --batch_size"):
    _tiny_samples(tmp_path, f"--num_samples={2**62}")


def test_samples_past_the_hosts_memory_are_one_line_on_cpu(tmp_path,
                                                           monkeypatch):
  """--num_samples=10**10 on a CPU host (2.2 TB of KV cache) aborted the
  process in XLA:CPU, a C++ CHECK on the buffer it could not allocate
  (exit 134, a stack dump). A host of 1 KiB stands in for a small one."""
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(array_sizes, "host_memory_bytes", lambda: 2**10)
  with pytest.raises(ValueError, match=r"^The sampling program for 64 "
                     r"samples at once needs .* GiB on this host's 1 CPU "
                     r"device\(s\) \(XLA's memory analysis: .* GiB of "
                     r"temporaries a device\), which share its 0.0 GiB "
                     r"\(memory and swap\); pass a smaller --batch_size"):
    _tiny_samples(tmp_path, "--num_samples=64")
