"""launch/tpu_pod.py: the gcloud commands it builds, without running gcloud."""
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import pytest
import repo

REPO = repo.ROOT
SCRIPT = os.path.join(REPO, "launch", "tpu_pod.py")

# launch/ is not a package; load the script as a module.
_spec = importlib.util.spec_from_file_location("tpu_pod", SCRIPT)
tpu_pod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tpu_pod)

TRAIN = ("python -m trm.main --config=configs/trm_sudoku.py "
         "--workdir=gs://bucket/run --distributed=true "
         "--config.total_steps=1000 --config.mesh.dcn_data=2")
MULTI = ["--name=trm-a", "--project=proj", "--zone=us-central2-b",
         "--accelerator_type=v4-64", "--num_slices=2",
         "--workdir=gs://bucket/run", "--config=configs/trm_sudoku.py",
         "--override=total_steps=1000", "--override=mesh.dcn_data=2",
         "--repo_url=https://github.com/example/trm.git", "--revision=abc123"]


_REAL_RUN = subprocess.run


def _is_local(command):
  """The launcher's local config check (a child Python, and git reading
  --revision here; not gcloud), which the fakes of subprocess.run below let
  run."""
  return command[0] in (sys.executable, "git")


def _args(*flags, sub="all"):
  return tpu_pod.parse_args([sub, *flags])


def _remote(command):
  """The remote shell string of a `tpu-vm ssh ... --command=...` argv."""
  (script,) = [a[len("--command="):] for a in command
               if a.startswith("--command=")]
  return script


def _is(command, *words):
  expected = ["gcloud", "compute", "tpus", *words]
  return command[:len(expected)] == expected


_CHECKED: dict = {}  # check_config's outcome per input, for this module


@pytest.fixture(autouse=True)
def _config_checked_once(monkeypatch):
  """`check_config` loads the config in a child Python (1-3 s); most tests
  launch the same config with the same overrides, so each distinct input
  is checked once here and its outcome (None or the LaunchError) reused."""
  check = tpu_pod.check_config

  def check_once(args):
    key = (args.skip_config_check, args.code_dir, args.config,
           tuple(args.override), tuple(args.trainer_flag), args.num_slices, args.accelerator_type,
           sys.executable, os.environ.get("PYTHONPATH"), args.repo_url,
           args.revision, tpu_pod.REPO_ROOT)
    if key not in _CHECKED:
      try:
        check(args)
        _CHECKED[key] = None
      except tpu_pod.LaunchError as e:
        _CHECKED[key] = e
    if _CHECKED[key] is not None:
      raise _CHECKED[key]

  monkeypatch.setattr(tpu_pod, "check_config", check_once)


@pytest.fixture(autouse=True)
def _fake_trees_are_projects(monkeypatch):
  """Most tests copy small fake --code_dir trees; the check that a tree
  holds the project (`_PROJECT_FILES`) is tested on its own."""
  monkeypatch.setattr(tpu_pod, "_PROJECT_FILES", ())


@pytest.fixture(name="no_gcloud")
def _no_gcloud(tmp_path):
  """PATH whose `gcloud` records being called (a real one may be installed)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  marker = tmp_path / "gcloud_was_called"
  stub = bin_dir / "gcloud"
  stub.write_text(f"#!/bin/sh\ntouch {shlex.quote(str(marker))}\nexit 1\n")
  stub.chmod(0o755)
  env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  return env, marker


def _cli(env, *argv):
  return subprocess.run([sys.executable, "launch/tpu_pod.py", *argv],
                        cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=60, check=False)


def test_cli_dry_run_two_slices(no_gcloud):
  env, marker = no_gcloud
  proc = _cli(env, "all", *MULTI, "--dry_run")
  assert proc.returncode == 0, proc.stderr
  assert not marker.exists()
  commands = [shlex.split(line) for line in proc.stdout.splitlines()]
  assert commands and all(c[0] == "gcloud" for c in commands)

  creates = [c for c in commands if _is(c, "queued-resources", "create")]
  assert len(creates) == 1
  assert creates[0][5] == "trm-a"
  for flag in ("--node-count=2", "--node-prefix=trm-a",
               "--accelerator-type=v4-64",
               "--runtime-version=tpu-ubuntu2204-base",
               "--zone=us-central2-b", "--project=proj"):
    assert flag in creates[0]
  # Provisioning is waited for before anything is ssh'd into.
  waits = [c for c in commands if _is(c, "queued-resources", "describe")]
  assert commands.index(waits[0]) < min(
      i for i, c in enumerate(commands) if _is(c, "tpu-vm", "ssh"))

  ssh = [c for c in commands if _is(c, "tpu-vm", "ssh")]
  setup = [c for c in ssh if "pip install" in _remote(c)]
  run = [c for c in ssh if "trm.main" in _remote(c) and "pkill" in _remote(c)
         and "nohup" in _remote(c)]
  logs = [c for c in ssh if "tail" in _remote(c)]
  for group in (setup, run):
    assert [c[5] for c in group] == ["trm-a-0", "trm-a-1"]
    assert all("--worker=all" in c for c in group)
  assert all("git clone" in _remote(c) and "abc123" in _remote(c)
             and "pip install -q -e '.[tpu]'" in _remote(c) for c in setup)
  for slice_id, command in enumerate(run):
    script = _remote(command)
    assert TRAIN in script
    assert "~/trm_run.log" in script
    tokens = shlex.split(script)
    assert "MEGASCALE_NUM_SLICES=2" in tokens
    assert f"MEGASCALE_SLICE_ID={slice_id}" in tokens
    assert "MEGASCALE_PORT=8081" in tokens
    assert any(t.startswith("MEGASCALE_COORDINATOR_ADDRESS=") and
               t.endswith(":8081") for t in tokens)
  assert len(logs) == 1 and logs[0][5] == "trm-a-0"
  assert "--worker=0" in logs[0]

  proc = _cli(env, "delete", *MULTI, "--dry_run")
  assert proc.returncode == 0, proc.stderr
  (delete,) = [shlex.split(line) for line in proc.stdout.splitlines()]
  assert _is(delete, "queued-resources", "delete")
  assert {"trm-a", "--force", "--quiet"} <= set(delete)
  assert not marker.exists()


def test_cli_dry_run_single_v4_8(no_gcloud):
  env, marker = no_gcloud
  flags = ["--name=one", "--zone=us-central2-b", "--accelerator_type=v4-8",
           "--config=configs/trm_sudoku.py:cpu", "--workdir=runs/x",
           "--code_dir=."]
  proc = _cli(env, "all", *flags, "--dry_run")
  assert proc.returncode == 0, proc.stderr
  commands = [shlex.split(line) for line in proc.stdout.splitlines()]
  assert _is(commands[0], "tpu-vm", "create")
  assert {"one", "--accelerator-type=v4-8",
          "--version=tpu-ubuntu2204-base"} <= set(commands[0])
  assert not any(_is(c, "queued-resources") for c in commands)
  (pack,) = [c for c in commands if c[0] == "tar"]
  assert any(_is(c, "tpu-vm", "scp") and pack[2] in c for c in commands)
  # Unpacked beside ~/trm, then renamed into place (never over it).
  unpack = _remote(next(c for c in commands if "tar -xzf" in " ".join(c)))
  assert unpack.startswith(
      'here=$(readlink -f ~/trm) && rm -rf "$here.new" && mkdir -p '
      '"$here.new" && tar -xzf ~/trm_upload.tar.gz -C "$here.new" && ')
  assert "os.rename(new, here)" in unpack
  script = _remote(next(c for c in commands if "nohup" in " ".join(c)))
  # A single host: no slice variables, and a local workdir is allowed.
  assert "MEGASCALE" not in script
  assert ("python -m trm.main --config=configs/trm_sudoku.py:cpu "
          "--workdir=runs/x < /dev/null;") in script
  assert ") > ~/trm_run.log 2>&1" in script
  proc = _cli(env, "delete", *flags, "--dry_run")
  assert shlex.split(proc.stdout) == [
      "gcloud", "compute", "tpus", "tpu-vm", "delete", "one",
      "--zone=us-central2-b", "--quiet"]
  assert not marker.exists()


def test_missing_gcloud_is_one_line(tmp_path):
  """Without the Cloud SDK the first gcloud call was a traceback."""
  result = _cli(dict(os.environ, PATH=str(tmp_path)), "delete",
                "--name=trm-a")
  assert result.returncode == 127, result.stderr
  assert result.stderr.splitlines() == [
      "tpu_pod.py: cannot run gcloud: not found on PATH (install the Google "
      "Cloud SDK and log in; --dry_run only prints the commands)"]


@pytest.mark.parametrize("sub", tpu_pod.SUBCOMMANDS)
def test_dry_run_never_calls_subprocess(monkeypatch, capsys, sub):
  def fail(command, **k):
    if _is_local(command):
      return _REAL_RUN(command, **k)
    raise AssertionError(f"subprocess.run called in a dry run: {command}")
  monkeypatch.setattr(subprocess, "run", fail)
  assert tpu_pod.main([sub, *MULTI, "--dry_run"]) == 0
  printed = capsys.readouterr().out.splitlines()
  assert printed and all(line.startswith("gcloud ") for line in printed)


def test_real_run_uses_argv_lists_and_looked_up_coordinator(monkeypatch):
  calls = []

  def fake_run(command, **kwargs):
    assert isinstance(command, list) and not kwargs.get("shell")
    if _is_local(command):
      return _REAL_RUN(command, **kwargs)
    calls.append(command)
    out = ""
    if "--format=value(state.state)" in command:
      out = "ACTIVE\n"
    elif any(a.startswith("--flatten=networkEndpoints") for a in command):
      out = "10.1.2.3\n10.1.2.4\n"
    return subprocess.CompletedProcess(command, 0, stdout=out, stderr="")

  monkeypatch.setattr(subprocess, "run", fake_run)
  assert tpu_pod.main(["all", *MULTI]) == 0
  runs = [c for c in calls if "nohup" in " ".join(c)]
  assert len(runs) == 2
  for command in runs:
    tokens = shlex.split(_remote(command))
    assert "MEGASCALE_COORDINATOR_ADDRESS=10.1.2.3:8081" in tokens
  assert "--worker=0" in calls[-1]  # logs last


@pytest.mark.parametrize("failure, code", [
    (subprocess.CalledProcessError(255, ["gcloud"]), 255),
    (KeyboardInterrupt(), 130)])
def test_a_failed_start_stops_the_trainer_on_every_slice(monkeypatch,
                                                         capsys, failure,
                                                         code):
  """Slice 1's start failed (or Ctrl-C came) after slice 0's trainers had
  started: they were left waiting for slice 1, holding their TPUs, and the
  launcher exited."""
  calls = []

  def run(command, check=False, **kwargs):
    if _is_local(command):
      return _REAL_RUN(command, check=check, **kwargs)
    calls.append(command)
    if check and "trm-a-1" in command and "nohup" in " ".join(command):
      raise failure
    return subprocess.CompletedProcess(command, 0, stdout="", stderr="")

  monkeypatch.setattr(subprocess, "run", run)
  assert tpu_pod.main(["run", *MULTI,
                       "--coordinator_address=10.0.0.9"]) == code
  starts = [c[5] for c in calls if "nohup" in " ".join(c)]
  assert starts == ["trm-a-0", "trm-a-1"]
  stops = [c[5] for c in calls[len(starts):]]
  assert stops == ["trm-a-0", "trm-a-1"]
  assert all("pkill -f" in _remote(c) for c in calls[len(starts):])
  assert "stopping it on every worker" in capsys.readouterr().err


def test_builders_match_cli():
  args = _args(*MULTI, "--coordinator_address=10.0.0.9")
  assert [c[5] for c in tpu_pod.create_commands(args)] == ["trm-a"]
  assert tpu_pod.node_names(args) == ["trm-a-0", "trm-a-1"]
  assert tpu_pod.megascale_env(args, 1, "10.0.0.9") == {
      "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.9:8081",
      "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_SLICE_ID": "1",
      "MEGASCALE_PORT": "8081"}
  assert tpu_pod.train_command(args) == TRAIN
  # trm.main's flags that are not config fields, after the overrides.
  flagged = _args(*MULTI, "--trainer_flag=distributed_timeout=900",
                  "--trainer_flag=--compilation_cache=off")
  assert tpu_pod.train_command(flagged) == (
      TRAIN + " --distributed_timeout=900 --compilation_cache=off")
  for command in tpu_pod.stop_commands(args):
    assert "--worker=all" in command and "pkill -f" in _remote(command)
  no_env = _args(*MULTI, "--no_megascale_env")
  assert all("MEGASCALE" not in _remote(c) for c in tpu_pod.run_commands(no_env))


def test_kill_pattern_spares_its_own_shell():
  pattern = tpu_pod._TRAINER_PATTERN  # pylint: disable=protected-access
  assert re.search(pattern, "python -m trm.main --config=c --workdir=w")
  assert re.search(pattern, "/home/u/trm_venv/bin/python3.10 -m trm.main")
  script = _remote(tpu_pod.run_commands(_args(*MULTI))[0])
  # pkill -f matches the full command line of the remote `bash -c SCRIPT`.
  assert not re.search(pattern, f"bash -c {script}")
  assert not re.search(pattern, "python -m trm.mainx")


@pytest.mark.parametrize("flag, value", [
    ("--workdir", "gs://bucket/run; rm -rf /"),
    ("--workdir", "gs://bucket/my run $(reboot) `id` 'x' \"y\""),
    ("--override", "note=a b; rm -rf / && echo 'hi'"),
])
def test_values_are_quoted_in_remote_command(flag, value):
  flags = [f for f in MULTI if not f.startswith(flag)]
  # Not a config field: the local config check is not what is tested.
  args = _args(*flags, f"{flag}={value}", "--skip_config_check")
  expected = (f"--workdir={value}" if flag == "--workdir"
              else f"--config.{value}")
  for command in tpu_pod.run_commands(args):
    tokens = shlex.split(_remote(command))
    assert expected in tokens
    assert "rm" not in tokens and "reboot" not in " ".join(
        t for t in tokens if t != expected)


_INJECTION = "x'; touch /tmp/pwned; echo \"$(id)\" `id` $HOME"


@pytest.mark.parametrize("flag, expected", [
    ("--env=NOTE", "NOTE={}"),
    ("--repo_url", "{}"),
    ("--revision", "{}"),
])
def test_other_values_are_quoted_in_remote_scripts(flag, expected):
  """--env values, --repo_url and --revision reach the remote shell as one
  word each, never as shell syntax (--coordinator_address takes a host
  name only: test_coordinator_address_is_a_host_without_port)."""
  name = flag.split("=")[0]
  base = [f for f in MULTI if f.split("=")[0] != name]
  args = _args(*base, f"{flag}={_INJECTION}")
  scripts = [_remote(c) for c in tpu_pod.setup_commands(args)
             + tpu_pod.run_commands(args)]
  seen = False
  for script in scripts:
    tokens = shlex.split(script)
    assert "touch" not in tokens and "id" not in tokens, script
    seen |= expected.format(_INJECTION) in tokens
  assert seen


@pytest.mark.parametrize("value", [
    "10.0.0.2:8081",  # trm.main's --coordinator_address is HOST:PORT
    "t-0.internal:1234", "fd00::2", "-x", "a b", _INJECTION])
def test_coordinator_address_is_a_host_without_port(capsys, value):
  """A port in it gave MEGASCALE_COORDINATOR_ADDRESS=10.0.0.2:8081:8081."""
  base = [f for f in MULTI if not f.startswith("--coordinator_address")]
  with pytest.raises(SystemExit) as e:
    _args(*base, f"--coordinator_address={value}", sub="run")
  assert e.value.code == 2
  assert "--coordinator_address: slice 0 worker 0's IP or host name only" in (
      capsys.readouterr().err)


@pytest.mark.parametrize("value, address", [
    ("10.0.0.2", "10.0.0.2:8081"),
    ("trm-a-0.internal", "trm-a-0.internal:8081"),
    ("[fd00::2]", "[fd00::2]:8081")])
def test_coordinator_address_gets_the_megascale_port(value, address):
  args = _args(*MULTI, f"--coordinator_address={value}", sub="run")
  for command in tpu_pod.run_commands(args, tpu_pod.coordinator_ip(args)):
    assert f"MEGASCALE_COORDINATOR_ADDRESS={address}" in shlex.split(
        _remote(command))


def test_config_path_with_spaces_is_one_token(tmp_path):
  cfg = tmp_path / "my configs" / "a;b.py"
  cfg.parent.mkdir()
  cfg.write_text("")
  flags = [f for f in MULTI if not f.startswith(("--config", "--repo_url"))]
  args = _args(*flags, f"--code_dir={tmp_path}",
               "--config=my configs/a;b.py:variant x", "--skip_config_check")
  tokens = shlex.split(_remote(tpu_pod.run_commands(args)[0]))
  assert "--config=my configs/a;b.py:variant x" in tokens


@pytest.mark.parametrize("flags, names", [
    (["--workdir=/tmp/run"], "--workdir"),
    (["--workdir=runs/x"], "--workdir"),
    (["--accelerator_type=v4_64"], "--accelerator_type"),
    (["--accelerator_type=v4-12"], "--accelerator_type"),
    (["--accelerator_type=tpu-64"], "--accelerator_type"),
    (["--num_slices=0"], "--num_slices"),
    # Looked up at --revision (MULTI's is not in this repository).
    (["--config=configs/missing.py", "--revision=HEAD"], "--config"),
    (["--override=total_steps"], "--override"),
    (["--name=Bad_Name"], "--name"),
    (["--code_dir=."], "--repo_url"),  # both sources given
    # A trailing newline passed `$`; the --env name is not quoted remotely.
    (["--env=NOTE\n=x"], "--env"),
    (["--name=trm-a\n"], "--name"),
    (["--override=total_steps\n=1"], "--override"),
    (["--accelerator_type=v4-64\n"], "--accelerator_type"),
    # git takes a leading '-' as an option: --upload-pack runs a command.
    (["--revision=--upload-pack=touch /tmp/pwned;git-upload-pack"],
     "--revision"),
    (["--repo_url=--upload-pack=touch /tmp/pwned"], "--repo_url"),
    # NaN: the queued resource's deadline never came; 0 or less: no wait.
    (["--max_wait_minutes=nan"], "--max_wait_minutes"),
    (["--max_wait_minutes=0"], "--max_wait_minutes"),
    (["--max_wait_minutes=-5"], "--max_wait_minutes"),
    # A config field goes in --override; the launcher sets the job's own.
    (["--trainer_flag=config.total_steps=3"], "goes in --override"),
    (["--trainer_flag=workdir=gs://b/other"], "set by the launcher"),
    (["--trainer_flag=distributed_timeout"], "--trainer_flag"),
])
def test_bad_flags_are_rejected_naming_the_flag(capsys, flags, names):
  keys = {f.split("=")[0] for f in flags}
  base = [f for f in MULTI if f.split("=")[0] not in keys]
  with pytest.raises(SystemExit) as e:
    _args(*base, *flags)
  assert e.value.code == 2
  assert names in capsys.readouterr().err


@pytest.mark.parametrize("slices, overrides, ok", [
    (2, ["mesh.dcn_data=4"], False), (1, ["mesh.dcn_data=2"], False),
    (2, ["mesh.dcn_data=0"], False),
    (4, ["mesh.dcn_data=2", "mesh.dcn_fsdp=1", "mesh.dcn_model=1"], False),
    (2, ["mesh.dcn_data=2"], True), (1, ["mesh.dcn_data=1"], True),
    (4, ["mesh.dcn_data=2", "mesh.dcn_fsdp=2"], True),
    # The config file is read: trm_sudoku.py leaves dcn_fsdp at 1.
    (4, ["mesh.dcn_data=2"], False),
    # The trainer's parser refuses it (was a ValueError here: '²'.isdigit()).
    (2, ["mesh.dcn_data=\u00b2"], False),
])
def test_dcn_overrides_must_fit_the_slice_count(capsys, slices, overrides,
                                                ok):
  """--num_slices=2 --override=mesh.dcn_data=4 created, set up and started
  the slices; every worker's trainer then refused the mesh."""
  flags = ["--name=a", "--accelerator_type=v4-8", "--workdir=gs://b/r",
           "--config=configs/trm_sudoku.py", f"--num_slices={slices}",
           *(f"--override={o}" for o in overrides)]
  if ok:
    _args(*flags, sub="run")
    return
  for sub in ("run", "all"):
    with pytest.raises(SystemExit):
      _args(*flags, f"--code_dir={REPO}", sub=sub)
    err = capsys.readouterr().err
    assert (f"--num_slices={slices}" in err
            or "mesh.dcn_data takes an integer" in err), err


def test_env_cannot_set_the_launchers_megascale_variables(capsys):
  """--env=MEGASCALE_PORT=9999 was exported, then replaced by 8081."""
  with pytest.raises(SystemExit):
    _args(*MULTI, "--env=MEGASCALE_PORT=9999", sub="run")
  assert "--env: MEGASCALE_PORT is exported by the launcher" in (
      capsys.readouterr().err)
  # Without the launcher's exports the value is the user's own.
  args = _args(*MULTI, "--env=MEGASCALE_PORT=9999", "--no_megascale_env",
               sub="run")
  for command in tpu_pod.run_commands(args):
    assert "MEGASCALE_PORT=9999" in shlex.split(_remote(command))


@pytest.mark.parametrize("accelerator, slices, joins", [
    ("v4-8", 1, False), ("v4-64", 1, True), ("v4-8", 2, True),
    ("v5litepod-8", 1, False), ("v5litepod-16", 1, True)])
def test_several_hosts_join_jax_distributed(accelerator, slices, joins):
  """trm.main's --distributed=auto finds the workers in TPU_WORKER_HOSTNAMES
  or MEGASCALE_NUM_SLICES; a Cloud TPU VM lists them in its metadata (jax's
  GceTpuCluster reads it), so one multi-host slice ran without
  jax.distributed (Orbax's async checkpoint barrier needs its client)."""
  args = _args("--name=a", f"--accelerator_type={accelerator}",
               f"--num_slices={slices}", "--workdir=gs://b/r",
               "--config=configs/trm_sudoku.py",
               f"--override=mesh.dcn_data={slices}", sub="run")
  tokens = shlex.split(tpu_pod.train_command(args))
  assert ("--distributed=true" in tokens) == joins


def test_multi_host_workdir_check_counts_slices():
  # One v4-8 host may use a local workdir; two v4-8 slices may not.
  single = ["--name=a", "--accelerator_type=v4-8", "--workdir=runs/x",
            "--config=configs/trm_sudoku.py"]
  _args(*single, sub="run")
  with pytest.raises(SystemExit):
    _args(*single, "--num_slices=2", sub="run")


def test_an_absurd_slice_count_is_refused_before_any_command(monkeypatch,
                                                             capsys):
  """--num_slices=10**8 built a command per slice for minutes."""
  def per_slice(args):
    raise AssertionError("a command per slice was built")
  monkeypatch.setattr(tpu_pod, "node_names", per_slice)
  bound = tpu_pod.MAX_NUM_SLICES
  for slices in (bound + 1, 10**8):
    flags = [f for f in MULTI if not f.startswith(("--num_slices",
                                                   "--override=mesh"))]
    started = time.monotonic()
    with pytest.raises(SystemExit):
      _args(*flags, f"--num_slices={slices}",
            f"--override=mesh.dcn_data={slices}", "--dry_run")
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert f"--num_slices: at most {bound:,} slices" in err, err
    assert f"got {slices:,}" in err


def test_the_largest_slice_count_builds_its_commands_at_once(monkeypatch,
                                                            tmp_path):
  """At the bound every sub-command's commands are built in about a second
  on a loaded host (a quadratic step would take minutes); the setup's
  unpack script is built once, not once per slice."""
  slices = tpu_pod.MAX_NUM_SLICES
  args = _args("--name=a", "--accelerator_type=v4-64",
               f"--num_slices={slices}", "--workdir=gs://b/r",
               "--config=configs/trm_sudoku.py", f"--code_dir={REPO}",
               f"--override=mesh.dcn_data={slices}", "--skip_config_check")
  unpack = tpu_pod.code_unpack_script
  built = []
  monkeypatch.setattr(tpu_pod, "code_unpack_script",
                      lambda: built.append(1) or unpack())
  started = time.monotonic()
  setup = tpu_pod.setup_commands(args, str(tmp_path))
  run = tpu_pod.run_commands(args)
  stop = tpu_pod.stop_commands(args)
  others = (tpu_pod.create_commands(args) + tpu_pod.logs_commands(args)
            + tpu_pod.delete_commands(args))
  assert time.monotonic() - started < 30
  assert (len(setup), len(run), len(stop), len(others)) == (
      1 + 2 * slices, slices, slices, 3)
  assert _remote(run[-1]).count(f"MEGASCALE_SLICE_ID={slices - 1}") == 1
  assert len(built) == 1


@pytest.mark.parametrize("accelerator, hosts", [
    ("v4-8", 1), ("v4-16", 2), ("v4-64", 8), ("v5p-128", 16), ("v2-32", 4),
    ("v5litepod-8", 1), ("v5litepod-16", 4), ("v6e-256", 64)])
def test_hosts_per_slice(accelerator, hosts):
  assert tpu_pod.hosts_per_slice(accelerator) == hosts


@pytest.mark.parametrize("accelerator, hosts", [
    ("v4-384", 48), ("v4-8192", 1024), ("v5p-12288", 1536), ("v5p-640", 80),
    ("v3-2048", 256),
    ("v2-512", 64), ("v5litepod-1", 1), ("v6e-4", 1), ("v6e-128", 32)])
def test_the_largest_and_odd_sold_slices_are_taken(accelerator, hosts):
  assert tpu_pod.hosts_per_slice(accelerator) == hosts


@pytest.mark.parametrize("accelerator", [
    "v4-8000000", "v4-24", "v4-96", "v4-8320", "v4-640", "v4-896",
    "v5p-896", "v5p-12416", "v5p-0",
    "v5litepod-48", "v5litepod-2", "v6e-512", "v2-64", "v3-16", "v3-4096"])
def test_a_slice_no_one_sells_is_refused_with_the_sizes_sold(accelerator):
  # gcloud was first to refuse them (after the config check and the code
  # archive); v5litepod-48 passed as 12 hosts.
  gen = accelerator.split("-")[0]
  with pytest.raises(tpu_pod.LaunchError, match=(
      rf"^--accelerator_type: no {gen} slice of size \d+ is sold; {gen} "
      rf"slices are {gen}-\d+, ")):
    tpu_pod.hosts_per_slice(accelerator)


def test_code_dir_leaves_ignored_runs_and_data_behind(tmp_path):
  """--code_dir copies the code, not the runs and datasets beside it: a git
  checkout's .gitignore decides; elsewhere the default excludes do."""
  tree = {"trm/a.py": "x", "configs/c.py": "x", "runs/x/ckpt": "x",
          "data/big.npy": "x", "notes.txt": "x", "trm/__pycache__/a.pyc": "x"}
  for name, text in tree.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  plain = tpu_pod.code_files(str(tmp_path))
  assert plain == ["configs/c.py", "notes.txt", "trm/a.py"]
  assert tpu_pod.code_files(str(tmp_path), ["notes*"]) == [
      "configs/c.py", "trm/a.py"]
  (tmp_path / ".gitignore").write_text("runs/\n__pycache__/\n")
  subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
  in_git = tpu_pod.code_files(str(tmp_path))
  assert "runs/x/ckpt" not in in_git and "data/big.npy" in in_git
  assert "trm/__pycache__/a.pyc" not in in_git
  # The archive holds exactly those files.
  args = _args(*[f for f in MULTI if not f.startswith("--repo_url")],
               f"--code_dir={tmp_path}", "--exclude=data", sub="setup")
  with tempfile.TemporaryDirectory() as stage:  # outside the code
    commands = tpu_pod.setup_commands(args, stage)
    assert commands[0][0] == "tar"
    subprocess.run(commands[0], check=True)
    listed = subprocess.run(["tar", "-tzf", commands[0][2]], check=True,
                            capture_output=True, text=True).stdout.split()
  assert sorted(listed) == [".gitignore", ".trm_code_files.new",
                            "configs/c.py", "notes.txt", "trm/a.py"]


def test_a_config_the_workers_will_not_have_is_refused(tmp_path, capsys):
  """--config passed when its file existed here, but --code_dir copies
  only what .gitignore and --exclude leave (a config under runs/ stays
  behind), and a path out of the tree (../x.py) is never under ~/trm: the
  slices were created and set up, then every trainer failed to find it."""
  for name in ("configs/c.py", "runs/mine.py"):
    (tmp_path / "code" / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "code" / name).write_text("x")
  (tmp_path / "code" / ".gitignore").write_text("runs/\n")
  subprocess.run(["git", "init", "-q", str(tmp_path / "code")], check=True)
  single = ["--name=t", "--accelerator_type=v4-8", "--workdir=/tmp/w",
            "--skip_config_check"]
  code = f"--code_dir={tmp_path / 'code'}"
  for sub, flags, needle in (
      ("all", [code, "--config=runs/mine.py"],
       "not among the files --code_dir"),
      ("run", [code, "--config=configs/c.py", "--exclude=configs"],
       "not among the files --code_dir"),
      ("all", [code, "--config=../code/configs/c.py"],
       "outside the code's tree"),
      ("run", ["--config=../" + os.path.basename(REPO) +
               "/configs/trm_sudoku.py"], "outside the code's tree")):
    with pytest.raises(SystemExit) as e:
      _args(*single, *flags, sub=sub)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err.strip().splitlines()[-1]
  _args(*single, code, "--config=configs/c.py:variant")
  _args(*single, code, "--config=./configs/c.py", sub="run")


def test_a_code_dir_that_would_copy_no_project_is_refused(tmp_path, capsys,
                                                          monkeypatch):
  """--code_dir=<not the project> (a dataset folder), or an --exclude that
  leaves out trm/ or setup.py, was copied to every worker, whose
  `pip install -e '.[tpu]'` or trainer then failed."""
  monkeypatch.setattr(tpu_pod, "_PROJECT_FILES", ("setup.py", "trm/main.py"))
  for name in ("setup.py", "trm/main.py", "configs/c.py"):
    (tmp_path / "code" / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "code" / name).write_text("x")
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "a.npy").write_text("x")
  single = ["--name=t", "--accelerator_type=v4-8", "--workdir=/tmp/w",
            "--skip_config_check", "--config=configs/c.py"]
  code = f"--code_dir={tmp_path / 'code'}"
  for sub, flags in (("setup", [f"--code_dir={tmp_path / 'other'}"]),
                     ("all", [code, "--exclude=trm"]),
                     ("setup", [code, "--exclude=setup.py"])):
    with pytest.raises(SystemExit) as e:
      _args(*single, *flags, sub=sub)
    assert e.value.code == 2
    assert "--code_dir: " in capsys.readouterr().err.strip().splitlines()[-1]
  _args(*single, code, "--exclude=*.md")


def test_setup_fetches_from_the_repo_url_given(tmp_path):
  """A second setup with another --repo_url fetched the revision from the
  first URL (the existing clone's origin): workers ran the old code."""
  for name in ("a", "b"):
    repo_dir = tmp_path / name
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo_dir)],
                   check=True)
    (repo_dir / "who.txt").write_text(name)
    subprocess.run(["git", "-C", str(repo_dir), "add", "who.txt"], check=True)
    subprocess.run(["git", "-C", str(repo_dir), "-c", "user.name=n", "-c",
                    "user.email=n@example.com", "commit", "-qm", name],
                   check=True)
  home = tmp_path / "home"
  home.mkdir()
  install = " && " + tpu_pod._install_script()  # pylint: disable=protected-access
  for name in ("a", "b"):
    args = _args("--name=w", f"--repo_url={tmp_path / name}",
                 "--revision=main", sub="setup")
    script = _remote(tpu_pod.setup_commands(args)[0])
    assert script.endswith(install)
    # The worker's part that gets the code, run here with HOME as the
    # worker's home directory.
    subprocess.run(["bash", "-c", script[:-len(install)]], check=True,
                   env=dict(os.environ, HOME=str(home)))
    assert (home / "trm" / "who.txt").read_text() == name


def _can_mount() -> bool:
  """Whether this host lets a test mount in a namespace of its own."""
  try:
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True,
                          check=False).returncode == 0
  except OSError:
    return False


@pytest.mark.skipif(not _can_mount(), reason="no unshare -rm here")
def test_code_dir_setup_refuses_a_mount_point_inside_the_tree(tmp_path):
  """A disk mounted inside ~/trm moved with the old tree into ~/trm.old:
  ~/trm/data became an empty folder. Now the setup stops with one line
  and ~/trm as it was."""
  home, code = tmp_path / "home", tmp_path / "code"
  (home / "trm" / "data").mkdir(parents=True)
  (code / "trm").mkdir(parents=True)
  (code / "trm" / "a.py").write_text("x")
  args = _args("--name=a", "--accelerator_type=v4-8", f"--code_dir={code}",
               sub="setup")
  with tempfile.TemporaryDirectory() as stage:
    pack = tpu_pod.setup_commands(args, stage)[0]
    subprocess.run(pack, check=True)
    os.replace(pack[2], home / "trm_upload.tar.gz")
  data = shlex.quote(str(home / "trm" / "data"))
  script = (f"mount -t tmpfs none {data} && {{ bash -c "
            f"{shlex.quote(tpu_pod.code_unpack_script())}; echo status $?; "
            f"mountpoint -q {data} && echo mounted; }}")
  done = subprocess.run(["unshare", "-rm", "bash", "-c", script],
                        env=dict(os.environ, HOME=str(home)),
                        capture_output=True, text=True, check=True)
  assert done.stdout.split() == ["status", "1", "mounted"], done
  assert f"{home / 'trm' / 'data'} is a mount point" in done.stderr
  assert not (home / "trm" / "trm").exists()


def test_setup_switches_between_code_dir_and_repo_url(tmp_path):
  """After a --code_dir setup a --repo_url one failed (`git clone`: the
  folder exists); after a --repo_url one a --code_dir copy kept the
  clone's .git (setup then printed the clone's commit as the copied
  code's) and the modules deleted since. Runs the workers' part that gets
  the code with a stand-in home directory."""
  repo, code, home = tmp_path / "repo", tmp_path / "code", tmp_path / "home"
  for name, text in (("repo/trm/a.py", "git"), ("repo/trm/gone.py", "x"),
                     ("code/trm/a.py", "copied")):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(text)
  home.mkdir()
  subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
  subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
  subprocess.run(["git", "-C", str(repo), "-c", "user.name=n", "-c",
                  "user.email=n@example.com", "commit", "-qm", "x"],
                 check=True)
  install = " && " + tpu_pod._install_script()  # pylint: disable=protected-access

  def setup(*flags):
    args = _args("--name=w", *flags, sub="setup")
    with tempfile.TemporaryDirectory() as stage:
      commands = tpu_pod.setup_commands(args, stage)
      if args.code_dir:
        subprocess.run(commands[0], check=True)
        os.replace(commands[0][2], home / "trm_upload.tar.gz")  # scp
    script = _remote(commands[-1])
    assert script.endswith(install)
    subprocess.run(["bash", "-c", script[:-len(install)]], check=True,
                   env=dict(os.environ, HOME=str(home)), capture_output=True)

  setup(f"--code_dir={code}")
  (home / "trm" / "runs").mkdir()
  (home / "trm" / "runs" / "ckpt").write_text("x")  # a local workdir
  setup(f"--repo_url={repo}", "--revision=main")
  assert (home / "trm" / "trm" / "a.py").read_text() == "git"
  assert (home / "trm" / ".git").is_dir()
  setup(f"--code_dir={code}")
  assert (home / "trm" / "trm" / "a.py").read_text() == "copied"
  assert not (home / "trm" / ".git").exists()
  assert not (home / "trm" / "trm" / "gone.py").exists()
  assert (home / "trm" / "runs" / "ckpt").read_text() == "x"


@pytest.mark.parametrize("dry_run", [False, True])
def test_code_dir_leaves_no_archive_behind(monkeypatch, tmp_path, dry_run):
  """Each setup with --code_dir left a copy of the code (13.7 MB for this
  repository) in the temporary directory; a dry run left its file list."""
  code = tmp_path / "code"
  code.mkdir()
  (code / "a.py").write_text("x")
  temp = tmp_path / "tmp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  calls = []

  def run(command, **kwargs):
    del kwargs
    calls.append(command)
    return subprocess.CompletedProcess(command, 1 if command[0] == "git"
                                       else 0, stdout=b"", stderr=b"")

  monkeypatch.setattr(subprocess, "run", run)
  flags = ["--name=a", "--accelerator_type=v4-8", f"--code_dir={code}"]
  assert tpu_pod.main(["setup", *flags] + ["--dry_run"] * dry_run) == 0
  assert not list(temp.iterdir())
  assert any(c[0] == "tar" for c in calls) != dry_run


@pytest.mark.parametrize("in_git", [False, True])
def test_code_dir_copies_file_names_that_are_not_utf8(tmp_path, in_git):
  """A non-UTF-8 file name is archived as it is, not a UnicodeError."""
  (tmp_path / "a.py").write_text("x")
  with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt"), "w") as f:
    f.write("x")
  if in_git:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
  args = _args(*[f for f in MULTI if not f.startswith("--repo_url")],
               f"--code_dir={tmp_path}", sub="setup")
  with tempfile.TemporaryDirectory() as stage:  # outside the code
    pack = tpu_pod.setup_commands(args, stage)[0]
    subprocess.run(pack, check=True)
    listed = subprocess.run(
        ["tar", "--quoting-style=literal", "-tzf", pack[2]], check=True,
        capture_output=True).stdout.split()
  assert sorted(listed) == [b".trm_code_files.new", b"a.py", b"caf\xe9.txt"]


@pytest.mark.parametrize("flags, error", [
    # Both were refused only by every worker's trainer, after `all` had
    # created the slices and set them up.
    (["--num_slices=2"], "config.mesh.dcn_* multiply to 1, but there are "
     "--num_slices=2 slices: add --override=mesh.dcn_data=2"),
    (["--override=mesh.fsdp=8"], "--config: its mesh does not fit 1 x v4-8: "
     "The fixed mesh sizes"),
    (["--override=no_such_key=3"], "--config/--override/--trainer_flag: the "
     "trainer would refuse it: --config.no_such_key: the config has no field"),
    # A trainer flag is checked by the trainer's own parser too.
    (["--trainer_flag=no_such_flag=1"], "--config/--override/--trainer_flag: "
     "the trainer would refuse it: Unknown command line flag 'no_such_flag'"),
    (["--config=configs/trm_sudoku.py:nope"], "Unknown config variant"),
])
def test_run_loads_the_config_and_refuses_what_the_trainers_would(
    capsys, flags, error):
  base = ["--name=a", "--accelerator_type=v4-8", "--workdir=gs://b/r",
          "--config=configs/trm_sudoku.py", "--dry_run"]
  with pytest.raises(SystemExit):
    _args(*base, *flags, sub="run")
  err = capsys.readouterr().err.strip().splitlines()
  assert error in err[-1] and len(err) == 2  # usage, then one line
  # The check can be skipped (e.g. no local Python environment).
  _args(*base, *flags, "--skip_config_check", sub="run")


def test_a_config_that_cannot_be_loaded_here_says_so(monkeypatch, tmp_path,
                                                     capsys):
  fake = tmp_path / "python"
  fake.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
                  "echo \"ModuleNotFoundError: No module named 'ml_collections'\""
                  " >&2\nexit 1\n")
  fake.chmod(0o755)
  monkeypatch.setattr(sys, "executable", str(fake))
  with pytest.raises(SystemExit):
    _args("--name=a", "--accelerator_type=v4-8", "--workdir=gs://b/r",
          "--config=configs/trm_sudoku.py", sub="run")
  assert ("--config: configs/trm_sudoku.py could not be loaded here (from "
          f"{REPO}) to check it before anything is created: "
          "ModuleNotFoundError: No module named 'ml_collections'. Install the"
          " project locally (pip install -e .), or pass --skip_config_check."
          ) in capsys.readouterr().err


def test_with_repo_url_the_config_is_checked_at_the_revision(
    monkeypatch, tmp_path, capsys):
  """With --repo_url the check read this checkout's config and code, not
  --revision's that the workers run: a config the trainers refuse passed,
  and one only at the revision was "no file". Runs in a stand-in
  repository: revision A holds a config whose mesh does not fit and
  another that does, which HEAD deleted."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(os.path.join(REPO, "trm"), tmp_path / "trm",
                  ignore=shutil.ignore_patterns("__pycache__"))
  (tmp_path / "configs").mkdir()
  good = open(os.path.join(REPO, "configs", "trm_sudoku.py")).read()
  (tmp_path / "configs" / "trm_sudoku.py").write_text(
      good + "\n_get = get_config\n\n\ndef get_config(arg=None):\n"
      "  config = _get(arg) if arg else _get()\n"
      "  config.mesh.fsdp = 8\n  return config\n")
  (tmp_path / "configs" / "only_at_a.py").write_text(good)

  def git(*argv):
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c",
                    "user.email=t@t", *argv], check=True, capture_output=True)

  git("init", "-q")
  git("add", ".")
  git("commit", "-q", "-m", "A")
  git("tag", "a")
  (tmp_path / "configs" / "trm_sudoku.py").write_text(good)
  (tmp_path / "configs" / "only_at_a.py").unlink()
  git("commit", "-q", "-a", "-m", "B")
  monkeypatch.setattr(tpu_pod, "REPO_ROOT", str(tmp_path))
  base = ["--name=a", "--accelerator_type=v4-8", "--workdir=gs://b/r",
          "--repo_url=https://example.com/trm.git", "--dry_run"]
  with pytest.raises(SystemExit):
    _args(*base, "--revision=a", "--config=configs/trm_sudoku.py", sub="run")
  assert ("--config: its mesh does not fit 1 x v4-8: The fixed mesh sizes "
          "{'mesh.data': -1, 'mesh.fsdp': 8") in capsys.readouterr().err
  _args(*base, "--revision=a", "--config=configs/only_at_a.py", sub="run")
  with pytest.raises(SystemExit):
    _args(*base, "--config=configs/only_at_a.py", sub="run")  # HEAD: B
  assert ("--config: no file 'configs/only_at_a.py' at --revision=HEAD "
          "(commit ") in capsys.readouterr().err
  # A revision this repository lacks: said in one line, not checked.
  _args(*base, "--revision=nope", "--config=configs/trm_sudoku.py", sub="run")
  assert capsys.readouterr().err == (
      "tpu_pod.py: --config was not checked before anything is created: "
      f"--revision=nope is not in this checkout's git repository "
      f"({tmp_path}); `git fetch https://example.com/trm.git nope` there "
      "lets the next launch check it.\n")


@pytest.mark.parametrize("accelerator, devices", [
    ("v2-8", 8), ("v3-32", 32), ("v4-8", 4), ("v4-64", 32), ("v5p-128", 64),
    ("v5litepod-16", 16), ("v6e-8", 8)])
def test_devices_per_slice(accelerator, devices):
  assert tpu_pod.devices_per_slice(accelerator) == devices


def test_code_dir_setup_removes_files_deleted_locally(tmp_path):
  """--code_dir was unpacked over ~/trm: a module deleted locally stayed on
  the workers and was still imported there. Runs the setup's remote script
  in a stand-in home directory (pip stubbed), twice."""
  home, code = tmp_path / "home", tmp_path / "code"
  venv_bin = home / "trm_venv" / "bin"
  venv_bin.mkdir(parents=True)
  (venv_bin / "pip").write_text("#!/bin/sh\nexit 0\n")
  (venv_bin / "pip").chmod(0o755)
  (venv_bin / "activate").write_text(f"PATH={venv_bin}:$PATH\n")
  for name in ("trm/a.py", "trm/old/b.py", "configs/c.py"):
    (code / name).parent.mkdir(parents=True, exist_ok=True)
    (code / name).write_text("x")
  env = dict(os.environ, HOME=str(home))
  # ~/trm may be a link to another disk: the link stays, its folder changes.
  (tmp_path / "disk" / "trm").mkdir(parents=True)
  (home / "trm").symlink_to(tmp_path / "disk" / "trm")

  def setup(cut=False):
    args = _args("--name=a", "--accelerator_type=v4-8",
                 f"--code_dir={code}", sub="setup")
    with tempfile.TemporaryDirectory() as stage:
      pack, scp, ssh = tpu_pod.setup_commands(args, stage)
      subprocess.run(pack, check=True)
      os.replace(pack[2], home / "trm_upload.tar.gz")  # what scp does
    if cut:  # a copy cut short, or a disk that fills while unpacking
      os.truncate(home / "trm_upload.tar.gz",
                  os.path.getsize(home / "trm_upload.tar.gz") // 2)
    assert _is(scp, "tpu-vm", "scp") and _is(ssh, "tpu-vm", "ssh")
    return subprocess.run(["bash", "-c", _remote(ssh)], env=env,
                          check=not cut, capture_output=True, cwd=home)

  setup()
  remote = home / "trm"
  assert remote.is_symlink()
  assert (remote / "trm" / "old" / "b.py").is_file()
  (remote / "runs" / "x").mkdir(parents=True)  # a local workdir
  (remote / "runs" / "x" / "ckpt").write_text("x")
  (code / "trm" / "old" / "b.py").unlink()
  (code / "trm" / "old").rmdir()
  setup()
  assert not (remote / "trm" / "old").exists()
  assert (remote / "trm" / "a.py").is_file()
  assert (remote / "configs" / "c.py").is_file()
  assert (remote / "runs" / "x" / "ckpt").is_file()  # not the setup's file
  assert not (home / "trm_upload.tar.gz").exists()
  # A setup that fails part-way left a mix of old and new modules in ~/trm
  # (unpacked over it): now the new tree replaces it only when complete.
  (code / "trm" / "m.bin").write_bytes(os.urandom(300_000))  # incompressible
  for name in ("trm/a.py", "configs/c.py"):
    (code / name).write_text("new")
  assert setup(cut=True).returncode
  assert [(remote / name).read_text() for name in ("trm/a.py",
                                                   "configs/c.py")] == [
                                                       "x", "x"]
  setup()
  assert [(remote / name).read_text() for name in ("trm/a.py",
                                                   "configs/c.py")] == [
                                                       "new", "new"]
  assert (remote / "runs" / "x" / "ckpt").is_file() and remote.is_symlink()


def test_logs_end_with_the_trainers_exit_status(monkeypatch, tmp_path):
  """`all` followed worker 0's log with `tail -F` forever, also after the
  trainer had failed (a failing worker stops the others): Ctrl-C (130) was
  the only way out, never the failure's status. Runs `run`'s start and `logs`'s script
  in a stand-in home directory with a stand-in trainer that fails."""
  home = tmp_path / "home"
  (home / "trm_venv" / "bin").mkdir(parents=True)
  (home / "trm_venv" / "bin" / "activate").write_text("")
  package = home / "trm" / "trm"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "main.py").write_text(
      "import sys, time\nprint('training', flush=True)\ntime.sleep(2)\n"
      "sys.exit(3)\n")
  (home / "trm" / "configs").mkdir()
  token = os.path.basename(tmp_path)
  (home / "trm" / "configs" / f"{token}.py").write_text("")
  (home / "bin").mkdir()
  os.symlink(sys.executable, home / "bin" / "python")
  env = dict(os.environ, HOME=str(home),
             PATH=f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}")
  # Only this test's stand-in: pkill/pgrep see every process of the host.
  monkeypatch.setattr(tpu_pod, "_TRAINER_PATTERN",
                      rf"^[^ ]*python[0-9.]* -m trm[.]main --config=configs/"
                      rf"{token}[.]py ")
  args = _args("--name=a", "--accelerator_type=v4-8", "--workdir=runs/x",
               f"--config=configs/{token}.py", f"--code_dir={home / 'trm'}",
               "--skip_config_check", sub="all")
  (start,) = tpu_pod.run_commands(args)
  (logs,) = tpu_pod.logs_commands(args)
  subprocess.run(["bash", "-c", _remote(start)], env=env, check=True,
                 cwd=home, timeout=60)
  time.sleep(0.5)  # the trainer is up
  followed = subprocess.run(["bash", "-c", _remote(logs)], env=env, cwd=home,
                            capture_output=True, text=True, timeout=60)
  assert followed.returncode == 3, followed
  assert followed.stdout.splitlines()[0] == "training"
  assert "trm.main exited with status 3" in followed.stdout
  # Read again after the run: the same status, at once.
  again = subprocess.run(["bash", "-c", _remote(logs)], env=env, cwd=home,
                         capture_output=True, text=True, timeout=60)
  assert again.returncode == 3, again
  # `logs` before the trainer is up (the run's log still empty) follows it
  # once it starts.
  (home / "trm_run.log").write_text("")
  early = subprocess.Popen(["bash", "-c", _remote(logs)], env=env, cwd=home,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  time.sleep(0.5)
  subprocess.run(["bash", "-c", _remote(start)], env=env, check=True,
                 cwd=home, timeout=60)
  out, err = early.communicate(timeout=60)
  assert early.returncode == 3 and "training" in out, (out, err)
  # No status line and no trainer (killed with the shell that logs it, the
  # host restarted), or no log at all: both exited 0, as if it succeeded.
  monkeypatch.setattr(tpu_pod, "_STATUS_WAIT_SECONDS", 1, raising=False)
  (logs,) = tpu_pod.logs_commands(args)
  (home / "trm_run.log").write_text("training\n")
  for error in ("ends without its exit status", "no ~/trm_run.log"):
    unknown = subprocess.run(["bash", "-c", _remote(logs)], env=env,
                             cwd=home, capture_output=True, text=True,
                             timeout=60)
    assert unknown.returncode == 1 and error in unknown.stderr, unknown
    (home / "trm_run.log").unlink(missing_ok=True)


def test_stop_reaches_every_slice_when_one_fails(monkeypatch, capsys):
  """`stop` with slice 0's ssh failing (exit 255) gave up there: slices 1
  and 2 went on training, holding their TPUs."""
  calls = []

  def run(command, check=False, **kwargs):
    del kwargs
    calls.append(command[5])
    code = 255 if command[5] == "trm-a-0" else 0
    if check and code:
      raise subprocess.CalledProcessError(code, command)
    return subprocess.CompletedProcess(command, code)

  monkeypatch.setattr(subprocess, "run", run)
  assert tpu_pod.main(["stop", "--name=trm-a", "--num_slices=3"]) == 255
  assert calls == ["trm-a-0", "trm-a-1", "trm-a-2"]
  assert ("command failed with exit status 255: gcloud compute tpus tpu-vm "
          "ssh trm-a-0") in capsys.readouterr().err
