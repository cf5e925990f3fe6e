"""tests/cli_batch.py's server gives a case what `subprocess.run` would."""
import os
import sys

import cli_batch


def _tool_in(tmp_path):
  """A preloaded module that reads SEEN at import, and a tool that prints
  that reading and the case's own."""
  (tmp_path / "reads_at_import.py").write_text(
      "import os\nAT_IMPORT = os.environ.get('SEEN')\n")
  (tmp_path / "show_seen.py").write_text(
      "import os, sys\nimport reads_at_import\n"
      "print(reads_at_import.AT_IMPORT, os.environ.get('SEEN'))\n"
      "sys.exit(int(sys.argv[1]))\n")
  return dict(os.environ, PYTHONPATH=str(tmp_path), SEEN="first")


def test_a_case_runs_with_its_argv_and_exit_code(tmp_path):
  env = _tool_in(tmp_path)
  server = cli_batch.Server("show_seen", ("reads_at_import",), env)
  try:
    result = server.run(["3"], cwd=tmp_path, env=env)
    assert (result.returncode, result.stdout) == (3, "first first\n")
    assert result.args == [sys.executable, "-m", "show_seen", "3"]
    assert server.restarts == 0
  finally:
    server.close()


def test_a_case_with_another_environment_gets_a_server_started_with_it(
    tmp_path):
  """The preloaded module's import-time reading is the case's, as in a
  fresh `python -m`: the server restarts rather than serve the old one,
  or refuse (which stopped a test when torch set TORCHINDUCTOR_CACHE_DIR
  in os.environ after its file's server had started)."""
  env = _tool_in(tmp_path)
  server = cli_batch.Server("show_seen", ("reads_at_import",), env)
  try:
    assert server.run(["0"], cwd=tmp_path, env=env).stdout == "first first\n"
    changed = dict(env, SEEN="second")
    result = server.run(["0"], cwd=tmp_path, env=changed)
    assert result.stdout == "second second\n"
    assert server.restarts == 1
    # A variable the server lacked altogether counts too.
    added = dict(changed, ANOTHER="1")
    assert server.run(["0"], cwd=tmp_path, env=added).returncode == 0
    assert server.restarts == 2
    # pytest's per-test variable does not.
    same = dict(added, PYTEST_CURRENT_TEST="x")
    assert server.run(["0"], cwd=tmp_path, env=same).returncode == 0
    assert server.restarts == 2
  finally:
    server.close()
