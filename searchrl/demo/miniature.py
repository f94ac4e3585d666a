"""The skeleton of a CPU miniature: a task fills in a `Miniature` (its world, cold start, arms, claims and
report) and `run` does the rest: the seeds (one after another or side by side, each with its own world and
cold start, or every seed's arms from one shared cold start), the figures over the seeds, the claims and the
results files. A task's arms train with `train` (RL on the trainer, from a cold start, optionally branching
another arm off halfway)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Any, Callable, Mapping, Sequence

import jax

from searchrl import experiment, run_config, task
from searchrl.configlib import ConfigError
from searchrl.demo.config import preset, seed_config, world_config
from searchrl.demo.results import run_seeds, write_results
from searchrl.rl.hooks import TrainHook
from searchrl.rl.trainer import Trainer
from searchrl.run_config import RunConfig

PerSeed = Mapping[str, Mapping[str, Any]]  # seed -> that seed's results (its arms' figures)
RUN_FILES = ("checkpoints", "tensorboard", "metrics.jsonl")  # what a training run leaves in its workdir


@dataclasses.dataclass(frozen=True)
class Miniature:
    """What a task's miniature fills in. `config.demo` (the task's `demo_config`) has `seeds` and
    `parallel_seeds` (seeds side by side, each in a fresh process that finds the task by its package,
    `searchrl.task.get`), and may have `shared_cold_start` (one world and cold start for every seed's arms).

    world: (a config with its world under its workdir, `world_config`; its `config.demo`) -> builds the
        world's files from scratch (datasets, index, tokenizer); returns what the cold start reads of it.
    cold_start: (that config, the world) -> what every arm starts from (the cold-started policy, its figures).
    arms: (one seed's config, the cold start) -> that seed's results (JSON-able): each arm trained (`train`)
        and evaluated, and whatever else the task records per seed.
    over_seeds: (each seed's results) -> each figure's `results.interval` over the seeds, by policy.
    claims: (each seed's results) -> the paper's claims checked on them (`results.claim`).
    markdown: (each seed's results) -> results.md.
    plot: (each seed's results, the workdir) -> draws its figure of every seed there, if any."""

    world: Callable[[RunConfig, Any], Any]
    cold_start: Callable[[RunConfig, Any], Any]
    arms: Callable[[RunConfig, Any], dict[str, Any]]
    over_seeds: Callable[[PerSeed], dict[str, Any]]
    claims: Callable[[PerSeed], list[dict[str, Any]]]
    markdown: Callable[[PerSeed], str]
    plot: Callable[[PerSeed, str], None] | None = None


def of(config: RunConfig) -> Miniature:
    """The miniature of `config`'s task (`searchrl.task.Task.demo`); a task without one is a ConfigError
    listing the tasks with one."""
    demo = task.get(config.task).demo
    if demo is None:
        raise ConfigError(f"task {config.task!r} (config.env.name) has no miniature; tasks with one: "
                         f"{task.with_demo()}")
    return demo.load()


def run(config: RunConfig) -> dict[str, Any]:
    """Every seed of `config.demo.seeds`, then their figures over the seeds and the claims: results.json (each
    seed's results under "held_out", "over_seeds", "claims", the seconds taken) and results.md under the
    workdir, and the miniature's plot."""
    start = time.perf_counter()
    miniature, demo = of(config), config.demo
    if getattr(demo, "shared_cold_start", False):  # one world and cold start, every seed's arms under seed<N>
        world = world_config(config)
        began = time.perf_counter()
        cold = miniature.cold_start(world, miniature.world(world, demo))
        per_seed = {str(seed): seed_results(miniature, seed_config(world, seed), cold, began)
                    for seed in demo.seeds}
    else:
        configs = [world_config(seed_config(config, seed)) for seed in demo.seeds]
        per_seed = dict(zip(map(str, demo.seeds), run_seeds(run_seed, configs, demo.parallel_seeds)))
    results = {"held_out": per_seed, "over_seeds": miniature.over_seeds(per_seed),
               "claims": miniature.claims(per_seed), "seconds": time.perf_counter() - start}
    write_results(config.workdir, miniature.markdown(per_seed), results)
    if miniature.plot is not None:
        miniature.plot(per_seed, config.workdir)
    print(f"results: {config.workdir}/results.json, results.md ({results['seconds']:.0f}s)")
    return results


def smoke(names: Sequence[str] = ()) -> None:
    """The smoke preset (`searchrl.task.Demo.smoke`) of each task of `names` (default: every task with a
    miniature), one after another, with the time each took (`make smoke`)."""
    for name in names or task.with_demo():
        start = time.perf_counter()
        run(run_config.parse(preset(task.get(name).demo.smoke)))
        print(f"smoke: {name} done in {time.perf_counter() - start:.0f}s", flush=True)


def run_seed(config: RunConfig) -> dict[str, Any]:
    """One seed from an empty directory: its world, its cold start, its arms (a `results.run_seeds` job)."""
    miniature, began = of(config), time.perf_counter()
    cold = miniature.cold_start(config, miniature.world(config, config.demo))
    print(f"seed {config.seed}: cold start done ({time.perf_counter() - began:.0f}s)")
    return seed_results(miniature, config, cold, began)


def seed_results(miniature: Miniature, config: RunConfig, cold: Any, began: float) -> dict[str, Any]:
    """A seed's arms from `cold`: their results and the seconds since `began`."""
    results = {**miniature.arms(config, cold), "seconds": time.perf_counter() - began}
    print(f"seed {config.seed}: done ({results['seconds']:.0f}s)")
    return results


@dataclasses.dataclass(frozen=True)
class Branch:
    """Another arm branching off a run: the run's checkpoint and metrics at `step` become `workdir`'s, where
    that arm resumes (`train(..., branched=True)`) with the same data order and keys as the run continues."""

    step: int
    workdir: str


def train(config: RunConfig, built: experiment.Experiment, policy: dict, *, env: Any = None,
          eval_examples: Sequence[dict] = (), hooks: Sequence[TrainHook] = (), branch: Branch | None = None,
          branched: bool = False) -> tuple[dict, list[dict[str, float]]]:
    """An arm's RL run from `policy` under `config.workdir`, in `built`'s env (or `env`) on its training
    examples, started over (an earlier run's files there are removed) unless `branched` (it resumes the run a
    `Branch` left there): the trained params (on the host) and each step's metrics."""
    if not branched:
        remove_run(config.workdir)
    trainer = Trainer(config, built.model_cfg, policy, built.tokenizer, env or built.env,
                      built.train_examples, eval_examples, hooks=hooks)
    try:
        history = []
        if branch is not None:
            history += trainer.train(branch.step)
            remove_run(branch.workdir)
            shutil.copytree(os.path.join(config.workdir, "checkpoints"),
                            os.path.join(branch.workdir, "checkpoints"))
            shutil.copy(os.path.join(config.workdir, "metrics.jsonl"), branch.workdir)
        history += trainer.train()
        return jax.device_get(trainer.state.policy), history
    finally:
        trainer.close()


def remove_run(workdir: str) -> None:
    """An earlier training run's files in `workdir` (`RUN_FILES`), so that a run there starts over."""
    for name in RUN_FILES:
        path = os.path.join(workdir, name)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)
