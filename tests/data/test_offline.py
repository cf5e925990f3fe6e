"""Without network, every download default fails at once in one line naming
the offline flags of the command in hand (`trm.core.hub`, the puzzle
builders, text inputs). No network is simulated by unresolvable hosts
(`.invalid` never resolves, RFC 2606), so these tests behave the same on a
machine with network."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import repo

from trm.core import hub as core_hub
from trm.data.puzzles import sudoku
from trm.data.text import windows as text_lib

NO_HUB = "http://hub.invalid"
NO_DATA_URL = "http://data.invalid/input.txt"
FAST_S = 5.0  # a failure without network must take less than this


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
  monkeypatch.setenv("HF_ENDPOINT", NO_HUB)
  monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # empty cache


def _one_line_error(call, error=ValueError) -> str:
  start = time.monotonic()
  with pytest.raises(error) as info:
    call()
  elapsed = time.monotonic() - start
  message = str(info.value)
  assert "\n" not in message, message
  assert elapsed < FAST_S, f"took {elapsed:.1f} s: {message}"
  return message


def test_download_and_snapshot_fail_fast_ending_with_the_hint(no_hub):
  hint = "pass --checkpoint=DIR (a local download)"
  message = _one_line_error(lambda: core_hub.download(
      "openai-community/gpt2", "config.json", offline_hint=hint),
      core_hub.HubUnavailable)
  assert message.endswith("; " + hint)
  assert "config.json of openai-community/gpt2" in message
  assert "hub.invalid does not resolve" in message
  message = _one_line_error(lambda: core_hub.snapshot(
      "openai-community/gpt2", allow_patterns=["*.json"], offline_hint=hint),
      core_hub.HubUnavailable)
  assert message.endswith("; " + hint) and "hub.invalid" in message


def test_a_local_copy_is_used_without_network(no_hub, tmp_path):
  (tmp_path / "train.csv").write_text("header\n")
  path = core_hub.download("sapientinc/sudoku-extreme", "train.csv",
                           repo_type="dataset", offline_hint="x",
                           local_dir=str(tmp_path))
  assert os.path.samefile(path, tmp_path / "train.csv")


def test_hf_hub_offline_never_looks_the_host_up(no_hub, monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")

  def looked_up(url):
    raise AssertionError(f"looked up {url} although HF_HUB_OFFLINE=1")

  monkeypatch.setattr(core_hub, "unreachable", looked_up)
  message = _one_line_error(lambda: core_hub.download(
      "org/name", "config.json", offline_hint="use DIR"),
      core_hub.HubUnavailable)
  assert "HF_HUB_OFFLINE is set" in message and message.endswith("use DIR")


def test_missing_huggingface_hub_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
  message = _one_line_error(lambda: core_hub.download(
      "org/name", "config.json", offline_hint="use DIR"),
      core_hub.HubUnavailable)
  assert "pip install -e .[hub]" in message and message.endswith("use DIR")


def test_sudoku_hint_follows_the_command(no_hub, tmp_path):
  builder = _one_line_error(lambda: sudoku.build_dataset(
      str(tmp_path / "a"), source="hub"))
  assert "--source=generate" in builder and "--csv_dir=DIR" in builder
  trainer = _one_line_error(lambda: sudoku.ensure_dataset(
      str(tmp_path / "b"), source="hub", field_prefix="config.data.build."))
  assert "--config.data.build.source=generate" in trainer
  assert "--config.data.build.csv_dir=DIR" in trainer
  assert " --source=" not in trainer and " --csv_dir=" not in trainer


def test_text_url_fails_fast_naming_the_input_flag(tmp_path):
  message = _one_line_error(lambda: text_lib.read_text(NO_DATA_URL), OSError)
  assert "data.invalid does not resolve" in message
  assert "--input=/path/to/input.txt" in message
  # trm.main prepares data.input: its flag is the config field.
  message = _one_line_error(lambda: text_lib.ensure_prepared(
      str(tmp_path / "d"), NO_DATA_URL, "char", process_index=0), OSError)
  assert "--config.data.input=/path/to/input.txt" in message
  assert not os.path.exists(tmp_path / "d" / "meta.json")


def _run(args, tmp_path, timeout):
  env = dict(os.environ, HF_ENDPOINT=NO_HUB, HF_HOME=str(tmp_path / "hf"),
             JAX_PLATFORMS="cpu")
  env.pop("HF_HUB_OFFLINE", None)
  return subprocess.run([sys.executable, "-m", *args], capture_output=True,
                        text=True, cwd=repo.ROOT, env=env, timeout=timeout)


def _error_line(proc, tool: str) -> str:
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.splitlines() if ": error: " in l]
  assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), (
      proc.stderr[-2000:])
  return lines[0]


def test_trainer_and_builder_command_lines(tmp_path):
  # The paper setup's default source is the Hub: trm.main stops before the
  # model is built or compiled, naming its own config overrides.
  workdir = tmp_path / "run"
  proc = _run(["trm.main", "--config=configs/trm_sudoku.py",
               f"--workdir={workdir}",
               f"--config.data.data_dir={tmp_path / 'data'}"], tmp_path, 120)
  line = _error_line(proc, "trm.main")
  assert "--config.data.build.source=generate" in line
  assert "--config.data.build.source=csv --config.data.build.csv_dir=DIR" in (
      line)
  assert " --source=" not in line
  assert not (workdir / "checkpoints").exists()
  assert "parameters" not in proc.stderr  # no model was built
  # The builder's own command line names its own flags.
  proc = _run(["trm.data.puzzles.sudoku", f"--output_dir={tmp_path / 'b'}",
               "--source=hub"], tmp_path, 60)
  line = _error_line(proc, "trm.data.puzzles.sudoku")
  assert "--source=generate" in line and "--source=csv --csv_dir=DIR" in line


def test_gpt2_hub_id_fails_fast_naming_init_checkpoint(no_hub, tmp_path):
  from test_gpt_task import tiny_config  # pylint: disable=g-import-not-at-top
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  config = tiny_config(tmp_path / "data", init_from="gpt2",
                       init_checkpoint="openai-community/gpt2",
                       **{"mesh.data": 8, "mesh.fsdp": 1, "mesh.model": 1})
  ctx = mesh_lib.ShardingContext.from_config(config)
  message = _one_line_error(
      lambda: families.build_task(config, str(tmp_path / "run"), ctx),
      core_hub.HubUnavailable)
  assert "hub.invalid does not resolve" in message
  assert "huggingface-cli download openai-community/gpt2" in message
  assert message.endswith("--config.init_checkpoint=DIR")


def test_dream_hub_id_is_downloaded_as_the_init_checkpoint(no_hub, tmp_path):
  # trm.main refused "config.init_checkpoint='apple/DiffuCoder-7B-Instruct'
  # is no directory", where DiffusionLM.from_pretrained and GPT's trainer
  # take a Hub id; it is now fetched (here: no network, one line).
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.set_values(
      config_lib.load_config(os.path.join(repo.ROOT, "configs",
                                          "diffucoder_7b.py"), "tiny"),
      {"init_checkpoint": "apple/DiffuCoder-7B-Instruct",
       "mesh.data": 8, "mesh.fsdp": 1, "mesh.model": 1})
  ctx = mesh_lib.ShardingContext.from_config(config)
  message = _one_line_error(
      lambda: families.build_task(config, str(tmp_path / "run"), ctx),
      FileNotFoundError)
  assert "hub.invalid does not resolve" in message
  assert ("huggingface-cli download apple/DiffuCoder-7B-Instruct --local-dir"
          " DIR) and pass config.init_checkpoint=DIR") in message
  assert not (tmp_path / "run").exists()


def test_a_host_that_resolves_but_does_not_answer(monkeypatch):
  # A closed local port stands for a firewalled host: refused at once, no
  # downloader retries.
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}/input.txt"
  assert "does not accept a connection" in core_hub.unreachable(url)
  monkeypatch.delenv("no_proxy", raising=False)
  monkeypatch.delenv("NO_PROXY", raising=False)
  monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
  # The proxy connects, not us: it is the proxy that is checked.
  assert core_hub.unreachable(url) == (
      "its proxy proxy.invalid does not resolve (no network?)")


@pytest.mark.parametrize("kept", ["tokenizer", "two_of_three_shards"])
def test_an_incomplete_cached_dream_snapshot_is_named_as_such(
    monkeypatch, tmp_path, kept):
  # Without network huggingface_hub returns the cached snapshot whatever it
  # holds (a download cut short, or trm.main's fetch of the tokenizer
  # alone); the loader then said "<cache path> has neither
  # model.safetensors.index.json nor model.safetensors" (or "...-00003-of-
  # 00003.safetensors (named in ...) is missing"), of a path never named.
  from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  commit = "0123456789abcdef0123456789abcdef01234567"
  repo_dir = tmp_path / "hub" / "models--org--tiny"
  snapshot = repo_dir / "snapshots" / commit
  snapshot.mkdir(parents=True)
  (repo_dir / "refs").mkdir()
  (repo_dir / "refs" / "main").write_text(commit)
  (snapshot / "tokenizer.json").write_text("{}")
  if kept != "tokenizer":
    (snapshot / "config.json").write_text("{}")
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {f"t{i}": f"model-0000{i}-of-00003.safetensors"
                        for i in (1, 2, 3)}}))
    for i in (1, 2):
      (snapshot / f"model-0000{i}-of-00003.safetensors").write_bytes(b"x")
  monkeypatch.setattr(constants, "HF_HUB_CACHE",
                      str(tmp_path / "hub"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  message = _one_line_error(
      lambda: inference.resolve_checkpoint("org/tiny", inference.CLI_NAMES),
      FileNotFoundError)
  assert message.startswith(f"--checkpoint=org/tiny: the Hugging Face "
                            f"cache's copy ({snapshot}) lacks "), message
  assert message.endswith("huggingface-cli download org/tiny --local-dir "
                          "DIR) and pass --checkpoint=DIR."), message
  assert (("config.json and the weights" in message) if kept == "tokenizer"
          else ("1 of the 3 weight files its model.safetensors.index.json "
                "names (model-00003-of-00003.safetensors)" in message)), message
