"""trm/data/text."""
