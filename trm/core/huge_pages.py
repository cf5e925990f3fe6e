"""Commands restart once with glibc's malloc on transparent huge pages.

XLA:CPU allocates its large temporaries with malloc, which maps big blocks
fresh for every call and unmaps them after; each first touch of a 4 KiB page
is then a page fault. At DiffuCoder's [16, 1024] forward that was ~263,000
faults and over half the call in the kernel; asking glibc for huge pages
(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) made that forward 2.1x and the
TRM `:cpu` step ~1.3x faster (BUILD_NOTES.md, "Huge pages").

glibc reads its tunables only when a process starts, so `python -m trm.X`
sets the variable and re-executes itself once, before jax is imported
(`trm/__init__.py` calls `restart_with_huge_pages`). Library use (`import
trm` in a notebook or a test) never restarts anything. Opt out with
TRM_NO_HUGE_PAGES=1 (0 or empty: no opt-out); a GLIBC_TUNABLES that
already names the tunable is left alone.
"""
from __future__ import annotations

import os
import sys

TUNABLE = "glibc.malloc.hugetlb"
OPT_OUT_ENV = "TRM_NO_HUGE_PAGES"
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def _glibc_version() -> tuple[int, ...] | None:
  try:
    name = os.confstr("CS_GNU_LIBC_VERSION") or ""   # 'glibc 2.36'
  except (AttributeError, ValueError, OSError):
    return None
  try:
    return tuple(int(p) for p in name.split()[-1].split("."))
  except (IndexError, ValueError):
    return None


def _thp_setting() -> str:
  """'always', 'madvise' or 'never' (the bracketed choice), '' if unknown."""
  try:
    with open(_THP_SETTING) as f:
      text = f.read()
  except OSError:
    return ""
  start, end = text.find("["), text.find("]")
  return text[start + 1:end] if 0 <= start < end else ""


# Interpreter options whose value is the next argument.
_OPTIONS_WITH_VALUES = ("-W", "-X", "--check-hash-based-pycs")


def is_command(orig_argv) -> bool:
  """True for `python [options] -m trm.<module> ...`: the interpreter's own
  -m, not one among a script's arguments (`python launch.py -m trm.main`
  ran launch.py's code before `import trm` twice)."""
  args = list(orig_argv[1:])
  for i, arg in enumerate(args):
    if arg == "-m":
      return i + 1 < len(args) and args[i + 1].startswith("trm.")
    if arg.startswith("-m"):  # -mtrm.main
      return arg[2:].startswith("trm.")
    if arg in _OPTIONS_WITH_VALUES:
      continue
    if i and args[i - 1] in _OPTIONS_WITH_VALUES:
      continue  # the value of -W or -X
    if arg.startswith("-c") or arg == "-" or not arg.startswith("-"):
      return False  # a command, stdin or a script: its own arguments follow
  return False


def should_restart(orig_argv, environ, glibc_version, thp_setting) -> bool:
  """Whether this process should re-execute itself with the tunable set."""
  return (is_command(orig_argv)
          # "0" is no opt-out (as TRM_TRACEBACK=0): it turned huge pages off.
          and environ.get(OPT_OUT_ENV, "") in ("", "0")
          and TUNABLE not in environ.get("GLIBC_TUNABLES", "")
          and glibc_version is not None and glibc_version >= (2, 35)
          and thp_setting in ("always", "madvise"))


def restart_with_huge_pages() -> None:
  """Re-executes `python -m trm.X ...` with the tunable added (no return);
  does nothing where it does not apply or the exec fails."""
  orig_argv = getattr(sys, "orig_argv", None)
  if not sys.platform.startswith("linux") or not orig_argv or not (
      should_restart(orig_argv, os.environ, _glibc_version(),
                     _thp_setting())):
    return
  tunables = os.environ.get("GLIBC_TUNABLES")
  os.environ["GLIBC_TUNABLES"] = (f"{tunables}:{TUNABLE}=1" if tunables
                                  else f"{TUNABLE}=1")
  try:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable] + list(orig_argv[1:]))
  except OSError:
    pass  # carry on without: only speed is lost


if __name__ == "__main__":
  print(os.environ.get("GLIBC_TUNABLES", ""))
