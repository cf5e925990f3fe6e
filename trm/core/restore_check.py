"""Does a saved train state fit the current config? Checked before Orbax
restores it, so that a checkpoint of another model, or of other sizes, fails
with one message naming the checkpoint, the tensor and the config instead of
Orbax's "Requested shape ... is not compatible" or tree-structure errors.

Only the checkpoint's metadata (paths and shapes) is read; nothing is
written or deleted.
"""
from __future__ import annotations

import os

import jax
from etils import epath

# Path names shown in a message at most.
_SHOW = 4


class CheckpointMismatchError(ValueError):
  """A saved train state whose tree or shapes do not match the config."""


def _name(key) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def path_name(path) -> str:
  """'params/L_level/.../kernel' for a tree path (as messages name it)."""
  return "/".join(_name(k) for k in path)


def _shapes(tree) -> dict[str, tuple[int, ...]]:
  """'params/L_level/.../kernel' -> shape, for every array leaf."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {path_name(path): tuple(leaf.shape)
          for path, leaf in leaves if hasattr(leaf, "shape")}


def latest_step(directory: str) -> int | None:
  """The newest finished step directory (Orbax names it by the step alone;
  unfinished saves carry a temporary suffix)."""
  path = epath.Path(directory)
  if not path.exists():
    return None
  steps = [int(p.name) for p in path.iterdir() if p.name.isdigit()
           and ("://" not in directory
                or (p / "commit_success.txt").exists())]
  return max(steps) if steps else None


def saved_shapes(step_dir: str) -> dict[str, tuple[int, ...]] | None:
  """Shapes of the `state` item of a step, from its metadata; None if the
  metadata cannot be read (the restore then reports what is wrong)."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  if "://" not in step_dir:  # Orbax reads local paths only when absolute
    step_dir = os.path.abspath(step_dir)
  try:
    # The item's handler, not a Checkpointer: that one also looks for a
    # step's _CHECKPOINT_METADATA inside the item's directory, where
    # CheckpointManager never writes one, and logs a warning on every read.
    metadata = ocp.PyTreeCheckpointHandler().metadata(
        epath.Path(step_dir) / "state")
    return _shapes(getattr(metadata, "tree", metadata)) or None
  except Exception:  # pylint: disable=broad-except
    return None


def _family(paths) -> str:
  """The display name of the registered family whose state has these
  tensor paths (each family's `program.owns_state`), or 'unknown'."""
  from trm import families  # pylint: disable=g-import-not-at-top
  return families.name_of_state(paths) or "unknown"


def _short(paths) -> str:
  paths = sorted(paths)
  more = f" and {len(paths) - _SHOW} more" if len(paths) > _SHOW else ""
  return ", ".join(paths[:_SHOW]) + more


# What to do about a checkpoint that does not fit the config: resumed,
# evaluated or exported, its run's own config or another run reads it.
FIX = ("Use the config that wrote it (the run's config.json), or another "
       "--workdir / --checkpoint.")


def check(directory: str, abstract, step: int | None = None,
          fields=None, family: str | None = None,
          optional=(), fix: str = FIX) -> list[str]:
  """Raises CheckpointMismatchError unless step `step` (default: the newest)
  of the Orbax checkpoints in `directory` holds a state with the tree and
  shapes of `abstract` (a pytree of arrays or ShapeDtypeStructs, e.g. the
  abstract TrainState or {'params': ...}). With `fields` (or when `abstract`
  is a dict), only those top-level fields are compared, as a partial restore
  reads them; `family` ('TRM (puzzle)' or 'DiffuCoder/Dream') names the
  model the config describes when the tensors alone do not tell. Top-level
  fields named in `optional` (fields a later version added) may be absent
  from the checkpoint: returns those it lacks, [] if none (or nothing was
  read: no checkpoint, or metadata that cannot be read). `fix` ends each
  refusal: what the caller's user can do (the default: `FIX`)."""
  step = latest_step(directory) if step is None else step
  if step is None:
    return []
  step_dir = os.path.join(str(directory), str(step))
  saved = saved_shapes(step_dir)
  if saved is None:
    return []
  expected = _shapes(abstract)
  if fields is None and isinstance(abstract, dict):
    fields = list(abstract)
  saved_fields = {p.split("/")[0] for p in saved}
  absent = sorted({p.split("/")[0] for p in expected}
                  & (set(optional) - saved_fields))
  expected = {p: s for p, s in expected.items()
              if p.split("/")[0] not in absent}
  expected_fields = {p.split("/")[0] for p in expected}
  ours = family or _family(expected)
  theirs = _family(saved)
  if fields is not None:
    saved = {p: s for p, s in saved.items() if p.split("/")[0] in fields}
    expected = {p: s for p, s in expected.items()
                if p.split("/")[0] in fields}
  where = f"Checkpoint {step_dir}"
  # The puzzle table is an empty field (nothing saved) when
  # config.model.puzzle_emb_ndim is 0, and a config difference otherwise
  # (reported with the tensors below): only the other fields tell a model
  # apart. Before, every checkpoint of a run without puzzle embeddings was
  # refused here as "written by another model" by trm.evaluate and
  # trm.export.
  lacking = sorted(set(fields or ()) - saved_fields - {"puzzle_emb"})
  if (ours != "unknown" and ours != theirs) or lacking:
    wanted = (f"a {ours} model" if ours != "unknown"
              else f"the fields {lacking}")
    raise CheckpointMismatchError(
        f"{where} holds a "
        + (f"{theirs} " if theirs != "unknown" else "") + "train state (fields "
        f"{sorted(saved_fields)}), but config.model.name describes {wanted} "
        f"(fields {sorted(expected_fields)}): it was written by another "
        f"model. {fix}")
  if fields is None and (saved_fields ^ expected_fields) - {"puzzle_emb"}:
    raise CheckpointMismatchError(
        f"{where} was written by another version of trm: its train state "
        f"lacks {sorted(expected_fields - saved_fields - {'puzzle_emb'})} and "
        f"has {sorted(saved_fields - expected_fields - {'puzzle_emb'})} "
        "beyond this version's. "
        "Resume it with the code that wrote it, or start another --workdir.")
  missing = sorted(set(expected) - set(saved))
  unexpected = sorted(set(saved) - set(expected))
  if missing or unexpected:
    parts = []
    if missing:
      parts.append(f"missing {_short(missing)}")
    if unexpected:
      parts.append(f"not in this model: {_short(unexpected)}")
    raise CheckpointMismatchError(
        f"{where} does not hold this config's model: {'; '.join(parts)}. "
        "config.model differs from the run that wrote it (layers, attention "
        f"or mlp_t, puzzle embedding, ...). {fix}")
  wrong = [(p, saved[p], expected[p]) for p in sorted(expected)
           if saved[p] != expected[p]]
  if not wrong:
    return absent
  # A parameter's shape says most; the carry's alone differ when only the
  # batch (or the dataset's seq_len) changed.
  wrong.sort(key=lambda w: (w[0].startswith("carry/"),
                            not w[0].startswith("params/")))
  path, have, want = wrong[0]
  if (path.startswith("carry/") and len(have) == len(want) and have
      and have[0] != want[0] and have[1:] == want[1:]):
    why = (f"the ACT carry keeps one row per example of the global batch: "
           f"the run used global_batch_size={have[0]}, this config "
           f"{want[0]}; keep config.global_batch_size={have[0]} to resume")
  else:
    # In the family's own field names: GPT's config has no hidden_size.
    from trm import families  # pylint: disable=g-import-not-at-top
    why = "the run that wrote it had other sizes: " + (
        families.size_fields_of_state(expected) or (
            "config.model (e.g. hidden_size, num_heads, expansion, "
            "puzzle_emb_ndim) or the dataset's seq_len / vocab_size / "
            "puzzle identifiers"))
  others = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
  raise CheckpointMismatchError(
      f"{where}: {path} has shape {have} but this config needs {want}"
      f"{others}; {why}. {fix}")
