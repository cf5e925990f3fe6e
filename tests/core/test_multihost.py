"""2 processes x 4 CPU devices (gloo) against 1 process x 8 devices."""
import json
import os
import re
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from trm.core import checkpoint as ckpt_lib
from trm.core import mesh as mesh_lib
from trm.core import state as state_lib
from trm.core import train
from trm import families
from trm.core import pipeline
from trm.data.puzzles import dataset as puzzle_dataset
from trm.data.puzzles import format as puzzle_format
from trm.data.text import preparation
from trm.families.trm import program as trm_program
from trm.families.trm import task as puzzle

from test_train import ROOT, tiny_config  # pylint: disable=g-import-not-at-top
import cli_batch  # pylint: disable=g-import-not-at-top
import workers as workers_lib  # pylint: disable=g-import-not-at-top

# Runs trm.main's own distributed start-up, trains, and saves process 0's
# parameters (replicated on a data-parallel mesh) for an exact comparison.
_WORKER = """
import sys
import numpy as np
from absl import app
import jax
sys.path[:0] = {tests!r}
from test_train import tiny_config
from trm import families
from trm import main as trm_main
from trm.core import train

def run(_):
  trm_main.initialize_distributed(jax)
  assert jax.process_count() == 2 and jax.local_device_count() == 4
  state, _ = train.train_and_evaluate(
      tiny_config(**{overrides!r}), {workdir!r}, families.build_task)
  if jax.process_index() == 0:
    np.savez({workdir!r} + "/params.npz", *[
        np.asarray(x.addressable_shards[0].data)
        for x in jax.tree.leaves(state.params)])

app.run(run)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# trm.main's refusals on 2 processes run as forks of two servers, one per
# process, that have imported cli_batch.MAIN_PRELOAD: most of each
# process's imports saved. The long runs below (_Training) start trm.main
# as a pod does.


def _main_env():
  """The environment of the refused trm.main processes: 1 CPU device
  each."""
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
              XLA_FLAGS=workers_lib.xla_flags(1))


@pytest.fixture(scope="module")
def main_clis():
  servers = [cli_batch.Server("trm.main", cli_batch.MAIN_PRELOAD,
                               _main_env())
             for _ in range(2)]
  yield servers
  for server in servers:
    server.close()


def _two_mains(servers, argvs, cwds=(ROOT, ROOT), timeout=120):
  """`python -m trm.main argvs[i]` in `cwds[i]` as process i, both at once:
  ([exit code of each], [stdout + stderr of each])."""
  import threading  # pylint: disable=g-import-not-at-top
  results, errors = [None, None], []

  def run(i):
    try:
      results[i] = servers[i].run(argvs[i], cwd=cwds[i], env=_main_env(),
                                  timeout=timeout)
    except BaseException as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  if errors:
    raise errors[0]
  return ([r.returncode for r in results],
          [r.stdout + r.stderr for r in results])


def _train_losses(workdir):
  # Imported late: TensorFlow loaded before jax's CPU backend can abort it.
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(workdir)
  events.Reload()
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  return [float(tensor_util.make_ndarray(e.tensor_proto))
          for e in events.Tensors("train/lm_loss")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("sudoku"))
  puzzle.prepare_data(tiny_config(**{"data.data_dir": path}), path)
  return path


def test_two_processes_match_one_and_checkpoint_moves_between_them(
    tmp_path, data_dir):
  # Learning rates of 1e-6: AdamATan2 and the puzzle embeddings' sign-SGD
  # turn a gradient near 0 into a full step of either sign, so at the
  # config's rates the two reduction orders (8 devices in one process, 4+4
  # over gloo) drifted apart by 7e-4 in the loss within 12 steps on an
  # AVX-512 host; at 1e-6 they agree to 1e-7, and each step's loss (another
  # batch each time) still tells a wrong data order or program apart.
  overrides = {"data.data_dir": data_dir, "mesh.data": -1, "mesh.fsdp": 1,
               "mesh.model": 1, "optim.lr": 1e-6, "optim.puzzle_emb_lr": 1e-6}
  config = tiny_config(**overrides)
  reference, _ = train.train_and_evaluate(config, str(tmp_path / "one"), families.build_task)

  workdir = str(tmp_path / "two")
  port = _free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(4))
  script = _WORKER.format(tests=[os.path.dirname(os.path.abspath(__file__)), os.path.join(ROOT, "tests")],
                          overrides=overrides, workdir=workdir)
  workers = [subprocess.Popen(
      [sys.executable, "-c", script, "--config=configs/trm_sudoku.py:cpu",
       f"--workdir={workdir}", f"--coordinator_address=127.0.0.1:{port}",
       "--num_processes=2", f"--process_id={i}"], cwd=ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=600)
  for worker, output in zip(workers, outputs):
    assert worker.returncode == 0, output[-3000:]
  # Each process divides its MFU by a matmul measured on its own devices
  # (process 1 once timed a matmul on process 0's device: 970 TFLOP/s).
  peaks = [float(re.search(r"MFU is measured against ([\d.eE+-]+) TFLOP/s",
                           output).group(1)) for output in outputs]
  assert all(0 < peak < 20 for peak in peaks), peaks

  # Same data, same program: the logged losses agree to float tolerance.
  np.testing.assert_allclose(_train_losses(workdir),
                             _train_losses(str(tmp_path / "one")), rtol=1e-4)
  saved = np.load(os.path.join(workdir, "params.npz"))
  two_process_params = [saved[f"arr_{i}"] for i in range(len(saved.files))]
  for a, b in zip(jax.tree.leaves(jax.device_get(reference.params)),
                  two_process_params):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)

  # The 2-process checkpoint restores in this 1-process, 8-device run (another
  # topology, 2x2x2 mesh) to exactly the parameters it held.
  config = tiny_config(**{"data.data_dir": data_dir})
  meta, arrays = puzzle_format.read_split(data_dir, "train")
  program = trm_program.build(config, None, meta)
  abstract, _ = state_lib.abstract_state(
      program.init_fn, mesh_lib.ShardingContext.from_config(config))
  data_iter = pipeline.grain_iterator(puzzle_dataset.TrainBatches(
      meta, arrays, global_batch_size=config.global_batch_size, seed=0,
      epochs_per_iter=1, num_batches=config.total_steps))
  manager = ckpt_lib.make_manager(os.path.join(workdir, "checkpoints"),
                                  max_to_keep=3)
  restored = ckpt_lib.restore_latest(manager, abstract, data_iter)
  assert int(restored.step) == config.total_steps
  assert data_iter.get_state()["next_index"] == config.total_steps
  kernel = restored.params["L_level"]["layers_0"]["mlp"]["gate_up_proj"][
      "kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "model")
  for a, b in zip(jax.tree.leaves(jax.device_get(restored.params)),
                  two_process_params):
    np.testing.assert_array_equal(a, b)


class _Training:
  """trm.main on 2 processes x `devices` CPU devices, training a long run
  of the tiny config; each process's output lines kept as they come, and
  `started[i]` set once process i trains."""

  def __init__(self, workdir: str, data_dir: str, devices: int,
               log_every: int = 3):
    import threading  # pylint: disable=g-import-not-at-top
    from test_reliability import _cli_flags  # pylint: disable=g-import-not-at-top
    config = tiny_config(**{"data.data_dir": data_dir, "mesh.data": -1,
                            "mesh.fsdp": 1, "mesh.model": 1,
                            "total_steps": 5000, "checkpoint_every": 5000,
                            "eval_every": 5000, "log_every": log_every})
    port = _free_port()
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=workers_lib.xla_flags(devices))
    self.workers = [subprocess.Popen(
        [sys.executable, "-m", "trm.main",
         "--config=configs/trm_sudoku.py:cpu", f"--workdir={workdir}",
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
         f"--process_id={i}", "--alsologtostderr"] + _cli_flags(config),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True) for i in range(2)]
    self.logs = [[], []]
    self.started = [threading.Event(), threading.Event()]
    self.readers = [threading.Thread(target=self._read, args=(i,),
                                     daemon=True) for i in range(2)]
    for reader in self.readers:
      reader.start()

  def _read(self, i):
    for line in self.workers[i].stdout:
      self.logs[i].append(line)
      if "Training from step 0" in line:
        self.started[i].set()

  def wait_started(self, i):
    assert self.started[i].wait(600), "".join(self.logs[i][-40:])

  def finish(self) -> list[str]:
    """Kills what still runs; each process's whole output."""
    for worker in self.workers:
      if worker.poll() is None:
        worker.kill()
    for reader in self.readers:
      reader.join(timeout=10)
    return ["".join(log) for log in self.logs]


def test_sigterm_to_every_process_saves_one_step_and_exits_zero(
    tmp_path, data_dir):
  """A pod's preemption notice reaches every host: through trm.main's own
  start-up, both processes agree on a step, save it once, and exit 0."""
  import re  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "run")
  # One device per process, as the next two tests: they load the train
  # step this run compiled from the session's compilation cache.
  run = _Training(workdir, data_dir, devices=1)
  try:
    for i in range(2):
      run.wait_started(i)
    for worker in run.workers:
      worker.send_signal(signal.SIGTERM)
    for worker in run.workers:
      worker.wait(timeout=300)
  finally:
    texts = run.finish()
  steps = []
  for worker, text in zip(run.workers, texts):
    assert worker.returncode == 0, text[-3000:]
    assert "stack trace" not in text and "Traceback" not in text
    steps.append(int(re.search(r"Preempted at step (\d+) \(SIGTERM\)",
                               text).group(1)))
  assert steps[0] == steps[1] and 0 < steps[0] < 5000
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(steps[0])))


def test_ctrl_c_to_one_process_saves_one_step_on_both(tmp_path, data_dir):
  """Ctrl-C (SIGINT) to process 1 alone: it stopped at once, saying it was
  "stopped by SIGINT before training began or after it ended; nothing was
  saved", and process 0 failed in its next collective. Now both save the
  same step and stop (130 for the interrupted process, 0 for the other),
  at the next step through JAX's preemption service: they agreed on the
  signal only every log_every steps (55 s later at 200 steps here)."""
  import re  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path / "run")
  run = _Training(workdir, data_dir, devices=1, log_every=1000)
  try:
    for i in range(2):
      run.wait_started(i)
    run.workers[1].send_signal(signal.SIGINT)
    for worker in run.workers:
      worker.wait(timeout=180)
  finally:
    texts = run.finish()
  assert [w.returncode for w in run.workers] == [0, 130], texts
  steps = [int(re.search(r"Preempted at step (\d+) \((SIGTERM|SIGINT)\)",
                         text).group(1)) for text in texts]
  assert steps[0] == steps[1] and 0 < steps[0] < 1000
  assert os.path.isdir(os.path.join(workdir, "checkpoints", str(steps[0])))


def test_a_killed_process_stops_the_other_at_once_with_one_line(
    tmp_path, data_dir):
  """Process 1 SIGKILLed mid-training: process 0's next collective fails.
  It printed a traceback, waited ~55 s in jax's shutdown barrier for the
  dead process's heartbeats to time out, then aborted (SIGABRT, a stack
  dump); now one line naming what to do, exit 1, within seconds."""
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top
  run = _Training(str(tmp_path / "run"), data_dir, devices=1)
  try:
    run.wait_started(1)
    time.sleep(1)
    run.workers[1].send_signal(signal.SIGKILL)
    killed = time.time()
    run.workers[0].wait(timeout=300)
    seconds = time.time() - killed
  finally:
    text = run.finish()[0]
  assert run.workers[0].returncode == 1, text[-3000:]
  assert "trm.main: error: another process of this job stopped (" in text
  assert "Traceback" not in text and "Fatal Python error" not in text
  assert seconds < 30, seconds


@pytest.mark.parametrize("argv,match", [
    # jax.distributed raised IndexError (no port), segfaulted (a port that
    # is not a number) or waited 300 s for a coordinator (no host, a URL).
    ({"coordinator_address": "localhost"}, "is not HOST:PORT"),
    ({"coordinator_address": "127.0.0.1:abc"}, "is not HOST:PORT"),
    ({"coordinator_address": ":1234"}, "is not HOST:PORT"),
    ({"coordinator_address": "http://10.0.0.2:1234"}, "is not HOST:PORT"),
    ({"coordinator_address": "10.0.0.2:70000"}, "is not HOST:PORT"),
    # Without an address these were ignored: each process ran alone.
    ({}, "need --coordinator_address"),
    # JAX's ValueError named neither flag.
    ({"coordinator_address": "127.0.0.1:1234", "process_id": 2},
     "--process_id=2 is not one of the --num_processes=2"),
    ({"coordinator_address": "127.0.0.1:1234", "distributed_timeout": 0},
     "--distributed_timeout=0: must be 1 to"),
    # A TypeError traceback from XLA's client (a 32-bit count).
    ({"coordinator_address": "127.0.0.1:1234",
      "distributed_timeout": 3 * 10**9}, "must be 1 to 10000000 seconds"),
])
def test_malformed_distributed_flags_stop_before_jax_starts(argv, match,
                                                            monkeypatch):
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from trm.core import distributed  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  calls = []
  # Compares the counts through the job FakeJax does not join.
  monkeypatch.setattr(distributed, "_check_same_count", lambda given: None)

  class FakeJax:  # Records jax.distributed.initialize instead of joining.
    class config:  # pylint: disable=invalid-name
      update = staticmethod(lambda *args: None)

    class distributed:  # pylint: disable=invalid-name
      initialize = staticmethod(lambda **kw: calls.append(kw))

  with flagsaver.flagsaver(**{"num_processes": 2, "process_id": 1, **argv}):
    with pytest.raises(app.UsageError, match=match):
      distributed.initialize_distributed(FakeJax)
  assert not calls
  with flagsaver.flagsaver(coordinator_address="[::1]:1234",
                           num_processes=2, process_id=1):
    distributed.initialize_distributed(FakeJax)
  assert calls[0]["coordinator_address"] == "[::1]:1234"
  # Process 0 on a port already served (another job, or two processes
  # given --process_id=0): every process waited 300 s for its peers.
  with socket.socket() as taken:
    taken.bind(("", 0))
    taken.listen()
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    with flagsaver.flagsaver(coordinator_address=address, num_processes=2,
                             process_id=0):
      with pytest.raises(app.UsageError, match="is in use on this host"):
        distributed.initialize_distributed(FakeJax)
  assert len(calls) == 1


def test_auto_joins_the_slice_jax_finds_on_a_cloud_tpu_vm(monkeypatch):
  """A pod's workers started by hand have no TPU_WORKER_HOSTNAMES (GKE sets
  it, Cloud TPU VMs do not): --distributed=auto left each worker alone.
  On a TPU VM it now lets JAX find the slice from the VM's metadata, and
  goes on as one process where JAX finds no cluster."""
  from absl import app, flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  from trm.core import distributed  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  calls, answers = [], []

  def initialize(**kw):
    calls.append(kw)
    if answers:
      raise answers.pop()

  class FakeJax:
    class config:  # pylint: disable=invalid-name
      update = staticmethod(lambda *args: None)

    class distributed:  # pylint: disable=invalid-name
      pass

  FakeJax.distributed.initialize = staticmethod(initialize)
  on_tpu_vm = distributed._on_tpu_vm  # pylint: disable=protected-access
  monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
  monkeypatch.delenv("MEGASCALE_NUM_SLICES", raising=False)
  with flagsaver.flagsaver(distributed="auto"):
    monkeypatch.setattr(distributed, "_on_tpu_vm", lambda: False)
    distributed.initialize_distributed(FakeJax)
    assert not calls  # a CPU or GPU host: one process, as before
    monkeypatch.setattr(distributed, "_on_tpu_vm", lambda: True)
    distributed.initialize_distributed(FakeJax)
    assert calls == [{"initialization_timeout": 360}]  # ours comes first
    answers.append(ValueError("coordinator_address should be defined."))
    distributed.initialize_distributed(FakeJax)  # no cluster: one process
    answers.append(ValueError("Number of processes must be defined."))
    with pytest.raises(ValueError, match="Number of processes"):
      distributed.initialize_distributed(FakeJax)
  with flagsaver.flagsaver(distributed="true"):
    # No cluster found (SLURM, MPI, TPU): JAX's line named no flag.
    answers.append(ValueError("coordinator_address should be defined."))
    monkeypatch.setattr(distributed, "_on_tpu_vm", lambda: False)
    with pytest.raises(app.UsageError, match=(
        "--distributed=true: JAX found no cluster to join on this host .*"
        "--coordinator_address=HOST:PORT")):
      distributed.initialize_distributed(FakeJax)
  with flagsaver.flagsaver(distributed="false"):
    distributed.initialize_distributed(FakeJax)
  assert len(calls) == 4
  # This CPU host is no TPU VM (jax's import found no chips).
  assert not on_tpu_vm()


def test_a_job_that_does_not_form_stops_each_process_with_one_line(
    tmp_path, main_clis):
  """A peer never started, or pointed at a wrong address: every process
  waited 300 s, then XLA aborted it (SIGABRT, a C++ stack dump). Now each
  stops after --distributed_timeout with one line naming the coordinator
  (process 0: how many of the processes joined). A process given another
  --num_processes joined process 0's job and trained on, unnoticed: now
  both stop with one line once joined."""
  address, nowhere, other = (f"127.0.0.1:{workers_lib.free_port()}"
                             for _ in range(3))
  # trm.main joins the job before anything else. Process 1 of 2 is started
  # nowhere (beside process 0 of the job it never joins); at `other`,
  # process 1 is given --num_processes=3.
  runs = [(address, 2, 0), (nowhere, 2, 1), (other, 2, 0), (other, 3, 1)]
  argvs = [["--config=configs/trm_sudoku.py:cpu",
            f"--workdir={tmp_path / 'run'}", f"--coordinator_address={where}",
            f"--num_processes={count}", f"--process_id={index}",
            f"--distributed_timeout={1 if where != other else 60}",
            "--compilation_cache=off"] for where, count, index in runs]
  codes, outputs = _two_mains(main_clis, argvs[:2], timeout=60)
  more_codes, more_outputs = _two_mains(main_clis, argvs[2:], timeout=60)
  codes, outputs = codes + more_codes, outputs + more_outputs
  assert codes == [1, 1, 2, 2], outputs
  lines = [[line for line in output.splitlines() if "error:" in line]
           for output in outputs]
  assert [len(found) for found in lines] == [1, 1, 1, 1], outputs
  assert ("this job has 2 processes (process 0's --num_processes), but "
          "process 1: --num_processes=3; give every process the same "
          "--num_processes.") in lines[2][0]
  assert (f"--num_processes=3, but process 0 at {other} started a job of 2 "
          "processes") in lines[3][0]
  assert (f"process 0 of 2 (the coordinator, at {address}) waited 1 s "
          "(--distributed_timeout) for the job to form; 1 of 2 processes "
          "joined.") in lines[0][0]
  assert (f"process 1 of 2 could not reach the coordinator at {nowhere} "
          "within 1 s") in lines[1][0]
  text = "".join(outputs)
  assert "Check failure" not in text and "Traceback" not in text
  assert not (tmp_path / "run").exists()


def test_the_join_watch_counts_the_connections_to_the_coordinator():
  """What the line above counts: this process's established connections on
  the coordinator's port (served: one per process that joined; reached:
  one of its own to the coordinator)."""
  from trm.core import distributed  # pylint: disable=g-import-not-at-top
  with socket.socket() as server:
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    assert distributed._coordinator_sockets(port) == (0, False)  # pylint: disable=protected-access
    with socket.create_connection(("127.0.0.1", port)) as client:
      accepted, _ = server.accept()
      with accepted:
        assert client and distributed._coordinator_sockets(port) == (1, True)  # pylint: disable=protected-access


def test_a_failed_text_preparation_stops_every_process_at_once(tmp_path,
                                                               main_clis):
  """Process 0 prepares a GPT run's text; when it failed (here: an empty
  input), process 1 waited for meta.json and process 0 for process 1 in
  the job's shutdown barrier: both hung 5 minutes, then aborted."""
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  address = f"127.0.0.1:{workers_lib.free_port()}"
  codes, outputs = _two_mains(main_clis, [[
      "--config=configs/gpt.py:shakespeare_char_cpu",
      f"--workdir={tmp_path / 'run'}", f"--config.data.input={empty}",
      f"--config.data_root={tmp_path / 'data'}",
      f"--coordinator_address={address}", "--num_processes=2",
      f"--process_id={i}", "--compilation_cache=off"] for i in range(2)])
  assert codes == [2, 2], outputs
  assert f"error: {empty} holds 0 characters" in outputs[0], outputs[0][-2000:]
  assert "error: process 0 stopped while preparing" in outputs[1], (
      outputs[1][-2000:])


def test_processes_started_with_other_settings_stop_before_writing(
    tmp_path, main_clis):
  """Process 1 given another learning rate trained its replica of the
  parameters apart from process 0's, silently (both logged one loss); given
  another workdir as well, both processes waited forever for the first
  checkpoint. Now each stops with one line before anything is written, the
  odd process naming the fields."""
  address = f"127.0.0.1:{workers_lib.free_port()}"
  workdirs = [tmp_path / "zero", tmp_path / "one"]
  codes, outputs = _two_mains(main_clis, [
      ["--config=configs/trm_sudoku.py:cpu",
       f"--workdir={workdirs[i]}", f"--coordinator_address={address}",
       "--num_processes=2", f"--process_id={i}", "--compilation_cache=off"]
      + ["--config.optim.lr=0.5"] * i for i in range(2)])
  assert codes == [2, 2], outputs
  assert ("error: process 1 of 2 was started with other settings than "
          "process 0 (the odd process's error line names the fields)") in outputs[0]
  assert (f"--workdir: '{workdirs[0]}' on process 0, '{workdirs[1]}' here; "
          "config.optim.lr: 0.001 on process 0, 0.5 here.") in outputs[1]
  assert "Traceback" not in outputs[0] + outputs[1]
  assert not any(w.exists() for w in workdirs)


def _write_host_data(host, family: str, i: int) -> list[str]:
  """Host i's copy of the data (other on each host) and the flags to it."""
  if family == "gpt":
    # The same characters, in another order on host 1.
    text = "".join(f"line {j}: to be, or not\n" for j in range(400))
    preparation.prepare_char(text[::1 - 2 * i],
                             str(host / "data" / "shakespeare_char"))
    return ["--config=configs/gpt.py:shakespeare_char_cpu",
            "--config.data_root=data", "--config.data.input=",
            "--config.batch_size=4", "--config.max_iters=2",
            "--config.eval_iters=2"]
  (host / "sft.jsonl").write_text("".join(
      f'{{"prompt": "q{j}", "response": "answer {j * (i + 1)}"}}\n'
      for j in range(24)))
  return ["--config=configs/diffucoder_7b.py:tiny",
          "--config.data.format=jsonl", "--config.data.path=sft.jsonl",
          "--config.data.chat=False", "--config.data.eval_rows=8",
          "--config.data.eval_batch_size=8", "--config.global_batch_size=8",
          "--config.seq_len=32", "--config.total_steps=2"]


@pytest.mark.parametrize("family", ["dream", "gpt"])
def test_hosts_holding_other_data_at_one_path_are_refused(tmp_path, family,
                                                          main_clis):
  """Each process reads its rows of every batch from its own copy of the
  data: two hosts with other files at the same config.data.path /
  data_root (here each process's relative path from its own directory)
  trained on a mix of both data sets, each skipping the rows the other
  would have read, silently. Now each stops with one line before anything
  is written."""
  address = f"127.0.0.1:{workers_lib.free_port()}"
  argvs, hosts = [], []
  for i in range(2):
    host = tmp_path / f"host{i}"
    host.mkdir()
    flags = _write_host_data(host, family, i)
    flags[0] = flags[0].replace("--config=", f"--config={ROOT}/")
    argvs.append([*flags, f"--workdir={tmp_path / 'run'}",
                  f"--coordinator_address={address}", "--num_processes=2",
                  f"--process_id={i}", "--compilation_cache=off"])
    hosts.append(str(host))
  codes, outputs = _two_mains(main_clis, argvs, cwds=hosts)
  assert codes == [2, 2], outputs
  assert re.search(
      r"error: process 1 of 2 was started with other settings than process "
      r"0: evaluation rows \(data fingerprint\): '[\w+]+' on process 0, "
      r"'[\w+]+' here; training rows \(data fingerprint\): '\w+' on process "
      r"0, '\w+' here\. Start every process of the job with the same "
      r"command \(the same data: identical files at config.data's paths on "
      r"every host\)", outputs[1]), outputs[1][-2000:]
  assert "Traceback" not in outputs[0] + outputs[1]
  assert not (tmp_path / "run" / "checkpoints").exists()

def test_a_mesh_that_puts_the_whole_batch_on_each_process_is_refused(
    tmp_path, main_clis):
  """The model axis across the two processes: each process's devices hold
  every row of the batch, but each process reads half of them. The first
  step failed after compiling ("compiled with int32[16,81] and called with
  int32[8,81]", a TypeError traceback); now one line before the data."""
  address = f"127.0.0.1:{workers_lib.free_port()}"
  codes, outputs = _two_mains(main_clis, [
      ["--config=configs/trm_sudoku.py:cpu",
       f"--workdir={tmp_path / 'run'}", f"--coordinator_address={address}",
       "--num_processes=2", f"--process_id={i}", "--compilation_cache=off",
       "--config.mesh.data=1", "--config.mesh.fsdp=1", "--config.mesh.model=-1",
       f"--config.data.data_dir={tmp_path / 'data'}"] for i in range(2)])
  assert codes == [2, 2], outputs
  for output in outputs:
    assert ("error: config.global_batch_size=64: each of the 2 processes "
            "reads 32 rows of every batch, but the mesh {'data': 1, 'fsdp': "
            "1, 'model': 2} (batch sharded over ('data', 'fsdp')) places 64 "
            "rows on this process's devices.") in output, output[-2000:]
  assert not os.path.exists(tmp_path / "data")


# Each process's rows of a 16-row batch (row i holds i), placed by
# `pipeline.to_global` on a (data, fsdp, model) = (2, 2, 2) mesh of both
# processes' devices, the batch over `axes`; the global rows, gathered.
_ROWS_WORKER = workers_lib.JOIN + """
import json
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from trm.core import pipeline
mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "fsdp", "model"))
rows = np.arange(48).reshape(16, 3)[8 * process_id:8 * (process_id + 1)]
found = {{}}
for axes in (("data", "fsdp"), ("fsdp", "data")):
  sharding = NamedSharding(mesh, P(axes, None))
  batch = pipeline.to_global({{"x": rows}}, {{"x": sharding}})
  assert batch["x"].sharding == sharding
  found["+".join(axes)] = multihost_utils.process_allgather(
      batch["x"], tiled=True)[:, 0].tolist()
print("RESULT", json.dumps(found), flush=True)
""" + workers_lib.LEAVE


def test_the_global_batch_keeps_its_row_order_on_any_mesh():
  """Process p reads rows [8p, 8p + 8) of each batch. With the batch over
  ('fsdp', 'data') (or fsdp across slices, or a TPU mesh ordering hosts
  otherwise) p's devices hold rows {0-3, 8-11} and {4-7, 12-15}:
  make_array_from_process_local_data put process 0's rows 4-7 at 8-11, so
  the batch was another than one process's, and trm.evaluate's
  predictions file paired example 4 with example 8's prediction."""
  address = f"127.0.0.1:{workers_lib.free_port()}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=workers_lib.xla_flags(4))
  workers = [subprocess.Popen(
      [sys.executable, "-c", _ROWS_WORKER.format(process_id=i,
                                                 address=address)],
      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True) for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=120)
  for worker, output in zip(workers, outputs):
    assert worker.returncode == 0, output[-3000:]
    result = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    assert result == {"data+fsdp": list(range(0, 48, 3)),
                      "fsdp+data": list(range(0, 48, 3))}, result
