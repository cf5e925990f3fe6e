"""trm/families."""
