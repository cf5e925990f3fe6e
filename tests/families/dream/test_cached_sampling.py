"""Cached block decoding: the model half (dream_cache) and the sampler."""
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo

from trm.families.dream import cached_sampling
from trm.families.dream import sampling as ds
from trm.families.dream import model as dream
from trm.families.dream import cache as dream_cache

MASK = 60


def _model(scan_layers: bool):
  cfg = dream.DreamConfig(
      vocab_size=64, hidden_size=32, intermediate_size=64,
      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
      mask_token_id=MASK, pad_token_id=0, dtype="float32",
      scan_layers=scan_layers, remat="none")
  params = nn.meta.unbox(dream.Dream(cfg).init(
      jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"])
  return cfg, params


def _padded_batch(length=12):
  tokens = jax.random.randint(jax.random.key(1), (2, length), 0, MASK)
  mask = jnp.array([[0, 0] + [1] * (length - 2), [1] * length], bool)
  positions = jnp.where(mask, jnp.cumsum(mask, -1) - 1, 1)
  return tokens, mask, positions


# Jitted (cfg static): op-by-op dispatch of the model took a third more CPU
# time in test_encode_and_window_match_the_full_forward.
_hidden = jax.jit(lambda cfg, params, *args: dream.Dream(cfg).apply(
    {"params": params}, *args, method=dream.Dream.hidden), static_argnums=0)
_encode = jax.jit(dream_cache.encode, static_argnums=0)
_window = jax.jit(dream_cache.window, static_argnums=(0, 5))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_encode_and_window_match_the_full_forward(scan_layers):
  cfg, params = _model(scan_layers)
  tokens, mask, positions = _padded_batch()
  full = _hidden(cfg, params, tokens, mask, positions)
  hidden, (k, v) = _encode(cfg, params, tokens, mask, positions)
  assert k.shape == v.shape == (2, 2, 12, 2, 8)  # layers, B, L, KV, K
  np.testing.assert_allclose(hidden, full, atol=2e-6)
  # A window at 5 against its own fresh cache: the same rows.
  window = _window(cfg, params, tokens[:, 5:], positions[:, 5:], (k, v), 5,
                   mask)
  np.testing.assert_allclose(window, full[:, 5:], atol=2e-6)
  # A window over everything replaces every cached key and value: a cache
  # of other tokens does not matter (pad rows, which the full forward lets
  # attend nothing, are never queried by the sampler).
  other = (tokens + 7) % MASK
  _, stale = _encode(cfg, params, other, mask, positions)
  window = _window(cfg, params, tokens, positions, stale, 0, mask)
  np.testing.assert_allclose(np.asarray(window)[np.asarray(mask)],
                             np.asarray(full)[np.asarray(mask)], atol=2e-6)
  # ... while a part-window does see the stale rest (the approximation).
  part = _window(cfg, params, tokens[:, 5:], positions[:, 5:], stale, 5,
                 mask)
  assert np.abs(np.asarray(part) - np.asarray(full[:, 5:])).max() > 1e-3


def _context_free_models(vocab=64, width=16, length=64):
  """A model whose output at position i depends on i only: no cache can be
  stale, so cached decoding must give the exact sampler's tokens."""
  table = jax.random.normal(jax.random.key(2), (length, width))
  head_w = jax.random.normal(jax.random.key(3), (width, vocab)) * 4

  def hidden(params, tokens, mask, positions):
    del params, mask
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
    return table[positions]

  def head(params, h):
    del params
    return (h @ head_w).at[..., MASK].set(-1e4)  # never predict the mask

  def encode(params, tokens, mask, positions):
    return hidden(params, tokens, mask, positions), jnp.zeros((1,))

  def window(params, tokens, positions, cache, start, mask):
    del cache, start
    return hidden(params, tokens, mask, positions)

  return (ds.Denoiser(hidden, head),
          dream_cache.CachedDenoiser(encode, window, head))


_EXACT, _CACHED = _context_free_models()


def _exact_cases():
  """Every (padded, threshold, cache); four of the eight run by default,
  every pair of settings together among them: the padding (mask and
  positions) and the threshold are settled before the cache's block loop,
  which each cache runs padded and not, with and without a threshold. The
  other four are `slow` (covered pair by pair by the default ones)."""
  default = {(False, None, "prefix"), (False, 0.5, "dual"),
             (True, None, "dual"), (True, 0.5, "prefix")}
  return [pytest.param(padded, threshold, cache,
                       id=f"{padded}-{threshold}-{cache}",
                       marks=[] if (padded, threshold, cache) in default
                       else [pytest.mark.slow])
          for padded in (False, True) for threshold in (None, 0.5)
          for cache in cached_sampling.CACHES]


@pytest.mark.parametrize("padded, threshold, cache", _exact_cases())
def test_cached_decoding_equals_exact_for_a_context_free_model(
    cache, threshold, padded):
  prompt = np.array([[5, 6, 7, 8], [9, 10, 11, 12]])
  mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]]) if padded else None
  common = dict(mask_token_id=MASK, max_new_tokens=16, alg="entropy")
  # Each position's token is its favourite whatever the order of reveals:
  # 4 exact steps give the tokens of 16 (and compile in half the time).
  exact = ds.diffusion_generate(_EXACT, prompt, mask, steps=4, **common)
  cached = cached_sampling.cached_generate(
      _CACHED, prompt, mask, params=None, cache=cache, block_length=4,
      threshold=threshold, steps=8, **common)
  assert not np.any(np.asarray(cached) == MASK)
  np.testing.assert_array_equal(cached, exact)


@pytest.mark.parametrize("cache", [None, "dual"])
def test_a_vanishing_temperature_draws_the_likeliest_token(cache):
  """logits / 1e-39 overflowed (every positive logit inf, the softmax NaN),
  so the draw was token 0 everywhere; now a row that overflows is shifted
  by its largest logit first, which is greedy, on the exact and the cached
  paths (both draw through `token_draws`)."""
  prompt = np.array([[5, 6, 7, 8]])
  common = dict(mask_token_id=MASK, max_new_tokens=8, alg="entropy",
                steps=8, temperature=1e-39, top_k=None)
  if cache is None:
    got = ds.diffusion_generate(_EXACT, prompt, **common)
  else:
    got = cached_sampling.cached_generate(
        _CACHED, prompt, params=None, cache=cache, block_length=4,
        threshold=None, **common)
  # A context-free model: every position gets its favourite, predicted by
  # the hidden row of the position before it.
  rows = _EXACT.hidden(None, None, None, jnp.arange(3, 11)[None])
  favourite = np.asarray(jnp.argmax(_EXACT.head(None, rows), axis=-1))
  assert not np.any(favourite == 0)
  np.testing.assert_array_equal(np.asarray(got)[:, 4:], favourite)


def _mask_predicting_models():
  """The context-free models of `_context_free_models`, except that the
  head's favourite is <|mask|> itself at some positions (a model may
  predict it; the reference then leaves the position masked)."""
  exact, cached = _context_free_models()

  def head(params, h):
    logits = exact.head(params, h)
    return logits.at[..., MASK].set(jnp.where(h[..., 0] > 1.0, 1e4, -1e4))

  return exact._replace(head=head), cached._replace(head=head)


def run_threshold_decoding_on_a_mask_predicting_model(cache: str):
  """Prints the cached sampler's tokens and each position's favourite, a
  line starting with `cache=` (run in a subprocess: the fault this guards
  against was a loop that never ended)."""
  exact, cached = _mask_predicting_models()
  prompt = np.array([[5, 6, 7, 8]])
  got = cached_sampling.cached_generate(
      cached, prompt, params=None, mask_token_id=MASK, max_new_tokens=16,
      alg="entropy", cache=cache, block_length=4, threshold=0.9)
  # Position j is predicted by the hidden row of position j - 1.
  rows = exact.hidden(None, None, None, jnp.arange(3, 19)[None])
  favourite = jnp.argmax(exact.head(None, rows), axis=-1)
  print(f"cache={cache} " + json.dumps([np.asarray(got)[0, 4:].tolist(),
                                        np.asarray(favourite)[0].tolist()]),
        flush=True)


@pytest.fixture(scope="module")
def threshold_decoding_runs():
  """{cache: (tokens, favourites) or None where it did not end}: every
  cache in one subprocess (one interpreter start-up), each printing its
  line when it ends."""
  code = ("import test_cached_sampling as t\n"
          f"for cache in {cached_sampling.CACHES!r}:\n"
          "  t.run_threshold_decoding_on_a_mask_predicting_model(cache)\n")
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.abspath(__file__)),
       os.path.join(repo.ROOT, "tests"), repo.ROOT]))
  timeout = 120 * len(cached_sampling.CACHES)
  try:
    result = subprocess.run([sys.executable, "-c", code], env=env,
                            capture_output=True, text=True, timeout=timeout)
    stdout, crashed = result.stdout, (
        None if result.returncode == 0 else result.stderr[-3000:])
  except subprocess.TimeoutExpired as expired:
    stdout, crashed = expired.stdout or b"", None
    stdout = stdout.decode() if isinstance(stdout, bytes) else stdout
  found = {}
  for line in stdout.splitlines():
    if line.startswith("cache="):
      name, _, text = line.partition(" ")
      found[name[len("cache="):]] = json.loads(text)
  return found, crashed


@pytest.mark.parametrize("cache", cached_sampling.CACHES)
def test_threshold_decoding_ends_when_the_model_predicts_the_mask(
    threshold_decoding_runs, cache):
  """Greedy threshold decoding whose most confident token is <|mask|>
  revealed nothing, so the next step was the same step: the block loop
  never ended (as Fast-dLLM's would not). Step block_length now reveals
  what is left, as the exact sampler's last step does."""
  found, crashed = threshold_decoding_runs
  assert crashed is None, crashed
  if cache not in found:
    pytest.fail(f"cache={cache!r}, threshold=0.9: no tokens in "
                f"{120 * len(cached_sampling.CACHES)} s (its loop, or an "
                "earlier cache's in the same subprocess, never ended)")
  got, favourite = found[cache]
  # A context-free model: every position holds its favourite, <|mask|>
  # where that is the mask token (three of the 16 here).
  assert favourite.count(MASK) == 3
  assert got == favourite


@pytest.mark.parametrize("cache", cached_sampling.CACHES)
def test_threshold_and_fixed_steps_agree_where_they_coincide(cache):
  """A threshold every token passes reveals a block in its first (full)
  step, as fixed steps of one step per block do."""
  cfg, params = _model(True)
  model = dream_cache.cached_denoiser(cfg)
  prompt = np.array([[5, 6, 7, 8, 9]])
  common = dict(params=params, mask_token_id=MASK, max_new_tokens=12,
                cache=cache, block_length=4)
  one_step = cached_sampling.cached_generate(
      model, prompt, threshold=None, steps=3, **common)
  everything = cached_sampling.cached_generate(
      model, prompt, threshold=1e-30, **common)
  np.testing.assert_array_equal(one_step, everything)
  assert not np.any(np.asarray(one_step) == MASK)


def test_real_model_dual_and_prefix_fill_the_canvas_with_sampling():
  cfg, params = _model(False)
  model = dream_cache.cached_denoiser(cfg)
  prompt = np.array([[5, 6, 7, 8], [1, 2, 3, 4]])
  for cache in cached_sampling.CACHES:
    out = cached_sampling.cached_generate(
        model, prompt, params=params, mask_token_id=MASK, max_new_tokens=8,
        cache=cache, block_length=4, threshold=0.9, temperature=0.7,
        top_p=0.9, rng=jax.random.key(3))
    out = np.asarray(out)
    assert out.shape == (2, 12) and not np.any(out == MASK)
    np.testing.assert_array_equal(out[:, :4], prompt)


@pytest.mark.parametrize("kwargs, message", [
    (dict(cache="full"), "cache='full': must be one of"),
    (dict(block_length=5), "block_length=5: must divide max_new_tokens=16"),
    (dict(block_length=0), "block_length=0: must be an integer >= 1"),
    (dict(threshold=1.5), "threshold=1.5: must lie in (0, 1]"),
    (dict(threshold=0.0), "threshold=0.0"),
    (dict(threshold=None, steps=6), "steps=6: must be a multiple of the "
     "number of blocks (4"),
    (dict(threshold=None, alg="origin"), "alg='origin': cached decoding"),
    (dict(threshold=None, fast_dllm=True, alg="maskgit_plus"),
     "alg='maskgit_plus': with fast_dllm, fixed steps rank by entropy"),
    (dict(threshold=None, fast_dllm=True, steps=4),
     "steps=4: with fast_dllm, give at least 2 steps per block (8)"),
    (dict(fast_dllm=1), "fast_dllm=1: must be True or False"),
])
def test_bad_settings_name_the_argument(kwargs, message):
  settings = dict(cache="dual", block_length=4, threshold=0.9,
                  max_new_tokens=16, steps=16, alg="entropy")
  settings.update(kwargs)
  with pytest.raises(ValueError) as error:
    cached_sampling.check_cached_settings(**settings)
  assert message in str(error.value)


def test_cached_sampler_on_a_gpu_unstacks_the_layers_once_and_samples_the_same():
  """As the exact sampler: on a GPU platform the cached denoiser's `prepare`
  unstacks a scanned model's layers once per call, so neither the full
  forward of each block nor the window forwards scan the layers (XLA:GPU
  copied every layer's weights out of the stack at each of them); the
  tokens are the scanned model's. Traced on the CPU with the platform set
  as a GPU mesh sets it."""
  from trm.nn import platform as platform_lib  # pylint: disable=g-import-not-at-top
  cfg, params = _model(scan_layers=True)
  on_cpu = dream_cache.cached_denoiser(cfg)
  assert on_cpu.prepare is None
  assert dream_cache.cached_denoiser(cfg, "tpu") is on_cpu
  with platform_lib.mesh_platform("cuda"):
    on_gpu = dream_cache.cached_denoiser(cfg)
  assert on_gpu.prepare is not None
  assert on_gpu is dream_cache.cached_denoiser(cfg, "cuda")
  ids = jax.random.randint(jax.random.key(4), (2, 6), 1, MASK)
  kwargs = dict(params=params, mask_token_id=MASK, max_new_tokens=8,
                block_length=4, steps=4, threshold=None, cache="dual",
                top_k=None)

  def loops(denoiser) -> int:  # while loops in the lowered program
    return cached_sampling.lower_cached_generate(
        denoiser, jax.ShapeDtypeStruct(ids.shape, jnp.int32), None,
        **kwargs).as_text().count("stablehlo.while")

  assert loops(on_gpu) == loops(on_cpu) - 2  # no layer scans: encode, window
  scanned, unstacked = (
      cached_sampling.cached_generate(d, ids, None, rng=jax.random.key(0),
                                      **kwargs) for d in (on_cpu, on_gpu))
  np.testing.assert_array_equal(np.asarray(unstacked), np.asarray(scanned))
