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
from trm.data.tfds_builders import trm_code_files
from trm.data.tfds_builders import trm_tiny_shakespeare

BUILDERS = {
    "trm_tiny_shakespeare": trm_tiny_shakespeare.TrmTinyShakespeare,
    "trm_code_files": trm_code_files.TrmCodeFiles,
}
