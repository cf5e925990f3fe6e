r"""Runs a pytest selection again and again on a loaded host; counts aborts.

  python benchmarks/reliability/busy_host.py [--runs=20] [--busy=3] \
      tests/core/test_reliability.py -k "skipped_one or trm_nonfinite"

A test that queues multi-device calls on XLA:CPU may pass alone and abort in
CI, where the other pytest-xdist worker loads the same two cores: XLA gives a
stuck collective 40 s, then ends the process ("Termination timeout ...").
This starts `--busy` processes that spin (the load), runs
`python -m pytest -q -s -x ARGS` `--runs` times one after another (each a
fresh process, so a fresh compile), and prints one line per failed run,
with XLA's reason where it gave one, then the counts. The busy processes are
stopped at the end, also on Ctrl-C, and each stops by itself once this
process is gone (killed, it leaves no spinning process behind).
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
# Spins until its parent (this script) is gone.
_SPIN = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"


def xla_abort_reason(output: str) -> str:
  """XLA:CPU's collective timeout in `output`, in one line (also used by
  cpu_dispatch_depth.py); else the output's last line."""
  found = re.search(r"Termination timeout for `([^`]*?) RendezvousKey.*?"
                    r"global_devices=\[([^\]]*)\].*?of (\d+) seconds "
                    r"exceeded.*?Expected (\d+) threads.*?only (\d+) of them",
                    output)
  if found:
    return (f"XLA's collective timeout ({found[3]} s) in {found[1]} over "
            f"devices [{found[2]}]: {found[5]} of {found[4]} arrived")
  lines = output.strip().splitlines()
  return lines[-1] if lines else "no output"


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--runs", type=int, default=20)
  parser.add_argument("--busy", type=int, default=3,
                      help="spinning processes beside the tests")
  parser.add_argument("--timeout", type=int, default=900,
                      help="seconds before a run is killed")
  args, pytest_args = parser.parse_known_args()
  if args.runs < 1 or args.busy < 0:
    parser.error("--runs must be >= 1 and --busy >= 0")
  if not pytest_args:
    parser.error("name the tests to run (pytest's arguments)")
  with open("/proc/loadavg") as f:
    load = f.read().split()[0]
  print(f"cpus: {os.cpu_count()}; load before: {load}; busy: {args.busy}; "
        f"pytest {' '.join(pytest_args)}", flush=True)
  spinners = [subprocess.Popen([sys.executable, "-c", _SPIN])
              for _ in range(args.busy)]
  passed = failed = 0
  interrupted = False
  try:
    for run in range(1, args.runs + 1):
      begin = time.time()
      try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-x",
             "-p", "no:cacheprovider", *pytest_args],
            cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        code, output = done.returncode, done.stdout + done.stderr
      except subprocess.TimeoutExpired:
        code, output = "killed", f"killed after {args.timeout} s"
      if code == 0:
        passed += 1
      else:
        failed += 1
        print(f"run {run}: exit code {code} after {time.time() - begin:.0f}"
              f" s; {xla_abort_reason(output)}", flush=True)
  except KeyboardInterrupt:
    interrupted = True
  finally:
    for spinner in spinners:
      spinner.kill()
  print(f"passed {passed} of {passed + failed} runs, failed {failed}"
        + ("; interrupted (the run under way is not counted)"
           if interrupted else ""))
  if interrupted:
    sys.exit(130)


if __name__ == "__main__":
  main()
