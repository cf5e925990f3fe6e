"""A test-only model family: the "add a model family" recipe, proven.

Registered by `toy_config.py` (`families.register`), it trains through
`trm.main` and compiles with `trm.aot` with no edit to `trm/`.
"""
