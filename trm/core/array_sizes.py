"""Arrays no machine can hold, found in a lowered program before XLA
compiles it: XLA aborts the whole process (a C++ CHECK, exit 134) on a
shape whose size overflows, so `--config.block_size=1000000000` or a
prompt of 10^8 tokens ended in a core dump instead of a line naming
the sizes."""

import re

# One pebibyte: more than a whole v5p pod's memory (8,960 chips x 95 GiB),
# and 2**13 below 2**63 bytes, so that XLA:TPU's layouts, which pad the two
# minor dimensions to 8 x 128 (f32[8,2,L,L] was checked as f32[8,128,L,L]),
# cannot overflow.
LIMIT_BYTES = 2**50

_TENSOR = re.compile(r"tensor<((?:\d+x)+)([a-zA-Z]+(\d+)[\w]*)>")


def largest_array(module_text: str) -> tuple[list[int], str, int] | None:
  """(shape, element type, bytes) of the largest array in a StableHLO
  module's text, or None when it has no ranked array."""
  largest = None
  for match in _TENSOR.finditer(module_text):
    dims = [int(d) for d in match.group(1).split("x")[:-1]]
    size = max(1, int(match.group(3)) // 8)
    for d in dims:
      size *= d
    if largest is None or size > largest[2]:
      largest = (dims, match.group(2), size)
  return largest


def check_lowered(lowered, what: str, fix: str) -> None:
  """Raises ValueError naming the array when `lowered` (a `jax.stages.
  Lowered`) holds one of LIMIT_BYTES or more; `what` names the program
  ('the train step'), `fix` the sizes to lower."""
  largest = largest_array(lowered.as_text(debug_info=False))
  if largest is not None and largest[2] >= LIMIT_BYTES:
    shape, dtype, size = largest
    raise ValueError(
        f"{what} holds an array of {shape} {dtype} ({size / 2**50:.3g} PiB), "
        f"more than any machine holds (XLA would abort the process on it); "
        f"{fix}.")


def check_abstract(tree, what: str, fix: str) -> None:
  """As `check_lowered`, for a tree of abstract arrays (`jax.eval_shape`'s
  ShapeDtypeStructs) before anything is lowered: an initialiser drawing
  2**64 or more random values fails while lowering with JAX's bare
  NotImplementedError traceback."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  largest = None
  for leaf in jax.tree.leaves(tree):
    shape = getattr(leaf, "shape", None)
    if shape is None:
      continue
    # A typed PRNG key's dtype (key<fry>) is no numpy dtype, but it has
    # an itemsize and a name as numpy's do.
    dtype = leaf.dtype if hasattr(leaf.dtype, "itemsize") else np.dtype(
        leaf.dtype)
    # Python ints: np.prod would wrap at 2**63.
    size = dtype.itemsize
    for d in shape:
      size *= int(d)
    if largest is None or size > largest[2]:
      largest = (list(shape), str(dtype), size)
  if largest is not None and largest[2] >= LIMIT_BYTES:
    shape, dtype, size = largest
    raise ValueError(
        f"{what} holds an array of {shape} {dtype} ({size / 2**50:.3g} PiB), "
        f"more than any machine holds; {fix}.")
