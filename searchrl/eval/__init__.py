"""searchrl.eval."""
