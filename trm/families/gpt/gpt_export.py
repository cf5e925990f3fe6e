"""Writes a GPT's parameters back to PyTorch's formats, the reverse of
`gpt_import`: nanoGPT's `ckpt.pt` (what its `sample.py --init_from=resume`
reads) or a Hugging Face GPT-2 directory (`GPT2LMHeadModel.from_pretrained`).

The tensors are `gpt_layout.tensor_layout`'s, named as each format names
them (the mapping table in `gpt_import`): nanoGPT's Linear weights are torch
[out, in], so ours are transposed; HF's Conv1D weights are [in, out] like
ours. The LM head is tied to `wte` in both: nanoGPT's state_dict holds it as
`lm_head.weight` too (its `load_state_dict` wants both keys), HF's
`save_pretrained` leaves it out.

Only nanoGPT's architecture can be written: `head_size` or `mlp_size` set
(MaxText's shapes) is refused. The Hugging Face config says
`activation_function: "gelu"`, the exact GELU nanoGPT trains with (GPT-2's
own `gelu_new` is the tanh approximation), and a model without biases
(nanoGPT's `bias=False`) gets zero biases, which GPT-2 always has: the HF
model computes what ours does.

Every process must call the writers (an array sharded over several
processes is gathered, a collective); process 0 writes.
"""
from __future__ import annotations

import collections
import json
import os

import flax.linen as nn
import jax
import numpy as np

from trm.core import host_arrays
from trm.core import weights_io
from trm.data import atomic_files
from trm.families.gpt import gpt_layout
from trm.families.gpt import hf_gpt2_files
from trm.families.gpt import model as gpt_model
from trm.families.gpt.config import GPTConfig

NANOGPT_FILE = "ckpt.pt"
# GPT-2's BPE <|endoftext|>, bos and eos of its config.json.
_GPT2_EOT = 50256


def check_exportable(cfg: GPTConfig) -> None:
  """nanoGPT and GPT-2 have neither a head width apart from n_embd / n_head,
  nor an MLP other than 4 * n_embd, nor fewer key/value heads than query
  heads."""
  for name, default in (("head_size", "n_embd // n_head"),
                        ("mlp_size", "4 * n_embd"), ("n_kv_head", "n_head")):
    if getattr(cfg, name) and not (name == "n_kv_head"
                                   and cfg.n_kv_head == cfg.n_head):
      raise ValueError(
          f"config.model.{name}={getattr(cfg, name)}: nanoGPT and Hugging "
          f"Face GPT-2 have no such field (theirs is always {default}), so "
          "this model cannot be written in their formats.")


def model_args(cfg: GPTConfig) -> dict:
  """nanoGPT's `model_args` (its GPTConfig's fields)."""
  return dict(n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd,
              block_size=cfg.block_size, bias=bool(cfg.bias),
              vocab_size=cfg.vocab_size, dropout=float(cfg.dropout))


def _writable(value: np.ndarray) -> np.ndarray:
  """`value`, or a copy in memory numpy owns where it is read-only: a JAX
  array's host value is a view (of its buffer, or a copy it caches),
  which torch warns of and must not write through."""
  return value if value.flags.writeable else np.array(value)


def _owned_whole(x) -> np.ndarray:
  """`host_arrays.whole(x)`, `_writable`, with the JAX array `x` deleted
  once read: copied while the array lived on, every such tensor would be
  held twice."""
  value = _writable(host_arrays.whole(x))
  if isinstance(x, jax.Array):
    x.delete()
  return value


def _torch_tensor(torch, value: np.ndarray):
  """`torch.from_numpy` of `value` made `_writable` (a copy beside the
  caller's JAX array without `consume`)."""
  return torch.from_numpy(_writable(value))


def _named_tensors(params, cfg: GPTConfig, torch_linear: bool,
                   with_bias: bool, dtype=None,
                   consume: bool = False) -> dict[str, np.ndarray]:
  """{name without 'transformer.': numpy value} on process 0 ({} on the
  others, after taking part in every gather). `consume`: the caller's
  last use of `params`, whose arrays are deleted a leaf at a time as they
  are read (`_owned_whole`), so that every value is writable."""
  check_exportable(cfg)
  # Gathered whole first (a collective, in the tree's order on every
  # process), then unstacked on the host: slicing an array that spans
  # processes is no eager operation.
  params = jax.tree.map(_owned_whole if consume else host_arrays.whole,
                        nn.meta.unbox(params))
  if jax.process_index() != 0:
    return {}
  if cfg.scan_layers:
    params = gpt_model.unstack_layers(params, cfg.n_layer)
  out = {}
  for name, path, shape, is_linear in gpt_layout.tensor_layout(
      dict(model_args(cfg), bias=with_bias)):
    if name.endswith(".bias") and not cfg.bias:
      value = np.zeros(shape, np.float32)
    else:
      value = weights_io.get_path(params, path)
    if tuple(value.shape) != shape:
      raise weights_io.CheckpointError(
          f"params/{'/'.join(path)} has shape {tuple(value.shape)}; the "
          f"config's GPT gives {shape}.")
    if is_linear and torch_linear:
      value = value.T
    out[name] = np.ascontiguousarray(weights_io.cast_for_export(
        name, value, dtype or value.dtype))
  return out


def hf_config_dict(cfg: GPTConfig, torch_dtype: str) -> dict:
  """config.json of the Hugging Face export; `hf_gpt2_files.hf_model_args`
  reads it back to the same sizes."""
  eot = _GPT2_EOT if cfg.vocab_size > _GPT2_EOT else None
  dropout = float(cfg.dropout)
  return {
      "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
      "vocab_size": cfg.vocab_size, "n_positions": cfg.block_size,
      "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
      "n_inner": None, "activation_function": "gelu",
      "resid_pdrop": dropout, "embd_pdrop": dropout, "attn_pdrop": dropout,
      "layer_norm_epsilon": 1e-5, "initializer_range": 0.02,
      "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
      "reorder_and_upcast_attn": False, "tie_word_embeddings": True,
      "use_cache": True, "bos_token_id": eot, "eos_token_id": eot,
      "torch_dtype": torch_dtype,
  }


def export_hf_gpt2(params, cfg: GPTConfig, directory: str,
                   dtype: str = "float32") -> list[str]:
  """Writes `directory`/model.safetensors and config.json; returns the
  files written (none on processes other than 0)."""
  tensors = _named_tensors(params, cfg, torch_linear=False, with_bias=True,
                           dtype=np.dtype(dtype))
  if jax.process_index() != 0:
    return []
  os.makedirs(directory, exist_ok=True)
  weights_io.save_safetensors(
      {"transformer." + k: v for k, v in tensors.items()},
      os.path.join(directory, hf_gpt2_files.HF_SINGLE),
      metadata={"format": "pt"})
  with open(os.path.join(directory, hf_gpt2_files.HF_CONFIG), "w") as f:
    json.dump(hf_config_dict(cfg, str(np.dtype(dtype))), f, indent=2)
  return [hf_gpt2_files.HF_SINGLE, hf_gpt2_files.HF_CONFIG]


# nanoGPT's best_val_loss before any evaluation (its train.py's 1e9).
_NO_BEST_VAL_LOSS = 1e9


def _adamw_state_dict(torch, adam: dict, cfg: GPTConfig, hyper: dict,
                     consume: bool = False):
  """torch.optim.AdamW's state_dict for nanoGPT's configure_optimizers,
  its two parameter groups `gpt_layout.adamw_groups` (as
  `gpt_import._adam_state` reads them back); `consume` as in
  `_named_tensors`."""
  moments = {key: _named_tensors(adam[key], cfg, torch_linear=True,
                                 with_bias=bool(cfg.bias), dtype=np.float32,
                                 consume=consume)
             for key in ("mu", "nu")}
  if jax.process_index() != 0:
    return None
  groups = gpt_layout.adamw_groups(gpt_layout.tensor_layout(
      dict(model_args(cfg), bias=bool(cfg.bias))))
  step = float(adam["count"])
  state, param_groups, index = {}, [], 0
  for names, decay in zip(groups, (hyper["weight_decay"], 0.0)):
    indices = list(range(index, index + len(names)))
    index += len(names)
    for i, name in zip(indices, names):
      state[i] = {"step": torch.tensor(step),
                  "exp_avg": _torch_tensor(torch, moments["mu"][name]),
                  "exp_avg_sq": _torch_tensor(torch, moments["nu"][name])}
    param_groups.append({
        "lr": float(hyper["learning_rate"]),
        "betas": (float(hyper["beta1"]), float(hyper["beta2"])),
        "eps": 1e-8, "weight_decay": float(decay), "amsgrad": False,
        "foreach": None, "maximize": False, "capturable": False,
        "differentiable": False, "fused": None, "params": indices})
  return {"state": state, "param_groups": param_groups}


def export_nanogpt(params, cfg: GPTConfig, path: str, iter_num: int,
                   dataset: str | None = None, adam: dict | None = None,
                   hyper: dict | None = None,
                   best_val_loss: float | None = None,
                   consume: bool = False) -> list[str]:
  """Writes nanoGPT's checkpoint dict to `path` with `torch.save` (needs
  torch): `model` (the state_dict, float32), `model_args`, `iter_num`,
  `best_val_loss` (1e9, nanoGPT's start, when the run recorded none) and,
  when known, `config.dataset` (sample.py looks for data/<dataset>/meta.pkl
  there). With `adam` ({'mu', 'nu', 'count'} as
  `gpt_import.restore_run_training` reads them) and `hyper` (the run's
  learning_rate, beta1, beta2, weight_decay) also `optimizer`, AdamW's
  state_dict: nanoGPT's train.py --init_from=resume then continues the run.
  `consume`: the caller's last use of `params` and `adam`, whose arrays are
  then deleted as they are read, each copied alone into memory numpy owns:
  torch gets writable arrays (not read-only views of JAX's, which it warns
  of) for about one tensor more than the views; without it the read-only
  ones are copied beside them. Returns the file written
  (none on processes other than 0)."""
  tensors = _named_tensors(params, cfg, torch_linear=True,
                           with_bias=bool(cfg.bias), dtype=np.float32,
                           consume=consume)
  torch = (weights_io.import_torch(f"Writing nanoGPT's checkpoint {path}")
           if jax.process_index() == 0 else None)
  optimizer = (None if adam is None
               else _adamw_state_dict(torch, adam, cfg, hyper, consume))
  if jax.process_index() != 0:
    return []
  state = collections.OrderedDict(
      ("transformer." + k, _torch_tensor(torch, v)) for k, v in tensors.items())
  state["lm_head.weight"] = state["transformer.wte.weight"]  # tied
  checkpoint = {"model": state, "model_args": model_args(cfg),
                "iter_num": int(iter_num),
                "best_val_loss": float(_NO_BEST_VAL_LOSS
                                       if best_val_loss is None
                                       else best_val_loss),
                "config": {"dataset": dataset} if dataset else {}}
  if optimizer is not None:
    checkpoint["optimizer"] = optimizer
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  atomic_files.atomic_write(path, lambda f: torch.save(checkpoint, f))
  return [os.path.basename(path)]
