"""Mesh-sharded training of Tiny Recursive Models (and friends) in JAX."""
