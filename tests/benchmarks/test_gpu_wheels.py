"""check_wheels.sh: a wheels folder against wheels.sha256, before run.sh,
rehearse.sh or fetch_wheels.sh install or hand over anything from it, so a
changed, missing or extra wheel is never installed. (That wheels.sha256
lists one wheel per pin of wheels.txt: test_gpu_kit.py; run.sh's use of
it: test_gpu_kit_inputs.py.)"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")


def _kit(tmp_path, files: dict[str, bytes]):
  """A copy of check_wheels.sh whose wheels.sha256 lists `files`, and a
  wheels folder holding them."""
  kit = tmp_path / "kit"
  kit.mkdir()
  shutil.copy(os.path.join(KIT, "check_wheels.sh"), kit)
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  lines = ["# a comment line", ""]
  for name, data in files.items():
    (wheels / name).write_bytes(data)
    lines.append(f"{hashlib.sha256(data).hexdigest()}  {name}")
  lines.append(f"{'0' * 64}  src-1.0.tar.gz")  # archives are not looked for
  (kit / "wheels.sha256").write_text("\n".join(lines) + "\n")
  return kit, wheels


def _check(kit, wheels):
  return subprocess.run(["bash", str(kit / "check_wheels.sh"), str(wheels)],
                        capture_output=True, text=True, timeout=60,
                        check=False)


FILES = {"a-1.0-py3-none-any.whl": b"first", "b-2.0-py3-none-any.whl": b"2nd"}


def test_check_wheels_passes_the_listed_wheels(tmp_path):
  kit, wheels = _kit(tmp_path, FILES)
  proc = _check(kit, wheels)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert f"2 wheels in {wheels} as wheels.sha256 says" in proc.stdout


def test_check_wheels_refuses_a_changed_missing_or_extra_wheel(tmp_path):
  kit, wheels = _kit(tmp_path, FILES)
  (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"changed")
  proc = _check(kit, wheels)
  assert proc.returncode == 1
  assert "a-1.0-py3-none-any.whl in" in proc.stdout
  assert "not as wheels.sha256 says" in proc.stdout

  (wheels / "a-1.0-py3-none-any.whl").unlink()
  proc = _check(kit, wheels)
  assert proc.returncode == 1 and "a-1.0-py3-none-any.whl" in proc.stdout

  (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"first")
  # Another build of a pinned version, whose platform tag pip would prefer.
  (wheels / "b-2.0-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"x")
  proc = _check(kit, wheels)
  assert proc.returncode == 1
  assert ("b-2.0-cp312-cp312-manylinux_2_28_x86_64.whl in "
          f"{wheels} not in wheels.sha256") in proc.stdout

  proc = _check(kit, tmp_path / "nowhere")
  assert proc.returncode == 1 and "run fetch_wheels.sh" in proc.stdout
