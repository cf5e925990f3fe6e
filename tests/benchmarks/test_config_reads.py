"""benchmarks/reliability/config_reads.py names the keys a run never read,
and only those: an entry point that reads two keys of a config file leaves
the others listed, and a read by a config-walking caller does not count."""
import os
import subprocess
import sys

import repo

_CONFIG = '''
import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.used = 1
  c.unused = 2
  c.data = ml_collections.ConfigDict(dict(used=3, ignored=4))
  return c
'''

_ENTRY = '''
import sys
from trm.core import config_lib

path = next(a for a in sys.argv if a.startswith("--config="))[9:]
config = config_lib.load_config(path)
print("read", config.used + config.data.used)


def set_values(config):  # a walker's name: its reads are not uses
  return [config[k] for k in config.keys()]


set_values(config)
'''


def test_the_keys_no_code_read_are_listed(tmp_path):
  (tmp_path / "cfg.py").write_text(_CONFIG)
  (tmp_path / "entry_for_reads.py").write_text(_ENTRY)
  result = subprocess.run(
      [sys.executable, os.path.join(repo.ROOT, "benchmarks", "reliability",
                                    "config_reads.py"),
       "entry_for_reads", f"--config={tmp_path / 'cfg.py'}"],
      cwd=tmp_path, capture_output=True, text=True, timeout=120,
      env=dict(os.environ, PYTHONPATH=os.pathsep.join(
          [str(tmp_path), repo.ROOT])))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "read 4" in result.stdout
  unread = [l for l in result.stdout.splitlines() if l.startswith("unread")]
  assert unread == ["unread: data.ignored", "unread: unused"], result.stdout
  assert "2 of 4 keys" in result.stdout
