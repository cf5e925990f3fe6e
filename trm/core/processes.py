"""Whether a process recorded by pid (in a lock, in a staging directory's
name) still runs on this host. No jax here: `trm.export` asks before it
loads jax, the workdir lock after."""
from __future__ import annotations

import os


def alive(pid: int) -> bool:
  """Whether a process `pid` exists on this host (another user's counts)."""
  if pid <= 0:  # 0 and negatives name process groups, never one process
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, owned by another user
    return True
  return True


def start_ticks(pid: int) -> int | None:
  """When process `pid` started, in clock ticks since boot (Linux /proc),
  or None where that cannot be read."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      stat = f.read()
    # Field 22; the command name (field 2, in parentheses) may hold spaces.
    return int(stat.rsplit(b")", 1)[1].split()[19])
  except (OSError, ValueError, IndexError):
    return None
