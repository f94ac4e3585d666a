"""Search QA at a forced search depth: the policy searches exactly k times, then answers (AutoSearch's pilot).

AutoSearch's pilot measures accuracy as a function of how many searches the model *makes*; its public code
(bofusun/AutoSearch @ 75ce1c5) holds the training code only, so the forcing here is this project's design, on
the search-QA env otherwise unchanged (prompt, retriever, observations, metrics):
- turns 0 .. k-1 are search turns. A turn that searches searches its query. A turn that does not (it answered
  early, or wrote no action) is replaced by a search whose query is the turn's own words (its answer, else its
  text without tags, as IRCoT searches with its thoughts); `info["forced"]` marks it.
- the answer after search j is the env's intermediate answer (its side branch: the answer prompt after search
  j's observation, sampled on a copy of the state, or in the public_prompt mode AutoSearch's separate prompt),
  so one run at depth K answers at every depth 1 .. K, each answer the one a run stopped after j searches
  would give (greedy decoding: the same tokens).
- at depth 0 the answer prompt follows the prompt, and turn 0 is the answer (its text up to `</answer>`).
- turn K, after the last search, is the policy's own (an answer; a search there is invalid, as in Search-R1).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from searchrl.episode import Action, Env, Observation, SideBranch, Trajectory, Turn
from searchrl.tasks.autosearch.env import AutoSearchEnv
from searchrl.tasks.autosearch.prompts import continued
from searchrl.tasks.search_r1 import env as search_env
from searchrl.text import chat, tags

_TAGS = tags.tag_pattern(tags.THINK, tags.SEARCH, tags.ANSWER, tags.INFORMATION)


class ForcedSearch(Action):
    """The search the env made of a turn that did not search."""


def own_words(turn_text: str, action: Action) -> str:
    """The query of a turn that did not search: its answer, else its text without tags (whitespace
    collapsed)."""
    text = action.content if action.kind == search_env.ANSWER else _TAGS.sub(" ", turn_text)
    return " ".join(text.split())


@dataclasses.dataclass
class ForcedDepthEnv(Env):
    """`base` (a search-QA env) with exactly `depth` searches per row, an answer after each (module doc)."""

    base: AutoSearchEnv
    depth: int

    def __post_init__(self):
        if self.depth < 0:
            raise ValueError(f"A forced search depth must be >= 0, got {self.depth}")
        config = dataclasses.replace(self.base.config, max_turns=self.depth, intermediate_answers=True)
        self.base = dataclasses.replace(self.base, config=config)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self.base.stop_strings

    @property
    def side_branch(self) -> SideBranch | None:
        return self.base.side_branch

    def side_branch_prompt(self, example: Mapping[str, Any], turns: Sequence[Turn]) -> chat.Prompt:
        return self.base.side_branch_prompt(example, turns)

    @property
    def max_turns(self) -> int:
        return self.depth

    def prompt(self, example: Mapping[str, Any]) -> chat.Prompt:
        prompt = self.base.prompt(example)
        return continued(prompt, self.base.config.answer_prompt) if self.depth == 0 else prompt

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        if self.depth == 0:
            return Action(search_env.ANSWER, tags.until_close(turn_text, tags.ANSWER), done=True)
        action = self.base.parse_action(turn_text, turn_index)
        if turn_index >= self.depth or action.kind == search_env.SEARCH:
            return action
        query = own_words(turn_text, action)[:self.base.config.max_query_chars]
        return ForcedSearch(search_env.SEARCH, query)

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        """The base env's search observations, each marked with whether the env forced the search."""
        return [Observation(obs.text, {**obs.info, "forced": isinstance(action, ForcedSearch)})
                for obs, action in zip(self.base.observe(actions), actions)]

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        return self.base.rewards(trajectory, examples)

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The base env's metrics (with the intermediate answers when the side branch ran), plus "forced":
        whether the env forced each search, in order."""
        rows = self.base.metrics(trajectory, examples)
        for row, turns in zip(rows, trajectory.turns):
            row["forced"] = [bool(t.info.get("forced")) for t in turns if t.action.kind == search_env.SEARCH]
        return rows
