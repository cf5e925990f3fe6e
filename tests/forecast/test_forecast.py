"""`trm.aot --forecast`: rows, calibration, search, flags and slice names."""
import json
import os
import subprocess
import sys

import cli_batch
import pytest
import repo

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core import topology
from trm.core import tpu_flags
from trm.forecast import plan
from trm.forecast import search
from trm.forecast import timeline

ROOT = repo.ROOT
V4_8 = topology.parse_topology("v4-8")

# Compiles to compile-only TPU devices, whose executables the session's
# compilation cache cannot load back (JAX warns, then compiles again).
pytestmark = pytest.mark.usefixtures("no_compilation_cache",
                                      "compiled_rows_once")

# `python -m trm.aot` for the refusal cases, forked from one process that
# has imported what they import (tests/cli_batch.py): ~45 start-ups of jax
# and the GPT family less. test_cli_writes_the_forecast_json runs the real
# entry point.
aot = cli_batch.serve(
    "trm.aot", env=lambda: dict(os.environ, TRM_COMPILATION_CACHE="off"),
    preload=("trm.core.cli", "trm.core.run_checks", "trm.forecast.plan",
             "trm.forecast.search", "trm.families.gpt.task"))


@pytest.fixture(scope="module")
def compiled_rows_once():
  """Each distinct row is compiled once for the whole file: several tests
  forecast the tiny GPT's rows of `tiny_rows` again, and the search's first
  layout is `tiny_rows`' one-slice row (libtpu takes 5-10 s a row on the
  2-core host). A row is a pure function of its config as `plan.row_config`
  resolves it (the slice count, batch and mesh overrides applied: all that
  `plan.compile_row` reads of them), the topology, slices and shapes."""
  real, rows = plan.compile_row, {}

  def compile_row(config, topology_, slices, shapes, global_batch,
                  mesh=None):
    row = plan.row_config(config, slices, global_batch, mesh)
    key = (row.to_json_best_effort(sort_keys=True), repr(topology_), slices,
           repr(shapes))
    if key not in rows:
      rows[key] = real(config, topology_, slices, shapes, global_batch, mesh)
    return rows[key]

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(plan, "compile_row", compile_row)
    yield


# The function itself, before `compiled_rows_once` memoizes it.
_REAL_COMPILE_ROW = plan.compile_row


def tiny_gpt():
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char")
  config.update(dict(n_layer=2, n_head=2, n_embd=64, block_size=32,
                     batch_size=8, gradient_accumulation_steps=1))
  config.model.update(vocab_size=65, scan_layers=True)
  # fsdp=4 (all of a v4-8), not -1: the search's first layout then resolves
  # to the same row config as `tiny_rows`' one-slice row (compiled once).
  config.mesh.update(data=1, fsdp=4)
  return config


@pytest.fixture(scope="module")
def tiny_rows(compiled_rows_once):  # pylint: disable=unused-argument
  lines = []
  rows, efficiency, source = plan.forecast(
      tiny_gpt(), V4_8, [1, 2], efficiency=0.5, report=lines.append)
  return rows, efficiency, source, lines


def test_forecast_rows_have_the_documented_keys(tiny_rows):
  rows, efficiency, source, lines = tiny_rows
  assert efficiency == 0.5 and source == "--efficiency"
  assert [r["slices"] for r in rows] == [1, 2]
  assert [r["chips"] for r in rows] == [4, 8]
  for row in rows:
    assert set(plan.ROW_KEYS) <= set(row)
    assert row["fits"] and 0 < row["memory_gib"] < 1
    assert row["step_seconds"] > 0 and 0 < row["mfu"] < 1
    assert row["bound"] in ("compute", "hbm", "ici", "dcn")
    assert 0 <= row["unoverlapped_seconds"] <= row["step_seconds"]
    assert row["tpu_compiler_options"] == tiny_gpt().tpu_compiler_options
    assert row["tflops_per_chip"] == pytest.approx(
        row["mfu"] * topology.CHIPS["v4"].peak_bf16_tflops)
  # Weak scaling: the 2-slice row doubles the global batch.
  assert [r["global_batch"] for r in rows] == [8, 16]
  assert rows[0]["scaling_efficiency"] == 1.0
  assert 0 < rows[1]["scaling_efficiency"] <= 1.0
  assert rows[0]["dcn_bytes"] == 0 and rows[1]["dcn_bytes"] > 0
  assert rows[0]["tokens_per_second"] == pytest.approx(
      8 * 32 / rows[0]["step_seconds"])
  # Progress: one line before and after each compile.
  assert sum("compiling" in line for line in lines) == 2
  text = plan.format_rows(rows, "v4-8", efficiency, source)
  assert "tokens/s" in text and "MFU" in text
  # A multi-slice table states the cross-slice latency it charged.
  assert "122 us per cross-slice ring step" in text
  assert "ring step" not in plan.format_rows(rows[:1], "v4-8", efficiency,
                                             source)
  json.dumps(rows, default=float)   # --forecast_json can write them


def test_heads_the_model_axis_does_not_divide_are_named_before_compiling(
    monkeypatch, caplog):
  """A row on a mesh.model wider than the heads: the trainer's one line
  (`trm.families.warn_if_heads_unsplit`), before the row compiles."""
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top

  def no_compile(*args):
    del args
    raise RuntimeError("compiled")

  config = tiny_gpt()
  config.mesh.update(fsdp=1, model=4)
  monkeypatch.setattr(task_lib, "compile_train_step", no_compile)
  families._warn_once.cache_clear()  # pylint: disable=protected-access
  with caplog.at_level("WARNING"), pytest.raises(RuntimeError,
                                                 match="compiled"):
    plan.compile_row(config, V4_8, 1, None, 8)
  assert caplog.text.count(
      "config.model.n_head=2 is not a multiple of config.mesh.model=4") == 1


def test_a_given_dcn_latency_replaces_the_fitted_one():
  """`--dcn_step_us`: each cross-slice ring step of the compiled program
  costs the given latency (2 steps per all-reduce over 2 slices), and the
  table says where the figure came from."""
  compiled = plan.compile_row(tiny_gpt(), V4_8, 2, None, 16)
  assert compiled.program.fabric.dcn_step_seconds == topology.DCN_STEP_SECONDS
  bare, slow = (plan.forecast_row(plan.with_dcn_step(compiled, seconds),
                                  V4_8, 0.5, "none")
                for seconds in (0.0, 1e-3))
  # (kind, network, axes, group size, ...) -> runs per step.
  ring_steps = sum(count * (key[3] - 1) * (2 if key[0] == "dcn-all-reduce"
                                           else 1)
                   for key, count in
                   compiled.program.totals().collectives.items()
                   if key[1] == "dcn")
  assert ring_steps > 0
  assert slow["step_seconds"] - bare["step_seconds"] == pytest.approx(
      ring_steps * 1e-3, rel=1e-6)
  assert slow["dcn_step_seconds"] == 1e-3
  # What trm.aot --num_slices=1,2 --dcn_step_us=1000 runs: the same rows
  # (those of `tiny_rows`, compiled once), and the table says the figure
  # was given, even where it equals the fitted constant.
  for seconds in (1e-3, topology.DCN_STEP_SECONDS):
    rows, _, _ = plan.forecast(tiny_gpt(), V4_8, [1, 2], efficiency=0.5,
                               report=lambda _: None,
                               dcn_step_seconds=seconds)
    text = plan.format_rows(rows, "v4-8", 0.5, "--efficiency")
    assert (f"{seconds * 1e6:.0f} us per cross-slice ring step "
            "(--dcn_step_us)") in text
    assert [r["dcn_step_seconds"] for r in rows] == [seconds, seconds]


def test_rows_state_the_runs_cost(tiny_rows):
  rows = tiny_rows[0]
  steps = tiny_gpt().total_steps
  for row in rows:
    assert row["run_steps"] == steps
    assert row["run_hours"] == pytest.approx(
        steps * row["step_seconds"] / 3600)
    assert row["chip_hours"] == pytest.approx(row["run_hours"] * row["chips"])
    # Chip-hours per billion tokens: chips over tokens/s, in hours.
    assert row["cost_unit"] == "1B tokens"
    assert row["chip_hours_per_unit"] == pytest.approx(
        row["chips"] * 1e9 / row["tokens_per_second"] / 3600)
  text = plan.format_run_cost(rows, chip_hour_price=3.22)
  assert f"run cost at {steps} steps" in text and "at 3.22 per chip-hour" in text
  last = text.splitlines()[-1].split()
  assert float(last[5]) == pytest.approx(rows[1]["chip_hours"] * 3.22,
                                         rel=1e-5)
  assert "cost" not in plan.format_run_cost(rows).splitlines()[1]
  # A row that does not fit has no cost, and no line.
  unfit = dict(rows[0], step_seconds=None)
  plan.with_run_cost([unfit], steps)
  assert unfit["chip_hours"] is None
  assert plan.format_run_cost([unfit]) == ""
  # config.num_epochs: the run's steps come from the data, which trm.aot
  # does not read, so only the cost per unit of data is given (before: the
  # file's total_steps were costed as the run's).
  by_epochs = tiny_gpt()
  by_epochs.num_epochs = 2.0
  assert plan.run_steps(by_epochs) is None
  assert plan.run_steps(tiny_gpt()) == steps
  unknown = [dict(row) for row in rows]
  plan.with_run_cost(unknown, plan.run_steps(by_epochs))
  assert [(r["run_hours"], r["chip_hours"]) for r in unknown] == [
      (None, None)] * len(rows)
  assert [r["chip_hours_per_unit"] for r in unknown] == [
      r["chip_hours_per_unit"] for r in rows]
  text = plan.format_run_cost(unknown, chip_hour_price=3.22)
  assert text.startswith("run cost per unit of data only (config.num_epochs "
                         "derives the run's steps from the training data")
  assert text.splitlines()[-1].split()[2:5] == ["-", "-", (
      f"{rows[-1]['chip_hours_per_unit']:.4g}")]
  # Examples when the model has no tokens.
  examples = dict(rows[0], tokens_per_second=None)
  plan.with_run_cost([examples], 10)
  assert examples["cost_unit"] == "1M examples"
  assert examples["chip_hours_per_unit"] == pytest.approx(
      examples["chips"] * 1e6 / examples["examples_per_second"] / 3600)


def test_calibration_fits_the_first_rows_mfu(tiny_rows):
  rows = tiny_rows[0]
  compiled = plan.compile_row(tiny_gpt(), V4_8, 1, None, 8)
  target = rows[0]["mfu"] * 0.9
  efficiency = plan.calibrate(compiled, V4_8, target)
  assert plan.forecast_row(compiled, V4_8, efficiency)["mfu"] == (
      pytest.approx(target, rel=1e-4))
  with pytest.raises(plan.ForecastError, match="--calibrate_mfu"):
    plan.calibrate(compiled, V4_8, 0.999)


def test_strong_scaling_keeps_the_global_batch():
  assert plan.batches(tiny_gpt(), [1, 2, 4], "strong") == [8, 8, 8]
  assert plan.batches(tiny_gpt(), [1, 2, 4], "weak") == [8, 16, 32]
  with pytest.raises(plan.ForecastError, match="--batch_scaling"):
    plan.batches(tiny_gpt(), [3, 4], "weak")


def test_the_config_dcn_sizes_must_fit_the_slice_count():
  config = tiny_gpt()
  config.mesh.dcn_fsdp = 2
  assert plan.row_config(config, 2, 8).mesh.dcn_data == 1
  with pytest.raises(plan.ForecastError, match="--num_slices=4"):
    plan.row_config(config, 4, 8)


def test_search_layouts_cover_the_divisors():
  layouts = search.layouts(4, 2)
  # (data, fsdp, model) with product 4: 6 ways; slices as data or fsdp.
  assert len(layouts) == 12
  assert all(m["data"] * m["fsdp"] * m["model"] == 4 for m in layouts)
  assert all(m["dcn_data"] * m["dcn_fsdp"] == 2 for m in layouts)
  assert layouts[0]["model"] == 1   # pure data/fsdp first
  assert len(search.layouts(4, 1)) == 6


def test_search_ranks_layouts_that_fit():
  # Two layouts compiled (the first is `tiny_rows`' one-slice row, compiled
  # once): a ranking of two is ranked as one of three; each more is a
  # libtpu compile.
  lines = []
  rows, tried = search.search(tiny_gpt(), V4_8, 1, None, efficiency=0.5,
                              limit=2, report=lines.append)
  assert tried["compiled"] == 2 and tried["not_compiled"] == 4
  assert len(rows) == 2
  times = [r["step_seconds"] for r in rows]
  assert times == sorted(times)
  assert all(r["overrides"].startswith("--config.mesh.data=") for r in rows)
  text = search.format_ranking(rows, tried, "v4-8", 1, 5)
  assert "1. " in text and "--config.mesh.fsdp=" in text
  assert "*" not in text
  # A fitted layout whose memory sum is over the chip is starred, with the
  # line that says the verdict is XLA's.
  rows[0]["memory_gib"] = 100.0
  text = search.format_ranking(rows, tried, "v4-8", 1, 5)
  assert "100.00* GiB/chip" in text and "over the chip's 30.75 GiB" in text
  # One whose schedule awaits its collectives back to back gets a note.
  rows[0]["unoverlapped_seconds"] = 0.5 * rows[0]["step_seconds"]
  text = search.format_ranking(rows, tried, "v4-8", 1, 5)
  assert "NOTE: the 1-slice step waits" in text and "(50%)" in text


@pytest.mark.parametrize("name, shape, chips, wraps", [
    ("v4-384", "4x4x12", 192, (True, True, True)),
    ("v4-768", "4x8x12", 384, (True, True, True)),
    ("v4-64", "2x4x4", 32, (False, False, False)),
    ("v4:4x4x12", "4x4x12", 192, (True, True, True)),
    ("v5p-1280", "4x8x20", 640, (True, True, True)),
    ("v5p-12288", "16x16x24", 6144, (True, True, True)),
    ("v5e-256", "16x16", 256, (True, True)),
    ("v6e-64", "8x8", 64, (False, False)),
])
def test_every_sold_slice_can_be_named(name, shape, chips, wraps):
  t = topology.parse_topology(name)
  assert (t.shape, t.chips, t.wraps) == (shape, chips, wraps)


# Before: digits other than ASCII ('\u0668' is 8) passed the pattern and
# reached libtpu, whose refusal was a RuntimeError traceback.
@pytest.mark.parametrize("name", ["v4-100", "v4:3x3x3", "v4:4x4x6",
                                  "v6e-512", "v5e:3x3", "v4-8194",
                                  "v4:4x4x\u0668", "v4-\u0661\u0662\u0668"])
def test_unsold_slices_are_refused(name):
  with pytest.raises(ValueError, match="--topology"):
    topology.parse_topology(name)


def test_a_v4_384_compiles():
  """A slice that is not a power of two: libtpu builds its devices."""
  devices = topology.topology_devices(topology.parse_topology("v4-384"), 1)
  assert len(devices) == 192
  assert {tuple(d.coords) for d in devices} >= {(3, 3, 11)}


@pytest.mark.parametrize("name", ["v5e-1", "v6e-1", "v5litepod-1"])
def test_a_one_chip_slice_compiles(name):
  """Before: libtpu refused the 1x1 layout with the default 2x2x1 host
  bounds, and trm.aot stopped with a traceback telling to install the TPU
  extra (installed)."""
  devices = topology.topology_devices(topology.parse_topology(name), 2)
  assert len(devices) == 2
  assert {d.slice_index for d in devices} == {0, 1}


def test_tpu_compiler_options():
  assert tpu_flags.parse("--a=1 --b_c=true") == {"a": "1", "b_c": "true"}
  assert tpu_flags.parse("") == {}
  for bad in ("TPU_MEGACORE=MEGACORE_DENSE", "--flag", "-x=1", 3):
    with pytest.raises(ValueError, match="config.tpu_compiler_options"):
      tpu_flags.parse(bad)
  cpu_mesh = mesh_lib.make_mesh(config_lib.mesh_config(data=-1))
  config = tiny_gpt()
  assert tpu_flags.for_mesh(config, cpu_mesh) == {}


@pytest.mark.parametrize("args, match", [
    (["--num_slices=0"], "--num_slices='0'"),
    (["--num_slices=1,x"], "--num_slices='1,x'"),
    (["--num_slices=2,2"], "--num_slices='2,2'"),
    (["--topology=v4-100"], "--topology='v4-100'"),
    (["--forecast", "--efficiency=1.5"], "--efficiency=1.5 must be"),
    # Before: a ZeroDivisionError traceback after compiling (the step time
    # overflowed to inf, the run cost divided by a zero rate).
    (["--forecast", "--efficiency=5e-324"],
     "--efficiency=4.94066e-324 is below the 0.001 of peak"),
    (["--forecast", "--calibrate_mfu=56.7"], "--calibrate_mfu=56.7 must be"),
    (["--forecast", "--efficiency=0.5", "--calibrate_mfu=0.5"],
     "give one"),
    (["--search"], "--search needs --forecast"),
    (["--forecast", "--search", "--num_slices=1,2"], "one slice count"),
    (["--forecast", "--search", "--search_limit=-3"],
     "--search_limit=-3 must be >= 0"),
    (["--forecast", "--search", "--search_top=0"],
     "--search_top=0 must be >= 1"),
    # Before: "no layout fits." and exit 1, as if layouts had been
    # compiled and found too big.
    (["--forecast", "--search", "--num_slices=2", "--config.batch_size=3"],
     "--search: config.global_batch_size=3 splits over none of the 12 mesh "
     "layouts of 2 x v4-8"),
    (["--forecast", "--mode=sample"], "drop --mode=sample"),
    # Before: ignored without a word (--search ranked at the default
    # efficiency, its MFU not calibrated; --hot_spots printed nothing).
    (["--hot_spots"], "--hot_spots needs --forecast"),
    # Before: dropped (GPT's sequence is config.block_size) and the step of
    # the config's length reported as if of this one.
    (["--seq_len=64"], "--seq_len does not apply to config.model.name='gpt'"),
    (["--forecast", "--search_limit=3"], "--search_limit needs --search"),
    (["--forecast", "--search", "--calibrate_mfu=0.5"],
     "--calibrate_mfu fits the efficiency on the first row"),
    (["--forecast", "--search", "--collectives"],
     "--collectives prints --forecast's rows"),
    (["--chip_hour_price=3"], "--chip_hour_price needs --forecast"),
    (["--dcn_step_us=50"], "--dcn_step_us needs --forecast"),
    (["--forecast", "--dcn_step_us=-1"],
     "--dcn_step_us=-1.0 must be a latency in microseconds"),
    (["--forecast", "--dcn_step_us=inf"],
     "--dcn_step_us=inf must be a latency in microseconds"),
    (["--forecast", "--chip_hour_price=-1"],
     "--chip_hour_price=-1.0 must be a positive number"),
    (["--forecast", "--chip_hour_price=nan"],
     "--chip_hour_price=nan must be a positive number"),
    (["--forecast", "--search", "--chip_hour_price=2"],
     "--chip_hour_price prices --forecast's rows"),
    (["--forecast", "--forecast_json=/no/such/dir/rows.json"],
     "--forecast_json='/no/such/dir/rows.json'"),
    (["--forecast", "--forecast_json=" + ROOT], "must be a file path"),
    # Before: an empty path (an unset shell variable) compiled, wrote
    # nothing and exited 0.
    (["--forecast", "--forecast_json="],
     "--forecast_json is given but empty: name the file to write."),
    (["--save_compiled="],
     "--save_compiled is given but empty: name the file to write."),
    (["--forecast", "--num_slices=1", "--config.mesh.data=3"],
     "config.mesh"),
    (["--forecast", "--num_slices=2", "--config.mesh.dcn_fsdp=4"],
     "--num_slices=2: config.mesh.dcn_*"),
    (["--forecast", "--config.tpu_compiler_options=fast"],
     "config.tpu_compiler_options"),
    # Values trm.main refuses are not compiled or forecast either (before:
    # a FITS verdict for a batch the trainer would not take).
    (["--config.global_batch_size=48"],
     "config.global_batch_size=48 must be config.batch_size x"),
    (["--forecast", "--config.learning_rate=nan"],
     "config.learning_rate=nan must be a finite number >= 0"),
])
def test_bad_forecast_flags_are_one_line(args, match, aot):
  argv = ["--config=configs/gpt.py:shakespeare_char", "--topology=v4-8",
          "--vocab_size=65", *args]
  result = aot.run(argv, cwd=ROOT, timeout=600)
  assert result.returncode == 2, result.stderr[-2000:]
  assert match in result.stderr, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  assert "verdict" not in result.stdout


TINY_GPT_FLAGS = ["--config.n_layer=2", "--config.n_embd=64",
                  "--config.n_head=2", "--config.block_size=32",
                  "--config.batch_size=8", "--config.mesh.data=1",
                  "--config.mesh.fsdp=-1", "--vocab_size=65"]


@pytest.mark.parametrize("flag", ["--forecast_json", "--save_compiled"])
def test_output_files_are_checked_before_compiling(flag, tmp_path, aot):
  """Before: the --config file named as the output was overwritten with
  the rows (or the step) after compiling, a FIFO was replaced by a file,
  and an unwritable directory failed only once the compile was done."""
  config = tmp_path / "gpt.py"
  with open(os.path.join(ROOT, "configs", "gpt.py")) as f:
    text = f.read()
  config.write_text(text)
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  for path, match in ((config, "is the --config file"),
                      (fifo, "is not a regular file"),
                      ("/proc/out", "its directory /proc is not writable")):
    result = aot.run(
        [f"--config={config}:shakespeare_char", "--topology=v4-8",
         *TINY_GPT_FLAGS, *(["--forecast"] if flag == "--forecast_json"
                            else []), f"{flag}={path}"],
        cwd=ROOT, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"trm.aot: error: {flag}='{path}'"), last
    assert match in last and "compiling" not in result.stderr
  assert config.read_text() == text


@pytest.mark.parametrize("args, match", [
    (["--forecast", "--num_slices=2,4", "--config.mesh.dcn_data=2"],
     "--num_slices=4: config.mesh.dcn_* multiply to 2"),
    (["--num_slices=2,4", "--config.mesh.dcn_data=2"],
     "--num_slices=4: config.mesh.dcn_* multiply to 2"),
    (["--forecast", "--num_slices=1,3", "--batch_scaling=strong"],
     "--num_slices=3: config.global_batch_size=8 must be a positive "
     "multiple of the data-parallel size 12"),
    (["--num_slices=1,3"], "--num_slices=3: config.global_batch_size=8"),
])
def test_every_rows_mesh_and_batch_are_checked_before_the_first_compiles(
    args, match, aot):
  """Before: the rows before the one whose mesh or batch does not work
  were compiled (minutes each on a large model), then it stopped."""
  result = aot.run(
      ["--config=configs/gpt.py:shakespeare_char", "--topology=v4-8",
       *TINY_GPT_FLAGS, *args],
      cwd=ROOT, timeout=600)
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith("trm.aot: error: ") and match in last, last
  assert "compiling" not in result.stderr and not result.stdout


def test_cli_writes_the_forecast_json(tmp_path):
  """The real entry point, one row (the 2-slice one, whose collectives
  cross the slices): a libtpu compile per row, which this process cannot
  share (the rows of several slice counts together: `tiny_rows`)."""
  path = tmp_path / "rows.json"
  result = subprocess.run(
      [sys.executable, "-m", "trm.aot", "--config=configs/gpt.py:"
       "shakespeare_char", "--topology=v4-8", "--vocab_size=65",
       "--config.n_layer=2", "--config.n_embd=64", "--config.n_head=2",
       "--config.block_size=32", "--config.batch_size=8",
       "--config.mesh.data=1", "--config.mesh.fsdp=-1", "--num_slices=2",
       "--forecast", "--collectives", "--hot_spots",
       f"--forecast_json={path}", "--chip_hour_price=2.5"],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  rows = json.loads(path.read_text())
  assert [r["slices"] for r in rows] == [2]
  for row in rows:
    assert set(plan.ROW_KEYS) <= set(row)
  assert "[forecast] compiling 2 x v4-8" in result.stderr
  assert "collectives of the 2-slice step" in result.stdout
  assert "dcn-all-reduce" in result.stdout
  assert "at 2.5 per chip-hour" in result.stdout
  assert all(r["chip_hours"] > 0 for r in rows)
  assert "hot spots of the 2-slice step" in result.stdout
  for row in rows:  # the model's own op names, largest roofline time first
    times = [h["seconds"] for h in row["hot_spots"]]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert any("dot_general" in h["op"] for h in row["hot_spots"])


def test_a_v6e_forecast_says_the_published_runs_were_slower():
  """MaxText's v6e runs of 70B models ran 4-9 MFU points below the
  forecast, its 8B and GPT-3 runs within 2.3 (sessions 78-87): a
  forecast at the default efficiency says so under its table; one
  at a given or calibrated efficiency, or on a chip whose runs agreed,
  does not."""
  note = plan.chip_check_note("v6e", plan.DEFAULT_EFFICIENCY_SOURCE)
  assert note.startswith("NOTE: on v6e this forecast came within 2.3 MFU "
                         "points of MaxText's published runs of Llama 3.1 8B")
  assert "4-9 points above its runs of 70B models" in note
  assert plan.chip_check_note("v6e", "--efficiency") == ""
  assert plan.chip_check_note("v6e", "calibrated: the 1-slice row") == ""
  assert plan.chip_check_note("v4", plan.DEFAULT_EFFICIENCY_SOURCE) == ""
  result = subprocess.run(
      [sys.executable, "-m", "trm.aot", "--config=configs/gpt.py:"
       "shakespeare_char", "--topology=v6e-4", "--vocab_size=65",
       "--config.n_layer=1", "--config.n_embd=64", "--config.n_head=2",
       "--config.block_size=32", "--config.batch_size=8",
       "--config.mesh.data=1", "--config.mesh.fsdp=-1", "--forecast"],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  table, note = result.stdout.split("NOTE: ")
  assert "forecast for v6e-4; dense compute at 0.7985" in table
  assert note.startswith("on v6e this forecast came within 2.3"), note


def test_the_collectives_summary_keeps_every_cross_slice_one():
  """A small cross-slice all-reduce ranked below the first 12 ICI
  collectives by bytes is still listed: its latency may cost more."""
  totals = timeline.Totals()
  for i in range(14):
    totals.collectives[("all-gather", "ici", "x", 4, 1e6 * (i + 2),
                        1e6 * (i + 2))] += 10
  totals.collectives[("dcn-all-reduce", "dcn", "slices", 2, 1e3, 1e3)] += 768
  summary = plan.collective_summary(totals)
  assert len(summary) == 13
  assert summary[-1]["kind"] == "dcn-all-reduce"
  assert summary[-1]["runs_per_step"] == 768


@pytest.mark.parametrize("message, hbm, host", [
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory"
     " in memory space hbm. Used 52.41G of 31.25G hbm. Exceeded hbm "
     "capacity by 21.16G.\n\nTotal hbm usage >= 52.41G:\n    reserved "
     "(52.41G)", 52.41, 0.0),
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory"
     " in memory space host. Used 160.00G of 128.00G host. Exceeded host "
     "capacity by 32.00G.\n    program (160.00G)", None, 160.0),
    # The refusal before scheduling (GPT-3 175B's 2 layers at 36 a chip).
    ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
     "required for HLO temporaries (35.79G) exceeds available HBM (31.25G).",
     35.79, 0.0),
    # After scheduling, in MiB (a tiny GPT under a 16 MiB limit).
    ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: XLA:TPU compile "
     "permanent error. Ran out of memory in memory space hbm. Used 20.38M "
     "of 16.00M hbm. Exceeded hbm capacity by 4.38M.", 20.38 / 1024, 0.0),
])
def test_a_row_out_of_memory_names_the_memory(monkeypatch, message, hbm,
                                              host):
  """A step XLA:TPU cannot fit is a row that says so: HBM's shortfall as
  its GiB per chip, the host's (a remat policy's offloads) apart, not as
  HBM."""
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top

  def out_of_memory(*args):
    del args
    raise RuntimeError(message)

  monkeypatch.setattr(task_lib, "compile_train_step", out_of_memory)
  # Not through `compiled_rows_once`: this row must not be served to others.
  compiled = _REAL_COMPILE_ROW(tiny_gpt(), V4_8, 1, None, 8)
  assert not compiled.fits and compiled.program is None
  assert compiled.memory_gib == hbm and compiled.host_memory_gib == host
  assert compiled.error == message.splitlines()[0]


def test_a_step_xla_compiled_fits_whatever_its_memory_sum(monkeypatch):
  """XLA:TPU fits a step to the chip or refuses it: a compiled step whose
  arguments + outputs + temporaries run past the chip (GPT-3 175B's on
  v6e-256: 35.56 GiB for 31.25) is a row that fits, its GiB the sum
  (marked), XLA's peak beside it."""
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  real = task_lib.compile_train_step
  gib = 2**30

  class Stats:
    argument_size_in_bytes = output_size_in_bytes = alias_size_in_bytes = (
        2 * gib)
    temp_size_in_bytes = 40 * gib
    peak_memory_in_bytes = 29 * gib
    host_temp_size_in_bytes = 0

  class Compiled:
    def __init__(self, compiled):
      self.as_text = compiled.as_text

    def memory_analysis(self):
      return Stats()

  monkeypatch.setattr(task_lib, "compile_train_step",
                      lambda *a: Compiled(real(*a)))
  compiled = _REAL_COMPILE_ROW(tiny_gpt(), V4_8, 1, None, 8)
  assert compiled.fits and compiled.program is not None
  assert compiled.memory_gib == 42 and compiled.memory_peak_gib == 29
  row = plan.forecast_row(compiled, V4_8, plan.DEFAULT_EFFICIENCY)
  assert row["fits"] and (row["memory_gib"], row["memory_peak_gib"]) == (42, 29)
  # The table marks a sum over the chip and says whose verdict it is.
  text = plan.format_rows([row], "v4-8", plan.DEFAULT_EFFICIENCY, "default")
  assert "  yes   42.00* " in text
  assert ("* the sum of arguments, outputs and temporaries (GiB/chip) is "
          "over the chip's 30.75 GiB, and XLA:TPU compiled the step for it "
          "all the same") in text


@pytest.mark.parametrize("row, starred", [
    (dict(fits=True, memory_gib=35.56, chip_hbm_gib=31.25), True),
    (dict(fits=True, memory_gib=29.0, chip_hbm_gib=31.25), False),
    # Refused by XLA: the figure is XLA's, the verdict "no"; no star.
    (dict(fits=False, memory_gib=35.79, chip_hbm_gib=31.25), False),
    (dict(fits=False, memory_gib=None, chip_hbm_gib=31.25), False),
    (dict(fits=True, memory_gib=35.56), False),  # no chip given
])
def test_only_a_sum_over_the_chip_of_a_step_xla_fitted_is_starred(
    row, starred):
  assert plan.sum_over_chip(row) is starred


def test_the_star_reads_the_hbm_the_step_was_fitted_to(monkeypatch):
  """A limit in config.tpu_compiler_options is the chip the row's star and
  line compare with."""
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(task_lib, "compile_train_step", lambda *a: (
      _ for _ in ()).throw(RuntimeError("RESOURCE_EXHAUSTED: (1.00G)")))
  config = tiny_gpt()
  config.tpu_compiler_options = "--xla_tpu_max_hbm_size_mib=512"
  compiled = _REAL_COMPILE_ROW(config, V4_8, 1, None, 8)
  assert compiled.chip_hbm_gib == 0.5
  assert plan.forecast_row(compiled, V4_8, 0.8)["chip_hbm_gib"] == 0.5


@pytest.mark.parametrize("peak, expected", [(29, (29, 42)), (0, (42, 42)),
                                            (None, (42, 42))])
def test_hbm_use_is_the_peak_and_the_sum(peak, expected):
  """(peak, sum); a backend with no peak (0, or an older jaxlib without
  the field) gives the sum for both."""
  gib = 2**30
  fields = dict(argument_size_in_bytes=2 * gib, output_size_in_bytes=2 * gib,
                alias_size_in_bytes=2 * gib, temp_size_in_bytes=40 * gib)
  if peak is not None:
    fields["peak_memory_in_bytes"] = peak * gib
  stats = type("Stats", (), fields)()
  assert tuple(b / gib for b in topology.hbm_use(stats)) == expected
