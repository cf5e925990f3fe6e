"""The GPU kit's `gptk` section: GPT-2's two Pallas Triton kernels alone,
each beside the XLA path it replaces, forward and backward, under each of
GPT_SETTINGS (the first is the kernels' default).

- loss: the tied LM head and the token cross-entropy of one micro-step
  ([12, 1024] positions, vocab 50304): `losses.softmax_cross_entropy` on
  `matmul_to`'s bf16 logits against `cross_entropy_gpu.linear_cross_entropy`
  (`config.loss_kernel`); the head's matmuls are the same on both sides.
- norm: a residual add and the LayerNorm after it ([12, 1024, 768]):
  `x + delta` then `kernels.layer_norm` against `norm_gpu.add_layer_norm`
  (`config.model.norm_kernel`).

Each program is jitted, run once (compile) and then timed for up to 0.5 s;
the figure is the median call. `max_rel_err` compares the kernel's outputs
and gradients with the XLA path's. The whole iteration's A/B is the gpt
section's `--gpt_variants`; this section says which kernel gives what, and
which setting of its constants is fastest (10 small programs; run.sh gives
it 45 s).
"""
from __future__ import annotations

import mixer_sweep

# Each kernel's settings of its module's CONSTANTS, the first its default
# (tests check that); `kernel_report.py --gpt` compiles the same ones.
GPT_SETTINGS = {
    "loss": [dict(rows=(1,), block=4096, warps=8, stages=2),
             dict(rows=(1,), block=2048, warps=8, stages=2),
             dict(rows=(1,), block=2048, warps=4, stages=2),
             dict(rows=(2,), block=2048, warps=8, stages=2)],
    "norm": [dict(rows=(1,), groups=8, warps=4),
             dict(rows=(2,), groups=4, warps=4),
             dict(rows=(4,), groups=4, warps=4),
             dict(rows=(4,), groups=4, warps=8)],
}


def setting_name(setting: dict) -> str:
  """rows1_block4096_...: a setting as one word, for figure names."""
  return "_".join(f"{key}{value[0] if isinstance(value, tuple) else value}"
                  for key, value in setting.items())


def shapes(smoke: bool) -> dict:
  batch, length, width, vocab = ((2, 16, 24, 300) if smoke
                                 else (12, 1024, 768, 50304))
  return dict(batch=batch, length=length, width=width, vocab=vocab)


def operands(smoke: bool) -> dict:
  """{kernel: its programs' operands}, the cotangents among them: passed,
  not closed over, which jit would embed in the program as constants."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  size = shapes(smoke)
  rows = (size["batch"], size["length"])
  wide = rows + (size["width"],)
  bf16 = jnp.bfloat16
  keys = jax.random.split(jax.random.key(0), 9)
  return {
      "loss": (jax.random.normal(keys[0], wide).astype(bf16),
               (0.02 * jax.random.normal(
                   keys[1], (size["vocab"], size["width"]))).astype(bf16),
               jax.random.randint(keys[2], rows, 0, size["vocab"]),
               jnp.full(rows, 1.0 / (rows[0] * rows[1]), jnp.float32)),
      "norm": (jax.random.normal(keys[3], wide),
               jax.random.normal(keys[4], wide).astype(bf16),
               1 + 0.1 * jax.random.normal(keys[5], (size["width"],)),
               0.1 * jax.random.normal(keys[6], (size["width"],)),
               jax.random.normal(keys[7], wide),
               jax.random.normal(keys[8], wide).astype(bf16)),
  }


def functions(interpret: bool) -> dict:
  """{kernel: (its module, its Pallas kernels' name prefix, XLA's fn, the
  kernel's fn)}; each fn takes `operands()[kernel]` and returns (outputs,
  gradients)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import kernels  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import norm_gpu  # pylint: disable=g-import-not-at-top
  from trm.nn import cross_entropy_gpu  # pylint: disable=g-import-not-at-top
  from trm.nn import linear  # pylint: disable=g-import-not-at-top
  from trm.nn import losses  # pylint: disable=g-import-not-at-top
  bf16 = jnp.dtype(jnp.bfloat16)

  def loss(token_loss):
    def fn(h, table, labels, g):
      out, pull = jax.vjp(lambda h, t: token_loss(h, t, labels), h, table)
      return out, pull(g)
    return fn

  def norm(add_and_norm):
    def fn(x, delta, scale, bias, ds, dy):
      out, pull = jax.vjp(add_and_norm, x, delta, scale, bias)
      return out, pull((ds, dy))
    return fn

  def xla_add_and_norm(x, delta, scale, bias):
    s = x + delta
    return s, kernels.layer_norm(s, scale, bias).astype(bf16)

  return {
      "loss": (cross_entropy_gpu, "lm_head",
               loss(lambda h, t, y: losses.softmax_cross_entropy(
                   linear.matmul_to(h, t.T, bf16), y)),
               loss(lambda h, t, y: cross_entropy_gpu.linear_cross_entropy(
                   h, t, y, bf16, interpret))),
      "norm": (norm_gpu, "gpt_add", norm(xla_add_and_norm),
               norm(lambda *a: norm_gpu.add_layer_norm(*a, bf16, interpret))),
  }


def section_gptk(args, rec, budget, log) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  size = shapes(args.smoke)
  programs, arrays = functions(args.smoke), operands(args.smoke)
  common = dict(dtype="bfloat16", positions=size["batch"] * size["length"],
                **size)
  log(f"gptk: {common['positions']} positions, width {size['width']}, "
      f"vocab {size['vocab']}, bfloat16"
      + (" (interpreted)" if args.smoke else ""))
  per_call = 0.2 if args.smoke else 0.5
  want, times = {}, {kernel: {} for kernel in programs}

  def run(kernel, setting=None):
    """Times XLA's program (setting None) or the kernel's under `setting`."""
    module, _, xla_fn, kernel_fn = programs[kernel]
    name = "xla" if setting is None else setting_name(setting)
    if budget.left() < (10 if setting is None else 8):
      log(f"gptk {kernel} {name}: skipped, {budget.left():.0f} s left")
      return
    if setting is not None and kernel not in want:
      return  # nothing to check it against
    try:
      # New functions each time: jit's cache is keyed on the function, and
      # the kernels read their module's CONSTANTS when they are traced.
      with mixer_sweep._constants(module, {"CONSTANTS": setting or {}}):  # pylint: disable=protected-access
        fn = jax.jit(lambda *a, f=kernel_fn if setting else xla_fn: f(*a))
        out, first, seconds = mixer_sweep._timed(fn, arrays[kernel],  # pylint: disable=protected-access
                                                 per_call)
      error = (None if setting is None
               else mixer_sweep._max_rel_err(out, want[kernel]))  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      log(f"gptk {kernel} {name}: failed ({type(e).__name__}: "
          f"{str(e)[:300]})")
      return
    meta = dict(common, first_call_s=round(first, 3))
    if setting is None:
      want[kernel] = out
      rec.figure(f"{kernel}/xla/ms", 1e3 * seconds, "ms", "ours", **meta)
      log(f"gptk {kernel} xla: {1e3 * seconds:.3f} ms (first call "
          f"{first:.1f} s)")
      return
    meta.update(constants=repr(setting),
                default=setting == GPT_SETTINGS[kernel][0])
    rec.figure(f"{kernel}/{name}/ms", 1e3 * seconds, "ms", "ours", **meta)
    rec.figure(f"{kernel}/{name}/max_rel_err", error, "fraction", "ours",
               **meta)
    log(f"gptk {kernel} {name}: {1e3 * seconds:.3f} ms, error {error:.4f} "
        f"(first call {first:.1f} s)")
    if error < 0.02:  # bf16 outputs, relative to the largest value
      times[kernel][name] = seconds

  # Both kernels' XLA paths and defaults first, then the other settings,
  # so a short budget still compares what the gpt section runs.
  for kernel in programs:
    run(kernel)
    run(kernel, GPT_SETTINGS[kernel][0])
  for kernel in programs:
    for setting in GPT_SETTINGS[kernel][1:]:
      run(kernel, setting)
  for kernel, found in times.items():
    if found:
      log(f"gptk {kernel}: fastest correct setting "
          f"{min(found, key=found.get)}")
