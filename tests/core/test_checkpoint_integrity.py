"""A corrupt checkpoint cannot pass as good (`trm.core.checkpoint`): every
save records a checksum per array (and of the data position) in the step's
metadata, every restore recomputes them; a mismatch falls back to the
previous step, while an error that is not damage (a data position beyond a
changed dataset, memory) stops and moves nothing. 8 CPU devices."""
import glob
import json
import logging
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from jax.sharding import NamedSharding, PartitionSpec as P

from trm.core import checkpoint as ckpt_lib
from trm.core import pipeline

# Orbax's failed restores leave coroutines that warn when garbage-collected.
pytestmark = pytest.mark.filterwarnings(
    "ignore::pytest.PytestUnraisableExceptionWarning")


class _Position:
  """A stand-in for the Grain iterator: only its state is checkpointed."""

  def __init__(self, index=0):
    self.index = index

  def get_state(self):
    return {"next_index": self.index}

  def set_state(self, state):
    self.index = state["next_index"]


def _state(step):
  """Random (incompressible) weights, so that a flipped byte of a chunk
  decodes to other numbers instead of failing to decode."""
  rng = np.random.default_rng(step)
  return {"w": jnp.asarray(rng.standard_normal((256, 64)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal((64,)), jnp.bfloat16),
          "step": jnp.asarray(step, jnp.int32)}


def _abstract(tree):
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree)


def _host(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def _equal(a, b):
  return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(_host(a)),
                                                 jax.tree.leaves(_host(b))))


def _save(directory, steps, save=ckpt_lib.save, position=_Position):
  manager = ckpt_lib.make_manager(directory, max_to_keep=5)
  for step in steps:
    save(manager, step, _state(step), position(step))
  ckpt_lib.wait_until_finished(manager)
  manager.close()


def _grain_position(step):
  """A Grain iterator over 10 records, 4 * `step` of them read."""
  data = pipeline.grain_iterator(list(range(10)))
  for _ in range(4 * step):
    next(data)
  return data


def _chunk(directory, step):
  """The largest data file of a step's `state` item (the weights)."""
  return max(glob.glob(os.path.join(directory, str(step), "state", "**", "d",
                                    "*"), recursive=True),
             key=os.path.getsize)


def _flip(path, offset):
  with open(path, "r+b") as f:
    f.seek(offset)
    byte = f.read(1)[0]
    f.seek(offset)
    f.write(bytes([byte ^ 0x10]))


def _snapshot(directory):
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      with open(os.path.join(root, name), "rb") as f:
        out[os.path.relpath(os.path.join(root, name), directory)] = f.read()
  return out


# ------------------------------------------------------------- the checksum


def _fmix(h):
  h = h ^ (h >> np.uint32(16))
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> np.uint32(13))
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> np.uint32(16))


def _numpy_checksum(x: np.ndarray) -> str:
  """The documented checksum, independently in numpy on the host."""
  unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
  bits = np.ascontiguousarray(x).view(unsigned).astype(np.uint32).ravel()
  index = np.arange(bits.size, dtype=np.uint32)
  with np.errstate(over="ignore"):
    a = _fmix(_fmix(index * np.uint32(0x9E3779B9) + np.uint32(0x7F4A7C15))
              ^ bits)
    b = _fmix(_fmix(index ^ np.uint32(0x2545F491))
              + bits * np.uint32(0x27D4EB2F))
  return (f"{int(a.sum(dtype=np.uint64)) % 2**32:08x}"
          f"{int(b.sum(dtype=np.uint64)) % 2**32:08x}")


@pytest.mark.parametrize("on_device", [True, False],
                         ids=["jitted on the devices", "numpy on the host"])
def test_the_checksum_is_the_arrays_whatever_its_sharding(on_device):
  """Restores go onto any mesh: the checksum must be a function of the
  logical array, equal however it is sharded, computed on the devices (as
  on accelerators) or in numpy from each process's shards (CPU), and equal
  to an independent numpy one."""
  rng = np.random.default_rng(0)
  values = {"f32": rng.standard_normal((16, 24)).astype(np.float32),
            "bf16": rng.standard_normal((16, 24)).astype(ml_dtypes.bfloat16),
            "i32": rng.integers(-9, 9, (16, 24)).astype(np.int32),
            "u8": rng.integers(0, 255, (16, 24)).astype(np.uint8)}
  mesh = jax.make_mesh((4, 2), ("a", "b"))
  specs = [P(), P("a"), P("b", "a"), P(("a", "b")), P(None, "a")]
  for name, value in values.items():
    expected = _numpy_checksum(value)
    seen = {ckpt_lib.checksums({"x": jnp.asarray(value)}, on_device)["x"][
        "sum"]}
    for spec in specs:
      placed = jax.device_put(value, NamedSharding(mesh, spec))
      seen.add(ckpt_lib.checksums({"x": placed}, on_device)["x"]["sum"])
    assert seen == {expected}, name
  # Other leaf kinds: both ways agree.
  others = {"bool": jnp.asarray(rng.integers(0, 2, (8, 4)).astype(bool)),
            "int4": jnp.asarray(rng.integers(-8, 7, (8, 4)).astype(
                ml_dtypes.int4)),
            "key": jax.random.key(3), "raw key": jax.random.PRNGKey(1),
            "scalar": jnp.float32(2.5), "host": np.arange(6, dtype=np.int32)}
  assert ckpt_lib.checksums(others, on_device) == ckpt_lib.checksums(
      others, not on_device)
  # One changed element, anywhere, changes it.
  value = values["f32"]
  base = _numpy_checksum(value)
  for i, j in [(0, 0), (7, 13), (15, 23)]:
    changed = value.copy()
    changed[i, j] = np.nextafter(changed[i, j], np.inf)
    assert ckpt_lib.checksums({"x": jnp.asarray(changed)}, on_device)["x"][
        "sum"] != base
  # Swapping two elements does too (the index is mixed in).
  swapped = value.copy()
  swapped[0, 0], swapped[0, 1] = value[0, 1], value[0, 0]
  assert ckpt_lib.checksums({"x": jnp.asarray(swapped)}, on_device)["x"][
      "sum"] != base


def test_each_save_records_a_checksum_per_array(tmp_path):
  directory = str(tmp_path)
  _save(directory, [1])
  with open(os.path.join(directory, "1", "_CHECKPOINT_METADATA")) as f:
    saved = json.load(f)["custom_metadata"][ckpt_lib.CHECKSUMS]
  assert sorted(saved["arrays"]) == ["b", "step", "w"]
  for name, value in _host(_state(1)).items():
    entry = saved["arrays"][name]
    assert entry == {"dtype": str(value.dtype), "shape": list(value.shape),
                     "sum": _numpy_checksum(np.asarray(value))}
  assert len(saved["data_iter"]) == 16


# ------------------------------------------------------ damage falls back


def test_a_flipped_bit_restores_the_previous_step(tmp_path, caplog):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  chunk = _chunk(directory, 2)
  _flip(chunk, os.path.getsize(chunk) // 2)
  # Orbax alone reads the damaged step as other numbers, without a word.
  raw = ocp.CheckpointManager(directory, item_names=("state", "data_iter"))
  silently = raw.restore(2, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(_abstract(_state(2)))))["state"]
  assert not _equal(silently, _state(2))
  assert all(np.isfinite(np.asarray(x, np.float32)).all()
             for x in jax.tree.leaves(_host(silently)))

  position = _Position()
  with caplog.at_level(logging.WARNING):
    restored = ckpt_lib.restore_latest(
        ckpt_lib.make_manager(directory, max_to_keep=5),
        _abstract(_state(0)), position)
  assert _equal(restored, _state(1)) and position.index == 1
  warning = [r.getMessage() for r in caplog.records
             if "cannot be restored" in r.getMessage()]
  assert warning == [
      f"Checkpoint {directory}/2 cannot be restored (array w does not match "
      "the checksum saved with step 2: its files changed after the save); "
      "falling back to the previous one."]
  assert glob.glob(os.path.join(directory, "2.unreadable-*"))
  assert sorted(os.listdir(directory))[0] == "1"


@pytest.mark.parametrize("where", ["early", "middle", "late"])
def test_any_flipped_byte_of_the_weights_is_caught(tmp_path, where):
  """Whether the damaged chunk fails to decode or decodes to other
  numbers, step 2 never comes back as good."""
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  chunk = _chunk(directory, 2)
  size = os.path.getsize(chunk)
  _flip(chunk, {"early": size // 8, "middle": size // 2,
                "late": size - size // 8}[where])
  restored = ckpt_lib.restore_latest(
      ckpt_lib.make_manager(directory, max_to_keep=5),
      _abstract(_state(0)), _Position())
  assert _equal(restored, _state(1))


def test_a_damaged_data_position_is_caught(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  with open(os.path.join(directory, "2", "data_iter", "metadata"), "w") as f:
    json.dump({"next_index": 7}, f)  # valid JSON, wrong place
  position = _Position()
  restored = ckpt_lib.restore_latest(
      ckpt_lib.make_manager(directory, max_to_keep=5),
      _abstract(_state(0)), position)
  assert _equal(restored, _state(1)) and position.index == 1


@pytest.mark.parametrize("index", [float("nan"), True, 2.5, "3", -1, None])
def test_a_data_position_no_save_writes_stops_in_one_line(tmp_path, index):
  """A position its checksum vouches for (re-digested by hand, or a step
  saved before checksums) that is no count of batches: NaN was a
  traceback at the first batch and `true` read from batch 1, silently."""
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2], position=lambda step: _Position(
      step if step == 1 else index))
  before = _snapshot(directory)
  with pytest.raises(ckpt_lib.CheckpointError, match=(
      r"checkpoints/2 failed: its data position .* is not a count of "
      r"batches read .*/checkpoints/2/data_iter/metadata was edited by hand")):
    ckpt_lib.restore_latest(ckpt_lib.make_manager(directory, max_to_keep=5),
                            _abstract(_state(0)), pipeline.grain_iterator(
                                list(range(10))))
  assert _snapshot(directory) == before  # nothing moved


def test_a_data_position_past_its_step_stops_in_one_line(tmp_path):
  """One batch a step: a position past the step (in the dataset's range,
  so Grain took it) silently skipped the batches between. One behind it
  restores (a run imported from nanoGPT's ckpt.pt reads from batch 0)."""
  directory = str(tmp_path / "checkpoints")
  for index, ok in ((5, False), (1, True), (2, True)):
    shutil.rmtree(directory, ignore_errors=True)
    _save(directory, [2], position=lambda _: _Position(index))  # pylint: disable=cell-var-from-loop
    data = pipeline.grain_iterator(list(range(10)))
    restore = lambda: ckpt_lib.restore_latest(  # pylint: disable=cell-var-from-loop
        ckpt_lib.make_manager(directory, max_to_keep=5),
        _abstract(_state(0)), data)
    if ok:
      assert _equal(restore(), _state(2)) and next(data) == index
      continue
    with pytest.raises(ckpt_lib.CheckpointError, match=(
        r"its data position \{'next_index': 5\} is past its step 2\. .*"
        "data_iter/metadata was edited by hand")):
      restore()

def test_damaged_step_metadata_falls_back(tmp_path, caplog):
  """The checksums live in the step's metadata file: if it cannot be read,
  nothing vouches for the step."""
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  with open(os.path.join(directory, "2", "_CHECKPOINT_METADATA"), "w") as f:
    f.write('{"custom_metadata": {"checksums": ')
  with caplog.at_level(logging.WARNING):
    restored = ckpt_lib.restore_latest(
        ckpt_lib.make_manager(directory, max_to_keep=5),
        _abstract(_state(0)), _Position())
  assert _equal(restored, _state(1))
  assert (f"Checkpoint {directory}/2 cannot be restored (its "
          "_CHECKPOINT_METADATA is not valid JSON") in caplog.text


def test_restore_fields_skips_a_damaged_step_and_moves_nothing(tmp_path,
                                                               caplog):
  """trm.evaluate, trm.sample and trm.generate read weights through
  `restore_fields`: the same checksums guard them."""
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  chunk = _chunk(directory, 2)
  _flip(chunk, os.path.getsize(chunk) // 2)
  before = _snapshot(directory)
  wanted = {"w": _abstract(_state(0))["w"]}
  with caplog.at_level(logging.WARNING):
    fields, step = ckpt_lib.restore_fields(directory, wanted)
  assert step == 1 and _equal(fields, {"w": _state(1)["w"]})
  assert (f"Checkpoint {directory}/2 cannot be read (array w does not match "
          "the checksum saved with step 2") in caplog.text
  assert _snapshot(directory) == before  # read-only: nothing moved
  # Asked for that step by number: one line, no fallback.
  with pytest.raises(ckpt_lib.CheckpointError) as error:
    ckpt_lib.restore_fields(directory, wanted, step=2)
  assert str(error.value).startswith(
      f"Checkpoint {directory}/2 is damaged: array w does not match the "
      "checksum saved with step 2")
  assert "\n" not in str(error.value)
  # Fields that are intact still read (only what is restored is verified).
  fields, step = ckpt_lib.restore_fields(
      directory, {"step": _abstract(_state(0))["step"]}, step=2)
  assert step == 2 and int(fields["step"]) == 2


# ---------------------------------------------- old checkpoints still load


def _save_without_checksums(manager, step, state, data_iter):
  """A save as trm wrote them before checksums (no custom metadata)."""
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data_iter=ocp.args.JsonSave(data_iter.get_state())), force=True)


def test_a_checkpoint_without_checksums_restores_unverified(tmp_path, caplog):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1], save=_save_without_checksums)
  position = _Position()
  with caplog.at_level(logging.INFO):
    restored = ckpt_lib.restore_latest(
        ckpt_lib.make_manager(directory, max_to_keep=5),
        _abstract(_state(0)), position)
  assert _equal(restored, _state(1)) and position.index == 1
  assert (f"Checkpoint {directory}/1 has no checksums (written before trm "
          "recorded them); restoring it without verification.") in caplog.text
  fields, step = ckpt_lib.restore_fields(directory,
                                         {"w": _abstract(_state(0))["w"]})
  assert step == 1 and _equal(fields["w"], _state(1)["w"])


# ------------------------------------------- not damage: stop, move nothing


def test_a_data_position_beyond_the_dataset_stops_and_moves_nothing(
    tmp_path):
  """The dataset shrank since the save: the checkpoint is good, the run's
  data is not what it was. Falling back (and setting step 2 aside) would
  lose a good checkpoint; the run stops instead."""
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2], position=_grain_position)
  before = _snapshot(directory)
  smaller = pipeline.grain_iterator(list(range(6)))
  with pytest.raises(ckpt_lib.CheckpointError) as error:
    ckpt_lib.restore_latest(ckpt_lib.make_manager(directory, max_to_keep=5),
                            _abstract(_state(0)), smaller)
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"Restoring checkpoint {directory}/2 failed: its "
                            "data position ")
  assert "does not fit the current training data (IndexError: " in message
  assert "out of range for dataset of length 6" in message
  assert "so nothing was moved aside" in message
  assert "go back to the data it was trained on" in message
  assert _snapshot(directory) == before
  assert sorted(os.listdir(directory)) == ["1", "2"]


@pytest.mark.parametrize("error", [
    MemoryError("host memory"),
    ValueError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
               "1.00GiB"),
    PermissionError(13, "Permission denied")], ids=["MemoryError", "OOM",
                                                    "permission"])
def test_a_restore_error_that_is_not_damage_moves_nothing(tmp_path,
                                                          monkeypatch, error):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  before = _snapshot(directory)

  def fail(self, *args, **kwargs):
    raise error

  monkeypatch.setattr(ocp.CheckpointManager, "restore", fail)
  with pytest.raises(ckpt_lib.CheckpointError) as info:
    ckpt_lib.restore_latest(ckpt_lib.make_manager(directory, max_to_keep=5),
                            _abstract(_state(0)), _Position())
  message = str(info.value)
  assert "\n" not in message
  assert message.startswith(f"Restoring checkpoint {directory}/2 failed: "
                            f"{type(error).__name__}: ")
  assert "so nothing was moved aside" in message
  assert _snapshot(directory) == before


def test_damage_then_a_failure_stops_without_moving(tmp_path):
  """Step 2 is damaged, step 1 is good but does not fit the data: the run
  stops (naming both) and neither is moved."""
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2], position=_grain_position)
  os.remove(os.path.join(directory, "2", "commit_success.txt"))
  before = _snapshot(directory)
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"Restoring checkpoint .*/1 failed \(the newer "
                     r"step\(s\) \[2\] are damaged\): its data position"):
    ckpt_lib.restore_latest(ckpt_lib.make_manager(directory, max_to_keep=5),
                            _abstract(_state(0)),
                            pipeline.grain_iterator(list(range(3))))
  assert _snapshot(directory) == before


def test_only_damaged_steps_is_an_error_that_moves_nothing(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _save(directory, [1, 2])
  for step in (1, 2):
    chunk = _chunk(directory, step)
    _flip(chunk, os.path.getsize(chunk) // 2)
  before = _snapshot(directory)
  with pytest.raises(ckpt_lib.CheckpointError) as error:
    ckpt_lib.restore_latest(ckpt_lib.make_manager(directory, max_to_keep=5),
                            _abstract(_state(0)), _Position())
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"{directory} holds checkpoints (steps [1, 2]) "
                            "but none can be restored; the newest, step 2: ")
  assert "nothing was moved" in message
  assert _snapshot(directory) == before


def test_save_checksum_cost(tmp_path):
  """What a save pays for its checksums (printed; the gate is loose)."""
  import time  # pylint: disable=g-import-not-at-top
  state = {f"w{i}": jnp.ones((512, 512), jnp.float32) * i for i in range(8)}
  ckpt_lib.checksums(state)  # compiles
  start = time.perf_counter()
  for _ in range(5):
    ckpt_lib.checksums(state)
  seconds = (time.perf_counter() - start) / 5
  print(f"checksums of 8 x 512x512 float32 (8 MiB): {seconds * 1e3:.1f} ms")
  assert seconds < 5


def _small_state(step):
  return {"w": jnp.arange(64, dtype=jnp.float32) * step,
          "step": jnp.asarray(step, jnp.int32)}


def test_incomplete_checkpoints_are_skipped_and_all_bad_is_an_error(tmp_path):
  directory = str(tmp_path / "checkpoints")
  manager = ckpt_lib.make_manager(directory, max_to_keep=5)
  for step in (1, 2, 3):
    ckpt_lib.save(manager, step, _small_state(step), _Position(step))
  ckpt_lib.wait_until_finished(manager)
  os.remove(os.path.join(directory, "3", "commit_success.txt"))  # no marker
  os.remove(os.path.join(directory, "2", "data_iter", "metadata"))

  position = _Position()
  restored = ckpt_lib.restore_latest(
      ckpt_lib.make_manager(directory, max_to_keep=5),
      _abstract(_small_state(0)), position)
  assert _equal(restored, _small_state(1))
  assert position.index == 1
  assert sorted(os.listdir(directory))[0] == "1"
  assert len(glob.glob(os.path.join(directory, "*.unreadable-*"))) == 2

  # Object stores cannot rename directories: the copy-and-delete path.
  aside = glob.glob(os.path.join(directory, "*.unreadable-*"))[0]
  ckpt_lib._move(epath.Path(aside), epath.Path(aside + "-copy"), copy=True)  # pylint: disable=protected-access
  assert not os.path.exists(aside)
  assert os.path.isfile(os.path.join(aside + "-copy", "_CHECKPOINT_METADATA"))

  os.remove(os.path.join(directory, "1", "_CHECKPOINT_METADATA"))
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=f"{directory} holds checkpoints .* none can be"):
    ckpt_lib.restore_latest(ckpt_lib.make_manager(directory, max_to_keep=5),
                            _abstract(_small_state(0)), _Position())
