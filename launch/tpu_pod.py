r"""Runs the trainer on every worker of one or more Cloud TPU slices.

  python launch/tpu_pod.py all --name=trm-a --project=P --zone=us-central2-b \
      --accelerator_type=v4-64 --num_slices=2 --workdir=gs://BUCKET/run \
      --config=configs/trm_sudoku.py --override=total_steps=1000 \
      --override=mesh.dcn_data=2 --code_dir=.

Sub-commands: create, setup, run, logs, stop, delete, all (= create, setup,
run, logs). Every gcloud command is printed (`shlex.join`) before it runs;
`--dry_run` prints them and runs nothing. See launch/README.md.

The command lists are built by pure functions (`create_commands(args)`, ...)
so tests can check them without gcloud.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fixed locations on each worker. `~` is left for the remote shell to expand,
# so these are never passed through shlex.quote.
REMOTE_DIR = "~/trm"
REMOTE_VENV = "~/trm_venv"
REMOTE_LOG = "~/trm_run.log"
_UPLOAD_ARCHIVE = "trm_upload.tar.gz"  # in the worker's home directory
# The list of files a --code_dir setup put in ~/trm (NUL-separated), so the
# next setup removes those it no longer copies; `.new` travels in the archive.
CODE_MANIFEST = ".trm_code_files"
# Never copied with --code_dir outside a git checkout (in one, what
# .gitignore ignores is left out instead): runs, datasets, environments.
DEFAULT_CODE_EXCLUDES = ("runs", "data", ".git", "__pycache__", "*.egg-info",
                         ".venv", "venv", "wandb", "*.pyc", ".pytest_cache")

# What every --code_dir setup must copy: `pip install -e` and the trainer.
_PROJECT_FILES = ("setup.py", "trm/main.py")

DEFAULT_RUNTIME = "tpu-ubuntu2204-base"
# The most slices one job may join. The largest multislice job published
# (Google Cloud blog, 2023-11-08, "the world's largest distributed training
# job for large language models across 50000+ TPU v5e chips") joined about
# 200 slices (a v5e pod, its largest slice, holds 256 chips); 10,000 leaves
# 50 times that. The launcher builds and prints commands per slice (about
# 5 kB each, 0.4 s for all at 10,000 here); at 10**8 that took minutes and
# gigabytes before gcloud could refuse anything.
MAX_NUM_SLICES = 10_000
# Ray's TPU multislice helper uses 8081 as the default MEGASCALE port.
DEFAULT_MEGASCALE_PORT = 8081
# Stands in for slice 0 worker 0's IP where it cannot be looked up (dry run).
COORDINATOR_PLACEHOLDER = "SLICE0_WORKER0_IP"

# Anchored at the start of the command line so it matches the python process
# but not the remote `bash -c '... python -m trm.main ...'` shell that runs
# pkill itself (a bare `pkill -f trm.main` would kill its own shell).
_TRAINER_PATTERN = r"^[^ ]*python[0-9.]* -m trm[.]main( |$)"
# The line `run` adds to the log when the trainer exits, then its status.
_EXIT_LINE = "trm.main exited with status"
# How long `logs` waits for that line once the trainer is gone.
_STATUS_WAIT_SECONDS = 10

# Matched with fullmatch: with match, `$` lets a trailing newline through
# (and an --env name goes into the remote script unquoted).
_ACCEL_RE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v6e)-([0-9]+)$")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A host name or IPv4 address, or an IPv6 address in brackets; never a port
# (megascale_env appends --megascale_port).
_HOST_RE = re.compile(
    r"[A-Za-z0-9]([-.A-Za-z0-9]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")

SUBCOMMANDS = ("create", "setup", "run", "logs", "stop", "delete", "all")


class LaunchError(ValueError):
  """A bad flag value; the message names the flag."""


# ---------------------------------------------------------------------------
# Topology.


def hosts_per_slice(accelerator_type: str) -> int:
  """Worker VMs in one slice of `accelerator_type` (e.g. v4-64 -> 8)."""
  m = _ACCEL_RE.fullmatch(accelerator_type or "")
  if not m:
    raise LaunchError(
        f"--accelerator_type: expected GENERATION-SIZE with GENERATION in "
        f"v2, v3, v4, v5p, v5litepod, v6e (e.g. v4-8, v4-64, v5p-128, "
        f"v5litepod-16), got {accelerator_type!r}")
  gen, size = m.group(1), int(m.group(2))
  if size not in _SOLD_SIZES[gen]:
    raise LaunchError(
        f"--accelerator_type: no {gen} slice of size {size} is sold; "
        f"{gen} slices are {_SOLD_WORDS[gen]}")
  if gen in ("v5litepod", "v6e"):
    # Size counts chips: up to 8 on one host, 4 chips a host beyond that.
    return 1 if size <= 8 else size // 4
  # Size counts TensorCores: 8 a host (v4/v5p: 4 chips x 2 cores).
  return size // 8


# The slice sizes Cloud TPU sells (its v2, v3, v4, v5e, v5p and v6e pages).
# v2/v3 and v4/v5p sizes count TensorCores, v5e/v6e sizes chips. A v4 or
# v5p slice is 4, 8, 16 or 32 chips, or an AxBxC block of whole 4x4x4
# cubes (64 chips, 128 TensorCores) that its pod holds: v4's 16x16x16
# (4x4x4 cubes), v5p's largest slice 16x16x24 (4x4x6).
_SOLD_SIZES = {"v2": (8, 32, 128, 256, 512),
               "v3": (8, 32, 64, 128, 256, 512, 1024, 2048),
               "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
               "v6e": (1, 4, 8, 16, 32, 64, 128, 256)}
_CUBE_CORES, _CUBE_GRIDS = 128, {"v4": (4, 4, 4), "v5p": (4, 4, 6)}
_SOLD_SIZES.update({
    gen: tuple(sorted({8, 16, 32, 64} | {
        a * b * c * _CUBE_CORES for a in range(1, grid[0] + 1)
        for b in range(1, grid[1] + 1) for c in range(1, grid[2] + 1)}))
    for gen, grid in _CUBE_GRIDS.items()})
_SOLD_WORDS = {gen: ", ".join(f"{gen}-{n}" for n in sizes)
               for gen, sizes in _SOLD_SIZES.items()}


def node_names(args) -> list[str]:
  """TPU VM names: NAME for one slice, NAME-0 .. NAME-{n-1} for a queued
  resource created with --node-prefix=NAME (gcloud's naming)."""
  if args.num_slices == 1:
    return [args.name]
  return [f"{args.name}-{i}" for i in range(args.num_slices)]


def _location(args) -> list[str]:
  # Left out when unset: gcloud then uses compute/zone and core/project.
  flags = []
  if args.zone:
    flags.append(f"--zone={args.zone}")
  if args.project:
    flags.append(f"--project={args.project}")
  return flags


# ---------------------------------------------------------------------------
# Validation.


def split_override(text: str) -> tuple[str, str]:
  """'model.hidden=512' -> ('model.hidden', '512')."""
  key, sep, value = text.partition("=")
  if not sep or not _KEY_RE.fullmatch(key):
    raise LaunchError(
        f"--override: expected KEY=VALUE with a dotted config key such as "
        f"total_steps=1000 or mesh.fsdp=8, got {text!r}")
  return key, value


# trm.main flags the launcher sets itself, or that have their own flag here.
_LAUNCHER_SETS = ("config", "workdir", "distributed", "coordinator_address",
                  "num_processes", "process_id")


def split_trainer_flag(text: str) -> tuple[str, str]:
  """'distributed_timeout=900' -> ('distributed_timeout', '900')."""
  name, sep, value = text.partition("=")
  name = name.removeprefix("--")
  if not sep or not _ENV_RE.fullmatch(name):  # an identifier
    hint = (" (a config field goes in --override)" if "." in name else "")
    raise LaunchError(
        f"--trainer_flag: expected NAME=VALUE naming a trm.main flag such as "
        f"distributed_timeout=900, got {text!r}{hint}")
  if name in _LAUNCHER_SETS:
    raise LaunchError(
        f"--trainer_flag: --{name} is set by the launcher (its own --config/"
        "--workdir, and the job's processes from the slices); drop it.")
  return name, value


def _split_env(text: str) -> tuple[str, str]:
  key, sep, value = text.partition("=")
  if not sep or not _ENV_RE.fullmatch(key):
    raise LaunchError(f"--env: expected NAME=VALUE, got {text!r}")
  return key, value


def _not_an_option(flag: str, value: str | None) -> None:
  # Quoting keeps the value one word, but git would still read a leading
  # '-' as an option (--upload-pack=CMD runs CMD on every worker).
  if value and value.startswith("-"):
    raise LaunchError(f"--{flag}: must not start with '-' (git would take it "
                      f"as an option), got {value!r}")


def _check_dcn_overrides(args) -> None:
  """The slices are the mesh's DCN axes: the trainer refuses config.mesh.dcn_*
  sizes that do not multiply to the slice count, but only on the workers,
  after the slices were created and set up."""
  dcn = {}
  for text in args.override:
    key, value = split_override(text)
    # Other values are the trainer's config parser's to refuse.
    if key.startswith("mesh.dcn_") and re.fullmatch(r"[0-9]+", value.strip()):
      dcn[key] = int(value)
  product = math.prod(dcn.values())
  # Sizes not given come from the config file (check_config reads it
  # after this quick check): they must make up the rest.
  given_all = len(dcn) == 3
  if dcn and (product != args.num_slices if given_all
              else not product or args.num_slices % product):
    sizes = ", ".join(f"{k}={v}" for k, v in dcn.items())
    raise LaunchError(
        f"--override: {sizes} split the mesh over {product} slices, but "
        f"--num_slices={args.num_slices}; the config.mesh.dcn_* sizes must "
        f"multiply to the number of slices (e.g. --override=mesh.dcn_data="
        f"{args.num_slices}).")


def devices_per_slice(accelerator_type: str) -> int:
  """JAX devices in one slice: a v4/v5p chip's two TensorCores are one
  device (megacore), a v2/v3 core is one, v5e/v6e sizes count chips."""
  hosts_per_slice(accelerator_type)  # the flag's own error
  gen, size = accelerator_type.split("-")
  return int(size) // (2 if gen in ("v4", "v5p") else 1)


# Run by `check_config` in a child Python: the trainer's own --config parser
# (one-line errors) and mesh rules, on --code_dir's code, with --repo_url on
# --revision's as this repository has it, else on this checkout's.
_CONFIG_CHECK = r"""
import json, math, sys
sys.argv[0] = "trm.main"  # how the workers' error lines would start
from absl import flags
from trm import main  # its flags: --config, --workdir, the tools' own
from trm.core import config_lib
slices, devices = json.loads(sys.argv[1])
config_lib.parse_flags([sys.argv[0], *sys.argv[2:]])
from trm.core import mesh
config = flags.FLAGS.config
try:
  wanted = math.prod(mesh.dcn_sizes(config.mesh))
  if wanted != slices:
    raise mesh.MeshConfigError(
        f"config.mesh.dcn_* multiply to {wanted}, but there are "
        f"--num_slices={slices} slices: add --override=mesh.dcn_data={slices}")
  mesh.mesh_shapes(config.mesh, slices * devices)
except mesh.MeshConfigError as e:
  print(e, file=sys.stderr)
  sys.exit(3)
"""


def _revision_commit(args) -> tuple[str | None, str]:
  """With --repo_url: the commit this checkout's git repository has for
  --revision (the workers fetch it from --repo_url), or None and why not."""
  try:
    found = subprocess.run(
        ["git", "-C", REPO_ROOT, "rev-parse", "--verify", "--quiet",
         f"{args.revision}^{{commit}}"], capture_output=True, text=True,
        check=False)
  except OSError as e:
    return None, f"git cannot run here ({e.strerror})"
  if found.returncode:
    return None, (f"--revision={args.revision} is not in this checkout's git "
                  f"repository ({REPO_ROOT}); `git fetch {args.repo_url} "
                  f"{args.revision}` there lets the next launch check it")
  return found.stdout.strip(), ""


def _config_at_revision(args, commit: str) -> bool:
  """Whether --config's file is in `commit`."""
  path = os.path.normpath(args.config.partition(":")[0])
  return subprocess.run(["git", "-C", REPO_ROOT, "cat-file", "-e",
                         f"{commit}:{path}"], capture_output=True,
                        check=False).returncode == 0


def check_config(args) -> None:
  """Loads --config with the --override values locally, as the trainer on
  each worker will, and refuses a config it would refuse or a mesh that
  does not fit --accelerator_type x --num_slices: before, the trainers said
  so only after the slices were created and set up. With --repo_url it
  loads the code and config of --revision as this repository has them
  (before, this checkout's files: another config than the workers'), and
  says in one line when it cannot."""
  if args.skip_config_check:
    return
  if args.code_dir or not args.repo_url:
    root = args.code_dir or REPO_ROOT
    _check_config_in(args, root, root)
    return
  commit, why = _revision_commit(args)
  if commit is None:
    print(f"tpu_pod.py: --config was not checked before anything is "
          f"created: {why}.", file=sys.stderr, flush=True)
    return
  top = os.path.normpath(args.config.partition(":")[0]).split(os.sep)[0]
  with tempfile.TemporaryDirectory(prefix="trm_config_check_") as tree:
    archive = os.path.join(tree, "tree.tar")
    packed = subprocess.run(
        ["git", "-C", REPO_ROOT, "archive", f"--output={archive}", commit,
         "--", *sorted({"trm", top})], capture_output=True, text=True,
        check=False)
    if packed.returncode:  # e.g. a partial clone without those files
      error = (packed.stderr.strip().splitlines() or ["?"])[-1]
      print(f"tpu_pod.py: --config was not checked before anything is "
            f"created: git could not read --revision={args.revision} here "
            f"({error}).", file=sys.stderr, flush=True)
      return
    with tarfile.open(archive) as files:  # (filter: Python 3.12's default)
      files.extractall(tree, **({"filter": "data"} if hasattr(
          tarfile, "data_filter") else {}))
    _check_config_in(args, tree, f"{REPO_ROOT} at --revision="
                     f"{args.revision}, commit {commit[:12]}")


def _check_config_in(args, root: str, where: str) -> None:
  """check_config on the code and config under `root` (`where` names it)."""
  argv = [sys.executable, "-c", _CONFIG_CHECK,
          json.dumps([args.num_slices,
                      devices_per_slice(args.accelerator_type)]),
          f"--config={args.config}", "--workdir=unused-by-the-check"]
  argv += [f"--config.{key}={value}"
           for key, value in map(split_override, args.override)]
  argv += [f"--{name}={value}"
           for name, value in map(split_trainer_flag, args.trainer_flag)]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      filter(None, [root, os.environ.get("PYTHONPATH")])),
             JAX_PLATFORMS="cpu")  # never claims a local accelerator
  try:
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True,
                          text=True, check=False, timeout=300)
  except subprocess.TimeoutExpired:
    proc = subprocess.CompletedProcess(argv, 1, "", "no answer in 300 s")
  if proc.returncode == 0:
    return
  lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
  last = lines[-1] if lines else f"exit status {proc.returncode}"
  refused = "trm.main: error: "
  if proc.returncode == 2 and last.startswith(refused):
    # The trainer's own parser refused the file or an --override.
    last = last[len(refused):].removesuffix(" (--helpshort lists the flags)")
    raise LaunchError(f"--config/--override/--trainer_flag: the trainer "
                      f"would refuse it: {last}")
  if proc.returncode == 3:
    raise LaunchError(f"--config: its mesh does not fit {args.num_slices} x "
                      f"{args.accelerator_type}: {last}")
  raise LaunchError(
      f"--config: {args.config} could not be loaded here (from {where}) to "
      f"check it before anything is created: {last}. Install the project "
      "locally (pip install -e .), or pass --skip_config_check.")


def validate(args, subcommand: str) -> None:
  """Raises LaunchError (naming the flag) before anything is run."""
  if not args.name or not _NAME_RE.fullmatch(args.name):
    raise LaunchError(
        f"--name: lower-case letters, digits and '-', starting with a letter "
        f"(it names the TPU VM or queued resource), got {args.name!r}")
  if args.num_slices < 1:
    raise LaunchError(f"--num_slices: must be >= 1, got {args.num_slices}")
  if args.num_slices > MAX_NUM_SLICES:
    raise LaunchError(
        f"--num_slices: at most {MAX_NUM_SLICES:,} slices (the largest "
        f"published multislice job joined about 200; the launcher builds "
        f"commands for each slice), got {args.num_slices:,}")
  needs_hosts = subcommand in ("create", "run", "all")
  if needs_hosts or args.accelerator_type is not None:
    hosts = hosts_per_slice(args.accelerator_type)
  for text in args.override:
    split_override(text)
  for text in args.trainer_flag:
    split_trainer_flag(text)
  for text in args.env:
    name, _ = _split_env(text)
    if (name.startswith("MEGASCALE_") and args.num_slices > 1
        and args.megascale_env):
      # remote_run_script exports its own per-slice values after --env's.
      raise LaunchError(
          f"--env: {name} is exported by the launcher on every slice and "
          "would replace this value; use --coordinator_address or "
          "--megascale_port, or --no_megascale_env to give every MEGASCALE_* "
          "variable yourself.")
  for flag in ("repo_url", "revision"):
    _not_an_option(flag, getattr(args, flag))
  if not args.max_wait_minutes > 0:
    # NaN made the deadline unreachable: `all` polled a queued resource
    # stuck in WAITING_FOR_RESOURCES forever.
    raise LaunchError(f"--max_wait_minutes: must be > 0 (inf waits without "
                      f"end), got {args.max_wait_minutes}")
  if not 1 <= args.megascale_port <= 65535:
    raise LaunchError(f"--megascale_port: not a port: {args.megascale_port}")
  if args.coordinator_address and not _HOST_RE.fullmatch(
      args.coordinator_address):
    # trm.main's --coordinator_address is HOST:PORT; here a port made
    # MEGASCALE_COORDINATOR_ADDRESS=HOST:PORT:PORT and no slice could join.
    raise LaunchError(
        f"--coordinator_address: slice 0 worker 0's IP or host name only, "
        f"no port (the port is --megascale_port={args.megascale_port}; an "
        f"IPv6 address goes in brackets), got {args.coordinator_address!r}")

  # What --code_dir's setup copies (git ls-files or a walk), listed once
  # for the checks below.
  copied = (set(code_files(args.code_dir, args.exclude))
            if args.code_dir and subcommand in ("setup", "run", "all")
            and os.path.isdir(args.code_dir) else set())

  if subcommand in ("setup", "all"):
    if bool(args.code_dir) == bool(args.repo_url):
      raise LaunchError("setup: give exactly one of --repo_url (git clone on "
                        "the workers) or --code_dir (copy a local directory)")
    if args.code_dir and not os.path.isdir(args.code_dir):
      raise LaunchError(f"--code_dir: no such directory: {args.code_dir!r}")
    if args.code_dir:
      # Copied as it was, a tree without them failed on every worker
      # (pip install -e, python -m trm.main) after the upload.
      missing = [f for f in _PROJECT_FILES if f not in copied]
      if missing:
        raise LaunchError(
            f"--code_dir: {args.code_dir!r} would copy no "
            f"{' or '.join(missing)} to the workers (not this project's "
            "tree, or --exclude or .gitignore leaves them out), which "
            "install and run it from there; pass the repository's root.")

  if subcommand in ("run", "all"):
    _check_dcn_overrides(args)
    if not args.config:
      raise LaunchError("--config: required, e.g. configs/trm_sudoku.py")
    path = args.config.partition(":")[0]
    if os.path.isabs(path):
      raise LaunchError(
          f"--config: give the path relative to the repository root (the "
          f"workers resolve it inside {REMOTE_DIR}), got {path!r}")
    rel = os.path.normpath(path)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
      # It existed here, beside the tree; no worker has it.
      raise LaunchError(
          f"--config: {path!r} lies outside the code's tree (the workers "
          f"resolve it inside {REMOTE_DIR}, which holds the tree only); "
          "move the config into the repository, e.g. configs/.")
    if args.repo_url and not args.code_dir:
      # The workers' file is --revision's: checked there when this
      # repository has that revision (check_config says when it has not).
      commit, _ = _revision_commit(args)
      if commit is not None and not _config_at_revision(args, commit):
        raise LaunchError(f"--config: no file {path!r} at --revision="
                          f"{args.revision} (commit {commit[:12]}) of "
                          f"{REPO_ROOT}")
    elif not os.path.isfile(os.path.join(args.code_dir or REPO_ROOT, path)):
      raise LaunchError(
          f"--config: no file {path!r} under {args.code_dir or REPO_ROOT}")
    elif args.code_dir and rel not in copied:
      # The check below loaded it here; the workers would not find it.
      raise LaunchError(
          f"--config: {path!r} is not among the files --code_dir copies "
          f"to the workers (.gitignore or --exclude leaves it out); move "
          "it, e.g. to configs/, or stop ignoring it.")
    if not args.workdir:
      raise LaunchError("--workdir: required (gs://BUCKET/DIR on a pod)")
    if hosts * args.num_slices > 1 and not re.match(r"^gs://[^/]+",
                                                    args.workdir):
      raise LaunchError(
          f"--workdir: {args.accelerator_type} x {args.num_slices} slice(s) "
          f"is {hosts * args.num_slices} hosts; every host must see the same "
          f"checkpoints, so use a gs://BUCKET/... path, got {args.workdir!r}")
    # Last: it starts a Python that loads the config (seconds).
    check_config(args)


# ---------------------------------------------------------------------------
# Command builders (pure: args in, list of argv lists out).


def _ssh(args, node: str, script: str, worker: str = "all") -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", node, *_location(args),
          f"--worker={worker}",
          # Many workers at once: a host-key prompt would stall them all.
          "--strict-host-key-checking=no",
          f"--command={script}"]


def create_commands(args) -> list[list[str]]:
  """One TPU VM, or a multislice queued resource (VMs NAME-0, NAME-1, ...)."""
  capacity = {"on_demand": [], "spot": ["--spot"],
              "reserved": ["--reserved"]}[args.capacity]
  if args.num_slices == 1:
    return [["gcloud", "compute", "tpus", "tpu-vm", "create", args.name,
             *_location(args), f"--accelerator-type={args.accelerator_type}",
             f"--version={args.runtime_version}", *capacity]]
  return [["gcloud", "compute", "tpus", "queued-resources", "create",
           args.name, f"--node-count={args.num_slices}",
           f"--node-prefix={args.name}",
           f"--accelerator-type={args.accelerator_type}",
           f"--runtime-version={args.runtime_version}", *_location(args),
           *capacity]]


def wait_command(args) -> list[str]:
  """Prints the queued resource's state (ACTIVE once its VMs are up)."""
  return ["gcloud", "compute", "tpus", "queued-resources", "describe",
          args.name, *_location(args), "--format=value(state.state)"]


def _install_script() -> str:
  # python3-venv is missing on the base image; the dpkg lock is often held by
  # unattended upgrades right after boot, hence the lock timeout.
  venv = (f"{{ [ -x {REMOTE_VENV}/bin/pip ] || {{ sudo apt-get -qq update && "
          f"sudo DEBIAN_FRONTEND=noninteractive apt-get -qq -o "
          f"DPkg::Lock::Timeout=600 install -y python3-venv && "
          f"python3 -m venv --clear {REMOTE_VENV}; }}; }}")
  return " && ".join([
      venv, f". {REMOTE_VENV}/bin/activate", f"cd {REMOTE_DIR}",
      "pip install -q -U pip", "pip install -q -e '.[tpu]'",
      # Workers must run identical code (else their HLOs differ and the job
      # hangs): print each worker's commit so a mismatch is visible.
      'echo "$(hostname): trm installed at $(git rev-parse --short HEAD '
      '2>/dev/null || echo copied-code)"'])


def _excluded(path: str, patterns) -> bool:
  return any(fnmatch.fnmatch(part, pattern) for part in path.split("/")
             for pattern in patterns)


def code_files(code_dir: str, excludes=()) -> list[str]:
  """The files --code_dir copies, relative to it: in a git checkout the
  tracked and untracked ones that .gitignore does not ignore, elsewhere all
  but DEFAULT_CODE_EXCLUDES; --exclude patterns apply to both."""
  listed = subprocess.run(
      ["git", "-C", code_dir, "ls-files", "--cached", "--others",
       "--exclude-standard", "-z"], capture_output=True, check=False)
  if listed.returncode == 0:
    # fsdecode: a file name need not be UTF-8 (fsencode restores it).
    files = [os.fsdecode(f) for f in listed.stdout.split(b"\0") if f]
    files = [f for f in files if os.path.isfile(os.path.join(code_dir, f))]
  else:
    files = []
    for root, dirs, names in os.walk(code_dir):
      rel = os.path.relpath(root, code_dir)
      dirs[:] = [d for d in dirs if not _excluded(d, DEFAULT_CODE_EXCLUDES)]
      files += [os.path.normpath(os.path.join(rel, n)) for n in names
                if not _excluded(n, DEFAULT_CODE_EXCLUDES)]
  return sorted(f for f in files if not _excluded(f, excludes))


def _code_archive_command(args, stage: str) -> tuple[list[str], str]:
  """A local `tar` of code_files(--code_dir), and their list as
  CODE_MANIFEST.new, into the directory `stage`; and the archive's path."""
  listing = os.path.join(stage, CODE_MANIFEST + ".new")
  with open(listing, "wb") as f:
    f.write(b"".join(os.fsencode(name) + b"\0" for name in
                     code_files(args.code_dir, args.exclude)
                     if not name.startswith(CODE_MANIFEST)))
  archive = os.path.join(stage, "code.tar.gz")
  return (["tar", "-czf", archive, "-C", args.code_dir, "--null", "-T",
           listing, "-C", stage, CODE_MANIFEST + ".new"], archive)


# Run on the worker with the code's directory (~/trm, or where a link of
# that name points) as argv[1], once the archive is unpacked beside it in
# DIR.new: carries into DIR.new what DIR holds besides the files the
# previous --code_dir setup copied (hard links: a local workdir such as
# runs/x, the editable install's metadata), then renames DIR.new into place.
# Until that rename DIR is untouched, so a setup that fails part-way (a cut
# archive, a full disk) never leaves a mix of old and new code. The old tree
# stays in DIR.old until the next setup.
_SWAP_SCRIPT = f"""
import os, shutil, socket, subprocess, sys
here = os.fsencode(sys.argv[1])
new, old = here + b".new", here + b".old"
def listed(path):
  return (set(filter(None, open(path, "rb").read().split(bytes(1))))
          if os.path.isfile(path) else set())
copied = listed(os.path.join(here, b"{CODE_MANIFEST}"))
if not copied and os.path.isdir(os.path.join(here, b".git")):
  # A --repo_url clone: its files are git's (its .git told `setup` the
  # copied code was the old commit, and modules deleted since stayed).
  tracked = subprocess.run(["git", "-C", here, "ls-files", "-z"],
                           capture_output=True).stdout
  copied = set(filter(None, tracked.split(bytes(1)))) | {{b".git"}}
stale = (copied - listed(os.path.join(new, b"{CODE_MANIFEST}.new"))
         - {{b".git"}})
made = {{f.rsplit(b"/", i)[0] for f in copied
        for i in range(1, f.count(b"/") + 1)}}
kept = 0
try:
  for root, dirs, files in os.walk(here) if os.path.isdir(here) else ():
    # Caches are rebuilt; a copied folder (a clone's .git) is not carried.
    dirs[:] = [d for d in dirs if d != b"__pycache__" and os.path.normpath(
        os.path.relpath(os.path.join(root, d), here)) not in copied]
    for name in [*dirs, *files]:
      src = os.path.join(root, name)
      rel = os.path.normpath(os.path.relpath(src, here))
      dst = os.path.join(new, rel)
      if rel in copied or rel == b"{CODE_MANIFEST}" or os.path.lexists(dst):
        continue
      if os.path.isdir(src) and not os.path.islink(src):
        if os.path.ismount(src):  # it would move with the old tree
          raise OSError(f"{{os.fsdecode(src)}} is a mount point; mount it "
                        "outside the code's folder")
        if rel not in made:  # a folder of its own, e.g. an empty runs/
          os.makedirs(dst)
        continue
      os.makedirs(os.path.dirname(dst), exist_ok=True)
      if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
      else:
        try:
          os.link(src, dst)
        except PermissionError:  # another user's file (protected_hardlinks)
          shutil.copy2(src, dst)
        except OSError as e:
          if e.errno != 18:  # EXDEV: a bind mount ismount does not see
            raise
          raise OSError(f"{{os.fsdecode(src)}} is on another mount; mount "
                        "it outside the code's folder") from None
      kept += 1
  if os.path.isfile(os.path.join(new, b"{CODE_MANIFEST}.new")):
    os.replace(os.path.join(new, b"{CODE_MANIFEST}.new"),
               os.path.join(new, b"{CODE_MANIFEST}"))
  shutil.rmtree(old, ignore_errors=True)
  if os.path.lexists(here):
    os.rename(here, old)
  os.rename(new, here)
except OSError as e:
  sys.exit(f"{{socket.gethostname()}}: setup stopped before the new code "
           f"replaced {{sys.argv[1]}}, which is unchanged: {{e}}")
print(f"{{socket.gethostname()}}: {{sys.argv[1]}} holds the new code; "
      f"{{len(stale)}} file(s) the previous setup copied and this one does "
      f"not are gone, {{kept}} other file(s) kept; the previous tree is "
      f"{{sys.argv[1]}}.old")
"""


def code_unpack_script() -> str:
  """The worker's side of a --code_dir setup: ~/trm becomes the archive's
  files, built beside it in ~/trm.new and renamed into place (see
  _SWAP_SCRIPT). Files the previous --code_dir setup copied and this one
  does not are gone (they stayed and were imported: a stale module deleted
  locally); anything else in ~/trm (a local workdir such as ~/trm/runs/x,
  the editable install's metadata) is kept."""
  return (f"here=$(readlink -f {REMOTE_DIR}) && rm -rf \"$here.new\" && "
          f"mkdir -p \"$here.new\" && tar -xzf ~/{_UPLOAD_ARCHIVE} -C "
          f"\"$here.new\" && rm -f ~/{_UPLOAD_ARCHIVE} && python3 -c "
          f"{_swap_command()}")


def _swap_command() -> str:
  """_SWAP_SCRIPT's arguments to `python3 -c` on the worker, $here set."""
  # exec of its repr: one line, as every printed command is.
  return f"{shlex.quote(f'exec({_SWAP_SCRIPT!r})')} \"$here\""


def setup_commands(args, stage: str | None = None) -> list[list[str]]:
  """Puts the code in ~/trm on every worker of every slice and installs it.
  With --code_dir, `stage` is an existing local directory for the archive
  (and its file list), which the caller removes."""
  commands = []
  if args.code_dir:
    pack, archive = _code_archive_command(args, stage)
    commands.append(pack)
    fetch = code_unpack_script()
  else:
    # Fetching the revision itself works for branches, tags and commits.
    # From --repo_url, not `origin`: a worker cloned by an earlier setup
    # from another URL kept fetching that one (its branch of the same
    # name, silently; workers cloned anew got the new code).
    url = shlex.quote(args.repo_url)
    # Not a clone yet (none, or a --code_dir copy, where `git clone`
    # refused the folder): cloned beside it and swapped in, as a copy is.
    fetch = (f"{{ [ -d {REMOTE_DIR}/.git ] || {{ here=$(readlink -f "
             f"{REMOTE_DIR}) && rm -rf \"$here.new\" && git clone -q {url} "
             f"\"$here.new\" && python3 -c {_swap_command()}; }}; }} && "
             f"cd {REMOTE_DIR} && git fetch -q {url} "
             f"{shlex.quote(args.revision)} && "
             f"git checkout -q --detach FETCH_HEAD")
  # The same script on every slice: built once (the swap script's repr is
  # most of it), not once a slice.
  script = f"{fetch} && {_install_script()}"
  for node in node_names(args):
    if args.code_dir:
      commands.append(
          ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive,
           f"{node}:{_UPLOAD_ARCHIVE}", *_location(args),
           "--worker=all", "--strict-host-key-checking=no"])
    commands.append(_ssh(args, node, script))
  return commands


def coordinator_lookup_command(args) -> list[str]:
  """Prints the internal IPs of slice 0's workers, worker 0 first."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "describe",
          node_names(args)[0], *_location(args),
          "--flatten=networkEndpoints[]",
          "--format=csv[no-heading](networkEndpoints.ipAddress)"]


def megascale_env(args, slice_id: int, coordinator_ip: str) -> dict[str, str]:
  """What libtpu reads to join N slices into one job over the DCN."""
  return {
      "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator_ip}:{args.megascale_port}",
      "MEGASCALE_NUM_SLICES": str(args.num_slices),
      "MEGASCALE_SLICE_ID": str(slice_id),
      "MEGASCALE_PORT": str(args.megascale_port),
  }


def train_command(args) -> str:
  """`python -m trm.main ...` as one remote shell string, every value quoted."""
  argv = ["python", "-m", "trm.main", f"--config={args.config}",
          f"--workdir={args.workdir}"]
  if hosts_per_slice(args.accelerator_type) * args.num_slices > 1:
    # trm.main's --distributed=auto looks for the workers in the
    # environment (TPU_WORKER_HOSTNAMES, MEGASCALE_NUM_SLICES), but a
    # Cloud TPU VM lists them in its metadata, which jax reads
    # (GceTpuCluster). Without jax.distributed, Orbax's async checkpoint
    # barrier has no client to use.
    argv.append("--distributed=true")
  for text in args.override:
    key, value = split_override(text)
    argv.append(f"--config.{key}={value}")
  for text in args.trainer_flag:
    name, value = split_trainer_flag(text)
    argv.append(f"--{name}={value}")
  return shlex.join(argv)


def _kill_script() -> str:
  pattern = shlex.quote(_TRAINER_PATTERN)
  # SIGTERM, up to 30 s for the TPU to be released, then SIGKILL.
  return (f"{{ pkill -f {pattern}; for _ in $(seq 30); do "
          f"pgrep -f {pattern} > /dev/null || break; sleep 1; done; "
          f"pkill -9 -f {pattern}; true; }}")


def remote_run_script(args, slice_id: int, coordinator_ip: str | None) -> str:
  """What one slice's workers execute: stop old run, start the trainer."""
  env = dict(_split_env(text) for text in args.env)
  if args.num_slices > 1 and args.megascale_env:
    env.update(megascale_env(args, slice_id, coordinator_ip))
  parts = [f". {REMOTE_VENV}/bin/activate", f"cd {REMOTE_DIR}",
           # A trainer left over on any worker holds its TPU and would stall
           # the new job on every other worker.
           _kill_script()]
  parts += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
  # setsid+nohup: the trainer outlives the ssh session; the subshell (which
  # ignores the session's hang-up and holds none of its streams) then adds
  # the trainer's exit status to the log for `logs`. The braces keep the
  # `&` from backgrounding the whole && chain (so set-up errors still fail).
  parts.append(f"{{ ( trap '' HUP; setsid --wait nohup {train_command(args)} "
               f"< /dev/null; echo \"{_EXIT_LINE} $?\" ) > {REMOTE_LOG} "
               "2>&1 < /dev/null & }")
  parts.append(f'echo "$(hostname): trm.main started, pid $!, log '
               f'{REMOTE_LOG}"')
  return " && ".join(parts)


def run_commands(args, coordinator_ip: str | None = None) -> list[list[str]]:
  """The same trainer on every worker of every slice (one ssh per slice)."""
  if coordinator_ip is None:
    coordinator_ip = args.coordinator_address or COORDINATOR_PLACEHOLDER
  return [_ssh(args, node, remote_run_script(args, i, coordinator_ip))
          for i, node in enumerate(node_names(args))]


def _logs_script() -> str:
  pattern = shlex.quote(_TRAINER_PATTERN)
  # Until the trainer exits (tail -F alone followed a finished or failed
  # run forever), then its exit status, as `run` logged it: a worker that
  # fails stops the others, so `all` ends with the failure. The status
  # line may follow the trainer's end by a moment.
  # No log, or a log without the status line and no trainer running (it
  # was killed with the shell that logs its status, or the host restarted)
  # exited 0: `all` reported success without a status.
  return (f"[ -f {REMOTE_LOG} ] || {{ echo \"$(hostname): no {REMOTE_LOG}: "
          "the trainer was never started here\" >&2; exit 1; }; "
          f"pid=$(pgrep -o -f {pattern}); "
          f"if [ -n \"$pid\" ]; then tail -n 200 -F --pid=\"$pid\" "
          f"{REMOTE_LOG}; else tail -n 200 {REMOTE_LOG}; fi; "
          f"for _ in $(seq {_STATUS_WAIT_SECONDS}); do "
          f"grep -q '^{_EXIT_LINE} ' {REMOTE_LOG} && break; "
          # A trainer that had not started yet: its whole log, followed.
          f"pid=$(pgrep -o -f {pattern}); [ -z \"$pid\" ] || tail -n +1 -F "
          f"--pid=\"$pid\" {REMOTE_LOG}; sleep 1; done; "
          f"status=$(sed -n 's/^{_EXIT_LINE} \\([0-9]*\\)$/\\1/p' "
          f"{REMOTE_LOG} | tail -n 1); "
          f"[ -n \"$status\" ] || {{ echo \"$(hostname): the trainer is not "
          f"running and {REMOTE_LOG} ends without its exit status (killed "
          "with the shell that records it, or the host restarted)\" >&2; "
          "exit 1; }; exit \"$status\"")


def logs_commands(args) -> list[list[str]]:
  """Follows slice 0 worker 0's log (process 0 logs the metrics) until its
  trainer exits, and exits with the trainer's status."""
  return [_ssh(args, node_names(args)[0], _logs_script(), worker="0")]


def stop_commands(args) -> list[list[str]]:
  return [_ssh(args, node, _kill_script()) for node in node_names(args)]


def delete_commands(args) -> list[list[str]]:
  if args.num_slices == 1:
    return [["gcloud", "compute", "tpus", "tpu-vm", "delete", args.name,
             *_location(args), "--quiet"]]
  # --force also deletes the queued resource's TPU VMs.
  return [["gcloud", "compute", "tpus", "queued-resources", "delete",
           args.name, *_location(args), "--force", "--quiet"]]


# ---------------------------------------------------------------------------
# Running.


def _show(command: list[str]) -> None:
  print(shlex.join(command), flush=True)


def execute(commands: list[list[str]], dry_run: bool,
            check: bool = True) -> None:
  for command in commands:
    _show(command)
    if not dry_run:
      subprocess.run(command, check=check)


def _capture(command: list[str]) -> str:
  _show(command)
  return subprocess.run(command, check=True, capture_output=True,
                        text=True).stdout.strip()


def stop_trainers(args, dry_run: bool) -> None:
  """`stop_commands` on every slice, also after one failed (a worker not
  reachable): `stop` gave up at the first, and the later slices' trainers
  went on holding their TPUs. The first failure is raised at the end."""
  failure = None
  for command in stop_commands(args):
    _show(command)
    if not dry_run:
      code = subprocess.run(command, check=False).returncode
      if code and failure is None:
        failure = subprocess.CalledProcessError(code, command)
  if failure is not None:
    raise failure


def start_trainers(args, coordinator: str | None) -> None:
  """`run_commands`; if starting fails on any worker, stops the trainer on
  every worker of every slice before reporting the failure. The workers that
  did start would otherwise wait for the missing ones, each holding its TPU,
  until the job times out, and a rerun's kill script reaches only the
  slices it gets to."""
  try:
    execute(run_commands(args, coordinator), args.dry_run)
  except (subprocess.CalledProcessError, KeyboardInterrupt):
    # Ctrl-C between two slices' starts left the first slice running too.
    print("tpu_pod.py: starting the trainer failed or was interrupted; "
          "stopping it on every worker", file=sys.stderr, flush=True)
    # Best effort on every slice: the first failure is the one reported.
    try:
      stop_trainers(args, dry_run=False)
    except subprocess.CalledProcessError:
      pass
    raise


def wait_until_active(args) -> None:
  """Polls the queued resource; its VMs are usable once it is ACTIVE."""
  if args.dry_run:
    _show(wait_command(args))
    return
  deadline = time.monotonic() + args.max_wait_minutes * 60
  while True:
    state = _capture(wait_command(args))
    print(f"queued resource {args.name}: {state or '?'}", flush=True)
    if state == "ACTIVE":
      return
    if state in ("FAILED", "SUSPENDED", "SUSPENDING"):
      raise RuntimeError(f"queued resource {args.name} is {state}")
    if time.monotonic() > deadline:
      raise RuntimeError(f"queued resource {args.name} not ACTIVE after "
                         f"{args.max_wait_minutes} min (--max_wait_minutes)")
    time.sleep(30)


def coordinator_ip(args) -> str | None:
  """Slice 0 worker 0's internal IP (looked up unless given or not needed)."""
  if args.num_slices == 1 or not args.megascale_env:
    return None
  if args.coordinator_address:
    return args.coordinator_address
  command = coordinator_lookup_command(args)
  if args.dry_run:
    _show(command)
    return COORDINATOR_PLACEHOLDER
  ips = _capture(command).split()
  if not ips:
    raise RuntimeError(f"no network endpoints for {node_names(args)[0]}")
  return ips[0]


def dispatch(args) -> None:
  sub = args.subcommand
  if sub in ("create", "all"):
    execute(create_commands(args), args.dry_run)
    if sub == "all" and args.num_slices > 1:
      wait_until_active(args)
  if sub in ("setup", "all"):
    # The archive (a copy of the code) is removed once it was copied: each
    # setup left one in the temporary directory, a dry run its file list.
    with tempfile.TemporaryDirectory(prefix="trm_code_") as stage:
      execute(setup_commands(args, stage), args.dry_run)
  if sub in ("run", "all"):
    start_trainers(args, coordinator_ip(args))
  if sub in ("logs", "all"):
    execute(logs_commands(args), args.dry_run)
  if sub == "stop":
    stop_trainers(args, args.dry_run)
  if sub == "delete":
    execute(delete_commands(args), args.dry_run)


# ---------------------------------------------------------------------------
# Flags.


def _common_flags() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--name", required=True,
                 help="TPU VM name (one slice) or queued-resource name and "
                 "node prefix (several slices: VMs NAME-0, NAME-1, ...).")
  p.add_argument("--project", help="GCP project (default: gcloud config).")
  p.add_argument("--zone", help="e.g. us-central2-b (default: gcloud config).")
  p.add_argument("--accelerator_type",
                 help="Slice type, e.g. v4-8 (1 host) or v4-64 (8 hosts).")
  p.add_argument("--num_slices", type=int, default=1,
                 help="Slices joined over the DCN (>1: queued resource).")
  p.add_argument("--runtime_version", default=DEFAULT_RUNTIME,
                 help="TPU VM image.")
  p.add_argument("--capacity", choices=("on_demand", "spot", "reserved"),
                 default="on_demand")
  p.add_argument("--max_wait_minutes", type=float, default=120,
                 help="`all`: how long to wait for a queued resource.")
  p.add_argument("--repo_url", help="setup: git URL cloned on each worker.")
  p.add_argument("--revision", default="HEAD",
                 help="setup: branch, tag or commit to check out (a commit "
                 "guarantees every worker runs the same code).")
  p.add_argument("--code_dir",
                 help="setup: local directory copied to each worker instead "
                 "of --repo_url (in a git checkout, what .gitignore ignores "
                 "stays behind; elsewhere runs/, data/, .git, environments).")
  p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                 help="setup with --code_dir: also leave out paths with a "
                 "part matching this glob (repeatable).")
  p.add_argument("--config",
                 help="Config path relative to the repo root, optionally "
                 "with :variant.")
  p.add_argument("--skip_config_check", action="store_true",
                 help="run/all: do not load --config locally (with the "
                 "--override values) to check it and its mesh against the "
                 "slices before anything is created.")
  p.add_argument("--workdir", help="gs://BUCKET/DIR (required on >1 host).")
  p.add_argument("--override", action="append", default=[],
                 metavar="KEY=VALUE",
                 help="Repeatable; becomes --config.KEY=VALUE.")
  p.add_argument("--trainer_flag", action="append", default=[],
                 metavar="NAME=VALUE",
                 help="Repeatable; becomes --NAME=VALUE on trm.main, for its "
                 "flags that are not config fields (distributed_timeout=900, "
                 "compilation_cache=off).")
  p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                 help="Repeatable; exported before the trainer starts.")
  p.add_argument("--megascale_port", type=int, default=DEFAULT_MEGASCALE_PORT)
  p.add_argument("--coordinator_address",
                 help="Slice 0 worker 0 IP/hostname, no port (that is "
                 "--megascale_port; default: looked up with `tpu-vm "
                 "describe`).")
  p.add_argument("--no_megascale_env", dest="megascale_env",
                 action="store_false",
                 help="Do not export MEGASCALE_*; rely on the values the "
                 "queued resource puts in the VMs' tpu-env metadata.")
  p.add_argument("--dry_run", action="store_true",
                 help="Print every command, run nothing.")
  return p


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="tpu_pod.py",
      description="Run trm on every worker of one or more Cloud TPU slices.")
  subs = parser.add_subparsers(dest="subcommand", required=True)
  common = _common_flags()
  helps = {
      "create": "create the TPU VM (1 slice) or queued resource (>1)",
      "setup": "get the code onto every worker and pip install -e .[tpu]",
      "run": "start the trainer in the background on every worker",
      "logs": "follow slice 0 worker 0's log",
      "stop": "kill the trainer on every worker",
      "delete": "delete the TPU VM / queued resource",
      "all": "create, setup, run, logs",
  }
  for name in SUBCOMMANDS:
    subs.add_parser(name, parents=[common], help=helps[name])
  return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
  """Parses and validates; exits with a usage error naming the bad flag."""
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    validate(args, args.subcommand)
  except LaunchError as e:
    parser.error(str(e))
  return args


def main(argv: list[str] | None = None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    dispatch(args)
  except subprocess.CalledProcessError as e:
    print(f"tpu_pod.py: command failed with exit status {e.returncode}: "
          f"{shlex.join(e.cmd)}", file=sys.stderr)
    return e.returncode or 1
  except RuntimeError as e:
    print(f"tpu_pod.py: {e}", file=sys.stderr)
    return 1
  except FileNotFoundError as e:  # subprocess: the program is not on PATH
    hint = (" (install the Google Cloud SDK and log in; --dry_run only "
            "prints the commands)" if e.filename == "gcloud" else "")
    print(f"tpu_pod.py: cannot run {e.filename}: not found on PATH{hint}",
          file=sys.stderr)
    return 127
  except KeyboardInterrupt:
    return 130
  return 0


if __name__ == "__main__":
  sys.exit(main())
