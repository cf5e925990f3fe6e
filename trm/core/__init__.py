"""The family-independent framework: loop, mesh, state, checkpoints, data feed.

Nothing here imports a model family; `trm.families` hands the loop a Task.
"""
from trm.core import tf_free as _tf_free

# Before any module of ours (or a user's) imports `clu.metric_writers`.
_tf_free.install()
