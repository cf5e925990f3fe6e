"""The GPU kit's `mixer` section: TRM's token mixer as the Pallas Triton
kernels of trm/families/trm/mlp_gpu.py, timed alone at the paper MLP-t
step's shapes against the XLA path (`layers.swiglu_residual_norm`), for
settings of each kernel's launch constants (column tile, inner chunk,
warps, pipeline stages) and layout (the orientation of its products); then
the channel MLP's kernel (trm/families/trm/channel_gpu.py) against its XLA
path the same way.

The kernels were written and compiled without a GPU. This sweep tunes
their constants within one prepared run, so no trial edits are needed on
the device: `bash benchmarks/gpu/run.sh OUT --only=mixer`. It runs only
when named. The three kernels are tuned one after the other, each with
the kernels before it at their best so far:
1. `forward`: the forward program alone, `mixer/forward/<setting>/ms`;
2. `dx` (dx and the norm's backward): the forward and backward program,
   `mixer/dx/<setting>/ms`;
3. `grad` (the weight gradients): the same program, `mixer/grad/<setting>/ms`;
4. `channel` (the channel MLP, whose 'default' is XLA's): a program with
   the step's mix of two forward passes for one forward and backward,
   `mixer/channel/<setting>/ms`.
The XLA path's are `mixer/xla/{forward,train,channel}/ms`. Each
setting's largest relative error against the XLA path (`.../max_rel_err`)
shows a fast but wrong setting as wrong; such a setting is never chosen.
With --smoke it runs tiny shapes in Pallas's interpreter on the CPU.

When the `trm` section runs after this one into the same OUT
(`--only=mixer,trm`), it compiles ours' Triton step with the constants
this sweep found fastest (`swept_setting`), so the step's figure uses
tuned constants within the same run; its figures name the settings.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import json_out  # the kit's own folder: sys.path[0] when run as a script

# Per kernel: (the constant it sets, in mlp_gpu or as OWNERS says, its
# settings as changes to the module's own constants; the first, {}, is the
# module's own). A kernel's settings are timed in this order until its
# share of the section's budget (by its number of settings) runs out.
# Every setting compiles for an H100 (offline, no GPU) without spilling
# registers, except dx's default (2.8 KB per thread, kept as the kernel
# the third run timed); `kernel_report.py` lists each one's registers,
# spills, occupancy and MMA instructions. The layouts other than 'tokens'
# (mlp_gpu's `layout`) are new since the third run. 'columns' and 'inner'
# compile to wgmma throughout where the MMA's rows (the register-made
# operand's side) number at least 64; at 32 columns or chunks of 16 they
# fall back to mma.sync, so no such setting is listed. The 'epilogue'
# settings (the SwiGLU, or its gradients, as a GEMM epilogue; cuBLAS and
# XLA for the rest) come early: the deviceless forecast puts the token
# mixer's share of the step at 18.1 ms at batch 384 with both, against
# 32.0 ms for the XLA path (BUILD_NOTES, session 40). Of the 'tokens'
# settings, those the third run timed slower or that spill were dropped.
_COLUMNS = {"layout": "columns"}
_TILES_128 = {"tiles": (128, 64, 32, 16), "warps": 8}
KERNELS = (
    ("forward", "_FORWARD", (
        ("default", {}),
        ("epi_t128_w8", dict(_TILES_128, layout="epilogue")),
        ("cols", _COLUMNS),
        ("cols_t128_w8", dict(_COLUMNS, **_TILES_128)),
        ("epi_t128_c128_w8", dict(_TILES_128, layout="epilogue", chunk=128)),
        ("cols_c32", dict(_COLUMNS, chunk=32)),
        ("cols_t128_w8_c32", dict(_COLUMNS, chunk=32, **_TILES_128)),
        ("c32", {"chunk": 32}),
        ("t32", {"tiles": (32, 16)}),
    )),
    ("dx", "_DX", (
        ("default", {}),
        ("epi_t128_w8", dict(_TILES_128, layout="epilogue")),
        ("cols_t128_w8_c32", dict(_COLUMNS, chunk=32, **_TILES_128)),
        ("epi_t64", {"layout": "epilogue", "tiles": (64, 32, 16)}),
        ("cols_t64_c32", dict(_COLUMNS, tiles=(64, 32, 16), chunk=32)),
        ("cols_t128_w8_c16", dict(_COLUMNS, chunk=16, **_TILES_128)),
        ("cols_t64_c16", dict(_COLUMNS, tiles=(64, 32, 16), chunk=16)),
        ("c16_w8", {"chunk": 16, "warps": 8}),
        ("t32_c16", {"tiles": (32, 16), "chunk": 16}),
    )),
    # Not run when dx's chosen setting is an 'epilogue' one, which does
    # the weight gradients with cuBLAS.
    ("grad", "_GRAD", (
        ("default", {}),
        ("inner_t32_w8", {"layout": "inner", "chunk": 64,
                          "tiles": (32, 16), "warps": 8}),
        ("inner_t16", {"layout": "inner", "chunk": 64, "tiles": (16,)}),
        ("c16_w8", {"chunk": 16, "warps": 8}),
        ("t128_w8", {"tiles": (128, 64, 32, 16), "warps": 8}),
    )),
    # The channel MLP (channel_gpu): 'default' is the XLA path (its figures
    # are the `xla/channel` ones, not timed twice); the others run the
    # SwiGLU as its GEMM's epilogue. Its program is the step's mix: two
    # forward passes without gradients for every one with its backward.
    # None of these spills (kernel_report.py): 106/189 registers (forward/
    # gradients) at 128 x 64 with 8 warps, 116/185 at 64 x 64 with 4.
    ("channel", "_CHANNEL", (
        ("default", {}),
        ("epi", {"layout": "epilogue"}),
        ("epi_r64_w4", {"layout": "epilogue", "rows": 64, "warps": 4}),
        ("epi_d128_s2", {"layout": "epilogue", "depth": 128, "stages": 2}),
    )),
)
# The module holding each constant: channel_gpu's, else mlp_gpu's.
OWNERS = {"_CHANNEL": "channel_gpu"}
EPS = 1e-5
# A setting whose results differ more from the XLA path's (largest error
# over the largest magnitude, per output) is wrong, not fast. bfloat16
# rounding in a different order stays near 1e-2.
MAX_REL_ERR = 0.05


@contextlib.contextmanager
def _constants(module, changes: dict):
  """`module`'s constants with `changes` ({constant: {key: value}}) merged
  in, restored on exit."""
  saved = {name: getattr(module, name) for name in changes}
  for name, change in changes.items():
    setattr(module, name, dict(saved[name], **change))
  try:
    yield
  finally:
    for name, value in saved.items():
      setattr(module, name, value)


def owner(constant: str):
  """The module of trm/families/trm that holds `constant`."""
  import importlib  # pylint: disable=g-import-not-at-top
  return importlib.import_module(
      "trm.families.trm." + OWNERS.get(constant, "mlp_gpu"))


@contextlib.contextmanager
def kernel_constants(changes: dict):
  """Each kernel constant with its `changes` ({constant: {key: value}})
  merged in, in the module that holds it; restored on exit."""
  with contextlib.ExitStack() as stack:
    for constant, change in changes.items():
      stack.enter_context(_constants(owner(constant), {constant: change}))
    yield


def _timed(fn, args, seconds: float, calls: int = 5):
  """(first call's seconds, median seconds of the later calls)."""
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  times, end = [], time.perf_counter() + seconds
  while len(times) < calls or (time.perf_counter() < end and
                               len(times) < 200):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return out, first, statistics.median(times)


def _max_rel_err(got, want) -> float:
  """The largest |got - want| over the largest |want|, per output; inf
  where an output is not finite (max() would pass over a NaN)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  worst = 0.0
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    error = float(np.abs(a - b).max() / (np.abs(b).max() or 1))
    if not np.isfinite(error):
      return float("inf")
    worst = max(worst, error)
  return worst


def _best(values: dict, kernel: str):
  """The name of `kernel`'s fastest setting in `values` (figure name after
  'mixer/' -> value) whose error is within MAX_REL_ERR; None if none."""
  best = None
  for name, _ in dict((k, s) for k, _, s in KERNELS)[kernel]:
    ms = values.get(f"{kernel}/{name}/ms")
    error = values.get(f"{kernel}/{name}/max_rel_err")
    # `not <=`: a NaN error is not within the bound.
    if ms is None or error is None or not error <= MAX_REL_ERR:
      continue
    if best is None or ms < best[0]:
      best = (ms, name)
  return None if best is None else best[1]


def _dx_does_the_weight_gradients(chosen: dict) -> bool:
  """Whether dx's chosen setting is an 'epilogue' one, which computes the
  weight gradients with cuBLAS (the grad kernel then never runs)."""
  if "dx" not in chosen:
    return False
  settings = dict(dict((k, s) for k, _, s in KERNELS)["dx"])
  return settings[chosen["dx"]].get("layout") == "epilogue"


def _changes(chosen: dict) -> dict:
  """{constant: changes} of the chosen setting of each kernel."""
  changes = {}
  for kernel, constant, settings in KERNELS:
    if kernel in chosen:
      change = dict(settings)[chosen[kernel]]
      if change:
        changes[constant] = change
  return changes


def swept_setting(figures_path: str):
  """(name, {constant: changes}) of each kernel's fastest correct
  setting in the mixer figures of `figures_path` (one JSON line per
  figure), e.g. ('forward=default dx=t64 grad=c16_w8', {...}); None where
  no setting was timed (no such file, or no mixer section in it). A kernel
  whose settings were not timed keeps the module's constants."""
  import os  # pylint: disable=g-import-not-at-top
  if not os.path.exists(figures_path):
    return None
  values = {}
  for row in json_out.read_lines(figures_path, "mixer_sweep.py"):
    if row.get("name", "").startswith("mixer/"):
      values[row["name"][len("mixer/"):]] = row["value"]
  chosen = {kernel: _best(values, kernel) for kernel, _, _ in KERNELS}
  chosen = {k: v for k, v in chosen.items() if v is not None}
  if not chosen:
    return None
  return (" ".join(f"{k}={v}" for k, v in chosen.items()), _changes(chosen))


def section_mixer(args, rec, budget, log) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.families.trm import channel_gpu  # pylint: disable=g-import-not-at-top
  from trm.families.trm import layers  # pylint: disable=g-import-not-at-top
  from trm.families.trm import mlp_gpu  # pylint: disable=g-import-not-at-top

  # The paper MLP-t step's token mixer: 97 tokens, hidden 512, inner 512.
  seq, batch, width, inter = ((13, 4, 32, 64) if args.smoke
                              else (97, args.mixer_batch, 512, 512))
  dtype = jnp.bfloat16
  keys = jax.random.split(jax.random.key(0), 4)
  x = jax.random.normal(keys[0], (seq, batch, width)).astype(dtype)
  w_in = (jax.random.normal(keys[1], (seq, 2 * inter)) / 10).astype(dtype)
  w_out = (jax.random.normal(keys[2], (inter, seq)) / 23).astype(dtype)
  dy = jax.random.normal(keys[3], (seq, batch, width)).astype(dtype)
  common = dict(dtype="bfloat16", batch=batch, seq=seq, hidden=width,
                inter=inter)
  # The channel MLP's weights, [D, 2I] and [I, D] at about LeCun's scale:
  # I = 1536 as in the paper step (64 in --smoke).
  channel_inter = 64 if args.smoke else 1536
  sizes = {"channel": dict(inter=channel_inter)}
  c_in = (jax.random.normal(keys[1], (width, 2 * channel_inter)) / 23
          ).astype(dtype)
  c_out = (jax.random.normal(keys[2], (channel_inter, width)) / 40
           ).astype(dtype)
  log(f"mixer: x [{seq}, {batch}, {width}], inner {inter}, bfloat16"
      + (" (interpreted)" if args.smoke else ""))

  def programs(mixer):
    # New functions each time: jit's cache is keyed on the function, and
    # the kernels read mlp_gpu's constants when they are traced.
    forward = jax.jit(lambda *a: mixer(*a))

    def train(x, w_in, w_out, dy):
      y, pull = jax.vjp(mixer, x, w_in, w_out)
      return (y,) + pull(dy)
    return {"forward": (forward, (x, w_in, w_out)),
            "train": (jax.jit(train), (x, w_in, w_out, dy))}

  def channel_program(channel):
    def step_mix(x, w_in, w_out, dy):
      h = channel(channel(x, w_in, w_out), w_in, w_out)
      y, pull = jax.vjp(channel, h, w_in, w_out)
      return (y,) + pull(dy)
    return jax.jit(step_mix), (x, c_in, c_out, dy)

  def xla_channel(x, w_in, w_out):
    return layers.swiglu_residual_norm(x, w_in, w_out, EPS, False)

  def triton_channel(x, w_in, w_out):
    return channel_gpu.channel_mlp(x, w_in, w_out, EPS, 1, args.smoke)

  def xla_mixer(x, w_in, w_out):
    return layers.swiglu_residual_norm(
        x.reshape(seq, -1), w_in, w_out, EPS, True).reshape(x.shape)

  def triton_mixer(x, w_in, w_out):
    return mlp_gpu.token_mixer(x, w_in, w_out, EPS, args.smoke)

  # Enough calls for a stable median of 1-5 ms calls; the compiles cost
  # more than the timing.
  per_call = 0.5 if not args.smoke else 0.2
  want, xla_times = {}, {}
  for kind, (fn, operands) in {**programs(xla_mixer),
                               "channel": channel_program(xla_channel)
                               }.items():
    out, first, seconds = _timed(fn, operands, per_call)
    want[kind] = out
    xla_times[kind] = first, seconds
    rec.figure(f"xla/{kind}/ms", 1e3 * seconds, "ms", "ours",
               first_call_s=round(first, 3),
               **dict(common, **sizes.get(kind, {})))
    log(f"mixer xla {kind}: {1e3 * seconds:.3f} ms (first call {first:.1f} s)")

  values, chosen = {}, {}
  unswept = sum(len(settings) for _, _, settings in KERNELS)
  for kernel, constant, settings in KERNELS:
    kind = {"forward": "forward", "channel": "channel"}.get(kernel, "train")
    if kernel == "grad" and _dx_does_the_weight_gradients(chosen):
      unswept -= len(settings)
      log(f"mixer grad: not swept, dx's {chosen['dx']} computes the weight "
          "gradients itself")
      continue
    # Each kernel's share of what is left, by its number of settings, so a
    # slow kernel cannot starve the later ones (what a kernel leaves unused
    # carries over); its first timed setting runs regardless. The channel's
    # XLA setting reuses the XLA figures, costs nothing and always counts:
    # without it a kernel slower than XLA's could be chosen.
    share_ends = budget.left() * (1 - len(settings) / unswept)  # left then
    unswept -= len(settings)
    timed_one = False
    for name, change in settings:
      with kernel_constants({constant: change}):
        reused = kernel == "channel" and not channel_gpu.use_kernel()
      if not reused and (budget.left() < 10 or
                         (timed_one and budget.left() < share_ends)):
        log(f"mixer {kernel} {name}: skipped, {budget.left():.0f} s left "
            "in the section")
        continue
      timed_one = timed_one or not reused
      try:
        with kernel_constants({**_changes(chosen), constant: change}):
          if reused:  # the XLA path, timed above
            out, first, seconds = want[kind], *xla_times[kind]
          else:
            fn, operands = (channel_program(triton_channel)
                            if kernel == "channel"
                            else programs(triton_mixer)[kind])
            out, first, seconds = _timed(fn, operands, per_call)
        error = _max_rel_err(out, want[kind])
      except Exception as e:  # pylint: disable=broad-except
        log(f"mixer {kernel} {name}: failed ({type(e).__name__}: "
            f"{str(e)[:300]})")
        continue
      meta = dict(common, **sizes.get(kind, {}), program=kind,
                  constants=repr(change or "module's"),
                  earlier=dict(chosen))
      rec.figure(f"{kernel}/{name}/ms", 1e3 * seconds, "ms", "ours",
                 first_call_s=round(first, 3), **meta)
      rec.figure(f"{kernel}/{name}/max_rel_err", error, "fraction", "ours",
                 **meta)
      values[f"{kernel}/{name}/ms"] = 1e3 * seconds
      values[f"{kernel}/{name}/max_rel_err"] = error
      log(f"mixer {kernel} {name}: {kind} {1e3 * seconds:.3f} ms, error "
          f"{error:.4f} (first call {first:.1f} s)")
    best = _best(values, kernel)
    if best is not None:
      chosen[kernel] = best
      log(f"mixer {kernel}: fastest correct setting {best}")
