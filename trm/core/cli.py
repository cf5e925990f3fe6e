"""What every command-line tool shares: flag parsing, one-line errors and
signals.

  if __name__ == "__main__":
    cli.run(main)

- A mistake in the input (a `UserError`, or a ValueError / OSError raised
  while checking it) prints ONE line, `<tool>: error: <message>`, and exits
  2. `--traceback` (or TRM_TRACEBACK=1) shows the whole traceback; other
  exceptions (programming errors) always keep theirs.
- SIGTERM and SIGINT (Ctrl-C) get Python handlers before jax loads, so
  libtpu's failure-signal handler (a stack dump, exit 143) never takes them.
  Before the training loop they stop the tool with one line (exit 0 for
  SIGTERM, a scheduler's normal stop; 130 for Ctrl-C); inside it,
  `train._Preemption` takes over to save first. A second signal while the
  first is handled exits at once with one line. Python runs a handler only
  when the main thread is back in the interpreter, so a signal that arrives
  while start-up is inside compiled code (an XLA compile, a blocked
  collective, a pool's shutdown) would wait for it: a watchdog thread, woken
  by the signal itself (`signal.set_wakeup_fd`), ends the process with the
  same line if the main thread has not exited `STARTUP_GRACE_SECONDS`
  later. The training loop turns the watchdog off (`startup_watch(False)`):
  there a signal means save first, however long that takes.
- On a host with no TPU or GPU, JAX_PLATFORMS defaults to cpu
  (`default_to_cpu`): with libtpu installed (`.[tpu]`, `.[test]`) jax would
  otherwise initialise it on every start and print its E0000 complaints
  about TPU_WORKER_HOSTNAMES.
"""
from __future__ import annotations

import gc
import glob
import logging as logging_std
import os
import signal
import sys
import threading
import time
import traceback

from absl import app, flags, logging

from trm.core import compile_cache
from trm.core import config_lib

TRACEBACK_ENV = "TRM_TRACEBACK"
_TRACEBACK = flags.DEFINE_bool(
    "traceback", False, "On an input error, show the whole traceback instead "
    f"of one line (also: {TRACEBACK_ENV}=1).")
_COMPILATION_CACHE = flags.DEFINE_string(
    "compilation_cache", None, "JAX's persistent compilation cache: a "
    f"directory, or 'off' (default: ${compile_cache.ENV}, else "
    "$XDG_CACHE_HOME/trm/jax).")
_COMPILATION_CACHE_MAX_GB = flags.DEFINE_float(
    "compilation_cache_max_gb", compile_cache.DEFAULT_MAX_GB,
    "The compilation cache's size limit; least recently used entries go "
    "first.")
EXIT_CODES = {signal.SIGTERM: 0, signal.SIGINT: 130}
STARTUP_GRACE_SECONDS = 5.0


class UserError(Exception):
  """Mixin for errors caused by the user's input or environment (not bugs):
  the command line shows them as one line."""


class Interrupted(BaseException):
  """A SIGTERM or SIGINT arrived outside the training loop (a BaseException,
  so `except Exception` in library code does not swallow it)."""

  def __init__(self, signum: int):
    self.signum = signum
    super().__init__(signal.Signals(signum).name)


def tool_name() -> str:
  """'trm.main' for `python -m trm.main`, else the script's name."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  if spec is not None and spec.name:
    # A package run as `python -m trm.data.tfds_builders` runs its
    # __main__ module: name it as it was typed.
    return spec.name.removesuffix(".__main__")
  name = os.path.basename(sys.argv[0] or "trm")
  if name in ("__main__.py", "-c", ""):
    name = "trm"
  return name.removesuffix(".py")


def exit_now(signum: int, what: str) -> None:
  """A second signal: one line, then exit without waiting for anything."""
  sys.stderr.write(f"{tool_name()}: {signal.Signals(signum).name} again: "
                   f"exiting now; {what}\n")
  sys.stderr.flush()
  os._exit(EXIT_CODES.get(signum, 1))  # pylint: disable=protected-access


REDELIVER_SECONDS = 0.05


def _in_gc_callback(frame) -> bool:
  """Is `frame`, or a frame that called it, one of `gc.callbacks`? (JAX
  registers one.) An exception raised there is printed as "Exception
  ignored" and dropped by the garbage collector."""
  codes = {getattr(c, "__code__", None) for c in gc.callbacks}
  while frame is not None:
    if frame.f_code in codes:
      return True
    frame = frame.f_back
  return False


def _on_signal(signum, frame):
  # A copy the watchdog sent (below) is not a second signal from the user.
  echo, _on_signal.echo = getattr(_on_signal, "echo", False), False
  if _in_gc_callback(frame):
    # Raised here, Interrupted would be lost (and its traceback printed):
    # the watchdog thread delivers the signal to the main thread again
    # shortly, once the callback has returned. (Not a new thread from here:
    # a timer started inside a handler inside the collector could stall.)
    _on_signal.deferred = signum
    return
  if getattr(_on_signal, "raised", False):
    if echo:
      return
    exit_now(signum, "cleanup was skipped.")
  _on_signal.raised = True
  raise Interrupted(signum)


_STOPPED_LINE = ("{tool}: stopped by {name} before training began or after "
                 "it ended; nothing was saved by this signal (checkpoints "
                 "already written are kept).")


class _StartupWatch:
  """Ends the process when a stop signal is not handled within a grace
  period outside the training loop (see the module docstring)."""

  def __init__(self):
    self.armed = True
    self.reported = False  # the main thread printed the line itself
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=self._watch, args=(read_fd,), daemon=True,
                     name="trm-signal-watch").start()

  def _watch(self, read_fd: int) -> None:
    while True:
      try:
        received = os.read(read_fd, 64)
      except OSError:
        return
      if not received:
        return
      signums = [s for s in received if s in EXIT_CODES]
      if not signums or not self.armed:
        continue
      deadline = time.monotonic() + STARTUP_GRACE_SECONDS
      pending = None
      while time.monotonic() < deadline:
        time.sleep(REDELIVER_SECONDS)
        deferred = getattr(_on_signal, "deferred", None)
        if deferred is not None:  # the main thread was in a gc callback
          _on_signal.deferred, pending = None, deferred
        if pending is not None and not getattr(_on_signal, "raised", False):
          # Sent again until the main code has raised it: a copy that
          # lands just before the main thread enters a blocking call (a
          # sleep, a compiled step) waits for that call to return, and
          # the next copy interrupts it.
          _on_signal.echo = True
          signal.pthread_kill(threading.main_thread().ident, pending)
      if self.armed:  # the main thread is still busy: end it from here
        name = signal.Signals(signums[0]).name
        if not self.reported:
          sys.stderr.write(_STOPPED_LINE.format(tool=tool_name(), name=name)
                           + f" (the signal waited {STARTUP_GRACE_SECONDS:g}"
                           " s for the main thread, busy in compiled code.)"
                           "\n")
        sys.stderr.flush()
        os._exit(EXIT_CODES[signums[0]])  # pylint: disable=protected-access


_WATCH: _StartupWatch | None = None


def startup_watch(armed: bool) -> None:
  """Turns the start-up watchdog off (the training loop saves on a signal,
  however long that takes) or back on."""
  if _WATCH is not None:
    _WATCH.armed = armed


def install_signal_handlers() -> None:
  """Our handlers for SIGTERM and SIGINT, and the start-up watchdog (main
  thread only)."""
  global _WATCH
  _on_signal.raised = False
  for signum in EXIT_CODES:
    signal.signal(signum, _on_signal)
  if _WATCH is None:
    _WATCH = _StartupWatch()
  _WATCH.armed = True


def traceback_requested(argv=None) -> bool:
  """--traceback or TRM_TRACEBACK=1. `argv`: the command line, read for
  --traceback while the flags are not parsed (an error parsing them)."""
  if flags.FLAGS.is_parsed():
    asked = _TRACEBACK.value
  else:
    asked = any(a.startswith("--traceback") and a.split("=", 1)[-1].lower()
                not in ("false", "0") for a in (argv or [])[1:])
  return asked or os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def is_user_error(error: BaseException) -> bool:
  return isinstance(error, (UserError, ValueError, OSError))


def out_of_memory(error: BaseException) -> bool:
  """An XLA runtime error for memory the device (or host) does not have:
  the config's sizes, not a bug, so one line naming what to shrink."""
  return (type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError")
          and "RESOURCE_EXHAUSTED" in str(error))


# What gloo reports when the process at the other end of a collective is
# gone (killed, crashed, its host lost).
_PEER_LOST_MARKS = ("Connection reset by peer", "Connection closed by peer",
                    "Broken pipe")


def peer_lost(error: BaseException) -> bool:
  """A collective's error whose peer process went away, whatever type
  carries it (or its cause). Fetching a failed result raises jax's
  JaxRuntimeError, but a program that fails while jit dispatches it (XLA:CPU
  runs a small one inline: `multihost_utils.process_allgather`'s, which
  `preemption.reached` calls) raises the same text as a ValueError. That one
  took the generic one-line exit, and process 0 then waited ~90 s in jax's
  shutdown barrier for the dead process and aborted (SIGABRT, a stack
  dump)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    text = str(error)
    if "Gloo" in text and any(m in text for m in _PEER_LOST_MARKS):
      return True
    error = error.__cause__ or error.__context__
  return False


def stdout_reader_gone() -> bool:
  """Whether stdout is a pipe or socket whose reading end has closed (poll
  reports an error on the writing end), not some other broken pipe (a
  child process's, a socket's)."""
  import select  # pylint: disable=g-import-not-at-top
  try:
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))
  except (AttributeError, OSError, ValueError):  # no fd (a notebook's)
    return False


# What to shrink when a tool runs out of device memory: the sampling tools
# take flags, not the trainer's config fields (which they told to reduce).
_SAMPLING_MEMORY = ("Pass fewer prompts at once (--batch_size), fewer "
                    "--max_new_tokens or shorter prompts, or "
                    "--dtype=bfloat16")
_OUT_OF_MEMORY_FIX = {
    "trm.generate": _SAMPLING_MEMORY + ".",
    "trm.evaluate": _SAMPLING_MEMORY + " (a TRM checkpoint: a smaller "
                    "--config.data.eval_batch_size).",
}
_TRAINER_MEMORY = ("Reduce config.global_batch_size (or the micro-batch), "
                   "the sequence length or the model size, turn on "
                   "rematerialisation (config.model.remat), or shard over "
                   "more devices (config.mesh.fsdp); checkpoints already "
                   "written are kept.")


def one_line(error: BaseException) -> str:
  text = " ".join(str(error).split()) or type(error).__name__
  if out_of_memory(error):
    fix = _OUT_OF_MEMORY_FIX.get(tool_name(), _TRAINER_MEMORY)
    text = (f"out of memory ({text[:300]}): the model, batch or sequence is "
            f"too big for this device. {fix}")
  return f"{tool_name()}: error: {text}"


def _exit_on_signal(signum, frame):
  """SIGTERM / SIGINT once `main` has returned (its work done or its error
  told): raised in the interpreter's teardown (jax's and Orbax's atexit
  callbacks), Interrupted was printed as an "Exception ignored" traceback.
  One line, then out at once with the run's own exit status: its work
  ended before the signal (and a failure stays one, not trm.main's 0 for
  a SIGTERM)."""
  del frame
  status = _exit_on_signal.status
  try:
    # os.write, not sys.stderr: the signal may land inside a write to it
    # (a reentrant call raises RuntimeError, and the exit never came).
    os.write(2, (f"{tool_name()}: {signal.Signals(signum).name} while "
                 "shutting down (the work had ended); exiting now.\n"
                 ).encode("utf-8", "replace"))
  except BaseException:  # pylint: disable=broad-except
    pass
  finally:
    os._exit(status)  # pylint: disable=protected-access


_exit_on_signal.status = 0
_exit_on_signal.installed = False


def ignore_late_stop_signals() -> None:
  """The last exit callback (`trm/__init__.py` registers it before jax
  loads, so after jax's and Orbax's): past it, Python's finalization puts
  back the signals' default action, and a SIGTERM there ended a finished
  run "killed by signal" (-15, which a scheduler counts as a failure)
  instead of its exit status. A tool's process therefore ends here, with
  that status, streams flushed: what is left is the interpreter's own
  teardown (ignoring the signals instead left a teardown that hangs
  deaf to SIGTERM)."""
  if (_exit_on_signal.installed
      and threading.current_thread() is threading.main_thread()):
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except BaseException:  # pylint: disable=broad-except
        pass
    os._exit(_exit_on_signal.status)  # pylint: disable=protected-access


def _exit_status(code) -> int:
  """The process exit status of `sys.exit(code)`."""
  if code is None:
    return 0
  return code if isinstance(code, int) else 1


def _wrap(main, compilation_cache: bool = True):
  def wrapped(argv):
    status = 1  # an exception other than SystemExit
    try:
      result = _run_main(argv)
      status = _exit_status(result)
      return result
    except SystemExit as e:
      status = _exit_status(e.code)
      raise
    finally:
      if threading.current_thread() is threading.main_thread():
        _exit_on_signal.status = status
        for signum in EXIT_CODES:
          signal.signal(signum, _exit_on_signal)
        _exit_on_signal.installed = True

  def _run_main(argv):
    try:
      if compilation_cache:
        compile_cache.configure(_COMPILATION_CACHE.value,
                                _COMPILATION_CACHE_MAX_GB.value)
      return main(argv)
    except Interrupted as stop:
      if _WATCH is not None:
        _WATCH.reported = True
      sys.stderr.write(_STOPPED_LINE.format(tool=tool_name(), name=stop) + "\n")
      sys.exit(EXIT_CODES.get(stop.signum, 1))
    except app.UsageError as error:
      # absl would print the module's whole docstring before the message.
      sys.stderr.write(f"{tool_name()}: error: {error} (--helpshort lists "
                       "the flags)\n")
      sys.exit(2)
    except Exception as error:  # pylint: disable=broad-except
      if isinstance(error, BrokenPipeError) and stdout_reader_gone():
        # `trm.sample ... | head`: the reader took what it wanted. A tool
        # in a pipeline stops quietly, as SIGPIPE stops `cat` (exit 128 +
        # 13), not with "error: [Errno 32] Broken pipe" and exit 2; stdout
        # goes to /dev/null so that Python's flush at exit fails no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
      if peer_lost(error) and not traceback_requested():
        # A traceback, then ~1 min in jax's shutdown barrier waiting for the
        # dead process's heartbeats to time out, then an abort (SIGABRT and
        # a stack dump): one line, and out at once.
        text = " ".join(str(error).split())[:300]
        sys.stderr.write(
            f"{tool_name()}: error: another process of this job stopped "
            f"({text}); its own output names the cause. Restart every "
            "process with the same command: the run resumes from its newest "
            "complete checkpoint.\n")
        logging.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # pylint: disable=protected-access
      if not (is_user_error(error) or out_of_memory(error)) or (
          traceback_requested()):
        raise
      sys.stderr.write(one_line(error) + "\n")
      sys.exit(2)
  return wrapped


def _quiet_closed_loop_callbacks() -> None:
  """After a failed asynchronous save, tensorstore's write callbacks find
  Orbax's event loop closed and report each RuntimeError as "unraisable"
  (a traceback apiece, dozens per save): noise after the one line that
  already names the failure. Shown with --traceback."""
  report = sys.unraisablehook

  def unraisablehook(unraisable):
    if isinstance(unraisable.exc_value, Interrupted):
      # Raised in a weakref or gc callback, a __del__ or an atexit callback,
      # where Python prints and drops it: the watchdog delivers the signal
      # again, to be raised in the main code.
      _on_signal.raised = False
      _on_signal.deferred = unraisable.exc_value.signum
      return
    if (unraisable.exc_type is RuntimeError
        and str(unraisable.exc_value) == "Event loop is closed"
        and not traceback_requested()):
      return
    report(unraisable)

  sys.unraisablehook = unraisablehook


# Device files of accelerators jax may use: TPU v2-v4 chips (/dev/accel*),
# TPU v5e and later (/dev/vfio/<n>), NVIDIA and AMD GPUs.
ACCELERATOR_FILES = ("/dev/accel*", "/dev/vfio/[0-9]*", "/dev/nvidia[0-9]*",
                     "/dev/kfd")


def default_to_cpu() -> bool:
  """Sets JAX_PLATFORMS=cpu when the user set no platform and the host has
  no accelerator; True if it did.

  jax tries every installed backend at start, libtpu's included, and libtpu
  without a chip logs errors (TPU_WORKER_HOSTNAMES, TPU_ACCELERATOR_TYPE) on
  the way to failing; JAX_PLATFORMS=cpu skips it. An explicit JAX_PLATFORMS
  (even ''), --jax_platforms or JAX_FORCE_TPU_INIT wins, and so does any
  accelerator device file, so TPU and GPU hosts start as before.
  """
  if ("JAX_PLATFORMS" in os.environ or "JAX_FORCE_TPU_INIT" in os.environ
      or any(glob.glob(pattern) for pattern in ACCELERATOR_FILES)):
    return False
  os.environ["JAX_PLATFORMS"] = "cpu"
  jax = sys.modules.get("jax")
  if jax is not None:  # imported already: its config read the variable then
    jax.config.update("jax_platforms", "cpu")
  return True


# What asyncio's "Task exception was never retrieved" names when the task
# was one of Orbax's reads or writes of a checkpoint.
_CHECKPOINT_IO_MARKS = ("orbax", "tensorstore", "OCDBT", "zarr")


class QuietLibraries(logging_std.Filter):
  """Drops INFO chatter of Orbax's internals (every save logs ~30 lines).

  A failed save surfaces as one `CheckpointError` line; Orbax's background
  threads would also log it with a traceback per thread and asyncio once
  per unretrieved write task (hundreds of lines for one full disk), so
  those keep their first line only (all of it with --traceback); asyncio's
  reports of unretrieved checkpoint reads and writes (after a failed save
  or restore has been reported in one line) are dropped."""

  def filter(self, record):
    orbax = "/orbax/" in record.pathname
    if orbax and record.levelno < logging_std.WARNING:
      return False
    if traceback_requested():
      return True
    message = record.getMessage()
    if record.name == "asyncio" and any(
        mark in message for mark in _CHECKPOINT_IO_MARKS):
      # A failed save's write tasks, or a failed restore's read tasks
      # (tensorstore: "Error reading ... in OCDBT database"), collected
      # after the one line that already reports the failure.
      return False
    if orbax and (record.exc_info or "\n" in message):
      record.msg, record.args = message.split("\n", 1)[0][:300], ()
      record.exc_info = record.exc_text = None
    return True


def expand_home(path: str) -> str:
  """`path` with a leading ~ expanded: `--flag=~/x` reaches a program as
  typed (the shell expands a ~ only at the start of a word), and the
  output went to a folder named '~' in the current one."""
  return os.path.expanduser(path) if path.startswith("~") else path


def expand_home_paths(config) -> None:
  """The config's strings that are `~` or start with `~/`, with the home
  directory: `--config.data_root=~/data` (data.input, data.tfds.data_dir,
  data.data_dir, ...) reaches us as typed, as --workdir does, and the data
  was prepared into a folder named '~' in the current one."""
  for key, value in config.items():
    if hasattr(value, "items"):  # a nested ConfigDict
      expand_home_paths(value)
    elif isinstance(value, str) and (value == "~" or value.startswith("~/")):
      config[key] = expand_home(value)


def within(path: str, directory: str) -> bool:
  """Whether `path` is `directory` or lies under it (links resolved): an
  output there would replace an input. Compared as resolved paths, then by
  file identity: one of `path`'s existing ancestors is `directory` (or its
  nearest existing ancestor, the names still to be created below it
  following) reached another way, which a path string does not show (a
  bind mount, another case of a name on a case-insensitive file system).
  URLs (`gs://...`) as strings only."""
  remote = "://" in path or "://" in directory
  path, directory = os.path.realpath(path), os.path.realpath(directory)
  if path == directory or path.startswith(directory.rstrip(os.sep) + os.sep):
    return True
  if remote:
    return False
  # The folder, or where it will go: its nearest existing ancestor and
  # the names still to be created below it.
  existing = nearest_existing(directory)
  below = ([] if existing == directory else
           os.path.relpath(directory, existing).split(os.sep))
  try:
    top = os.stat(existing)
  except (OSError, ValueError):  # unreadable
    return False
  names = []  # path's names under `here`
  here = path
  while True:
    if names[:len(below)] == below and _same_stat(here, top):
      return True
    parent = os.path.dirname(here)
    if parent == here:
      return False
    names.insert(0, os.path.basename(here))
    here = parent


def same_file(a: str, b: str) -> bool:
  """Whether `a` and `b` name one file or folder: the same resolved path,
  or, both existing, one file reached two ways (a bind mount, a hard link,
  another case of a name on a case-insensitive file system). URLs
  (`gs://...`) as strings only."""
  remote = "://" in a or "://" in b
  a, b = os.path.realpath(a), os.path.realpath(b)
  if a == b or remote:
    return a == b
  try:
    return os.path.samestat(os.stat(a), os.stat(b))
  except (OSError, ValueError):  # absent, unreadable, a NUL in the name
    return False


def _same_stat(path: str, stat: os.stat_result) -> bool:
  try:
    return os.path.samestat(os.stat(path), stat)
  except (OSError, ValueError):  # absent, unreadable, a NUL in the name
    return False


def nearest_existing(path: str) -> str:
  """`path` (made absolute) or its nearest ancestor that exists: where a
  path still to be created would go (its permissions, its disk)."""
  path = os.path.abspath(path)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


def check_writable_ancestor(path: str, flag: str) -> None:
  """The nearest existing ancestor of `path` is a directory we may write."""
  ancestor = nearest_existing(os.path.dirname(os.path.abspath(path)))
  if not os.path.isdir(ancestor):
    raise ValueError(f"{flag}={path}: {ancestor} is a file, so nothing can "
                     "be written under it; choose a path in a directory.")
  if not os.access(ancestor, os.W_OK | os.X_OK):
    raise ValueError(f"{flag}={path}: {ancestor} is not writable.")


def check_output_dir(path: str, flag: str = "--output_dir") -> str:
  """`flag`'s `path` can be (or become) a directory; checked before any
  work (os.makedirs said only '[Errno 17] File exists'). Returns it."""
  if not path:  # e.g. --output_dir=$OUT with OUT unset
    raise ValueError(f"{flag} is given but empty: name a directory.")
  path = expand_home(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ValueError(f"{flag}={path}: is a file; a directory is expected.")
  check_writable_ancestor(path, flag)
  # Written into, not replaced: read-only, the outputs failed after the
  # work, a bare "[Errno 13] Permission denied" naming a temporary file.
  if os.path.isdir(path) and not os.access(path, os.W_OK | os.X_OK):
    raise ValueError(f"{flag}={path}: the directory is not writable; make "
                     f"it writable or pass another {flag}.")
  return path


class _StepParser(flags.ArgumentParser):
  """--step: 'latest', 'best' or a step number (an int), refused as the
  flags are parsed, before anything is read."""
  syntactic_help = "latest, best or a step number"

  def __init__(self, name: str = "--step"):
    super().__init__()
    self.name = name  # how the error's example spells it

  def parse(self, argument):
    text = str(argument).strip().lower()
    if text in ("latest", "best"):
      return text
    if text.isascii() and text.isdigit():
      return int(text)
    raise ValueError(f"{argument!r} is none of latest, best or a step number "
                     f"(e.g. {self.name}=2000)")

  def flag_type(self):
    return "string"


def parse_step(value, name: str = "--step") -> str | int:
  """A --step value ('latest', 'best', a step number; an int passes) as
  `checkpoint.choose_step` takes it; ValueError naming what is accepted
  (its example spelled as `name`: the flag, or the API's argument)."""
  return _StepParser(name).parse(value)


def step_spelling(name: str = "--step"):
  """value -> how an error spells that step choice: `--step=best` for the
  tools' flag, `checkpoint_step='best'` for the Python API's argument (a
  `DiffusionLM` caller passed no --step)."""
  if name.startswith("--"):
    return lambda value: f"{name}={value}"
  return lambda value: f"{name}={value!r}"


def define_step_flag() -> flags.FlagHolder:
  """--step, which checkpoint of a trm.main workdir a reading tool
  (trm.generate, trm.evaluate, trm.export, trm.sample) reads: its value is
  'latest', 'best' or an int, for `checkpoint.choose_step`. Defined by each
  tool's `define_flags`, not here: trm.main and the builders take no
  --step."""
  return flags.DEFINE(
      _StepParser(), "step", "latest",
      "Which checkpoint of a trm.main workdir to read: latest (the newest "
      "readable one), best (the one with the lowest held-out loss, or the "
      "best config.best_metric the run ranked by, which the trainer keeps) "
      "or a step number.")


def workdir_step(workdir: str, choice, flag: str = "--checkpoint"
                 ) -> int | None:
  """The step --step (`define_step_flag`) names among the checkpoints of
  the trm.main workdir `workdir` (`checkpoint.choose_step`), before any
  weight is read; None for latest. Another source (Hugging Face weights, a
  Hub id, a PyTorch file) holds one set of weights: any other --step is
  refused there, as is an object-store workdir (read from a local disk,
  as without --step). A step's own directory, `<workdir>/checkpoints/<N>`,
  is refused naming the flags that read it (no tool reads one alone)."""
  parent, name = os.path.split(os.path.normpath(workdir)) if workdir else (
      "", "")
  if (name.isascii() and name.isdigit()
      and os.path.basename(parent) == "checkpoints"
      and os.path.isdir(workdir)):
    raise app.UsageError(
        f"{flag}={workdir} is one checkpoint of the trm.main workdir "
        f"{os.path.dirname(parent)}: pass {flag}={os.path.dirname(parent)} "
        f"--step={int(name)}.")
  if choice == "latest":
    return None
  if "://" in workdir:
    from trm.core import weights_io  # pylint: disable=g-import-not-at-top
    weights_io.check_local(workdir, flag, "trm.main workdirs are")
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    raise app.UsageError(
        f"--step={choice} chooses among the checkpoints of a trm.main "
        f"workdir; {flag}={workdir} is not one (it has no checkpoints/ "
        "directory). Drop --step, or point at the workdir.")
  from trm.core import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top
  return ckpt_lib.choose_step(directory, choice)


def show_shared_flags(compilation_cache: bool = True,
                      flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Makes the flags that trm modules define for the running tool key flags
  of its main module, so that `--help` lists them.

  absl's --help shows only the flags defined in the main module itself, so
  a builder's --output_dir and --source (`builder_cli`), trm.evaluate's
  sampling flags (defined in trm.generate), --traceback and the pod flags
  were listed by --helpfull alone, among absl's own. The compilation-cache
  flags stay out where the tool does not use the cache (trm.aot)."""
  main_module = sys.argv[0]
  hidden = set() if compilation_cache else {_COMPILATION_CACHE.name,
                                             _COMPILATION_CACHE_MAX_GB.name}
  for module, module_flags in flag_values.flags_by_module_dict().items():
    if module == main_module or not module.startswith("trm."):
      continue
    for flag in module_flags:
      if flag.name not in hidden:
        flag_values.register_key_flag_for_module(main_module, flag)


def run(main, compilation_cache: bool = True,
        stopped_line: str | None = None) -> None:
  """`app.run(main)` with the shared flag parser, one-line errors, signal
  handling, the persistent compilation cache (`compile_cache`; off for
  tools whose executables cannot be loaded back, such as trm.aot's
  compile-only TPU programs, and for the data builders and trm.visualize,
  which compile nothing: configuring it imports jax, 0.8 s of a builder's
  1.3 s refusal),
  and no libtpu start-up on hosts without an accelerator.

  stopped_line: for every tool but trm.main (which saves on SIGTERM and
  exits 0 for its scheduler to restart it), the line a stop signal prints
  ({tool}, {name}); SIGTERM then exits 143 (128 + 15), not 0: a script's
  `trm.export ... && upload OUT` went on after an export a scheduler or
  `timeout` had stopped."""
  global _STOPPED_LINE
  if stopped_line is not None:
    _STOPPED_LINE = stopped_line
    EXIT_CODES[signal.SIGTERM] = 128 + signal.SIGTERM
  show_shared_flags(compilation_cache)
  default_to_cpu()
  install_signal_handlers()
  _quiet_closed_loop_callbacks()
  logging.get_absl_handler().addFilter(QuietLibraries())
  app.run(_wrap(main, compilation_cache),
          flags_parser=config_lib.parse_flags)
