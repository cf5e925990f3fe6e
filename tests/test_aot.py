"""TPU compile checks on a CPU host (libtpu compile-only devices)."""
import functools
import os
import re
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import cli_batch
import pytest
import repo

from trm.core import compiled_step
from trm.core import topology
from trm.families.dream import sample_program
from trm.core import config_lib
from trm import aot
from trm.families.dream import steps as lm_steps
from trm.core import mesh as mesh_lib
from trm.data.puzzles import sudoku
from trm.families.dream import model as dream
from trm.families.trm import model as trm

# Compiles to compile-only TPU devices, whose executables the session's
# compilation cache cannot load back (JAX warns, then compiles again).
pytestmark = pytest.mark.usefixtures("no_compilation_cache")

# `python -m trm.aot` for the refusal cases, forked from one process that
# has imported what they import (tests/cli_batch.py): a start-up of jax and
# the model families per case less. The test of the DOES NOT FIT exit code
# runs the real entry point.
aot_cli = cli_batch.serve(
    "trm.aot", env=lambda: dict(os.environ, TRM_COMPILATION_CACHE="off"),
    preload=("trm.core.cli", "trm.core.run_checks", "trm.forecast.plan",
             "trm.families.dream.task", "trm.families.trm.task"))

ROOT = repo.ROOT


def sudoku_config(variant="cpu"):
  return config_lib.load_config(
      os.path.join(ROOT, "configs", "trm_sudoku.py"), variant)


@pytest.mark.parametrize("name, generation, shape, chips", [
    ("v4-8", "v4", "2x2x1", 4), ("v4-64", "v4", "2x4x4", 32),
    ("v4-4096", "v4", "8x16x16", 2048), ("v5p-128", "v5p", "4x4x4", 64),
    ("v5e-16", "v5e", "4x4", 16), ("v5litepod-256", "v5e", "16x16", 256),
])
def test_topology_names(name, generation, shape, chips):
  topology = aot.parse_topology(name)
  assert (topology.generation, topology.shape, topology.chips) == (
      generation, shape, chips)


@pytest.mark.parametrize("name", ["v4-7", "v4-6", "v3-8", "tpu", "v5e-3"])
def test_bad_topology_names(name):
  with pytest.raises(ValueError, match="--topology"):
    aot.parse_topology(name)


_SMALL_TRM = {}


@pytest.fixture
def small_trm_v4_8(no_compilation_cache, tmp_path_factory):
  """(report, --save_compiled file) of the small TRM's train step for one
  v4-8, compiled once (with its unrolled twin) for the save/report test
  and the Pallas one: `cpu,att` with both kinds of Pallas kernel
  (mlp_kernel='pallas', attention='splash'), one layer and one L cycle
  (two H cycles keep the gradient-free loop; every kernel still runs in
  each H cycle). The report and save path do not depend on depth or on
  the kernels; the compiles do. The plain `cpu` step compiles in
  test_cli_reports_does_not_fit_with_exit_code_1. Function-scoped and
  memoised (not module-scoped): it compiles with the session's cache off,
  as every test of this file does."""
  del no_compilation_cache  # requested first: the cache is off
  if not _SMALL_TRM:
    config = sudoku_config("cpu,att")
    config.model.update(mlp_kernel="pallas", attention="splash", L_layers=1,
                        L_cycles=1)
    path = str(tmp_path_factory.mktemp("small_trm") / "step.bin")
    _SMALL_TRM["compiled"] = aot.compile_report(
        config, aot.parse_topology("v4-8"), 1, sudoku.dataset_metadata(1),
        save_compiled=path), path
  return _SMALL_TRM["compiled"]


# Two slices (slow): tests/forecast's compiled programs cover multi-slice
# compiles; one slice runs the same save/report path here.
@pytest.mark.parametrize("num_slices", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_small_trm_compiles_for_v4_8(num_slices, tmp_path, request):
  if num_slices == 1:
    report, path = request.getfixturevalue("small_trm_v4_8")
  else:
    config = sudoku_config()
    # One layer and one L cycle (two H cycles keep the gradient-free loop):
    # the report and save path do not depend on depth, the compiles do.
    config.model.update(L_layers=1, L_cycles=1)
    config.mesh.dcn_data = num_slices
    path = str(tmp_path / "step.bin")
    report = aot.compile_report(config, aot.parse_topology("v4-8"),
                                num_slices, sudoku.dataset_metadata(1),
                                save_compiled=path)
  assert report["chips"] == 4 * num_slices
  assert report["mesh"] == {"data": 4 * num_slices, "fsdp": 1, "model": 1}
  assert report["fits"]
  assert 0 < report["total_gib"] < 1
  assert report["train_flops_per_step"] > 0
  assert report["hbm_bytes_per_device"] > 0
  assert report["bound"] in ("compute", "memory")
  assert "verdict: FITS" in aot.format_report(report)
  assert "-bound" in aot.format_report(report)
  # --save_compiled: the TPU step, serialized, with what it was built for;
  # a CPU run is told in one line (tests/core/test_compiled_step.py loads
  # a CPU-built one).
  assert f"saved: {path} ({4 * num_slices} x TPU v4" in aot.format_report(
      report)
  header, _ = compiled_step.read(path)
  assert header["topology"] == "v4-8"
  assert header["environment"]["platform"] == "tpu"
  assert header["environment"]["num_devices"] == 4 * num_slices
  assert header["environment"]["libtpu"]
  assert header["mesh"]["axes"] == report["mesh"]
  cpu_run = dict(header, environment=compiled_step.environment(
      jax.make_mesh((8,), ("data",))))
  with pytest.raises(compiled_step.CompiledStepError,
                     match="platform: built for tpu, this run has cpu"):
    compiled_step.check(path, header, cpu_run)


def test_pallas_kernels_are_compiled_and_named_in_the_report(small_trm_v4_8):
  """Both kinds of Pallas kernel in one program (one compile, and its
  unrolled twin, instead of one each; `small_trm_v4_8`): the SwiGLU
  kernels declare their cost; jax's splash kernel declares none, so XLA
  counts no FLOPs for it (before, the report said every kernel call
  counted what it declares)."""
  report, _ = small_trm_v4_8
  assert report["fits"]
  calls = report["pallas_kernel_calls"]
  bare = report["pallas_calls_without_cost"]
  # A SwiGLU block per layer call, a forward kernel each and a backward
  # kernel in the last H cycle; as many splash calls (forward, backward);
  # the unrolled twin lists every call.
  assert calls - bare >= 4 and bare >= 2, (calls, bare)
  text = aot.format_report(report)
  assert (f"of which {calls - bare} Pallas kernel calls count the FLOPs "
          "and bytes they declare") in text
  assert f"{bare} Pallas kernel calls declare no cost" in text
  # A program of splash calls only (config.model.mlp_kernel='dot') names
  # none as counting what it declares.
  splash_only = aot.format_report(dict(report, pallas_kernel_calls=bare))
  assert f"{bare} Pallas kernel calls declare no cost" in splash_only
  assert "count the FLOPs and bytes they declare" not in splash_only


def test_slices_must_match_the_mesh():
  config = sudoku_config()
  with pytest.raises(mesh_lib.MeshConfigError, match="dcn_data=2"):
    aot.compile_report(config, aot.parse_topology("v4-8"), 2,
                       sudoku.dataset_metadata(1))


def test_mesh_that_does_not_fit_the_topology_is_a_clear_error():
  config = sudoku_config()
  config.mesh.update(data=2, fsdp=1, model=1)  # 2 of v4-8's 4 chips
  with pytest.raises(mesh_lib.MeshConfigError, match="4 are available"):
    aot.compile_report(config, aot.parse_topology("v4-8"), 1,
                       sudoku.dataset_metadata(1))


def test_cli_local_topology_needs_save_compiled(aot_cli):
  result = aot_cli.run(
      ["--config=configs/trm_sudoku.py:cpu", "--topology=local"], cwd=ROOT,
      timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "trm.aot: error: --topology=local compiles for this host only to save "
      "the step: add --save_compiled=FILE.")


def test_cli_save_compiled_to_an_unwritable_directory_stops_before_compiling(
    tmp_path, aot_cli):
  locked = tmp_path / "locked"
  locked.mkdir()
  locked.chmod(0o500)
  path = locked / "step.bin"
  if os.access(locked, os.W_OK) and os.geteuid() == 0:
    path = "/proc/step.bin"  # root writes anywhere on disk; procfs refuses
  result = aot_cli.run(
      ["--config=configs/trm_sudoku.py:cpu", "--topology=local",
       f"--save_compiled={path}"], cwd=ROOT, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f"trm.aot: error: --save_compiled='{path}': its "
                         "directory "), last
  assert "not writable" in last and "[aot] compiling" not in result.stdout


def test_cli_save_compiled_with_num_epochs_is_refused_before_compiling(
    tmp_path, aot_cli):
  """config.num_epochs derives total_steps from the training data, which
  trm.aot does not read: a step saved with the file's total_steps would
  hold another schedule (and trm.main refuses num_epochs with it)."""
  result = aot_cli.run(
      ["--config=configs/trm_sudoku.py:cpu", "--topology=local",
       f"--save_compiled={tmp_path / 'step.bin'}", "--config.num_epochs=2"],
      cwd=ROOT, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      "trm.aot: error: --save_compiled with config.num_epochs=2: the "
      "compiled step holds the learning-rate schedule of config.total_steps")
  assert "[aot] compiling" not in result.stdout + result.stderr
  assert not (tmp_path / "step.bin").exists()


def test_cli_a_size_past_int32_is_a_flag_error(aot_cli):
  """A puzzle table of 2**62 rows (2**71 parameters) ended in a JAX
  OverflowError traceback from its gather's int32 index arithmetic: the
  size flags take what the configs' sizes take (1 to 2**31 - 1)."""
  result = aot_cli.run(
      ["--config=configs/trm_sudoku.py:cpu", "--topology=v4-8",
       f"--num_puzzle_identifiers={2**62}"], cwd=ROOT, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1].startswith(
      f"trm.aot: error: flag --num_puzzle_identifiers={2**62}: {2**62} is "
      "not an integer in the range [1, 2147483647]")


def test_cli_reports_does_not_fit_with_exit_code_1():
  # A 100M-row puzzle table, replicated over the data axis: 24 GiB of
  # parameters per chip plus its update does not fit a v4 chip. One layer
  # and one L cycle (the table is the state; the compile is the network's).
  result = subprocess.run(
      [sys.executable, "-m", "trm.aot", "--config=configs/trm_sudoku.py:cpu",
       "--topology=v4-8", "--num_puzzle_identifiers=100000000",
       "--config.model.L_layers=1", "--config.model.L_cycles=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 1, result.stdout + result.stderr[-2000:]
  assert "verdict: DOES NOT FIT" in result.stdout
  # XLA's out-of-memory line names its temporaries only; the report also
  # gives the train state's share of the chip (the table: 24 GiB), which
  # no smaller batch frees (the 7B's on a v4-8: 21.3 GiB).
  state = re.search(r"train state per chip: ([\d.]+) GiB of 30\.75 GiB",
                    result.stdout)
  assert state and 23 < float(state.group(1)) < 25, result.stdout


def _grad_step_cost(batch=8, **sizes):
  """(FLOPs, bytes) XLA counts for the gradient of one ACT step of a small
  TRM, and the analytic FLOPs of the step (`train_flops_per_example`)."""
  cfg = trm.TRMConfig(vocab_size=11, seq_len=81, num_puzzle_identifiers=1,
                      num_heads=4, forward_dtype="float32", **sizes)
  model = trm.TRM(cfg)
  variables = nn.meta.unbox(jax.eval_shape(
      functools.partial(trm.init_variables, model, jax.random.PRNGKey(0))))
  carry = jax.eval_shape(lambda: trm.empty_carry(cfg, batch))
  vectors = jax.ShapeDtypeStruct((batch, cfg.puzzle_emb_ndim), jnp.float32)

  def loss(params, carry, vectors):
    _, out = trm.act_step(model, {**variables, "params": params}, carry,
                          vectors, train=False)
    return jnp.sum(out["logits"])

  compiled = jax.jit(jax.grad(loss)).lower(
      variables["params"], carry, vectors).compile()
  return topology.step_cost(compiled), trm.train_flops_per_example(cfg) * batch


def test_flops_formula_matches_xla_cost_analysis():
  """With one H cycle (no loops) XLA counts every FLOP of the step. The
  step formula counts the forward of all H*(L+1) calls plus the backward of
  the last L+1; with H=1 that is 3x the forward."""
  for mlp_t in (True, False):
    (xla_flops, _), ours = _grad_step_cost(
        hidden_size=256, puzzle_emb_ndim=256, H_cycles=1, L_cycles=2,
        mlp_t=mlp_t)
    assert abs(xla_flops - ours) / ours < 0.15, (mlp_t, xla_flops, ours)


def test_unrolled_cost_analysis_scales_with_depth():
  """XLA counts a loop body once, so the rolled step under-reports; the
  unrolled twin `trm.aot` analyses grows with depth and matches the
  analytic count."""
  def cost(l_cycles, unroll):
    return _grad_step_cost(hidden_size=128, puzzle_emb_ndim=128, H_cycles=3,
                           L_cycles=l_cycles, mlp_t=True, unroll_loops=unroll)

  (rolled2, _), _ = cost(2, False)
  (rolled4, _), _ = cost(4, False)
  (flops2, bytes2), ours2 = cost(2, True)
  (flops4, bytes4), ours4 = cost(4, True)
  # The rolled count misses the H - 1 gradient-free cycles (loop bodies
  # counted once): about 30% of the step here.
  assert rolled2 < 0.8 * ours2 and rolled4 < 0.8 * ours4
  for xla, ours in ((flops2, ours2), (flops4, ours4)):
    assert abs(xla - ours) / ours < 0.15, (xla, ours)
  assert flops4 > 1.5 * flops2 and bytes4 > 1.3 * bytes2
  report = topology.roofline(flops4, bytes4, topology.CHIPS["v4"])
  assert report["bound"] in ("compute", "memory")
  assert report["flops_per_byte"] == pytest.approx(flops4 / bytes4)


def test_multislice_devices_need_dcn_sizes():
  """Two slices with dcn_data=1 would silently span DCN with ICI axes."""
  devices = topology.topology_devices(aot.parse_topology("v4-8"), 2)
  config = sudoku_config()
  with pytest.raises(mesh_lib.MeshConfigError, match="span 2 slice"):
    mesh_lib.make_mesh(config.mesh, devices)
  config.mesh.dcn_data = 2
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  # Slice 0's devices hold the first half of the data axis.
  assert {d.slice_index for d in mesh.devices[:4].flat} == {0}


# One slice (slow): two slices compile the same train step with the data
# axis over DCN; test_small_trm_compiles_for_v4_8[1] and
# test_tiny_gpt_train_step_compiles_for_v4_8 compile one-slice steps.
@pytest.mark.parametrize("num_slices", [
    pytest.param(1, marks=pytest.mark.slow), 2])
def test_tiny_diffucoder_train_step_compiles_for_v4_8(num_slices):
  """Also with each layer's input offloaded to the host by
  `remat=custom`: the report gives the host memory it takes."""
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")
  config.mesh.dcn_data = num_slices
  config.model.update(remat="custom", remat_offload="decoder_layer_input")
  report = aot.compile_report(config, aot.parse_topology("v4-8"), num_slices,
                              aot.data_shapes(config, {}))
  assert report["mesh"] == {"data": num_slices, "fsdp": 4, "model": 1}
  assert report["fits"] and 0 < report["total_gib"] < 1
  assert report["train_flops_per_step"] > 0
  # 2 layers x 16 / (4 x num_slices) rows x 128 tokens x 64, float32.
  inputs = 2 * 16 // (4 * num_slices) * 128 * 64 * 4
  assert report["host_temp_gib"] * 2**30 >= inputs


def test_tiny_gpt_train_step_compiles_for_v4_8():
  """nanoGPT's iteration (accumulation, AdamW, the written-out backward
  passes) compiles for TPU, parameters split over fsdp; scanned blocks
  whose inputs a remat policy offloads to the host, the report giving the
  host memory they take."""
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char")
  config.update(dict(n_layer=2, n_head=2, n_embd=64, block_size=32,
                     batch_size=8, gradient_accumulation_steps=2))
  config.model.update(remat=True, scan_layers=True, remat_policy="custom",
                      remat_offload="decoder_layer_input")
  config.mesh.data, config.mesh.fsdp = 1, -1
  with pytest.raises(ValueError, match="--vocab_size"):
    aot.compile_report(config, aot.parse_topology("v4-8"), 1)
  config.model.vocab_size = 65
  report = aot.compile_report(config, aot.parse_topology("v4-8"), 1)
  assert report["mesh"] == {"data": 1, "fsdp": 4, "model": 1}
  assert report["global_batch_size"] == 16
  assert report["fits"] and 0 < report["total_gib"] < 1
  assert report["train_flops_per_step"] > 0
  # 2 layers x 2 sequences a device x 32 x 64, float32 (8 KiB a layer):
  # XLA:TPU pads its buffers to tiles, so at least that.
  assert report["host_temp_gib"] * 2**30 >= 2 * 2 * 32 * 64 * 4
  text = aot.format_report(report)
  assert "host memory per chip: 0.00 GiB (offloaded by " in text
  # The verdict is XLA's compile for the chip; its peak is reported beside
  # the sum (topology.hbm_use).
  assert 0 < report["peak_gib"] < 1
  assert (f"XLA's peak {report['peak_gib']:.2f} GiB; XLA:TPU compiled it for "
          "the chip's 30.75 GiB") in text


def test_the_verdict_is_xlas_compile_for_the_chips_hbm(monkeypatch):
  """XLA:TPU fits a step to the chip's HBM or refuses it; the report's
  verdict is that. A tiny GPT under an HBM of 16 MiB
  (--xla_tpu_max_hbm_size_mib, the chip's own by default) is refused,
  with XLA's figure (about 20 MiB); under 32 MiB it compiles, though XLA's
  peak (about 38 MiB) is above it: the peak is reported, not checked."""
  def report(limit_mib):
    config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                    "shakespeare_char")
    config.update(dict(n_layer=2, n_head=2, n_embd=256, block_size=256,
                       batch_size=32, gradient_accumulation_steps=2,
                       tpu_compiler_options=(
                           f"--xla_tpu_max_hbm_size_mib={limit_mib}")))
    config.model.update(remat=True, scan_layers=True, vocab_size=65)
    config.mesh.data, config.mesh.fsdp = 1, -1
    return aot.compile_report(config, aot.parse_topology("v4-8"), 1)

  # A sum far over the chip (as GPT-3 175B's 35.56 GiB on v6e's 31.25)
  # changes no verdict of a step XLA compiled.
  real = aot.hbm_use
  monkeypatch.setattr(aot, "hbm_use",
                      lambda memory: (real(memory)[0], 100 * 2**30))
  refused = report(16)
  assert not refused["fits"] and refused["usable_gib"] == 16 / 1024
  assert re.search(r"Used [\d.]+M of 16\.00M hbm", refused["error"])
  fitted = report(32)
  assert fitted["fits"] and fitted["usable_gib"] == 32 / 1024
  assert fitted["peak_gib"] > fitted["usable_gib"]
  assert fitted["total_gib"] == 100
  assert "XLA:TPU compiled it for the chip's 0.03 GiB" in aot.format_report(
      fitted)


def test_an_hbm_limit_that_is_not_a_number_is_refused_before_compiling():
  config = sudoku_config()
  config.tpu_compiler_options = "--xla_tpu_max_hbm_size_mib=lots"
  with pytest.raises(ValueError, match="--xla_tpu_max_hbm_size_mib=lots is "
                     "not a whole number of MiB"):
    aot.compile_report(config, aot.parse_topology("v4-8"), 1)


@pytest.mark.parametrize("name, wrap", [
    ("v4-8", (False, False, False)), ("v4-64", (False, False, False)),
    ("v4-128", (True, True, True)), ("v4-384", (True, True, True)),
    ("v5e-128", (False, True, False)), ("v5e-256", (True, True, False)),
    ("v5p-128", (True, True, True))])
def test_compile_only_devices_have_the_slices_wraparound_links(
    name, wrap, monkeypatch):
  """libtpu is asked for the slice's torus (its default is a mesh with no
  wraparound at all), as MaxText's train_compile.py asks for it."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  asked = {}
  # pytest.skip's exception is a BaseException: it stops the call before
  # libtpu without being rewrapped by topology_devices' RuntimeError.
  monkeypatch.setattr(topologies, "get_topology_desc",
                      lambda **kwargs: asked.update(kwargs) or pytest.skip(
                          "captured"))
  with pytest.raises(pytest.skip.Exception):
    topology.topology_devices(topology.parse_topology(name), 1)
  assert asked["wrap"] == wrap


# `slow` (a 64-chip compile): the wraparound links it needs are what
# test_compile_only_devices_have_the_slices_wraparound_links checks.
@pytest.mark.slow
def test_fsdp_weights_are_all_gathered_on_a_v4_128_torus():
  """On the torus XLA:TPU gathers FSDP weights with all-gathers; compiled
  for a 4x4x4 mesh without wraparound it used all-reduces of zero-padded
  weights (twice the traffic)."""
  from trm.forecast import plan  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "maxtext22b")
  config.update(dict(n_layer=1, n_embd=1024, n_head=8, batch_size=64))
  v4_128 = topology.parse_topology("v4-128")
  row = plan.compile_row(config, v4_128, 1, None, config.global_batch_size)
  kinds = {kind for kind, *_ in row.program.totals().collectives}
  assert "all-gather" in kinds, kinds


def test_heads_the_model_axis_does_not_divide_are_named_before_compiling(
    monkeypatch, caplog):
  """trm.aot logs the trainer's line (trm.families.warn_if_heads_unsplit)
  once the program is built, before the step compiles."""
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "shakespeare_char")
  config.update(dict(n_layer=2, n_head=2, n_embd=64, block_size=32,
                     batch_size=8, gradient_accumulation_steps=2))
  config.mesh.update(data=1, fsdp=1, model=4)
  config.model.vocab_size = 65

  def no_compile(*args):
    del args
    def compile_step():
      raise RuntimeError("compiled")
    return compile_step

  monkeypatch.setattr(aot, "_step_compiler", no_compile)
  aot.families._warn_once.cache_clear()  # pylint: disable=protected-access
  with caplog.at_level("WARNING"), pytest.raises(RuntimeError,
                                                 match="compiled"):
    aot.compile_report(config, aot.parse_topology("v4-8"), 1)
  assert caplog.text.count(
      "config.model.n_head=2 is not a multiple of config.mesh.model=4") == 1


@pytest.mark.parametrize("head_gather", ["param", "compute"])
def test_gpt_lm_head_gathers_the_table_as_configured_for_v4_8(
    head_gather, monkeypatch):
  """model.head_gather='compute' casts each FSDP shard of the tied table to
  bfloat16 and gathers that; 'param' gathers the float32 table and casts it
  (XLA may then make one float32 gather serve the token lookup too, which
  on the MaxText 32B kept the whole float32 table live from the lookup to
  the loss: BUILD_NOTES, "Another chip: MaxText's v5e runs"). Read from
  the lowered train step for v4-8: the sharding constraints on the whole
  table's bfloat16 copy."""
  from trm import families  # pylint: disable=g-import-not-at-top
  from trm.core import state as state_lib  # pylint: disable=g-import-not-at-top
  from trm.core import task as task_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.load_config(os.path.join(ROOT, "configs", "gpt.py"),
                                  "maxtext16b")
  assert config.model.head_gather == "compute"  # the v5e variants' choice
  # The whole logits at once: the chunked loss's backward pins its table
  # gradient, a bfloat16 [vocab, C] split over fsdp too.
  config.update(dict(n_layer=2, n_head=2, n_embd=256, block_size=64,
                     batch_size=8, loss_chunk_size=0))
  config.model.update(head_size=128, mlp_size=512, attention="dot",
                      head_gather=head_gather)
  devices = topology.topology_devices(aot.parse_topology("v4-8"), 1)
  ctx = mesh_lib.ShardingContext.from_config(config, devices)
  program = families.program(config.model.name).build(config, ctx, None)
  abstract, shardings = state_lib.abstract_state(program.init_fn, ctx)

  def lower_only(step_fn, abstract_state, state_shardings, abstract_batch,
                 compiler_options=None):
    del compiler_options
    batch_shardings = jax.tree.map(lambda x: x.sharding, abstract_batch)
    return jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings),
                   out_shardings=(state_shardings, None)).lower(
                       abstract_state, abstract_batch)

  monkeypatch.setattr(state_lib, "compile_step", lower_only)
  text = task_lib.compile_train_step(program, ctx, 8, abstract,
                                     shardings).as_text()
  # A bfloat16 copy of the whole table still split over fsdp: the cast
  # came before the gather.
  pinned = re.findall(r"sharding_constraint %\S+ <@mesh, \[\{[^}]*\}, "
                      r"\{\"fsdp\"\}\]> : tensor<32768x256xbf16>", text)
  assert bool(pinned) == (head_gather == "compute"), len(pinned)


def _tiny_dream_config():
  return config_lib.load_config(
      os.path.join(ROOT, "configs", "diffucoder_7b.py"), "tiny")


def test_tiny_diffucoder_sampling_loop_compiles_for_v4_8():
  sample = aot.SampleSettings(batch=None, prompt_len=24, max_new_tokens=16,
                              steps=8, alg="entropy", temperature=0.3,
                              top_p=0.95)
  report = aot.compile_report(_tiny_dream_config(), aot.parse_topology("v4-8"),
                              1, None, sample)
  assert report["mode"] == "sample"
  assert report["mesh"] == {"data": 1, "fsdp": 4, "model": 1}
  # One prompt per data-parallel device by default.
  assert report["sample_batch"] == 4 and report["per_device_batch"] == 1
  assert report["fits"] and 0 < report["total_gib"] < 1
  # The weights (float32, sharded 4 ways) are the arguments.
  cfg = dream.DreamConfig.from_config(_tiny_dream_config().model)
  assert report["argument_gib"] * aot.GIB >= dream.param_count(cfg) * 4 / 4
  forward = lm_steps.train_flops_per_example(cfg, 24 + 16) // 3
  assert report["sample_flops_per_call"] == forward * 4 * 8
  assert report["new_tokens_per_second_at_50pct_mfu"] > 0
  text = aot.format_report(report)
  assert "sampling batch 4 (1 per data-parallel device)" in text
  assert "prompt 24 + 16 new tokens, 8 steps, alg entropy" in text
  assert "verdict: FITS" in text


def test_sampling_on_a_model_axis_not_dividing_the_heads_is_refused():
  """The sampler's weights took the mesh's rules, so mesh.model=8 on the
  tiny model's 4 query heads compiled with the q/o projections whole on
  every chip, as the trainer did before it refused it."""
  config = config_lib.set_values(_tiny_dream_config(), {
      "mesh.data": 1, "mesh.fsdp": 1, "mesh.model": 8})
  sample = aot.SampleSettings(batch=None, prompt_len=24, max_new_tokens=16,
                              steps=8)
  with pytest.raises(mesh_lib.MeshConfigError, match=(
      r"config.mesh.model=8 does not divide "
      r"config.model.num_attention_heads=4")):
    aot.compile_report(config, aot.parse_topology("v4-16"), 1, None, sample)


# Fast-dLLM's rules (slow): "our rules" compiles the same cached sampler for
# TPU; tests/families/dream/test_cached_sampling.py runs Fast-dLLM's rules.
@pytest.mark.parametrize("fast_dllm", [
    False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["our rules", "fast_dllm"])
def test_tiny_diffucoder_cached_sampler_compiles_for_v4_8(fast_dllm):
  sample = aot.SampleSettings(batch=None, prompt_len=24, max_new_tokens=16,
                              steps=8, alg="entropy", temperature=0.3,
                              top_p=0.95, cache="dual", block_length=8,
                              fast_dllm=fast_dllm)
  report = aot.compile_report(_tiny_dream_config(), aot.parse_topology("v4-8"),
                              1, None, sample)
  assert report["mode"] == "sample" and report["cache"] == "dual"
  assert report["sample_batch"] == 4 and report["per_device_batch"] == 1
  assert report["fits"] and 0 < report["total_gib"] < 1
  # 2 blocks of 8, 4 steps each: per block one full forward over 40
  # positions, then 3 windows of 9 queries (Fast-dLLM's: 8) against the
  # 40 keys.
  cfg = dream.DreamConfig.from_config(_tiny_dream_config().model)
  full = lm_steps.train_flops_per_example(cfg, 24 + 16) // 3
  assert sample_program.forward_flops(cfg, 40, 40) == full
  window = sample_program.forward_flops(cfg, 8 if fast_dllm else 9, 40)
  assert window < full
  assert report["sample_flops_per_call"] == 4 * 2 * (full + 3 * window)
  assert report["fast_dllm"] == fast_dllm
  text = aot.format_report(report)
  assert "cache dual, blocks of 8, threshold None" + (
      ", Fast-dLLM's rules;" if fast_dllm else ";") in text
  assert "per block one full forward + window forwards" in text
  assert "verdict: FITS" in text


def test_cached_flops_count_the_threshold_at_its_bound():
  cfg = dream.DreamConfig()
  kw = dict(batch=1, prompt_len=512, max_new_tokens=512, steps=512,
            block_length=32)
  fixed = sample_program.cached_flops_per_call(cfg, cache="dual",
                                               threshold=None, **kw)
  # One token per step either way: the threshold's bound is the fixed count.
  assert sample_program.cached_flops_per_call(
      cfg, cache="dual", threshold=0.9, **kw) == fixed
  exact = sample_program.sample_flops_per_call(cfg, 1, 512, 512, 512)
  prefix = sample_program.cached_flops_per_call(cfg, cache="prefix",
                                                threshold=None, **kw)
  assert fixed < prefix < exact


def test_sample_flops_are_a_third_of_training_per_forward():
  cfg = dream.DreamConfig()
  # 7.6B parameters: about 2 x N FLOPs per token and step, plus attention.
  flops = sample_program.sample_flops_per_call(
      cfg, batch=1, prompt_len=512, max_new_tokens=512, steps=1)
  assert 2 * 7.0e9 * 1024 < flops < 2 * 8.2e9 * 1024
  assert sample_program.sample_flops_per_call(cfg, 3, 512, 512, 5) == 15 * flops


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch=0), "--sample_batch=0"),
    (dict(prompt_len=-1), "--prompt_len=-1"),
    (dict(max_new_tokens=0), "--max_new_tokens=0"),
    (dict(steps=0), "--steps=0"),
    # Before: a 16 GiB host table of the schedule's times (--max_new_tokens
    # sets --steps), and the OOM killer.
    (dict(max_new_tokens=2**31 - 1, steps=2**31 - 1),
     "--steps=2147483647 must be at most 1,048,576"),
    # Before: "error: Maximum allowed size exceeded", naming no flag.
    (dict(max_new_tokens=10**20), r"--max_new_tokens=100000000000000000000 "
     r"must be a positive integer below 2\*\*31"),
    (dict(alg="greedy"), "--alg='greedy'"),
    (dict(top_p=1.5), "--top_p=1.5"),
    (dict(temperature=-1.0), "--temperature=-1.0"),
    # Before: compiled, and reported as "temperature nan".
    (dict(temperature=float("nan")), "--temperature=nan must be a finite"),
    (dict(temperature=float("inf")), "--temperature=inf must be a finite"),
    (dict(cache="full"), "--cache='full': choose from none, prefix, dual"),
    (dict(cache="dual", block_length=0), "--block_length=0"),
    (dict(cache="dual", max_new_tokens=48, steps=48, block_length=32),
     "--block_length=32: must divide max_new_tokens=48"),
    (dict(cache="dual", threshold=1.5), "--threshold=1.5"),
    (dict(threshold=0.9), "--threshold=0.9: parallel decoding needs --cache"),
    (dict(cache="prefix", steps=3), "--steps=3: must be a multiple"),
    (dict(cache="dual", alg="origin"), "--alg='origin': cached decoding"),
    (dict(fast_dllm=True),
     "--fast_dllm: Fast-dLLM's block rules need --cache"),
    (dict(cache="dual", fast_dllm=True, alg="maskgit_plus"),
     "--alg='maskgit_plus': with fast_dllm"),
])
def test_bad_sample_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    sample_program.check_settings(aot.SampleSettings(**{"batch": 4, **kwargs}))


def test_sample_mode_needs_a_dream_config():
  with pytest.raises(ValueError, match="--mode=sample"):
    aot.compile_report(sudoku_config(), aot.parse_topology("v4-8"), 1,
                       sudoku.dataset_metadata(1), aot.SampleSettings(4))


# Each case is a fork of `aot_cli` (a process that loads jax, but those
# trm.aot refuses before: --mode and the flags of the other mode). --alg,
# --cache and --threshold take the path of --steps=0 (the sampler's
# ValueError as one usage line); test_bad_sample_settings checks their
# messages.
@pytest.mark.parametrize("args, match", [
    (["--mode=sample", "--steps=0"], "--steps=0 must be a positive"),
    (["--mode=sample", "--alg=fast"], "--alg='fast': choose from"),
    (["--mode=sample", "--seq_len=64"], "--seq_len only apply to --mode=train"),
    (["--prompt_len=64"], "--prompt_len only apply to --mode=sample"),
    (["--cache=dual"], "--cache only apply to --mode=sample"),
    (["--mode=sample", "--cache=full"], "--cache='full': choose from"),
    (["--mode=sample", "--cache=dual", "--block_length=48"],
     "--block_length=48: must divide max_new_tokens=512"),
    (["--mode=sample", "--cache=dual", "--threshold=0"],
     "--threshold=0.0: must lie in (0, 1]"),
    (["--mode=decode"], "--mode"),
    (["--mode=sample", "--config=configs/trm_sudoku.py:cpu"],
     "model family 'trm' has no sampler"),
])
def test_cli_rejects_bad_sample_flags(args, match, aot_cli):
  result = aot_cli.run(
      ["--config=configs/diffucoder_7b.py:tiny", "--topology=v4-8", *args],
      cwd=ROOT, timeout=600)
  assert result.returncode != 0
  assert match in result.stderr, result.stderr[-2000:]
  assert "verdict" not in result.stdout


@pytest.mark.parametrize("config_file, arg, shapes", [
    ("trm_sudoku.py", None, (81, 11, 1)),
    ("trm_maze.py", None, (900, 6, 1)),
    ("trm_arc.py", "arc1", (900, 12, 876406)),
    ("trm_arc.py", "arc1,cpu", (900, 12, None)),
])
def test_dataset_shapes_of_every_puzzle_config(config_file, arg, shapes):
  config = config_lib.load_config(
      os.path.join(ROOT, "configs", config_file), arg)
  metadata = aot.data_shapes(config, {})
  seq_len, vocab, puzzles = shapes
  assert (metadata.seq_len, metadata.vocab_size) == (seq_len, vocab)
  if puzzles is not None:
    assert metadata.num_puzzle_identifiers == puzzles
