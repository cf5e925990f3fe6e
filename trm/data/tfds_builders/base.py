"""What this project's TFDS builders share: ArrayRecord by default and
records kept in generation order."""
from __future__ import annotations

import tensorflow_datasets as tfds


class OrderedArrayRecordBuilder(tfds.core.GeneratorBasedBuilder):
  """Abstract (not registered): subclasses define _info via `ordered_info`,
  _split_generators and _generate_examples."""

  def __init__(self, *, file_format=None, **kwargs):
    # ArrayRecord unless asked otherwise: training reads it by random access
    # (tfds.data_source), which TFRecord does not offer.
    super().__init__(file_format=file_format or "array_record", **kwargs)

  def ordered_info(self, doc: str, features: dict,
                   **kwargs) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=doc.split("\n\n")[0],
        features=tfds.features.FeaturesDict(features),
        # Records in generation order (TFDS shuffles them by key hash
        # otherwise): a token stream, or documents packed in file order.
        disable_shuffling=True, **kwargs)
