r"""What a trainer's first TensorBoard writes cost its start: ours against
tensorboard's functions.

  PYTHONPATH=. python benchmarks/speed/event_writer_seconds.py --rounds=5 --cpu=0

`trm.main` opens an event file, writes the run's hparams and then its
scalars. Each round runs two fresh processes, rounds alternating (ours,
tensorboard, ours, ...), so drift in the machine's load hits both alike.
Each process imports `trm.core.train` first (untimed: `python -m trm.main`
has those modules before it writes), then times with `time.perf_counter`
from the writer's creation to its close, writing:

  * the file version event, an hparams summary and one step of two
    scalars,
  * `ours`: through `trm.core.metrics.TensorBoardWriter` (its own TFRecord
    framing, `trm.core.event_records`, and its own hparams protos);
  * `tensorboard`: the same events through tensorboard's `RecordWriter`
    and its hparams plugin's `hparams_pb`, as this writer did before
    session 83 (both import the `tensorboard.summary` package and its
    TensorFlow stub).

The process's wall time from start to exit is printed beside it; the
1-minute load average at each run. Both files are read back with
tensorboard's reader (which checks each record's CRCs) and must hold the
same tags. With `--cpu=N` every process runs under `taskset -c N`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fresh_process  # pylint: disable=g-import-not-at-top,wrong-import-position

_CHILD = r"""
import json, os, sys, time
import trm.core.train
from trm.core import metrics
side, logdir = sys.argv[1], sys.argv[2]
hparams = {"num_params": 1234567}
scalars = {"train/loss": 2.5, "train/lr": 1e-4}
start = time.perf_counter()
if side == "ours":
  writer = metrics.TensorBoardWriter(logdir)
  writer.write_hparams(hparams)
  writer.write_scalars(1, scalars)
  writer.close()
else:
  from tensorboard.compat.proto import event_pb2, summary_pb2
  from tensorboard.plugins.hparams import summary_v2
  from tensorboard.summary.writer.record_writer import RecordWriter
  os.makedirs(logdir, exist_ok=True)
  records = RecordWriter(open(os.path.join(
      logdir, "events.out.tfevents.%d.tensorboard" % time.time()), "wb"))
  records.write(event_pb2.Event(wall_time=time.time(),
                                file_version="brain.Event:2")
                .SerializeToString())
  records.write(event_pb2.Event(
      wall_time=time.time(), step=0,
      summary=summary_v2.hparams_pb(hparams)).SerializeToString())
  records.write(event_pb2.Event(
      wall_time=time.time(), step=1, summary=summary_pb2.Summary(value=[
          metrics.TensorBoardWriter._scalar(k, v)  # pylint: disable=protected-access
          for k, v in scalars.items()])).SerializeToString())
  records.close()
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"seconds": seconds, "tensorboard.summary":
                              "tensorboard.summary" in sys.modules}))
"""

SIDES = ("ours", "tensorboard")


def _run(side: str, logdir: str, cpu) -> dict:
  return fresh_process.run(f"event_writer_seconds ({side})", _CHILD,
                           args=[side, logdir], cpu=cpu)


def _tags(logdir: str) -> list:
  """(step, tag) of every summary value in logdir's one event file, read
  with tensorboard's loader (it checks the CRCs)."""
  # pylint: disable=g-import-not-at-top
  from tensorboard.backend.event_processing import event_file_loader
  from tensorboard.compat.proto import event_pb2
  # pylint: enable=g-import-not-at-top
  (name,) = [n for n in os.listdir(logdir) if n.startswith("events.out.")]
  tags = []
  for raw in event_file_loader.RawEventFileLoader(
      os.path.join(logdir, name)).Load():
    event = event_pb2.Event.FromString(raw)
    tags += [(event.step, v.tag) for v in event.summary.value]
  return tags


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--cpu", type=int, default=None,
                      help="run each process under taskset -c CPU")
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error("--rounds must be >= 1")
  print(f"python {sys.version.split()[0]}, cpu {args.cpu}, "
        f"{os.cpu_count()} cores")
  with tempfile.TemporaryDirectory() as tmp:
    for side in SIDES:  # a first run of each, not counted (disk cache)
      _run(side, os.path.join(tmp, f"warm_{side}"), args.cpu)
    tags = {side: _tags(os.path.join(tmp, f"warm_{side}")) for side in SIDES}
    if tags["ours"] != tags["tensorboard"]:
      raise SystemExit(f"event_writer_seconds: the two files differ: {tags}")
    results = fresh_process.alternate(
        args.rounds, SIDES,
        lambda side, round_: _run(side, os.path.join(tmp, f"{side}_{round_}"),
                                  args.cpu),
        lambda r: (f"writes {r['seconds']:.3f} s, process {r['wall']:.3f} s, "
                   f"imported tensorboard.summary {r['tensorboard.summary']}"))
  fresh_process.print_medians(
      "writer", {"seconds": "first writes s", "wall": "process s"}, results)


if __name__ == "__main__":
  main()
