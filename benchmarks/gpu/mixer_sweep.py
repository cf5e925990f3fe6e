"""The GPU kit's `mixer` section: TRM's token mixer as the Pallas Triton
kernels of trm/families/trm/mlp_gpu.py, timed alone at the paper MLP-t
step's shapes against the XLA path (`layers.swiglu_residual_norm`), for a
few settings of the kernels' tile, chunk and warp constants.

The kernels were written and compiled without a GPU. This sweep tunes
their constants within one prepared run, so no trial edits are needed on
the device: `bash benchmarks/gpu/run.sh OUT --only=mixer`. It runs only
when named. Figures: `mixer/<setting>/forward/ms` and `.../train/ms`
(forward and backward), the XLA path's as `mixer/xla/...`, and each
setting's largest relative error against the XLA path
(`.../max_rel_err`), so that a fast but wrong setting shows as wrong.
With --smoke it runs tiny shapes in Pallas's interpreter on the CPU.

When the `trm` section runs after this one into the same OUT
(`--only=mixer,trm`), it compiles ours' Triton step with the setting this
sweep found fastest (`swept_setting`), so the step's figure uses tuned
constants within the same run; its figures name the setting.
"""
from __future__ import annotations

import contextlib
import statistics
import time

# (name, the mlp_gpu constants it changes); the first is the module's own.
# Each compiles for an H100 (offline, no GPU); a chunk of 128 does not: it
# asks for 256 KiB of shared memory, over the 227 KiB a block may use.
SETTINGS = (
    ("default", {}),
    ("tile64_warps4", {"_TILES": (64, 32, 16), "_WARPS": 4}),
    ("warps4", {"_WARPS": 4}),
    ("chunk32", {"_CHUNK": 32}),
    ("grad_chunk64_warps8", {"_GRAD_CHUNK": 64, "_GRAD_WARPS": 8}),
    ("grad_tile128_warps8", {"_GRAD_TILES": (128, 64, 32, 16),
                             "_GRAD_WARPS": 8}),
)
EPS = 1e-5
# A setting whose results differ more from the XLA path's (largest error
# over the largest magnitude, per output) is wrong, not fast. bfloat16
# rounding in a different order stays near 1e-2.
MAX_REL_ERR = 0.05


@contextlib.contextmanager
def _constants(module, changes: dict):
  saved = {name: getattr(module, name) for name in changes}
  for name, value in changes.items():
    setattr(module, name, value)
  try:
    yield
  finally:
    for name, value in saved.items():
      setattr(module, name, value)


def _timed(fn, args, seconds: float, calls: int = 5):
  """(first call's seconds, median seconds of the later calls)."""
  import jax  # pylint: disable=g-import-not-at-top
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - start
  times, end = [], time.perf_counter() + seconds
  while len(times) < calls or (time.perf_counter() < end and
                               len(times) < 50):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return out, first, statistics.median(times)


def _max_rel_err(got, want) -> float:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  worst = 0.0
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    worst = max(worst, float(np.abs(a - b).max() / (np.abs(b).max() or 1)))
  return worst


def section_mixer(args, rec, budget, log) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
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
  log(f"mixer: x [{seq}, {batch}, {width}], inner {inter}, bfloat16"
      + (" (interpreted)" if args.smoke else ""))

  def programs(mixer):
    # New functions each time: jit's cache is keyed on the function, and
    # the kernels read mlp_gpu's constants when they are traced.
    forward = jax.jit(lambda *a: mixer(*a))

    def train(x, w_in, w_out, dy):
      y, pull = jax.vjp(mixer, x, w_in, w_out)
      return (y,) + pull(dy)
    return forward, jax.jit(train)

  xla = programs(lambda x, w_in, w_out: layers.swiglu_residual_norm(
      x.reshape(seq, -1), w_in, w_out, EPS, True).reshape(x.shape))
  triton = lambda x, w_in, w_out: mlp_gpu.token_mixer(  # noqa: E731
      x, w_in, w_out, EPS, args.smoke)
  want = {}
  per_call = 2.0 if not args.smoke else 0.5
  for name, changes in (("xla", None),) + SETTINGS:
    if budget.left() < 15:
      log(f"mixer {name}: skipped, {budget.left():.0f} s left")
      continue
    try:
      with _constants(mlp_gpu, changes or {}):
        forward, train = xla if changes is None else programs(triton)
        for kind, fn, operands in (("forward", forward, (x, w_in, w_out)),
                                   ("train", train, (x, w_in, w_out, dy))):
          out, first, seconds = _timed(fn, operands, per_call)
          meta = dict(common, **{"first_call_s": round(first, 3)})
          rec.figure(f"{name}/{kind}/ms", 1e3 * seconds, "ms", "ours",
                     **meta)
          if changes is None:
            want[kind] = out
          else:
            rec.figure(f"{name}/{kind}/max_rel_err",
                       _max_rel_err(out, want[kind]), "fraction", "ours",
                       **common)
          log(f"mixer {name} {kind}: {1e3 * seconds:.3f} ms (first call "
              f"{first:.1f} s)")
    except Exception as e:  # pylint: disable=broad-except
      log(f"mixer {name}: failed ({type(e).__name__}: {str(e)[:300]})")


def swept_setting(figures_path: str):
  """(name, constants) of the setting with the fastest forward+backward in
  the mixer figures of `figures_path` (one JSON line per figure) whose
  outputs match the XLA path's within MAX_REL_ERR in both programs; None
  where no setting was timed (no such file, or no mixer section in it)."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  if not os.path.exists(figures_path):
    return None
  values = {}
  with open(figures_path) as f:
    for line in f:
      row = json.loads(line)
      if row.get("name", "").startswith("mixer/"):
        values[row["name"][len("mixer/"):]] = row["value"]
  best = None
  for name, changes in SETTINGS:
    train = values.get(f"{name}/train/ms")
    errors = [values.get(f"{name}/{kind}/max_rel_err")
              for kind in ("forward", "train")]
    if train is None or None in errors or max(errors) > MAX_REL_ERR:
      continue
    if best is None or train < best[0]:
      best = (train, name, changes)
  return None if best is None else best[1:]
