"""trm/families/dream."""
