"""The code sandbox's fallback without namespaces (mode "none",
trm.families.dream.code_exec): what a program there can still do to the
evaluator, its supervisor and our files. These programs are safe to run
without a PID namespace: they signal the evaluator with signal 0 only (a
permission check, no signal sent), and what they would damage is a
directory or a process of the test's own making."""
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

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
