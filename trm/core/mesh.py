"""The device mesh and logical-axis sharding, both built from the config.

Mesh axes are always ('data', 'fsdp', 'model'). `config.mesh.{data,fsdp,model}`
are sizes inside one slice (ICI); `config.mesh.dcn_{data,fsdp,model}` are sizes
across slices (DCN). One ICI size may be -1: "all remaining devices".

Parameters and activations carry logical axis names ('embed', 'mlp',
'activation_batch', ...); `config.logical_axis_rules` maps them to mesh axes,
ordered, first match wins. Nothing in the code names a mesh axis per array.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Any, Sequence

from absl import logging
import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from trm.core import config_lib
from trm.nn import platform as platform_lib

MESH_AXES = ("data", "fsdp", "model")
# Logical name of the batch axis of activations and input batches.
BATCH = "activation_batch"


class MeshConfigError(ValueError):
  """A mesh or batch setting that cannot work on the devices at hand."""


# Kernel choices that Pallas compiles for TPU only; each has an `_interpret`
# twin that runs in Pallas's interpreter anywhere.
TPU_ONLY_KERNELS = ("pallas", "splash")
GPU_ONLY_KERNELS = ("triton",)  # Pallas Triton kernels (NVIDIA GPUs)


def devices_platform(mesh: Mesh) -> str:
  """Where the mesh's devices are (compile-only ones included): 'tpu',
  'cuda', 'cpu', ..."""
  return mesh.devices.flat[0].platform


def check_tpu_kernels(mesh: Mesh, prefix: str = "config.model.",
                      default: str = "dot", **choices: str) -> None:
  """A TPU-only (or NVIDIA-GPU-only) kernel (`<prefix><field>=value`)
  chosen for a mesh of other devices fails here, naming the field, before
  anything compiles; Pallas itself would only say that CPU supports
  interpret mode. `trm.aot`'s meshes are TPU devices, so its compiles
  pass."""
  platform = devices_platform(mesh)
  for field, kind in choices.items():
    if kind in TPU_ONLY_KERNELS and platform != "tpu":
      raise MeshConfigError(
          f"{prefix}{field}={kind!r} runs on TPU only, and this mesh's "
          f"devices are {platform}: use '{default}', or '{kind}_interpret' "
          "to run the kernel in Pallas's interpreter.")
    if kind in GPU_ONLY_KERNELS and platform not in platform_lib.GPU_PLATFORMS:
      raise MeshConfigError(
          f"{prefix}{field}={kind!r} runs on NVIDIA GPUs only, and this "
          f"mesh's devices are {platform}: use '{default}', or "
          f"'{kind}_interpret' to run the kernel in Pallas's interpreter.")


def _resolve_sizes(sizes: Sequence[int], num_devices: int,
                   what: str, slices: int = 1) -> tuple[int, ...]:
  """Replaces a single -1 so that the product equals `num_devices` (the
  devices of one of `slices` slices)."""
  # With slices, "4 are available" on 8 devices read as a miscount.
  where = (f" in each of the {slices} slices (config.mesh.dcn_* multiply to"
           f" {slices}; {slices * num_devices} devices in all)"
           if slices > 1 else "")
  sizes = [int(s) for s in sizes]
  names = [f"{what}{a}" for a in MESH_AXES]
  for name, size in zip(names, sizes):
    if size == 0 or size < -1:
      raise MeshConfigError(
          f"config.{name}={size}: mesh sizes must be positive, or -1 for "
          "'the remaining devices'.")
  if sizes.count(-1) > 1:
    raise MeshConfigError(
        f"config.{', config.'.join(n for n, s in zip(names, sizes) if s == -1)}"
        " are all -1: at most one mesh axis may be -1.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise MeshConfigError(
          f"The fixed mesh sizes {dict(zip(names, sizes))} multiply to {known}, "
          f"which does not divide the {num_devices} devices available"
          f"{where}; change config.mesh so the product divides the device "
          "count.")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise MeshConfigError(
        f"config.mesh {dict(zip(names, sizes))} has {math.prod(sizes)} devices"
        f" but {num_devices} are available{where}; set one axis to -1 or make"
        " the product equal the device count.")
  return tuple(sizes)


def dcn_sizes(mesh_config) -> tuple[int, ...]:
  """config.mesh's cross-slice sizes of ('data', 'fsdp', 'model'); their
  product is the number of slices the config asks for."""
  dcn = tuple(int(mesh_config.get(f"dcn_{a}", 1)) for a in MESH_AXES)
  for axis, size in zip(MESH_AXES, dcn):
    if size < 1:
      raise MeshConfigError(f"config.mesh.dcn_{axis}={size} must be >= 1.")
  return dcn


def mesh_shapes(mesh_config, num_devices: int) -> tuple[tuple[int, ...],
                                                         tuple[int, ...]]:
  """Returns the (ICI, DCN) sizes of ('data', 'fsdp', 'model')."""
  dcn = dcn_sizes(mesh_config)
  num_slices = math.prod(dcn)
  if num_devices % num_slices:
    raise MeshConfigError(
        f"config.mesh.dcn_* ask for {num_slices} slices, which does not divide"
        f" the {num_devices} devices available.")
  ici = _resolve_sizes([mesh_config[a] for a in MESH_AXES],
                       num_devices // num_slices, "mesh.", num_slices)
  return ici, dcn


def make_mesh(mesh_config, devices: Sequence[Any] | None = None) -> Mesh:
  """Builds the ('data', 'fsdp', 'model') mesh with Auto axis types."""
  devices = list(jax.devices() if devices is None else devices)
  if hasattr(devices[0], "slice_index"):
    # Checked before the ICI sizes, which are counted per slice of the
    # config's: data=8 on two 8-device slices with dcn_data=1 was "has 8
    # devices but 16 are available", not the missing dcn_data=2.
    slices = len({d.slice_index for d in devices})
    wanted = math.prod(dcn_sizes(mesh_config))
    if slices != wanted:
      raise MeshConfigError(
          f"The devices span {slices} slice(s) but config.mesh.dcn_* multiply"
          f" to {wanted}; set --config.mesh.dcn_data={slices}.")
  ici, dcn = mesh_shapes(mesh_config, len(devices))
  if math.prod(dcn) > 1:
    if hasattr(devices[0], "slice_index"):
      array = mesh_utils.create_hybrid_device_mesh(
          ici, dcn, devices, allow_split_physical_axes=True)
    else:
      # Devices without slice information (CPU): consecutive blocks of devices
      # play the slices, and each mesh axis is (dcn, ici) with dcn outermost,
      # which is the layout create_hybrid_device_mesh produces.
      array = np.asarray(devices, dtype=object).reshape(dcn + ici)
      array = array.transpose(0, 3, 1, 4, 2, 5).reshape(
          [d * i for d, i in zip(dcn, ici)])
  elif devices[0].platform == "cpu":
    array = np.asarray(devices, dtype=object).reshape(ici)
  else:
    array = mesh_utils.create_device_mesh(
        ici, devices, allow_split_physical_axes=True)
  return Mesh(array, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def axes_of(value) -> tuple[str, ...]:
  """The mesh axes of a rule's or a spec entry's value (an axis name, a
  tuple of them, or None) as a tuple."""
  return (value,) if isinstance(value, str) else tuple(value or ())


def free_axes(mesh) -> set[str]:
  """The mesh's axes that are not manual already (outside any
  `shard_map`: all of them)."""
  return set(mesh.axis_names) - set(getattr(mesh, "manual_axes", ()) or ())


def logical_rules(config) -> tuple[tuple[str, Any], ...]:
  """The ordered (logical name, mesh axes) rules as hashable tuples."""
  rules = []
  for i, rule in enumerate(config.logical_axis_rules):
    if not isinstance(rule, (tuple, list)) or len(rule) != 2:
      raise MeshConfigError(
          f"config.logical_axis_rules[{i}]={rule!r} must be a pair "
          "(logical_name, mesh_axis | tuple of mesh axes | None).")
    name, axes = rule
    if not isinstance(name, str) or not (
        axes is None or isinstance(axes, str) or (
            isinstance(axes, (tuple, list))
            and all(isinstance(a, str) for a in axes))):
      # Else a traceback from deep in the mesh code (an int axis: "not
      # iterable"; a nested list: "unhashable").
      raise MeshConfigError(
          f"config.logical_axis_rules[{i}]={rule!r} must be a pair "
          "(logical_name, mesh_axis | tuple of mesh axes | None) of strings, "
          f"with mesh axes from {MESH_AXES}.")
    flat = axes_of(axes)
    if len(set(flat)) != len(flat):
      # JAX refuses such a spec only once a sharding is made from it.
      raise MeshConfigError(
          f"config.logical_axis_rules[{i}]={rule!r} names a mesh axis twice; "
          "a dimension is split over each mesh axis at most once.")
    for axis in flat:
      if axis not in MESH_AXES:
        raise MeshConfigError(
            f"config.logical_axis_rules[{i}] maps {name!r} to unknown mesh axis"
            f" {axis!r}; mesh axes are {MESH_AXES}.")
    rules.append((name, axes if isinstance(axes, str) or axes is None
                  else tuple(axes)))
  return tuple(rules)


def check_rules_cover(rules, names: Sequence[str]) -> None:
  """Every logical name in `names` has a rule. Flax replicates an axis whose
  name no rule matches, silently, and a --config.logical_axis_rules
  override replaces the whole list: one rule given on the command line left
  every other array, the batch included, whole on every device (no data
  parallelism on any mesh)."""
  named = {name for name, _ in rules}
  missing = [name for name in names if name not in named]
  if missing:
    raise MeshConfigError(
        f"config.logical_axis_rules has no rule for "
        f"{', '.join(map(repr, missing))}: arrays with these logical axes "
        "would be replicated on every device"
        + (" (the batch too: no data parallelism)" if BATCH in missing
           else "")
        + ". An override replaces the whole list: give every rule (None "
        "replicates a name); the defaults are trm/core/config_lib.py's "
        "default_logical_axis_rules().")


def logical_split(mesh, rules, name: str) -> tuple[tuple[str, ...], int]:
  """(the mesh axes logical axis `name` is split over, how many ways), by
  `rules` (None: the active ones) on `mesh` (a Mesh or an abstract one;
  axes it lacks do not split)."""
  axes = tuple(a for a in axes_of(nn.logical_to_mesh_axes((name,), rules)[0])
               if a in mesh.shape)
  return axes, math.prod(mesh.shape[a] for a in axes)


def batch_parallelism(mesh: Mesh, rules) -> int:
  """How many ways the batch axis is split across devices."""
  return logical_split(mesh, rules, BATCH)[1]


def check_batch_size(global_batch_size: int, mesh: Mesh, rules,
                     field: str = "global_batch_size") -> None:
  """Raises unless the batch splits evenly over devices and processes."""
  ways = batch_parallelism(mesh, rules)
  if global_batch_size <= 0 or global_batch_size % ways:
    raise MeshConfigError(
        f"config.{field}={global_batch_size} must be a positive multiple of "
        f"the data-parallel size {ways} (mesh {dict(mesh.shape)}, batch "
        f"sharded over {nn.logical_to_mesh_axes((BATCH,), rules)[0]}).")
  if global_batch_size % jax.process_count():
    raise MeshConfigError(
        f"config.{field}={global_batch_size} must be divisible by the number "
        f"of processes ({jax.process_count()}).")
  if jax.process_count() > 1:
    # Each process reads only its share of every batch's rows; a mesh whose
    # batch axes do not split the rows over the processes (e.g. the model
    # axis across hosts) gave each process's devices more rows than it
    # read, and the first step failed after compiling (a TypeError).
    spec = nn.logical_to_mesh_axes((BATCH,), rules)
    held = NamedSharding(mesh, spec).addressable_devices_indices_map(
        (global_batch_size,)).values()
    rows = len(set().union(*(range(global_batch_size)[index[0]]
                             for index in held)))
    share = global_batch_size // jax.process_count()
    if rows != share:
      raise MeshConfigError(
          f"config.{field}={global_batch_size}: each of the "
          f"{jax.process_count()} processes reads {share} rows of every "
          f"batch, but the mesh {dict(mesh.shape)} (batch sharded over "
          f"{spec[0]}) places {rows} rows on this process's devices. Split "
          "the processes' devices over the batch axes: make "
          "config.mesh.data (or config.mesh.fsdp) a multiple of the number "
          "of processes.")


def logical_sharding(mesh: Mesh, rules, names: Sequence[str | None]):
  """NamedSharding for an array whose axes carry these logical names."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(tuple(names), rules))


def fit_spec(spec: PartitionSpec, shape, mesh: Mesh) -> PartitionSpec:
  """Drops mesh axes from dimensions they do not divide (those replicate)."""
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    flat = axes_of(axes)
    kept = []
    for axis in flat:
      if dim % (math.prod(mesh.shape[a] for a in kept) * mesh.shape[axis]) == 0:
        kept.append(axis)
    fitted.append(None if not kept else kept[0] if len(kept) == 1
                  else tuple(kept))
  return PartitionSpec(*fitted)


def tree_shardings(mesh: Mesh, rules, boxed_tree):
  """Shardings for a (possibly abstract) tree of `nn.LogicallyPartitioned`.

  A dimension that a mesh axis does not divide (a vocabulary of 11 on
  model=2) is not split along that axis, as MaxText and big_vision do.
  """
  specs = nn.get_partition_spec(boxed_tree)
  shapes = nn.meta.unbox(boxed_tree)
  return jax.tree.map(
      lambda spec, x: NamedSharding(
          mesh, fit_spec(nn.logical_to_mesh_axes(tuple(spec), rules)
                          if spec else PartitionSpec(), x.shape, mesh)),
      specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))


# Mesh axes that split weights (data only replicates them), and MaxText's
# default `sharding_tolerance`: how much more than a fully split share of
# the parameters a device may hold before its
# `assert_params_sufficiently_sharded` stops a run.
WEIGHT_AXES = ("fsdp", "model")
SHARDING_TOLERANCE = 0.02


def replicated_params(params, mesh: Mesh) -> tuple[float, list[str]]:
  """(how much more of the parameters' elements each device holds than if
  every array were split over all weight-splitting mesh axes, as a
  fraction: MaxText's `assert_params_sufficiently_sharded` measure, the
  paths of the arrays some such axis larger than 1 does not split, largest
  first). `params`: arrays or ShapeDtypeStructs carrying NamedShardings."""
  axes = {a for a in WEIGHT_AXES if mesh.shape.get(a, 1) > 1}
  leaves = jax.tree_util.tree_leaves_with_path(params)
  total = sum(math.prod(x.shape) for _, x in leaves)
  if not axes or not total:
    return 0.0, []
  held, whole = 0, []
  for path, x in leaves:
    spec = tuple(x.sharding.spec) + (None,) * (len(x.shape) - len(
        x.sharding.spec))
    held += math.prod(-(-dim // math.prod(mesh.shape[a] for a in axes_of(s)))
                      for dim, s in zip(x.shape, spec))
    used = set(axes_of_spec(spec))
    if not axes <= used:
      whole.append((math.prod(x.shape), jax.tree_util.keystr(path)))
  whole.sort(key=lambda item: -item[0])
  # Not the share of elements left whole: 1.5% of them whole on 8 devices
  # is 10% more on each, which MaxText stops and that share let through.
  split = total / math.prod(mesh.shape[a] for a in axes)
  return max(0.0, held / split - 1), [name for _, name in whole]


def warn_if_params_replicated(params, mesh: Mesh) -> float:
  """Logs a warning when each device holds more than MaxText's 2% more of
  the parameters than a layout splitting all of them along `fsdp` and
  `model` would give it (a rule mapping to None, an override that dropped
  one, dimensions the axis does not divide leave arrays whole, and each
  device then holds and updates those copies in full). MaxText stops such
  a run; here small arrays are replicated on purpose (norm scales, biases,
  4 key/value heads), so tiny models on wide meshes cross the line
  legitimately, and it is a warning. Returns that excess."""
  excess, names = replicated_params(params, mesh)
  if excess > SHARDING_TOLERANCE:
    logging.warning(
        "Each device holds %.1f%% more of the parameters than it would were "
        "all of them split over every weight-splitting mesh axis (%s; "
        "MaxText's sharding_tolerance allows %.0f%%); not split over all of "
        "them, largest first: %s. Check config.logical_axis_rules and that "
        "config.mesh.fsdp/model divide the weights' dimensions.",
        100 * excess,
        ", ".join(f"{a}={mesh.shape[a]}" for a in WEIGHT_AXES
                  if mesh.shape[a] > 1),
        100 * SHARDING_TOLERANCE, ", ".join(names[:5]))
  return excess


# The logical axis of the heads dimension of every family's attention
# activations ([batch, length, heads, head_dim]). The weights' 'heads' axis
# is the heads x head_dim width in GPT and TRM, which a mesh axis can divide
# where the head count does not.
ACTIVATION_HEADS = "activation_heads"


def unsplit_heads(heads: dict[str, int], mesh: Mesh, rules,
                  mesh_config=None) -> str | None:
  """The line saying which of `heads` ({config.model field: head count},
  the family's `attention_heads`) the mesh axes that the rules split
  'activation_heads' over do not divide, or None. `mesh_config`
  (config.mesh) names a cross-slice factor (dcn_model) where there is one."""
  # As the families' constraint ([batch, length, heads, head_dim]) resolves
  # it: a mesh axis the batch or length rule takes first splits no heads.
  axes = axes_of(nn.logical_to_mesh_axes(
      ("activation_batch", "activation_length", ACTIVATION_HEADS, None),
      rules)[2])
  ways = math.prod(mesh.shape[a] for a in axes)
  bad = {field: count for field, count in heads.items() if count % ways}
  if not bad:
    return None
  sizes = []  # (field, value) of each mesh size in the split
  for axis in axes:
    dcn = int(mesh_config.get(f"dcn_{axis}", 1)) if mesh_config else 1
    sizes.append((f"mesh.{axis}", mesh.shape[axis] // dcn))
    if mesh_config and mesh_config.get(axis) == -1:  # the size it took
      sizes[-1] = (f"mesh.{axis}", f"{sizes[-1][1]} (-1: the devices left)")
    if dcn > 1:
      sizes.append((f"mesh.dcn_{axis}", dcn))
  split = " x ".join(f"config.{f}={n}" for f, n in sizes)
  use = (f"a {sizes[0][0]} that" if len(sizes) == 1 else
         f"{', '.join(f for f, _ in sizes)} whose product")
  fits = math.gcd(*heads.values())
  # A mesh size divides the device count too (no mesh.model=3 on 8 chips).
  divisors = ", ".join(str(d) for d in range(1, min(fits, mesh.size) + 1)
                       if fits % d == 0 and mesh.size % d == 0)
  count = next(iter(bad.values()))
  slots = ways * -(-count // ways)
  # Not refused: GSPMD pads the uneven split and the step computes the
  # same numbers (a run trains); only the attention's work is not divided.
  return (
      f"{', '.join(f'config.model.{f}={n}' for f, n in bad.items())} "
      f"{'is' if len(bad) == 1 else 'are'} not a multiple of {split}, over "
      "which config.logical_axis_rules split the attention heads "
      f"('{ACTIVATION_HEADS}' -> {' x '.join(axes)}): XLA pads the {count} "
      f"heads to {slots} ({slots - count} of padding) and moves the "
      "attention's activations in and out of that split (its 'Involuntary "
      "full rematerialization' lines); the run trains correctly, but that "
      f"split does not divide the attention's work. Use {use} divides "
      f"{', '.join(heads)} ({divisors}), or map '{ACTIVATION_HEADS}' to "
      "None.")


def constrain(x, names: Sequence[str | None]):
  """Activation sharding hint by logical names (no-op outside a mesh)."""
  return nn.with_logical_constraint(x, tuple(names))


class ShardingContext:
  """The mesh and the ordered logical-axis rules, held together.

  Everything that places arrays needs both, so they travel as one object:
  `with ctx:` activates the mesh (`jax.set_mesh`) and the rules
  (`nn.logical_axis_rules`) for tracing, and the methods turn logical names
  into shardings.
  """

  def __init__(self, mesh: Mesh, rules):
    self.mesh, self.rules = mesh, tuple(rules)
    # Per thread: each `with` must leave the contexts it entered (their
    # context-variable tokens belong to its thread), also when threads
    # share this object (concurrent `DiffusionLM.generate` calls).
    self._local = threading.local()

  @property
  def _stack(self) -> list:
    if not hasattr(self._local, "stack"):
      self._local.stack = []
    return self._local.stack

  @classmethod
  def from_config(cls, config, devices: Sequence[Any] | None = None):
    """The config's mesh (`config.mesh`) and rules
    (`config.logical_axis_rules`); a TPU-only kernel in `config.model` for
    other devices fails here, before any data or model is built."""
    mesh = make_mesh(config.mesh, devices)
    model = config.get("model") or {}
    check_tpu_kernels(mesh, **{k: model[k] for k in ("mlp_kernel", "attention")
                               if k in model})
    if "norm_kernel" in model:
      check_tpu_kernels(mesh, default="xla", norm_kernel=model.norm_kernel)
    if "loss_kernel" in config:
      check_tpu_kernels(mesh, prefix="config.", default="xla",
                        loss_kernel=config.loss_kernel)
    rules = logical_rules(config)
    # The names the code's arrays carry (config_lib's defaults name each).
    check_rules_cover(rules, [name for name, _ in
                              config_lib.default_logical_axis_rules()])
    return cls(mesh, rules)

  def __enter__(self):
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.mesh))
    stack.enter_context(nn.logical_axis_rules(self.rules))
    stack.enter_context(platform_lib.mesh_platform(self.platform))
    self._stack.append(stack)
    return self

  @property
  def platform(self) -> str:
    """Where the mesh's devices are (compile-only ones included)."""
    return devices_platform(self.mesh)

  def __exit__(self, *exc):
    return self._stack.pop().__exit__(*exc)

  def sharding(self, names: Sequence[str | None]) -> NamedSharding:
    return logical_sharding(self.mesh, self.rules, names)

  def tree_shardings(self, boxed_tree):
    return tree_shardings(self.mesh, self.rules, boxed_tree)

  def boxed_shardings(self, build_boxed):
    """(boxed abstract tree `build_boxed()` traced under the rules, its
    shardings): a model's parameters or a whole train state."""
    with nn.logical_axis_rules(self.rules), platform_lib.mesh_platform(
        self.platform):
      boxed = build_boxed()
    return boxed, self.tree_shardings(boxed)

  @property
  def batch_parallelism(self) -> int:
    return batch_parallelism(self.mesh, self.rules)

  def check_batch_size(self, global_batch_size: int,
                       field: str = "global_batch_size") -> None:
    check_batch_size(global_batch_size, self.mesh, self.rules, field)


def per_batch_shard(fn, sharded, replicated, *, batch_axis, reduce_outputs=(),
                    reduced_layouts=None):
  """fn(*local sharded, *replicated) on each shard of the batch axis
  (`batch_axis` of every `sharded` array, split as 'activation_batch').
  Outputs whose index is in `reduce_outputs` are summed over the shards;
  the others are split like the inputs. `reduced_layouts`: {index of a
  summed output: its logical axis names}: that sum leaves laid out as the
  names say rather than whole on every device; over each mesh axis of that
  layout that the batch is split over the shards reduce-scatter it, over
  the others each device keeps its own slice."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn(*sharded, *replicated)
  # Inside `trm.core.data_parallel.sum_over_data` every axis is manual
  # already: fn runs on this device's rows, and outputs to reduce stay
  # this device's share, which that step sums once.
  free = free_axes(mesh)
  if not free:
    return fn(*sharded, *replicated)
  batch = nn.logical_to_mesh_axes((BATCH,))[0]
  axes = axes_of(batch)

  def split(ndim):
    return jax.sharding.PartitionSpec(
        *(batch if i == batch_axis else None for i in range(ndim)))

  whole = jax.sharding.PartitionSpec()
  outs = jax.eval_shape(fn, *sharded, *replicated)
  layouts = {}
  for i, names in (reduced_layouts or {}).items():
    if i not in reduce_outputs:
      raise ValueError(f"reduced_layouts names output {i}, which is not in "
                       f"reduce_outputs={tuple(reduce_outputs)}.")
    spec = fit_spec(nn.logical_to_mesh_axes(tuple(names)), outs[i].shape,
                     mesh)
    if set(axes_of_spec(spec)) <= free:
      layouts[i] = spec

  def run(*args):
    results = fn(*args)
    return tuple(_sum_into(o, axes, layouts.get(i, whole), mesh)
                 if i in reduce_outputs else o
                 for i, o in enumerate(results))

  return jax.shard_map(
      run, mesh=mesh, axis_names=free,
      in_specs=(tuple(split(a.ndim) for a in sharded)
                + (whole,) * len(replicated)),
      out_specs=tuple(layouts.get(i, whole) if i in reduce_outputs
                      else split(o.ndim) for i, o in enumerate(outs)),
      check_vma=False)(*sharded, *replicated)


def axes_of_spec(spec: PartitionSpec) -> tuple[str, ...]:
  """Every mesh axis a PartitionSpec names, in order."""
  return tuple(a for entry in spec for a in axes_of(entry))


def _sum_into(x, axes: tuple[str, ...], spec: PartitionSpec, mesh):
  """Inside a shard_map: this device's part of x summed over the mesh axes
  `axes`, as `spec` lays the sum out (`spec`'s other axes hold the same x
  on every device, so each keeps its slice)."""
  # A sum over one device is the identity (and an all-reduce XLA may keep).
  axes = tuple(a for a in axes if mesh.shape[a] > 1)
  laid = set(axes_of_spec(spec))
  rest = tuple(a for a in axes if a not in laid)
  if rest:
    x = jax.lax.psum(x, rest)
  for dim, entry in enumerate(spec):
    entry = axes_of(entry)
    if entry and all(a in axes for a in entry):
      # Tiled over a tuple of axes, the first the major one, as a spec's
      # entry orders them.
      x = _scatter(x, entry, dim, spec, mesh)
    elif entry:
      summed = tuple(a for a in entry if a in axes)
      if summed:
        x = jax.lax.psum(x, summed)
      x = _slice_dim(x, dim, entry, mesh)
  return x


def _scatter(x, entry: tuple[str, ...], dim: int, spec: PartitionSpec, mesh):
  """x summed over the mesh axes `entry`, split over them along `dim`.
  XLA:TPU (libtpu 0.0.42.1) writes this reduce-scatter as a whole
  all-reduce and a slice. Along a minor dimension it fused the slice
  into the sum's last reader (a step's finite check, after every layer's
  backward pass), so the whole sum stayed alive until then. Where the
  leading dimension is free and divides, the sum is scattered along it
  and an all-to-all of the shares (1/n of x) moves the split to `dim`: a
  collective reads the slice, so the whole sum dies at once."""
  ways = math.prod(mesh.shape[a] for a in entry)
  if (dim > 0 and math.prod(mesh.shape[a] for a in axes_of(spec[0])) == 1
      and x.shape[0] % ways == 0
      and x.shape[dim] % ways == 0):
    x = jax.lax.psum_scatter(x, entry, scatter_dimension=0, tiled=True)
    return jax.lax.all_to_all(x, entry, split_axis=dim, concat_axis=0,
                              tiled=True)
  return jax.lax.psum_scatter(x, entry, scatter_dimension=dim, tiled=True)


def _slice_dim(x, dim: int, entry: tuple[str, ...], mesh):
  """This device's block of x's `dim` split over the mesh axes `entry`
  (the first the major one)."""
  size = x.shape[dim] // math.prod(mesh.shape[a] for a in entry)
  return jax.lax.dynamic_slice_in_dim(
      x, jax.lax.axis_index(entry) * size, size, axis=dim)
