"""Scripted search trajectories for the supervised cold start: search each hop of a question's plan — sometimes
once more than needed — then answer.

The extra search looks up the final answer itself (a "verification" search), so the cold-started policy
over-searches on some questions: the behaviour AutoSearch's efficiency reward is there to remove. Its passage,
titled with the answer's name, gives a half-copied answer a second chance (docs/autosearch.md). A search that
brings nothing new was tried instead: the last hop's subject with the answer, which finds the passage the
answer was read from again for 95% of bridges. The final answer then copied the policy's own query, often
mis-copied, and cold-start 1-hop EM fell to 0.23 and 0.16 (seeds 0 and 1), though the answer before that
search was right on half of those questions. Observations come from the real environment (its retriever and
its formatting), batched in one call.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from searchrl.episode import Action
from searchrl.tasks.search_r1.env import SEARCH, SearchEnv
from searchrl.text import tags

SEARCH_THOUGHT = tags.block(tags.THINK, " I need to search. ")
ANSWER_THOUGHT = tags.block(tags.THINK, " I can answer. ")

Segments = list[tuple[str, bool]]  # (text, is_policy)


def search_turn(query: str) -> str:
    return SEARCH_THOUGHT + tags.block(tags.SEARCH, f" {query} ")


def answer_turn(answer: str) -> str:
    return ANSWER_THOUGHT + tags.block(tags.ANSWER, f" {answer} ")


def plan_queries(example: dict[str, Any], extra_search: bool) -> list[str]:
    """The plan's queries, plus a verification search for the answer when `extra_search`."""
    meta = example["metadata"]
    return list(meta["plan"]) + ([meta["hop_answers"][-1]] if extra_search else [])


def scripted_trajectories(examples: Sequence[dict[str, Any]], env: SearchEnv, extra_search_fraction: float,
                          seed: int) -> list[Segments]:
    """One segment list per example: prompt, then (search turn, observation) per query, then the answer turn."""
    rng = np.random.default_rng(seed)
    queries = [plan_queries(ex, bool(rng.random() < extra_search_fraction)) for ex in examples]
    observations = iter(env.observe([Action(SEARCH, q) for qs in queries for q in qs]))
    out = []
    for example, qs in zip(examples, queries):
        segments: Segments = [(env.prompt(example), False)]
        for query in qs:
            segments += [(search_turn(query), True), (next(observations).text, False)]
        segments.append((answer_turn(example["golden_answers"][0]), True))
        out.append(segments)
    return out


def early_answers(examples: Sequence[dict[str, Any]], trajectories: Sequence[Segments], fraction: float,
                  seed: int, answer_prompt: str) -> list[Segments]:
    """For a random `fraction` of the trajectories that searched once more than their plan, the intermediate
    answer the environment elicits just before that extra search: the answer straight from the last hop's
    passage, after the env's `answer_prompt` (which must open the scripted answer turn, so that the elicited
    answer reads exactly like the policy's own).

    Without these, answering from the last hop's passage is practised only on the trajectories that stop
    there, while copying the answer into the verification query is practised on every other one, so stopping
    early costs the cold-started policy accuracy. With all of them, the direct answer becomes the better one
    and RL stops early whatever the efficiency reward says.
    """
    if not answer_turn("x").startswith(answer_prompt):
        raise ValueError(f"The answer prompt {answer_prompt!r} does not open the scripted answer turn "
                         f"{answer_turn('x')!r}: set config.env.answer_prompt to its opening.")
    rng = np.random.default_rng(seed)
    out = []
    for example, segments in zip(examples, trajectories):
        # A trajectory holds the prompt, a (search, observation) pair per query, and the answer.
        if len(segments) > 2 * len(example["metadata"]["plan"]) + 2 and rng.random() < fraction:
            answer = answer_turn(example["golden_answers"][0]).removeprefix(answer_prompt)
            out.append(list(segments[:-3]) + [(answer_prompt, False), (answer, True)])
    return out


def turn_prefixes(trajectories: Sequence[Segments], policy_turns: int) -> list[Segments]:
    """Each trajectory cut after its first `policy_turns` policy turns (and the observations between them).

    Two-turn prefixes hold both copies a search agent makes (the question's subject into the first query, a
    name or value from the retrieved passage into the answer or the next query) in a third of a trajectory's
    tokens: a cheap first SFT stage for a model that has to learn copying from scratch.
    """
    if policy_turns < 1:
        raise ValueError(f"policy_turns must be at least 1, got {policy_turns}")
    out = []
    for segments in trajectories:
        ends = [i for i, (_, is_policy) in enumerate(segments) if is_policy]
        out.append(list(segments[: ends[min(policy_turns, len(ends)) - 1] + 1]))
    return out
