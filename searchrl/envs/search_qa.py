"""Search-R1 / AutoSearch question answering: the policy searches with `<search>` and answers with `<answer>`.

Prompt, action parsing, observation format and the invalid-action message follow Search-R1
(`search_r1/llm_agent/generation.py`), so checkpoints and numbers carry over.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import ml_collections
import numpy as np

from searchrl.envs.base import Action, Observation
from searchrl.retrieval.types import Hit, Retriever
from searchrl.rewards import autosearch, protocol, qa, search_r1
from searchrl.rollout.trajectory import Trajectory, Turn

REWARDS = ("em", "search_r1", "autosearch")

SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Question: {question}\n"
)
INVALID_ACTION = (
    "\nMy previous action is invalid. If I want to search, I should put the query between <search> and </search>. "
    "If I want to give the final answer, I should put the answer between <answer> and </answer>. Let me try again.\n"
)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def format_passages(hits: Sequence[Hit]) -> str:
    """Search-R1's `_passages2string`: one `Doc i(Title: ...) text` line per hit."""
    return "".join(f"Doc {i + 1}(Title: {hit.title}) {hit.text}\n" for i, hit in enumerate(hits))


@dataclasses.dataclass
class SearchQAEnv:
    """Multi-turn retrieval-augmented QA over one retriever. Examples are dicts with a "question"."""

    retriever: Retriever
    topk: int = 3
    max_turns: int = 4
    prompt_template: str = SEARCH_R1_PROMPT
    answer_prompt: str | None = None  # e.g. "\n<answer>" to record AutoSearch's intermediate answers
    reward: str = "search_r1"  # one of REWARDS
    autosearch_config: ml_collections.ConfigDict = dataclasses.field(default_factory=autosearch.default_config)
    stop_strings: tuple[str, ...] = ("</search>", "</answer>")

    def __post_init__(self):
        if self.reward not in REWARDS:
            raise ValueError(f"SearchQAEnv.reward {self.reward!r} is not one of {REWARDS}")
        if self.reward == "autosearch" and self.answer_prompt is None:
            raise ValueError("The autosearch reward needs intermediate answers: set SearchQAEnv.answer_prompt.")

    def prompt(self, example: dict[str, Any]) -> str:
        return self.prompt_template.format(question=example["question"].strip())

    def parse_action(self, turn_text: str, tools_allowed: bool) -> Action:
        """The first `<search>` or `<answer>` block of the turn, as Search-R1's `postprocess_predictions`."""
        match = _ACTION.search(turn_text)
        if match is None:
            return Action("invalid", "no <search> or <answer> block")
        kind, content = match.group(1), match.group(2).strip()
        if kind == "search" and not tools_allowed:
            return Action("invalid", "search is disabled in the final turn")
        return Action(kind, content)

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        """Retrieves for every search action in one batched call; invalid actions get Search-R1's message."""
        queries = [a.content for a in actions if a.kind == "search"]
        results = iter(self.retriever.search(queries, self.topk) if queries else [])
        observations = []
        for action in actions:
            if action.kind == "search":
                hits = next(results)
                text = f"\n\n<information>{format_passages(hits).strip()}</information>\n\n"
                observations.append(Observation(text, tuple(h.id for h in hits)))
            else:
                observations.append(Observation(INVALID_ACTION))
        return observations

    def intermediate_answer_prompt(self) -> str | None:
        return self.answer_prompt

    def rewards(self, trajectory: Trajectory, examples: Sequence[dict[str, Any]]) -> list[list[float]]:
        """Outcome rewards (`em`, `search_r1`) on the last turn, or AutoSearch's turn-level rewards."""
        out = []
        for b, example in enumerate(examples):
            turns, golds = trajectory.turns[b], example["golden_answers"]
            if self.reward == "autosearch":
                record = autosearch_record(turns, trajectory.intermediate_answers[b], golds)
                out.append(autosearch.autosearch_rewards(record, self.autosearch_config).total)
                continue
            if self.reward == "em":
                score = qa.exact_match(_final_answer(turns), golds)
            else:
                score = search_r1.search_r1_reward(trajectory.response_text(b), golds)
            out.append([0.0] * (len(turns) - 1) + [score])
        return out

    def metrics(self, trajectory: Trajectory, examples: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Final-answer EM / F1 / cover-EM, searches per question and the share of well-formed responses."""
        answers = [_final_answer(turns) for turns in trajectory.turns]
        golds = [ex["golden_answers"] for ex in examples]
        valid = [protocol.check_sequence(trajectory.response_text(b)).ok for b in range(len(examples))]
        return {
            "em": float(np.mean([qa.exact_match(a, g) for a, g in zip(answers, golds)])),
            "f1": float(np.mean([qa.f1(a, g) for a, g in zip(answers, golds)])),
            "cover_em": float(np.mean([qa.cover_em(a, g) for a, g in zip(answers, golds)])),
            "searches": float(trajectory.num_searches.mean()),
            "format_valid": float(np.mean(valid)),
        }


def _final_answer(turns: Sequence[Turn]) -> str:
    """The answer of a row's last turn ("" when it did not answer)."""
    last = turns[-1].action if turns else None
    return last.content if last is not None and last.kind == "answer" else ""


def autosearch_record(turns: Sequence[Turn], intermediate: Sequence[str], golds: Sequence[str]
                      ) -> autosearch.AutoSearchRecord:
    """The AutoSearch view of a row: every non-answer turn is a search step (invalid ones with no query and a
    failed format check), the answer turn last; one intermediate answer per real search."""
    answers = iter(intermediate)
    steps, step_answers, answer_turn = [], [], None
    for turn in turns:
        if turn.action.kind == "answer":
            answer_turn = autosearch.AnswerTurn(turn.text, protocol.check_turn(turn.text, "answer").ok)
            continue
        searched = turn.action.kind == "search"
        ok = searched and protocol.check_turn(turn.text, "search").ok
        steps.append(autosearch.SearchTurn(turn.text, turn.action.content if searched else None, ok))
        step_answers.append(next(answers) if searched else None)
    return autosearch.AutoSearchRecord(steps, answer_turn, step_answers, list(golds))
