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

from trm.families.dream import steps as lm_steps
from trm.core import loss_scale
from trm.core import restore_check
from trm.data.text import tokenizer as tok_lib
from trm.data.text import sft
from trm.families.dream import model as dream
from trm.families.dream import hf_import
from trm.core.task import Task


def tokenizer_spec(config) -> str:
  spec = config.data.tokenizer or config.init_checkpoint
  if not spec:
    raise ValueError("No tokenizer: set config.data.tokenizer to a directory "
                     "holding tokenizer.json (or 'bytes'), or set "
                     "config.init_checkpoint.")
  return spec


def build(config, workdir: str, mesh, rules) -> Task:
  if config.loss_chunk_size <= 0:
    raise ValueError(f"config.loss_chunk_size={config.loss_chunk_size} must "
                     "be a positive integer.")
  cfg = dream.DreamConfig.from_config(config.model)
  scale = loss_scale.initial_state(config)  # None unless float16
  tokenizer = tok_lib.from_spec(tokenizer_spec(config), cfg)
  (train_tokens, train_maskable), (eval_tokens, eval_maskable) = (
      sft.train_and_eval_rows(config.data, tokenizer, config.seq_len))
  process = dict(process_index=jax.process_index(),
                 process_count=jax.process_count())
  train_source = sft.SFTBatches(
      train_tokens, train_maskable, global_batch_size=config.global_batch_size,
      seed=config.seed, num_batches=config.total_steps, **process)
  eval_source = sft.SFTEvalBatches(
      eval_tokens, eval_maskable,
      global_batch_size=config.data.eval_batch_size,
      max_batches=config.data.max_eval_batches, **process)
  batch_shardings = lm_steps.batch_shardings(mesh, rules)

  model = dream.Dream(cfg)
  tx = lm_steps.make_optimizer(config.optim, config.total_steps)
  initial_state = None
  if config.init_checkpoint:
    if restore_check.latest_step(os.path.join(workdir, "checkpoints")) is None:
      # A fresh run: check config.json and the tensor shapes now (no weights
      # read), before the loop creates checkpoints/ or compiles anything.
      # (A resumed run restores its own checkpoint instead.)
      hf_import.check_hf_checkpoint(config.init_checkpoint, cfg)
    initial_state = functools.partial(lm_steps.state_from_hf_checkpoint,
                                      config.init_checkpoint, model, tx,
                                      config.seed, loss_scale=scale)
  return Task(
      model=model, train_source=train_source, eval_source=eval_source,
      batch_shardings=batch_shardings,
      abstract_batch=lm_steps.abstract_batch(
          config.global_batch_size, config.seq_len, batch_shardings),
      init_fn=lm_steps.make_init_fn(model, tx, config.seed, scale),
      train_step=functools.partial(lm_steps.train_step, model=model, tx=tx,
                                   chunk_size=config.loss_chunk_size),
      eval_step=functools.partial(lm_steps.eval_step, model=model,
                                  seed=config.seed,
                                  chunk_size=config.loss_chunk_size),
      initial_state=initial_state)
