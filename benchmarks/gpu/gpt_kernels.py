"""The GPU kit's `gptk` section: GPT-2's two Pallas Triton kernels alone,
each beside the XLA path it replaces, forward and backward, under each of
kernel_report.GPT_SETTINGS (the first is the kernels' default).

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
from kernel_report import GPT_SETTINGS


def _setting_name(setting: dict) -> str:
  return "_".join(f"{key}{value[0] if isinstance(value, tuple) else value}"
                  for key, value in setting.items())


def _programs(args):
  """{kernel: (module, XLA's fn, the kernel's fn, operands)}; each fn
  returns (outputs, gradients) for fixed cotangents."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import kernels  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import norm_gpu  # pylint: disable=g-import-not-at-top
  from trm.nn import cross_entropy_gpu  # pylint: disable=g-import-not-at-top
  from trm.nn import linear  # pylint: disable=g-import-not-at-top
  from trm.nn import losses  # pylint: disable=g-import-not-at-top

  batch, length, width, vocab = ((2, 16, 24, 300) if args.smoke
                                 else (12, 1024, 768, 50304))
  bf16 = jnp.dtype(jnp.bfloat16)
  keys = jax.random.split(jax.random.key(0), 8)
  h = jax.random.normal(keys[0], (batch, length, width)).astype(bf16)
  table = (0.02 * jax.random.normal(keys[1], (vocab, width))).astype(bf16)
  labels = jax.random.randint(keys[2], (batch, length), 0, vocab)
  g = jnp.full((batch, length), 1.0 / (batch * length), jnp.float32)
  x = jax.random.normal(keys[3], (batch, length, width))
  delta = jax.random.normal(keys[4], (batch, length, width)).astype(bf16)
  scale = 1 + 0.1 * jax.random.normal(keys[5], (width,))
  bias = 0.1 * jax.random.normal(keys[6], (width,))
  ds = jax.random.normal(keys[7], (batch, length, width))
  dy = jax.random.normal(keys[0], (batch, length, width)).astype(bf16)

  def with_gradients(fn, cotangent, *operands):
    out, pull = jax.vjp(fn, *operands)
    return out, pull(cotangent)

  def xla_loss(h, table, labels):
    return with_gradients(
        lambda h, t: losses.softmax_cross_entropy(
            linear.matmul_to(h, t.T, bf16), labels), g, h, table)

  def kernel_loss(h, table, labels):
    return with_gradients(
        lambda h, t: cross_entropy_gpu.linear_cross_entropy(
            h, t, labels, bf16, args.smoke), g, h, table)

  def xla_norm(x, delta, scale, bias):
    def fn(x, delta, scale, bias):
      s = x + delta
      return s, kernels.layer_norm(s, scale, bias).astype(bf16)
    return with_gradients(fn, (ds, dy), x, delta, scale, bias)

  def kernel_norm(x, delta, scale, bias):
    return with_gradients(
        lambda *a: norm_gpu.add_layer_norm(*a, bf16, args.smoke), (ds, dy),
        x, delta, scale, bias)

  shapes = dict(batch=batch, positions=batch * length, width=width,
                vocab=vocab)
  return shapes, {
      "loss": (cross_entropy_gpu, xla_loss, kernel_loss, (h, table, labels)),
      "norm": (norm_gpu, xla_norm, kernel_norm, (x, delta, scale, bias)),
  }


def section_gptk(args, rec, budget, log) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  shapes, programs = _programs(args)
  common = dict(dtype="bfloat16", **shapes)
  log(f"gptk: {shapes['positions']} positions, width {shapes['width']}, "
      f"vocab {shapes['vocab']}, bfloat16"
      + (" (interpreted)" if args.smoke else ""))
  per_call = 0.2 if args.smoke else 0.5
  want, times = {}, {kernel: {} for kernel in programs}

  def run(kernel, setting=None):
    """Times XLA's program (setting None) or the kernel's under `setting`."""
    module, xla_fn, kernel_fn, operands = programs[kernel]
    name = "xla" if setting is None else _setting_name(setting)
    if budget.left() < (10 if setting is None else 8):
      log(f"gptk {kernel} {name}: skipped, {budget.left():.0f} s left")
      return
    if setting is not None and kernel not in want:
      return  # nothing to check it against
    default = dict(module.CONSTANTS)
    module.CONSTANTS.update(setting or {})
    try:
      # New functions each time: jit's cache is keyed on the function, and
      # the kernels read their module's CONSTANTS when they are traced.
      fn = jax.jit(lambda *a, f=kernel_fn if setting else xla_fn: f(*a))
      out, first, seconds = mixer_sweep._timed(fn, operands, per_call)  # pylint: disable=protected-access
      error = (None if setting is None
               else mixer_sweep._max_rel_err(out, want[kernel]))  # pylint: disable=protected-access
    except Exception as e:  # pylint: disable=broad-except
      log(f"gptk {kernel} {name}: failed ({type(e).__name__}: "
          f"{str(e)[:300]})")
      return
    finally:
      module.CONSTANTS.clear()
      module.CONSTANTS.update(default)
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
