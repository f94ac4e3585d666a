"""`config.demo` of the DeepRetrieval miniature (no JAX here: building a config stays instant)."""
from __future__ import annotations

from searchrl.configlib import group, ranged


@group
class RewriteDemoConfig:
    """The DeepRetrieval miniature: its world (`searchrl.tasks.deepretrieval.world`), cold start and seeds."""

    concepts_per_kind: int = ranged(24, "[1, inf)")  # conditions and treatments; a topic pairs one of each
    # technical words the cold start considers per user word (one is right)
    num_candidates: int = ranged(4, "[1, inf)")
    vocab_size: int = ranged(1200, "[1, inf)")  # of the BPE tokenizer trained on the world: a token a word
    sft_samples: int = ranged(4, "[1, inf)")  # cold-start rewrites drawn per training question
    # whole runs (world, model, cold start, RL), one per seed
    seeds: tuple[int, ...] = ranged((0, 1), "[0, inf)")
    # seeds run side by side, each in a process of its own (results.run_seeds)
    parallel_seeds: int = ranged(1, "[1, inf)")
