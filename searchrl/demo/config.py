"""A miniature's config, per seed and with its world's files under its workdir (no JAX here)."""
from __future__ import annotations

import dataclasses
import os

from searchrl.run_config import RunConfig


def seed_config(config: RunConfig, seed: int) -> RunConfig:
    """The config of one seed's run: its own seed, and its workdir under the config's (workdir/seed<seed>)."""
    return dataclasses.replace(config, seed=seed, workdir=os.path.join(config.workdir, f"seed{seed}"))


def world_config(config: RunConfig) -> RunConfig:
    """`config` with a demo world's files under its workdir: the datasets, the index and the tokenizer."""
    return dataclasses.replace(
        config, tokenizer=os.path.join(config.workdir, "tokenizer"),
        data=dataclasses.replace(config.data, dir=config.workdir),
        retrieval=dataclasses.replace(config.retrieval, index_dir=os.path.join(config.workdir, "index")))
