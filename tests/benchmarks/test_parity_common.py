"""benchmarks/parity/common.py, what the parity scripts share: the
comparisons, the one line format, the summary, --json and the exit codes."""
import json
import math
import os
import sys

import numpy as np
import pytest
import repo

sys.path.insert(0, os.path.join(repo.ROOT, "benchmarks", "parity"))
import common  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_compare_against_theirs_larger_or_a_given_scale():
  theirs = np.array([1.0, -2.0, 4.0])
  c = common.compare("x", theirs + 1e-6, theirs, 1e-5)
  assert c.passed and c.max_abs == pytest.approx(1e-6)
  assert c.max_rel == pytest.approx(1e-6 / 4)
  c = common.compare("x", theirs * 2, theirs, 1.0, scale="larger")
  assert c.max_rel == pytest.approx(4 / 8)
  c = common.compare("x", theirs + 1e-3, theirs, 1e-2, scale=np.full(3, 0.01))
  assert c.max_rel == pytest.approx(0.1) and not c.passed
  where = np.array([True, True, False])
  assert common.compare("x", theirs + [0, 0, 1], theirs, 0.0,
                        where=where).passed
  for bad in ([np.nan, 0, 0], [np.inf, -2, 4], [1.0, 2.0]):
    c = common.compare("x", bad, theirs, 1.0)
    assert not c.passed and c.note, c
  assert common.compare("zero", [0.0], [0.0], 0.0).passed
  assert common.compare("zero", [1e-9], [0.0], 1.0).max_rel == math.inf


def test_compare_all_and_trees_name_the_worst_item():
  x = np.linspace(-2, 2, 50)
  # Each item against its own scale: a small tensor's error shows.
  c = common.compare_all("s", [("big", x * 1e3, x * 1e3),
                               ("small", x * 1e-3 + 1e-5, x * 1e-3)], 1e-3)
  assert not c.passed and c.note == "worst: small"
  assert c.max_abs == pytest.approx(1e-5)
  # A NaN item fails the check even when it is not the first.
  c = common.compare_all("n", [("a", x, x), ("b", x * np.nan, x)], 1.0)
  assert not c.passed and c.note.startswith("worst: b")
  theirs = {"a": {"w": np.ones(3)}, "b": np.full(2, 2.0)}
  c = common.compare_trees("t", {"a": {"w": np.ones(3)},
                                 "b": np.array([2.0, 2.5])}, theirs, 1e-3)
  assert not c.passed and c.note == "worst: b"
  assert common.compare_trees("t", theirs, theirs, 0.0).passed
  # Different leaf sets fail, either way round, without a KeyError.
  for ours in ({"a": {"w": np.ones(3)}}, dict(theirs, c=np.zeros(1))):
    c = common.compare_trees("t", ours, theirs, 1.0)
    assert not c.passed and "trees differ" in c.note


def test_compare_exact_counts_every_pair():
  c = common.compare_exact("ints", [([1, 2, 4], [1, 2, 3]), ([5], [5])])
  assert not c.passed and c.figures == "1 of 4 differ"
  c = common.compare_exact("shape", [([1, 2], [1, 2, 3])])
  assert not c.passed and c.values["differ"] == 3 and "shapes" in c.note
  assert common.compare_exact("same", [(np.arange(4), np.arange(4))]).passed


def test_one_line_format():
  c = common.Check("a check", True, 1.5e-6, 2.5e-7, 1e-5, note="worst: w")
  line = c.line()
  assert line.startswith("a check ")
  assert line.split() == ["a", "check", "max_abs", "1.500e-06", "max_rel",
                          "2.500e-07", "tol", "1e-05", "PASS", "(worst:",
                          "w)"]
  assert line.index("max_abs") == 57 and line.index("tol ") == 57 + 37
  exact = common.compare_exact("tokens", [([1, 2], [1, 3])])
  assert exact.line().split()[-7:] == ["1", "of", "2", "differ", "tol",
                                       "exact", "FAIL"]
  assert exact.line().index("1 of 2") == 57
  assert exact.line().endswith("tol exact     FAIL")
  info = common.Check("x", False, figures="d", info=True)
  assert info.line().endswith("INFO") and not info.scored
  assert common.Check("y", True, skipped="why").line().endswith(
      "SKIP  (why)")


def test_report_failing_check_exits_1_and_writes_json(tmp_path, capsys):
  report = common.Report()
  assert report.add(common.compare("good", [1.0], [1.0], 0.0))
  assert not report.add(common.compare("bad", [1.1], [1.0], 1e-3))
  report.add(common.Check("info", False, figures="-", info=True))
  report.skip("later", "no upstream file")
  path = tmp_path / "r.json"
  assert report.finish(str(path), upstream_commit="abc") == 1
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 5
  assert out[-1] == ("1 of 2 checks passed (2 INFO/SKIP lines not counted)"
                     "; FAILED: bad")
  data = json.loads(path.read_text())
  assert data["upstream_commit"] == "abc"
  assert [c["status"] for c in data["checks"]] == ["PASS", "FAIL", "INFO",
                                                   "SKIP"]
  assert data["checks"][1]["pass"] is False


def test_report_all_passed_exits_0(capsys):
  report = common.Report()
  report.add(common.compare_exact("same", [([1], [1])]))
  assert report.finish() == 0
  assert capsys.readouterr().out.splitlines()[-1] == "1 of 1 checks passed"


def test_refusals_exit_2_with_one_line_naming_the_flag(tmp_path, capsys):
  (tmp_path / "model.py").write_text("")
  cases = [
      lambda: common.require_files("upstream_dir", str(tmp_path / "no"),
                                   ["model.py"], "a nanoGPT"),
      lambda: common.require_files("upstream_dir", str(tmp_path),
                                   ["model.py", "train.py"], "a nanoGPT"),
      lambda: common.require_json_dir(str(tmp_path / "no" / "r.json")),
  ]
  words = [("--upstream_dir=", "is not a directory"),
           ("--upstream_dir=", "is not a nanoGPT work tree: it lacks "
            "train.py"),
           ("--json=", "does not exist")]
  for case, said in zip(cases, words):
    with pytest.raises(common.UsageError) as e:
      case()
    assert common.refuse("x.py", e.value) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("x.py: ")
    for word in said:
      assert word in err, err
  common.require_files("upstream_dir", str(tmp_path), ["model.py"], "a")
  common.require_json_dir(str(tmp_path / "r.json"))
  common.require_json_dir(None)


@pytest.mark.parametrize("value", ["model,nope", "", ",", "Model"])
def test_comma_list_refuses_unknown_or_no_names(value):
  # The one check behind every script's comma-list flag (read_flags' tuple
  # fields, nanoGPT's --checks / --cases, TRM's --variants / --dtypes).
  with pytest.raises(common.UsageError) as e:
    common.comma_list("checks", value, ("model", "grads"))
  assert str(e.value) == (f"--checks={value}: use a comma-separated subset "
                          "of model,grads")


def test_comma_list_keeps_order_and_skips_empty_items():
  assert common.comma_list("checks", "grads,,model,", ("model", "grads")) == (
      "grads", "model")


@pytest.mark.parametrize("script", ["upstream_dream", "upstream_fastdllm"])
def test_read_flags_tuple_fields_use_comma_list(script):
  module = __import__(script)
  with pytest.raises(common.UsageError,
                     match="--checks=nope: use a comma-separated subset of "):
    module.parse_args(["--upstream_dir=.", "--checks=nope"])
