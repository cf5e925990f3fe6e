"""Tests for trm.families.trm.losses: the ACT loss head and its metrics."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from trm.core import metrics as metrics_lib
from trm.families.trm import losses
from trm.families.trm import model as trm

IGN = trm.IGNORE_LABEL_ID


def _np_stablemax_ce(logits, label):
  s = np.where(logits < 0, 1.0 / (1.0 - logits), logits + 1.0)
  return -math.log(s[label] / s.sum())


def _np_bce(x, y):
  return max(x, 0.0) - x * y + math.log1p(math.exp(-abs(x)))


def _one_hot_logits(preds, vocab=3, hi=2.0, lo=-1.0, jitter=0.0):
  preds = np.asarray(preds)
  logits = np.full(preds.shape + (vocab,), lo, np.float64)
  np.put_along_axis(logits, preds[..., None], hi, axis=-1)
  rng = np.random.default_rng(0)
  return logits + jitter * rng.normal(size=logits.shape)


# Four rows, four tokens, vocabulary 3.
LABELS = np.array([[1, 2, IGN, 0],       # fully correct, halted
                   [0, 0, 1, 1],         # wrong, not halted
                   [IGN, IGN, IGN, IGN],  # no labels, halted
                   [2, 1, 0, IGN]])      # 2 of 3 right, halted
PREDS = np.array([[1, 2, 0, 0],
                  [0, 1, 1, 2],
                  [0, 0, 0, 0],
                  [2, 0, 0, 1]])
INPUTS = np.array([[1, 0, 0, 0],         # blank: position 1 (3 is given)
                   [0, 0, 0, 0],
                   [1, 1, 1, 1],
                   [0, 0, 0, 1]])        # blanks: positions 0, 1
HALTED = np.array([True, False, True, True])
STEPS = np.array([3, 1, 2, 4])
Q_HALT = np.array([0.3, -1.2, 2.0, 0.5])


def _example():
  logits = _one_hot_logits(PREDS, jitter=0.3)
  carry = trm.Carry(
      z_H=jnp.zeros((4, 1, 1)), z_L=jnp.zeros((4, 1, 1)),
      steps=jnp.asarray(STEPS, jnp.int32), halted=jnp.asarray(HALTED),
      inputs=jnp.asarray(INPUTS, jnp.int32),
      labels=jnp.asarray(LABELS, jnp.int32),
      puzzle_identifiers=jnp.zeros((4,), jnp.int32))
  outputs = {"logits": jnp.asarray(logits, jnp.float32),
             "q_halt_logits": jnp.asarray(Q_HALT, jnp.float32),
             "q_continue_logits": jnp.zeros((4,), jnp.float32)}
  return logits, carry, outputs


def _expected():
  """Upstream's numbers by hand (float64)."""
  logits, _, _ = _example()
  logits = np.asarray(np.float32(logits), np.float64)
  row_lm, seq_correct, token_acc = [], [], []
  for b in range(4):
    valid = [t for t in range(4) if LABELS[b, t] != IGN]
    ce = sum(_np_stablemax_ce(logits[b, t], LABELS[b, t]) for t in valid)
    row_lm.append(ce / max(len(valid), 1))
    right = sum(PREDS[b, t] == LABELS[b, t] for t in valid)
    seq_correct.append(right == len(valid))
    token_acc.append(right / max(len(valid), 1))
  row_q = [_np_bce(Q_HALT[b], float(seq_correct[b])) for b in range(4)]
  return np.array(row_lm), np.array(seq_correct), np.array(token_acc), \
      np.array(row_q)


def test_expected_example_is_what_the_test_says():
  _, seq_correct, token_acc, _ = _expected()
  # Row 2 has no labels: "all correct" vacuously, but it is never counted.
  np.testing.assert_array_equal(seq_correct, [True, False, True, False])
  np.testing.assert_allclose(token_acc, [1.0, 0.5, 0.0, 2 / 3])


def test_act_loss_train():
  _, carry, outputs = _example()
  loss, metrics = losses.act_loss(outputs, carry, train=True)
  row_lm, _, _, row_q = _expected()
  want = row_lm.sum() + 0.5 * row_q.sum()  # all rows, halted or not
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  values = metrics_lib.compute(metrics)
  # Losses are normalised by the batch (4 rows); the rest by the 2 valid
  # rows: halted with labels (rows 0 and 3).
  np.testing.assert_allclose(values["loss"], want / 4, rtol=1e-5)
  np.testing.assert_allclose(values["lm_loss"], row_lm.sum() / 4, rtol=1e-5)
  np.testing.assert_allclose(values["q_halt_loss"], row_q.sum() / 4,
                             rtol=1e-5)
  assert int(metrics["loss"].count) == 4
  assert int(metrics["accuracy"].count) == 2
  np.testing.assert_allclose(values["accuracy"], (1.0 + 2 / 3) / 2, rtol=1e-6)
  np.testing.assert_allclose(values["exact_accuracy"], 0.5)
  # Row 0: q 0.3 >= 0 and correct (right); row 3: q 0.5 >= 0, wrong.
  np.testing.assert_allclose(values["q_halt_accuracy"], 0.5)
  np.testing.assert_allclose(values["steps"], (3 + 4) / 2)
  # Cells to fill (input != label) among valid rows: row 0 t=1 (right);
  # row 3 t=0 (right), t=1 (wrong). Row 1 is not halted: not counted.
  assert int(metrics["blank_accuracy"].count) == 3
  np.testing.assert_allclose(values["blank_accuracy"], 2 / 3, rtol=1e-6)


def test_act_loss_eval_normalises_by_valid_rows():
  _, carry, outputs = _example()
  loss, metrics = losses.act_loss(outputs, carry, train=False)
  row_lm, _, _, row_q = _expected()
  np.testing.assert_allclose(float(loss), row_lm.sum() + 0.5 * row_q.sum(),
                             rtol=1e-5)
  values = metrics_lib.compute(metrics)
  valid = [0, 3]
  np.testing.assert_allclose(values["lm_loss"], row_lm[valid].sum() / 2,
                             rtol=1e-5)
  np.testing.assert_allclose(values["q_halt_loss"], row_q[valid].sum() / 2,
                             rtol=1e-5)
  np.testing.assert_allclose(values["exact_accuracy"], 0.5)
  np.testing.assert_allclose(values["accuracy"], (1.0 + 2 / 3) / 2, rtol=1e-6)


@pytest.mark.parametrize("train", [True, False])
def test_loss_metric_is_lm_plus_half_q(train):
  """The reported loss is lm_loss + 0.5 * q_halt_loss over the same rows."""
  _, carry, outputs = _example()
  _, metrics = losses.act_loss(outputs, carry, train=train)
  values = metrics_lib.compute(metrics)
  np.testing.assert_allclose(
      values["loss"], values["lm_loss"] + 0.5 * values["q_halt_loss"],
      rtol=1e-5)


def test_lm_loss_is_per_row_mean_then_sum():
  """Doubling a row's label count must not double its weight."""
  vocab = 3
  labels = np.array([[1, IGN, IGN, IGN], [1, 1, 1, 1]])
  logits = np.zeros((2, 4, vocab))
  logits[..., 1] = 0.5
  carry = trm.Carry(
      z_H=jnp.zeros((2, 1, 1)), z_L=jnp.zeros((2, 1, 1)),
      steps=jnp.ones((2,), jnp.int32), halted=jnp.ones((2,), bool),
      inputs=jnp.zeros((2, 4), jnp.int32), labels=jnp.asarray(labels),
      puzzle_identifiers=jnp.zeros((2,), jnp.int32))
  outputs = {"logits": jnp.asarray(logits, jnp.float32),
             "q_halt_logits": jnp.zeros((2,)),
             "q_continue_logits": jnp.zeros((2,))}
  loss, metrics = losses.act_loss(outputs, carry, train=True)
  ce = _np_stablemax_ce(logits[0, 0], 1)
  bce = _np_bce(0.0, 1.0)  # both rows predict 1 everywhere: all correct
  np.testing.assert_allclose(float(loss), 2 * ce + 0.5 * 2 * bce, rtol=1e-5)
  np.testing.assert_allclose(float(metrics["lm_loss"].total), 2 * ce,
                             rtol=1e-5)


def test_nothing_halted_leaves_accuracy_metrics_out():
  _, carry, outputs = _example()
  carry = carry.replace(halted=jnp.zeros((4,), bool))
  loss, metrics = losses.act_loss(outputs, carry, train=True)
  row_lm, _, _, row_q = _expected()
  # The loss still covers every row.
  np.testing.assert_allclose(float(loss), row_lm.sum() + 0.5 * row_q.sum(),
                             rtol=1e-5)
  values = metrics_lib.compute(metrics)
  assert set(values) == {"loss", "lm_loss", "q_halt_loss"}
  _, eval_metrics = losses.act_loss(outputs, carry, train=False)
  assert metrics_lib.compute(eval_metrics) == {}


def test_merge_and_compute():
  _, carry, outputs = _example()
  _, a = losses.act_loss(outputs, carry, train=True)
  # Second step: every row halted and correct, q all positive.
  labels = np.where(LABELS == IGN, IGN, PREDS)
  carry_b = carry.replace(halted=jnp.ones((4,), bool),
                          labels=jnp.asarray(labels, jnp.int32))
  _, b = losses.act_loss(outputs, carry_b, train=True)
  assert metrics_lib.merge(None, a) is a
  merged = metrics_lib.merge(a, b)
  assert set(merged) == set(a)
  values = metrics_lib.compute(merged)
  # a: 2 valid rows, 1 exact; b: 3 valid rows (row 2 has no labels), 3 exact.
  assert int(merged["exact_accuracy"].count) == 5
  np.testing.assert_allclose(values["exact_accuracy"], 4 / 5)
  np.testing.assert_allclose(values["steps"], (3 + 4 + 3 + 1 + 4) / 5)
  va, vb = metrics_lib.compute(a), metrics_lib.compute(b)
  np.testing.assert_allclose(values["loss"], (va["loss"] + vb["loss"]) / 2,
                             rtol=1e-6)
  assert all(isinstance(v, float) for v in values.values())


@pytest.mark.parametrize("train", [True, False])
def test_metric_types(train):
  _, carry, outputs = _example()
  _, metrics = losses.act_loss(outputs, carry, train=train)
  assert set(metrics) == {"loss", "lm_loss", "q_halt_loss", "accuracy",
                          "exact_accuracy", "q_halt_accuracy", "steps",
                          "blank_accuracy"}
  for m in metrics.values():
    assert m.total.dtype == jnp.float32 and m.count.dtype == jnp.int32
