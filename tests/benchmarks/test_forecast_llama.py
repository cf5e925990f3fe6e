"""benchmarks/forecast/forecast_llama.py: the GPT it forecasts has
Llama2-70B's weight matmuls, its MaxText count is MaxText's, and bad flags
stop before anything compiles."""
import pytest
import repo


@pytest.fixture(scope="module")
def script():
  return repo.load_script("benchmarks", "forecast", "forecast_llama.py")


def test_the_proxy_mlp_carries_what_gqa_and_swiglu_hold(script):
  # Llama2-70B: q|k|v 8192 x (64 + 2 x 8) x 128, output 8192^2, three
  # 8192 x 28672 MLP matmuls = 855.6M per layer; a GPT of 4 x 8192^2
  # attention needs an MLP of 2 x 8192 x 35840 for the same.
  assert script.llama_layer_params() == 855_638_016
  assert script.proxy_mlp_size() == 35_840
  assert 4 * 8192**2 + 2 * 8192 * 35_840 == script.llama_layer_params()


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
