"""TFDS builders of the project's text datasets (ArrayRecord, offline).

Importing this package registers `trm_tiny_shakespeare` and
`trm_code_files` with TFDS. Prepare data (once, e.g. on a workstation, then
copy DATA_DIR to the pod's disk or a bucket) with TFDS's own tool, naming
the builder file:

    tfds build trm/data/tfds_builders/trm_tiny_shakespeare.py \
        --manual_dir=PATH/tinyshakespeare --data_dir=DATA_DIR

or by name (`tfds build trm_tiny_shakespeare
--imports=trm.data.tfds_builders ...`), or without the `tfds` script:

    python -m trm.data.tfds_builders trm_tiny_shakespeare \
        --manual_dir=PATH/tinyshakespeare --data_dir=DATA_DIR

TFDS marks a build complete itself: it writes into a temporary
`<version>.incomplete*` directory and renames it when done, so an
interrupted build is never read (`tfds_source` reports the dataset as not
prepared) and the next build starts over. `build` also records its
arguments and the SHA-256 of the input files it read (`ARGS_FILE` in the
version directory, written atomically after TFDS finished): TFDS never
rebuilds a prepared version, so building again with another --manual_dir
or --pattern, or after the input files changed, is refused in one line
instead of silently keeping the old records.
"""
import json
import os

from absl import logging
import tensorflow_datasets as tfds

from trm.core import cli
from trm.data import atomic_files
from trm.data import io as data_io

from trm.data.tfds_builders import trm_code_files
from trm.data.tfds_builders import trm_tiny_shakespeare

BUILDERS = {
    "trm_tiny_shakespeare": trm_tiny_shakespeare.TrmTinyShakespeare,
    "trm_code_files": trm_code_files.TrmCodeFiles,
}


ARGS_FILE = "trm_build_args.json"
# The recorded hash of the input files (absent from records written before
# it was kept: those are not compared).
INPUTS_KEY = "inputs_sha256"


def _recorded_args(builder) -> dict | None:
  """The version's recorded build arguments; None when it has no record
  (built by `tfds build` or an older version). A record that cannot be
  read is refused: taken for none, it let any arguments keep the
  version."""
  path = os.path.join(os.fspath(builder.data_dir), ARGS_FILE)
  if not os.path.lexists(path):
    return None
  fix = (f"delete {os.fspath(builder.data_dir)} to build it again, or pass "
         "another --data_dir")
  try:
    with open(path, encoding="utf-8") as f:
      recorded = json.load(f)
  except (OSError, ValueError, RecursionError) as e:  # RecursionError: nesting
    raise ValueError(f"{path} (the version's build arguments) cannot be read "
                     f"({type(e).__name__}: {str(e)[:120]}); {fix}.") from None
  if not isinstance(recorded, dict):
    raise ValueError(f"{path} (the version's build arguments) holds a JSON "
                     f"{type(recorded).__name__}, not an object; {fix}.")
  return recorded


def _pending_path(builder, data_dir: str) -> str:
  """Where a build's arguments wait while TFDS prepares the version: a
  hidden file in data_dir (TFDS lists no such names), named after the
  version directory. A build killed after TFDS renamed the version into
  place, before `ARGS_FILE` was written, leaves it; the next build takes
  it as the record (one build of data_dir at a time: `build`'s lock)."""
  version = os.path.relpath(os.fspath(builder.data_dir), data_dir)
  return os.path.join(data_dir,
                      f".{version.replace(os.sep, '+')}.{ARGS_FILE}")


def _settle_pending(builder, data_dir: str) -> None:
  """A prepared version's arguments left pending (`_pending_path`) become
  its record when it has none; a stale copy beside a record goes."""
  pending = _pending_path(builder, data_dir)
  if not os.path.isfile(pending):
    return
  recorded = os.path.join(os.fspath(builder.data_dir), ARGS_FILE)
  if os.path.exists(recorded):
    os.remove(pending)
  else:
    os.replace(pending, recorded)


def _check_rebuild(builder, wanted: dict) -> None:
  """An already prepared version: fine when built with `wanted`, refused
  (one line naming the flags) when built with other arguments or from input
  files that have changed since. --manual_dir counts as the recorded one
  when it is that folder reached another way (a link, a bind mount)."""
  where = os.fspath(builder.data_dir)
  recorded = _recorded_args(builder)
  if recorded is None:
    logging.warning("%s is already prepared (by `tfds build` or an older "
                    "version: its build arguments are not recorded); TFDS "
                    "keeps it as it is. Delete it to build it again.", where)
    return
  differ = [k for k in sorted(set(recorded) | set(wanted))
            if recorded.get(k) != wanted.get(k)
            and (k != INPUTS_KEY or k in recorded)
            and not (k == "manual_dir" and isinstance(recorded.get(k), str)
                     and cli.same_file(recorded[k], wanted[k]))]
  if differ == [INPUTS_KEY]:
    raise ValueError(
        f"{where} is already prepared, but the input files under "
        f"--manual_dir={wanted['manual_dir']} changed since it was built "
        f"(their sha256 is {wanted[INPUTS_KEY][:12]}..., the build read "
        f"{recorded[INPUTS_KEY][:12]}...). TFDS never rebuilds a prepared "
        f"version: delete {where} to build it again, or pass another "
        "--data_dir.")
  differ = [k for k in differ if k != INPUTS_KEY]
  if differ:
    shown = ", ".join(f"--{k}={wanted.get(k)!r} (built with "
                      f"{recorded.get(k)!r})" for k in differ)
    raise ValueError(
        f"{where} is already prepared with other arguments: {shown}. TFDS "
        f"never rebuilds a prepared version: delete {where} to build it "
        "again, or pass another --data_dir.")


def build(name: str, manual_dir: str, data_dir: str, pattern: str = ""):
  """Prepares builder `name` into `data_dir`; returns the builder.

  A version already prepared there is kept when it was built with these
  arguments from the same input files, and refused (ValueError naming what
  differs) when it was not."""
  if name not in BUILDERS:
    raise ValueError(f"Unknown builder {name!r}; this project has "
                     f"{sorted(BUILDERS)}.")
  if "://" in data_dir:
    # The build lock and the argument records are local files: a bucket
    # got a local directory named "gs:" and TFDS's traceback.
    raise ValueError(
        f"--data_dir={data_dir}: builds are written to a local directory; "
        "build into one, then copy it to the bucket (e.g. gsutil -m cp -r "
        "DATA_DIR gs://...) and train with --config.data.tfds.data_dir set "
        "to the bucket.")
  if not os.path.isdir(manual_dir):
    raise FileNotFoundError(f"--manual_dir={manual_dir} is not a directory: "
                            "pass the directory holding the input files.")
  kwargs = {}
  if pattern:
    if name != "trm_code_files":
      raise ValueError("--pattern applies to trm_code_files only.")
    kwargs["config"] = trm_code_files.CodeFilesConfig(
        name="custom", pattern=pattern)
  # One build of data_dir at a time: a second build started meanwhile
  # (other inputs, say) would otherwise find the version TFDS just renamed
  # into place before its arguments are recorded, and keep it as its own.
  with atomic_files.dir_lock(data_dir, "--data_dir"):
    builder = BUILDERS[name](data_dir=data_dir, **kwargs)
    wanted = {"manual_dir": os.path.realpath(manual_dir),
              "pattern": pattern or None,
              INPUTS_KEY: data_io.files_sha256(
                  builder.input_files(manual_dir), manual_dir)}
    if builder.is_prepared():
      _settle_pending(builder, data_dir)
      _check_rebuild(builder, wanted)
      return builder
    # Recorded before TFDS starts: a kill between TFDS's rename of the
    # version into place and ARGS_FILE left a version of unknown arguments,
    # which the next build kept whatever it was asked for.
    pending = _pending_path(builder, data_dir)
    atomic_files.replace_whole(pending, json.dumps(wanted, indent=2))
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    atomic_files.write_json_atomic(
        os.path.join(os.fspath(builder.data_dir), ARGS_FILE), wanted)
    os.remove(pending)
    return builder
