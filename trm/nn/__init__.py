"""Layers shared by the model families, with logical axis names."""
