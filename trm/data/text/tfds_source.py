"""TFDS splits as the data of the language-model tasks
(`config.data.source = 'tfds'`).

A split is read with `tfds.data_source(name, split=, data_dir=)`: random
access into ArrayRecord, no TensorFlow input pipeline. The tasks keep their
own Grain sources (`text.TokenWindows`, `sft.SFTBatches`), whose item k is
this process's rows of global batch k; only what those rows are read from
changes. So the per-process slicing, the global arrays and the checkpointed
iterator position are the ones the other sources use, and the same data
gives the same batches whichever way it is stored:

  * GPT: `TokenStream`, a split of fixed-size token records (as
    `trm_tiny_shakespeare` writes them) read as one long token stream, in
    place of train.bin / val.bin;
  * DiffuCoder: `texts`, the string features of every record (documents or
    prompt/response pairs), tokenised and packed as files are.

Every mistake names the config field (`config.data.tfds.<key>`) and says
what to do: the command line shows it as one line (`trm.core.cli`).
"""
from __future__ import annotations

import os

import numpy as np

from trm.data.text import windows as text

PREFIX = "config.data.tfds"
_BUILD_HINT = ("prepare it with `python -m trm.data.tfds_builders "
               "trm_tiny_shakespeare --manual_dir=DIR --data_dir=DATA_DIR` "
               "(or trm_code_files; README, 'TFDS data')")
# Records fetched per `__getitems__` call when reading a whole split.
_READ_BLOCK = 256


def _tfds():
  # Imported on first use: training from .bin files or code files never
  # pays tensorflow_datasets' import time.
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  return tfds


def _prepared_builder(tfds_config):
  """The TFDS builder of `tfds_config.name`, prepared in its data_dir."""
  tfds = _tfds()
  name, data_dir = tfds_config.name, tfds_config.data_dir or None
  if not name:
    raise ValueError(f"{PREFIX}.name is empty: set it to the TFDS dataset to "
                     "train from, e.g. trm_tiny_shakespeare.")
  # A bucket (gs://...) is read by TFDS and array_record themselves (the
  # README's "copy DATA_DIR to ... a bucket"): only a local path is looked
  # at here.
  remote = bool(data_dir) and "://" in data_dir
  if data_dir and not remote and not os.path.isdir(data_dir):
    what = "is not a directory" if os.path.lexists(data_dir) else (
        "does not exist")
    raise FileNotFoundError(
        f"{PREFIX}.data_dir={data_dir} {what}: point it at the "
        f"--data_dir the dataset was built into, or {_BUILD_HINT}.")
  where = f"in {data_dir}" if data_dir else "in TFDS's default data directory"
  try:
    tfds.core.naming.parse_builder_name_kwargs(name)
  except ValueError as e:  # told apart from the files' errors below
    raise ValueError(f"{PREFIX}.name={name!r} is no TFDS dataset name "
                     f"({str(e).splitlines()[0][:200]}); set it to e.g. "
                     "trm_tiny_shakespeare.") from None
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  try:
    builder = tfds.builder(name, data_dir=data_dir)
    prepared = builder.is_prepared()
  except tfds.core.registered.DatasetNotFoundError:
    raise FileNotFoundError(
        f"{PREFIX}.name={name!r}: no such dataset {where}; check "
        f"{PREFIX}.name and {PREFIX}.data_dir, or {_BUILD_HINT}.") from None
  except (json_format.Error, ValueError, TypeError, AttributeError,
          KeyError, RecursionError) as e:  # RecursionError: nesting
    # TFDS reads the version directory's dataset_info.json and
    # features.json here; damaged or edited, its error (a protobuf
    # ParseError's traceback, JSON's) named neither file nor dataset.
    text = " ".join(str(e).split())[:200]
    raise ValueError(
        f"{PREFIX}.name={name!r} {where}: its dataset_info.json or "
        f"features.json cannot be read ({type(e).__name__}: {text}); delete "
        f"the dataset's version directory and {_BUILD_HINT}.") from None
  except Exception as e:  # pylint: disable=broad-except
    if not remote:
      raise
    # The bucket unreachable, or not readable with this machine's
    # credentials: TensorFlow's error (a traceback) said so in its own way.
    text = " ".join(str(e).split())[:200]
    raise OSError(
        f"{PREFIX}.data_dir={data_dir} cannot be read ({type(e).__name__}: "
        f"{text}); check that it exists and that this machine can reach it "
        "(network, credentials), or copy it to a local directory.") from None
  if not prepared:
    raise FileNotFoundError(
        f"{PREFIX}.name={name!r} is not prepared {where}; {_BUILD_HINT}.")
  # A version directory copied or moved from another dataset (or version)
  # was read as this one: its own dataset_info.json says what it holds.
  version_dir = os.fspath(builder.data_dir)
  held = (builder.info.name, str(builder.info.version))
  asked = tfds.core.naming.parse_builder_name_kwargs(name)[0].name
  if held != (asked, os.path.basename(version_dir)):
    raise ValueError(
        f"{version_dir} holds {held[0]} {held[1]} (its dataset_info.json), "
        f"not {PREFIX}.name={name!r} of that version: it was copied or moved "
        f"there; delete it and {_BUILD_HINT}.")
  return builder


def open_split(tfds_config, split_key: str, features: dict):
  """(data source, builder info) of `tfds_config[split_key]`, after checking
  that the dataset, split and `features` exist and the files are
  ArrayRecord. `features` maps each feature to the config field naming it."""
  tfds = _tfds()
  builder = _prepared_builder(tfds_config)
  name, data_dir = tfds_config.name, tfds_config.data_dir or None
  split = tfds_config[split_key]
  info = builder.info
  base = str(split).split("[")[0]  # 'train[:10%]' slices split 'train'
  if base not in info.splits:
    raise ValueError(
        f"{PREFIX}.{split_key}={split!r} is not a split of {name} (it has "
        f"{sorted(info.splits)}); set {PREFIX}.{split_key} to one of them.")
  for feature, field in features.items():
    if feature not in info.features:
      raise ValueError(
          f"{field}={feature!r} is not a feature of {name} (it has "
          f"{sorted(info.features)}); set {field} to one of them.")
  # The slice ('train[:1%]') checked before the files are opened: TFDS's
  # own errors (a slice past the end, a malformed one) named no field, an
  # empty slice failed in array_record ("Paths sequence can not be of 0
  # length") and a reversed one ('train[5:2]', -3 records) in len().
  try:
    count = info.splits[split].num_examples
  except (ValueError, KeyError, TypeError) as e:
    # TFDS's reason is its last line ("Error parsing split ..." first).
    lines = [line for line in str(e).splitlines() if line.strip()] or [""]
    text = " ".join(lines[-1].split(". See format")[0].split())[:200]
    raise ValueError(
        f"{PREFIX}.{split_key}={split!r} is no slice of {name}'s splits "
        f"({text}); use e.g. '{base}', '{base}[:90%]' or '{base}[100:200]' "
        "(https://www.tensorflow.org/datasets/splits).") from None
  if count <= 0:
    raise ValueError(f"{PREFIX}.{split_key}={split!r} of {name} holds no "
                     "records; choose a larger split.")
  file_format = getattr(info.file_format, "value", info.file_format)
  if file_format != "array_record":
    raise ValueError(
        f"{PREFIX}.name={name!r} was built as {file_format}, which has no "
        "random access; rebuild it as array_record (our builders' default; "
        "`tfds build ... --file_format=array_record`).")
  # Decode only the features read: skipping the others (e.g. the text
  # beside the tokens) cut reading 70 tinyshakespeare records from ~5.7 to
  # ~4.0 ms (one measurement on a loaded 2-core host).
  skip = {f: tfds.decode.SkipDecoding() for f in info.features
          if f not in features}
  source = tfds.data_source(name, split=split, data_dir=data_dir,
                            download=False, decoders=skip or None)
  return source, info


def read_records(source, keys: list[int], where: str) -> list:
  """`source`'s records `keys`; a ValueError naming `where` (the split and
  its version directory) when its ArrayRecord files are truncated or
  damaged, or one was deleted (array_record raised a RuntimeError: a
  traceback)."""
  try:
    return source.__getitems__(keys)
  except RuntimeError as e:
    text = " ".join(str(e).split())
    if not any(what in text for what in ("Riegeli", "ArrayRecord",
                                         "open() failed")):
      raise
    raise ValueError(f"{where}: its ArrayRecord files cannot be read, they "
                     f"are missing, truncated or damaged ({text[:200]}); "
                     f"delete the version directory and {_BUILD_HINT}."
                     ) from None


def metadata(tfds_config) -> tuple[dict, str]:
  """(the dataset's metadata.json, or {} if it has none; the directory of
  the prepared version). Our builders record meta.json's fields there
  (vocabulary, tokenizer), which GPT and trm.sample read."""
  from trm.data.text import preparation  # pylint: disable=g-import-not-at-top
  builder = _prepared_builder(tfds_config)
  directory = os.fspath(builder.data_dir)
  path = os.path.join(directory, "metadata.json")
  fix = f"delete {directory} and {_BUILD_HINT}"
  try:
    # TFDS parses the file here: damaged JSON, or a list, raised its own
    # error without the file's name (a TypeError's traceback).
    meta = builder.info.metadata or {}
    meta = dict(meta) if isinstance(meta, dict) else None
  except (TypeError, ValueError, RecursionError) as e:
    raise ValueError(f"{path} is not the JSON object the builders write "
                     f"({' '.join(str(e).split())}); {fix}.") from None
  if meta is None:
    raise ValueError(f"{path} is not the JSON object the builders write; "
                     f"{fix}.")
  preparation.check_vocab_fields(meta, path, fix)
  return meta, directory


class TokenStream(text.TokenFile):
  """A split of token records read as one stream: record r holds tokens
  [r*C, (r+1)*C) with C the first record's length (the last may be
  shorter), the layout of `trm_tiny_shakespeare`. Drop-in for a .bin
  `TokenFile` in `text.TokenWindows` / `text.EvalWindows`: windows are read
  by random access into only the records they touch."""

  def __init__(self, tfds_config, split_key: str = "split"):
    # Not TokenFile.__init__: there is no file; `data` opens the split.
    self.config = tfds_config
    self.split_key = split_key
    self.feature = tfds_config.feature
    source, info = open_split(tfds_config, split_key,
                              {self.feature: f"{PREFIX}.feature"})
    spec = info.features[self.feature]
    if (len(getattr(spec, "shape", ())) != 1
        or not np.issubdtype(np.dtype(spec.np_dtype), np.integer)):
      raise ValueError(
          f"{PREFIX}.feature={self.feature!r} of {tfds_config.name} is "
          f"{spec!r}, not a 1-D sequence of token ids, which GPT needs; use "
          "a token feature (trm_tiny_shakespeare's 'tokens').")
    self.path = (f"tfds:{tfds_config.name}/{tfds_config[split_key]}"
                 f"[{self.feature}]@{tfds_config.data_dir}")
    self.where = (f"{PREFIX}.{split_key}={tfds_config[split_key]!r} of "
                  f"{tfds_config.name} in {info.data_dir}")
    self.num_records = len(source)
    first, last = read_records(source, [0, self.num_records - 1],
                               self.where)
    self.chunk = len(first[self.feature])
    if not self.chunk or len(last[self.feature]) > self.chunk:
      # Checked now, as the records between are (when read): a longer last
      # record failed in the middle of training, in numpy's broadcasting,
      # naming nothing; an empty first one at the first window.
      raise ValueError(
          f"{self.where}: its last record holds {len(last[self.feature])} "
          f"tokens, record 0 {self.chunk}: the split is not a stream of "
          "equal token records (the last one shorter); build it with "
          f"trm_tiny_shakespeare, or use {PREFIX}.feature of such a split.")
    self.num_tokens = ((self.num_records - 1) * self.chunk
                       + len(last[self.feature]))
    self._data = source

  @property
  def data(self):
    if self._data is None:  # after unpickling (see TokenFile.__getstate__)
      self._data = open_split(self.config, self.split_key,
                              {self.feature: f"{PREFIX}.feature"})[0]
    return self

  def first_id_from(self, vocab_size: int) -> None:
    """None, unread: a split's records are read only as windows reach them
    (each batch's ids are checked, `text.TokenWindows`)."""
    del vocab_size
    return None

  def __getitem__(self, index: np.ndarray) -> np.ndarray:
    """Tokens at the stream positions `index` (any integer array)."""
    index = np.asarray(index)
    records, inverse = np.unique(index // self.chunk, return_inverse=True)
    table = np.zeros((len(records), self.chunk), np.int32)
    fetched = read_records(self._data, [int(r) for r in records],
                           self.where)
    for row, (r, record) in enumerate(zip(records, fetched)):
      tokens = np.asarray(record[self.feature])
      if len(tokens) != self.chunk and r != self.num_records - 1:
        raise ValueError(
            f"{self.path}: record {r} holds {len(tokens)} tokens, record 0 "
            f"{self.chunk}: the split is not a stream of equal token records;"
            f" build it with trm_tiny_shakespeare, or use {PREFIX}.feature "
            "of such a split.")
      table[row, :len(tokens)] = tokens
    return table[inverse.reshape(index.shape), index % self.chunk]


def texts(tfds_config, split_key: str, features: dict) -> list[list[str]]:
  """[[record's value of each feature] for every record of the split], each
  a string feature (TFDS stores them as UTF-8 bytes); `features` maps each
  to the config field naming it."""
  source, info = open_split(tfds_config, split_key, features)
  for feature, field in features.items():
    spec = info.features[feature]
    if getattr(spec, "np_dtype", None) != np.object_:
      raise ValueError(
          f"{field}={feature!r} of {tfds_config.name} is {spec!r}, not text;"
          f" set {field} to a text feature.")
  where = (f"{PREFIX}.{split_key}={tfds_config[split_key]!r} of "
           f"{tfds_config.name} in {info.data_dir}")
  rows = []
  for start in range(0, len(source), _READ_BLOCK):
    keys = range(start, min(start + _READ_BLOCK, len(source)))
    for key, record in zip(keys, read_records(source, list(keys), where)):
      rows.append([_as_str(record[f], f"{where}: record {key}, feature {f!r}")
                   for f in features])
  return rows


def _as_str(value, where: str) -> str:
  """A text feature's value (TFDS stores UTF-8 bytes, or any bytes a
  builder gave it: their decoding error named no dataset)."""
  if not isinstance(value, bytes):
    return str(value)
  try:
    return value.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(
        f"{where} is not UTF-8 text (byte 0x{value[e.start]:02x} at offset "
        f"{e.start}); rebuild the dataset from UTF-8 text.") from None
