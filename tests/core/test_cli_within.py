"""cli.within: whether an output path is an input directory or lies under
it (an `--overwrite` there would delete the input), by path and by file
identity: a bind mount (or a case-insensitive file system) reaches one
folder under two paths that no path string shows."""
import json
import os
import sys

import bind_mounts
import repo
from trm.core import cli


def test_paths_compared_resolved(tmp_path):
  (tmp_path / "data" / "sub").mkdir(parents=True)
  (tmp_path / "data2").mkdir()
  os.symlink(tmp_path / "data", tmp_path / "link")
  data = str(tmp_path / "data")
  assert cli.within(data, data)
  assert cli.within(str(tmp_path / "data" / "sub"), data)
  assert cli.within(str(tmp_path / "data" / "new" / "x"), data)  # to be made
  assert cli.within(str(tmp_path / "link" / "sub"), data)
  assert cli.within(str(tmp_path / "data" / "sub" / ".." / "x"), data)
  assert not cli.within(str(tmp_path / "data2"), data)  # a prefix, not a folder
  assert not cli.within(data, str(tmp_path / "data" / "sub"))
  assert not cli.within(str(tmp_path / "new" / "x"), str(tmp_path / "new2"))
  assert cli.within(str(tmp_path / "new" / "x"), str(tmp_path / "new"))


def test_urls_compared_as_strings():
  assert cli.within("gs://bucket/run/x", "gs://bucket/run")
  assert cli.within("gs://bucket/run", "gs://bucket/run/")
  assert not cli.within("gs://bucket/run2", "gs://bucket/run")
  assert not cli.within("gs://bucket", "gs://bucket/run")


# Each case "A B": (within(A, B), same_file(A, B)), paths under the test's
# folder, where `alias` is a bind mount of `data` (a disk mounted twice; on
# macOS, `Data` beside `data`).
_CASES = {
    "alias data": (True, True),
    "data alias": (True, True),
    "alias/split data/split": (True, True),
    "alias/rows.npy data/rows.npy": (True, True),
    "data/hard.npy alias/rows.npy": (True, True),  # a hard link
    "data/soft.npy data/rows.npy": (True, True),  # a link, as before
    "alias/split data": (True, False),
    "alias/split/rows.npy data": (True, False),
    "data/split alias": (True, False),
    "alias/new/deeper data": (True, False),  # not there yet: where it goes
    "data/new/x alias/new": (True, False),  # neither there: the same name
    "data/new alias/new": (True, False),  # same_file: no file to be one
    "alias data/split": (False, False),
    "data/other/x alias/new": (False, False),
    "other data": (False, False),
    "other/x alias": (False, False),
    "data other": (False, False),
}
_CHECK = """
import json, sys
from trm.core import cli
root = sys.argv[1]
print(json.dumps({case: [check(*(f"{root}/{p}" for p in case.split()))
                         for check in (cli.within, cli.same_file)]
                  for case in sys.argv[2:]}))
"""


def test_a_bind_mount_is_the_folder_it_shows(tmp_path):
  """What lies under one path of a folder lies under its other (paths
  still to be created too), a file is itself under both, and other
  folders stay apart."""
  (tmp_path / "data" / "split").mkdir(parents=True)
  (tmp_path / "data" / "split" / "rows.npy").write_text("rows")
  (tmp_path / "data" / "rows.npy").write_text("rows")
  os.link(tmp_path / "data" / "rows.npy", tmp_path / "data" / "hard.npy")
  os.symlink("rows.npy", tmp_path / "data" / "soft.npy")
  (tmp_path / "alias").mkdir()
  (tmp_path / "other").mkdir()
  found = json.loads(bind_mounts.python(
      tmp_path / "data", tmp_path / "alias", _CHECK, tmp_path, *_CASES))
  assert {case: tuple(r) for case, r in found.items()} == _CASES
  assert not os.listdir(tmp_path / "alias")  # the mount went with it
  assert cli.same_file("gs://b/x", "gs://b/x/")
  assert not cli.same_file("gs://b/x", "gs://b/y")


def test_export_refuses_an_out_that_is_the_checkpoint_mounted_elsewhere(
    tmp_path):
  """`trm.export --out=ALIAS --overwrite` where ALIAS is the run's workdir
  bound elsewhere: refused as the workdir is (the swap deleted every
  checkpoint once the export was written)."""
  workdir, alias = tmp_path / "run", tmp_path / "alias"
  (workdir / "checkpoints" / "3").mkdir(parents=True)
  (workdir / "checkpoints" / "3" / "state").write_text("weights")
  alias.mkdir()
  done = bind_mounts.run(
      workdir, alias,
      [sys.executable, "-m", "trm.export",
       "--config=configs/diffucoder_7b.py:tiny", f"--checkpoint={workdir}",
       f"--out={alias}", "--overwrite"],
      cwd=repo.ROOT, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert done.returncode == 2, done.stderr[-3000:]
  errors = [l for l in done.stderr.splitlines() if "error:" in l]
  assert len(errors) == 1 and "contains --checkpoint=" in errors[0], (
      done.stderr[-3000:])
  assert (workdir / "checkpoints" / "3" / "state").read_text() == "weights"
