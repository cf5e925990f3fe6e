"""TRM's ACT loss head (upstream `models/losses.py::ACTLossHead`) and metrics.

loss = sum_b mean_t CE(b, t) + 0.5 * sum_b BCE(q_halt_b, row b fully correct)

CE is stablemax cross-entropy averaged over each row's supervised tokens, then
summed over the batch; the caller divides by the global batch size. Metrics
are `clu.metrics.Average`s over the rows that halted this step (as upstream),
so accumulating them over steps with `merge` gives upstream's normalisation.
"""
from __future__ import annotations

import jax.numpy as jnp
import optax
from clu import metrics as clu_metrics

from trm.families.trm.model import IGNORE_LABEL_ID
from trm.families.trm.stablemax import stablemax_cross_entropy


def _average(total, count) -> clu_metrics.Average:
  return clu_metrics.Average(total=jnp.asarray(total, jnp.float32),
                             count=jnp.asarray(count, jnp.int32))


def act_loss(outputs, carry, *, train: bool):
  """Returns (summed loss, metrics) for one ACT step.

  `carry` is the carry after the step: its labels are those of the data each
  row actually worked on, its `halted`/`steps` decide which rows count.
  In training the losses are averaged over all rows (upstream divides them
  by the global batch size); in evaluation over the halted rows.
  """
  labels, logits = carry.labels, outputs["logits"]
  q_halt = outputs["q_halt_logits"]
  mask = labels != IGNORE_LABEL_ID
  loss_counts = mask.sum(-1)
  divisor = jnp.maximum(loss_counts, 1).astype(jnp.float32)

  preds = jnp.argmax(logits, axis=-1)
  is_correct = mask & (preds == labels)
  seq_correct = is_correct.sum(-1) == loss_counts
  valid = carry.halted & (loss_counts > 0)
  num_valid = valid.sum()

  token_loss = stablemax_cross_entropy(logits, labels,
                                       ignore_index=IGNORE_LABEL_ID)
  row_lm_loss = (token_loss / divisor[:, None]).sum(-1)
  row_q_loss = optax.sigmoid_binary_cross_entropy(
      q_halt, seq_correct.astype(jnp.float32))
  loss = row_lm_loss.sum() + 0.5 * row_q_loss.sum()

  # The cells a solver has to fill: supervised positions whose input token
  # differs from the answer (Sudoku blanks, maze path cells).
  to_fill = mask & (carry.inputs != labels) & valid[:, None]
  rows = labels.shape[0]
  loss_count = rows if train else num_valid
  metrics = {
      "loss": _average(loss if train else jnp.where(
          valid, row_lm_loss + 0.5 * row_q_loss, 0).sum(), loss_count),
      "lm_loss": _average(row_lm_loss.sum() if train
                          else jnp.where(valid, row_lm_loss, 0).sum(),
                          loss_count),
      "q_halt_loss": _average(row_q_loss.sum() if train
                              else jnp.where(valid, row_q_loss, 0).sum(),
                              loss_count),
      "accuracy": _average(
          jnp.where(valid, is_correct.sum(-1) / divisor, 0).sum(), num_valid),
      "exact_accuracy": _average((valid & seq_correct).sum(), num_valid),
      "q_halt_accuracy": _average(
          (valid & ((q_halt >= 0) == seq_correct)).sum(), num_valid),
      "steps": _average(jnp.where(valid, carry.steps, 0).sum(), num_valid),
      "blank_accuracy": _average((is_correct & to_fill).sum(), to_fill.sum()),
  }
  return loss, metrics
