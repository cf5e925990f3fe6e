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


def test_trm_importer_refuses_a_nonfinite_safetensors_file(tmp_path):
  """torch_import reads .safetensors through weights_io: a TRM checkpoint
  with a NaN stops before any shape is matched."""
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  w = np.zeros((4, 4), np.float32)
  w[0, 0] = np.nan
  path = _file(tmp_path, **{"_orig_mod.model.inner.lm_head.weight": w})
  with pytest.raises(weights_io.CheckpointError,
                     match="'_orig_mod.model.inner.lm_head.weight'"):
    torch_import._read(path)  # pylint: disable=protected-access


def test_trm_importer_refuses_a_nonfinite_torch_file(tmp_path):
  """The same refusal for a torch.save file (upstream's own format), which
  was loaded with its NaN while the .safetensors copy was refused."""
  torch = pytest.importorskip("torch")
  from trm.families.trm import torch_import  # pylint: disable=g-import-not-at-top
  w = torch.zeros(4, 4)
  w[1, 2] = float("inf")
  path = str(tmp_path / "step_1")
  torch.save({"_orig_mod.model.inner.lm_head.weight": w}, path)
  with pytest.raises(weights_io.CheckpointError) as info:
    torch_import._read(path)  # pylint: disable=protected-access
  message = str(info.value)
  assert "'_orig_mod.model.inner.lm_head.weight'" in message
  assert path in message and "holds 1 NaN or Inf" in message
  assert "\n" not in message
