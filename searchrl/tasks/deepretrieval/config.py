"""`config.demo` of the DeepRetrieval miniature (no JAX here: building a config stays instant)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class RewriteDemoConfig:
    """The DeepRetrieval miniature: its world (`searchrl.tasks.deepretrieval.world`), cold start and seeds."""

    concepts_per_kind: int = 24  # conditions and treatments; a topic pairs one of each
    num_candidates: int = 4  # technical words the cold start considers per user word (one is right)
    vocab_size: int = 1200  # of the BPE tokenizer trained on the world: every word one token
    sft_samples: int = 4  # cold-start rewrites drawn per training question
    seeds: tuple[int, ...] = (0, 1)  # whole runs (world, model, cold start, RL), one per seed
    parallel_seeds: int = 1  # seeds run side by side, each in a process of its own (results.run_seeds)
