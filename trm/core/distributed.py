"""Joining a multi-process job: the flags and start-up every entry point
shares (a pod runs the same command on every worker)."""
from __future__ import annotations

import os
import sys
import threading
import time

from absl import app, flags

from trm.core import cli

_DISTRIBUTED = flags.DEFINE_enum(
    "distributed", "auto", ["auto", "true", "false"],
    "Call jax.distributed.initialize(): 'auto' does so on a Cloud TPU VM "
    "(JAX finds the slice's workers), on a GKE TPU pod or when "
    "--coordinator_address is given.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (CPU/GPU clusters; "
    "TPU pods find it themselves).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Number of processes in the job.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "This process's index in the job.")
_TIMEOUT = flags.DEFINE_integer(
    "distributed_timeout", 300,
    "Seconds every process waits for the whole job to join "
    "jax.distributed; then it stops with one line naming the coordinator "
    "and, on process 0, how many processes joined.")
# JAX's own deadline, this much after ours: at it, XLA aborts the process.
_JAX_GRACE_SECONDS = 60
_MAX_TIMEOUT = 10**7  # 115 days


def _on_multihost_tpu() -> bool:
  """GKE's TPU pods name every worker of the slice in TPU_WORKER_HOSTNAMES;
  a multi-slice job has MEGASCALE_NUM_SLICES."""
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  slices = int(os.environ.get("MEGASCALE_NUM_SLICES", "1") or 1)
  return len([h for h in hosts.split(",") if h.strip()]) > 1 or slices > 1


def _on_tpu_vm() -> bool:
  """A host with TPU chips whose metadata server may be asked (a Cloud TPU
  VM: JAX's `GceTpuCluster` reads its workers there, not from the
  environment)."""
  if os.environ.get("TPU_SKIP_MDS_QUERY") is not None:
    return False
  try:  # set by `import jax` where libtpu finds TPU chips
    from jax._src import cloud_tpu_init  # pylint: disable=g-import-not-at-top
    return bool(cloud_tpu_init.running_in_cloud_tpu_vm)
  except Exception:  # pylint: disable=broad-except
    return False  # a JAX without it: the environment rules above only


def initialize_distributed(jax) -> None:
  """Joins the multi-process job before anything touches devices."""
  wanted = _DISTRIBUTED.value
  if (wanted == "auto" and not _COORDINATOR.value and not _on_multihost_tpu()
      and _on_tpu_vm()):
    # A pod's workers started by hand (`gcloud ... ssh --worker=all`) have
    # no TPU_WORKER_HOSTNAMES: JAX finds the slice from the VM's metadata,
    # as MaxText relies on (before, each worker went on without joining,
    # and Orbax's async checkpointer then failed on several processes).
    try:
      _join(jax)
      return
    except ValueError as e:
      if "coordinator_address" not in str(e):
        raise
      # No TPU cluster found after all: one process, as before.
  if wanted == "false" or (wanted == "auto" and not _COORDINATOR.value
                           and not _on_multihost_tpu()):
    if wanted == "auto" and (_NUM_PROCESSES.value not in (None, 1)
                             or _PROCESS_ID.value not in (None, 0)):
      # Otherwise ignored: every process would train alone, as process 0.
      raise app.UsageError(
          "--num_processes/--process_id need --coordinator_address=HOST:PORT "
          "(process 0's address), or --distributed=true where JAX finds the "
          "cluster itself (e.g. SLURM).")
    return
  if _COORDINATOR.value:
    _check_address(_COORDINATOR.value)
    if _NUM_PROCESSES.value is None or _PROCESS_ID.value is None:
      raise app.UsageError("--coordinator_address needs --num_processes and "
                           "--process_id.")
    if not 0 <= _PROCESS_ID.value < _NUM_PROCESSES.value:
      # JAX's own ValueError named neither flag.
      raise app.UsageError(
          f"--process_id={_PROCESS_ID.value} is not one of the "
          f"--num_processes={_NUM_PROCESSES.value} processes' indices: give "
          "each process its own --process_id from 0 to --num_processes - 1.")
    if _PROCESS_ID.value == 0:
      _check_port_free(_COORDINATOR.value)
  if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
    # CPU processes exchange collectives over gloo.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    _join(jax, coordinator_address=_COORDINATOR.value,
          num_processes=_NUM_PROCESSES.value, process_id=_PROCESS_ID.value)
  except ValueError as e:
    if _COORDINATOR.value or "defined" not in str(e):
      raise
    # JAX's own line ("coordinator_address should be defined.") named
    # neither our flags nor a way out.
    raise app.UsageError(
        f"--distributed={wanted}: JAX found no cluster to join on this host "
        f"({e}); pass --coordinator_address=HOST:PORT --num_processes=N "
        "--process_id=I to every process, or --distributed=false to run "
        "one process.") from None
  if _COORDINATOR.value:
    _check_same_count(_NUM_PROCESSES.value)


def _check_same_count(given: int) -> None:
  """Refuses, on every process, a job whose processes were given different
  --num_processes: process 0's count wins, and a process given another
  went on training unnoticed. The processes compare through the
  coordination service's key-value store (milliseconds, nothing to
  compile); after its barrier, the store holds one entry per process of
  the job."""
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  state = jax_distributed.global_state
  state.client.key_value_set(f"trm/num_processes/{state.process_id}",
                             str(given))
  state.client.wait_at_barrier("trm/num_processes", _TIMEOUT.value * 1000)
  counts = {int(key.rpartition("/")[2]): int(value) for key, value in
            state.client.key_value_dir_get("trm/num_processes/")}
  size = len(counts)  # process 0's --num_processes
  odd = sorted(index for index, count in counts.items() if count != size)
  if not odd:
    return
  if given != size:
    raise app.UsageError(
        f"--num_processes={given}, but process 0 at {_COORDINATOR.value} "
        f"started a job of {size} processes: give every process the same "
        "--num_processes.")
  others = ", ".join(f"process {i}: --num_processes={counts[i]}"
                     for i in odd)
  raise app.UsageError(
      f"this job has {size} processes (process 0's --num_processes), but "
      f"{others}; give every process the same --num_processes.")


def _join(jax, **kwargs) -> None:
  """jax.distributed.initialize, ended with one line after
  --distributed_timeout seconds if the job has not formed. At JAX's own
  deadline jax 0.10.2 raises nothing: XLA aborts the process (SIGABRT and
  a C++ stack dump), and the main thread waits inside that call. So a
  watchdog thread ends the process first; JAX's deadline comes later."""
  timeout = _TIMEOUT.value
  if not 0 < timeout <= _MAX_TIMEOUT:  # XLA takes a 32-bit count
    raise app.UsageError(f"--distributed_timeout={timeout}: must be 1 to "
                         f"{_MAX_TIMEOUT} seconds, e.g. 300.")
  joined = threading.Event()
  threading.Thread(target=_watch_join, args=(joined, timeout), daemon=True,
                   name="trm-join-watch").start()
  try:
    jax.distributed.initialize(
        **kwargs, initialization_timeout=timeout + _JAX_GRACE_SECONDS)
  finally:
    joined.set()


def _coordinator_sockets(port: int) -> tuple[int, bool] | None:
  """This process's established TCP connections on the coordinator's port:
  how many it serves (process 0: one per process connected to its
  coordination service, its own included), and whether it has one to it.
  None where /proc cannot tell (not Linux)."""
  try:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
      try:
        link = os.readlink(f"/proc/self/fd/{fd}")
      except OSError:
        continue
      if link.startswith("socket:["):
        inodes.add(link[len("socket:["):-1])
    served, reached = 0, False
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
      if not os.path.exists(table):
        continue
      with open(table) as f:
        for line in f.readlines()[1:]:
          fields = line.split()
          # 01: ESTABLISHED; ports are hexadecimal after the last ':'.
          if fields[3] != "01" or fields[9] not in inodes:
            continue
          served += int(fields[1].rpartition(":")[2], 16) == port
          reached |= int(fields[2].rpartition(":")[2], 16) == port
    return served, reached
  except (OSError, ValueError, IndexError):
    return None


def _watch_join(joined: threading.Event, timeout: float) -> None:
  """Counts the processes connected to the coordinator each second; if the
  job has not formed after `timeout` seconds, ends this process with one
  line."""
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + timeout
  most, reached = None, False
  while not joined.wait(max(0.0, min(1.0, deadline - time.monotonic()))):
    state = jax_distributed.global_state
    address = state.coordinator_address or _COORDINATOR.value or "?"
    port = address.rpartition(":")[2]
    sockets = _coordinator_sockets(int(port)) if port.isdigit() else None
    if sockets is not None:
      # The most seen: a peer that gave up a moment earlier still joined.
      most, reached = max(most or 0, sockets[0]), reached or sockets[1]
    if time.monotonic() < deadline:
      continue
    count, index = state.num_processes, state.process_id
    if _COORDINATOR.value:
      same = (f"Start every process with --coordinator_address={address} "
              f"--num_processes={count} and its own --process_id (0 to "
              f"{count - 1 if count else '?'})")
      odd = ("process 0 expects another --num_processes, or another "
             "process has this --process_id")
    else:  # JAX found the cluster (a TPU pod): no flags of ours to name
      same = ("Start the same command on every worker of the job "
              "(launch/tpu_pod.py run does)")
      odd = "e.g. a worker that failed to start"
    if count is None or index is None:  # still finding the cluster (TPU)
      text = (f"the job did not form within {timeout} s "
              "(--distributed_timeout): JAX found no cluster to join yet. "
              "Start every worker of the job with the same command, or "
              "raise --distributed_timeout.")
    elif index == 0:
      joined_text = (f"; {most} of {count} processes joined"
                     if most is not None else "")
      text = (f"process 0 of {count} (the coordinator, at {address}) waited "
              f"{timeout} s (--distributed_timeout) for the job to form"
              f"{joined_text}. {same}, or raise --distributed_timeout if "
              "some start later.")
    elif reached:
      text = (f"process {index} of {count} reached the coordinator at "
              f"{address}, but the job did not form within {timeout} s "
              "(--distributed_timeout): not every process joined (process "
              f"0's own line counts them), {odd}. {same}.")
    else:
      text = (f"process {index} of {count} could not reach the coordinator "
              f"at {address} within {timeout} s (--distributed_timeout): "
              "process 0 is not running there, or the host or port is "
              f"wrong or blocked from this host. {same}.")
    sys.stderr.write(f"{cli.tool_name()}: error: {text}\n")
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access


def _check_address(address: str) -> None:
  """One line for an address that jax.distributed would crash on (no port:
  IndexError; a port that is not a number: a segfault) or wait 300 s on."""
  host, _, port = address.rpartition(":")
  if ("://" in address or not host.strip("[]").strip() or not port.isdigit()
      or not 0 < int(port) < 2**16):
    raise app.UsageError(
        f"--coordinator_address={address!r} is not HOST:PORT: pass process "
        "0's host name or IP and a free port, e.g. 10.0.0.2:1234.")


def _check_port_free(address: str) -> None:
  """Process 0 serves the job on the address's port (all interfaces). A
  port already served (another job, or a second process given
  --process_id=0) left every process waiting 300 s for peers."""
  if os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
    return
  import socket  # pylint: disable=g-import-not-at-top
  port = int(address.rpartition(":")[2])
  with socket.socket() as probe:
    # Not refused by a closed port's TIME_WAIT, only by a listening socket.
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(("", port))
    except OSError as e:
      raise app.UsageError(
          f"--coordinator_address={address}: port {port} is in use on this "
          f"host ({e.strerror}): another job, or another process given "
          "--process_id=0; pick a free port.") from None


class ProcessZeroError(cli.UserError, RuntimeError):
  """Process 0 stopped in work only it does; the others stop with it."""


def run_on_process_0(fn, what: str):
  """`fn()` on process 0 (None on the others), for work only it does
  (reading or writing a shared output). If it fails there, every process
  stops now: the others would otherwise wait in the job's next collective
  until the coordinator gave up on process 0."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return fn()
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  result, error = None, None
  if jax.process_index() == 0:
    try:
      result = fn()
    except Exception as e:  # pylint: disable=broad-except
      error = e
  failed = int(multihost_utils.broadcast_one_to_all(
      np.int32(error is not None)))
  if error is not None:
    raise error
  if failed:
    raise ProcessZeroError(f"process 0 stopped while {what}; its output "
                           "names the cause.")
  return result


class ProcessesDifferError(cli.UserError, ValueError):
  """The processes of one job were started with different settings."""


def check_same_settings(settings: dict, what: str) -> None:
  """Refuses a job whose processes were given different `settings` ({name:
  value}, JSON-serialisable), on every process, before any of them builds
  or writes anything. Each process names the fields where its own settings
  differ from process 0's. A process given another learning rate trained
  its replica of the parameters silently apart from the others; one given
  another workdir left every process waiting for a checkpoint that never
  completed."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return
  import hashlib  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  text = json.dumps(settings, sort_keys=True, default=repr).encode()
  digests = np.asarray(multihost_utils.process_allgather(
      np.frombuffer(hashlib.sha256(text).digest(), np.uint8)))
  differing = [i for i, digest in enumerate(digests)
               if not np.array_equal(digest, digests[0])]
  if not differing:
    return
  # Process 0's settings, to name the fields that differ from them.
  size = int(multihost_utils.broadcast_one_to_all(np.int64(len(text))))
  mine = np.zeros(size, np.uint8)
  mine[:min(size, len(text))] = np.frombuffer(text, np.uint8)[:size]
  first = json.loads(bytes(np.asarray(
      multihost_utils.broadcast_one_to_all(mine))))
  ours = json.loads(text)
  diff = "; ".join(
      f"{key}: {first.get(key)!r} on process 0, {ours.get(key)!r} here"
      for key in sorted(set(first) | set(ours))
      if first.get(key) != ours.get(key))
  fix = ("Start every process of the job with the same command (the same "
         f"{what}), then rerun.")
  if diff:
    raise ProcessesDifferError(
        f"process {jax.process_index()} of {jax.process_count()} was started "
        f"with other settings than process 0: {diff}. {fix}")
  others = (f"process {differing[0]} of {jax.process_count()} was"
            if len(differing) == 1 else
            f"processes {', '.join(map(str, differing))} of "
            f"{jax.process_count()} were")
  raise ProcessesDifferError(
      f"{others} started with other settings than process 0 (the odd "
      f"process's error line names the fields). {fix}")
