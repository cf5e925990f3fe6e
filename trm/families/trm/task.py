"""TRM on puzzle datasets (Sudoku): upstream's data, ACT step and evaluation.

A new run starts from random weights, or from `config.init_checkpoint`'s
(`init_source`): a trm.main workdir's newest step (`DIR/checkpoints/N`:
step N; `DIR/checkpoints/best`: its best, as the tools' --step=best), the
weights it evaluates (its EMA when it kept one), or an
upstream PyTorch checkpoint file, as upstream's `load_checkpoint`. Only the
weights, H_init / L_init and the puzzle table are read: the optimizer
state, the ACT carry and the step start afresh. A puzzle table of another
number of identifiers (another dataset) starts every row at the mean of the
loaded rows, as upstream's; any other shape is refused. A workdir that
already holds checkpoints resumes from them and reads no init_checkpoint.
"""
from __future__ import annotations

import functools
import importlib
import json
import os

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from trm.core import config_lib
from trm.core import host_arrays
from trm.core import optimizers
from trm.core import restore_check
from trm.core import weights_io
from trm.core.task import Task
from trm.data.puzzles import dataset as puzzle_dataset
from trm.data.puzzles import format as puzzle_format
from trm.families.trm import model as trm_model
from trm.families.trm import program as trm_program
from trm.families.trm import steps as trm_steps

# config.num_epochs derives total_steps from the training data (`build`).
COUNTS_EPOCHS = True


def _data_dir(config, workdir: str) -> str:
  data_dir = config.data.data_dir or os.path.join(workdir, "data")
  if "://" in data_dir:
    raise ValueError(
        f"Dataset directory {data_dir!r} is remote, but datasets are memory-"
        "mapped from local disk: set --config.data.data_dir to a local path "
        "(each worker builds or copies its own).")
  if os.path.exists(data_dir) and not os.path.isdir(data_dir):
    raise ValueError(
        f"The dataset directory {data_dir!r} (config.data.data_dir, '' = "
        "<workdir>/data) is a file, not a directory: set "
        "--config.data.data_dir to a directory (a new one is built), or "
        "move the file away.")
  return data_dir


def prepare_data(config, workdir: str) -> str:
  """Builds the dataset named by the config when its directory has none.

  `config.data.name` names a builder module in `trm/data/puzzles/` whose
  `ensure_from_config(data_dir, build_config)` builds the dataset from
  `config.data.build` unless the directory already holds one.
  """
  data_dir = _data_dir(config, workdir)
  if config.data.name not in trm_program.BUILDERS:
    raise ValueError(f"config.data.name={config.data.name!r} has no builder; "
                     f"known: {sorted(trm_program.BUILDERS)}.")
  builder = importlib.import_module(f"trm.data.puzzles.{config.data.name}")
  builder.ensure_from_config(data_dir, config.data.build)
  return data_dir


def run_data_dir(config, checkpoint: str, output_dir: str) -> str:
  """The dataset `trm.evaluate` reads: config.data.data_dir when set; else,
  when `checkpoint` is a trm.main workdir, the dataset that run trained on
  (its config.json's data.data_dir, or `<workdir>/data` when that was '')
  if it is a usable build, so it is read, never rebuilt; else
  `<output_dir>/data` (built there). A run's dataset built with other
  arguments than `config.data.build` is refused by `prepare_data`."""
  if config.data.data_dir:
    return config.data.data_dir
  if config.data.name in trm_program.BUILDERS and os.path.isdir(
      os.path.join(checkpoint, "checkpoints")):
    from trm.data.puzzles import builds  # pylint: disable=g-import-not-at-top
    run_dir = _recorded_data_dir(checkpoint) or os.path.join(checkpoint,
                                                             "data")
    builder = importlib.import_module(
        f"trm.data.puzzles.{config.data.name}")
    extra = getattr(builder, "EXTRA_FILES", ())
    if builds.build_state(run_dir, extra) in ("complete", "foreign"):
      return run_dir
  return os.path.join(output_dir, "data")


def _recorded_data_dir(workdir: str) -> str:
  """data.data_dir in the run's config.json ('' when unset or unreadable:
  the run then used `<workdir>/data`)."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):  # a FIFO's open blocked for ever
    return ""
  try:
    # Past 64 MiB, refused unread (json.load held twice the file).
    data_dir = weights_io.read_json(path)["data"]["data_dir"]
  except (OSError, ValueError, KeyError, TypeError):
    return ""
  return data_dir if isinstance(data_dir, str) else ""


class EvalHook:
  """Per evaluation: ARC voting and pass@K (ARC datasets; `submission.json`
  beside the sheet) and a PNG sheet of the first rows (input, prediction,
  target)."""

  def __init__(self, data_dir: str, kind: str, arc: bool, sheet_rows: int,
               partial: bool = False):
    from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
    self.kind, self.sheet_rows = kind, sheet_rows
    # A partial evaluation (config.data.max_eval_batches) scores the test
    # inputs it saw, as the token metrics do.
    self.evaluator = (arc_eval.ARCEvaluator(data_dir, answered_only=partial)
                      if arc else None)
    self.rows = arc_eval.addressable_rows
    self.sheet = None

  def update(self, batch, outputs) -> None:
    if self.evaluator is None and not self.sheet_rows:
      return
    inputs = self.rows(batch["inputs"])
    predictions = self.rows(outputs["predictions"])
    if self.evaluator is not None:
      self.evaluator.update(self.rows(batch["puzzle_identifiers"]), inputs,
                            predictions, self.rows(outputs["q_halt_logits"]))
    if self.sheet is None and self.sheet_rows and jax.process_index() == 0:
      labels = self.rows(batch["labels"])
      # The padding rows of a short batch have no label (and Sudoku's and
      # Maze's share the puzzles' identifier): drawn, each would show as a
      # wrong answer.
      real = (labels != trm_model.IGNORE_LABEL_ID).reshape(
          len(labels), -1).any(-1)
      if real.any():
        n = self.sheet_rows
        self.sheet = (inputs[real][:n], predictions[real][:n],
                      labels[real][:n])

  def result(self, save_dir) -> dict:
    results = {}
    if self.evaluator is not None:
      results = self.evaluator.result(save_dir)
    if self.sheet is not None and save_dir:
      from trm.families.trm import sheets as visualize  # pylint: disable=g-import-not-at-top
      visualize.sample_sheet(self.kind, *self.sheet,
                             os.path.join(save_dir, "sheet.png"),
                             max_rows=self.sheet_rows)
    return results


class KeptPredictions:
  """Wraps a task's eval hook and also keeps every predicted row, in the
  split's example order, for `trm.evaluate`'s predictions file (what
  `trm.visualize --predictions` reads). Test batches are sequential and
  their padding rows come last, so row i of the concatenation is example i;
  `array()` drops the padding. Collective: call `update` on every process
  (a batch split across processes is gathered)."""

  def __init__(self, hook, num_examples: int):
    self.hook, self.num_examples, self.parts = hook, num_examples, []

  def update(self, batch, outputs) -> None:
    if self.hook is not None:
      self.hook.update(batch, outputs)
    rows = host_arrays.whole(outputs["predictions"])
    # Puzzle vocabularies are tiny (<= 12 ids): a quarter of int32's disk.
    self.parts.append(rows.astype(np.uint8) if rows.size and
                      rows.max() < 256 else rows)

  def result(self, save_dir) -> dict:
    return self.hook.result(save_dir) if self.hook is not None else {}

  def array(self) -> np.ndarray:
    """[examples evaluated, seq_len] token ids (row i = example i)."""
    if not self.parts:  # no test batch
      return np.zeros((0, 0), np.uint8)
    return np.concatenate(self.parts)[:self.num_examples]


def visualize_kind(metadata):
  """'sudoku', 'maze' or 'arc'; None for datasets with no picture."""
  from trm.families.trm import sheets as visualize  # pylint: disable=g-import-not-at-top
  try:
    return visualize.kind_from_metadata(metadata)
  except ValueError:
    return None


def check_config(config) -> None:
  """Before any data is built (the paper's datasets take minutes, a
  download or ARC's 1000 augmentations): every model field, as TRMConfig
  checks it again once the dataset's sizes are known."""
  trm_model.check_forward_dtype(config.model.forward_dtype)
  trm_model.TRMConfig(vocab_size=1, seq_len=1, num_puzzle_identifiers=1,
                      **config_lib.model_kwargs(config.model,
                                                trm_model.TRMConfig, "trm"))
  if config.data.epochs_per_iter <= 0:
    raise ValueError(f"config.data.epochs_per_iter={config.data.epochs_per_iter}"
                     " must be a positive integer.")
  optimizers.check(config.optim.get("optimizer", trm_steps.DEFAULT_OPTIMIZER),
                   trm_steps.OPTIMIZER_FIELD)
  optimizers.check_multipliers(config.optim, "config.optim")
  if (config.optim.get("freeze_weights", False)
      and config.model.puzzle_emb_ndim <= 0):
    # Upstream then trains every weight, its flag unread.
    raise ValueError(
        "config.optim.freeze_weights=True trains the puzzle embeddings "
        f"alone, but config.model.puzzle_emb_ndim={config.model.puzzle_emb_ndim}"
        " gives the model none: set puzzle_emb_ndim > 0 (as the weights it "
        "starts from, config.init_checkpoint), or freeze_weights=False.")


def schedule_spans_run(config) -> bool:
  """Below lr_min_ratio=1.0 the cosine decays over config.total_steps
  (`optim.lr_schedule`), and a warmup_ratio warms up over a share of it,
  so a resume may not lengthen the run silently
  (`trm.core.config_record`)."""
  return (config.optim.lr_min_ratio != 1.0
          or config.optim.get("warmup_ratio", 0.0) > 0)


INIT_NAME = "config.init_checkpoint"


def init_source(config, workdir: str):
  """(path, step) of the weights config.init_checkpoint names: a trm.main
  workdir and its step (None: the newest readable one; WORKDIR/checkpoints/N,
  .../best or .../latest name one), or an upstream
  PyTorch / safetensors file and None. None when unset, or when `workdir`
  already holds checkpoints: the run resumes from them (said once), as a
  restarted run must. Checked before any data is built; a path that is
  none of those is refused in one line."""
  path = config.get("init_checkpoint", "")
  if not path:
    return None
  if restore_check.latest_step(os.path.join(workdir, "checkpoints")) is not None:
    logging.warning(
        "%s=%r is not read: %s holds checkpoints, and the run resumes from "
        "its newest (use another --workdir to start a new run from it).",
        INIT_NAME, path, os.path.join(workdir, "checkpoints"))
    return None
  weights_io.check_local(path, INIT_NAME, "starting weights are")
  parent, name = os.path.split(os.path.normpath(path))
  if (os.path.basename(parent) == "checkpoints" and os.path.isdir(parent)
      and (name in ("best", "latest") or (name.isascii() and name.isdigit()))):
    # One step of a workdir, named as the tools' --step names it: a number,
    # best (the lowest held-out loss, which the trainer keeps) or latest.
    # A step not on disk, or a best with none ranked, names the steps.
    from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
    spell = lambda choice: (
        f"{INIT_NAME}={os.path.join(parent, str(choice))!r}")
    step = ckpt_lib.choose_step(
        parent, name if not name.isdigit() else int(name), spell=spell)
    return os.path.dirname(parent), step
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return path, None
  if os.path.isfile(path):
    return path, None
  raise FileNotFoundError(
      f"{INIT_NAME}={path!r} is neither a trm.main workdir (a directory with "
      "checkpoints/), one of its steps (WORKDIR/checkpoints/N, or .../best) "
      "nor an upstream PyTorch checkpoint file: point it at one, or set "
      f"{INIT_NAME}='' to start from random weights.")


def _evaluated_weights(config, workdir: str, step_dir: str) -> str:
  """'ema_params' where the run in `workdir` kept an EMA (the weights it
  evaluated and `trm.export` writes, as upstream saves its EMA model),
  else 'params'; by its record (the step's, else config.json), else by
  this config."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.core import config_record  # pylint: disable=g-import-not-at-top
  from etils import epath  # pylint: disable=g-import-not-at-top
  record = ckpt_lib.saved_config_record(step_dir)
  if record is None:
    try:
      record = config_record.read_file(
          epath.Path(workdir) / config_record.RECORD)
    except (OSError, ValueError):
      record = {}
  optim = record.get("optim")
  ema = (optim.get("ema") if isinstance(optim, dict) else None)
  if not isinstance(ema, bool):
    ema = bool(config.optim.ema)
  return "ema_params" if ema else "params"


def _check_puzzle_width(got, want, where: str) -> None:
  """Only the number of identifiers may differ (upstream's mean fills any
  count; its expand fails on another width)."""
  if tuple(got[1:]) != tuple(want[1:]):
    raise ValueError(
        f"{INIT_NAME}: puzzle_emb/weights in {where} has shape {tuple(got)} "
        f"but this config needs {tuple(want)}: only its number of "
        "identifiers may differ (then every row starts at their mean); set "
        f"config.model.puzzle_emb_ndim={got[1]}, as the run that wrote it.")


def _fit_puzzle_table(table, want_rows: int, sharding, where: str):
  """The loaded table on `sharding`, or, when it holds another number of
  identifiers, `want_rows` copies of the mean of its rows (upstream
  `load_checkpoint`'s reset, said in one line)."""
  if table.shape[0] == want_rows:
    return jax.device_put(table, sharding)
  logging.warning(
      "%s: the puzzle-embedding table in %s has %d identifiers, this "
      "dataset %d: every row starts at the mean of the loaded rows, as "
      "upstream's load_checkpoint.", INIT_NAME, where, table.shape[0],
      want_rows)
  return jax.jit(
      lambda t: jnp.broadcast_to(jnp.mean(t, axis=0, keepdims=True),
                                 (want_rows,) + t.shape[1:]),
      out_shardings=sharding)(table)


def _state_around(program, ctx, shardings, params, buffers, puzzle_emb):
  """A step-0 train state (fresh optimizer state, ACT carry and counters)
  holding the given weights, as the EMA too (upstream registers its EMA
  from the loaded model). The initialiser's own weights are never made
  (unused, XLA drops them)."""
  def build(params, buffers, puzzle_emb):
    # Behind the barrier the weights are new values, so each field gets
    # buffers of its own (jit hands an output that is an input back as it
    # is): the train step donates every buffer of the state, and params
    # and EMA placed from the same arrays shared some (even with
    # device_put's may_alias=False), which crashed XLA:CPU's first step.
    params, buffers, puzzle_emb = jax.lax.optimization_barrier(
        (params, buffers, puzzle_emb))
    state = nn.meta.unbox(program.init_fn())
    return state.replace(params=params, ema_params=params, buffers=buffers,
                         puzzle_emb=puzzle_emb)

  placed = (shardings.params, shardings.buffers, shardings.puzzle_emb)
  with ctx:
    return jax.jit(build, in_shardings=placed, out_shardings=shardings)(
        *jax.device_put((params, buffers, puzzle_emb), placed))


def starting_state(config, source, program, ctx):
  """(ctx, shardings) -> the train state of `source` (`init_source`), for
  `Task.initial_state`. What can be checked without reading the weights
  (the file's shapes are read with them; a workdir's from its metadata)
  is checked now, before anything compiles."""
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  path, step = source
  abstract, _ = state_lib.abstract_state(program.init_fn, ctx)
  rows = program.model.cfg.num_puzzle_identifiers
  if os.path.isfile(path):
    from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
    params, buffers, puzzle_emb = torch_import.load_torch_checkpoint(
        path, program.model.cfg, any_puzzle_rows=True)
    logging.info("Starting weights: %s (upstream PyTorch); optimizer state "
                 "fresh, step 0.", path)

    def initial_state(ctx, shardings):
      table = {k: _fit_puzzle_table(v, rows, shardings.puzzle_emb[k], path)
               for k, v in puzzle_emb.items()}
      return _state_around(program, ctx, shardings, params, buffers, table)

    return initial_state

  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  directory = os.path.join(path, "checkpoints")
  newest = step if step is not None else restore_check.latest_step(directory)
  if newest is None:
    raise FileNotFoundError(f"{INIT_NAME}={path!r}: {directory} holds no "
                            "checkpoint; point it at a trained workdir.")
  step_dir = os.path.join(directory, str(newest))
  weights = _evaluated_weights(config, path, step_dir)
  fields = {k: getattr(abstract, k) for k in (weights, "buffers",
                                              "puzzle_emb")}
  saved = restore_check.saved_shapes(step_dir)
  saved_table = (saved or {}).get("puzzle_emb/weights")
  if fields["puzzle_emb"] and saved_table is not None:
    target = fields["puzzle_emb"]["weights"]
    _check_puzzle_width(saved_table, target.shape, step_dir)
    fields["puzzle_emb"] = {"weights": jax.ShapeDtypeStruct(
        saved_table, target.dtype, sharding=target.sharding)}
  try:
    # Not FIX's "another --workdir / --checkpoint": --workdir is the new
    # run's, and this run reads no --checkpoint.
    restore_check.check(
        directory, fields, newest, family=trm_program.DISPLAY_NAME,
        fix=(f"Point {INIT_NAME} at a run of this config's model and "
             "sizes, or set config.model as that run's config.json "
             "records it."))
  except restore_check.CheckpointMismatchError as e:
    raise restore_check.CheckpointMismatchError(
        f"{INIT_NAME}={path!r}: {e}") from None

  def initial_state(ctx, shardings):
    restored, used = ckpt_lib.restore_fields(
        directory, fields, step=step, family=trm_program.DISPLAY_NAME)
    where = os.path.join(directory, str(used))
    logging.info("Starting weights: %s step %d (its %s); optimizer state "
                 "fresh, step 0.", path, used, weights)
    table = {k: _fit_puzzle_table(v, rows, shardings.puzzle_emb[k], where)
             for k, v in restored["puzzle_emb"].items()}
    return _state_around(program, ctx, shardings, restored[weights],
                         restored["buffers"], table)

  return initial_state


def epoch_steps(config, metadata) -> tuple[float, str]:
  """(steps per epoch, what an epoch is) for config.num_epochs, counted as
  upstream's pretrain.py counts them: a whole number of iterations of
  data.epochs_per_iter epochs runs the full batches each iteration fills
  (its loop; the last partial batch of each is dropped), any other count
  upstream's total_steps formula, epochs x total_groups x
  mean_puzzle_examples / global_batch_size (`metadata`: the train
  split's)."""
  examples = metadata.total_groups * metadata.mean_puzzle_examples
  per_iter = config.data.epochs_per_iter
  iteration_steps = int(per_iter * examples) // config.global_batch_size
  epochs = config.get("num_epochs", 0)
  if iteration_steps and epochs and float(epochs / per_iter).is_integer():
    return (iteration_steps / per_iter,
            f"{iteration_steps} full batches of {config.global_batch_size} per "
            f"iteration of config.data.epochs_per_iter={per_iter} epochs, as "
            "upstream's pretrain.py")
  return (examples / config.global_batch_size,
          f"{examples:g} examples per epoch in batches of "
          f"{config.global_batch_size}, upstream's total_steps formula")


def _check_identifier_count(data_dir: str, metadata, splits) -> None:
  """num_puzzle_identifiers sizes the puzzle table: one past the largest
  identifier the splits use, or the names identifiers.json lists. A value
  far beyond both (2**31 - 1 in a handed dataset.json: a 128 GiB table)
  hung the trainer's start-up with no message."""
  count = metadata.num_puzzle_identifiers
  used = max((int(a["puzzle_identifiers"].max()) + 1 for a in splits
              if a["puzzle_identifiers"].size), default=1)
  if count <= used:
    return
  names = os.path.join(data_dir, puzzle_format.IDENTIFIERS_FILE)
  listed = None
  try:
    if os.path.isfile(names) and os.path.getsize(names) < 1 << 30:
      with open(names, encoding="utf-8") as f:
        listed = json.load(f)
  except (OSError, ValueError, RecursionError):
    listed = None
  if isinstance(listed, list) and len(listed) == count:
    return
  raise ValueError(
      f"{data_dir}: dataset.json's num_puzzle_identifiers={count:,} is more "
      f"than the splits use (largest identifier {used - 1:,}) and than "
      f"{names} lists "
      + (f"({len(listed):,} names)" if isinstance(listed, list) else
         "(no readable list)")
      + "; the puzzle table would have that many rows. Rebuild the dataset, "
      "or correct the field.")


def build(config, workdir: str, ctx) -> Task:
  check_config(config)
  source = init_source(config, workdir)
  data_dir = prepare_data(config, workdir)
  train_meta, train_arrays = puzzle_format.read_split(data_dir, "train")
  test_meta, test_arrays = puzzle_format.read_split(data_dir, "test")
  # The model is sized by the train split; a test identifier past its
  # puzzle table would read NaN embeddings (loss nan, accuracy 0, no error).
  fields = ("seq_len", "vocab_size", "num_puzzle_identifiers")
  differ = [f"{f} {getattr(train_meta, f)} != {getattr(test_meta, f)}"
            for f in fields if getattr(train_meta, f) != getattr(test_meta, f)]
  if differ:
    raise ValueError(f"{data_dir}: train and test dataset.json disagree "
                     f"({', '.join(differ)}); rebuild the dataset.")
  _check_identifier_count(data_dir, train_meta, (train_arrays, test_arrays))
  config_lib.total_steps_from_epochs(config, *epoch_steps(config,
                                                         train_meta))
  process = dict(process_index=jax.process_index(),
                 process_count=jax.process_count())
  train_source = puzzle_dataset.TrainBatches(
      train_meta, train_arrays, global_batch_size=config.global_batch_size,
      seed=config_lib.data_seed(config),
      epochs_per_iter=config.data.epochs_per_iter,
      num_batches=config.total_steps, **process)
  test_source = puzzle_dataset.TestBatches(
      test_meta, test_arrays, global_batch_size=config.data.eval_batch_size,
      max_batches=config.data.max_eval_batches, **process)
  kind = visualize_kind(train_meta)
  if config.data.name == "arc":
    # Read and checked now: the hook reads them at each evaluation, and the
    # first comes only after config.eval_every steps of training.
    from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
    arc_eval.ARCEvaluator(
        data_dir, num_puzzle_identifiers=train_meta.num_puzzle_identifiers)
  program = trm_program.build(config, ctx, train_meta)
  return Task(
      program=program,
      train_source=train_source, eval_source=test_source,
      initial_state=(starting_state(config, source, program, ctx)
                     if source is not None else None),
      make_eval_hook=functools.partial(
          EvalHook, data_dir, kind, arc=config.data.name == "arc",
          sheet_rows=config.data.eval_sheet_rows if kind else 0,
          partial=test_source.partial),
      # (The sheet is a file, no metric.)
      eval_hook_metrics=(arc_eval_names() if config.data.name == "arc"
                         else ()))


def arc_eval_names() -> tuple:
  from trm.families.trm import arc_eval  # pylint: disable=g-import-not-at-top
  return arc_eval.metric_names()


def check_eval_checkpoint(checkpoint: str) -> None:
  """`trm.evaluate --checkpoint` is a trm.main workdir or a checkpoint file;
  checked before the dataset (a mistyped path was named only after the
  test split had been built under <output_dir>/data: minutes for ARC)."""
  if not (os.path.isdir(os.path.join(checkpoint, "checkpoints"))
          or os.path.isfile(checkpoint)):
    raise FileNotFoundError(
        f"--checkpoint={checkpoint} is neither a trm.main workdir (with a "
        "checkpoints/ directory) nor an upstream PyTorch checkpoint file.")


def check_run_model(checkpoint: str, config) -> None:
  """`config` against the trm.main workdir `checkpoint`'s config.json,
  before the dataset is built: its dataset (`data.name`: a Maze config on
  a Sudoku run built, or downloaded, the Maze data before any weight's
  shape refused it), and config.model in the fields no weight shape pins
  (`torch_import.differing_fields`, as an upstream checkpoint's
  all_config.yaml is held to them; those that do not apply under mlp_t or
  without RoPE are skipped): a --config.model.rms_norm_eps the run never
  had restored and evaluated another function, silently. H/L cycles may
  differ on purpose (more recursion at test time)."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  path = os.path.join(checkpoint, "config.json")
  if not (os.path.isdir(os.path.join(checkpoint, "checkpoints"))
          and os.path.isfile(path)):
    return
  try:
    run = weights_io.read_json(path)
    recorded, dataset = run["model"], run["data"]["name"]
  except (OSError, ValueError, KeyError, TypeError):
    return  # the restore names what does not fit
  if isinstance(dataset, str) and dataset != config.data.get("name"):
    raise ValueError(
        f"--config gives config.data.name={config.data.get('name')!r}, but "
        f"the run trained on {dataset!r} ({path}): its weights fit only "
        f"that dataset's puzzles. Pass the config the run trained with "
        f"(configs/trm_{dataset}.py for the paper's).")
  if not isinstance(recorded, dict):
    return
  model = config.model
  for field, theirs, ours in torch_import.differing_fields(
      {k: v for k, v in recorded.items() if k in model}, model.get):
    raise ValueError(
        f"--config gives config.model.{field}={ours!r}, but the run "
        f"trained with {theirs!r} ({path}) and no weight shape depends on "
        "it: the evaluation would compute another model. Pass "
        f"--config.model.{field}={theirs} (the run's config.json holds "
        "its settings).")


def load_eval_state(checkpoint: str, program, abstract, shardings, ctx,
                    step: int | None = None):
  """(train state, description) for `trm.evaluate`: the weights of a
  trm.main workdir (its checkpoint `step`, default the newest readable
  one) or of an upstream PyTorch checkpoint file."""
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  saved = os.path.join(checkpoint, "checkpoints")
  names = ("params", "ema_params", "buffers", "puzzle_emb")
  check_eval_checkpoint(checkpoint)
  if os.path.isdir(saved):
    fields, step = ckpt_lib.restore_fields(
        saved, {k: getattr(abstract, k) for k in names}, step=step,
        family=trm_program.DISPLAY_NAME)
    state = state_lib.init_state(program.init_fn, ctx, shardings)
    return state.replace(**fields), f"{saved} step {step}"
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  params, buffers, puzzle_emb = torch_import.load_torch_checkpoint(
      checkpoint, program.model.cfg)
  state = state_lib.init_state(program.init_fn, ctx, shardings)
  state = state.replace(
      params=jax.device_put(params, shardings.params),
      ema_params=jax.device_put(params, shardings.ema_params),
      buffers=jax.device_put(buffers, shardings.buffers),
      puzzle_emb=jax.device_put(puzzle_emb, shardings.puzzle_emb))
  return state, f"{checkpoint} (upstream PyTorch)"
