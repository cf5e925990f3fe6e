"""TRM's token mixer alone, forecast for an H100 without a GPU: the
forward program and the forward plus backward program that the `mixer`
sweep times, for the XLA path and for chosen layouts of mlp_gpu's kernels.

  /tmp/gpuvenv/bin/python benchmarks/gpu/mixer_forecast.py [--batch=384]

Each program is compiled as offline.py compiles (XLA:GPU's deviceless
compile, JAX's CUDA plugin in a scratch venv) and played on
`trm.forecast`'s roofline timeline, which charges a Pallas kernel its
operands' and results' bytes and the FLOPs it declares
(`offline.declared_kernel_flops`; bytes only before session 42), at the
same 0.6 of the peak as cuBLAS. Beside the third H100 run's timings of the
same programs at batch 384 (`--measured`, the sweep's figures), the XLA
path's ratio of measured to forecast time is the scale for the others'
forecasts.
"""
from __future__ import annotations

import argparse
import os
import sys

import json_out  # the kit's own folder: sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Layouts forecast beside the XLA path: {name: mixer-sweep settings, as
# offline.py's --mixer_setting takes them}.
SETTINGS = {
    "tokens (mlp_gpu's defaults)": "",
    "epilogue (forward and dx, 128 columns, 8 warps)":
        "forward=epi_t128_w8,dx=epi_t128_w8",
}


def programs(batch: int):
  """{name: {kind: compiled program text}} for the XLA path and SETTINGS."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  import offline  # pylint: disable=g-import-not-at-top
  from trm.families.trm import layers  # pylint: disable=g-import-not-at-top
  from trm.families.trm import mlp_gpu  # pylint: disable=g-import-not-at-top

  sharding = jax.sharding.SingleDeviceSharding(offline.gpu_devices("h100")[0])
  spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16,  # noqa: E731
                                            sharding=sharding)
  seq, width, inter = 97, 512, 512  # the paper MLP-t step's token mixer
  x, dy = spec((seq, batch, width)), spec((seq, batch, width))
  w_in, w_out = spec((seq, 2 * inter)), spec((inter, seq))

  def texts(mixer):
    def train(x, w_in, w_out, dy):
      y, pull = jax.vjp(mixer, x, w_in, w_out)
      return (y,) + pull(dy)
    return {"forward": jax.jit(lambda *a: mixer(*a)).lower(
                x, w_in, w_out).compile().as_text(),
            "train": jax.jit(train).lower(
                x, w_in, w_out, dy).compile().as_text()}

  def xla(x, w_in, w_out):
    return layers.swiglu_residual_norm(x.reshape(seq, -1), w_in, w_out,
                                       mixer_sweep.EPS, True).reshape(x.shape)

  def triton(x, w_in, w_out):
    return mlp_gpu.token_mixer(x, w_in, w_out, mixer_sweep.EPS, False)

  out = {"XLA path": texts(xla)}
  for name, setting in SETTINGS.items():
    with offline.mixer_constants(setting):
      out[name] = texts(triton)
  return out


def forecast_ms(batch: int) -> dict:
  """{(name, kind): forecast ms} of `programs(batch)`, each Pallas kernel
  charged its declared FLOPs."""
  import offline  # pylint: disable=g-import-not-at-top
  with offline.declared_kernel_flops() as kernel_flops:
    texts = programs(batch)
  return {(name, kind): offline.forecast(name, text, "h100", 0.6, 0,
                                         kernel_flops)["forecast_ms"]
          for name, kinds in texts.items() for kind, text in kinds.items()}


def measured_ms(path: str) -> dict:
  """The third run's sweep figures at batch 384: {(name, kind): ms}. Its
  `tile64_warps4` forward had today's forward constants; its train
  programs mixed other dx and gradient constants, so only the XLA path's
  train figure is taken."""
  want = {"mixer/xla/forward/ms": ("XLA path", "forward"),
          "mixer/xla/train/ms": ("XLA path", "train"),
          "mixer/tile64_warps4/forward/ms": ("tokens (mlp_gpu's defaults)",
                                             "forward")}
  out = {}
  for row in json_out.read_lines(path, "mixer_forecast.py", "--measured"):
    if row.get("name") in want and row.get("batch") == 384:
      out[want[row["name"]]] = row["value"]
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=384)
  p.add_argument("--measured", default=os.path.join(
      HERE, "results", "2026-11-27-h100-s39", "run1-figures.jsonl"),
                 help="a kit figures.jsonl holding the mixer sweep's figures")
  args = p.parse_args(argv)
  if args.batch < 1:  # as kernel_report.py: before the compiles
    p.error(f"--batch={args.batch}: must be a positive integer")
  for path in (REPO, HERE):
    if path not in sys.path:
      sys.path.insert(0, path)
  if not os.path.isfile(args.measured):
    raise SystemExit(f"mixer_forecast.py: --measured={args.measured}: no "
                     "such file (a kit figures.jsonl with the mixer "
                     "sweep's figures)")
  import offline  # pylint: disable=g-import-not-at-top
  offline.prepare_environment()
  # The third run timed the sweep at batch 384 only.
  measured = measured_ms(args.measured) if args.batch == 384 else {}
  print(f"token mixer alone, batch {args.batch}, H100 forecast "
        "(efficiency 0.6; Pallas kernels charged their declared FLOPs)")
  print(f"{'program':50s} {'kind':8s} {'forecast ms':>11s} "
        f"{'measured ms':>11s}")
  for (name, kind), forecast in forecast_ms(args.batch).items():
    ms = measured.get((name, kind))
    print(f"{name:50s} {kind:8s} {forecast:11.3f} "
          f"{'-' if ms is None else f'{ms:.3f}':>11s}")


if __name__ == "__main__":
  main()
