"""searchrl.rl: the RL core. Advantages, losses and KL are pure, jit-able functions on [B, T] arrays
(`advantages`, `losses`, `kl`); `ppo.learn` is one RL step as one jitted, sharded program; `trainer` is the
host loop around it, `sft` the supervised cold start. Their settings are `config` (importable without JAX)."""
