"""The family-independent framework: loop, mesh, state, checkpoints, data feed.

Nothing here imports a model family; `trm.families` hands the loop a Task.
"""
