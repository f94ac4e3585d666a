"""A batch of finished rollouts, on the host: what rewards, advantages and the PPO update consume."""
from __future__ import annotations

import dataclasses

import numpy as np

from searchrl.envs.base import Action


@dataclasses.dataclass
class Turn:
    """One policy turn of one row: slots [start, end) of the trajectory, its text and the action it took."""

    start: int
    end: int
    text: str
    action: Action
    observation: str = ""  # the text appended after the turn (as tokenised and truncated), "" for the last
    doc_ids: tuple[str, ...] = ()  # what the observation after it returned

    @property
    def last_token(self) -> int:
        """The slot where a turn-level reward goes."""
        return self.end - 1


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
    finish_reasons: list[str]  # "answer", "max_turns", "length"
    intermediate_answers: list[list[str]]  # per row, one per search step (AutoSearch)
    logprob_temperature: float = 1.0

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_searches(self) -> np.ndarray:
        return np.array([sum(t.action.kind == "search" for t in row) for row in self.turns], np.int32)

    @property
    def final_actions(self) -> list[Action | None]:
        return [row[-1].action if row else None for row in self.turns]

    def cropped(self, width: int) -> Trajectory:
        """The same rows with their [B, S] arrays cut to the first `width` slots (all rows must fit)."""
        if width < int(self.lengths.max()):
            raise ValueError(f"Cannot crop to {width} slots: a row holds {int(self.lengths.max())} tokens.")
        arrays = {name: getattr(self, name)[:, :width]
                  for name in ("tokens", "attention_mask", "loss_mask", "logprobs")}
        return dataclasses.replace(self, **arrays)

    def response_text(self, row: int) -> str:
        """Everything after the prompt of one row: its turns and the observations between them."""
        return "".join(t.text + t.observation for t in self.turns[row])

    @property
    def response_lengths(self) -> np.ndarray:
        """Policy tokens per row."""
        return self.loss_mask.sum(axis=1).astype(np.int32)

    def turn_rewards_to_tokens(self, rewards: list[list[float]]) -> np.ndarray:
        """Places per-turn rewards (one list per row, one value per policy turn) on each turn's last token."""
        out = np.zeros(self.tokens.shape, np.float32)
        for b, (row, values) in enumerate(zip(self.turns, rewards)):
            if len(values) != len(row):
                raise ValueError(f"Row {b}: {len(values)} turn rewards for {len(row)} turns.")
            for turn, value in zip(row, values):
                out[b, turn.last_token] += value
        return out
