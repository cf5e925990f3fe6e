"""Paths the tests share: the repository root (configs, benchmarks, data)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
