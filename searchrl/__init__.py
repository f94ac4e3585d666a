"""searchrl: reinforcement learning for LLM search agents, in JAX."""

__version__ = "0.1.0"
