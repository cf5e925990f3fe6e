"""trm.data.atomic_files: a replaced file's directory is synced after the
rename (a power loss could otherwise keep a later write and lose this
one), and a file system that refuses to sync a directory is no error."""
import os
import stat

from trm.data import atomic_files


def _synced(monkeypatch):
  """Records, per os.fsync call, whether it synced a directory."""
  calls, real = [], os.fsync

  def fsync(fd):
    calls.append(stat.S_ISDIR(os.fstat(fd).st_mode))
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  return calls


def test_the_directory_is_synced_after_the_rename(tmp_path, monkeypatch):
  path = tmp_path / "a.json"
  calls = _synced(monkeypatch)
  atomic_files.write_json_atomic(str(path), {"x": 1})
  assert calls == [False, True]  # the file, then its directory
  assert path.read_text() == '{\n  "x": 1\n}'


def test_a_directory_that_cannot_be_synced_is_no_error(tmp_path,
                                                       monkeypatch):
  real = os.fsync

  def fsync(fd):
    if stat.S_ISDIR(os.fstat(fd).st_mode):
      raise OSError(22, "Invalid argument")  # as some file systems answer
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  atomic_files.replace_whole(str(tmp_path / "b.txt"), "text")
  assert (tmp_path / "b.txt").read_text() == "text"
  (tmp_path / "settings.json").write_text("{}")
  atomic_files.remove_before_rewrite(str(tmp_path / "settings.json"))
  assert os.listdir(tmp_path) == ["b.txt"]
