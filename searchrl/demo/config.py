"""`config.demo`: the sizes of a CPU miniature (no JAX here, so that building a config stays instant)."""
from __future__ import annotations

import copy
import dataclasses
import os

import ml_collections

from searchrl.rl.config import SFTConfig


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    """The synthetic world, the scripted cold start and the evaluation of the AutoSearch demo."""

    entities: int = 4000
    questions_per_entity: float = 2.0
    hop_fractions: tuple[float, ...] = (0.5, 0.3, 0.2)  # of 1-, 2- and 3-hop questions
    vocab_size: int = 1200  # of the BPE tokenizer trained on the world
    extra_search_fraction: float = 0.7  # scripted trajectories that search once more than needed
    early_answer_fraction: float = 0.3  # of those, the ones that also practise the answer before that search
    eval_questions: int = 384  # per evaluation set
    budgets: tuple[int, ...] = (0, 1, 2, 3)  # search budgets of the accuracy-vs-budget curve
    prefix_sft: SFTConfig = SFTConfig()  # the first cold-start stage, on two-turn prefixes


@dataclasses.dataclass(frozen=True)
class RewriteDemoConfig:
    """The DeepRetrieval miniature: its world (`searchrl.demo.rewrite_world`), cold start and seeds."""

    concepts_per_kind: int = 24  # conditions and treatments; a topic pairs one of each
    num_candidates: int = 4  # technical words the cold start considers per user word (one is right)
    vocab_size: int = 1200  # of the BPE tokenizer trained on the world: every word one token
    sft_samples: int = 4  # cold-start rewrites drawn per training question
    seeds: tuple[int, ...] = (0, 1)  # whole runs (world, model, cold start, RL), one per seed


@dataclasses.dataclass(frozen=True)
class RPLDemoConfig:
    """The Retrieval Program Learning miniature (`searchrl.demo.rpl`): GlobalQA tasks over a synthetic world,
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
    seeds: tuple[int, ...] = (0, 1)  # RL seeds: each trains every arm from the one cold start


def seed_config(config: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
    """The config of one seed's run: its own seed, and its workdir under the config's (workdir/seed<seed>)."""
    config = copy.deepcopy(config)
    config.seed = seed
    config.workdir = os.path.join(config.workdir, f"seed{seed}")
    return config


def world_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with a demo world's files under its workdir: the datasets, the index and the tokenizer."""
    config = copy.deepcopy(config)
    config.tokenizer = os.path.join(config.workdir, "tokenizer")
    config.data.dir = config.workdir
    config.retrieval.index_dir = os.path.join(config.workdir, "index")
    return config
