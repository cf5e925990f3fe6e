r"""Sample from DiffuCoder / Dream with masked diffusion, sharded on the mesh.

  python -m trm.generate --checkpoint=DiffuCoder-7B-Instruct \
      --prompt="Write a quick sort." --chat
  python -m trm.generate --checkpoint=DIR --batch_file=prompts.txt \
      --max_new_tokens=256 --steps=256 --alg=entropy --temperature=0.3 \
      --top_p=0.95 [--config=configs/diffucoder_7b.py]

A thin layer over `trm.inference.DiffusionLM`. --checkpoint is a Hugging
Face download (its config.json gives the model; no --config needed) or a
`trm.main` fine-tuning workdir. --config, when given, supplies the mesh and
logical-axis rules. The sampling program is compiled ahead of time, and the
compile and generation times are printed apart; generation runs once.
Completions are cut at <|endoftext|>, <|dlm_pad|> or <|im_end|>, as the
reference callers do. `--top_k` defaults to 50, what Hugging Face's
`diffusion_generate` runs with; `--top_k=0` turns it off. `--cache=dual`
(or `prefix`) switches to Fast-dLLM-style cached block decoding, with
`--block_length` and, for parallel decoding, `--threshold` (approximate;
see `trm/cached_sampling.py`).
"""
from __future__ import annotations

import os

from absl import app, flags
from ml_collections import config_flags

from trm import cli
from trm.data import io as data_io
from trm.inference import left_pad, load_params  # noqa: F401 (re-exported)


def read_prompts(prompt: str | None, batch_file: str | None) -> list[str]:
  if bool(prompt) == bool(batch_file):
    raise app.UsageError("Give exactly one of --prompt and --batch_file.")
  if prompt:
    return [prompt]
  if not os.path.isfile(batch_file):
    raise app.UsageError(f"--batch_file={batch_file}: no such file (one "
                         "prompt per line).")
  text = data_io.read_utf8(batch_file, fix="--batch_file holds one prompt "
                           "per line")
  prompts = [line for line in text.split("\n") if line.strip()]
  if not prompts:
    raise app.UsageError(f"--batch_file={batch_file} holds no prompts.")
  return prompts


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from trm import inference  # pylint: disable=g-import-not-at-top
  if not _CHECKPOINT.value:
    raise app.UsageError("--checkpoint is required.")
  prompts = read_prompts(_PROMPT.value, _BATCH_FILE.value)
  steps = _STEPS.value or _MAX_NEW.value
  # Before any weight is read: the same checks the API makes.
  inference.check_settings(
      max_new_tokens=_MAX_NEW.value, steps=steps,
      temperature=_TEMPERATURE.value, top_p=_TOP_P.value, top_k=_TOP_K.value,
      alg=_ALG.value, alg_temp=_ALG_TEMP.value, eps=1e-3)
  if _CACHE.value:
    from trm import cached_sampling  # pylint: disable=g-import-not-at-top
    cached_sampling.check_cached_settings(
        cache=_CACHE.value, block_length=_BLOCK_LENGTH.value,
        threshold=_THRESHOLD.value, max_new_tokens=_MAX_NEW.value,
        steps=steps, alg=_ALG.value)
  lm = inference.DiffusionLM.from_pretrained(
      _CHECKPOINT.value, dtype=_DTYPE.value, tokenizer=_TOKENIZER.value,
      config=_CONFIG.value)
  print(f"weights: {lm.source}")
  completions = lm.generate(
      prompts, max_new_tokens=_MAX_NEW.value, steps=steps, alg=_ALG.value,
      alg_temp=_ALG_TEMP.value, temperature=_TEMPERATURE.value,
      top_p=_TOP_P.value, top_k=_TOP_K.value, chat=_CHAT.value,
      batch_size=_BATCH_SIZE.value, seed=_SEED.value, cache=_CACHE.value,
      block_length=_BLOCK_LENGTH.value, threshold=_THRESHOLD.value)
  for prompt, completion in zip(prompts, completions):
    print(f"=== {prompt}\n{completion}")
  import jax  # pylint: disable=g-import-not-at-top
  t = lm.timings
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"batch {len(prompts)}, {_MAX_NEW.value} new tokens, {_how(steps)}: "
        f"{t['new_tokens'] / t['run_seconds']:.1f} tokens/s (generation "
        f"{t['run_seconds']:.2f} s; compile {t['compile_seconds']:.1f} s)")


def _how(steps: int) -> str:
  if not _CACHE.value:
    return f"{steps} steps"
  rule = (f"threshold {_THRESHOLD.value:g}" if _THRESHOLD.value is not None
          else f"{steps} steps")
  return f"{_CACHE.value} cache, blocks of {_BLOCK_LENGTH.value}, {rule}"


def define_flags():
  """Defines the command-line flags; only when run as a program, so that
  tests can import several entry points into one process."""
  global _CONFIG, _CHECKPOINT, _TOKENIZER, _PROMPT, _BATCH_FILE, _CHAT, \
      _MAX_NEW, _STEPS, _ALG, _ALG_TEMP, _TEMPERATURE, _TOP_P, _TOP_K, \
      _SEED, _BATCH_SIZE, _DTYPE, _CACHE, _BLOCK_LENGTH, _THRESHOLD
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Optional: a config whose mesh and logical-axis rules "
      "to use (model sizes come from the checkpoint).", lock_config=True)
  _CHECKPOINT = flags.DEFINE_string(
      "checkpoint", None, "Hugging Face checkpoint directory, or a trm.main "
      "workdir (its newest checkpoint).")
  _TOKENIZER = flags.DEFINE_string(
      "tokenizer", None, "Directory with tokenizer.json, or 'bytes'; default:"
      " the checkpoint directory (HF), or the run's data.tokenizer.")
  _PROMPT = flags.DEFINE_string("prompt", None, "One prompt.")
  _BATCH_FILE = flags.DEFINE_string("batch_file", None,
                                    "A UTF-8 file with one prompt per line.")
  _CHAT = flags.DEFINE_bool("chat", False, "Wrap prompts in the Instruct "
                            "ChatML template.")
  _MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Tokens to generate.")
  _STEPS = flags.DEFINE_integer("steps", None, "Denoising steps (default: "
                                "max_new_tokens, one token per step).")
  _ALG = flags.DEFINE_enum("alg", "entropy", ["origin", "maskgit_plus",
                                              "topk_margin", "entropy"],
                           "Which masked positions to reveal first.")
  _ALG_TEMP = flags.DEFINE_float("alg_temp", None, "Randomness of the reveal "
                                 "order (unset or 0: most confident first).")
  _TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Token sampling "
                                    "temperature (0: greedy).")
  _TOP_P = flags.DEFINE_float("top_p", None, "Nucleus sampling mass.")
  _TOP_K = flags.DEFINE_integer("top_k", 50, "Top-k sampling (Hugging "
                                "Face's effective default; 0: off).")
  _SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
  _BATCH_SIZE = flags.DEFINE_integer(
      "batch_size", None, "Prompts per compiled batch (default: all).")
  _CACHE = flags.DEFINE_enum(
      "cache", None, ["prefix", "dual"], "Cached block decoding (Fast-dLLM; "
      "approximate, faster); unset: the exact reference sampler.")
  _BLOCK_LENGTH = flags.DEFINE_integer(
      "block_length", 32, "With --cache: tokens per block (divides "
      "--max_new_tokens).")
  _THRESHOLD = flags.DEFINE_float(
      "threshold", None, "With --cache: reveal every token at least this "
      "probable (and one per step at least); unset: fixed steps per block.")
  _DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"],
                             "Compute dtype.")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
