"""DiffuCoder / Dream sampling as a Python API (notebooks, scripts, the CLI).

  from trm import DiffusionLM
  lm = DiffusionLM.from_pretrained("DiffuCoder-7B-Instruct")
  lm.generate(["Write a quick sort."], chat=True, max_new_tokens=256,
              temperature=0.3, top_p=0.95)

`from_pretrained` takes a Hugging Face directory (its config.json gives
the sizes, vocabulary, RoPE theta and special ids; no config file needed) or
a `trm.main` fine-tuning workdir (its recorded config.json). Weights are read
shard by shard onto the mesh (default: FSDP over every device). `generate`
takes strings, tokenizes (optionally in the Instruct chat template),
left-pads, splits into fixed-size batches so one compiled program serves
them all, samples, and cuts each completion at the stop tokens. Compiled
programs are kept per setting on the object; `compile` builds one ahead of
time and reports its compile time. `loglikelihood` scores lm-eval's
(context, continuation) requests as Dream's lm-eval harness does
(`trm.families.dream.likelihood`).

Defaults follow what Hugging Face's `diffusion_generate` runs with
(`top_k=50`, `eps=1e-3`), except `alg="entropy"` and `steps =
max_new_tokens`, DiffuCoder's recommendation, and greedy decoding. Called
without a generation config the reference builds one from the model's
config, whose legacy generation fields (transformers 4.x) give it
`top_k=50`, `top_p=1.0` (off) and `temperature=1.0`: a call that passes
no temperature samples there (its own class default, 0.0, applies only to
a `DreamGenerationConfig()` passed in), with `alg="origin"`, `steps=512`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
from typing import Optional, Sequence

import numpy as np

from trm.core import array_sizes
from trm.core import cli
from trm.core import config_lib
from trm.families.dream import sampling as diffusion_sampling

DEFAULT_TOP_K = diffusion_sampling.DEFAULT_TOP_K
# jax.random.key keeps 32 bits of a seed (without x64): 2**32 would give
# the key of 0.
SEED_LIMIT = 2**32
# Prompts are left-padded to a multiple of this many tokens by default, so
# that a notebook feeding prompts of new lengths reuses compiled programs
# (the padding is masked: outputs are those of the unpadded batch, up to
# floating-point rounding; see `generate`).
PROMPT_BUCKET = 64
# A Hub repository's tokenizer: tokenizer.json, or (DiffuCoder's and Dream's
# own repositories have none) the slow tokenizer's files.
TOKENIZER_HUB_FILES = ("tokenizer.json", "vocab.json", "merges.txt",
                       "added_tokens.json", "tokenizer_config.json")
# The files of a Hub repository that `from_pretrained("org/name")` reads.
HUB_FILES = ("config.json", "*.safetensors",
             "model.safetensors.index.json") + TOKENIZER_HUB_FILES
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# What a Hub id's checks read before its weights download: the config, the
# shards' index and the tokenizer (kilobytes, against gigabytes).
HUB_CHECK_FILES = tuple(f for f in HUB_FILES if f != "*.safetensors")
# A Hugging Face cache snapshot's directory name: the commit it holds.
COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclasses.dataclass(frozen=True)
class ArgumentNames:
  """How errors of `from_pretrained` name its inputs: the Python API's
  argument names (`API_NAMES`), or a command line's flags (`CLI_NAMES`)."""
  path: str = "path"
  tokenizer: str = "tokenizer"
  config: str = "config"
  allow_nonfinite: str = "allow_nonfinite=True"
  checkpoint_step: str = "checkpoint_step"


API_NAMES = ArgumentNames()
CLI_NAMES = ArgumentNames(path="--checkpoint", tokenizer="--tokenizer",
                          config="--config",
                          allow_nonfinite="--allow_nonfinite",
                          checkpoint_step="--step")


class ArgumentTypeError(cli.UserError, TypeError):
  """An argument of the Python API of the wrong type (a TypeError; the
  command line shows it as one line)."""


def _is_int(value) -> bool:
  """An integer, and not a bool (True is not a batch size or a seed)."""
  return (isinstance(value, (int, np.integer))
          and not isinstance(value, (bool, np.bool_)))


def check_text(text: str, name: str) -> None:
  """ValueError naming `name` when `text` cannot be UTF-8: a lone surrogate,
  which is what Python makes of a non-UTF-8 byte in a command-line argument
  or of a "\\ud800" escape in JSON (the tokenizer raises a TypeError)."""
  try:
    text.encode("utf-8")
  except UnicodeEncodeError as e:
    code = ord(text[e.start])
    what = (f"byte 0x{code - 0xdc00:02x}" if 0xdc80 <= code <= 0xdcff
            else f"lone surrogate U+{code:04X}")
    raise ValueError(f"{name} is not UTF-8 text ({what} at character "
                     f"{e.start}); pass UTF-8 text.") from None


def check_switches(**switches) -> None:
  """One ValueError naming the first of the on/off arguments `switches`
  that is not a bool: a string such as chat="no" is truthy and applied the
  chat template without a word."""
  for name, value in switches.items():
    if not isinstance(value, (bool, np.bool_)):
      raise ValueError(f"{name}={value!r:.80}: must be True or False.")


def check_system(system, chat, name: str = "system") -> None:
  """`system` (the flag or argument `name`) is a UTF-8 string given with
  chat: the system message is part of the chat template, and a raw prompt
  has none (it would be dropped without a word)."""
  if system is None:
    return
  if not isinstance(system, str):
    raise ArgumentTypeError(f"{name} is a {type(system).__name__}: pass a "
                            "string.")
  check_text(system, name)
  if not chat:
    raise ValueError(f"{name}: a system message belongs to the chat "
                     "template; pass "
                     f"{'--chat' if name.startswith('--') else 'chat=True'}"
                     " with it.")


def check_prompts(prompts) -> list[str]:
  """`prompts` (a string, or a list / tuple / other iterable of strings) as
  a list; ArgumentTypeError naming `prompts` (and the index) otherwise,
  ValueError when there is none or one is not UTF-8 text."""
  if isinstance(prompts, str):
    check_text(prompts, "prompts")
    return [prompts]
  if isinstance(prompts, (bytes, bytearray)):
    raise ArgumentTypeError("prompts is bytes: pass a string (decode it "
                            "first, e.g. prompts.decode('utf-8')) or a list "
                            "of strings.")
  if isinstance(prompts, dict) or not hasattr(prompts, "__iter__"):
    raise ArgumentTypeError(f"prompts is a {type(prompts).__name__}: pass a "
                            "string or a list of strings.")
  prompts = list(prompts)
  for i, prompt in enumerate(prompts):
    if not isinstance(prompt, str):
      raise ArgumentTypeError(
          f"prompts[{i}] is a {type(prompt).__name__} ({prompt!r:.40}), not "
          "a string: every prompt must be a str.")
    check_text(prompt, f"prompts[{i}]")
  if not prompts:
    raise ValueError("prompts is empty: pass at least one prompt.")
  return prompts


def check_dtype(value, name: str, allowed: Sequence[str]) -> Optional[str]:
  """`value` (a name, or a spelling transformers users write: 'bf16',
  'torch.bfloat16', torch.float16, jnp.bfloat16) as one of `allowed`; None
  for None or 'auto' (the checkpoint's own, as transformers' 'auto').
  Otherwise one ValueError naming the argument `name`; not the checkpoint's
  config.json."""
  from trm.core import mfu  # pylint: disable=g-import-not-at-top
  if value is None or (isinstance(value, str)
                       and value.strip().lower() == "auto"):
    return None
  try:
    canonical = mfu.normalise_dtype(value)
  except (TypeError, ValueError):
    canonical = None
  if canonical not in allowed:
    raise ValueError(f"{name}={value!r}: pass one of {', '.join(allowed)} "
                     "(or 'auto': the checkpoint's own; 'bf16', "
                     "torch.bfloat16 and the like are read too).")
  return canonical


def _check_count(name: str, value, meaning: str) -> None:
  """An integer >= 1 (not a bool), else one ArgumentTypeError / ValueError
  naming the argument; `meaning` says what it counts."""
  if not _is_int(value):
    raise ArgumentTypeError(f"{name}={value!r} is a {type(value).__name__}: "
                            f"pass an integer >= 1 ({meaning}).")
  if value < 1:
    raise ValueError(f"{name}={value!r}: must be >= 1 ({meaning}).")


def check_num_return_sequences(value) -> int:
  """Completions per prompt (Hugging Face's `num_return_sequences`),
  checked (`_check_count`)."""
  _check_count("num_return_sequences", value, "completions per prompt")
  return int(value)


def check_batch_and_seed(batch_size, seed, num_prompts: int) -> None:
  """batch_size: None or an integer >= 1; seed: an integer in
  [0, 2**32 - number of batches] (batch n samples with seed + n), for
  `num_prompts` sequences (prompts times `num_return_sequences`). One
  ArgumentTypeError / ValueError naming the argument."""
  if batch_size is not None:
    _check_count("batch_size", batch_size, "or None: all prompts in one batch")
  if not _is_int(seed):
    raise ArgumentTypeError(f"seed={seed!r} is a {type(seed).__name__}: pass "
                            "an integer.")
  size = batch_size or num_prompts
  batches = -(-num_prompts // size)
  if batches > SEED_LIMIT:  # no seed fits: the count, not the seed, is wrong
    raise ValueError(
        f"{num_prompts} sequences (prompts x num_return_sequences) in batches"
        f" of batch_size={size} make {batches} batches, more than the "
        f"{SEED_LIMIT} seeds (batch n samples with seed + n): raise "
        "batch_size or lower num_return_sequences.")
  if not 0 <= seed <= SEED_LIMIT - batches:
    raise ValueError(
        f"seed={seed}: must lie in [0, {SEED_LIMIT - batches}] (batch n "
        f"samples with seed + n, and jax keeps 32 bits of a seed, so a "
        "larger or negative one would repeat another seed's samples).")


def check_rows_fit(num_prompts: int, copies: int, batch_size, width: int,
                   prefix: str = "", processes=None) -> None:
  """The token and mask rows (int32 + bool, `width` tokens each) of
  `num_prompts` prompts x `copies` completions, then of those padded to
  whole batches of `batch_size`, fit in this host's memory
  (`array_sizes`); the refusal names num_return_sequences (or the
  prompts) or batch_size, after `prefix` ('--' on a command line). Every
  process of `processes` (default: every process of the job;
  `DiffusionLM.generate` passes those its model spans) refuses when one
  does. trm.generate checks them before any weight is read, with the
  least width a row can have (one prompt token and the new ones)."""
  row_bytes = width * (np.dtype(np.int32).itemsize + 1)
  count = num_prompts * copies
  if copies > 1:
    what = (f"{prefix}num_return_sequences={copies}: {count} rows (prompts "
            f"x completions) of at least {width} tokens")
    fix = f"lower {prefix}num_return_sequences (or pass fewer prompts)"
  else:
    what = f"{count} prompts' rows of at least {width} tokens"
    fix = f"pass fewer prompts or lower {prefix}max_new_tokens"
  refusal = array_sizes.host_refusal(count * row_bytes, what, fix)
  rows = -(-count // batch_size) * batch_size if batch_size else count
  if refusal is None and rows > count:
    refusal = array_sizes.host_refusal(
        rows * row_bytes,
        f"{prefix}batch_size={batch_size}: {count} rows padded to {rows} "
        f"(whole batches) of at least {width} tokens",
        f"lower {prefix}batch_size ({count} fills one batch)")
  # One agreement for both: the padded check is not made where the first
  # refuses.
  array_sizes.refuse_together(
      refusal, f"The rows of {count} sequences to generate",
      f"lower {prefix}num_return_sequences or {prefix}batch_size, or pass "
      "fewer prompts", processes)


def _pad_rows(ids: np.ndarray, mask: np.ndarray, rows: int,
              batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """`ids` and `mask` with their last row repeated to `rows` rows (whole
  batches of `batch_size`). A batch_size far past the prompts
  (--batch_size=2**31 for one prompt) was numpy's MemoryError traceback;
  past 2**62 rows numpy's "array is too big" ValueError names no flag."""
  try:
    return (np.concatenate([ids, np.repeat(ids[-1:], rows - len(ids), 0)]),
            np.concatenate([mask, np.repeat(mask[-1:], rows - len(mask), 0)]))
  except (MemoryError, OverflowError, ValueError):  # "array is too big"
    raise ValueError(
        f"batch_size={batch_size}: {batch_size} rows of {ids.shape[1]} "
        "tokens do not fit in this host's memory (the "
        f"{len(ids)} sequence(s) to generate are padded to whole batches); "
        f"lower batch_size ({len(ids)} fills one batch).") from None


@dataclasses.dataclass
class Generation:
  """What `generate(..., return_tokens=True)` (or Hugging Face's spelling,
  `return_dict_in_generate=True`) returns."""
  completions: list[str]
  tokens: np.ndarray                 # [N, P + max_new_tokens]: prompt + canvas
  prompt_len: int                    # P: the longest prompt (left-padded)
  history: Optional[np.ndarray] = None  # [steps, N, P + max_new_tokens]:
                                        # the canvas after each step

  @property
  def sequences(self) -> np.ndarray:
    """`tokens`, under the name of Dream's `DreamModelOutput.sequences`."""
    return self.tokens


MAX_STEPS = diffusion_sampling.MAX_STEPS


def check_settings(*, max_new_tokens: int, steps: int, temperature: float,
                   top_p, top_k, alg: str, alg_temp, eps: float,
                   max_positions: Optional[int] = None,
                   prompt_len: int = 0, steps_unset: bool = False) -> None:
  """One ValueError naming the argument (the CLI flag has the same name);
  `steps_unset`: `steps` is max_new_tokens, as an unset steps means."""
  def bad(name, value, want):
    raise ValueError(f"{name}={value!r}: {want}.")
  if not _is_int(max_new_tokens) or max_new_tokens < 1:
    bad("max_new_tokens", max_new_tokens, "must be an integer >= 1")
  if not _is_int(steps) or steps < 1:
    bad("steps", steps, "must be an integer >= 1")
  # The schedule is a host table of steps + 1 times (float64 while built):
  # 2**63 steps gave an IndexError, 10**9 gigabytes, before any call.
  if steps > MAX_STEPS and steps_unset:  # not the steps the caller gave
    bad("max_new_tokens", max_new_tokens, f"must be at most {MAX_STEPS:,} "
        "while steps is unset (one step, one call of the model, a token); "
        "set steps to fewer for more tokens")
  if steps > MAX_STEPS:
    bad("steps", steps, f"must be at most {MAX_STEPS:,} (each step is one "
        "call of the model)")
  if not (config_lib.is_number(temperature) and math.isfinite(temperature)
          and temperature >= 0):
    bad("temperature", temperature, "must be a finite number >= 0 (0: greedy)")
  # 0 keeps the likeliest token alone, as the reference's filter does.
  if top_p is not None and not (config_lib.is_number(top_p)
                                and 0 <= top_p <= 1):
    bad("top_p", top_p, "must lie in [0, 1] (or be unset)")
  if top_k is not None and not (_is_int(top_k) and top_k >= 0):
    bad("top_k", top_k, "must be an integer >= 0 (0 or None: off)")
  if alg not in diffusion_sampling.ALGS:
    bad("alg", alg, f"must be one of {diffusion_sampling.ALGS}")
  if alg_temp is not None and not (config_lib.is_number(alg_temp)
                                   and math.isfinite(alg_temp)
                                   and alg_temp >= 0):
    bad("alg_temp", alg_temp, "must be a finite number >= 0")
  # The reference's linspace(1, eps) at either end: 1 reveals everything
  # at the last step, 0 is its last time (outside, counts turn negative).
  if not (config_lib.is_number(eps) and 0 <= eps <= 1):
    bad("eps", eps, "must lie in [0, 1]")
  if max_positions is not None and prompt_len + max_new_tokens > max_positions:
    raise ValueError(
        f"max_new_tokens={max_new_tokens}: the longest prompt ({prompt_len} "
        f"tokens) plus the new tokens exceed the model's {max_positions} "
        "positions; lower max_new_tokens or shorten the prompts.")


def sampler_settings(*, max_new_tokens: int = 256,
                     steps: Optional[int] = None, alg: str = "entropy",
                     temperature: float = 0.0, top_p: Optional[float] = None,
                     top_k: Optional[int] = DEFAULT_TOP_K,
                     alg_temp: Optional[float] = None, eps: float = 1e-3,
                     cache: Optional[str] = None, block_length: int = 32,
                     threshold: Optional[float] = None,
                     fast_dllm: bool = False) -> dict:
  """`generate`'s sampler settings (its defaults), checked (one ValueError
  naming the argument) and normalised as a compiled program is keyed:
  steps None is max_new_tokens, top_k 0 is None (off), numbers are Python
  ints and floats, the cache's settings only with `cache`. `compile` takes
  them too, so a program it builds ahead is the one `generate` reuses."""
  from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
  steps_unset = steps is None
  steps = max_new_tokens if steps_unset else steps
  check_settings(max_new_tokens=max_new_tokens, steps=steps,
                 temperature=temperature, top_p=top_p, top_k=top_k, alg=alg,
                 alg_temp=alg_temp, eps=eps, steps_unset=steps_unset)
  cached_sampling.check_needs_cache(cache is not None, threshold, fast_dllm,
                                    cli=False)
  if cache is not None:
    cached_sampling.check_cached_settings(
        cache=cache, block_length=block_length, threshold=threshold,
        max_new_tokens=max_new_tokens, steps=steps, alg=alg,
        fast_dllm=fast_dllm)
  settings = dict(
      max_new_tokens=int(max_new_tokens), steps=int(steps), alg=alg,
      temperature=float(temperature),
      top_p=None if top_p is None else float(top_p),
      top_k=int(top_k) if top_k else None,  # 0 and None: off
      alg_temp=None if alg_temp is None else float(alg_temp),
      eps=float(eps))
  if cache is not None:
    settings.update(cache=cache, block_length=int(block_length),
                    threshold=None if threshold is None
                    else float(threshold), fast_dllm=bool(fast_dllm))
  return settings


def padded_width(longest: int, *, bucket: int = 1, multiple_of: int = 1,
                 new_tokens: int = 0) -> int:
  """The prompt width P for a longest prompt of `longest` tokens: rounded up
  to a multiple of `bucket`, then raised so that P + new_tokens is a
  multiple of `multiple_of` (the splash kernel tiles the sequence by 128)."""
  width = -(-longest // bucket) * bucket
  return width + (-(width + new_tokens)) % multiple_of


def left_pad(token_lists, pad_id: int, max_len: Optional[int] = None,
             multiple_of: int = 1, new_tokens: int = 0, bucket: int = 1):
  """(ids [B, P], mask [B, P]) with every prompt right-aligned; P is
  `padded_width` of the longest prompt."""
  longest = max(len(t) for t in token_lists)
  if max_len is not None and longest > max_len:
    raise ValueError(f"A prompt has {longest} tokens but only "
                     f"{max(max_len, 0)} fit: the model's positions minus "
                     "max_new_tokens. Shorten the prompt, lower "
                     "max_new_tokens or raise config.seq_len.")
  width = padded_width(longest, bucket=bucket, multiple_of=multiple_of,
                       new_tokens=new_tokens)
  ids = np.full((len(token_lists), width), pad_id, np.int32)
  mask = np.zeros((len(token_lists), width), bool)
  for i, tokens in enumerate(token_lists):
    ids[i, width - len(tokens):] = tokens
    mask[i, width - len(tokens):] = True
  return ids, mask



# How each family's workdir is sampled or evaluated (README).
_OTHER_FAMILY_COMMANDS = {
    "gpt": "sample it with `python -m trm.sample --workdir={path}`",
    "trm": ("evaluate it with `python -m trm.evaluate --config=CONFIG "
            "--checkpoint={path} --output_dir=DIR` (TRM models are not "
            "sampled)"),
}


def _workdir_family(workdir: str) -> tuple[str | None, str]:
  """(config.model.name of the run in `workdir`, how it was found): from its
  recorded config.json, else from the tensors of its newest checkpoint;
  (None, '') when neither tells."""
  recorded = os.path.join(workdir, "config.json")
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  try:
    # isfile: a FIFO's open blocked until a writer came (for ever). read_json
    # refuses a file past 64 MiB unread (json.load held twice its size);
    # _workdir_config's reader then says so.
    if os.path.isfile(recorded):
      name = weights_io.read_json(recorded).get("model", {}).get("name")
      if isinstance(name, str) and name:
        return name, f"config.model.name={name!r} in {recorded}"
  except (OSError, ValueError, AttributeError, RecursionError):
    pass  # RecursionError: JSON nested past the stack
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  checkpoints = os.path.join(workdir, "checkpoints")
  step = restore_check.latest_step(checkpoints)
  if step is None:
    return None, ""
  shapes = restore_check.saved_shapes(os.path.join(checkpoints, str(step)))
  display = families.name_of_state(shapes) if shapes else None
  for name in families.names():
    if display and _display_name(name) == display:
      return name, f"the tensors of {checkpoints}/{step}"
  return None, ""


def _display_name(name: str) -> str:
  """The family's display name ('GPT', 'TRM (puzzle)'), or its config name
  when its package cannot be imported."""
  from trm import families  # pylint: disable=g-import-not-at-top
  try:
    return families.display_name(name)
  except Exception:  # pylint: disable=broad-except
    return repr(name)


def check_dream_workdir(workdir: str) -> None:
  """Refuses (CheckpointMismatchError, one line) a `trm.main` workdir of
  another model family, naming the family and the command that samples or
  evaluates it. Only a workdir's config.json and checkpoint metadata are
  read."""
  name, how = _workdir_family(workdir)
  if name is None or name == "dream":
    return
  from trm.core import restore_check  # pylint: disable=g-import-not-at-top
  command = _OTHER_FAMILY_COMMANDS.get(
      name, "use the command of its model family").format(path=workdir)
  raise restore_check.CheckpointMismatchError(
      f"{workdir} holds a {_display_name(name)} train state "
      f"({how}), but trm.generate / DiffusionLM sample DiffuCoder/Dream "
      f"models only: it was written by another model; {command}.")


def _workdir_config(workdir: str, config,
                    names: ArgumentNames = API_NAMES):
  """The model section and seq_len a `trm.main` run recorded."""
  recorded = os.path.join(workdir, "config.json")
  if os.path.lexists(recorded):  # a FIFO or broken link: named as such
    import ml_collections  # pylint: disable=g-import-not-at-top
    from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
    record = hf_config.read_config_object(recorded)
    # Edited by hand, its fields gave a TypeError's traceback (a model
    # that is no object) or int()'s error naming no file (seq_len).
    seq_len = record.get("seq_len")
    if not isinstance(record.get("model"), dict) or (
        seq_len is not None and (isinstance(seq_len, bool)
                                 or not isinstance(seq_len, int)
                                 or seq_len <= 0)):
      raise ValueError(
          f"{recorded}: model={record.get('model')!r:.60}, seq_len="
          f"{seq_len!r:.60}; trm.main records config.model as an object and"
          " seq_len as a positive integer: restore the file as the run "
          "wrote it.")
    return ml_collections.ConfigDict(record)
  if config is None:
    raise FileNotFoundError(f"{recorded} is missing; pass the run's config "
                            f"as {names.config}.")
  return config


# What `resolve_checkpoint` reads from a local disk only (its refusal of a
# gs:// path; trm.export's too).
CHECKPOINTS_READ = ("checkpoints (Hugging Face directories and trm.main "
                    "workdirs) are")


def check_config_family(config, names: ArgumentNames = API_NAMES) -> None:
  """A `config` of another model family (a TRM or GPT config) is refused:
  only its mesh and rules were read, so a wrong --config passed without a
  word."""
  from trm import families  # pylint: disable=g-import-not-at-top
  model = config.get("model") if config is not None else None
  name = model.get("name") if hasattr(model, "get") else None
  # A name registered for this package too (`families.register`) passes.
  if name is not None and families.package(name) != __package__:
    raise ValueError(
        f"{names.config} describes a config.model.name={name!r} model; "
        "DiffuCoder/Dream checkpoints take a 'dream' config (e.g. "
        "configs/diffucoder_7b.py) or none (their own settings).")


def resolve_checkpoint(path: str, names: ArgumentNames = API_NAMES,
                       revision: Optional[str] = None,
                       files: Sequence[str] = HUB_FILES) -> str:
  """The local directory `path` names: itself when it is a directory (a
  Hugging Face cache folder: its snapshot of `revision`, default main), else,
  when it looks like a Hub id ('org/name'), a download of the repository's
  `files` (its config, weights and tokenizer; `trm.core.hub.snapshot`, the
  cache when offline). Anything else is refused in one line naming
  `names.path`."""
  if not isinstance(path, (str, os.PathLike)):
    raise ArgumentTypeError(f"{names.path}={path!r} is a "
                            f"{type(path).__name__}: pass a directory or a "
                            "Hugging Face Hub id ('org/name').")
  path = os.fspath(path)
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  # A gs:// run was "no such directory", which did not say what to do.
  weights_io.check_local(path, names.path, CHECKPOINTS_READ)
  if os.path.isdir(path):
    return _cache_snapshot(path, names, revision) or path
  if os.path.exists(path):
    raise NotADirectoryError(
        f"{names.path}={path}: is a file; pass a Hugging Face checkpoint "
        "directory, a trm.main workdir or a Hub id ('org/name').")
  if not HUB_ID.fullmatch(path):
    raise FileNotFoundError(
        f"{names.path}={path}: no such directory (and not a Hugging Face "
        "Hub id, 'org/name'); pass a Hugging Face checkpoint directory or a "
        "trm.main workdir.")
  from trm.core import hub  # pylint: disable=g-import-not-at-top
  advice = (f"download it where there is network (huggingface-cli download "
            f"{path} --local-dir DIR) and pass {names.path}=DIR")
  try:
    directory = hub.snapshot(
        path, allow_patterns=files, revision=revision,
        offline_hint=f"{names.path}={path} is no local directory either; "
        + advice)
  except hub.HubUnavailable as error:
    raise FileNotFoundError(str(error)) from error
  if "*.safetensors" in files:
    lacking = _lacking_weights(directory)
    if lacking:
      raise FileNotFoundError(
          f"{names.path}={path}: the Hugging Face cache's copy ({directory}) "
          f"lacks {lacking} (a download cut short or of the tokenizer "
          "alone, which without network is all there is; or a repository "
          "without them). Run it again with network, or " + advice + ".")
  return directory


def expected_source(path: str, checkpoint_step: Optional[int] = None
                    ) -> Optional[str]:
  """What `DiffusionLM.source` will be for the local checkpoint `path`,
  before any weight is read (a --resume compares it with the one recorded):
  a Hugging Face directory (a cache folder's snapshot of main), or a
  workdir's checkpoints/ and step (`checkpoint_step`, else the newest
  complete step on disk: the newest readable one, loaded, may be older).
  None when it is known only once read: a Hub id (downloaded first), a
  workdir without a complete step, a cache folder without its snapshot."""
  if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
    return None
  path = os.fspath(path)
  try:
    path = _cache_snapshot(path, API_NAMES, None) or path
  except (OSError, ValueError):
    return None
  saved = os.path.join(path, "checkpoints")
  if not os.path.isdir(saved):
    return path
  if checkpoint_step is None:
    checkpoint_step = newest_complete_step(path)
    if checkpoint_step is None:
      return None
  return f"{saved} step {checkpoint_step}"


def _hub_snapshot(source) -> Optional[tuple[str, str]]:
  """(repository folder, commit) when `source` is a Hugging Face cache
  snapshot path (.../models--org--name/snapshots/<commit>); None else."""
  if not isinstance(source, str):
    return None
  parts = os.path.normpath(source).split(os.sep)
  if (len(parts) < 3 or parts[-2] != "snapshots"
      or not parts[-3].startswith("models--")
      or not COMMIT.fullmatch(parts[-1])):
    return None
  return parts[-3], parts[-1]


def same_source(recorded, source, recorded_fingerprint=None,
                fingerprint=None) -> bool:
  """Whether a weights source recorded by an earlier run (`recorded`) names
  the weights `source` does: the same string, one Hub repository's
  snapshot of one commit in two caches (another HF_HOME, a moved cache),
  whose files the commit fixes, or two paths whose files have one
  `source_fingerprint` (a moved or copied local checkpoint). Without both
  fingerprints (a record from before them) a moved local directory is
  another source: nothing but its path says what it holds."""
  if recorded == source:
    return True
  snapshot = _hub_snapshot(source)
  if snapshot is not None and _hub_snapshot(recorded) == snapshot:
    return True
  return (isinstance(fingerprint, str)
          and recorded_fingerprint == fingerprint)


# `source_fingerprint`'s format, in its digest: a fingerprint of another
# format is another checkpoint's (refused, as before fingerprints).
_FINGERPRINT_FORMAT = "files-v1"
# Files up to this size are read whole (configs, indexes, tokenizers);
# larger ones in blocks of `_BLOCK` bytes.
_WHOLE = 1 << 20
_BLOCK = 4096
# Blocks of a large file that is not safetensors (an Orbax step's data),
# evenly spaced.
_SPREAD = 256
_STEP_SOURCE = re.compile(r"(.*) step ([0-9]+)")
# safetensors' own bound on a header (its MAX_HEADER_SIZE): a file that
# claims more is no safetensors, and its claim is not read into memory.
_MAX_HEADER = 100_000_000


def _read_at(f, offset: int, size: int) -> bytes:
  f.seek(offset)
  return f.read(size)


def _source_files(source: str) -> Optional[tuple[str, list[str]]]:
  """(directory, its files that hold the weights `source` names, relative
  to it): a Hugging Face directory's `HUB_FILES`, a workdir step's
  (`<workdir>/checkpoints step N`) every file; None for another source."""
  import fnmatch  # pylint: disable=g-import-not-at-top
  if os.path.isdir(source):
    # os.path.isfile follows a cache snapshot's links to its blobs.
    return source, sorted(
        name for name in os.listdir(source)
        if os.path.isfile(os.path.join(source, name))
        and any(fnmatch.fnmatch(name, p) for p in HUB_FILES))
  step = _STEP_SOURCE.fullmatch(source)
  if not step:
    return None
  directory = os.path.join(step.group(1), step.group(2))
  if not os.path.isdir(directory):
    return None
  files = []
  for root, _, names in os.walk(directory):
    # Regular files alone: opening a FIFO put there would wait forever.
    files += [os.path.relpath(os.path.join(root, n), directory)
              for n in names if os.path.isfile(os.path.join(root, n))]
  return directory, sorted(files)


def _file_digest(path: str, digest) -> None:
  """Adds to `digest` what `source_fingerprint` reads of the file `path`."""
  size = os.path.getsize(path)
  digest.update(f"{size}\0".encode())
  with open(path, "rb") as f:
    if size <= _WHOLE:
      digest.update(_read_at(f, 0, size))
      return
    spans = None
    if path.endswith(".safetensors"):
      header = _read_at(f, 0, 8)
      length = int.from_bytes(header, "little")
      if length < min(size - 8, _MAX_HEADER):
        header += _read_at(f, 8, length)
        digest.update(header)
        try:
          tensors = json.loads(header[8:])
          spans = [(len(header) + v["data_offsets"][0],
                    v["data_offsets"][1] - v["data_offsets"][0])
                   for k, v in sorted(tensors.items())
                   if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
          spans = None  # not safetensors after all: read as any file
        # Spans outside the file (or of negative length, which `read`
        # takes as "to the end") are no safetensors either.
        if spans and not all(
            isinstance(start, int) and isinstance(length, int)
            and len(header) <= start and 0 <= length <= size - start
            for start, length in spans):
          spans = None
    if spans is None:
      stride = max(_BLOCK, (size - _BLOCK) // (_SPREAD - 1))
      spans = [(start, _BLOCK) for start in range(0, size, stride)]
    for start, length in spans:
      if length <= 3 * _BLOCK:
        digest.update(_read_at(f, start, length))
      else:  # its first, middle and last blocks
        for at in (start, start + (length - _BLOCK) // 2,
                   start + length - _BLOCK):
          digest.update(_read_at(f, at, _BLOCK))


def source_fingerprint(source) -> Optional[str]:
  """A digest of the files behind the weights `source` (`DiffusionLM
  .source`: a Hugging Face directory's config, index, weights and
  tokenizer, or every file of a workdir's step) that a moved or copied
  checkpoint keeps: each file's name and size, a small file's bytes, and
  of a large one its safetensors header and every tensor's first, middle
  and last 4 KiB (a tensor of up to 12 KiB whole: norms, biases), or, not
  safetensors, 256 blocks spread over it. A 7B model's 15 GB are read in
  a few MB. Two checkpoints that differ only inside large tensors away
  from those blocks look the same: every trained tensor differs in them;
  a fine-tune that changed some rows alone of an embedding may not.
  None when `source` names no local files (a Hub id's snapshot before its
  weights, a missing path) or they cannot be read."""
  import hashlib  # pylint: disable=g-import-not-at-top
  if not isinstance(source, str):
    return None
  try:
    found = _source_files(source)
    if not found or not found[1]:
      return None
    directory, files = found
    digest = hashlib.sha256(_FINGERPRINT_FORMAT.encode())
    for name in files:
      digest.update(os.fsencode(name) + b"\0")
      _file_digest(os.path.join(directory, name), digest)
  except OSError:
    return None
  return f"{_FINGERPRINT_FORMAT}:{digest.hexdigest()}"


def newest_complete_step(path) -> Optional[int]:
  """The newest step of the trm.main workdir `path` that carries every
  commit marker; None for another path, or a workdir without one."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  if not isinstance(path, (str, os.PathLike)):
    return None
  saved = os.path.join(os.fspath(path), "checkpoints")
  steps = ckpt_lib.complete_steps(saved) if os.path.isdir(saved) else []
  return steps[-1] if steps else None


def _cache_snapshot(path: str, names: ArgumentNames,
                    revision: Optional[str]) -> Optional[str]:
  """For a Hugging Face cache folder of a repository (HF_HOME/hub/
  models--org--name, which holds refs/ and snapshots/, not the files), its
  snapshot of `revision` (default: main); None for any other directory.
  Read as a checkpoint it said "holds no tokenizer.json"."""
  if (os.path.isfile(os.path.join(path, "config.json"))
      or not os.path.isdir(os.path.join(path, "snapshots"))
      or not os.path.isdir(os.path.join(path, "refs"))):
    return None
  ref = revision or "main"
  commit, from_file = ref, False
  ref_file = os.path.join(path, "refs", ref)
  try:
    # isfile: a FIFO's open blocked until a writer came (for ever). A ref
    # holds a 40-character commit hash; 256 bytes is plenty.
    if os.path.isfile(ref_file):
      with open(ref_file, errors="replace") as f:
        commit, from_file = f.read(256).strip(), True
  except OSError:
    pass  # a commit hash names its snapshot directly
  if from_file and (not commit or commit in (".", "..") or "/" in commit
                    or os.sep in commit or "\0" in commit):
    raise FileNotFoundError(
        f"{names.path}={path} is a Hugging Face cache folder whose "
        f"{ref_file} names no snapshot ({commit[:64]!r}); pass "
        f"{names.path}={os.path.join(path, 'snapshots', '<commit>')} or its "
        "Hub id ('org/name').")
  snapshot = os.path.join(path, "snapshots", commit)
  if not os.path.isdir(snapshot):
    have = ", ".join(sorted(os.listdir(os.path.join(path, "snapshots"))))
    raise FileNotFoundError(
        f"{names.path}={path} is a Hugging Face cache folder with no "
        f"snapshot of revision {ref!r} (snapshots: {have or 'none'}); pass "
        f"{names.path}={os.path.join(path, 'snapshots', '<commit>')} or its "
        "Hub id ('org/name').")
  return snapshot


def _lacking_weights(directory: str) -> str:
  """What of a checkpoint's config and weights `directory` lacks ('' if
  nothing). Without network huggingface_hub returns the cached snapshot as
  it is, whatever it holds; its loaders then said only "DIR has neither
  model.safetensors.index.json nor model.safetensors" of a path in the
  cache the user never named."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  lacking = [] if os.path.isfile(os.path.join(directory, "config.json")) else [
      "config.json"]
  index = os.path.join(directory, hf_import.INDEX_FILE)
  # The layout the loader will read (it says so when both are there).
  layout = weights_io.weights_layout(directory, hf_import.SINGLE_FILE,
                                     hf_import.INDEX_FILE, warn=False)
  if layout == hf_import.INDEX_FILE:
    shards = sorted(set(weights_io.read_index(index).values()))
    absent = [f for f in shards
              if not os.path.isfile(os.path.join(directory, f))]
    if absent:
      lacking.append(f"{len(absent)} of the {len(shards)} weight files its "
                     f"{hf_import.INDEX_FILE} names ({', '.join(absent[:3])}"
                     + (", ..." if len(absent) > 3 else "") + ")")
  elif layout is None:
    lacking.append(f"the weights ({hf_import.SINGLE_FILE}, or "
                   f"{hf_import.INDEX_FILE} and its shards)")
  return " and ".join(lacking)


def _hub_id(path) -> Optional[str]:
  """`path` when `resolve_checkpoint` would download it as a Hub id (no
  such path, and it reads 'org/name'); None else."""
  if not isinstance(path, (str, os.PathLike)):
    return None
  path = os.fspath(path)
  return (path if path and not os.path.exists(path) and HUB_ID.fullmatch(path)
          else None)


def _hub_weights(repo_id: str, checked: str, names: ArgumentNames,
                 revision: Optional[str]) -> str:
  """The download of the Hub repository `repo_id` with its weights, at the
  commit whose config and tokenizer were checked (`checked`, the cache's
  snapshots/<commit>): a branch moved between the two downloads would
  otherwise pair them with another commit's weights."""
  commit = os.path.basename(os.path.normpath(checked))
  return resolve_checkpoint(repo_id, names,
                            commit if COMMIT.fullmatch(commit) else revision)


def fetch_hub_id(path: str, names: ArgumentNames = API_NAMES,
                 files: Sequence[str] = HUB_FILES) -> str:
  """`path` as it is, unless no such path exists and it reads 'org/name':
  then the download of that Hub repository's `files`
  (`resolve_checkpoint`, the cache when offline)."""
  if path and not os.path.exists(path) and HUB_ID.fullmatch(path):
    return resolve_checkpoint(path, names, files=files)
  return path


class DiffusionLM:
  """A Dream/DiffuCoder model on a mesh, with its tokenizer."""

  def __init__(self, cfg, params, tokenizer, *, mesh, rules,
               max_positions: Optional[int] = None, source: str = ""):
    from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
    from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
    self.cfg, self.params, self.tokenizer = cfg, params, tokenizer
    self.ctx = mesh_lib.ShardingContext(mesh, rules)
    self.mesh, self.rules = self.ctx.mesh, self.ctx.rules
    self.max_positions, self.source = max_positions, source
    self._denoiser = dream.denoiser(cfg)
    self._compiled = {}
    self._cached_denoiser = None  # built on the first cached call

  @classmethod
  def from_pretrained(cls, path: str, *, mesh=None, dtype: str = "bfloat16",
                      param_dtype: Optional[str] = None,
                      tokenizer: Optional[str] = None, config=None,
                      attention: Optional[str] = None,
                      allow_nonfinite: bool = False,
                      revision: Optional[str] = None,
                      checkpoint_step: Optional[int | str] = None,
                      names: ArgumentNames = API_NAMES,
                      before_weights=None, before_hub_weights=None):
    """From a Hugging Face directory, a Hub id or a `trm.main` workdir.

    path: a local directory (a Hugging Face download, an export of
    `trm.export`, a `trm.main` workdir, or a Hugging Face cache folder
    models--org--name: its snapshot of `revision`, default main), else a
    Hub id such as
    "apple/DiffuCoder-7B-Instruct", downloaded once into the Hugging Face
    cache (config.json, the safetensors and tokenizer.json; `revision`: a
    branch, tag or commit): the config and tokenizer first, then, once
    the checks and `before_weights` pass, the weights of the same commit;
    a path that is neither fails in one line.

    mesh: a `jax.sharding.Mesh` with axes 'data', 'fsdp' and 'model' (size
    1 where unused; e.g. from `jax.make_mesh`, its axes taken as Auto)
    (default: FSDP over every device, or the config's mesh when `config`
    is given); dtype: compute dtype, 'bfloat16',
    'float32' or 'float16' (transformers' spellings too: 'bf16',
    torch.bfloat16, 'torch.float32'; 'auto' or None: the checkpoint's, as
    config.json's torch_dtype or the run's config.model.dtype); param_dtype:
    the weights' ('bfloat16' or 'float32'; default: a workdir's
    config.model.param_dtype, else bfloat16 for bfloat16 or float8 tensors,
    else float32);
    tokenizer: a directory with tokenizer.json or 'bytes' (default: the
    checkpoint's own, or the run's data.tokenizer); config: an
    ml_collections config whose mesh, logical-axis rules and seq_len (the
    longest sequence) to use, each where it has one (its model sizes are
    not: they come from the checkpoint); attention: 'dot'
    or 'splash' (the Pallas TPU kernel; default: the config's
    model.attention, else 'dot'); allow_nonfinite: load Hugging Face
    weights holding NaN or Inf (refused by default, naming the tensor);
    checkpoint_step: of a `trm.main` workdir, which checkpoint to read:
    'latest' (None: the newest readable one), 'best' (the lowest held-out
    loss, the one the trainer keeps) or a step number.
    A workdir of another model family (GPT, TRM) is refused first, naming
    the command that samples it. names: how errors name these arguments
    (the command-line tools pass `CLI_NAMES`, their flags).
    before_weights: called as before_weights(tokenizer, model config,
    max_positions) before any weight is read, to check inputs against them
    (a tokenizer loads in seconds, a 7B model's weights in minutes).
    before_hub_weights: for a Hub id, called as before_hub_weights(source)
    after before_weights and before its weights download, `source` the
    download of the commit its config and tokenizer came from, which the
    weights join (the model's `source` once loaded): e.g. to compare that
    commit with a record of an earlier run.
    """
    cli.default_to_cpu()  # no libtpu start-up (E0000 lines) on a CPU host
    from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
    from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
    from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
    from trm.families.dream import program as dream_program  # pylint: disable=g-import-not-at-top
    # The arguments before any download or read; DreamConfig's own check
    # blamed the checkpoint's config.json for them.
    dtype = check_dtype(dtype, "dtype", dream.COMPUTE_DTYPES)
    param_dtype = check_dtype(param_dtype, "param_dtype", dream.PARAM_DTYPES)
    if attention is not None and attention not in dream.ATTENTION_KINDS:
      raise ValueError(f"attention={attention!r}: pass one of "
                       f"{', '.join(dream.ATTENTION_KINDS)} (or None: the "
                       "config's model.attention, else 'dot').")
    # Of the wrong type they gave AttributeErrors from deep inside
    # ('str' object has no attribute 'devices').
    import jax  # pylint: disable=g-import-not-at-top
    import ml_collections  # pylint: disable=g-import-not-at-top
    for name, value, kinds, want in (
        ("mesh", mesh, jax.sharding.Mesh, "a jax.sharding.Mesh"),
        ("config", config, ml_collections.ConfigDict,
         "an ml_collections config (config_lib.load_config)"),
        ("tokenizer", tokenizer, (str, os.PathLike),
         "a directory or 'bytes'")):
      if value is not None and not isinstance(value, kinds):
        raise ArgumentTypeError(f"{name}={value!r:.60} is a "
                                f"{type(value).__name__}: pass {want} (or "
                                "None: the default).")
    tokenizer = None if tokenizer is None else os.fspath(tokenizer)
    if tokenizer == "":  # `or` took it as unset: the checkpoint's own
      raise ValueError(f"{names.tokenizer} is given but empty: pass a "
                       "directory with tokenizer.json or 'bytes' (or leave "
                       "it out: the checkpoint's own tokenizer).")
    check_config_family(config, names)
    hub_id = _hub_id(path)
    # A Hub id's config and tokenizer come first: the checks below and
    # before_weights run before its weights download (minutes for a 7B).
    path = resolve_checkpoint(path, names, revision,
                              HUB_CHECK_FILES if hub_id else HUB_FILES)
    if attention is None:
      attention = (config.model.get("attention", "dot") if config is not None
                   and "model" in config else "dot")
    workdir = os.path.isdir(os.path.join(path, "checkpoints"))
    if workdir:
      check_dream_workdir(path)
      run = _workdir_config(path, config, names)
      cfg = dream.DreamConfig.from_config(dict(
          run.model, attention=attention,
          **({"dtype": dtype} if dtype else {}),
          # It was dropped without a word (the run's float32 restored).
          **({"param_dtype": param_dtype} if param_dtype else {})))
      spec = tokenizer or _run_tokenizer(run, path, names.tokenizer)
      # Named as the flag that fixes it: a --tokenizer directory without
      # tokenizer.json said "point --checkpoint at a DiffuCoder/Dream
      # directory".
      tok = tok_lib.from_spec(spec, cfg, names.tokenizer)
      positions = int(run.seq_len) if "seq_len" in run else None
    elif tokenizer == "bytes":  # the mask id must come from config.json
      cfg, positions = hf_config.model_config_from_hf(
          path, None, dtype=dtype, param_dtype=param_dtype,
          attention=attention)
      tok = tok_lib.from_spec(tokenizer, cfg)
    else:
      if not tok_lib.has_tokenizer(tokenizer or path):
        which = (f"{names.tokenizer}={tokenizer}" if tokenizer
                 else f"{names.path}={path}")
        raise FileNotFoundError(
            f"{which} holds no tokenizer.json: pass {names.tokenizer}=<a "
            "directory with tokenizer.json, or vocab.json and merges.txt>, "
            f"or {names.tokenizer}=bytes for "
            "a model trained with the byte tokenizer (e.g. an export of "
            "configs/diffucoder_7b.py:tiny).")
      tok = tok_lib.load_tokenizer(tokenizer or path)
      cfg, positions = hf_config.model_config_from_hf(
          path, tok, dtype=dtype, param_dtype=param_dtype,
          attention=attention)
      tok_lib.check_against_model(tok, cfg, tokenizer or path)
    if config is not None and "seq_len" in config:  # the context trained
      positions = min(positions or config.seq_len, config.seq_len)
    # A config giving only some of them (e.g. seq_len) takes the defaults
    # for the rest; it was an AttributeError: "'logical_axis_rules'".
    given = config if config is not None else {}
    rules = (mesh_lib.logical_rules(config) if "logical_axis_rules" in given
             else config_lib.default_logical_axis_rules())
    if mesh is None:
      mesh = mesh_lib.make_mesh(config.mesh if "mesh" in given else
                                config_lib.mesh_config(data=1, fsdp=-1,
                                                       model=1))
    else:  # a mesh of other axis names was a KeyError: 'model'
      wanted = sorted({a for _, axes in rules for a in mesh_lib.axes_of(axes)},
                      key=mesh_lib.MESH_AXES.index)
      if not set(wanted) <= set(mesh.axis_names):
        raise ValueError(
            f"mesh= has axes {tuple(mesh.axis_names)}, but the logical-axis "
            f"rules place arrays on {tuple(wanted)}: name its axes so (size 1"
            f" where unused), e.g. jax.make_mesh((1, jax.device_count(), 1), "
            f"{tuple(wanted)}), or leave mesh=None (FSDP over every device).")
      # jax.make_mesh's axes are Explicit, which the model's sharding hints
      # do not serve (ShardingTypeError in the embedding's gather); the
      # project's meshes are Auto. The devices and names are kept.
      mesh = jax.sharding.Mesh(
          mesh.devices, mesh.axis_names,
          axis_types=(jax.sharding.AxisType.Auto,) * len(mesh.axis_names))
    mesh_lib.check_tpu_kernels(mesh, prefix="", attention=cfg.attention)
    placement = mesh_lib.ShardingContext(mesh, rules)
    # Before any weight is read, as the trainer checks it.
    dream_program.check_heads_fit(cfg, placement)
    if before_weights is not None:
      before_weights(tok, cfg, positions)
    if hub_id:
      if before_hub_weights is not None:
        before_hub_weights(path)
      path = _hub_weights(hub_id, path, names, revision)
    _, shardings = placement.boxed_shardings(
        lambda: dream.abstract_params(cfg))
    params, source = load_params(path, cfg, shardings,
                                 allow_nonfinite=allow_nonfinite,
                                 allow_hint=names.allow_nonfinite,
                                 checkpoint_step=checkpoint_step,
                                 step_name=names.checkpoint_step)
    return cls(cfg, params, tok, mesh=mesh, rules=rules,
               max_positions=positions, source=source)

  # ------------------------------------------------------------- generation

  def encode(self, prompts: str | Sequence[str], chat: bool = False,
             system: Optional[str] = None):
    """Token ids of `prompts` (a string or a list, as `generate` takes
    them), one list per prompt; with `chat`, each stripped of surrounding
    whitespace and wrapped in the Instruct template, a special token's
    name in it encoded as text (`chat_prompt_ids`), as DiffuCoder's README
    and inference_demo.py prompt the model and as the fine-tuning rows are
    built. `system` replaces the template's system message ("You are a
    helpful assistant."), as a first system message does in the chat
    template and in a fine-tuning conversation."""
    from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
    # As `generate` reads them: a lone string was encoded one character at
    # a time, silently.
    prompts = check_prompts(prompts)
    check_switches(chat=chat)
    if chat:
      return [tok_lib.chat_prompt_ids(
          self.tokenizer, p if system is None
          else [("system", system), ("user", p)]) for p in prompts]
    return [self.tokenizer.encode(p) for p in prompts]

  def compile(self, batch: int, prompt_len: int, *, padded: bool,
              history: bool = False, **settings):
    """(compiled program, compile seconds) for [batch, prompt_len] prompts
    (`padded`: with a padding mask; `generate` pads to a multiple of
    `prompt_bucket` unless it is 1); cached per shape and setting. The
    settings are `generate`'s (its defaults, `sampler_settings`), so a
    program compiled ahead here is the one `generate` then reuses."""
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    # Unchecked and unnormalised, they compiled temperature=-1, and keyed
    # programs that `generate` (all settings, normalised) never found.
    settings = sampler_settings(**settings)
    key = (batch, prompt_len, padded, history,
           tuple(sorted(settings.items())))
    if key in self._compiled:
      return self._compiled[key], 0.0
    start = time.perf_counter()
    with self.ctx:
      ids = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
      mask = (jax.ShapeDtypeStruct((batch, prompt_len), jnp.bool_) if padded
              else None)
      if settings.get("cache"):
        lowered = self._lower_cached(ids, mask, history, settings)
      else:
        settings = {k: v for k, v in settings.items()
                    if k not in ("cache", "block_length", "threshold",
                                 "fast_dllm")}
        lowered = diffusion_sampling.lower_generate(
            self._denoiser, ids, mask, params=self.params,
            mask_token_id=self.cfg.mask_token_id, return_history=history,
            **settings)
      compiled = array_sizes.compile_checked(
          lowered, "The sampling loop",
          "lower the prompt length, max_new_tokens or the batch")
    self._compiled[key] = compiled
    return compiled, time.perf_counter() - start

  def _lower_cached(self, ids, mask, history, settings):
    from trm.families.dream import cached_sampling  # pylint: disable=g-import-not-at-top
    from trm.families.dream import cache as dream_cache  # pylint: disable=g-import-not-at-top
    if history:
      raise ValueError("return_history: not available with cache=...; the "
                       "exact sampler (cache unset) records it.")
    if self._cached_denoiser is None:
      self._cached_denoiser = dream_cache.cached_denoiser(self.cfg)
    return cached_sampling.lower_cached_generate(
        self._cached_denoiser, ids, mask, params=self.params,
        mask_token_id=self.cfg.mask_token_id, **settings)

  def generate(self, prompts, *, max_new_tokens: int = 256,
               steps: Optional[int] = None, alg: str = "entropy",
               temperature: float = 0.0, top_p: Optional[float] = None,
               top_k: Optional[int] = DEFAULT_TOP_K,
               alg_temp: Optional[float] = None, eps: float = 1e-3,
               chat: bool = False, system: Optional[str] = None,
               batch_size: Optional[int] = None,
               seed: int = 0, return_tokens: bool = False,
               return_history: bool = False, cache: Optional[str] = None,
               block_length: int = 32, threshold: Optional[float] = None,
               fast_dllm: bool = False,
               prompt_bucket: int = PROMPT_BUCKET,
               return_dict_in_generate: bool = False,
               output_history: bool = False,
               num_return_sequences: int = 1):
    """Completions (list of str) for `prompts` (a string or a list).

    `num_return_sequences` completions of each prompt, as Hugging Face's
    generate and Dream's `diffusion_generate` return them: each prompt's
    consecutively (p0, p0, p1, p1, ...), each its own draw (each row of a
    batch draws its own noise; with temperature 0, no `alg_temp` and an
    `alg` other than 'origin', whose order of unmasking is drawn, the
    copies are equal). Rows, not prompts, then fill the batches of
    `batch_size`; batch n samples with seed + n, so a fixed seed gives the
    same rows again.

    steps defaults to max_new_tokens (one token per step). `system`
    (with `chat` only) replaces the template's system message. `cache`
    ('prefix' or 'dual') selects Fast-dLLM-style cached block decoding
    (`cached_sampling`: approximate, much faster on long canvases) with
    blocks of `block_length` tokens and, with `threshold`, confidence-
    threshold parallel decoding; `fast_dllm` switches its block rules to
    Fast-dLLM's own, which it then reproduces token for token (greedy);
    unset, the exact reference sampler runs. With
    `return_tokens` (or `return_history`) a `Generation` comes back instead,
    holding the raw sequences and, with `return_history`, the canvas after
    every step. `return_dict_in_generate` and `output_history` are Hugging
    Face's `diffusion_generate` spellings of the same: the object has
    `.sequences` (prompt + canvas) and `.history` (x after each step, as
    `DreamModelOutput.history`); unlike there, `output_history` alone also
    returns the object (HF would drop the history silently). Prompts are
    left-padded to a multiple of `prompt_bucket` tokens (1: to the longest
    prompt only), so that new prompt lengths mostly reuse a compiled program;
    the padding is masked (positions, attention) and cut off again, so the
    outputs are the unbucketed ones up to floating-point rounding: attention
    then sums over longer rows of masked zeros, which can move a logit by
    ~1e-7 and so flip an exact near-tie (two reveals of equal confidence).
    `self.timings` then holds the compile and run seconds.
    """
    import jax  # pylint: disable=g-import-not-at-top
    from trm.core import host_arrays  # pylint: disable=g-import-not-at-top
    # Every argument is checked before anything is tokenised or computed.
    prompts = check_prompts(prompts)
    check_switches(chat=chat, return_tokens=return_tokens,
                   return_history=return_history,
                   output_history=output_history,
                   return_dict_in_generate=return_dict_in_generate)
    check_system(system, chat)
    copies = check_num_return_sequences(num_return_sequences)
    check_batch_and_seed(batch_size, seed, len(prompts) * copies)
    seed = int(seed)  # numpy integers would wrap in seed + n
    if not _is_int(prompt_bucket) or prompt_bucket < 1:
      raise ValueError(f"prompt_bucket={prompt_bucket!r}: must be an "
                       "integer >= 1 (1: no bucketing).")
    return_history = bool(return_history or output_history)
    batch_size = None if batch_size is None else int(batch_size)
    settings = sampler_settings(
        max_new_tokens=max_new_tokens, steps=steps, alg=alg,
        temperature=temperature, top_p=top_p, top_k=top_k, alg_temp=alg_temp,
        eps=eps, cache=cache, block_length=block_length, threshold=threshold,
        fast_dllm=fast_dllm)
    steps = settings["steps"]
    token_lists = self.encode(prompts, chat, system)
    empty = [i for i, t in enumerate(token_lists) if not t]
    if empty:
      raise ValueError(f"prompt {empty[0]} encodes to no tokens; a sequence "
                       "needs at least one token before the canvas.")
    count = len(token_lists) * copies  # rows: one per sequence
    longest = max(len(t) for t in token_lists)
    check_settings(max_new_tokens=max_new_tokens, steps=steps,
                   temperature=temperature, top_p=top_p, top_k=top_k, alg=alg,
                   alg_temp=alg_temp, eps=eps,
                   max_positions=self.max_positions, prompt_len=longest)
    widths = dict(new_tokens=int(max_new_tokens),
                  multiple_of=1 if self.cfg.attention == "dot" else 128)
    ids, mask = left_pad(token_lists, self.tokenizer.eos_id,
                         bucket=int(prompt_bucket), **widths)
    spanned = {d.process_index for d in self.mesh.devices.flat}
    check_rows_fit(len(token_lists), copies, batch_size, ids.shape[1],
                   processes=spanned)
    if copies > 1:
      # Hugging Face's order (`repeat_interleave`): each prompt's copies
      # together.
      try:
        ids, mask = np.repeat(ids, copies, 0), np.repeat(mask, copies, 0)
      # numpy's traceback otherwise; past 2**62 rows its ValueError "array
      # is too big" named no argument.
      except (MemoryError, OverflowError, ValueError):
        raise ValueError(
            f"num_return_sequences={copies}: {count} rows of {ids.shape[1]} "
            "tokens do not fit in this host's memory; lower "
            "num_return_sequences (or pass fewer prompts).") from None
    # The bucket's extra pad columns, cut from what is returned.
    extra = ids.shape[1] - padded_width(longest, **widths)
    size = batch_size or count
    rows = -(-count // size) * size
    if rows > count:  # repeat the last prompt: one program for all
      ids, mask = _pad_rows(ids, mask, rows, batch_size)
    # Bucketed, a prompt that fills its bucket exactly runs the padded
    # program too (an all-ones mask gives the same result): one program per
    # bucket, not two.
    padded = bool((~mask).any()) or prompt_bucket > 1
    compiled, compile_seconds = self.compile(
        size, ids.shape[1], padded=padded, history=return_history, **settings)
    # The prompts go where the program wants them (split over the batch
    # axis's devices, of every process on a pod), and its outputs come back
    # whole on every process.
    _, ids_sharding, mask_sharding, _ = compiled.input_shardings[0]
    start = time.perf_counter()
    outs, hists = [], []
    with self.ctx:
      for n, first in enumerate(range(0, rows, size)):
        batch_mask = (host_arrays.put(mask[first:first + size],
                                      mask_sharding) if padded else None)
        out = compiled(self.params,
                       host_arrays.put(ids[first:first + size],
                                       ids_sharding),
                       batch_mask, jax.random.key(seed + n))
        if return_history:
          out, hist = out
          hists.append(host_arrays.whole(hist))
        outs.append(host_arrays.whole(out))
    tokens = np.concatenate(outs)[:count, extra:]
    self.timings = {"compile_seconds": compile_seconds,
                    "run_seconds": time.perf_counter() - start,
                    "new_tokens": count * int(max_new_tokens)}
    prompt_len = ids.shape[1] - extra
    cut = diffusion_sampling.split_completion(tokens[:, prompt_len:],
                                              self.tokenizer.stop_ids())
    completions = [self.tokenizer.decode(c) for c in cut]
    if not (return_tokens or return_history or return_dict_in_generate):
      return completions
    history = (np.concatenate(hists, axis=1)[:, :count, extra:]
               if hists else None)
    return Generation(completions, tokens, prompt_len, history)

  # ------------------------------------------------------------ likelihood

  def loglikelihood(self, requests, *, mc_num: int = 128,
                    batch_size: int = 32, nll_type: str = "mc",
                    log_type: str = "ftb", sampling_eps: float = 1e-3,
                    seed: int = 0, bucket: int = PROMPT_BUCKET
                    ) -> list[tuple[float, bool]]:
    """lm-eval's `loglikelihood`: (log p(continuation | context), is_greedy)
    for each (context, continuation) pair of strings in `requests`, as
    Dream's lm-eval harness estimates it (`likelihood`'s docstring): with
    nll_type 'mc', the Monte Carlo estimate over `mc_num` draws in rounds of
    `batch_size` (mc_num a multiple of it), noising the continuation
    (log_type 'ftb'), the context ('btf') or both ('union'), t from
    [`sampling_eps`, 1], is_greedy False (the reference does not check it);
    with 'ar_ftb', the exact left-to-right sum, is_greedy True when every
    continuation token is the model's argmax where it is scored. Every
    request draws from numpy's Generator seeded `seed`, so a request's
    estimate does not depend on the others. Each request is checked (one
    line naming its index: empty, too long, holding the mask token, 'ftb'
    with no context, whose first token it would never score) before
    anything is computed. Sequences are right-padded to a multiple of
    `bucket` tokens, the padding masked (one compiled program per bucket)."""
    from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
    likelihood.check_settings(mc_num=mc_num, batch_size=batch_size,
                              nll_type=nll_type, log_type=log_type,
                              sampling_eps=sampling_eps, seed=seed)
    if not _is_int(bucket) or bucket < 1:
      raise ValueError(f"bucket={bucket!r}: must be an integer >= 1 (1: no "
                       "padding).")
    pairs = likelihood.check_requests(requests)
    encoded = [likelihood.encode_pair(self.tokenizer, *pair)
               for pair in pairs]
    refusal = None
    for i, request in enumerate(encoded):
      likelihood.check_request(request, i, self.cfg.mask_token_id,
                               self.max_positions,
                               log_type if nll_type == "mc" else None)
      # Before any draw: a batch_size past the host's memory was an OOM kill.
      refusal = refusal or likelihood.host_memory_refusal(
          mc_num, batch_size, nll_type, len(request.tokens),
          self._width(len(request.tokens), int(bucket)), i)
    # Agreed where the model spans every process (each then scores every
    # request); a per-host model decides alone.
    array_sizes.refuse_together(
        refusal, f"{likelihood.host_memory_names(mc_num, batch_size, nll_type)}"
        ": the draws and rows of a request",
        likelihood.HOST_MEMORY_FIX[nll_type == "mc"],
        {d.process_index for d in self.mesh.devices.flat})
    out = []
    for request in encoded:
      if nll_type == "ar_ftb":
        nll, wrong = self.ar_nll(request, batch_size=int(batch_size),
                                 bucket=int(bucket))
        out.append((-nll, wrong == 0))
        continue
      rng = np.random.default_rng(int(seed))
      length = len(request.tokens)
      draws = [likelihood.forward_process(rng, int(batch_size), length,
                                          float(sampling_eps))
               for _ in range(mc_num // batch_size)]
      # + 0.0: a region with no token to mask ('btf' without a context)
      # scores 0, not -0.0.
      ll = -float(np.mean(self.mc_draw_losses(request, draws, log_type,
                                              bucket=int(bucket)))) + 0.0
      if log_type == "union":
        ll /= length
      out.append((ll, False))
    return out

  def _score(self, parts, batch: int, width: int):
    """`likelihood.score` over the rows of `parts` (a list of
    `likelihood.Rows`) in batches of `batch`: (nll [rows], wrong [rows])."""
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from trm.core import host_arrays  # pylint: disable=g-import-not-at-top
    from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
    count = sum(p.noisy.shape[0] for p in parts)
    batches = likelihood.stack_rows(parts, batch)
    scored = batches[0].rows.shape[1]
    key = ("loglikelihood", batch, width, scored)
    if key not in self._compiled:
      # noisy, real [batch, width]; rows, targets, weights [batch, scored]
      shapes = [((batch, width), jnp.int32), ((batch, width), jnp.bool_),
                ((batch, scored), jnp.int32), ((batch, scored), jnp.int32),
                ((batch, scored), jnp.float32)]
      with self.ctx:
        lowered = likelihood.score.lower(
            self._denoiser, self.params,
            *(jax.ShapeDtypeStruct(*shape) for shape in shapes))
        self._compiled[key] = array_sizes.compile_checked(
            lowered, "The likelihood program",
            "lower batch_size or shorten the requests")
    compiled = self._compiled[key]
    shardings = compiled.input_shardings[0][1:]
    nll, wrong = [], []
    with self.ctx:
      for rows in batches:
        args = [host_arrays.put(x, s) for x, s in zip(
            (rows.noisy, rows.real, rows.rows, rows.targets, rows.weights),
            shardings)]
        a, b = compiled(self.params, *args)
        nll.append(host_arrays.whole(a))
        wrong.append(host_arrays.whole(b))
    return (np.concatenate(nll)[:count].astype(np.float64),
            np.concatenate(wrong)[:count])

  def _width(self, length: int, bucket: int) -> int:
    """The padded width of a `length`-token sequence (the splash kernel
    tiles by 128)."""
    return padded_width(length, bucket=bucket,
                        multiple_of=1 if self.cfg.attention == "dot" else 128)

  def mc_draw_losses(self, request, draws, log_type: str = "ftb", *,
                     bucket: int = PROMPT_BUCKET) -> np.ndarray:
    """Each draw's loss (Dream's per-round `loss`: sum over the masked
    tokens of CE / p_mask, divided by the batch) for a tokenised
    `likelihood.Request` and `draws`, a list of (masked [B, L] bool,
    p_mask [B]) over the whole sequence (`likelihood.forward_process`);
    `log_type` keeps the masks of its region only."""
    from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
    length = len(request.tokens)
    region = likelihood.scored_region(len(request.prefix), length, log_type)
    batch = draws[0][0].shape[0]
    width = self._width(length, bucket)
    scored = likelihood.padded(max(len(region), 1), min(bucket, 16))
    parts = [likelihood.mc_rows(request, np.asarray(masked, bool),
                                np.asarray(p_mask, np.float32), log_type,
                                self.cfg.mask_token_id, width, scored,
                                self.tokenizer.eos_id)
             for masked, p_mask in draws]
    nll, _ = self._score(parts, batch, width)
    return nll.reshape(len(draws), batch).sum(1) / batch

  def ar_nll(self, request, *, batch_size: int = 32,
             bucket: int = PROMPT_BUCKET) -> tuple[float, int]:
    """('ar_ftb') (the continuation's negative log-likelihood revealed left
    to right, how many of its tokens are not the argmax where scored)."""
    from trm.families.dream import likelihood  # pylint: disable=g-import-not-at-top
    width = self._width(len(request.tokens), bucket)
    rows = likelihood.ar_rows(request, self.cfg.mask_token_id, width,
                              self.tokenizer.eos_id)
    # batch_size rows per call whatever the length (the last batch filled
    # with rows of weight 0): one program per width.
    nll, wrong = self._score([rows], batch_size, width)
    return float(nll.sum()), int(wrong.sum())


def _run_tokenizer(run, workdir: str, name: str = "tokenizer") -> str:
  """The tokenizer the run in `workdir` trained with; `name`: how the
  error spells the argument that supplies one (`tokenizer` from the API,
  --tokenizer from the tools)."""
  spec = run.data.get("tokenizer", "") if "data" in run else ""
  if not spec:
    # A run started from a Hub id: its tokenizer from the Hub cache.
    spec = fetch_hub_id(run.get("init_checkpoint", ""),
                        files=TOKENIZER_HUB_FILES)
  if not spec:
    # e.g. data.source='synthetic' (hashed ids): any tokenizer whose ids
    # fit the vocabulary decodes them.
    raise ValueError(f"The run in {workdir} names no tokenizer "
                     f"(data.tokenizer, init_checkpoint); pass {name}=<a "
                     "directory with tokenizer.json, or 'bytes'>.")
  return spec


def check_finite_params(params, cfg, where: str,
                        allow_hint: str = "allow_nonfinite=True") -> None:
  """Raises CheckpointError naming the Hugging Face tensor (and layer) of
  the first param holding NaN or Inf. The counts are reduced on the
  devices, each from its own shards; only one number per tensor (per layer)
  is fetched."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.core import host_arrays  # pylint: disable=g-import-not-at-top
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_layout  # pylint: disable=g-import-not-at-top
  leaves = hf_layout.leaves(cfg)
  arrays = [weights_io.get_path(params, leaf.path) for leaf in leaves]

  def counts(arrays):
    out = []
    for leaf, x in zip(leaves, arrays):
      bad = jnp.logical_not(jnp.isfinite(x))
      axes = tuple(range(1, x.ndim)) if leaf.per_layer else None
      out.append(jnp.sum(bad, axis=axes, dtype=jnp.int32))
    return out

  found = [host_arrays.whole(x) for x in jax.jit(counts)(arrays)]
  for leaf, x, bad in zip(leaves, arrays, found):
    bad = np.asarray(bad)
    if not bad.any():
      continue
    name, size = leaf.hf_name, int(np.prod(x.shape))
    if leaf.per_layer:
      layer = int(np.flatnonzero(bad)[0])
      name = name.replace("{i}", str(layer))
      size //= max(x.shape[0], 1)
      bad = bad[layer]
    raise weights_io.nonfinite_error(name, where, int(bad), size, allow_hint)


def load_params(checkpoint: str, cfg, shardings,
                allow_nonfinite: bool = False,
                allow_hint: str = "allow_nonfinite=True",
                checkpoint_step: int | str | None = None,
                step_name: str = "checkpoint_step"):
  """(params, description) from a HF directory or a trm.main workdir (its
  checkpoint `checkpoint_step`: see `DiffusionLM.from_pretrained`; errors
  spell it as `step_name`, the tools' `--step`).

  A workdir of another model family is refused naming the command that
  samples it; Hugging Face weights holding NaN or Inf are refused naming
  the tensor, unless `allow_nonfinite`."""
  from flax.linen import meta  # pylint: disable=g-import-not-at-top
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  saved = os.path.join(checkpoint, "checkpoints")
  choice = None
  if checkpoint_step is not None:
    # Parsed whatever the weights are ('Latest' is 'latest' for both).
    try:
      choice = cli.parse_step(checkpoint_step, step_name)
    except ValueError as e:
      raise ValueError(f"{cli.step_spelling(step_name)(checkpoint_step)}: "
                       f"{e}.") from None
  if os.path.isdir(saved):
    check_dream_workdir(checkpoint)
    if choice is not None:
      checkpoint_step = ckpt_lib.choose_step(saved, choice, step_name)
    abstract = state_lib.with_shardings(
        meta.unbox(dream.abstract_params(cfg)), shardings)
    fields, step = ckpt_lib.restore_fields(saved, {"params": abstract},
                                           step=checkpoint_step,
                                           family="DiffuCoder/Dream")
    return fields["params"], f"{saved} step {step}"
  if choice not in (None, "latest"):
    raise ValueError(f"{cli.step_spelling(step_name)(checkpoint_step)} "
                     "chooses among the checkpoints of a trm.main workdir; "
                     f"{checkpoint} is not one (it has no checkpoints/ "
                     "directory).")
  params = hf_import.load_hf_checkpoint(checkpoint, cfg, shardings)
  if not allow_nonfinite:
    check_finite_params(params, cfg, checkpoint, allow_hint)
  return params, checkpoint
