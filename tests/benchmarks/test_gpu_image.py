"""benchmarks/gpu/image.txt (the GPU machine's packages, which rehearse.sh
installs on a CPU host) against what the device's runs logged, and
rehearse.sh's refusals, which need no venv."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")


def image_pins() -> dict[str, str]:
  """image.txt -> {package: version} for its exact pins (extras dropped)."""
  pins = {}
  with open(os.path.join(KIT, "image.txt")) as f:
    for line in f:
      line = line.split("#")[0].strip()
      m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line)
      if m:
        pins[m.group(1).lower()] = m.group(3)
  return pins


def logged_versions(path: str) -> dict[str, str]:
  """A device run's log.txt -> {package: version} from run.sh's list."""
  out = {}
  with open(path) as f:
    for line in f:
      m = re.fullmatch(r"  ([a-z0-9_.-]+) (\d[^\s:]*)\n", line)
      if m:
        out[m.group(1)] = m.group(2)
  return out


def device_logs() -> list[str]:
  """The logs of runs on a GPU (a `gpu:` line), oldest first by folder."""
  found = []
  for path in sorted(glob.glob(os.path.join(KIT, "results", "*", "*log*.txt"))):
    with open(path) as f:
      if "  gpu: NVIDIA" in f.read():
        found.append(path)
  return found


def test_image_pins_are_what_the_newest_device_run_logged():
  logs = device_logs()
  assert logs, "no device run's log under benchmarks/gpu/results"
  newest = logged_versions(logs[-1])
  assert {"jax", "torch", "flax"} <= set(newest), logs[-1]
  pins = image_pins()
  compared = {name for name in pins if name in newest}
  assert {"jax", "jaxlib", "torch", "triton", "flax", "optax"} <= compared
  wrong = {n: (pins[n], newest[n]) for n in compared if pins[n] != newest[n]}
  assert not wrong, f"image.txt vs {logs[-1]} (pin, logged): {wrong}"
  # The compile-only plugin must be the same JAX as the device's.
  with open(os.path.join(KIT, "image.txt")) as f:
    text = f.read()
  assert f"jax-cuda13-plugin[with-cuda]=={newest['jax']}" in text


def test_logged_versions_reads_run_sh_list_only():
  log = ("[15:23:00] run.sh: Python 3.12.3 at /opt/x\n"
         "  gpu: NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04\n"
         "  jax 0.11.2\n  torch 2.11.0\n  tensorflow: not installed\n"
         "  + python3 -m pip install x==1\n")
  path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "trm_image_log.txt")
  with open(path, "w") as f:
    f.write(log)
  try:
    assert logged_versions(path) == {"jax": "0.11.2", "torch": "2.11.0"}
  finally:
    os.remove(path)


def _rehearse(*args, env=None):
  return subprocess.run(["bash", os.path.join(KIT, "rehearse.sh"), *args],
                        capture_output=True, text=True, timeout=60,
                        env={**os.environ, **(env or {})}, check=False)


def test_rehearse_refuses_an_unknown_step(tmp_path):
  run = _rehearse(str(tmp_path), "--steps=smoke,deploy")
  assert run.returncode == 2
  assert "unknown step 'deploy'" in run.stderr


def test_rehearse_without_a_venv_says_how_to_build_it(tmp_path):
  run = _rehearse(str(tmp_path / "out"), "--steps=smoke",
                  env={"TRM_IMAGE_VENV": str(tmp_path / "no_venv")})
  assert run.returncode == 1
  assert "--steps=venv first" in run.stdout
  with open(tmp_path / "out" / "rehearse.txt") as f:
    assert "--steps=venv first" in f.read()


def test_rehearse_never_replaces_a_directory_that_is_not_a_venv(tmp_path):
  keep = tmp_path / "precious"
  keep.mkdir()
  (keep / "data.txt").write_text("kept")
  run = _rehearse(str(tmp_path / "out"), "--steps=venv",
                  env={"TRM_IMAGE_VENV": str(keep),
                       "PYTHON312": os.environ.get("PYTHON312", "python3")})
  assert run.returncode == 1
  assert "is not a venv" in run.stdout
  assert (keep / "data.txt").read_text() == "kept"


@pytest.mark.skipif(sys.version_info[:2] == (3, 12),
                    reason="needs an interpreter that is not Python 3.12")
def test_rehearse_refuses_an_interpreter_that_is_not_python_3_12(tmp_path):
  venv = tmp_path / "venv"
  run = _rehearse(str(tmp_path / "out"), "--steps=venv",
                  env={"TRM_IMAGE_VENV": str(venv),
                       "PYTHON312": sys.executable})
  assert run.returncode == 1
  assert f"PYTHON312={sys.executable} is not one" in run.stdout
  assert not venv.exists()


def test_rehearse_without_the_wheels_skips_what_needs_them(tmp_path):
  """The compile steps import the carried wheels: without them they are
  skipped in one line (they ran for minutes and failed), and the run
  fails."""
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / "pyvenv.cfg").write_text("")
  (venv / "bin" / "python").symlink_to(sys.executable)
  run = _rehearse(str(tmp_path / "out"), "--steps=compile,registers",
                  env={"TRM_IMAGE_VENV": str(venv),
                       "TRM_GPU_WHEELS": str(tmp_path / "no_wheels")})
  assert run.returncode == 1
  assert "wheels: FAILED" in run.stdout
  assert "compile and registers skipped" in run.stdout
  assert not (tmp_path / "out" / "compile.txt").exists()
  assert "FAILED: wheels" in run.stdout
