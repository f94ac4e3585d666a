"""The RL loop end to end on a toy task a tiny model learns in a few dozen steps, and exact resumption."""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from searchrl import models, run_config
from searchrl.episode import Action, Env
from searchrl.metric_writer import read_metrics
from searchrl.rl import trainer as trainer_lib
from searchrl.text.tokenizer import train_bpe_tokenizer


def toy_tokenizer():
    rng = np.random.default_rng(0)
    words = "red green blue cyan magenta yellow black white".split()
    return train_bpe_tokenizer([" ".join(rng.choice(words, 10)) for _ in range(200)], vocab_size=300)


@pytest.fixture(scope="module")
def tokenizer():
    return toy_tokenizer()


@dataclasses.dataclass
class LowTokensEnv(Env):
    """One turn; the reward is the share of sampled tokens whose id is in the lower half of the vocabulary."""

    vocab_size: int
    stop_strings: tuple[str, ...] = ("</answer>",)
    side_branch = None

    def prompt(self, example):
        return f"say {example['word']}"

    def parse_action(self, text, turn_index):
        return Action("answer", text, done=True)

    def observe(self, actions):
        raise AssertionError("a single-turn task never observes")

    def _scores(self, traj):
        turns = [row[0] for row in traj.turns]
        return [float(np.mean(traj.tokens[b, t.start:t.end] < self.vocab_size // 2)) for b, t in enumerate(turns)]

    def rewards(self, traj, examples):
        return [[s] for s in self._scores(traj)]

    def metrics(self, traj, examples):
        return [{"low_share": s} for s in self._scores(traj)]


def make_config(workdir, **rl):
    config = run_config.experiment_config("search_r1")
    config.workdir = str(workdir)
    config.train.batch_size = 16
    config.train.checkpoint_every = 1000  # and the last step of each `train` call
    config.train.async_checkpoints = False
    config.rollout.update(dict(max_prompt_tokens=8, max_len=24, max_turn_tokens=8, max_obs_tokens=8,
                               obs_buckets=(8,), chunk_steps=8))
    config.rl.minibatch_size = 16
    config.rl.micro_batch_size = 8
    config.rl.actor.lr = 3e-3
    config.rl.critic.lr = 3e-3
    config.rl.update(rl)
    return config


def tiny_config(tokenizer):
    return dataclasses.replace(models.get_preset("tiny"), vocab_size=len(tokenizer),
                               eos_token_id=tokenizer.eos_token_id)


def make_trainer(config, tokenizer, critic=None):
    cfg = tiny_config(tokenizer)
    policy = models.init_params(cfg, jax.random.key(0))
    examples = [{"word": w} for w in "red green blue cyan magenta yellow black white".split()] * 4
    env = LowTokensEnv(cfg.vocab_size)
    return trainer_lib.Trainer(run_config.parse(config), cfg, policy, tokenizer, env, examples, examples[:8],
                               critic=critic)


def test_a_new_run_starts_its_critic_from_the_one_given(tmp_path, tokenizer):
    """A carried-over critic (`config.model.critic_path`, e.g. an export's critic/) is the new run's; a run
    without a critic refuses one."""
    cfg = tiny_config(tokenizer)
    critic = models.init_params(cfg, jax.random.key(7), value=True)
    trainer = make_trainer(make_config(tmp_path / "a"), tokenizer, critic=critic)
    try:
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(trainer.state.critic), critic)
    finally:
        trainer.close()
    with pytest.raises(ValueError, match="critic_path gives a critic, but rl.use_critic is False"):
        make_trainer(make_config(tmp_path / "b", advantage="grpo", use_critic=False, responses_per_prompt=4),
                     tokenizer, critic=critic)


@pytest.mark.parametrize("algo", [
    dict(advantage="gae"),
    dict(advantage="grpo", use_critic=False, responses_per_prompt=4),
    dict(advantage="gigpo", use_critic=False, responses_per_prompt=4),
])
def test_reward_rises(tmp_path, tokenizer, algo):
    config = make_config(tmp_path, **algo)
    if algo["advantage"] in ("grpo", "gigpo"):
        config.train.batch_size = 4  # 4 prompts x 4 responses
    trainer = make_trainer(config, tokenizer)
    history = trainer.train(30)
    rewards = [m["reward/mean"] for m in history]
    first, last = np.mean(rewards[:5]), np.mean(rewards[-5:])
    assert last > first + 0.2, rewards
    assert len(read_metrics(tmp_path / "metrics.jsonl")) == 30
    assert trainer.evaluate()["low_share"] > first
    trainer.close()


def test_resume_is_exact(tmp_path, tokenizer):
    straight = make_trainer(make_config(tmp_path / "a"), tokenizer)
    straight.train(4)
    straight.close()
    assert straight.checkpointer.all_steps() == [4]  # checkpoint_every=1000: a run still ends with one

    config = make_config(tmp_path / "b")
    config.train.checkpoint_every = 2
    first = make_trainer(config, tokenizer)
    first.train(2)
    first.close()
    resumed = make_trainer(config, tokenizer)  # restores step 2, its optimizer state and data position
    assert resumed.step_count == 2
    resumed.train(4)
    resumed.close()

    a = {row["step"]: row for row in read_metrics(tmp_path / "a" / "metrics.jsonl")}
    b = {row["step"]: row for row in read_metrics(tmp_path / "b" / "metrics.jsonl")}
    assert all(row["perf/step_seconds"] > 0 for row in a.values())  # RPL's Figure 4 training time
    for step in (3, 4):
        for name in ("reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm"):
            np.testing.assert_allclose(b[step][name], a[step][name], rtol=1e-6, err_msg=f"{name} at {step}")


def test_training_steps_on_a_3d_mesh_make_no_implicit_transfers(tmp_path, tokenizer):
    """Rollout (sharded over data x fsdp, heads over tensor) and update on a (2, 2, 2) mesh of the 8 test
    devices, with JAX refusing every implicit host<->device and device<->device transfer; a checkpoint and an
    evaluation included."""
    config = make_config(tmp_path)
    config.mesh.update(dict(data=2, fsdp=2, tensor=2))
    config.train.checkpoint_every = 2
    trainer = make_trainer(config, tokenizer)
    with jax.transfer_guard("disallow"):
        history = trainer.train(2)
        evaluation = trainer.evaluate()
    trainer.close()
    assert [row["train/nonfinite"] for row in history] == [0.0, 0.0]
    assert 0.0 <= evaluation["low_share"] <= 1.0 and trainer.step_count == 2
    assert trainer.checkpointer.latest_step() == 2
