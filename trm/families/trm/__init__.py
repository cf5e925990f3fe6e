"""trm/families/trm."""
