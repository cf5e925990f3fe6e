"""The TRM family's Program (`trm.families.trm.program`)."""
import os

import pytest
import repo

from trm.core import config_lib
from trm.core import mfu
from trm.families.trm import program as trm_program


@pytest.mark.parametrize("dtype,h100_peak", [("bfloat16", 989e12),
                                             ("float32", 67e12)])
def test_mfu_divides_by_the_peak_of_the_forward_dtype(dtype, h100_peak):
  """The trainer's MFU takes its peak from `Program.compute_dtype`: a TRM
  computing in bfloat16 (every paper config) was divided by the float32
  peak, 67 instead of 989 TFLOP/s on an H100."""
  config = config_lib.load_config(
      os.path.join(repo.ROOT, "configs", "trm_sudoku.py"), "cpu")
  config.model.forward_dtype = dtype
  shapes = trm_program.data_shapes(config, {})
  program = trm_program.build(config, None, shapes)
  assert program.compute_dtype == dtype
  assert mfu.published_peak_flops("NVIDIA H100 80GB HBM3",
                                  program.compute_dtype) == h100_peak
