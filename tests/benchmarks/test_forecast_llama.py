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


@pytest.mark.parametrize("flags, message", [
    (["--run=v5e,v4"], "--run: unknown ['v4']"),
    (["--efficiency=0"], "--efficiency=0.0: a fraction of peak"),
    (["--efficiency=1.5"], "--efficiency=1.5: a fraction of peak"),
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
