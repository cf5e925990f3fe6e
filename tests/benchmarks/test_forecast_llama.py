"""benchmarks/forecast/forecast_llama.py: the GPT it forecasts has
Llama2-70B's weight matmuls, its MaxText count is MaxText's, and bad flags
stop before anything compiles."""
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import repo
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trm.core.topology import parse_topology
from trm.core.topology import topology_devices
from trm.forecast import network
from trm.forecast import timeline
from trm.nn import tpu_attention


@pytest.fixture(scope="module")
def script():
  return repo.load_script("benchmarks", "forecast", "forecast_llama.py")


def test_the_proxy_mlp_carries_what_swiglu_holds(script):
  # Llama2-70B: q|k|v 8192 x (64 + 2 x 8) x 128, output 8192^2, three
  # 8192 x 28672 MLP matmuls = 855.6M per layer; a GPT with Llama's GQA
  # attention (n_kv_head 8) needs an MLP of 2 x 8192 x 43008 for the same.
  assert script.llama_layer_params() == 855_638_016
  assert script.proxy_mlp_size() == 43_008 == 3 * 28_672 // 2
  assert (8192 * 80 * 128 + 8192**2 + 2 * 8192 * 43_008
          == script.llama_layer_params())


def test_the_proxys_flop_count_is_maxtexts_llama_count(script):
  # MaxText's Llama count (its 2024 count: attention not halved) of the
  # v5e run against the nanoGPT 6 N T + 12 L H Q T^2 count of the GPT the
  # script compiles: the same step to 1e-4 (LayerNorm and position-table
  # parameters are the difference).
  theirs = script.maxtext_flops_per_chip(2, 2048, causal=False)
  assert theirs == pytest.approx(1754.666e12, rel=1e-6)
  config = script.config_for(script.RUNS["v5e"])
  ours = script.forecast_maxtext.maxtext_flops_per_chip(config, 2, True)
  assert ours == pytest.approx(theirs, rel=1e-4)
  assert (config.global_batch_size, config.block_size,
          config.model.remat_policy) == (512, 2048, "full")
  # k and v have Llama2-70B's 8 heads; GPT-3 (below) keeps one per head.
  assert (config.n_head, config.model.n_kv_head) == (64, 8)
  # Since 2025 MaxText halves the attention term (the tiering page's row).
  assert script.maxtext_flops_per_chip(4, 4096, causal=True) < \
      script.maxtext_flops_per_chip(4, 4096, causal=False)


def test_the_v6e_rows_are_maxtexts_logged_steps(script):
  # tpu-recipes' 2024-10 log: 17.373 s a step, 419.193 TFLOP/s per chip at
  # 4 x 4096 per chip; its 2025-03 log (the tiering page's 43.8%): 9.052 s,
  # 402.274 at 2 x 4096. Both in MaxText's count before PR #1988
  # (attention not halved); halved, the 2024 row would read 404.0.
  for name, seconds, logged in (("v6e", 17.373, 419.193),
                                ("v6e2025", 9.052, 402.274)):
    run = script.RUNS[name]
    theirs = script.maxtext_flops_per_chip(run["per_chip"], run["seq"],
                                           run["causal"])
    assert theirs / seconds / 1e12 == pytest.approx(logged, rel=1e-4)
    assert run["mfu"] == pytest.approx(100 * logged / 918, abs=0.05)  # 43.8
    assert run["per_chip"] * run["seq"] / seconds == pytest.approx(
        {"v6e": 943.086, "v6e2025": 905.021}[name], rel=1e-4)
  halved = script.maxtext_flops_per_chip(4, 4096, causal=True)
  assert halved / 17.373 / 1e12 == pytest.approx(404.0, abs=0.1)
  # The compiled GPT: 256 chips x 4 sequences of 4096, full remat (as
  # MaxText's run), MaxText's Trillium flags; the nanoGPT count of it is
  # MaxText's to 1e-4.
  config = script.config_for(script.RUNS["v6e"])
  assert (config.global_batch_size, config.block_size,
          config.model.remat_policy) == (1024, 4096, "full")
  assert "--xla_tpu_scoped_vmem_limit_kib=98304" in \
      config.tpu_compiler_options
  ours = script.forecast_maxtext.maxtext_flops_per_chip(config, 4, True)
  assert ours == pytest.approx(
      script.maxtext_flops_per_chip(4, 4096, causal=False), rel=1e-4)
  # The v5e and v5p rows keep maxtext64b's flags (MaxText's v5e ones).
  assert "scoped_vmem" not in script.config_for(
      script.RUNS["v5e"]).tpu_compiler_options


@pytest.mark.parametrize("flags, message", [
    (["--run=v5e,v4"], "--run: unknown ['v4']"),
    (["--run=v6e,v7"], "--run: unknown ['v7']"),
    (["--efficiency=0"], "--efficiency=0.0: a fraction of peak"),
    (["--efficiency=1.5"], "--efficiency=1.5: a fraction of peak"),
    (["--efficiency=0.8,nan"], "--efficiency=nan: a fraction of peak"),
    (["--efficiency=0.8,x"], "--efficiency=0.8,x: fractions of peak"),
    (["--splash_factor=0"], "--splash_factor=0.0: a multiple"),
    (["--splash_factor=nan"], "--splash_factor=nan: a multiple"),
    (["--splash_factor=100"], "--splash_factor=100.0: a multiple"),
    (["--per_chip=0"], "--per_chip=0: sequences per chip"),
    # Before: an MLIR TypeError traceback once the compile began.
    ([f"--per_chip={10**23}"], f"--per_chip={10**23}: sequences per chip, 1 "
     "to 2147483647"),
    (["--json="], "--json='': name a file to write the rows to"),
    (["--json=/"], "--json='/': name a file to write the rows to"),
    (["--json=/dev/null/rows.json"], "--json=/dev/null/rows.json: /dev/null "
     "is a file, so nothing can be written under it"),
])
def test_bad_flags_stop_before_compiling(script, monkeypatch, flags,
                                         message):
  """Also --json, written after the compiles: a path it cannot write
  was a traceback after minutes of compiling."""
  monkeypatch.setattr(script.plan, "compile_row", lambda *a: pytest.fail(
      "compiled before checking its flags"))
  with pytest.raises(SystemExit, match=message.replace("[", r"\[")
                     .replace("]", r"\]").replace(".", r"\.")):
    script.main(flags)


def test_a_json_that_is_a_fifo_or_a_size_too_big_is_one_line(
    script, monkeypatch, tmp_path):
  """--json naming a FIFO (standing in for /dev/null) was taken, its write
  refused after the compiles; --per_chip=2**30 ended in array_sizes'
  ValueError as a traceback."""
  os.mkfifo(tmp_path / "fifo")
  monkeypatch.setattr(script.plan, "compile_row", lambda *a: pytest.fail(
      "compiled before checking its flags"))
  with pytest.raises(SystemExit, match="name a file to write the rows to"):
    script.main([f"--json={tmp_path / 'fifo'}"])

  def too_big(*args):
    raise ValueError("The train step holds an array of [80, 1] bf16")

  monkeypatch.setattr(script.plan, "compile_row", too_big)
  with pytest.raises(SystemExit, match=r"^forecast_llama\.py: v5e: The "
                     r"train step holds an array"):
    script.main(["--run=v5e", f"--per_chip={2**30}"])


def test_the_gpt3_row_is_maxtexts_logged_step(script):
  # tpu-recipes' GPT3-175B bf16 log on one v6e-256 (MaxText
  # tpu-recipes-v0.1.2): 17.182 s a step, 384.891 TFLOP/s and 357.580
  # tokens/s per chip at 3 x 2048 per chip, attention not halved. GPT-3
  # is a GPT, so the compiled model is GPT-3's own: 96 x 12288, 96 heads
  # of 128, MLP 49152, vocabulary 50304, whose nanoGPT count is MaxText's.
  run = script.RUNS["v6e_gpt3"]
  gpt3 = run["model"]
  assert script.llama_layer_params(gpt3) == 4 * 12288**2 + 2 * 12288 * 49152
  assert script.proxy_mlp_size(gpt3) == 49152
  theirs = script.maxtext_flops_per_chip(run["per_chip"], run["seq"],
                                         run["causal"], gpt3)
  assert theirs / 17.182 / 1e12 == pytest.approx(384.891, rel=1e-4)
  assert run["per_chip"] * run["seq"] / 17.182 == pytest.approx(357.580,
                                                                 rel=1e-4)
  assert run["mfu"] == pytest.approx(41.93, abs=0.005)
  config = script.config_for(run)
  assert (config.global_batch_size, config.block_size, config.n_layer,
          config.n_embd, config.n_head, config.model.head_size,
          config.model.mlp_size, config.model.vocab_size,
          config.model.remat_policy) == (768, 2048, 96, 12288, 96, 128,
                                         49152, 50304, "full")
  assert config.model.n_kv_head == 0
  ours = script.forecast_maxtext.maxtext_flops_per_chip(config, 3, True)
  assert ours == pytest.approx(theirs, rel=1e-4)
  flags = config.tpu_compiler_options
  assert flags.startswith(script.FLAGS["trillium"])
  assert "--xla_tpu_use_bundle_aware_cost_model_for_fusions=false" in flags
  assert "--xla_tpu_enable_data_parallel_all_reduce_opt=true" in flags
  # The Llama rows keep Llama2-70B.
  assert script.config_for(script.RUNS["v6e"]).n_layer == 80


def test_several_efficiencies_share_one_compile(script, monkeypatch,
                                                capsys):
  compiles, played = [], []
  monkeypatch.setattr(script.plan, "compile_row",
                      lambda *a: compiles.append(a) or "compiled")

  def forecast_row(compiled, topology, efficiency):
    del topology
    played.append((compiled, efficiency))
    return {"step_seconds": 1.0 / efficiency, "chips": 256, "fits": True,
            "memory_gib": 20.0,
            "seconds_by_cause": {"compute": 0.5 / efficiency}}
  monkeypatch.setattr(script.plan, "forecast_row", forecast_row)
  script.main(["--run=v6e", "--efficiency=0.8,0.5"])
  assert len(compiles) == 1
  assert played == [("compiled", 0.8), ("compiled", 0.5)]
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.split()[:1] == ["v6e"]]
  assert [line.split()[1] for line in lines] == ["0.8000", "0.5000"]


@pytest.mark.parametrize("name, seconds, logged, tokens", [
    # tpu-recipes' Llama 3.1 logs on one v6e-256 at 8192: MaxText
    # tpu-recipes-v0.1.2 (its listed batch says 5 per chip; the logged
    # tokens, 948.086 x 34.562 = 32768, say 4) and v0.1.4.
    ("v6e_l70b_8k", 34.562, 456.442, 948.086),
    ("v6e_l70b_8k_b5", 42.656, 462.297, 960.248),
    ("v6e_l8b_8k", 4.546, 417.397, 7207.336),
    # The same models on v6e-128, -64, -32 and -8 (v0.1.4).
    ("v6e128_l70b_8k", 34.786, 453.500, 941.976),
    ("v6e64_l70b_8k", 18.688, 422.091, 876.736),
    ("v6e32_l70b_8k", 17.790, 443.385, 920.965),
    ("v6e128_l8b_8k", 4.602, 412.319, 7119.648),
    ("v6e32_l8b_8k", 3.495, 407.225, 7031.689),
    ("v6e8_l8b_8k", 3.443, 413.433, 7138.890),
])
def test_the_llama31_rows_are_maxtexts_logged_steps(script, name, seconds,
                                                    logged, tokens):
  run = script.RUNS[name]
  model = run["model"]
  theirs = script.maxtext_flops_per_chip(run["per_chip"], run["seq"],
                                         run["causal"], model)
  assert theirs / seconds / 1e12 == pytest.approx(logged, rel=2e-4)
  assert run["per_chip"] * run["seq"] / seconds == pytest.approx(
      tokens, rel=2e-4)
  assert run["mfu"] == pytest.approx(100 * logged / 918, abs=1e-9)
  # Halved (MaxText's count since PR #1988), no row would match its log.
  assert script.maxtext_flops_per_chip(
      run["per_chip"], run["seq"], True, model) / seconds / 1e12 < \
      0.94 * logged
  config = script.config_for(run)
  assert (config.block_size, config.n_layer, config.n_embd,
          config.model.vocab_size) == (8192, model["n_layer"], model["emb"],
                                       128256)
  chips = int(run["topology"].split("-")[1])
  assert config.global_batch_size == chips * run["per_chip"]
  # The 8B's GPT: GQA's 4096 x 48 x 128 + 4096^2 + 2 x 4096 x 21504 =
  # Llama 3.1 8B's layer.
  assert config.model.mlp_size == {80: 43008, 32: 21504}[model["n_layer"]]
  assert config.model.n_kv_head == 8
  ours = script.forecast_maxtext.maxtext_flops_per_chip(
      config, run["per_chip"], True)
  assert ours == pytest.approx(theirs, rel=1e-4)
  # MaxText's tile in every pass (sa_block_* = 2048); other rows keep ours.
  assert config.model.splash_block == 2048
  assert script.config_for(script.RUNS["v6e"]).model.splash_block == 0
  # remat_policy=custom as the runs had it: the layer input and q, k, v
  # offloaded to the host, for the 8B also attention's output projection;
  # the other rows keep full remat.
  offload = "decoder_layer_input,query_proj,key_proj,value_proj" + (
      ",out_proj" if model["n_layer"] == 32 else "")
  assert (config.model.remat_policy, config.model.remat_offload,
          config.model.remat_save) == ("custom", offload, "")
  assert script.config_for(script.RUNS["v6e"]).model.remat_policy == "full"
  flags = config.tpu_compiler_options
  assert flags.startswith(script.FLAGS["trillium"])
  assert "--xla_tpu_assign_all_reduce_scatter_layout=true" in flags
  assert "--xla_tpu_enable_data_parallel_all_reduce_opt=true" in flags
  # The v6e-32 and v6e-8 runs disabled collective matmuls; only the 70B's
  # stored bfloat16 weights.
  no_cm = "--xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000"
  assert (no_cm in flags) == (run["topology"] in ("v6e-32", "v6e-8"))
  assert config.model.param_dtype == (
      "bfloat16" if name == "v6e32_l70b_8k" else "float32")
  # The head's gradient summed once (MaxText's one logits matmul); the
  # Llama2 and GPT-3 rows keep the per-chunk default.
  assert config.loss_reduce_once
  assert not script.config_for(script.RUNS["v6e"]).loss_reduce_once


def test_a_splash_factor_stretches_the_kernels_seconds_only(
    script, monkeypatch, capsys, tmp_path):
  """--splash_factor=F adds (F - 1) x the splash kernels' seconds to the
  step: 2 s of kernels in a 10 s step at F=3 is a 14 s step."""
  monkeypatch.setattr(script.plan, "compile_row", lambda *a: "compiled")
  monkeypatch.setattr(script.plan, "forecast_row", lambda *a: {
      "step_seconds": 10.0, "chips": 256, "fits": True, "memory_gib": 20.0,
      "seconds_by_cause": {"compute": 8.0}})
  monkeypatch.setattr(script, "splash_seconds", lambda *a: 2.0)
  out = tmp_path / "rows.json"
  script.main(["--run=v6e_l8b_8k", "--splash_factor=3",
               f"--json={out}"])
  (row,) = __import__("json").loads(out.read_text())
  run = script.RUNS["v6e_l8b_8k"]
  theirs = script.maxtext_flops_per_chip(4, 8192, False, run["model"])
  assert row["forecast_mfu"] == pytest.approx(100 * theirs / 918e12 / 10)
  assert row["splash_scaled_mfu"] == pytest.approx(
      100 * theirs / 918e12 / 14)
  assert row["splash_seconds"] == 2.0
  line = next(line for line in capsys.readouterr().out.splitlines()
              if line.startswith("v6e_l8b_8k "))
  assert f"{row['splash_scaled_mfu']:.2f}" in line.split()


def test_per_chip_compiles_a_stand_in_batch(script, monkeypatch, capsys):
  """The 70B rows at 8192 do not compile at their batch (MaxText offloads
  each layer's input to the host; our GPT keeps it in HBM): --per_chip
  compiles fewer sequences, the published MFU stays the run's, and the
  line says so."""
  configs = []
  monkeypatch.setattr(script.plan, "compile_row",
                      lambda config, *a: configs.append(config) or "c")
  monkeypatch.setattr(script.plan, "forecast_row", lambda *a: {
      "step_seconds": 10.0, "chips": 256, "fits": True, "memory_gib": 20.0,
      "seconds_by_cause": {"compute": 8.0}})
  monkeypatch.setattr(script, "splash_seconds", lambda *a: None)
  script.main(["--run=v6e_l70b_8k", "--per_chip=2"])
  assert configs[0].global_batch_size == 512
  out = capsys.readouterr().out
  assert "v6e_l70b_8k: compiled at 2 sequences per chip, published at 4" \
      in out
  theirs = script.maxtext_flops_per_chip(2, 8192, False,
                                         script.LLAMA31_70B)
  row = next(line.split() for line in out.splitlines()
             if line.startswith("v6e_l70b_8k "))
  assert float(row[6]) == pytest.approx(49.7, abs=0.05)  # the run's
  assert float(row[7]) == pytest.approx(100 * theirs / 918e12 / 10,
                                        abs=0.01)


def test_a_sum_over_the_chip_that_xla_compiled_is_marked(
    script, monkeypatch, capsys):
  """GPT-3 175B's step on v6e-256: 35.56 GiB in sum, compiled for the
  chip's 31.25. The row fits (XLA's verdict); its GiB is starred and a
  line under it says why."""
  monkeypatch.setattr(script.plan, "compile_row", lambda *a: "compiled")
  monkeypatch.setattr(script.plan, "forecast_row", lambda *a: {
      "step_seconds": 16.0, "chips": 256, "fits": True, "memory_gib": 35.56,
      "chip_hbm_gib": 31.25, "seconds_by_cause": {"compute": 11.0}})
  monkeypatch.setattr(script, "splash_seconds", lambda *a: None)
  script.main(["--run=v6e_gpt3"])
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("v6e_gpt3 ")]
  assert lines[0].split()[3:5] == ["yes", "35.56*"]
  assert lines[1].startswith("v6e_gpt3 * the sum of arguments, outputs and "
                             "temporaries (GiB/chip) is over the chip's "
                             "31.25 GiB, and XLA:TPU compiled the step for "
                             "it")


@pytest.mark.usefixtures("no_compilation_cache")
def test_splash_seconds_are_the_kernels_roofline_time(script):
  """The splash column sums the forward, dq and dkv kernels of a compiled
  step at the charged rate, and nothing else (not the matmul beside
  them): causal 1,024 x 1,024 in 512-blocks computes 3 of 4 blocks."""
  topology = parse_topology("v4-8")
  mesh = jax.sharding.Mesh(np.array([topology_devices(topology, 1)[0]]),
                           ("data",))
  q = jax.ShapeDtypeStruct((2, 1024, 4, 128), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P()))
  w = jax.ShapeDtypeStruct((512, 8192), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P()))

  def loss(q, k, v, w):
    out = tpu_attention.splash_attention(q, k, v, None, causal=True)
    beside = q.reshape(-1, 512) @ w   # 17 GFLOP (2.4x the kernels)
    return out.astype(jnp.float32).sum() + beside.astype(jnp.float32).sum()

  compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
      q, q, q, w).compile()
  program = timeline.Program(compiled.as_text(),
                             network.Fabric.for_mesh(mesh, topology, 1))
  efficiency = 0.25
  seconds = script.splash_seconds(types.SimpleNamespace(program=program),
                                  topology, efficiency)
  flops = 2 * (2 + 3 + 4) * 2 * 4 * 128 * 3 * 512 * 512
  at_rate = flops / (topology.chip.peak_bf16_tflops * 1e12 * efficiency)
  assert at_rate <= seconds < 1.1 * at_rate
  assert script.splash_seconds(types.SimpleNamespace(program=None),
                               topology, efficiency) is None
