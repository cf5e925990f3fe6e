"""`trm_code_files`: a directory of source files as random-access
ArrayRecord (TFDS), one document per file, built offline.

Each example is {"text": the file's UTF-8 text, "path": its path relative
to --manual_dir}, in sorted path order, exactly the documents and order of
DiffuCoder's `data.format='code'` with `data.path='DIR/<pattern>'`
(`trm.data.text.sft.read_code_files`). The trainer tokenises and packs them as
it does files, so both give the same rows. The glob comes from the builder
config (default `py`: `**/*.py`); another is a JSON config:

    tfds build trm/data/tfds_builders/trm_code_files.py \
        --manual_dir=SRC_DIR --data_dir=DATA_DIR \
        [--config='{"name": "rs", "pattern": "**/*.rs"}']
"""
from __future__ import annotations

import dataclasses
import os

import tensorflow_datasets as tfds

from trm.data.text import sft
from trm.data.tfds_builders import base


@dataclasses.dataclass(eq=False)
class CodeFilesConfig(tfds.core.BuilderConfig):
  pattern: str = "**/*.py"  # glob under --manual_dir (recursive `**`)


class TrmCodeFiles(base.OrderedArrayRecordBuilder):
  """Source files under --manual_dir, one document each."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "One example per file, sorted by path."}
  BUILDER_CONFIG_CLASS = CodeFilesConfig
  BUILDER_CONFIGS = [CodeFilesConfig(name="py", pattern="**/*.py")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "Pass --manual_dir=DIR, the root of the source files; the config's "
      "pattern (default **/*.py) selects them.")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.ordered_info(__doc__, {"text": tfds.features.Text(),
                                       "path": tfds.features.Text()})

  def input_files(self, manual_dir) -> list[str]:
    """The files a build reads, in document order (`tfds_builders.build`
    records their hash)."""
    root = os.fspath(manual_dir)
    return sft.code_file_paths(
        os.path.join(root, self.builder_config.pattern),
        what=f"the builder config's pattern under --manual_dir={root}")

  def _split_generators(self, dl_manager):
    root = os.fspath(dl_manager.manual_dir)
    what = f"the builder config's pattern under --manual_dir={root}"
    return {"train": self._generate_examples(root, self.input_files(root),
                                             what)}

  def _generate_examples(self, root, paths, what):
    for i, path in enumerate(paths):
      yield i, {"text": sft.read_code_file(path, what=what),
                "path": os.path.relpath(path, root)}
