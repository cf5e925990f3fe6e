"""Dream's evaluation log-likelihood (`trm.families.dream.likelihood`,
`DiffusionLM.loglikelihood`): each Monte Carlo draw's loss equals the one
Dream's lm-eval harness computes (`_eval_target_nll_mc`, written here in
torch from its definition) on transformers' Qwen2 holding the same weights;
the estimate's mean is the exact expectation within its Monte Carlo error;
'ar_ftb' is the direct left-to-right sum. On the 8 CPU devices, mesh
2x2x2."""
import os
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
import repo

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.data.text import tokenizer as tok_lib
from trm.families.dream import hf_import
from trm.families.dream import inference
from trm.families.dream import likelihood
from trm.families.dream import model as dream

torch = pytest.importorskip("torch")
F = torch.nn.functional

MASK = 500  # configs/diffucoder_7b.py:tiny's
EPS = 1e-3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """(our DiffusionLM of configs/diffucoder_7b.py:tiny's sizes on a 2x2x2
  mesh with the byte tokenizer, transformers' Qwen2 with the same weights).
  The weights are drawn with numpy (flax's init ran 6 s here): peaked
  predictions (CE varies with the context, so a wrong position or mask
  shows), norms near 1, non-zero biases."""
  sys.path.insert(0, os.path.join(repo.ROOT, "benchmarks", "reference"))
  import dream_torch_sampler as ref  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "diffucoder_7b.py"), "tiny")
  cfg = dream.DreamConfig.from_config(config.model)
  assert cfg.mask_token_id == MASK and cfg.dtype == "float32"
  rng = np.random.default_rng(0)

  def draw(path, leaf):
    name = jax.tree_util.keystr(path)
    noise = rng.normal(size=leaf.shape).astype(np.float32)
    if "norm" in name:
      return 1 + 0.1 * noise
    return noise * (0.5 if "lm_head" in name else 0.1)

  params = jax.tree_util.tree_map_with_path(
      draw, nn.meta.unbox(dream.abstract_params(cfg)))
  directory = str(tmp_path_factory.mktemp("dream_ll"))
  hf_import.export_hf_checkpoint(params, cfg, directory, dtype="float32")
  placement = mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=2, fsdp=2, model=2)),
      config_lib.default_logical_axis_rules())
  _, shardings = placement.boxed_shardings(lambda: dream.abstract_params(cfg))
  lm = inference.DiffusionLM(
      cfg, jax.device_put(params, shardings),
      tok_lib.ByteTokenizer(mask_id=MASK), mesh=placement.mesh,
      rules=placement.rules, max_positions=64)
  return lm, ref.qwen2_from_hf_dir(directory)


def _torch_logits(model, tokens):
  """Dream's `_get_logits`: a bidirectional forward, shifted right by one
  (position 0 keeps its own row)."""
  b, l = tokens.shape
  with torch.no_grad():
    logits = model(input_ids=tokens, attention_mask=torch.ones(
        b, 1, l, l, dtype=torch.bool)).logits.float()
  return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


def _reference_draw(generator, batch, length):
  """Dream's `_forward_process` on a torch generator."""
  u0 = torch.rand(1, generator=generator, dtype=torch.float32)
  t = (u0 + torch.arange(batch).float() / batch) % 1
  p_mask = ((1 - EPS) * t + EPS)[:, None].repeat(1, length)
  masked = torch.rand((batch, length), generator=generator) < p_mask
  masked[:, 0] = False
  masked[:, -1] = False
  return masked, p_mask


def _reference_loss(model, seq, masked, p_mask, start, log_type="ftb"):
  """One round of `_eval_target_nll_mc`: only the continuation (from
  `start`; log_type 'ftb'), the context ('btf') or both ('union') keep the
  draw's masks."""
  batch = masked.shape[0]
  seq = seq[None].repeat(batch, 1)
  noisy = seq.clone()
  region = {"ftb": slice(start, None), "btf": slice(0, start),
            "union": slice(None)}[log_type]
  noisy[:, region] = torch.where(masked, MASK, seq)[:, region]
  where = noisy == MASK
  logits = _torch_logits(model, noisy)
  loss = F.cross_entropy(logits[where], seq[where], reduction="none")
  return float((loss / p_mask[where]).sum() / batch)


REQUEST = likelihood.Request(prefix=(5, 17, 99, 3), target=(42, 7, 300, 256))


def test_each_draw_equals_dreams_loss_on_the_torch_model(pair):
  lm, model = pair
  generator = torch.Generator().manual_seed(0)
  seq = torch.tensor(REQUEST.tokens, dtype=torch.long)
  draws = [_reference_draw(generator, 16, len(seq)) for _ in range(3)]
  want = [_reference_loss(model, seq, m, p, len(REQUEST.prefix))
          for m, p in draws]
  got = lm.mc_draw_losses(REQUEST, [(m.numpy(), p[:, 0].numpy())
                                    for m, p in draws])
  assert min(want) > 0
  # Padded to the default bucket (64 tokens, masked out of attention), the
  # unpadded reference's figures.
  np.testing.assert_allclose(got, want, rtol=2e-5)
  for log_type in ("btf", "union"):
    np.testing.assert_allclose(
        lm.mc_draw_losses(REQUEST, [(draws[0][0].numpy(),
                                     draws[0][1][:, 0].numpy())], log_type),
        [_reference_loss(model, seq, *draws[0], len(REQUEST.prefix),
                         log_type)], rtol=2e-5)
  # No context: 'btf' has nothing to mask and scores 0 (not -0.0).
  assert lm.loglikelihood([("", "ab")], mc_num=16, batch_size=16,
                          log_type="btf") == [(0.0, False)]
  assert str(lm.loglikelihood([("", "ab")], mc_num=16, batch_size=16,
                              log_type="btf")[0][0]) == "0.0"
  # The draw of numpy's generator is the reference's formula.
  masked, p_mask = likelihood.forward_process(np.random.default_rng(1), 4, 8,
                                              EPS)
  t = (p_mask - EPS) / (1 - EPS)
  np.testing.assert_allclose(np.sort((t - t[0]) % 1), [0, .25, .5, .75],
                             atol=1e-6)
  assert not masked[:, [0, -1]].any()


def test_the_estimate_is_the_expected_loss_within_its_error(pair):
  """The exact expectation over t and the masks (3 maskable positions: the
  7 non-empty mask sets, weighted by p^(k-1) (1-p)^(3-k), integrated over t
  by Gauss-Legendre, exact for the polynomial) from the torch model, and
  our estimate from 48 rounds of 16 draws of our generator: within 4 standard errors."""
  lm, model = pair
  request = likelihood.Request(prefix=(5, 17), target=(42, 7, 300, 256))
  seq = torch.tensor(request.tokens, dtype=torch.long)
  start, length = len(request.prefix), len(seq)
  maskable = list(range(start, length - 1))
  sets = [[j for n, j in enumerate(maskable) if k >> n & 1]
          for k in range(1, 2 ** len(maskable))]
  noisy = seq[None].repeat(len(sets), 1)
  for row, chosen in enumerate(sets):
    noisy[row, chosen] = MASK
  ce = F.cross_entropy(_torch_logits(model, noisy).transpose(1, 2),
                       seq[None].repeat(len(sets), 1), reduction="none")
  nodes, weights = np.polynomial.legendre.leggauss(8)
  p = (1 - EPS) * (nodes + 1) / 2 + EPS
  expected = 0.0
  for row, chosen in enumerate(sets):
    k, n = len(chosen), len(maskable)
    total = float(ce[row, chosen].sum())
    expected += total * np.sum(weights / 2 * p ** (k - 1) * (1 - p) ** (n - k))
  rng = np.random.default_rng(7)
  draws = [likelihood.forward_process(rng, 16, length, EPS)
           for _ in range(48)]
  losses = lm.mc_draw_losses(request, draws)
  error = np.std(losses, ddof=1) / np.sqrt(len(losses))
  assert abs(losses.mean() - expected) < 4 * error, (losses, expected)
  # loglikelihood is minus that mean, over mc_num / batch_size rounds.
  text = [("\x05\x11", "*\x07")]  # bytes 5, 17 | 42, 7 (+ end of text)
  got = lm.loglikelihood(text, mc_num=32, batch_size=16, seed=7)
  rng = np.random.default_rng(7)
  want = lm.mc_draw_losses(likelihood.Request((5, 17), (42, 7, 256)), [
      likelihood.forward_process(rng, 16, 5, EPS) for _ in range(2)])
  assert got == [(pytest.approx(-want.mean(), rel=1e-6), False)]


def test_ar_ftb_is_the_direct_sum_and_greedy_its_argmaxes(pair):
  lm, model = pair
  seq = torch.tensor(REQUEST.tokens, dtype=torch.long)
  start = len(REQUEST.prefix)
  nll, argmax = 0.0, []
  for i in range(len(REQUEST.target)):
    row = seq.clone()
    row[start + i:] = MASK
    logits = _torch_logits(model, row[None])[0, start + i]
    nll += float(F.cross_entropy(logits[None], seq[start + i][None]))
    argmax.append(int(logits.argmax()))
  got, wrong = lm.ar_nll(REQUEST, batch_size=4)
  assert got == pytest.approx(nll, rel=1e-5)
  assert wrong == sum(a != t for a, t in zip(argmax, REQUEST.target)) > 0
  # The model's own greedy continuation (each token its argmax given the
  # ones before) is greedy; one token changed is not.
  target = []
  for i in range(4):
    row = torch.tensor(REQUEST.prefix + tuple(target) + (MASK,) * (4 - i))
    target.append(int(_torch_logits(model, row[None])[0, start + i].argmax()))
  greedy = likelihood.Request(REQUEST.prefix, tuple(target))
  assert lm.ar_nll(greedy, batch_size=4)[1] == 0
  changed = likelihood.Request(REQUEST.prefix,
                               tuple(target[:2]) + ((target[2] + 1) % 500,)
                               + tuple(target[3:]))
  assert lm.ar_nll(changed, batch_size=4)[1] >= 1
  # Through loglikelihood: the byte tokenizer's text, end-of-text appended.
  text = [("".join(map(chr, REQUEST.prefix)),
           "".join(map(chr, REQUEST.target[:2])))]
  want, _ = lm.ar_nll(likelihood.Request(REQUEST.prefix,
                                         REQUEST.target[:2] + (256,)),
                      batch_size=4)
  assert lm.loglikelihood(text, nll_type="ar_ftb", batch_size=4) == [
      (pytest.approx(-want), False)]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(mc_num=100, batch_size=32), ValueError,
     "mc_num=100 is not a multiple of batch_size=32 (each round"),
    (dict(mc_num=0), ValueError, "mc_num=0: must be an integer >= 1."),
    (dict(batch_size=2.0), ValueError, "batch_size=2.0: must be an integer"),
    (dict(nll_type="ar"), ValueError, "nll_type='ar': pass one of mc, "
     "ar_ftb."),
    (dict(log_type="btf", nll_type="ar_ftb"), ValueError,
     "log_type='btf': nll_type='ar_ftb' reveals"),
    (dict(sampling_eps=1.0), ValueError, "sampling_eps=1.0: must lie in"),
    (dict(seed="0"), TypeError, "seed='0' is a str: pass an integer."),
    (dict(requests=[("a", "")]), ValueError, "requests[0]: the continuation "
     "encodes to no token"),
    (dict(requests=[("a", "b"), ("a" * 70, "b")]), ValueError,
     "requests[1]: context and continuation are 72 tokens (with the "
     "end-of-text token), more than the model's 64 positions; shorten"),
    (dict(requests=["ab"]), TypeError, "requests[0] is 'ab': each request is"
     " a (context, continuation) pair of strings."),
    (dict(requests=[]), ValueError, "requests is empty"),
    # Position 0 is never masked: the first token went unscored, and a
    # one-token choice scored 0.0 (probability 1) without a word.
    (dict(requests=[("a", "b"), ("  ", "x")]), ValueError, "requests[1]: "
     "the context encodes to no token, so the continuation's first token"),
])
def test_bad_values_are_one_line_before_any_compile(pair, kwargs, error,
                                                    message, monkeypatch):
  lm, _ = pair
  monkeypatch.setattr(lm, "_score", lambda *a, **k: pytest.fail("scored"))
  requests = kwargs.pop("requests", [("ab", "cd")])
  with pytest.raises(error) as info:
    lm.loglikelihood(requests, **kwargs)
  assert str(info.value).startswith(message), str(info.value)
  assert "\n" not in str(info.value)


@pytest.mark.parametrize("nll_type, named, fix", [
    ("mc", "mc_num=64, batch_size=64: request 0",
     "lower mc_num and batch_size"),
    ("ar_ftb", "batch_size=64: request 0", "lower batch_size"),
])
def test_draws_past_the_hosts_memory_are_one_line_before_any_draw(
    pair, nll_type, named, fix, monkeypatch):
  """--batch_size=2**31 drew its masks until the kernel's OOM killer ended
  trm.evaluate --loglikelihood with no message; here a host of 64 KiB."""
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  lm, _ = pair
  monkeypatch.setattr(array_sizes, "memory_bound",
                      lambda *_: (1 << 16, "its 0.0 GiB (memory and swap)"))
  monkeypatch.setattr(likelihood, "forward_process",
                      lambda *a, **k: pytest.fail("drawn"))
  monkeypatch.setattr(lm, "_score", lambda *a, **k: pytest.fail("scored"))
  with pytest.raises(ValueError) as info:
    lm.loglikelihood([("ab", "cd")], mc_num=64, batch_size=64,
                     nll_type=nll_type)
  message = str(info.value)
  assert message.startswith(named) and "\n" not in message, message
  assert message.endswith(f"more than its 0.0 GiB (memory and swap); {fix}.")


def test_every_rounds_rows_count_against_the_hosts_memory(monkeypatch):
  """'mc' holds the rows of every round at once (mc_draw_losses builds them
  all, then stack_rows copies them): mc_num=4096 at batch_size=1 holds
  about 3.5 MB for a 20-token request 128 wide, so a 1 MiB host refuses
  it; one batch's rows alone (86 KB) passed it."""
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(array_sizes, "memory_bound",
                      lambda *_: (1 << 20, "its 0.0 GiB (memory and swap)"))
  assert likelihood.host_memory_refusal(4096, 1, "mc", 20, 128, 0).startswith(
      "mc_num=4096, batch_size=1: ")
  # 280 KB fits.
  assert likelihood.host_memory_refusal(64, 1, "mc", 20, 128, 0) is None


def test_a_request_holding_the_mask_token_is_refused():
  """The reference finds masked positions as those holding the mask token:
  one in the text (a tokenizer parses "<|mask|>" to it) would be scored as
  masked. Refused, naming the request."""
  with pytest.raises(ValueError, match=r"^requests\[3\] holds the mask token "
                     r"\(id 500\), which the estimate cannot tell"):
    likelihood.check_request(likelihood.Request((1, MASK), (2, 256)), 3,
                             MASK, None)


# ------------------------------------------------- trm.evaluate --loglikelihood


def test_requests_file_is_read_in_order_and_bad_lines_named(tmp_path):
  path = tmp_path / "requests.jsonl"
  path.write_text('{"context": "Q: 2+2=", "continuation": " 4", "doc": 1}\r\n'
                  '\n{"context": "", "continuation": "x"}\n')
  assert likelihood.read_requests(str(path)) == [("Q: 2+2=", " 4"),
                                                 ("", "x")]
  for text, message in (
      ('{"context": "a"}\n', r"line 1: '\{\"context\": \"a\"\}' is not a "
       r"request; the file holds one JSON object per line"),
      ('\n{"context": "a", "continuation": 3}\n', r"line 2: .* is not a "
       "request"),
      ("[1]\n", r"line 1: '\[1\]' is not a request"),
      ("{nope\n", r"line 1: not JSON \(Expecting property name"),
      ("\n\n", r"holds no requests"),
  ):
    path.write_text(text)
    with pytest.raises(ValueError, match=r"^--loglikelihood=\S+ " + message):
      likelihood.read_requests(str(path))
  with pytest.raises(FileNotFoundError, match=r"nope\.jsonl: no such file"):
    likelihood.read_requests(str(tmp_path / "nope.jsonl"))
  with pytest.raises(ValueError, match=r"is not a regular file"):
    likelihood.read_requests(str(tmp_path))


def test_results_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
  """One strict JSON line per request (a non-finite figure as null), the
  settings beside; a write failing part-way leaves the earlier file."""
  import json  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / "ll.jsonl")
  likelihood.write_results(path, [(-1.5, False), (float("-inf"), True)],
                           {"mc_num": 8})
  lines = open(path).read().splitlines()
  assert [json.loads(l, parse_constant=pytest.fail) for l in lines] == [
      {"loglikelihood": -1.5, "is_greedy": False},
      {"loglikelihood": None, "is_greedy": True}]
  assert json.load(open(likelihood.settings_path(path))) == {"mc_num": 8}
  before = open(path).read()
  calls = []

  def dumps(value, **kwargs):
    calls.append(value)
    if len(calls) > 1:
      raise OSError("disk full")
    return json.JSONEncoder(**kwargs).encode(value)

  monkeypatch.setattr(json, "dumps", dumps)
  with pytest.raises(OSError):
    likelihood.write_results(path, [(-2.0, False), (-3.0, False)], {})
  monkeypatch.undo()
  assert open(path).read() == before
  assert sorted(os.listdir(tmp_path)) == ["ll.jsonl", "ll_settings.json"]


def test_flags_of_the_other_mode_are_refused():
  """--chat (or any sampling flag) with --loglikelihood, and --mc_num (or
  another estimate flag) without it, were ignored without a word."""
  from trm import evaluate  # pylint: disable=g-import-not-at-top
  evaluate.unused_flags({"checkpoint", "mc_num", "seed", "batch_size"}, True)
  evaluate.unused_flags({"checkpoint", "chat", "temperature"}, False)
  with pytest.raises(ValueError, match=r"^--chat: --loglikelihood scores "
                     "each request's context as given"):
    evaluate.unused_flags({"mc_num", "chat"}, True)
  with pytest.raises(ValueError, match=r"^--log_type: it sets "
                     "--loglikelihood's estimate; pass --loglikelihood=FILE"):
    evaluate.unused_flags({"benchmark", "log_type"}, False)
  # The Monte Carlo's own flags with the exact sum: ignored before, and
  # recorded in the settings file as if they had been used.
  evaluate.unused_flags({"nll_type", "seed", "batch_size"}, True, "ar_ftb")
  with pytest.raises(ValueError, match=r"^--mc_num: --nll_type=ar_ftb sums "
                     "the continuation's tokens exactly and draws nothing"):
    evaluate.unused_flags({"nll_type", "mc_num"}, True, "ar_ftb")


def test_results_are_appended_as_scored_and_resume_ends_as_one_run(
    pair, tmp_path, monkeypatch):
  """A killed run kept nothing (the file was written at the end); now each
  request's line is on disk when scored, --resume checks the settings,
  drops a line cut by the kill and scores only the rest: the file equals
  an uninterrupted run's."""
  import json  # pylint: disable=g-import-not-at-top
  from trm import evaluate  # pylint: disable=g-import-not-at-top
  lm, _ = pair
  requests = [("ab", "cd"), ("hello", " w")]
  # The shapes of the tests above (one compiled program for all).
  settings = dict(mc_num=16, batch_size=16, nll_type="mc", log_type="ftb",
                  sampling_eps=EPS, seed=0)
  record = dict(settings, requests_sha256=likelihood.requests_digest(
      requests), checkpoint="tiny")
  whole = str(tmp_path / "whole.jsonl")
  evaluate.score_requests(lm, requests, settings, record, whole, False)
  assert json.load(open(likelihood.settings_path(whole)))["complete"]
  out = str(tmp_path / "ll.jsonl")
  scored = []
  real = lm.loglikelihood

  def killed(pairs, **kwargs):
    if scored:
      raise KeyboardInterrupt  # the kill, after one request
    scored.append(pairs)
    return real(pairs, **kwargs)

  monkeypatch.setattr(lm, "loglikelihood", killed)
  with pytest.raises(KeyboardInterrupt):
    evaluate.score_requests(lm, requests, settings, record, out, False)
  monkeypatch.undo()
  lines = open(whole).read().splitlines(True)
  assert open(out).read() == lines[0]
  assert not json.load(open(likelihood.settings_path(out)))["complete"]
  with open(out, "a") as f:
    f.write(lines[1][:7])  # a line cut by the kill
  with pytest.raises(ValueError, match=r"^--resume: \S+ll\.jsonl was "
                     r"computed with seed 0, this run has 1: rerun with"):
    evaluate.score_requests(lm, requests, dict(settings, seed=1),
                            dict(record, seed=1), out, True)
  monkeypatch.setattr(lm, "loglikelihood", lambda pairs, **kwargs: (
      scored.append(pairs), real(pairs, **kwargs))[1])
  evaluate.score_requests(lm, requests, settings, record, out, True)
  assert scored[1:] == [[requests[1]]]  # only the rest
  assert open(out).read() == open(whole).read()
  assert json.load(open(likelihood.settings_path(out)))["complete"]
  with pytest.raises(ValueError, match=r"holds 2 results, more than the 1 "
                     "requests"):
    likelihood.resumed_lines(out, 1)
  with open(out, "a") as f:
    f.write('{"task_id": 1}\n')
  with pytest.raises(ValueError, match=r"line 3 is not a result line "
                     "written by trm.evaluate --loglikelihood"):
    likelihood.resumed_lines(out, 9)


def test_request_tokens_are_checked_before_weights_naming_the_line(
    pair, tmp_path, monkeypatch):
  """The checks (no token, too long, mask token, not UTF-8) ran after the
  weights loaded and named the request's index, which blank lines shift
  from its file line."""
  lm, _ = pair
  path = tmp_path / "requests.jsonl"
  path.write_text('{"context": "a", "continuation": "b"}\n\n'
                  '{"context": "a", "continuation": "\\ud800"}\n')
  with pytest.raises(ValueError, match=r"^--loglikelihood=\S+ line 3 "
                     r"continuation is not UTF-8 text \(lone surrogate"):
    likelihood.read_numbered_requests(str(path))
  path.write_text('\n{"context": "a", "continuation": "b"}\n\n'
                  '{"context": "a", "continuation": "' + "b" * 70 + '"}\n')
  numbered = likelihood.read_numbered_requests(str(path))
  assert [n for n, _ in numbered] == [2, 4]
  with pytest.raises(ValueError, match=r"^--loglikelihood=x line 4: context "
                     "and continuation are 72 tokens"):
    likelihood.check_file_requests(numbered, lm.tokenizer, MASK, 64, "mc",
                                   "ftb", "--loglikelihood=x")
  # from_pretrained runs them before any weight is read.
  directory = str(tmp_path / "hf")
  hf_import.export_hf_checkpoint(jax.device_get(lm.params), lm.cfg,
                                 directory, dtype="float32")
  monkeypatch.setattr(inference, "load_params",
                      lambda *a, **k: pytest.fail("weights read"))
  seen = []
  with pytest.raises(ValueError, match="line 4"):
    inference.DiffusionLM.from_pretrained(
        directory, tokenizer="bytes", before_weights=lambda tok, cfg, n: (
            seen.append(n), likelihood.check_file_requests(
                numbered, tok, cfg.mask_token_id, 64, "mc", "ftb", "f")))
  assert seen


def test_settings_file_replaces_no_input(tmp_path):
  """--loglikelihood=x_settings.json --output=x.jsonl overwrote the
  requests with the settings."""
  from trm import evaluate  # pylint: disable=g-import-not-at-top
  requests = tmp_path / "x_settings.json"
  requests.write_text('{"context": "a", "continuation": "b"}\n')
  output = str(tmp_path / "x.jsonl")
  with pytest.raises(ValueError, match=r"^--output=\S+x\.jsonl: its settings "
                     r"file \S+ is --loglikelihood=\S+: writing the settings "
                     "would replace it; pass another --output"):
    evaluate._check_settings_file(  # pylint: disable=protected-access
        likelihood.settings_path(output), output,
        {"--loglikelihood": str(requests)})
  checkpoint = tmp_path / "ckpt"
  checkpoint.mkdir()
  (checkpoint / "model_settings.json").write_text("{}")
  (checkpoint / "ll_settings.json").write_text('{"nll_type": "mc"}')
  with pytest.raises(ValueError, match=r"is a file of --checkpoint="):
    evaluate._check_settings_file(  # pylint: disable=protected-access
        str(checkpoint / "model_settings.json"), "o",
        {"--checkpoint": str(checkpoint)})
  evaluate._check_settings_file(  # pylint: disable=protected-access
      str(checkpoint / "ll_settings.json"), "o",
      {"--checkpoint": str(checkpoint)})
