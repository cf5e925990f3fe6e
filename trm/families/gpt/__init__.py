"""trm/families/gpt."""
