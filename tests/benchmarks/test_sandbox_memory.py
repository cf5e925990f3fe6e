"""benchmarks/reliability/sandbox_memory.py's probes hold memory where
only RLIMIT_AS stands in their way (so its zeros in the sandbox are the
filter's doing, not a probe that never worked), and hold none in the
sandbox."""
import re

import pytest

import repo
from trm.families.dream import code_exec

sandbox_memory = repo.load_script("benchmarks", "reliability",
                                  "sandbox_memory.py")


def _held(text):
  found = re.search(r"held (\d+) MB", text)
  assert found, text
  return int(found.group(1))


@pytest.mark.skipif(code_exec.sandbox_init.seccomp_machine() is None,
                    reason="no seccomp filter on this machine")
@pytest.mark.parametrize("probe", ["memfd", "sysv_shm"])
def test_a_probe_holds_memory_past_the_rlimit_and_none_in_the_sandbox(probe):
  source = sandbox_memory.PROBES[probe].replace("{cap}", "128")
  assert _held(sandbox_memory.rlimit_only(source, 96)) == 128
  outcome = code_exec.run_program(
      source, code_exec.Limits(memory_mb=96, site_packages=False),
      mode="none")
  assert _held(outcome.result) == 0, outcome.result
