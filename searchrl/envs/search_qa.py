"""Search-R1 / AutoSearch question answering: the policy searches with `<search>` and answers with `<answer>`.

Prompt, action parsing, observation format and the invalid-action message follow Search-R1
(`search_r1/llm_agent/generation.py`), so checkpoints and numbers carry over.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

from searchrl.envs.base import Action, Observation
from searchrl.retrieval.types import Hit, Retriever

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
    stop_strings: tuple[str, ...] = ("</search>", "</answer>")

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
