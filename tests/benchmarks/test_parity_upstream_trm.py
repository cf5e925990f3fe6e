"""benchmarks/parity/upstream_trm.py without upstream's code (not in CI):
flag refusals, the comparison helper, the forced random draws and --perturb."""
import os
import sys

import numpy as np
import pytest
import repo

sys.path.insert(0, os.path.join(repo.ROOT, "benchmarks", "parity"))
import upstream_trm  # pylint: disable=g-import-not-at-top,wrong-import-position


def _refused(capsys, argv, *words):
  assert upstream_trm.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1, err
  for word in words:
    assert word in err, err


def _fake_upstream(root, skip=()):
  for name in upstream_trm.UPSTREAM_FILES:
    if name in skip:
      continue
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
  return str(root)


def test_refuses_missing_or_wrong_upstream_dir(capsys, tmp_path):
  _refused(capsys, [], "--upstream_dir is required")
  _refused(capsys, [f"--upstream_dir={tmp_path / 'nope'}"], "--upstream_dir",
           "not a directory")
  _refused(capsys, [f"--upstream_dir={tmp_path}"], "--upstream_dir",
           "models/recursive_reasoning/trm.py")
  up = _fake_upstream(tmp_path / "up", skip=("pretrain.py",))
  _refused(capsys, [f"--upstream_dir={up}"], "pretrain.py")


def test_refuses_bad_adam_dir_and_variants(capsys, tmp_path):
  up = _fake_upstream(tmp_path / "up")
  _refused(capsys, [f"--upstream_dir={up}", f"--adam_atan2_dir={tmp_path}"],
           "--adam_atan2_dir", "adam_atan2/adam_atan2.py")
  _refused(capsys, [f"--upstream_dir={up}", "--variants=mlp"], "--variants")
  _refused(capsys, [f"--upstream_dir={up}", "--batch=1"], "--batch")
  _refused(capsys, [f"--upstream_dir={up}", f"--json={tmp_path}/a/b.json"],
           "--json")


def test_checker_passes_and_fails(capsys):
  ck = upstream_trm.Checker()
  x = np.linspace(-2, 2, 50).astype(np.float32)
  assert ck.close("same", (x, x), 0.0)
  assert ck.close("within", [(("a", x + 1e-6), x), (x, x)], 1e-5)
  assert not ck.failed
  assert not ck.close("beyond", (x + 1e-3, x), 1e-5)
  assert ck.failed
  # Each tensor against its own scale: a small tensor's error is not hidden
  # by a large one next to it.
  assert not ck.close("scales", [(x * 1e3, x * 1e3),
                                 (("small", x * 1e-3 + 1e-5), x * 1e-3)],
                      1e-3)
  assert not ck.close("shape", (x[:3], x), 1.0)
  assert not ck.close("nan", (np.full(3, np.nan), np.zeros(3)), 1.0)
  assert ck.equal("ints", ([1, 2, 3], [1, 2, 3]))
  assert not ck.equal("ints differ", ([1, 2, 4], [1, 2, 3]))
  out = capsys.readouterr().out.splitlines()
  assert [line.split("  (")[0].split()[-1] for line in out] == [
      "PASS", "PASS", "FAIL", "FAIL", "FAIL", "FAIL", "PASS", "FAIL"]
  assert [c.status for c in ck.checks] == [
      "PASS", "PASS", "FAIL", "FAIL", "FAIL", "FAIL", "PASS", "FAIL"]
  assert ck.checks[3].note == "worst: small" and "1 of 3 differ" in out[7]
  assert [c.passed for c in ck.checks].count(False) == 5


def test_forced_draws_replace_and_restore_torch_rng():
  torch = pytest.importorskip("torch")
  rand_like, randint_like = torch.rand_like, torch.randint_like
  like = torch.zeros(3)
  with upstream_trm.forced_draws(np.array([0.1, 0.9, 0.5], np.float32),
                                 np.array([2, 3, 4], np.int32)):
    np.testing.assert_array_equal(torch.rand_like(like).numpy(),
                                  np.array([0.1, 0.9, 0.5], np.float32))
    steps = torch.zeros(3, dtype=torch.int32)
    got = torch.randint_like(steps, low=2, high=5)
    assert got.dtype == torch.int32 and got.tolist() == [2, 3, 4]
  assert torch.rand_like is rand_like and torch.randint_like is randint_like


def test_perturb_changes_one_parameter():
  pytest.importorskip("jax")
  params = {"lm_head": {"kernel": np.zeros((2, 3), np.float32)},
            "q_head": {"kernel": np.ones((2,), np.float32),
                       "bias": np.zeros((2,), np.float32)}}
  moved = upstream_trm.flat_tree(upstream_trm.perturb_params(params,
                                                             "q_head"))
  plain = upstream_trm.flat_tree(params)
  changed = [k for k in plain if not np.array_equal(plain[k], moved[k])]
  assert changed == ["q_head/bias"]  # the first match, in sorted order
  np.testing.assert_allclose(moved["q_head/bias"], 1e-2)
  with pytest.raises(SystemExit, match="--perturb=nothing"):
    upstream_trm.perturb_params(params, "nothing")


def test_refuses_bad_dtypes(capsys, tmp_path):
  up = _fake_upstream(tmp_path / "up")
  _refused(capsys, [f"--upstream_dir={up}", "--dtypes=float16"], "--dtypes")
  _refused(capsys, [f"--upstream_dir={up}", "--dtypes=,"], "--dtypes")


def test_bf16_rule_against_upstreams_own_distance():
  """ours-vs-upstream bf16 passes within 2 x upstream's own bf16-vs-fp32
  max_rel + floor, per tensor, and fails beyond it."""
  x = np.linspace(-1, 1, 64)
  own = 1e-2  # upstream's bf16 run 1e-2 (relative) from its fp32 run
  fp32 = x + own * np.sign(x)
  floor = upstream_trm.BF16_FLOOR
  bound = 2 * own + floor
  ok = upstream_trm.bf16_compare("ok", [("t", x + 0.99 * bound, x, fp32)])
  assert ok.passed and ok.status == "PASS"
  assert ok.tol == pytest.approx(bound)
  assert "upstream bf16 vs its fp32 1.000e-02" in ok.note
  bad = upstream_trm.bf16_compare("bad", [("t", x + 1.01 * bound, x, fp32)])
  assert not bad.passed and bad.status == "FAIL"
  # Each tensor against its own distance: a tensor upstream computes
  # exactly in bf16 gets the floor only, whatever the others' distances.
  mixed = upstream_trm.bf16_compare(
      "mixed", [("noisy", x + 0.5 * bound, x, fp32),
                ("exact", x + 2 * floor, x, x)])
  assert not mixed.passed and mixed.note.startswith("worst: exact")
  # An item's own floor replaces the default one.
  assert upstream_trm.bf16_compare(
      "own floor", [("t", x + 0.05, x, x, 0.06)]).passed
  assert not upstream_trm.bf16_compare(
      "shape", [("t", x[:3], x, fp32)]).passed
  assert not upstream_trm.bf16_compare(
      "nan", [("t", np.full_like(x, np.nan), x, fp32)]).passed


def test_decision_check_pass_info_fail():
  theirs = np.array([True, False, True, False])
  q = np.array([3.0, -2.0, 0.01, -4.0])
  same = upstream_trm.decision_check("same", theirs.copy(), theirs, q, 0.1,
                                     "4 of 4 agree")
  assert same.passed and same.status == "PASS" and same.scored
  assert same.figures == "4 of 4 agree"
  near = theirs.copy()
  near[2] = False  # flipped where |q| = 0.01: within the borderline
  info = upstream_trm.decision_check("near", near, theirs, q, 0.1, "")
  assert info.status == "INFO" and not info.scored
  assert info.figures == "3 of 4 agree"
  far = theirs.copy()
  far[0] = False  # flipped where |q| = 3: a real difference
  fail = upstream_trm.decision_check("far", far, theirs, q, 0.1, "")
  assert fail.status == "FAIL" and not fail.passed


def test_solved_rows():
  labels = np.array([[1, 2, -100], [1, 2, 3], [-100, -100, -100]])
  preds = np.array([[1, 2, 9], [1, 2, 4], [5, 5, 5]])
  assert upstream_trm._solved(preds, labels).tolist() == [True, False, True]  # pylint: disable=protected-access
