"""The command-line contract (`trm.core.cli`): input errors are one line with no
traceback (unless --traceback), a missing config file is named before jax
starts, and SIGTERM / SIGINT stop cleanly before and inside the loop, a
second signal at once."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import cli_batch  # pylint: disable=g-import-not-at-top
from test_reliability import _cli_flags  # pylint: disable=g-import-not-at-top
from test_train import ONE_AXIS, ROOT, tiny_config  # pylint: disable=g-import-not-at-top
from trm.core import cli  # pylint: disable=g-import-not-at-top

ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def _main(*args, timeout=300):
  return subprocess.run([sys.executable, "-m", "trm.main", *args], cwd=ROOT,
                        env=ENV, capture_output=True, text=True,
                        timeout=timeout)


@pytest.mark.parametrize("overrides", [
    (),
    # An override made ml_collections read the missing file: an OSError
    # traceback.
    ("--config.total_steps=1",)])
def test_a_missing_config_file_is_named_before_jax(tmp_path, overrides):
  result = _main("--config=configs/nope.py", f"--workdir={tmp_path}",
                 *overrides, timeout=60)
  assert result.returncode == 2
  assert ("trm.main: error: --config=configs/nope.py: no such config file"
          in result.stderr)
  assert "Traceback" not in result.stderr
  assert "TPU" not in result.stderr  # jax (and libtpu) never loaded


def test_help_is_printed_whatever_config_names(tmp_path):
  # The config path check runs before absl's parse, which prints the help:
  # a mistyped --config beside --helpshort refused it.
  result = _main("--helpshort", "--config=configs/nope.py",
                 f"--workdir={tmp_path}", timeout=60)
  assert "Try --helpfull to get a list of all flags." in result.stdout, (
      result.stderr[-2000:])
  assert "no such config file" not in result.stderr


@pytest.mark.parametrize("kind", ["directory", "device", "fifo",
                                  "fifo as its own argument",
                                  "fifo in a flagfile"])
def test_a_config_path_that_is_no_file_is_said_as_what_it_is(tmp_path, kind):
  # It was "no such config file" for a path that exists; a FIFO blocked
  # ml_collections' read (given in a --flagfile, until session 106).
  import os  # pylint: disable=g-import-not-at-top
  path = {"directory": "configs", "device": "/dev/null"}.get(
      kind, str(tmp_path / "pipe"))
  if kind.startswith("fifo"):
    os.mkfifo(path)
  flag = (["--config", f"{path}:cpu"] if kind.endswith("argument")
          else [f"--config={path}:cpu"])
  if kind.endswith("flagfile"):
    (tmp_path / "flags").write_text(f"# the run's flags\n{flag[0]}\n")
    flag = [f"--flagfile={tmp_path / 'flags'}"]
  result = _main(*flag, f"--workdir={tmp_path / 'run'}", timeout=60)
  assert result.returncode == 2
  said = ("a directory, not a config file" if kind == "directory" else
          "not a regular file (a device, FIFO or socket)")
  assert f"trm.main: error: --config={path}: {said}" in result.stderr, (
      result.stderr[-2000:])
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("text, needle", [
    ("def get_config(:\n  pass\n", "(line 1): SyntaxError: invalid syntax"),
    ("x = 1\n", "AttributeError: module"),
    ("import no_such_module_anywhere\n", "(line 1): ModuleNotFoundError"),
    ("def get_config(arg=None):\n  return undefined_name\n",
     "(line 2): NameError"),
    ("def get_config(arg=None):\n  return {'total_steps': 1}\n",
     "get_config() returned a dict, not an ml_collections.ConfigDict"),
], ids=["syntax error", "no get_config", "import error", "name error",
        "not a ConfigDict"])
def test_a_broken_config_file_is_one_line_naming_it(tmp_path, text, needle):
  config = tmp_path / "broken.py"
  config.write_text(text)
  workdir = tmp_path / "run"
  result = _main(f"--config={config}", f"--workdir={workdir}", timeout=60)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
  errors = [line for line in result.stderr.splitlines() if "error:" in line]
  assert len(errors) == 1 and errors[0].startswith(
      f"trm.main: error: --config={config}"), result.stderr[-2000:]
  assert needle in errors[0], errors
  assert not workdir.exists()
  if "returned a" not in needle:  # an exception: shown on request
    shown = _main(f"--config={config}", f"--workdir={workdir}",
                  "--traceback", timeout=60)
    assert "Traceback" in shown.stderr


def test_an_empty_workdir_is_refused(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "trm.main",
       f"--config={os.path.join(ROOT, 'configs', 'trm_sudoku.py')}:cpu",
       "--workdir="], cwd=tmp_path, env=dict(ENV, PYTHONPATH=ROOT),
      capture_output=True, text=True, timeout=60)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "trm.main: error: --workdir is empty" in result.stderr
  assert not os.listdir(tmp_path)  # nothing written where it was started


# `python -m trm.main` for the refusal of a config value (found after jax
# and the trainer are imported), forked from one process that has imported
# cli_batch.MAIN_PRELOAD: its start-up per case less. The other tests here
# run the real entry point.
main_cli = cli_batch.serve("trm.main", env=lambda: ENV,
                          preload=cli_batch.MAIN_PRELOAD)


def test_shared_preloads_define_no_flag_the_tools_lack():
  """A fork of a server whose preload defined a flag would accept it where
  the real tool refuses it as unknown (tests/cli_batch.py)."""
  script = (
      "import importlib, sys\n"
      "from absl import flags\n"
      "import trm.main, trm.export\n"
      "tools = set(flags.FLAGS)\n"
      f"sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})\n"
      "import cli_batch\n"
      "for name in cli_batch.MAIN_PRELOAD + cli_batch.DREAM_EXPORT_PRELOAD:\n"
      "  importlib.import_module(name)\n"
      "print(sorted(set(flags.FLAGS) - tools))\n")
  done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == "[]", done.stdout


def test_an_input_error_is_one_line_and_traceback_on_request(tmp_path,
                                                             main_cli):
  args = ("--config=configs/trm_sudoku.py:cpu", f"--workdir={tmp_path}",
          "--config.optim.lr=-1.0")
  run = lambda *argv: main_cli.run(argv, cwd=ROOT, env=ENV, timeout=300)
  result = run(*args)
  assert result.returncode == 2, result.stderr[-2000:]
  assert "Traceback" not in result.stderr
  errors = [line for line in result.stderr.splitlines() if "error:" in line]
  assert errors == ["trm.main: error: config.optim.lr=-1.0 must be a finite "
                    "number >= 0."]
  assert not os.listdir(tmp_path) or os.listdir(tmp_path) == []
  shown = run(*args, "--traceback")
  assert shown.returncode == 1 and "Traceback" in shown.stderr


def _start(workdir, config, cwd=ROOT, env=None):
  process = subprocess.Popen(
      [sys.executable, "-m", "trm.main",
       f"--config={os.path.join(ROOT, 'configs', 'trm_sudoku.py')}:cpu",
       f"--workdir={workdir}", "--alsologtostderr"] + _cli_flags(config),
      cwd=cwd, env=dict(ENV, PYTHONPATH=ROOT, **(env or {})),
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines, seen = [], {}

  def read():
    for line in process.stderr:
      lines.append(line)
      for marker in ("Mesh ", "Training from step"):
        if marker in line:
          seen.setdefault(marker, threading.Event()).set()

  events = {m: seen.setdefault(m, threading.Event())
            for m in ("Mesh ", "Training from step")}
  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  return process, lines, events, reader


def _finish(process, reader, lines):
  try:
    returncode = process.wait(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
  reader.join(timeout=10)
  return returncode, "".join(lines)


def test_sigterm_before_the_loop_is_one_clean_line(tmp_path):
  process, lines, events, reader = _start(
      tmp_path, tiny_config(total_steps=200))
  assert events["Mesh "].wait(300), "".join(lines[-40:])
  process.send_signal(signal.SIGTERM)
  returncode, log = _finish(process, reader, lines)
  assert returncode == 0, log[-3000:]
  assert "stopped by SIGTERM before training began" in log
  assert "stack trace" not in log and "Traceback" not in log


def test_ctrl_c_in_the_loop_saves_under_a_tilde_workdir_and_says_so(
    tmp_path):
  # The workdir is given as `~/run`, which reaches trm.main unexpanded (the
  # shell expands a leading ~ only): it made a folder named '~' where the
  # run was started. (One training process for both checks: each start
  # costs an import and a compile.)
  home, started = tmp_path / "home", tmp_path / "started_here"
  home.mkdir()
  started.mkdir()
  # (The data-parallel mesh: the step loads from the compilation cache.)
  process, lines, events, reader = _start(
      "~/run", tiny_config(total_steps=2000, checkpoint_every=1000,
                           **ONE_AXIS),
      cwd=started, env=dict(HOME=str(home)))
  assert events["Training from step"].wait(300), "".join(lines[-40:])
  time.sleep(0.3)
  process.send_signal(signal.SIGINT)
  returncode, log = _finish(process, reader, lines)
  assert returncode == 130, log[-3000:]
  step = int(re.search(r"Preempted at step (\d+) \(SIGINT\); saved",
                       log).group(1))
  assert (home / "run" / "checkpoints" / str(step)).is_dir()
  assert not os.listdir(started)
  assert "KeyboardInterrupt" not in log and "Traceback" not in log


# A child that receives SIGTERM inside a gc callback (the handler runs
# there: it sleeps `{wait}` s in it), then sleeps 20 s in the main code.
# `{setup}` runs first; the child prints how `sent` grew, if it is there.
_GC_CALLBACK_CHILD = """
import gc, os, signal, time
from trm.core import cli
sent = []
{setup}
cli.install_signal_handlers()
def callback(phase, info):
  if phase == "start" and not getattr(callback, "done", False):
    callback.done = True
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep({wait})
gc.callbacks.append(callback)
try:
  gc.collect()
  time.sleep(20)
  print("not interrupted")
except cli.Interrupted as e:
  print("interrupted in the main code:", e, "after", len(sent), "copies")
"""


def _gc_callback_child(wait: float, setup: str = ""):
  return subprocess.run(
      [sys.executable, "-c", _GC_CALLBACK_CHILD.format(wait=wait,
                                                       setup=setup)],
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)


def test_a_signal_inside_a_gc_callback_still_interrupts_the_main_code():
  # JAX runs a gc callback; a SIGTERM handled while it runs used to raise
  # Interrupted inside it, where the collector printed "Exception ignored"
  # with a traceback and dropped it (a flaky CI failure). It is delivered
  # again once the callback returns.
  result = _gc_callback_child(0.2)
  assert "interrupted in the main code: SIGTERM" in result.stdout, (
      result.stdout + result.stderr)
  assert "Traceback" not in result.stderr
  assert "Exception ignored" not in result.stderr


def test_a_resent_signal_that_is_not_handled_is_sent_again():
  # The watchdog's copy of a signal deferred out of a gc callback can land
  # just before the main thread enters a blocking call, which then does not
  # wake (about 1 run in 20 under load in session 38: the process ended
  # through the 5 s fallback instead). The copy is sent again until the
  # main code has raised it. Here the first copy is lost on purpose.
  result = _gc_callback_child(0.01, setup=textwrap.dedent("""
      real_kill = signal.pthread_kill
      def lossy_kill(thread, signum):
        sent.append(signum)
        if len(sent) > 1:
          real_kill(thread, signum)
      cli.signal.pthread_kill = lossy_kill"""))
  assert "interrupted in the main code: SIGTERM after 2 copies" in (
      result.stdout), result.stdout + result.stderr
  assert "again" not in result.stderr  # the copy is not a second signal


def test_a_signal_inside_a_weakref_callback_still_interrupts_the_main_code():
  # As in a gc callback: a SIGTERM just after trm.main's final evaluation
  # was raised in a WeakKeyDictionary's callback, printed as "Exception
  # ignored" and dropped. It is delivered again (sys.unraisablehook).
  child = textwrap.dedent("""
      import os, signal, sys, time, weakref
      from trm.core import cli
      cli.install_signal_handlers()
      cli._quiet_closed_loop_callbacks()
      class Key: pass
      def callback(_):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # the handler runs here, in the callback
      key = Key()
      ref = weakref.ref(key, callback)
      try:
        del key
        time.sleep(20)
        print("not interrupted")
      except cli.Interrupted as e:
        print("interrupted in the main code:", e)
      """)
  result = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60)
  assert "interrupted in the main code: SIGTERM" in result.stdout, (
      result.stdout + result.stderr)
  assert "Exception ignored" not in result.stderr, result.stderr


# A tool run through cli.run whose main returns ({mode}: 0, or a one-line
# error), then gets SIGTERM while the interpreter shuts down: in an exit
# callback, or during module finalization (after Python has put back the
# signals' default action).
_TEARDOWN_CHILD = """
import atexit, builtins, os, signal, sys, time
import trm
from absl import app
from trm.core import cli

class Late:
  def __del__(self):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)

class Hung:
  def __del__(self):
    time.sleep(30)  # a teardown that hangs

def main(argv):
  where, mode = argv[1:]
  if where == "atexit":
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM),
                             time.sleep(2)))
  elif where == "hung":
    builtins.hung_object = Hung()
  else:
    builtins.late_object = Late()  # freed after the exit callbacks
  if mode == "error":
    raise app.UsageError("bad input")

cli.run(main, compilation_cache=False)
"""


@pytest.mark.parametrize("where, mode, status, line", [
    ("atexit", "ok", 0, "SIGTERM while shutting down (the work had ended)"),
    ("atexit", "error", 2, "SIGTERM while shutting down (the work had ended)"),
    ("finalization", "ok", 0, None),
    ("finalization", "error", 2, None),
    ("hung", "ok", 0, None),
])
def test_a_signal_after_the_work_ended_keeps_the_runs_exit_status(
    where, mode, status, line):
  """Raised in jax's exit callback, Interrupted was printed as "Exception
  ignored in atexit callback" with a traceback; later, once Python had put
  back the default action, SIGTERM ended the process "killed by signal"
  (-15, a failure to a scheduler) though the run had finished."""
  start = time.monotonic()
  result = subprocess.run(
      [sys.executable, "-c", _TEARDOWN_CHILD, where, mode], cwd=ROOT,
      env=ENV, capture_output=True, text=True, timeout=60)
  assert result.returncode == status, (result.returncode, result.stderr)
  # The process ends at the last exit callback: the interpreter's own
  # teardown, which may hang (a finalizer here sleeps 30 s), is skipped
  # (ignoring the signals there left such a hang deaf to SIGTERM).
  assert time.monotonic() - start < 20
  assert "Traceback" not in result.stderr, result.stderr
  assert "Exception ignored" not in result.stderr, result.stderr
  if line is not None:
    assert f"{line}; exiting now." in result.stderr, result.stderr


@pytest.mark.parametrize("where", ["loop", "before"])
def test_a_second_signal_exits_at_once_with_one_line(where):
  if where == "loop":
    body = """
      from trm.core import preemption
      with preemption.PreemptionWatch(None, 1):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    """
    expected = "SIGTERM again: exiting now; the checkpoint save was skipped"
  else:
    body = """
      from trm.core import cli
      cli.install_signal_handlers()
      try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
      except cli.Interrupted:
        os.kill(os.getpid(), signal.SIGINT)  # e.g. during cleanup
        time.sleep(30)
    """
    expected = "SIGINT again: exiting now; cleanup was skipped."
  script = "import os, signal, time\n" + textwrap.dedent(body)
  start = time.time()
  result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60)
  assert time.time() - start < 25
  assert result.returncode == (0 if where == "loop" else 130), result.stderr
  assert expected in result.stderr
  assert "Traceback" not in result.stderr


def test_cpu_start_does_not_initialise_libtpu(tmp_path):
  """With libtpu installed and no TPU, a CLI run (no JAX_PLATFORMS set)
  starts on the CPU without libtpu's start-up errors."""
  pytest.importorskip("libtpu")
  if any(__import__("glob").glob(p) for p in cli.ACCELERATOR_FILES):
    pytest.skip("this host has an accelerator")
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  result = subprocess.run(
      [sys.executable, "-m", "trm.main", "--config=configs/trm_sudoku.py:cpu",
       f"--workdir={tmp_path}", "--config.optim.lr=-1.0", "--alsologtostderr"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert re.search(r"devices \(cpu\)", result.stderr)  # the backend started
  for noise in ("TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "E0000",
                "libtpu"):
    assert noise not in result.stderr, result.stderr[-3000:]


def test_an_explicit_platform_or_an_accelerator_is_left_alone(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "")
  assert not cli.default_to_cpu()
  assert os.environ["JAX_PLATFORMS"] == ""
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setattr(cli.glob, "glob", lambda pattern: (
      ["/dev/accel0"] if pattern == "/dev/accel*" else []))
  assert not cli.default_to_cpu()
  assert "JAX_PLATFORMS" not in os.environ


_BUSY = """
import hashlib, signal, sys, time
from trm.core import cli

def main(argv):
  {busy}
  return 0

cli.run(main)
"""


@pytest.mark.parametrize("busy, inside_loop", [
    # An XLA compile or a blocked collective: compiled code that never
    # returns to the interpreter within the grace period.
    ("print('busy', flush=True)\n"
     "  hashlib.pbkdf2_hmac('sha256', b'x', b'y', 400_000_000)", False),
    # The loop turns the watchdog off: a save may take longer.
    ("from trm.core import preemption\n"
     "  with preemption.PreemptionWatch(None, 1):\n"
     "    print('busy', flush=True)\n"
     "    hashlib.pbkdf2_hmac('sha256', b'x', b'y', 20_000_000)\n"
     "    print('loop ended', flush=True)", True),
])
def test_a_signal_during_busy_start_up_ends_the_process_in_seconds(
    tmp_path, busy, inside_loop):
  script = tmp_path / "busy.py"
  script.write_text(_BUSY.format(busy=busy))
  process = subprocess.Popen([sys.executable, str(script)], cwd=ROOT,
                             env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  assert process.stdout.readline().strip() == "busy"
  time.sleep(0.5)
  start = time.time()
  process.send_signal(signal.SIGTERM)
  try:
    out, err = process.communicate(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
  waited = time.time() - start
  if inside_loop:
    assert "loop ended" in out, err  # the loop's own handler, not cut short
    assert "busy in compiled code" not in err
  else:
    assert waited < cli.STARTUP_GRACE_SECONDS + 10, waited
    assert process.returncode == 0, err
    lines = [l for l in err.splitlines() if "stopped by SIGTERM" in l]
    assert len(lines) == 1 and "busy in compiled code" in lines[0], err
    assert "Traceback" not in err


def test_out_of_memory_is_one_line_naming_what_to_shrink(capsys,
                                                         monkeypatch):
  # A config too big for the device (e.g. gpt.py with block_size=100000)
  # compiles, then fails at its first step with XLA's RESOURCE_EXHAUSTED:
  # one line naming what to shrink, not a traceback.
  import jax  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)

  def main(unused_argv):
    raise jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory allocating 961652809136 bytes.")

  with pytest.raises(SystemExit) as stop:
    cli._wrap(main, compilation_cache=False)(["trm.main"])  # pylint: disable=protected-access
  assert stop.value.code == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1, err
  assert "error: out of memory (RESOURCE_EXHAUSTED" in err
  assert "config.global_batch_size" in err
  # The sampling tools name their own flags, not the trainer's fields.
  for tool in ("trm.generate", "trm.evaluate"):
    monkeypatch.setattr(cli, "tool_name", lambda tool=tool: tool)
    with pytest.raises(SystemExit):
      cli._wrap(main, compilation_cache=False)([tool])  # pylint: disable=protected-access
    err = capsys.readouterr().err
    assert err.startswith(f"{tool}: error: out of memory ("), err
    assert "--batch_size" in err and "--max_new_tokens" in err, err
    assert "config.global_batch_size" not in err, err


def test_unretrieved_checkpoint_reads_add_no_traceback(monkeypatch):
  # After "trm.main: error: ... holds checkpoints but none can be restored"
  # the garbage collector reported Orbax's failed read tasks through asyncio
  # ("Task exception was never retrieved" and a traceback) under the line.
  import logging  # pylint: disable=g-import-not-at-top
  monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
  try:
    raise ValueError(
        'NOT_FOUND: Error opening "zarr" driver: Error reading "rng/.zarray"'
        ' in OCDBT database at local file "/w/checkpoints/6/state/"')
  except ValueError:
    exc_info = sys.exc_info()
  record = logging.LogRecord(
      "asyncio", logging.ERROR, "/usr/lib/python3.11/asyncio/base_events.py",
      1771, "Task exception was never retrieved\nfuture: <Task finished "
      "name='Task-390' coro=<_wrap_awaitable() done> exception=%r>",
      (exc_info[1],), exc_info)
  assert not cli.QuietLibraries().filter(record)
  other = logging.LogRecord("asyncio", logging.ERROR, "x.py", 1,
                            "Task exception was never retrieved: %s",
                            ("KeyError('a')",), None)
  assert cli.QuietLibraries().filter(other)  # other tasks still show


def _sigterm_at(module: str, function: str) -> str:
  """A script running trm.main that sends itself a SIGTERM the first time
  `module.function` is called (then calls it)."""
  return f"""
import os, runpy, signal, sys
from trm.core import {module} as target
real = target.{function}
def first_call_signals(*args, **kwargs):
  if not getattr(first_call_signals, "sent", False):
    first_call_signals.sent = True
    os.kill(os.getpid(), signal.SIGTERM)
  return real(*args, **kwargs)
target.{function} = first_call_signals
sys.argv = ["trm.main"] + sys.argv[1:]
runpy.run_module("trm.main", run_name="__main__")
"""


@pytest.fixture(scope="module")
def signalled_runs(tmp_path_factory):
  """One workdir, two trm.main processes (each start costs an import and a
  compile): the first gets a SIGTERM as its step-3 evaluation begins; the
  second resumes it and gets one as its final wait for the checkpoints in
  flight begins. (the workdir, the first's result and its files right
  after it, the second's result)"""
  workdir = tmp_path_factory.mktemp("signalled")
  config = tiny_config(total_steps=6, checkpoint_every=6, eval_every=3)
  config.mesh.update(data=-1, fsdp=1, model=1)

  def run(script):
    return subprocess.run(
        [sys.executable, "-c", script, "--config=configs/trm_sudoku.py:cpu",
         f"--workdir={workdir}"] + _cli_flags(config), cwd=ROOT,
        env=dict(ENV, TRM_NO_HUGE_PAGES="1"), capture_output=True,
        text=True, timeout=300)

  first = run(_sigterm_at("train", "evaluate"))
  files = {"eval_3.json": (workdir / "eval_3.json").exists(),
           "checkpoints/3/commit_success.txt": (
               workdir / "checkpoints" / "3" / "commit_success.txt").exists()}
  # `checkpoint.wait_until_finished` runs only there in a run that is not
  # preempted: the final save (of step 6) may still be writing.
  second = run(_sigterm_at("checkpoint", "wait_until_finished"))
  return workdir, first, files, second


def test_sigterm_during_an_evaluation_saves_without_finishing_it(
    signalled_runs):
  # The evaluation ran to its end first (minutes for the paper's test
  # sets, past a preemption's notice), then one more step, then the save.
  workdir, result, files, resumed = signalled_runs
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Preempted at step 3 (SIGTERM); saved" in result.stderr, (
      result.stderr[-3000:])
  assert "Step 3: evaluation stopped by SIGTERM" in result.stderr
  assert not files["eval_3.json"]
  assert files["checkpoints/3/commit_success.txt"]
  # The resumed run owes step 3 its evaluation and does it before training.
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert ("Step 3: redoing the evaluation the preemption cut short"
          in resumed.stderr), resumed.stderr[-3000:]
  assert (workdir / "eval_3.json").exists()
  assert (workdir / "eval_6.json").exists()


def test_sigterm_during_the_final_save_completes_it(signalled_runs):
  # The loop's preemption watch had ended, so the SIGTERM stopped the
  # process inside the final wait: the last checkpoint, being written,
  # was abandoned (`<step>.orbax-checkpoint-tmp`) and the steps since the
  # previous one had to be trained again. (The resumed run of
  # `signalled_runs` is signalled there.)
  workdir, _, _, result = signalled_runs
  assert result.returncode == 0, result.stderr[-3000:]
  checkpoints = workdir / "checkpoints"
  assert sorted(os.listdir(checkpoints)) == ["3", "6"], os.listdir(
      checkpoints)
  assert (checkpoints / "6" / "commit_success.txt").exists()
  assert "SIGTERM after training ended" in result.stderr


# The tool's own `cli.run(...)` call, with a main that stops itself by
# SIGTERM in place of the tool's: the line and exit status a script sees.
# Run as `python -m stopped_tool TOOL ...` from a folder holding it, forked
# from one process that has imported jax, flax, optax and tensorstore
# (tests/cli_batch.py; they define no flags): their start-up per tool less.
_TOOL_STOPPED = """
import os, runpy, signal, sys, time
from trm.core import cli
real_run = cli.run
def stopped(argv):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(20)
cli.run = lambda main, **kwargs: real_run(stopped, **kwargs)
module = sys.argv.pop(1)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""

stopped_tools = cli_batch.serve(
    "stopped_tool", env=lambda: ENV,
    preload=("trm.core.cli", "jax", "flax.linen", "optax", "tensorstore"))


@pytest.fixture(scope="module")
def stopped_tool_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("stopped_tool")
  (folder / "stopped_tool.py").write_text(_TOOL_STOPPED)
  return folder


@pytest.mark.parametrize("tool, required", [
    ("trm.generate", []), ("trm.sample", []), ("trm.evaluate", []),
    ("trm.visualize", ["--data_dir=unread"]),
    ("trm.aot", [f"--config={ROOT}/configs/trm_sudoku.py:cpu"])])
def test_a_tool_stopped_by_sigterm_does_not_exit_0(tool, required,
                                                   stopped_tools,
                                                   stopped_tool_dir):
  """trm.main saves on SIGTERM and exits 0 for its scheduler to restart
  it; the other tools exited 0 too, with trm.main's line ("before training
  began ..."), so `trm.evaluate ... && upload` went on with part of the
  work. Each now exits 143 with its own line."""
  result = stopped_tools.run([tool, *required], cwd=stopped_tool_dir,
                             env=ENV, timeout=60)
  assert result.returncode == 143, result.stderr[-3000:]
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith(f"{tool}: stopped by SIGTERM before "), line
  assert "training" not in line, line


_PRINTS_MUCH = """
from trm.core import cli
def main(argv):
  for i in range(100000):
    print("line", i)
cli.run(main)
"""


def test_a_tool_piped_into_head_stops_quietly(tmp_path):
  """`trm.sample ... | head` ended with "error: [Errno 32] Broken pipe" and
  exit 2: a tool whose reader has gone stops quietly with SIGPIPE's status,
  as cat does; another broken pipe is still an error."""
  script = tmp_path / "prints.py"
  script.write_text(_PRINTS_MUCH)
  result = subprocess.run(
      f"{sys.executable} {script} | head -1; echo status ${{PIPESTATUS[0]}}",
      shell=True, executable="/bin/bash", cwd=ROOT, env=ENV,
      capture_output=True, text=True, timeout=60)
  assert result.stdout.splitlines() == ["line 0", "status 141"], result
  assert result.stderr == "", result.stderr
  # A broken pipe that is not stdout's: the one-line error, exit 2.
  script.write_text(_PRINTS_MUCH.replace(
      'print("line", i)', 'raise BrokenPipeError(32, "Broken pipe")'))
  result = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 2, result
  assert "error: [Errno 32] Broken pipe" in result.stderr


def test_help_lists_the_flags_that_shared_helpers_define(monkeypatch):
  """`python -m trm.data.puzzles.sudoku --help` listed --num_aug,
  --num_blanks and --seed only: the README's --output_dir (required),
  --source and --num_train come from builder_cli, and absl's --help shows
  only the main module's own flags (trm.evaluate's sampling flags, defined
  in trm.generate, were missing the same way)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from trm.data.puzzles import sudoku  # pylint: disable=g-import-not-at-top
  flag_values = flags.FlagValues()
  sudoku.define_flags(flag_values)
  monkeypatch.setattr(sys, "argv", [sudoku.__name__])
  cli.show_shared_flags(flag_values=flag_values)
  shown = flag_values.main_module_help()
  for name in ("output_dir", "source", "csv_dir", "num_train",
               "subsample_size", "num_aug"):
    assert f"--{name}:" in shown, name
  # A tool without the compilation cache (trm.aot) does not offer its flags.
  monkeypatch.setattr(sys, "argv", ["trm.a_tool_without_a_cache"])
  cli.show_shared_flags(compilation_cache=False)
  shown = flags.FLAGS.main_module_help()
  assert "traceback: On an input error" in shown
  assert "--compilation_cache" not in shown


def test_a_package_tool_is_named_as_typed(monkeypatch):
  """`python -m trm.data.tfds_builders` errors began
  'trm.data.tfds_builders.__main__: error: ...'."""
  import importlib.machinery  # pylint: disable=g-import-not-at-top
  import types  # pylint: disable=g-import-not-at-top
  main = types.ModuleType("__main__")
  main.__spec__ = importlib.machinery.ModuleSpec(
      "trm.data.tfds_builders.__main__", None)
  monkeypatch.setitem(sys.modules, "__main__", main)
  assert cli.tool_name() == "trm.data.tfds_builders"
  main.__spec__ = importlib.machinery.ModuleSpec("trm.main", None)
  assert cli.tool_name() == "trm.main"
