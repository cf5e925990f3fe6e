r"""Compile the real train step for a TPU topology on a CPU host.

  python -m trm.aot --config=configs/trm_sudoku.py --topology=v4-64 \
      [--num_slices=2 --config.mesh.dcn_data=2] [--config.key=value]
  python -m trm.aot --config=configs/gpt.py --topology=v4-8 --vocab_size=50304
  python -m trm.aot --config=configs/diffucoder_7b.py --topology=v4-64 \
      --mode=sample [--sample_batch=32 --prompt_len=512 --max_new_tokens=512
      --steps=512 --alg=entropy --temperature=0.3 --top_p=0.95]

Uses libtpu's compile-only devices (`pip install -e .[tpu]`; no TPU needed)
and the trainer's own mesh, sharding and step code, then prints per chip the
argument, output, temporary and total bytes against the usable HBM, a FITS /
DOES NOT FIT verdict (exit code 1 when it does not fit), the compile time,
and the analytic training FLOPs per step with the step time they imply at 50%
MFU.

`--mode=sample` (Dream / DiffuCoder configs) compiles instead the whole
masked-diffusion sampling loop (`diffusion_sampling.diffusion_generate`, as
`trm.generate` runs it: weights sharded by the config's rules and passed as
arguments, a left-padded prompt batch with its padding mask, replicated as
`trm.generate`'s host arrays are; the model's activation constraints shard
the batch over the data-parallel axes inside). Its FLOPs are the model
forward over prompt + canvas, times the steps.
"""
from __future__ import annotations

import os

# Before jax loads libtpu: compile for TPU from a host that has none.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import dataclasses  # pylint: disable=g-import-not-at-top,wrong-import-position
import math
import re
import sys
import time

from absl import app, flags  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags

from trm.core import cli
from trm.core import config_lib
from trm.core import loss_scale

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  usable_hbm_gib: float   # what XLA:TPU reports as available (libtpu 0.0.42.1)
  peak_bf16_tflops: float  # published peak per chip
  chip_config: str
  chips_per_host: tuple[int, int, int]
  hbm_gbps: float         # published HBM bandwidth per chip, GB/s


CHIPS = {
    "v4": Chip(30.75, 275.0, "megacore", (2, 2, 1), 1200.0),
    "v5p": Chip(95.74, 459.0, "megacore", (2, 2, 1), 2765.0),
    "v5e": Chip(15.75, 197.0, "default", (2, 2, 1), 819.0),
    "v6e": Chip(31.25, 918.0, "default", (2, 2, 1), 1640.0),
}

# Physical shape per chip count (v4 and v5p name cores: v4-N has N/2 chips).
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4",
              128: "4x4x8", 256: "4x8x8", 512: "8x8x8", 768: "8x8x12",
              1024: "8x8x16", 2048: "8x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8",
              128: "8x16", 256: "16x16"}


@dataclasses.dataclass(frozen=True)
class Topology:
  name: str        # e.g. v4-64
  generation: str  # v4 | v5p | v5e | v6e
  shape: str       # e.g. 2x4x4
  chips: int

  @property
  def chip(self) -> Chip:
    return CHIPS[self.generation]


def parse_topology(name: str) -> Topology:
  """'v4-64' -> 32 v4 chips in a 2x4x4 torus; v5litepod-N is v5e-N."""
  match = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name)
  if not match:
    raise ValueError(f"--topology={name!r}: use v4-N, v5p-N (N = TensorCores,"
                     " 2 per chip), v5e-N or v6e-N (N = chips), e.g. v4-64.")
  generation, count = match.group(1), int(match.group(2))
  generation = "v5e" if generation == "v5litepod" else generation
  if generation in ("v4", "v5p"):
    chips, shapes = count // 2, _SHAPES_3D
  else:
    chips, shapes = count, _SHAPES_2D
  if chips not in shapes or (generation in ("v4", "v5p") and count % 2):
    raise ValueError(f"--topology={name!r} is not a known slice size; known "
                     f"{generation} sizes: " + ", ".join(
                         f"{generation}-{c * 2 if generation in ('v4', 'v5p') else c}"
                         for c in sorted(shapes)))
  return Topology(name, generation, shapes[chips], chips)


def topology_devices(topology: Topology, num_slices: int):
  """Compile-only TPU devices from libtpu (no TPU needed)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    return topologies.get_topology_desc(
        platform="tpu", topology_name=f"{topology.generation}:{topology.shape}",
        chip_config_name=topology.chip.chip_config,
        chips_per_host_bounds=topology.chip.chips_per_host,
        num_slices=num_slices).devices
  except Exception as e:  # pylint: disable=broad-except
    raise RuntimeError(
        f"Could not create {topology.name} devices from libtpu ({e}). Install "
        "the TPU extra: pip install -e .[tpu]") from e


def _train_step_builder(config, mesh, rules, metadata,
                        unroll_loops: bool = False):
  """(function that compiles the model family's train step, FLOPs per step).

  `unroll_loops` (TRM): the recursion Python-unrolled, for cost analysis."""
  import jax  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.models import get_model  # pylint: disable=g-import-not-at-top

  def under_mesh(fn):
    def run():
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        return fn()
    return run

  batch = config.global_batch_size
  if config.model.name == "dream":
    from trm.families.dream import steps as lm_steps  # pylint: disable=g-import-not-at-top
    model = get_model(config.model)
    tx = lm_steps.make_optimizer(config.optim, config.total_steps)
    init_fn = lm_steps.make_init_fn(model, tx, config.seed,
                                    loss_scale.initial_state(config))
    abstract, shardings = state_lib.abstract_state(init_fn, mesh, rules)
    batch_shardings = lm_steps.batch_shardings(mesh, rules)
    flops = lm_steps.train_flops_per_example(model.cfg, config.seq_len) * batch
    return under_mesh(lambda: lm_steps.compile_train_step(
        config, model, tx, abstract, shardings, batch_shardings)), flops
  if config.model.name == "gpt":
    return _gpt_train_step_builder(config, mesh, rules, under_mesh)
  from trm.families.trm import steps  # pylint: disable=g-import-not-at-top
  from trm.core import pipeline  # pylint: disable=g-import-not-at-top
  from trm.families.trm import model as trm  # pylint: disable=g-import-not-at-top
  model = get_model(config.model, metadata)
  if unroll_loops:
    model = trm.TRM(dataclasses.replace(model.cfg, unroll_loops=True))
  tx = steps.make_optimizer(config.optim, config.total_steps)
  init_fn = state_lib.make_init_fn(model, tx, batch, config.seed)
  abstract, shardings = state_lib.abstract_state(init_fn, mesh, rules)
  batch_shardings = pipeline.batch_shardings(mesh, rules)
  flops = trm.train_flops_per_example(model.cfg) * batch
  return under_mesh(lambda: steps.compile_train_step(
      config, model, tx, abstract, shardings, batch_shardings,
      metadata.seq_len)), flops


def _gpt_train_step_builder(config, mesh, rules, under_mesh):
  """nanoGPT's iteration (configs/gpt.py): accumulation and AdamW in one
  step. A character-level config's vocabulary comes from its data, so an
  unset `model.vocab_size` needs --vocab_size."""
  import functools  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top
  from trm.families.dream import steps as lm_steps  # pylint: disable=g-import-not-at-top
  from trm.core import mfu  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  if not config.model.vocab_size:
    raise ValueError("config.model.vocab_size is 0 (taken from the prepared "
                     "data at training time): pass --vocab_size, e.g. 65 for "
                     "tinyshakespeare's characters or 50304 for GPT-2's "
                     "tokens (nanoGPT's padded figure).")
  cfg = gpt.GPTConfig.from_config(config.model)
  model = gpt.GPT(cfg)
  tx = gpt_steps.make_optimizer(config)
  init_fn = lm_steps.make_init_fn(model, tx, config.seed,
                                  loss_scale.initial_state(config))
  abstract, shardings = state_lib.abstract_state(init_fn, mesh, rules)
  batch_shardings = gpt_steps.batch_shardings(mesh, rules)
  abstract_batch = gpt_steps.abstract_batch(
      config.global_batch_size, cfg.block_size, batch_shardings)
  step = functools.partial(gpt_steps.train_step, model=model, tx=tx,
                           accum_steps=config.gradient_accumulation_steps)
  flops = mfu.nanogpt_flops_per_iter(
      gpt.num_params(gpt.abstract_params(cfg), non_embedding=True),
      cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size,
      config.global_batch_size)
  return under_mesh(lambda: state_lib.compile_step(
      step, abstract, shardings, abstract_batch)), flops


@dataclasses.dataclass(frozen=True)
class SampleSettings:
  """What `--mode=sample` compiles: one `diffusion_generate` call."""
  batch: int | None        # prompts per call (None: one per data-parallel
                           # device, filled in by `compile_report`)
  prompt_len: int = 512    # left-padded prompt length P
  max_new_tokens: int = 512
  steps: int = 512
  alg: str = "entropy"
  temperature: float = 0.0
  top_p: float | None = None

  def __post_init__(self):
    from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top
    for flag, value in (("sample_batch", self.batch),
                        ("prompt_len", self.prompt_len),
                        ("max_new_tokens", self.max_new_tokens),
                        ("steps", self.steps)):
      if value is not None and (not isinstance(value, int) or value < 1):
        raise ValueError(f"--{flag}={value!r} must be a positive integer.")
    if self.alg not in diffusion_sampling.ALGS:
      raise ValueError(f"--alg={self.alg!r}: choose from "
                       f"{', '.join(diffusion_sampling.ALGS)}.")
    if self.temperature < 0:
      raise ValueError(f"--temperature={self.temperature} must be >= 0.")
    if self.top_p is not None and not 0 < self.top_p <= 1:
      raise ValueError(f"--top_p={self.top_p} must lie in (0, 1].")


def sample_flops_per_call(cfg, batch: int, prompt_len: int,
                          max_new_tokens: int, steps: int) -> int:
  """Model FLOPs of one sampling call: every step is a full forward over
  prompt + canvas (no KV cache), i.e. a third of the train step's 6N."""
  from trm.families.dream import steps as lm_steps  # pylint: disable=g-import-not-at-top
  length = prompt_len + max_new_tokens
  return lm_steps.train_flops_per_example(cfg, length) // 3 * batch * steps


def _sample_builder(config, mesh, rules, sample: SampleSettings):
  """(function that compiles the sampling loop, FLOPs per call)."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
  from trm.families.dream import sampling as diffusion_sampling  # pylint: disable=g-import-not-at-top
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top

  cfg = dream.DreamConfig.from_config(config.model)
  with nn.logical_axis_rules(rules):
    boxed = dream.abstract_params(cfg)
    shardings = mesh_lib.tree_shardings(mesh, rules, boxed)
  params = state_lib.with_shardings(nn.meta.unbox(boxed), shardings)
  # trm.generate hands the sampler host arrays: they enter replicated.
  replicated = NamedSharding(mesh, PartitionSpec())
  shape = (sample.batch, sample.prompt_len)
  ids = jax.ShapeDtypeStruct(shape, jnp.int32, sharding=replicated)
  mask = jax.ShapeDtypeStruct(shape, jnp.bool_, sharding=replicated)
  key = jax.eval_shape(lambda: jax.random.key(0))
  rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=replicated)

  def compile_sampler():
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return diffusion_sampling.lower_generate(
          dream.denoiser(cfg), ids, mask, params=params, rng=rng,
          mask_token_id=cfg.mask_token_id,
          max_new_tokens=sample.max_new_tokens, steps=sample.steps,
          alg=sample.alg, temperature=sample.temperature,
          top_p=sample.top_p).compile()

  flops = sample_flops_per_call(cfg, sample.batch, sample.prompt_len,
                                sample.max_new_tokens, sample.steps)
  return compile_sampler, flops


def step_cost(compiled) -> tuple[float, float]:
  """(FLOPs, bytes accessed) per device from XLA's cost analysis of a
  compiled program (loop bodies counted once: see `unroll_loops`)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0]
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def roofline(flops: float, hbm_bytes: float, chip: Chip) -> dict:
  """Per-device step time bounds from compute and from HBM traffic."""
  compute_s = flops / (chip.peak_bf16_tflops * 1e12)
  memory_s = hbm_bytes / (chip.hbm_gbps * 1e9)
  return {"xla_flops_per_device": flops, "hbm_bytes_per_device": hbm_bytes,
          "flops_per_byte": flops / hbm_bytes if hbm_bytes else float("inf"),
          "compute_seconds": compute_s, "memory_seconds": memory_s,
          "bound": "memory" if memory_s > compute_s else "compute"}


def compile_report(config, topology: Topology, num_slices: int,
                   metadata=None, sample: SampleSettings | None = None
                   ) -> dict:
  """Compiles the train step (or with `sample`, the Dream sampling loop) for
  the topology; returns the figures."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  slices = math.prod(config.mesh.get(f"dcn_{a}", 1) for a in mesh_lib.MESH_AXES)
  if slices != num_slices:
    raise mesh_lib.MeshConfigError(
        f"config.mesh.dcn_* multiply to {slices} slices but --num_slices="
        f"{num_slices}: set --config.mesh.dcn_data={num_slices}.")
  devices = topology_devices(topology, num_slices)
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  rules = mesh_lib.logical_rules(config)
  half_peak = 0.5 * len(devices) * topology.chip.peak_bf16_tflops * 1e12
  report = {
      "mode": "sample" if sample else "train",
      "topology": topology.name, "num_slices": num_slices,
      "chips": len(devices), "mesh": dict(mesh.shape),
      "usable_gib": topology.chip.usable_hbm_gib,
  }
  if sample is None:
    mesh_lib.check_batch_size(config.global_batch_size, mesh, rules)
    compile_step, flops = _train_step_builder(config, mesh, rules, metadata)
    report.update({
        "global_batch_size": config.global_batch_size,
        "per_device_batch": config.global_batch_size
                            / mesh_lib.batch_parallelism(mesh, rules),
        "train_flops_per_step": flops,
        "step_seconds_at_50pct_mfu": flops / half_peak,
    })
  else:
    if config.model.name != "dream":
      raise ValueError(f"--mode=sample compiles the masked-diffusion sampler "
                       f"of 'dream' models; config.model.name is "
                       f"{config.model.name!r}.")
    ways = mesh_lib.batch_parallelism(mesh, rules)
    if sample.batch is None:
      sample = dataclasses.replace(sample, batch=ways)
    compile_step, flops = _sample_builder(config, mesh, rules, sample)
    seconds = flops / half_peak
    report.update({
        "sample_batch": sample.batch,
        "per_device_batch": sample.batch / ways,
        "prompt_len": sample.prompt_len,
        "max_new_tokens": sample.max_new_tokens,
        "steps": sample.steps, "alg": sample.alg,
        "temperature": sample.temperature, "top_p": sample.top_p,
        "param_dtype": config.model.param_dtype,
        "sample_flops_per_call": flops,
        "call_seconds_at_50pct_mfu": seconds,
        "new_tokens_per_second_at_50pct_mfu":
            sample.batch * sample.max_new_tokens / seconds,
    })
  start = time.time()
  try:
    compiled = compile_step()
  except Exception as e:  # pylint: disable=broad-except
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text and "hbm" not in text.lower():
      raise
    report.update(compile_seconds=time.time() - start, fits=False,
                  error=text.splitlines()[0][:400])
    return report
  compile_seconds = time.time() - start
  if sample is None and config.model.name == "trm":
    # XLA counts each loop body once; the unrolled twin counts every cycle.
    start = time.time()
    unrolled = _train_step_builder(config, mesh, rules, metadata,
                                   unroll_loops=True)[0]()
    report.update(roofline(*step_cost(unrolled), topology.chip),
                  analysis_compile_seconds=time.time() - start)
  memory = compiled.memory_analysis()
  total = (memory.argument_size_in_bytes + memory.output_size_in_bytes
           + memory.temp_size_in_bytes - memory.alias_size_in_bytes)
  report.update(
      compile_seconds=compile_seconds,
      argument_gib=memory.argument_size_in_bytes / GIB,
      output_gib=memory.output_size_in_bytes / GIB,
      temp_gib=memory.temp_size_in_bytes / GIB,
      alias_gib=memory.alias_size_in_bytes / GIB,
      total_gib=total / GIB,
      fits=total / GIB <= topology.chip.usable_hbm_gib)
  return report


def format_report(report: dict) -> str:
  where = (f"topology: {report['topology']} x {report['num_slices']} "
           f"slice(s), {report['chips']} chips; mesh {report['mesh']}; ")
  if report.get("mode") == "sample":
    lines = [
        where + f"sampling batch {report['sample_batch']} "
        f"({report['per_device_batch']:g} per data-parallel device), prompt "
        f"{report['prompt_len']} + {report['max_new_tokens']} new tokens, "
        f"{report['steps']} steps, alg {report['alg']}, temperature "
        f"{report['temperature']:g}, top_p {report['top_p']}; params "
        f"{report['param_dtype']}"]
  else:
    lines = [where + f"global batch {report['global_batch_size']} "
             f"({report['per_device_batch']:g} per data-parallel device)"]
  lines.append(f"compile_seconds: {report['compile_seconds']:.1f}")
  if "total_gib" in report:
    lines.append(
        f"per chip: arguments {report['argument_gib']:.2f} GiB, outputs "
        f"{report['output_gib']:.2f} GiB, temporaries {report['temp_gib']:.2f}"
        f" GiB, aliased {report['alias_gib']:.2f} GiB, total "
        f"{report['total_gib']:.2f} GiB of {report['usable_gib']:.2f} GiB "
        "usable")
  else:
    lines.append(f"compiler: {report['error']}")
  if report.get("mode") == "sample":
    lines += [
        f"sample_flops_per_call: {report['sample_flops_per_call']:.3e} (model"
        " FLOPs: forward x steps)",
        f"call_seconds_at_50pct_mfu: {report['call_seconds_at_50pct_mfu']:.3f}"
        f" ({report['new_tokens_per_second_at_50pct_mfu']:.1f} new tokens/s)",
    ]
  else:
    lines += [
        f"train_flops_per_step: {report['train_flops_per_step']:.3e} (model "
        "FLOPs)",
        f"step_seconds_at_50pct_mfu: "
        f"{report['step_seconds_at_50pct_mfu']:.4f}",
    ]
  if "hbm_bytes_per_device" in report:
    lines.append(
        f"compiled program per chip (recursion unrolled): "
        f"{report['xla_flops_per_device']:.3e} FLOPs, "
        f"{report['hbm_bytes_per_device'] / GIB:.2f} GiB HBM traffic, "
        f"{report['flops_per_byte']:.0f} FLOPs/byte; at peak "
        f"{report['compute_seconds'] * 1e3:.2f} ms compute vs "
        f"{report['memory_seconds'] * 1e3:.2f} ms memory: "
        f"{report['bound']}-bound (analysis compile "
        f"{report['analysis_compile_seconds']:.1f} s)")
  lines.append(f"verdict: {'FITS' if report['fits'] else 'DOES NOT FIT'}")
  return "\n".join(lines)


def dataset_metadata(config, overrides: dict):
  """Shapes of the config's dataset without reading it (TRM configs; None
  for language models, whose shapes are all in the config)."""
  if config.model.name != "trm":
    return None
  build = config.data.build
  if config.data.name == "sudoku":
    from trm.data.puzzles import sudoku  # pylint: disable=g-import-not-at-top
    metadata = sudoku.dataset_metadata(1)
  elif config.data.name == "maze":
    from trm.data.puzzles import maze  # pylint: disable=g-import-not-at-top
    metadata = maze.dataset_metadata(1)
  elif config.data.name == "arc":
    from trm.data.puzzles import arc  # pylint: disable=g-import-not-at-top
    # Upstream's data include ConceptARC (the kaggle source's default).
    metadata = arc.dataset_metadata(
        build.version, build.num_aug,
        concept=build.source == "kaggle" or bool(build.concept_dir))
  else:
    raise ValueError(f"config.data.name={config.data.name!r}: no known shapes;"
                     " known: 'sudoku', 'maze', 'arc'.")
  return dataclasses.replace(
      metadata, **{k: v for k, v in overrides.items() if v is not None})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _TOPOLOGY.value:
    raise app.UsageError("--topology is required, e.g. --topology=v4-8.")
  topology = parse_topology(_TOPOLOGY.value)
  if _NUM_SLICES.value < 1:
    raise app.UsageError("--num_slices must be >= 1.")
  sample = sample_settings_from_flags()
  if sample is None and _CONFIG.value.model.name == "gpt":
    metadata = None
    if _VOCAB.value:
      _CONFIG.value.model.vocab_size = _VOCAB.value
  elif sample is None:
    metadata = dataset_metadata(_CONFIG.value, {
        "seq_len": _SEQ_LEN.value, "vocab_size": _VOCAB.value,
        "num_puzzle_identifiers": _PUZZLES.value})
  elif _CONFIG.value.model.name != "dream":
    raise app.UsageError(
        "--mode=sample compiles the masked-diffusion sampler of 'dream' "
        f"models; --config has model {_CONFIG.value.model.name!r}.")
  else:
    metadata = None
  report = compile_report(_CONFIG.value, topology, _NUM_SLICES.value,
                          metadata, sample)
  print(format_report(report), flush=True)
  sys.exit(0 if report["fits"] else 1)


_TRAIN_ONLY = ("seq_len", "vocab_size", "num_puzzle_identifiers")
_SAMPLE_ONLY = ("sample_batch", "prompt_len", "max_new_tokens", "steps",
                "alg", "temperature", "top_p")


def sample_settings_from_flags() -> SampleSettings | None:
  """SampleSettings for --mode=sample, None for --mode=train; flags of the
  other mode are an error rather than silently ignored."""
  given = lambda names: [f"--{n}" for n in names  # noqa: E731
                         if flags.FLAGS[n].present]
  if _MODE.value == "train":
    if given(_SAMPLE_ONLY):
      raise app.UsageError(f"{', '.join(given(_SAMPLE_ONLY))} only apply to "
                           "--mode=sample.")
    return None
  if given(_TRAIN_ONLY):
    raise app.UsageError(f"{', '.join(given(_TRAIN_ONLY))} only apply to "
                         "--mode=train.")
  try:
    return SampleSettings(
        batch=_SAMPLE_BATCH.value, prompt_len=_PROMPT_LEN.value,
        max_new_tokens=_MAX_NEW.value,
        steps=_MAX_NEW.value if _STEPS.value is None else _STEPS.value,
        alg=_ALG.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e


def _check_topology_flag(name: str | None) -> bool:
  """--topology is checked while flags are parsed: one line, no traceback."""
  if name is not None:
    try:
      parse_topology(name)
    except ValueError as e:
      raise flags.ValidationError(str(e)) from e
  return True


def define_flags():
  """Defines the command-line flags; only when run as a program, so that
  tests can import several entry points into one process."""
  global _CONFIG, _TOPOLOGY, _NUM_SLICES, _SEQ_LEN, _VOCAB, _PUZZLES, _MODE
  global _SAMPLE_BATCH, _PROMPT_LEN, _MAX_NEW, _STEPS, _ALG, _TEMPERATURE
  global _TOP_P
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.",
                                            lock_config=True)
  _TOPOLOGY = flags.DEFINE_string("topology", None, "e.g. v4-8, v4-64, v5p-128.")
  flags.register_validator("topology", _check_topology_flag)
  _NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices (multi-slice).")
  _SEQ_LEN = flags.DEFINE_integer("seq_len", None, "Override the dataset's "
                                  "sequence length (e.g. 900 for ARC/Maze).")
  _VOCAB = flags.DEFINE_integer("vocab_size", None, "Override the vocabulary.")
  _PUZZLES = flags.DEFINE_integer("num_puzzle_identifiers", None,
                                  "Override the puzzle-embedding rows.")
  _MODE = flags.DEFINE_enum("mode", "train", ["train", "sample"],
                            "train: the train step; sample: the Dream "
                            "masked-diffusion sampling loop.")
  _SAMPLE_BATCH = flags.DEFINE_integer(
      "sample_batch", None, "sample: prompts per call (default: one per "
      "data-parallel device).")
  _PROMPT_LEN = flags.DEFINE_integer("prompt_len", 512, "sample: left-padded "
                                     "prompt length.")
  _MAX_NEW = flags.DEFINE_integer("max_new_tokens", 512,
                                  "sample: tokens generated per prompt.")
  _STEPS = flags.DEFINE_integer("steps", None, "sample: denoising steps "
                                "(default: --max_new_tokens).")
  _ALG = flags.DEFINE_string("alg", "entropy", "sample: origin, "
                             "maskgit_plus, topk_margin or entropy.")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sample: token "
                                    "sampling temperature (0: greedy).")
  _TOP_P = flags.DEFINE_float("top_p", None, "sample: nucleus mass (None: "
                              "off; 0.95 compiles the vocabulary sort).")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config"])
  cli.run(main)
