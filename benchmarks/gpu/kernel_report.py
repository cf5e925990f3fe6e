"""Registers, spills, shared memory and occupancy of ours' Pallas Triton
kernels on an H100, for every setting of the `mixer` sweep (TRM's token
mixer and channel MLP), or with --gpt of GPT-2's, without a GPU.

  python3 benchmarks/gpu/kernel_report.py [--batch=384] [--json=OUT]

Each setting's program (the token mixer's forward, or its forward and
backward) is compiled for an H100 as offline.py compiles (XLA:GPU's
deviceless compile; JAX's CUDA plugin in a scratch venv, see offline.py),
with XLA's dump on. The kernel's PTX goes through `ptxas -v` (the plugin's
CUDA wheels ship it) for its registers and spill bytes, and the dump's
thunk sequence gives its grid, threads and shared memory. From those, the
resident blocks per SM follow from the H100's limits (65,536 registers,
228 KiB of shared memory, 64 warps, 32 blocks per SM).

It also counts instructions in each kernel's PTX: Hopper's wgmma, the
older mma.sync that Triton falls back to, and stores to shared memory
(mlp_gpu's `layout`).

Why: on the H100 (2026-11-27) every token-mixer kernel ran at 255
registers and 6-12% occupancy (the trace's kernel details), and the sweep
could time only 3 of its settings. This report shows, before any device
time, which settings spill and how many warps each SM can hold, so the
sweep's settings are chosen among those that do not spill.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import json_out  # the kit's own folder: sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# One H100 SM (sm_90): CUDA's occupancy limits.
SM_REGISTERS = 65536
SM_SHARED = 228 * 1024       # bytes per SM
BLOCK_SHARED_RESERVED = 1024  # bytes the runtime reserves per block
SM_WARPS = 64
SM_BLOCKS = 32
SMS = 132
REGISTER_GRANULE = 256        # registers are allocated per warp in these


@dataclasses.dataclass
class Kernel:
  name: str
  registers: int
  spill_stores: int
  spill_loads: int
  threads: int
  shared: int
  grid: int
  wgmma: int = 0      # Hopper's warpgroup MMA instructions in the PTX
  mma_sync: int = 0   # the older warp-level MMAs (Ampere's)
  st_shared: int = 0  # stores from registers to shared memory

  def blocks_per_sm(self) -> int:
    warps = -(-self.threads // 32)
    per_warp = -(-self.registers * 32 // REGISTER_GRANULE) * REGISTER_GRANULE
    by_registers = SM_REGISTERS // (per_warp * warps)
    by_shared = SM_SHARED // (self.shared + BLOCK_SHARED_RESERVED)
    return max(0, min(by_registers, by_shared, SM_WARPS // warps, SM_BLOCKS))

  def occupancy(self) -> float:
    """Resident warps over the SM's 64."""
    return self.blocks_per_sm() * -(-self.threads // 32) / SM_WARPS

  def waves(self) -> float:
    blocks = self.blocks_per_sm()
    return self.grid / (blocks * SMS) if blocks else float("inf")


def parse_ptxas(text: str) -> dict[str, tuple[int, int, int]]:
  """`ptxas -v`'s stderr -> {function: (registers, spill stores, spill
  loads)}."""
  out, current, spills = {}, None, (0, 0)
  for line in text.splitlines():
    m = re.search(r"Compiling entry function '(\w+)'", line)
    if m:
      current, spills = m.group(1), (0, 0)
      continue
    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
      spills = (int(m.group(1)), int(m.group(2)))
      continue
    m = re.search(r"Used (\d+) registers", line)
    if m and current:
      out[current] = (int(m.group(1)),) + spills
  return out


def parse_instructions(ptx: str) -> dict[str, tuple[int, int, int]]:
  """A PTX module -> {entry: (wgmma, mma.sync, st.shared instructions)}.
  Triton emits wgmma where the MMA's rows are at least 64, else mma.sync.
  wgmma reads its B operand from shared memory only, so a product made in
  registers that enters a dot as B is stored there first (st.shared, as
  are operands loaded into registers before a dot)."""
  out = {}
  entries = list(re.finditer(r"\.entry\s+(\w+)", ptx))
  for i, m in enumerate(entries):
    end = entries[i + 1].start() if i + 1 < len(entries) else len(ptx)
    body = ptx[m.end():end]
    out[m.group(1)] = (len(re.findall(r"\bwgmma\.mma_async\.", body)),
                       len(re.findall(r"\bmma\.sync\.", body)),
                       len(re.findall(r"\bst\.shared\.", body)))
  return out


def parse_thunks(text: str) -> dict[str, tuple[int, int, int]]:
  """XLA's `*.thunk_sequence.txt` -> {kernel: (grid blocks, threads per
  block, shared memory bytes)}."""
  out = {}
  for line in text.splitlines():
    m = re.search(r"\]\s+(\S+)\s+grid:\s*\[(\d+),\s*(\d+),\s*(\d+)\]\s+"
                  r"threads:\s*\[(\d+),\s*(\d+),\s*(\d+)\]\s+"
                  r"shared_memory:\s*(\d+)", line)
    if m:
      g = [int(v) for v in m.group(2, 3, 4)]
      t = [int(v) for v in m.group(5, 6, 7)]
      out[m.group(1)] = (g[0] * g[1] * g[2], t[0] * t[1] * t[2],
                         int(m.group(8)))
  return out


def find_ptxas() -> str:
  """ptxas from JAX's CUDA wheels on this interpreter's path, or PATH."""
  for entry in sys.path:
    for pattern in ("nvidia/cu*/bin/ptxas", "nvidia/cuda_nvcc/bin/ptxas"):
      found = sorted(glob.glob(os.path.join(entry, pattern)))
      if found:
        return found[-1]
  found = shutil.which("ptxas")
  if not found:
    raise SystemExit("kernel_report.py: no ptxas (install "
                     "jax-cuda13-plugin[with-cuda] in the venv; offline.py's "
                     "docstring)")
  return found


# XLA options that make this JAX write the PTX (kernels_of).
_PTX_DUMP = {}


def kernels_of(compile_fn, ptxas: str, prefix: str = "trm_") -> list[Kernel]:
  """Compiles with XLA's dump into a scratch dir (compile_fn(options)),
  then reads the kernels named `prefix*` back from it."""
  scratch = tempfile.mkdtemp(prefix="kernel_report_")
  try:
    options = {"xla_dump_to": scratch, "xla_dump_hlo_as_text": True}
    compile_fn({**options, **_PTX_DUMP})
    if not _PTX_DUMP and not glob.glob(os.path.join(scratch, "*.ptx")):
      # XLA in JAX 0.11 writes a module's PTX only when this pattern
      # matches (no narrower one than ".*" did), and then also every
      # emitter's IR, which makes a compile about 7x slower; JAX 0.10
      # always writes the PTX. So the option is added, for this and later
      # compiles, only once a compile wrote none.
      _PTX_DUMP["xla_dump_emitter_re"] = ".*"
      shutil.rmtree(scratch, ignore_errors=True)
      os.makedirs(scratch)
      compile_fn({**options, **_PTX_DUMP})
    thunks = {}
    for path in glob.glob(os.path.join(scratch, "*thunk_sequence.txt")):
      with open(path) as f:
        thunks.update(parse_thunks(f.read()))
    found = []
    for path in glob.glob(os.path.join(scratch, "*.ptx")):
      with open(path) as f:
        ptx = f.read()
      if f".entry {prefix}" not in ptx:
        continue
      counts = parse_instructions(ptx)
      run = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o",
                            os.devnull], capture_output=True, text=True,
                           check=False)
      for name, (regs, stores, loads) in parse_ptxas(run.stderr).items():
        if name.startswith(prefix) and name in thunks:
          grid, threads, shared = thunks[name]
          found.append(Kernel(name, regs, stores, loads, threads, shared,
                              grid, *counts.get(name, (0, 0, 0))))
    return found
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _target(gpu: str):
  """(ptxas, a sharding on one compile-only `gpu`, a one-device mesh of
  it), with the repository and the kit importable. Programs lower under
  that mesh (`jax.set_mesh`): JAX 0.11's Pallas Triton lowering finds the
  GPU it compiles for through the abstract mesh, as no GPU is attached."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  for path in (REPO, HERE):
    if path not in sys.path:
      sys.path.insert(0, path)
  import jax  # pylint: disable=g-import-not-at-top
  import offline  # pylint: disable=g-import-not-at-top
  device = offline.gpu_devices(gpu)[0]
  mesh = jax.sharding.Mesh([device], ("device",),
                           axis_types=(jax.sharding.AxisType.Auto,))
  return (find_ptxas(),
          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()), mesh)


def report(batch: int, gpu: str = "h100") -> list[dict]:
  ptxas, sharding, mesh = _target(gpu)
  import jax  # pylint: disable=g-import-not-at-top
  with jax.set_mesh(mesh):
    return _mixer_rows(batch, ptxas, sharding)


def _mixer_rows(batch: int, ptxas: str, sharding) -> list[dict]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import mixer_sweep  # pylint: disable=g-import-not-at-top
  from trm.families.trm import channel_gpu  # pylint: disable=g-import-not-at-top
  from trm.families.trm import mlp_gpu  # pylint: disable=g-import-not-at-top
  spec = lambda shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16,  # noqa: E731
                                            sharding=sharding)
  seq, width, inter = 97, 512, 512  # the paper MLP-t step's token mixer
  x, dy = spec((seq, batch, width)), spec((seq, batch, width))
  w_in, w_out = spec((seq, 2 * inter)), spec((inter, seq))

  def mixer(x, w_in, w_out):
    return mlp_gpu.token_mixer(x, w_in, w_out, mixer_sweep.EPS, False)

  def channel(x, w_in, w_out):
    return channel_gpu.channel_mlp(x, w_in, w_out, mixer_sweep.EPS, 1, False)

  def train(x, w_in, w_out, dy, fn=mixer):
    y, pull = jax.vjp(fn, x, w_in, w_out)
    return (y,) + pull(dy)

  # The 'epilogue' layouts run the SwiGLU kernels instead.
  names = {"forward": ("trm_token_mixer_forward", "trm_token_mixer_swiglu"),
           "dx": ("trm_token_mixer_dx", "trm_token_mixer_swiglu_grad"),
           "grad": ("trm_token_mixer_weight_grads",),
           "channel": ("trm_channel_swiglu", "trm_channel_swiglu_grad")}
  # The channel MLP's weights (inner width 1536).
  c_in, c_out = spec((width, 2 * 1536)), spec((1536, width))
  rows = []
  for kernel, constant, settings in mixer_sweep.KERNELS:
    for name, change in settings:
      with mixer_sweep.kernel_constants({constant: change}):
        if kernel == "channel" and not channel_gpu.use_kernel():
          continue  # XLA's, no kernel of ours
        # A new function per setting: the kernels read the constants when
        # traced, and jit caches by function.
        if kernel == "forward":
          fn, args = jax.jit(lambda *a: mixer(*a)), (x, w_in, w_out)
        elif kernel == "channel":
          fn = jax.jit(lambda *a: train(*a, fn=channel))
          args = (x, c_in, c_out, dy)
        else:
          fn, args = jax.jit(lambda *a: train(*a)), (x, w_in, w_out, dy)
        lowered = fn.lower(*args)
        found = kernels_of(lowered.compile, ptxas)
      if not any(k.name in names[kernel] for k in found):
        print(f"kernel_report.py: {kernel} {name}: no kernel named "
              f"{names[kernel]} in the compiled program (found "
              f"{sorted(k.name for k in found)})", file=sys.stderr)
      for k in found:
        if k.name not in names[kernel]:
          continue
        # The channel's two kernels, forward and gradients, on two rows.
        label = {"trm_channel_swiglu": "ch_fwd",
                 "trm_channel_swiglu_grad": "ch_grad"}.get(k.name, kernel)
        rows.append(_row(label, name, change, k))
  return rows


def _row(kernel: str, setting: str, changes, k: Kernel) -> dict:
  """One table row: a compiled kernel under a named setting."""
  return dict(kernel=kernel, setting=setting, changes=changes,
              registers=k.registers, spill_stores=k.spill_stores,
              spill_loads=k.spill_loads, threads=k.threads,
              shared_bytes=k.shared, grid=k.grid,
              blocks_per_sm=k.blocks_per_sm(), occupancy=k.occupancy(),
              waves=k.waves(), wgmma=k.wgmma, mma_sync=k.mma_sync,
              st_shared=k.st_shared)


def gpt_report(gpu: str = "h100") -> list[dict]:
  """GPT-2's Pallas kernels (`--gpt`): the loss's and the residual-add
  LayerNorm's, in the gptk section's programs (forward and backward) at
  the kit's shapes, under each of gpt_kernels.GPT_SETTINGS."""
  ptxas, sharding, mesh = _target(gpu)
  import jax  # pylint: disable=g-import-not-at-top
  with jax.set_mesh(mesh):
    return _gpt_rows(ptxas, sharding)


def _gpt_rows(ptxas: str, sharding) -> list[dict]:
  import jax  # pylint: disable=g-import-not-at-top
  import gpt_kernels  # pylint: disable=g-import-not-at-top
  import mixer_sweep  # pylint: disable=g-import-not-at-top

  abstract = jax.eval_shape(lambda: gpt_kernels.operands(False))
  rows = []
  for kernel, (module, prefix, _, fn) in gpt_kernels.functions(False).items():
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
             for a in abstract[kernel]]
    for setting in gpt_kernels.GPT_SETTINGS[kernel]:
      name = gpt_kernels.setting_name(setting)
      # A new function per setting: the kernels read CONSTANTS when
      # traced, and jit caches by function.
      with mixer_sweep._constants(module, {"CONSTANTS": setting}):  # pylint: disable=protected-access
        found = kernels_of(jax.jit(lambda *a, f=fn: f(*a)).lower(
            *specs).compile, ptxas, prefix=prefix)
      if not found:
        print(f"kernel_report.py: {kernel} {name}: no kernel named "
              f"{prefix}*", file=sys.stderr)
      rows.extend(_row(k.name, name, setting, k) for k in found)
  return rows


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--batch", type=int, default=384,
                 help="the MLP-t step's batch (columns = batch x 512)")
  p.add_argument("--gpu", default="h100", choices=("h100", "h200"))
  p.add_argument("--json", default=None, help="also write the rows here")
  p.add_argument("--gpt", action="store_true",
                 help="GPT-2's loss and norm kernels instead "
                 "(gpt_kernels.GPT_SETTINGS)")
  args = p.parse_args(argv)
  # Before a minute (8.5 under JAX 0.11) of compiles, not after them.
  if args.batch < 1:
    p.error(f"--batch={args.batch}: must be a positive integer")
  json_out.check_path(p, args.json)
  if args.gpt:
    rows = gpt_report(args.gpu)
    print(f"GPT-2 kernels, 12 x 1024 positions ({args.gpu}, sm_90a; "
          "ptxas -v and XLA's thunk sequence)")
    width, kwidth = 30, 23
  else:
    rows = report(args.batch, args.gpu)
    print(f"TRM MLP-t kernels, batch {args.batch} ({args.gpu}, sm_90a; "
          "ptxas -v and XLA's thunk sequence)")
    width, kwidth = 16, 8
  print(f"{'kernel':{kwidth}s} {'setting':{width}s} {'regs':>4s} {'spill st/ld':>12s} "
        f"{'threads':>7s} {'smem KiB':>8s} {'blocks/SM':>9s} "
        f"{'occupancy':>9s} {'waves':>6s} {'wgmma':>5s} {'mma.sync':>8s} "
        f"{'st.shared':>9s}")
  for r in rows:
    print(f"{r['kernel']:{kwidth}s} {r['setting']:{width}s} {r['registers']:4d} "
          f"{r['spill_stores']:5d}/{r['spill_loads']:<6d} {r['threads']:7d} "
          f"{r['shared_bytes'] / 1024:8.0f} {r['blocks_per_sm']:9d} "
          f"{r['occupancy']:9.1%} {r['waves']:6.1f} {r['wgmma']:5d} "
          f"{r['mma_sync']:8d} {r['st_shared']:9d}")
  if args.json:
    json_out.write(args.json, rows)


if __name__ == "__main__":
  main()
