"""The RPL task's config dataclasses that hold no env: program mutation (`config.env.mutation`) and the
miniature (`config.demo`). No JAX here: building a config stays instant."""
from __future__ import annotations

import dataclasses

from searchrl.rl.config import OptimConfig, SFTConfig


@dataclasses.dataclass(frozen=True)
class MutationConfig:
    """`config.env.mutation`: Retrieval Program Learning's program mutation inside an RL run
    (`searchrl.tasks.rpl.distill`)."""

    at_step: int = 0  # the RL step after which mutation and distillation run once (0: never; the paper: 200)
    episodes: int = 64  # training questions whose programs are rolled out and mutated
    max_variants: int = 64  # single-edit variants verified per program and round
    rounds: int = 1  # of local search: each round mutates the last round's best verified variant
    max_shown: int = 10  # a verified variant shows at most this many documents (the context budget)
    keep_unimproved: bool = True  # also distil the programs no edit improves (the paper: variants only)
    # Distil the policy's answers to the kept programs' documents too; False: the program turns alone, the
    # answers left to RL (`searchrl.tasks.rpl.distill`).
    distil_answers: bool = True
    # Answers tried per kept program: the greedy one, then answers sampled as the rollouts sample; the
    # highest-scoring is the trajectory's answer (1: the greedy answer alone).
    answer_samples: int = 1
    sft: SFTConfig = SFTConfig(steps=50, batch_size=8, max_len=1024,
                               optim=OptimConfig(lr=1e-5, warmup_steps=5))

    def __post_init__(self):
        if self.answer_samples < 1:
            raise ValueError(f"config.env.mutation.answer_samples must be at least 1 (the greedy answer), "
                             f"got {self.answer_samples}")


@dataclasses.dataclass(frozen=True)
class RPLDemoConfig:
    """The Retrieval Program Learning miniature (`searchrl.tasks.rpl.demo`): GlobalQA tasks over a synthetic world,
    the scripted cold starts of the program and the search policies, and the seeds."""

    entities: int = 6000  # of the synthetic world: enough distinct names for a policy to learn to copy them
    pair_fraction: float = 0.0  # passages stating two facts (one fact each keeps observations short)
    test_fraction: float = 0.2  # of the world's entities, and so of its groups, held out
    types: tuple[str, ...] = ("count",)  # GlobalQA task types trained and evaluated
    max_answer: int = 6  # largest group asked about
    vocab_size: int = 800  # of the BPE tokenizer: held-out names in pieces that training queries write too
    cold_start_top_k: int = 8  # the scripted programs retrieve this many documents
    cold_start_windows: tuple[tuple[int, int], ...] = ((0, 4),)  # and show ranks [i, j): a trajectory each
    search_turns: int = 2  # searches of a scripted search trajectory (the plan query, then the value)
    eval_questions: int = 128  # held-out tasks evaluated
    prefix_sft: SFTConfig = SFTConfig()  # the first cold-start stage, on prompts and first turns
    seeds: tuple[int, ...] = (0, 1)  # whole runs (world, cold start, RL of every arm), one per seed
    shared_cold_start: bool = False  # one world and cold start (the config's seed) for every seed's RL
    # Seeds run side by side, each in a process of its own (results.run_seeds; not with a shared cold start).
    parallel_seeds: int = 1

    def __post_init__(self):
        if self.shared_cold_start and self.parallel_seeds > 1:
            raise ValueError(f"parallel_seeds={self.parallel_seeds} needs a cold start per seed; "
                             "shared_cold_start=True runs the seeds one after another in one process")
