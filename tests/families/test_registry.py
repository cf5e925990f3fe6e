"""The family registry: names, lazy lookup, and naming a checkpoint's family."""
import logging
import os

import pytest
import repo

from trm import families
from trm.core import config_lib
from trm.core import mesh as mesh_lib


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


@pytest.mark.parametrize("config_file, arg, heads", [
    ("gpt.py", "shakespeare_char_cpu", {"n_head": 2}),
    ("diffucoder_7b.py", "tiny", {"num_attention_heads": 4}),
    ("trm_arc.py", "cpu", {"num_heads": 2}),
    ("trm_maze.py", "cpu", {"num_heads": 2}),
])
def test_heads_a_model_axis_does_not_divide_are_named_once(
    config_file, arg, heads, caplog):
  """Each family's heads, read from its own config fields: a mesh.model
  wider than them (GPT's n_head=2 on model=8) said nothing of the heads
  (the shared line that `trm.main` and `trm.aot` log before compiling)."""
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", config_file), arg)
  (field, count), = heads.items()
  config = config_lib.set_values(config, {
      f"model.{field}": count, "mesh.data": 1, "mesh.fsdp": 1,
      "mesh.model": 8})
  ctx = mesh_lib.ShardingContext.from_config(config)
  families._warn_once.cache_clear()  # pylint: disable=protected-access
  with caplog.at_level(logging.WARNING):
    line = families.warn_if_heads_unsplit(config, ctx)
    # trm.aot asks once a slice count (and --forecast once a row).
    assert families.warn_if_heads_unsplit(config, ctx) == line
  assert line.startswith(f"config.model.{field}={count} is not a multiple "
                         "of config.mesh.model=8"), line
  assert caplog.text.count("is not a multiple of") == 1
  # A model axis that divides the heads: nothing to say.
  config.mesh.update(data=8 // count, model=count)
  ctx = mesh_lib.ShardingContext.from_config(config)
  assert families.warn_if_heads_unsplit(config, ctx) is None


def test_heads_of_a_model_without_attention_are_not_checked():
  """TRM's MLP-t mixes tokens with an MLP: its num_heads is unused."""
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "trm_sudoku.py"), "cpu")
  assert config.model.mlp_t
  config.mesh.update(data=1, fsdp=1, model=8)
  ctx = mesh_lib.ShardingContext.from_config(config)
  assert families.warn_if_heads_unsplit(config, ctx) is None
