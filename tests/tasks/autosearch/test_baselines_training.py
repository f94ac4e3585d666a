"""StepSearch and HiPRAG train: two PPO steps from each `configs/autosearch_baselines.py:tiny_*` preset on a
small synthetic world (the AutoSearch miniature's), with their rewards on the real trajectories."""
from __future__ import annotations

import math
import os
import sys

import jax
import numpy as np
import pytest

from searchrl import experiment, run_config
from searchrl.rl.trainer import Trainer
from searchrl.tasks.autosearch import baseline_rewards as br
from searchrl.tasks.autosearch import demo
from searchrl.tasks.autosearch.config import DemoConfig

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "configs"))
import autosearch_baselines  # noqa: E402

BATCH, STEPS = 8, 2


def small(preset: str, world: str, workdir: str):
    """The preset over the world under `world`, at toy sizes."""
    config = autosearch_baselines.get_config(preset)
    config.workdir = workdir
    config.tokenizer = os.path.join(world, "tokenizer")
    config.data.dir = world
    config.retrieval.index_dir = os.path.join(world, "index")
    config.rollout.obs_buckets = (64,)  # one observation width: fewer rollout programs to compile
    config.train.update(dict(batch_size=BATCH, checkpoint_every=1000))
    config.rl.update(dict(minibatch_size=BATCH, micro_batch_size=BATCH))
    return config


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("world"))
    config = run_config.parse(small("tiny_stepsearch", root, os.path.join(root, "unused")))
    demo.build_world(config, DemoConfig(entities=60))
    return root


@pytest.mark.slow  # about 40 s a preset on 2 cores, most of it compiling
@pytest.mark.parametrize("preset", ["tiny_stepsearch", "tiny_hiprag"])
def test_each_baseline_trains_from_its_tiny_preset(preset, world, tmp_path, monkeypatch):
    config = small(preset, world, str(tmp_path / "run"))
    parsed = run_config.parse(config)
    exp = experiment.build(parsed)
    env = exp.env
    assert env.config.reward == preset.removeprefix("tiny_")
    seen: list[tuple[list, list]] = []
    env_rewards = env.rewards

    def recorded(trajectory, batch):
        out = env_rewards(trajectory, batch)
        seen.append((out, [trajectory.turns[b] for b in range(len(batch))], list(batch)))
        return out

    monkeypatch.setattr(env, "rewards", recorded)
    before = jax.tree.map(np.array, exp.policy)
    trainer = Trainer(parsed, exp.model_cfg, exp.policy, exp.tokenizer, env, exp.train_examples)
    history = trainer.train(STEPS)
    after = jax.device_get(trainer.state.policy)
    trainer.close()

    assert len(history) == STEPS and len(seen) == STEPS
    for (rows, turns, examples), metrics in zip(seen, history):
        assert [len(r) for r in rows] == [len(t) for t in turns]
        assert metrics["reward/mean"] == pytest.approx(np.mean([sum(r) for r in rows]), abs=1e-6)
        for values, row_turns, example in zip(rows, turns, examples):
            if preset == "tiny_stepsearch":  # the world's gold ids and plan feed the reward
                record = br.stepsearch_record(row_turns, example, env.config.stepsearch)
                assert record.gold_ids and record.search_keys
                assert values == pytest.approx(br.stepsearch_rewards(record, env.config.stepsearch).total)
                assert values[-1] == -1.0 or values[-1] >= 0.0
            else:  # one score on the last turn, one of HiPRAG's: 0, lambda_f, 1 - lambda_f or 1 + bonus
                assert all(v == 0.0 for v in values[:-1])
                score = values[-1]
                assert any(math.isclose(score, v) for v in (0.0, 0.2, 0.8)) or 1.0 <= score <= 1.4 + 1e-9
        assert metrics["train/nonfinite"] == 0.0
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
