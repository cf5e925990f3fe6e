"""Weight files holding NaN or Inf are refused at load, naming the tensor,
unless allowed (`trm.core.weights_io`)."""
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from trm.core import weights_io


def _file(tmp_path, **tensors):
  path = str(tmp_path / "w.safetensors")
  save_file(tensors, path)
  return path


@pytest.mark.parametrize("dtype", [np.float32, np.float16,
                                   ml_dtypes.bfloat16])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_tensor_is_refused_naming_it(tmp_path, dtype, bad):
  w = np.ones((3, 4), dtype)
  w[1, 2] = bad
  path = _file(tmp_path, ok=np.ones(2, np.float32), **{"layer.1.w": w})
  with pytest.raises(weights_io.CheckpointError) as info:
    weights_io.read_safetensors(path)
  message = str(info.value)
  assert "\n" not in message
  assert "Tensor 'layer.1.w'" in message and path in message
  assert "holds 1 NaN or Inf value(s) (of 12)" in message
  assert "allow_nonfinite=True" in message
  loaded = weights_io.read_safetensors(path, allow_nonfinite=True)
  assert loaded["layer.1.w"].shape == (3, 4)


def test_finite_and_integer_tensors_load(tmp_path):
  path = _file(tmp_path, w=np.ones((2, 2), np.float32),
               ids=np.array([1, 2], np.int64))
  assert sorted(weights_io.read_safetensors(path)) == ["ids", "w"]


def _trm_state_dict():
  """(config, a zero upstream TRM state_dict of numpy arrays) whose
  names and shapes the importer takes."""
  from trm.families.trm import model as trm_model  # pylint: disable=g-import-not-at-top
  from trm.families.trm import torch_layout  # pylint: disable=g-import-not-at-top
  cfg = trm_model.TRMConfig(
      vocab_size=10, seq_len=16, num_puzzle_identifiers=5, hidden_size=32,
      num_heads=2, expansion=4.0, L_layers=1, H_cycles=1, L_cycles=1,
      halt_max_steps=2, puzzle_emb_ndim=32, puzzle_emb_len=4,
      forward_dtype="float32")
  abstract = torch_layout.abstract(cfg)
  return cfg, {
      "_orig_mod.model.inner." + e.name: np.zeros(torch_layout.upstream_shape(
          e, weights_io.get_path(abstract[e.collection], e.path).shape),
                                                  np.float32)
      for e in torch_layout.entries(cfg)}


def test_trm_importer_refuses_a_nonfinite_safetensors_file(tmp_path):
  """torch_import reads .safetensors through weights_io: a TRM checkpoint
  with a NaN stops, naming the tensor, once its names and shapes are
  matched (before, any tensor is read)."""
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  cfg, state = _trm_state_dict()
  state["_orig_mod.model.inner.lm_head.weight"][0, 0] = np.nan
  path = _file(tmp_path, **state)
  with pytest.raises(weights_io.CheckpointError,
                     match="'_orig_mod.model.inner.lm_head.weight'"):
    torch_import.load_torch_checkpoint(path, cfg)


def test_trm_importer_refuses_a_nonfinite_torch_file(tmp_path):
  """The same refusal for a torch.save file (upstream's own format), which
  was loaded with its NaN while the .safetensors copy was refused."""
  torch = pytest.importorskip("torch")
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  cfg, state = _trm_state_dict()
  state["_orig_mod.model.inner.lm_head.weight"][1, 2] = np.inf
  path = str(tmp_path / "step_1")
  torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)
  with pytest.raises(weights_io.CheckpointError) as info:
    torch_import.load_torch_checkpoint(path, cfg)
  message = str(info.value)
  assert "'_orig_mod.model.inner.lm_head.weight'" in message
  assert path in message and "holds 1 NaN or Inf" in message
  assert "\n" not in message
