"""Puzzle datasets in upstream TRM's format: builders, reader, augmentation."""
