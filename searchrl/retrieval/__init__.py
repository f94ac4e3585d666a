"""searchrl.retrieval."""
