r"""SIGKILL a CPU training run at random moments; the resumed run must end
bit-identical to an uninterrupted one.

  nice python benchmarks/reliability/kill_resume.py [--trials=20] [--seed=0] \
      [--root=/tmp/kill_resume]

Builds a small Sudoku dataset once, runs `python -m trm.main` (tiny
`configs/trm_sudoku.py:cpu` model, 40 steps, a checkpoint every 5 steps, an
evaluation every 8, 2 forced CPU devices) uninterrupted as the reference,
then per trial: a fresh workdir, the same command killed with SIGKILL at a
random moment (seeded), restarted with the same command until it finishes
(a restart is itself killed again with probability --rekill_prob, up to
--max_kills per trial). A kill moment is either a random time in start-up
and compilation (drawn over the reference's time to its first step), or a
random train step k and a random 0-0.5 s after the run logs that step k is
done, which lands in the next steps, the asynchronous checkpoint writes,
the evaluations and the final save. The final checkpoint's state is read
back with Orbax as numpy arrays and compared bit for bit with the
reference's (params, and the whole train state with the data position),
and the train and eval metrics in the workdir's events files, as
TensorBoard reads them, with the reference's (`--log_every` that does not
divide `--checkpoint_every` checks that the steps since the last logged
interval are not lost with a kill after a checkpoint).

Prints one line per trial: each kill (time since start, the last train step
the run had logged, the whole checkpoints on disk after it, the step the
next start resumed from), and whether the final parameters are identical;
then "N/T identical".
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from absl import app, flags, logging

# This process only reads checkpoints back: keep jax off any TPU plugin.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

_TRIALS = flags.DEFINE_integer("trials", 20, "Killed runs to check.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the kill delays.")
_ROOT = flags.DEFINE_string("root", "/tmp/kill_resume",
                            "Scratch directory (emptied first).")
_DEVICES = flags.DEFINE_integer("devices", 2, "Forced CPU devices per run "
                                "(the batch is sharded over them).")
_STEPS = flags.DEFINE_integer("steps", 40, "config.total_steps.")
_CHECKPOINT_EVERY = flags.DEFINE_integer("checkpoint_every", 5,
                                         "config.checkpoint_every.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 8, "config.eval_every.")
_REKILL_PROB = flags.DEFINE_float("rekill_prob", 0.35, "Chance a restart is "
                                  "killed again.")
_MAX_KILLS = flags.DEFINE_integer("max_kills", 3, "Kills per trial at most.")
_LOG_EVERY = flags.DEFINE_integer("log_every", 1, "config.log_every (kills "
                                  "land after a logged step: 1 spreads "
                                  "them over every step).")

TRAIN_LOG = re.compile(r"\] \[(\d+)\] .*train/")
RESUMED = re.compile(r"Training from step (\d+) to")


def overrides(data_dir: str) -> list[str]:
  """The tiny run: small model, small data, frequent saves and evals."""
  values = {
      "model.hidden_size": 32, "model.num_heads": 2,
      "model.puzzle_emb_ndim": 32, "model.halt_max_steps": 2,
      "data.data_dir": data_dir, "data.eval_batch_size": 16,
      "data.build.num_train": 256, "data.build.num_test": 32,
      "data.build.num_blanks": 30, "optim.warmup_steps": 5,
      "global_batch_size": 16, "total_steps": _STEPS.value,
      "checkpoint_every": _CHECKPOINT_EVERY.value,
      "eval_every": _EVAL_EVERY.value, "log_every": _LOG_EVERY.value,
  }
  return [f"--config.{k}={v}" for k, v in values.items()]


def env() -> dict:
  return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
              XLA_FLAGS=f"--xla_force_host_platform_device_count="
              f"{_DEVICES.value}")


class Attempt:
  """One `trm.main` process; its stderr lines are timestamped on arrival."""

  def __init__(self, workdir: str, data_dir: str, log_path: str):
    self.lines: list[tuple[float, str]] = []
    self.start = time.monotonic()
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "trm.main",
         "--config=configs/trm_sudoku.py:cpu", f"--workdir={workdir}",
         *overrides(data_dir)],
        cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    self.log = open(log_path, "w")
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()

  def _read(self):
    for line in self.proc.stderr:
      self.lines.append((time.monotonic() - self.start, line))
      self.log.write(line)

  def elapsed(self) -> float:
    return time.monotonic() - self.start

  def wait(self, timeout: float | None = None) -> int | None:
    """Exit code, or None if still running after `timeout` seconds."""
    try:
      return self.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      return None

  def run(self, plan) -> tuple[int | None, float | None]:
    """Waits for the exit, or SIGKILLs the run as `plan` says: None (never),
    ('time', seconds since start) or ('step', k, extra seconds after train
    step k, or a later one, is logged as done). Returns (exit code or None,
    kill time or None)."""
    fired = None
    while self.elapsed() < 600:
      rc = self.proc.poll()
      if rc is not None:
        return rc, None
      now = self.elapsed()
      if plan is not None and fired is None:
        if plan[0] == "time" and now >= plan[1]:
          fired = now
        elif plan[0] == "step" and ((self.last_step() or 0) >= plan[1]
                                    or self.first("Final evaluation")):
          fired = now + plan[2]
      if fired is not None and now >= fired:
        self.proc.send_signal(signal.SIGKILL)  # no cleanup, no finally
        self.proc.wait()
        return None, now
      time.sleep(0.01)
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait()
    return None, None

  def finish(self) -> None:
    self.reader.join(timeout=30)
    self.log.close()

  def first(self, pattern: str) -> float | None:
    return next((t for t, line in self.lines if pattern in line), None)

  def last_step(self) -> int | None:
    """Last train step whose metrics were logged (they are fetched an
    interval late: with log_every=1, when the step has run), None if
    training had not started."""
    steps = [int(m.group(1)) for _, line in self.lines
             if (m := TRAIN_LOG.search(line))]
    return max(steps) if steps else None

  def resumed_from(self) -> int | None:
    """The step training started from (0: no checkpoint was restored)."""
    for _, line in self.lines:
      if (m := RESUMED.search(line)):
        return int(m.group(1))
    return None


def saved_steps(workdir: str) -> tuple[list[int], list[str]]:
  """(whole checkpoint steps, other entries: Orbax's half-written temporary
  directories)."""
  directory = os.path.join(workdir, "checkpoints")
  names = os.listdir(directory) if os.path.isdir(directory) else []
  return (sorted(int(n) for n in names if n.isdigit()),
          sorted(n for n in names if not n.isdigit()))


def final_state(workdir: str, step: int):
  """The saved train state of `step` as numpy arrays, and the Grain
  position."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  path = os.path.join(workdir, "checkpoints", str(step))
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(os.path.join(path, "state")).item_metadata.tree
  state = checkpointer.restore(
      os.path.join(path, "state"), args=ocp.args.PyTreeRestore(
          restore_args=jax.tree.map(
              lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)))
  # JsonSave writes the iterator state as the item's `metadata` file.
  with open(os.path.join(path, "data_iter", "metadata")) as f:
    position = json.load(f)
  return state, position


def metrics_record(workdir: str) -> dict:
  """{tag: {step: value}} of the train and eval metrics in `workdir`'s
  events files, as TensorBoard reads them (a restarted run's rewrites
  replace the killed run's). Timing (`eval/seconds`, `timing/*`) is left
  out: it differs in every run."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(
      workdir, size_guidance={event_accumulator.TENSORS: 0})
  events.Reload()
  return {tag: {e.step: tensor_util.make_ndarray(e.tensor_proto).tobytes()
                for e in events.Tensors(tag)}
          for tag in events.Tags()["tensors"]
          if tag.startswith(("train/", "eval/")) and tag != "eval/seconds"}


def metrics_difference(record: dict, reference: dict) -> str | None:
  """Where `record` differs from the reference's, None if nowhere."""
  problems = []
  for tag in sorted(set(record) | set(reference)):
    got, want = record.get(tag, {}), reference.get(tag, {})
    if set(got) != set(want):
      problems.append(f"{tag} at steps {sorted(got)}, reference "
                      f"{sorted(want)}")
    elif (steps := [k for k in sorted(want) if got[k] != want[k]]):
      problems.append(f"{tag} differs at steps {steps}")
  return "; ".join(problems) or None


def identical(a, b) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  return ta == tb and all(
      x.dtype == y.dtype and x.shape == y.shape
      and np.array_equal(np.ascontiguousarray(x).reshape(-1).view(np.uint8),
                         np.ascontiguousarray(y).reshape(-1).view(np.uint8))
      for x, y in zip(la, lb))


def build_data(data_dir: str) -> None:
  subprocess.run(
      [sys.executable, "-m", "trm.data.puzzles.sudoku", f"--output_dir={data_dir}",
       "--source=generate", "--num_train=256", "--num_test=32",
       "--num_blanks=30", "--seed=0"],
      cwd=ROOT, env=env(), check=True, capture_output=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import numpy as np  # pylint: disable=g-import-not-at-top
  logging.set_verbosity(logging.ERROR)  # Orbax's restore chatter
  root = _ROOT.value
  shutil.rmtree(root, ignore_errors=True)
  os.makedirs(root)
  data_dir = os.path.join(root, "data")
  build_data(data_dir)

  reference_dir = os.path.join(root, "reference")
  reference = Attempt(reference_dir, data_dir,
                      os.path.join(root, "reference.log"))
  rc = reference.wait(timeout=600)
  reference.finish()
  if rc != 0:
    sys.exit(f"reference run failed (exit {rc}); see {root}/reference.log")
  compiled = reference.first("Train step compiled") or 1.0
  done = reference.first("Final evaluation") or reference.lines[-1][0]
  ref_state, ref_position = final_state(reference_dir, _STEPS.value)
  ref_metrics = metrics_record(reference_dir)
  print(f"reference: {_STEPS.value} steps, checkpoint every "
        f"{_CHECKPOINT_EVERY.value}, eval every {_EVAL_EVERY.value}, "
        f"log every {_LOG_EVERY.value}, "
        f"{_DEVICES.value} CPU devices; train step compiled at "
        f"{compiled:.1f} s, final evaluation at {done:.1f} s", flush=True)

  rng = np.random.default_rng(_SEED.value)

  def plan():
    if rng.random() < 0.3:
      return ("time", float(rng.uniform(0.2, compiled)))
    return ("step", int(rng.integers(1, _STEPS.value + 1)),
            float(rng.uniform(0.0, 0.5)))

  same_params = same_state = same_metrics = 0
  for trial in range(1, _TRIALS.value + 1):
    workdir = os.path.join(root, f"trial_{trial:02d}")
    kills, attempt_no, events = 0, 0, []
    pending_kill = None
    while True:
      attempt_no += 1
      attempt = Attempt(workdir, data_dir,
                        os.path.join(root, f"trial_{trial:02d}_{attempt_no}"
                                     ".log"))
      wants_kill = kills == 0 or (kills < _MAX_KILLS.value
                                  and rng.random() < _REKILL_PROB.value)
      rc, killed_at = attempt.run(plan() if wants_kill else None)
      attempt.finish()
      if pending_kill is not None:
        pending_kill["resumed"] = attempt.resumed_from()
        events.append(pending_kill)
        pending_kill = None
      if killed_at is not None:
        kills += 1
        steps, partial = saved_steps(workdir)
        pending_kill = dict(at=killed_at, step=attempt.last_step(),
                            compiled=attempt.first("Train step compiled"),
                            saved=steps, partial=partial)
        continue
      if rc == 0 and kills == 0:
        # Finished before its kill moment: start the trial over.
        shutil.rmtree(workdir)
        attempt_no = 0
        continue
      break
    kills_text = []
    for e in events:
      if e["step"] is not None:
        where = f"step {e['step']} done"
      elif e["compiled"] is not None:
        where = "compiled, no step done"
      else:
        where = "start-up/compile"
      saved = ",".join(map(str, e["saved"])) or "none"
      if e["partial"]:
        saved += " + " + ", ".join(
            f"{n.split('.')[0]} unfinished" if "tmp" in n else n
            for n in e["partial"])
      resumed = ("killed again before resuming" if e["resumed"] is None
                 else f"resumed from {e['resumed']}")
      kills_text.append(f"kill at {e['at']:5.2f} s ({where}; on disk: "
                        f"{saved}) -> {resumed}")
    if rc != 0:
      print(f"trial {trial:02d}: " + " | ".join(kills_text) + f" | attempt "
            f"{attempt_no} exited {rc}, see {workdir}", flush=True)
      continue
    state, position = final_state(workdir, _STEPS.value)
    params_ok = identical(state["params"], ref_state["params"])
    state_ok = identical(state, ref_state) and position == ref_position
    metrics_problem = metrics_difference(metrics_record(workdir),
                                         ref_metrics)
    same_params += params_ok
    same_state += state_ok
    same_metrics += metrics_problem is None
    print(f"trial {trial:02d}: " + " | ".join(kills_text)
          + f" | identical: {'yes' if params_ok else 'NO'}"
          + ("" if state_ok == params_ok else
             f" (whole state: {'yes' if state_ok else 'NO'})")
          + ("" if metrics_problem is None else
             f" | metrics: {metrics_problem}"), flush=True)
  print(f"{same_params}/{_TRIALS.value} identical (params); "
        f"{same_state}/{_TRIALS.value} with the whole train state; "
        f"{same_metrics}/{_TRIALS.value} with the metrics "
        f"({sum(map(len, ref_metrics.values()))} values)")


if __name__ == "__main__":
  app.run(main)
