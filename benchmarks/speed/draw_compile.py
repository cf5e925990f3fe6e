r"""Compile time and run time of the token draw and of the sampler, per
top-k / top-p setting.

  taskset -c 0 python benchmarks/speed/draw_compile.py [--parts=draw,sampler]

`token_draws.sample_tokens` alone (entropy confidence) on [4, 128, 16384]
float32 logits (standard normal x 20), then `sampling.diffusion_generate`
(alg=entropy) with a random Dream of the sampler benchmark's shape (vocab
16384, hidden 256, 4 layers; batch 4, prompt 128 + 128 new tokens,
`--steps` steps). Settings: unset (greedy), top_k 50 (greedy), top_p 0.95
alone and top_p 0.95 with top_k 50 (both at temperature 0.2). One XLA
thread, to be pinned to one core with taskset. Prints per setting the
compile seconds (lower + compile, the cache empty; wall and CPU) and the
run time: the draw's median of `--calls` calls (5 at least), the
sampler's best call divided by its steps and a digest of its tokens (to
compare two trees: run this file with PYTHONPATH at either); the 1-minute
load average first. `--settings` picks some of the settings; with
`--per_size` the sampler is also compiled with the per-size draw that
platforms other than the CPU keep, and the two are called in turn.
"""
from __future__ import annotations

import hashlib
import os
import time

# One intra-op thread for XLA's CPU client, set before jax loads.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                           "--xla_cpu_multi_thread_eigen=false "
                           "intra_op_parallelism_threads=1").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # pylint: disable=wrong-import-position

_PARTS = flags.DEFINE_list("parts", ["draw", "sampler"],
                           "Which of: draw, sampler.")
_STEPS = flags.DEFINE_integer("steps", 32, "Sampler denoising steps.")
_CALLS = flags.DEFINE_integer("calls", 2, "Timed calls per setting.")
_PER_SIZE = flags.DEFINE_bool(
    "per_size", False, "Also compile the sampler with the per-size draw "
    "(`_generate(draw_in_chunks=False)`) and time both programs' calls in "
    "turn: their step-time ratio, under the same load.")
_SETTINGS = flags.DEFINE_list("settings", None, "Some of: unset, top_k, "
                              "top_p, top_p+top_k (default: all).")

SETTINGS = {
    "unset": dict(top_k=None, top_p=None, temperature=0.0),
    "top_k": dict(top_k=50, top_p=None, temperature=0.0),
    "top_p": dict(top_k=None, top_p=0.95, temperature=0.2),
    "top_p+top_k": dict(top_k=50, top_p=0.95, temperature=0.2),
}


def _settings():
  names = _SETTINGS.value or list(SETTINGS)
  unknown = sorted(set(names) - set(SETTINGS))
  if unknown:
    raise app.UsageError(f"--settings: unknown {unknown}")
  return {name: SETTINGS[name] for name in names}


def _timed(fn, *args, calls):
  """Seconds of each of `calls` calls of fn(*args), results awaited."""
  import jax  # pylint: disable=g-import-not-at-top
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return times


def _compiled(lower):
  """(lower().compile(), its wall seconds, its CPU seconds: the steadier
  figure on a shared host)."""
  start, cpu = time.perf_counter(), time.process_time()
  compiled = lower().compile()
  return (compiled, time.perf_counter() - start,
          time.process_time() - cpu)


def _draws(calls):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.families.dream import token_draws  # pylint: disable=g-import-not-at-top

  logits = jnp.asarray(np.random.default_rng(0).standard_normal(
      (4, 128, 16384)).astype(np.float32) * 20)
  key = jax.random.key(0)
  for name, setting in _settings().items():
    draw = jax.jit(lambda l, k, s=setting: token_draws.sample_tokens(
        l, k, conf_kind="entropy", **s))
    compiled, seconds, cpu = _compiled(lambda d=draw: d.lower(logits, key))
    ms = 1e3 * float(np.median(_timed(compiled, logits, key, calls=calls)))
    print(f"draw {name}: compile {seconds:.2f} s ({cpu:.2f} s CPU), run "
          f"{ms:.1f} ms", flush=True)


def _sampler(steps, calls):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sampling  # pylint: disable=g-import-not-at-top

  import dream_random  # pylint: disable=g-import-not-at-top  # beside this file

  # Peaked predictions, as the sampler benchmark's (its --head_scale).
  cfg, params = dream_random.random_dream(20.0)
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 16383, (4, 128)),
                    jnp.int32)
  denoiser = dream.denoiser(cfg)
  for name, setting in _settings().items():
    compiled, seconds, cpu = _compiled(lambda s=setting: (
        sampling.lower_generate(
            denoiser, jax.ShapeDtypeStruct(ids.shape, jnp.int32), None,
            params=params, mask_token_id=cfg.mask_token_id,
            max_new_tokens=128, steps=steps, alg="entropy", **s)))
    best = min(_timed(compiled, params, ids, None, jax.random.key(0),
                      calls=calls))
    tokens = np.asarray(compiled(params, ids, None, jax.random.key(0)))
    digest = hashlib.sha1(tokens.astype("<i4").tobytes()).hexdigest()[:12]
    print(f"sampler {name}: compile {seconds:.2f} s ({cpu:.2f} s CPU), run "
          f"{1e3 * best / steps:.1f} ms/step, tokens {digest}", flush=True)
    if _PER_SIZE.value:
      kw = sampling._static_kwargs(  # pylint: disable=protected-access
          mask_token_id=cfg.mask_token_id, max_new_tokens=128, steps=steps,
          eps=1e-3, alg="entropy", alg_temp=None, use_mask=False,
          history=False, window=ids.shape[1], **setting)
      generate = sampling._generate  # pylint: disable=protected-access
      per_size, seconds, _ = _compiled(lambda kw=kw: generate.lower(
          denoiser, params, ids, None, jax.random.key(0),
          draw_in_chunks=False, **kw))
      pairs = [(_timed(per_size, params, ids, None, jax.random.key(0),
                       calls=1)[0],
                _timed(compiled, params, ids, None, jax.random.key(0),
                       calls=1)[0]) for _ in range(calls)]
      print(f"  per-size draw: compile {seconds:.2f} s, run "
            f"{1e3 * min(p for p, _ in pairs) / steps:.1f} ms/step; calls "
            "in turn, the chunked draw's time / the per-size draw's: "
            + ", ".join(f"{c / p:.3f}" for p, c in pairs), flush=True)


def main(argv):
  del argv
  print(f"load {os.getloadavg()[0]:.2f}", flush=True)
  if "draw" in _PARTS.value:
    _draws(max(_CALLS.value, 5))
  if "sampler" in _PARTS.value:
    _sampler(_STEPS.value, _CALLS.value)


if __name__ == "__main__":
  app.run(main)
