"""searchrl.rollout."""
