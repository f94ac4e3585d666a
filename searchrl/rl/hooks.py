"""A task's extension of the training loop (`TrainHook`, from `searchrl.task.Task.train_hooks`) and the narrow
view of the run it gets (`RunHandle`): what it may read (step, seed, key, env, tokenizer, training examples)
and the few things it may do (roll out examples, fine-tune the policy on text, replace the policy). A hook
never holds the trainer or its rollout engine, so it depends on this module alone.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Protocol, Sequence

import jax

from searchrl.episode import Env, Observation, SamplingParams, Trajectory
from searchrl.rl.config import SFTConfig
from searchrl.rl.sft import Segments


class RollOut(Protocol):
    """Rolls out `examples` (this process's rows of a batch whose first is global row `first_row`) with the
    run's policy and rollout settings; `env`, `sampling` and `prompt_tokens` (the room for a prompt, slots
    added to every row) change them for this call, `side_branch=False` skips the env's side branch."""

    def __call__(self, examples: Sequence[dict], key: jax.Array, first_row: int = 0, *, env: Env | None = None,
                 sampling: SamplingParams | None = None, prompt_tokens: int | None = None,
                 side_branch: bool = True) -> Trajectory:
        ...


@dataclasses.dataclass(frozen=True)
class RunHandle:
    """What a train hook sees of the run before step `step + 1`."""

    step: int  # RL steps done
    seed: int
    key: jax.Array  # the run's key (the hook folds in what it needs)
    env: Env
    tokenizer: Any
    train_examples: Sequence[dict]
    max_len: int  # the most tokens a trajectory holds (`rollout.max_len`)
    # `examples` as this process rolls them out in training-sized batches: (its rows of a batch, how many of
    # them are real examples, the global index of its first row)
    local_batches: Callable[[Sequence[dict]], Iterator[tuple[list[dict], int, int]]]
    roll_out: RollOut
    # an observation's text as a rollout shows it to a row that has used `used` slots (truncated)
    observation_text: Callable[[Observation, int], str]
    # supervised fine-tuning of the policy on (text, trained) segments: the tuned params and the losses
    fine_tune: Callable[[Sequence[Segments], SFTConfig], tuple[dict, list[float]]]
    # continue from these params (placed as the policy is; optimizer states, critic and reference kept)
    replace_policy: Callable[[dict], None]


class TrainHook(Protocol):
    """Runs before each RL step of `Trainer.train` (also the first one after a resume) and returns metrics to
    log at `run.step`; it may replace the policy (`RunHandle.replace_policy`)."""

    def before_step(self, run: RunHandle) -> dict[str, float]:
        ...
