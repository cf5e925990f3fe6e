"""The dataset builders' command line (`trm.data.puzzles.builder_cli`)."""
import os
import subprocess
import sys

import pytest

import repo


@pytest.mark.parametrize("builder", ["sudoku", "maze", "arc"])
def test_output_dir_that_is_a_file_is_one_line_before_any_work(tmp_path,
                                                              builder):
  """It was '[Errno 17] File exists: PATH' (for an empty one '[Errno 2] No
  such file or directory'), and only once the puzzles were generated or
  read."""
  path = tmp_path / "a_file"
  path.write_text("not a dataset")
  for out, needle in (
      (path, f"--output_dir={path}: is a file; a directory is expected."),
      (path / "sub", f"--output_dir={path / 'sub'}: {path} is a file"),
      ("", "--output_dir is given but empty: name a directory.")):
    args = [sys.executable, "-m", f"trm.data.puzzles.{builder}",
            f"--output_dir={out}"]
    if builder != "arc":
      args.append("--num_train=5000")
    result = subprocess.run(args, cwd=repo.ROOT, capture_output=True,
                            text=True, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"trm.data.puzzles.{builder}: error: {needle}")
  assert path.read_text() == "not a dataset"


def test_a_build_larger_than_memory_is_one_line(tmp_path):
  """numpy's MemoryError (--num_test=10**13: 810 TB, past any address
  space) was a traceback; the line names the flags that size the build."""
  out = tmp_path / "sudoku"
  result = subprocess.run(
      [sys.executable, "-m", "trm.data.puzzles.sudoku", f"--output_dir={out}",
       "--num_train=5", f"--num_test={10**13}"], cwd=repo.ROOT,
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(
      f"trm.data.puzzles.sudoku: error: Building the dataset in {out} ran out"
      " of host memory (Unable to allocate "), last
  assert f"--num_test={10**13}, --num_aug=0" in last
  assert "Traceback" not in result.stderr


def test_a_remote_output_dir_is_one_line_and_nothing_local(tmp_path):
  """--output_dir=gs://... was built into a local directory "gs:" and
  printed as if written to the bucket."""
  result = subprocess.run(
      [sys.executable, "-m", "trm.data.puzzles.sudoku",
       "--output_dir=gs://bucket/sudoku", "--num_train=5", "--num_test=5"],
      cwd=tmp_path, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join(
                   [str(repo.ROOT), os.environ.get("PYTHONPATH", "")])))
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      "trm.data.puzzles.sudoku: error: gs://bucket/sudoku (--output_dir) is "
      "a remote path")
  assert not os.path.exists(tmp_path / "gs:")


def test_input_directories_expand_a_leading_tilde(tmp_path):
  """`--csv_dir=~/csv` reached the builder as typed (the shell expands a ~
  only at the start of a word) and was looked for under a folder '~'."""
  result = subprocess.run(
      [sys.executable, "-m", "trm.data.puzzles.sudoku",
       f"--output_dir={tmp_path / 'out'}", "--csv_dir=~/csv"], cwd=repo.ROOT,
      capture_output=True, text=True, timeout=300,
      env=dict(os.environ, JAX_PLATFORMS="cpu", HOME=str(tmp_path)))
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"trm.data.puzzles.sudoku: error: {tmp_path / 'csv' / 'train.csv'} not "
      "found")
