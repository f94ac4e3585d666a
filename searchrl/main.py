"""searchrl's entry point:
`python -m searchrl.main --config configs/FILE.py:PRESET COMMAND [--config.x.y=v ...]`.

Commands: `info` (the resolved config, the device mesh and the model size), `train` (RL from the config:
PPO/GRPO/... on its environment, resuming from config.workdir's latest checkpoint), `sft` (a supervised cold
start on the env's reference responses, saved as a Hugging Face model at <workdir>/sft) and `world` (a
miniature's world, built where its config reads it unless it is there; `launch/local.sh` runs it first).
Evaluation is `python -m searchrl.eval`, the retrieval server `python -m searchrl.serving.serve`.
"""
from __future__ import annotations

from typing import Callable

from absl import app, logging
import jax
from ml_collections import config_flags

from searchrl import cli, run_config
from searchrl.configlib import to_config
from searchrl.run_config import RunConfig

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.")


def info(config: RunConfig) -> None:
    """Prints the resolved config, the mesh it asks for, and the model's parameter count."""
    from searchrl import models  # local: keeps `--help` fast

    print(to_config(config))
    mesh = models.mesh_of(config.mesh)
    print(f"mesh: {dict(mesh.shape)} over {jax.device_count()} {jax.default_backend()} device(s)")
    cfg = models.config_from_source(config.model)
    shapes = jax.eval_shape(lambda: models.init_params(cfg, jax.random.key(0)))
    count = sum(x.size for x in jax.tree.leaves(shapes))
    print(f"model: {cfg.family}, {count / 1e6:.2f}M parameters")


def train(config: RunConfig) -> None:
    """Builds the run from its config and trains until config.train.steps, with the task's train hooks."""
    from searchrl import distributed, experiment, run_record, task
    from searchrl.data import datasets
    from searchrl.rl.trainer import Trainer

    distributed.initialize(config.distributed)
    built = experiment.build(config)
    if not config.model.path and jax.process_index() == 0:
        cold_start = " (a miniature's cold start: python -m searchrl.demo --config CONFIG)"
        print("note: config.model.path is empty: training from random weights"
              + (cold_start if experiment.miniature(config) else ""), flush=True)  # the tool's output
    data = config.data
    eval_sets = datasets.load_examples(data.dir, data.eval, data.eval_split, data.format, data.tfds_dir)
    eval_examples = [r for records in eval_sets.values() for r in records[: data.eval_limit or None]]
    spec = task.get(config.task)
    hooks = spec.train_hooks(built.env) if spec.train_hooks is not None else []
    trainer = Trainer(config, built.model_cfg, built.policy, built.tokenizer, built.env, built.train_examples,
                      eval_examples, hooks=hooks, critic=experiment.load_critic(config.model, built.model_cfg))
    print(f"process {jax.process_index()} of {jax.process_count()}: rows {trainer.rows.start}-"
          f"{trainer.rows.stop - 1} of each batch of {trainer.batch_rows}", flush=True)  # the tool's output
    try:
        if jax.process_index() == 0:  # the process that holds the workdir
            changed = run_record.start(config, trainer.workdir)
            if changed:
                print(f"{trainer.workdir} (at step {trainer.step_count}) changed since its last start:\n  " +
                      "\n  ".join(changed), flush=True)
        trainer.train()
    finally:
        trainer.close()


def sft(config: RunConfig) -> None:
    """A supervised cold start on the env's reference responses (`env.reference_response`, e.g. the gold SQL
    of text-to-SQL), saved as a Hugging Face model at <workdir>/sft, and with `sft.save_epochs` after those
    epochs at <workdir>/sft/epoch_N: set config.model.path to the one to start RL from."""
    import os

    from searchrl import distributed, experiment, models
    from searchrl.rl import sft as sft_lib
    from searchrl.text import chat

    distributed.initialize(config.distributed)
    built = experiment.build(config)
    examples = [[(chat.render(built.tokenizer, built.env.prompt(example)), False), (response, True)]
                for example in built.train_examples
                if (response := built.env.reference_response(example)) is not None]
    if not examples:
        raise app.UsageError(f"{type(built.env).__name__} has no reference responses for a cold start "
                             f"(config.env: {config.env}).")
    # save_hf replaces a directory whole, so the epochs wait beside <workdir>/sft until it is written.
    out, staged = os.path.join(config.workdir, "sft"), os.path.join(config.workdir, "sft_epochs")

    def save(params: dict, path: str) -> None:
        models.save_hf(built.model_cfg, params, path)  # every process takes part; process 0 writes
        if jax.process_index() == 0:
            built.tokenizer.save_pretrained(path)

    def at_epoch_end(epoch: int, params: dict) -> None:
        if epoch in config.sft.save_epochs:
            save(params, os.path.join(staged, f"epoch_{epoch}"))

    params, losses = sft_lib.fine_tune(built.model_cfg, built.policy, built.tokenizer, examples, config.sft,
                                       models.placement_of(config.mesh), on_epoch_end=at_epoch_end)
    save(params, out)
    if jax.process_index() == 0 and config.sft.save_epochs:
        for n in config.sft.save_epochs:
            os.replace(os.path.join(staged, f"epoch_{n}"), os.path.join(out, f"epoch_{n}"))
        os.rmdir(staged)
    print(f"SFT on {len(examples)} examples, {len(losses)} steps: loss {losses[0]:.3f} -> {losses[-1]:.3f}; "
          f"saved to {out}" + "".join(f", {out}/epoch_{n}" for n in config.sft.save_epochs))


def world(config: RunConfig) -> None:
    """Builds a miniature's world (its `Miniature.world`: datasets, index, tokenizer, where the config reads
    them) unless its tokenizer and index are there; a config that is no miniature needs none."""
    from searchrl import experiment, task

    if not experiment.miniature(config):
        print(f"{config.task}: no miniature world to build for this config")
    elif experiment.world_built(config):
        print(f"{config.task}: the world is there ({config.tokenizer}, {config.retrieval.index_dir})")
    else:
        task.get(config.task).demo.load().world(config, config.demo)
        print(f"{config.task}: built the world under {config.data.dir}")


COMMANDS: dict[str, Callable[[RunConfig], None]] = {"info": info, "train": train, "sft": sft, "world": world}


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"Expected one command out of {sorted(COMMANDS)}, got {argv[1:]}.")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/search_r1.py:tiny")
    logging.info("command %s", argv[1])
    COMMANDS[argv[1]](run_config.parse(_CONFIG.value))


if __name__ == "__main__":
    cli.run_app(main)
