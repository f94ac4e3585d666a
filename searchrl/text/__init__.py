"""searchrl.text."""
