"""GPT-2 tensor names and shapes -> our params tree (see the mapping table in
`trm.families.gpt.gpt_import`), checked by name, shape and dtype. Shared by
the nanoGPT and Hugging Face GPT-2 readers of `gpt_import`."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from trm.core import weights_io

def tensor_layout(args: Mapping[str, Any]):
  """[(name without 'transformer.', our path, our shape, is Linear weight)]."""
  c, v, bs = int(args["n_embd"]), int(args["vocab_size"]), int(
      args["block_size"])
  bias = bool(args["bias"])
  out = [("wte.weight", ("wte", "embedding"), (v, c), False),
         ("wpe.weight", ("wpe", "embedding"), (bs, c), False)]

  def norm(name, path):
    out.append((f"{name}.weight", path + ("scale",), (c,), False))
    if bias:
      out.append((f"{name}.bias", path + ("bias",), (c,), False))

  def linear(name, path, n_in, n_out):
    out.append((f"{name}.weight", path + ("kernel",), (n_in, n_out), True))
    if bias:
      out.append((f"{name}.bias", path + ("bias",), (n_out,), False))

  for i in range(int(args["n_layer"])):
    h, p = f"h.{i}.", (f"h_{i}",)
    norm(h + "ln_1", p + ("ln_1",))
    linear(h + "attn.c_attn", p + ("attn", "c_attn"), c, 3 * c)
    linear(h + "attn.c_proj", p + ("attn", "c_proj"), c, c)
    norm(h + "ln_2", p + ("ln_2",))
    linear(h + "mlp.c_fc", p + ("mlp", "c_fc"), c, 4 * c)
    linear(h + "mlp.c_proj", p + ("mlp", "c_proj"), 4 * c, c)
  norm("ln_f", ("ln_f",))
  return out


def adamw_groups(layout) -> tuple[list[str], list[str]]:
  """The tensor names of nanoGPT's two AdamW parameter groups
  (configure_optimizers): those of 2 or more dimensions (weight decay),
  then the rest, each in module order, which is `tensor_layout`'s; torch
  numbers the parameters through the groups in that order."""
  return ([name for name, _, shape, _ in layout if len(shape) >= 2],
          [name for name, _, shape, _ in layout if len(shape) < 2])


def integer(value, what: str, where: str) -> int:
  """`value` (a size or count read from a checkpoint) as an int; a string,
  bool, None or fraction is one CheckpointError naming `what` in `where`."""
  if isinstance(value, float) and value.is_integer():
    value = int(value)
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise weights_io.CheckpointError(
        f"{where}: {what}={value!r} is not an integer; the file is corrupt "
        "or was edited by hand: fix the value or use another checkpoint.")
  return int(value)


def number(value, what: str, where: str) -> float:
  """`value` as a float; anything but a number is one CheckpointError as
  `integer`'s."""
  if isinstance(value, bool) or not isinstance(value, (int, float,
                                                       np.number)):
    raise weights_io.CheckpointError(
        f"{where}: {what}={value!r} is not a number; the file is corrupt or "
        "was edited by hand: fix the value or use another checkpoint.")
  return float(value)


def check_heads(args: Mapping[str, Any], where: str) -> None:
  """n_embd must split into n_head heads: nanoGPT and HF GPT-2 both refuse
  to build the model otherwise (GPTConfig's error would blame
  config.model, which the checkpoint's sizes replaced)."""
  c, heads = args["n_embd"], args["n_head"]
  if heads < 1 or c % heads:
    raise weights_io.CheckpointError(
        f"{where}: n_embd={c} is not a multiple of n_head={heads}, so it "
        "describes no GPT (each head takes n_embd // n_head features); fix "
        "n_head or use another checkpoint.")


def short_keys(keys, limit: int = 8) -> str:
  keys = sorted(keys)
  more = f" ... ({len(keys) - limit} more)" if len(keys) > limit else ""
  return ", ".join(repr(k) for k in keys[:limit]) + more


def convert(tensors: dict[str, np.ndarray], args: Mapping[str, Any],
             where: str, prefix: str, torch_linear: bool) -> dict:
  """`tensors` (names without `prefix`, lm_head.weight and mask buffers
  already handled) -> our params tree; checks names and shapes."""
  last = f"h.{int(args['n_layer']) - 1}.ln_1.weight"
  if int(args["n_layer"]) > 0 and last not in tensors:
    # Before tensor_layout lists every layer's tensors: n_layer=10**9 would
    # exhaust the memory first.
    raise weights_io.CheckpointError(
        f"{where} lacks {prefix + last!r}: n_layer={args['n_layer']} names "
        "more layers than it holds; set n_layer to its layer count.")
  layout = tensor_layout(args)
  expected = {name for name, *_ in layout}
  missing = expected - set(tensors)
  unexpected = set(tensors) - expected
  if missing:
    raise weights_io.CheckpointError(
        f"{where} lacks {len(missing)} tensor(s) the model needs (n_layer="
        f"{args['n_layer']}, bias={args['bias']}): "
        f"{short_keys(prefix + k for k in missing)}.")
  if unexpected:
    raise weights_io.CheckpointError(
        f"{where} has {len(unexpected)} tensor(s) a GPT with n_layer="
        f"{args['n_layer']}, bias={args['bias']} does not have: "
        f"{short_keys(prefix + k for k in unexpected)}.")
  params: dict = {}
  for name, path, shape, is_linear in layout:
    value = tensors[name]
    stored = shape[::-1] if is_linear and torch_linear else shape
    if tuple(value.shape) != stored:
      raise weights_io.CheckpointError(
          f"{where}: tensor {prefix + name!r} has shape {tuple(value.shape)};"
          f" expected {stored} for n_embd={args['n_embd']}, vocab_size="
          f"{args['vocab_size']}, block_size={args['block_size']}.")
    dtype = np.asarray(value).dtype
    if not weights_io.is_float(dtype):
      raise weights_io.CheckpointError(
          f"{where}: tensor {prefix + name!r} has dtype {dtype}; weights must "
          "be floating point (float32, float16, bfloat16 or float8): an "
          "integer or bool tensor would load as garbage.")
    if is_linear and torch_linear:
      value = value.T
    weights_io.set_path(params, path, np.ascontiguousarray(value))
  return params


def tied_head(tensors: dict[str, np.ndarray], name: str, where: str):
  """Drops the LM head after checking that it is the token embedding."""
  head = tensors.pop(name, None)
  if head is None:
    return
  wte = tensors.get("wte.weight")
  if wte is not None and (head.shape != wte.shape
                          or not np.array_equal(head, wte)):
    raise weights_io.CheckpointError(
        f"{where}: {name!r} differs from the token embedding, but the model "
        "ties its LM head to wte (nanoGPT's weight tying); an untied "
        "checkpoint cannot be loaded.")
