"""benchmarks/parity/upstream_nanogpt.py's own logic, without upstream's code:
flag refusals, the comparison helpers, get_lr's extraction, and a stand-in
upstream (our spec-written torch port behind model.py's names) on which the
model checks pass, and fail once --perturb moves one of our weights."""
import importlib.util
import math
import os
import textwrap

import numpy as np
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_SCRIPT = os.path.join(_REPO, "benchmarks", "parity", "upstream_nanogpt.py")


def _load():
  spec = importlib.util.spec_from_file_location("upstream_nanogpt_parity",
                                                _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


parity = _load()


def _fake_upstream(tmp_path, train_py="def get_lr(it):\n  return 0.0\n"):
  """A directory with upstream's file names: model.py re-exports our port
  (benchmarks/reference/nanogpt_torch.py) as GPT / GPTConfig."""
  d = tmp_path / "nanoGPT"
  (d / "data" / "shakespeare_char").mkdir(parents=True)
  (d / "model.py").write_text(textwrap.dedent(f"""
      import importlib.util
      _spec = importlib.util.spec_from_file_location(
          "_port", {os.path.join(_REPO, "benchmarks", "reference",
                                 "nanogpt_torch.py")!r})
      _port = importlib.util.module_from_spec(_spec)
      _spec.loader.exec_module(_port)
      GPT = _port.GPT
      GPTConfig = _port.Config
      """))
  (d / "train.py").write_text(train_py)
  (d / "data" / "shakespeare_char" / "prepare.py").write_text("")
  return d


@pytest.mark.parametrize("argv, flag", [
    ([], "--upstream_dir is required"),
    (["--upstream_dir=/nonexistent/nanoGPT"], "is not a directory"),
])
def test_refuses_missing_upstream_dir(argv, flag, capsys):
  assert parity.main(argv) == 2
  err = capsys.readouterr().err
  assert flag in err and "--upstream_dir" in err
  assert len(err.strip().splitlines()) == 1


def test_refuses_a_directory_that_is_not_nanogpt(tmp_path, capsys):
  (tmp_path / "model.py").write_text("")
  assert parity.main([f"--upstream_dir={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert "is not a nanoGPT work tree" in err and "train.py" in err
  assert "prepare.py" in err


@pytest.mark.parametrize("flag, says", [
    ("--checks=model,nope", "--checks=model,nope"),
    ("--cases=v7", "--cases=v7"),
    ("--input=/nonexistent/input.txt", "--input=/nonexistent/input.txt"),
    ("--json=/nonexistent/dir/out.json", "--json="),
])
def test_refuses_bad_flags_before_work(tmp_path, flag, says, capsys):
  d = _fake_upstream(tmp_path)
  checks = [] if flag.startswith(("--checks", "--input")) else [
      "--checks=model"]
  assert parity.main([f"--upstream_dir={d}", flag] + checks) == 2
  assert says in capsys.readouterr().err


def test_compare_passes_within_and_fails_beyond_tolerance():
  theirs = np.array([1.0, -2.0, 4.0])
  ok = parity.compare("x", theirs + 1e-6, theirs, 1e-5)
  assert ok.passed and ok.max_abs == pytest.approx(1e-6)
  assert ok.max_rel == pytest.approx(1e-6 / 4.0)
  bad = parity.compare("x", theirs + np.array([0, 0, 1e-3]), theirs, 1e-5)
  assert not bad.passed and bad.max_rel == pytest.approx(2.5e-4)
  assert not parity.compare("x", [np.nan, 0, 0], theirs, 1.0).passed
  assert not parity.compare("x", [1.0, 2.0], theirs, 1.0).passed
  # Relative to a given scale (the change the iterations made).
  scaled = parity.compare("x", theirs + 1e-3, theirs, 1e-2,
                          scale=np.full(3, 0.01))
  assert scaled.max_rel == pytest.approx(0.1) and not scaled.passed
  assert "FAIL" in scaled.line()
  assert "PASS" in ok.line()


def test_compare_trees_names_the_worst_leaf():
  theirs = {"a": {"w": np.ones(3)}, "b": np.zeros(2) + 2.0}
  ours = {"a": {"w": np.ones(3)}, "b": np.array([2.0, 2.5])}
  r = parity.compare_trees("t", ours, theirs, 1e-3)
  assert not r.passed and r.note == "worst: b"
  assert r.max_abs == pytest.approx(0.5)
  assert parity.compare_trees("t", theirs, theirs, 0.0).passed
  assert not parity.compare_trees("t", {"a": {"w": np.ones(3)}}, theirs,
                                  1.0).passed


def test_compare_exact_counts_differences():
  exact = parity.common.compare_exact
  assert exact("s", [([1, 2, 3], [1, 2, 3])]).passed
  r = exact("s", [([1, 2, 4], [1, 2, 3])])
  assert not r.passed and r.values["differ"] == 1 and "1 of 3" in r.line()
  assert not exact("s", [([1, 2], [1, 2, 3])]).passed


def test_get_lr_is_taken_from_train_py_and_given_globals(tmp_path):
  d = _fake_upstream(tmp_path, train_py=textwrap.dedent("""
      import torch  # never executed: only get_lr is taken out
      raise SystemExit('train.py must not run')
      def get_lr(it):
          if it < warmup_iters:
              return learning_rate * it
          return min_lr + math.cos(lr_decay_iters)
      """))
  get_lr = parity.upstream_get_lr(str(d), learning_rate=2.0, warmup_iters=3,
                                  lr_decay_iters=0.5, min_lr=1.0)
  assert get_lr(2) == 4.0
  assert get_lr(3) == pytest.approx(1.0 + math.cos(0.5))
  (d / "train.py").write_text("x = 1\n")
  with pytest.raises(RuntimeError, match="defines no get_lr"):
    parity.upstream_get_lr(str(d))


def test_model_checks_pass_on_a_faithful_port_and_fail_when_perturbed(
    tmp_path, capsys):
  pytest.importorskip("torch")
  d = _fake_upstream(tmp_path)
  argv = [f"--upstream_dir={d}", "--checks=model", "--cases=v65_bias"]
  assert parity.main(argv) == 0
  out = capsys.readouterr().out
  assert "commit unknown" in out
  assert "v65_bias model plain logits" in out and "FAIL" not in out
  assert out.count("PASS") == 5
  json_path = tmp_path / "r.json"
  assert parity.main(argv + ["--perturb=1e-3", f"--json={json_path}"]) == 1
  out = capsys.readouterr().out
  assert "FAIL" in out.split("v65_bias model plain logits")[1].splitlines()[0]
  assert "checks passed; FAILED:" in out
  assert '"pass": false' in json_path.read_text()
