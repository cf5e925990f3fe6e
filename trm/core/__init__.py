"""trm/core."""
