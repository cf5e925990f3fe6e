r"""Memory a sandboxed program can hold outside its address space limit.

  PYTHONPATH=. python benchmarks/reliability/sandbox_memory.py \
      [--memory_mb=256] [--cap_mb=1024] [--sample_memory_mb=0|N] \
      [--start_rounds=4]

RLIMIT_AS (`--memory_mb`) counts a process's mappings, not memory the
kernel holds for it elsewhere: a memfd's pages, a SysV shared-memory
segment that was touched and detached, files on a tmpfs that a user
namespace of its own mounted, bytes left unread in socketpairs (children
fill more once one process's open files run out). Four probe programs
each try to hold `--cap_mb` that way in 64 MB pieces (the socketpairs: a
process's worth at a time) and end by raising "held N MB" with why they
stopped. Each runs:

- `rlimit only`: a plain subprocess with RLIMIT_AS = `--memory_mb` and
  nothing else (what the sandbox's mode "none" amounted to before its
  seccomp filter, and the proof that the probe can hold memory here);
- in the code sandbox (`trm.families.dream.code_exec.run_program`), in
  every mode this machine offers ("root" when run as root, "user" where
  unprivileged user namespaces work, "none"), with its memory cgroup of
  `--sample_memory_mb` where one can be made (the header's isolation line
  says): a probe it stops ends as "memory limit (the sample's cgroup"
  (MB held then unknown) instead of "held N MB".

Prints one row per probe and column: MB held, then why it stopped. The
probes remove what they made (shared-memory segments included) before
they raise. With `--start_rounds=N`, then what the memory cgroup costs a
sample's start: 40 `pass` programs without it and with the default one,
N rounds each, alternating.
"""
from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from trm.families.dream import code_exec


def _define_flags():
  """Defined only when run as a script: a test imports the probes into a
  process whose trm.evaluate already defines --memory_mb."""
  flags.DEFINE_integer("memory_mb", 256,
                       "the sandbox's --memory_mb (RLIMIT_AS)")
  flags.DEFINE_integer("cap_mb", 1024,
                       "the most each probe tries to hold, in MB",
                       lower_bound=0)
  flags.DEFINE_integer(
      "sample_memory_mb", None, "the sandbox's --sample_memory_mb (its "
      "memory cgroup, where one can be made; 0: none; default: Limits' own)")
  flags.DEFINE_integer(
      "start_rounds", 0, "then the start cost of 40 `pass` programs (one "
      "worker) without a memory cgroup and with the default one, this many "
      "rounds each, alternating; 0: not measured", lower_bound=0)


_HEAD = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
CAP = {cap}
CHUNK = 64
held = 0
why = 'reached the cap'
"""
_TAIL = "\nraise RuntimeError(f'held {held} MB: {why}')\n"

# Pages written into memfds: shmem, not the writer's mappings.
MEMFD = _HEAD + """fds = []
block = b'x' * (1 << 20)
try:
    while held < CAP:
        fd = os.memfd_create('probe')
        fds.append(fd)
        for _ in range(CHUNK):
            os.write(fd, block)
        held += CHUNK
except OSError as error:
    why = f'{type(error).__name__}: {error}'
""" + _TAIL

# Segments touched while attached, then detached: they outlive the mapping.
SYSV_SHM = _HEAD + """libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
ids = []
try:
    while held < CAP:
        sid = libc.shmget(0, CHUNK << 20, 0o1600)
        if sid < 0:
            raise OSError(ctypes.get_errno(), 'shmget')
        ids.append(sid)
        address = libc.shmat(sid, None, 0)
        if address in (None, 2 ** 64 - 1):
            raise OSError(ctypes.get_errno(), 'shmat')
        ctypes.memset(address, 1, CHUNK << 20)
        libc.shmdt(ctypes.c_void_p(address))
        held += CHUNK
except OSError as error:
    why = f'{type(error).__name__}: {error}'
finally:
    for sid in ids:
        libc.shmctl(sid, 0, None)  # IPC_RMID
""" + _TAIL

# A tmpfs of the program's own, in a user and mount namespace of its own.
USERNS_TMPFS = _HEAD + """try:
    target = os.path.realpath('.')
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(0x10020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        raise OSError(ctypes.get_errno(), 'unshare')
    # Unmapped ids cannot create files (EOVERFLOW): map ours to root.
    for name, text in (('setgroups', 'deny'), ('uid_map', f'0 {uid} 1'),
                       ('gid_map', f'0 {gid} 1')):
        with open(f'/proc/self/{name}', 'w') as f:
            f.write(text)
    if libc.mount(b'none', target.encode(), b'tmpfs', 0, b'size=100%') != 0:
        raise OSError(ctypes.get_errno(), 'mount')
    block = b'x' * (1 << 20)
    while held < CAP:
        with open(os.path.join(target, f'f{held}'), 'wb') as f:
            for _ in range(CHUNK):
                f.write(block)
        held += CHUNK
except OSError as error:
    why = f'{type(error).__name__}: {error}'
""" + _TAIL

# Bytes written into socketpairs nobody reads: the kernel's socket
# buffers, outside every address space (through libc, past any Python
# guard: the sandbox's refused socket.socketpair when this was written). One process holds about 110 MB before
# its 1024 open files run out, so children fill more, one after another,
# each reporting its bytes through a pipe and then holding them (asleep,
# killed with their parent). It counts the bytes written, less than the
# kernel holds for them (each buffer's own overhead); a "held ... so far"
# line goes to stderr after each child, for a result that quotes the last.
SOCKETPAIRS = _HEAD + """import sys, time
block = b'x' * 65536
def fill(limit):
    count, pair = 0, (ctypes.c_int * 2)()
    try:
        while count < limit:
            if libc.socketpair(1, 1, 0, pair) != 0:  # AF_UNIX, SOCK_STREAM
                raise OSError(ctypes.get_errno(), 'socketpair')
            os.set_blocking(pair[0], False)
            try:
                while count < limit:
                    count += os.write(pair[0], block)
            except BlockingIOError:
                pass
    except OSError as error:
        return count, f'{type(error).__name__}: {error}'
    return count, 'reached the cap'
children = []
try:
    while held < CAP and len(children) < 32:
        reports, report_to = os.pipe()  # EOF if the child dies first
        pid = os.fork()
        if pid == 0:
            libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
            os.close(reports)
            count, why = fill((CAP - held) << 20)
            os.write(report_to, f'{count} {why}\\n'.encode())
            time.sleep(600)
            os._exit(0)
        children.append(pid)
        os.close(report_to)
        line = b''
        while not line.endswith(b'\\n'):
            chunk = os.read(reports, 4096)
            if not chunk:
                raise OSError('a child died before it reported')
            line += chunk
        os.close(reports)
        count, why = line.decode().split(' ', 1)
        held += int(count) >> 20
        why = why.strip()
        print(f'held {held} MB so far', file=sys.stderr, flush=True)
except OSError as error:
    why = f'{type(error).__name__}: {error}'
finally:
    for pid in children:
        os.kill(pid, 9)
""" + _TAIL

PROBES = {"memfd": MEMFD, "sysv_shm": SYSV_SHM, "userns_tmpfs": USERNS_TMPFS,
          "socketpairs": SOCKETPAIRS}
_HELD = re.compile(r"held (\d+) MB: (.*)")
_CGROUP = re.compile(r"the sample's cgroup: (\d+) MB")


def rlimit_only(source: str, memory_mb: int) -> str:
  """The probe's last stderr line, run under RLIMIT_AS alone (in a scratch
  directory, killed after 60 s)."""
  limit = memory_mb << 20

  def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

  with tempfile.TemporaryDirectory() as scratch:
    done = subprocess.run([sys.executable, "-I", "-S", "-c", source],
                          cwd=scratch, preexec_fn=_limit, capture_output=True,
                          text=True, timeout=60, check=False)
  lines = done.stderr.strip().splitlines()
  return lines[-1] if lines else f"exit status {done.returncode}"


def _cell(text: str) -> str:
  stopped = _CGROUP.search(text)
  if stopped:  # the kernel kept it under the limit; what it held is lost
    return f"<={stopped.group(1):>4} MB (OOM kill in the sample's cgroup)"
  found = _HELD.search(text)
  if not found:
    return f"? ({text[:100]})"
  return f"{int(found.group(1)):>5} MB ({found.group(2)[:70]})"


def main(argv):
  del argv
  memory_mb, cap_mb = flags.FLAGS.memory_mb, flags.FLAGS.cap_mb
  limits = code_exec.Limits(memory_mb=memory_mb, timeout_s=60,
                            disk_mb=64, site_packages=False,
                            sample_memory_mb=flags.FLAGS.sample_memory_mb)
  try:
    limits.check()
  except ValueError as error:
    raise app.UsageError(str(error)) from None
  modes = ["root"] if os.geteuid() == 0 else []
  modes += ["user", "none"]
  usable = [m for m in modes if m == "none" or code_exec.probe(m) is None]
  skipped = sorted(set(modes) - set(usable))
  print(f"memory_mb={memory_mb} cap_mb={cap_mb} python={sys.version.split()[0]} "
        f"seccomp={code_exec.sandbox_init.seccomp_machine() or 'none'} "
        f"load_1min={os.getloadavg()[0]:.2f}\n"
        f"isolation: {code_exec.isolation(limits)}")
  if skipped:
    print("modes not available here: " + ", ".join(
        f"{m} ({code_exec.probe(m)})" for m in skipped))
  for name, template in PROBES.items():
    source = template.replace("{cap}", str(cap_mb))
    print(f"{name}:")
    print(f"  {'rlimit only':<12} {_cell(rlimit_only(source, memory_mb))}")
    for mode in usable:
      outcome = code_exec.run_program(source, limits, mode=mode)
      print(f"  {'sandbox ' + mode:<12} {_cell(outcome.result)}")
  if flags.FLAGS.start_rounds:
    start_cost(flags.FLAGS.start_rounds)


def start_cost(rounds: int) -> None:
  """Prints the median start cost per `pass` program, sample_memory_mb=0
  (no memory cgroup) against the default (a cgroup where one can be
  made), `rounds` of 40 programs each, alternating which goes first."""
  seconds = {0: [], None: []}
  for round_ in range(rounds):
    for sample_memory_mb in ((0, None) if round_ % 2 == 0 else (None, 0)):
      limits = code_exec.Limits(sample_memory_mb=sample_memory_mb,
                                site_packages=False)
      start = time.perf_counter()
      outcomes = code_exec.run_programs(["pass"] * 40, limits, workers=1)
      seconds[sample_memory_mb].append(time.perf_counter() - start)
      assert all(o.passed for o in outcomes), outcomes
  for sample_memory_mb, times in seconds.items():
    print(f"40 x pass, one worker, "
          f"{'no memory cgroup' if sample_memory_mb == 0 else 'default'}: "
          f"rounds {', '.join(f'{t:.2f}' for t in times)} s; median "
          f"{statistics.median(times) / 40 * 1000:.1f} ms per program")
  print(f"load_1min={os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
