"""What one episode is, for any task: the actions a policy takes, what it observes, its turns and the finished
batch (`Trajectory`), and the `Env` protocol the rollout engine drives.

An environment owns everything task-specific: its prompt, the kinds of action that exist, when an episode ends
(`Action.done`), what each action returns, its per-turn data (`Turn.info`) and its rewards and metrics. It
never touches tokens or arrays: the engine does the tokenising, batching and caching. This module imports
nothing else from searchrl but the config helpers, so every layer above can use it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from searchrl.configlib import group, ranged


@dataclasses.dataclass(frozen=True)
class Action:
    """What one policy turn asked for. `kind` is the env's own word ("search", "answer", "program", ...);
    `content` is its argument (a query, an answer, a program) or why the turn was invalid; `done` ends the
    episode after this turn."""

    kind: str
    content: str
    done: bool = False


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the policy sees after an action that did not end the episode, and the env's data about it
    (e.g. the ids of the documents shown), kept on the turn as `Turn.info`."""

    text: str
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@group
class SamplingParams:
    """Static sampling settings (hashable: part of the compiled program)."""

    temperature: float = ranged(1.0, "[0, inf)")  # 0 = greedy
    top_k: int = ranged(0, "[0, inf)")  # 0 = off
    top_p: float = ranged(1.0, "(0, 1]")  # 1 = off

    @property
    def logprob_temperature(self) -> float:
        """The temperature the log-probabilities are reported (and must be recomputed) at."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class SideBranch:
    """A continuation the engine samples after some turns' observations, on a copy of the rollout state: the
    main trajectory is bit-identical with or without it (AutoSearch's intermediate answers are one).

    After a turn whose action kind is in `after_kinds`, the engine appends the observation and `prompt`,
    samples at most `max_tokens` tokens until a stop string, EOS or the budget, and stores the text (cut after
    the first stop string) in the turn's `info[name]`, sampling with `sampling`. With `separate_prompt`, the branch does not continue the trajectory: it is sampled after
    `env.side_branch_prompt(example, turns_so_far)` (a prompt as `Env.prompt` returns) alone, in an empty
    context; `prompt` then only describes it.
    """

    name: str
    prompt: str
    stop_strings: tuple[str, ...]
    max_tokens: int
    after_kinds: tuple[str, ...]
    sampling: SamplingParams
    separate_prompt: bool = False


@dataclasses.dataclass
class Turn:
    """One policy turn of one row: slots [start, end) of the trajectory, its text and the action it took."""

    start: int
    end: int
    text: str
    action: Action
    observation: str = ""  # the text appended after the turn (as tokenised and truncated), "" for the last
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # the observation's info and side branches

    @property
    def last_token(self) -> int:
        """The slot where a turn-level reward goes."""
        return self.end - 1


FINISH_REASONS = ("done", "length")  # the env ended the episode / the row ran out of slots


@dataclasses.dataclass
class Trajectory:
    """Rows of the static [B, S] slot layout the sampler wrote (slot = RoPE position; no holes)."""

    tokens: np.ndarray  # [B, S] int32
    attention_mask: np.ndarray  # [B, S] bool: slot < length
    loss_mask: np.ndarray  # [B, S] float32: 1 on tokens the policy sampled, 0 on prompt/observations/padding
    logprobs: np.ndarray  # [B, S] float32: sampler log-probabilities at `logprob_temperature`
    prompt_lengths: np.ndarray  # [B] int32
    lengths: np.ndarray  # [B] int32
    turns: list[list[Turn]]
    finish_reasons: list[str]  # one of FINISH_REASONS per row
    logprob_temperature: float = 1.0
    side_branch: str | None = None  # the name of the side branch that ran (its text is in `Turn.info`)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def cropped(self, width: int) -> Trajectory:
        """The same rows with their [B, S] arrays cut to the first `width` slots (all rows must fit)."""
        if width < int(self.lengths.max()):
            raise ValueError(f"Cannot crop to {width} slots: a row holds {int(self.lengths.max())} tokens.")
        arrays = {name: getattr(self, name)[:, :width]
                  for name in ("tokens", "attention_mask", "loss_mask", "logprobs")}
        return dataclasses.replace(self, **arrays)

    def first_rows(self, n: int) -> Trajectory:
        """The first `n` rows (e.g. without the rows that padded a batch to its static size)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name)[:n]
                                            for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), (np.ndarray, list))})

    def response_text(self, row: int) -> str:
        """Everything after the prompt of one row: its turns and the observations between them."""
        return "".join(t.text + t.observation for t in self.turns[row])

    @property
    def response_lengths(self) -> np.ndarray:
        """Policy tokens per row."""
        return self.loss_mask.sum(axis=1).astype(np.int32)

    @property
    def observation_tokens(self) -> np.ndarray:
        """Tokens each row took into its context that the policy did not write, its observations (the prompt
        excluded): RPL's context consumption."""
        slots = np.arange(self.tokens.shape[1])[None, :]
        after_prompt = (slots >= self.prompt_lengths[:, None]) & self.attention_mask
        return (after_prompt & (self.loss_mask == 0)).sum(axis=1)

    def turn_rewards_to_tokens(self, rewards: Sequence[Sequence[float]]) -> np.ndarray:
        """Places per-turn rewards (one list per row, one value per policy turn) on each turn's last token."""
        out = np.zeros(self.tokens.shape, np.float32)
        for b, (row, values) in enumerate(zip(self.turns, rewards)):
            if len(values) != len(row):
                raise ValueError(f"Row {b}: {len(values)} turn rewards for {len(row)} turns.")
            for turn, value in zip(row, values):
                out[b, turn.last_token] += value
        return out


class Env(Protocol):
    """A multi-turn task. `observe` is batched: it receives every row waiting on a tool call at once.

    Everything the rest of searchrl reads of an env is here. An env subclasses `Env` to inherit the defaults
    of the optional members (`max_turns`, `with_max_turns`, `side_branch_prompt`, `reference_response`)."""

    stop_strings: tuple[str, ...]  # a policy turn ends at the first of these (the stop string is kept)
    side_branch: SideBranch | None  # a continuation sampled after some observations, or None
    max_turns: int | None = None  # tool calls an episode may make (its search budget); None: no such limit

    def with_max_turns(self, max_turns: int) -> Env:
        """The same env with another `max_turns` (an evaluation's search budget). Optional."""
        raise ValueError(f"{type(self).__name__} has no search budget (max_turns): evaluate it without budgets.")

    def side_branch_prompt(self, example: Mapping[str, Any], turns: Sequence[Turn]
                           ) -> str | Sequence[Mapping[str, str]]:
        """The prompt of a side branch with its own prompt (`SideBranch.separate_prompt`), after `turns`.
        Required with such a branch."""
        raise NotImplementedError(f"{type(self).__name__} declares a side branch with a separate prompt but no "
                                  "side_branch_prompt.")

    def reference_response(self, example: Mapping[str, Any]) -> str | None:
        """The example's reference response, what a supervised cold start trains on (`searchrl.main sft`);
        None (the default): the example has none."""
        return None

    def prompt(self, example: Mapping[str, Any]) -> str | Sequence[Mapping[str, str]]:
        """The prompt of one example: its full text, or chat messages that the engine renders with the
        tokenizer's chat template (`searchrl.text.chat`; a final assistant message is continued)."""
        ...

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        """The action in one policy turn's text (`turn_index` counts from 0); `done` when the episode ends."""
        ...

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        """Observations for the actions that did not end their episode, all waiting rows in one batch."""
        ...

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        """Per-turn rewards of each row (one value per policy turn, placed on the turn's last token)."""
        ...

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The task's results for each row. Numbers are its metrics (averaged by the trainer, tabulated by the
        evaluation harness, None where one does not apply to the row); other values (an answer) are reported."""
        ...


def outcome_reward(score: float, turns: Sequence[Turn]) -> list[float]:
    """An episode's per-turn rewards for an outcome reward: `score` on its last turn, 0 on the others."""
    return [0.0] * (len(turns) - 1) + [score]


def numeric_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """A row's metrics that are numbers, as floats (bools count as 0 / 1; None: not applicable)."""
    return {name: float(value) for name, value in row.items()
            if isinstance(value, (int, float, np.number, np.bool_))}


def mean_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The mean of each metric over the rows where it is a number (`numeric_metrics`)."""
    values: dict[str, list[float]] = {}
    for row in rows:
        for name, value in numeric_metrics(row).items():
            values.setdefault(name, []).append(value)
    return {name: float(np.mean(v)) for name, v in values.items()}
