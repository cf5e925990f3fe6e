"""A Hugging Face GPT-2 directory: its config.json (checked and turned into
nanoGPT model args) and its .safetensors weight files (one file, or shards
named by an index). Read by `trm.families.gpt.gpt_import.load_hf_gpt2`. A
Hub model id in place of the directory ("openai-community/gpt2") is
downloaded first (`local_directory`)."""

from __future__ import annotations

import os
import re

from trm.core import hub
from trm.core import weights_io
from trm.families.gpt import gpt_layout

HF_CONFIG = "config.json"
HF_SINGLE = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"
HF_FILES = (f"{HF_CONFIG} and {HF_SINGLE} (or sharded "
             f"model-*.safetensors with {HF_INDEX})")
# What a GPT-2 download needs: the config and the safetensors weights (one
# file or shards with their index), not the PyTorch / TF / Flax copies.
HUB_PATTERNS = (HF_CONFIG, "*.safetensors", HF_INDEX)
# "org/name" as the Hub spells model ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def local_directory(path: str, flag: str = "--config.init_checkpoint") -> str:
  """`path` itself when it is a directory (or does not look like a Hub model
  id, so the readers name it as missing); a Hub model id such as
  "openai-community/gpt2" is downloaded with `trm.core.hub.snapshot` (the
  Hub cache; without network a cached copy, else one line naming `flag`,
  how the command in hand spells the directory)."""
  if os.path.exists(path) or not _HUB_ID.match(path):
    return path
  return hub.snapshot(
      path, allow_patterns=HUB_PATTERNS,
      offline_hint=(f"{flag}={path} is no local directory, so it was taken "
                    "as a Hugging Face Hub model id; without network, "
                    f"download it elsewhere (huggingface-cli download {path} "
                    f"--local-dir DIR) and pass {flag}=DIR"))


def read_hf_config(directory: str) -> dict:
  path = os.path.join(directory, HF_CONFIG)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing; a Hugging Face GPT-2 "
                            f"directory holds {HF_FILES}.")
  # The shared reader: a size cap, and one line for bad UTF-8 or nesting
  # deep enough to exhaust Python's recursion limit (a traceback before).
  hf = weights_io.read_json(path)
  if not isinstance(hf, dict):
    raise weights_io.CheckpointError(
        f"{path} holds a {type(hf).__name__}, not the "
        "model's config object.")
  weights_io.check_quantization_config(hf, path)
  return hf


def hf_model_args(hf: dict, path: str) -> dict:
  vocab = hf.get("vocab_size", hf.get("n_vocab"))
  fields = {"vocab_size": vocab, "block_size": hf.get("n_positions"),
            "n_layer": hf.get("n_layer"), "n_head": hf.get("n_head"),
            "n_embd": hf.get("n_embd")}
  absent = [k for k, v in fields.items() if v is None]
  if absent:
    raise weights_io.CheckpointError(f"{path} lacks the GPT-2 size(s) {absent} "
                          "(vocab_size, n_positions, n_layer, n_head, "
                          "n_embd).")
  keys = {"block_size": "n_positions", "vocab_size": (
      "vocab_size" if "vocab_size" in hf else "n_vocab")}  # config.json's
  fields = {k: gpt_layout.integer(v, keys.get(k, k), path)
            for k, v in fields.items()}
  gpt_layout.check_heads(fields, path)
  # Architecture switches our (nanoGPT) model does not implement.
  for field, want in (("scale_attn_weights", True),
                      ("scale_attn_by_inverse_layer_idx", False),
                      ("add_cross_attention", False)):
    if field in hf and bool(hf[field]) != want:
      raise weights_io.CheckpointError(
          f"{path}: {field}={hf[field]!r} is not supported "
          f"(nanoGPT's GPT has {want}).")
  act = hf.get("activation_function", "gelu_new")
  if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
    raise weights_io.CheckpointError(
        f"{path}: activation_function={act!r} is not a "
        "GELU; nanoGPT's MLP uses GELU.")
  n_inner = hf.get("n_inner")
  if n_inner is not None and gpt_layout.integer(
      n_inner, "n_inner", path) != 4 * fields["n_embd"]:
    raise weights_io.CheckpointError(
        f"{path}: n_inner={n_inner} is not 4 * n_embd, as "
        "nanoGPT's MLP requires.")
  eps = hf.get("layer_norm_epsilon", 1e-5)
  if abs(gpt_layout.number(eps, "layer_norm_epsilon", path) - 1e-5) > 1e-12:
    raise weights_io.CheckpointError(
        f"{path}: layer_norm_epsilon={eps} is not nanoGPT's"
        " 1e-5.")
  args = dict(fields, bias=True, dropout=0.0)
  return args


def hf_files(directory: str) -> tuple[list[str], str]:
  index = os.path.join(directory, HF_INDEX)
  layout = weights_io.weights_layout(directory, HF_SINGLE, HF_INDEX)
  if layout == HF_SINGLE:
    single = os.path.join(directory, HF_SINGLE)
    return [single], single
  if layout == HF_INDEX:
    weight_map = weights_io.read_index(index)  # names checked inside it
    files = sorted(set(weight_map.values()))
    for file in files:
      if not os.path.isfile(os.path.join(directory, file)):
        raise FileNotFoundError(f"{os.path.join(directory, file)} (named in "
                                f"{index}) is missing.")
    return [os.path.join(directory, f) for f in files], index
  extra = (" (pytorch_model.bin is not read: convert it to safetensors)"
           if os.path.exists(os.path.join(directory, "pytorch_model.bin"))
           else "")
  raise FileNotFoundError(f"{directory} has neither {HF_SINGLE} nor "
                          f"{HF_INDEX}; a Hugging Face GPT-2 directory holds "
                          f"{HF_FILES}{extra}.")
