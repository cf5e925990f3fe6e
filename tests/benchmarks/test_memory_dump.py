"""benchmarks/forecast/memory_dump.py refuses a bad flag in one line, before
anything compiles."""
import pytest
import repo


@pytest.fixture(scope="module")
def script():
  return repo.load_script("benchmarks", "forecast", "memory_dump.py")


@pytest.mark.parametrize("argv, needle", [
    (["--run=v6e_nope"], "--run='v6e_nope': not one of"),
    (["--run=v6e_l8b_8k", "--layers=0"], "--layers=0: must be at least 1"),
    (["--run=v6e_l8b_8k", "--set=model.head_gather"], "expected KEY=VALUE"),
    (["--run=v6e_l8b_8k", "--set=model.nope=1"],
     "a field of the row's config (no 'nope')"),
    (["--run=v6e_l8b_8k", "--set=model.head_gather.x=1"], "(no 'x')"),
    (["--run=v6e_l8b_8k", "--set=model.n_kv_head=eight"],
     "invalid literal for int()"),
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
