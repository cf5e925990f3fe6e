"""Dream / DiffuCoder `config.json`: checked against our model config on
import, written on export (see `trm.families.dream.hf_import`), and read into
a DreamConfig for inference (`model_config_from_hf`)."""

from __future__ import annotations

import math
import os
from typing import Optional

from trm.core import config_lib
from trm.core import weights_io
from trm.families.dream.model import DreamConfig

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

# config.json key -> DreamConfig field (the same names upstream).
CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size",
                  "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "rope_theta", "rms_norm_eps",
                  "mask_token_id", "pad_token_id")
# What Dream's DreamConfig (and Qwen2's) takes for a float field config.json
# leaves out; no tensor shape shows a wrong one, so it must be compared too.
HF_DEFAULTS = {"rope_theta": 10000.0, "rms_norm_eps": 1e-6}


def hf_value(hf: dict, field: str):
  """config.json's `field` (None if absent; a float field absent means
  `HF_DEFAULTS`). transformers 5 writes no top-level rope_theta: it keeps
  it in `rope_parameters` ({"rope_type": "default", "rope_theta": ...}),
  where it was not looked for, so a Qwen2 directory saved by it was read
  with the default base 10000 (a silently different model)."""
  if field not in hf and field == "rope_theta":
    rope = hf.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
      return rope["rope_theta"]
  return hf.get(field, HF_DEFAULTS.get(field))


def _check_rope_parameters(hf: dict, path: str) -> None:
  """`rope_scaling`, and transformers 5's `rope_parameters` (its
  rope_scaling, with rope_theta inside), must describe plain RoPE, the only
  one the port implements: absent, null, or rope_type "default", which
  transformers computes as no scaling (such a rope_scaling was refused)."""
  for field in ("rope_scaling", "rope_parameters"):
    rope = hf.get(field)
    if rope is None:
      continue
    plain = (isinstance(rope, dict)
             and rope.get("rope_type", rope.get("type", "default"))
             == "default"
             and set(rope) <= {"rope_type", "type", "rope_theta"})
    if not plain:
      raise weights_io.CheckpointError(
          f"{path}: {field}={rope!r} is not supported (expected the "
          "default RoPE: null, or {\"rope_type\": \"default\"}).")


def check_hf_config(directory: str, cfg: DreamConfig) -> dict:
  """Checks config.json against `cfg`; returns it. Errors name the field."""
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.exists(path):
    raise weights_io.CheckpointError(f"{path} is missing.")
  hf = weights_io.read_json(path)
  if not isinstance(hf, dict):
    raise weights_io.CheckpointError(
        f"{path} holds a {type(hf).__name__}, not the "
        "model's config object.")
  weights_io.check_quantization_config(hf, path)
  for field in CONFIG_FIELDS:
    # A float left out is Dream's default (as `model_config_from_hf` and
    # Dream's own code read it), not whatever config.model holds.
    theirs = hf_value(hf, field)
    if theirs is None:  # Qwen2 configs have no mask_token_id
      continue
    ours = getattr(cfg, field)
    if isinstance(ours, float) and not config_lib.is_number(theirs):
      raise weights_io.CheckpointError(
          f"{path}: {field}={_shown(theirs)} is not a number; fix config.json "
          "or download the checkpoint again.")
    ok = (math.isclose(float(theirs), float(ours), rel_tol=1e-9)
          if isinstance(ours, float) else theirs == ours)
    if not ok:
      raise weights_io.CheckpointError(
          f"{path}: {field}={theirs!r}"
          + ("" if field in hf or hf_value(hf, field) != HF_DEFAULTS.get(
              field) else " (absent: Dream's default)")
          + f" does not match config.model.{field}={ours!r}.")
  # Architecture switches the port does not implement must be off.
  for field, want in (("tie_word_embeddings", False),
                      ("use_sliding_window", False), ("hidden_act", "silu")):
    if field in hf and hf[field] != want and not (want is False
                                                  and hf[field] is None):
      raise weights_io.CheckpointError(
          f"{path}: {field}={hf[field]!r} is not supported "
          f"(expected {want!r}).")
  _check_rope_parameters(hf, path)
  if hf.get("head_dim") not in (None, cfg.head_dim):
    raise weights_io.CheckpointError(
        f"{path}: head_dim={hf['head_dim']!r} does not match "
        f"config.model.hidden_size / num_attention_heads = "
        f"{cfg.head_dim}.")
  return hf



# What `auto_map` names: Dream's remote code, which this project does not
# ship. An export claims it only when those files were copied beside it.
REMOTE_CODE = {"AutoConfig": "configuration_dream.DreamConfig",
               "AutoModel": "modeling_dream.DreamModel"}


def stored_dtype(hf: dict):
  """The tensors' dtype config.json names, or None: `torch_dtype`, which
  transformers 4.56 and later write as `dtype`."""
  return hf.get("torch_dtype") or hf.get("dtype")


# Fields of the checkpoint a run was fine-tuned from that our config does
# not hold, carried into the export's config.json (`fields_from_source`).
SOURCE_FIELDS = ("bos_token_id", "eos_token_id", "max_position_embeddings")


def fields_from_source(directory: str, cfg: DreamConfig) -> dict:
  """The checkpoint's own `SOURCE_FIELDS` from `directory`'s config.json
  (the Hugging Face download a run was fine-tuned from, `trm.export
  --tokenizer`), so an export keeps its bos/eos ids (Dream-Coder's bos is
  not its pad) and position limit; {} when the directory has no
  config.json. A value that is not a token id below `cfg.vocab_size` (or a
  positive length) is refused, naming the file and field."""
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.lexists(path):
    return {}
  hf = read_config_object(path)
  out = {}
  for field in SOURCE_FIELDS:
    if field not in hf or hf[field] is None:
      continue
    value = hf[field]
    if field == "max_position_embeddings":
      ok = _is_int(value) and value > 0
      want = "a positive integer"
    else:
      ok = _are_token_ids(field, value, cfg.vocab_size)
      want = f"token id(s) below the model's vocab_size {cfg.vocab_size}"
    if not ok:
      raise weights_io.CheckpointError(
          f"{path}: {field}={value!r} is not {want}; fix the file, or point "
          "--tokenizer at the checkpoint the run was fine-tuned from.")
    out[field] = value
  return out


def check_source_generation_config(directory: str, cfg: DreamConfig) -> None:
  """`directory`'s generation_config.json, which `trm.export --tokenizer`
  copies over the export's own, must agree with the model: Dream's
  `diffusion_generate` takes mask_token_id and pad_token_id from it (a
  `generation_config` passed in falls back to it for every special id), so
  a file naming another mask id made Dream's code fill the canvas with an
  ordinary token, while config.json and our loaders said the model's. Its
  mask id, where set, must equal config.model's; its bos/eos/pad ids must
  be token ids below the vocabulary. Its pad id is not held to the model's: a
  download's generation config may name another padding token than its
  config.json (Dream's code then pads as the source model does), and no
  such file may stop an export of that model. Nothing to check without
  the file."""
  path = os.path.join(directory, GENERATION_CONFIG_FILE)
  if not os.path.lexists(path):
    return
  generation = read_config_object(path)
  mask = generation.get("mask_token_id")
  if mask is not None and mask != cfg.mask_token_id:
    raise weights_io.CheckpointError(
        f"{path}: mask_token_id={mask!r}, but config.model.mask_token_id="
        f"{cfg.mask_token_id} (what the export's config.json says); "
        "Dream's diffusion_generate would read the file's. Point "
        "--tokenizer at the checkpoint the run was fine-tuned from.")
  for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
    value = generation.get(field)
    if value is not None and not _are_token_ids(field, value, cfg.vocab_size):
      raise weights_io.CheckpointError(
          f"{path}: {field}={value!r} is not token id(s) below the model's "
          f"vocab_size {cfg.vocab_size}; fix the file, or point --tokenizer "
          "at the checkpoint the run was fine-tuned from.")


def hf_config_dict(cfg: DreamConfig, torch_dtype: str,
                   source: dict | None = None) -> dict:
  """config.json contents for an exported checkpoint (Dream's fields). No
  `auto_map`: `transformers` would look for remote-code files the export
  does not write (`trm.export` adds it when --tokenizer's directory brought
  them). `source`: `fields_from_source`'s values, which replace the
  defaults below (bos and eos equal to pad, as Dream's and DiffuCoder's
  own config.json have them)."""
  out = {
      "architectures": ["DreamModel"],
      "model_type": "Dream",
      "hidden_act": "silu",
      "tie_word_embeddings": False,
      "rope_scaling": None,
      "use_sliding_window": False,
      "sliding_window": None,
      "attention_dropout": 0.0,
      "use_cache": False,
      "bos_token_id": cfg.pad_token_id,
      "eos_token_id": cfg.pad_token_id,
      # DiffuCoder's value (RoPE has no hard limit; Dream trained at 2048).
      "max_position_embeddings": 131072,
      "torch_dtype": torch_dtype,
  }
  out.update(source or {})
  out.update({field: getattr(cfg, field) for field in CONFIG_FIELDS})
  return out


def hf_generation_config_dict(cfg: DreamConfig,
                              source: dict | None = None) -> dict:
  """generation_config.json for an exported checkpoint: the special ids, as
  config.json names them (`source` as in `hf_config_dict`). Dream's remote
  code needs the file: `DreamModel.from_pretrained` (hub and dllm alike)
  reads it with `DreamGenerationConfig.from_pretrained`, which raises where
  it is missing (transformers' own loader falls back to config.json;
  Dream's override does not). `trm.export --tokenizer=DIR` copies DIR's
  file over this one (the checkpoint's own, with its sampling defaults)."""
  source = source or {}
  return {"bos_token_id": source.get("bos_token_id", cfg.pad_token_id),
          "eos_token_id": source.get("eos_token_id", cfg.pad_token_id),
          "pad_token_id": cfg.pad_token_id,
          "mask_token_id": cfg.mask_token_id}


def _are_token_ids(field: str, value, vocab_size: int) -> bool:
  """A bos/eos field's value is one token id below `vocab_size`, or for
  eos (generation configs may list several) a non-empty list of them."""
  ids = value if isinstance(value, list) and field == "eos_token_id" else [
      value]
  return bool(ids) and all(_is_int(v) and 0 <= v < vocab_size for v in ids)


def _is_int(value) -> bool:
  """A JSON integer (a bool is no size or token id)."""
  return isinstance(value, int) and not isinstance(value, bool)


def _shown(value) -> str:
  """repr(value), cut to 60 characters (a crafted number can be thousands
  of digits long)."""
  text = repr(value)
  if len(text) <= 60:
    return text
  return f"{text[:40]}... ({len(text):,} characters)"


# Stored dtypes whose every value bfloat16 holds exactly (float8's exponent
# range lies inside bfloat16's), so params need not take float32's memory.
_BF16_HOLDS = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def read_config_object(path: str) -> dict:
  """A config object from `path` (weights_io's reader, plus the checks that
  the file exists and holds an object)."""
  if os.path.lexists(path) and not os.path.isfile(path):
    raise weights_io.CheckpointError(
        f"{path} is not a regular file (a directory, FIFO, device or broken "
        "link); name the checkpoint's config file.")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path} is missing.")
  value = weights_io.read_json(path)
  if not isinstance(value, dict):
    raise weights_io.CheckpointError(f"{path} holds a {type(value).__name__},"
                                    " not a config object.")
  return value


def model_config_from_hf(directory: str, tokenizer=None, *,
                         dtype: Optional[str] = "bfloat16",
                         param_dtype: Optional[str] = None,
                         attention: str = "dot"):
  """(DreamConfig, max positions or None) from a Hugging Face directory's
  config.json; a Qwen2 config (no mask id) takes `<|mask|>` from the
  tokenizer. `dtype` None computes in the stored dtype (bfloat16 for
  float8); `param_dtype` None stores bfloat16 for bfloat16 or float8
  tensors, else float32."""
  path = os.path.join(directory, CONFIG_FILE)
  hf = read_config_object(path)
  weights_io.check_quantization_config(hf, path)
  kind = str(hf.get("model_type", "")).lower()
  if kind not in ("dream", "qwen2"):
    raise weights_io.CheckpointError(
        f"{path}: model_type={hf.get('model_type')!r}; a Dream/DiffuCoder "
        "(model_type 'Dream') or Qwen2-shaped directory is needed.")
  sizes = {}
  for field in ("vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads"):
    if not _is_int(hf.get(field)):
      raise weights_io.CheckpointError(
          f"{path}: {field} is missing or not an integer.")
    sizes[field] = hf[field]
  mask_id = hf.get("mask_token_id")
  if mask_id is None and tokenizer is not None:
    mask_id = tokenizer.mask_id
  if mask_id is None:
    raise weights_io.CheckpointError(
        f"{path} has no mask_token_id and no tokenizer names <|mask|>; pass "
        "a DiffuCoder/Dream checkpoint.")
  pad_id = hf.get("pad_token_id", hf.get("eos_token_id"))
  if isinstance(pad_id, list):
    pad_id = pad_id[0] if pad_id else None
  if pad_id is None:
    raise weights_io.CheckpointError(f"{path}: pad_token_id is missing.")
  for field, value in (("mask_token_id", mask_id), ("pad_token_id", pad_id)):
    if not _is_int(value):
      raise weights_io.CheckpointError(
          f"{path}: {field}={value!r} is not an integer token id.")
  floats = {}
  _check_rope_parameters(hf, path)
  for field in HF_DEFAULTS:
    value = hf_value(hf, field)
    if not config_lib.is_number(value):
      raise weights_io.CheckpointError(
          f"{path}: {field}={_shown(value)} is not a number.")
    floats[field] = float(value)
  stored = str(stored_dtype(hf) or "float32")
  if dtype is None:  # 'auto': compute in the stored dtype (float8: bf16)
    dtype = stored if stored in ("float32", "float16") else "bfloat16"
  try:
    cfg = DreamConfig(
        **sizes, **floats, mask_token_id=mask_id, pad_token_id=pad_id,
        dtype=dtype, param_dtype=param_dtype or (
            "bfloat16" if stored in _BF16_HOLDS else "float32"),
        remat="none", attention=attention)
  except ValueError as e:  # sizes that do not fit together
    raise weights_io.CheckpointError(f"{path} describes no valid model: "
                                     f"{e}") from None
  positions = hf.get("max_position_embeddings")
  if _is_int(positions) and positions < 1:
    raise weights_io.CheckpointError(
        f"{path}: max_position_embeddings={positions} must be a positive "
        "integer (the longest sequence the model takes); fix it, or remove "
        "the field.")
  return cfg, (int(positions) if _is_int(positions) else None)
