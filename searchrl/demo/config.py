"""A miniature's config, per seed and with its world's files under its workdir (no JAX here)."""
from __future__ import annotations

import copy
import os

import ml_collections


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
