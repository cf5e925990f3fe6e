r"""Samples from a GPT, with nanoGPT's sample.py options:

  python -m trm.sample --workdir=runs/shakespeare_char \
      --start="ROMEO:" --num_samples=3 --max_new_tokens=500
  python -m trm.sample --init_from=gpt2 --checkpoint=DIR --start=FILE:p.txt

`--init_from=resume` (the default) reads the newest checkpoint of a
`trm.main` workdir (or the one `--step=best|N` names) and its config.json; `gpt2*` reads a Hugging Face GPT-2
directory (and its tokenizer.json, when no meta.json names another);
`--checkpoint=.../ckpt.pt` reads nanoGPT's own checkpoint (with
`--data_dir` holding the dataset's meta.json, or nanoGPT's own meta.pkl).
A model of GPT-2's BPE reads it through tiktoken, which downloads its
files; offline, `--tokenizer=DIR` takes a gpt2 download's tokenizer.json.
Generation is one compiled program with a KV cache
(`trm.families.gpt.model.generate`).
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time

from absl import app, flags

from trm.core import cli
from trm.core import config_lib
from trm.core import distributed


def attention_here(attention: str, platform: str) -> str:
  """The run's `config.model.attention` where its kernel runs on
  `platform` (Pallas TPU kernels on a TPU, cuDNN on a GPU), else 'dot':
  every kernel computes the attention the dot path does, so a run trained
  on one platform samples on any."""
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.nn import platform as platform_lib  # pylint: disable=g-import-not-at-top
  if attention == "cudnn" and platform in platform_lib.GPU_PLATFORMS:
    return attention
  if attention in mesh_lib.TPU_ONLY_KERNELS and platform == "tpu":
    return attention
  return "dot"


_INIT_FROM = flags.DEFINE_string(
    "init_from", "resume", "resume (a trm.main --workdir, or --checkpoint="
    "ckpt.pt) | gpt2 | gpt2-medium | gpt2-large | gpt2-xl (--checkpoint=HF "
    "directory).")
_WORKDIR = flags.DEFINE_string("workdir", None, "The trm.main workdir "
                               "(nanoGPT's out_dir).")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "A Hugging Face GPT-2 directory or a nanoGPT "
    "ckpt.pt, instead of a workdir.")
_STEP = cli.define_step_flag()
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Directory with the dataset's meta.json or nanoGPT's "
    "meta.pkl (default: the run's data_root/dataset, a ckpt.pt's "
    "data/<dataset>; GPT-2 BPE when there is none).")
_TOKENIZER = flags.DEFINE_string(
    "tokenizer", None, "GPT-2's tokenizer.json (or a directory holding one, "
    "e.g. a Hugging Face gpt2 download) for a model whose data is GPT-2's "
    "BPE, in place of tiktoken, which downloads its files: samples offline.")
_START = flags.DEFINE_string("start", "\n", "Prompt text, or FILE:path.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 10, "Samples to draw.")
_BATCH_SIZE = flags.DEFINE_integer(
    "batch_size", 0, "Samples drawn at once (0: all --num_samples). Each "
    "row holds a KV cache of the whole block (GPT-2 124M: 75 MB), so many "
    "samples are drawn in batches of this size, printed as each ends.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 500, "Tokens per sample.")
_TEMPERATURE = flags.DEFINE_float(
    "temperature", 0.8, "1.0: unchanged; lower: less random; 0: greedy.")
_TOP_K = flags.DEFINE_integer("top_k", 200, "Keep the k most likely tokens "
                              "(0: all).")
_SEED = flags.DEFINE_integer("seed", 1337, "Sampling seed.")
_ALLOW_NONFINITE = flags.DEFINE_bool(
    "allow_nonfinite", False, "Load weights even when a tensor holds NaN or "
    "Inf (refused by default, naming it).")

# Tokens a sample holds, its prompt's included: their positions and the
# sampling loop's indices are int32 (--max_new_tokens=3000000000 ended in
# jax's OverflowError traceback once the weights were read).
MAX_TOKENS = 2**31 - 1

# What samples or evaluates the workdir of each other model family.
_OTHER_FAMILY_COMMANDS = {
    "dream": "sample it with `python -m trm.generate --checkpoint={path}`",
    "trm": ("evaluate it with `python -m trm.evaluate --config=CONFIG "
            "--checkpoint={path} --output_dir=DIR` (TRM models are not "
            "sampled)"),
}


def read_start(start: str) -> str:
  """nanoGPT's --start: the text itself, or FILE:path for a file's text."""
  if not start.startswith("FILE:"):
    return start
  path = start[len("FILE:"):]
  if not os.path.exists(path):  # a directory: read_utf8 says what it is
    raise FileNotFoundError(f"--start={start!r}: {path} does not exist.")
  from trm.data import io as data_io  # pylint: disable=g-import-not-at-top
  # CRLF (or CR) line ends read as LF and a byte-order mark is dropped: a
  # file saved on Windows prompts exactly as the same text saved elsewhere.
  return "\n".join(data_io.split_lines(data_io.read_utf8(
      path, fix=f"--start={start} names a UTF-8 text file")))


def encode_start(codec, text: str) -> list[int]:
  """--start's token ids as nanoGPT's sample.py encodes them: with GPT-2's
  BPE (tiktoken) the text "<|endoftext|>", which nanoGPT suggests as a
  start, is the end-of-text token (its `allowed_special`), not the
  ordinary tokens of its characters that data preparation's
  `encode_ordinary` makes of it; a GPT-2 tokenizer.json the same way.
  Character codecs have no special tokens."""
  from trm.data.text import text_codecs  # pylint: disable=g-import-not-at-top
  if isinstance(codec, text_codecs.TiktokenCodec):
    special = {"<|endoftext|>"} & codec.encoding.special_tokens_set
    return codec.encoding.encode(text, allowed_special=special,
                                 disallowed_special=())
  if isinstance(codec, text_codecs.HFTokenizerCodec):
    return codec.encode_allowing_special(text)
  try:
    return codec.encode(text)
  except ValueError as e:  # the codec's line names no flag
    raise app.UsageError(f"--start: {e}") from None


def run_config(workdir: str):
  """The ConfigDict a trm.main run recorded in its config.json."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"{path} does not exist: --workdir must be the --workdir of a "
        "`python -m trm.main --config=configs/gpt.py...` run.")
  from etils import epath  # pylint: disable=g-import-not-at-top
  from trm.core import config_record  # pylint: disable=g-import-not-at-top
  # A config.json edited by hand: damaged JSON, or other JSON than the
  # object trm.main records, is one line naming it (was a traceback).
  record = config_record.read_file(epath.Path(path))
  if not isinstance(record.get("model"), dict):
    raise ValueError(f"{path}: its 'model' is {record.get('model')!r}, not "
                     "the config.model object trm.main records; restore the "
                     "file, or sample a checkpoint with --checkpoint.")
  config = ml_collections.ConfigDict(record)
  name = config.model.get("name")
  if name != "gpt":
    command = _OTHER_FAMILY_COMMANDS.get(
        name, "use the command of its model family").format(path=workdir)
    raise ValueError(f"{path} describes a config.model.name={name!r} run, "
                     f"not a GPT (trm.sample samples GPTs only); {command}.")
  return config


def check_finite(params, where: str) -> None:
  """Refuses (one line naming the tensor) weights holding NaN or Inf,
  unless --allow_nonfinite."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  allow = _ALLOW_NONFINITE.value if flags.FLAGS.is_parsed() else False
  weights_io.check_finite_tree(params, where, allow,
                               allow_hint="--allow_nonfinite")


def gpt2_tokenizer_json(path: str, meta: dict) -> str:
  """--tokenizer's file, once it is GPT-2's BPE standing in for tiktoken
  (the model's `meta` names 'gpt2'): tiktoken's error offline names this
  flag, and a tokenizer of other ids would sample text of other words."""
  from trm.data.text import text_codecs  # pylint: disable=g-import-not-at-top
  from trm.data.text import preparation  # pylint: disable=g-import-not-at-top
  if meta.get("tokenizer") != "gpt2":
    raise app.UsageError(
        f"--tokenizer={path} stands in for GPT-2's BPE (tiktoken), but the "
        f"model's tokenizer is {meta.get('tokenizer')!r} (its data "
        "directory's): leave --tokenizer unset.")
  try:
    codec = text_codecs.HFTokenizerCodec(path)
  except (FileNotFoundError, ValueError) as e:
    raise app.UsageError(f"--tokenizer={path}: {e}") from None
  if codec.vocab_size != preparation.GPT2_VOCAB:
    raise app.UsageError(
        f"--tokenizer={path} has {codec.vocab_size} ids, not GPT-2's "
        f"{preparation.GPT2_VOCAB}: pass the tokenizer.json of a Hugging "
        "Face gpt2 download.")
  return codec.path


def check_prompt_ids(prompt, vocab_size: int, codec, data_dir) -> None:
  """Refuses a --start whose token ids the model has no embedding for: the
  codec (meta.json's, or GPT-2's BPE when there is none) is not the one
  the weights were trained with. JAX's gather would fill those rows with
  NaN and every sample would print token 0, with exit 0 (nanoGPT's torch
  raises an IndexError)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  top = int(np.max(prompt))
  if top < vocab_size:
    return
  where = (f"the meta.json of {data_dir}" if data_dir else
           "GPT-2's BPE (no meta.json was found)")
  raise app.UsageError(
      f"--start encodes to token id {top}, but the model's vocabulary has "
      f"{vocab_size} ids: the tokenizer, {where}, with "
      f"{getattr(codec, 'vocab_size', '?')} ids, is not the model's. Pass "
      "--data_dir=DIR with the meta.json of the data the model was trained "
      "on.")


def compile_sampler(generate, params, prompt, key, batch: int,
                    max_new_tokens: int, vocab_size: int):
  """The jitted `generate` compiled for `batch` samples at once, once its
  arrays are known to fit: none of 2**50 bytes or more (`array_sizes`),
  and on CPU devices the program within this host's memory. Before,
  --num_samples=10**10 (all at once by default) aborted the process in
  XLA:CPU (a C++ CHECK on a buffer it could not allocate, exit 134), and
  2**62 ended in JAX's NotImplementedError traceback while tracing."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from trm.core import array_sizes  # pylint: disable=g-import-not-at-top
  what = f"The sampling program for {batch} samples at once"
  fix = ("pass a smaller --batch_size (samples drawn at once) or fewer "
         "--max_new_tokens")
  # Before tracing: the samples' tokens, and a step's logits, whose random
  # draw JAX cannot trace past 2**64 values.
  array_sizes.check_abstract(
      [jax.ShapeDtypeStruct((batch, prompt.shape[1] + max_new_tokens),
                            jnp.int32),
       jax.ShapeDtypeStruct((batch, vocab_size), jnp.float32)], what, fix)
  return array_sizes.compile_checked(generate.lower(params, prompt, key),
                                     what, fix)


def load_model(init_from: str, workdir: str | None, checkpoint: str | None,
               ctx, step: int | None = None):
  """(GPTConfig, params on `ctx.mesh`, default meta.json dir, description);
  of a workdir, its checkpoint `step` (`cli.workdir_step`; default the
  newest readable one)."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import gpt_import  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import task as gpt_task  # pylint: disable=g-import-not-at-top

  def from_args(args: dict):
    cfg = gpt.GPTConfig(**{k: args[k] for k in (
        "n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")})
    return cfg, ctx.boxed_shardings(lambda: gpt.abstract_params(cfg))[1]

  # Read with os and torch from a local disk, as trm.generate, trm.evaluate
  # and trm.export read theirs; a pod run's gs:// workdir was said not to
  # hold its config.json.
  if workdir and not checkpoint:
    weights_io.check_local(workdir, "--workdir", "trm.main workdirs are")
  if checkpoint:
    weights_io.check_local(checkpoint, "--checkpoint", "checkpoints are")
  if init_from.startswith("gpt2"):
    if not checkpoint:
      raise app.UsageError(
          f"--init_from={init_from} needs --checkpoint=DIR, a Hugging Face "
          f"directory of openai-community/{init_from} (config.json and "
          "model.safetensors).")
    params, args = gpt_import.load_hf_gpt2(checkpoint)
    check_finite(params, checkpoint)
    cfg, shardings = from_args(args)
    return (cfg, gpt_import.to_sharded(params, shardings, cfg.param_dtype),
            None, f"GPT-2 weights from {checkpoint}")
  if init_from != "resume":
    raise app.UsageError(f"--init_from={init_from!r} must be resume, gpt2, "
                         "gpt2-medium, gpt2-large or gpt2-xl.")
  if checkpoint:
    if os.path.isfile(os.path.join(checkpoint, "config.json")) and (
        os.path.isdir(os.path.join(checkpoint, "checkpoints"))):
      # Was "nanoGPT checkpoint DIR does not exist or is not a file".
      raise app.UsageError(
          f"--checkpoint={checkpoint} is a trm.main workdir, not nanoGPT's "
          f"ckpt.pt: pass --workdir={checkpoint} (and no --checkpoint).")
    params, args, extras = gpt_import.load_nanogpt_checkpoint(checkpoint)
    check_finite(params, checkpoint)
    cfg, shardings = from_args(args)
    dataset = (extras.get("config") or {}).get("dataset")
    return (cfg, gpt_import.to_sharded(params, shardings, cfg.param_dtype),
            os.path.join("data", dataset) if dataset else None,
            f"nanoGPT checkpoint {checkpoint}")
  if not workdir:
    raise app.UsageError("Pass --workdir (a trm.main run) or --checkpoint.")
  config = run_config(workdir)
  cfg = gpt.GPTConfig.from_config(config.model)
  cfg = dataclasses.replace(
      cfg, attention=attention_here(cfg.attention, ctx.platform))
  params, step = gpt_import.restore_run_params(workdir, cfg, ctx, step)
  try:
    data_dir = gpt_task.data_dir(config)
  except (TypeError, AttributeError, KeyError) as e:
    # A config.json edited by hand (data_root 5, data a number): a
    # TypeError's or AttributeError's traceback. --data_dir stands in.
    if _DATA_DIR.value if flags.FLAGS.is_parsed() else None:
      data_dir = None
    else:
      raise ValueError(
          f"{os.path.join(workdir, 'config.json')}: data_root, dataset and "
          f"data.source / data.tfds name no data directory ({e}); restore "
          "the file, or pass --data_dir=DIR with the meta.json of the data "
          "the model was trained on.") from None
  return (cfg, params, data_dir, f"{workdir} step {step}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # Before jax starts: --step=best or a step not on disk is one line.
  if _CHECKPOINT.value or _INIT_FROM.value != "resume":
    step = cli.workdir_step(_CHECKPOINT.value or "", _STEP.value,
                            "--checkpoint")
  else:
    step = cli.workdir_step(_WORKDIR.value or "", _STEP.value, "--workdir")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(jax)

  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top
  from trm.data.text import preparation  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top

  if _NUM_SAMPLES.value <= 0 or _MAX_NEW.value <= 0:
    raise app.UsageError("--num_samples and --max_new_tokens must be "
                         "positive.")
  # Checked before any weight is read; NaN passes `< 0` and would sample
  # token 0 every step.
  if not (math.isfinite(_TEMPERATURE.value) and _TEMPERATURE.value >= 0):
    raise app.UsageError(f"--temperature={_TEMPERATURE.value}: must be a "
                         "finite number >= 0 (0: greedy).")
  if _TOP_K.value < 0:
    raise app.UsageError(f"--top_k={_TOP_K.value}: must be >= 0 (0: all "
                         "tokens).")
  if _BATCH_SIZE.value < 0:
    raise app.UsageError(f"--batch_size={_BATCH_SIZE.value}: must be >= 0 "
                         "(0: all --num_samples at once).")
  # jax.random.key takes an int64: a larger seed ended the run after the
  # weights were read, with numpy's OverflowError traceback.
  if not -2**63 <= _SEED.value < 2**63:
    raise app.UsageError(f"--seed={_SEED.value}: must fit in 64 bits "
                         f"(from {-2**63} to {2**63 - 1}).")
  if _MAX_NEW.value >= MAX_TOKENS:  # the prompt has a token at least
    raise app.UsageError(f"--max_new_tokens={_MAX_NEW.value}: a sample "
                         f"holds at most {MAX_TOKENS} tokens, its prompt's "
                         "included (their positions are 32-bit).")
  # Read with os (meta.json, .bin, tokenizer.json): an object-store path
  # was "not a prepared text data set ... prepare it with --out_dir=gs://",
  # which sampling would not read either.
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  if _DATA_DIR.value:
    weights_io.check_local(_DATA_DIR.value, "--data_dir",
                           "data directories are")
  if _TOKENIZER.value == "":  # taken as unset: tiktoken's download
    raise app.UsageError("--tokenizer is given but empty: pass GPT-2's "
                         "tokenizer.json (or its directory), or leave it "
                         "out.")
  if _TOKENIZER.value:
    weights_io.check_local(_TOKENIZER.value, "--tokenizer",
                           "tokenizer files are")
  start = read_start(_START.value)
  # One device: a handful of samples gains nothing from splitting. On a pod
  # it is process 0's, which alone reads the tokens back and prints.
  ctx = mesh_lib.ShardingContext(
      mesh_lib.make_mesh(config_lib.mesh_config(data=1),
                         devices=jax.devices()[:1]),
      config_lib.default_logical_axis_rules())
  cfg, params, data_dir, source = load_model(
      _INIT_FROM.value, _WORKDIR.value, _CHECKPOINT.value, ctx, step)
  data_dir = _DATA_DIR.value or data_dir
  meta_source = "meta.json"  # named in errors about the vocabulary
  if data_dir and preparation.is_prepared(data_dir):
    # meta.json, or nanoGPT's meta.pkl (no file at all: GPT-2's BPE).
    meta = preparation.load_meta(data_dir)
    meta_source = os.path.join(data_dir, preparation.META_FILE)
  elif data_dir and os.path.isfile(os.path.join(data_dir, "metadata.json")):
    # A TFDS run: the builder's metadata holds meta.json's fields.
    meta_source = os.path.join(data_dir, "metadata.json")
    meta = preparation.resolve_tokenizer(preparation.read_meta_json(
        meta_source, "rebuild the data set, or pass --data_dir=DIR with the "
        "meta.json of the data the model was trained on"), data_dir)
  elif data_dir and os.path.isfile(
      os.path.join(data_dir, preparation.NANOGPT_META_FILE)):
    # nanoGPT's own data directory (a ckpt.pt's config.dataset), as its
    # sample.py reads it.
    meta = preparation.read_nanogpt_meta(
        os.path.join(data_dir, preparation.NANOGPT_META_FILE),
        "pass --data_dir=DIR with the meta.json of the data the model was "
        "trained on")
  else:
    if _DATA_DIR.value:
      preparation.load_meta(data_dir)  # the error that says what is missing
    data_dir = None  # errors then name GPT-2's BPE, not a meta.json
    own = (os.path.join(_CHECKPOINT.value, "tokenizer.json")
           if _INIT_FROM.value.startswith("gpt2") and _CHECKPOINT.value
           else "")
    if os.path.isfile(own) and not _TOKENIZER.value:
      # A Hugging Face GPT-2 download holds GPT-2's BPE (tiktoken's ids,
      # <|endoftext|> too), read offline; tiktoken fetches its files.
      print(f"No meta.json found, using {own}...", file=sys.stderr)
      meta = {"tokenizer": own}
    else:
      print("No meta.json found, assuming GPT-2 encodings...",
            file=sys.stderr)
      meta = {"tokenizer": "gpt2", "vocab_size": 50257}
  if _TOKENIZER.value:
    meta = {"tokenizer": gpt2_tokenizer_json(_TOKENIZER.value, meta)}
  codec = preparation.codec_from_meta(meta, meta_source)
  num_samples = _NUM_SAMPLES.value
  batch = min(_BATCH_SIZE.value or num_samples, num_samples)
  # Every row starts from the same prompt, so the last, partial batch is a
  # full one cut short: one compiled program serves every batch. The
  # program repeats the one row (a host-side batch of --num_samples=10**9
  # rows was a MemoryError traceback before the out-of-memory line below).
  prompt = np.asarray([encode_start(codec, start)], np.int32)
  if prompt.shape[1] == 0:
    raise app.UsageError("--start encodes to no tokens; give some text.")
  check_prompt_ids(prompt, cfg.vocab_size, codec, data_dir)
  if prompt.shape[1] + _MAX_NEW.value > MAX_TOKENS:
    raise app.UsageError(
        f"--start's {prompt.shape[1]} tokens and --max_new_tokens="
        f"{_MAX_NEW.value} make {prompt.shape[1] + _MAX_NEW.value} tokens a "
        f"sample; at most {MAX_TOKENS} (their positions are 32-bit).")
  if jax.process_index() == 0:
    print(f"weights: {source}", file=sys.stderr)

  model = gpt.GPT(cfg)
  top_k = _TOP_K.value or None
  # A vocabulary padded past the tokenizer's (nanoGPT's 50304 for GPT-2's
  # 50257): its extra ids cannot be decoded (tiktoken raised a KeyError
  # after the whole generation; nanoGPT's sample.py does), so none is drawn.
  limit = getattr(codec, "vocab_size", None)
  limit = limit if limit and limit < cfg.vocab_size else None
  generate = jax.jit(
      lambda params, prompt, rng: gpt.generate(
          model, params, jnp.broadcast_to(prompt, (batch, prompt.shape[1])),
          _MAX_NEW.value, rng,
          temperature=_TEMPERATURE.value, top_k=top_k, vocab_limit=limit))
  key = jax.random.key(_SEED.value)
  batches = -(-num_samples // batch)
  begin = time.time()
  compiled = None
  with ctx:
    for index in range(batches):
      # One batch draws with the seed's key itself (the samples of a run
      # without --batch_size); each of several its own key from it.
      rng = key if batches == 1 else jax.random.fold_in(key, index)
      try:
        if compiled is None:
          compiled = compile_sampler(
              generate, params, prompt, rng, batch, _MAX_NEW.value,
              cfg.vocab_size)
        tokens = compiled(params, prompt, rng)
        if jax.process_index() != 0:
          continue
        tokens = np.asarray(jax.device_get(tokens))
      except Exception as e:  # pylint: disable=broad-except
        if not cli.out_of_memory(e):
          raise
        # The trainer's line (config.global_batch_size, remat, ...) named
        # nothing this command takes.
        raise ValueError(
            f"out of memory drawing {batch} samples at once ("
            f"{' '.join(str(e).split())[:300]}): each holds a KV cache of "
            f"the whole {cfg.block_size}-token block and its "
            f"{_MAX_NEW.value} new tokens; pass a smaller --batch_size "
            "(samples drawn at once) or fewer --max_new_tokens.") from None
      for row in tokens[:num_samples - index * batch]:
        print(codec.decode(row.tolist()))
        print("---------------", flush=True)
  if jax.process_index() != 0:
    return
  seconds = time.time() - begin
  new = num_samples * _MAX_NEW.value
  print(f"device: {jax.devices()[0].device_kind}; {num_samples} "
        f"samples x {_MAX_NEW.value} tokens in {seconds:.2f} s including "
        f"compilation ({new / seconds:.0f} tokens/s)", file=sys.stderr)


# A stop signal exits 143 (SIGTERM) with this line: a script's
# `trm.sample ... > out.txt && next` must not go on with part of it.
STOPPED_LINE = ("{tool}: stopped by {name} before every sample was printed; "
                "it writes nothing else: run it again.")


if __name__ == "__main__":
  cli.run(main, stopped_line=STOPPED_LINE)
