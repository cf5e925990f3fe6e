"""benchmarks/forecast/forecast_maxtext.py: the cross-slice ring step's
latency is fitted on a run's loss of speed over its slice counts."""
import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import repo

from trm.core import topology
from trm.forecast import network
from trm.forecast import plan
from trm.forecast import timeline

SCRIPT = os.path.join(repo.ROOT, "benchmarks", "forecast",
                      "forecast_maxtext.py")
V5E = topology.parse_topology("v5e-256")


@pytest.fixture(scope="module")
def script():
  return repo.load_script("benchmarks", "forecast", "forecast_maxtext.py")


_DOT = """HloModule step, is_scheduled=true, num_partitions=1

%fused_dot (p0: bf16[4096,4096], p1: bf16[4096,4096]) -> f32[4096,4096] {
  %p0 = bf16[4096,4096]{1,0} parameter(0)
  %p1 = bf16[4096,4096]{1,0} parameter(1)
  ROOT %dot.1 = f32[4096,4096]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[4096,4096], b: f32[1024,1024]) -> f32[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = f32[1024,1024]{1,0} parameter(1)
  %f = f32[4096,4096]{1,0} fusion(%a, %a), kind=kOutput, calls=%fused_dot
"""
_SEND = """  %tok = token[] after-all()
  %r = (f32[1024,1024]{1,0}, u32[], token[]) recv(%tok), channel_id=1, is_host_transfer=true, frontend_attributes={_xla_megascale_target="{0:LAST}x{0:0}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %s = (f32[1024,1024]{1,0}, u32[], token[]) send(%b, %tok), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_megascale_target="{0:LAST}x{0:0}",_xla_megascale_transfer_type="ALL_REDUCE"}
  %sd = token[] send-done(%s), channel_id=2, is_host_transfer=true
  %rd = (f32[1024,1024]{1,0}, token[]) recv-done(%r), channel_id=1, is_host_transfer=true
"""


def _row(slices: int, step_seconds: float) -> plan.CompiledRow:
  """A one-chip step: a matmul, then (on several slices) a 4 MiB
  cross-slice all-reduce."""
  text = _DOT + (_SEND.replace("LAST", str(slices - 1)) * (slices > 1))
  text += "  ROOT %out = f32[4096,4096]{1,0} copy(%f)\n}\n"
  fabric = network.Fabric(((0, 0, 0),), (1, 1, 1), (False,) * 3, 45e9,
                          V5E.chip.dcn_gbits_per_chip * 1e9 / 8, slices,
                          dcn_step_seconds=step_seconds)
  return plan.CompiledRow(slices=slices, chips=1, mesh={}, global_batch=1,
                          model_flops=2 * 4096**3, tokens_per_example=1,
                          compile_seconds=0.0, fits=True, memory_gib=1.0,
                          program=timeline.Program(text, fabric))


@pytest.mark.parametrize("latency", [0.0, 40e-6, 250e-6])
def test_the_fit_finds_the_latency_that_made_the_rows(script, latency):
  counts = (1, 2, 8, 32)
  made = [plan.forecast_row(_row(n, latency), V5E, 0.8, "none")
          for n in counts]
  assert made[-1]["step_seconds"] > made[1]["step_seconds"] or not latency
  run = dict(variant="test", published={
      n: (0.0, 50.0 * made[0]["step_seconds"] / r["step_seconds"])
      for n, r in zip(counts, made)})
  rows = [_row(n, 0.0) for n in counts]  # compiled without the latency
  fitted = script.fit_dcn_step(run, V5E, rows, 0.8, "none")
  assert fitted == pytest.approx(latency, abs=1e-7)
  # The rows it hands on carry the fitted latency; the originals keep
  # theirs.
  carried = script.with_dcn_step(rows, fitted)
  assert [r.program.fabric.dcn_step_seconds for r in carried] == [fitted] * 4
  assert rows[-1].program.fabric.dcn_step_seconds == 0.0
  assert plan.forecast_row(carried[-1], V5E, 0.8, "none")[
      "step_seconds"] == pytest.approx(made[-1]["step_seconds"], rel=1e-6)


def test_the_fit_needs_a_multi_slice_row(script):
  run = dict(variant="test", published={1: (0.0, 50.0)})
  with pytest.raises(SystemExit, match="needs its first row"):
    script.fit_dcn_step(run, V5E, [_row(1, 0.0)], 0.8, "none")


def test_the_fit_finds_the_best_of_two_minima(script, monkeypatch):
  """The summed error need not be unimodal: with a shallow minimum at
  20 us and the exact one at 3 ms, the fit returns 3 ms."""
  rows = [_row(n, 0.0) for n in (1, 2)]
  run = dict(variant="test", published={1: (0.0, 50.0), 2: (0.0, 40.0)})
  def played(row, *unused):
    del unused
    x = row.program.fabric.dcn_step_seconds
    # Extra step time: 0.26 at 20 us (a local minimum of the error), 0.25,
    # the published loss, only at 3 ms.
    extra = 0.25 + min(0.01 + 1e3 * abs(x - 20e-6), 10 * abs(x - 3e-3))
    return {"step_seconds": 1.0 + (extra if row.slices > 1 else 0.0)}
  monkeypatch.setattr(script.plan, "forecast_row", played)
  assert script.fit_dcn_step(run, V5E, rows, 0.8, "none") == pytest.approx(
      3e-3, rel=1e-4)


@pytest.mark.parametrize("flags,message", [
    (["--run=22b", "--fit_dcn_on=v5e16b"], "not among --run's runs"),
    (["--run=v5e16b", "--fit_dcn_on=v5e16b", "--dcn_step_us=5"],
     "both set the latency"),
    (["--run=v5e16b", "--fit_dcn_on=v5e16b", "--slices=2,4"],
     "needs its 1-slice row first"),
    (["--run=v5e16b", "--dcn_step_us=nan"], "must be a latency"),
    (["--run=v5e16b", "--dcn_step_us=-3"], "must be a latency")])
def test_contradicting_latency_flags_stop_before_compiling(
    flags, message, script, monkeypatch, capsys):
  """The first case as a command (the script's own start-up), the rest in
  this process (2 s of imports each saved); a case that got past the
  checks would compile and fail the exit-code assertion either way."""
  if flags[0] == "--run=22b":
    result = subprocess.run([sys.executable, SCRIPT, *flags],
                            capture_output=True, text=True, timeout=120,
                            cwd=repo.ROOT)
    code, stderr = result.returncode, result.stderr
  else:
    monkeypatch.setattr(sys, "argv", [SCRIPT, *flags])
    with pytest.raises(SystemExit) as stopped:
      script.main()
    code, stderr = stopped.value.code, capsys.readouterr().err
  assert code == 2
  assert message in stderr


@pytest.mark.parametrize("value", ["0.5", "nan", "inf", "-2"])
def test_permute_links_below_one_link_are_refused(value, script, monkeypatch,
                                                  capsys):
  monkeypatch.setattr(sys, "argv", [SCRIPT, "--run=v5e16b",
                                    f"--permute_links={value}"])
  with pytest.raises(SystemExit) as stopped:
    script.main()
  assert stopped.value.code == 2
  assert "--permute_links=" in capsys.readouterr().err


def test_permute_links_reach_every_row_played_not_the_saved_one(
    script, monkeypatch, tmp_path):
  """The sensitivity is applied to the rows as played; a saved program
  keeps the model's one link, so a later run without the flag is not
  changed by it."""
  monkeypatch.setattr(script.plan, "compile_row",
                      lambda config, topology, count, *unused: _row(count,
                                                                    0.0))
  _, rows, _ = script.compile_rows("v5p32b", V5E, [1, 2], "causal",
                                   programs=str(tmp_path), permute_links=3)
  assert [r.program.fabric.permute_links for r in rows] == [3, 3]
  def refuse(*unused):
    raise AssertionError("read back, not compiled again")
  monkeypatch.setattr(script.plan, "compile_row", refuse)
  _, again, _ = script.compile_rows("v5p32b", V5E, [1, 2], "causal",
                                    programs=str(tmp_path))
  assert [r.program.fabric.permute_links for r in again] == [1, 1]


def test_the_default_latency_is_the_topology_constant():
  assert network.Fabric(((0, 0, 0),), (1, 1, 1), (False,) * 3, 1.0, 1.0,
                        2).dcn_step_seconds == topology.DCN_STEP_SECONDS


def test_each_published_row_is_its_tflops_over_the_chips_peak(script):
  """The rows were typed from MaxText's READMEs: each MFU must be its
  TFLOP/s per chip over the chip's peak (to the rounding of the TFLOP/s)."""
  for name, run in script.RUNS.items():
    peak = topology.parse_topology(run["topology"]).chip.peak_bf16_tflops
    for slices, (tflops, mfu) in run["published"].items():
      assert abs(100 * tflops / peak - mfu) < 100 * 0.5 / peak, (
          name, slices)


def test_the_v5p_runs_count_half_the_attention_term(script):
  """MaxText's train.py of December 2023 (the v5p README) halved the
  attention term for causality; the v5e runs' (November 2023) did not."""
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "gpt.py"), "v5p32b")
  none = script.maxtext_flops_per_chip(config, 1.0, False)
  full = script.maxtext_flops_per_chip(config, 1.0, True)
  causal = script.maxtext_flops_per_chip(config, 1.0, "causal")
  attention = 12.0 * 32 * 32 * 256 * 2048**2
  assert full - none == pytest.approx(attention)
  assert causal - none == pytest.approx(attention / 2)
  assert {run["attention_flops"] for name, run in script.RUNS.items()
          if name.startswith("v5p")} == {"causal"}


def test_a_row_published_above_its_compute_alone_is_named(script, capsys,
                                                           monkeypatch):
  """The compute-only ceiling is the MFU with the step cut to its compute;
  a published row above it gets a CEILING line whose efficiency makes the
  row's compute take exactly the published step. Below it: no line."""
  theirs = 2.0 * 4096**3  # the rows' one matmul, as MaxText would count it
  monkeypatch.setattr(script, "maxtext_flops_per_chip",
                      lambda *unused: theirs)
  rows = [_row(1, 0.0), _row(2, 1e-3)]  # the second waits on the DCN
  played = [plan.forecast_row(r, V5E, 0.8, "none") for r in rows]
  compute = played[1]["seconds_by_cause"]["compute"]
  assert played[1]["step_seconds"] > 1.5 * compute
  peak = V5E.chip.peak_bf16_tflops
  ceiling = 100 * theirs / compute / 1e12 / peak
  forecast = 100 * theirs / played[1]["step_seconds"] / 1e12 / peak
  # Published: the one-slice row just under its ceiling, the two-slice
  # row above it.
  run = dict(variant="test", attention_flops=False,
             published={1: (0.0, 0.99 * ceiling), 2: (0.0, 1.2 * ceiling)})
  result = script.compare("test", run, V5E, None, rows, 1.0, 0.8, None,
                          "none")
  out = capsys.readouterr().out
  one, two = result["rows"]
  assert two["compute_only_mfu"] == pytest.approx(ceiling)
  assert two["forecast_mfu"] == pytest.approx(forecast)
  assert one["compute_only_mfu"] == pytest.approx(ceiling)  # same compute
  assert "CEILING: the 2-slice row" in out
  assert "CEILING: the 1-slice row" not in out
  # At the efficiency it names, the row's compute is the published step.
  assert two["published_efficiency"] == pytest.approx(0.8 * 1.2)
  published_step = theirs / (two["published_mfu"] / 100 * peak * 1e12)
  at_it = plan.forecast_row(rows[1], V5E, two["published_efficiency"],
                            "none")
  # (seconds_by_cause is rounded to the microsecond: this step is 0.7 ms.)
  assert at_it["seconds_by_cause"]["compute"] == pytest.approx(
      published_step, rel=2e-3)
  assert f"{two['published_efficiency']:.4f} x peak" in out
  # A slice count with no published row: a ceiling, no efficiency.
  ceiling_only = script.compute_only(theirs, peak, 0.8, played[1], math.nan)
  assert ceiling_only["compute_only_mfu"] == pytest.approx(ceiling)
  assert math.isnan(ceiling_only["published_efficiency"])


def test_a_saved_program_reads_back_for_its_config_only(script, tmp_path):
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "gpt.py"), "v5p32b")
  row = _row(2, 40e-6)
  script.save_row(str(tmp_path), "v5p32b", V5E, 2, 1024, config, row)
  back = script.load_row(str(tmp_path), "v5p32b", V5E, 2, 1024, config)
  assert back.program.fabric == row.program.fabric
  assert back.program.text == row.program.text
  assert dataclasses.replace(back, program=None) == dataclasses.replace(
      row, program=None)
  assert plan.forecast_row(back, V5E, 0.8, "none") == plan.forecast_row(
      row, V5E, 0.8, "none")
  # Another batch is another file; another config is compiled again.
  assert script.load_row(str(tmp_path), "v5p32b", V5E, 2, 512,
                         config) is None
  config.n_layer = 4
  assert script.load_row(str(tmp_path), "v5p32b", V5E, 2, 1024,
                         config) is None


def test_a_damaged_or_edited_saved_program_is_compiled_again(script,
                                                            tmp_path):
  """An edited figure (model_flops) or a swapped program text replayed as a
  wrong forecast, and a broken JSON stopped the run with a traceback: each
  is now compiled again."""
  from trm.core import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "gpt.py"), "v5p32b")
  meta_path, text_path = script._program_files(  # pylint: disable=protected-access
      str(tmp_path), "v5p32b", V5E, 2, 1024)

  def saved_then(edit):
    script.save_row(str(tmp_path), "v5p32b", V5E, 2, 1024, config,
                    _row(2, 40e-6))
    assert script.load_row(str(tmp_path), "v5p32b", V5E, 2, 1024, config)
    edit()
    return script.load_row(str(tmp_path), "v5p32b", V5E, 2, 1024, config)

  def edit_json(change):
    with open(meta_path) as f:
      meta = json.load(f)
    change(meta)
    with open(meta_path, "w") as f:
      json.dump(meta, f)

  assert saved_then(lambda: edit_json(
      lambda m: m.update(model_flops=2 * m["model_flops"]))) is None
  assert saved_then(lambda: edit_json(lambda m: m.update(extra=1))) is None
  assert saved_then(lambda: open(text_path, "a").write(" ")) is None
  assert saved_then(lambda: open(meta_path, "w").write("{")) is None
  assert saved_then(lambda: open(meta_path, "w").write("[]")) is None


def test_the_published_runs_matmuls_fill_a_128_wide_mxu(script):
  """Why the MXU's padding (ops.mxu_padding, BUILD_NOTES "Session 79")
  leaves the v4, v5e and v5p published-run forecasts as they were: every
  matmul dim of their configs, per chip and per tensor shard, is a
  multiple of 128 (the compiled Llama2-70B program of the v6e run, the
  same model, has no instruction padded at 128 either)."""
  llama = repo.load_script("benchmarks", "forecast", "forecast_llama.py")
  runs = [(run["variant"], run) for run in script.RUNS.values()]
  runs += [(llama.config_for(run), run) for run in llama.RUNS.values()]
  for config, run in runs:
    if isinstance(config, str):
      config = script.config_lib.load_config(
          os.path.join(repo.ROOT, "configs", "gpt.py"), config)
    cfg = script.gpt.GPTConfig.from_config(config.model)
    chips = topology.parse_topology(run["topology"]).chips
    per_chip = (run.get("batch_per_slice") or config.global_batch_size
                ) / chips
    model = config.mesh.model
    dims = {"embd": cfg.n_embd, "head": cfg.head_dim,
            "attention shard": cfg.attention_width // model,
            "mlp shard": cfg.mlp_width // model,
            "embd shard": cfg.n_embd // model, "vocab": cfg.vocab_size,
            "sequence": cfg.block_size,
            "tokens per chip": per_chip * cfg.block_size}
    assert all(size % 128 == 0 for size in dims.values()), (run, dims)
