"""The config of a run: every group an experiment config has, with its defaults from the group's dataclass.

`configs/*.py` start from `experiment_config()` and change what their preset needs. Nothing here (nor in the
dataclasses) imports JAX, transformers or orbax, so building a config is instant.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from searchrl import task
from searchrl.configlib import to_config
from searchrl.data.config import DataConfig
from searchrl.models.config import MeshConfig, ModelSource
from searchrl.retrieval import RetrievalConfig
from searchrl.rl.config import RLConfig, SFTConfig, TrainConfig
from searchrl.rollout.config import RolloutConfig


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """`config.distributed`: JAX's multi-process runtime (see `searchrl.distributed.initialize`)."""

    enabled: bool = False  # jax.distributed.initialize() from the cluster environment
    coordinator_address: str = ""  # host:port; empty = auto-detect (SLURM, TPU pod, ...)
    num_processes: int = -1
    process_id: int = -1


def base_config() -> ml_collections.ConfigDict:
    """The fields every run has: seed, workdir, model, mesh and distributed."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.workdir = "runs/default"
    config.model = to_config(ModelSource())
    config.mesh = to_config(MeshConfig())
    config.distributed = to_config(DistributedConfig())
    return config


def experiment_config(name: str) -> ml_collections.ConfigDict:
    """Every group a training run reads: base, tokenizer, data, retrieval, the env group of task `name`, rollout,
    train, rl and sft."""
    config = base_config()
    config.tokenizer = ""  # a local HF tokenizer directory; empty: config.model.path
    config.data = to_config(DataConfig())
    config.retrieval = to_config(RetrievalConfig())
    config.env = task.default_config(name)
    config.rollout = to_config(RolloutConfig())
    config.train = to_config(TrainConfig())
    config.rl = to_config(RLConfig())
    config.sft = to_config(SFTConfig())
    return config
