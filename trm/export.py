r"""Export a trm.main run's weights to the formats PyTorch users read.

  python -m trm.export --config=configs/diffucoder_7b.py \
      --checkpoint=runs/dc-sft --out=DiffuCoder-7B-mine \
      --tokenizer=DiffuCoder-7B-Instruct --dtype=bfloat16
  python -m trm.export --config=configs/gpt.py:shakespeare_char \
      --checkpoint=out-shakespeare-char --out=OUT [--format=nanogpt]
  python -m trm.export --config=configs/trm_sudoku.py \
      --checkpoint=runs/sudoku --out=OUT [--format=safetensors]

GPT runs go to a Hugging Face GPT-2 directory or nanoGPT's ckpt.pt
(`trm.families.gpt.gpt_export`); TRM runs to upstream's state_dict, as its
pretrain.py saves it (`step_<N>`, the EMA weights when config.optim.ema;
`trm.families.trm.torch_import`) with its `all_config.yaml`. For DiffuCoder / Dream the rest of this
text holds: it reads the newest checkpoint of a `trm.main` workdir (or
the one `--step=best|N` names)
(parameters only), writes sharded `*.safetensors` +
`model.safetensors.index.json` + `config.json` + `generation_config.json`
(the special ids; Dream's `DreamModel.from_pretrained` refuses a directory
without one), and copies
the tokenizer files of --tokenizer's directory (its generation_config.json
replaces ours; its config.json's bos/eos ids and max_position_embeddings
go into ours, where by default bos and eos equal the pad id).

Who reads the result: this project's loaders, `DiffusionLM.from_pretrained
(OUT)`, `trm.generate --checkpoint=OUT`, `trm.evaluate --benchmark=...
--checkpoint=OUT` and `trm.main --config.init_checkpoint=OUT` (a model
trained with the byte tokenizer: add `tokenizer='bytes'` /
`--tokenizer=bytes`). `transformers` (`AutoModel.from_pretrained(OUT,
trust_remote_code=True)`) needs Dream's remote code (configuration_dream.py,
modeling_dream.py), which this project does not ship: config.json names it
in `auto_map` only when --tokenizer's directory (a Hugging Face download)
held both files and they were copied. On a pod run it on every worker, as
trm.main; process 0 writes.
"""
from __future__ import annotations

import errno
import glob
import os
import re
import shutil
import socket
import sys

from absl import app, flags
from ml_collections import config_flags

from trm.core import cli
from trm.core import distributed
from trm.core import processes

# Files of a Hugging Face model directory that are not weights or config.json.
TOKENIZER_FILES = ("tokenizer*", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json",
                   "generation_config.json", "chat_template.jinja", "*.py")


def check_tokenizer_dir(source: str) -> None:
  """--tokenizer holds a tokenizer.json, and every file an export would
  copy from it is a regular file (main checks it before the weights load,
  which takes minutes for a 7B model)."""
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  if source == "bytes":
    # What trm.generate and trm.evaluate take for a byte-tokenizer run; here
    # it was read as a directory ("bytes holds no tokenizer.json").
    raise app.UsageError(
        "--tokenizer=bytes: the byte tokenizer has no files to copy; drop "
        "--tokenizer (load the export with --tokenizer=bytes), or pass "
        "--tokenizer=./bytes for a directory of that name.")
  if not tok_lib.has_tokenizer(source):
    raise FileNotFoundError(f"{source} holds no tokenizer.json (nor "
                            "vocab.json and merges.txt); point --tokenizer "
                            "at the checkpoint you fine-tuned.")
  tokenizer_files(source)


def _link_roots(source: str) -> tuple[str, ...]:
  """Where a link in `source` may point: inside `source` itself, or, for a
  Hugging Face cache snapshot (`.../snapshots/<revision>`, or a subfolder
  of one, whose files are links to `../../blobs/<hash>`), inside that
  repository's `blobs/`."""
  real = os.path.realpath(source)
  revision = real
  while os.path.basename(os.path.dirname(revision)) != "snapshots":
    if os.path.dirname(revision) == revision:  # no snapshot: only itself
      return (real,)
    revision = os.path.dirname(revision)
  blobs = os.path.join(os.path.dirname(os.path.dirname(revision)), "blobs")
  # The hub writes blobs/ as a directory; one that is a link (to `/` or
  # `~`) would make every file on the machine a "blob".
  if os.path.isdir(blobs) and not os.path.islink(blobs):
    return (real, blobs)
  return (real,)


def tokenizer_files(source: str) -> list[str]:
  """The paths of `source` that `TOKENIZER_FILES` name. A directory that
  a pattern matches (a `tokenizer_cache/`) is no file to copy and is
  skipped; a FIFO, device or broken link is refused (copying it failed
  only after every weight had been read and written), and so is a link
  out of `source` (and out of a Hugging Face snapshot's blobs): a crafted
  `tokenizer_config.json -> ~/.ssh/id_rsa` put the key into the export."""
  paths, roots = [], _link_roots(source)
  for pattern in TOKENIZER_FILES:
    for path in sorted(glob.glob(os.path.join(source, pattern))):
      if os.path.isdir(path):
        continue
      if not os.path.isfile(path):
        raise app.UsageError(
            f"--tokenizer={source}: {os.path.basename(path)} is not a "
            "regular file (a FIFO, device or broken link), so it cannot be "
            "copied into the export; remove it or point --tokenizer at the "
            "Hugging Face download.")
      target = os.path.realpath(path)
      if not any(cli.within(target, root) for root in roots):
        raise app.UsageError(
            f"--tokenizer={source}: {os.path.basename(path)} is a link out "
            f"of that directory (to {target}), which the export would copy "
            "into its output; copy the file there itself or point "
            "--tokenizer at the Hugging Face download.")
      paths.append(path)
  return paths


def check_tokenizer_fits(source: str, cfg) -> None:
  """--tokenizer's tokenizer.json is the model's: its <|mask|> id is
  config.model.mask_token_id and its ids fit the vocabulary. The export
  copies it beside the weights, and every loader of the export (ours
  included) refuses a tokenizer that does not fit; the export itself
  succeeded before."""
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  try:
    tok_lib.from_spec(source, cfg, "--tokenizer")
  except ValueError as e:
    raise app.UsageError(f"--tokenizer={source}: {e} The export would "
                         "ship a tokenizer its loaders refuse; point "
                         "--tokenizer at the checkpoint the run was "
                         "fine-tuned from.") from None


def copy_tokenizer_files(source: str, out: str) -> list[str]:
  check_tokenizer_dir(source)
  copied = []
  for path in tokenizer_files(source):
    shutil.copy2(path, out)
    copied.append(os.path.basename(path))
  return copied


def link_remote_code(directory: str, copied: list[str]) -> bool:
  """Adds `auto_map` to `directory`'s config.json when the remote code it
  names (Dream's configuration and modeling files) was copied there; True
  if it did. Without those files the claim would send `transformers` after
  files that are not there."""
  import json  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
  needed = {f"{name.split('.')[0]}.py" for name in
            hf_config.REMOTE_CODE.values()}
  if not needed <= set(copied):
    return False
  path = os.path.join(directory, "config.json")
  with open(path) as f:
    config = json.load(f)
  config["auto_map"] = dict(hf_config.REMOTE_CODE)
  with open(path, "w") as f:
    json.dump(config, f, indent=2)
  return True


def check_local_sources(checkpoint: str | None,
                        tokenizer: str | None) -> None:
  """A gs:// --checkpoint or --tokenizer is refused in one line saying how
  to copy it, before anything is read (it was "not a trm.main workdir").
  The run's config.json and checkpoint metadata are read with os, and the
  tokenizer files are copied with shutil: local paths only."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  if checkpoint:
    weights_io.check_local(checkpoint, "--checkpoint",
                           "trm.main workdirs are")
  if tokenizer:
    weights_io.check_local(tokenizer, "--tokenizer", "tokenizer files are")


# What an export writes its weights to (hf: model.safetensors or its
# shards; nanogpt: ckpt.pt; TRM's torch format: step_<N>): a folder holding
# one of these files is an earlier export, which --overwrite replaces.
EXPORT_WEIGHTS = re.compile(r"model.*\.safetensors|ckpt\.pt|step_[0-9]+")


def is_earlier_export(path: str) -> bool:
  """Whether the folder `path` is empty or looks like an earlier export:
  one of its files has an EXPORT_WEIGHTS name. What a user added to an
  export (a README.md, an onnx/ conversion, a hub's .cache/) does not make
  it the run's folder; a folder of the run (logs, evaluations, a dataset
  split) holds no such file."""
  try:
    names = os.listdir(path)
  except OSError:
    return False
  return not names or any(
      EXPORT_WEIGHTS.fullmatch(name)
      and os.path.isfile(os.path.join(path, name)) for name in names)


def _placed_within(out: str, folder: str) -> bool:
  """Whether --out as spelled lies in `folder` (one of its ancestors is
  there), wherever a link on the way leads: a link in the workdir to
  another disk is still a folder of the run."""
  path = os.path.abspath(out)
  while os.path.dirname(path) != path:
    path = os.path.dirname(path)
    if cli.within(path, folder):
      return True
  return False


def check_out_spares_folder(out: str, folder: str, named: str) -> None:
  """--out in `folder` (an input, `named` in the error) may be a new folder,
  an empty one or an earlier export; any other would be replaced as a
  whole, deleting files of the input (a split of the dataset, a run's
  logs). Through a link too (in `folder`, or leading into it)."""
  target = resolve_out(out)
  if (os.path.isdir(target)
      and (cli.within(target, folder) or _placed_within(out, folder))
      and not cli.within(folder, target) and not is_earlier_export(target)):
    raise app.UsageError(
        f"--out={out} is a folder of {named} that holds no earlier export "
        "(no model*.safetensors, ckpt.pt or step_N): the export would "
        "replace it and delete its files. Export to a new directory.")


def _holds_tokenizer(source: str) -> bool:
  from trm.data.text import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  return os.path.isdir(source) and tok_lib.has_tokenizer(source)


def check_out_dir(out: str, tokenizer: str | None, overwrite: bool,
                  checkpoint: str | None = None,
                  config: str | None = None) -> None:
  """Refuses, before anything is read or written, an --out that would mix
  with other files or destroy an input: the --config file, the tokenizer
  source or the checkpoint (paths compared resolved: links, `..`)."""
  if not out:  # resolve_out would make it "/", and the export went there
    raise app.UsageError("--out is empty; pass the directory to export to.")
  if "://" in out:
    raise app.UsageError(f"--out={out}: export to a local directory, then "
                         "copy it (an object store cannot swap a directory "
                         "in atomically).")
  # --overwrite swaps --out in as a whole: a --config file in it was gone.
  if config and "://" not in config and cli.within(config, out):
    raise app.UsageError(
        f"--out={out} holds --config={config}, which the export reads: "
        "replacing --out would delete it. Export to a new directory, or "
        "keep the config file elsewhere.")
  if tokenizer and cli.within(tokenizer, out):
    raise app.UsageError(
        f"--out={out} equals or contains --tokenizer={tokenizer}: the "
        "export would replace the files it copies. Export to a new "
        "directory.")
  # The tokenizer's folder is a source (a Hugging Face download): no export
  # goes into it, new or replacing one of its folders (original/ weights).
  # A folder without a tokenizer is refused as such (check_tokenizer_dir).
  if (tokenizer and "://" not in tokenizer and cli.within(out, tokenizer)
      and _holds_tokenizer(tokenizer)):
    raise app.UsageError(
        f"--out={out} lies in --tokenizer={tokenizer}, the download the "
        "export copies from: it would write into (or, with --overwrite, "
        "replace a folder of) it. Export to a new directory outside it.")
  # --overwrite swaps --out in as a whole: the run's checkpoints would go.
  # Its checkpoints/ may be a link to another disk: where it leads counts.
  checkpoints = os.path.join(checkpoint or "", "checkpoints")
  if checkpoint and (cli.within(checkpoint, out)
                     or cli.within(checkpoints, out)
                     or cli.within(out, checkpoints)):
    raise app.UsageError(
        f"--out={out} equals or contains --checkpoint={checkpoint} or its "
        "checkpoints/ (where a link leads), or lies in them: the export "
        "would replace the checkpoints it reads. Export to a directory "
        "outside them.")
  if checkpoint:
    check_out_spares_folder(out, checkpoint, f"--checkpoint={checkpoint}")
  # The swap renames --out, which fails for the process's own directory
  # ("Device or resource busy: '.'") after every weight was written.
  if cli.within(os.getcwd(), resolve_out(out)):
    raise app.UsageError(
        f"--out={out} is or contains the current directory, which the "
        "export cannot replace (it is written beside --out and renamed into "
        "place); pass a directory that does not hold the current one.")
  if os.path.exists(out) and not os.path.isdir(out):
    raise app.UsageError(f"--out={out} is a file; pass a directory.")
  try:
    os.stat(out)
  except OSError as e:  # a link to a path still to be created is fine
    if e.errno == errno.ELOOP:
      raise app.UsageError(
          f"--out={out} is a symbolic link that loops (it never reaches a "
          "directory); pass a directory, or a link to one.") from None
  # The export is staged beside --out (or its link's target) and renamed:
  # that directory must take new entries. Checked here, not when the
  # staging directory is made, after minutes of reading weights.
  # Its nearest existing ancestor: makedirs creates the rest.
  parent = cli.nearest_existing(os.path.dirname(os.path.abspath(
      resolve_out(out))))
  if not os.path.isdir(parent):
    # os.access said "cannot be written" (or, for an executable file as
    # root, let it pass to a bare "Not a directory" after the weights).
    raise app.UsageError(
        f"--out={out}: {parent} is a file, not a directory, so nothing can "
        "be written under it; pass a directory path.")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise app.UsageError(
        f"--out={out}: {parent} cannot be written (a read-only file system "
        "or no permission), and the export is written beside --out; pass "
        "a directory you can write.")
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise app.UsageError(
        f"--out={out} is not empty. An export into it would mix its files "
        "(e.g. an old model.safetensors, which loaders read first) "
        "with the new weights. Use a new directory, or --overwrite to "
        "replace the whole directory with the export.")


def check_out_spares_data(out: str, config, workdir: str) -> None:
  """A TRM export reads the run's dataset (the model's sizes) and names it
  in all_config.yaml: an --out that is or holds it was replaced by the
  export under --overwrite (as the checkpoints were, see check_out_dir)."""
  from trm.families.trm import task as trm_task  # pylint: disable=g-import-not-at-top
  data_dir = trm_task.run_data_dir(config, workdir, workdir)
  if cli.within(data_dir, resolve_out(out)):
    raise app.UsageError(
        f"--out={out} equals or contains the run's dataset {data_dir}, "
        "which the export reads and its all_config.yaml names: the export "
        "would replace it. Export to a directory outside it.")
  check_out_spares_folder(out, data_dir, f"the run's dataset {data_dir}")


def resolve_out(out: str) -> str:
  """Where the export goes: --out itself, or, when --out is a symbolic link
  (to a directory, or to a path still to be created), the path it points
  at. The export is then written beside the target and swapped in there,
  so the link stays and shows the export; renaming the link itself would
  replace it by a plain directory and leave the old target behind."""
  out = out.rstrip(os.sep) or os.sep
  if os.path.islink(out):
    return os.path.realpath(out)
  return out


def _host() -> str:
  """This machine's name as it may appear in a file name."""
  return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"


def _sibling(out: str, kind: str) -> str:
  """`out`'s sibling of `kind` ('partial' or 'replaced') for this process.
  The host is in the name so that a later export removes only leftovers
  whose process it can see has ended."""
  return f"{out.rstrip(os.sep)}.{kind}-{_host()}-{os.getpid()}"


def staging_dir(out: str) -> str:
  """The sibling directory an export is written to before `swap_in`."""
  return _sibling(out, "partial")


def recover_interrupted(out: str) -> list[str]:
  """Tidies what an export killed on this host left beside `out` (a
  SIGKILL, a lost machine: its `finally` never ran), before a new export
  begins. A staging directory (`out.partial-HOST-PID`) is a half-written
  export, 15 GB for a 7B model, which nothing else removes: deleted. An
  `out.replaced-HOST-PID` is the previous export, renamed aside by
  `swap_in`: with no `out` (killed between the two renames) it is renamed
  back, so the previous export is not lost; beside a new `out` (killed
  while deleting it) it is deleted. Only leftovers whose process has ended
  are touched (this process's pid too: it has written nothing yet, so
  such a leftover is an earlier process's). Call it before the export
  begins. Returns what was done, one line each."""
  out = out.rstrip(os.sep) or os.sep
  if out == os.sep:
    return []
  parent = os.path.dirname(os.path.abspath(out))
  try:
    names = os.listdir(parent)
  except OSError:
    return []
  # Names before the host was added (`out.partial-PID`) count as this
  # host's.
  leftover = re.compile(re.escape(os.path.basename(out))
                        + r"\.(partial|replaced)-(?:" + re.escape(_host())
                        + r"-)?(\d+)")
  done = []
  for name in sorted(names):
    match = leftover.fullmatch(name)
    # This process has staged nothing yet: a leftover with its pid is an
    # earlier process's (a container restarted under the same host name,
    # its export again pid 1).
    if not match or not (int(match.group(2)) == os.getpid()
                         or not processes.alive(int(match.group(2)))):
      continue
    path = os.path.join(parent, name)
    if os.path.islink(path) or not os.path.isdir(path):
      continue
    if match.group(1) == "replaced" and not os.path.lexists(out):
      try:
        os.rename(path, out)
        done.append(f"restored the previous export {path} to {out} (an "
                    "export was killed while replacing it)")
        continue
      except OSError:  # another process restored it first
        pass
    shutil.rmtree(path, ignore_errors=True)
    if not os.path.lexists(path):
      done.append(f"removed {path}, left by an export that was killed")
  return done


def swap_in(staging: str, out: str) -> None:
  """Moves the finished export to `out`; an existing `out` is replaced as a
  whole (renamed aside, then deleted), so no file of it remains."""
  if os.path.isdir(out):
    old = _sibling(out, "replaced")
    os.rename(out, old)
    try:
      os.rename(staging, out)
    except BaseException:  # a stop signal (cli.Interrupted) in between
      if not os.path.lexists(out):
        os.rename(old, out)
      raise
    shutil.rmtree(old)
  else:
    os.rename(staging, out)


# The formats each model family is written in; the first is the default.
FORMATS = {"dream": ("hf",), "gpt": ("hf", "nanogpt"),
           "trm": ("torch", "safetensors")}
# --dtype unset: what each family's readers expect (the hub's DiffuCoder is
# bfloat16; GPT-2's and nanoGPT's checkpoints float32).
DEFAULT_DTYPES = {"dream": "bfloat16", "gpt": "float32"}


def check_format(family: str, fmt: str | None, dtype: str | None,
                 tokenizer: str | None) -> str:
  """The format to write for `family`; a combination that cannot be
  written is one line before anything is read."""
  if family not in FORMATS:
    raise app.UsageError(
        f"--config's config.model.name={family!r}: trm.export writes "
        f"{', '.join(sorted(FORMATS))} runs.")
  fmt = fmt or FORMATS[family][0]
  if fmt not in FORMATS[family]:
    raise app.UsageError(
        f"--format={fmt}: a {family} run is written as "
        f"{' or '.join(FORMATS[family])}.")
  if dtype and (family == "trm" or fmt == "nanogpt"):
    raise app.UsageError(
        f"--dtype={dtype}: --format={fmt} stores the dtypes its PyTorch "
        "readers expect (float32 weights); drop --dtype.")
  if tokenizer and fmt != "hf":
    raise app.UsageError(
        f"--tokenizer: a --format={fmt} export holds weights only; "
        "tokenizer files go with Hugging Face exports (--format=hf).")
  return fmt


def _dream_writer(config, checkpoint: str, ctx, fmt: str, dtype: str | None,
                  step: int | None = None):
  """(write(directory) -> files, description) for a DiffuCoder/Dream run."""
  del fmt  # hf only
  from trm import generate  # pylint: disable=g-import-not-at-top
  from trm.families.dream import model as dream  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
  from trm.families.dream import hf_import  # pylint: disable=g-import-not-at-top
  cfg = dream.DreamConfig.from_config(config.model)
  # The fine-tuned checkpoint's bos/eos and position limit, checked before
  # any weight is read.
  source_fields = (hf_config.fields_from_source(_TOKENIZER.value, cfg)
                   if _TOKENIZER.value else None)
  if _TOKENIZER.value:
    hf_config.check_source_generation_config(_TOKENIZER.value, cfg)
    check_tokenizer_fits(_TOKENIZER.value, cfg)
  _, shardings = ctx.boxed_shardings(lambda: dream.abstract_params(cfg))
  params, source = generate.load_params(checkpoint, cfg, shardings,
                                        checkpoint_step=step,
                                        step_name="--step")
  return (lambda out: hf_import.export_hf_checkpoint(
      params, cfg, out, dtype=dtype or DEFAULT_DTYPES["dream"],
      source_fields=source_fields)), source


def _recorded_config(workdir: str) -> dict:
  """The run's config.json ({} when it has none). One that is there but
  unreadable is refused: read as none, the export described the run by
  --config's optimizer settings and skipped the family check."""
  from trm.core import weights_io  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "config.json")
  if not os.path.lexists(path):
    return {}
  fix = ("it is the run's record of its config: restore it from a copy, or "
         "move it aside to export by the checkpoint's shapes and --config "
         "alone")
  try:
    recorded = weights_io.read_json(path, fix)
  except (OSError, ValueError) as e:
    raise app.UsageError(str(e)) from None
  if not isinstance(recorded, dict):
    raise app.UsageError(f"{path} holds a JSON {type(recorded).__name__}, "
                         f"not a config; {fix}.")
  return recorded


def _recorded_model(workdir: str) -> dict:
  """The run's config.json `model` section ({} when there is none to
  read: runs are then checked by their checkpoint's shapes alone)."""
  model = _recorded_config(workdir).get("model")
  return model if isinstance(model, dict) else {}


# nanoGPT's optimizer settings: the AdamW an export's state was made by
# (grad_clip > 0 adds a stage to the state's tree) and the hyperparameters
# torch's load_state_dict takes from the export's parameter groups.
_GPT_OPTIMIZER_FIELDS = ("learning_rate", "beta1", "beta2", "weight_decay",
                         "grad_clip")
# A TRM run's training settings, which its all_config.yaml records.
_TRM_RUN_FIELDS = ("global_batch_size", "total_steps", "seed", "eval_every",
                   "checkpoint_every", "data.epochs_per_iter", "optim.lr",
                   "optim.lr_min_ratio", "optim.warmup_steps",
                   "optim.warmup_ratio", "optim.beta1",
                   "optim.beta2", "optim.weight_decay", "optim.puzzle_emb_lr",
                   "optim.puzzle_emb_weight_decay", "optim.ema",
                   "optim.ema_rate")


def _run_optimizer_config(config, workdir: str,
                          fields=_GPT_OPTIMIZER_FIELDS):
  """`config` with the run's own `fields` (dotted) where its config.json
  records them: an export's --config may differ there (they shape no
  weight), and the AdamW state must be read, and the run described, as
  it was."""
  recorded = _recorded_config(workdir)
  config = config.copy_and_resolve_references()
  for field in fields:
    *parents, last = field.split(".")
    value, section = recorded, config
    for key in parents:
      value = value.get(key) if isinstance(value, dict) else None
      section = section[key]
    value = value.get(last) if isinstance(value, dict) else None
    if isinstance(section[last], bool):
      if isinstance(value, bool):
        section[last] = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      section[last] = type(section[last])(value)
  return config


def check_nanogpt_optimizer(workdir: str, config) -> None:
  """nanoGPT's ckpt.pt holds AdamW's state, which its train.py resumes: a
  run that trained with another config.optimizer (its config.json, else
  --config's) is one line, before anything is read, not a file whose
  optimizer state is another optimizer's (or none)."""
  recorded = _recorded_config(workdir)
  optimizer = recorded.get("optimizer", "adamw" if recorded
                           else config.get("optimizer", "adamw"))
  if optimizer != "adamw":
    raise app.UsageError(
        f"--format=nanogpt writes nanoGPT's AdamW state, but {workdir} "
        f"trained with config.optimizer={optimizer!r}: export its weights "
        "with --format=hf instead.")


def check_run_family(workdir: str, family: str) -> None:
  """A run of another model family is named before its data or weights
  are looked for (a TRM config on a GPT run asked for a puzzle dataset)."""
  name = _recorded_model(workdir).get("name")
  if isinstance(name, str) and name != family:
    raise app.UsageError(
        f"--checkpoint={workdir} is a config.model.name={name!r} run (its "
        f"config.json), but --config describes {family!r}: pass the config "
        "the run trained with.")


def check_run_model(workdir: str, model, family: str) -> None:
  """--config's fields of config.model (`_model_fields(family)`), which
  the export writes into its config.json (all_config.yaml for TRM) but
  which no weight's shape shows (RoPE base, norm epsilon, special ids,
  GPT's head count), must be those the run trained with (its
  config.json): otherwise the checkpoint
  restores and the export labels its weights with another model's
  settings, which its readers then run. TRM's fields are compared as
  trm.evaluate compares them (`torch_import.differing_fields`: floats as
  numbers, num_heads and RoPE's skipped where they do not apply)."""
  fields = _model_fields(family)
  recorded = {k: v for k, v in _recorded_model(workdir).items()
              if k in fields and k in model}
  if family == "trm":
    from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
    differing = torch_import.differing_fields(recorded, model.get, fields)
  else:
    differing = ((field, recorded[field], model[field]) for field in fields
                 if field in recorded and recorded[field] != model[field])
  for field, _, _ in differing:
    raise app.UsageError(
        f"--config gives config.model.{field}={model[field]!r}, but the "
        f"run trained with {recorded[field]!r} "
        f"({os.path.join(workdir, 'config.json')}): the export would "
        "describe its weights as another model's. Pass the config (and "
        "--config.* overrides) the run trained with.")


def _model_fields(family: str) -> tuple[str, ...]:
  """config.model's fields an export of `family` writes into its config
  (config.json, all_config.yaml) that no weight's shape shows."""
  if family == "dream":
    from trm.families.dream import hf_config  # pylint: disable=g-import-not-at-top
    return hf_config.CONFIG_FIELDS
  if family == "trm":
    from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
    return torch_import.RUN_CONFIG_FIELDS
  # GPT: c_attn is [D, 3D] for any head count.
  return ("n_head",)


def _recorded_vocab_size(workdir: str) -> int:
  """config.model.vocab_size as the run recorded it in its config.json
  (the dataset's vocabulary, where the config file says 0)."""
  path = os.path.join(workdir, "config.json")
  vocab = _recorded_model(workdir).get("vocab_size")
  if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab <= 0:
    raise app.UsageError(
        f"config.model.vocab_size=0 means the run's dataset's vocabulary, "
        f"and {path} records none; pass --config.model.vocab_size=N, the "
        "run's.")
  return vocab


def _gpt_writer(config, checkpoint: str, ctx, fmt: str, dtype: str | None,
                step: int | None = None):
  """(write, description) for a GPT run: a Hugging Face GPT-2 directory or
  nanoGPT's ckpt.pt."""
  from trm.families.gpt import gpt_export  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import gpt_import  # pylint: disable=g-import-not-at-top
  from trm.families.gpt import model as gpt  # pylint: disable=g-import-not-at-top
  model = dict(config.model)
  if not model.get("vocab_size"):  # 0: the dataset's, as the run resolved it
    model["vocab_size"] = _recorded_vocab_size(checkpoint)
  cfg = gpt.GPTConfig.from_config(model)
  try:
    gpt_export.check_exportable(cfg)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  if fmt == "nanogpt":  # with AdamW's state: nanoGPT's train.py resumes
    from trm.families.gpt import steps as gpt_steps  # pylint: disable=g-import-not-at-top
    check_nanogpt_optimizer(checkpoint, config)
    run_config = _run_optimizer_config(config, checkpoint)
    params, adam, step, best = gpt_import.restore_run_training(
        checkpoint, cfg, ctx, gpt_steps.make_optimizer(run_config), step)
    hyper = {k: run_config[k] for k in ("learning_rate", "beta1", "beta2",
                                        "weight_decay")}
    return (lambda out: gpt_export.export_nanogpt(
        params, cfg, os.path.join(out, gpt_export.NANOGPT_FILE), step,
        dataset=config.get("dataset"), adam=adam, hyper=hyper,
        best_val_loss=best, consume=True)), f"{checkpoint} step {step}"
  params, step = gpt_import.restore_run_params(checkpoint, cfg, ctx, step)
  source = f"{checkpoint} step {step}"
  return (lambda out: gpt_export.export_hf_gpt2(
      params, cfg, out, dtype=dtype or DEFAULT_DTYPES["gpt"])), source


def _trm_writer(config, checkpoint: str, ctx, fmt: str, dtype: str | None,
                step: int | None = None):
  """(write, description) for a TRM run: upstream's state_dict, in the
  file upstream's pretrain.py saves (`step_<N>`, torch.save) or as
  model.safetensors (no torch needed), and the all_config.yaml it writes
  beside them."""
  del dtype  # refused by check_format
  import jax  # pylint: disable=g-import-not-at-top
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  params, buffers, puzzle_emb, cfg, step, run_config = (
      torch_import.restore_run_variables(
          config, checkpoint, ctx,
          _run_optimizer_config(config, checkpoint, _TRM_RUN_FIELDS),
          step))
  name = f"step_{step}" if fmt == "torch" else "model.safetensors"

  def write(out):
    torch_import.export_torch_checkpoint(params, buffers, puzzle_emb, cfg,
                                         os.path.join(out, name))
    if jax.process_index() != 0:
      return [name]
    # Upstream builds the model from it, and every reader of the weights
    # (ours too) is held to the arch they were trained with.
    return [name, torch_import.write_run_config(out, run_config)]
  weights = "EMA " if config.optim.ema else ""
  return write, f"{checkpoint} step {step} ({weights}parameters)"


_WRITERS = {"dream": _dream_writer, "gpt": _gpt_writer, "trm": _trm_writer}


def config_file() -> str:
  """--config's file ('configs/gpt.py:shakespeare_char': its argument
  dropped)."""
  return config_flags.get_config_filename(flags.FLAGS["config"]).split(
      ":", 1)[0]


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if _TOKENIZER.value == "":  # `if _TOKENIZER.value` took it as unset
    raise app.UsageError("--tokenizer is given but empty: pass the "
                         "directory whose tokenizer files to copy, or leave "
                         "it out.")
  family = config.model.get("name", "dream")
  fmt = check_format(family, _FORMAT.value, _DTYPE.value, _TOKENIZER.value)
  check_local_sources(_CHECKPOINT.value, _TOKENIZER.value)
  out_flag = cli.expand_home(_OUT.value or "")
  if out_flag:
    for line in recover_interrupted(resolve_out(out_flag)):
      print(f"trm.export: warning: {line}", file=sys.stderr)
  check_out_dir(out_flag, _TOKENIZER.value, _OVERWRITE.value,
                _CHECKPOINT.value, config_file())
  if _TOKENIZER.value:
    check_tokenizer_dir(_TOKENIZER.value)
  if not os.path.isdir(os.path.join(_CHECKPOINT.value, "checkpoints")):
    raise app.UsageError(f"--checkpoint={_CHECKPOINT.value} is not a trm.main "
                         "workdir (it has no checkpoints/ directory).")
  check_run_family(_CHECKPOINT.value, family)
  check_run_model(_CHECKPOINT.value, config.model, family)
  step = cli.workdir_step(_CHECKPOINT.value, _STEP.value)
  if family == "trm":
    check_out_spares_data(out_flag, config, _CHECKPOINT.value)
  if fmt in ("torch", "nanogpt"):  # torch.save: before the weights load
    try:
      import torch  # pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      other = "safetensors" if family == "trm" else "hf"
      raise app.UsageError(
          f"--format={fmt} is written with torch.save, and PyTorch is not "
          f"installed: pip install torch (CPU wheels suffice), or pass "
          f"--format={other}.") from None
  import jax  # pylint: disable=g-import-not-at-top
  distributed.initialize_distributed(jax)
  from trm.core import mesh as mesh_lib  # pylint: disable=g-import-not-at-top

  ctx = mesh_lib.ShardingContext.from_config(config)
  write, source = _WRITERS[family](config, _CHECKPOINT.value, ctx, fmt,
                                   _DTYPE.value, step)
  # Everything goes to a sibling directory first: a failed export leaves
  # --out as it was. Through a symbolic link, into the directory it names.
  out = resolve_out(out_flag)
  staging = staging_dir(out)
  copied = []
  try:
    files = write(staging)
    if jax.process_index() == 0:
      copied = (copy_tokenizer_files(_TOKENIZER.value, staging)
                if _TOKENIZER.value else [])
      if family == "dream":
        link_remote_code(staging, copied)
      swap_in(staging, out)
  finally:
    if os.path.isdir(staging):
      shutil.rmtree(staging, ignore_errors=True)
  if jax.process_index() == 0:
    via = (f" (through the link {out_flag})"
           if out != out_flag.rstrip(os.sep) else "")
    print(f"exported {source} to {out}{via}: {', '.join(files)}"
          + (f", {', '.join(copied)}" if copied else ""))


# A stop signal's line (trm.core.cli's is about training); SIGTERM exits 143.
STOPPED_LINE = ("{tool}: stopped by {name} before it reported the export "
                "done: --out holds the previous export or the whole new one, "
                "never a mix; run it again.")


def define_flags():
  global _CONFIG, _CHECKPOINT, _OUT, _TOKENIZER, _DTYPE, _FORMAT
  global _OVERWRITE, _STEP
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Model config.",
                                            lock_config=True)
  _CHECKPOINT = flags.DEFINE_string("checkpoint", None, "trm.main workdir.")
  _STEP = cli.define_step_flag()
  _OUT = flags.DEFINE_string(
      "out", None, "Output directory (a symbolic link to one: the export "
      "goes into the directory it points at).")
  _TOKENIZER = flags.DEFINE_string(
      "tokenizer", None, "Directory whose tokenizer files (and Dream's "
      "remote code, if it holds it) are copied: the checkpoint you "
      "fine-tuned from. Unset (a byte-tokenizer run): load the export with "
      "--tokenizer=bytes.")
  _DTYPE = flags.DEFINE_enum(
      "dtype", None, ["bfloat16", "float32"], "Stored dtype of a Hugging "
      "Face export; unset: bfloat16 for DiffuCoder/Dream (the hub's), "
      "float32 for GPT.")
  _FORMAT = flags.DEFINE_enum(
      "format", None, sorted({f for fs in FORMATS.values() for f in fs}),
      "What to write; unset: hf for DiffuCoder/Dream and GPT, torch for "
      "TRM. hf: a Hugging Face directory (Dream's layout; GPT-2's "
      "GPT2LMHeadModel). nanogpt (GPT): nanoGPT's ckpt.pt. torch / "
      "safetensors (TRM): upstream's state_dict as pretrain.py saves it "
      "(step_<N>), or as model.safetensors.")
  _OVERWRITE = flags.DEFINE_bool(
      "overwrite", False, "Replace a non-empty --out as a whole (the new "
      "export is written beside it and swapped in; no old file remains).")


if __name__ == "__main__":
  define_flags()
  flags.mark_flags_as_required(["config", "checkpoint", "out"])
  cli.run(main, stopped_line=STOPPED_LINE)
