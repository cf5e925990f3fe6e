"""benchmarks/parity/upstream_dream.py without upstream's code: flag checks
(exit 2, one line naming the flag, before any heavy import), the comparison
helpers failing where they should, `--perturb`, the blob ids and the import
of an upstream folder (a stand-in with the three file names); the export
check end to end on a stand-in that runs (transformers' Qwen2 made
bidirectional, the reference sampler)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import parity_scripts
import repo


@pytest.fixture(scope="module")
def script():
  yield from parity_scripts.loaded("upstream_dream")


def _run(*args):
  return parity_scripts.run("upstream_dream", *args)


def _fake_upstream(root, nested=True):
  """A folder with the three model files (relative imports between them)."""
  folder = os.path.join(root, "dllm", "pipelines", "dream", "models") if (
      nested) else root
  os.makedirs(folder, exist_ok=True)
  files = {"configuration_dream.py": "VALUE = 7\n",
           "generation_utils.py": "from .configuration_dream import VALUE\n",
           "modeling_dream.py": "from .generation_utils import VALUE\n"
                                "DOUBLE = 2 * VALUE\n"}
  for name, text in files.items():
    with open(os.path.join(folder, name), "w") as f:
      f.write(text)
  return folder


@pytest.mark.parametrize("args, flag", [
    ((), "--upstream_dir"),
    (("--upstream_dir=/nonexistent/dllm",), "--upstream_dir"),
    (("--upstream_dir=.", "--checks=forward,nope"), "--checks"),
    (("--upstream_dir=.", "--hidden=12"), "--hidden"),
    (("--upstream_dir=.", "--frobnicate=1"), "--frobnicate"),
])
def test_bad_flags_exit_2_naming_the_flag(args, flag, tmp_path):
  if args and args[0] == "--upstream_dir=.":  # a valid folder for the rest
    _fake_upstream(str(tmp_path))
    args = (f"--upstream_dir={tmp_path}",) + args[1:]
  result = _run(*args)
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and flag in lines[0], result.stderr
  assert result.stdout == ""


def test_a_folder_without_dream_code_is_refused(tmp_path):
  (tmp_path / "modeling_dream.py").write_text("")  # two files missing
  result = _run(f"--upstream_dir={tmp_path}")
  assert result.returncode == 2
  assert "--upstream_dir" in result.stderr
  assert "generation_utils.py" in result.stderr


def test_flags_are_checked_before_heavy_imports(script, tmp_path):
  _fake_upstream(str(tmp_path))
  out = parity_scripts.run_with("upstream_dream", f"""
      m.parse_args(["--upstream_dir={tmp_path}", "--perturb"])
      print(sorted(n for n in ("jax", "torch", "transformers")
                   if n in sys.modules))""")
  assert out.strip() == "[]"


def test_options(script, tmp_path):
  _fake_upstream(str(tmp_path))
  opts = script.parse_args([f"--upstream_dir={tmp_path}", "--perturb",
                            "--checks=loss,forward", "--vocab=256"])
  assert opts.perturb and opts.checks == ("loss", "forward")
  assert opts.vocab == 256
  assert script.has_trainer(str(tmp_path)) is False


def test_compare_arrays_fails_past_the_tolerance(script):
  rng = np.random.default_rng(0)
  a = rng.standard_normal((2, 5, 7)).astype(np.float32) * 10
  assert script.compare_arrays("same", a, a.copy(), 1e-5).passed
  near = a.astype(np.float64) + 1e-6
  check = script.compare_arrays("near", near, a, 1e-5)
  assert check.passed and check.max_abs == pytest.approx(1e-6, rel=0.1)
  far = a.copy()
  far[1, 2, 3] += 1e-2 * np.abs(a).max()
  check = script.compare_arrays("far", far, a, 1e-5)
  assert not check.passed and "FAIL" in check.line()
  assert check.max_rel == pytest.approx(1e-2, rel=1e-3)
  # Only where `where` holds: the perturbed entry left out passes.
  where = np.ones(a.shape, bool)
  where[1, 2, 3] = False
  assert script.compare_arrays("masked", far, a, 1e-5, where=where).passed
  nan = a.copy()
  nan[0, 0, 0] = np.nan
  assert not script.compare_arrays("nan", nan, a, 1.0).passed
  assert not script.compare_arrays("shape", a[:1], a, 1.0).passed


def test_compare_tokens(script):
  a = np.arange(12).reshape(2, 6)
  assert script.compare_tokens("same", a, a.copy()).passed
  b = a.copy()
  b[1, 4] = 0
  check = script.compare_tokens("one", a, b)
  assert not check.passed and check.values["differ"] == 1
  hist = np.zeros((3, 2, 6), int)
  other = hist.copy()
  other[1, 0, 0] = 5  # parts at step 1, final tokens equal
  check = script.compare_tokens("hist", a, a.copy(), (hist, other))
  assert not check.passed and check.values["first_history_diff"] == 1
  assert script.compare_tokens("hist", a, a.copy(), (hist, hist)).passed


def test_info_checks_do_not_fail_the_run(script):
  check = script.Check("x", False, figures="d", info=True)
  assert check.line().endswith("INFO") and not check.scored


def test_perturb_moves_one_bias(script):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  params = {"layers": {"self_attn": {"q_proj": {"bias": jnp.zeros((2, 4, 8)),
                                                "kernel": jnp.ones((2, 3))}}},
            "lm_head": {"kernel": jnp.ones((3, 5))}}
  out = script.perturb_params(params)
  bias = np.asarray(out["layers"]["self_attn"]["q_proj"]["bias"])
  assert np.all(bias[0] == np.float32(1e-3)) and np.all(bias[1] == 0)
  assert np.all(np.asarray(params["layers"]["self_attn"]["q_proj"]["bias"])
                == 0)  # the input is left alone
  np.testing.assert_array_equal(out["lm_head"]["kernel"], 1.0)


def test_blob_id_is_gits(script, tmp_path):
  path = tmp_path / "f.py"
  path.write_text("print('hi')\n")
  want = subprocess.run(["git", "hash-object", str(path)], capture_output=True,
                        text=True, check=True).stdout.strip()
  assert script.blob_id(str(path)) == want


@pytest.mark.parametrize("nested", [True, False])
def test_imports_an_upstream_folder(tmp_path, nested):
  _fake_upstream(str(tmp_path), nested)
  out = parity_scripts.run_with("upstream_dream", f"""
      up, trainer, shimmed = m.import_upstream({str(tmp_path)!r})
      print(up.modeling.DOUBLE, trainer, sorted(m.upstream_files(
          {str(tmp_path)!r})))""")
  prefix = "dllm/pipelines/dream/models/" if nested else ""
  assert out.strip() == "14 None " + str(
      [prefix + f for f in ("configuration_dream.py", "generation_utils.py",
                            "modeling_dream.py")])


def test_stand_in_modules(script):
  finder = script._StubFinder(["no_such_pkg_for_parity"])
  sys.meta_path.insert(0, finder)
  try:
    import no_such_pkg_for_parity.sub as sub  # pylint: disable=g-import-not-at-top
    base = sub.Thing
    assert isinstance(type("Child", (base,), {})(), base)
    assert sub.inner.more.__name__ == "no_such_pkg_for_parity.sub.inner.more"
  finally:
    sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n.startswith("no_such_pkg")]:
      del sys.modules[name]


# ------------------------------------------------------------ draws check


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _top_p(logits, temperature, top_p, extra=0):
  """Hand-written top-p distribution (stable descending order): keep a
  token while the mass ranked before it is <= top_p; `extra` keeps that
  many tokens more (negative: fewer), the off-by-one stand-ins."""
  p = _softmax(logits.astype(np.float64) / temperature)
  order = np.argsort(-p, kind="stable")
  before = np.cumsum(p[order]) - p[order]
  n = int((before <= top_p).sum()) + extra
  out = np.zeros_like(p)
  out[order[:n]] = p[order[:n]]
  return out / out.sum()


def _draw(rng, probs, n):
  return np.stack([rng.choice(p.size, size=n, p=p) for p in probs])


def test_draw_test_passes_a_right_sampler_and_fails_wrong_ones(script):
  """The statistical machinery of the draws check: draws from the right
  distribution pass; temperature applied twice, top-p keeping one token
  more or one fewer, fail (one wrong stand-in each)."""
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 1.0, (4, 60)).astype(np.float32)
  t, top_p, n = 1.3, 0.9, 2000
  upstream = np.stack([_top_p(row, t, top_p) for row in logits])
  test = script.common.draw_test
  right = test("right", _draw(rng, upstream, n), upstream, tests=4)
  assert right.passed, right.line()
  assert right.values["outside"] == right.values["missing"] == 0
  twice = np.stack([_top_p(row / t, t, top_p) for row in logits])
  bad = test("twice", _draw(rng, twice, n), upstream, tests=4)
  assert not bad.passed and bad.values["min_p"] < 1e-8, bad.line()
  more = np.stack([_top_p(row, t, top_p, extra=1) for row in logits])
  bad = test("more", _draw(rng, more, n), upstream, tests=4)
  assert not bad.passed and bad.values["outside"] > 0, bad.line()
  fewer = np.stack([_top_p(row, t, top_p, extra=-1) for row in logits])
  bad = test("fewer", _draw(rng, fewer, n), upstream, tests=4)
  assert not bad.passed and bad.values["missing"] > 0, bad.line()
  assert "FAIL" in bad.line() and "PASS" in right.line()


def test_draws_classify_rows(script):
  """Kept-set differences: an exact tie cut differently (same count of the
  tied value) is a split; anything else is bad; near-ties of the mass at
  top_p are found from the logits alone."""
  scaled = np.array([[3.0, 1.0, 1.0, 1.0, 0.0]], np.float32)
  ours = np.array([[0.7, 0.15, 0.15, 0.0, 0.0]])
  theirs = np.array([[0.7, 0.0, 0.15, 0.15, 0.0]])
  assert script.classify_rows(scaled, ours, theirs, 0.8) == ([0], [])
  fewer = np.array([[0.7, 0.0, 0.15, 0.0, 0.0]])
  assert script.classify_rows(scaled, fewer, theirs, 0.8) == ([], [0])
  p = np.array([0.45, 0.45, 0.05, 0.05])
  assert script.near_tie_rows(np.log(p)[None], 0.9) == [0]
  assert script.near_tie_rows(np.log(p)[None], 0.8) == []
  assert script.near_tie_rows(np.log(p)[None], None) == []
  ids, pooled = script.tie_classes(scaled[0], np.array([1, 3, 0]),
                                   theirs[0])
  np.testing.assert_array_equal(ids, [1, 1, 0])
  np.testing.assert_allclose(pooled, [0.7, 0.3, 0, 0, 0])


def test_draws_check_is_selectable(script, tmp_path):
  _fake_upstream(str(tmp_path))
  opts = script.parse_args([f"--upstream_dir={tmp_path}", "--checks=draws"])
  assert opts.checks == ("draws",)
  logits = script.draw_logits(np.random.default_rng(0))
  assert logits.shape == (11, script.DRAW_VOCAB)
  assert script.near_tie_rows(logits, 0.9) and script.near_tie_rows(
      logits, 0.95)  # the rows built to sit on the threshold


# ------------------------------------------------------------ export check

_STAND_IN = {
    "configuration_dream.py": '''
import transformers


class DreamConfig(transformers.Qwen2Config):
  model_type = "Dream"

  def __init__(self, mask_token_id=None, **kwargs):
    super().__init__(**kwargs)
    self.mask_token_id = mask_token_id
''',
    "generation_utils.py": '''
import types


class DreamGenerationConfig(types.SimpleNamespace):
  pass
''',
    "modeling_dream.py": '''
import sys
import types

import torch
import transformers

sys.path.insert(0, REFERENCE)
import dream_torch_sampler  # noqa: E402

from .configuration_dream import DreamConfig  # noqa: E402
from .generation_utils import DreamGenerationConfig  # noqa: E402,F401


class DreamModel(transformers.Qwen2ForCausalLM):
  config_class = DreamConfig

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              **kwargs):
    if attention_mask is None:  # bidirectional, as Dream's code
      b, n = input_ids.shape
      attention_mask = torch.ones(b, 1, n, n, dtype=torch.bool)
    return super().forward(input_ids=input_ids, attention_mask=attention_mask,
                           position_ids=position_ids, **kwargs)

  def diffusion_generate(self, input_ids, generation_config,
                         attention_mask=None):
    g = generation_config
    seq = torch.as_tensor(dream_torch_sampler.diffusion_generate(
        self, input_ids, attention_mask, mask_token_id=g.mask_token_id,
        max_new_tokens=g.max_new_tokens, steps=g.steps, alg=g.alg,
        temperature=g.temperature, top_p=g.top_p, top_k=g.top_k))
    return types.SimpleNamespace(sequences=seq, history=[seq])
''',
}


def _stand_in_upstream(root):
  """A folder whose three files make a working Dream: DreamConfig a
  Qwen2Config, DreamModel transformers' Qwen2ForCausalLM made bidirectional
  (an all-true 4-D mask, as Dream's code passes), its diffusion_generate
  benchmarks/reference/dream_torch_sampler.py's (final tokens only)."""
  os.makedirs(root)
  reference = os.path.join(repo.ROOT, "benchmarks", "reference")
  for name, text in _STAND_IN.items():
    with open(os.path.join(root, name), "w") as f:
      f.write(text.replace("REFERENCE", repr(reference)))
  return str(root)


def test_export_check_on_a_stand_in_upstream(tmp_path):
  """`--checks=export` end to end against the stand-in: it passes; it fails
  under --perturb (our side moved after the export), and when our writer
  transposes one tensor (o_proj: square here, so it still loads)."""
  folder = _stand_in_upstream(tmp_path / "up")
  report = str(tmp_path / "report.json")
  out = parity_scripts.run_with("upstream_dream", f"""
      import json
      import torch
      from trm.families.dream import hf_layout
      torch.set_num_threads(1)  # beside the other pytest worker: 2 cores
      args = ["--upstream_dir={folder}", "--checks=export", "--vocab=64",
              "--hidden=32", "--layers=1", "--prompt_len=6",
              "--new_tokens=8", "--head_scale=2", "--json={report}"]

      def run(*extra):
        code = m.main(args + list(extra))
        checks = json.load(open({report!r}))["checks"]
        print("RESULT", json.dumps([code, len(checks), sorted(
            c["name"] for c in checks if c["status"] == "FAIL")]))

      run()
      run("--perturb")
      to_hf = hf_layout.to_hf
      hf_layout.to_hf = lambda leaf, x: (
          to_hf(leaf, x).T if leaf.kind == "heads_out" else to_hf(leaf, x))
      run()""", timeout=150)
  (ok, n, failed), (perturbed, _, moved), (broken, _, transposed) = [
      json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
      if line.startswith("RESULT ")]
  assert (ok, failed) == (0, []) and n >= 10, out
  assert perturbed == 1 and "export float32: logits, full attention" in moved
  assert broken == 1 and "export: AutoModel(trust_remote_code) logits" in (
      transposed)
  assert not any("every tensor read" in name or "config.json" in name
                 for name in transposed)  # the file itself is read whole
