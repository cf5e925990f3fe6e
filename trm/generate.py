r"""Sample from DiffuCoder / Dream with masked diffusion, sharded on the mesh.

  python -m trm.generate --checkpoint=DiffuCoder-7B-Instruct \
      --prompt="Write a quick sort." --chat [--system="You are a coder."]
  python -m trm.generate --checkpoint=DIR --batch_file=prompts.txt \
      --max_new_tokens=256 --steps=256 --alg=entropy --temperature=0.3 \
      --top_p=0.95 [--config=configs/diffucoder_7b.py]

A thin layer over `trm.families.dream.inference.DiffusionLM`. --checkpoint is a Hugging
Face download (its config.json gives the model; no --config needed), a
`trm.main` fine-tuning workdir, or a Hub id such as
apple/DiffuCoder-7B-Instruct (downloaded once into the Hugging Face cache). --config, when given, supplies the mesh and
logical-axis rules. The sampling program is compiled ahead of time, and the
compile and generation times are printed apart; generation runs once.
Completions are cut at <|endoftext|>, <|dlm_pad|> or <|im_end|>, as the
reference callers do. `--top_k` defaults to 50, what Hugging Face's
`diffusion_generate` runs with; `--top_k=0` turns it off. `--cache=dual`
(or `prefix`) switches to Fast-dLLM-style cached block decoding, with
`--block_length` and, for parallel decoding, `--threshold` (approximate;
see `trm/families/dream/cached_sampling.py`); `--fast_dllm` takes
Fast-dLLM's own block rules, so that its outputs are reproduced.
`--num_return_sequences=N` (Hugging Face's name) samples N completions of
each prompt, printed under it in turn; each counts as one row of
`--batch_size`.
"""
from __future__ import annotations

import os

from absl import app, flags
from ml_collections import config_flags

from trm.core import cli
from trm.core import distributed
from trm.data import io as data_io
from trm.families.dream.inference import left_pad, load_params  # noqa: F401 (re-exported)


def read_prompts(prompt: str | None, batch_file: str | None) -> list[str]:
  if prompt == "" and not batch_file:  # e.g. --prompt="$EMPTY_VARIABLE"
    raise app.UsageError("--prompt is empty; give the text to continue.")
  if bool(prompt) == bool(batch_file):
    raise app.UsageError("Give exactly one of --prompt and --batch_file.")
  if prompt:
    # Before any weight is read: a non-UTF-8 byte in argv is a surrogate.
    from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
    inference.check_text(prompt, "--prompt")
    return [prompt]
  if not os.path.exists(batch_file):  # a directory: read_utf8 names it
    raise app.UsageError(f"--batch_file={batch_file}: no such file (one "
                         "prompt per line).")
  text = data_io.read_utf8(batch_file, fix="--batch_file holds one prompt "
                           "per line")
  prompts = [line for line in data_io.split_lines(text) if line.strip()]
  if not prompts:
    raise app.UsageError(f"--batch_file={batch_file} holds no prompts.")
  return prompts


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not _CHECKPOINT.value:
    raise app.UsageError("--checkpoint is required.")
  prompts = read_prompts(_PROMPT.value, _BATCH_FILE.value)
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  # Before any weight is read.
  inference.check_system(_SYSTEM.value, _SAMPLER["chat"].value, "--system")
  settings = sampler_settings(_SAMPLER)
  check_batch_and_seed(_SAMPLER, len(prompts))
  step = cli.workdir_step(_CHECKPOINT.value, _STEP.value)
  import jax  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(jax)
  # Minutes before a 7B model's weights are read: a row holds at least one
  # prompt token and the new ones.
  inference.check_rows_fit(
      len(prompts), _SAMPLER["num_return_sequences"].value,
      _SAMPLER["batch_size"].value, settings["max_new_tokens"] + 1, "--")
  lm = load_model(_CHECKPOINT.value, _SAMPLER, _CONFIG.value, step)
  first = jax.process_index() == 0  # on a pod every process generates
  if first:
    print(f"weights: {lm.source}")
  sampler = {k: _SAMPLER[k].value for k in ("chat", "batch_size", "seed",
                                             "num_return_sequences")}
  completions = lm.generate(prompts, **settings, **sampler,
                            system=_SYSTEM.value)
  if not first:
    return
  copies = sampler["num_return_sequences"]
  for n, completion in enumerate(completions):  # each prompt's together
    which = f" [{n % copies + 1}/{copies}]" if copies > 1 else ""
    print(f"=== {prompts[n // copies]}{which}\n{completion}")
  t = lm.timings
  print(f"device: {jax.device_count()} x {jax.devices()[0].device_kind}; "
        f"batch {len(completions)}, {settings['max_new_tokens']} new tokens, "
        f"{describe(settings)}: "
        f"{t['new_tokens'] / t['run_seconds']:.1f} tokens/s (generation "
        f"{t['run_seconds']:.2f} s; compile {t['compile_seconds']:.1f} s)")


def sampler_settings(holders: dict) -> dict:
  """`DiffusionLM.generate` arguments from the sampler flags, checked the
  way the API checks them, before any weight is read."""
  from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  value = {name: holder.value for name, holder in holders.items()}
  settings = {name: value[name] for name in (
      "max_new_tokens", "alg", "alg_temp", "temperature", "top_p", "top_k")}
  # Unset means one token per step; an explicit 0 is refused as the API
  # refuses it (`or` would have turned it into the default).
  settings["steps"] = (value["max_new_tokens"] if value["steps"] is None
                       else value["steps"])
  inference.check_settings(**settings, eps=1e-3,
                           steps_unset=value["steps"] is None)
  fast_dllm = bool(value.get("fast_dllm", False))
  cached_sampling.check_needs_cache(bool(value["cache"]), value["threshold"],
                                    fast_dllm, cli=True)
  if value["cache"]:
    cached = {name: value[name] for name in ("cache", "block_length",
                                             "threshold")}
    # Only when set: settings recorded before the flag existed (a samples
    # file's, for --resume) stay equal to today's default.
    if fast_dllm:
      cached["fast_dllm"] = True
    cached_sampling.check_cached_settings(
        **cached, max_new_tokens=settings["max_new_tokens"],
        steps=settings["steps"], alg=settings["alg"])
    settings.update(cached)
  return settings


def check_batch_and_seed(holders: dict, num_prompts: int) -> None:
  """--batch_size, --seed and (trm.generate's) --num_return_sequences
  checked as `DiffusionLM.generate` checks them (for `num_prompts`
  prompts), before any weight is read: a 7B checkpoint takes minutes to
  load."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  copies = holders.get("num_return_sequences")
  copies = (1 if copies is None
            else inference.check_num_return_sequences(copies.value))
  inference.check_batch_and_seed(holders["batch_size"].value,
                                 holders["seed"].value, num_prompts * copies)


def describe(settings: dict) -> str:
  """'N steps', or the cached decoding rule."""
  if not settings.get("cache"):
    return f"{settings['steps']} steps"
  rule = (f"threshold {settings['threshold']:g}"
          if settings["threshold"] is not None
          else f"{settings['steps']} steps")
  return (f"{settings['cache']} cache, blocks of {settings['block_length']},"
          f" {rule}" + (", Fast-dLLM's rules" if settings.get("fast_dllm")
                        else ""))


def load_model(checkpoint: str, holders: dict, config=None,
               step: int | None = None, before_weights=None,
               before_hub_weights=None):
  """The DiffusionLM the flags name (--dtype, --tokenizer,
  --allow_nonfinite), of a workdir's checkpoint `step` (`choose_step`;
  default the newest readable one); `before_weights` and
  `before_hub_weights` as `DiffusionLM.from_pretrained` takes them."""
  from trm.families.dream import inference  # pylint: disable=g-import-not-at-top
  allow = holders.get("allow_nonfinite")
  return inference.DiffusionLM.from_pretrained(
      checkpoint, dtype=holders["dtype"].value,
      tokenizer=holders["tokenizer"].value, config=config,
      allow_nonfinite=bool(allow.value) if allow is not None else False,
      checkpoint_step=step, names=inference.CLI_NAMES,
      before_weights=before_weights, before_hub_weights=before_hub_weights)


def define_sampler_flags(*, temperature: float = 0.0,
                         top_p: float | None = None) -> dict:
  """The sampling flags trm.generate and trm.evaluate share, by name:
  max_new_tokens, steps, alg, alg_temp, temperature, top_p, top_k, seed,
  batch_size, dtype, allow_nonfinite, tokenizer, chat, cache, block_length,
  threshold, fast_dllm (holders: read `.value`)."""
  return dict(
      tokenizer=flags.DEFINE_string(
          "tokenizer", None, "Directory with tokenizer.json, or 'bytes'; "
          "default: the checkpoint directory (HF), or the run's "
          "data.tokenizer."),
      chat=flags.DEFINE_bool("chat", False, "Wrap prompts, stripped of "
                             "surrounding whitespace, in the Instruct "
                             "ChatML template (as DiffuCoder's README)."),
      max_new_tokens=flags.DEFINE_integer("max_new_tokens", 256,
                                          "Tokens to generate."),
      steps=flags.DEFINE_integer("steps", None, "Denoising steps (default: "
                                 "max_new_tokens, one token per step)."),
      alg=flags.DEFINE_enum("alg", "entropy", ["origin", "maskgit_plus",
                                               "topk_margin", "entropy"],
                            "Which masked positions to reveal first."),
      alg_temp=flags.DEFINE_float("alg_temp", None, "Randomness of the "
                                  "reveal order (unset or 0: most confident "
                                  "first)."),
      temperature=flags.DEFINE_float("temperature", temperature, "Token "
                                     "sampling temperature (0: greedy)."),
      top_p=flags.DEFINE_float("top_p", top_p, "Nucleus sampling mass."),
      top_k=flags.DEFINE_integer("top_k", 50, "Top-k sampling (Hugging "
                                 "Face's effective default; 0: off)."),
      seed=flags.DEFINE_integer("seed", 0, "Sampling seed."),
      batch_size=flags.DEFINE_integer(
          "batch_size", None, "Prompts per compiled batch (default: all)."),
      dtype=flags.DEFINE_enum(
          "dtype", "bfloat16", ["bfloat16", "float32", "float16"],
          "Compute dtype (float16 as transformers' torch_dtype; bfloat16 "
          "is what DiffuCoder was trained in)."),
      allow_nonfinite=flags.DEFINE_bool(
          "allow_nonfinite", False, "Load Hugging Face weights even when a "
          "tensor holds NaN or Inf (refused by default, naming it)."),
      cache=flags.DEFINE_enum(
          "cache", None, ["prefix", "dual"], "Cached block decoding "
          "(Fast-dLLM; approximate, faster); unset: the exact sampler."),
      block_length=flags.DEFINE_integer(
          "block_length", 32, "With --cache: tokens per block (divides "
          "--max_new_tokens)."),
      threshold=flags.DEFINE_float(
          "threshold", None, "With --cache: reveal every token at least "
          "this probable (and one per step at least); unset: fixed steps "
          "per block."),
      fast_dllm=flags.DEFINE_bool(
          "fast_dllm", False, "With --cache: Fast-dLLM's own block rules "
          "(the refresh commits each block's first token, windows start "
          "at the block), reproducing its generate token for token."))


def define_flags():
  """Defines the command-line flags; only when run as a program, so that
  tests can import several entry points into one process."""
  global _CONFIG, _CHECKPOINT, _PROMPT, _BATCH_FILE, _SYSTEM, _SAMPLER, _STEP
  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Optional: a config whose mesh and logical-axis rules "
      "to use (model sizes come from the checkpoint).", lock_config=True)
  _CHECKPOINT = flags.DEFINE_string(
      "checkpoint", None, "Hugging Face checkpoint directory, a trm.main "
      "workdir (its checkpoint --step), or a Hub id ('org/name').")
  _STEP = cli.define_step_flag()
  _PROMPT = flags.DEFINE_string("prompt", None, "One prompt.")
  _BATCH_FILE = flags.DEFINE_string(
      "batch_file", None, "A UTF-8 file with one prompt per line (LF or "
      "CRLF line ends).")
  _SYSTEM = flags.DEFINE_string(
      "system", None, "With --chat: the system message, in place of the "
      "template's 'You are a helpful assistant.'.")
  _SAMPLER = define_sampler_flags()
  # trm.generate's own: trm.evaluate --benchmark has --num_samples.
  _SAMPLER["num_return_sequences"] = flags.DEFINE_integer(
      "num_return_sequences", 1, "Completions per prompt (Hugging Face's "
      "name), each its own draw, printed in turn under their prompt.")


# A stop signal exits 143 (SIGTERM) with this line: a script's
# `trm.generate ... > out.txt && next` must not go on with part of it.
STOPPED_LINE = ("{tool}: stopped by {name} before every completion was "
                "printed; it writes nothing else: run it again.")


if __name__ == "__main__":
  define_flags()
  cli.run(main, stopped_line=STOPPED_LINE)
