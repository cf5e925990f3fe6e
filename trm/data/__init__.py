"""Dataset builders and input pipelines."""
