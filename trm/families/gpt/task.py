"""GPT trained as nanoGPT trains it (`model.name='gpt'`, configs/gpt.py).

Data is a prepared nanoGPT dataset directory (`train.bin`, `val.bin`,
`meta.json`; `python -m trm.data.text.windows`), read as random windows like
nanoGPT's get_batch. `init_from` follows nanoGPT:
  scratch   new weights (a workdir that already holds checkpoints resumes,
            so a preempted run restarts with the same command)
  resume    the workdir's newest checkpoint, which must exist; or, with
            `init_checkpoint=.../ckpt.pt`, nanoGPT's run: its weights,
            AdamW state, iteration and best validation loss
  gpt2*     OpenAI's GPT-2 weights from a Hugging Face directory in
            `init_checkpoint`, or a Hub model id there
            ("openai-community/gpt2", downloaded; `trm.core.hub`)
Weights from a checkpoint decide the model's shapes, as in nanoGPT; the
config's values are overwritten (and so recorded in config.json), and a
smaller `block_size` crops the position table (nanoGPT's crop_block_size).
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from absl import logging
from etils import epath

from trm.core import config_lib
from trm.core import config_record
from trm.core import distributed
from trm.core import lm_state
from trm.core import loss_scale
from trm.core import optimizers
from trm.core import restore_check
from trm.core import weights_io
from trm.core.task import Task
from trm.data.text import preparation
from trm.data.text import tfds_source
from trm.data.text import windows as text
from trm.families.gpt import gpt_import
from trm.families.gpt import hf_gpt2_files
from trm.families.gpt import model as gpt
from trm.families.gpt import program as gpt_program
from trm.families.gpt import steps as gpt_steps

# config.num_epochs derives total_steps from the training data (`build`).
COUNTS_EPOCHS = True

INIT_FROM = ("scratch", "resume", "gpt2", "gpt2-medium", "gpt2-large",
             "gpt2-xl")
DTYPES = ("float32", "bfloat16", "float16")  # float16: with loss scaling
_SHAPE_KEYS = ("n_layer", "n_head", "n_embd", "bias")
SOURCES = ("bin", "tfds", "synthetic")  # config.data.source


def data_dir(config) -> str:
  """Where the dataset's vocabulary lives: data_root/<dataset> (meta.json),
  or the prepared TFDS version directory (metadata.json). (A run recorded
  before data.source existed read .bin files.)"""
  if config.data.get("source", "bin") == "tfds":
    return tfds_source.metadata(config.data.tfds)[1]
  return os.path.join(config.data_root, config.dataset)


def schedule_spans_run(config) -> bool:
  """nanoGPT's cosine spans lr_decay_iters, not the run; a warmup_ratio
  warms up over a share of config.total_steps, so then a resume may not
  lengthen the run silently (`trm.core.config_record`)."""
  return config.get("warmup_ratio", 0.0) > 0


def check_config(config) -> None:
  """nanoGPT's keys, checked before any data is read or compiled."""
  if config.data.source not in SOURCES:
    raise ValueError(f"config.data.source={config.data.source!r} must be one "
                     f"of {list(SOURCES)}.")
  dataset = config.dataset
  if (not isinstance(dataset, str) or not dataset.strip()
      or os.path.isabs(dataset)
      or ".." in dataset.replace("\\", "/").split("/")
      or os.path.normpath(dataset) == "."):
    # data_root/<dataset> is where the prepared files are written: empty
    # or "." wrote them into data_root itself, "../x" outside it.
    raise ValueError(
        f"config.dataset={dataset!r} must name a directory inside "
        f"config.data_root ({config.data_root!r}), such as "
        "'shakespeare_char': not empty, not absolute, no '..'.")
  if config.init_from not in INIT_FROM:
    raise ValueError(f"config.init_from={config.init_from!r} must be one of "
                     f"{list(INIT_FROM)}.")
  if config.init_from == "scratch" and config.init_checkpoint:
    # Would start from random weights, the named checkpoint unread.
    raise ValueError(
        f"config.init_checkpoint={config.init_checkpoint!r} is not read with "
        "config.init_from='scratch': set config.init_from='resume' (a "
        "nanoGPT ckpt.pt) or 'gpt2'... (a GPT-2 directory), or leave "
        "config.init_checkpoint empty.")
  if config.init_from.startswith("gpt2") and not config.init_checkpoint:
    raise ValueError(
        f"config.init_from={config.init_from!r} needs config.init_checkpoint"
        " = a directory with config.json and model.safetensors of OpenAI's "
        f"GPT-2 (e.g. `huggingface-cli download openai-community/"
        f"{config.init_from} --local-dir DIR`), or the Hub model id "
        f"openai-community/{config.init_from} to download it (needs network"
        " and huggingface_hub: pip install -e .[hub]).")
  if config.init_from != "scratch":
    # GPT-2 and nanoGPT weights: n_embd-wide attention, 4 * n_embd MLP.
    size = config.model.get
    for key, what, width, theirs, name in (
        ("head_size", "attention", size("head_size", 0) * config.n_head,
         config.n_embd, "n_embd"),
        ("mlp_size", "MLP", size("mlp_size", 0), 4 * config.n_embd,
         "4 * n_embd")):
      if size(key, 0) and width != theirs:
        raise ValueError(
            f"config.model.{key}={size(key)} makes the {what} {width} wide,"
            f" but config.init_from={config.init_from!r} loads GPT-2 / "
            f"nanoGPT weights whose {what} is {name} wide: set "
            f"config.model.{key}=0.")
    if size("n_kv_head", 0) and size("n_kv_head") != config.n_head:
      raise ValueError(
          f"config.model.n_kv_head={size('n_kv_head')} groups the keys and "
          f"values, but config.init_from={config.init_from!r} loads GPT-2 / "
          "nanoGPT weights with one key/value head per query head: set "
          "config.model.n_kv_head=0.")
  if config.dtype not in DTYPES:
    raise ValueError(f"config.dtype={config.dtype!r} must be one of "
                     f"{list(DTYPES)}.")
  optimizers.check(config.get("optimizer", "adamw"), "config.optimizer")
  optimizers.check_multipliers(config, "config")
  loss_scale.check_config(config)
  # nanoGPT's names first: the trainer's total_steps, eval_every,
  # checkpoint_every and log_every follow them.
  for key in ("max_iters", "eval_interval", "log_interval", "batch_size",
              "block_size", "gradient_accumulation_steps", "eval_iters",
              "n_layer", "n_head", "n_embd"):
    if config[key] <= 0:
      raise ValueError(f"config.{key}={config[key]} must be a positive "
                       "integer.")
  per_iteration = config.batch_size * config.gradient_accumulation_steps
  if config.global_batch_size != per_iteration:
    # The train step splits the batch into gradient_accumulation_steps
    # micro-batches of batch_size rows.
    raise ValueError(
        f"config.global_batch_size={config.global_batch_size} must be "
        f"config.batch_size x config.gradient_accumulation_steps = "
        f"{config.batch_size} x {config.gradient_accumulation_steps} = "
        f"{per_iteration}: set those two instead.")
  if not 0.0 <= config.dropout < 1.0:
    raise ValueError(f"config.dropout={config.dropout} must be in [0, 1).")
  # nanoGPT's get_lr runs both of these edges, and learning_rate_schedule
  # gives its values there (warmup then min_lr; a cosine that rises), so
  # they are said, not refused. (lr_decay_iters == warmup_iters divides by
  # zero in get_lr at that iteration; ours takes the cosine's start, the
  # peak rate, there.)
  warmup = config_lib.warmup_steps(config, config.total_steps,
                                   "warmup_iters")
  if config.decay_lr and config.lr_decay_iters < warmup:
    logging.warning(
        "config.lr_decay_iters=%d < %s=%d: the rate warms up over the first "
        "%d iterations, then is config.min_lr=%g (no cosine), as nanoGPT's "
        "get_lr.", config.lr_decay_iters,
        "the warmup (config.warmup_ratio)" if config.get("warmup_ratio", 0.0)
        else "config.warmup_iters", warmup, warmup, config.min_lr)
  # (A negative or NaN learning_rate is named itself, by run_checks.)
  if config.decay_lr and 0 <= config.learning_rate < config.min_lr:
    # Almost always a mistyped exponent (nanoGPT's rule of thumb is
    # learning_rate / 10), but nanoGPT trains it.
    logging.warning(
        "config.min_lr=%g > config.learning_rate=%g: the cosine rises from "
        "the learning rate to min_lr, as nanoGPT's get_lr does (nanoGPT "
        "uses about learning_rate / 10; config.decay_lr=False: a constant "
        "rate).", config.min_lr, config.learning_rate)
  # Then the model's own fields (config.model.*), before weights are read or
  # data prepared: GPTConfig alone would check them only after both.
  gpt_program.check_config(config)


def _load_weights(config, optimizer: bool):
  """(numpy params, their model args, what they are, extras) for init_from;
  extras is a nanoGPT checkpoint's (iter_num, best_val_loss and, with
  `optimizer`, AdamW's state), {} for GPT-2 weights. Params and AdamW's
  moments come in the model's layout (`_model_layout`)."""
  path = config.init_checkpoint
  if config.init_from.startswith("gpt2"):
    params, args = gpt_import.load_hf_gpt2(
        hf_gpt2_files.local_directory(path))
    weights_io.check_finite_tree(params, path)
    return (_model_layout(config, params, args), args,
            f"GPT-2 weights from {path}", {})
  params, args, extras = gpt_import.load_nanogpt_checkpoint(
      path, optimizer=optimizer)
  weights_io.check_finite_tree(params, path)
  if extras.get("adam") is not None:
    adam = extras["adam"]
    extras["adam"] = dict(adam, **{k: _model_layout(config, adam[k], args)
                                   for k in ("mu", "nu")})
  return (_model_layout(config, params, args), args,
          (f"nanoGPT checkpoint {path} (iter {extras.get('iter_num')}, best "
           f"val loss {extras.get('best_val_loss')})"), extras)


def _check_optimizer_takes(config, adam, source: str) -> None:
  """init_from='resume' goes on with a nanoGPT checkpoint's AdamW state
  (`adam`, None when it holds none), which only config.optimizer='adamw'
  can take up: another choice is one line (it would start afresh at that
  iteration and drop the moments without a word)."""
  optimizer = config.get("optimizer", "adamw")
  if adam is not None and optimizer != "adamw":
    raise ValueError(
        f"config.optimizer={optimizer!r} cannot take up the AdamW state of "
        f"{source}, which config.init_from='resume' continues: set "
        "config.optimizer='adamw' to continue that run.")


def _model_layout(config, tree, args: dict):
  """An imported tree (nanoGPT's per-layer h_0 .. h_{L-1}) stacked into
  one `h` when config.model.scan_layers; the checkpoint's n_layer wins, as
  for every shape (`_adopt_shapes`). (A config without the key predates
  it: unscanned.)"""
  if not config.model.get("scan_layers", False):
    return tree
  return gpt.stack_layers(tree, int(args["n_layer"]))


def _adopt_shapes(config, args: dict, source: str) -> None:
  """Sets the config's model shapes to the checkpoint's, as nanoGPT does,
  so config.json (and trm.sample) describe the model actually trained."""
  changed = {k: (config[k], args[k]) for k in _SHAPE_KEYS
             if config[k] != args[k]}
  with config.unlocked():
    for key, (_, value) in changed.items():
      config[key] = value
    config.model.vocab_size = args["vocab_size"]
    if config.block_size > args["block_size"]:
      changed["block_size"] = (config.block_size, args["block_size"])
      config.block_size = args["block_size"]
  if changed:
    logging.warning("Model shapes taken from %s: %s", source, ", ".join(
        f"{k} {old} -> {new}" for k, (old, new) in changed.items()))


def _check_block_size_kept(config, workdir: str, step: int) -> None:
  """A resume may not shorten the windows: its checkpoints' position table
  (and its AdamW moments) cannot be restored at another size, not even
  with allow_config_change. nanoGPT crops the table on resume
  (crop_block_size), but its AdamW state keeps the old shape and the first
  step fails; through its ckpt.pt both are cropped here (`build`)."""
  recorded = config_record.run_record(config, epath.Path(workdir),
                                      step).get("block_size")
  if isinstance(recorded, int) and config.block_size < recorded:
    raise ValueError(
        f"config.block_size={config.block_size} is smaller than the "
        f"{recorded} that the run in {workdir} was trained with: its "
        "checkpoints cannot be restored with a shorter position table (not "
        "even with config.allow_config_change). To train on with the table "
        "cropped, as nanoGPT's crop_block_size: `python -m trm.export "
        f"--config=CONFIG --checkpoint={workdir} --out=DIR --format=nanogpt`"
        ", then --config.init_from=resume --config.init_checkpoint=DIR/"
        f"ckpt.pt --config.block_size={config.block_size} with another "
        "--workdir (its weights and AdamW moments are cropped); or rerun "
        f"with --config.block_size={recorded}.")


def _crop_positions(params, block_size: int):
  """nanoGPT's crop_block_size: keep the first block_size positions."""
  params = dict(params)
  params["wpe"] = {"embedding": params["wpe"]["embedding"][:block_size]}
  return params


def _state_from_weights(params, tx, seed: int, param_dtype: str, scale,
                        ctx, shardings, adam=None, iter_num: int = 0):
  """A state around imported weights, placed on the mesh: at step 0 with a
  fresh AdamW, or with `adam` (a nanoGPT checkpoint's moments and count) at
  step `iter_num`, continuing that run."""
  sharded = gpt_import.to_sharded(params, shardings.params, dtype=param_dtype)
  state = lm_state.state_around_params(sharded, tx, seed, ctx,
                                       shardings, scale)
  if adam is None and not iter_num:
    return state
  if adam is not None:
    adam = dict(adam, **{k: gpt_import.to_sharded(adam[k], shardings.params,
                                                  dtype=param_dtype)
                         for k in ("mu", "nu")})
  state = state.replace(
      step=jnp.asarray(iter_num, jnp.int32),
      opt_state=gpt_steps.with_adam_state(state.opt_state, iter_num, adam))
  return jax.device_put(state, shardings)


def _token_streams(config):
  """(meta, its directory, [train, val] token streams) of config.data:
  a prepared .bin directory (prepared from data.input if need be), two
  TFDS splits, or two synthetic streams (nothing read)."""
  if config.data.source == "synthetic":
    # MaxText's dataset_type=synthetic: a pod's step benchmarked with no
    # data; nanoGPT's vocabulary unless the config sets one.
    vocab = config.model.vocab_size or preparation.NANOGPT_VOCAB
    logging.warning("config.data.source='synthetic': training on hashed "
                    "token ids (vocabulary %d), not text; the loss only "
                    "shows the step runs.", vocab)
    return ({"vocab_size": vocab}, "synthetic",
            [text.SyntheticTokens(vocab, split) for split in (0, 1)])
  if config.data.source == "tfds":
    tfds_config = config.data.tfds
    meta, directory = tfds_source.metadata(tfds_config)
    if "vocab_size" not in meta and not config.model.vocab_size:
      raise ValueError(
          f"config.data.tfds.name={tfds_config.name!r} records no "
          "vocab_size in its metadata (only trm_tiny_shakespeare does): set "
          "config.model.vocab_size.")
    return meta, directory, [tfds_source.TokenStream(tfds_config, "split"),
                             tfds_source.TokenStream(tfds_config,
                                                     "eval_split")]
  directory = data_dir(config)
  # Process 0 prepares; if that fails, every process stops with it (the
  # others waited for meta.json until the job's shutdown barrier gave up).
  meta = distributed.run_on_process_0(
      lambda: text.ensure_prepared(directory, config.data.input,
                                   config.data.tokenizer, process_index=0),
      f"preparing {directory}")
  if meta is None:  # another process: process 0 has prepared it
    meta = text.ensure_prepared(directory, config.data.input,
                                config.data.tokenizer)
  if meta.get("input"):
    with config.unlocked():
      # The text the data was prepared from, as config.json records it: a
      # rerun without --config.data.input (or with the config's default
      # URL) uses the prepared data and is the same run to the resume check.
      config.data.input = meta["input"]
  return meta, directory, [os.path.join(directory, text.TRAIN_FILE),
                           os.path.join(directory, text.VAL_FILE)]


def build(config, workdir: str, ctx) -> Task:
  check_config(config)
  checkpoints = os.path.join(workdir, "checkpoints")
  resuming = restore_check.latest_step(checkpoints) is not None
  if config.init_from == "resume" and not (resuming or config.init_checkpoint):
    raise ValueError(
        f"config.init_from='resume' but {checkpoints} holds no checkpoint: "
        "pass the --workdir of the run to resume, set config.init_checkpoint"
        " to a nanoGPT ckpt.pt, or use config.init_from='scratch'.")
  if config.init_from == "scratch" and resuming:
    logging.warning("config.init_from='scratch', but %s holds checkpoints: "
                    "resuming from the newest (use another --workdir for a "
                    "new run).", checkpoints)
  ctx.check_batch_size(config.batch_size, "batch_size")

  weights = None
  if config.init_checkpoint and config.init_from != "scratch":
    # The weights' shapes win, also when resuming: the resumed run's model
    # was built from them. A resumed GPT-2 run reads only config.json.
    if resuming and config.init_from.startswith("gpt2"):
      _adopt_shapes(config, gpt_import.hf_gpt2_model_args(
          hf_gpt2_files.local_directory(config.init_checkpoint)),
                    config.init_checkpoint)
    else:
      # AdamW's state only when the run starts from the file: a resumed run
      # restores its own (restore_latest never returns None over existing
      # checkpoints, so initial_state goes unused).
      weights = _load_weights(
          config, optimizer=config.init_from == "resume" and not resuming)
      _check_optimizer_takes(config, weights[3].get("adam"), weights[2])
      _adopt_shapes(config, weights[1], weights[2])
  if resuming:
    _check_block_size_kept(config, workdir,
                           restore_check.latest_step(checkpoints))

  meta, directory, streams = _token_streams(config)
  with config.unlocked():
    if not config.model.vocab_size:
      # A nanoGPT BPE directory: nanoGPT's 50304 (the data's ids are 50257).
      config.model.vocab_size = int(meta.get("model_vocab_size",
                                             meta["vocab_size"]))
  if config.model.vocab_size < meta.get("vocab_size", 0):
    raise ValueError(
        f"config.model.vocab_size={config.model.vocab_size} is smaller than "
        f"the vocabulary of {directory} ({meta['vocab_size']} tokens).")
  # Opened once: the id scan, the epoch count and the windows share each
  # file's header checks and memory map.
  streams = [text.TokenFile(s) if isinstance(s, str) else s for s in streams]
  # Before compiling: a damaged id deep in train.bin stopped the run at the
  # step whose random window first reached it.
  text.check_file_ids(streams, config.model.vocab_size)
  if config.get("num_epochs", 0):  # (synthetic streams have no length)
    # An epoch: as many tokens as the training split holds, in windows of
    # block_size (nanoGPT's tokens_per_iter = batch x block_size).
    tokens, window_tokens = (streams[0].num_tokens,
                             config.global_batch_size * config.block_size)
    config_lib.total_steps_from_epochs(
        config, tokens / window_tokens,
        f"{tokens} training tokens per epoch in batches of "
        f"{config.global_batch_size} x {config.block_size} tokens")
    if config.decay_lr and config.lr_decay_iters != config.total_steps:
      # nanoGPT's cosine spans lr_decay_iters, set apart from max_iters.
      logging.warning(
          "config.lr_decay_iters=%d is not the %d iterations of "
          "config.num_epochs=%g: the cosine reaches config.min_lr at "
          "iteration %d (nanoGPT sets lr_decay_iters ~= max_iters; set it "
          "to %d to span the run).", config.lr_decay_iters,
          config.total_steps, config.num_epochs, config.lr_decay_iters,
          config.total_steps)
  program = gpt_program.build(config, ctx)
  cfg = program.model.cfg

  process = dict(process_index=jax.process_index(),
                 process_count=jax.process_count())
  train_source = text.TokenWindows(
      streams[0], cfg.block_size, config.global_batch_size,
      config_lib.data_seed(config),
      num_batches=config.total_steps, vocab_size=cfg.vocab_size, **process)
  eval_source = text.EvalWindows(
      directory, cfg.block_size, config.data.eval_batch_size,
      config.eval_iters, config_lib.data_seed(config), streams=streams,
      vocab_size=cfg.vocab_size, **process)

  scale = loss_scale.initial_state(config)  # None unless float16
  initial_state, best_loss = None, None
  if weights is not None and not resuming:
    params, _, source, extras = weights
    crop = params["wpe"]["embedding"].shape[0] > cfg.block_size
    if crop:
      params = _crop_positions(params, cfg.block_size)
    resume = {}
    if config.init_from == "resume":
      # nanoGPT's init_from='resume': the run goes on from its iteration,
      # AdamW state and best validation loss.
      adam = extras.get("adam")
      if adam is None:
        logging.warning("%s holds no optimizer state: config.optimizer=%r "
                        "starts afresh at iteration %d.", source,
                        config.get("optimizer", "adamw"), extras["iter_num"])
      elif crop:
        adam = dict(adam, mu=_crop_positions(adam["mu"], cfg.block_size),
                    nu=_crop_positions(adam["nu"], cfg.block_size))
      resume = dict(adam=adam, iter_num=extras["iter_num"])
      best_loss = extras["best_val_loss"]
      logging.info("Continuing %s at iteration %d.", source,
                   extras["iter_num"])
    initial_state = functools.partial(_state_from_weights, params,
                                      gpt_steps.make_optimizer(config),
                                      config.seed, cfg.param_dtype, scale,
                                      **resume)

  logging.info("GPT: %.2fM parameters (non-embedding), %d tokens per "
               "iteration.", gpt.num_params(gpt.abstract_params(cfg),
                                            non_embedding=True) / 1e6,
               config.global_batch_size * cfg.block_size)
  return Task(program=program, train_source=train_source,
              eval_source=eval_source, initial_state=initial_state,
              initial_best_loss=best_loss)
