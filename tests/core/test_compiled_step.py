"""A train step saved by `trm.aot --save_compiled` and loaded by a run
(`config.compiled_step`) trains bit-identically without compiling it; a
file built for something else, damaged, or holding a foreign pickle class
is one line before anything compiles. Also: a finished run evaluates
without building its train step, and every metrics line and scalar carries
the step it was measured at. A tiny GPT on 8 CPU devices (data parallel),
the cheapest step to compile."""
import contextlib
import hashlib
import json
import os
import pickle
import shutil

import jax
import numpy as np
import pytest
from clu import metric_writers
from test_gpt_task import corpus_path
from test_gpt_task import tiny_config as gpt_config

from log_lines import absl_lines
from trm import aot
from trm import families
from trm.core import compiled_step
from trm.core import state as state_lib
from trm.core import task as task_lib
from trm.core import train

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def tiny_config(data_root, **overrides):
  values = {"mesh.data": 8, "mesh.fsdp": 1, "mesh.model": 1, "n_layer": 1,
            "n_embd": 16, "block_size": 16, "gradient_accumulation_steps": 1,
            "max_iters": 8, "lr_decay_iters": 8, "warmup_iters": 2,
            "eval_interval": 8, "eval_iters": 1, "log_interval": 2}
  values.update(overrides)
  return gpt_config(data_root, **values)


# These tests count XLA compiles: an executable loaded from the session's
# compilation cache is not one, so a step compiled when it should not be
# would pass unseen.
pytestmark = pytest.mark.usefixtures("no_compilation_cache")


@contextlib.contextmanager
def backend_compiles():
  """The names of the functions XLA compiles inside the block."""
  names = []

  def listener(event, unused_seconds, **kwargs):
    if event == _COMPILE_EVENT:
      names.append(kwargs.get("fun_name"))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


class RecordingWriter(metric_writers.MetricWriter):
  """Keeps every (step, scalars) written, in order."""

  def __init__(self):
    self.scalars = []

  def write_scalars(self, step, scalars):
    self.scalars.append((int(step), {k: float(v) for k, v in scalars.items()}))

  def write_summaries(self, step, values, metadata=None): pass
  def write_images(self, step, images): pass
  def write_videos(self, step, videos): pass
  def write_audios(self, step, audios, *, sample_rate): pass
  def write_texts(self, step, texts): pass
  def write_histograms(self, step, arrays, num_buckets=None): pass
  def write_hparams(self, hparams): pass
  def flush(self): pass
  def close(self): pass


def _train(config, workdir, monkeypatch):
  """(state, results, scalars written, log lines, compiled functions)."""
  writer = RecordingWriter()
  monkeypatch.setattr(train, "make_writer", lambda *a: writer)
  with absl_lines() as lines, backend_compiles() as compiles:
    state, results = train.train_and_evaluate(config, str(workdir),
                                              families.build_task)
  return state, results, writer.scalars, lines, compiles


def _losses(scalars):
  return [(step, s["train/loss"]) for step, s in scalars if "train/loss" in s]


def _params(state):
  return jax.tree.leaves(jax.tree.map(np.asarray,
                                      jax.device_get(state.params)))


def _vocab(data_root) -> int:
  with open(corpus_path(data_root), encoding="utf-8") as f:
    return len(set(f.read()))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
  return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, data_root):
  """The train step saved by trm.aot for this host's 8 CPU devices."""
  path = str(tmp_path_factory.mktemp("aot") / "step.bin")
  config = tiny_config(data_root)
  with backend_compiles() as compiles:
    report = aot.save_local_step(config, path, aot.data_shapes(
        config, {"vocab_size": _vocab(data_root)}))
  assert report["saved"].startswith(f"saved: {path} (8 x cpu")
  assert len(compiles) == 1 and "train_step" in compiles[0], compiles
  return path, compiles[0]


class _ProbedStep:
  """The compiled train step, plus a metric holding the step each call
  produced (kept from the newest call of an interval, like the loss)."""

  def __init__(self, compiled):
    self._compiled = compiled

  def __call__(self, state, batch):
    state, metrics = self._compiled(state, batch)
    # A host copy: the state's arrays are donated to the next call.
    metrics["probe_step"] = state_lib.Counter(np.asarray(state.step),
                                              np.int32(1))
    return state, metrics

  def memory_analysis(self):
    return self._compiled.memory_analysis()


@pytest.fixture(scope="module")
def normal_run(tmp_path_factory, data_root):
  """A run that compiles its own step (probed: see _ProbedStep)."""
  real = task_lib.compile_train_step
  with pytest.MonkeyPatch.context() as monkeypatch:
    monkeypatch.setattr(task_lib, "compile_train_step",
                        lambda *a, **k: _ProbedStep(real(*a, **k)))
    workdir = tmp_path_factory.mktemp("normal")
    return (workdir,) + _train(tiny_config(data_root), workdir, monkeypatch)


def test_loaded_step_trains_bit_identically_without_compiling(
    saved, normal_run, data_root, tmp_path, monkeypatch):
  path, step_name = saved
  _, state, results, scalars, _, compiles = normal_run
  assert step_name in compiles  # the normal run compiled the same function
  config = tiny_config(data_root, compiled_step=path)
  loaded, loaded_results, loaded_scalars, lines, loaded_compiles = _train(
      config, tmp_path, monkeypatch)
  assert step_name not in loaded_compiles, loaded_compiles
  assert any(f"Train step loaded from {path}" in line for line in lines)
  assert _losses(loaded_scalars) == _losses(scalars)
  assert [step for step, _ in _losses(scalars)] == [2, 4, 6, 8]
  for a, b in zip(_params(state), _params(loaded)):
    np.testing.assert_array_equal(a, b)
  assert loaded_results["eval/loss"] == results["eval/loss"]


def test_a_finished_run_evaluates_without_building_the_train_step(
    normal_run, data_root, tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  shutil.copytree(normal_run[0], workdir)
  os.remove(workdir / "eval_8.json")
  _, results, _, lines, compiles = _train(tiny_config(data_root), workdir,
                                          monkeypatch)
  assert not any("train_step" in str(name) for name in compiles), compiles
  assert compiles  # the counter works: the evaluation compiled
  assert any("the run is finished; evaluating without building the train "
             "step" in line for line in lines), lines
  assert results["eval/loss"] == pytest.approx(normal_run[2]["eval/loss"],
                                               rel=1e-6)
  assert (workdir / "eval_8.json").exists()


def test_metrics_carry_the_step_they_were_measured_at(normal_run):
  _, _, _, scalars, lines, _ = normal_run
  train_writes = [(step, s) for step, s in scalars if "train/loss" in s]
  assert [step for step, _ in train_writes] == [2, 4, 6, 8]
  for step, values in train_writes:  # fetched one interval late
    assert values["train/probe_step"] == step, (step, values)
  # nanoGPT's line for each interval but the first (warm-up: no timing),
  # naming the step of the loss it prints.
  printed = [line for line in lines if line.startswith("iter ")]
  assert [line.split(":")[0] for line in printed] == ["iter 4", "iter 6",
                                                      "iter 8"]
  for line, (step, values) in zip(printed, train_writes[1:]):
    assert f"loss {values['train/loss']:.4f}" in line, (line, step)
  # The progress report: our own line, never CLU's work-unit notes.
  assert not any("work unit notes" in line for line in lines)
  progress = [line for line in lines if line.startswith("step 8/8 (100.0%)")]
  assert progress and " steps/s" in progress[0], lines
  rates = [step for step, s in scalars if "steps_per_sec" in s]
  assert rates and rates[-1] == 8


# ------------------------------------------------------------- mismatches


def _rewrite(path, target, header=None, payload=None):
  """A copy of the file at `target` with its header and/or payload
  replaced (the payload's size and SHA-256 follow it)."""
  old_header, old_payload = compiled_step.read(path)
  header = dict(header or old_header)
  payload = old_payload if payload is None else payload
  header.update(payload_bytes=len(payload),
                payload_sha256=hashlib.sha256(payload).hexdigest())
  with open(target, "wb") as f:
    f.write(compiled_step.MAGIC + json.dumps(header).encode() + b"\n"
            + payload)
  return str(target)


def _refused(config, workdir, monkeypatch) -> str:
  """The one-line error of a run that stops before anything compiles."""
  with backend_compiles() as compiles:
    with pytest.raises(compiled_step.CompiledStepError) as info:
      _train(config, workdir, monkeypatch)
  assert compiles == [], compiles
  message = str(info.value)
  assert "\n" not in message
  return message


def test_a_changed_batch_size_is_one_line_before_any_compile(
    saved, data_root, tmp_path, monkeypatch):
  config = tiny_config(data_root, compiled_step=saved[0], batch_size=16)
  message = _refused(config, tmp_path, monkeypatch)
  assert "config.batch_size: built for 8, this run has 16" in message
  assert "trm.aot --save_compiled" in message


def test_a_cpu_step_over_several_device_groups_is_not_saved(data_root,
                                                            tmp_path):
  # Loaded back, such an XLA:CPU step can deadlock (trm.core.cpu_collectives).
  config = tiny_config(data_root, **{"mesh.data": 2, "mesh.fsdp": 2,
                                     "mesh.model": 2})
  path = tmp_path / "step.bin"
  with pytest.raises(compiled_step.CompiledStepError,
                     match="span several groupings of the devices"):
    aot.save_local_step(config, str(path), aot.data_shapes(
        config, {"vocab_size": _vocab(data_root)}))
  assert not path.exists()


def test_a_tampered_jax_version_is_one_line(saved, data_root, tmp_path,
                                            monkeypatch):
  header, _ = compiled_step.read(saved[0])
  header["environment"] = dict(header["environment"], jax="0.4.1")
  path = _rewrite(saved[0], tmp_path / "old_jax.bin", header=header)
  message = _refused(tiny_config(data_root, compiled_step=path), tmp_path,
                     monkeypatch)
  assert (f"jax version: built for 0.4.1, this run has {jax.__version__}"
          in message)


def test_a_truncated_file_is_one_line(saved, data_root, tmp_path,
                                      monkeypatch):
  with open(saved[0], "rb") as f:
    data = f.read()
  path = tmp_path / "cut.bin"
  path.write_bytes(data[:len(data) // 2])
  message = _refused(tiny_config(data_root, compiled_step=str(path)),
                     tmp_path, monkeypatch)
  assert "is truncated or padded" in message and str(path) in message
  # A flipped byte keeps the size: the checksum catches it.
  flipped = bytearray(data)
  flipped[-100] ^= 1
  path.write_bytes(bytes(flipped))
  with pytest.raises(compiled_step.CompiledStepError,
                     match="does not match the SHA-256"):
    compiled_step.read(str(path))


class _Payload:
  """A pickle that would run a command when unpickled."""

  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def test_a_pickle_with_a_foreign_class_is_refused(saved, tmp_path):
  marker = tmp_path / "ran"
  path = _rewrite(saved[0], tmp_path / "evil.bin",
                  payload=pickle.dumps(_Payload(marker)))
  header, payload = compiled_step.read(path)  # intact as a file
  with pytest.raises(compiled_step.CompiledStepError) as info:
    compiled_step.load(path, payload, None, None)
  message = str(info.value)
  assert "\n" not in message and "refused to unpickle" in message
  assert f"{os.system.__module__}.system" in message
  assert not marker.exists()
  assert header["environment"]["platform"] == "cpu"


def test_a_payload_whose_inputs_are_not_its_headers_is_one_line(saved,
                                                                 tmp_path):
  """A crafted payload: the saved executable with one argument info left
  out (the header, which the run checks, left as saved). Before: jax's
  `Too few leaves for PyTreeDef` after loading the executable, naming
  neither the file nor the field."""
  import io  # pylint: disable=g-import-not-at-top
  from jax.experimental import serialize_executable  # pylint: disable=g-import-not-at-top
  header, payload = compiled_step.read(saved[0])
  backend = jax.devices()[0].client
  unloaded, infos, no_kwargs = compiled_step._restricted_unpickler()(  # pylint: disable=protected-access
      io.BytesIO(payload), backend).load()
  buffer = io.BytesIO()
  serialize_executable._JaxPjrtPickler(buffer).dump(  # pylint: disable=protected-access
      (unloaded, infos[:-1], no_kwargs))
  path = _rewrite(saved[0], tmp_path / "crafted.bin",
                  payload=buffer.getvalue())
  in_tree = jax.tree.structure([0] * len(infos))
  with pytest.raises(compiled_step.CompiledStepError) as info:
    compiled_step.load(path, compiled_step.read(path)[1], in_tree, in_tree)
  message = str(info.value)
  assert "\n" not in message and repr(path) in message, message
  assert f"{len(infos) - 1} argument infos" in message, message
  assert header["environment"]["platform"] == "cpu"


def test_every_changed_config_field_is_named():
  """Only the first changed field (sorted) was named, with 'and N more':
  a builder's data.build.num_test hid the global_batch_size the user
  changed."""
  def header(config):
    return {"environment": {}, "mesh": {"axes": {}, "device_ids": []},
            "code_sha256": "c",
            "config": config, "config_sha256": json.dumps(config)}
  built = header({"data.build.num_test": 1000, "global_batch_size": 8})
  run = header({"data.build.num_test": 50, "global_batch_size": 16})
  run["environment"] = built["environment"] = dict.fromkeys((
      "platform", "device_kind", "jax", "jaxlib", "libtpu", "num_devices",
      "num_processes", "num_slices", "chip_grid"))
  assert compiled_step._difference(built, run) == (  # pylint: disable=protected-access
      "config.data.build.num_test: built for 1000, this run has 50 (also "
      "config.global_batch_size)")
