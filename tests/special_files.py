"""Paths that are no regular file, standing in for a device such as
/dev/null (which a test must never risk replacing): a FIFO, and a link
to it."""
import os
import stat


def fifo_and_link(directory, link_name: str) -> list:
  """[FIFO, link to it] made in `directory` (a pytest tmp_path)."""
  fifo = directory / "fifo"
  os.mkfifo(fifo)
  link = directory / link_name
  os.symlink(fifo, link)
  return [fifo, link]


def still_fifo(path) -> bool:
  """Whether `path` still leads to the FIFO (nothing replaced it)."""
  return stat.S_ISFIFO(os.stat(path).st_mode)
