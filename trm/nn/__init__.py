"""trm/nn."""
