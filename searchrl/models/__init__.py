"""searchrl.models."""
