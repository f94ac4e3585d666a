"""searchrl.programs."""
