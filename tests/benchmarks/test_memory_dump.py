"""benchmarks/forecast/memory_dump.py refuses a bad flag in one line, before
anything compiles, and lists the buffers live at a dumped step's peak."""
import pytest
import repo


@pytest.fixture(scope="module")
def script():
  return repo.load_script("benchmarks", "forecast", "memory_dump.py")


@pytest.mark.parametrize("argv, needle", [
    (["--run=v6e_nope"], "--run='v6e_nope': not one of"),
    (["--run=v6e_l8b_8k", "--layers=0"], "--layers=0: must be at least 1"),
    (["--run=v6e_l8b_8k", "--peak=-1"], "--peak=-1: must be 0 or more"),
    (["--run=v6e_l8b_8k", "--set=model.head_gather"],
     "'model.head_gather': expected KEY=VALUE"),
    (["--run=v6e_l8b_8k", "--set=model.nope=1"],
     "config.model has no field 'nope'"),
    (["--run=v6e_l8b_8k", "--set=model.head_gather.x=1"],
     "config.model.head_gather has no field 'x'"),
    (["--run=v6e_l8b_8k", "--set=model.n_kv_head=eight"],
     "config.model.n_kv_head='eight' has the wrong type"),
    (["--run=v6e_l8b_8k", "--hbm_limit_mib=0"],
     "--xla_tpu_max_hbm_size_mib=0: XLA:TPU fits the step to that many MiB"),
    # Above v6e's 31.25 GiB: a step fitted to it need not fit the chip.
    (["--run=v6e_l8b_8k", "--hbm_limit_mib=32769"],
     "and the chip has 32000; set it from 1 to that"),
])
def test_a_bad_flag_is_one_line(script, monkeypatch, capsys, argv, needle):
  def compile_row(*_):
    raise AssertionError("compiled despite a bad flag")
  monkeypatch.setattr(script.plan, "compile_row", compile_row)
  with pytest.raises(SystemExit) as exit_info:
    script.main(argv)
  assert exit_info.value.code == 2
  lines = [line for line in capsys.readouterr().err.splitlines()
           if "error:" in line]
  assert len(lines) == 1 and needle in lines[0], lines


def test_set_types_a_field_as_the_config_does(script, monkeypatch, capsys):
  seen = {}

  def compile_row(config, *_):
    seen.update(head_gather=config.model.head_gather,
                n_kv_head=config.model.n_kv_head, layers=config.n_layer)
    raise SystemExit(0)
  monkeypatch.setattr(script.plan, "compile_row", compile_row)
  with pytest.raises(SystemExit):
    script.main(["--run=v6e_l8b_8k", "--layers=3",
                 "--set=model.head_gather=compute", "--set=model.n_kv_head=4"])
  assert seen == dict(head_gather="compute", n_kv_head=4, layers=3)


class _Row:
  def __init__(self, **fields):
    self.__dict__.update(dict(program=None, memory_gib=None,
                              memory_peak_gib=None, fits=False,
                              host_memory_gib=0.0, error=None), **fields)


def test_hbm_limit_reaches_the_compile_and_a_refusal_is_one_line(
    script, monkeypatch, capsys):
  """--hbm_limit_mib is XLA:TPU's xla_tpu_max_hbm_size_mib among the
  row's own options; a step XLA refuses under it is a line with XLA's
  figure and message, a step it compiles a line with sum and peak (the
  sum over the limit: XLA rescheduled it to fit)."""
  seen = []
  tpu_mesh = type("Mesh", (), {"devices": type("D", (), {
      "flat": [type("Dev", (), {"platform": "tpu"})()]})()})()

  def compile_row(config, *_):
    seen.append(script.tpu_flags.for_mesh(config, tpu_mesh))
    if len(seen) == 1:
      return _Row(memory_gib=4.37, error="RESOURCE_EXHAUSTED: ... (4.37G)")
    return _Row(program=object(), memory_gib=8.383, memory_peak_gib=6.759,
                fits=True)
  monkeypatch.setattr(script.plan, "compile_row", compile_row)
  script.main(["--run=v6e_gpt3", "--reduce_once=0", "--hbm_limit_mib=4096"])
  assert seen[0]["xla_tpu_max_hbm_size_mib"] == "4096"
  assert capsys.readouterr().out.strip() == (
      "v6e_gpt3 layers=2 reduce_once=False hbm_limit_mib=4096: refused by "
      "XLA (4.370 GiB a chip): RESOURCE_EXHAUSTED: ... (4.37G)")
  script.main(["--run=v6e_gpt3", "--reduce_once=0", "--hbm_limit_mib=7500"])
  assert seen[1]["xla_tpu_max_hbm_size_mib"] == "7500"
  assert capsys.readouterr().out.strip() == (
      "v6e_gpt3 layers=2 reduce_once=False hbm_limit_mib=7500: 8.383 GiB a "
      "chip (arguments, outputs and temporaries less aliased; XLA's peak "
      "6.759), fits=True (XLA compiled it), host 0.00 GiB")
  # Each run's limit is its own: a run without one compiles for the chip.
  script.main(["--run=v6e_gpt3", "--reduce_once=0"])
  assert "xla_tpu_max_hbm_size_mib" not in seen[2]


_REPORT = """HloLiveRange (max 9):
  InstructionSequence:
    0:param.1
  BufferLiveRange:
    param.1{}:0-9
  Live ranges at 7 (peak):
    copy.3{}: 1048576 bytes (cumulative: 1048576 bytes)
    fusion.9{1}: 4194304 bytes (cumulative: 5242880 bytes)
    all-gather.2{}: 2097152 bytes (cumulative: 7340032 bytes)
  Stack trace breakdown for peak usage: 7 340 032 bytes
"""
_PROGRAM = """HloModule jit_train_step
  %fusion.9 = (f32[4]) fusion(%p), metadata={op_name="jit(train_step)/mlp/dot_general"}
  %all-gather.2 = f32[512,1024] all-gather(%x)
"""


def test_the_peak_is_listed_largest_first_with_each_op(script, tmp_path):
  stem = "module_0001.jit_train_step.cl_1.after_optimizations"
  (tmp_path / f"{stem}-live-range.txt").write_text(_REPORT)
  (tmp_path / f"{stem}.txt").write_text(_PROGRAM)
  lines = script.peak_buffers(str(tmp_path), 2)
  assert lines[0] == "Live ranges at 7 (peak):"
  assert lines[1].split() == ["4.0", "MiB", "fusion.9{1}",
                              "jit(train_step)/mlp/dot_general"]
  assert lines[2].split() == ["2.0", "MiB", "all-gather.2{}"]
  assert len(lines) == 3


def test_no_report_says_so(script, tmp_path):
  assert script.peak_buffers(str(tmp_path), 5) == [
      f"no train step live-range report in {tmp_path}"]


_ASSIGNMENT = """BufferAssignment:
allocation 0: size 1073741824, parameter 0, shape |f32[4]| at ShapeIndex {}, maybe-live-out:
allocation 1: size 536870912, maybe-live-out:
allocation 2: size 2147483648, preallocated-temp:
allocation 3: size 4294967296, color 5, preallocated-temp:
allocation 4: size 512, color 6, thread-local:
"""


def test_allocations_sum_hbm_only(script, tmp_path):
  stem = "module_0001.jit_train_step.cl_1.after_optimizations"
  (tmp_path / f"{stem}-buffer-assignment.txt").write_text(_ASSIGNMENT)
  assert script.allocations(str(tmp_path)) == (
      "buffer assignment, HBM: 1.50 GiB parameters and outputs, "
      "2.00 GiB temporaries, 3.50 GiB in all")
  assert script.allocations(str(tmp_path / "none")).startswith("no train")
