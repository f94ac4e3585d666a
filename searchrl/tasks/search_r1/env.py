"""Search-R1 question answering: the policy searches with `<search>` and answers with `<answer>`.

Prompt, action parsing, observation format and the invalid-action message follow Search-R1
(`search_r1/llm_agent/generation.py`), so checkpoints and numbers carry over. Rewards are registered by name in
`REWARDS` (`config.env.reward`); a task building on this env (AutoSearch) adds its own there.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from searchrl.configlib import group, ranged
from searchrl.episode import Action, Env, Observation, SideBranch, Trajectory, Turn, outcome_reward
from searchrl.registry import Registry
from searchrl.retrieval import RetrievalConfig, make_retriever
from searchrl.retrieval.types import Hit, Retriever, search_or_explain
from searchrl.tasks.search_r1 import rewards
from searchrl.text import protocol, qa, tags
from searchrl.text.protocol import INVALID, final_answer, tool_or_answer

SEARCH, ANSWER = tags.SEARCH, tags.ANSWER  # the action kinds, with INVALID

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


@group
class Config:
    """`config.env` of `search_r1`."""

    reward: str = "search_r1"  # a name in REWARDS
    topk: int = ranged(3, "[1, inf)")  # passages per search
    # longer queries are not searched: the observation says so (server's limit)
    max_query_chars: int = ranged(4096, "[1, inf)")
    max_turns: int = ranged(4, "[0, inf)")  # search turns; the turn after the last one must answer
    prompt_template: str = SEARCH_R1_PROMPT
    search_r1: rewards.RewardConfig = rewards.RewardConfig()  # reward="search_r1"'s scores


@dataclasses.dataclass(frozen=True)
class Reward:
    """A reward of the search env: `fn(env, trajectory, row, example)` gives the row's per-turn rewards;
    `side_branch` names the side branch whose outputs it reads (the env must run it), or None."""

    fn: Callable[[Any, Trajectory, int, Mapping[str, Any]], list[float]]
    side_branch: str | None = None


REWARDS: Registry[Reward] = Registry("search reward", "config.env.reward")


def format_passages(hits: Sequence[Hit]) -> str:
    """Search-R1's `_passages2string`: per hit, `Doc i(Title: <first line of its contents>) <the rest>`, the
    title line as stored (quotes and all)."""
    lines = []
    for i, hit in enumerate(hits):
        title, _, text = hit.contents.partition("\n")
        lines.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(lines)


def search_observation(outcome: Sequence[Hit] | str) -> Observation:
    """A search's hits, or why it has none, in an `<information>` block; info: the doc ids and the error."""
    if isinstance(outcome, str):
        return Observation(f"\n\n{tags.block(tags.INFORMATION, outcome)}\n\n",
                           {"doc_ids": (), "error": outcome})
    text = f"\n\n{tags.block(tags.INFORMATION, format_passages(outcome).strip())}\n\n"
    return Observation(text, {"doc_ids": tuple(h.id for h in outcome), "error": None})


@dataclasses.dataclass
class SearchEnv(Env):
    """Multi-turn retrieval-augmented QA over one retriever. Examples are dicts with a "question" and
    "golden_answers"."""

    retriever: Retriever
    config: Config = Config()
    stop_strings: tuple[str, ...] = (tags.close_tag(tags.SEARCH), tags.close_tag(tags.ANSWER))

    def __post_init__(self):
        needs = REWARDS.get(self.config.reward).side_branch
        if needs is not None and (self.side_branch is None or self.side_branch.name != needs):
            raise ValueError(f"config.env.reward={self.config.reward!r} reads the {needs!r} side branch, "
                             f"which this env ({type(self).__name__}) does not run.")

    @property
    def side_branch(self) -> SideBranch | None:
        return None

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    def with_max_turns(self, max_turns: int) -> SearchEnv:
        """The same env with another search budget (the accuracy-vs-budget curve)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, max_turns=max_turns))

    def prompt(self, example: Mapping[str, Any]) -> str:
        return self.config.prompt_template.format(question=example["question"].strip())

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        """The first `<search>` or `<answer>` block of the turn, as Search-R1's `postprocess_predictions`.

        An answer ends the episode, and so does the turn after the last search turn, whatever it holds.
        """
        return tool_or_answer(turn_text, turn_index, self.config.max_turns, SEARCH,
                              "no <search> or <answer> block", "search is disabled in the final turn")

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        """Retrieves for every search action in one batched call; invalid actions get Search-R1's message.

        A search that cannot be made is the policy's observation, the same for every retriever: a query that
        is empty, blank, over `max_query_chars` or not valid text (a lone surrogate) is not searched and the
        observation names the problem. When the batched call refuses a query for its text (`QueryRefused`),
        each query is searched alone and one refused is told why. Any other retrieval failure stops the run
        (the error is raised): the retriever is down (`RetrievalUnavailable`, its retries used up) or
        refused the request for something no query did.
        """
        outcomes = iter(search_or_explain(self.retriever, [a.content for a in actions if a.kind == SEARCH],
                                          self.config.topk, self.config.max_query_chars))
        return [search_observation(next(outcomes)) if a.kind == SEARCH else Observation(INVALID_ACTION)
                for a in actions]

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        """Each row's per-turn rewards, from the reward `config.env.reward` names."""
        reward = REWARDS.get(self.config.reward).fn
        return [reward(self, trajectory, b, example) for b, example in enumerate(examples)]

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Per question: the final answer, its EM / F1 / cover-EM, the searches made and whether the response
        is well-formed."""
        rows = []
        for b, example in enumerate(examples):
            turns, golds = trajectory.turns[b], list(example["golden_answers"])
            answer = final_answer(turns)
            rows.append({
                "question": example["question"], "golden_answers": golds, "answer": answer,
                **qa.scores(answer, golds), "searches": searches(turns),
                "format_valid": float(protocol.check_sequence(trajectory.response_text(b)).ok),
            })
        return rows


def em_reward(env: SearchEnv, trajectory: Trajectory, b: int, example: Mapping[str, Any]) -> list[float]:
    """Search-R1 v0.2's reward: exact match of the final answer."""
    turns = trajectory.turns[b]
    return outcome_reward(qa.exact_match(final_answer(turns), example["golden_answers"]), turns)


def search_r1_reward(env: SearchEnv, trajectory: Trajectory, b: int, example: Mapping[str, Any]
                     ) -> list[float]:
    """Search-R1 v0.3's format-aware reward on the whole response."""
    score = rewards.search_r1_reward(trajectory.response_text(b), example["golden_answers"],
                                     env.config.search_r1)
    return outcome_reward(score, trajectory.turns[b])


REWARDS.register("em")(Reward(em_reward))
REWARDS.register("search_r1")(Reward(search_r1_reward))


def make(config: Config, retrieval: RetrievalConfig) -> SearchEnv:
    """The env of `config.env` over the retriever of `config.retrieval`."""
    return SearchEnv(make_retriever(retrieval), config)


def searches(turns: Sequence[Turn]) -> int:
    return sum(turn.action.kind == SEARCH for turn in turns)


