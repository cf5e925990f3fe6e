"""TFDS/ArrayRecord data for GPT and DiffuCoder (`config.data.source='tfds'`):
our builders write offline from local files; TFDS-fed batches equal the
.bin / code-file batches of the same data; the Grain position restores
bit-exactly; processes read disjoint rows; mistakes are one line naming the
config field; and a GPT run trains from TFDS through `trm.main`."""
import glob
import os
import pickle
import shutil
import subprocess
import sys
import threading

import ml_collections
import numpy as np
import bind_mounts
import cli_batch
import pytest
import repo

from trm.core import config_lib
from trm.data.text import tokenizer as tok_lib
from trm.core import pipeline
from trm.data.text import sft
from trm.data.text import preparation
from trm.data.text import windows as text
from trm.data.text import tfds_source
from trm.data import tfds_builders as tfds_build
from trm.families.dream import model as dream

ROOT = repo.ROOT
SHAKESPEARE = os.path.join(ROOT, "..", "shared", "data", "tinyshakespeare",
                           "input.txt")
ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _corpus() -> str:
  """tinyshakespeare where the checkout has ../shared/data, else generated
  text (several records' worth, so windows cross record boundaries)."""
  if os.path.isfile(SHAKESPEARE):
    return text.read_text(SHAKESPEARE)
  rng = np.random.default_rng(0)
  words = ["thou", "art", "the", "king", "ROMEO:", "\n", "love,", "night."]
  return " ".join(rng.choice(words, size=60000))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """(tfds config, .bin dir): the same text built both ways."""
  root = tmp_path_factory.mktemp("tfds")
  manual = root / "manual"
  manual.mkdir()
  corpus = _corpus()
  (manual / "input.txt").write_text(corpus, encoding="utf-8")
  data_dir = str(root / "tfds_data")
  tfds_build.build("trm_tiny_shakespeare", str(manual), data_dir)
  bin_dir = str(root / "bin")
  preparation.prepare_char(corpus, bin_dir)
  config = ml_collections.ConfigDict(dict(
      name="trm_tiny_shakespeare", data_dir=data_dir, split="train",
      eval_split="validation", feature="tokens"))
  return config, bin_dir


def test_build_writes_array_record_with_the_vocabulary(built):
  config, bin_dir = built
  version_dir = os.path.join(config.data_dir, "trm_tiny_shakespeare", "1.0.0")
  records = glob.glob(os.path.join(version_dir, "*.array_record-*"))
  assert sorted(os.path.basename(p).split(".")[0] for p in records) == [
      "trm_tiny_shakespeare-train", "trm_tiny_shakespeare-validation"]
  meta, directory = tfds_source.metadata(config)
  assert directory == version_dir
  bin_meta = preparation.load_meta(bin_dir)
  for key in ("vocab_size", "itos", "tokenizer", "train_tokens",
              "val_tokens"):
    assert meta[key] == bin_meta[key], key


def test_tfds_batches_equal_bin_batches(built):
  config, bin_dir = built
  stream = tfds_source.TokenStream(config)
  assert stream.num_tokens == preparation.load_meta(bin_dir)["train_tokens"]
  from_tfds = text.TokenWindows(stream, 64, 8, seed=3)
  from_bin = text.TokenWindows(os.path.join(bin_dir, "train.bin"), 64, 8,
                               seed=3)
  for k in range(5):
    for key in ("x", "y"):
      np.testing.assert_array_equal(from_tfds[k][key], from_bin[k][key])
  # Grain workers get the source pickled: without the open TFDS source, which
  # is reopened on first read.
  copy = pickle.loads(pickle.dumps(from_tfds))
  assert copy.file._data is None  # pylint: disable=protected-access
  np.testing.assert_array_equal(copy[4]["x"], from_bin[4]["x"])
  streams = [stream, tfds_source.TokenStream(config, "eval_split")]
  eval_tfds = text.EvalWindows("tfds", 64, 8, 2, seed=3, streams=streams)
  eval_bin = text.EvalWindows(bin_dir, 64, 8, 2, seed=3)
  for k in range(len(eval_bin)):
    for key in ("x", "y", "split"):
      np.testing.assert_array_equal(eval_tfds[k][key], eval_bin[k][key])


def test_windows_across_records_are_the_stream(built):
  config, bin_dir = built
  stream = tfds_source.TokenStream(config)
  tokens = np.fromfile(os.path.join(bin_dir, "train.bin"), np.uint16)
  # Windows ending exactly at, and straddling, record boundaries; the last.
  starts = np.asarray([0, stream.chunk - 65, stream.chunk - 1,
                       stream.num_tokens - 65])
  rows = stream.windows(starts, 64)
  for row, start in zip(rows["x"], starts):
    np.testing.assert_array_equal(row, tokens[start:start + 64])


def test_iterator_state_restores_bit_exactly(built):
  config, _ = built
  def windows():
    return text.TokenWindows(tfds_source.TokenStream(config), 32, 4, seed=7,
                             num_batches=20)
  first = pipeline.grain_iterator(windows())
  for _ in range(3):
    next(first)
  state = first.get_state()
  expected = [next(first) for _ in range(3)]
  again = pipeline.grain_iterator(windows())  # a fresh pipeline and source
  again.set_state(state)
  for want in expected:
    got = next(again)
    for key in ("x", "y"):
      np.testing.assert_array_equal(got[key], want[key])
  # Not trivially equal: the restored position matters.
  assert not np.array_equal(next(pipeline.grain_iterator(windows()))["x"],
                            expected[0]["x"])


def test_a_stream_hashes_alike_from_tfds_and_bin(built):
  """The same text gives the same fingerprint either way, so a run may
  move between them (config.data.source is a change of its own)."""
  config, bin_dir = built
  assert (tfds_source.TokenStream(config).fingerprint()
          == text.TokenFile(os.path.join(bin_dir, "train.bin")).fingerprint())


def test_two_processes_read_disjoint_halves(built):
  config, _ = built
  stream = tfds_source.TokenStream(config)
  whole = text.TokenWindows(stream, 32, 8, seed=1)
  halves = [text.TokenWindows(stream, 32, 8, seed=1, process_index=p,
                              process_count=2) for p in (0, 1)]
  for k in range(3):
    parts = [h[k]["x"] for h in halves]
    assert parts[0].shape == (4, 32)
    np.testing.assert_array_equal(np.concatenate(parts), whole[k]["x"])
    np.testing.assert_array_equal(parts[1], whole[k]["x"][4:])


@pytest.mark.parametrize("change, message", [
    (dict(data_dir="/nonexistent/tfds"),
     "config.data.tfds.data_dir=/nonexistent/tfds does not exist"),
    (dict(name="no_such_set"), "config.data.tfds.name='no_such_set'"),
    (dict(name="Bad-Name"),
     "config.data.tfds.name='Bad-Name' is no TFDS dataset name"),
    (dict(split="test"), "config.data.tfds.split='test' is not a split"),
    (dict(feature="tokenz"), "config.data.tfds.feature='tokenz' is not a"),
    (dict(feature="text"), "not a 1-D sequence of token ids"),
    # Slices: array_record's "Paths sequence can not be of 0 length", len()'s
    # "__len__() should return >= 0" and TFDS's own lines named no field.
    (dict(split="train[:0]"),
     r"config.data.tfds.split='train\[:0\]' of trm_tiny_shakespeare holds "
     "no records"),
    (dict(split="train[5:2]"), r"split='train\[5:2\]' of .* holds no"),
    (dict(eval_split="validation[:0]"),
     r"config.data.tfds.eval_split='validation\[:0\]' of .* holds no"),
    (dict(split="train[abc]"),
     r"config.data.tfds.split='train\[abc\]' is no slice of "
     "trm_tiny_shakespeare's splits \\(Unrecognized split format"),
    (dict(split="train[100000:]"),
     r"split='train\[100000:\]' is no slice .* \(Requested slice"),
    (dict(data_dir=__file__),
     f"config.data.tfds.data_dir={__file__} is not a directory"),
])
def test_bad_tfds_config_names_the_field(built, change, message):
  config = ml_collections.ConfigDict(built[0].to_dict())
  config.update(change)
  with pytest.raises((ValueError, OSError), match=message):
    tfds_source.TokenStream(config, "eval_split" if "eval_split" in change
                            else "split")


@pytest.mark.parametrize("first, last", [(4096, 5000), (0, 10)])
def test_records_that_are_no_token_stream_are_refused_at_once(
    built, monkeypatch, first, last):
  """A split whose last record is longer than the first (or whose first
  is empty) is no stream of equal records: it failed mid-training in
  numpy's broadcasting (an empty first one: at the first window),
  naming nothing."""
  real = tfds_source.read_records

  def records(source, keys, where):
    got = real(source, keys, where)
    if len(keys) == 2:  # TokenStream's first look: records 0 and N - 1
      got = [{"tokens": np.zeros(first, np.int32)},
             {"tokens": np.zeros(last, np.int32)}]
    return got

  monkeypatch.setattr(tfds_source, "read_records", records)
  with pytest.raises(ValueError, match=(
      f"config.data.tfds.split='train' of trm_tiny_shakespeare in .*: its "
      f"last record holds {last} tokens, record 0 {first}: the split is not "
      "a stream of equal token records")):
    tfds_source.TokenStream(built[0])


def test_a_bucket_data_dir_is_read_by_tfds_and_built_locally(
    built, tmp_path, monkeypatch):
  """The README copies DATA_DIR to a bucket, but a gs:// data_dir was
  refused as one that "does not exist" (os.path.isdir) before TFDS could
  read it; building into one made a local directory "gs:" and ended in
  TensorFlow's traceback."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  bucket = "gs://no-such-bucket/tfds"

  def unreachable(*args, **kwargs):
    raise RuntimeError("FailedPreconditionError: Error executing an HTTP "
                       "request: Could not resolve host: www.googleapis.com")

  monkeypatch.setattr(tfds, "builder", unreachable)
  config = ml_collections.ConfigDict(built[0].to_dict())
  config.data_dir = bucket
  with pytest.raises(OSError, match=(
      f"^config.data.tfds.data_dir={bucket} cannot be read \\(RuntimeError: "
      "FailedPreconditionError: .*Could not resolve host.*\\); check that it "
      "exists and that this machine can reach it")):
    tfds_source.TokenStream(config)
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ValueError, match=(
      f"^--data_dir={bucket}: builds are written to a local directory")):
    tfds_build.build("trm_tiny_shakespeare", str(tmp_path), bucket)
  assert not os.path.exists(tmp_path / "gs:")


_LATIN1_BUILDER = """
import tensorflow_datasets as tfds
from trm.data.tfds_builders import base


class TrmTestLatin1Text(base.OrderedArrayRecordBuilder):
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return self.ordered_info("Latin-1 bytes.", {"text": tfds.features.Text()})

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    yield 0, {"text": "fine"}
    yield 1, {"text": b"caf\\xe9"}
"""


def test_text_records_that_are_not_utf8_name_the_record(tmp_path,
                                                        monkeypatch):
  """A builder may store any bytes in a Text feature; their decoding error
  reached trm.main as "'utf-8' codec can't decode byte 0xe9 ...", naming
  neither dataset, record nor feature."""
  # TFDS wants a builder's module in a package.
  (tmp_path / "latin1_builder").mkdir()
  (tmp_path / "latin1_builder" / "__init__.py").write_text(_LATIN1_BUILDER)
  monkeypatch.syspath_prepend(str(tmp_path))
  import latin1_builder  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  data_dir = str(tmp_path / "data")
  latin1_builder.TrmTestLatin1Text(data_dir=data_dir).download_and_prepare()
  config = ml_collections.ConfigDict(dict(
      name="trm_test_latin1_text", data_dir=data_dir, split="train",
      eval_split="", feature="text"))
  with pytest.raises(ValueError, match=(
      "^config.data.tfds.split='train' of trm_test_latin1_text in .*: record "
      "1, feature 'text' is not UTF-8 text \\(byte 0xe9 at offset 3\\); "
      "rebuild the dataset")):
    tfds_source.texts(config, "split", {"text": "config.data.tfds.feature"})


def test_a_version_directory_of_another_dataset_is_refused(built, tmp_path):
  # Copied (or moved) under another dataset's name, tinyshakespeare's
  # records were read as trm_code_files' documents, silently.
  config, _ = built
  copied = tmp_path / "tfds" / "trm_code_files" / "py" / "1.0.0"
  shutil.copytree(os.path.join(config.data_dir, "trm_tiny_shakespeare",
                               "1.0.0"), copied)
  other = ml_collections.ConfigDict(dict(
      name="trm_code_files", data_dir=str(tmp_path / "tfds"), split="train",
      eval_split="train", feature="text"))
  with pytest.raises(ValueError, match=f"^{copied} holds trm_tiny_shakespeare"
                     " 1.0.0 .*not config.data.tfds.name='trm_code_files'"):
    tfds_source.texts(other, "split", {"text": "config.data.tfds.feature"})


@pytest.mark.parametrize("metadata, message", [
    ('{"vocab_size": 1099511627776}', "vocab_size=1099511627776 must be an "
     "integer in"),
    ('{"vocab_size": 22, "model_vocab_size": "abc"}',
     "model_vocab_size='abc' must be"),
    ("[1, 2]", "is not the JSON object the builders write"),
    ('{"vocab_size": 22,', "is not the JSON object the builders write")])
def test_a_hand_edited_metadata_json_is_one_line(built, tmp_path, metadata,
                                                 message):
  """The GPT is sized by the metadata's vocab_size: 2**40 failed in JAX's
  compilation with a traceback, a list or damaged JSON inside TFDS (a
  TypeError's traceback, or JSON's error without the file's name)."""
  config = ml_collections.ConfigDict(built[0].to_dict())
  version = os.path.join("trm_tiny_shakespeare", "1.0.0")
  shutil.copytree(os.path.join(config.data_dir, version),
                  tmp_path / version)
  config.data_dir = str(tmp_path)
  assert tfds_source.metadata(config)[0]["vocab_size"] > 0  # as built
  config.data_dir = str(tmp_path / "edited")
  shutil.copytree(tmp_path / version, tmp_path / "edited" / version)
  path = tmp_path / "edited" / version / "metadata.json"
  path.write_text(metadata)
  with pytest.raises(ValueError, match=message) as info:
    tfds_source.metadata(config)
  assert str(info.value).startswith(str(path))


@pytest.mark.parametrize("name, text", [
    ("dataset_info.json", "[1]"), ("dataset_info.json", '{"splits": 5}'),
    ("dataset_info.json", "{")])
def test_a_damaged_dataset_info_json_is_one_line(
    built, tmp_path, name, text):
  """TFDS reads them when the builder is made: a protobuf ParseError's
  traceback, or JSON's error naming no file. (features.json is read there
  only where the builder's code is not imported, as in trm.main.)"""
  config = ml_collections.ConfigDict(built[0].to_dict())
  version = os.path.join("trm_tiny_shakespeare", "1.0.0")
  shutil.copytree(os.path.join(config.data_dir, version),
                  tmp_path / version)
  (tmp_path / version / name).write_text(text)
  config.data_dir = str(tmp_path)
  with pytest.raises(ValueError, match=(
      f"config.data.tfds.name='trm_tiny_shakespeare' in {tmp_path}: its "
      "dataset_info.json or features.json cannot be read")):
    tfds_source.metadata(config)


def test_damaged_array_record_files_are_one_line(built, tmp_path):
  """A truncated, damaged or deleted ArrayRecord file (a copy cut short, a
  bad disk) stopped the run with array_record's RuntimeError's traceback,
  at start or at the first batch that read it."""
  config = ml_collections.ConfigDict(built[0].to_dict())
  version = os.path.join("trm_tiny_shakespeare", "1.0.0")
  shutil.copytree(os.path.join(config.data_dir, version),
                  tmp_path / version)
  config.data_dir = str(tmp_path)
  (path,) = glob.glob(str(tmp_path / version / "*-train.array_record*"))
  with open(path, "rb") as f:
    whole = f.read()
  stream = tfds_source.TokenStream(config)
  with open(path, "r+b") as f:  # the middle of the file: read by a batch
    f.seek(len(whole) // 2)
    f.write(b"\xff" * 100)
  where = (f"config.data.tfds.split='train' of trm_tiny_shakespeare in "
           f"{tmp_path / version}: its ArrayRecord files cannot be read")
  with pytest.raises(ValueError, match=where):
    stream[np.arange(stream.num_tokens)]
  with open(path, "wb") as f:
    f.write(whole[:20000])
  with pytest.raises(ValueError, match=where):
    tfds_source.TokenStream(config)
  os.remove(path)  # a partial copy: array_record's 'open() failed'
  with pytest.raises(ValueError, match=f"{where}, they are missing, "
                     "truncated or damaged .*No such file"):
    tfds_source.TokenStream(config)


def _code_config(tmp_path):
  src = tmp_path / "src"
  for name, body in [("b/z.py", "def z():\n  return 26\n"),
                     ("a.py", "print('a' * 40)\n" * 12),
                     ("b/c.py", "x = [i for i in range(99)]\n" * 9),
                     ("notes.txt", "not code")]:
    (src / name).parent.mkdir(parents=True, exist_ok=True)
    (src / name).write_text(body)
  data_dir = str(tmp_path / "tfds_data")
  tfds_build.build("trm_code_files", str(src), data_dir)
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")
  return config_lib.set_values(config, {
      "data.path": str(src / "**" / "*.py"), "data.eval_rows": 1,
      "data.tfds.data_dir": data_dir})


def test_code_rows_from_tfds_equal_rows_from_files(tmp_path):
  config = _code_config(tmp_path)
  tokenizer = tok_lib.from_spec("bytes",
                                dream.DreamConfig.from_config(config.model))
  from_files = sft.train_and_eval_rows(config.data, tokenizer, 16)
  config.data.source = "tfds"
  from_tfds = sft.train_and_eval_rows(config.data, tokenizer, 16)
  assert len(from_files[0][0]) > 4
  for a, b in zip(from_files, from_tfds):
    for x, y in zip(a, b):
      np.testing.assert_array_equal(x, y)
  config.data.tfds.feature = "nope"
  with pytest.raises(ValueError, match="config.data.tfds.feature='nope'"):
    sft.train_and_eval_rows(config.data, tokenizer, 16)


def test_tfds_build_loads_our_builder_files():
  """`tfds build trm/data/tfds_builders/<name>.py` resolves the file to our
  builder with TFDS's own loader (running the `tfds` script itself needs
  apache_beam in tensorflow-datasets 4.9.10; see README)."""
  from tensorflow_datasets.scripts.cli import build  # pylint: disable=g-import-not-at-top
  for name in ("trm_tiny_shakespeare", "trm_code_files"):
    path = os.path.join(ROOT, "trm", "data", "tfds_builders", f"{name}.py")
    cls, _ = build._get_builder_cls_and_kwargs(path, has_imports=False)  # pylint: disable=protected-access
    assert cls.name == name


# The refusals below run in forks of one process that has imported
# cli_batch.MAIN_PRELOAD: a start-up of jax per run less.
# test_gpt_trains_from_tfds_on_the_command_line runs the real entry point.
main_cli = cli_batch.serve("trm.main", env=lambda: ENV,
                           preload=cli_batch.MAIN_PRELOAD)
# trm.data.tfds_builders imports TFDS before it parses its flags.
builders_cli = cli_batch.serve(
    "trm.data.tfds_builders", env=lambda: ENV,
    preload=("trm.core.cli", "trm.data.tfds_builders"))


def _gpt(tmp_path, config, *extra, server=None):
  """`python -m trm.main` on the TFDS data (in a fork of `server`, a
  `main_cli`, when given)."""
  argv = ["--config=configs/gpt.py:shakespeare_char_cpu",
          f"--workdir={tmp_path / 'run'}", "--config.data.source=tfds",
          f"--config.data.tfds.data_dir={config.data_dir}",
          "--config.max_iters=3", "--config.lr_decay_iters=3",
          "--config.warmup_iters=1", "--config.eval_interval=3",
          "--config.eval_iters=1", "--config.n_layer=1", "--config.n_head=2",
          "--config.n_embd=16", "--config.block_size=16",
          "--config.batch_size=8", *extra]
  if server is not None:
    return server.run(argv, cwd=ROOT, env=ENV, timeout=300)
  return subprocess.run([sys.executable, "-m", "trm.main", *argv], cwd=ROOT,
                        env=ENV, capture_output=True, text=True, timeout=300)


def test_gpt_trains_from_tfds_on_the_command_line(built, tmp_path):
  result = _gpt(tmp_path, built[0])
  assert result.returncode == 0, result.stderr[-3000:]
  assert os.listdir(tmp_path / "run" / "checkpoints") == ["3"]
  assert os.path.isfile(tmp_path / "run" / "eval_3.json")


@pytest.mark.parametrize("override, message", [
    ("--config.data.tfds.eval_split=dev",
     "config.data.tfds.eval_split='dev' is not a split"),
    ("--config.data.tfds.data_dir=/nonexistent/tfds",
     "config.data.tfds.data_dir=/nonexistent/tfds does not exist"),
])
def test_gpt_bad_tfds_config_is_one_line(built, tmp_path, override, message,
                                        main_cli):
  result = _gpt(tmp_path, built[0], override, server=main_cli)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith(f"trm.main: error: {message}"), lines[-5:]
  assert len(lines[-1]) < 400 and "Traceback" not in result.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_runs_recorded_before_the_tfds_keys_still_resume(tmp_path):
  from etils import epath  # pylint: disable=g-import-not-at-top
  from trm.core import config_record  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char_cpu")
  old = config.to_dict()
  del old["data"]["source"], old["data"]["tfds"]
  (tmp_path / config_record.RECORD).write_text(
      ml_collections.ConfigDict(old).to_json_best_effort())
  assert "data.source" in config_record.check(config, epath.Path(tmp_path), 5)
  config.data.source = "tfds"  # this does change the data: refused
  with pytest.raises(config_record.ConfigChangedError, match="data.source"):
    config_record.check(config, epath.Path(tmp_path), 5)


def test_build_from_an_empty_input_names_it(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "input.txt").write_text("")
  with pytest.raises(ValueError, match=f"^{manual / 'input.txt'} holds 0 "
                     "characters"):
    tfds_build.build("trm_tiny_shakespeare", str(manual),
                     str(tmp_path / "out"))


def test_the_input_folder_through_a_bind_mount_is_the_one_built_from(
    tmp_path):
  """--manual_dir named through a bind mount of the folder it was built
  from (a disk mounted twice; on macOS another case of its name): kept,
  not refused as "already prepared with other arguments"."""
  manual, alias = tmp_path / "manual", tmp_path / "alias"
  manual.mkdir()
  alias.mkdir()
  (manual / "input.txt").write_text("To be, or not to be.\n" * 40)
  out = str(tmp_path / "out")
  tfds_build.build("trm_tiny_shakespeare", str(manual), out)
  assert bind_mounts.python(manual, alias, (
      "import sys\n"
      "from trm.data import tfds_builders\n"
      "tfds_builders.build('trm_tiny_shakespeare', *sys.argv[1:])\n"
      "print('kept')"), alias, out).split()[-1:] == ["kept"]


@pytest.mark.parametrize("name", ["trm_tiny_shakespeare", "trm_code_files"])
def test_building_again_after_the_inputs_changed_is_refused(tmp_path, name):
  """TFDS keeps a prepared version: built again from edited input files,
  the old records would be served as the new text."""
  manual = tmp_path / "manual"
  manual.mkdir()
  first = "To be, or not to be: that is the question.\n" * 40
  path = manual / ("input.txt" if name == "trm_tiny_shakespeare" else "a.py")
  path.write_text(first)
  out = str(tmp_path / "out")
  tfds_build.build(name, str(manual), out)
  tfds_build.build(name, str(manual), out)  # the same inputs: kept
  path.write_text(first.replace("question", "answer"))
  with pytest.raises(ValueError, match=(
      r"^\S+/1.0.0 is already prepared, but the input files under "
      rf"--manual_dir={manual} changed since it was built \(their sha256 is "
      r"\w{12}\.\.\., the build read \w{12}\.\.\.\)\. TFDS never rebuilds")):
    tfds_build.build(name, str(manual), out)
  path.write_text(first)  # back to what was built
  tfds_build.build(name, str(manual), out)


def test_a_build_killed_before_recording_its_arguments_is_still_checked(
    tmp_path, monkeypatch):
  """Killed after TFDS renamed the version into place but before the
  build's arguments were written, the next build with other inputs only
  warned ("its build arguments are not recorded") and kept the records."""
  for name, line in (("a", "To be or not to be.\n"),
                     ("b", "Now is the winter.\n")):
    (tmp_path / name).mkdir()
    (tmp_path / name / "input.txt").write_text(line * 50)
  real = tfds_build.atomic_files.write_json_atomic

  def killed(path, value):
    if path.endswith(tfds_build.ARGS_FILE):
      raise KeyboardInterrupt("killed before the arguments were recorded")
    return real(path, value)

  out = str(tmp_path / "out")
  monkeypatch.setattr(tfds_build.atomic_files, "write_json_atomic", killed)
  with pytest.raises(KeyboardInterrupt):
    tfds_build.build("trm_tiny_shakespeare", str(tmp_path / "a"), out)
  monkeypatch.setattr(tfds_build.atomic_files, "write_json_atomic", real)
  with pytest.raises(ValueError, match=(
      rf"already prepared with other arguments: --manual_dir='{tmp_path}/b'"
      rf" \(built with '{tmp_path}/a'\)")):
    tfds_build.build("trm_tiny_shakespeare", str(tmp_path / "b"), out)
  builder = tfds_build.build("trm_tiny_shakespeare", str(tmp_path / "a"), out)
  assert os.path.isfile(os.path.join(builder.data_dir, tfds_build.ARGS_FILE))
  assert not [f for f in os.listdir(out) if f.endswith(tfds_build.ARGS_FILE)]


@pytest.mark.parametrize("record", ["", "[1, 2]", "{\"manual_dir\": "])
def test_a_damaged_build_record_is_refused_not_taken_for_none(tmp_path,
                                                              record):
  """An unreadable trm_build_args.json was taken for a version built
  without one (a warning), so a build from another --manual_dir kept it."""
  for name, line in (("a", "To be or not to be.\n"),
                     ("b", "Now is the winter.\n")):
    (tmp_path / name).mkdir()
    (tmp_path / name / "input.txt").write_text(line * 50)
  out = str(tmp_path / "out")
  builder = tfds_build.build("trm_tiny_shakespeare", str(tmp_path / "a"), out)
  path = os.path.join(builder.data_dir, tfds_build.ARGS_FILE)
  with open(path, "w") as f:
    f.write(record)
  with pytest.raises(ValueError, match=(
      f"^{path} \\(the version's build arguments\\) .*; delete "
      f"{builder.data_dir} to build it again")):
    tfds_build.build("trm_tiny_shakespeare", str(tmp_path / "b"), out)


def test_a_build_started_during_another_waits_for_it(tmp_path, monkeypatch):
  """Two builds of one --data_dir from other texts: the second, started
  after TFDS put the first's version in place but before its arguments were
  recorded, kept those records as its own. It now waits for the first and
  is refused, naming the arguments."""
  for name, line in (("a", "To be or not to be.\n"),
                     ("b", "Now is the winter.\n")):
    (tmp_path / name).mkdir()
    (tmp_path / name / "input.txt").write_text(line * 50)
  real = tfds_build.atomic_files.write_json_atomic
  recording, go_on = threading.Event(), threading.Event()

  def slow_record(path, value):
    if threading.current_thread().name == "first":
      recording.set()
      go_on.wait(60)
    return real(path, value)

  monkeypatch.setattr(tfds_build.atomic_files, "write_json_atomic",
                      slow_record)
  out, results = str(tmp_path / "out"), {}

  def build(name):
    try:
      tfds_build.build("trm_tiny_shakespeare", str(tmp_path / name), out)
      results[name] = "built"
    except ValueError as e:
      results[name] = str(e)

  first = threading.Thread(target=build, args=("a",), name="first")
  first.start()
  assert recording.wait(120)
  second = threading.Thread(target=build, args=("b",))
  second.start()
  second.join(1)
  go_on.set()
  first.join()
  second.join()
  assert results["a"] == "built"
  assert "is already prepared with other arguments: --manual_dir=" in \
      results["b"]


def test_build_command_line(tmp_path, builders_cli):
  """(Forks of `builders_cli`; the next test runs the real entry point.)"""
  source = tmp_path / "play"
  source.mkdir()
  (source / "input.txt").write_text(
      "To be, or not to be: that is the question.\n" * 50)
  def build(manual_dir, out="out"):
    return builders_cli.run(
        ["trm_tiny_shakespeare", f"--manual_dir={manual_dir}",
         f"--data_dir={tmp_path / out}"], cwd=ROOT, env=ENV, timeout=300)
  result = build(source)
  assert result.returncode == 0, result.stderr[-2000:]
  assert (f"--config.data.tfds.name=trm_tiny_shakespeare "
          f"--config.data.tfds.data_dir={tmp_path / 'out'}") in result.stdout
  (source / "input.txt").rename(source / "other.txt")
  result = build(source, "out2")  # "out" holds it: TFDS would reuse it
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].endswith(
      f"error: {source / 'input.txt'} does not exist: pass --manual_dir=DIR "
      "with DIR/input.txt (e.g. tinyshakespeare's input.txt, or any UTF-8 "
      "text)."), result.stderr[-2000:]


def test_build_command_line_expands_a_leading_tilde(tmp_path):
  """`--data_dir=~/tfds` reached the builder as typed: a folder named '~'
  in the current one."""
  home = tmp_path / "home"
  (home / "manual").mkdir(parents=True)
  (home / "manual" / "input.txt").write_text("To be or not to be.\n" * 50)
  result = subprocess.run(
      [sys.executable, "-m", "trm.data.tfds_builders", "trm_tiny_shakespeare",
       "--manual_dir=~/manual", "--data_dir=~/tfds"], capture_output=True,
      text=True, cwd=tmp_path, timeout=300,
      env=dict(ENV, HOME=str(home), PYTHONPATH=os.pathsep.join(
          [ROOT, os.environ.get("PYTHONPATH", "")])))
  assert result.returncode == 0, result.stderr[-2000:]
  assert f"--config.data.tfds.data_dir={home / 'tfds'}" in result.stdout
  assert (home / "tfds" / "trm_tiny_shakespeare").is_dir()
  assert not (tmp_path / "~").exists()
