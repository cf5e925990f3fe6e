"""The code sandbox's fallback without namespaces (mode "none",
trm.families.dream.code_exec): what a program there can still do to the
evaluator, its supervisor and our files. These programs are safe to run
without a PID namespace: they signal the evaluator with signal 0 only (a
permission check, no signal sent), and what they would damage is a
directory or a process of the test's own making."""
import ctypes
import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest
import repo
from sandbox_daemons import assert_ends
from sandbox_daemons import setsid_daemon
from sandbox_daemons import SharedDir

from trm.families.dream import code_exec

LIMITS = code_exec.Limits(timeout_s=20, memory_mb=256, namespaces=False,
                          site_packages=False)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the sandbox is Linux-only")


def test_links_left_by_a_program_do_not_redirect_its_removal(tmp_path):
  """The work directory's removal made every directory in it writable
  first, by a chmod that followed symbolic links: a program that left a
  link to one of our directories had it changed to 0700 by us (as root,
  /usr or /etc so)."""
  ours = tmp_path / "ours"
  ours.mkdir()
  ours.chmod(0o755)
  program = (f"import os\nos.symlink({str(ours)!r}, 'link')\nos.mkdir('d')\n"
             f"os.symlink({str(ours)!r}, 'd/link')\n")
  outcome = code_exec.run_program(program, LIMITS, "none")
  assert outcome.passed, outcome
  assert stat.S_IMODE(ours.stat().st_mode) == 0o755


# In a program: whether `call()` raises PermissionError.
_REFUSED = """def refused(call):
    try:
        call()
    except PermissionError:
        return True
    return False
"""


def _maps(uid: int) -> bool:
  """Whether our user namespace maps `uid` (a rootless container's may
  not: the fallback then runs programs as our user)."""
  try:
    with open("/proc/self/uid_map", encoding="ascii") as f:
      rows = [tuple(map(int, line.split())) for line in f]
  except (OSError, ValueError):
    return True
  return any(inside <= uid < inside + count for inside, _, count in rows)


def _reachable_python():
  """An interpreter an unprivileged uid may run (ours may sit under
  /root, 0700), or None."""
  for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
    try:
      run = subprocess.run([python, "-I", "-S", "-c", "pass"], user=65534,
                           group=65534, extra_groups=[], timeout=60,
                           check=False, capture_output=True)
    except (OSError, subprocess.SubprocessError):
      continue
    if run.returncode == 0:
      return python
  return None


@pytest.fixture
def as_a_uid(monkeypatch):
  """The fallback as root (or with CAP_SETUID, CAP_SETGID and CAP_CHOWN),
  running
  programs as a uid of their own: under an interpreter that uid can
  reach."""
  # pylint: disable=protected-access
  if not code_exec._can_change_ids():
    pytest.skip("we cannot change ids here (not root, no CAP_SETUID, "
                "CAP_SETGID and CAP_CHOWN): the fallback runs programs as "
                "our user")
  if not _maps(code_exec._UID_BASE):
    pytest.skip("our user namespace maps no program uid")
  python = _reachable_python()
  if python is None:
    pytest.skip("no interpreter here that an unprivileged uid may run")
  monkeypatch.setattr(code_exec, "_program_python", lambda: python)
  code_exec._probe_fallback_uid.cache_clear()
  try:
    assert code_exec._fallback_uid()
    yield
  finally:
    code_exec._probe_fallback_uid.cache_clear()


def test_as_root_the_fallback_runs_programs_as_a_uid_of_their_own(as_a_uid):
  """The fallback ran programs as our user, root included: they read any
  file, opened the evaluator's memory and could signal it. Now (as root)
  they run as their slot's unprivileged uid with no groups or
  capabilities, in a directory of that uid's: what other users may read is
  all they may read, and the kernel refuses their signals to us."""
  with SharedDir() as shared:
    secret = os.path.join(shared, "secret")
    public = os.path.join(shared, "public")
    for path, mode in ((secret, 0o600), (public, 0o644)):
      with open(path, "w", encoding="utf-8") as f:
        f.write("ours")
      os.chmod(path, mode)
    program = f"""import errno, os
uid = os.getuid()
assert uid >= {code_exec._UID_BASE} and os.getgid() == uid, uid  # pylint: disable=protected-access
assert os.getgroups() == [], os.getgroups()
caps = [l for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm'))]
assert all(int(l.split()[1], 16) == 0 for l in caps), caps
assert open({public!r}).read() == 'ours'
{_REFUSED}assert refused(lambda: open({secret!r}).read())
supervisor = os.getppid()
evaluator = int([l for l in open(f'/proc/{{supervisor}}/status')
                 if l.startswith('PPid:')][0].split()[1])
assert evaluator == {os.getpid()}, evaluator
assert refused(lambda: os.open(f'/proc/{{evaluator}}/mem', os.O_RDONLY))
assert refused(lambda: os.listdir(f'/proc/{{evaluator}}/fd'))
assert refused(lambda: os.kill(evaluator, 0))
assert refused(lambda: os.kill(supervisor, 0))
assert os.listdir('.') == ['solution.py'], os.listdir('.')
with open('mine', 'w') as f:
    f.write('x')
os.mkdir('d')
assert os.environ['HOME'] == os.environ['TMPDIR'] == os.getcwd()
"""
    outcome = code_exec.run_program((program, "pass\n"), LIMITS, "none")
    assert outcome.passed, outcome


def test_the_fallbacks_uid_bounds_a_samples_processes(as_a_uid):
  """Without namespaces the process limit was left off (it counts every
  process of the uid, which was ours); a uid of the sample's own counts its
  processes alone, as in root mode."""
  program = ("import os, time\nfor _ in range(20):\n    if os.fork() == 0:\n"
             "        time.sleep(30)\n        os._exit(0)\n")
  limits = code_exec.Limits(timeout_s=20, memory_mb=256, namespaces=False,
                            site_packages=False, max_processes=8)
  outcome = code_exec.run_program((program, "pass\n"), limits, "none")
  assert outcome.reason == "process_limit", outcome


@pytest.mark.parametrize("ending", ["exits", "times_out"])
def test_the_fallbacks_uid_leaves_no_process_behind(as_a_uid, monkeypatch,
                                                    ending):
  """Without a cgroup (none can be made in most containers), a daemon that
  left the sample's process group by setsid outlived the sample, and the
  next sample of its slot shares its uid. Every process of the uid is now
  killed when the sample ends or times out."""
  monkeypatch.setattr(code_exec, "_make_groups",
                      lambda limits: code_exec._Groups())  # pylint: disable=protected-access
  limits = code_exec.Limits(timeout_s=5, memory_mb=256, namespaces=False,
                            site_packages=False)
  with SharedDir() as shared:
    pid_file = os.path.join(shared, "daemon.pid")
    program = setsid_daemon(
        pid_file, "time.sleep(60)\n" if ending == "times_out" else "")
    outcome = code_exec.run_program((program, "pass\n"), limits, "none")
    assert outcome.reason == ("passed" if ending == "exits" else "timeout"), (
        outcome)
    with open(pid_file, encoding="ascii") as f:
      assert_ends(int(f.read()), seconds=5)


def test_an_interpreter_the_uid_cannot_reach_keeps_programs_as_our_user(
    monkeypatch, caplog, tmp_path):
  """Where the program's uid cannot run the interpreter (one under /root,
  0700), a program there fails to start with that reason; the probe then
  leaves programs to run as our user, as before, with one warning."""
  # pylint: disable=protected-access
  if not code_exec._can_change_ids() or not _maps(code_exec._UID_BASE):
    pytest.skip("the fallback cannot change ids here")
  hidden = tmp_path / "hidden"
  hidden.mkdir(mode=0o700)
  (hidden / "python").symlink_to(os.path.realpath(sys.executable))
  monkeypatch.setattr(code_exec, "_program_python",
                      lambda: str(hidden / "python"))
  monkeypatch.setattr(code_exec, "_told_fallback_uid", set())
  code_exec._probe_fallback_uid.cache_clear()
  try:
    outcome = code_exec._run("pass", None, LIMITS, "none", drop=True)
    assert outcome.reason == "sandbox_error", outcome
    assert f"cannot reach {hidden / 'python'}" in outcome.result, outcome
    with caplog.at_level("WARNING"):
      assert not code_exec._fallback_uid()
      assert not code_exec._fallback_uid()
      outcome = code_exec.run_program("import os\nassert os.getuid() == "
                                      f"{os.getuid()}\n", LIMITS, "none")
    assert outcome.passed, outcome
    warnings = [r.getMessage() for r in caplog.records
                if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "cannot reach" in warnings[0], warnings
  finally:
    code_exec._probe_fallback_uid.cache_clear()


needs_filter = pytest.mark.skipif(
    code_exec.sandbox_init.seccomp_machine() is None,
    reason="no seccomp filter on this machine (x86-64 and arm64 only)")

# Each call as a program would make it against the evaluator (the test's
# process), its supervisor and the processes above; each must fail with
# EPERM. Harmless where it gets through: signal 0 (a permission check),
# a limit read, a ptrace request on a process not traced (the kernel
# answers ESRCH), a pidfd opened and signal 0, our own pid as an owner.
_ABOVE = """import ctypes, errno, fcntl, os, signal, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
numbers = {'x86_64': dict(kill=62, tgkill=234, tkill=200, rt_sigqueueinfo=129,
                          ptrace=101, prlimit64=302, ioctl=16),
           'aarch64': dict(kill=129, tgkill=131, tkill=130, rt_sigqueueinfo=138,
                           ptrace=117, prlimit64=261, ioctl=29)}[
                               os.uname().machine]
def call(name, *args):
    number = numbers[name] if name in numbers else {
        'pidfd_open': 434, 'pidfd_send_signal': 424}[name]
    if libc.syscall(number, *args) < 0:
        raise OSError(ctypes.get_errno(), name)
supervisor = os.getppid()
evaluator = EVALUATOR
thread = THREAD
info = ctypes.create_string_buffer(128)  # si_code SI_QUEUE (-1)
struct.pack_into('<i', info, 8, -1)
old = ctypes.create_string_buffer(16)
def pidfd_of_proc():
    fd = os.open(f'/proc/{evaluator}', os.O_RDONLY | os.O_DIRECTORY)
    call('pidfd_send_signal', fd, 0, None, 0)
def owner(command):
    a, b = socket.socketpair()
    if command == 'fcntl':
        fcntl.fcntl(a, fcntl.F_SETOWN, os.getpid())
    else:
        call('ioctl', a.fileno(), 0x8901, ctypes.byref(ctypes.c_int(os.getpid())))
attempts = {
    'kill(evaluator)': lambda: os.kill(evaluator, 0),
    'kill(a thread of the evaluator)': lambda: os.kill(thread, 0),
    'kill(supervisor)': lambda: os.kill(supervisor, 0),
    'kill(1)': lambda: os.kill(1, 0),
    'kill(-1)': lambda: os.kill(-1, 0),
    # pid_t is an int: a high half of zeros is -1 to the kernel
    'kill(0xffffffff)': lambda: call('kill', ctypes.c_long(2 ** 32 - 1), 0),
    'killpg(evaluator)': lambda: os.killpg(os.getpgid(evaluator), 0),
    'killpg(supervisor)': lambda: os.killpg(os.getpgid(supervisor), 0),
    'tgkill(evaluator)': lambda: call('tgkill', evaluator, evaluator, 0),
    'tkill(a thread of the evaluator)': lambda: call('tkill', thread, 0),
    'rt_sigqueueinfo(evaluator)': lambda: call('rt_sigqueueinfo', evaluator, 0, info),
    'prlimit64(evaluator)': lambda: call('prlimit64', evaluator, 4, None, old),
    'ptrace(PEEKDATA, evaluator)': lambda: call('ptrace', 2, evaluator, 0, 0),
    'pidfd_open(evaluator)': lambda: call('pidfd_open', evaluator, 0),
    'pidfd_send_signal(/proc/evaluator)': pidfd_of_proc,
    'fcntl(F_SETOWN)': lambda: owner('fcntl'),
    'ioctl(FIOSETOWN)': lambda: owner('ioctl'),
}
through = {}
for name, attempt in attempts.items():
    try:
        attempt()
        through[name] = 'ok'
    except OSError as error:
        if error.errno != errno.EPERM:
            through[name] = errno.errorcode.get(error.errno, error.errno)
assert not through, through
"""


@needs_filter
def test_a_fallback_program_cannot_reach_the_processes_above_it(monkeypatch):
  """Without namespaces a program as our user (or as root, every process)
  signalled the evaluator, its threads and its supervisor, their process
  groups, pid 1 and kill(-1), and could ptrace them, set their limits,
  signal them through a pidfd or make the kernel signal them for a file
  (F_SETOWN; SIGIO's default ends a process). The filter refuses each,
  whatever our user: shown here with the program as our own user."""
  monkeypatch.setattr(code_exec, "_fallback_uid", lambda *_: False)
  stop = threading.Event()
  thread = threading.Thread(target=stop.wait)
  thread.start()
  try:
    program = (_ABOVE.replace("EVALUATOR", str(os.getpid()))
               .replace("THREAD", str(thread.native_id)))
    outcome = code_exec.run_program(program, LIMITS, "none")
  finally:
    stop.set()
    thread.join()
  assert outcome.passed, outcome


@needs_filter
def test_a_fallback_program_still_signals_its_own_processes():
  """What the refusals leave: a program signals, ends, renices and sets
  limits and CPUs of its own children (os.kill, subprocess, multiprocessing's terminate, an
  asyncio subprocess) and its own process group, and of itself."""
  program = """import asyncio, multiprocessing, os, resource, signal, subprocess, sys, time
def sleep():
    time.sleep(30)
pid = os.fork()
if pid == 0:
    time.sleep(30)
    os._exit(0)
os.kill(pid, 0)
resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
os.setpriority(os.PRIO_PROCESS, pid, 5)
os.sched_setaffinity(pid, os.sched_getaffinity(0))
os.kill(pid, signal.SIGTERM)
assert os.waitpid(pid, 0)[1] == signal.SIGTERM
os.kill(os.getpid(), 0)
os.killpg(0, 0)
os.killpg(os.getpgrp(), 0)
resource.prlimit(os.getpid(), resource.RLIMIT_CORE, (0, 0))
os.sched_setaffinity(0, os.sched_getaffinity(0))
os.nice(1)
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
child.send_signal(signal.SIGTERM)
assert child.wait() == -signal.SIGTERM
process = multiprocessing.Process(target=sleep)
process.start()
process.terminate()
process.join()
assert process.exitcode == -signal.SIGTERM, process.exitcode
with multiprocessing.Pool(2) as pool:
    assert pool.map(abs, [-1, -2]) == [1, 2]
    pool.terminate()
async def main():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, '-c', 'import time; time.sleep(30)')
    proc.kill()
    return await proc.wait()
assert asyncio.run(main()) == -signal.SIGKILL
"""
  outcome = code_exec.run_program((program, "pass\n"), LIMITS, "none")
  assert outcome.passed, outcome


def test_a_fallback_programs_process_group_is_its_own(monkeypatch):
  """The program shared its supervisor's process group: killpg(0) (or
  kill(0)) ended the supervisor, scored sandbox_error. It now has a group
  of its own, in a session of its own: in its supervisor's session it
  could setpgid() into the supervisor's group and kill(0) it there (which
  the filter allows), and what stayed in its own group ran on."""
  monkeypatch.setattr(code_exec, "_fallback_uid", lambda *_: False)
  program = ("import os, signal\n"
             "signal.signal(signal.SIGTERM, lambda *_: None)\n"
             "assert os.getpgrp() == os.getpid() != os.getpgid(os.getppid())\n"
             "try:\n"
             "    os.setpgid(0, os.getpgid(os.getppid()))\n"
             "except PermissionError:\n    pass\nelse:\n"
             "    raise AssertionError('joined the supervisor group')\n"
             "os.killpg(0, signal.SIGTERM)\n")
  outcome = code_exec.run_program((program, "pass\n"), LIMITS, "none")
  assert outcome.passed, outcome


@pytest.mark.parametrize("ending", ["exits", "times_out"])
def test_a_fallback_programs_children_end_with_it(monkeypatch, ending):
  """Its children (not daemons: in its process group) are killed when it
  exits or times out, without a cgroup and as our own user: by its
  supervisor, since its group is no longer the one we kill."""
  # pylint: disable=protected-access
  monkeypatch.setattr(code_exec, "_fallback_uid", lambda *_: False)
  monkeypatch.setattr(code_exec, "_make_groups",
                      lambda limits: code_exec._Groups())
  limits = code_exec.Limits(timeout_s=5, memory_mb=256, namespaces=False,
                            site_packages=False)
  with SharedDir() as shared:
    pid_file = os.path.join(shared, "child.pid")
    program = ("import os, time\nif os.fork() == 0:\n"
               f"    open({pid_file!r} + '.new', 'w').write(str(os.getpid()))"
               f"\n    os.rename({pid_file!r} + '.new', {pid_file!r})\n"
               "    time.sleep(60)\n    os._exit(0)\n"
               f"while not os.path.exists({pid_file!r}):\n"
               "    time.sleep(0.01)\n"
               + ("time.sleep(60)\n" if ending == "times_out" else ""))
    outcome = code_exec.run_program((program, "pass\n"), limits, "none")
    assert outcome.reason == ("passed" if ending == "exits" else "timeout"), (
        outcome)
    with open(pid_file, encoding="ascii") as f:
      assert_ends(int(f.read()), seconds=5)


def _passes_under_a_capless_evaluator(program):
  """Runs `program` (EVALUATOR in it: the evaluator's pid) in the fallback,
  as root without the uid drop, from an evaluator that is root without
  any capability (setpriv): like a user of its own uid. Asserts it
  passed."""
  if os.geteuid() != 0 or not shutil.which("setpriv"):
    pytest.skip("needs root and setpriv (an evaluator of our uid without "
                "capabilities)")
  script = ("import os, sys\nfrom trm.families.dream import code_exec as c\n"
            "c._fallback_uid = lambda *_: False\n"
            f"program = {program!r}.replace('EVALUATOR', str(os.getpid()))\n"
            "outcome = c.run_program((program, 'pass'), c.Limits("
            "namespaces=False, site_packages=False), 'none')\n"
            "print(outcome)\nsys.exit(0 if outcome.passed else 1)\n")
  run = subprocess.run(
      ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all",
       sys.executable, "-c", script], capture_output=True, text=True,
      timeout=120, check=False,
      env=dict(os.environ, PYTHONPATH=repo.ROOT))
  assert run.returncode == 0, (run.stdout, run.stderr[-2000:])


def test_a_fallback_program_cannot_reschedule_the_evaluator():
  """A program of the evaluator's uid and capabilities reniced it to 19,
  made it SCHED_IDLE, pinned it to one CPU or lowered its I/O priority,
  each outlasting the sample (as root the kernel refused it only because
  the evaluator held capabilities the program did not). Shown with an
  evaluator that is root without any capability (setpriv), its program as
  root too; each call sets what the evaluator has already, harmless were
  it let through. Its own processes it still reschedules
  (`test_a_fallback_program_still_signals_its_own_processes`)."""
  ioprio = {"x86_64": (251, 252), "aarch64": (30, 31)}.get(os.uname().machine)
  if ioprio is None:
    pytest.skip("no seccomp filter on this machine")
  program = f"""import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
evaluator = EVALUATOR
def ioprio_set():
    now = libc.syscall({ioprio[1]}, 1, evaluator)
    if libc.syscall({ioprio[0]}, 1, evaluator, now) < 0:
        raise OSError(ctypes.get_errno(), 'ioprio_set')
attempts = {{
    'setpriority': lambda: os.setpriority(
        os.PRIO_PROCESS, evaluator, os.getpriority(os.PRIO_PROCESS, evaluator)),
    'sched_setaffinity': lambda: os.sched_setaffinity(
        evaluator, os.sched_getaffinity(evaluator)),
    'sched_setscheduler': lambda: os.sched_setscheduler(
        evaluator, os.sched_getscheduler(evaluator), os.sched_getparam(evaluator)),
    'sched_setparam': lambda: os.sched_setparam(
        evaluator, os.sched_getparam(evaluator)),
    'ioprio_set': ioprio_set,
}}
through = []
for name, attempt in attempts.items():
    try:
        attempt()
        through.append(name)
    except OSError as error:
        if error.errno != errno.EPERM:
            through.append((name, error.errno))
assert not through, through
"""
  _passes_under_a_capless_evaluator(program)


def test_a_fallback_program_cannot_open_its_supervisors_memory():
  """The supervisor holds the nonce and the report's fd: a program of the
  same uid and capabilities (our user's, where Yama allows ptrace, as here
  with no Yama) opened its /proc/<pid>/mem and fds. The supervisor is no
  longer dumpable, so only CAP_SYS_PTRACE would: shown with an evaluator
  that is root without any capability (setpriv), like a user of its own
  uid, its program as root too (no uid drop)."""
  program = ("import os\nsupervisor = os.getppid()\nfor path in "
             "(f'/proc/{supervisor}/mem', f'/proc/{supervisor}/fd/1'):\n"
             "    try:\n        os.close(os.open(path, os.O_RDONLY))\n"
             "    except PermissionError:\n        continue\n"
             "    raise AssertionError(path)\n")
  _passes_under_a_capless_evaluator(program)


def test_a_fallback_program_cannot_open_the_evaluators_memory():
  """A program of the evaluator's uid and capabilities (a non-root user's,
  where Yama allows ptrace, as here with no Yama) opened the evaluator's
  /proc/<pid>/mem and fds, and so could rewrite its results. The
  evaluator is not dumpable from its first such program on (session 106),
  so only CAP_SYS_PTRACE would: shown with an evaluator that is root
  without any capability (setpriv), its program as root too."""
  program = ("import os\nfor path in ('/proc/EVALUATOR/mem', "
             "'/proc/EVALUATOR/fd/1'):\n"
             "    try:\n        os.close(os.open(path, os.O_RDONLY))\n"
             "    except PermissionError:\n        continue\n"
             "    raise AssertionError(path)\n")
  _passes_under_a_capless_evaluator(program)


def test_as_our_user_a_fallback_program_holds_no_capability(monkeypatch):
  """Where the uid drop does not apply (as root: an interpreter other uids
  cannot reach, as this host's), the program kept every capability:
  CAP_DAC_OVERRIDE read any user's files, CAP_SYS_PTRACE opened the
  evaluator's memory and fds, CAP_KILL signalled any user's process. It
  keeps our uid now, with no capability, none regained by an exec (it
  may still list the evaluator's fds as their owner, not open them)."""
  if os.geteuid() != 0:
    pytest.skip("as root (a non-root user's program held none before)")
  monkeypatch.setattr(code_exec, "_fallback_uid", lambda *_: False)
  with SharedDir() as shared:
    theirs = os.path.join(shared, "theirs")
    with open(theirs, "w", encoding="utf-8") as f:
      f.write("another user's")
    os.chmod(theirs, 0o600)
    os.chown(theirs, 65534, 65534)
    program = f"""import os, subprocess, sys
def caps(text):
    return [l for l in text.splitlines() if l.startswith(('CapEff', 'CapPrm', 'CapBnd', 'CapAmb'))]
mine = caps(open('/proc/self/status').read())
assert all(int(l.split()[1], 16) == 0 for l in mine), mine
child = caps(subprocess.run([sys.executable, '-c', "print(open('/proc/self/status').read())"],
                            capture_output=True, text=True, check=True).stdout)
assert all(int(l.split()[1], 16) == 0 for l in child), child
{_REFUSED}assert refused(lambda: open({theirs!r}).read())
evaluator = {os.getpid()}
assert refused(lambda: os.open(f'/proc/{{evaluator}}/mem', os.O_RDONLY))
assert refused(lambda: os.open(f'/proc/{{evaluator}}/fd/0', os.O_RDONLY))
assert os.getuid() == 0
"""
    outcome = code_exec.run_program((program, "pass\n"), LIMITS, "none")
  assert outcome.passed, outcome


def test_the_fallbacks_uid_leaves_no_zombie_to_its_slot(as_a_uid,  # pylint: disable=redefined-outer-name,unused-argument
                                                       monkeypatch):
  """An evaluator that is a container's pid 1 (here: a subreaper) reaps
  only its own children: the program's orphans, killed, stayed zombies of
  the slot's uid, counted by RLIMIT_NPROC, and after max_processes of them
  every later program of the slot failed with process_limit."""
  # pylint: disable=protected-access
  monkeypatch.setattr(code_exec, "_make_groups",
                      lambda limits: code_exec._Groups())
  libc = ctypes.CDLL(None, use_errno=True)
  assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
  limits = code_exec.Limits(timeout_s=20, memory_mb=256, namespaces=False,
                            site_packages=False, max_processes=4)
  leave = "import subprocess\nsubprocess.Popen(['sleep', '60'])\n"
  fork = "import subprocess\nsubprocess.run(['true'], check=True)\n"
  try:
    for _ in range(5):
      assert code_exec.run_program((leave, "pass\n"), limits, "none").passed
    outcome = code_exec.run_program((fork, "pass\n"), limits, "none")
    assert outcome.passed, outcome
  finally:
    libc.prctl(36, 0, 0, 0, 0)
    while True:
      try:
        if os.waitpid(-1, os.WNOHANG) == (0, 0):
          break
      except ChildProcessError:
        break
