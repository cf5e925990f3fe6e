r"""Forward and masked-diffusion sampling speed of a Dream / DiffuCoder config.

  python benchmarks/speed/lm_speed.py                       # configs/...:tiny, CPU
  python benchmarks/speed/lm_speed.py --config=configs/diffucoder_7b.py:1b \
      --config.model.param_dtype=bfloat16 --batch=8 --seq_len=2048 \
      --sample_batch=8 --prompt_len=256 --max_new_tokens=256   # one GPU

Random weights are initialised on the config's mesh, every array born on its
devices (`trm.core.state.init_state` with shardings from the logical axis rules),
so nothing needs a checkpoint. Two measurements, each timed after a warm-up
call (which includes compilation) and ended with `block_until_ready`:

  forward: a jitted forward (raw logits) of a [batch, seq_len] token batch,
           sharded over the data-parallel axes; tokens/s = batch * seq_len /
           seconds per call.
  sample:  `diffusion_sampling.diffusion_generate` exactly as `trm.generate`
           calls it (weights as arguments, host prompts); new tokens/s =
           sample_batch * max_new_tokens / seconds per call. Every step is a
           full forward over prompt + canvas (no KV cache).

Each output line names the devices and every setting. Model TFLOP/s use the
analytic forward FLOPs (a third of `lm_steps.train_flops_per_example`).
"""
from __future__ import annotations

import time

from absl import app, flags
from ml_collections import config_flags


def _time_calls(fn, repeats: int) -> tuple[float, float]:
  """(seconds of the first call, compilation included; mean seconds of
  `repeats` further calls)."""
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(repeats):
    out = fn()
  jax.block_until_ready(out)
  return first, (time.perf_counter() - start) / repeats


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import steps as lm_steps  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  if config.model.name != "dream":
    raise app.UsageError(f"--config: model {config.model.name!r}; this "
                         "benchmark times Dream / DiffuCoder configs.")
  batch = _BATCH.value or config.global_batch_size
  seq_len = _SEQ_LEN.value or config.seq_len
  sample_batch = _SAMPLE_BATCH.value
  steps = _STEPS.value or _MAX_NEW.value
  for name, value in (("batch", batch), ("seq_len", seq_len),
                      ("sample_batch", sample_batch),
                      ("prompt_len", _PROMPT_LEN.value),
                      ("max_new_tokens", _MAX_NEW.value), ("steps", steps),
                      ("repeats", _REPEATS.value)):
    if value < 1:
      raise app.UsageError(f"--{name}={value} must be >= 1.")
  if _PADDED.value and _PROMPT_LEN.value < 2:
    raise app.UsageError("--padded needs --prompt_len >= 2.")

  cfg = dream.DreamConfig.from_config(config.model)
  model = dream.Dream(cfg)
  ctx = mesh_lib.ShardingContext.from_config(config)
  mesh = ctx.mesh
  ways = ctx.batch_parallelism
  if batch % ways:
    raise app.UsageError(f"--batch={batch} must be a multiple of the "
                         f"data-parallel size {ways} (mesh "
                         f"{dict(mesh.shape)}).")

  def init():
    return model.init(jax.random.key(config.seed),
                      jnp.zeros((1, 1), jnp.int32))["params"]

  _, shardings = state_lib.abstract_state(init, ctx)
  params = state_lib.init_state(init, ctx, shardings)
  rows = ctx.sharding((mesh_lib.BATCH, None))
  device = jax.devices()[0]
  where = (f"{jax.device_count()} x {device.device_kind} ({device.platform});"
           f" config {flags.FLAGS['config'].serialize().split('=', 1)[1]}, "
           f"{dream.param_count(cfg):,} params {cfg.param_dtype}, "
           f"compute {cfg.dtype}; mesh {dict(mesh.shape)}")
  rng = np.random.default_rng(0)
  high = min(cfg.mask_token_id, cfg.vocab_size)  # never the mask token

  # Forward.
  host_tokens = rng.integers(0, high, (batch, seq_len)).astype(np.int32)
  tokens = jax.make_array_from_callback(host_tokens.shape, rows,
                                        lambda index: host_tokens[index])
  forward = jax.jit(lambda p, t: model.apply({"params": p}, t))
  with ctx:
    first, seconds = _time_calls(lambda: forward(params, tokens),
                                 _REPEATS.value)
  flops = lm_steps.train_flops_per_example(cfg, seq_len) // 3 * batch
  print(f"forward: {where}; batch {batch} x seq_len {seq_len}: "
        f"{batch * seq_len / seconds:.1f} tokens/s ({seconds:.4f} s per call,"
        f" mean of {_REPEATS.value}; first call with compilation {first:.1f} "
        f"s; {flops / seconds / 1e12:.2f} model TFLOP/s)", flush=True)
  del tokens

  # Sampling, as trm.generate calls it.
  ids = rng.integers(0, high, (sample_batch, _PROMPT_LEN.value)).astype(
      np.int32)
  mask = np.ones(ids.shape, bool)
  if _PADDED.value:
    # Every other prompt left-padded to half length: the padding-mask path.
    half = _PROMPT_LEN.value // 2
    ids[1::2, :half], mask[1::2, :half] = cfg.pad_token_id, False

  denoiser = dream.denoiser(cfg)  # as trm.generate: head on masked rows

  def generate():
    return diffusion_sampling.diffusion_generate(
        denoiser, ids, mask, params=params, mask_token_id=cfg.mask_token_id,
        max_new_tokens=_MAX_NEW.value, steps=steps, alg=_ALG.value,
        temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
        rng=jax.random.key(0))

  with ctx:
    first, seconds = _time_calls(generate, _REPEATS.value)
  length = _PROMPT_LEN.value + _MAX_NEW.value
  flops = (lm_steps.train_flops_per_example(cfg, length) // 3 * sample_batch
           * steps)
  new_tokens = sample_batch * _MAX_NEW.value
  print(f"sample: {where}; batch {sample_batch}, prompt {_PROMPT_LEN.value}"
        f"{' (odd rows half padding)' if _PADDED.value else ''} + "
        f"{_MAX_NEW.value} new tokens, {steps} steps, alg {_ALG.value}, "
        f"temperature {_TEMPERATURE.value:g}, top_p {_TOP_P.value}: "
        f"{new_tokens / seconds:.1f} new tokens/s ({seconds:.3f} s per call, "
        f"mean of {_REPEATS.value}; first call with compilation {first:.1f} s;"
        f" {flops / seconds / 1e12:.2f} model TFLOP/s)", flush=True)


def define_flags():
  """Defines the command-line flags; only when run as a program."""
  global _CONFIG, _BATCH, _SEQ_LEN, _SAMPLE_BATCH, _PROMPT_LEN, _MAX_NEW, \
      _STEPS, _ALG, _TEMPERATURE, _TOP_P, _PADDED, _REPEATS
  _CONFIG = config_flags.DEFINE_config_file(
      "config", "configs/diffucoder_7b.py:tiny", "Dream config file.",
      lock_config=True)
  _BATCH = flags.DEFINE_integer("batch", None, "forward: sequences per call "
                                "(default config.global_batch_size).")
  _SEQ_LEN = flags.DEFINE_integer("seq_len", None, "forward: tokens per "
                                  "sequence (default config.seq_len).")
  _SAMPLE_BATCH = flags.DEFINE_integer("sample_batch", 8,
                                       "sample: prompts per call.")
  _PROMPT_LEN = flags.DEFINE_integer("prompt_len", 256,
                                     "sample: prompt tokens.")
  _MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256,
                                  "sample: tokens generated per prompt.")
  _STEPS = flags.DEFINE_integer("steps", None, "sample: denoising steps "
                                "(default --max_new_tokens).")
  _ALG = flags.DEFINE_enum("alg", "entropy", ["origin", "maskgit_plus",
                                              "topk_margin", "entropy"],
                           "sample: reveal order.")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sample: token "
                                    "temperature (0: greedy).")
  _TOP_P = flags.DEFINE_float("top_p", None, "sample: nucleus mass.")
  _PADDED = flags.DEFINE_bool("padded", False, "sample: left-pad every "
                              "other prompt (the padding-mask program).")
  _REPEATS = flags.DEFINE_integer("repeats", 3, "Timed calls after warm-up.")


if __name__ == "__main__":
  define_flags()
  app.run(main)
