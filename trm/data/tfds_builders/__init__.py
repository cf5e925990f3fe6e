"""TFDS builders of the project's text datasets (ArrayRecord, offline).

Importing this package registers `trm_tiny_shakespeare` and
`trm_code_files` with TFDS. Prepare data (once, e.g. on a workstation, then
copy DATA_DIR to the pod's disk or a bucket) with TFDS's own tool, naming
the builder file:

    tfds build trm/data/tfds_builders/trm_tiny_shakespeare.py \
        --manual_dir=PATH/tinyshakespeare --data_dir=DATA_DIR

or by name (`tfds build trm_tiny_shakespeare
--imports=trm.data.tfds_builders ...`), or without the `tfds` script:

    python -m trm.data.tfds_builders trm_tiny_shakespeare \
        --manual_dir=PATH/tinyshakespeare --data_dir=DATA_DIR
"""
import os

import tensorflow_datasets as tfds

from trm.data.tfds_builders import trm_code_files
from trm.data.tfds_builders import trm_tiny_shakespeare

BUILDERS = {
    "trm_tiny_shakespeare": trm_tiny_shakespeare.TrmTinyShakespeare,
    "trm_code_files": trm_code_files.TrmCodeFiles,
}


def build(name: str, manual_dir: str, data_dir: str, pattern: str = ""):
  """Prepares builder `name` into `data_dir`; returns the builder."""
  if name not in BUILDERS:
    raise ValueError(f"Unknown builder {name!r}; this project has "
                     f"{sorted(BUILDERS)}.")
  if not os.path.isdir(manual_dir):
    raise FileNotFoundError(f"--manual_dir={manual_dir} is not a directory: "
                            "pass the directory holding the input files.")
  kwargs = {}
  if pattern:
    if name != "trm_code_files":
      raise ValueError("--pattern applies to trm_code_files only.")
    kwargs["config"] = trm_code_files.CodeFilesConfig(
        name="custom", pattern=pattern)
  builder = BUILDERS[name](data_dir=data_dir, **kwargs)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder
