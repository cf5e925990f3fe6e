"""Commands restart once with glibc's malloc on huge pages; nothing else does."""
import os
import subprocess
import sys

from repo import ROOT
from trm.core import huge_pages

CMD = ["python3", "-m", "trm.main", "--config=configs/x.py"]


def test_a_command_restarts_where_glibc_and_the_kernel_allow():
  assert huge_pages.should_restart(CMD, {}, (2, 36), "madvise")
  assert huge_pages.should_restart(CMD, {}, (2, 35), "always")
  # TRM_NO_HUGE_PAGES=0 (or empty) opts nothing out; it turned them off.
  for value in ("0", ""):
    assert huge_pages.should_restart(CMD, {"TRM_NO_HUGE_PAGES": value},
                                     (2, 36), "madvise")


def test_no_restart_for_library_use_opt_out_or_an_unsupporting_host():
  assert not huge_pages.should_restart(["python3", "-c", "import trm"], {},
                                       (2, 36), "madvise")
  assert not huge_pages.should_restart(["python3", "-m", "pytest"], {},
                                       (2, 36), "madvise")
  # A script's own -m: re-executing it ran its code before `import trm`
  # twice.
  for argv in (["python3", "launch.py", "-m", "trm.main"],
               ["python3", "-c", "import trm", "-m", "trm.main"],
               ["python3", "-m", "launch", "-m", "trm.main"]):
    assert not huge_pages.is_command(argv), argv
  for argv in (["python3", "-W", "ignore", "-X", "dev", "-m", "trm.main"],
               ["python3", "-u", "-mtrm.sample"]):
    assert huge_pages.is_command(argv), argv
  assert not huge_pages.should_restart(CMD, {"TRM_NO_HUGE_PAGES": "1"},
                                       (2, 36), "madvise")
  assert not huge_pages.should_restart(
      CMD, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, (2, 36), "madvise")
  assert not huge_pages.should_restart(CMD, {}, (2, 34), "madvise")
  assert not huge_pages.should_restart(CMD, {}, None, "madvise")
  assert not huge_pages.should_restart(CMD, {}, (2, 36), "never")


def _tunables_seen_by(env):
  out = subprocess.run(
      [sys.executable, "-W", "ignore", "-m", "trm.core.huge_pages"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
      check=True)
  return out.stdout.strip()


def test_python_m_trm_runs_with_the_tunable_added_once():
  env = {k: v for k, v in os.environ.items()
         if k not in ("GLIBC_TUNABLES", "TRM_NO_HUGE_PAGES")}
  expected = ("glibc.malloc.hugetlb=1" if huge_pages.should_restart(
      CMD, env, huge_pages._glibc_version(), huge_pages._thp_setting())
              else "")
  assert _tunables_seen_by(env) == expected
  env["GLIBC_TUNABLES"] = "glibc.malloc.check=0"
  if expected:
    assert _tunables_seen_by(env) == ("glibc.malloc.check=0:"
                                      "glibc.malloc.hugetlb=1")
  env["TRM_NO_HUGE_PAGES"] = "1"
  assert _tunables_seen_by(env) == "glibc.malloc.check=0"


def test_importing_trm_does_not_restart_or_set_anything():
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  out = subprocess.run(
      [sys.executable, "-c",
       "import os, trm; print(os.environ.get('GLIBC_TUNABLES', ''))"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
      check=True)
  assert out.stdout.strip() == ""
