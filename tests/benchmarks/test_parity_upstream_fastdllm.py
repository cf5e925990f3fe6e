"""benchmarks/parity/upstream_fastdllm.py without Fast-dLLM's code: flag
checks (exit 2, one line naming the flag, before any heavy import), the
import of an upstream folder (stand-in files), and the script's own
machinery on a tiny random model of ours: the emulation with our rules
gives our cached sampler's tokens, with Fast-dLLM's rules it differs (the
measured difference) and gives our sampler's with `fast_dllm=True`, and `--perturb`'s weight change fails the float
checks."""
from __future__ import annotations

import os
import types

import numpy as np
import pytest

import parity_scripts

FILES = ("configuration_dream.py", "modeling_dream.py", "generation_utils.py",
         "generation_utils_block.py")


@pytest.fixture(scope="module")
def script():
  yield from parity_scripts.loaded("upstream_fastdllm")


def _run(*args):
  return parity_scripts.run("upstream_fastdllm", *args)


def _fake_upstream(root, nested=True):
  """A folder with the four files (relative imports between them)."""
  folder = os.path.join(root, "dream", "model") if nested else root
  os.makedirs(folder, exist_ok=True)
  texts = {"configuration_dream.py": "VALUE = 7\n",
           "generation_utils.py": "from .configuration_dream import VALUE\n",
           "generation_utils_block.py": "from .generation_utils import VALUE\n"
                                        "TRIPLE = 3 * VALUE\n",
           "modeling_dream.py": "from .generation_utils import VALUE\n"
                                "DOUBLE = 2 * VALUE\n"}
  for name, text in texts.items():
    with open(os.path.join(folder, name), "w") as f:
      f.write(text)
  return folder


@pytest.mark.parametrize("args, flag", [
    ((), "--upstream_dir"),
    (("--upstream_dir=/nonexistent/fastdllm",), "--upstream_dir"),
    (("--upstream_dir=.", "--checks=model,nope"), "--checks"),
    (("--upstream_dir=.", "--block_length=7"), "--block_length"),
    (("--upstream_dir=.", "--threshold=1.5"), "--threshold"),
    (("--upstream_dir=.", "--hidden=12"), "--hidden"),
    (("--upstream_dir=.", "--layers=x"), "--layers"),
    (("--upstream_dir=.", "--frobnicate=1"), "--frobnicate"),
    (("--upstream_dir=.", "--upstream_git=/nonexistent"), "--upstream_git"),
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


def test_a_folder_without_the_block_code_is_refused(tmp_path):
  folder = _fake_upstream(str(tmp_path))
  os.remove(os.path.join(folder, "generation_utils_block.py"))
  result = _run(f"--upstream_dir={tmp_path}")
  assert result.returncode == 2
  assert "--upstream_dir" in result.stderr
  assert "generation_utils_block.py" in result.stderr


def test_flags_are_checked_before_heavy_imports(tmp_path):
  _fake_upstream(str(tmp_path))
  out = parity_scripts.run_with("upstream_fastdllm", f"""
      o = m.parse_args(["--upstream_dir={tmp_path}", "--perturb",
                        "--checks=generate", "--block_length=8"])
      assert o.perturb and o.checks == ("generate",) and o.block_length == 8
      print(sorted(n for n in ("jax", "torch", "transformers")
                   if n in sys.modules))""")
  assert out.strip() == "[]"


@pytest.mark.parametrize("nested", [True, False])
def test_imports_an_upstream_folder(tmp_path, nested):
  _fake_upstream(str(tmp_path), nested)
  out = parity_scripts.run_with("upstream_fastdllm", f"""
      up = m.import_upstream({str(tmp_path)!r})
      print(up.modeling.DOUBLE, up.block.TRIPLE,
            sorted(m.upstream_files({str(tmp_path)!r})))""")
  prefix = "dream/model/" if nested else ""
  assert out.strip() == "14 21 " + str(sorted(prefix + f
                                                     for f in FILES))


def test_info_lines_are_not_scored(script):
  a = np.arange(12).reshape(2, 6)
  b = a.copy()
  b[0, 0] = 99
  check = script.info_tokens("x", a, b)
  assert check.info and check.line().endswith("INFO  (measured)")
  assert check.note == "measured" and check.tol == "-"
  assert check.values["differ"] == 1


# --------------------------------------- the machinery on a model of ours

MASK = 60


@pytest.fixture(scope="module")
def tiny(script):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  cfg = dream.DreamConfig(
      vocab_size=64, hidden_size=32, intermediate_size=64,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      mask_token_id=MASK, pad_token_id=0, dtype="float32", remat="none")
  # Jitted: one compile, not one per op (eager took 2x as long).
  params = jax.jit(lambda: nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]))()
  # Peaked predictions, so that greedy orders are far from ties.
  params["lm_head"]["kernel"] = params["lm_head"]["kernel"] * 30.0
  ours = types.SimpleNamespace(cfg=cfg, params=params)
  ids = np.asarray(jax.random.randint(jax.random.key(3), (1, 6), 1, MASK))
  return script.OursCached(ours), ids


# The emulation's switches for each side's block rules.
RULES = {False: dict(first="rule", offset=1),  # ours
         True: dict(first="position0", offset=0)}  # Fast-dLLM's


def _rules_cases():
  """(cache, threshold, fast_dllm): the 4 of 8 in the default run pair
  each cache with each threshold, each cache with each rule and each
  threshold with each rule (the rest are `slow`)."""
  default = {("prefix", None, False), ("dual", None, True),
             ("prefix", 0.5, True), ("dual", 0.5, False)}
  return [pytest.param(cache, threshold, fast_dllm,
                       marks=[] if (cache, threshold, fast_dllm) in default
                       else [pytest.mark.slow])
          for fast_dllm in (False, True)
          for cache, threshold in (("prefix", None), ("dual", None),
                                   ("prefix", 0.5), ("dual", 0.5))]


@pytest.mark.parametrize(
    "cache, threshold, fast_dllm", _rules_cases(),
    ids=lambda v: {False: "our rules", True: "fast_dllm"}.get(v, None)
    if isinstance(v, bool) else None)
def test_our_sampler_is_the_emulation_of_its_rules(script, tiny, cache,
                                                    threshold, fast_dllm):
  """Our cached sampler runs the rules the script's emulation runs: ours,
  or with `fast_dllm=True` Fast-dLLM's (which the exact check (b) holds
  equal to Fast-dLLM's own code). 16 tokens in blocks of 8, where the two
  rules pick 2-5 tokens differently on this model (the measured,
  by-design difference)."""
  oc, ids = tiny
  settings = dict(block_length=8, threshold=threshold, steps=8)
  dual = cache == "dual"
  mine = oc.generate(ids, cache=cache, new=16, fast_dllm=fast_dllm,
                     **settings)
  emu, _ = script.emulate(oc, ids, new=16, dual=dual, **RULES[fast_dllm],
                          **settings)
  check = script.compare_tokens("ours == emulation", mine, emu)
  assert check.passed, check.line()
  other, _ = script.emulate(oc, ids, new=16, dual=dual,
                            **RULES[not fast_dllm], **settings)
  assert (other[:, 6:] != MASK).all() and not np.array_equal(mine, other)


def test_emulation_reveals_the_block_start_first_with_fastdllm_rules(
    script, tiny):
  """Fast-dLLM's refresh forward commits the block's first token; with
  steps == tokens our schedule's first count is 0 (nothing revealed)."""
  oc, ids = tiny
  from trm.families.dream import reveal_rules  # pylint: disable=g-import-not-at-top
  assert reveal_rules.reveal_schedule(4, 4)[0] == 0
  # One step per block: only the refresh forward runs.
  x, forwards = script.emulate(oc, ids, new=8, block_length=4, steps=2,
                               threshold=None, dual=True, first="position0",
                               offset=0)
  assert forwards == 2
  assert (x[:, [6, 10]] != MASK).all() and (x[:, [7, 8, 9, 11]] == MASK).all()


def test_perturb_fails_the_float_checks(script, tiny):
  oc, ids = tiny
  x = np.concatenate([ids, np.full((1, 8), MASK)], 1)
  logits, kv = oc.encode(x)
  assert script.compare_arrays("same", logits, oc.encode(x)[0],
                               script.TOL).passed
  perturbed = script.OursCached(types.SimpleNamespace(
      cfg=oc.ours.cfg, params=script.perturb_params(oc.params)))
  moved, moved_kv = perturbed.encode(x)
  check = script.compare_arrays("perturbed", moved, logits, script.TOL)
  assert not check.passed and "FAIL" in check.line()
  check = script.compare_arrays("perturbed keys", np.asarray(moved_kv[0]),
                                np.asarray(kv[0]), script.TOL)
  assert not check.passed
