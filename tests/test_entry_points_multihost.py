"""The entry points on 2 processes x 4 CPU devices (gloo) against one
process x 8: `DiffusionLM.generate` (prompts split over the batch axis,
history, cached decoding) and the TRM torch export with arrays that span
both processes; then `trm.generate`, `trm.sample` and `trm.evaluate`
(TRM and --benchmark) started as on a pod (the same command, with
--coordinator_address): every process takes part, process 0 alone prints
and writes, and what it prints or writes is what one process does. The
default run starts trm.evaluate --benchmark so (with --resume and two
failures); the other tools are a `slow` test's (each loads its weights
over the processes as the script and tests/test_export_multihost.py do)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from test_bad_inputs import _write_checkpoint, dc_config
import test_generate
import test_sample_inputs
from test_train import tiny_config
import workers as workers_lib
from trm.families.trm import task as puzzle

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A batch of 8 prompts: on 8 devices the sampler splits it over all of them.
_WORKER = workers_lib.JOIN + """
import json
import numpy as np
from flax import linen as nn
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from trm import DiffusionLM
from trm.families.trm import model as trm
from trm.families.trm import torch_import

lm = DiffusionLM.from_pretrained({checkpoint!r}, dtype="float32")
prompts = ["w3 w4 w5", "w9", "w7 w1", "w2"] * 2
exact = lm.generate(prompts, max_new_tokens=8, steps=4, return_history=True)
cached = lm.generate(prompts, max_new_tokens=8, steps=4, cache="dual",
                     block_length=4, return_tokens=True)

cfg = trm.TRMConfig(vocab_size=10, seq_len=16, num_puzzle_identifiers=8,
                    hidden_size=32, num_heads=2, expansion=4.0, L_layers=2,
                    H_cycles=2, L_cycles=2, halt_max_steps=4,
                    puzzle_emb_ndim=32, puzzle_emb_len=4,
                    forward_dtype="float32")
abstract = nn.meta.unbox(jax.eval_shape(
    lambda: trm.init_variables(trm.TRM(cfg), jax.random.PRNGKey(0))))
rng = np.random.default_rng(0)
mesh = Mesh(np.array(jax.devices()), ("x",))
def place(a):
  value = rng.normal(size=a.shape).astype(a.dtype)
  spec = P("x") if a.ndim and a.shape[0] % 8 == 0 else P()
  return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec),
                                      lambda i: value[i])
variables = jax.tree.map(place, abstract)
split = sum(not x.is_fully_addressable for x in jax.tree.leaves(variables))
torch_import.export_torch_checkpoint(
    variables["params"], variables["buffers"], variables["puzzle_emb"], cfg,
    {out!r} + "/trm.safetensors")
print("RESULT", json.dumps(dict(
    process=jax.process_index(), split=split, tokens=exact.tokens.tolist(),
    history=exact.history.tolist(), cached=cached.tokens.tolist())),
    flush=True)
if {then_module!r}:  # the one-process reference: a tool after, as `-m`
  import runpy, sys
  sys.argv = [{then_module!r}, *{then_argv!r}]
  runpy.run_module({then_module!r}, run_name="__main__", alter_sys=True)
"""


def _two(commands, env, timeout=300):
  """Runs commands[i] as process i of a 2-process job; their outputs."""
  workers = [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for c in commands]
  outputs = workers_lib.wait_all(workers, timeout=timeout)
  for worker, output in zip(workers, outputs):
    assert worker.returncode == 0, output[-3000:]
  return outputs


def _result(output):
  return json.loads(next(line for line in output.splitlines()
                         if line.startswith("RESULT "))[len("RESULT "):])


def _samples(directory):
  with open(os.path.join(directory, "samples.jsonl"), encoding="utf-8") as f:
    return [(r["task_id"], r["sample"], r["generation"], r["passed"])
            for r in map(json.loads, f)]


def _evaluate_args(checkpoint):
  """trm.evaluate --benchmark on the tiny Dream checkpoint; {out} is the
  output directory."""
  return ["-m", "trm.evaluate", f"--checkpoint={checkpoint}",
          "--config=configs/diffucoder_7b.py:tiny",
          "--config.seq_len=512", "--benchmark=humaneval",
          "--limit=2", "--num_samples=2", "--batch_size=2",
          "--max_new_tokens=8", "--steps=2", "--dtype=float32",
          "--output={out}/samples.jsonl"]


def test_two_processes_do_what_one_does(tmp_path):
  checkpoint = test_generate.make_tiny_checkpoint(tmp_path / "ckpt")
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=workers_lib.xla_flags(8))

  evaluate = _evaluate_args(checkpoint)
  evaluate_one = tmp_path / "evaluate-one"

  def script(out, process_id=None, address=None, then=()):
    return _WORKER.format(checkpoint=checkpoint, out=str(out),
                          process_id=process_id, address=address,
                          then_module=then[0] if then else "",
                          then_argv=list(then[1:]))

  # The one-process reference also runs trm.evaluate's below (its samples
  # file), in the same process after the script: one start-up fewer.
  os.makedirs(tmp_path / "one")
  one = subprocess.run([sys.executable, "-c", script(
      tmp_path / "one", then=[a.format(out=evaluate_one)
                              for a in evaluate[1:]])],
                       cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
  assert one.returncode == 0, one.stderr[-3000:]
  expected, expected_out = _result(one.stdout), one.stdout + one.stderr

  os.makedirs(tmp_path / "two")
  address = f"127.0.0.1:{workers_lib.free_port()}"
  env["XLA_FLAGS"] = workers_lib.xla_flags(4)
  outputs = _two([[sys.executable, "-c", script(
      tmp_path / "two", process_id=i, address=address)] for i in range(2)],
                 env)
  for i, output in enumerate(outputs):
    got = _result(output)
    assert got["process"] == i and got["split"] > 0
    for key in ("tokens", "history", "cached"):
      assert got[key] == expected[key], (i, key)
  assert os.listdir(tmp_path / "two") == ["trm.safetensors"]
  want = load_file(str(tmp_path / "one" / "trm.safetensors"))
  have = load_file(str(tmp_path / "two" / "trm.safetensors"))
  assert sorted(have) == sorted(want)
  for name, value in want.items():
    np.testing.assert_array_equal(have[name], value, err_msg=name)

  # trm.evaluate --benchmark as every worker of a pod starts it (the other
  # tools are the slow test below's: each restores or loads its weights as
  # the script above and tests/test_export_multihost.py do), with --resume:
  # the two processes go on from the first batch of the one-process run's
  # file. Process 0 alone reads it and writes, every process skips the
  # same batch and generates the other, and the file ends as one process's.
  one, two = evaluate_one, tmp_path / "evaluate-two"
  assert len(_samples(one)) == 4 and "pass@1" in expected_out
  os.makedirs(two)
  with open(one / "samples.jsonl", encoding="utf-8") as f:
    # Sample 0 of both problems: the first batch generated (the finished
    # file is in problem order).
    first_batch = [line for line in f if json.loads(line)["sample"] == 0]
  assert len(first_batch) == 2
  (two / "samples.jsonl").write_text("".join(first_batch), encoding="utf-8")
  shutil.copy(one / "samples_generation.json", two)
  env["XLA_FLAGS"] = workers_lib.xla_flags(4)
  address = f"127.0.0.1:{workers_lib.free_port()}"
  outputs = _two([[sys.executable, *[a.format(out=two) for a in evaluate],
                   "--resume", f"--coordinator_address={address}",
                   "--num_processes=2", f"--process_id={i}"]
                  for i in range(2)], env)
  assert "--resume: 2 samples of 1/2 batches kept" in outputs[0], (
      outputs[0][-3000:])
  assert _samples(two) == _samples(one)
  assert "pass@1" in outputs[0]
  # The other process printed none of it (its stderr is merged in here).
  for line in ("pass@1", "--resume:"):
    assert line not in outputs[1], outputs[1][-3000:]
  # Refused there (other settings), it stops both processes at once, each
  # with one line, instead of leaving process 1 in a collective.
  address = f"127.0.0.1:{workers_lib.free_port()}"
  workers = [subprocess.Popen(
      [sys.executable, *[a.format(out=two) for a in evaluate],
       "--resume", "--seed=7", f"--coordinator_address={address}",
       "--num_processes=2", f"--process_id={i}"], cwd=ROOT, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=240)
  assert [w.returncode for w in workers] == [2, 2], outputs
  assert "was generated with seed" in outputs[0], outputs[0][-2000:]
  assert "process 0 stopped while starting --output" in outputs[1], (
      outputs[1][-2000:])
  assert "Traceback" not in outputs[0] + outputs[1]
  # An append that fails on process 0 mid-run (a full disk) stops process 1
  # at once too, instead of leaving it in the next batch's collective.
  failing = ("import sys, runpy\n"
             "from trm.families.dream import code_eval\n"
             "def append_samples(path, records):\n"
             "  raise OSError(28, 'No space left on device', path)\n"
             "code_eval.append_samples = append_samples\n"
             "sys.argv[0] = 'trm.evaluate'\n"
             "runpy.run_module('trm.evaluate', run_name='__main__')\n")
  full = tmp_path / "evaluate-full"
  address = f"127.0.0.1:{workers_lib.free_port()}"
  workers = [subprocess.Popen(
      [sys.executable, "-c", failing,
       *[a.format(out=full) for a in evaluate[2:]],
       f"--coordinator_address={address}", "--num_processes=2",
       f"--process_id={i}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = workers_lib.wait_all(workers, timeout=240)
  assert [w.returncode for w in workers] == [2, 2], outputs
  assert "No space left on device" in outputs[0], outputs[0][-2000:]
  assert "process 0 stopped while appending samples to --output" in (
      outputs[1]), outputs[1][-2000:]
  assert "Traceback" not in outputs[0] + outputs[1]


def _compare_tools(tmp_path, tools, env):
  """Runs each tool as one process with 8 devices, then as 2 processes x 4
  started as on a pod; what process 0 prints or writes must be what the
  one process does, and process 1 prints none of it."""
  for name, args in tools.items():
    one, two = tmp_path / f"{name}-one", tmp_path / f"{name}-two"
    env["XLA_FLAGS"] = workers_lib.xla_flags(8)
    single = subprocess.run(
        [sys.executable, *[a.format(out=one) for a in args]], cwd=ROOT,
        env=env, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    env["XLA_FLAGS"] = workers_lib.xla_flags(4)
    address = f"127.0.0.1:{workers_lib.free_port()}"
    outputs = _two([[sys.executable, *[a.format(out=two) for a in args],
                     f"--coordinator_address={address}", "--num_processes=2",
                     f"--process_id={i}"] for i in range(2)], env)
    if name == "evaluate":  # the samples file process 0 alone wrote
      assert _samples(two) == _samples(one) and len(_samples(one)) == 4
      assert "pass@1" in outputs[0]
    elif name == "evaluate_trm":
      assert sorted(os.listdir(two)) == sorted(os.listdir(one))
      np.testing.assert_array_equal(
          np.load(two / "predictions_test.npy"),
          np.load(one / "predictions_test.npy"))
      assert "paper metric exact_accuracy" in outputs[0]
    else:  # process 0 printed the results (its stderr is merged in)
      want = single.stdout.split("device:")[0].strip().splitlines()
      # Other lines may come between ours (Gloo prints its connections to
      # stdout when a restore opens them, logs go to the merged stderr):
      # ours must all be there, in order.
      printed = iter(outputs[0].splitlines())
      assert want and all(line in printed for line in want), (
          name, want, outputs[0][-3000:])
    # The other process printed none of it (its stderr is merged in here).
    for line in ("weights:", "===", "---------------", "pass@1", "exported",
                 "paper metric"):
      assert line not in outputs[1], (name, outputs[1][-3000:])


@pytest.mark.slow
def test_two_processes_run_the_other_tools_as_one_does(tmp_path):
  """trm.generate of a trm.main workdir, trm.sample of GPT-2 weights and
  trm.evaluate of a TRM workdir, started as on a pod."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("w3 w4 w5\nw9\nw7 w1\nw2\n" * 2)
  gpt2 = test_sample_inputs.write_tiny_gpt2(tmp_path / "gpt2")
  chars = tmp_path / "chars"
  os.makedirs(chars)
  (chars / "meta.json").write_text(json.dumps(
      {"vocab_size": 64, "tokenizer": "char",
       "itos": list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789 \n")}))
  for name in ("train.bin", "val.bin"):
    (chars / name).write_bytes(bytes(16))
  workdir = _write_checkpoint(dc_config(), str(tmp_path / "dc_run"))
  sudoku = str(tmp_path / "sudoku")
  trm_config = tiny_config(**{"data.data_dir": sudoku})
  puzzle.prepare_data(trm_config, sudoku)
  trm_run = _write_checkpoint(trm_config, str(tmp_path / "trm_run"))
  # No trm.generate of the Hugging Face checkpoint: loading it over both
  # processes is the fast test's script, and its trm.evaluate loads it by
  # the command line; trm.generate's own command line is the workdir's.
  tools = {
      # A trm.main workdir: its checkpoint restored over the processes'
      # devices.
      "generate_workdir": ["-m", "trm.generate", f"--checkpoint={workdir}",
                           "--config=configs/diffucoder_7b.py:tiny",
                           f"--batch_file={prompts}", "--max_new_tokens=8",
                           "--steps=4"],
      "sample": ["-m", "trm.sample", "--init_from=gpt2",
                 f"--checkpoint={gpt2}", f"--data_dir={chars}", "--start=ab",
                 "--num_samples=2", "--max_new_tokens=8"],
      # tests/core/test_train.py's tiny_config, as flags.
      "evaluate_trm": [
          "-m", "trm.evaluate", "--config=configs/trm_sudoku.py:cpu",
          f"--checkpoint={trm_run}", "--output_dir={out}",
          f"--config.data.data_dir={sudoku}", "--config.model.hidden_size=32",
          "--config.model.num_heads=2", "--config.model.puzzle_emb_ndim=32",
          "--config.model.halt_max_steps=2", "--config.model.L_layers=1",
          "--config.data.build.num_train=256",
          "--config.data.build.num_test=32",
          "--config.data.build.num_blanks=30",
          "--config.data.eval_batch_size=16"],
      # No trm.export: tests/test_export_multihost.py exports weights that
      # span both processes (process 0 alone writes), and generate_workdir
      # above restores this workdir over them by the same start-up.
  }
  _compare_tools(tmp_path, tools, env)
