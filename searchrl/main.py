"""searchrl's entry point: `python -m searchrl.main --config configs/FILE.py:PRESET COMMAND [--config.x.y=v ...]`.

Commands: `info` (the resolved config, the device mesh and the model size) and `train` (RL from the config:
PPO/GRPO/... on its environment, resuming from config.workdir's latest checkpoint). Evaluation is
`python -m searchrl.eval`, the retrieval server `python -m searchrl.retrieval.serve`.
"""
from __future__ import annotations

from typing import Callable

from absl import app, flags, logging
import jax
import ml_collections
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.")


def info(config: ml_collections.ConfigDict) -> None:
    """Prints the resolved config, the mesh it asks for, and the model's parameter count."""
    from searchrl import models  # local: keeps `--help` fast

    from searchrl.configlib import from_config

    print(config)
    mesh = models.mesh_from_config(from_config(models.MeshConfig, config.mesh, "config.mesh"))
    print(f"mesh: {dict(mesh.shape)} over {jax.device_count()} {jax.default_backend()} device(s)")
    cfg = models.config_from_dict(config.model)
    shapes = jax.eval_shape(lambda: models.init_params(cfg, jax.random.key(0)))
    count = sum(x.size for x in jax.tree.leaves(shapes))
    print(f"model: {cfg.family}, {count / 1e6:.2f}M parameters")


def train(config: ml_collections.ConfigDict) -> None:
    """Builds the run from its config and trains until config.train.steps."""
    from searchrl import distributed, experiment
    from searchrl.data import datasets
    from searchrl.rl.trainer import Trainer

    distributed.initialize(config)
    built = experiment.build(config)
    eval_sets = datasets.load_examples(config.data.dir, config.data.eval, config.data.eval_split,
                                      config.data.format)
    eval_examples = [r for records in eval_sets.values() for r in records[: config.data.eval_limit or None]]
    trainer = Trainer(config, built.model_cfg, built.policy, built.tokenizer, built.env, built.train_examples,
                      eval_examples)
    try:
        trainer.train()
    finally:
        trainer.close()


COMMANDS: dict[str, Callable[[ml_collections.ConfigDict], None]] = {"info": info, "train": train}


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"Expected one command out of {sorted(COMMANDS)}, got {argv[1:]}.")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/search_r1.py:tiny")
    logging.info("command %s", argv[1])
    COMMANDS[argv[1]](_CONFIG.value)


if __name__ == "__main__":
    app.run(main)
