"""searchrl.data."""
