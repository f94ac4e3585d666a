"""The RL loop for any environment: rollout -> rewards -> old logprobs/values -> advantages -> update -> log ->
eval -> checkpoint. One `Trainer.step` is one PPO iteration; `Trainer.train` runs them with resumable checkpoints.

Everything a step depends on is a function of (config, checkpoint): the rollout key is folded from the seed and
step, the data order from the seed and the data position, the update's shuffling from the state's RNG. A run
stopped at step n and resumed therefore continues exactly as if it had not stopped.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tqdm import tqdm

from searchrl import models
from searchrl.checkpoint import Checkpointer
from searchrl.envs.base import Env
from searchrl.metric_writer import MetricWriter
from searchrl.rl import advantages as adv
from searchrl.rl import kl as kl_lib
from searchrl.rl import update as update_lib
from searchrl.rl.train_state import abstract_train_state, init_train_state
from searchrl.rollout.engine import RolloutConfig, RolloutEngine
from searchrl.rollout.sampling import SamplingParams
from searchrl.rollout.trajectory import Trajectory
from searchrl.shapes import padded_width


def default_config() -> ml_collections.ConfigDict:
    """`config.train`, `config.rollout` and the loop's `config.rl` fields (on top of `update.default_config`)."""
    config = ml_collections.ConfigDict()
    config.train = ml_collections.ConfigDict(dict(
        steps=100, batch_size=8, log_every=1, eval_every=0, checkpoint_every=10, keep_checkpoints=3,
        async_checkpoints=True, eval_batches=1,
    ))
    config.rollout = ml_collections.ConfigDict(dict(
        max_prompt_tokens=256, max_len=1024, max_turn_tokens=128, max_obs_tokens=256,
        obs_buckets=(64, 128, 256), chunk_steps=32, intermediate_answer_tokens=32,
        temperature=1.0, top_k=0, top_p=1.0,
    ))
    rl = update_lib.default_config()
    rl.advantage = "gae"  # a name in searchrl.rl.advantages.ADVANTAGES
    rl.gamma = 1.0
    rl.lam = 1.0
    rl.whiten_advantages = True  # masked whitening over the batch (verl's GAE does this)
    rl.responses_per_prompt = 1  # > 1: group sampling for GRPO / RLOO (groups keyed by prompt id)
    rl.kl_in_reward = False  # subtract beta * KL(k1) from token rewards (needs rl.use_reference)
    rl.kl_controller = "fixed"
    rl.kl_coef = 0.001
    rl.kl_target = 0.1
    rl.kl_horizon = 10000.0
    config.rl = rl
    return config


def rollout_config(rollout: ml_collections.ConfigDict) -> RolloutConfig:
    """The static `RolloutConfig` of a `config.rollout` group."""
    fields = {f.name for f in dataclasses.fields(RolloutConfig)} - {"sampling"}
    sampling = SamplingParams(rollout.temperature, rollout.top_k, rollout.top_p)
    values = {name: rollout[name] for name in fields}
    values["obs_buckets"] = tuple(values["obs_buckets"])
    return RolloutConfig(**values, sampling=sampling)


class DataOrder:
    """An endless, seeded stream of example indices: a fresh permutation per epoch, addressable by position."""

    def __init__(self, size: int, seed: int):
        if size == 0:
            raise ValueError("The training set is empty.")
        self.size, self.seed = size, seed

    def take(self, position: int, count: int) -> list[int]:
        return [int(self._permutation(p // self.size)[p % self.size]) for p in range(position, position + count)]

    @functools.lru_cache(maxsize=2)
    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.size)


class Trainer:
    """PPO / GRPO / RLOO / REINFORCE++ on one environment, with checkpoints and logs under `workdir`."""

    def __init__(self, config: ml_collections.ConfigDict, model_cfg: models.ModelConfig, policy: dict,
                 tokenizer: Any, env: Env, train_examples: Sequence[dict], eval_examples: Sequence[dict] = (),
                 workdir: str | None = None):
        self.config, self.model_cfg, self.env = config, model_cfg, env
        self.train_examples, self.eval_examples = list(train_examples), list(eval_examples)
        self.workdir = workdir or config.workdir
        self.mesh = models.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor)
        self.ppo = update_lib.PPOConfig.from_config(config.rl, model_cfg)
        self.rows = config.train.batch_size * config.rl.responses_per_prompt
        shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if self.rows % shards or self.rows % self.ppo.minibatch_size:
            raise ValueError(f"train.batch_size x rl.responses_per_prompt = {self.rows} rows must be a multiple of "
                             f"the data-parallel size {shards} and of rl.minibatch_size={self.ppo.minibatch_size}.")
        if config.rl.kl_in_reward and not config.rl.use_reference:
            raise ValueError("rl.kl_in_reward needs a reference policy: set rl.use_reference=True.")
        self.kl_controller = kl_lib.make_kl_controller(
            config.rl.kl_controller, config.rl.kl_coef, config.rl.kl_target, config.rl.kl_horizon)
        rollout = rollout_config(config.rollout)
        self.engine = RolloutEngine(model_cfg, tokenizer, env, rollout)
        greedy = dataclasses.replace(rollout, sampling=SamplingParams(temperature=0.0))
        self.eval_engine = RolloutEngine(model_cfg, tokenizer, env, greedy)
        self.order = DataOrder(len(self.train_examples), config.seed)
        self.key = jax.random.key(config.seed)
        self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                         max_to_keep=config.train.keep_checkpoints,
                                         async_save=config.train.async_checkpoints)
        self.writer = MetricWriter(self.workdir)
        self.state, self.data_position = self._restore_or_init(policy)

    def _restore_or_init(self, policy: dict):
        if self.checkpointer.latest_step() is not None:
            state, record = self.checkpointer.restore(abstract_train_state(self.ppo.layout, self.mesh))
            return state, int(record["data_position"])
        state = init_train_state(self.ppo.layout, self.mesh, policy, jax.random.fold_in(self.key, 0),
                                 kl_coef=float(self.kl_controller.init().coef))
        return state, 0

    @property
    def step_count(self) -> int:
        return int(jax.device_get(self.state.step))

    def _next_batch(self) -> tuple[list[dict], np.ndarray]:
        """This step's rows (each prompt repeated `responses_per_prompt` times) and their prompt ids."""
        n = self.config.rl.responses_per_prompt
        indices = self.order.take(self.data_position, self.config.train.batch_size)
        self.data_position += len(indices)
        examples = [self.train_examples[i] for i in indices for _ in range(n)]
        group_ids = np.repeat(np.arange(len(indices), dtype=np.int32), n)
        return examples, group_ids

    def _advantages(self, traj: Trajectory, token_rewards: jax.Array, values, group_ids: np.ndarray):
        rl = self.config.rl
        mask = jnp.asarray(traj.loss_mask)
        advantages, returns = adv.compute_advantages(
            rl.advantage, rewards=token_rewards, values=values, mask=mask, group_ids=jnp.asarray(group_ids),
            gamma=rl.gamma, lam=rl.lam)
        if rl.whiten_advantages:
            advantages = adv.masked_whiten(advantages, mask)
        return advantages, returns

    def step(self) -> dict[str, float]:
        """One PPO iteration; returns its metrics (already written to the logs)."""
        step = self.step_count
        examples, group_ids = self._next_batch()
        self.engine.stats = type(self.engine.stats)()
        traj = self.engine.run(self.state.policy, examples, jax.random.fold_in(self.key, step + 1))
        # Train on the slots the batch uses, padded to one of a few widths (a bounded number of compiled updates).
        traj = traj.cropped(padded_width(int(traj.lengths.max()), traj.tokens.shape[1]))
        turn_rewards = self.env.rewards(traj, examples)
        token_rewards = jnp.asarray(traj.turn_rewards_to_tokens(turn_rewards))
        tokens, attention = jnp.asarray(traj.tokens), jnp.asarray(traj.attention_mask)
        old_logprobs, values, ref_logprobs = update_lib.compute_old_logprobs_and_values(
            self.state, tokens, attention, traj.logprob_temperature, self.ppo, self.mesh)
        metrics: dict[str, float] = {}
        if self.config.rl.kl_in_reward:
            token_rewards, kl_metrics = kl_lib.apply_kl_penalty(
                token_rewards, old_logprobs, ref_logprobs, traj.loss_mask, self.state.kl.coef, "k1")
            new_kl = self.kl_controller.update(self.state.kl, kl_metrics["kl"], self.rows)
            self.state = self.state._replace(kl=jax.device_put(new_kl, self.state.kl.coef.sharding))
            metrics |= {f"rollout/{k}": v for k, v in kl_metrics.items()}
        advantages, returns = self._advantages(traj, token_rewards, values, group_ids)
        batch = update_lib.PPOBatch(
            tokens=tokens, attention_mask=attention, loss_mask=jnp.asarray(traj.loss_mask),
            old_logprobs=old_logprobs, advantages=advantages,
            returns=returns if values is not None else None, old_values=values, ref_logprobs=ref_logprobs,
            temperature=traj.logprob_temperature)
        self.state, update_metrics = update_lib.ppo_update(self.state, batch, self.ppo, self.mesh)
        policy = traj.loss_mask > 0
        sampler_gap = np.abs(np.asarray(old_logprobs)[policy] - traj.logprobs[policy])
        metrics |= jax.device_get(update_metrics)
        metrics |= {
            "reward/mean": float(np.mean([sum(r) for r in turn_rewards])),
            "rollout/response_tokens": float(traj.response_lengths.mean()),
            "rollout/host_fraction": self.engine.stats.host_fraction,
            "rollout/seconds": self.engine.stats.wall_s,
            "rollout/logprob_gap_max": float(sampler_gap.max()) if sampler_gap.size else 0.0,
        }
        metrics |= {f"env/{k}": v for k, v in self.env.metrics(traj, examples).items()}
        metrics = {k: float(v) for k, v in metrics.items()}
        self.writer.write(step + 1, metrics)
        return metrics

    def evaluate(self, examples: Sequence[dict] | None = None) -> dict[str, float]:
        """Greedy rollouts of `examples` (default: the eval set) in training-sized batches; env metrics averaged."""
        examples = list(self.eval_examples if examples is None else examples)
        if not examples:
            return {}
        totals: dict[str, float] = {}
        for start in range(0, len(examples), self.rows):
            chunk = examples[start:start + self.rows]
            padded = chunk + [chunk[-1]] * (self.rows - len(chunk))  # static batch shape
            traj = self.eval_engine.run(self.state.policy, padded, jax.random.key(0))
            keep = dataclasses.replace(traj, **_first_rows(traj, len(chunk)))
            for name, value in self.env.metrics(keep, chunk).items():
                totals[name] = totals.get(name, 0.0) + value * len(chunk)
        return {name: value / len(examples) for name, value in totals.items()}

    def save(self) -> None:
        self.checkpointer.save(self.step_count, self.state, model=self.model_cfg,
                               record={"data_position": self.data_position})

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Runs until `steps` (default: train.steps) PPO iterations are done in total; returns their metrics."""
        train = self.config.train
        total = train.steps if steps is None else steps
        history = []
        with tqdm(total=total, initial=self.step_count, desc="train", disable=jax.process_index() != 0) as bar:
            while self.step_count < total:
                metrics = self.step()
                history.append(metrics)
                step = self.step_count
                if train.eval_every and step % train.eval_every == 0:
                    evaluation = {f"eval/{k}": v for k, v in self.evaluate().items()}
                    self.writer.write(step, evaluation)
                    metrics |= evaluation
                if train.checkpoint_every and (step % train.checkpoint_every == 0 or step == total):
                    self.save()
                bar.update(1)
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}",
                                rollout_s=f"{metrics['rollout/seconds']:.1f}")
        self.checkpointer.wait_until_finished()
        return history

    def close(self) -> None:
        self.checkpointer.close()
        self.writer.close()


def _first_rows(traj: Trajectory, n: int) -> dict[str, Any]:
    """The per-row fields of a Trajectory cut to its first n rows."""
    return {name: value[:n] for name, value in traj.__dict__.items() if isinstance(value, (np.ndarray, list))}
