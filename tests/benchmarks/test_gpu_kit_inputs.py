"""Bad input to the GPU kit's tools (benchmarks/gpu/) and to `trm.aot`'s
slice counts: one line naming what is wrong, before anything is measured,
compiled or written; OUT holds one run; the figures are strict JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KIT = os.path.join(ROOT, "benchmarks", "gpu")

# Stands in for the interpreter: measure.py writes one figure at once, so
# run.sh's own handling is checked in a second, not a section's minutes.
STUB = """#!/bin/bash
if [[ "${1:-}" == *measure.py ]]; then
  [ -z "${STUB_ARGV:-}" ] || echo "$*" >> "$STUB_ARGV"
  shift; out=$(printf '%s\\n' "$@" | sed -n 's/^--out=//p')
  echo "{\\"name\\": \\"$1/x\\", \\"value\\": 1.0}" >> "$out/figures.jsonl"
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


def _run_sh(tmp_path, out, *args, **env):
  stub = tmp_path / "python_stub"
  stub.write_text(STUB)
  stub.chmod(0o755)
  full = {**os.environ, "TRM_GPU_INSTALL": "0", "PYTHON": str(stub),
          "REAL_PYTHON": sys.executable,
          "TRM_GPU_SCRATCH": str(tmp_path / "scratch"), **env}
  return subprocess.run(["bash", os.path.join(KIT, "run.sh"), str(out),
                         *args], cwd=ROOT, env=full, capture_output=True,
                        text=True, timeout=120, check=False)


def test_run_sh_counts_the_install_in_its_total(tmp_path):
  """The run ends within its total (issue 26's 8 minutes) counted from its
  start: the install and the version check (here a 2 s stand-in) and the
  15 s run.sh keeps for the end come out of the sections' time. The
  sections' budgets summed to the total without the install (about 15 s on
  the H100), so the run could end past it."""
  stub = tmp_path / "slow_version_check"
  stub.write_text(STUB.replace('exec "$REAL_PYTHON"',
                               '[ "${1:-}" != - ] || sleep 2\nexec "$REAL_PYTHON"'))
  stub.chmod(0o755)
  argv = tmp_path / "argv"
  proc = _run_sh(tmp_path, tmp_path / "out", "--only=cudnn",
                 PYTHON=str(stub), STUB_ARGV=str(argv), TRM_GPU_TOTAL="40",
                 TRM_GPU_BUDGET_CUDNN="40")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  budget = argv.read_text().split("--budget=")[1].split()[0]
  assert int(budget) <= 40 - 2 - 15, proc.stdout
  assert "cut to the" in proc.stdout and "the install counted" in proc.stdout
  # Under 10 s left: the section is not started, and the run says so.
  proc = _run_sh(tmp_path, tmp_path / "out", "--only=cudnn",
                 PYTHON=str(stub), TRM_GPU_TOTAL="25")
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert "section cudnn: skipped: " in proc.stdout, proc.stdout
  assert "failed: cudnn" in proc.stdout
  proc = _run_sh(tmp_path, tmp_path / "out", "--only=cudnn",
                 TRM_GPU_TOTAL="1e3")
  assert proc.returncode == 2
  assert "TRM_GPU_TOTAL='1e3' must be a whole number of seconds" in (
      proc.stderr)


def test_run_sh_refuses_an_out_that_is_a_file(tmp_path):
  # It used to fall back to OUT='' and write /figures.jsonl and /log.txt.
  out = tmp_path / "a_file"
  out.write_text("mine\n")
  proc = _run_sh(tmp_path, out, "--smoke", "--only=cudnn")
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert f"OUTDIR {out} exists and is not a directory" in proc.stderr
  assert out.read_text() == "mine\n"
  assert "section" not in proc.stdout


def test_run_sh_refuses_an_option_for_out(tmp_path):
  proc = _run_sh(tmp_path, "--smoke")
  assert proc.returncode == 2
  assert "OUTDIR '--smoke' must come first" in proc.stderr


@pytest.mark.parametrize("budget", ["abc", "-5", "0", "1e3", "2.5",
                                    "99999999999999999999"])
def test_run_sh_rejects_a_budget_that_is_not_seconds(tmp_path, budget):
  # abc: "unbound variable"; 1e3: every section skipped, exit 0; 0:
  # `timeout 0`, no limit at all; -5: timeout's own error; 20 digits wrap.
  proc = _run_sh(tmp_path, tmp_path / "out", "--smoke", "--only=cudnn,trm",
                 TRM_GPU_BUDGET_CUDNN=budget)
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert (f"TRM_GPU_BUDGET_CUDNN='{budget}' must be a whole number of "
          "seconds from 1 to 86400") in proc.stderr
  assert "section" not in proc.stdout


def test_run_sh_reads_a_budget_with_a_leading_zero_as_decimal(tmp_path):
  proc = _run_sh(tmp_path, tmp_path / "out", "--smoke", "--only=cudnn",
                 TRM_GPU_BUDGET_CUDNN="030")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "section cudnn: up to 30 s" in proc.stdout  # not octal 24


def test_run_sh_refuses_an_only_with_no_section(tmp_path):
  proc = _run_sh(tmp_path, tmp_path / "out", "--smoke", "--only=,")
  assert proc.returncode == 2
  assert "names no section" in proc.stderr


def test_a_second_run_into_the_same_out_keeps_nothing_of_the_first(tmp_path):
  out, dump = tmp_path / "out", tmp_path / "scratch" / "xla_dump"
  out.mkdir()
  dump.mkdir(parents=True)
  (out / "trace_trm_old.tar.gz").write_text("old")
  (out / "hlo_after_optimizations.tar.gz").write_text("old")
  (out / "log.txt").write_text("OLD RUN\n")
  (out / "figures.jsonl").write_text('{"name": "trm/old", "value": 1.0}\n')
  (dump / "module_1.jit_train_step.after_optimizations.txt").write_text("old")
  proc = _run_sh(tmp_path, out, "--smoke", "--only=cudnn")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert sorted(os.listdir(out)) == ["figures.jsonl", "log.txt"]
  assert "OLD RUN" not in (out / "log.txt").read_text()
  assert "removed the previous run's" in (out / "log.txt").read_text()
  names = [json.loads(line)["name"] for line in open(out / "figures.jsonl")]
  assert names == ["cudnn/x"]


def _kit(name):
  sys.path.insert(0, KIT)
  try:
    return __import__(name)
  finally:
    sys.path.remove(KIT)


def _strict(line: str):
  def refuse(constant):
    raise ValueError(f"not JSON: {constant}")
  return json.loads(line, parse_constant=refuse)


def test_non_finite_figures_are_strict_json(tmp_path):
  measure, mixer_sweep = _kit("measure"), _kit("mixer_sweep")
  args = measure.parse_args(["mixer", f"--out={tmp_path}", "--smoke"])
  rec = measure.Recorder(args, "mixer")
  name = mixer_sweep.KERNELS[0][2][0][0]
  rec.figure(f"forward/{name}/ms", 1.0, "ms", "ours", dtype="bf16", batch=1)
  # A setting whose outputs hold NaN scores an infinite error.
  rec.figure(f"forward/{name}/max_rel_err", float("inf"), "fraction", "ours",
             dtype="bf16", batch=1, mfu=float("nan"))
  rows = [_strict(line) for line in open(tmp_path / "figures.jsonl")]
  assert rows[1]["value"] is None and rows[1]["non_finite"] == "inf"
  assert rows[1]["mfu"] is None
  # ... and is still never chosen.
  assert mixer_sweep.swept_setting(str(tmp_path / "figures.jsonl")) is None


@pytest.mark.parametrize("argv, needle", [
    (["dream", "--dream_batches", "16x"], "--dream_batches 16x"),
    (["dream", "--dream_batches", "0", "16"], "--dream_batches 0 16"),
    (["trm", "--steps=0"], "--steps=0"),
    (["trm", "--rounds=0"], "--rounds=0"),
    (["trm", "--trm_batch=-1"], "--trm_batch=-1"),
    (["dream", "--dream_block=0"], "--dream_block=0"),
    (["trm", "--budget=0"], "--budget=0.0"),
    (["trm", "--budget=nan"], "--budget=nan"),
])
def test_measure_checks_its_arguments_before_any_work(argv, needle, capsys):
  measure = _kit("measure")
  with pytest.raises(SystemExit) as e:
    measure.parse_args(argv[:1] + ["--out=x"] + argv[1:])
  assert e.value.code == 2
  assert needle in capsys.readouterr().err


def test_measure_refuses_an_out_that_is_a_file(tmp_path, capsys):
  measure = _kit("measure")
  (tmp_path / "f").write_text("")
  with pytest.raises(SystemExit):
    measure.parse_args(["trm", f"--out={tmp_path / 'f'}"])
  assert "exists and is not a directory" in capsys.readouterr().err
  assert measure.parse_args(["dream", "--out=x", "--dream_batches", "1",
                             "16"]).dream_batches == [1, 16]


def test_dream_reference_says_whether_it_is_the_pinned_copy(tmp_path):
  measure = _kit("measure")
  with open(os.path.join(KIT, "dream_hf.sha256")) as f:
    names = [line.split()[1] for line in f if line.strip()]
  for name in names:
    (tmp_path / name).write_text("# edited\n")
  said = measure.dream_hf_digest(str(tmp_path))
  assert said.startswith("NOT the pinned copy") and names[0] in said


def test_offline_one_line_errors(tmp_path):
  offline = _kit("offline")
  (tmp_path / "file").write_text("")
  with pytest.raises(SystemExit) as e:
    offline.parse_args([f"--out={tmp_path / 'file'}"])
  assert e.value.code == 2
  hlo = tmp_path / "x.hlo"
  hlo.write_text("hello\n")
  with pytest.raises(SystemExit, match="no ENTRY computation"):
    offline.replay(str(hlo), "h100", 0.6, 5)
  bad = tmp_path / "bad.hlo.gz"
  bad.write_bytes(b"\x1f\x8b\x08\x00")
  with pytest.raises(SystemExit, match="not readable"):
    offline.replay(str(bad), "h100", 0.6, 5)
  figures = tmp_path / "figures.jsonl"
  figures.write_text('{"name": "trm/a/ms", "side": "ours", "device": '
                     '"NVIDIA H100 80GB HBM3", "value": null}\n')
  assert offline.measured_seconds([str(figures)], "NVIDIA H100 80GB HBM3") == {}
  figures.write_text('{"name": "trm/a/ms", "val\n')
  with pytest.raises(SystemExit, match="line 1 is not a JSON figure"):
    offline.measured_seconds([str(figures)], "NVIDIA H100 80GB HBM3")


def test_profile_table_one_line_errors(tmp_path, capsys):
  profile_table = _kit("profile_table")
  trace = tmp_path / "t.trace.json"
  trace.write_text("{}")
  for argv, needle in (([f"--json={tmp_path}"], "--json="),
                       ([f"--json={tmp_path / 'no' / 'x.json'}"], "--json="),
                       (["--top=-3"], "--top=-3")):
    with pytest.raises(SystemExit) as e:
      profile_table.parse_args([str(trace)] + argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err
  hlo = tmp_path / "x.hlo"
  hlo.write_text("hello\n")
  with pytest.raises(SystemExit, match="no ENTRY computation"):
    profile_table.checked_hlo(str(hlo))
  (tmp_path / "t.tar.gz").write_bytes(b"\x1f\x8b\x08\x00")
  with pytest.raises(SystemExit, match="not readable"):
    profile_table.checked_hlo(f"{tmp_path / 't.tar.gz'}:m.txt")


@pytest.mark.parametrize("argv", [["--batch=0"],
                                  ["--gpt", "--json=/nonexistent/r.json"],
                                  ["--json={fifo}"]])
def test_kernel_report_checks_before_compiling(argv, capsys, tmp_path):
  """A FIFO (standing in for a device, /dev/null) passed as --json was
  taken, and its write refused only after the compiles."""
  kernel_report = _kit("kernel_report")
  os.mkfifo(tmp_path / "fifo")
  argv = [a.format(fifo=tmp_path / "fifo") for a in argv]
  with pytest.raises(SystemExit) as e:
    kernel_report.main(argv)
  assert e.value.code == 2
  assert "must be" in capsys.readouterr().err


def test_aot_refuses_slice_counts_libtpu_cannot_compile():
  from trm import aot  # pylint: disable=g-import-not-at-top
  v5e = aot.parse_topology("v5e-256")
  aot.check_slice_total(v5e, [1, 2, 256])
  # 512 slices: libtpu's CHECK (NumSlices() < 512) aborts the process;
  # 10**12: its slice count overflows and it aborts at once.
  for counts in ([1, 512], [10**12], [100000]):
    with pytest.raises(ValueError, match="--num_slices="):
      aot.check_slice_total(v5e, counts)
  with pytest.raises(ValueError, match="131,072"):
    aot.check_slice_total(aot.parse_topology("v5p-12288"), [32])


def test_aot_huge_slice_count_is_one_line_before_any_compile():
  proc = subprocess.run(
      [sys.executable, "-m", "trm.aot", "--config=configs/trm_sudoku.py",
       "--topology=v5e-256", "--num_slices=1,512", "--forecast"],
      cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
      env=dict(os.environ, PYTHONPATH=ROOT))
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert ("trm.aot: error: --num_slices=512: libtpu compiles for at most "
          "511 slices") in proc.stderr
  assert "compiling" not in proc.stderr


@pytest.mark.parametrize("extra", ["--rounds=1 --budget=1000", "--out=/tmp/y"])
def test_run_sh_keeps_out_and_budget_its_own(tmp_path, extra):
  # measure.py takes the last --budget: 1000 would outlive the section's
  # `timeout`, which kills it with nothing written.
  proc = _run_sh(tmp_path, tmp_path / "out", "--smoke", "--only=cudnn",
                 TRM_GPU_ARGS_CUDNN=extra)
  assert proc.returncode == 2, proc.stdout + proc.stderr
  assert "is run.sh's own" in proc.stderr


def test_measure_takes_no_abbreviated_flags(capsys):
  measure = _kit("measure")
  with pytest.raises(SystemExit):
    measure.parse_args(["trm", "--out=x", "--bud=1000"])
  assert "unrecognized arguments: --bud=1000" in capsys.readouterr().err


def test_run_sh_installs_nothing_from_wheels_that_fail_the_check(tmp_path):
  # check_wheels.sh (tests/benchmarks/test_gpu_wheels.py) runs first: a
  # wheel that is not wheels.sha256's is never handed to pip.
  wheels = tmp_path / "wheels"
  wheels.mkdir()
  (wheels / "clu-0.0.12-py3-none-any.whl").write_bytes(b"not clu")
  proc = _run_sh(tmp_path, tmp_path / "out", "--smoke", "--only=cudnn",
                 TRM_GPU_INSTALL="dry", TRM_GPU_WHEELS=str(wheels))
  log = proc.stdout
  assert "install: wheels FAILED (" in log, log
  assert "nothing installed from them" in log
  assert "install: site FAILED (wheels not checked)" in log
  assert "install: hf FAILED (wheels not checked)" in log
  assert "site: all" not in log and "hf: all" not in log


@pytest.mark.parametrize("bad", ['{"name": "mixer/a", "val\n', '[1, 2]\n'])
def test_figures_readers_refuse_a_bad_line_alike(tmp_path, bad):
  """offline.py's --measured, mixer_forecast.py's --measured and the mixer
  sweep's own figures file: one reader (json_out.read_lines), one error
  (SystemExit) naming the file and the line."""
  offline, mixer_forecast, mixer_sweep = (
      _kit("offline"), _kit("mixer_forecast"), _kit("mixer_sweep"))
  path = tmp_path / "figures.jsonl"
  path.write_text('{"name": "mixer/xla/forward/ms", "value": 1.0}\n\n' + bad)
  readers = {
      "offline.py: --measured=": lambda: offline.measured_seconds(
          [str(path)], "NVIDIA H100 80GB HBM3"),
      "mixer_forecast.py: --measured=": lambda: mixer_forecast.measured_ms(
          str(path)),
      "mixer_sweep.py: ": lambda: mixer_sweep.swept_setting(str(path)),
  }
  for prefix, read in readers.items():
    with pytest.raises(SystemExit) as e:
      read()
    assert str(e.value).startswith(f"{prefix}{path}: line 3 is not a JSON "
                                   "figure ("), e.value
  path.write_text('{"name": "mixer/xla/forward/ms", "value": 1.0}\n\n')
  assert mixer_forecast.measured_ms(str(path)) == {}


def test_replay_and_hlo_share_one_check_of_the_hlo_text(tmp_path):
  """offline.py --replay and profile_table.py --hlo: profile_table's
  checked_hlo, each naming its own flag."""
  import tarfile  # pylint: disable=g-import-not-at-top
  offline, profile_table = _kit("offline"), _kit("profile_table")
  hlo = tmp_path / "x.hlo"
  hlo.write_text("hello\n")
  archive = tmp_path / "h.tar.gz"
  with tarfile.open(archive, "w:gz") as tar:
    tar.add(hlo, arcname="a.txt")
  checks = (
      ("offline.py: --replay=",
       lambda spec: offline.replay(spec, "h100", 0.6, 5)),
      ("profile_table.py: --hlo=", profile_table.checked_hlo))
  for prefix, check in checks:
    for spec, said in ((str(hlo), "no ENTRY computation"),
                       (f"{archive}:a.txt", "no ENTRY computation"),
                       (f"{archive}:b.txt", "has no file 'b.txt'")):
      with pytest.raises(SystemExit) as e:
        check(spec)
      assert str(e.value).startswith(f"{prefix}{spec}: "), e.value
      assert said in str(e.value)


def test_run_sh_finds_dreams_hf_code_in_the_wheels_it_installs(tmp_path):
  """TRM_GPU_WHEELS=DIR (fetch_wheels.sh DIR with DREAM_SRC puts Dream's HF
  code in DIR/dream_hf): the Dream section reads it there, not from
  benchmarks/gpu/wheels, which left it no PyTorch side; without the code,
  the log says so before the sections run."""
  wheels = tmp_path / "wheels"
  (wheels / "dream_hf").mkdir(parents=True)
  (wheels / "dream_hf" / "modeling_dream.py").write_text("")
  argv = tmp_path / "argv"
  proc = _run_sh(tmp_path, tmp_path / "out", "--only=dream,trm",
                 TRM_GPU_WHEELS=str(wheels), STUB_ARGV=str(argv))
  assert proc.returncode == 0, proc.stdout + proc.stderr
  dream, trm = argv.read_text().splitlines()
  assert f"--dream_hf={wheels}/dream_hf" in dream.split(), dream
  assert "--dream_hf" not in trm
  assert "no Dream HF code" not in proc.stdout
  proc = _run_sh(tmp_path, tmp_path / "out", "--only=dream",
                 TRM_GPU_WHEELS=str(tmp_path / "none"))
  assert (f"dream: no Dream HF code in {tmp_path / 'none'}/dream_hf: the "
          "Dream figures will have no PyTorch side") in proc.stdout
