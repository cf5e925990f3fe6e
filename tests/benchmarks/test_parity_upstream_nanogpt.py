"""benchmarks/parity/upstream_nanogpt.py's own logic, without upstream's code:
flag refusals, the comparison helpers, get_lr's extraction, and a stand-in
upstream (our spec-written torch port behind model.py's names) on which the
model checks pass, and fail once --perturb moves one of our weights."""
import importlib.util
import io
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
# Torch on one thread: the tests run beside another pytest worker on a
# 2-core host, where torch's second thread only contends (the bf16
# test 26-31 -> 12 s of CPU, measured side by side under load).
_ONE_THREAD = "--threads=1"


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
  argv = [f"--upstream_dir={d}", "--checks=model", "--cases=v65_bias",
          _ONE_THREAD]
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


# ------------------------------------------------------------ draws check


def _top_k_probs(logits, temperature, top_k, extra=0):
  """nanoGPT's recipe by hand (keep every logit >= the k-th largest);
  `extra` keeps the `extra` next tokens too (an off-by-one stand-in)."""
  x = logits.astype(np.float64) / temperature
  kth = -np.sort(-x, -1)[:, top_k - 1 + extra][:, None]
  e = np.where(x >= kth, np.exp(x - x.max(-1, keepdims=True)), 0.0)
  return e / e.sum(-1, keepdims=True)


def test_draw_test_fails_wrong_top_k_samplers():
  rng = np.random.default_rng(1)
  logits = rng.normal(0, 2.0, (3, 80)).astype(np.float32)  # as draw_logits
  t, k, n = 1.3, 20, 2000
  upstream = _top_k_probs(logits, t, k)

  def draw(probs):
    return np.stack([rng.choice(p.size, size=n, p=p) for p in probs])
  test = parity.common.draw_test
  assert test("right", draw(upstream), upstream, tests=3).passed
  twice = _top_k_probs(logits / t, t, k)
  assert not test("twice", draw(twice), upstream, tests=3).passed
  more = _top_k_probs(logits, t, k, extra=1)
  bad = test("more", draw(more), upstream, tests=3)
  assert not bad.passed and bad.values["outside"] > 0


def test_multinomial_recorder_returns_our_tokens_and_restores():
  torch = pytest.importorskip("torch")
  real = torch.multinomial
  probs = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 1.0]])
  with parity._Multinomial([np.array([1, 0])]) as rec:
    out = torch.multinomial(probs, num_samples=1)
  assert torch.multinomial is real
  assert out.tolist() == [[1], [0]]
  np.testing.assert_array_equal(rec.probs[0], probs.numpy())
  stand_in = parity._FixedLogits(torch.ones(2, 3))
  logits, loss = stand_in(torch.zeros(2, 1, dtype=torch.long))
  assert logits.shape == (2, 1, 3) and loss is None
  assert stand_in.config.block_size == 1


def _recipe_generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
  """A stand-in for upstream's GPT.generate, written here from nanoGPT's
  documented recipe (not its code): crop, scale, top-k, softmax, draw."""
  import torch  # pylint: disable=g-import-not-at-top
  for _ in range(max_new_tokens):
    logits, _ = self(idx[:, -self.config.block_size:])
    logits = logits[:, -1, :] / temperature
    if top_k is not None:
      v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
      logits[logits < v[:, [-1]]] = -float("inf")
    probs = torch.softmax(logits, dim=-1)
    idx = torch.cat((idx, torch.multinomial(probs, num_samples=1)), dim=1)
  return idx


def test_run_draws_passes_on_the_recipe_and_fails_when_perturbed(
    monkeypatch):
  pytest.importorskip("torch")
  import types  # pylint: disable=g-import-not-at-top
  upstream = types.SimpleNamespace(
      GPT=types.SimpleNamespace(generate=_recipe_generate))
  monkeypatch.setattr(parity, "DRAW_SETTINGS", ((0.5, None), (1.3, 20)))
  report = parity.common.Report(out=io.StringIO())
  parity.run_draws(report, upstream, 0.0)
  assert not report.failed, [c.line() for c in report.checks]
  kept = report.checks[0]
  assert "ties at the k-th keep more than k" in kept.note
  assert not kept.note.startswith("0 rows")
  report = parity.common.Report(out=io.StringIO())
  parity.run_draws(report, upstream, 1e-3)  # ours: temperature twice
  assert len(report.failed) >= 2


def test_draws_is_a_check(tmp_path):
  d = _fake_upstream(tmp_path)
  parity.check_args(parity.parse_args([f"--upstream_dir={d}",
                                       "--checks=draws"]))


# ------------------------------------------------------- dropout and bf16

# Appended to the stand-in's model.py: when F.scaled_dot_product_attention
# is missing at construction (as the dropout check arranges), attention
# takes a written-out path whose probabilities pass through an nn.Dropout
# module, as upstream's own manual path does. NO_MLP_DROPOUT drops one
# dropout site (a model that no longer matches ours).
_MANUAL_ATTENTION = """
import math, os, types
import torch

def _manual(self, x):
  b, t, c = x.shape
  heads = lambda y: y.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
  q, k, v = (heads(y) for y in self.c_attn(x).split(c, dim=2))
  scores = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
  causal = torch.ones(t, t, dtype=torch.bool).tril()
  probs = self.attn_dropout(scores.masked_fill(~causal, float("-inf"))
                            .softmax(-1))
  y = (probs @ v).transpose(1, 2).contiguous().view(b, t, c)
  return self.resid_dropout(self.c_proj(y))

class GPT(_port.GPT):
  def __init__(self, cfg):
    super().__init__(cfg)
    if not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
      for block in self.transformer.h:
        block.attn.attn_dropout = torch.nn.Dropout(cfg.dropout)
        block.attn.forward = types.MethodType(_manual, block.attn)
        if os.environ.get("NO_MLP_DROPOUT"):
          block.mlp.dropout = torch.nn.Identity()
"""


# train.py's schedule as nanoGPT's README describes it (linear warmup from
# lr / (warmup + 1), cosine to min_lr at lr_decay_iters), for the stand-in.
_WARMUP_COSINE = textwrap.dedent("""
    def get_lr(it):
      if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
      if it > lr_decay_iters:
        return min_lr
      ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
      return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (
          learning_rate - min_lr)
    """)


def _fake_upstream_manual(tmp_path, train_py=_WARMUP_COSINE):
  d = _fake_upstream(tmp_path, train_py)
  with open(d / "model.py", "a", encoding="utf-8") as f:
    f.write(_MANUAL_ATTENTION)
  return d


def _dropout_check(tmp_path, capsys, *flags):
  """(exit status, stdout) of the dropout check on the stand-in."""
  pytest.importorskip("torch")
  d = _fake_upstream_manual(tmp_path)
  status = parity.main([f"--upstream_dir={d}", "--checks=dropout",
                        "--cases=v65_nobias", _ONE_THREAD, *flags])
  return status, capsys.readouterr().out


def test_dropout_check_passes_and_fails_when_perturbed(tmp_path, capsys):
  status, out = _dropout_check(tmp_path, capsys)
  assert status == 0
  assert out.count("PASS") == 8 and "FAIL" not in out, out
  assert "ours 7, upstream 7" in out and "6 distinct of 6" in out
  status, out = _dropout_check(tmp_path / "p", capsys, "--perturb=1e-3")
  failed = [line for line in out.splitlines()
            if line.endswith("FAIL") or "FAIL  (" in line]
  assert status == 1
  assert any("dropout p=0.2 logits" in line for line in failed), failed


def test_dropout_check_fails_when_a_site_is_missing_upstream(
    tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("NO_MLP_DROPOUT", "1")
  status, out = _dropout_check(tmp_path, capsys)
  line = next(x for x in out.splitlines() if "calls and shapes" in x)
  assert status == 1
  assert "ours 7, upstream 5" in line and "FAIL" in line


def test_bf16_check_passes_and_fails_when_perturbed(tmp_path, capsys):
  pytest.importorskip("torch")
  d = _fake_upstream_manual(tmp_path)
  # After the dropout check too: a config it changed once leaked into this.
  argv = [f"--upstream_dir={d}", "--checks=dropout,bf16", "--cases=v65_bias",
          _ONE_THREAD]
  assert parity.main(argv) == 0
  out = capsys.readouterr().out
  assert out.count("PASS") == 12 and "upstream autocast vs float32" in out
  # Within bf16's own noise a small shift passes; ln_f's scale + 0.1 moves
  # every logit by about a tenth. Perturbed, the bf16 check runs alone (the
  # dropout check's failure: test_dropout_check_passes_and_fails_when_...).
  argv[1] = "--checks=bf16"
  assert parity.main(argv + ["--perturb=0.1"]) == 1
  out = capsys.readouterr().out
  assert "v65_bias bf16 logits" in out
  assert "FAIL" in out.split("v65_bias bf16 logits")[1].splitlines()[0]


def test_rms_rel_is_over_all_elements():
  numerics = pytest.importorskip("nanogpt_numerics")
  start = {"a": np.zeros(3), "b": {"c": np.zeros(1)}}
  truth = {"a": np.array([3.0, 0.0, 0.0]), "b": {"c": np.array([4.0])}}
  ours = {"a": np.array([3.0, 0.0, 0.0]), "b": {"c": np.array([4.5])}}
  assert numerics.rms_rel(ours, truth, start) == pytest.approx(0.1)
  assert numerics.rms_rel(ours, start, start) == math.inf
