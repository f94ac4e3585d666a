"""A miniature's config: a preset by name, per seed, and with its world's files under its workdir (no JAX
here)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import ml_collections

from searchrl.configlib import sibling
from searchrl.run_config import RunConfig

ROOT = Path(__file__).resolve().parents[2]  # the checkout: a preset's config file is relative to it


def preset(spec: str) -> ml_collections.ConfigDict:
    """The config of "FILE:PRESET" (a `searchrl.task.Demo` preset; FILE relative to the checkout, or
    absolute), as --config loads it."""
    file, _, name = spec.rpartition(":")
    path = ROOT / file
    return sibling(str(path), path.stem).get_config(name)


def seed_config(config: RunConfig, seed: int) -> RunConfig:
    """The config of one seed's run: its own seed, and its workdir under the config's (workdir/seed<seed>)."""
    return dataclasses.replace(config, seed=seed, workdir=os.path.join(config.workdir, f"seed{seed}"))


def world_config(config: RunConfig) -> RunConfig:
    """`config` with a demo world's files under its workdir: the datasets, the index and the tokenizer."""
    return dataclasses.replace(
        config, tokenizer=os.path.join(config.workdir, "tokenizer"),
        data=dataclasses.replace(config.data, dir=config.workdir),
        retrieval=dataclasses.replace(config.retrieval, index_dir=os.path.join(config.workdir, "index")))
