"""Model FLOPs utilisation (MFU): FLOP counts, device peaks and the ratio.

MFU = (model FLOPs an iteration needs) / (seconds per iteration) /
(devices * peak FLOP/s per device). The numerator follows nanoGPT's
`estimate_mfu` (PaLM paper, Appendix B) so our figures and nanoGPT's are the
same quantity. The denominator is where comparisons usually go wrong: nanoGPT
divides by a hard-coded 312e12 (A100 bf16 dense) whatever the hardware, so its
printed MFU is only meaningful on an A100 in bf16. Here the peak comes from the
device actually used:

  * known accelerators: the vendor's published dense (no 2:4 sparsity) peak
    for the compute dtype;
  * CPU: no meaningful published figure exists (it depends on the core count,
    vector width, clocks and the BLAS in use), so we measure the best FLOP/s of
    a large jitted matmul on the JAX CPU backend with all threads, which makes
    CPU MFU "fraction of what this machine's GEMM can do";
  * unknown accelerators: the same measurement on that device, with a warning,
    since a measured matmul peak is below the datasheet one (MFU reads high).
"""
from __future__ import annotations

import time
import warnings
from typing import Any

# Dense peak FLOP/s per jax device, by normalised dtype name. Sources:
#   A100 (SXM4 and PCIe, 40/80 GB): NVIDIA A100 Tensor Core GPU datasheet:
#     BF16/FP16 tensor core 312 TFLOPS dense (624 with sparsity), TF32 156
#     dense, FP32 (CUDA cores) 19.5. 312e12 is the number nanoGPT hard-codes.
#   H100 SXM: NVIDIA H100 Tensor Core GPU datasheet: BF16/FP16 1,979 TFLOPS
#     "with sparsity", i.e. 989 dense; TF32 989 sparse -> 494.5 dense; FP32 67.
#   H100 PCIe (same datasheet): BF16 1,513 sparse -> 756 dense; TF32 378; FP32 51.
#   H100 NVL (same datasheet, per GPU): BF16 1,671 sparse -> 835; TF32 417; FP32 60.
#   H200 SXM: NVIDIA H200 datasheet, same compute as H100 SXM (only memory
#     differs); H200 NVL as H100 NVL. GH200's GPU is an H100 SXM-class part.
#   TPU v4: Google Cloud TPU v4 docs, 275 TFLOPS bf16 per chip. A v4 chip's two
#     TensorCores run as one "megacore" JAX device, so per chip = per device.
#   TPU v5e ("TPU v5 lite"): Cloud TPU v5e docs, 197 TFLOPS bf16 per chip (one
#     TensorCore, one device).
#   TPU v5p ("TPU v5"): Cloud TPU v5p docs, 459 TFLOPS bf16 per chip (megacore,
#     one device).
#   TPU v6e / Trillium ("TPU v6 lite"): Cloud TPU v6e docs, 918 TFLOPS bf16 per
#     chip (one device).
# TPUs publish no float32 figure: the MXU multiplies in bf16, and XLA's default
# precision runs a float32 matmul as a single bf16 pass, so the bf16 peak is
# also the ceiling for float32 at default precision.
_A100 = {"bfloat16": 312e12, "float16": 312e12, "tfloat32": 156e12,
         "float32": 19.5e12}
_H100_SXM = {"bfloat16": 989e12, "float16": 989e12, "tfloat32": 494.5e12,
             "float32": 67e12}
_H100_PCIE = {"bfloat16": 756e12, "float16": 756e12, "tfloat32": 378e12,
              "float32": 51e12}
_H100_NVL = {"bfloat16": 835e12, "float16": 835e12, "tfloat32": 417.5e12,
             "float32": 60e12}


def _tpu(bf16: float) -> dict[str, float]:
  return {"bfloat16": bf16, "float32": bf16}


_TPU_V4 = _tpu(275e12)
_TPU_V5E = _tpu(197e12)
_TPU_V5P = _tpu(459e12)
_TPU_V6E = _tpu(918e12)

_DTYPE_ALIASES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "f16": "float16", "half": "float16",
    "float16": "float16",
    "fp32": "float32", "f32": "float32", "float": "float32",
    "float32": "float32",
    "tf32": "tfloat32", "tfloat32": "tfloat32",
}


def normalise_dtype(dtype: Any) -> str:
  """Maps 'bf16', jnp.bfloat16, np.float32, torch.bfloat16 (or its string,
  as transformers users write it) ... to one canonical name."""
  if not isinstance(dtype, str):
    import numpy as np  # pylint: disable=g-import-not-at-top
    try:
      dtype = np.dtype(dtype).name
    except TypeError:  # torch.bfloat16 is no numpy dtype; str() names it
      dtype = str(dtype)
  key = dtype.strip().lower().removeprefix("torch.")
  if key not in _DTYPE_ALIASES:
    raise ValueError(f"unknown dtype {dtype!r}; expected one of "
                     f"{sorted(set(_DTYPE_ALIASES.values()))}")
  return _DTYPE_ALIASES[key]


def _published_table(device_kind: str) -> dict[str, float] | None:
  """The peak table for a jax `device.device_kind` string, or None."""
  kind = device_kind.strip().lower()
  if "nvidia" in kind or kind.startswith(("a100", "h100", "h200", "gh200")):
    if "a100" in kind:  # "NVIDIA A100-SXM4-40GB", "NVIDIA A100 80GB PCIe"
      return _A100
    # "GH200" contains "h200"; its GPU has H100 SXM compute, as does H200 SXM.
    if "h100" in kind or "h200" in kind:
      if "pcie" in kind:  # "NVIDIA H100 PCIe"
        return _H100_PCIE
      if "nvl" in kind:  # "NVIDIA H100 NVL", "NVIDIA H200 NVL"
        return _H100_NVL
      return _H100_SXM  # "NVIDIA H100 80GB HBM3", "NVIDIA H200", "GH200 480GB"
    return None
  if kind.startswith("tpu"):
    version = kind[3:].strip()
    lite = "lite" in version or version.endswith("e")
    if version.startswith("v4"):
      # "TPU v4"; "TPU v4 lite" (v4i, inference) has a different peak.
      return None if lite else _TPU_V4
    if version.startswith("v5"):  # "TPU v5 lite" / "TPU v5e"; "TPU v5" / "v5p"
      return _TPU_V5E if lite else _TPU_V5P
    if version.startswith("v6"):  # "TPU v6 lite" / "TPU v6e" (Trillium)
      return _TPU_V6E if lite else None
  return None


def published_peak_flops(device_kind: str, dtype: str) -> float | None:
  """Vendor-published dense peak FLOP/s of one jax device, or None if unknown.

  `device_kind` is jax's `device.device_kind`; `dtype` the matmul input dtype
  ('bfloat16', 'float16', 'float32' or 'tfloat32', common aliases accepted).
  None means "no published figure we trust for this device and dtype": callers
  should measure instead of guessing.
  """
  table = _published_table(device_kind)
  if table is None:
    return None
  return table.get(normalise_dtype(dtype))


# (platform, device_kind, dtype, size) -> best measured FLOP/s, so a run (and
# every benchmark line in it) divides by one number measured once.
_MEASURED: dict[tuple[str, str, str, int], float] = {}


def measured_matmul_peak_flops(device, dtype: str = "float32",
                               size: int = 1024, repeats: int = 5,
                               min_seconds: float = 0.25) -> float:
  """Best-of-`repeats` FLOP/s of a jitted size^3 matmul on `device`.

  The inputs are committed to `device`, so the jitted matmul runs there (on
  CPU it uses XLA's intra-op thread pool, i.e. all cores). Three untimed calls
  compile and warm up; each timed call ends with `block_until_ready`.
  Counts 2*n^3 FLOPs per call (a multiply and an add per inner-product term).
  Timing continues past `repeats` calls until `min_seconds` have been spent:
  on a shared machine a burst of contention can cover five 5 ms calls, and a
  peak taken in such a burst would inflate every MFU divided by it.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  if device.process_index != jax.process_index():
    # Another process's device (jax.devices() is global in a multi-process
    # run): a matmul committed there runs nothing here, and its "time" made
    # process 1 of a 2-process CPU run divide by 970 TFLOP/s. Measure on
    # one of this process's own devices of that platform instead.
    device = jax.local_devices(backend=device.platform)[0]
  name = normalise_dtype(dtype)
  if name == "tfloat32":
    raise ValueError("measure tfloat32 as float32 under "
                     "jax.default_matmul_precision('tensorfloat32')")
  key = (device.platform, device.device_kind, name, int(size))
  if key in _MEASURED:
    return _MEASURED[key]
  if size < 1 or repeats < 1 or min_seconds < 0:
    raise ValueError(f"size={size} and repeats={repeats} must be >= 1, "
                     f"min_seconds={min_seconds} >= 0")
  k1, k2 = jax.random.split(jax.random.key(0))
  a = jax.device_put(jax.random.normal(k1, (size, size), name), device)
  b = jax.device_put(jax.random.normal(k2, (size, size), name), device)
  matmul = jax.jit(jnp.matmul)
  for _ in range(3):  # Compile, then let the thread pool spin up.
    jax.block_until_ready(matmul(a, b))
  best = float("inf")
  calls = 0
  begin = time.perf_counter()
  while calls < repeats or time.perf_counter() - begin < min_seconds:
    start = time.perf_counter()
    jax.block_until_ready(matmul(a, b))
    best = min(best, time.perf_counter() - start)
    calls += 1
  flops = 2.0 * float(size) ** 3 / max(best, 1e-9)
  _MEASURED[key] = flops
  return flops


def measured_cpu_peak_flops(dtype: str = "float32", size: int = 1024,
                            repeats: int = 5, min_seconds: float = 0.25
                           ) -> float:
  """Best-of-`repeats` FLOP/s of a jitted square matmul on the JAX CPU backend.

  Uses this process's first CPU device even when the default backend is an
  accelerator, so a PyTorch-on-CPU baseline and a JAX-on-CPU run can share one
  denominator. Cached per (dtype, size): measured once per process.
  """
  import jax  # pylint: disable=g-import-not-at-top
  return measured_matmul_peak_flops(jax.local_devices(backend="cpu")[0],
                                    dtype, size, repeats, min_seconds)


# jax_default_matmul_precision values under which XLA:GPU multiplies float32
# operands in float32 (CUDA cores); at every other setting, the default
# (None) included, it uses TF32 tensor cores (trm.forecast.ops charges a
# float32 cuBLAS matmul likewise).
FULL_FLOAT32 = ("highest", "float32", "f32_f32_f32")


def _gpu_float32_as(name: str) -> str:
  """The peak a float32 matmul on an NVIDIA GPU runs against: TF32's at
  jax's default precision (dividing by the CUDA-core float32 peak made an
  H100's MFU read 7.4x high: 67 instead of 494.5 TFLOP/s)."""
  import jax  # pylint: disable=g-import-not-at-top
  precision = jax.config.jax_default_matmul_precision
  if name != "float32" or str(precision).lower() in FULL_FLOAT32:
    return name
  return "tfloat32"


def peak_flops(device=None, dtype: str = "float32") -> tuple[float, str]:
  """(Peak FLOP/s of one device, a description of where the number is from).

  device: a jax Device (default: this process's first). CPU: measured matmul
  peak; known accelerator: published peak for `dtype` (float32 on an NVIDIA
  GPU: TF32's, unless jax's default matmul precision is 'highest');
  unknown accelerator: a matmul measured on it (4096^3, which is big enough
  to approach peak on current GPUs/TPUs), with a warning that MFU will read
  high.

  A CPU figure is the whole machine's (XLA's thread pool uses every core).
  Forced host devices (--xla_force_host_platform_device_count=N) share those
  cores, so CPU MFU should use num_devices=1, not N.
  """
  import jax  # pylint: disable=g-import-not-at-top
  if device is None:
    device = jax.local_devices()[0]
  name = normalise_dtype(dtype)
  if device.platform == "cpu":
    measure_dtype = "float32" if name == "tfloat32" else name
    value = measured_cpu_peak_flops(measure_dtype)
    return value, (f"measured CPU matmul peak ({measure_dtype}, 1024^3, "
                   f"{value / 1e9:.1f} GFLOP/s)")
  if "tfloat32" in (_published_table(device.device_kind) or {}):
    name = _gpu_float32_as(name)  # an NVIDIA GPU
  published = published_peak_flops(device.device_kind, name)
  if published is not None:
    return published, (f"published peak of {device.device_kind} ({name}, "
                       f"{published / 1e12:.1f} TFLOP/s)")
  measure_dtype = "float32" if name == "tfloat32" else name
  warnings.warn(
      f"no published peak for {device.device_kind!r} ({name}); using a "
      "measured matmul peak, which is below the datasheet figure, so MFU "
      "will read high", stacklevel=2)
  value = measured_matmul_peak_flops(device, measure_dtype, size=4096)
  return value, (f"measured matmul peak of {device.device_kind} "
                 f"({measure_dtype}, 4096^3, {value / 1e12:.2f} TFLOP/s)")


def mfu(flops_per_iter: float, seconds_per_iter: float, num_devices: int,
        peak_per_device: float) -> float:
  """Fraction (0..1) of the devices' combined peak that the model FLOPs use."""
  if seconds_per_iter <= 0 or num_devices < 1 or peak_per_device <= 0:
    raise ValueError(
        f"seconds_per_iter={seconds_per_iter}, num_devices={num_devices} and "
        f"peak_per_device={peak_per_device} must be positive")
  return flops_per_iter / seconds_per_iter / (num_devices * peak_per_device)


def nanogpt_flops_per_iter(num_params_non_embedding: int, n_layer: int,
                           n_head: int, n_embd: int, block_size: int,
                           sequences_per_iter: int,
                           head_size: int = 0) -> float:
  """Training FLOPs per iteration by nanoGPT's `estimate_mfu` formula.

  Per token: 6N for the matmuls with the weights (2 forward, 4 backward) plus
  12*L*H*Q*T for attention scores and values (Q = head size, T = block_size),
  i.e. always the full (non-causal) T x T attention. A forward-backward of one
  sequence is T tokens; an iteration is `sequences_per_iter` =
  batch_size * gradient_accumulation_steps sequences. `head_size` (0:
  n_embd // n_head) is Q for attention wider or narrower than n_embd.
  """
  q = head_size or n_embd // n_head
  per_token = (6 * num_params_non_embedding +
               12 * n_layer * n_head * q * block_size)
  return float(per_token) * block_size * sequences_per_iter
