"""Masked-diffusion fine-tuning of DiffuCoder / Dream (`model.name='dream'`).

Data is prompt/response JSONL or packed code files (`trm.data.text.sft`),
tokenized with the checkpoint's tokenizer.json (or bytes, for the tiny
model). A run starts from `config.init_checkpoint` (a Hugging Face
directory, read slice by slice onto the mesh) or from random weights, and
evaluates the held-out diffusion loss.
"""
from __future__ import annotations

import functools
import os

import jax
from absl import logging

from trm.families.dream import steps as lm_steps
from trm.core import accumulation
from trm.core import config_lib
from trm.core import loss_scale
from trm.core import optimizers
from trm.core import restore_check
from trm.core import weights_io
from trm.data.text import tokenizer as tok_lib
from trm.data.text import sft
from trm.families.dream import model as dream
from trm.families.dream import hf_import
from trm.families.dream import inference
from trm.families.dream import program as dream_program
from trm.core.task import Task

# config.num_epochs derives total_steps from the training data (`build`).
COUNTS_EPOCHS = True


# How a download's errors name the field (`inference.resolve_checkpoint`).
INIT_NAMES = inference.ArgumentNames(path="config.init_checkpoint")


def init_directory(config, weights: bool = True) -> str:
  """config.init_checkpoint as a local directory: itself, or, when no such
  path exists and it reads 'org/name', that Hugging Face Hub repository
  downloaded once into the Hub cache (the cached copy offline), as
  `DiffusionLM.from_pretrained` and GPT's init_from='gpt2' take one; its
  tokenizer files only unless `weights`."""
  weights_io.check_local(config.init_checkpoint, INIT_NAMES.path)
  return inference.fetch_hub_id(
      config.init_checkpoint, INIT_NAMES,
      files=(inference.HUB_FILES if weights
             else inference.TOKENIZER_HUB_FILES))


def tokenizer_spec(config, init: str | None = None) -> str:
  """config.data.tokenizer, else the init checkpoint's directory (`init`,
  from `init_directory`; config.init_checkpoint itself by default)."""
  spec = config.data.tokenizer or (config.init_checkpoint if init is None
                                   else init)
  if not spec:
    raise ValueError("No tokenizer: set config.data.tokenizer to a directory "
                     "holding tokenizer.json (or 'bytes'), or set "
                     "config.init_checkpoint.")
  return spec


def check_config(config) -> None:
  dream_program.check_config(config)
  optimizers.check(config.optim.get("optimizer", "adamw"),
                   "config.optim.optimizer")
  optimizers.check_multipliers(config.optim, "config.optim")


def schedule_spans_run(config) -> bool:
  """The cosine decays to 10% at config.total_steps
  (`steps.make_optimizer`), so a resume may not lengthen the run silently
  (`trm.core.config_record`)."""
  del config
  return True


def accumulation_keeps_the_step(config) -> bool:
  """Micro-batches train on the whole batch's noise, each divided by the
  whole batch's masked count (`steps.train_step`): a resume that only
  splits config.global_batch_size otherwise is the same step (the same
  sum, added in another order), so it needs no allow_config_change
  (`trm.core.config_record`)."""
  del config
  return True


def _sources(config, cfg: dream.DreamConfig, init: str):
  """(training batches, held-out batches) of config.data: rows of the
  tokenized files or TFDS splits, or synthetic rows (no tokenizer or data
  read)."""
  process = dict(process_index=jax.process_index(),
                 process_count=jax.process_count())
  if sft.check_source(config.data) == "synthetic":
    # MaxText's dataset_type=synthetic: a pod's step timed with no data.
    logging.warning("config.data.source='synthetic': training on hashed "
                    "token ids (vocabulary %d), not text; the loss only "
                    "shows the step runs.", cfg.vocab_size)
    shape = dict(seq_len=config.seq_len, vocab_size=cfg.vocab_size,
                 mask_token_id=cfg.mask_token_id)
    train_source = sft.SyntheticBatches(
        global_batch_size=config.global_batch_size,
        num_batches=config.total_steps, **shape, **process)
    # The held-out rows: data.eval_rows rows of another stream.
    eval_source = sft.SyntheticEvalBatches(
        config.data.eval_rows, global_batch_size=config.data.eval_batch_size,
        max_batches=config.data.max_eval_batches, **shape, **process)
    return train_source, eval_source
  # trm.main has no --checkpoint: a missing tokenizer.json names the field.
  tokenizer = tok_lib.from_spec(tokenizer_spec(config, init), cfg,
                                "config.data.tokenizer")
  (train_tokens, train_maskable), (eval_tokens, eval_maskable) = (
      sft.train_and_eval_rows(config.data, tokenizer, config.seq_len))
  train_from, held_from, more_held = sft.row_sources(config.data)
  # An epoch is SFTBatches' (as the Hugging Face Trainer's with
  # dataloader_drop_last): the full batches of one pass over the rows.
  config_lib.total_steps_from_epochs(
      config, len(train_tokens) // config.global_batch_size,
      f"{len(train_tokens) // config.global_batch_size} full batches of "
      f"{config.global_batch_size} per epoch of {len(train_tokens)} "
      "training rows")
  train_source = sft.SFTBatches(
      train_tokens, train_maskable, global_batch_size=config.global_batch_size,
      seed=config_lib.data_seed(config), num_batches=config.total_steps,
      source=train_from,
      **process)
  eval_source = sft.SFTEvalBatches(
      eval_tokens, eval_maskable,
      global_batch_size=config.data.eval_batch_size,
      max_batches=config.data.max_eval_batches, source=held_from,
      more=more_held, **process)
  return train_source, eval_source


def build(config, workdir: str, ctx) -> Task:
  check_config(config)
  cfg = dream.DreamConfig.from_config(config.model)
  # Before any checkpoint or data is read (`program.build` checks it again
  # for trm.aot).
  dream_program.check_heads_fit(cfg, ctx)
  accumulation.check_micro_batch(config, ctx)
  fresh = restore_check.latest_step(os.path.join(workdir,
                                                 "checkpoints")) is None
  # A resumed run restores its own weights: at most the tokenizer is read.
  init = (init_directory(config, weights=fresh)
          if fresh or not config.data.tokenizer else config.init_checkpoint)
  if init and fresh:
    # A fresh run: config.json and the tensor shapes checked now (no
    # weights read), before any data is read, checkpoints/ is created or
    # anything compiles. (A resumed run restores its own checkpoint.)
    if not os.path.isdir(init):
      raise ValueError(
          f"config.init_checkpoint={config.init_checkpoint!r} is no "
          "directory: pass a Hugging Face DiffuCoder/Dream download "
          "(config.json and model*.safetensors), or '' for random weights.")
    hf_import.check_hf_checkpoint(init, cfg)
  scale = loss_scale.initial_state(config)  # None unless float16
  train_source, eval_source = _sources(config, cfg, init)
  program = dream_program.build(config, ctx)
  initial_state = None
  if config.init_checkpoint:
    initial_state = functools.partial(
        lm_steps.state_from_hf_checkpoint, init,
        program.model, lm_steps.make_optimizer(config.optim,
                                               config.total_steps),
        config.seed, loss_scale=scale)
  return Task(program=program, train_source=train_source,
              eval_source=eval_source, initial_state=initial_state)
