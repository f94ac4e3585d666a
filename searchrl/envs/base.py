"""The environment interface the rollout engine drives: one module per task implements it.

An environment owns its prompt, how a policy turn's text becomes an action, and what the policy observes back.
It never touches tokens or arrays: the engine does the tokenising, batching and caching.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Literal, Protocol, Sequence

if TYPE_CHECKING:
    from searchrl.rollout.trajectory import Trajectory

ActionKind = Literal["search", "answer", "program", "invalid"]


@dataclasses.dataclass(frozen=True)
class Action:
    """What one policy turn asked for. `content` is the query, answer or program text, or why it was invalid."""

    kind: ActionKind
    content: str

    @property
    def ends_episode(self) -> bool:
        return self.kind == "answer"


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the policy sees after a non-final action, and what produced it."""

    text: str
    doc_ids: tuple[str, ...] = ()


class Env(Protocol):
    """A multi-turn task. `observe` is batched: it receives every row waiting on a tool call at once."""

    stop_strings: tuple[str, ...]  # a policy turn ends at the first of these (the stop string is kept)
    max_turns: int  # tool-using turns; the turn after the last one cannot use tools

    def prompt(self, example: dict[str, Any]) -> str:
        """The full prompt text for one example (chat template applied)."""
        ...

    def parse_action(self, turn_text: str, tools_allowed: bool) -> Action:
        """The action in one policy turn's text. With tools disallowed every non-answer action is invalid."""
        ...

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        """Observations for non-final actions (tool calls and invalid actions), all rows in one batch."""
        ...

    def intermediate_answer_prompt(self) -> str | None:
        """Text appended after an observation to elicit an intermediate answer (AutoSearch), or None for none."""
        ...

    def rewards(self, trajectory: Trajectory, examples: Sequence[dict[str, Any]]) -> list[list[float]]:
        """Per-turn rewards of each row (one value per policy turn, placed on the turn's last token)."""
        ...

    def metrics(self, trajectory: Trajectory, examples: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Task metrics of a batch (e.g. exact match, searches per question), averaged over rows."""
        ...
