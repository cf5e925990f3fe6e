"""CLI and config plumbing shared by the dataset builders.

A builder (`python -m trm.data.<name>`) defines its flags only when run as a
script (`define_flags`): the trainer imports the builder modules for
`ensure_dataset` and has its own flags (e.g. --seed) that would clash. The
trainer passes the build arguments as `config.data.build` instead
(`ensure_from_config`), where '' and -1 mean "not set".
"""

from typing import Any, Callable, Optional, Sequence

from absl import app
from absl import flags

from trm.core import cli
from trm.data import atomic_files
from trm.data.puzzles import builds


def define_output_dir(flag_values: flags.FlagValues) -> None:
  """Defines the required --output_dir."""
  flags.DEFINE_string("output_dir", None, "Dataset root to write.",
                      flag_values=flag_values)
  flags.mark_flag_as_required("output_dir", flag_values=flag_values)


def define_source_flags(flag_values: flags.FlagValues,
                        sources: Sequence[str], default: str,
                        source_help: str, dir_flag: str,
                        dir_help: str) -> None:
  """Defines --source (one of `sources`) and --`dir_flag`, a directory that
  implies a source when --source is not given (see `source`)."""
  flags.DEFINE_enum("source", default, sources, source_help,
                    flag_values=flag_values)
  flags.DEFINE_string(dir_flag, "", dir_help, flag_values=flag_values)


def define_csv_source_flags(flag_values: flags.FlagValues,
                            sources: Sequence[str], items: str) -> None:
  """Defines --source, --csv_dir, --num_train and --num_test of a builder of
  upstream's Hub CSVs (see `trm.data.puzzles.hub`) with an offline generator of
  `items` (e.g. "puzzles")."""
  define_source_flags(
      flag_values, sources, "generate",
      "generate: offline generator; csv: CSVs in --csv_dir; hub: download "
      "from the Hugging Face Hub (needs network and huggingface_hub: pip "
      "install -e .[hub]). Defaults to csv when only --csv_dir is given.", "csv_dir", "Directory with train.csv/test.csv (source=csv) "
      "or to download them to (source=hub).")
  flags.DEFINE_integer("num_train", 1000, f"generate: train {items}.",
                       flag_values=flag_values)
  flags.DEFINE_integer("num_test", 1000, f"generate: test {items}.",
                       flag_values=flag_values)


def define_optional_int(name: str, help_text: str,
                        flag_values: flags.FlagValues) -> None:
  """Defines an integer flag that may be empty (read it with
  `optional_int`).

  A string flag, so that an empty value (e.g. `--subsample_size=`) means
  "none".
  """
  flags.DEFINE_string(name, "", help_text, flag_values=flag_values)


def optional_int(flag_values: flags.FlagValues, name: str) -> Optional[int]:
  """The value of a `define_optional_int` flag: an int, or None if empty."""
  value = flag_values[name].value.strip()
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise app.UsageError(f"--{name} must be an integer or empty, got "
                         f"{value!r}") from None


def source(flag_values: flags.FlagValues, dir_flag: str,
           dir_source: str) -> str:
  """--source, or `dir_source` when --`dir_flag` is set and --source is not
  given."""
  if flag_values[dir_flag].value and not flag_values["source"].present:
    return dir_source
  return flag_values.source


# The builders' input directories (`define_source_flags`, ARC's).
_INPUT_DIR_FLAGS = ("csv_dir", "kaggle_dir", "concept_dir")


def run_main(argv: Sequence[str],
             run_from_flags: Callable[[flags.FlagValues], str]) -> None:
  """A builder's `main`: builds from the parsed flags, prints output_dir."""
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # Before the puzzles are read or generated (minutes for big builds), not
  # at the first write.
  flags.FLAGS.output_dir = cli.check_output_dir(flags.FLAGS.output_dir)
  # The input directories too: `--csv_dir=~/x` reached us as typed.
  for name in _INPUT_DIR_FLAGS:
    if name in flags.FLAGS and flags.FLAGS[name].value:
      flags.FLAGS[name].value = cli.expand_home(flags.FLAGS[name].value)
  # A gs:// one was written to a local directory "gs:" and printed as if in
  # the bucket.
  atomic_files.check_dir_or_absent(flags.FLAGS.output_dir, "--output_dir")
  try:
    print(run_from_flags(flags.FLAGS))
  except MemoryError as e:
    # numpy's error alone was a traceback; name the flags that size it.
    sizes = {name: flags.FLAGS[name].value for name in builds.SIZE_ARGS
             if name in flags.FLAGS and flags.FLAGS[name].value != ""}
    raise builds.out_of_memory(e, flags.FLAGS.output_dir, sizes,
                               "--") from None


def unset_if_negative(value: int) -> Optional[int]:
  """A `config.data.build` count: None when negative (-1 means "not set")."""
  return None if value < 0 else value


def csv_source_config(build_config: Any) -> dict[str, Any]:
  """`source`, `csv_dir` and `subsample_size` of the `config.data.build` of
  a builder of upstream's Hub CSVs, as `build_dataset` arguments."""
  return dict(source=build_config.source,
              csv_dir=build_config.csv_dir or None,
              subsample_size=unset_if_negative(build_config.subsample_size))
