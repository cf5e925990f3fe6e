"""trm.export's --out next to the run it exports: --overwrite swaps --out in
as a whole, so an --out that is, holds or lies in the run's checkpoints
would delete them (it did: the workdir became the export)."""
import os
import subprocess
import sys

import pytest
from absl import app

import cli_batch
import repo
from trm import export


def _workdir(tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "3").mkdir(parents=True)
  (workdir / "checkpoints" / "3" / "state").write_text("weights")
  os.symlink(workdir, tmp_path / "link")
  return workdir


@pytest.mark.parametrize("out", ["run", "", "link", "run/checkpoints",
                                 "run/checkpoints/hf", "run/checkpoints/3"])
def test_out_over_the_checkpoints_is_refused(tmp_path, out):
  workdir = _workdir(tmp_path)
  with pytest.raises(app.UsageError, match="--checkpoint="):
    export.check_out_dir(str(tmp_path / out), None, True, str(workdir))


@pytest.mark.parametrize("out", ["store", "store/ckpts"])
def test_out_over_checkpoints_linked_elsewhere_is_refused(tmp_path, out):
  """A workdir whose checkpoints/ is a link to another disk: an --out
  holding the link's target passed, and --overwrite deleted every
  checkpoint after the export (`trm.export ... --out=STORE --overwrite`)."""
  workdir = _workdir(tmp_path)
  (tmp_path / "store").mkdir()
  os.rename(workdir / "checkpoints", tmp_path / "store" / "ckpts")
  os.symlink(tmp_path / "store" / "ckpts", workdir / "checkpoints")
  with pytest.raises(app.UsageError, match="its checkpoints/"):
    export.check_out_dir(str(tmp_path / out), None, True, str(workdir))
  export.check_out_dir(str(tmp_path / "hf"), None, True, str(workdir))


def test_out_beside_or_inside_the_run_is_allowed(tmp_path):
  workdir = _workdir(tmp_path)
  for out in (tmp_path / "hf", workdir / "hf", tmp_path / "run2"):
    export.check_out_dir(str(out), None, True, str(workdir))


# `python -m trm.export` for the refusal cases, forked from one process that
# has imported what the tool imports (tests/cli_batch.py): a start-up of jax,
# flax and the Dream model per case less.
# test_cli_removes_a_killed_exports_staging_directory_first runs the real
# entry point.
export_cli = cli_batch.serve(
    "trm.export", env=lambda: dict(os.environ, JAX_PLATFORMS="cpu"),
    preload=cli_batch.DREAM_EXPORT_PRELOAD)


def _export_error(server, workdir, *flags) -> str:
  """The one error line of a trm.export run that must stop before it
  reads the (fake) checkpoint (`server`: `export_cli`)."""
  result = server.run(
      ["--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       *flags],
      cwd=repo.ROOT, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1, result.stderr[-3000:]
  return errors[0]


def test_cli_keeps_the_workdir_it_was_asked_to_overwrite(tmp_path, export_cli):
  workdir = _workdir(tmp_path)
  error = _export_error(export_cli, workdir, f"--out={workdir}",
                        "--overwrite")
  assert "contains --checkpoint=" in error
  assert (workdir / "checkpoints" / "3" / "state").read_text() == "weights"


def test_cli_checks_the_tokenizer_before_the_weights(tmp_path, export_cli):
  """A --tokenizer without tokenizer.json failed only after the weights
  were loaded and written."""
  workdir = _workdir(tmp_path)
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={tmp_path}")
  assert f"{tmp_path} holds no tokenizer.json" in error


def test_cli_an_empty_tokenizer_is_refused(tmp_path, export_cli):
  """--tokenizer= was taken as unset: the export shipped no tokenizer."""
  workdir = _workdir(tmp_path)
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        "--tokenizer=")
  assert "error: --tokenizer is given but empty" in error, error
  assert not (tmp_path / "hf").exists()


def test_cli_tokenizer_bytes_says_to_drop_it(tmp_path, export_cli):
  """--tokenizer=bytes (the other tools' spelling for a byte-tokenizer run)
  was read as a directory: 'bytes holds no tokenizer.json ... point
  --tokenizer at the checkpoint you fine-tuned', which has none."""
  workdir = _workdir(tmp_path)
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        "--tokenizer=bytes")
  assert (
      "error: --tokenizer=bytes: the byte tokenizer has no files to copy; "
      "drop --tokenizer (load the export with --tokenizer=bytes), or pass "
      "--tokenizer=./bytes for a directory of that name.") in error, error


def test_cli_checks_the_sources_special_ids_before_the_weights(tmp_path,
                                                               export_cli):
  """--tokenizer's config.json gives the export its bos/eos ids; one that
  is no token id of the model stops the export before any weight is read
  (the fake checkpoint would fail to load) and leaves --out unwritten."""
  workdir = _workdir(tmp_path)
  source = tmp_path / "source"
  source.mkdir()
  (source / "tokenizer.json").write_text("{}")
  (source / "config.json").write_text('{"eos_token_id": 99999999}')
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={source}")
  assert "config.json: eos_token_id=99999999 is not token id(s)" in error
  assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("field,value", [("rope_theta", 500000.0),
                                         ("rms_norm_eps", 1e-5),
                                         ("mask_token_id", 400)])
def test_cli_refuses_a_config_whose_model_is_not_the_runs(tmp_path, field,
                                                          value, export_cli):
  """A --config whose RoPE base, norm epsilon or special ids differ from
  those the run trained with restored the run's weights (same shapes) and
  wrote its own values into the export's config.json, so Dream's code ran
  the weights with another RoPE. Refused before any weight is read."""
  workdir = _workdir(tmp_path)
  (workdir / "config.json").write_text(
      '{"model": {"name": "dream", "rope_theta": 1000000.0, '
      '"rms_norm_eps": 1e-06, "mask_token_id": 500}}')
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        f"--config.model.{field}={value}")
  assert (f"config.model.{field}={value!r}, but the run trained with"
          in error), error
  assert not (tmp_path / "hf").exists()


# trm.export's cli.run stopped by SIGTERM while it works (the sleep).
_STOPPED_CHILD = """
import os, signal, time
from trm import export
from trm.core import cli
def main(argv):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(20)
cli.run(main, stopped_line=export.STOPPED_LINE)
"""


def test_an_export_stopped_by_sigterm_does_not_exit_0():
  """A SIGTERM (a scheduler, `timeout`) exited 0 with trm.main's line
  ("before training began"), so `trm.export ... && upload OUT` went on
  with the previous export or none."""
  result = subprocess.run([sys.executable, "-c", _STOPPED_CHILD],
                          cwd=repo.ROOT, capture_output=True, text=True,
                          timeout=60, env=dict(os.environ,
                                               JAX_PLATFORMS="cpu"))
  assert result.returncode == 143, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [
      "trm: stopped by SIGTERM before it reported the export done: --out "
      "holds the previous export or the whole new one, never a mix; run it "
      "again."]


def test_a_signal_between_the_swaps_renames_puts_the_old_export_back(
    tmp_path, monkeypatch):
  from trm.core import cli  # pylint: disable=g-import-not-at-top
  (tmp_path / "out").mkdir()
  (tmp_path / "out" / "old").write_text("previous export")
  (tmp_path / "staging").mkdir()
  rename = os.rename

  def stopped_second_rename(src, dst):
    if src == str(tmp_path / "staging"):
      raise cli.Interrupted(15)
    rename(src, dst)
  monkeypatch.setattr(export.os, "rename", stopped_second_rename)
  with pytest.raises(cli.Interrupted):
    export.swap_in(str(tmp_path / "staging"), str(tmp_path / "out"))
  assert (tmp_path / "out" / "old").read_text() == "previous export"


@pytest.mark.parametrize("out", [".", "..", "./", "here"])
def test_an_out_holding_the_current_directory_is_refused(tmp_path,
                                                         monkeypatch, out):
  """`--out=. --overwrite` wrote the export, then failed renaming '.'
  ("[Errno 16] Device or resource busy"); an empty '.' did without
  --overwrite."""
  (tmp_path / "here").mkdir()
  monkeypatch.chdir(tmp_path / "here")
  if out == "here":
    os.symlink(".", "here")  # a link to the current directory
  with pytest.raises(app.UsageError, match="contains the current directory"):
    export.check_out_dir(out, None, True, "/nonexistent/run")
  export.check_out_dir("new", None, False, "/nonexistent/run")


@pytest.mark.parametrize("mode", [0o644, 0o755])
def test_an_out_under_a_file_is_refused_naming_the_file(tmp_path, mode):
  """--out=FILE/sub was "FILE cannot be written (a read-only file system
  or no permission)"; for an executable FILE as root it passed, and the
  export failed after loading every weight with a bare "[Errno 20] Not a
  directory: FILE/sub.partial-HOST-PID"."""
  a_file = tmp_path / "notes.txt"
  a_file.write_text("x")
  a_file.chmod(mode)
  with pytest.raises(app.UsageError,
                     match=f"{a_file} is a file, not a directory"):
    export.check_out_dir(str(a_file / "sub" / "hf"), None, False,
                         "/nonexistent/run")


def test_an_empty_out_is_refused():
  """--out= read as '/': the export was staged in /.partial-PID and then
  failed to rename the root directory, after loading every weight."""
  with pytest.raises(app.UsageError, match="--out is empty"):
    export.check_out_dir("", None, False, "/nonexistent")


@pytest.mark.parametrize("checkpoint, tokenizer, flag", [
    ("gs://bucket/run", None, "--checkpoint"),
    ("/runs/run", "gs://bucket/DiffuCoder-7B", "--tokenizer")])
def test_an_object_store_source_is_one_line_saying_how_to_copy_it(
    checkpoint, tokenizer, flag):
  """A gs:// workdir was "not a trm.main workdir (it has no checkpoints/
  directory)", which did not say what to do."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  with pytest.raises(weights_io.CheckpointError,
                     match=f"{flag}='gs://.*gcloud storage cp -r gs://"):
    export.check_local_sources(checkpoint, tokenizer)
  export.check_local_sources("/runs/run", "/models/DiffuCoder-7B")


def write_tokenizer(directory, mask_id=500, extra_ids=()):
  """A tokenizer.json with the byte tokenizer's special ids (:tiny's model:
  <|endoftext|> 256, <|dlm_pad|> 257, <|im_end|> 258) and <|mask|> at
  `mask_id`; `extra_ids` adds tokens at those ids."""
  from tokenizers import Tokenizer, models  # pylint: disable=g-import-not-at-top
  vocab = {f"t{i}": i for i in range(8)}
  vocab.update({"<|endoftext|>": 256, "<|dlm_pad|>": 257, "<|im_end|>": 258,
                "<|mask|>": mask_id})
  vocab.update({f"x{i}": i for i in extra_ids})
  os.makedirs(directory, exist_ok=True)
  Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(
      os.path.join(directory, "tokenizer.json"))
  return directory


@pytest.mark.parametrize("mask_id, extra, message", [
    (400, (), "has <|mask|> = 400 but config.model.mask_token_id=500"),
    (500, (9000,), "has 9001 ids, more than config.model.vocab_size=512"),
])
def test_cli_checks_the_tokenizer_fits_the_model_before_the_weights(
    tmp_path, mask_id, extra, message, export_cli):
  """--tokenizer's tokenizer.json is copied beside the weights; one whose
  <|mask|> id or vocabulary does not fit the model made an export that
  every loader (trm.generate included) refuses, after a whole export."""
  workdir = _workdir(tmp_path)
  source = write_tokenizer(str(tmp_path / "source"), mask_id, extra)
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={source}")
  assert f"--tokenizer={source}: The tokenizer" in error
  assert message in error
  assert not (tmp_path / "hf").exists()


def test_cli_refuses_a_tokenizer_file_it_cannot_copy_before_the_weights(
    tmp_path, export_cli):
  """A FIFO among --tokenizer's files (special_tokens_map.json) failed the
  copy only after every weight had been read and written."""
  workdir = _workdir(tmp_path)
  source = write_tokenizer(str(tmp_path / "source"))
  os.mkfifo(os.path.join(source, "special_tokens_map.json"))
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={source}")
  assert "special_tokens_map.json is not a regular file" in error


def test_a_directory_matching_a_tokenizer_pattern_is_not_copied(tmp_path):
  """`tokenizer*` matched a directory (tokenizer_cache/), and copying it
  failed with IsADirectoryError after the weights were written."""
  source = write_tokenizer(str(tmp_path / "source"))
  os.mkdir(os.path.join(source, "tokenizer_cache"))
  out = tmp_path / "out"
  out.mkdir()
  assert export.copy_tokenizer_files(source, str(out)) == ["tokenizer.json"]


def test_a_tokenizer_link_out_of_its_directory_is_refused(tmp_path):
  """A crafted `tokenizer_config.json -> ~/.ssh/id_rsa` put the key into
  the export. Links inside the directory, and a Hugging Face snapshot's
  links to its repository's blobs, are copied as before."""
  secret = tmp_path / "id_rsa"
  secret.write_text("PRIVATE KEY")
  source = write_tokenizer(str(tmp_path / "source"))
  os.symlink(secret, os.path.join(source, "tokenizer_config.json"))
  out = tmp_path / "out"
  out.mkdir()
  with pytest.raises(app.UsageError, match=r"tokenizer_config\.json is a "
                     f"link out of that directory \\(to {secret}\\)"):
    export.copy_tokenizer_files(source, str(out))
  assert not list(out.iterdir())

  repo = tmp_path / "hub" / "models--org--coder"
  snapshot = repo / "snapshots" / "abc123"
  snapshot.mkdir(parents=True)
  (repo / "blobs").mkdir()
  os.replace(os.path.join(source, "tokenizer.json"), repo / "blobs" / "f00")
  os.symlink("../../blobs/f00", snapshot / "tokenizer.json")
  os.symlink("tokenizer.json", snapshot / "vocab.json")  # inside: fine
  assert sorted(export.copy_tokenizer_files(str(snapshot), str(out))) == [
      "tokenizer.json", "vocab.json"]
  assert not (out / "tokenizer.json").is_symlink()
  # A repository whose tokenizer is in a subfolder (snapshots/<rev>/sub/,
  # links to ../../../blobs/) was refused as linking out.
  (snapshot / "tokenizer").mkdir()
  os.symlink("../../../blobs/f00", snapshot / "tokenizer" / "tokenizer.json")
  assert export.tokenizer_files(str(snapshot / "tokenizer")) == [
      str(snapshot / "tokenizer" / "tokenizer.json")]


def test_a_snapshot_whose_blobs_is_a_link_allows_no_link_out(tmp_path):
  """A crafted `snapshots/<rev>` whose `../../blobs` is a link to `/` made
  every file on the machine a blob: `tokenizer_config.json -> id_rsa` was
  copied into the export."""
  secret = tmp_path / "id_rsa"
  secret.write_text("PRIVATE KEY")
  repo = tmp_path / "models--evil"
  snapshot = repo / "snapshots" / "abc123"
  snapshot.mkdir(parents=True)
  os.symlink("/", repo / "blobs")
  (snapshot / "tokenizer.json").write_text("{}")
  os.symlink(secret, snapshot / "tokenizer_config.json")
  with pytest.raises(app.UsageError, match=r"tokenizer_config\.json is a "
                     "link out of that directory"):
    export.tokenizer_files(str(snapshot))


def test_cli_refuses_a_format_of_another_family_before_the_weights(
    tmp_path, export_cli):
  """Each family is written in its own formats (a GPT config was refused as
  "model 'dream' does not know these keys" before GPT had an exporter)."""
  workdir = _workdir(tmp_path)
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        "--format=nanogpt")
  assert "--format=nanogpt: a dream run is written as hf" in error
  assert not (tmp_path / "hf").exists()


@pytest.mark.skipif(os.access("/proc/sys", os.W_OK),
                    reason="needs a directory this user cannot write")
def test_an_out_that_cannot_be_written_is_refused_first(tmp_path, export_cli):
  """An --out on a read-only file system failed only when the staging
  directory was made, after every weight had been read, naming the
  staging path ('No such file or directory: ...partial-PID')."""
  workdir = _workdir(tmp_path)
  error = _export_error(export_cli, workdir,
                        "--out=/proc/sys/trm-export-probe/hf")
  assert "/proc/sys cannot be written" in error


def test_cli_checks_the_sources_generation_config_before_the_weights(
    tmp_path, export_cli):
  """--tokenizer's generation_config.json replaces the export's; Dream's
  diffusion_generate reads its mask id, so one that is not the model's is
  refused before any weight is read."""
  workdir = _workdir(tmp_path)
  source = write_tokenizer(str(tmp_path / "source"))
  with open(os.path.join(source, "generation_config.json"), "w") as f:
    f.write('{"mask_token_id": 7, "pad_token_id": 256}')
  error = _export_error(export_cli, workdir, f"--out={tmp_path / 'hf'}",
                        f"--tokenizer={source}")
  assert ("generation_config.json: mask_token_id=7, but "
          "config.model.mask_token_id=500") in error
  assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("text, says", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "holds a JSON list, not a config"),
    ('{"a": ' + "[" * 100000 + "]" * 100000 + "}", "no checkpoint JSON"),
], ids=["not_json", "a_list", "nested"])
def test_a_runs_unreadable_config_json_is_refused_not_read_as_none(
    tmp_path, text, says):
  """Read as no record, the export described a GPT run by --config's
  optimizer settings and skipped the family check."""
  workdir = _workdir(tmp_path)
  assert export._recorded_config(str(workdir)) == {}  # pylint: disable=protected-access
  (workdir / "config.json").write_text(text)
  with pytest.raises(app.UsageError) as error:
    export._recorded_config(str(workdir))  # pylint: disable=protected-access
  message = str(error.value)
  assert message.startswith(f"{workdir / 'config.json'} ") and says in message
  assert message.endswith(
      "it is the run's record of its config: restore it from a copy, or "
      "move it aside to export by the checkpoint's shapes and --config "
      "alone.")


def _ended_pid() -> int:
  child = subprocess.Popen(["true"])
  child.wait()
  return child.pid


def _export_dir(path, text):
  path.mkdir()
  (path / "config.json").write_text(text)


def test_a_killed_exports_leftovers_are_removed(tmp_path):
  """A SIGKILL skips the export's `finally`: its staging directory (a
  half-written export, 15 GB for a 7B model) stayed for good, and so did
  the previous export renamed aside by --overwrite."""
  out = tmp_path / "hf"
  _export_dir(out, "new")
  host, dead = export._host(), _ended_pid()
  running = subprocess.Popen(["sleep", "60"])  # another live export
  try:
    _export_dir(tmp_path / f"hf.partial-{host}-{dead}", "half")
    _export_dir(tmp_path / f"hf.replaced-{dead}", "old")  # older naming
    _export_dir(tmp_path / f"hf.partial-{host}-{running.pid}", "running")
    _export_dir(tmp_path / f"hf.partial-otherhost-{dead}", "elsewhere")
    _export_dir(tmp_path / f"hf2.partial-{host}-{dead}", "another out")
    done = export.recover_interrupted(str(out))
  finally:
    running.kill()
    running.wait()
  assert len(done) == 2, done
  assert sorted(os.listdir(tmp_path)) == sorted([
      "hf", f"hf.partial-{host}-{running.pid}", f"hf.partial-otherhost-{dead}",
      f"hf2.partial-{host}-{dead}"])
  assert (out / "config.json").read_text() == "new"


def test_leftovers_under_this_processs_own_pid_are_an_earlier_ones(
    tmp_path):
  """A container restarted under the same host name runs its export as
  pid 1 again: the killed one's staging and renamed-aside export carry
  this process's pid. They were kept as a live export's, so the old
  export was never restored, and the next --overwrite failed renaming
  --out onto the non-empty OUT.replaced-HOST-PID after the whole export."""
  host, pid = export._host(), os.getpid()
  _export_dir(tmp_path / f"hf.replaced-{host}-{pid}", "old")
  _export_dir(tmp_path / f"hf.partial-{host}-{pid}", "half")
  done = export.recover_interrupted(str(tmp_path / "hf"))
  assert len(done) == 2, done
  assert sorted(os.listdir(tmp_path)) == ["hf"]
  assert (tmp_path / "hf" / "config.json").read_text() == "old"


def test_an_export_killed_between_its_renames_gets_the_old_one_back(
    tmp_path):
  """--overwrite renames the old export aside, then the new one in: killed
  between the two, there was no --out at all, only hf.replaced-PID."""
  host, dead = export._host(), _ended_pid()
  _export_dir(tmp_path / f"hf.replaced-{host}-{dead}", "old")
  _export_dir(tmp_path / f"hf.partial-{host}-{dead}", "new, complete")
  done = export.recover_interrupted(str(tmp_path / "hf") + os.sep)
  assert any("restored the previous export" in line for line in done), done
  assert sorted(os.listdir(tmp_path)) == ["hf"]
  assert (tmp_path / "hf" / "config.json").read_text() == "old"


def test_cli_removes_a_killed_exports_staging_directory_first(tmp_path):
  workdir = _workdir(tmp_path)
  out = tmp_path / "hf"
  _export_dir(out, "previous")
  staging = tmp_path / f"hf.partial-{export._host()}-{_ended_pid()}"
  _export_dir(staging, "half")
  result = subprocess.run(
      [sys.executable, "-m", "trm.export",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       f"--out={out}"],
      cwd=repo.ROOT, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  assert "is not empty" in result.stderr  # the refusal still comes
  assert f"warning: removed {staging}" in result.stderr, result.stderr
  assert not staging.exists()
  assert (out / "config.json").read_text() == "previous"


def test_a_nanogpt_export_of_another_optimizers_run_is_refused(tmp_path):
  """--format=nanogpt writes nanoGPT's AdamW state: a GPT run that trained
  with another config.optimizer (its config.json) is one line pointing at
  --format=hf, before its checkpoint is read (here a fake one). A run
  recorded before the field trained with AdamW; with no record, --config's
  value is the run's."""
  import json  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  workdir = _workdir(tmp_path)
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "gpt.py"), "shakespeare_char_cpu")
  config = config_lib.set_values(config, {"model.vocab_size": 65})
  record = json.loads(config.to_json_best_effort())
  for optimizer in ("lion", "adam_atan2"):
    (workdir / "config.json").write_text(json.dumps(
        dict(record, optimizer=optimizer)))
    with pytest.raises(app.UsageError) as error:
      export._gpt_writer(config, str(workdir), None, "nanogpt", None)  # pylint: disable=protected-access
    assert str(error.value) == (
        f"--format=nanogpt writes nanoGPT's AdamW state, but {workdir} "
        f"trained with config.optimizer={optimizer!r}: export its weights "
        "with --format=hf instead.")
  del record["optimizer"]
  (workdir / "config.json").write_text(json.dumps(record))
  config.optimizer = "sgd"  # --config's: the record's (implicit) AdamW wins
  export.check_nanogpt_optimizer(str(workdir), config)
  (workdir / "config.json").unlink()
  with pytest.raises(app.UsageError, match="optimizer='sgd'"):
    export.check_nanogpt_optimizer(str(workdir), config)
  config.optimizer = "adamw"
  export.check_nanogpt_optimizer(str(workdir), config)


# Session 77: an --out that holds or lies in what the export reads. With
# --overwrite the export is swapped in for the whole of --out, so the
# --config file in it, or a folder of the --tokenizer download it lies in,
# was deleted (`--config=A/diffucoder_7b.py:tiny --out=A --overwrite` left A
# holding only the export).


def test_cli_keeps_the_config_file_of_an_out_it_was_asked_to_overwrite(
    tmp_path, export_cli):
  workdir = _workdir(tmp_path)
  folder = tmp_path / "mine"
  folder.mkdir()
  config = folder / "diffucoder_7b.py"
  with open(os.path.join(repo.ROOT, "configs", "diffucoder_7b.py")) as f:
    config.write_text(f.read())
  result = export_cli.run(
      [f"--config={config}:tiny", f"--checkpoint={workdir}",
       f"--out={folder}", "--overwrite"],
      cwd=repo.ROOT, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-3000:]
  errors = [l for l in result.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and f"holds --config={config}" in errors[0], (
      result.stderr[-3000:])
  assert config.is_file()


@pytest.mark.parametrize("out", ["mine", "mine/..", "link_to_mine"])
def test_an_out_holding_the_config_file_is_refused(tmp_path, out):
  """Through `..` and links too (paths are compared resolved)."""
  (tmp_path / "mine").mkdir()
  config = tmp_path / "mine" / "gpt.py"
  config.write_text("")
  os.symlink(tmp_path / "mine", tmp_path / "link_to_mine")
  with pytest.raises(app.UsageError, match=f"holds --config={config}"):
    export.check_out_dir(str(tmp_path / out), None, True, "/nonexistent/run",
                         config=str(config))
  export.check_out_dir(str(tmp_path / "hf"), None, True, "/nonexistent/run",
                       config=str(config))


def test_cli_keeps_the_tokenizer_folder_an_out_in_it_would_replace(
    tmp_path, export_cli):
  """`--out=DOWNLOAD/original --overwrite --tokenizer=DOWNLOAD` deleted the
  download's original/ weights (exported, then swapped in for them)."""
  workdir = _workdir(tmp_path)
  source = write_tokenizer(str(tmp_path / "source"))
  (tmp_path / "source" / "original").mkdir()
  (tmp_path / "source" / "original" / "consolidated.pth").write_text("w")
  error = _export_error(export_cli, workdir,
                        f"--out={tmp_path / 'source' / 'original'}",
                        "--overwrite", f"--tokenizer={source}")
  assert f"lies in --tokenizer={source}" in error
  assert (tmp_path / "source" / "original" / "consolidated.pth").exists()


@pytest.mark.parametrize("out", ["source/original", "source/hf",
                                 "link/original", "source/x/../hf"])
def test_an_out_in_the_tokenizer_folder_is_refused(tmp_path, out):
  """The tokenizer folder (a Hugging Face download) is a source: no export
  goes into it, new or replacing, however the path is spelled."""
  source = write_tokenizer(str(tmp_path / "source"))
  (tmp_path / "source" / "original").mkdir()
  (tmp_path / "source" / "original" / "consolidated.pth").write_text("w")
  os.symlink(source, tmp_path / "link")
  with pytest.raises(app.UsageError, match=f"lies in --tokenizer={source}"):
    export.check_out_dir(str(tmp_path / out), source, True, "/nonexistent")
  export.check_out_dir(str(tmp_path / "hf"), source, True, "/nonexistent")


def test_an_existing_folder_of_the_run_is_replaced_only_if_an_export(
    tmp_path):
  """An --out in the --checkpoint workdir: a new folder, an empty one or an
  earlier export (its weights file, whatever was added beside it) may be
  written; any other folder there holds the run's files (its logs,
  evaluations), which the swap deleted."""
  workdir = _workdir(tmp_path)
  (workdir / "logs" / "train").mkdir(parents=True)
  (workdir / "logs" / "train" / "events").write_text("x")
  (workdir / "notes").mkdir()
  (workdir / "notes" / "todo.txt").write_text("x")
  # Files named like an export's but not one (an evaluation's step_N.json,
  # a step_N/ folder), and the run's folder on another disk through a link
  # in the workdir (at it or on the way to it).
  (workdir / "evals" / "step_7").mkdir(parents=True)
  (workdir / "evals" / "step_5.json").write_text("x")
  (tmp_path / "disk2" / "logs" / "a").mkdir(parents=True)
  (tmp_path / "disk2" / "logs" / "a" / "events").write_text("x")
  os.symlink(tmp_path / "disk2" / "logs", workdir / "linked_logs")
  os.symlink(tmp_path / "disk2", workdir / "disk2")
  for out in ("logs", "notes", "evals", "linked_logs", "disk2/logs",
              "linked_logs/a"):
    with pytest.raises(app.UsageError,
                       match=f"is a folder of --checkpoint={workdir}"):
      export.check_out_dir(str(workdir / out), None, True, str(workdir))
  for out, files in (("hf", ("config.json", "model.safetensors")),
                     ("nanogpt", ("ckpt.pt",)), ("upstream",
                                                 ("step_5", "all_config.yaml")),
                     ("uploaded", ("model.safetensors",
                                   ".cache/huggingface/upload/x")),
                     # Folders a user added to it (a conversion, the
                     # download's original/): still an earlier export.
                     ("converted", ("model-00001-of-00002.safetensors",
                                    "README.md", "onnx/model.onnx",
                                    "original/consolidated.00.pth")),
                     ("empty", ()), ("new", None)):
    if files is not None:
      (workdir / out).mkdir()
      for name in files:
        (workdir / out / name).parent.mkdir(parents=True, exist_ok=True)
        (workdir / out / name).write_text("x")
    export.check_out_dir(str(workdir / out), None, True, str(workdir))
