"""CLU's metric writers without TensorFlow.

`clu.metric_writers` imports its TensorFlow summary writer when it is
imported, and so does every CLU module that imports it (`periodic_actions`,
for one): 3-4 s of TensorFlow's import in every process that writes
metrics, and a failed import on a host without it (a GPU image: tensorflow
is hundreds of MiB). `install()` puts a stand-in module in that writer's
place whose `SummaryWriter` is `trm.core.metrics.TensorBoardWriter` (the
tensorboard package's event files; TensorFlow's gfile only for a URL log
directory such as gs://). `trm.core` runs it when it is imported, which
`import trm` does, so no module of ours depends on its import order. Only
the standard library here: it runs at `import trm`.
"""
from __future__ import annotations

import sys
import types

# The module of CLU's TensorFlow writer that `clu.metric_writers` imports.
CLU_SUMMARY_WRITER = "clu.metric_writers.summary_writer"


def install() -> bool:
  """Makes `clu.metric_writers` take `TensorBoardWriter` as its
  SummaryWriter; returns whether that writer is (now) the one CLU uses. A
  no-op once `clu.metric_writers` was imported (it then holds whichever
  writer it imported)."""
  module = sys.modules.get(CLU_SUMMARY_WRITER)
  if module is not None:
    return bool(getattr(module, "TRM_TF_FREE", False))
  if "clu.metric_writers" in sys.modules:
    return False
  module = types.ModuleType(
      CLU_SUMMARY_WRITER, "TensorBoard summaries without TensorFlow "
      "(installed by trm.core.tf_free).")
  module.TRM_TF_FREE = True
  cache = {}

  def __getattr__(name):  # pylint: disable=invalid-name
    if name != "SummaryWriter":
      raise AttributeError(f"module {CLU_SUMMARY_WRITER!r} has no attribute "
                           f"{name!r}")
    if name not in cache:
      # By now `clu.metric_writers` asks for it, so its interface exists.
      from trm.core import metrics  # pylint: disable=g-import-not-at-top
      cache[name] = metrics.summary_writer_class()
    return cache[name]

  module.__getattr__ = __getattr__
  sys.modules[CLU_SUMMARY_WRITER] = module
  return True
