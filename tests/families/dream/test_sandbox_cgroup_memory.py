"""The code sandbox's memory cgroup (trm.families.dream.code_exec): a
sample's processes and the kernel memory charged to them (socket buffers,
its /tmp) stay under `sample_memory_mb`, which RLIMIT_AS per process did
not bound; the cgroup's OOM kill is reason "memory"; no group outlives its
sample; machines where no cgroup can be made run samples as before."""
import dataclasses
import os
import subprocess
import sys

import pytest
import repo

from trm.families.dream import code_exec

# pylint: disable=protected-access
_memory_base = code_exec._memory_group_base
sandbox_memory = repo.load_script("benchmarks", "reliability",
                                  "sandbox_memory.py")

needs_group = pytest.mark.skipif(
    _memory_base() is None,
    reason="no cgroup with the memory controller can be made here (cgroup "
    "v1 as root, or a v2 parent that delegates memory)")

# A process's own address space stays far under RLIMIT_AS (256 MB) while
# its children fill socketpairs: 320 MB in kernel buffers with no cgroup.
LIMITS = code_exec.Limits(timeout_s=30, memory_mb=256, sample_memory_mb=128,
                          site_packages=False)
SOCKETPAIRS = sandbox_memory.PROBES["socketpairs"].replace("{cap}", "320")


def _ours(base):
  """This evaluator's sample cgroups left under `base`."""
  return [name for name in os.listdir(base)
          if name.startswith(f"trm_code_{code_exec._owner()}_")]  # pylint: disable=protected-access


@needs_group
def test_socket_buffers_past_the_sample_limit_are_reason_memory():
  """Without the cgroup the probe held all 320 MB (reason "error", its
  own "held 320 MB" line), as it still does with sample_memory_mb=0."""
  unbounded = code_exec.run_program(
      SOCKETPAIRS, dataclasses.replace(LIMITS, sample_memory_mb=0))
  assert "held 320 MB" in unbounded.result, unbounded
  outcome = code_exec.run_program(SOCKETPAIRS, LIMITS)
  assert outcome.reason == "memory", outcome
  assert outcome.result.startswith(
      "failed: memory limit (the sample's cgroup: 128 MB"), outcome
  assert not _ours(_memory_base())


@needs_group
@pytest.mark.parametrize("mode", ["root", "user", "none"])
def test_the_oom_kill_takes_the_program_not_its_supervisor(mode):
  """The sandbox's own processes score below the program (900 and 1000):
  the cgroup's OOM kill ends the program, whose supervisor reports how.
  With every process at 1000 it took the supervisor, in every mode, and
  the result said "sandbox error (no report; exit status -9)"; at 999
  still."""
  if mode != "none" and code_exec.probe(mode) is not None:
    pytest.skip(f"{mode} mode does not work here: {code_exec.probe(mode)}")
  for _ in range(2):
    outcome = code_exec.run_program(SOCKETPAIRS, LIMITS, mode)
    assert outcome.reason == "memory", outcome
    assert "no report" not in outcome.result, outcome
    assert "; killed by signal 9 (SIGKILL): held " in outcome.result, outcome


@pytest.mark.parametrize("mode", ["root", "user", "none"])
def test_the_program_scores_above_the_sandbox_for_the_oom_killer(mode):
  """Its oom_score_adj is 1000, its supervisor's (the parent) 900."""
  if mode != "none" and code_exec.probe(mode) is not None:
    pytest.skip(f"{mode} mode does not work here: {code_exec.probe(mode)}")
  program = ("import os\nscore = open('/proc/self/oom_score_adj').read()\n"
             "assert score == '1000\\n', score\n")
  if mode == "none":  # the supervisor's /proc is the program's here
    program += ("parent = open(f'/proc/{os.getppid()}/oom_score_adj').read()"
                "\nassert parent == '900\\n', parent\n")
  outcome = code_exec.run_program(program, LIMITS, mode)
  assert outcome.passed, outcome


@needs_group
def test_a_sample_under_its_limit_passes_in_its_own_group():
  """It holds some of everything the cgroup counts (an array, /tmp, socket
  buffers) and checks it runs in a memory cgroup of this evaluator's own
  (without the change it was in ours: no such line); the group is gone
  once it ends."""
  program = (
      "import ctypes, os\n"
      "lines = open('/proc/self/cgroup').read().splitlines()\n"
      "mine = [l for l in lines if l.split(':')[1] in ('', 'memory') and\n"
      f"        '/trm_code_{code_exec._owner()}_' in l]\n"  # pylint: disable=protected-access
      "assert mine, lines\n"
      "data = b'x' * (24 << 20)\n"
      "with open('/tmp/f', 'wb') as f:\n"
      "    f.write(os.urandom(8 << 20))\n"
      "libc = ctypes.CDLL(None)\n"
      "pair = (ctypes.c_int * 2)()\n"
      "for _ in range(16):\n"
      "    assert libc.socketpair(1, 1, 0, pair) == 0\n"
      "    os.write(pair[0], b'x' * 65536)\n")
  outcome = code_exec.run_program((program, "assert len(data) == 24 << 20\n"),
                                  LIMITS)
  assert outcome.passed, outcome
  assert not _ours(_memory_base())
  cpu = code_exec._cpu_group_base()
  assert cpu is None or not _ours(cpu)


@needs_group
def test_isolation_names_the_memory_cgroup_and_its_size():
  assert ("a memory cgroup per sample (128 MB" in code_exec.isolation(LIMITS))
  assert "no memory cgroup (sample_memory_mb=0)" in code_exec.isolation(
      code_exec.Limits(sample_memory_mb=0))


@needs_group
def test_memory_groups_of_a_dead_evaluator_are_removed():
  """An evaluator killed mid-sample leaves its empty groups; the next
  probe removes those named after a pid that no longer runs."""
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  base = _memory_base()
  orphan = os.path.join(base, f"trm_code_{int(dead.stdout)}_0123456789ab")
  os.mkdir(orphan)
  _memory_base.cache_clear()
  try:
    assert _memory_base() == base
    assert not os.path.exists(orphan)
  finally:
    if os.path.exists(orphan):
      os.rmdir(orphan)


def test_without_any_cgroup_samples_run_as_before(monkeypatch):
  """Where no cgroup can be made (no writable hierarchy), samples run and
  isolation() says there is no memory cgroup; nothing raises."""
  monkeypatch.setattr(code_exec, "_group_bases", lambda controller: [])
  code_exec._cpu_group_base.cache_clear()
  _memory_base.cache_clear()
  try:
    assert "no memory cgroup (none can be made here)" in code_exec.isolation(
        LIMITS)
    assert code_exec.run_program("pass", LIMITS).passed
  finally:
    code_exec._cpu_group_base.cache_clear()
    _memory_base.cache_clear()


@pytest.mark.parametrize("value", [10, -1, 1 << 30, True, 64.5])
def test_sample_memory_mb_out_of_range_is_one_line(value):
  with pytest.raises(ValueError, match=(
      rf"^--sample_memory_mb={value!r}: must be 0 \(no memory cgroup\) or "
      r"between 64 and")):
    code_exec.Limits(sample_memory_mb=value).check()


def test_sample_memory_mb_defaults_and_zero():
  assert code_exec.Limits().sample_memory() == 2 * 1024 + 64 + 2 * 16
  assert code_exec.Limits(memory_mb=256, disk_mb=8).sample_memory() == 552
  code_exec.Limits(sample_memory_mb=0).check()
  assert code_exec.Limits(sample_memory_mb=0).sample_memory() == 0


def test_the_flag_is_checked_before_anything_loads(tmp_path):
  run = subprocess.run(
      [sys.executable, "-m", "trm.evaluate", "--benchmark=humaneval",
       "--checkpoint=/nonexistent", f"--output_dir={tmp_path}",
       "--sample_memory_mb=10"], cwd=repo.ROOT, capture_output=True,
      text=True, timeout=300, check=False,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert run.returncode == 2, run.stderr[-3000:]
  lines = run.stderr.strip().splitlines()
  assert lines == [
      "trm.evaluate: error: --sample_memory_mb=10: must be 0 (no memory "
      "cgroup) or between 64 and 1048576 (all of a sample's processes and "
      "the kernel memory charged to it)."], run.stderr


def _files(directory, names):
  for name, text in names.items():
    (directory / name).write_text(text)


def test_v2_limit_and_oom_counter_files(tmp_path):
  """cgroup v2's files (not mounted with the memory controller here): the
  limit, no swap, and memory.events' oom_kill."""
  _files(tmp_path, {"memory.max": "max\n", "memory.swap.max": "max\n",
                    "memory.events": "low 0\nhigh 0\nmax 7\noom 2\n"
                                     "oom_kill 2\noom_group_kill 0\n"})
  assert code_exec._limit_memory(str(tmp_path), 128 << 20)
  assert (tmp_path / "memory.max").read_text() == str(128 << 20)
  assert (tmp_path / "memory.swap.max").read_text() == "0"
  assert code_exec._oom_kills(str(tmp_path)) == 2


def test_v1_limit_and_oom_counter_files(tmp_path):
  """cgroup v1's: memory, then memory + swap (never below it), kmem where
  it is; memory.oom_control's oom_kill (not failcnt, which page-cache
  reclaim at the limit raises too)."""
  _files(tmp_path, {"memory.limit_in_bytes": "9223372036854771712\n",
                    "memory.memsw.limit_in_bytes": "9223372036854771712\n",
                    "memory.failcnt": "5\n",
                    "memory.oom_control": "oom_kill_disable 0\nunder_oom 0"
                                          "\noom_kill 0\n"})
  assert code_exec._limit_memory(str(tmp_path), 64 << 20)
  for name in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
               "memory.kmem.limit_in_bytes"):
    assert (tmp_path / name).read_text() == str(64 << 20)
  assert code_exec._oom_kills(str(tmp_path)) == 0
  assert code_exec._oom_kills(None) == 0
  # No limit file at all (no memory controller): nothing capped.
  assert not code_exec._limit_memory(str(tmp_path / "absent"), 64 << 20)
