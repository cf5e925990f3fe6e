"""Reads and writes TRM checkpoints in the upstream PyTorch layout.

Upstream (SamsungSAILMontreal/TinyRecursiveModels) `pretrain.py` saves
`model.state_dict()` of a `torch.compile`d `ACTLossHead` wrapping
`TinyRecursiveReasoningModel_ACTV1` (attribute `model`), which holds the inner
model (attribute `inner`), with `torch.save`; `load_checkpoint` reads it back
with `load_state_dict(..., assign=True)`. Keys are therefore

    _orig_mod.model.inner.<name>   torch.compile'd loss head (pretrain.py)
    model.inner.<name>             loss head, DISABLE_COMPILE=1
    inner.<name>                   the ACT model alone
    <name>                         the inner model alone

and all four are accepted on import (leading `_orig_mod.`, `model.` and
`inner.` components are stripped; one file must use one prefix). On export
the keys are `prefix + "inner." + <name>`.

Mapping. Sizes: D hidden_size, V vocab_size, S = seq_len + prefix_len, I =
swiglu_width(D, expansion), It = swiglu_width(S, expansion), N
num_puzzle_identifiers, P puzzle_emb_ndim (prefix_len = puzzle_emb_len, or
ceil(P / D) when that is 0, or 0 when P is 0). X = `L_level.layers.{i}` and
Y = `params/L_level/layers_{i}` for i < L_layers. Ours = collection/path in
the variables of `trm.families.trm.model.TRM`. T = transpose, cast = astype.

  upstream <name> [shape]              ours [shape]                      op
  H_init [D] (forward dtype)           buffers/H_init [D]              cast
  L_init [D] (forward dtype)           buffers/L_init [D]              cast
  embed_tokens.embedding_weight [V,D]  params/embed_tokens/embedding   copy
  lm_head.weight [V,D]                 params/lm_head/kernel [D,V]        T
  q_head.weight [2,D]                  params/q_head/kernel [D,2]         T
  q_head.bias [2]                      params/q_head/bias [2]          copy
  puzzle_emb.weights [N,P]      (a)    puzzle_emb/weights [N,P]        copy
  embed_pos.embedding_weight [S,D] (b) params/embed_pos [S,D]          copy
  X.self_attn.qkv_proj.weight [3D,D]   Y/self_attn/qkv_proj/kernel [D,3D] T
  X.self_attn.o_proj.weight [D,D]      Y/self_attn/o_proj/kernel [D,D]    T
  X.mlp_t.gate_up_proj.weight (c)      Y/mlp_t/gate_up_proj/kernel        T
      [2It,S]                            [S,2It]
  X.mlp_t.down_proj.weight [S,It] (c)  Y/mlp_t/down_proj/kernel [It,S]    T
  X.mlp.gate_up_proj.weight [2I,D]     Y/mlp/gate_up_proj/kernel [D,2I]   T
  X.mlp.down_proj.weight [D,I]         Y/mlp/down_proj/kernel [I,D]       T

  (a) only if P > 0; (b) only if pos_encodings == 'learned'; (c) replace the
  two self_attn rows when mlp_t is True.

Notes on the transforms:
  * Linear weights are `[out, in]` upstream, kernels `[in, out]` here; a
    transpose keeps the order of the output features, so the fused layouts
    carry over unchanged: qkv output features are `[q heads | k heads | v
    heads]`, each head's `head_dim` contiguous, in both (our `Attention`
    reshapes its fused projection to `[B, S, 3H, head_dim]` exactly as
    upstream's `.view`), and the first half of `gate_up_proj` is the gate in
    both. No per-head reshape is needed.
  * Params and the puzzle table are float32 in both (a checkpoint in another
    float dtype is cast to float32); H_init / L_init take
    `config.model.forward_dtype` (upstream creates them in forward_dtype, so a
    default checkpoint stores bfloat16, which is exact in float32).
  * Not stored, tolerated and ignored if present: upstream's non-persistent
    `rotary_emb.{cos,sin}_cached` (recomputed from rope_theta) and
    `puzzle_emb.{local_weights,local_ids}` (per-batch scratch).
  * A puzzle table of another size is an error here for `trm.evaluate`
    and `trm.export` (the config must come from the same dataset build);
    `trm.main --config.init_checkpoint` takes one with another number of
    rows and starts every row at their mean, as upstream's `load_checkpoint`
    (`trm.families.trm.task`).
  * Not in the checkpoint at all, so they must come from `config.model`:
    num_heads (qkv is [3D, D] for any head count), pos_encodings 'rope' vs
    'none', rope_theta, rms_norm_eps, H_cycles, L_cycles, halt_*,
    forward_dtype. Where upstream's `all_config.yaml` lies beside the file
    (pretrain.py writes it into the checkpoint directory), a config.model
    that differs from its `arch` in mlp_t, num_heads, pos_encodings,
    rope_theta, puzzle_emb_len or rms_norm_eps is refused, and one that
    differs in H_cycles, L_cycles, halt_max_steps or forward_dtype is
    logged (`check_run_config`).

Security: PyTorch files are read only with `torch.load(path,
map_location='cpu', weights_only=True)`; a file that needs arbitrary
unpickling is refused. `.safetensors` files (detected by content) are read
with safetensors and need no torch. float8 tensors (e4m3fn, e5m2) load and
are cast like the others; a quantized file (scale tensors beside the
weights) is refused. torch is imported lazily, only for
`.pt`-style files; it is not a dependency of the package.
"""
from __future__ import annotations

import collections
import contextlib
import os
from typing import Mapping

from absl import logging
from flax.core import meta
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from trm.core import config_lib
from trm.core import host_arrays
from trm.core import weights_io
from trm.data import atomic_files
from trm.families.trm import model as trm_model
from trm.families.trm import torch_layout

__all__ = ["load_torch_checkpoint", "export_torch_checkpoint"]

# Module names upstream wraps the inner model in (see the module docstring).
_WRAPPERS = ("_orig_mod", "model", "inner")
# Upstream non-persistent buffers: never saved by upstream, ignored if present.
_IGNORED = ("rotary_emb.cos_cached", "rotary_emb.sin_cached",
            "puzzle_emb.local_weights", "puzzle_emb.local_ids")

# ------------------------------------------------------------------ reading


class _Stored:
  """A tensor of the file, known by its shape and kind until `read`: the
  names and shapes are checked before any tensor's bytes are (a mistyped
  config, or a file that is not this model's, is refused without reading a
  file that may be gigabytes)."""

  def __init__(self, shape, floating: bool, dtype: str, read):
    self.shape = tuple(int(n) for n in shape)
    self.ndim = len(self.shape)
    self.floating = floating
    self.dtype = dtype
    self.read = read  # () -> the tensor as numpy


def _torch_tensors(path: str) -> dict[str, _Stored]:
  # A memory map: a tensor's bytes are read when it is converted, and those
  # of tensors never read (a refused file's, the ignored buffers) not at all.
  torch, obj = weights_io.load_weights_only(
      path, f"Reading the PyTorch checkpoint {path}", mmap=True)
  if not isinstance(obj, Mapping):
    raise weights_io.CheckpointError(
        f"{path} holds a {type(obj).__name__}, not a state_dict (a mapping of "
        "names to tensors) as upstream pretrain.py saves.")
  weights_io.check_not_quantized([k for k in obj if isinstance(k, str)], path)
  out = {}
  for key, value in obj.items():
    if not isinstance(key, str) or not isinstance(value, torch.Tensor):
      raise weights_io.CheckpointError(
          f"{path} is not a plain state_dict: key {key!r} holds a "
          f"{type(value).__name__}, not a tensor (upstream pretrain.py saves "
          "model.state_dict() alone).")
    # As a .safetensors file's: NaN or Inf weights are refused in one line
    # naming the tensor, once read (`_load`).
    out[key] = _Stored(
        value.shape, value.is_floating_point(), str(value.dtype),
        lambda t=value, k=key: weights_io.torch_to_numpy(torch, t, k, path))
  return out


def _safetensors_tensors(path: str, stack) -> dict[str, _Stored]:
  f = stack.enter_context(weights_io.SafetensorsFile(path))
  weights_io.check_not_quantized(f.names, path)
  return {name: _Stored(f.shape(name), weights_io.is_float_tag(f.dtype(name)),
                        f.dtype(name), lambda n=name: f.read(n))
          for name in f.names}


def _tensors(path: str, stack) -> dict[str, _Stored]:
  """The file's tensors by name, unread; `stack` (a contextlib.ExitStack)
  holds a .safetensors file open while they are read (a .pt's tensors
  hold their own memory map)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"TRM checkpoint {path} does not exist or is not "
                            "a file.")
  if weights_io.is_safetensors(path):
    return _safetensors_tensors(path, stack)
  return _torch_tensors(path)


def _strip(key: str) -> tuple[str, str]:
  """(wrapper prefix, name under the inner model)."""
  parts = key.split(".")
  i = 0
  while i < len(parts) - 1 and parts[i] in _WRAPPERS:
    i += 1
  return "".join(p + "." for p in parts[:i]), ".".join(parts[i:])


# Upstream's arch fields that no weight shape pins: a checkpoint read under
# other values computes another function. Refused when the run's
# all_config.yaml says otherwise. (H/L cycles and the halting knobs may be
# changed on purpose, e.g. more recursion at test time: a warning.)
_FUNCTION_FIELDS = ("mlp_t", "num_heads", "pos_encodings", "rope_theta",
                    "puzzle_emb_len", "rms_norm_eps")
_RUNTIME_FIELDS = ("H_cycles", "L_cycles", "halt_max_steps",
                   "forward_dtype")
# What all_config.yaml's arch is compared in; trm.export holds --config to
# the run's config.json in them, since it writes them there.
RUN_CONFIG_FIELDS = _FUNCTION_FIELDS + _RUNTIME_FIELDS
_RUN_CONFIG = "all_config.yaml"
_RUN_CONFIG_LIMIT = 1 << 20


# Upstream's model and loss classes (its config/arch/trm.yaml `name`s).
_UPSTREAM_ARCH = "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1"
_UPSTREAM_LOSS = {"name": "losses@ACTLossHead",
                  "loss_type": "stablemax_cross_entropy"}
# config.model's fields upstream's arch names alike (its
# TinyRecursiveReasoningModel_ACTV1Config).
_ARCH_FIELDS = ("H_cycles", "L_cycles", "L_layers", "hidden_size",
                "expansion", "num_heads", "pos_encodings", "rms_norm_eps",
                "rope_theta", "halt_max_steps", "halt_exploration_prob",
                "forward_dtype", "mlp_t", "puzzle_emb_ndim", "puzzle_emb_len",
                "no_ACT_continue")


def run_config_dict(config, model_cfg: trm_model.TRMConfig, data_dir: str,
                    metadata) -> dict:
  """The `all_config.yaml` upstream's pretrain.py writes beside its
  checkpoints (its PretrainConfig's model_dump()) for a trm.main run of
  `config`: the arch the weights compute, which upstream needs to build the
  model they load into (`pretrain.py --config-path=DIR
  --config-name=all_config load_checkpoint=DIR/step_N`) and which
  `check_run_config` holds a reader's config.model to, and the run's
  training settings under upstream's names. `epochs` is the run's
  total_steps in upstream's unit: whole iterations of data.epochs_per_iter
  epochs when total_steps is a multiple of the full batches one iteration
  fills (upstream's loop runs just those, so the paper Sudoku run's 65,100
  steps are 50,000 epochs), else by upstream's total_steps formula
  (epochs * total_groups * mean_puzzle_examples / global_batch_size, of
  `metadata`, the train split's), rounded; eval_interval is
  data.epochs_per_iter where it divides that (upstream asserts it), else
  unset."""
  arch = {field: getattr(model_cfg, field) for field in _ARCH_FIELDS}
  arch.update(name=_UPSTREAM_ARCH, loss=dict(_UPSTREAM_LOSS), H_layers=0,
              expansion=float(model_cfg.expansion))
  optim = config.optim
  examples = metadata.total_groups * metadata.mean_puzzle_examples
  per_iter = config.data.epochs_per_iter
  iteration_steps = int(per_iter * examples) // config.global_batch_size
  if iteration_steps and config.total_steps % iteration_steps == 0:
    epochs = config.total_steps // iteration_steps * per_iter
  else:
    epochs = max(1, round(config.total_steps * config.global_batch_size
                          / max(examples, 1)))
  return {
      "arch": arch, "data_paths": [os.path.abspath(data_dir)],
      "data_paths_test": [],
      "evaluators": ([{"name": "arc@ARC"}] if config.data.name == "arc"
                     else []),
      "global_batch_size": config.global_batch_size, "epochs": epochs,
      "lr": optim.lr, "lr_min_ratio": optim.lr_min_ratio,
      "lr_warmup_steps": config_lib.warmup_steps(optim, config.total_steps),
      "weight_decay": optim.weight_decay, "beta1": optim.beta1,
      "beta2": optim.beta2, "puzzle_emb_lr": optim.puzzle_emb_lr,
      "puzzle_emb_weight_decay": optim.puzzle_emb_weight_decay,
      "project_name": None, "run_name": None, "load_checkpoint": None,
      "checkpoint_path": None, "seed": config.seed,
      "checkpoint_every_eval": config.checkpoint_every == config.eval_every,
      "eval_interval": per_iter if epochs % per_iter == 0 else None,
      "min_eval_interval": 0, "eval_save_outputs": [],
      "ema": bool(optim.ema), "ema_rate": optim.ema_rate,
      "freeze_weights": bool(optim.get("freeze_weights", False)),
  }


def write_run_config(directory: str, run_config: dict) -> str:
  """Writes `run_config` (`run_config_dict`) as `directory`/all_config.yaml
  (as upstream dumps it: yaml, keys sorted); returns the file's name."""
  import yaml  # pylint: disable=g-import-not-at-top
  atomic_files.atomic_write(
      os.path.join(directory, _RUN_CONFIG),
      lambda f: yaml.safe_dump(run_config, f), mode="w")
  return _RUN_CONFIG


def differing_fields(recorded, value_of, fields=_FUNCTION_FIELDS):
  """(field, recorded value, ours) for each of `fields` that `recorded`
  (a run's settings) holds and ours (`value_of(field)`) differs from,
  floats compared as numbers; those that do not apply are skipped
  (num_heads and RoPE's under mlp_t, rope_theta without RoPE)."""
  skipped = ((("num_heads", "pos_encodings", "rope_theta")
              if value_of("mlp_t") else ())
             + (("rope_theta",) if value_of("pos_encodings") != "rope"
                else ()))
  for field in fields:
    if field not in recorded or field in skipped:
      continue
    theirs, ours = recorded[field], value_of(field)
    try:
      same = (float(theirs) == float(ours) if isinstance(ours, float)
              else theirs == ours)
    except (TypeError, ValueError):
      same = False
    if not same:
      yield field, theirs, ours


def check_run_config(path: str, cfg: trm_model.TRMConfig) -> None:
  """Compares config.model with the `all_config.yaml` upstream's
  `pretrain.py` writes beside its checkpoints, if there is one.

  Raises:
    CheckpointError: a field of `_FUNCTION_FIELDS` differs (naming the
      field, both values and the file); fields that do not apply (num_heads
      and RoPE's under mlp_t) are not compared.
  """
  yaml_path = os.path.join(os.path.dirname(os.path.abspath(path)),
                           _RUN_CONFIG)
  if not os.path.isfile(yaml_path):
    return
  import yaml  # pylint: disable=g-import-not-at-top
  try:
    if os.path.getsize(yaml_path) > _RUN_CONFIG_LIMIT:
      raise ValueError(f"over {_RUN_CONFIG_LIMIT >> 20} MiB")
    with open(yaml_path, encoding="utf-8") as f:
      arch = yaml.safe_load(f).get("arch")
    if not isinstance(arch, dict):
      raise ValueError("no 'arch' mapping")
  except (OSError, ValueError, AttributeError, RecursionError,
          yaml.YAMLError) as e:  # RecursionError: nesting past the stack
    logging.warning("%s was not compared with config.model: %s (%s).",
                    yaml_path, type(e).__name__, str(e)[:200])
    return
  for field in _FUNCTION_FIELDS + _RUNTIME_FIELDS:
    # A list or mapping is no setting, and formatting one for a message
    # could take forever: YAML aliases let a few hundred bytes stand for a
    # list of a billion items.
    if not isinstance(arch.get(field), (str, int, float, bool, type(None))):
      logging.warning("%s was not compared with config.model: its arch.%s "
                      "is a %s, no setting.", yaml_path, field,
                      type(arch[field]).__name__)
      return
  for field, theirs, ours in differing_fields(
      arch, lambda name: getattr(cfg, name), RUN_CONFIG_FIELDS):
    if field in _RUNTIME_FIELDS:
      logging.warning("config.model.%s=%r; the run that wrote %s had %r (%s)."
                      , field, ours, path, theirs, yaml_path)
      continue
    raise weights_io.CheckpointError(
        f"config.model.{field}={ours!r} does not match the run that wrote "
        f"{path}: its {yaml_path} has arch.{field}={theirs!r}, and no weight "
        f"shape depends on it. Set --config.model.{field}={theirs} (or move "
        f"{_RUN_CONFIG} away to load the weights regardless).")


def load_torch_checkpoint(path: str, model_cfg: trm_model.TRMConfig,
                          any_puzzle_rows: bool = False):
  """Reads an upstream TRM state_dict file into our variables.

  Args:
    path: a file as upstream `pretrain.py` writes it (`torch.save` of the
      state_dict; read with `weights_only=True`), or a `.safetensors` file of
      the same state_dict (any name; detected by content).
    model_cfg: our `TRMConfig`; every size must match the checkpoint.
    any_puzzle_rows: the puzzle table may hold another number of
      identifiers than `model_cfg`'s (its width must match); it is returned
      with its own rows (`trm.main --config.init_checkpoint` starts a run
      on another dataset from it, as upstream's `load_checkpoint`).

  Returns:
    (params, buffers, puzzle_emb) as `TrainState` holds them (unboxed dicts of
    arrays on the default device): params float32, buffers {'H_init',
    'L_init'} in `model_cfg.forward_dtype`, puzzle_emb {'weights': [N, P]}
    float32 or {} when puzzle_emb_ndim is 0. Shard with `jax.device_put`.

  Raises:
    CheckpointError: not a TRM state_dict, missing / unexpected keys, a shape
      that does not match `model_cfg` (naming the key, the file, the expected
      shape and the config field that probably differs), or a file that
      `weights_only` loading refuses.
    ImportError: a PyTorch-format file and no torch installed.
  """
  cfg = model_cfg
  check_run_config(path, cfg)
  abstract = torch_layout.abstract(cfg)
  with contextlib.ExitStack() as stack:
    return _load(path, cfg, abstract, _tensors(path, stack), any_puzzle_rows)


def _load(path: str, cfg: trm_model.TRMConfig, abstract, raw, any_puzzle_rows):
  if not raw:
    raise weights_io.CheckpointError(f"{path} holds an empty state_dict.")

  names: dict[str, _Stored] = {}
  full_key: dict[str, str] = {}
  prefixes = collections.Counter()
  for key, value in raw.items():
    prefix, name = _strip(key)
    prefixes[prefix] += 1
    names[name], full_key[name] = value, key
  if not ("embed_tokens.embedding_weight" in names
          or any(n.startswith("L_level.layers.") for n in names)):
    raise weights_io.CheckpointError(
        f"{path} is not an upstream TRM checkpoint: none of its {len(raw)} "
        "keys is '[_orig_mod.][model.][inner.]embed_tokens.embedding_weight' "
        "or '...L_level.layers.*'. Its keys start: "
        f"{torch_layout.short(raw, 6)}.")
  if any(n.startswith("H_level.") for n in names):
    raise weights_io.CheckpointError(
        f"{path} looks like an HRM checkpoint (it has H_level.* as well as "
        "L_level.*); only TRM (one shared L_level network) is supported.")
  if len(prefixes) > 1:
    raise weights_io.CheckpointError(
        f"{path} mixes key prefixes {sorted(prefixes)}; expected one "
        "state_dict with a single prefix (e.g. '_orig_mod.model.inner.').")
  prefix = next(iter(prefixes))

  entries = torch_layout.entries(cfg)
  expected = {e.name for e in entries}
  missing = expected - set(names)
  unexpected = set(names) - expected - set(_IGNORED)
  if missing or unexpected:
    parts = []
    if missing:
      parts.append(
          f"missing keys: {torch_layout.short(prefix + m for m in missing)}")
    if unexpected:
      parts.append("unexpected keys: "
                   f"{torch_layout.short(full_key[u] for u in unexpected)}")
    hints = torch_layout.variant_hints(cfg, names)
    raise weights_io.CheckpointError(
        f"{path} does not match config.model: " + "; ".join(parts) + "."
        + (" Probably " + "; ".join(hints) + "." if hints else ""))

  variables: dict[str, dict] = {"params": {}, "buffers": {}, "puzzle_emb": {}}
  for entry in entries:
    target = weights_io.get_path(abstract[entry.collection], entry.path)
    value = names[entry.name]
    want = torch_layout.upstream_shape(entry, target.shape)
    if (any_puzzle_rows and entry.collection == "puzzle_emb"
        and value.ndim == 2 and value.shape[1:] == want[1:]):
      want = tuple(value.shape)
    if tuple(value.shape) != want:
      raise torch_layout.shape_error(entry, full_key[entry.name], path,
                                     value.shape, want, cfg)
    if not value.floating:
      raise weights_io.CheckpointError(
          f"Tensor {full_key[entry.name]!r} in {path} has dtype {value.dtype}"
          "; expected a floating-point tensor.")
  # Every name, shape and kind holds: only now are the bytes read.
  for entry in entries:
    target = weights_io.get_path(abstract[entry.collection], entry.path)
    value = names[entry.name].read()
    weights_io.check_finite(full_key[entry.name], value, path)
    if entry.transpose:
      value = value.T
    value = np.ascontiguousarray(value.astype(target.dtype, copy=False))
    weights_io.set_path(variables[entry.collection], entry.path,
                        jnp.asarray(value))
  return variables["params"], variables["buffers"], variables["puzzle_emb"]


# ------------------------------------------------------------------ writing


def _to_torch(torch, x: np.ndarray):
  if x.dtype == ml_dtypes.bfloat16:
    return torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)
  return torch.from_numpy(x)


def export_torch_checkpoint(params, buffers, puzzle_emb,
                            model_cfg: trm_model.TRMConfig, path: str,
                            prefix: str = "_orig_mod.model.") -> list[str]:
  """Writes our variables as an upstream state_dict; returns its keys.

  Keys are `prefix + "inner." + <upstream name>` (module docstring table):
  the default `_orig_mod.model.` is what upstream `pretrain.py`'s
  `load_checkpoint` expects of its torch.compile'd model; use `model.` for
  `DISABLE_COMPILE=1` and `""` for a bare `TinyRecursiveReasoningModel_ACTV1`.
  Params and the puzzle table are written float32, H_init / L_init in
  `model_cfg.forward_dtype` (bfloat16 by default, as upstream creates them).

  `path` ending in `.safetensors` writes safetensors (no torch needed; load
  with `safetensors.torch.load_file`); any other name is written with
  `torch.save` (needs torch), the format upstream `torch.load`s. Arrays
  sharded over several processes are gathered (a collective: call it on
  every process); only process 0 writes.
  """
  if prefix and not prefix.endswith("."):
    raise ValueError(f"prefix={prefix!r} must be empty or end with '.'.")
  cfg = model_cfg
  abstract = torch_layout.abstract(cfg)
  ours = {"params": meta.unbox(params), "buffers": meta.unbox(buffers),
          "puzzle_emb": meta.unbox(puzzle_emb or {})}
  tensors: dict[str, np.ndarray] = {}
  for entry in torch_layout.entries(cfg):
    where = "/".join((entry.collection,) + entry.path)
    try:
      value = weights_io.get_path(ours[entry.collection], entry.path)
    except (KeyError, TypeError) as e:
      raise weights_io.CheckpointError(
          f"{where} is missing from the variables to "
          "export (do they belong to config.model?).") from e
    target = weights_io.get_path(abstract[entry.collection], entry.path)
    value = host_arrays.whole(value)
    if value.shape != target.shape:
      raise weights_io.CheckpointError(
          f"{where} has shape {value.shape}; config.model "
          f"gives {target.shape}.")
    if entry.transpose:
      value = value.T
    dtype = target.dtype if entry.collection == "buffers" else np.float32
    tensors[prefix + "inner." + entry.name] = np.ascontiguousarray(
        value.astype(dtype))
  if jax.process_index() != 0:
    return list(tensors)
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  if path.endswith(".safetensors"):
    weights_io.save_safetensors(tensors, path, metadata={"format": "pt"})
  else:
    torch = weights_io.import_torch(f"Writing the PyTorch checkpoint {path}")
    state = collections.OrderedDict(
        (k, _to_torch(torch, v)) for k, v in tensors.items())
    # Through a temporary file and a rename (as save_file does): a writer
    # killed mid-way leaves the previous file, not a truncated one.
    atomic_files.atomic_write(path, lambda f: torch.save(state, f))
  return list(tensors)


def restore_run_variables(config, workdir: str, ctx, settings=None,
                          step: int | None = None):
  """(params, buffers, puzzle table, TRMConfig, step, `run_config_dict`
  of `settings`, the run's training settings, default `config`) of
  checkpoint `step` (default: the newest readable one) of a trm.main
  workdir, the variables upstream's
  `pretrain.py` saves: with `config.optim.ema` the EMA of the parameters
  (the model it evaluates and saves), else the parameters. The model's
  sizes (vocabulary, sequence, puzzle identifiers) come from the run's
  dataset's train metadata, as in training."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.data.puzzles import format as puzzle_format  # pylint: disable=g-import-not-at-top
  from trm.families.trm import program as trm_program  # pylint: disable=g-import-not-at-top
  from trm.families.trm import task as trm_task  # pylint: disable=g-import-not-at-top
  data_dir = trm_task.run_data_dir(config, workdir, workdir)
  try:
    shapes = puzzle_format.read_metadata(data_dir, "train")
  except (OSError, ValueError) as e:
    raise FileNotFoundError(
        f"The model's sizes come from the run's dataset, and {data_dir} "
        f"gives none ({str(e).rstrip('.')}). Pass "
        "--config.data.data_dir=DIR, the dataset the run trained on."
    ) from None
  program = trm_program.build(config, ctx, shapes)
  abstract, _ = state_lib.abstract_state(program.init_fn, ctx)
  weights = "ema_params" if config.optim.ema else "params"
  fields, step = ckpt_lib.restore_fields(
      os.path.join(workdir, "checkpoints"),
      {k: getattr(abstract, k) for k in (weights, "buffers", "puzzle_emb")},
      step=step, family=trm_program.DISPLAY_NAME)
  return (fields[weights], fields["buffers"], fields["puzzle_emb"],
          program.model.cfg, step, run_config_dict(
              config if settings is None else settings, program.model.cfg,
              data_dir, shapes))
