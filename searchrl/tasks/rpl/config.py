"""The RPL task's config dataclasses that hold no env: program mutation (`config.env.mutation`) and the
miniature (`config.demo`). No JAX here: building a config stays instant."""
from __future__ import annotations

from searchrl.configlib import group, ranged
from searchrl.rl.config import OptimConfig, SFTConfig


@group
class MutationConfig:
    """`config.env.mutation`: Retrieval Program Learning's program mutation inside an RL run
    (`searchrl.tasks.rpl.distill`)."""

    # the RL step after which mutation and distillation run once (0: never; the paper: 200)
    at_step: int = ranged(0, "[0, inf)")
    episodes: int = ranged(64, "[1, inf)")  # training questions whose programs are rolled out and mutated
    max_variants: int = ranged(64, "[1, inf)")  # single-edit variants verified per program and round
    # of local search: each round mutates the last round's best verified variant
    rounds: int = ranged(1, "[1, inf)")
    # a verified variant shows at most this many documents (the context budget)
    max_shown: int = ranged(10, "[1, inf)")
    keep_unimproved: bool = True  # also distil the programs no edit improves (the paper: variants only)
    # Distil the policy's answers to the kept programs' documents too; False: the program turns alone, the
    # answers left to RL (`searchrl.tasks.rpl.distill`).
    distil_answers: bool = True
    # Answers tried per kept program: the greedy one, then answers sampled as the rollouts sample; the
    # highest-scoring is the trajectory's answer (1: the greedy answer alone).
    answer_samples: int = ranged(1, "[1, inf)")
    sft: SFTConfig = SFTConfig(steps=50, batch_size=8, max_len=1024,
                               optim=OptimConfig(lr=1e-5, warmup_steps=5))


@group
class RPLDemoConfig:
    """The Retrieval Program Learning miniature (`searchrl.tasks.rpl.demo`): GlobalQA tasks over a synthetic world,
    the scripted cold starts of the program and the search policies, and the seeds."""

    # of the synthetic world: enough distinct names for a policy to learn to copy them
    entities: int = ranged(6000, "[1, inf)")
    # passages stating two facts (one fact each keeps observations short)
    pair_fraction: float = ranged(0.0, "[0, 1]")
    test_fraction: float = ranged(0.2, "(0, 1)")  # of the world's entities, and so of its groups, held out
    types: tuple[str, ...] = ("count",)  # GlobalQA task types trained and evaluated
    max_answer: int = ranged(6, "[1, inf)")  # largest group asked about
    # of the BPE tokenizer: held-out names in pieces that training queries write too
    vocab_size: int = ranged(800, "[1, inf)")
    cold_start_top_k: int = ranged(8, "[1, inf)")  # the scripted programs retrieve this many documents
    # and show ranks [i, j): a trajectory each
    cold_start_windows: tuple[tuple[int, int], ...] = ranged(((0, 4),), "[0, inf)")
    # searches of a scripted search trajectory (the plan query, then the value)
    search_turns: int = ranged(2, "[1, inf)")
    eval_questions: int = ranged(128, "[1, inf)")  # held-out tasks evaluated
    prefix_sft: SFTConfig = SFTConfig()  # the first cold-start stage, on prompts and first turns
    # whole runs (world, cold start, RL of every arm), one per seed
    seeds: tuple[int, ...] = ranged((0, 1), "[0, inf)")
    shared_cold_start: bool = False  # one world and cold start (the config's seed) for every seed's RL
    # Seeds run side by side, each in a process of its own (results.run_seeds; not with a shared cold start).
    parallel_seeds: int = ranged(1, "[1, inf)")

    def __post_init__(self):
        if self.shared_cold_start and self.parallel_seeds > 1:
            raise ValueError(f"parallel_seeds={self.parallel_seeds} needs a cold start per seed; "
                             "shared_cold_start=True runs the seeds one after another in one process")
