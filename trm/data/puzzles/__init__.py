"""trm/data/puzzles."""
