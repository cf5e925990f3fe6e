"""Reads nanoGPT `ckpt.pt` files and Hugging Face GPT-2 directories.

Both give the parameters as a tree of numpy arrays in our layout
(trm/families/gpt/model.py) plus the architecture found in the file, so the caller
can compare it with `config.model` (`check_model_args`) and place the arrays
on a mesh (`to_sharded`).

Mapping (i < n_layer; C = n_embd, V = vocab_size; biases only with bias):

  nanoGPT key, without 'transformer.'  HF GPT-2 key     ours
  wte.weight [V, C]                     same             wte/embedding
  wpe.weight [block_size, C]            same             wpe/embedding
  h.i.ln_1.weight, .bias [C]            same             h_i/ln_1/scale, bias
  h.i.attn.c_attn.weight [3C, C]        [C, 3C]          h_i/attn/c_attn/kernel
  h.i.attn.c_proj.weight [C, C]         [C, C]           h_i/attn/c_proj/kernel
  h.i.mlp.c_fc.weight [4C, C]           [C, 4C]          h_i/mlp/c_fc/kernel
  h.i.mlp.c_proj.weight [C, 4C]         [4C, C]          h_i/mlp/c_proj/kernel
  h.i.<linear>.bias                     same             h_i/.../bias
  ln_f.weight, .bias [C]                same             ln_f/scale, bias
  lm_head.weight [V, C] (no prefix)     same             none: tied to wte,
                                                         must equal it if there

nanoGPT's Linear weights are torch [out, in] and are transposed; HF's Conv1D
weights are already [in, out].
Transposing a Linear weight keeps the order of its output features, so the
fused [q | k | v] layout of c_attn carries over unchanged. HF keys may carry
a `transformer.` prefix (GPT2LMHeadModel) or not (GPT2Model); nanoGPT keys
may carry `_orig_mod.` (a torch.compile'd model). The causal-mask buffers
(`attn.bias`, `attn.masked_bias`) are dropped.

Security: torch files are read only with `torch.load(path,
map_location='cpu', weights_only=True)` (tensors and plain containers, no
arbitrary unpickling) and safetensors with `weights_io.SafetensorsFile`. torch
is imported only to read a ckpt.pt. float8 tensors (torch float8_e4m3fn /
float8_e5m2, safetensors F8_E4M3 / F8_E5M2) load and are cast to the params'
dtype like the others; quantized checkpoints (a quantization_config, or scale
tensors beside the weights) are refused.

nanoGPT uses exact GELU while HF GPT-2 uses the tanh approximation
(`gelu_new`); like nanoGPT's own `from_pretrained`, we load the weights into
the exact-GELU model regardless.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from trm.core import weights_io
from trm.families.gpt import gpt_layout
from trm.families.gpt import hf_gpt2_files
from trm.families.gpt.model import GPTConfig

__all__ = ["load_nanogpt_checkpoint", "load_hf_gpt2",
           "check_model_args", "to_sharded"]

MODEL_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias",
              "vocab_size", "dropout")
_COMPARED = ("n_layer", "n_head", "n_embd", "block_size", "bias",
             "vocab_size")
_MASK_BUFFER = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$")



# ------------------------------------------------------------------ nanoGPT


def _scalar(torch, value, what: str, path: str):
  if isinstance(value, torch.Tensor):
    if value.numel() != 1:
      raise weights_io.CheckpointError(f"{path}: {what} is a tensor of shape "
                            f"{tuple(value.shape)}, not a scalar.")
    return value.item()
  return value


def _adam_state(torch, optimizer, args: Mapping[str, Any], path: str):
  """nanoGPT's AdamW state_dict -> {'mu', 'nu': numpy trees in our layout,
  'count': AdamW's step}.

  nanoGPT's configure_optimizers makes two groups from named_parameters()
  (`gpt_layout.adamw_groups`).
  """
  where = f"{path}: 'optimizer'"
  if (not isinstance(optimizer, Mapping)
      or not {"state", "param_groups"} <= set(optimizer)
      or not isinstance(optimizer["state"], Mapping)
      or not isinstance(optimizer["param_groups"], (list, tuple))):
    raise weights_io.CheckpointError(
        f"{where} is not a torch optimizer state_dict "
        "(expected 'state', a dict, and 'param_groups', a list).")
  layout = gpt_layout.tensor_layout(args)
  groups = gpt_layout.adamw_groups(layout)
  torch_shapes = {name: shape[::-1] if is_linear else shape
                  for name, _, shape, is_linear in layout}
  sizes = [len(g.get("params", ())) if isinstance(g, Mapping) else None
           for g in optimizer["param_groups"]]
  if sizes != [len(g) for g in groups]:
    raise weights_io.CheckpointError(
        f"{where} has parameter groups of sizes {sizes}; nanoGPT's AdamW for "
        f"this model has [{len(groups[0])}, {len(groups[1])}] (weights of 2+ "
        "dimensions, then biases and LayerNorms).")
  moments = {"exp_avg": {}, "exp_avg_sq": {}}
  steps = set()
  for group, names in zip(optimizer["param_groups"], groups):
    for index, name in zip(group["params"], names):
      entry = optimizer["state"].get(index)
      if entry is None:  # never stepped: torch creates the state lazily
        for key in moments:
          moments[key][name] = np.zeros(torch_shapes[name], np.float32)
        steps.add(0)
        continue
      for key in moments:
        value = entry.get(key) if isinstance(entry, Mapping) else None
        if not isinstance(value, torch.Tensor):
          raise weights_io.CheckpointError(
              f"{where}: parameter {index} ({name}) has no "
              f"{key!r} tensor.")
        moments[key][name] = weights_io.torch_to_numpy(
            torch, value, f"optimizer {key} of {name}", path).astype(
                np.float32)
      steps.add(int(_scalar(torch, entry.get("step", 0),
                            f"optimizer step of {name}", path)))
  if len(steps) != 1:
    raise weights_io.CheckpointError(
        f"{where}: its parameters were stepped different "
        f"numbers of times ({sorted(steps)}).")
  return {"mu": gpt_layout.convert(moments["exp_avg"], args,
                                   where + " exp_avg", "transformer.",
                                   torch_linear=True),
          "nu": gpt_layout.convert(moments["exp_avg_sq"], args,
                                   where + " exp_avg_sq", "transformer.",
                                   torch_linear=True),
          "count": steps.pop()}


def load_nanogpt_checkpoint(path: str, optimizer: bool = False
                            ) -> tuple[dict, dict, dict]:
  """Reads a nanoGPT train.py `ckpt.pt`.

  Returns (params: numpy tree in our layout, model_args: {n_layer, n_head,
  n_embd, block_size, bias, vocab_size, dropout}, extras: {iter_num,
  best_val_loss (float), config (dict)}). With `optimizer`, extras also has
  'adam': AdamW's moments in our layout and its step count (`_adam_state`),
  or None when the file has no optimizer state.

  Raises:
    FileNotFoundError: no such file.
    ImportError: torch is not installed.
    CheckpointError (a ValueError): not a nanoGPT checkpoint, something
      other than tensors and plain containers in it, missing or unexpected
      tensors, or shapes that disagree with its model_args.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"nanoGPT checkpoint {path} does not exist or is "
                            "not a file (train.py writes out_dir/ckpt.pt).")
  torch, ckpt = weights_io.load_weights_only(
      path, f"Reading the nanoGPT checkpoint {path}")
  if not isinstance(ckpt, Mapping) or not {"model", "model_args"} <= set(
      ckpt):
    got = (gpt_layout.short_keys(ckpt) if isinstance(ckpt, Mapping)
           else f"a {type(ckpt).__name__}")
    raise weights_io.CheckpointError(
        f"{path} is not a nanoGPT checkpoint: expected a dict with 'model' "
        f"(state_dict) and 'model_args' as train.py saves; got {got}.")
  raw_args = ckpt["model_args"]
  if not isinstance(raw_args, Mapping):
    raise weights_io.CheckpointError(f"{path}: 'model_args' is a "
                          f"{type(raw_args).__name__}, not a dict.")
  absent = [k for k in MODEL_ARGS if k not in raw_args]
  if absent:
    raise weights_io.CheckpointError(
        f"{path}: model_args lacks {absent}; nanoGPT saves "
        f"{list(MODEL_ARGS)}.")
  model_args = {k: _scalar(torch, raw_args[k], f"model_args[{k!r}]", path)
                for k in MODEL_ARGS}
  bias = model_args["bias"]
  # nanoGPT saves a bool; bool("False") would be True.
  if not isinstance(bias, (bool, np.bool_)) and not (
      isinstance(bias, (int, np.integer)) and bias in (0, 1)):
    raise weights_io.CheckpointError(
        f"{path}: model_args['bias']={bias!r} is not a bool (nanoGPT's "
        "train.py saves True or False).")
  model_args["bias"] = bool(bias)
  model_args["dropout"] = gpt_layout.number(model_args["dropout"],
                                            "model_args['dropout']", path)
  for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
    model_args[k] = gpt_layout.integer(model_args[k], f"model_args[{k!r}]",
                                       path)
  gpt_layout.check_heads(model_args, f"{path}: model_args")

  state = ckpt["model"]
  if not isinstance(state, Mapping):
    raise weights_io.CheckpointError(
        f"{path}: 'model' is a {type(state).__name__}, not "
        "a state_dict.")
  weights_io.check_not_quantized(
      [key for key in state if isinstance(key, str)], path)
  tensors: dict[str, np.ndarray] = {}
  for key, value in state.items():
    if not isinstance(key, str):
      raise weights_io.CheckpointError(
          f"{path}: state_dict key {key!r} is a {type(key).__name__}, not a "
          "tensor name (nanoGPT's state_dict keys are strings).")
    if not isinstance(value, torch.Tensor):
      raise weights_io.CheckpointError(f"{path}: state_dict entry {key!r} is a "
                            f"{type(value).__name__}, not a tensor.")
    name = key[len("_orig_mod."):] if key.startswith("_orig_mod.") else key
    if name.startswith("transformer."):
      name = name[len("transformer."):]
    elif name != "lm_head.weight":
      raise weights_io.CheckpointError(
          f"{path}: state_dict key {key!r} is neither 'transformer.*' nor "
          "'lm_head.weight' (nanoGPT's GPT module names).")
    if _MASK_BUFFER.match(name):  # tril buffer of the non-flash path
      continue
    if name in tensors:
      raise weights_io.CheckpointError(
          f"{path}: {name!r} appears twice (with and "
          "without the '_orig_mod.' prefix).")
    tensors[name] = weights_io.torch_to_numpy(torch, value, key, path)
  gpt_layout.tied_head(tensors, "lm_head.weight", path)
  params = gpt_layout.convert(tensors, model_args, path, "transformer.",
                    torch_linear=True)

  iter_num = _scalar(torch, ckpt.get("iter_num", 0), "iter_num", path)
  best = _scalar(torch, ckpt.get("best_val_loss", float("inf")),
                 "best_val_loss", path)
  config = ckpt.get("config", {})
  extras = {"iter_num": gpt_layout.integer(iter_num, "iter_num", path),
            "best_val_loss": gpt_layout.number(best, "best_val_loss", path),
            "config": dict(config) if isinstance(config, Mapping) else {}}
  if optimizer:
    extras["adam"] = (None if ckpt.get("optimizer") is None else
                      _adam_state(torch, ckpt["optimizer"], model_args, path))
  return params, model_args, extras


# ------------------------------------------------------------- HF GPT-2


def hf_gpt2_model_args(directory: str) -> dict:
  """The model args of a Hugging Face GPT-2 directory, from its config.json
  alone (no weights read); errors as `load_hf_gpt2`."""
  if not os.path.isdir(directory):
    raise FileNotFoundError(
        f"Hugging Face GPT-2 directory {directory} does "
        f"not exist; it should hold {hf_gpt2_files.HF_FILES}.")
  return hf_gpt2_files.hf_model_args(hf_gpt2_files.read_hf_config(directory),
                        os.path.join(directory, hf_gpt2_files.HF_CONFIG))


def load_hf_gpt2(directory: str) -> tuple[dict, dict]:
  """Reads a Hugging Face GPT-2 directory (GPT2LMHeadModel or GPT2Model).

  Returns (params: numpy tree in our layout, model_args with vocab_size,
  block_size = n_positions, n_layer, n_head, n_embd, bias=True,
  dropout=0.0).

  Raises:
    FileNotFoundError: no such directory, or config.json / the weights
      missing.
    CheckpointError (a ValueError): missing, unexpected or misshapen
      tensors, or a config our model cannot represent.
  """
  model_args = hf_gpt2_model_args(directory)
  files, where = hf_gpt2_files.hf_files(directory)
  tensors: dict[str, np.ndarray] = {}
  with contextlib.ExitStack() as stack:
    opened = [stack.enter_context(weights_io.SafetensorsFile(file))
              for file in files]
    # From the headers, before any weight is read: a scale in one shard
    # makes its weight in another a quantized one.
    weights_io.check_not_quantized(
        [key for f in opened for key in f.names], where)
    for f in opened:
      for key in f.names:
        name = key[len("transformer."):] if key.startswith(
            "transformer.") else key
        if _MASK_BUFFER.match(name):
          continue
        if name in tensors:
          raise weights_io.CheckpointError(
              f"{where}: tensor {name!r} appears twice.")
        tensors[name] = f.read(key)
  gpt_layout.tied_head(tensors, "lm_head.weight", where)
  params = gpt_layout.convert(tensors, model_args, where, "",
                              torch_linear=False)
  return params, model_args


# ------------------------------------------------------------------ checks


def check_model_args(model_args: Mapping[str, Any], cfg: GPTConfig,
                     source: str) -> None:
  """Raises ValueError listing every architecture field where `cfg` and a
  checkpoint's model_args differ (dropout is a training setting and is not
  compared)."""
  problems = []
  for field in _COMPARED:
    if field not in model_args:
      problems.append(f"{source} does not record {field}")
      continue
    ours, theirs = getattr(cfg, field), model_args[field]
    if (bool(ours) != bool(theirs)) if field == "bias" else (
        int(ours) != int(theirs)):
      problems.append(f"config.model.{field}={ours!r} but {source} has "
                      f"{theirs!r}")
  if problems:
    raise ValueError("The checkpoint does not fit the model config: "
                     + "; ".join(problems) + ". Set config.model to the "
                     "checkpoint's sizes.")


def _is_target(x) -> bool:
  return isinstance(x, (jax.sharding.Sharding, jax.ShapeDtypeStruct))


def to_sharded(params, shardings, dtype=None):
  """Places a numpy params tree on devices, one shard per device.

  params: numpy arrays (as the loaders return). shardings: the same tree
  structure with `jax.sharding.Sharding` leaves (trm.core.mesh.tree_shardings of
  gpt.abstract_params) or `jax.ShapeDtypeStruct` leaves carrying a sharding
  (trm.core.state.with_shardings), whose shapes are then checked and whose dtypes
  are the targets. dtype: the stored dtype of every leaf (cfg.param_dtype),
  overriding those; with neither, each array keeps its own dtype. Every
  device's shard is cut from the host copy by `jax.make_array_from_callback`,
  so this works with several processes as long as each holds the whole tree.
  """
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  targets, target_def = jax.tree_util.tree_flatten(shardings,
                                                   is_leaf=_is_target)
  if treedef != target_def:
    ours = {jax.tree_util.keystr(p) for p, _ in flat}
    theirs = {jax.tree_util.keystr(p) for p, _ in
              jax.tree_util.tree_flatten_with_path(shardings,
                                                   is_leaf=_is_target)[0]}
    raise ValueError(
        "params and shardings differ in structure: only in params "
        f"{gpt_layout.short_keys(ours - theirs) or 'nothing'}; only in "
        f"shardings {gpt_layout.short_keys(theirs - ours) or 'nothing'}.")
  out = []
  for (path, value), target in zip(flat, targets):
    value = np.asarray(value)
    name = f"params{jax.tree_util.keystr(path)}"
    want = value.dtype
    if isinstance(target, jax.ShapeDtypeStruct):
      if tuple(target.shape) != value.shape:
        raise ValueError(f"{name} has shape {value.shape}; the model expects "
                         f"{tuple(target.shape)}.")
      want, target = target.dtype, target.sharding
      if target is None:
        raise ValueError(f"{name}: its ShapeDtypeStruct carries no sharding.")
    want = jnp.dtype(dtype) if dtype is not None else jnp.dtype(want)

    def block(index, value=value, want=want):
      return np.ascontiguousarray(value[index].astype(want))

    try:
      out.append(jax.make_array_from_callback(value.shape, target, block,
                                              dtype=want))
    except ValueError as e:
      raise ValueError(f"{name} of shape {value.shape} cannot take its "
                       f"sharding: {e}") from e
  return jax.tree_util.tree_unflatten(treedef, out)


# ------------------------------------------------------------------ our runs


def _restore_run_fields(workdir: str, ctx, build_boxed,
                        step: int | None = None):
  """(fields, step, checkpoints directory): the fields `build_boxed()` (a
  dict of boxed abstract trees) describes, read from checkpoint `step`
  (default: the newest readable one) of a trm.main workdir onto `ctx`'s
  mesh."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  boxed, shardings = ctx.boxed_shardings(build_boxed)
  directory = os.path.join(workdir, "checkpoints")
  fields, step = ckpt_lib.restore_fields(
      directory, state_lib.with_shardings(nn.meta.unbox(boxed), shardings),
      step=step)
  return fields, step, directory


def restore_run_training(workdir: str, cfg: GPTConfig, ctx, tx,
                         step: int | None = None):
  """(params, adam, step, best_val_loss) of checkpoint `step` (default: the
  newest readable one) of a trm.main workdir: `restore_run_params` plus the AdamW state of `tx`
  (the run's `gpt.steps.make_optimizer`) as {'mu', 'nu': trees like params,
  'count': its step}, and the best held-out loss the step was saved with
  (None when it has none)."""
  import optax  # pylint: disable=g-import-not-at-top
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top

  def boxed_fields():
    params = gpt.abstract_params(cfg)
    return {"params": params, "opt_state": jax.eval_shape(tx.init, params)}

  fields, step, directory = _restore_run_fields(workdir, ctx, boxed_fields,
                                                step)
  adam = [node for node in jax.tree.leaves(
      fields["opt_state"],
      is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
          if isinstance(node, optax.ScaleByAdamState)]
  if len(adam) != 1:
    raise weights_io.CheckpointError(
        f"{directory} step {step}: its optimizer state holds "
        f"{len(adam)} AdamW states; nanoGPT's optimizer is one AdamW.")
  adam = {"mu": adam[0].mu, "nu": adam[0].nu, "count": int(adam[0].count)}
  return (fields["params"], adam, step,
          ckpt_lib.read_best_loss(directory, step))


def restore_run_params(workdir: str, cfg: GPTConfig, ctx,
                       step: int | None = None):
  """(params on `ctx`'s mesh, step): checkpoint `step` (default: the newest
  readable one) of a trm.main workdir, its parameters only (the AdamW moments are not read),
  for `cfg`, the run's own model config."""
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  fields, step, _ = _restore_run_fields(
      workdir, ctx, lambda: {"params": gpt.abstract_params(cfg)}, step)
  return fields["params"], step
