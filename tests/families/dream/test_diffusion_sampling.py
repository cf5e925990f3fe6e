"""Compiled Dream sampler vs the spec's schedule and a plain numpy loop."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trm.families.dream import inference
from trm.families.dream import reveal_rules
from trm.families.dream import sampling as ds
from trm.families.dream import token_draws

V, D, MASK = 16, 8, 15   # tiny vocab; the last id is the mask token
PAD = 0
F32_MIN = np.finfo(np.float32).min


def _make_model(seed=0, max_len=64):
  """Fixed random embedding + linear head + bidirectional mean mixing."""
  r = np.random.default_rng(seed)
  emb = jnp.asarray(r.normal(size=(V, D)), jnp.float32)
  pos_emb = jnp.asarray(r.normal(size=(max_len, D)), jnp.float32)
  w = jnp.asarray(r.normal(size=(D, V)) * 2.0, jnp.float32)
  # Never predict the mask token, so "all revealed" means no mask left.
  bias = jnp.zeros((V,), jnp.float32).at[MASK].set(-30.0)

  def logits_fn(tokens, mask, positions):
    b, l = tokens.shape
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(l), (b, l))
    h = emb[tokens] + pos_emb[positions]
    m = jnp.ones((b, l), bool) if mask is None else mask
    pair = (m[:, :, None] & m[:, None, :]).astype(jnp.float32)  # [B,q,k]
    mixed = jnp.einsum("bqk,bkd->bqd", pair, h)
    mixed = mixed / jnp.maximum(pair.sum(-1, keepdims=True), 1.0)
    return (h + jnp.tanh(mixed)) @ w + bias

  return logits_fn


# ---------------------------------------------------------------- schedule


@pytest.mark.parametrize("n,steps,head,mid,tail", [
    (256, 256, 0, 1, 2), (256, 128, 1, 2, 3), (64, 16, 3, 4, 5),
    (8, 8, 0, 1, 2)])
def test_reveal_schedule_matches_spec_table(n, steps, head, mid, tail):
  s = reveal_rules.reveal_schedule(steps, n)
  assert s == [head] + [mid] * (steps - 2) + [tail]
  assert sum(s) == n


def test_timesteps_float32():
  ts = reveal_rules._timesteps(256, 1e-3)
  assert ts.dtype == np.float32 and ts[0] == 1.0
  assert ts[-1] == np.float32(1e-3) and np.all(np.diff(ts) < 0)


# ---------------------------------------------------- numpy reference loop


def _np_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_sample_tokens(logits, top_p, top_k, alg):
  """Greedy (T=0) reference sample_tokens on [N,V] float32 logits."""
  lg = logits.astype(np.float32).copy()
  if top_p is not None and top_p < 1:
    order = np.argsort(-lg, axis=-1, kind="stable")
    cum = np.cumsum(_np_softmax(np.take_along_axis(lg, order, -1)), -1)
    drop_sorted = np.zeros_like(cum, bool)
    drop_sorted[:, 1:] = (cum > top_p)[:, :-1]   # first token always kept
    drop = np.zeros_like(drop_sorted)
    np.put_along_axis(drop, order, drop_sorted, -1)
    lg[drop] = F32_MIN
  if top_k is not None:
    kth = np.sort(lg, -1)[:, -min(top_k, V)][:, None]
    lg[lg < kth] = F32_MIN
  p = _np_softmax(lg)
  conf, x0 = p.max(-1), p.argmax(-1)
  if alg == "topk_margin":
    sp = -np.sort(-p, -1)
    conf = sp[:, 0] - sp[:, 1]
  elif alg == "entropy":
    conf = (p * np.log(p + np.float32(1e-10))).sum(-1)
  return conf, x0


def _np_generate(logits_fn, ids, am, *, n_new, steps, alg, top_p=None,
                 top_k=None, eps=1e-3):
  """Straight loop over the spec (§2.2), numpy, greedy; returns x, history."""
  model = jax.jit(logits_fn)
  b, p = ids.shape
  x = np.concatenate([ids, np.full((b, n_new), MASK)], 1).astype(np.int32)
  if am is not None and (am == 0).any():
    m = np.concatenate([am.astype(bool), np.ones((b, n_new), bool)], 1)
    pos = np.cumsum(m, -1).astype(np.int32) - 1
    pos[~m] = 1
  else:
    m, pos = None, None
  ts = reveal_rules._timesteps(steps, eps)
  hist = []
  for i in range(steps):
    mask_index = x == MASK
    raw = np.asarray(model(jnp.asarray(x), None if m is None else
                           jnp.asarray(m), None if pos is None else
                           jnp.asarray(pos)))
    lg = np.concatenate([raw[:, :1], raw[:, :-1]], 1)
    conf, x0 = _np_sample_tokens(lg[mask_index], top_p, top_k, alg)
    t, s = ts[i], ts[i + 1]
    num = np.float32(mask_index.sum()) / np.float32(b)
    k = int(num * (np.float32(1) - s / t)) if i < steps - 1 else int(num)
    full = np.full(x.shape, -np.inf, np.float32)
    full[mask_index] = conf
    if k > 0:
      idx = np.argsort(-full, -1, kind="stable")[:, :k]
      x_ = np.full_like(x, MASK)
      x_[mask_index] = x0
      rows = np.arange(b)[:, None]
      x[rows, idx] = x_[rows, idx]
    hist.append(x.copy())
  return x, np.stack(hist)


def _prompts(b, p, seed=1):
  r = np.random.default_rng(seed)
  return r.integers(1, MASK, size=(b, p)).astype(np.int32)


@pytest.mark.parametrize("alg,top_p,top_k", [
    ("maskgit_plus", None, None), ("topk_margin", None, None),
    ("entropy", None, None), ("maskgit_plus", 0.7, 5),
    ("topk_margin", None, 4), ("entropy", 0.8, None)])
def test_greedy_matches_numpy_loop(alg, top_p, top_k):
  fn = _make_model()
  ids = _prompts(3, 4)
  n_new, steps = 12, 6
  want, want_h = _np_generate(fn, ids, None, n_new=n_new, steps=steps,
                              alg=alg, top_p=top_p, top_k=top_k)
  got, got_h = ds.diffusion_generate(
      fn, ids, None, mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
      alg=alg, top_p=top_p, top_k=top_k, rng=jax.random.key(0),
      return_history=True)
  np.testing.assert_array_equal(np.asarray(got_h), want_h)
  np.testing.assert_array_equal(np.asarray(got), want)
  assert not (want == MASK).any()
  np.testing.assert_array_equal(want[:, :4], ids)


@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_a_model_predicting_the_mask_token_is_sampled_as_the_reference(alg):
  """A reveal that draws <|mask|> leaves its position masked (the
  reference's rule), so the canvas holds more masked positions than the
  schedule's remainder. The steps that draw for the first masked
  positions only (`_segments`, 16 new tokens and more) dropped the others:
  some were revealed as token 0, some never (5-33 of 22-46 tokens differed
  from Dream's own loop at batch 1)."""
  base = _make_model(seed=5)

  def fn(tokens, mask, positions):  # <|mask|> is the favourite at 1 in 3
    logits = base(tokens, mask, positions)
    where = (jnp.arange(tokens.shape[1]) % 3 == 1)[None, :]
    return logits.at[..., MASK].set(jnp.where(where, 50.0, -30.0))

  ids = _prompts(1, 4)
  n_new, steps = 24, 6
  assert len(ds._segments(steps, n_new, 1e-3, alg, True)) > 1
  want, want_h = _np_generate(fn, ids, None, n_new=n_new, steps=steps,
                              alg=alg)
  got, got_h = ds.diffusion_generate(
      fn, ids, None, mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
      alg=alg, top_k=None, return_history=True)
  assert (want == MASK).sum() >= 6  # the model's own <|mask|> draws
  np.testing.assert_array_equal(np.asarray(got_h), want_h)


def test_reveals_per_step_follow_schedule():
  fn = _make_model(seed=3)
  ids = _prompts(2, 3)
  n_new, steps = 16, 8
  x, hist = ds.diffusion_generate(
      fn, ids, None, mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
      alg="entropy", rng=jax.random.key(0), return_history=True)
  masks = np.concatenate(
      [np.full((1, 2), n_new), (np.asarray(hist) == MASK).sum(-1)], 0)
  revealed = masks[:-1] - masks[1:]                       # [steps, B]
  sched = reveal_rules.reveal_schedule(steps, n_new)
  np.testing.assert_array_equal(revealed, np.array(sched)[:, None]
                                .repeat(2, 1))
  assert sched == [1, 2, 2, 2, 2, 2, 2, 3]   # != the (n, n) pattern
  assert not (np.asarray(x) == MASK).any()


def test_left_padded_batch_mask_and_positions():
  fn = _make_model(seed=5)
  seen = []

  def spy(tokens, mask, positions):
    jax.debug.callback(lambda m, q: seen.append((np.asarray(m),
                                                 np.asarray(q))),
                       mask, positions)
    return fn(tokens, mask, positions)

  p, n_new, steps = 5, 8, 4
  ids = _prompts(3, p, seed=7)
  am = np.ones((3, p), np.int32)
  am[0, :2] = 0          # prompt lengths 3, 5, 4, padded on the left
  am[2, :1] = 0
  ids[am == 0] = PAD
  got, got_h = ds.diffusion_generate(
      spy, ids, am, mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
      alg="maskgit_plus", rng=jax.random.key(0), return_history=True)
  want, want_h = _np_generate(fn, ids, am, n_new=n_new, steps=steps,
                              alg="maskgit_plus")
  np.testing.assert_array_equal(np.asarray(got_h), want_h)
  np.testing.assert_array_equal(np.asarray(got), want)
  # What the model saw: the 2-D mask extended with ones, cumsum-1 positions
  # with pads at 1.
  assert len(seen) == steps
  m_ext = np.concatenate([am, np.ones((3, n_new), np.int32)], 1).astype(bool)
  pos = np.cumsum(m_ext, -1) - 1
  pos[~m_ext] = 1
  for m, q in seen:
    np.testing.assert_array_equal(m, m_ext)
    np.testing.assert_array_equal(q, pos)
  assert pos[0, 2] == 0 and pos[0, 0] == 1 and pos[1, 0] == 0
  # Padding changes the result vs. an unmasked run (the mask is really used).
  nomask = ds.diffusion_generate(
      fn, ids, None, mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
      alg="maskgit_plus", rng=jax.random.key(0))
  assert not np.array_equal(np.asarray(nomask), want)


def test_all_ones_mask_means_no_mask():
  fn = _make_model()
  seen = []

  def spy(tokens, mask, positions):
    seen.append((mask is None, positions is None))   # at trace time
    return fn(tokens, mask, positions)

  ids = _prompts(2, 3)
  a = ds.diffusion_generate(spy, ids, np.ones_like(ids),
                            mask_token_id=MASK, max_new_tokens=4, steps=4,
                            alg="maskgit_plus")
  b = ds.diffusion_generate(fn, ids, None, mask_token_id=MASK,
                            max_new_tokens=4, steps=4, alg="maskgit_plus")
  assert seen and all(s == (True, True) for s in seen)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------ stochastic


def _revealed_counts(hist, n_new, b):
  masks = np.concatenate([np.full((1, b), n_new),
                          (np.asarray(hist) == MASK).sum(-1)], 0)
  return masks[:-1] - masks[1:]


def _check_monotone(ids, hist):
  """Prompt untouched; a revealed token never changes or re-masks."""
  h = np.asarray(hist)
  p = ids.shape[1]
  for i in range(h.shape[0]):
    np.testing.assert_array_equal(h[i, :, :p], ids)
    if i:
      kept = h[i - 1] != MASK
      np.testing.assert_array_equal(h[i][kept], h[i - 1][kept])


def test_origin_greedy():
  fn = _make_model(seed=2)
  ids = _prompts(4, 3)
  n_new, steps = 24, 8
  kw = dict(mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
            alg="origin", return_history=True)
  x, hist = ds.diffusion_generate(fn, ids, None, rng=jax.random.key(1), **kw)
  x2, hist2 = ds.diffusion_generate(fn, ids, None, rng=jax.random.key(1),
                                    **kw)
  _, hist3 = ds.diffusion_generate(fn, ids, None, rng=jax.random.key(2), **kw)
  x, hist = np.asarray(x), np.asarray(hist)
  np.testing.assert_array_equal(x, np.asarray(x2))
  np.testing.assert_array_equal(hist, np.asarray(hist2))
  assert not np.array_equal(hist, np.asarray(hist3))
  assert not (x == MASK).any()
  _check_monotone(ids, hist)
  counts = _revealed_counts(hist, n_new, 4).sum(1)       # whole batch
  assert counts.sum() == 4 * n_new and (counts >= 0).all()
  # p = 1 - s/t ~ 1/(steps - i): no step reveals nearly everything early.
  assert counts[:steps // 2].sum() < 4 * n_new * 0.8
  assert counts[:-1].sum() > 0
  # Each reveal at T=0 is the argmax of the shifted logits at that step.
  model = jax.jit(fn)
  prev = np.concatenate([ids, np.full((4, n_new), MASK)], 1)
  for i in range(steps):
    raw = np.asarray(model(jnp.asarray(prev), None, None))
    best = np.concatenate([raw[:, :1], raw[:, :-1]], 1).argmax(-1)
    new = (prev == MASK) & (hist[i] != MASK)
    np.testing.assert_array_equal(hist[i][new], best[new])
    prev = hist[i]


def test_alg_temp_gumbel_topk():
  fn = _make_model(seed=4)
  ids = _prompts(3, 4)
  n_new, steps = 16, 6
  kw = dict(mask_token_id=MASK, max_new_tokens=n_new, steps=steps,
            alg="maskgit_plus", alg_temp=0.5, return_history=True)
  x, hist = ds.diffusion_generate(fn, ids, None, rng=jax.random.key(3), **kw)
  _, hist2 = ds.diffusion_generate(fn, ids, None, rng=jax.random.key(3), **kw)
  _, hist3 = ds.diffusion_generate(fn, ids, None, rng=jax.random.key(9), **kw)
  hist = np.asarray(hist)
  np.testing.assert_array_equal(hist, np.asarray(hist2))
  assert not np.array_equal(hist, np.asarray(hist3))
  sched = reveal_rules.reveal_schedule(steps, n_new)
  np.testing.assert_array_equal(_revealed_counts(hist, n_new, 3),
                                np.array(sched)[:, None].repeat(3, 1))
  _check_monotone(ids, hist)
  assert not (np.asarray(x) == MASK).any()
  greedy = ds.diffusion_generate(fn, ids, None, mask_token_id=MASK,
                                 max_new_tokens=n_new, steps=steps,
                                 alg="maskgit_plus")
  # Sampling positions changes the order, hence (typically) the tokens.
  assert not np.array_equal(np.asarray(greedy), np.asarray(x))


def test_a_vanishing_alg_temp_reveals_the_most_confident_first():
  """entropy conf / 1e-39 overflowed to -inf at every masked position, tied
  with the revealed positions' -inf, so the reveal top-k chose revealed
  tokens again and wrote <|mask|> over them; such a row now ranks by
  confidence, as alg_temp=0 does."""
  fn = _make_model()
  ids = _prompts(2, 4)
  kw = dict(mask_token_id=MASK, max_new_tokens=8, steps=8, alg="entropy",
            rng=jax.random.key(0), return_history=True)
  _, hist = ds.diffusion_generate(fn, ids, None, alg_temp=1e-39, **kw)
  _check_monotone(ids, hist)
  _, greedy = ds.diffusion_generate(fn, ids, None, **kw)
  np.testing.assert_array_equal(hist, greedy)


def test_temperature_sampling_bf16():
  base = _make_model(seed=6)
  fn = lambda t, m, q: base(t, m, q).astype(jnp.bfloat16)  # model dtype
  ids = _prompts(2, 3)
  kw = dict(mask_token_id=MASK, max_new_tokens=10, steps=5, alg="entropy",
            temperature=0.7, top_p=0.95, top_k=8)
  a = np.asarray(ds.diffusion_generate(fn, ids, None,
                                       rng=jax.random.key(5), **kw))
  b = np.asarray(ds.diffusion_generate(fn, ids, None,
                                       rng=jax.random.key(5), **kw))
  np.testing.assert_array_equal(a, b)
  assert not (a == MASK).any() and a.shape == (2, 13)
  np.testing.assert_array_equal(a[:, :3], ids)


def test_bad_alg():
  with pytest.raises(ValueError):
    ds.diffusion_generate(_make_model(), _prompts(1, 2), None,
                          mask_token_id=MASK, max_new_tokens=2, steps=2,
                          alg="nope")


def test_split_completion():
  toks = np.array([[5, 6, 7, 2, 9], [3, 1, 1, 1, 1], [4, 4, 4, 4, 4],
                   [8, 3, 9, 9, 9]])
  assert ds.split_completion(toks, [1, 2]) == [
      [5, 6, 7], [3], [4, 4, 4, 4, 4], [8, 3, 9, 9, 9]]
  assert ds.split_completion(toks, [9]) == [
      [5, 6, 7, 2], [3, 1, 1, 1, 1], [4, 4, 4, 4, 4], [8, 3]]
  assert ds.split_completion(toks[:, :0], [1]) == [[], [], [], []]


def test_params_enter_the_loop_as_arguments():
  """logits_fn(params, ...) gives the same result, and new params need no
  recompilation (they are traced arguments, not constants)."""
  fn = _make_model()
  ids = _prompts(2, 4)
  kwargs = dict(mask_token_id=MASK, max_new_tokens=8, steps=4,
                alg="entropy", rng=jax.random.key(0))
  want = ds.diffusion_generate(fn, ids, None, **kwargs)

  def with_params(scale, tokens, mask, positions):
    return scale * fn(tokens, mask, positions)

  got = ds.diffusion_generate(with_params, ids, None, params=jnp.float32(1.0),
                              **kwargs)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  before = ds._generate._cache_size()  # pylint: disable=protected-access
  ds.diffusion_generate(with_params, ids, None, params=jnp.float32(2.0),
                        **kwargs)
  assert ds._generate._cache_size() == before  # pylint: disable=protected-access


@pytest.mark.parametrize("change, message", [
    (dict(steps=2**63 - 1), "steps=9223372036854775807: must be at most "
     "1,048,576 (each step is one call of the model)."),
    (dict(steps=2**20 + 1), "steps=1048577: must be at most 1,048,576"),
    (dict(temperature=10**400), "temperature=1000"),
    (dict(alg_temp=10**400), "alg_temp=1000"),
])
def test_settings_past_what_the_host_holds_are_one_line(change, message):
  # steps=2**63-1 built its schedule table first (an IndexError; 10**9
  # steps, gigabytes); an integer temperature of 401 digits raised
  # OverflowError in math.isfinite.
  settings = dict(max_new_tokens=12, steps=6, temperature=0.0, top_p=None,
                  top_k=None, alg="entropy", alg_temp=None, eps=1e-3)
  with pytest.raises(ValueError) as error:
    inference.check_settings(**{**settings, **change})
  assert str(error.value).startswith(message), str(error.value)[:200]
  inference.check_settings(**{**settings, "steps": 2**20})


def test_new_tokens_past_the_step_limit_name_max_new_tokens_if_steps_unset():
  # trm.generate --max_new_tokens=2**31 said "steps=2147483648: must be at
  # most 1,048,576", naming a flag that was not given.
  with pytest.raises(ValueError, match=(
      r"^max_new_tokens=2147483648: must be at most 1,048,576 while steps "
      r"is unset \(one step, one call of the model, a token\); set steps "
      r"to fewer for more tokens\.$")):
    inference.sampler_settings(max_new_tokens=2**31)
  with pytest.raises(ValueError, match=r"^steps=2147483648: must be at most"):
    inference.sampler_settings(max_new_tokens=2**31, steps=2**31)
  assert inference.sampler_settings(max_new_tokens=2**31, steps=8)[
      "steps"] == 8


# ------------------------------------------ sort-free top-k / top-p (exact)


@pytest.mark.parametrize("alg,top_p,eps", [
    ("maskgit_plus", 0.0, 1e-3), ("entropy", 0.0, 1e-3),
    ("entropy", None, 0.0), ("topk_margin", None, 1.0)])
def test_the_references_edge_settings_match_numpy_loop(alg, top_p, eps):
  """top_p=0 (the likeliest token alone) and eps at 0 or 1 (linspace(1,
  eps)'s ends: 1 reveals everything at the last step) run in the
  reference; they were refused. They are accepted (`check_settings`) and
  sample as the reference's loop."""
  inference.check_settings(max_new_tokens=12, steps=6, temperature=0.0,
                           top_p=top_p, top_k=None, alg=alg, alg_temp=None,
                           eps=eps)
  fn = _make_model()
  ids = _prompts(3, 4)
  want, want_h = _np_generate(fn, ids, None, n_new=12, steps=6, alg=alg,
                              top_p=top_p, eps=eps)
  got, got_h = ds.diffusion_generate(
      fn, ids, None, mask_token_id=MASK, max_new_tokens=12, steps=6,
      alg=alg, top_p=top_p, eps=eps, rng=jax.random.key(0),
      return_history=True)
  np.testing.assert_array_equal(np.asarray(got_h), want_h)
  np.testing.assert_array_equal(np.asarray(got), want)
  if eps == 1.0:  # nothing revealed before the last step
    assert (want_h[-2][:, 4:] == MASK).all()


def _as_dtype(x, dtype):
  """float64 `x` rounded to `dtype` (None: as it is)."""
  if dtype is None:
    return x
  return np.asarray(jnp.asarray(x, jnp.float32).astype(dtype).astype(
      jnp.float32), np.float64)


def _sorted_filter(logits, top_p, top_k, dtype=None):
  """The reference's filters with a stable descending sort (ties: lower id
  first), in numpy float64 for the mass: the kept mask. With `dtype`
  (bfloat16 logits) each probability and each running mass is rounded to
  it, as torch's softmax and cumsum of a bf16 tensor round them."""
  x = np.asarray(logits, np.float64)
  keep = np.ones(x.shape, bool)
  if top_p is not None:
    order = np.argsort(-x, axis=-1, kind="stable")
    p = np.take_along_axis(_as_dtype(_np_softmax(x), dtype), order, -1)
    before = _as_dtype(np.cumsum(p, -1) - p, dtype)
    np.put_along_axis(keep, order, before <= top_p, -1)
  if top_k is not None:
    # The reference takes the k-th of the top-p-filtered logits; top-p keeps
    # a prefix of the sorted order, so that is the k-th of `x` wherever it
    # matters (fewer than k kept: all of them are >= it anyway).
    kth = -np.sort(-x, -1)[..., top_k - 1:top_k]
    keep &= x >= kth
  return keep


@functools.partial(jax.jit, static_argnames=("top_p", "top_k"))
def _kept_both(logits, top_p, top_k):
  """Per row [R, V]: the kept set our sampler uses from the candidates, the
  one from the whole vocabulary, and whether the candidates are complete."""
  ids = jnp.broadcast_to(jnp.arange(logits.shape[-1]), logits.shape)
  log_norm = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)

  def kept(values, kth):
    keep = jnp.ones(values.shape, bool)
    if top_k:
      keep = token_draws._order_keys(values) >= kth[..., None]  # pylint: disable=protected-access
    if top_p is not None:
      keep &= token_draws._top_p_keep(values, log_norm, top_p)  # pylint: disable=protected-access
    return keep

  if not top_k:
    full = kept(logits, None)
    return (ids, full), full, jnp.ones(logits.shape[:-1], bool)
  cand, cand_ids, kth, complete = token_draws._candidates(logits, top_k)  # pylint: disable=protected-access
  return (cand_ids, kept(cand, kth)), kept(logits, kth), complete


def _kept(logits, top_p, top_k):
  """[R, V] bool: the kept set the sampler uses for each row (the candidates
  where they are complete, else, as the sampler, the whole vocabulary)."""
  (cand_ids, cand_keep), full, complete = jax.device_get(
      _kept_both(logits, top_p, top_k))
  out = np.array(full)
  for row in np.nonzero(complete)[0]:
    out[row] = False
    out[row, cand_ids[row][cand_keep[row]]] = True
  return out, complete


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("top_p,top_k", [
    (None, 1), (None, 7), (None, 50), (0.9, None),
    # Top-p alone takes the whole-vocabulary path of (0.9, None), which
    # runs by default; another mass, no other code.
    pytest.param(0.5, None, marks=pytest.mark.slow), (0.95, 50), (0.3, 5)])
def test_sort_free_filters_match_a_sorted_reference(dtype, top_p, top_k):
  rng = np.random.default_rng(0)
  # Coarse values: many ties, also at the boundaries (bf16 has few values).
  logits = np.round(rng.normal(size=(6, 5, 1000)) * 4) / 4
  logits[0, 0] = 0.0  # all equal
  logits = jnp.asarray(logits, dtype).reshape(-1, 1000)
  want = _sorted_filter(np.asarray(logits.astype(jnp.float32)), top_p, top_k,
                        None if dtype == "float32" else dtype)
  got, complete = _kept(logits, top_p, top_k)
  np.testing.assert_array_equal(got, want)
  if top_k and top_k < 16:
    # Both paths ran: the all-equal row needs the whole vocabulary (ties at
    # the boundary outside the candidate blocks), some others do not.
    assert not complete[0] and complete[1:].any()


def test_candidates_are_complete_for_continuous_logits():
  """The fast path is the common one: only an exact tie of the boundary
  value across blocks (row 28 here has its maximum twice) needs the
  fallback."""
  logits = jax.random.normal(jax.random.key(0), (64, 16384)) * 3
  # Jitted, as in the sampler (op by op: twice the CPU time).
  candidates = jax.jit(token_draws._candidates, static_argnums=1)  # pylint: disable=protected-access
  for k in (1, 50, 64):
    complete = np.asarray(candidates(logits, k)[3])
    assert complete.mean() > 0.95, (k, np.where(~complete))


def _filter_cases():
  """Every filter setting with maskgit_plus; the other confidences (computed
  by the same `_finish` after whichever filter ran) with no filter and with
  both filters and a draw by default, their top-k-only and top-p-only cases
  `slow` (the filter paths are maskgit_plus's cases here)."""
  cases = []
  for alg in ("maskgit_plus", "topk_margin", "entropy"):
    for top_p, top_k, temperature in [(None, 50, 0.0), (0.95, 50, 0.2),
                                      (0.9, None, 0.0), (None, None, 0.0)]:
      slow = alg != "maskgit_plus" and (top_p is None) != (top_k is None)
      cases.append(pytest.param(
          alg, top_p, top_k, temperature,
          id=f"{top_p}-{top_k}-{temperature}-{alg}",
          marks=[pytest.mark.slow] if slow else []))
  return cases


@pytest.mark.parametrize("alg,top_p,top_k,temperature", _filter_cases())
def test_sample_tokens_equals_full_vocabulary_softmax(alg, top_p, top_k,
                                                      temperature):
  """Confidence and greedy token equal those of a softmax over the whole
  filtered vocabulary (the candidates hold every kept entry)."""
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(3, 4, 700)) * 3, jnp.float32)
  conf, x0 = token_draws.sample_tokens(logits, jax.random.key(0),
                                       temperature=0.0, top_p=top_p,
                                       top_k=top_k, conf_kind=alg)
  keep = _sorted_filter(np.asarray(logits), top_p, top_k)
  probs = _np_softmax(np.where(keep, np.asarray(logits, np.float64), -np.inf))
  np.testing.assert_array_equal(np.asarray(x0), probs.argmax(-1))
  if alg == "maskgit_plus":
    want = probs.max(-1)
  elif alg == "topk_margin":
    top2 = -np.sort(-probs, -1)[..., :2]
    want = top2[..., 0] - top2[..., 1]
  else:
    want = np.sum(probs * np.log(probs + 1e-10), -1)
  np.testing.assert_allclose(np.asarray(conf), want, rtol=2e-5, atol=2e-6)
  if temperature > 0:  # draws stay inside the kept set
    _, drawn = token_draws.sample_tokens(logits, jax.random.key(1),
                                         temperature=temperature, top_p=top_p,
                                         top_k=top_k, conf_kind=alg)
    scaled = _sorted_filter(np.asarray(logits) / temperature, top_p, top_k)
    assert np.take_along_axis(scaled, np.asarray(drawn)[..., None], -1).all()


def _loop_hlo(top_k, top_p=None, vocab=4096):
  fn = lambda t, m, q: jnp.zeros(t.shape + (vocab,), jnp.float32)  # noqa: E731
  ids = jax.ShapeDtypeStruct((2, 8), jnp.int32)
  return ds.lower_generate(fn, ids, None, mask_token_id=vocab - 1,
                           max_new_tokens=8, steps=4, alg="entropy",
                           top_k=top_k, top_p=top_p).compile().as_text()


def _vocab_sorts(hlo_text: str, vocab: int = 4096) -> list[str]:
  """HLO instructions that sort or top-k over the vocabulary (XLA:CPU emits
  lax.top_k as a full sort inside loops and a TopK custom call outside)."""
  return [line for line in hlo_text.splitlines()
          if (" sort(" in line and f"{vocab}]" in line)
          or 'custom_call_target="TopK"' in line]


def test_no_vocabulary_sort_in_the_compiled_loop_with_top_k():
  assert not _vocab_sorts(_loop_hlo(50))
  assert not _vocab_sorts(_loop_hlo(50, top_p=0.95))
  # The check can fail: top-k by lax.top_k, in a loop and outside one.
  in_loop = jax.jit(lambda x: jax.lax.fori_loop(
      0, 2, lambda i, y: y + jax.lax.top_k(y, 50)[0][..., -1:], x)).lower(
          jax.ShapeDtypeStruct((2, 4096), jnp.float32)).compile().as_text()
  plain = jax.jit(lambda x: jax.lax.top_k(x, 50)[0]).lower(
      jax.ShapeDtypeStruct((2, 4096), jnp.float32)).compile().as_text()
  assert _vocab_sorts(in_loop) and _vocab_sorts(plain)


def test_head_only_on_the_canvas_is_token_exact():
  """A Denoiser (head applied to the canvas rows only) gives the tokens of
  the same model as a plain logits function over every position."""
  r = np.random.default_rng(3)
  emb = jnp.asarray(r.normal(size=(V, D)), jnp.float32)
  w = jnp.asarray(r.normal(size=(D, V)) * 2, jnp.float32)
  bias = jnp.zeros((V,)).at[MASK].set(-30.0)

  def hidden(params, tokens, mask, positions):
    h = params["emb"][tokens]
    return h + jnp.tanh(h.mean(1, keepdims=True))

  def head(params, h):
    return h @ params["w"] + bias

  params = {"emb": emb, "w": w}
  full = lambda p, t, m, q: head(p, hidden(p, t, m, q))  # noqa: E731
  ids = _prompts(3, 5)
  for kw in (dict(alg="entropy", top_k=None), dict(alg="topk_margin"),
             dict(alg="origin")):
    a = ds.diffusion_generate(ds.Denoiser(hidden, head), ids, None,
                              params=params, mask_token_id=MASK,
                              max_new_tokens=12, steps=6, **kw)
    b = ds.diffusion_generate(full, ids, None, params=params,
                              mask_token_id=MASK, max_new_tokens=12, steps=6,
                              **kw)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_step_is_compiled_once_whatever_the_segments():
  """The steps that draw for the first masked positions only (`_segments`)
  run in one loop that picks a draw per static size: the model's forward
  is in the program once and the LM head once per size. (A loop per
  segment held a copy of the whole step each, plus a whole-window draw as
  each smaller size's fallback: 4 forwards and 7 heads here, which
  multiplied the compile time of the top-k and top-p draws.)"""
  def hidden(params, tokens, mask, positions):  # sine: the forward's marker
    return jnp.sin(params["emb"][tokens])

  def head(params, h):  # cosine: the head's marker
    return jnp.cos(h @ params["w"])

  params = {"emb": jax.ShapeDtypeStruct((V, D), jnp.float32),
            "w": jax.ShapeDtypeStruct((D, V), jnp.float32)}
  n_new, steps = 128, 32
  sizes = len(ds._segments(steps, n_new, 1e-3, "entropy", True))
  assert sizes == 4
  for kw in (dict(top_k=50), dict(top_k=None, top_p=0.95, temperature=0.2)):
    text = ds.lower_generate(
        ds.Denoiser(hidden, head), jax.ShapeDtypeStruct((2, 5), jnp.int32),
        None, params=params, mask_token_id=MASK, max_new_tokens=n_new,
        steps=steps, alg="entropy", **kw).as_text()
    assert text.count("stablehlo.sine") == 1
    assert text.count("stablehlo.cosine") == sizes


@pytest.mark.parametrize("top_p,top_k", [(None, 5), (0.8, None)])
def test_draws_in_chunks_are_the_per_size_draws(top_p, top_k):
  """Every step's tokens of the one loop over chunks of rows equal those of
  the per-size draw: each chunk took its own rows' part of the step's
  noise (sizes 38, 19 and 9 here: chunks of 9 rows, the last one partial).
  The logits are scaled down so that the noise decides most tokens."""
  model = _make_model(seed=5)
  fn = lambda t, m, q: 0.2 * model(t, m, q)  # noqa: E731
  ids = jnp.asarray(_prompts(2, 4))
  assert [s for _, _, s in ds._segments(12, 38, 1e-3, "entropy", True)] == [
      None, 19, 9]
  kw = ds._static_kwargs(
      mask_token_id=MASK, max_new_tokens=38, steps=12, eps=1e-3,
      alg="entropy", alg_temp=None, temperature=0.8, top_p=top_p,
      top_k=top_k, use_mask=False, history=True, window=4)
  assert token_draws.rows_drawable(jax.random.key(1), (2, 45, V))
  hist = [np.asarray(ds._generate(fn, None, ids, None, jax.random.key(1),
                                  draw_in_chunks=chunks, **kw)[1])
          for chunks in (False, True)]
  np.testing.assert_array_equal(hist[1], hist[0])


@pytest.mark.parametrize("flat_row", [9, 11])
def test_rows_in_chunks_redraw_all_from_the_vocabulary_as_the_block_does(
    flat_row):
  """Top-k's candidates cannot hold a row of equal logits: `sample_tokens`
  then draws every row of its block from the whole vocabulary (other noise,
  other tokens). In chunks: every chunk too, when the row is in the block
  (9, in the last chunk of 10 rows), and none when it is beyond (11)."""
  logits = np.random.default_rng(2).normal(size=(2, 12, 64)) * 3
  logits[1, flat_row] = 0.0
  logits = jnp.asarray(logits, jnp.float32)
  key = jax.random.key(4)
  kw = dict(temperature=0.7, top_p=None, top_k=2, conf_kind="entropy")
  want = jax.jit(lambda l: token_draws.sample_tokens(l[:, :10], key, **kw))(
      logits)
  got = jax.jit(lambda l, rows: token_draws.sample_rows_in_chunks(
      l, key, rows, 4, **kw))(logits, 10)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(np.asarray(g)[:, :10], np.asarray(w))


def test_a_prompt_holding_the_mask_token_is_filled_as_the_reference_does():
  fn = _make_model(seed=4)
  ids = _prompts(2, 6)
  ids[:, 2] = MASK  # in every row: rows must hold equal mask counts
  x = np.asarray(ds.diffusion_generate(fn, ids, None, mask_token_id=MASK,
                                       max_new_tokens=6, steps=6,
                                       alg="entropy"))
  assert not (x == MASK).any()  # the prompts' mask tokens were filled too
  want, _ = _np_generate(fn, ids, None, n_new=6, steps=6, alg="entropy")
  np.testing.assert_array_equal(x, want)


def test_default_top_k_is_hugging_faces_50():
  import inspect  # pylint: disable=g-import-not-at-top
  for fn in (ds.diffusion_generate, ds.lower_generate):
    assert inspect.signature(fn).parameters["top_k"].default == 50
  # 0 and None both turn it off (one compiled program).
  vocab = 200
  r = np.random.default_rng(5)
  table = jnp.asarray(r.normal(size=(vocab,)) * 3, jnp.float32)
  fn = lambda t, m, q: jnp.broadcast_to(table, t.shape + (vocab,)) + 0.01 * t[..., None]  # noqa: E731
  ids = np.ones((1, 3), np.int32)
  kw = dict(mask_token_id=vocab - 1, max_new_tokens=4, steps=2,
            alg="entropy", temperature=1.0, rng=jax.random.key(0))
  off = [np.asarray(ds.diffusion_generate(fn, ids, None, top_k=k, **kw))
         for k in (None, 0)]
  np.testing.assert_array_equal(off[0], off[1])


@pytest.fixture(scope="module")
def reference_pair(tmp_path_factory):
  """(DreamConfig, our params, transformers' Qwen2 running the reference
  `_sample` loop (benchmarks/reference/dream_torch_sampler.py), its
  module), the same weights on both sides; built once for every case."""
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import repo  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(repo.ROOT, "benchmarks", "reference"))
  import dream_torch_sampler as ref  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  cfg = dream.DreamConfig(vocab_size=512, hidden_size=64,
                          intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          mask_token_id=511, pad_token_id=0, dtype="float32",
                          remat="none")
  init = nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(1), jnp.zeros((1, 4), jnp.int32))["params"])
  # Peaked but unsaturated predictions. With the init's near-uniform ones
  # confidences tie to within float noise (the two sides' roundings then
  # pick the order); saturated ones (x200) tie exactly, and torch.topk
  # breaks exact ties in another order than ours (lower index first).
  init["lm_head"]["kernel"] = init["lm_head"]["kernel"] * 20
  directory = str(tmp_path_factory.mktemp("dream_hf"))
  hf_import.export_hf_checkpoint(init, cfg, directory, dtype="float32")
  params = hf_import.load_hf_checkpoint(directory, cfg)
  return cfg, params, ref.qwen2_from_hf_dir(directory), ref


# Left padding (the mask and positions both sides derive from the attention
# mask) is independent of the confidence and the filters: one padded case
# runs by default, with the default settings (entropy, top_k 50); the other
# padded ones are `slow`, their algorithms covered unpadded here.
@pytest.mark.parametrize("kw, padded", [
    pytest.param(dict(alg="entropy", top_k=None), False,
                 id="False-entropy-unset"),
    pytest.param(dict(alg="entropy"), False, id="False-entropy-top_k50"),
    pytest.param(dict(alg="topk_margin", top_k=20), False,
                 id="False-margin-top_k20"),
    pytest.param(dict(alg="maskgit_plus", top_p=0.9), False,
                 id="False-maskgit-top_p"),
    pytest.param(dict(alg="entropy", top_k=None), True,
                 id="True-entropy-unset", marks=pytest.mark.slow),
    pytest.param(dict(alg="entropy"), True, id="True-entropy-top_k50"),
    pytest.param(dict(alg="topk_margin", top_k=20), True,
                 id="True-margin-top_k20", marks=pytest.mark.slow),
    pytest.param(dict(alg="maskgit_plus", top_p=0.9), True,
                 id="True-maskgit-top_p", marks=pytest.mark.slow),
])
def test_greedy_tokens_equal_the_pytorch_reference_loop(reference_pair, kw,
                                                        padded):
  """Same weights in a Dream model and in transformers' Qwen2 running the
  reference `_sample` loop (benchmarks/reference/dream_torch_sampler.py): greedy
  tokens agree exactly, also left-padded."""
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  cfg, params, model, ref = reference_pair
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 500, (3, 7)).astype(np.int32)
  mask = np.ones(ids.shape, bool)
  if padded:
    ids[1, :3], mask[1, :3] = cfg.pad_token_id, False
  common = dict(mask_token_id=cfg.mask_token_id, max_new_tokens=10, steps=5,
                **kw)
  ours = np.asarray(ds.diffusion_generate(dream.denoiser(cfg), ids, mask,
                                          params=params, **common))
  theirs = ref.diffusion_generate(model, ids, mask, top_k=kw.get("top_k", 50),
                                  **{k: v for k, v in common.items()
                                     if k != "top_k"})
  np.testing.assert_array_equal(ours, theirs)


def _numpy_filtered(logits, temperature, top_p, top_k):
  """The reference's temperature, top-p (stable descending order, keep
  while the mass before <= top_p) then top-k (>= the k-th of what top-p
  kept), softmax; float64."""
  x = logits.astype(np.float64) / temperature
  out = []
  for row in x:
    keep = np.ones(row.size, bool)
    if top_p is not None:
      p = np.exp(row - row.max())
      p /= p.sum()
      order = np.argsort(-row, kind="stable")
      before = np.cumsum(p[order]) - p[order]
      keep[:] = False
      keep[order[before <= top_p]] = True
    if top_k is not None:
      kth = np.sort(np.where(keep, row, -np.inf))[::-1][top_k - 1]
      keep &= row >= kth
    e = np.where(keep, np.exp(row - row.max()), 0.0)
    out.append(e / e.sum())
  return np.stack(out)


@pytest.mark.parametrize("top_p, top_k", [
    (0.9, None), (None, 20), (0.9, 20),
    # Both filters as (0.9, 20), top-p the tighter: the kept set is the
    # intersection whichever binds (top-k of what top-p kept), one code path.
    pytest.param(0.6, 50, marks=pytest.mark.slow)])
def test_token_probs_is_the_distribution_sample_tokens_draws_from(
    top_p, top_k):
  """token_probs (the draws parity check's view of our sampler) against
  the reference's recipe by hand, and sample_tokens' draws over many keys
  inside its support with matching frequencies."""
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 2.0, (3, 200)).astype(np.float32)
  logits[1, 5:9] = logits[1].max() + 0.5  # a tie at the top
  t = 1.3
  # Jitted, as the sampling loop runs them: op by op, the first case
  # dispatched (and compiled) each op of the filters on its own.
  filters = dict(temperature=t, top_p=top_p, top_k=top_k)
  probs = np.asarray(jax.jit(functools.partial(
      token_draws.token_probs, **filters))(jnp.asarray(logits)))
  want = _numpy_filtered(logits, t, top_p, top_k)
  np.testing.assert_array_equal(probs > 0, want > 0)
  np.testing.assert_allclose(probs, want, atol=1e-6)
  n = 4000
  _, x0 = jax.jit(functools.partial(
      token_draws.sample_tokens, conf_kind="maskgit_plus", **filters))(
          jnp.asarray(np.repeat(logits, n, axis=0)), jax.random.key(3))
  draws = np.asarray(x0).reshape(3, n)
  from scipy import stats  # pylint: disable=g-import-not-at-top
  for row in range(3):
    counts = np.bincount(draws[row], minlength=200)
    assert np.all(counts[probs[row] == 0] == 0)
    # Pearson chi-square, bins of expected count < 5 pooled: p >= 1e-6.
    expected = n * probs[row].astype(np.float64)
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    obs, exp = obs[exp > 0], exp[exp > 0]
    chi2 = ((obs - exp) ** 2 / exp).sum()
    assert stats.chi2.sf(chi2, obs.size - 1) > 1e-6


def test_bf16_filters_and_confidences_round_as_the_torch_reference():
  """bf16 logits (the 7B's compute dtype) through the PyTorch port of the
  reference's `sample_tokens` (benchmarks/reference/dream_torch_sampler.py):
  torch computes a bf16 tensor's softmax, its quotient by a Python
  temperature, top-p's running mass and the entropy's sum in float32 and
  rounds each once. Ours did them in bf16 steps (the temperature itself
  rounded to 0.30078125): half of the rows' confidences differed."""
  torch = pytest.importorskip("torch")
  import os  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import repo  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.join(repo.ROOT, "benchmarks", "reference"))
  import dream_torch_sampler as ref  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.standard_normal((48, 1024)) * rng.uniform(1, 6, (48, 1))
  theirs = torch.tensor(x, dtype=torch.float32).to(torch.bfloat16)
  ours = jnp.asarray(theirs.float().numpy()).astype(jnp.bfloat16)
  # DiffuCoder's T=0.3, top_p=0.95, with top_k 50: the quotient, top-p's
  # mass, the softmax and the entropy's terms and sum (the entropy does not
  # depend on the draw). One compiled call (an eager one takes seconds).
  # Rows 3 and 7 sit where float32 rounding (our logsumexp against torch's
  # max-and-sum) moves a probability across a bf16 rounding edge; the old
  # code differed in 24 of the 48 rows.
  want, _ = ref.sample_tokens(theirs, 0.3, top_p=0.95, top_k=50,
                              neg_entropy=True)
  got, _ = jax.jit(functools.partial(
      token_draws.sample_tokens, temperature=0.3, top_p=0.95, top_k=50,
      conf_kind="entropy"))(ours, jax.random.key(0))
  differ = np.asarray(got.astype(jnp.float32)) != want.float().numpy()
  assert differ.sum() <= 2, np.flatnonzero(differ)
