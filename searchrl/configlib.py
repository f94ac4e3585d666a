"""Defaults shared by every experiment config (`configs/*.py`), so each file only states what differs."""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from searchrl.models.config import OVERRIDABLE


def base_config() -> ml_collections.ConfigDict:
    """The fields every run has. Experiment configs override them per preset (`tiny`, `paper`, ...)."""
    config = ml_collections.ConfigDict()
    config.seed = 0
    config.workdir = "runs/default"

    config.model = ml_collections.ConfigDict()
    config.model.preset = "tiny"  # a name from searchrl.models.PRESETS, used when `path` is empty
    config.model.path = ""  # a local Hugging Face directory (config.json + *.safetensors); wins over `preset`
    config.model.param_dtype = "float32"  # bfloat16 on accelerators; master weights stay float32 in the optimizer
    for name, kind in OVERRIDABLE.items():  # unset: the preset's / checkpoint's value
        config.model[name] = config_dict.placeholder(kind)

    config.mesh = ml_collections.ConfigDict()
    config.mesh.data = -1  # -1: all devices not used by the other axes
    config.mesh.fsdp = 1
    config.mesh.tensor = 1

    config.distributed = ml_collections.ConfigDict()
    config.distributed.enabled = False  # jax.distributed.initialize() from the cluster environment
    config.distributed.coordinator_address = ""  # host:port; empty = auto-detect (SLURM, TPU pod, ...)
    config.distributed.num_processes = -1
    config.distributed.process_id = -1
    return config


def experiment_config() -> ml_collections.ConfigDict:
    """Every group a training run reads: base, tokenizer/data/retrieval/env, train/rollout/rl, sft."""
    from searchrl import experiment  # local: these import the model, rollout and RL stacks
    from searchrl.rl import sft, trainer

    config = base_config()
    config.update(experiment.default_config())
    config.update(trainer.default_config())
    config.sft = sft.default_config()
    return config
