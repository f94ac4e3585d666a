"""The RL loop for any environment, on the host: data -> rollout -> rewards -> `ppo.learn` -> log ->
checkpoint. One `Trainer.step` is one RL iteration; `Trainer.train` runs them with resumable checkpoints.

Everything a step depends on is a function of (config, checkpoint): the rollout key is folded from the seed and
step, the data order from the seed and the data position, the update's shuffling from the state's RNG. A run
stopped at step n and resumed therefore continues exactly as if it had not stopped; the metrics it logged
past its checkpoint are dropped, as it logs those steps again.

Across processes (`python -m searchrl.main train` on every host, `config.distributed`), every process opens
the same training set and takes the same seeded global batch; it reads and rolls out only its own rows
(`distributed.local_rows`) on its own devices, against its own retriever, and the update is one jit over the
global mesh. Each row samples with its global index, so the run is the same on any number of processes
(`RolloutEngine.run`); metrics are averaged over all rows of all processes. (`tfds.split_for_jax_process`
would instead give each process a fixed part of the data, and the batches would change with the process
count.)

A run owns its workdir (`searchrl.run_lock`; process 0 holds the lock): a second run there stops with an error
naming the first. Each checkpoint records the run's `fingerprint`, the config values that shape its data order
and its state; resuming under other values is an error naming them, unless `config.resume` is "force" (then
the run resumes, and a checkpoint of another state structure restores the arrays that still fit).

A step whose rewards, losses, gradients or new params are non-finite is skipped (`ppo.learn` applies no such
value; the metrics train/nonfinite and train/nonfinite_in_a_row count them); `train.max_nonfinite_steps`
such steps in a row stop the run with NonFiniteError. A non-finite state is never saved, and a checkpoint
that restores as one is damaged: the resume falls back to the step before it.

A run always ends with a checkpoint: every `train.checkpoint_every` steps and the last. SIGTERM (a scheduler
preempting the job) stops the loop after the step in progress: that step is saved if it is not already, the
save finished, and `train` raises Terminated, which ends the process with SIGTERM's status once the callers'
`finally` clauses have run (`close` gives the workdir up); a second SIGTERM ends the process at once, which
loses no checkpoint either (a save in flight is never listed).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import signal
import threading
import time
from typing import Any, Iterator, Mapping, Protocol, Sequence

import jax
import numpy as np

from searchrl import distributed, models
from searchrl.checkpoint import TOKENIZER, Checkpointer
from searchrl.episode import Env, Trajectory, mean_metrics, numeric_metrics
from searchrl.metric_writer import MetricWriter
from searchrl.progress import Progress
from searchrl.rl import advantages, packing, ppo, sft
from searchrl.rl.config import RLConfig, SFTConfig, TrainConfig, batch_rows
from searchrl.rl.hooks import RunHandle, TrainHook
from searchrl.rl.train_state import abstract_train_state, init_train_state
from searchrl.rollout.config import RolloutConfig, SamplingParams
from searchrl.rollout.engine import RolloutEngine
from searchrl.rollout.rows import RolloutStats
from searchrl.run_lock import WorkdirInUseError, WorkdirLock
from searchrl.shapes import padded_width
from searchrl.text.protocol import INVALID

FINGERPRINT = "fingerprint"  # key of the run's fingerprint in a checkpoint's record

log = logging.getLogger(__name__)


class NonFiniteError(RuntimeError):
    """Training produced non-finite values: too many skipped updates in a row, or a non-finite state."""


class ResumeMismatchError(ValueError):
    """The workdir's checkpoint was saved under a config that shapes data order or state differently."""


class Terminated(SystemExit):
    """The run was told to stop (SIGTERM) and stopped cleanly, its last step checkpointed: it ends the process
    with status 128 + SIGTERM, as the signal would have (a SystemExit: no traceback, and no `except Exception`
    keeps the run going)."""

    def __init__(self, message: str):
        super().__init__(128 + signal.SIGTERM)
        self.message = message

    def __str__(self) -> str:
        return self.message


_all_finite = jax.jit(ppo.all_finite)


def _not_finite(state: Any) -> str | None:
    """Why a restored training state is unusable: the trainer never saves a non-finite one."""
    if bool(jax.device_get(_all_finite(state))):
        return None
    return "its arrays are not all finite (the trainer never saves such a state)"


class _StopRequests:
    """SIGTERM's handler while the loop runs (installed from the main thread only): the first SIGTERM asks
    the loop to stop after the step in progress, a second one ends the process at once (the default
    action)."""

    def __init__(self):
        self.requested = False
        self._previous: Any = None

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        log.warning("SIGTERM: stopping after the step in progress, once it is checkpointed (another SIGTERM "
                    "ends the process now)")

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


class TrainRun(Protocol):
    """The parts of a parsed run config the trainer reads (`searchrl.run_config.RunConfig` has them)."""

    seed: int
    workdir: str
    resume: str  # "force": resume a checkpoint whose fingerprint differs
    train: TrainConfig
    rl: RLConfig
    rollout: RolloutConfig
    mesh: models.MeshConfig


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


def throughput(step_seconds: float, episodes: int, mean_response_tokens: float) -> dict[str, float]:
    """A step's `perf/*` metrics: its wall time, and the episodes and generated (response) tokens of the whole
    batch per second of it."""
    return {"perf/step_seconds": step_seconds, "perf/episodes_per_second": episodes / step_seconds,
            "perf/tokens_per_second": episodes * mean_response_tokens / step_seconds}


def fingerprint(config: TrainRun, model_cfg: models.ModelConfig, train_size: int) -> dict[str, Any]:
    """The config values that shape a run's data order (seed, training-set size, batch size) and its state
    (model, critic, reference, dtypes), by dotted name, as JSON values: what a resumed run must share with the
    checkpoint it resumes."""
    rl = config.rl
    values = {"seed": config.seed, "train_size": train_size, "train.batch_size": config.train.batch_size,
              "rl.responses_per_prompt": rl.responses_per_prompt, "rl.use_critic": rl.use_critic,
              "rl.use_reference": rl.use_reference, "rl.compute_dtype": rl.compute_dtype,
              **{f"model.{k}": v for k, v in dataclasses.asdict(model_cfg).items()}}
    return json.loads(json.dumps(values))


def tokenizer_dir(tokenizer: Any) -> str | None:
    """The absolute directory `tokenizer` was loaded from (None for one built in memory): checkpoints record
    it so that an export can write the tokenizer beside the weights."""
    path = getattr(tokenizer, "name_or_path", "")
    return os.path.abspath(path) if path and os.path.isdir(path) else None


def fingerprint_changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Each value that differs between a checkpoint's fingerprint and this run's: "train_size: 32 -> 40"."""
    return [f"{name}: {saved.get(name, 'unset')!r} -> {current.get(name, 'unset')!r}"
            for name in sorted(saved.keys() | current.keys()) if saved.get(name) != current.get(name)]


def lock_workdir(workdir: str) -> WorkdirLock | None:
    """The workdir's lock, taken by process 0 (None on the others); every process raises WorkdirInUseError
    when another run holds it."""
    lock, error = None, ""
    if jax.process_index() == 0:
        try:
            lock = WorkdirLock.acquire(workdir)
        except WorkdirInUseError as e:
            error = str(e)
    if error := distributed.all_processes(error)[0]:
        raise WorkdirInUseError(error)
    return lock


class Trainer:
    """PPO / GRPO / RLOO / REINFORCE++ on one environment, with checkpoints and logs under `workdir`.

    Reads the run's `train`, `rl`, `rollout` and `mesh` groups, its seed and its workdir."""

    def __init__(self, config: TrainRun, model_cfg: models.ModelConfig, policy: dict, tokenizer: Any, env: Env,
                 train_examples: Sequence[dict], eval_examples: Sequence[dict] = (), workdir: str | None = None,
                 hooks: Sequence[TrainHook] = (), critic: dict | None = None):
        """`critic`: the value model a new run's critic starts from (`experiment.load_critic`); None: the
        policy's backbone with a new head. A resumed run takes its checkpoint's critic."""
        self.model_cfg, self.tokenizer, self.env, self.seed = model_cfg, tokenizer, env, config.seed
        if critic is not None and not config.rl.use_critic:
            raise ValueError("config.model.critic_path gives a critic, but rl.use_critic is False")
        self.initial_critic = critic
        self.tokenizer_dir = tokenizer_dir(tokenizer)
        self.train_config, rl, mesh, rollout = config.train, config.rl, config.mesh, config.rollout
        self.train_examples, self.eval_examples = train_examples, list(eval_examples)
        self.workdir = workdir or config.workdir
        self.placement = models.placement_of(mesh)
        self.mesh = self.placement.mesh
        self.ppo = ppo.PPOConfig.create(rl, model_cfg, self.placement.train)
        self.batch_rows = batch_rows(self.train_config, rl)
        self.shards = shards = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if self.batch_rows % shards or self.batch_rows % rl.minibatch_size:
            raise ValueError(f"train.batch_size x rl.responses_per_prompt = {self.batch_rows} rows must be a "
                             f"multiple of the data-parallel size {shards} and of "
                             f"rl.minibatch_size={rl.minibatch_size}.")
        self.rows = distributed.local_rows(self.mesh, self.batch_rows)  # this process's rows of every batch
        self.engine = self._engine(rollout)
        self.eval_engine = self._engine(dataclasses.replace(rollout, sampling=SamplingParams(temperature=0.0)))
        self.order = DataOrder(len(self.train_examples), self.seed)
        self.key, self.eval_key = jax.random.key(self.seed), jax.random.key(0)
        self.resume = config.resume
        self.fingerprint = fingerprint(config, model_cfg, len(self.train_examples))
        self.lock = lock_workdir(self.workdir)
        try:
            self.checkpointer = Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                             max_to_keep=self.train_config.keep_checkpoints,
                                             async_save=self.train_config.async_checkpoints)
            self.state, self.data_position = self._restore_or_init(policy)
            wandb = "wandb" in self.train_config.loggers and dataclasses.is_dataclass(config)
            run = dataclasses.asdict(config) if wandb else None  # the run's config, for W&B
            self.writer = MetricWriter(self.workdir, resume_step=self.step_count,
                                       loggers=self.train_config.loggers, project=self.train_config.project,
                                       config=run)
        except BaseException:
            if self.lock is not None:
                self.lock.release()
            raise
        self.nonfinite_in_a_row = 0
        self.packed_shapes: set[tuple[int, int, int]] = set()  # (width, micro-batches, block pairs) so far
        self.hooks = list(hooks)

    def _engine(self, settings: RolloutConfig, env: Env | None = None, side_branch: bool = True) -> RolloutEngine:
        """A rollout engine of this run (its mesh and layouts, sampling in the dtype the update scores in) with
        `settings` and `env` (default: the training engine's)."""
        return RolloutEngine(self.model_cfg, self.tokenizer, env or self.env, settings,
                             side_branch=side_branch, dtype=self.ppo.rl.compute_dtype, placement=self.placement)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _restore_or_init(self, policy: dict):
        """(state, data position): the newest checkpoint's, checked against this run's fingerprint, or the
        initial ones."""
        latest = self.checkpointer.latest_step()
        if latest is None:
            return self._initial_state(policy), 0
        try:
            latest_record = self.checkpointer.record(latest)
        except Exception:  # unreadable: the restore falls back to an older step, checked below
            latest_record = None
        if latest_record is not None:
            self._check_resume(latest_record, latest)  # before reading any array
        initial = functools.partial(self._initial_state, policy) if self.resume == "force" else None
        state, record = self.checkpointer.restore(abstract_train_state(self.ppo.spec, self.mesh),
                                                  fallback=initial, validate=_not_finite)
        if latest_record is None or int(jax.device_get(state.step)) != latest:  # an older step, unchecked
            self._check_resume(record, int(jax.device_get(state.step)))
        return state, int(record["data_position"])

    def _initial_state(self, policy: dict):
        return init_train_state(self.ppo.spec, self.mesh, policy, jax.random.fold_in(self.key, 0),
                                kl_coef=self.ppo.rl.kl_coef, critic=self.initial_critic)

    def _check_resume(self, record: Mapping[str, Any], step: int) -> None:
        """Raises ResumeMismatchError when checkpoint `step`'s record has another fingerprint than this run
        (a warning instead with config.resume="force", or for a checkpoint saved without one)."""
        where = f"checkpoint step {step} in {self.checkpointer.directory}"
        if FINGERPRINT not in record:
            log.warning("%s has no config fingerprint: resuming it unchecked", where)
            return
        changes = fingerprint_changes(record[FINGERPRINT], self.fingerprint)
        if not changes:
            return
        if self.resume != "force":
            raise ResumeMismatchError(
                f"{where} was saved under another config: {'; '.join(changes)}. Resuming it would read other "
                "training rows or restore another state. Use another --config.workdir, or "
                "--config.resume=force to resume anyway.")
        log.warning("%s was saved under another config (%s); resuming anyway as config.resume=force asks",
                    where, "; ".join(changes))

    @property
    def policy(self) -> dict:
        """The policy's current params (sharded as the train state holds them)."""
        return self.state.policy

    def replace_policy(self, params: dict) -> None:
        """Continues from `params` (e.g. a task hook's distilled policy), placed with the current policy's
        shardings; the optimizer states, critic and reference are kept."""
        placed = jax.tree.map(lambda new, old: jax.device_put(new, old.sharding), params, self.state.policy)
        self.state = self.state._replace(policy=placed)

    def handle(self) -> RunHandle:
        """What a train hook sees of this run now (`searchrl.rl.hooks.RunHandle`)."""
        return RunHandle(step=self.step_count, seed=self.seed, key=self.key, env=self.env,
                         tokenizer=self.tokenizer, train_examples=self.train_examples,
                         max_len=self.engine.config.max_len,
                         local_batches=self.local_batches, roll_out=self._roll_out,
                         observation_text=self.engine.observation_text, fine_tune=self._fine_tune,
                         replace_policy=self.replace_policy)

    def _roll_out(self, examples: Sequence[dict], key: jax.Array, first_row: int = 0, *, env: Env | None = None,
                  sampling: SamplingParams | None = None, prompt_tokens: int | None = None,
                  side_branch: bool = True) -> Trajectory:
        """`RunHandle.roll_out`: the training engine, or one with the call's changes."""
        engine = self.engine
        if env is not None or sampling is not None or prompt_tokens is not None or not side_branch:
            config = engine.config
            settings = dataclasses.replace(config, sampling=sampling or config.sampling,
                                           max_prompt_tokens=prompt_tokens or config.max_prompt_tokens)
            engine = self._engine(settings, env, side_branch=side_branch)
        return engine.run(self.policy, examples, key, first_row=first_row)

    def _fine_tune(self, segments: Sequence[sft.Segments], config: SFTConfig) -> tuple[dict, list[float]]:
        """`RunHandle.fine_tune`: SFT of the current policy on this run's mesh and training layout."""
        return sft.fine_tune(self.model_cfg, self.policy, self.tokenizer, segments, config, self.placement)

    @property
    def step_count(self) -> int:
        return int(jax.device_get(self.state.step))

    def _next_batch(self) -> tuple[list[dict], np.ndarray]:
        """This process's rows of this step's batch (each prompt repeated `responses_per_prompt` times), the
        only examples it reads, and their prompt ids."""
        n = self.ppo.rl.responses_per_prompt
        indices = self.order.take(self.data_position, self.train_config.batch_size)
        self.data_position += len(indices)
        examples = [self.train_examples[i] for i in np.repeat(indices, n)[self.rows]]
        group_ids = np.repeat(np.arange(len(indices), dtype=np.int32), n)[self.rows]
        return examples, group_ids

    def step(self) -> dict[str, float]:
        """One RL iteration; returns its metrics (already written to the logs), with its throughput and wall-clock
        seconds (`perf/step_seconds`: rollout, rewards and update, RPL's Figure 4 training time)."""
        began = time.perf_counter()
        step = self.step_count
        examples, group_ids = self._next_batch()
        self.engine.stats = RolloutStats()
        # The step number reaches the device explicitly: the loop makes no implicit host transfer.
        key = jax.random.fold_in(self.key, jax.device_put(np.uint32(step + 1)))
        traj = self.engine.run(self.state.policy, examples, key, first_row=self.rows.start)
        # Train on the slots the batch uses, padded to one of a few widths (few compiled learn steps).
        longest = max(distributed.all_processes(int(traj.lengths.max())))
        traj = traj.cropped(padded_width(longest, traj.tokens.shape[1]))
        turn_rewards = self.env.rewards(traj, examples)
        rows = dict(tokens=traj.tokens, attention_mask=traj.attention_mask, loss_mask=traj.loss_mask,
                    sampler_logprobs=traj.logprobs, token_rewards=traj.turn_rewards_to_tokens(turn_rewards),
                    group_ids=group_ids)
        if advantages.ADVANTAGES.get(self.ppo.rl.advantage).needs_anchor_states:
            rows["anchor_ids"] = advantages.anchor_state_ids(traj.tokens, traj.loss_mask, group_ids)
        arrays = distributed.host_local_batch_to_global(self.mesh, rows)
        batch = ppo.Batch(**arrays, temperature=traj.logprob_temperature,
                          packing=self._packing(traj.lengths, traj.tokens.shape[1]))
        self.state, learned = ppo.learn(self.state, batch, self.ppo, self.mesh)
        metrics = {k: float(v) for k, v in jax.device_get(learned).items()}
        self.nonfinite_in_a_row = self.nonfinite_in_a_row + 1 if metrics["train/nonfinite"] else 0
        metrics["train/nonfinite_in_a_row"] = float(self.nonfinite_in_a_row)
        # Every env's context consumption and retrieval turns (valid actions answered with an observation, not
        # an invalid turn's feedback): RPL's Figure 4 for any agent.
        row_metrics = [
            {"reward/mean": float(sum(rewards)), "rollout/response_tokens": float(length),
             "rollout/context_tokens": float(context), "rollout/retrieval_turns": float(sum(
                 bool(t.observation) and t.action.kind != INVALID for t in turns))}
            | {f"env/{k}": v for k, v in numeric_metrics(env_metrics).items()}
            for rewards, length, context, turns, env_metrics in zip(
                turn_rewards, traj.response_lengths.tolist(), traj.observation_tokens.tolist(), traj.turns,
                self.env.metrics(traj, examples))]
        stats = self.engine.stats
        processes = distributed.all_processes([row_metrics, stats.host_fraction, stats.wall_s])
        metrics |= mean_metrics([row for process_rows, _, _ in processes for row in process_rows])
        metrics["rollout/host_fraction"] = float(np.mean([fraction for _, fraction, _ in processes]))
        metrics["rollout/seconds"] = max(seconds for _, _, seconds in processes)  # the slowest process's
        metrics |= throughput(time.perf_counter() - began, self.batch_rows, metrics["rollout/response_tokens"])
        self.writer.write(step + 1, metrics)
        if self.nonfinite_in_a_row >= self.train_config.max_nonfinite_steps:
            raise NonFiniteError(
                f"steps {step + 2 - self.nonfinite_in_a_row}..{step + 1}: non-finite rewards, losses or "
                f"gradients {self.nonfinite_in_a_row} steps in a row (train.max_nonfinite_steps="
                f"{self.train_config.max_nonfinite_steps}); no update applied them. Stopping.")
        return metrics

    def _packing(self, lengths: np.ndarray, width: int) -> packing.Packing | None:
        """The step's packed layout (with `rl.pack`) of the batch's rows, of which this process holds those
        of `lengths`, of `width` slots: one packed row a data-parallel shard a micro-batch, at most the
        model's sliding window wide."""
        rl = self.ppo.rl
        if not rl.pack:
            return None
        lengths = np.concatenate([np.asarray(x) for x in distributed.all_processes(lengths.tolist())])
        orders = ppo.update_orders(self.state, self.batch_rows, self.ppo)
        block = models.pair_block(self.ppo.compute.attention)
        plan = packing.pack(lengths, orders, rl.minibatch_size, rl.micro_batch_size, self.shards, width,
                            block, packing.packed_widths(width, block, self.ppo.spec.model.sliding_window))
        shape = (plan.width, plan.micro_batches, plan.block_pairs.shape[-2])
        if shape not in self.packed_shapes:
            self.packed_shapes.add(shape)
            log.info("learn step for packed micro-batches of %d x %d tokens, %d a minibatch, %d block pairs "
                     "a row (%d shapes so far)", self.shards, *shape, len(self.packed_shapes))
        return plan

    def evaluate(self, examples: Sequence[dict] | None = None) -> dict[str, float]:
        """Greedy rollouts of `examples` (default: the eval set) in training-sized batches, each process
        rolling out its rows of each; the env's metrics averaged over the examples."""
        rows = []
        for mine, real, first_row in self.local_batches(self.eval_examples if examples is None else examples):
            traj = self.eval_engine.run(self.state.policy, mine, self.eval_key, first_row=first_row)
            metrics = ([numeric_metrics(m) for m in self.env.metrics(traj.first_rows(real), mine[:real])]
                       if real else [])
            rows += [row for process in distributed.all_processes(metrics) for row in process]
        return mean_metrics(rows)

    def local_batches(self, examples: Sequence[dict]) -> Iterator[tuple[list[dict], int, int]]:
        """`examples` in training-sized batches (the last one padded), as this process rolls them out: its
        rows of each batch, how many of those are real examples (the rest is padding, at the end) and the
        global index of its first row (which its sampling keys are folded from)."""
        return distributed.local_batches(list(examples), self.batch_rows, self.rows)

    def save(self) -> None:
        """Checkpoints the state (never a non-finite one: that raises NonFiniteError)."""
        if not bool(jax.device_get(_all_finite(self.state))):
            raise NonFiniteError(f"the training state at step {self.step_count} is not finite; not saved.")
        self.checkpointer.save(self.step_count, self.state, model=self.model_cfg,
                               record={"data_position": self.data_position, FINGERPRINT: self.fingerprint,
                                       TOKENIZER: self.tokenizer_dir})

    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Runs until `steps` (default: `train.num_steps`, train.steps or train.epochs over the training set)
        PPO iterations are done in total; returns their metrics. Checkpoints every `train.checkpoint_every`
        steps and the last; on SIGTERM, checkpoints the last step done and raises Terminated (module
        docstring)."""
        train = self.train_config
        total = train.num_steps(len(self.train_examples)) if steps is None else steps
        history = []
        console = "console" in train.loggers and jax.process_index() == 0
        progress = Progress(total, self.step_count, train.progress_every_s) if console else None
        try:
            with _StopRequests() as stop:
                while self.step_count < total:
                    if any(distributed.all_processes(stop.requested)):  # every process stops at the same step
                        self._stop()
                    for hook in self.hooks:
                        if hooked := hook.before_step(self.handle()):
                            self.writer.write(self.step_count, hooked)
                    metrics = self.step()
                    history.append(metrics)
                    step = self.step_count
                    if train.eval_every and step % train.eval_every == 0:
                        evaluation = {f"eval/{k}": v for k, v in self.evaluate().items()}
                        self.writer.write(step, evaluation)
                        metrics |= evaluation
                    if step % train.checkpoint_every == 0 or step == total:
                        self.save()
                    if progress is not None:
                        progress.update(step, metrics)
        finally:
            if progress is not None:
                progress.close()
        self.checkpointer.wait_until_finished()
        return history

    def _stop(self) -> None:
        """Checkpoints the last step done (unless it is), waits for the save, raises Terminated."""
        step = self.step_count
        if self.checkpointer.latest_step() != step:
            self.save()
        self.checkpointer.wait_until_finished()
        stopped = Terminated(f"stopped by SIGTERM after step {step}, checkpointed in "
                             f"{self.checkpointer.directory}; the same command resumes the run")
        log.warning("%s", stopped)
        raise stopped

    def close(self) -> None:
        """Finishes pending saves, closes the logs and gives the workdir up."""
        self.checkpointer.close()
        self.writer.close()
        if self.lock is not None:
            self.lock.release()
