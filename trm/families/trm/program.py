"""What to compile for TRM: model, state, ACT train/eval steps, batch spec.

The model's vocabulary, sequence length and puzzle-embedding rows come from
the dataset (`shapes`, a `PuzzleDatasetMetadata`), as upstream injects them;
`trm.aot` gets them from the builder modules without reading data
(`data_shapes`).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib

import numpy as np

from trm.core import config_lib
from trm.core import mesh as mesh_lib
from trm.core.task import BatchField, Program
from trm.families.trm import model as trm_model
from trm.families.trm import state as trm_state
from trm.families.trm import steps

DISPLAY_NAME = "TRM (puzzle)"
# Dataset builders (modules of trm/data/puzzles/) a config can name.
BUILDERS = ("sudoku", "maze", "arc")


def owns_state(paths) -> bool:
  """A TRM train state carries the ACT carry and the EMA weights."""
  fields = {p.split("/")[0] for p in paths}
  return bool({"carry", "puzzle_emb", "ema_params"} & fields)


def batch_spec(seq_len: int) -> dict:
  rows = (mesh_lib.BATCH, None)
  return {"inputs": BatchField((seq_len,), np.int32, rows),
          "labels": BatchField((seq_len,), np.int32, rows),
          "puzzle_identifiers": BatchField((), np.int32, (mesh_lib.BATCH,))}


def attention_heads(model_config) -> dict[str, int]:
  """The heads `trm.families.warn_if_heads_unsplit` checks against the
  mesh (keys and values have as many); an MLP-t model has no attention."""
  if model_config.get("mlp_t", False):
    return {}
  return {"num_heads": int(model_config.num_heads)}


def make_model(model_config, shapes, unroll_loops: bool = False):
  kwargs = config_lib.model_kwargs(model_config, trm_model.TRMConfig, "trm")
  if unroll_loops:
    kwargs["unroll_loops"] = True
  return trm_model.TRM(trm_model.TRMConfig(
      vocab_size=shapes.vocab_size, seq_len=shapes.seq_len,
      num_puzzle_identifiers=shapes.num_puzzle_identifiers, **kwargs))


def _eval_step(state, batch, *, model, use_ema: bool):
  metrics, predictions, q_halt_logits = steps.eval_step(
      state, batch, model=model, use_ema=use_ema)
  return metrics, {"predictions": predictions, "q_halt_logits": q_halt_logits}


def build(config, ctx, shapes, unroll_loops: bool = False) -> Program:
  """`unroll_loops`: the recursion Python-unrolled, for cost analysis."""
  del ctx  # TRM's layers place themselves by logical names
  model = make_model(config.model, shapes, unroll_loops)
  tx = steps.make_optimizer(config.optim, config.total_steps)
  batch = config.global_batch_size
  return Program(
      model=model,
      init_fn=trm_state.make_init_fn(model, tx, batch, config.seed),
      train_step=functools.partial(
          steps.train_step, model=model, tx=tx, optim_config=config.optim,
          total_steps=config.total_steps, global_batch_size=batch,
          reduce_once=config.get("reduce_gradients_once", True)),
      eval_step=functools.partial(_eval_step, model=model,
                                  use_ema=config.optim.ema),
      batch_spec=batch_spec(shapes.seq_len),
      flops_per_step=trm_model.train_flops_per_example(model.cfg) * batch,
      # The matmuls run in forward_dtype: MFU divides by that dtype's peak
      # (left at Program's float32, a bf16 run on an H100 was divided by
      # 67 TFLOP/s instead of 989 and its MFU read 14.8x high).
      compute_dtype=model.cfg.forward_dtype,
      cost_twin=None if unroll_loops else functools.partial(
          build, config, None, shapes, unroll_loops=True))


def data_shapes(config, overrides: dict):
  """The dataset's shapes from its builder, without reading it (aot);
  `overrides` (seq_len, vocab_size, num_puzzle_identifiers) win."""
  if config.data.name not in BUILDERS:
    raise ValueError(f"config.data.name={config.data.name!r}: no known shapes;"
                     f" known: {', '.join(map(repr, BUILDERS))}.")
  builder = importlib.import_module(f"trm.data.puzzles.{config.data.name}")
  build = config.data.build
  if config.data.name == "arc":
    # Upstream's data include ConceptARC (the kaggle source's default).
    metadata = builder.dataset_metadata(
        build.version, build.num_aug,
        concept=build.source == "kaggle" or bool(build.concept_dir))
  else:
    metadata = builder.dataset_metadata(1)
  return dataclasses.replace(
      metadata, **{k: v for k, v in overrides.items() if v is not None})
