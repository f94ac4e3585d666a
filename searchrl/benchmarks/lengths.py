"""A Search-R1-like mix of rollout lengths, and its packed layout: the batch the benchmarks lay out when the
learn step packs rows (`rl.pack`), so that their figures describe what the trainer runs."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from searchrl.rl import packing
from searchrl.rl.config import RLConfig
from searchrl.rollout.config import RolloutConfig


class Episodes(NamedTuple):
    """The parts of rollouts, each [rows] tokens (searches: a count)."""

    prompt: np.ndarray
    searches: np.ndarray  # search turns, each followed by an observation
    sampled: np.ndarray  # tokens sampled over all turns, the answer turn's included
    observed: np.ndarray  # observation tokens over all searches


def search_r1_episodes(rows: int, rollout: RolloutConfig, seed: int = 0) -> Episodes:
    """The parts of [rows] Search-R1-like rollouts, uniform draws: a prompt of 150-400 tokens, 1-4 search
    turns of 50-300 sampled tokens and a 300-500-token observation each, then an answer turn of 20-100
    tokens; turns and observations at most rollout.max_turn_tokens and .max_obs_tokens."""
    rng = np.random.default_rng(seed)
    searches = rng.integers(1, 5, rows)
    turns = [(np.minimum(rng.integers(50, 301, n), rollout.max_turn_tokens).sum(),
              np.minimum(rng.integers(300, 501, n), rollout.max_obs_tokens).sum()) for n in searches]
    answer = np.minimum(rng.integers(20, 101, rows), rollout.max_turn_tokens)
    sampled, observed = (np.asarray(part) for part in zip(*turns))
    return Episodes(rng.integers(150, 401, rows), searches, sampled + answer, observed)


def search_r1_lengths(rows: int, rollout: RolloutConfig, seed: int = 0) -> np.ndarray:
    """Tokens [rows] of Search-R1-like rollouts (`search_r1_episodes`), each at most rollout.max_len."""
    episodes = search_r1_episodes(rows, rollout, seed)
    return np.minimum(episodes.prompt + episodes.sampled + episodes.observed, rollout.max_len)


def packing_of(lengths: np.ndarray, rl: RLConfig, width: int, shards: int, block: int, seed: int = 0
               ) -> packing.Packing:
    """The packed layout `Trainer` gives rows of `lengths` in rows of `width` on `shards` data-parallel
    shards, with block pairs of `block` slots (`models.pair_block`; 0: none), the update's orders drawn from
    `seed` (the trainer's come from the state's RNG)."""
    rng = np.random.default_rng(seed)
    orders = np.stack([rng.permutation(lengths.size) if rl.shuffle else np.arange(lengths.size)
                       for _ in range(rl.ppo_epochs)])
    return packing.pack(lengths, orders, rl.minibatch_size, rl.micro_batch_size, shards, width, block)
