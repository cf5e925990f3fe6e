"""ARC evaluator: augmentation voting and pass@K (upstream `evaluators/arc.py`).

Every test row of an ARC dataset is one augmentation (dihedral transform +
colour permutation) of one original test input. Its prediction is cropped to
the grid the model drew, mapped back to the original frame and colours, and
counted as one vote, weighted by the model's halting confidence
sigmoid(q_halt), for the original test input. Candidates are ranked by
(number of votes, mean confidence), and pass@K asks whether the correct
output is among the top K.

Canvas encoding and augmentation names: see `trm.families.trm.arc_canvas`.

Same semantics as upstream, with these fixes:

* Votes come from one evaluation only: `result()` clears the state. Upstream
  (`aggregated_voting=True`, the default) never clears it, so each evaluation
  also votes with the predictions of every earlier checkpoint (upstream
  issue #35, which also reports the ~2 GB `gather_object` it causes).
* Works in one process without any distributed set-up (upstream calls
  `dist.gather_object` unconditionally), and across processes with JAX
  collectives; every process returns the same metrics.
* Only 28 bytes per prediction cross processes (input key, 128-bit grid
  hash, confidence); the grids themselves travel only for the submission's
  top candidates.
* Ties in (votes, mean confidence) are broken by the grid hash, mean
  confidences are exact sums (`math.fsum`) and a NaN q_halt logit votes with
  confidence 0, so results do not depend on how rows are split over
  processes or batches (upstream: gather order).
* A test input without any prediction still gets its entry in
  `submission.json` (placeholder `[[0]]` attempts); upstream skips it, which
  shifts the remaining attempts onto the wrong test inputs.

pass@K is averaged as upstream: the fraction of a puzzle's test inputs that
pass, averaged over the puzzles of `test_puzzles.json`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from trm.data import io as data_io
from trm.families.trm import arc_canvas

IDENTIFIERS_FILE = "identifiers.json"
TEST_PUZZLES_FILE = "test_puzzles.json"
SUBMISSION_FILE = "submission.json"
# Attempt used for a test input that received no prediction at all.
PLACEHOLDER_GRID = ((0,),)

# Per-prediction record exchanged between processes, as int32 columns:
# input key, grid digest (4 x int32), confidence (float64 as 2 x int32).
_RECORD_INTS = 1 + arc_canvas.DIGEST_BYTES // 4 + 2


# ----------------------------------------------------------------------------
# Process helpers.


def addressable_rows(x) -> np.ndarray:
  """This process's share of the rows of a (global) array, as numpy.

  Across all processes every global row is returned exactly once (the
  replica-0 copy of each row block), in row order, so the result can be
  passed to `ARCEvaluator.update` on every process. Numpy arrays and fully
  addressable arrays come back whole.

  Raises:
    ValueError: the array is split along a dimension other than the first.
  """
  if not hasattr(x, "addressable_shards") or x.is_fully_addressable:
    return np.asarray(x)
  pieces = {}
  for shard in x.addressable_shards:
    if shard.replica_id != 0:
      continue
    for dim, (index, size) in enumerate(zip(shard.index[1:], x.shape[1:]), 1):
      if index.indices(size)[:2] != (0, size):
        raise ValueError(f"array of shape {x.shape} is split along dimension "
                         f"{dim}; gather it (process_allgather) first")
    start = shard.index[0].indices(x.shape[0])[0] if x.ndim else 0
    pieces[start] = np.asarray(shard.data)
  if not pieces:
    return np.zeros((0,) + tuple(x.shape[1:]), x.dtype)
  return np.concatenate([pieces[k] for k in sorted(pieces)])


def _allgather(array: np.ndarray) -> np.ndarray:
  """[process_count, *shape] stack of every process's equally shaped array."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(array, tiled=False))


def _process_info() -> tuple[int, int]:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index(), jax.process_count()


def _sigmoid(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  e = np.exp(-np.abs(x))
  return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


# ----------------------------------------------------------------------------
# Evaluator.


PASS_KS = (1, 2, 5, 10, 100, 1000)


def metric_names(pass_ks: Sequence[int] = PASS_KS) -> tuple:
  """The names `ARCEvaluator.result` reports."""
  return (*(f"ARC/pass@{k}" for k in pass_ks), "ARC/num_puzzles",
          "ARC/num_test_inputs", "ARC/num_answered", "ARC/num_predictions",
          "ARC/num_unmatched")


class ARCEvaluator:
  """Votes over augmented predictions; pass@K and a Kaggle submission.

  Usage, once per evaluation: `update(...)` for every eval batch with this
  process's rows (each global row on exactly one process; padding rows with
  the blank puzzle identifier are skipped), then `result(save_dir)` on every
  process (it is collective when there are several).

  Unlike upstream, votes come from one evaluation only: `result()` clears
  the state, where upstream's `aggregated_voting` keeps every earlier
  evaluation's predictions (upstream issue #35).
  """

  def __init__(self, data_dir: str,
               pass_ks: Sequence[int] = PASS_KS,
               submission_k: int = 2, blank_identifier_id: int = 0,
               answered_only: bool = False,
               num_puzzle_identifiers: Optional[int] = None):
    """Reads `identifiers.json` and `test_puzzles.json` from `data_dir`.

    Args:
      data_dir: the ARC dataset root.
      pass_ks: the K of each reported `ARC/pass@K`.
      submission_k: attempts per test input in `submission.json` (Kaggle: 2).
      blank_identifier_id: puzzle identifier of padding rows.
      answered_only: score only the test inputs that got a prediction, and
        average over the puzzles with one or more of them: for an evaluation
        of part of the test split (config.data.max_eval_batches), whose
        unseen puzzles would otherwise count as failed. Off, every puzzle
        counts, as upstream.
      num_puzzle_identifiers: if set, the dataset's count (dataset.json);
        `identifiers.json` must name that many puzzles.
    """
    self.pass_ks = tuple(int(k) for k in pass_ks)
    if not self.pass_ks or min(self.pass_ks) < 1:
      raise ValueError(f"pass_ks must be positive integers, got {pass_ks}")
    if submission_k < 1:
      raise ValueError(f"submission_k must be >= 1, got {submission_k}")
    self.submission_k = int(submission_k)
    self.blank_identifier_id = int(blank_identifier_id)
    self.answered_only = bool(answered_only)
    self._identifiers = _read_json(os.path.join(data_dir, IDENTIFIERS_FILE))
    puzzles_path = os.path.join(data_dir, TEST_PUZZLES_FILE)
    self._test_puzzles = _read_json(puzzles_path)
    if not isinstance(self._identifiers, list) or not all(
        isinstance(n, str) for n in self._identifiers):
      raise ValueError(f"{data_dir}/{IDENTIFIERS_FILE}: expected a JSON list "
                       "of puzzle names; rebuild the dataset.")
    if (num_puzzle_identifiers is not None and
        len(self._identifiers) != num_puzzle_identifiers):
      raise ValueError(f"{data_dir}/{IDENTIFIERS_FILE}: names "
                       f"{len(self._identifiers)} puzzles, but dataset.json "
                       f"has num_puzzle_identifiers={num_puzzle_identifiers}"
                       "; rebuild the dataset.")
    if not isinstance(self._test_puzzles, dict):
      raise ValueError(f"{puzzles_path}: expected an object {{puzzle name: "
                       f"puzzle}}, got a {type(self._test_puzzles).__name__}"
                       "; rebuild the dataset.")
    for name, puzzle in self._test_puzzles.items():
      tests = puzzle.get("test") if isinstance(puzzle, dict) else None
      if not isinstance(tests, list) or not all(
          isinstance(pair, dict) and {"input", "output"} <= set(pair)
          for pair in tests):
        raise ValueError(f"{puzzles_path}: puzzle {name!r} needs a 'test' "
                         "list of {'input', 'output'} grids; rebuild the "
                         "dataset.")

    # One "input key" per distinct (puzzle, test input); test slots are the
    # (puzzle, test index) pairs, in file order.
    self._key_of = {}  # (name, input digest) -> key
    self._slots = []  # (name, key, label digest)
    for name, puzzle in self._test_puzzles.items():
      for pair in puzzle["test"]:
        digest = arc_canvas.grid_digest(_grid(pair["input"], name))
        key = self._key_of.setdefault((name, digest), len(self._key_of))
        self._slots.append(
            (name, key, arc_canvas.grid_digest(_grid(pair["output"], name))))
    self._parsed = {}  # identifier -> parse_name(...)
    self.reset()

  def reset(self) -> None:
    """Drops every recorded prediction."""
    self._keys = []
    self._digests = []
    self._qs = []
    self._grids = {}  # digest -> grid, this process's predictions only
    self._num_unmatched = 0

  def _parse(self, identifier: int):
    parsed = self._parsed.get(identifier)
    if parsed is None:
      if not 0 <= identifier < len(self._identifiers):
        raise ValueError(f"puzzle identifier {identifier} outside "
                         f"identifiers.json (0..{len(self._identifiers) - 1})")
      parsed = arc_canvas.parse_name(self._identifiers[identifier])
      self._parsed[identifier] = parsed
    return parsed

  def update(self, puzzle_identifiers, inputs, predictions,
             q_halt_logits) -> None:
    """Records one batch of this process's rows.

    Args:
      puzzle_identifiers: [B] ints.
      inputs: [B, 900] input token ids.
      predictions: [B, 900] predicted token ids (argmax).
      q_halt_logits: [B] halting logits; the vote weight is their sigmoid.
    """
    ids = np.asarray(puzzle_identifiers).reshape(-1)
    inputs = np.asarray(inputs).reshape(len(ids), -1)
    predictions = np.asarray(predictions).reshape(len(ids), -1)
    qs = _sigmoid(np.asarray(q_halt_logits).reshape(-1))
    # A NaN logit still votes, with the least confidence: a NaN mean
    # compares neither below nor above any other, so the ranking (and
    # pass@K) followed the order rows arrived in, i.e. the process split.
    qs = np.where(np.isnan(qs), 0.0, qs)
    if not (inputs.shape[1] == predictions.shape[1] == arc_canvas.GRID_SIZE ** 2
            and len(qs) == len(ids) and len(predictions) == len(ids)):
      raise ValueError(
          f"expected [B] ids, [B, 900] inputs and predictions, [B] q_halt "
          f"logits; got {ids.shape}, {inputs.shape}, {predictions.shape}, "
          f"{qs.shape}")
    keep = ids != self.blank_identifier_id
    ids, inputs, predictions, qs = (ids[keep], inputs[keep], predictions[keep],
                                    qs[keep])
    in_rows, in_cols = arc_canvas.crop_sizes(inputs)
    out_rows, out_cols = arc_canvas.crop_sizes(predictions)
    for i, identifier in enumerate(ids.tolist()):
      name, tid, color_map = self._parse(identifier)
      grid = inputs[i].reshape(arc_canvas.GRID_SIZE,
                               arc_canvas.GRID_SIZE)[:in_rows[i], :in_cols[i]]
      grid = arc_canvas.inverse_augment(
          grid.astype(np.int64) - arc_canvas.COLOR_OFFSET, tid, color_map)
      key = self._key_of.get((name, arc_canvas.grid_digest(grid)))
      if key is None:
        self._num_unmatched += 1
        continue
      pred = predictions[i].reshape(
          arc_canvas.GRID_SIZE,
          arc_canvas.GRID_SIZE)[:out_rows[i], :out_cols[i]]
      pred = arc_canvas.inverse_augment(
          pred.astype(np.int64) - arc_canvas.COLOR_OFFSET, tid, color_map)
      digest = arc_canvas.grid_digest(pred)
      self._grids.setdefault(digest, pred)
      self._keys.append(key)
      self._digests.append(digest)
      self._qs.append(float(qs[i]))

  # --------------------------------------------------------------- result

  def _gather_records(self):
    """Every process's (keys, digests, qs) and unmatched count, concatenated."""
    n = len(self._keys)
    keys = np.asarray(self._keys, np.int32)
    digests = np.frombuffer(b"".join(self._digests), np.uint8).reshape(
        n, arc_canvas.DIGEST_BYTES)
    qs = np.asarray(self._qs, np.float64)
    _, num_processes = _process_info()
    if num_processes == 1:
      return keys, digests, qs, self._num_unmatched
    counts = _allgather(np.array([n, self._num_unmatched], np.int32))
    width = int(counts[:, 0].max())
    unmatched = int(counts[:, 1].sum())
    if width == 0:
      return keys, digests, qs, unmatched
    # Fixed-size int32 records (float64 and bytes travel as their bits, so
    # nothing depends on jax_enable_x64).
    packed = np.zeros((width, _RECORD_INTS), np.int32)
    packed[:n, 0] = keys
    packed[:n, 1:5] = digests.view("<i4")
    packed[:n, 5:7] = qs.view(np.int32).reshape(n, 2)
    every = _allgather(packed)
    every = np.concatenate([every[p, :counts[p, 0]]
                            for p in range(num_processes)])
    return (every[:, 0].copy(),
            np.ascontiguousarray(every[:, 1:5]).view(np.uint8),
            np.ascontiguousarray(every[:, 5:7]).view(np.float64).reshape(-1),
            unmatched)

  def _gather_grids(self, digests: list[bytes]) -> dict:
    """Grids for `digests` from whichever process recorded them."""
    _, num_processes = _process_info()
    if num_processes == 1 or not digests:
      return {d: self._grids[d] for d in digests}
    # Per digest: found flag, rows, cols, 900 colours.
    local = np.zeros((len(digests), 3 + arc_canvas.GRID_SIZE ** 2), np.uint8)
    for i, d in enumerate(digests):
      grid = self._grids.get(d)
      if grid is not None:
        local[i, :3] = (1,) + grid.shape
        local[i, 3:3 + grid.size] = grid.reshape(-1)
    every = _allgather(local)
    grids = {}
    for i, d in enumerate(digests):
      p = int(np.argmax(every[:, i, 0]))
      rows, cols = int(every[p, i, 1]), int(every[p, i, 2])
      grids[d] = every[p, i, 3:3 + rows * cols].reshape(rows, cols)
    return grids

  def result(self, save_dir: Optional[str] = None) -> dict[str, float]:
    """Metrics of the predictions recorded since the last `result()`.

    Collective over processes; every process returns the same metrics.
    Clears the recorded predictions.

    Args:
      save_dir: if set, process 0 writes `submission.json` there, in the
        Kaggle format `{task: [{"attempt_1": grid, ...}, ...]}` with one
        entry per test input in `test_puzzles.json` order.

    Returns:
      `ARC/pass@K` for every K, and counts: `ARC/num_puzzles` (those
      pass@K averages over), `ARC/num_test_inputs` (all of them),
      `ARC/num_answered` (test inputs with at least one prediction),
      `ARC/num_predictions` (rows matched to a test input) and
      `ARC/num_unmatched` (non-padding rows whose input matched none).
    """
    keys, digests, qs, unmatched = self._gather_records()
    # key -> digest -> confidences of its votes.
    votes = {}
    for key, digest, q in zip(keys.tolist(), map(bytes, digests), qs.tolist()):
      votes.setdefault(key, {}).setdefault(digest, []).append(q)
    ranking = {}
    for key, candidates in votes.items():
      ranked = sorted(((-len(v), -math.fsum(v) / len(v), d)
                       for d, v in candidates.items()))
      ranking[key] = [d for _, _, d in ranked]

    per_puzzle = {}  # name -> [num tests, hits per K]
    answered = 0
    needed = set()
    for name, key, label in self._slots:
      ranked = ranking.get(key, [])
      if self.answered_only and not ranked:
        continue
      entry = per_puzzle.setdefault(name, [0, [0] * len(self.pass_ks)])
      entry[0] += 1
      if ranked:
        answered += 1
        needed.update(ranked[:self.submission_k])
      for j, k in enumerate(self.pass_ks):
        entry[1][j] += label in ranked[:k]

    num_puzzles = len(per_puzzle if self.answered_only else
                      self._test_puzzles)
    metrics = {}
    for j, k in enumerate(self.pass_ks):
      total = sum(hits[j] / tests for tests, hits in per_puzzle.values())
      metrics[f"ARC/pass@{k}"] = total / num_puzzles if num_puzzles else 0.0
    metrics.update({
        "ARC/num_puzzles": float(num_puzzles),
        "ARC/num_test_inputs": float(len(self._slots)),
        "ARC/num_answered": float(answered),
        "ARC/num_predictions": float(len(keys)),
        "ARC/num_unmatched": float(unmatched),
    })

    grids = self._gather_grids(sorted(needed))
    if save_dir is not None and _process_info()[0] == 0:
      self._write_submission(save_dir, ranking, grids)
    self.reset()
    return metrics

  def _write_submission(self, save_dir: str, ranking: dict,
                        grids: dict) -> None:
    from etils import epath  # pylint: disable=g-import-not-at-top
    submission = {name: [] for name in self._test_puzzles}
    for name, key, _ in self._slots:
      attempts = [grids[d].tolist()
                  for d in ranking.get(key, [])[:self.submission_k]]
      if not attempts:
        attempts = [[list(row) for row in PLACEHOLDER_GRID]]
      attempts += [attempts[0]] * (self.submission_k - len(attempts))
      submission[name].append({f"attempt_{i + 1}": grid
                               for i, grid in enumerate(attempts)})
    text = json.dumps(submission)
    if "://" in str(save_dir):  # an object store's upload is whole already
      path = epath.Path(save_dir)
      path.mkdir(parents=True, exist_ok=True)
      (path / SUBMISSION_FILE).write_text(text)
    else:  # whole or not at all: an interrupted write leaves the old one
      from trm.data import atomic_files  # pylint: disable=g-import-not-at-top
      atomic_files.atomic_write(os.path.join(save_dir, SUBMISSION_FILE),
                                lambda f: f.write(text), mode="w")


def _read_json(path: str):
  """A JSON file of an ARC dataset directory; damage is one line naming it."""
  data_io.check_regular_file(path, "rebuild the dataset")
  try:
    with open(path, "r", encoding="utf-8") as f:
      return json.load(f)
  except (ValueError, RecursionError) as e:  # nesting, 4300+ digit ints
    raise ValueError(f"{path}: not valid JSON ({str(e)[:200]}); rebuild "
                     "the dataset.") from None


def _grid(rows, name: str) -> np.ndarray:
  """A test_puzzles.json grid as uint8, checked."""
  try:
    grid = np.asarray(rows)
  except ValueError:  # ragged rows
    grid = np.zeros((0, 0))
  if (grid.ndim != 2 or grid.dtype.kind not in "iu" or
      grid.shape[0] > arc_canvas.GRID_SIZE or
      grid.shape[1] > arc_canvas.GRID_SIZE or grid.size == 0 or
      grid.min() < 0 or grid.max() >= arc_canvas.NUM_COLORS):
    raise ValueError(f"{TEST_PUZZLES_FILE}: puzzle {name!r} has a grid that "
                     f"is not 1..30 x 1..30 colours 0..9: {rows!r}")
  return grid.astype(np.uint8)
