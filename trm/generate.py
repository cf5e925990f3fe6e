r"""Sample from DiffuCoder / Dream with masked diffusion, sharded on the mesh.

  python -m trm.generate --config=configs/diffucoder_7b.py \
      --checkpoint=DiffuCoder-7B-Instruct --prompt="Write a quick sort." --chat
  python -m trm.generate --config=configs/diffucoder_7b.py \
      --checkpoint=DIR --batch_file=prompts.txt --max_new_tokens=256 \
      --steps=256 --alg=entropy --temperature=0.3 --top_p=0.95

--checkpoint is the Hugging Face download (safetensors shards, index,
config.json, tokenizer.json), or a `trm.main` fine-tuning workdir (its newest
Orbax checkpoint; the tokenizer is then the config's data.tokenizer, or
--tokenizer). Each process reads only the slices of the weights its devices
hold. Prompts are left-padded into one batch; the
whole denoising loop is one compiled program. Completions are cut at
<|endoftext|>, <|dlm_pad|> or <|im_end|>, as the reference callers do.
"""
from __future__ import annotations

import os
import time

from absl import app, flags
from ml_collections import config_flags

from trm import config_lib


def read_prompts(prompt: str | None, batch_file: str | None) -> list[str]:
  if bool(prompt) == bool(batch_file):
    raise app.UsageError("Give exactly one of --prompt and --batch_file.")
  if prompt:
    return [prompt]
  if not os.path.isfile(batch_file):
    raise app.UsageError(f"--batch_file={batch_file}: no such file (one "
                         "prompt per line).")
  with open(batch_file) as f:
    prompts = [line.rstrip("\n") for line in f if line.strip()]
  if not prompts:
    raise app.UsageError(f"--batch_file={batch_file} holds no prompts.")
  return prompts


def left_pad(token_lists, pad_id: int, max_len: int):
  """(ids [B, P], mask [B, P]) with every prompt right-aligned."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  longest = max(len(t) for t in token_lists)
  if longest > max_len:
    raise ValueError(f"A prompt has {longest} tokens but only "
                     f"{max(max_len, 0)} fit: config.seq_len minus "
                     "--max_new_tokens. Shorten the prompt, lower "
                     "--max_new_tokens or raise config.seq_len.")
  ids = np.full((len(token_lists), longest), pad_id, np.int32)
  mask = np.zeros((len(token_lists), longest), bool)
  for i, tokens in enumerate(token_lists):
    ids[i, longest - len(tokens):] = tokens
    mask[i, longest - len(tokens):] = True
  return ids, mask


def load_params(checkpoint: str, cfg, shardings):
  """(params, description) from a HF directory or a trm.main workdir."""
  from flax.linen import meta  # pylint: disable=g-import-not-at-top
  from trm import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.models import dream, hf_import  # pylint: disable=g-import-not-at-top
  saved = os.path.join(checkpoint, "checkpoints")
  if os.path.isdir(saved):
    abstract = state_lib.with_shardings(
        meta.unbox(dream.abstract_params(cfg)), shardings)
    fields, step = ckpt_lib.restore_fields(saved, {"params": abstract},
                                           family="DiffuCoder/Dream")
    return fields["params"], f"{saved} step {step}"
  return hf_import.load_hf_checkpoint(checkpoint, cfg, shardings), checkpoint


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from trm import diffusion_sampling  # pylint: disable=g-import-not-at-top
  from trm import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  from trm.models import dream  # pylint: disable=g-import-not-at-top
  from trm.tasks import diffusion_lm  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  if not _CHECKPOINT.value:
    raise app.UsageError("--checkpoint is required.")
  prompts = read_prompts(_PROMPT.value, _BATCH_FILE.value)
  cfg = dream.DreamConfig.from_config(config.model)
  workdir = os.path.isdir(os.path.join(_CHECKPOINT.value, "checkpoints"))
  tokenizer = tok_lib.from_spec(
      _TOKENIZER.value or (diffusion_lm.tokenizer_spec(config) if workdir
                           else _CHECKPOINT.value), cfg)
  texts = [tok_lib.chat_prompt(p) if _CHAT.value else p for p in prompts]
  ids, mask = left_pad([tokenizer.encode(t) for t in texts],
                       tokenizer.eos_id, config.seq_len - _MAX_NEW.value)

  mesh = mesh_lib.make_mesh(config.mesh)
  rules = mesh_lib.logical_rules(config)
  model = dream.Dream(cfg)
  with nn.logical_axis_rules(rules):
    shardings = mesh_lib.tree_shardings(mesh, rules,
                                        dream.abstract_params(cfg))
  params, source = load_params(_CHECKPOINT.value, cfg, shardings)
  print(f"weights: {source}")

  def logits_fn(params, tokens, attention_mask, positions):
    return model.apply({"params": params}, tokens, attention_mask, positions)

  def generate(seed):
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      return jax.block_until_ready(diffusion_sampling.diffusion_generate(
          logits_fn, ids, mask, params=params,
          mask_token_id=cfg.mask_token_id, max_new_tokens=_MAX_NEW.value,
          steps=_STEPS.value, alg=_ALG.value, alg_temp=_ALG_TEMP.value,
          temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
          top_k=_TOP_K.value, rng=jax.random.key(seed)))

  start = time.time()
  sequences = generate(_SEED.value)  # includes compilation
  first = time.time() - start
  start = time.time()
  sequences = generate(_SEED.value)
  seconds = time.time() - start
  completions = diffusion_sampling.split_completion(
      jax.device_get(sequences)[:, ids.shape[1]:], tokenizer.stop_ids())
  for prompt, completion in zip(prompts, completions):
    print(f"=== {prompt}\n{tokenizer.decode(completion)}")
  new_tokens = len(prompts) * _MAX_NEW.value
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"batch {len(prompts)}, {_MAX_NEW.value} new tokens, {_STEPS.value} "
        f"steps: {new_tokens / seconds:.1f} tokens/s ({seconds:.2f} s; first "
        f"call with compilation {first:.1f} s)")


def define_flags():
  """Defines the command-line flags; only when run as a program, so that
  tests can import several entry points into one process."""
  global _CONFIG, _CHECKPOINT, _TOKENIZER, _PROMPT, _BATCH_FILE, _CHAT, _MAX_NEW, \
      _STEPS, _ALG, _ALG_TEMP, _TEMPERATURE, _TOP_P, _TOP_K, _SEED
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Model config.",
                                            lock_config=True)
  _CHECKPOINT = flags.DEFINE_string(
      "checkpoint", None, "Hugging Face checkpoint directory, or a trm.main "
      "workdir (its newest checkpoint).")
  _TOKENIZER = flags.DEFINE_string(
      "tokenizer", None, "Directory with tokenizer.json, or 'bytes'; default:"
      " the checkpoint directory (HF), or config.data.tokenizer (workdir).")
  _PROMPT = flags.DEFINE_string("prompt", None, "One prompt.")
  _BATCH_FILE = flags.DEFINE_string("batch_file", None,
                                    "A file with one prompt per line.")
  _CHAT = flags.DEFINE_bool("chat", False, "Wrap prompts in the Instruct "
                            "ChatML template.")
  _MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Tokens to generate.")
  _STEPS = flags.DEFINE_integer("steps", 256, "Denoising steps.")
  _ALG = flags.DEFINE_enum("alg", "entropy", ["origin", "maskgit_plus",
                                              "topk_margin", "entropy"],
                           "Which masked positions to reveal first.")
  _ALG_TEMP = flags.DEFINE_float("alg_temp", 0.0, "Randomness of the reveal "
                                 "order (0: most confident first).")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Token sampling "
                                    "temperature (0: greedy).")
  _TOP_P = flags.DEFINE_float("top_p", None, "Nucleus sampling mass.")
  _TOP_K = flags.DEFINE_integer("top_k", None, "Top-k sampling.")
  _SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config"])
  app.run(main, flags_parser=config_lib.parse_flags)
