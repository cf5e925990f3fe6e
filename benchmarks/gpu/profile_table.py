"""Where a measured GPU step's time went, from a jax.profiler trace, beside
what the roofline forecast (`trm.forecast`) charges the same instructions.

  python3 benchmarks/gpu/profile_table.py TRACE [--hlo=FILE] [--top=25]
      [--module=jit_train_step] [--gpu=h100] [--efficiency=0.6] [--json=OUT]
  python3 benchmarks/gpu/profile_table.py TRACE --side=torch

TRACE is a kit trace archive (`trace_<name>.tar.gz`) or the
`*.trace.json.gz` inside one; --hlo the same program's optimized HLO as the
GPU compiled it (the kit's `hlo_after_optimizations.tar.gz` holds it:
`--hlo=ARCHIVE:MEMBER`, or an extracted file). No GPU and no CUDA plugin
are needed.

Per step (the trace's kernel time divided by the module's executions in
it), the table lists:
- time by kind of kernel: cuBLAS matmuls, cuDNN attention, XLA's Triton GEMM
  fusions, XLA's other fusions by kind (elementwise loops, reductions,
  concatenates and slices, Triton-emitted normalisations);
- with --hlo, the XLA kernels joined to their instructions: XLA:GPU emits
  one kernel for each distinct fused computation (e.g. the same LayerNorm
  of every layer) and names it after one of the fusions that run it, so a
  row is such a group, labelled by its model-code name with layer indices
  as `*`, its measured time beside the forecast of all its members;
  library kernels (cuBLAS, cuDNN) are compared as a whole with the
  forecast of the library calls.

`--side=torch` reads the PyTorch side the kit profiled into the same
archive (`torch/torch.trace.json.gz`, torch.profiler's Chrome trace of the
same steps or calls; `torch/meta.json`, their count): GPU time per step by
kind of kernel (cuBLAS, flash attention, Inductor's Triton kernels, torch's
own) and the largest kernels, to set beside ours.
"""
from __future__ import annotations

import argparse
import collections
import gzip
import io
import json
import os
import re
import sys
import tarfile

import json_out  # the kit's own folder: sys.path[0] when run as a script

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Library kernels, by name: (pattern, what they are).
_LIBRARY = (
    (re.compile(r"cudnn|sdpa|flash_[bf]prop"), "cuDNN attention"),
    (re.compile(r"flash_fwd|flash_bwd|fmha|flash::"), "flash attention"),
    (re.compile(r"^(nvjet|cutlass|sm\d+_xmma|ampere_|hopper_|gemm|"
                r"cublas|.*gemv)", re.I), "cuBLAS matmul"),
    (re.compile(r"^(memset|memcpy)", re.I), "memset/memcpy"),
)
_XLA_GEMM = ("gemm_fusion", "triton_gemm")  # XLA's Triton GEMM fusions
# The project's Pallas kernels, by the names their `pallas_call(name=...)`
# gives them (XLA launches them under that name): TRM's trm_* (mlp_gpu,
# channel_gpu), GPT's norms (norm_gpu) and loss (trm/nn/cross_entropy_gpu).
# tests/benchmarks/test_gpu_profile_table.py checks every name in trm/.
_PALLAS = ("trm_", "gpt_add_layer_norm", "lm_head_cross_entropy")
_LAYER_SCOPE = re.compile(r"(?<![^/])([A-Za-z][A-Za-z]*)_\d+(?=/|$)")


def read_trace(path: str, side: str = "ours") -> dict:
  """The Chrome-format trace of a kit archive (ours' jax.profiler trace, or
  with side='torch' torch.profiler's, with `_runs` from its meta.json) or
  of a .trace.json(.gz)."""
  try:
    trace = _read_trace(path, side)
  except (OSError, EOFError, tarfile.TarError, ValueError) as e:
    raise SystemExit(f"profile_table.py: {path}: not a readable jax.profiler "
                     f"trace ({type(e).__name__}: {e})") from None
  if not isinstance(trace, dict):
    raise SystemExit(f"profile_table.py: {path}: not a Chrome-format trace "
                     "(no traceEvents object)")
  return trace


def _read_trace(path: str, side: str):
  if path.endswith((".tar.gz", ".tgz")):
    with tarfile.open(path) as archive:
      members = [m for m in archive.getmembers()
                 if m.name.endswith((".trace.json.gz", ".trace.json"))
                 and ("/torch/" in m.name) == (side == "torch")]
      if not members:
        raise SystemExit(
            f"profile_table.py: {path} holds no "
            + ("torch/torch.trace.json.gz (the kit profiles torch's side "
               "where it has one)" if side == "torch" else
               "*.trace.json.gz (is it a jax.profiler trace archive?)"))
      data = archive.extractfile(members[0]).read()
      meta = [m for m in archive.getmembers()
              if m.name.endswith("/torch/meta.json")]
      runs = (json.loads(archive.extractfile(meta[0]).read()).get("runs", 1)
              if meta and side == "torch" else None)
    if members[0].name.endswith(".gz"):
      data = gzip.decompress(data)
    trace = json.loads(data)
    if runs and isinstance(trace, dict):
      trace["_runs"] = int(runs)
    return trace
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return json.load(f)


def hlo_source(spec: str) -> tuple[str, str | None]:
  """(file, archive member or None) of --hlo=FILE(.gz) or
  ARCHIVE.tar.gz:MEMBER."""
  if ".tar.gz:" in spec:
    archive, member = spec.split(".tar.gz:", 1)
    return archive + ".tar.gz", member
  return spec, None


def read_hlo(spec: str) -> str:
  """HLO text from FILE(.gz) or ARCHIVE.tar.gz:MEMBER (LookupError: no
  such member)."""
  path, member = hlo_source(spec)
  if member is not None:
    with tarfile.open(path) as tar:
      names = [m.name for m in tar.getmembers() if m.isfile()]
      if member not in names:
        raise LookupError(f"{path} has no file {member!r}; it holds: "
                          f"{', '.join(sorted(names)) or 'none'}")
      return tar.extractfile(member).read().decode()
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rt") as f:
    return f.read()


def device_kernels(trace: dict, module: str | None):
  """(kernel events of the GPU for `module` (default: the module with the
  most kernel time), module name, executions of it in the trace)."""
  events = trace.get("traceEvents", [])
  processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "process_name"}
  kernels = [e for e in events if e.get("ph") == "X"
             and processes.get(e.get("pid"), "").startswith("/device:GPU")]
  by_module = collections.Counter()
  for e in kernels:
    by_module[e.get("args", {}).get("hlo_module")] += e.get("dur", 0)
  if module is None:
    named = [(t, m) for m, t in by_module.items() if m]
    if not named:
      raise SystemExit("profile_table.py: no GPU kernels with an hlo_module "
                       "in the trace")
    module = max(named)[1]
  kernels = [e for e in kernels
             if e.get("args", {}).get("hlo_module") == module]
  if not kernels:
    raise SystemExit(f"profile_table.py: no GPU kernels of module {module!r}"
                     f"; the trace has {sorted(m for m in by_module if m)}")
  runs = sum(1 for e in events if e.get("ph") == "X"
             and e.get("name") == f"{module}:XLA GPU module")
  return kernels, module, max(runs, 1)


def torch_table(trace: dict, runs: int | None = None) -> dict:
  """Per-step GPU time of torch.profiler's kernels (events of category
  `kernel`) by kind and by kernel."""
  runs = runs or trace.get("_runs") or 1
  kernels = [e for e in trace.get("traceEvents", [])
             if e.get("ph") == "X" and e.get("cat") == "kernel"]
  if not kernels:
    raise SystemExit("profile_table.py: torch's trace has no GPU kernels "
                     "(profiled on a CPU?)")
  result, _, _ = _per_run(kernels, runs, torch_kind)
  return {"module": "torch", "runs": runs, **result}


def _per_run(kernels, runs: int, kind_of):
  """({measured_ms, by_kind, kernels} per run, seconds by kernel name,
  launches by kernel name) of kernel events."""
  by_kind = collections.Counter()
  by_kernel = collections.Counter()
  launches = collections.Counter()
  for e in kernels:
    name, seconds = e["name"], e.get("dur", 0) / 1e6 / runs
    by_kind[kind_of(name)] += seconds
    by_kernel[name] += seconds
    launches[name] += 1 / runs
  result = {
      "measured_ms": 1e3 * sum(by_kind.values()),
      "by_kind": [{"kind": k, "measured_ms": 1e3 * v}
                  for k, v in by_kind.most_common()],
      "kernels": [{"kernel": k, "measured_ms": 1e3 * v,
                   "launches": round(launches[k], 2)}
                  for k, v in by_kernel.most_common()],
  }
  return result, by_kernel, launches


def torch_kind(name: str) -> str:
  """What a kernel of torch's side is, from its name."""
  library = library_kind(name)
  if library:
    return library
  if name.startswith("triton_"):
    return "Inductor (Triton) fusion"
  return "torch's own kernels (ATen)"


def library_kind(name: str) -> str | None:
  """cuBLAS, cuDNN or a memset/memcpy, by kernel name; None for XLA's own
  kernels (named after their instructions)."""
  if name.startswith(_XLA_GEMM):
    return None
  for pattern, kind in _LIBRARY:
    if pattern.search(name):
      return kind
  return None


def xla_kind(name: str) -> str:
  """What an XLA-emitted kernel is, from its (instruction) name."""
  if name.startswith(_PALLAS):
    return "Pallas kernel (ours)"
  if name.startswith(_XLA_GEMM):
    return "XLA Triton GEMM fusion"
  if "reduce" in name:
    return "XLA reduction fusion"
  if re.search(r"concatenate|slice|transpose|copy|dynamic|pad|gather|"
               r"scatter", name):
    return "XLA data movement (concatenate, slice, copy)"
  if name.startswith("fusion"):
    return "XLA Triton-emitted fusion (kCustom)"
  return "XLA elementwise fusion"


def layerless(label: str) -> str:
  """A model-code label with layer indices as `*` (h_10 -> h_*)."""
  return _LAYER_SCOPE.sub(r"\1_*", label)


_NAMES = re.compile(r"%[^\s,(){}]+")
_NOISE = re.compile(r"(metadata|backend_config|frontend_attributes)=")


def _strip_noise(attrs: str) -> str:
  """Attributes without metadata and backend configs, names as `%`."""
  cut = _NOISE.search(attrs)
  return _NAMES.sub("%", attrs[:cut.start()] if cut else attrs)


def kernel_key(module, inst) -> tuple:
  """What makes two instructions one kernel: XLA:GPU emits a kernel once
  per distinct fused computation (by content, not name; marked with
  `deduplicated_name` only sometimes) and reuses it, named after one of
  them. So: the called computations' instructions (opcode, shape, operand
  positions, attributes without names or metadata), with the
  instruction's own shapes."""
  parts = [inst.opcode, repr(inst.shape), _strip_noise(inst.attrs)]
  for name in inst.called():
    comp = module.computations.get(name)
    if comp is None:
      continue
    position = {i.name: k for k, i in enumerate(comp.instructions)}
    for i in comp.instructions:
      parts.append((i.opcode, repr(i.shape),
                    tuple(position.get(o, -1) for o in i.operands),
                    _strip_noise(i.attrs), i.operand_text
                    if i.opcode in ("parameter", "constant") else ""))
  return tuple(parts)


def table(trace: dict, hlo_text: str | None = None, module: str | None = None,
          gpu: str = "h100", efficiency: float = 0.6) -> dict:
  """Per-step measured time by kernel kind and (with HLO) by instruction
  group, with the forecast beside it."""
  kernels, module, runs = device_kernels(trace, module)
  per_run, by_kernel, launches = _per_run(
      kernels, runs, lambda name: library_kind(name) or xla_kind(name))
  result = {"module": module, "runs": runs, **per_run}
  if hlo_text is not None:
    result.update(_joined(hlo_text, by_kernel, launches, gpu, efficiency))
  return result


def _kernel_name(instruction: str) -> str:
  """The kernel name XLA:GPU gives an instruction's code."""
  return instruction.replace(".", "_").replace("-", "_")


def _joined(hlo_text, by_kernel, launches, gpu, efficiency) -> dict:
  for path in (REPO, HERE):
    if path not in sys.path:
      sys.path.insert(0, path)
  import offline  # pylint: disable=g-import-not-at-top
  from trm.forecast import ops  # pylint: disable=g-import-not-at-top
  from trm.forecast import timeline  # pylint: disable=g-import-not-at-top
  spec = offline.GPUS[gpu]
  program = offline.gpu_program(hlo_text)
  groups = collections.defaultdict(
      lambda: {"forecast_s": 0.0, "members": 0, "label": None, "kind": None})
  by_name = {}
  library_forecast = collections.Counter()
  for inst, seconds, _, _, times in program.instruction_times(
      spec["peak_bf16"], efficiency, spec["bandwidth"]):
    target = inst.attr("custom_call_target") or ""
    if inst.opcode == "custom-call" and target.startswith(
        (ops.CUBLAS_PREFIX, ops.CUDNN_ATTENTION_PREFIX)):  # as ops prices them
      kind = ("cuBLAS matmul" if target.startswith(ops.CUBLAS_PREFIX)
              else "cuDNN attention")
      library_forecast[kind] += seconds * times
      continue
    key = kernel_key(program.module, inst)
    group = groups[key]
    group["forecast_s"] += seconds * times
    group["members"] += 1
    if group["label"] is None:
      group["label"] = layerless(timeline.op_label(inst))
      group["kind"] = timeline.instruction_kind(inst)
    by_name[_kernel_name(inst.name)] = key
    if inst.opcode == "async-start":  # its kernels carry the inner names
      for called in inst.called():
        for inner in getattr(program.module.computations.get(called),
                             "instructions", ()):
          by_name.setdefault(_kernel_name(inner.name), key)
  rows = collections.defaultdict(
      lambda: {"measured_s": 0.0, "forecast_s": 0.0, "launches": 0.0,
               "kernels": []})
  unmatched = collections.Counter()
  for kernel, seconds in by_kernel.items():
    library = library_kind(kernel)
    key = by_name.get(kernel)
    if library:
      row = rows[("library", library)]
      row["label"], row["kind"] = library, "library"
      row["forecast_s"] = library_forecast.get(library, 0.0)
    elif key is not None:
      row = rows[("group", key)]
      group = groups[key]
      row["label"], row["kind"] = group["label"], group["kind"]
      row["forecast_s"] = group["forecast_s"]
      row["members"] = group["members"]
    else:
      unmatched[kernel] += seconds
      continue
    row["measured_s"] += seconds
    row["launches"] += launches[kernel]
    row["kernels"].append(kernel)
  ranked = sorted(rows.values(), key=lambda r: -r["measured_s"])
  return {
      "forecast_ms": 1e3 * (sum(g["forecast_s"] for g in groups.values())
                            + sum(library_forecast.values())),
      "efficiency": efficiency,
      "groups": [{
          "label": r["label"], "kind": r["kind"],
          "measured_ms": 1e3 * r["measured_s"],
          "forecast_ms": 1e3 * r["forecast_s"],
          "launches": round(r["launches"], 2),
          "members": r.get("members"),
          "kernels": sorted(r["kernels"])[:4]} for r in ranked],
      "unmatched": [{"kernel": k, "measured_ms": 1e3 * v}
                    for k, v in unmatched.most_common()],
  }


def format_table(result: dict, top: int) -> str:
  out = io.StringIO()
  w = lambda s="": out.write(s + "\n")  # noqa: E731
  w(f"module {result['module']}: {result['runs']} run(s) in the trace; "
    f"{result['measured_ms']:.1f} ms of GPU kernels per run"
    + (f"; forecast {result['forecast_ms']:.1f} ms at efficiency "
       f"{result['efficiency']}" if "forecast_ms" in result else ""))
  w()
  w("  measured ms   share  kind of kernel")
  for row in result["by_kind"]:
    w(f"  {row['measured_ms']:11.2f}  {100 * row['measured_ms'] / result['measured_ms']:5.1f}%  {row['kind']}")
  if "groups" in result:
    w()
    w("  measured ms  forecast ms  meas/fcst  launches  kind      what "
      "(model code; one kernel per group of identical fusions)")
    for row in result["groups"][:top]:
      ratio = (f"{row['measured_ms'] / row['forecast_ms']:9.2f}"
               if row["forecast_ms"] else "        -")
      w(f"  {row['measured_ms']:11.2f}  {row['forecast_ms']:11.2f}  {ratio}"
        f"  {row['launches']:8.1f}  {row['kind']:8s}  {row['label']}")
    if result["unmatched"]:
      rest = sum(r["measured_ms"] for r in result["unmatched"])
      names = ", ".join(r["kernel"][:40] for r in result["unmatched"][:3])
      w(f"  {rest:11.2f}  (kernels matching no instruction: {names}...)")
  else:
    w()
    w("  measured ms  launches  kernel")
    for row in result["kernels"][:top]:
      w(f"  {row['measured_ms']:11.2f}  {row['launches']:8.1f}  "
        f"{row['kernel'][:100]}")
  return out.getvalue()


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("trace", help="trace_<name>.tar.gz or *.trace.json.gz")
  p.add_argument("--hlo", help="the program's optimized HLO: FILE(.gz) or "
                 "ARCHIVE.tar.gz:MEMBER")
  p.add_argument("--side", choices=("ours", "torch"), default="ours",
                 help="ours' jax.profiler trace, or torch's in the same kit "
                 "archive")
  p.add_argument("--module", help="HLO module name in the trace (default: "
                 "the one with the most kernel time)")
  p.add_argument("--gpu", default="h100", choices=("h100", "h200"))
  p.add_argument("--efficiency", type=float, default=0.6)
  p.add_argument("--top", type=int, default=25)
  p.add_argument("--json", help="also write the table as JSON here")
  args = p.parse_args(argv)
  if not os.path.isfile(args.trace):
    p.error(f"trace {args.trace}: no such file")
  if args.hlo and not os.path.isfile(hlo_source(args.hlo)[0]):
    p.error(f"--hlo={args.hlo}: no such file")
  if not 0 < args.efficiency <= 1:
    p.error(f"--efficiency={args.efficiency}: must be in (0, 1]")
  if args.top < 1:
    p.error(f"--top={args.top}: must be >= 1")
  json_out.check_path(p, args.json)
  return args


def checked_hlo(spec: str, flag: str = "--hlo",
                script: str = "profile_table.py") -> str:
  """read_hlo, with an unreadable file or one that holds no HLO module (no
  ENTRY computation) as one line naming `flag`: the kit's one check of an
  HLO text file, profile_table.py's --hlo and offline.py's --replay."""
  try:
    text = read_hlo(spec)
  except LookupError as e:
    raise SystemExit(f"{script}: {flag}={spec}: {e}") from None
  except (OSError, EOFError, tarfile.TarError, UnicodeDecodeError) as e:
    raise SystemExit(f"{script}: {flag}={spec}: not readable "
                     f"({type(e).__name__}: {e})") from None
  if "ENTRY" not in text:
    raise SystemExit(f"{script}: {flag}={spec}: no ENTRY computation (a "
                     "compiled program's text is needed, e.g. an XLA dump's "
                     "*after_optimizations.txt)")
  return text


def main(argv=None) -> None:
  args = parse_args(argv)
  trace = read_trace(args.trace, args.side)
  if args.side == "torch":
    result = torch_table(trace)
  else:
    result = table(trace, checked_hlo(args.hlo) if args.hlo else None,
                   args.module, args.gpu, args.efficiency)
  print(format_table(result, args.top), end="")
  if args.json:
    json_out.write(args.json, result)


if __name__ == "__main__":
  main()
