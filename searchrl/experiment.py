"""Everything a run is built from, from its config alone: tokenizer, policy, environment, rollout settings,
data.

`searchrl.main train`, `searchrl.eval` and the demos all call `build`, so a checkpoint is always evaluated
with the environment, prompt, retriever and budgets it was trained with.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from searchrl import checkpoint as checkpoint_lib
from searchrl import cli, models, task
from searchrl.data import datasets
from searchrl.data.tfds_records import Records
from searchrl.episode import Env
from searchrl.rollout.config import RolloutConfig
from searchrl.run_config import RunConfig
from searchrl.text.tokenizer import load_tokenizer


@dataclasses.dataclass
class Experiment:
    """The built pieces of a run. `source` says where the policy came from: {"kind": "config" | "orbax" |
    "hf", "checkpoint": dir or None, "step": int or None}."""

    model_cfg: models.ModelConfig
    policy: dict
    tokenizer: Any
    env: Env
    rollout: RolloutConfig
    train_examples: Sequence[dict]  # read on demand (searchrl.data.tfds_records.Records)
    source: dict[str, Any]


def load_policy(source: models.ModelSource, seed: int, tokenizer: Any) -> tuple[models.ModelConfig, dict]:
    """The HF checkpoint at `source.path`, or a random-initialised preset (drawn from `seed`) sized to the
    tokenizer."""
    dtype = jnp.dtype(source.param_dtype)
    cfg = models.config_from_source(source)
    if source.path:
        return cfg, models.load_hf(source.path, dtype=dtype)[1]
    # A new model speaks its tokenizer's language: vocabulary size (unless set) and special ids come from it.
    vocab = len(tokenizer) if source.vocab_size is None else cfg.vocab_size
    cfg = dataclasses.replace(cfg, vocab_size=vocab, eos_token_id=tokenizer.eos_token_id,
                              bos_token_id=tokenizer.bos_token_id, pad_token_id=tokenizer.pad_token_id)
    return cfg, models.init_params(cfg, jax.random.key(seed), dtype)


def load_critic(source: models.ModelSource, model_cfg: models.ModelConfig) -> dict | None:
    """The value model at `source.critic_path` (an export's critic/), or None when unset: a run's critic then
    starts from the policy's backbone. Its shapes must be those of `model_cfg`'s value model."""
    if not source.critic_path:
        return None
    _, critic = models.load_hf(source.critic_path, dtype=jnp.float32, value=True)
    want = jax.eval_shape(lambda key: models.init_params(model_cfg, key, value=True), jax.random.key(0))
    shapes = [jax.tree.map(lambda a: tuple(a.shape), tree) for tree in (critic, want)]
    if shapes[0] != shapes[1]:
        raise ValueError(f"config.model.critic_path {source.critic_path!r} is a value model of another shape "
                         f"than the policy's ({model_cfg.family}, {model_cfg.num_layers} layers, hidden "
                         f"{model_cfg.hidden_size}, vocab {model_cfg.vocab_size}).")
    return critic


def miniature(config: RunConfig) -> bool:
    """Whether `config` is a miniature whose task builds its world (datasets, index, tokenizer) itself."""
    return config.demo is not None and task.get(config.task).demo is not None


def world_built(config: RunConfig) -> bool:
    """Whether a miniature's world is where its config reads it (its tokenizer and index exist)."""
    return os.path.exists(config.tokenizer) and os.path.exists(config.retrieval.index_dir)


def _is_hf_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def resolve_checkpoint(path: str | os.PathLike) -> tuple[str, Path]:
    """("hf", dir) for a Hugging Face model dir, ("orbax", dir) for a trainer's checkpoint dir (or the run
    workdir holding `checkpoints/`)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Checkpoint not found: {str(path)!r}")
    if _is_hf_dir(path):
        return "hf", path
    if (steps := checkpoint_lib.steps_dir(path)) is not None:
        return "orbax", steps
    raise FileNotFoundError(f"{str(path)!r} is neither a Hugging Face model directory (config.json + "
                            "*.safetensors) nor a searchrl checkpoint directory (<step>/ subdirectories, "
                            "or a run dir with checkpoints/).")


def load_checkpoint(path: str | os.PathLike, step: int | None = None, dtype: str = "float32"
                    ) -> tuple[models.ModelConfig, dict, dict[str, Any]]:
    """(model config, policy params, source) of a trainer checkpoint (default: its latest step) or a Hugging
    Face model dir; source: {"kind": "orbax" | "hf", "checkpoint": dir, "step": int | None}."""
    kind, directory = resolve_checkpoint(path)
    if kind == "hf":
        if step is not None:
            raise ValueError(f"A step ({step}) was given, but {str(directory)!r} is a Hugging Face model "
                             "(no steps).")
        cfg, params = models.load_hf(directory, dtype=jnp.dtype(dtype))
        return cfg, params, {"kind": kind, "checkpoint": str(directory), "step": None}
    with checkpoint_lib.Checkpointer(directory, max_to_keep=None, read_only=True) as ckpt:
        step = ckpt.latest_step() if step is None else step
        cfg = checkpoint_lib.model_config_from_json(ckpt.record(step)[checkpoint_lib.MODEL_CONFIG])
        params = ckpt.restore_policy(step, cfg)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), params)
    return cfg, params, {"kind": kind, "checkpoint": str(directory), "step": step}


def build(config: RunConfig, *, train_data: bool = True, checkpoint: str = "", step: int | None = None
          ) -> Experiment:
    """Tokenizer, policy, environment, rollout settings and (optionally) the training examples of `config`.

    `checkpoint` (a trainer checkpoint dir, run workdir or Hugging Face model dir; `step` picks a trainer
    checkpoint's step) replaces the config's own policy.
    """
    source: dict[str, Any] = {"kind": "config", "checkpoint": config.model.path or None, "step": None}
    if checkpoint:
        model_cfg, policy, source = load_checkpoint(checkpoint, step, config.model.param_dtype)
    hf_dir = source["checkpoint"] if source["kind"] == "hf" else ""
    tokenizer_dir = config.tokenizer or config.model.path or hf_dir
    if not tokenizer_dir:
        raise ValueError("No tokenizer: set config.tokenizer (or config.model.path) to a local tokenizer "
                         "directory.")
    if miniature(config) and not world_built(config):
        raise cli.MissingInput(f"{config.task}'s miniature world", config.data.dir,
                               "build it with: python -m searchrl.main --config CONFIG world, CONFIG this "
                               "run's --config")
    tokenizer = load_tokenizer(tokenizer_dir)
    if not checkpoint:
        model_cfg, policy = load_policy(config.model, config.seed, tokenizer)
    if model_cfg.vocab_size < len(tokenizer):
        raise ValueError(f"The model's vocab_size {model_cfg.vocab_size} is smaller than the tokenizer's "
                         f"{len(tokenizer)} tokens ({tokenizer_dir}).")
    env = task.build(config.task, config.env, config.retrieval)
    train: Sequence[dict] = []
    if train_data:
        data = config.data
        sets = datasets.load_examples(data.dir, data.train, data.train_split, data.format, data.tfds_dir)
        train = Records.concatenate(sets.values())
    return Experiment(model_cfg, policy, tokenizer, env, config.rollout, train, source)
