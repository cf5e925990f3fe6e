"""ARC evaluator: cropping, inverse augmentation, voting, pass@K, submission."""
import json
import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from trm.families.trm import arc_canvas
from trm.families.trm import arc_eval
from trm.data.puzzles import dihedral
import workers as workers_lib
import repo

ROOT = repo.ROOT

# ----------------------------------------------------------------------------
# A hand-made dataset: 4 puzzles, 5 test inputs.

A = [[1, 2, 0], [0, 3, 4]]  # p1 test input (2x3, non-symmetric)
Y = [[5, 6], [7, 8], [9, 1]]  # p1 answer
W1 = [[5, 6], [7, 8], [9, 2]]
W2 = [[1]]
B = [[1, 1], [2, 3]]  # p2 test inputs
C = [[4, 0, 0], [0, 5, 6], [7, 0, 8]]
Z = [[3, 2], [1, 1]]
W3 = [[3, 2], [1, 2]]
V = [[0, 1, 2, 3]]
W4 = [[0, 1, 2, 4]]
W5 = [[0], [1], [2], [3]]
D = [[6, 7]]  # p3 test input: never predicted
E = [[2], [9]]  # p4 test input
F = [[9, 2]]

IDENTIFIERS = [
    "<blank>",
    "p1", "p1|||t1|||0321456789", "p1|||t6|||0987654321",
    "p1|||t3|||0123456798", "p1|||t7|||0234567891", "p1|||t5|||0123456789",
    "p1|||t4|||0912345678",
    "p2", "p2|||t2|||0564738291", "p2|||t7|||0192837465",
    "p3",
    "p4",
    "train_only|||t1|||0123456789",
]
TEST_PUZZLES = {
    "p1": {"train": [{"input": [[1]], "output": [[2]]}],
           "test": [{"input": A, "output": Y}]},
    "p2": {"train": [{"input": [[3]], "output": [[4]]}],
           "test": [{"input": B, "output": Z}, {"input": C, "output": V}]},
    "p3": {"train": [], "test": [{"input": D, "output": [[1]]}]},
    "p4": {"train": [], "test": [{"input": E, "output": F}]},
}
NOT_A_GRID_CANVAS = np.full(900, 7, np.uint8)  # no EOS: a 30x30 grid of 5s
EMPTY_CANVAS = np.zeros(900, np.uint8)  # starts with PAD: the 0x0 grid


def _aug_canvas(grid, identifier):
  _, tid, color_map = arc_canvas.parse_name(IDENTIFIERS[identifier])
  return arc_canvas.to_canvas(arc_canvas.augment(np.array(grid), tid,
                                                 color_map))


# (identifier, original test input, predicted answer in the original frame,
# q_halt logit). Raw canvases (already augmented) are given as arrays.
ROWS = [
    # p1 / A: Y and W1 both get 2 votes; Y has the higher mean q. W2 has one
    # vote with the highest q; the garbage predictions one vote each.
    (1, A, W1, 0.0),
    (2, A, Y, 2.0),
    (3, A, W1, -1.0),
    (4, A, Y, -3.0),
    (5, A, W2, 5.0),
    (6, A, NOT_A_GRID_CANVAS, -4.0),
    (7, A, EMPTY_CANVAS, -5.0),
    # p2 / B: W3 has 3 votes, Z 2 -> Z second.
    (8, B, W3, -2.0),
    (9, B, W3, -2.0),
    (10, B, W3, -2.0),
    (9, B, Z, 3.0),
    (10, B, Z, 3.0),
    # p2 / C: one vote each; q: W4 > W5 > V -> V third.
    (8, C, W4, 1.0),
    (9, C, W5, 0.5),
    (10, C, V, 0.0),
    # p4 / E: one correct prediction.
    (12, E, F, 0.0),
    # Unmatched: an input that is no test input of p1, and a puzzle that
    # has no test inputs at all.
    (2, B, Y, 9.0),
    (13, A, Y, 9.0),
]
PASS = {1: (1 + 0 + 0 + 1) / 4, 2: (1 + 0.5 + 0 + 1) / 4,
        5: (1 + 1 + 0 + 1) / 4, 10: 0.75, 100: 0.75, 1000: 0.75}


def _rows(num_blank: int = 3):
  """(ids, inputs, predictions, q logits) of ROWS plus blank padding rows."""
  ids, inputs, preds, qs = [], [], [], []
  for identifier, inp, out, q in ROWS:
    ids.append(identifier)
    inputs.append(_aug_canvas(inp, identifier))
    preds.append(out if isinstance(out, np.ndarray)
                 else _aug_canvas(out, identifier))
    qs.append(q)
  rng = np.random.default_rng(0)
  for _ in range(num_blank):  # Padding: blank id, garbage tokens.
    ids.append(0)
    inputs.append(rng.integers(0, 12, 900, dtype=np.uint8))
    preds.append(rng.integers(0, 12, 900, dtype=np.uint8))
    qs.append(100.0)
  return (np.array(ids, np.int32), np.stack(inputs), np.stack(preds),
          np.array(qs, np.float32))


@pytest.fixture
def data_dir(tmp_path):
  path = tmp_path / "arc"
  path.mkdir()
  (path / "identifiers.json").write_text(json.dumps(IDENTIFIERS))
  (path / "test_puzzles.json").write_text(json.dumps(TEST_PUZZLES))
  return str(path)


def _expected_submission():
  return {
      "p1": [{"attempt_1": Y, "attempt_2": W1}],
      "p2": [{"attempt_1": W3, "attempt_2": Z},
             {"attempt_1": W4, "attempt_2": W5}],
      "p3": [{"attempt_1": [[0]], "attempt_2": [[0]]}],
      "p4": [{"attempt_1": F, "attempt_2": F}],
  }


def _check_metrics(metrics):
  for k, value in PASS.items():
    assert metrics[f"ARC/pass@{k}"] == pytest.approx(value, abs=1e-12), k
  assert metrics["ARC/num_puzzles"] == 4
  assert metrics["ARC/num_test_inputs"] == 5
  assert metrics["ARC/num_answered"] == 4
  assert metrics["ARC/num_predictions"] == len(ROWS) - 2
  assert metrics["ARC/num_unmatched"] == 2


# ----------------------------------------------------------------------------
# Grids and names.


def _reference_crop_size(canvas):
  """Straightforward transcription of the cropping rule."""
  g = np.asarray(canvas).reshape(30, 30)
  best, size, width = 0, (0, 0), 30
  for r in range(1, 31):
    for c in range(width):
      if not 2 <= g[r - 1, c] <= 11:
        width = c
        break
    if r * width > best:
      best, size = r * width, (r, width)
  return size


def test_crop_hand_made_canvases():
  grid = np.array([[0, 1, 2], [3, 4, 5]])
  np.testing.assert_array_equal(arc_canvas.crop(arc_canvas.to_canvas(grid)),
                                grid)
  # No EOS anywhere: the whole canvas; PAD first: nothing.
  assert arc_canvas.crop(NOT_A_GRID_CANVAS).shape == (30, 30)
  assert np.all(arc_canvas.crop(NOT_A_GRID_CANVAS) == 5)
  assert arc_canvas.crop(EMPTY_CANVAS).shape == (0, 0)
  # A 30x30 grid has no EOS at all.
  full = np.arange(900).reshape(30, 30) % 10
  np.testing.assert_array_equal(arc_canvas.crop(arc_canvas.to_canvas(full)),
                                full)

  # Staircase of row widths 5, 3, 3, 1, 0: areas 5, 6, 9, 4 -> 3 x 3.
  canvas = np.full((30, 30), 4, np.uint8)
  for row, width in enumerate((5, 3, 3, 1, 0)):
    canvas[row, width] = arc_canvas.EOS_ID
  assert arc_canvas.crop(canvas).shape == (3, 3)
  assert np.all(arc_canvas.crop(canvas) == 2)
  # Ties keep the first (fewest rows): widths 4, 2 -> 1x4 and 2x2 both 4.
  canvas = np.full((30, 30), 4, np.uint8)
  canvas[0, 4] = arc_canvas.PAD_ID
  canvas[1, 2] = arc_canvas.EOS_ID
  canvas[2, :] = arc_canvas.EOS_ID
  assert arc_canvas.crop(canvas).shape == (1, 4)
  # Out-of-vocabulary tokens (>= 12) end a row like EOS does.
  canvas = np.array(arc_canvas.to_canvas(np.ones((4, 4), int)))
  canvas[1] = 12  # Row 0 keeps 1 cell, so every rectangle is 1 wide.
  assert arc_canvas.crop(canvas).shape == (4, 1)


def test_crop_sizes_match_reference_on_noisy_canvases():
  rng = np.random.default_rng(1)
  canvases = rng.integers(2, 12, (400, 900))
  for i, p in enumerate(np.linspace(0.0, 0.2, len(canvases))):
    noise = rng.random(900) < p
    canvases[i, noise] = rng.integers(0, 13, noise.sum())
  rows, cols = arc_canvas.crop_sizes(canvases)
  for i, canvas in enumerate(canvases):
    assert (rows[i], cols[i]) == _reference_crop_size(canvas), i


def test_names_and_inverse_augmentation():
  assert arc_canvas.parse_name("abc")[0] == "abc"
  assert arc_canvas.parse_name("abc")[2] is None
  name, tid, color_map = arc_canvas.parse_name("abc|||t3|||0312456789")
  assert (name, tid) == ("abc", 3)
  # Digit i of the permutation is where colour i goes.
  np.testing.assert_array_equal(
      arc_canvas.augment(np.array([[1, 2, 3]]), 0, color_map), [[3, 1, 2]])
  for bad in ("abc|||t8|||0123456789", "abc|||3|||0123456789",
              "abc|||t1|||0123456788", "abc|||t1"):
    with pytest.raises(ValueError):
      arc_canvas.parse_name(bad)
  grid = np.array([[1, 2, 0], [0, 3, 4]], np.uint8)
  perm = np.random.default_rng(0).permutation(10).astype(np.uint8)
  for tid in range(dihedral.NUM_TRANSFORMS):
    out = arc_canvas.augment(grid, tid, perm)
    np.testing.assert_array_equal(arc_canvas.inverse_augment(out, tid, perm),
                                  grid)
  # Colours map before the rotation: t1 (rot90 ccw) of [[1, 2]] is [[2], [1]].
  np.testing.assert_array_equal(
      arc_canvas.augment(np.array([[1, 2]]), 1,
                       np.array([0, 5, 6, 3, 4, 1, 2, 7, 8, 9])),
      [[6], [5]])


def test_grid_digest_depends_on_shape():
  assert (arc_canvas.grid_digest(np.zeros((2, 3))) !=
          arc_canvas.grid_digest(np.zeros((3, 2))))
  assert (arc_canvas.grid_digest(np.array([[1, 2]])) ==
          arc_canvas.grid_digest(np.array([[1, 2]], np.int64)))


# ----------------------------------------------------------------------------
# Voting.


def test_pass_at_k_submission_and_reset(data_dir, tmp_path):
  evaluator = arc_eval.ARCEvaluator(data_dir)
  ids, inputs, preds, qs = _rows()
  evaluator.update(ids, inputs, preds, qs)
  save_dir = str(tmp_path / "out")
  metrics = evaluator.result(save_dir=save_dir)
  _check_metrics(metrics)
  # The names the TRM task declares for config.best_metric's check.
  assert sorted(metrics) == sorted(arc_eval.metric_names())
  with open(os.path.join(save_dir, "submission.json")) as f:
    assert json.load(f) == _expected_submission()

  # result() cleared the votes: nothing is left for the next evaluation.
  metrics = evaluator.result()
  assert metrics["ARC/pass@1000"] == 0.0
  assert metrics["ARC/num_predictions"] == 0
  assert metrics["ARC/num_answered"] == 0
  # A second evaluation with the same rows scores the same (no carry-over).
  evaluator.update(ids, inputs, preds, qs)
  _check_metrics(evaluator.result())


def test_answered_only_scores_the_puzzles_an_evaluation_saw(data_dir,
                                                            tmp_path):
  """A partial evaluation (config.data.max_eval_batches) scores the test
  inputs it has predictions for: p3, never predicted, is left out rather
  than counted as failed; the submission still has every test input."""
  evaluator = arc_eval.ARCEvaluator(data_dir, answered_only=True)
  evaluator.update(*_rows())
  metrics = evaluator.result(save_dir=str(tmp_path))
  # p1, p2 (2 inputs) and p4, as PASS without p3's zero.
  expected = {1: (1 + 0 + 1) / 3, 2: (1 + 0.5 + 1) / 3, 5: 1.0, 10: 1.0,
              100: 1.0, 1000: 1.0}
  for k, value in expected.items():
    assert metrics[f"ARC/pass@{k}"] == pytest.approx(value, abs=1e-12), k
  assert metrics["ARC/num_puzzles"] == 3
  assert metrics["ARC/num_test_inputs"] == 5
  assert metrics["ARC/num_answered"] == 4
  with open(tmp_path / "submission.json") as f:
    assert json.load(f) == _expected_submission()


def test_batching_and_row_order_do_not_matter(data_dir, tmp_path):
  ids, inputs, preds, qs = _rows()
  order = np.random.default_rng(3).permutation(len(ids))
  evaluator = arc_eval.ARCEvaluator(data_dir, pass_ks=(1, 2, 5, 10, 100, 1000))
  for chunk in np.array_split(order, 4):
    evaluator.update(ids[chunk], inputs[chunk], preds[chunk], qs[chunk])
  _check_metrics(evaluator.result(save_dir=str(tmp_path)))
  with open(tmp_path / "submission.json") as f:
    assert json.load(f) == _expected_submission()


def test_ranking_by_count_then_mean_q(data_dir, tmp_path):
  """One test input; the submission shows the top-3 order directly."""
  evaluator = arc_eval.ARCEvaluator(data_dir, pass_ks=(1, 2, 3),
                                    submission_k=3)
  rows = [  # (identifier, answer, logit)
      (1, W1, 4.0),  # W1: 1 vote, q 0.98
      (2, W2, -1.0), (3, W2, -1.0),  # W2: 2 votes, mean q 0.27
      (4, Y, 0.0), (5, Y, 1.0),  # Y: 2 votes, mean q 0.62
  ]
  evaluator.update(
      np.array([r[0] for r in rows]),
      np.stack([_aug_canvas(A, r[0]) for r in rows]),
      np.stack([_aug_canvas(r[1], r[0]) for r in rows]),
      np.array([r[2] for r in rows]))
  metrics = evaluator.result(save_dir=str(tmp_path))
  with open(tmp_path / "submission.json") as f:
    entry = json.load(f)["p1"][0]
  assert [entry[f"attempt_{i}"] for i in (1, 2, 3)] == [Y, W2, W1]
  assert metrics["ARC/pass@1"] == pytest.approx(0.25)  # 1 of 4 puzzles


def test_a_nan_q_halt_votes_with_the_least_confidence(data_dir, tmp_path):
  """A NaN logit (a diverged model) must not make the ranking follow the
  order rows arrive in, i.e. the process split: it ranks below any number."""
  rows = [(4, Y, float("nan")), (1, W1, 4.0)]  # one vote each
  results = []
  for order in (rows, rows[::-1]):
    evaluator = arc_eval.ARCEvaluator(data_dir, pass_ks=(1, 2))
    evaluator.update(
        np.array([r[0] for r in order]),
        np.stack([_aug_canvas(A, r[0]) for r in order]),
        np.stack([_aug_canvas(r[1], r[0]) for r in order]),
        np.array([r[2] for r in order], np.float32))
    metrics = evaluator.result(save_dir=str(tmp_path))
    with open(tmp_path / "submission.json") as f:
      entry = json.load(f)["p1"][0]
    results.append((metrics["ARC/pass@1"], metrics["ARC/pass@2"],
                    entry["attempt_1"], entry["attempt_2"]))
  assert results[0] == results[1] == (0.0, 0.25, W1, Y)


def test_rejects_bad_shapes_and_identifiers(data_dir):
  evaluator = arc_eval.ARCEvaluator(data_dir)
  with pytest.raises(ValueError):
    evaluator.update(np.array([1]), np.zeros((1, 81)), np.zeros((1, 81)),
                     np.zeros(1))
  with pytest.raises(ValueError):
    evaluator.update(np.array([len(IDENTIFIERS)]), np.zeros((1, 900)),
                     np.zeros((1, 900)), np.zeros(1))


def test_addressable_rows_takes_each_row_once():
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  x = np.arange(8 * 3).reshape(8, 3)
  sharded = jax.device_put(x, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("data")))
  np.testing.assert_array_equal(arc_eval.addressable_rows(sharded), x)
  np.testing.assert_array_equal(arc_eval.addressable_rows(x), x)


def test_on_a_dataset_from_the_builder(tmp_path):
  """Labels as predictions score 1 on every augmentation; inputs score 0."""
  arc = pytest.importorskip("trm.data.puzzles.arc")
  from trm.data.puzzles import format as puzzle_format  # pylint: disable=g-import-not-at-top
  data_dir = str(tmp_path / "arc")
  arc.build_dataset(data_dir, version="arc1", num_aug=3, subsample_size=3,
                    seed=0)
  _, arrays = puzzle_format.read_split(data_dir, "test")
  ids = np.repeat(arrays["puzzle_identifiers"],
                  np.diff(arrays["puzzle_indices"]))
  inputs, labels = np.asarray(arrays["inputs"]), np.asarray(arrays["labels"])
  evaluator = arc_eval.ARCEvaluator(data_dir)
  evaluator.update(ids, inputs, labels, np.zeros(len(ids)))
  metrics = evaluator.result(save_dir=str(tmp_path))
  assert metrics["ARC/pass@1"] == 1.0
  assert metrics["ARC/num_predictions"] == len(ids)
  assert metrics["ARC/num_answered"] == metrics["ARC/num_test_inputs"]
  with open(tmp_path / "submission.json") as f:
    submission = json.load(f)
  with open(os.path.join(data_dir, "test_puzzles.json")) as f:
    puzzles = json.load(f)
  assert sorted(submission) == sorted(puzzles)
  for name, puzzle in puzzles.items():
    assert [a["attempt_1"] for a in submission[name]] == [
        pair["output"] for pair in puzzle["test"]]
  evaluator.update(ids, inputs, inputs, np.zeros(len(ids)))
  assert evaluator.result()["ARC/pass@1000"] == 0.0


# ----------------------------------------------------------------------------
# Two processes.

_WORKER = """
import json, sys
import numpy as np
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address={address!r}, num_processes=2,
                           process_id=int(sys.argv[1]),
                           initialization_timeout=120)
from trm.families.trm import arc_eval

rows = np.load({rows!r})
mesh = jax.make_mesh((2,), ("data",))
sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
evaluator = arc_eval.ARCEvaluator({data_dir!r})
for _ in range(2):  # Two evaluations: the second must not see the first.
  for start in range(0, len(rows["ids"]), 8):  # Global batches of 8 rows.
    local = []
    for name in ("ids", "inputs", "preds", "qs"):
      full = rows[name][start:start + 8]
      global_array = jax.make_array_from_callback(
          full.shape, sharding, lambda index, full=full: full[index])
      local.append(arc_eval.addressable_rows(global_array))
    assert len(local[0]) == 4
    evaluator.update(*local)
  metrics = evaluator.result(save_dir={save_dir!r})
with open({out!r} + str(jax.process_index()) + ".json", "w") as f:
  json.dump(metrics, f)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_processes_match_one(data_dir, tmp_path):
  ids, inputs, preds, qs = _rows(num_blank=6)  # 24 rows: 3 batches of 8.
  assert len(ids) % 8 == 0
  # Rows of one test input land on both processes.
  order = np.random.default_rng(5).permutation(len(ids))
  rows_path = str(tmp_path / "rows.npz")
  np.savez(rows_path, ids=ids[order], inputs=inputs[order],
           preds=preds[order], qs=qs[order])
  save_dir = str(tmp_path / "two")
  script = _WORKER.format(address=f"127.0.0.1:{_free_port()}", rows=rows_path,
                          data_dir=data_dir, save_dir=save_dir,
                          out=str(tmp_path / "metrics"))
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(1))
  workers = [subprocess.Popen([sys.executable, "-c", script, str(i)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=300)
  for worker, output in zip(workers, outputs):
    assert worker.returncode == 0, output[-3000:]

  evaluator = arc_eval.ARCEvaluator(data_dir)
  evaluator.update(ids, inputs, preds, qs)
  reference = evaluator.result(save_dir=str(tmp_path / "one"))
  _check_metrics(reference)
  for i in range(2):
    with open(tmp_path / f"metrics{i}.json") as f:
      assert json.load(f) == reference
  with open(os.path.join(save_dir, "submission.json")) as f:
    assert json.load(f) == _expected_submission()
