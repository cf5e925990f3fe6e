"""Tiny Recursive Model on puzzles (Sudoku, Maze, ARC): upstream TRM, in JAX."""
