"""searchrl.envs."""
