"""A train step compiled once (`python -m trm.aot --save_compiled=FILE`) and
loaded by every run (`--config.compiled_step=FILE`) instead of compiling.

The file is one header line of JSON after a magic line, then the payload:
what `jax.experimental.serialize_executable.serialize` makes of the
compiled step (a pickle whose executables are XLA's own serialized form).
The header says what the step was built for: jax / jaxlib / libtpu, the
devices (platform, kind, count, processes, slices, chip grid), the mesh
(axis sizes and device order), every input's shape, dtype and sharding,
the input and output tree structures, the config fields that shape the
program, a hash of the `trm` package's code, and the payload's SHA-256.

A run checks all of it before anything compiles and names the first
difference in one line ("built for X, this run has Y"). The payload is
read with an unpickler that builds only the jax classes a compiled step
holds, refuses any other by name, and sets state on instances only (never
on a class or function itself). That closes the pickle's door, not the
executable's: a compiled step is native code that runs on the devices, so
load only files you built yourself (or got from someone you would let run
code on the machine). The checksum only catches damage, not intent.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import io
import json
import os
import pickle
import socket
import time
import types

import jax
from etils import epath

from trm.core import cli
from trm.core import config_record
from trm.core import cpu_collectives
from trm.data import atomic_files
from trm.data import io as data_io

MAGIC = b"TRM-COMPILED-STEP 1\n"
FIELD = "config.compiled_step"
_REBUILD = "rebuild it with `python -m trm.aot --save_compiled=FILE`"
# Why an XLA:CPU step of some meshes is neither saved nor loaded
# (trm.core.cpu_collectives).
_CPU_DEADLOCK = ("collectives span several groupings of the devices (two or "
                 "more mesh axes larger than 1), or whose program could not "
                 "be read, can deadlock when loaded from a file")
# Config fields that never enter the compiled train step: the host loop's
# cadence, where files live, how runs are watched. Everything else is in
# the fingerprint (a field wrongly left in costs a rebuild; one wrongly left
# out would train with a stale program).
HOST_ONLY = (
    "compiled_step", "allow_config_change", "checkpoint_every", "eval_every",
    "log_every", "keep_checkpoints", "max_consecutive_bad_steps",
    "always_save_checkpoint", "eval_only", "eval_at_start", "eval_interval",
    "log_interval", "eval_iters", "init_from", "init_checkpoint", "wandb_log",
    "wandb_project", "wandb_run_name", "data_root", "data.data_dir",
    "data.path", "data.eval_path", "data.input", "data.prefetch",
    "data.eval_batch_size",
    "data.max_eval_batches", "data.eval_sheet_rows", "data.tfds.data_dir",
    "data.build.csv_dir", "data.build.kaggle_dir", "data.build.concept_dir",
    "profiler_steps", "skip_first_n_steps_for_profiler",
    "keep_checkpoint_every", "metrics_jsonl", "resume_step",
    "early_stopping_patience", "early_stopping_threshold", "best_metric",
    "best_metric_mode")
HOST_ONLY_PREFIXES = ("wandb.",)
# What a serialized train step holds (jax 0.10.2): the unloaded
# executable, its argument infos (abstract values, shardings, meshes,
# layouts), numpy arrays of device ids, the dtypes of its inputs (ml_dtypes'
# narrow floats and ints) and, for typed PRNG keys, the key type with jax's
# own implementation functions. Nothing else is built.
_ML_DTYPES = ("bfloat16", "float4_e2m1fn", "float8_e3m4", "float8_e4m3",
              "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
              "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "int2",
              "int4", "uint2", "uint4")
_PRNG_FUNCTIONS = {
    "jax._src.random.threefry2x32": ("threefry_seed", "threefry_split",
                                     "threefry_random_bits",
                                     "threefry_fold_in"),
    "jax._src.random.threefry4x32": ("threefry4x32_seed", "threefry4x32_split",
                                     "threefry4x32_random_bits",
                                     "threefry4x32_fold_in"),
    "jax._src.random.philox4x32": ("philox4x32_seed", "philox4x32_split",
                                   "philox4x32_random_bits",
                                   "philox4x32_fold_in"),
    "jax._src.random.rbg": ("_rbg_seed", "_rbg_split", "_rbg_random_bits",
                            "_rbg_fold_in", "_unsafe_rbg_split",
                            "_unsafe_rbg_fold_in"),
}
ALLOWED_CLASSES = frozenset({
    *(("ml_dtypes", name) for name in _ML_DTYPES),
    *((module, name) for module, names in _PRNG_FUNCTIONS.items()
      for name in names),
    ("jax._src.random.prng", "KeyTy"),
    ("jax._src.random.prng", "PRNGImpl"),
    ("jax", "P"),
    ("jax._src.core", "ShapedArray"),
    ("jax._src.core", "ManualAxisType"),
    ("jax._src.core", "MemorySpace"),
    ("jax._src.interpreters.pxla", "UnloadedMeshExecutable"),
    ("jax._src.interpreters.pxla", "AllArgsInfo"),
    ("jax._src.layout", "Layout"),
    # JAX 0.11's marker for an automatic layout (a class with no state).
    ("jax._src.layout", "AutoLayoutSingleton"),
    ("jax._src.linear_util", "DebugInfo"),
    ("jax._src.mesh", "AbstractDevice"),
    ("jax._src.mesh", "AbstractMesh"),
    ("jax._src.mesh", "AxisType"),
    ("jax._src.mesh", "Mesh"),
    ("jax._src.named_sharding", "_unpickle_named_sharding"),
    ("jax._src.stages", "ArgInfo"),
    ("jaxlib._jax", "DeviceList"),
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"),
})


class CompiledStepError(cli.UserError, ValueError):
  """The compiled step file cannot be used by this run (one line)."""


# ------------------------------------------------------------ what it is for


def _package_version(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


@functools.lru_cache(maxsize=None)
def code_hash() -> str:
  """SHA-256 of the `trm` package's Python files (names and contents): the
  step's model, loss and optimizer are this code, frozen at the build.
  Hashed once per process: the code it runs is the code it imported."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  digest = hashlib.sha256()
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__")
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(folder, name)
      digest.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f:
        digest.update(f.read() + b"\0")
  return digest.hexdigest()


def environment(mesh) -> dict:
  """The software and devices a step is compiled for (the mesh's)."""
  devices = list(mesh.devices.flat)
  first = devices[0]
  coords = [tuple(d.coords) for d in devices if getattr(d, "coords", None)]
  grid = None
  if coords and len(coords) == len(devices):
    grid = "x".join(str(max(c[i] for c in coords) - min(c[i] for c in coords)
                        + 1) for i in range(len(coords[0])))
  slices = {getattr(d, "slice_index", None) for d in devices}
  return {
      "jax": jax.__version__,
      "jaxlib": _package_version("jaxlib"),
      # Only a TPU program depends on it (compiled by and for libtpu).
      "libtpu": ((_package_version("libtpu")
                  or _package_version("libtpu-nightly"))
                 if first.platform == "tpu" else None),
      "platform": first.platform,
      "device_kind": first.device_kind,
      "num_devices": len(devices),
      "num_processes": len({d.process_index for d in devices}),
      "num_slices": len(slices - {None}) or 1,
      "chip_grid": grid,
  }


def mesh_record(mesh) -> dict:
  return {"axes": dict(mesh.shape),
          "device_ids": [int(d.id) for d in mesh.devices.flat]}


def signature(abstract_args) -> list[list[str]]:
  """[path, shape+dtype, sharding] of every input leaf of (state, batch)."""
  rows = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_args)[0]:
    sharding = getattr(leaf, "sharding", None)
    spec = getattr(sharding, "spec", sharding)
    rows.append([jax.tree_util.keystr(path),
                 f"{leaf.dtype}{list(leaf.shape)}", str(spec)])
  return rows


def program_fields(config) -> dict:
  """The config fields that shape the compiled step, JSON-ready."""
  fields = {}
  for key, value in config_record.flat(config).items():
    if key in HOST_ONLY or key.startswith(HOST_ONLY_PREFIXES):
      continue
    fields[key] = json.loads(json.dumps(value, default=repr))
  return fields


def fingerprint(fields: dict) -> str:
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()
                        ).hexdigest()


def expected(mesh, abstract_args, config_fields: dict, out_tree=None) -> dict:
  """The header a step compiled for this run would carry (without the
  payload's fields); `out_tree` is checked at load."""
  in_tree = jax.tree.structure((abstract_args, {}))
  return {
      "environment": environment(mesh),
      "mesh": mesh_record(mesh),
      "inputs": signature(abstract_args),
      "in_tree": str(in_tree),
      "out_tree": None if out_tree is None else str(out_tree),
      "config": config_fields,
      "config_sha256": fingerprint(config_fields),
      "code_sha256": code_hash(),
  }


# ---------------------------------------------------------------- the file


def save(path: str, compiled, mesh, abstract_args, config_fields: dict,
         topology: str) -> dict:
  """Serializes `compiled` (the jitted train step for `abstract_args` =
  (state, batch)) to `path`, whole or not at all; returns the header."""
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top
  platform = mesh.devices.flat[0].platform
  if cpu_collectives.deadlock_prone(platform, compiled):
    raise CompiledStepError(
        f"--save_compiled: refused, as an XLA:CPU step whose {_CPU_DEADLOCK}"
        "; on CPU train without config.compiled_step, or save the step of "
        "a mesh with one axis larger than 1.")
  try:
    payload, _, out_tree = serialize_executable.serialize(compiled)
  except (ValueError, NotImplementedError) as e:
    raise CompiledStepError(
        f"--save_compiled: jax {jax.__version__} cannot serialize a train "
        f"step compiled for {platform} ({' '.join(str(e).split())}); train "
        "without config.compiled_step there.") from None
  header = expected(mesh, abstract_args, config_fields, out_tree)
  header.update(
      format=1, topology=topology,
      payload_bytes=len(payload),
      payload_sha256=hashlib.sha256(payload).hexdigest(),
      built_on=socket.gethostname(),
      built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
  data = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload
  _write_whole(path, data)
  return header


def _write_whole(path: str, data: bytes) -> None:
  """Whole or not at all: a crash leaves the old file or none (an object
  store's upload is whole already)."""
  if "://" in path:
    epath.Path(path).write_bytes(data)
  else:
    atomic_files.atomic_write(path, lambda f: f.write(data))


def read(path: str) -> tuple[dict, bytes]:
  """(header, payload) of a compiled step file; a missing, foreign,
  truncated or damaged file is one line naming it."""
  where = f"{FIELD}={path!r}"
  if "://" not in path:
    try:  # a FIFO or device would block the read: refused unread
      data_io.check_regular_file(path)
    except ValueError:
      raise CompiledStepError(
          f"{where} is not a regular file; {_REBUILD}.") from None
  try:
    data = epath.Path(path).read_bytes()
  except FileNotFoundError:
    raise CompiledStepError(
        f"{where}: no such file; build it with `python -m trm.aot "
        "--save_compiled=FILE`.") from None
  except OSError as e:
    raise CompiledStepError(f"{where}: cannot read it ({e}).") from None
  if not data.startswith(MAGIC):
    raise CompiledStepError(
        f"{where} is not a compiled train step written by trm.aot "
        f"--save_compiled (it does not start with {MAGIC.strip().decode()!r})"
        f"; {_REBUILD}.")
  end = data.find(b"\n", len(MAGIC))
  try:
    header = json.loads(data[len(MAGIC):end if end >= 0 else None])
    if not isinstance(header, dict):
      raise ValueError("not a JSON object")
    size, digest = int(header["payload_bytes"]), header["payload_sha256"]
  except (ValueError, KeyError, TypeError, OverflowError,
          RecursionError) as e:
    # OverflowError: a payload_bytes of 1e400, which JSON reads as inf;
    # RecursionError: a header nested deeper than json's recursion.
    raise CompiledStepError(f"{where}: its header is damaged ({e}); "
                            f"{_REBUILD}.") from None
  payload = data[end + 1:] if end >= 0 else b""
  if len(payload) != size:
    raise CompiledStepError(
        f"{where} is truncated or padded: its payload has {len(payload)} "
        f"bytes, the header says {size}; {_REBUILD}.")
  if hashlib.sha256(payload).hexdigest() != digest:
    raise CompiledStepError(
        f"{where} is damaged: its payload does not match the SHA-256 in its "
        f"header; {_REBUILD}.")
  return header, payload


# ---------------------------------------------------------------- checking


def _short(value, limit: int = 120) -> str:
  text = value if isinstance(value, str) else json.dumps(value)
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _difference(built: dict, run: dict) -> str | None:
  """'<what>: built for X, this run has Y' for the first difference."""
  env_b, env_r = built.get("environment", {}), run["environment"]
  for key, what in (("platform", "platform"),
                    ("device_kind", "device kind"),
                    ("jax", "jax version"), ("jaxlib", "jaxlib version"),
                    ("libtpu", "libtpu version"),
                    ("num_devices", "device count"),
                    ("num_processes", "process count"),
                    ("num_slices", "slice count"),
                    ("chip_grid", "chip grid")):
    if env_b.get(key) != env_r[key]:
      extra = (f" (topology {built.get('topology')})"
               if key in ("num_devices", "num_slices", "chip_grid") else "")
      return (f"{what}: built for {env_b.get(key)}{extra}, this run has "
              f"{env_r[key]}")
  mesh_b, mesh_r = built.get("mesh", {}), run["mesh"]
  if mesh_b.get("axes") != mesh_r["axes"]:
    return (f"mesh: built for {mesh_b.get('axes')}, this run has "
            f"{mesh_r['axes']}")
  if mesh_b.get("device_ids") != mesh_r["device_ids"]:
    return (f"mesh device order: built for ids "
            f"{_short(mesh_b.get('device_ids'))}, this run has "
            f"{_short(mesh_r['device_ids'])}")
  if built.get("code_sha256") != run["code_sha256"]:
    return (f"trm code: built from code with SHA-256 "
            f"{str(built.get('code_sha256'))[:12]}, this run's is "
            f"{run['code_sha256'][:12]} (the package changed since the "
            "build)")
  if built.get("config_sha256") != run["config_sha256"]:
    fields_b, fields_r = built.get("config", {}), run["config"]
    absent = "<absent>"
    changed = sorted(k for k in set(fields_b) | set(fields_r)
                     if fields_b.get(k, absent) != fields_r.get(k, absent))
    if changed:
      key = changed[0]
      # By name: the first in sorted order is often not the one the user
      # changed (a builder's data.build.num_test before global_batch_size).
      others = [f"config.{k}" for k in changed[1:6]]
      more = (f" (also {', '.join(others)}"
              f"{', ...' if len(changed) > 6 else ''})" if others else "")
      return (f"config.{key}: built for "
              f"{_short(fields_b.get(key, absent))}, this run has "
              f"{_short(fields_r.get(key, absent))}{more}")
    return "config fingerprint differs"
  inputs_b, inputs_r = built.get("inputs", []), run["inputs"]
  for row_b, row_r in zip(inputs_b, inputs_r):
    if row_b != row_r:
      if row_b[0] != row_r[0]:
        return (f"inputs: built for {row_b[0]}, this run has {row_r[0]} "
                "in its place")
      name = f"input (state, batch){row_r[0]}"
      if row_b[1] != row_r[1]:
        return f"{name}: built for {row_b[1]}, this run has {row_r[1]}"
      return (f"{name} sharding: built for {row_b[2]}, this run has "
              f"{row_r[2]}")
  if len(inputs_b) != len(inputs_r):
    return (f"inputs: built for {len(inputs_b)} arrays, this run has "
            f"{len(inputs_r)}")
  for key in ("in_tree", "out_tree"):
    if run.get(key) is not None and built.get(key) != run[key]:
      what = "input" if key == "in_tree" else "output"
      return (f"{what} structure: built for {_short(built.get(key))}, this "
              f"run has {_short(run[key])}")
  return None


# The header's fields `check` compares, with the JSON type each must have.
_HEADER_TYPES = (("environment", dict), ("mesh", dict), ("inputs", list),
                 ("config", dict))


def _check_header_types(path: str, header: dict) -> None:
  """A header whose fields have the wrong JSON types (hand-edited or
  crafted) is one line, not an AttributeError deep in the comparison."""
  damaged = [f"{key!r} is a {type(header[key]).__name__}, not a "
             f"{kind.__name__}" for key, kind in _HEADER_TYPES
             if key in header and not isinstance(header[key], kind)]
  rows = header.get("inputs")
  if not damaged and isinstance(rows, list) and not all(
      isinstance(row, list) and len(row) == 3 for row in rows):
    damaged.append("'inputs' holds rows other than [path, shape, sharding]")
  if damaged:
    raise CompiledStepError(f"{FIELD}={path!r}: its header is damaged "
                            f"({damaged[0]}); {_REBUILD}.")


def check(path: str, header: dict, run: dict) -> None:
  """Raises CompiledStepError naming the first way the file's step was
  built for something other than this run."""
  if header.get("format") != 1:
    raise CompiledStepError(
        f"{FIELD}={path!r}: file format {header.get('format')!r}, this "
        f"trainer reads format 1; {_REBUILD}.")
  _check_header_types(path, header)
  difference = _difference(header, run)
  if difference:
    raise CompiledStepError(
        f"{FIELD}={path!r} does not match this run: {difference}; "
        f"{_REBUILD} for this run's config and devices, or drop {FIELD}.")


# ----------------------------------------------------------------- loading


def _restricted_unpickler():
  """jax's own unpickler of executables (its persistent ids: executables,
  devices, the client), limited to ALLOWED_CLASSES, and building state only
  onto instances. Python's own unpickler, not the C one: only its BUILD can
  be checked, and a crafted BUILD onto an allowed class itself (not one of
  its instances) replaced that class's attributes in this process (e.g.
  jax's `UnloadedMeshExecutable.load`), allowed classes or not."""
  from jax._src.lib import xla_client  # pylint: disable=g-import-not-at-top
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top
  jax_unpickler = serialize_executable._JaxPjrtUnpickler  # pylint: disable=protected-access

  class RestrictedUnpickler(pickle._Unpickler):  # pylint: disable=protected-access

    def __init__(self, file, backend):
      super().__init__(file)
      # What jax's unpickler keeps for its persistent_load.
      self.backend = backend
      self.devices_by_id = {d.id: d for d in backend.devices()}
      self.execution_devices = xla_client.DeviceList(
          tuple(backend.devices()))

    persistent_load = jax_unpickler.persistent_load

    def find_class(self, module, name):
      if (module, name) not in ALLOWED_CLASSES:
        raise pickle.UnpicklingError(
            f"it names the class {module}.{name}, which a compiled train "
            "step never holds")
      return super().find_class(module, name)

    def load_build(self):
      target = self.stack[-2]  # under the state BUILD pops
      if isinstance(target, (type, types.FunctionType,
                             types.BuiltinFunctionType, types.ModuleType)):
        raise pickle.UnpicklingError(
            f"it sets attributes of {getattr(target, '__qualname__', target)}"
            " itself, which a compiled train step never does")
      super().load_build()

    dispatch = dict(pickle._Unpickler.dispatch)  # pylint: disable=protected-access
    dispatch[pickle.BUILD[0]] = load_build

  return RestrictedUnpickler


def load(path: str, payload: bytes, in_tree, out_tree):
  """The compiled step of a checked payload, loaded onto this process's
  backend; `in_tree` / `out_tree` are this run's (state, batch) and
  (state, metrics) structures."""
  backend = jax.devices()[0].client
  unpickler = _restricted_unpickler()(io.BytesIO(payload), backend)
  try:
    unloaded, args_info_flat, no_kwargs = unpickler.load()
  except Exception as e:  # pylint: disable=broad-except
    # Beyond the refused classes: a crafted payload's persistent ids reach
    # jax's unpickler (an unknown device id is a KeyError, a malformed id an
    # IndexError, bytes that are no executable XLA's own error).
    why = " ".join(str(e).split())[:300] or type(e).__name__
    raise CompiledStepError(
        f"{FIELD}={path!r}: refused to unpickle its payload: {why}. Load "
        "only files you built with `python -m trm.aot --save_compiled`."
    ) from None
  # The header was checked against this run, the payload only hashed
  # against the header: a crafted one's executable and argument infos are
  # checked for what they are before any executable is loaded.
  from jax._src import stages  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import pxla  # pylint: disable=g-import-not-at-top
  if not isinstance(unloaded, pxla.UnloadedMeshExecutable):
    raise CompiledStepError(
        f"{FIELD}={path!r}: its payload holds a {type(unloaded).__name__}, "
        f"not a compiled step; {_REBUILD}.")
  if not (isinstance(args_info_flat, list)
          and all(isinstance(a, stages.ArgInfo) for a in args_info_flat)
          and len(args_info_flat) == in_tree.num_leaves):
    count = (len(args_info_flat) if isinstance(args_info_flat, list)
             else type(args_info_flat).__name__)
    raise CompiledStepError(
        f"{FIELD}={path!r}: its payload's step takes {count} argument "
        f"infos, this run has {in_tree.num_leaves} inputs (the payload does "
        f"not match its header); {_REBUILD}.")
  try:
    executable = unloaded.load()
  except Exception as e:  # pylint: disable=broad-except
    raise CompiledStepError(
        f"{FIELD}={path!r}: this backend ({backend.platform}) cannot load "
        f"the executable ({' '.join(str(e).split())[:300]}); {_REBUILD} on "
        "a jax/libtpu of this run.") from None
  if cpu_collectives.deadlock_prone(backend.platform, executable):
    raise CompiledStepError(
        f"{FIELD}={path!r}: refused, as an XLA:CPU step whose "
        f"{_CPU_DEADLOCK}; on CPU leave {FIELD} unset (the step compiles) or "
        "use a mesh with one axis larger than 1.")
  return jax.stages.Compiled(executable, [], in_tree.unflatten(args_info_flat),
                             out_tree, no_kwargs=no_kwargs)


def describe(header: dict) -> str:
  env = header["environment"]
  return (f"{env['num_devices']} x {env['device_kind']} "
          f"(topology {header.get('topology')}), mesh {header['mesh']['axes']}"
          f", {header['payload_bytes'] / 2**20:.1f} MiB")



# ------------------------------------------------------------ for a run


def abstract_args(program, ctx, abstract_state, global_batch_size: int):
  """(state, batch) as the train step is compiled for: what `trm.aot`
  saves a step for and what a run checks a file against."""
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  shardings = task_lib.batch_shardings(program.batch_spec, ctx)
  return (abstract_state, task_lib.abstract_batch(
      program.batch_spec, global_batch_size, shardings))


class Prepared:
  """A compiled step file checked against this run, ready to load."""

  def __init__(self, path: str, header: dict, payload: bytes, in_tree,
               out_tree):
    self.path, self.header, self.payload = path, header, payload
    self._in_tree, self._out_tree = in_tree, out_tree

  def load(self):
    """The train step, deserialized (no compile); the payload is let go."""
    payload, self.payload = self.payload, None
    return load(self.path, payload, self._in_tree, self._out_tree)


def prepare(path: str, contents: tuple[dict, bytes], program, ctx,
            abstract_state, global_batch_size: int,
            config_fields: dict) -> Prepared:
  """Checks the (header, payload) `read` from `path` against this run
  (software, devices, mesh, code, config, inputs, then the step's output
  structure, traced but not compiled); CompiledStepError names the first
  difference."""
  header, payload = contents
  args = abstract_args(program, ctx, abstract_state, global_batch_size)
  run = expected(ctx.mesh, args, config_fields)
  check(path, header, run)
  with ctx:  # traced only: the structure of (state, metrics)
    out_tree = jax.tree.structure(jax.eval_shape(program.train_step, *args))
  run["out_tree"] = str(out_tree)
  check(path, header, run)
  return Prepared(path, header, payload, jax.tree.structure((args, {})),
                  out_tree)
