"""A trainer that fails before writing anything leaves no new empty workdir
(`run_checks.missing_directories` / `remove_if_empty`); one that wrote
something, or a workdir that existed, is left as it is."""
import os

import pytest

from test_train import tiny_config  # pylint: disable=g-import-not-at-top
from trm.core import run_checks
from trm.core import train


class _TaskRefused(ValueError):
  pass


def _failing_task(write=None):
  def build_task(config, workdir, ctx):
    del config, ctx
    if write:
      with open(os.path.join(workdir, write), "w") as f:
        f.write("kept")
    raise _TaskRefused("data missing")
  return build_task


def test_a_failed_start_removes_the_directories_it_made(tmp_path):
  workdir = tmp_path / "runs" / "new" / "run"
  with pytest.raises(_TaskRefused):
    train.train_and_evaluate(tiny_config(), str(workdir), _failing_task())
  # runs/new/run were made for the run and hold nothing: gone; tmp_path
  # was there before.
  assert os.listdir(tmp_path) == []


def test_a_failed_start_keeps_what_holds_a_file_or_was_there(tmp_path):
  workdir = tmp_path / "runs" / "run"
  with pytest.raises(_TaskRefused):
    train.train_and_evaluate(tiny_config(), str(workdir),
                             _failing_task(write="notes.txt"))
  assert os.listdir(workdir) == ["notes.txt"]
  existing = tmp_path / "existing"
  existing.mkdir()
  with pytest.raises(_TaskRefused):
    train.train_and_evaluate(tiny_config(), str(existing), _failing_task())
  assert existing.is_dir() and os.listdir(existing) == []


def test_missing_directories_stop_at_the_first_that_exists(tmp_path):
  assert run_checks.missing_directories(str(tmp_path / "a" / "b")) == [
      str(tmp_path / "a" / "b"), str(tmp_path / "a")]
  assert run_checks.missing_directories(str(tmp_path)) == []
  assert run_checks.missing_directories("gs://bucket/run") == []
  # A dangling link is there: not ours to remove.
  (tmp_path / "link").symlink_to(tmp_path / "nowhere")
  assert run_checks.missing_directories(str(tmp_path / "link")) == []
