"""benchmarks/README.md lists every script of the groups, and every
`benchmarks/...py` path the docs name exists (a moved script leaves no
stale path behind)."""
import glob
import os
import re

import repo

BENCHMARKS = os.path.join(repo.ROOT, "benchmarks")
_PATH = re.compile(r"(?<![\w/])benchmarks/[\w/]+\.py")


def _scripts():
  """GROUP/NAME.py of every script in a group folder (gpu/ has its own
  README)."""
  return sorted(os.path.relpath(path, BENCHMARKS)
                for path in glob.glob(os.path.join(BENCHMARKS, "*", "*.py"))
                if not path.startswith(os.path.join(BENCHMARKS, "gpu")))


def test_the_index_lists_every_script_once():
  with open(os.path.join(BENCHMARKS, "README.md"), encoding="utf-8") as f:
    index = f.read()
  rows = {}
  for group in re.split(r"^## ", index, flags=re.M)[1:]:
    name = group.split("/", 1)[0].strip()
    for script in re.findall(r"^\| `(\w+\.py)` \|", group, flags=re.M):
      rows.setdefault(f"{name}/{script}", 0)
      rows[f"{name}/{script}"] += 1
  assert sorted(rows) == _scripts()
  assert set(rows.values()) == {1}


def test_every_benchmark_path_in_the_docs_exists():
  missing = []
  for doc in ("README.md", "BUILD_NOTES.md", "benchmarks/README.md",
              "benchmarks/gpu/README.md"):
    with open(os.path.join(repo.ROOT, doc), encoding="utf-8") as f:
      text = f.read()
    if doc.startswith("benchmarks/"):  # paths relative to the folder too
      text = re.sub(r"(?<![\w/])(speed|quality|reference|forecast|"
                    r"reliability|gpu)/", r"benchmarks/\1/", text)
    for path in set(_PATH.findall(text)):
      if not os.path.isfile(os.path.join(repo.ROOT, path)):
        missing.append(f"{doc}: {path}")
  assert not missing, "\n".join(sorted(missing))
