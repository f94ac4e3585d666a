"""searchrl.rewards."""
