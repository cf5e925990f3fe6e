"""The family registry: names, lazy lookup, and naming a checkpoint's family."""
import pytest

from trm import families


def test_every_family_has_both_builders():
  for name in ("trm", "dream", "gpt"):
    assert name in families.names()
    assert callable(families.program(name).build)
    assert callable(families.task(name).build)


def test_an_unknown_name_is_one_clear_line(monkeypatch):
  # Only the built-in families: a test run in the same worker may have
  # registered the toy family (tests/families/toy) already.
  monkeypatch.setattr(families, "_FAMILIES", {
      name: package for name, package in families._FAMILIES.items()
      if package.startswith("trm.families.")})
  with pytest.raises(ValueError, match="config.model.name='llama' is not a "
                     "known model family; known: 'dream', 'gpt', 'trm'"):
    families.program("llama")


@pytest.mark.parametrize("paths, name", [
    (["params/L_level/layers_0/mlp/gate_up_proj/kernel", "params/embed_tokens",
      "carry/z_H", "ema_params/lm_head/kernel"], "TRM (puzzle)"),
    (["params/embed_tokens", "params/layers/mlp/down_proj/kernel",
      "opt_state/0/mu"], "DiffuCoder/Dream"),
    (["params/wte/embedding", "params/h_0/attn/c_attn/kernel"], "GPT"),
    (["params/something_else"], None),
])
def test_a_checkpoint_is_named_by_its_tensor_paths(paths, name):
  assert families.name_of_state(paths) == name


def test_registering_twice_under_another_package_is_refused():
  with pytest.raises(ValueError, match="already registered"):
    families.register("gpt", "somewhere.else")


def test_a_family_registered_at_a_missing_package_is_one_clear_line(
    monkeypatch):
  # Registered for this test only: name_of_state asks every family.
  monkeypatch.setitem(families._FAMILIES, "nowhere", "no_such_package_for_trm")  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="'nowhere' is registered as package "
                     "'no_such_package_for_trm', but "
                     "no_such_package_for_trm.program cannot be imported"):
    families.program("nowhere")
