"""AutoSearch's env: Search-R1's search env that answers after every search, on a side branch, and is rewarded
per turn for format, answer-quality gains and stopping at the minimal sufficient search depth; the rewards of
its RL baselines (StepSearch, HiPRAG: `baseline_rewards`) are registered here too.

The side branch (`intermediate_answers`) answers the question after every search (AutoSearch's
self-answering): the AutoSearch reward and the minimal-sufficient-depth metric read those answers.
`intermediate_answer_mode` says how they are elicited: "continuation" appends `answer_prompt` to the trajectory;
"public_prompt" samples AutoSearch's separate chat prompt holding the question and the trajectory so far
(`public_answer_prompt`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from searchrl.configlib import group, ranged
from searchrl.episode import SamplingParams, SideBranch, Trajectory, Turn, outcome_reward
from searchrl.retrieval import RetrievalConfig, make_retriever
from searchrl.tasks.autosearch import baseline_rewards, rewards
from searchrl.tasks.search_r1 import env as search_r1
from searchrl.tasks.search_r1.env import ANSWER, REWARDS, SEARCH, Reward, SearchEnv
from searchrl.text import chat, protocol, qa, tags

INTERMEDIATE_ANSWER = "intermediate_answer"  # the side branch's name, the key of its text in `Turn.info`

ANSWER_PROMPT = "\n" + tags.open_tag(tags.ANSWER)  # elicits an intermediate answer after a search
CONTINUATION, PUBLIC_PROMPT = "continuation", "public_prompt"  # the intermediate answer modes
# AutoSearch's separate prompt for an intermediate answer, byte for byte: github.com/bofusun/AutoSearch
# verl/trainer/main_ppo_format_turn_new78.py:421-438 (RewardManager.__call__), the system and user messages
# of the ChatML text it writes out, which Qwen2.5's chat template renders identically.
PUBLIC_ANSWER_SYSTEM = "You are a helpful assistant."
PUBLIC_ANSWER_USER = (
    "Answer the given question according to search trajectories, which consists of multiple reasoning, "
    "search calls, and retrieved informations.\n"
    "Important instructions:\n"
    "1) You must conduct reasoning inside <think> and </think> first.\n"
    "2) After reasoning, output the final answer wrapped in <answer> and </answer>.\n"
    "For example: <think>Reasoning</think><answer>Jaden Smith</answer>\n"
    "Search trajectory: Question: {question}\n\n"
    "Below are your previous reasoning, search calls, and retrieved informations:\n{trajectory}\n\n."
)


@group
class Config(search_r1.Config):
    """`config.env` of `autosearch`: Search-R1's, with the intermediate answers and AutoSearch's reward."""

    reward: str = "autosearch"  # a name in searchrl.tasks.search_r1.env.REWARDS ("stepsearch", "hiprag", ...)
    intermediate_answers: bool = True  # answer after every search on a side branch
    intermediate_answer_mode: str = CONTINUATION  # or PUBLIC_PROMPT (module doc)
    answer_prompt: str = ANSWER_PROMPT  # continuation: appended after a search's observation to elicit it
    intermediate_answer_tokens: int = ranged(32, "[1, inf)")  # budget of one intermediate answer
    intermediate_answer_sampling: SamplingParams = SamplingParams(temperature=0.0)  # greedy by default
    autosearch: rewards.RewardConfig = rewards.RewardConfig()
    stepsearch: baseline_rewards.StepSearchConfig = baseline_rewards.StepSearchConfig()  # reward="stepsearch"
    hiprag: baseline_rewards.HiPRAGConfig = baseline_rewards.HiPRAGConfig()  # reward="hiprag"


def side_branch(config: Config) -> SideBranch | None:
    """The intermediate answers `config` asks for, as a side branch after every search (None: off)."""
    if not config.intermediate_answers:
        return None
    public = config.intermediate_answer_mode == PUBLIC_PROMPT
    return SideBranch(INTERMEDIATE_ANSWER, PUBLIC_ANSWER_USER if public else config.answer_prompt,
                      (tags.close_tag(tags.ANSWER),), config.intermediate_answer_tokens,
                      after_kinds=(SEARCH,), sampling=config.intermediate_answer_sampling,
                      separate_prompt=public)


@dataclasses.dataclass
class AutoSearchEnv(SearchEnv):
    """The search env with an intermediate answer after every search (when `config.intermediate_answers`)."""

    config: Config = Config()

    def __post_init__(self):
        if self.config.intermediate_answer_mode not in (CONTINUATION, PUBLIC_PROMPT):
            raise ValueError(f"config.env.intermediate_answer_mode {self.config.intermediate_answer_mode!r} "
                             f"is not one of {(CONTINUATION, PUBLIC_PROMPT)}")
        super().__post_init__()

    @property
    def side_branch(self) -> SideBranch | None:
        return side_branch(self.config)

    def side_branch_prompt(self, example: Mapping[str, Any], turns: Sequence[Turn]) -> list[dict[str, str]]:
        """The public_prompt mode's prompt for the answer after the last of `turns`: the question and every
        turn so far with its observation."""
        return public_answer_prompt(example["question"], "".join(t.text + t.observation for t in turns))

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The search env's metrics, the question's hop count (None outside synthetic worlds) and, when the
        intermediate answers ran, those answers and the minimal sufficient depth."""
        rows = super().metrics(trajectory, examples)
        for row, example in zip(rows, examples):
            row["hops"] = hop_count(example)
        if trajectory.side_branch == INTERMEDIATE_ANSWER:
            mode = self.config.intermediate_answer_mode
            for row, turns in zip(rows, trajectory.turns):
                row["intermediate_answers"] = intermediate_answers(turns, mode)
                row["depth"] = minimal_sufficient_depth(row["golden_answers"], row["intermediate_answers"],
                                                        row["answer"], row["searches"])
        return rows


def hop_count(example: Mapping[str, Any]) -> int | None:
    """metadata.hops of a synthetic-world record as an int (None when absent)."""
    hops = (example.get("metadata") or {}).get("hops")
    if hops is None:
        return None
    try:
        return int(hops)
    except (TypeError, ValueError):
        raise ValueError(f"Question {example.get('id')!r} of {example.get('dataset')!r}: metadata.hops "
                         f"must be an integer, got {hops!r}") from None


def autosearch_reward(env: AutoSearchEnv, trajectory: Trajectory, b: int, example: Mapping[str, Any]
                      ) -> list[float]:
    """AutoSearch's turn-level rewards (`rewards.autosearch_rewards`) of row b."""
    record = autosearch_record(trajectory.turns[b], example["golden_answers"],
                               env.config.intermediate_answer_mode)
    return rewards.autosearch_rewards(record, env.config.autosearch).total


def stepsearch_reward(env: AutoSearchEnv, trajectory: Trajectory, b: int, example: Mapping[str, Any]
                      ) -> list[float]:
    """StepSearch's per-turn rewards (`baseline_rewards.stepsearch_rewards`) of row b."""
    cfg = env.config.stepsearch
    record = baseline_rewards.stepsearch_record(trajectory.turns[b], example, cfg)
    return baseline_rewards.stepsearch_rewards(record, cfg).total


def hiprag_reward(env: AutoSearchEnv, trajectory: Trajectory, b: int, example: Mapping[str, Any]
                  ) -> list[float]:
    """HiPRAG's outcome-plus-process score (`baseline_rewards.hiprag_rewards`) of row b, on its last turn."""
    turns = trajectory.turns[b]
    record = autosearch_record(turns, example["golden_answers"], env.config.intermediate_answer_mode)
    format_ok = protocol.check_sequence(trajectory.response_text(b)).ok
    return outcome_reward(baseline_rewards.hiprag_rewards(record, format_ok, env.config.hiprag).score, turns)


REWARDS.register("autosearch")(Reward(autosearch_reward, side_branch=INTERMEDIATE_ANSWER))
REWARDS.register("stepsearch")(Reward(stepsearch_reward))
REWARDS.register("hiprag")(Reward(hiprag_reward, side_branch=INTERMEDIATE_ANSWER))


def make(config: Config, retrieval: RetrievalConfig) -> AutoSearchEnv:
    """The env of `config.env` over the retriever of `config.retrieval`."""
    return AutoSearchEnv(make_retriever(retrieval), config)


def public_answer_prompt(question: str, trajectory: str) -> list[dict[str, str]]:
    """AutoSearch's separate prompt for an intermediate answer, as chat messages (PUBLIC_ANSWER_USER). The
    question is its first line, as the public code reads it back from the prompt
    (`_extract_original_question`, main_ppo_format_turn_new78.py:270-277)."""
    question = question.strip().partition("\n")[0].strip()
    user = PUBLIC_ANSWER_USER.format(question=question, trajectory=trajectory)
    return chat.messages(PUBLIC_ANSWER_SYSTEM, user)


def intermediate_answer(turn: Turn, mode: str = CONTINUATION) -> str | None:
    """The answer elicited after a search turn, or None: the side branch's text up to `</answer>` (after the
    continuation's `<answer>`), or (public_prompt) its first `<answer>` block, else all of it, as the public
    `_extract_final_answer` (main_ppo_format_turn_new78.py:263-267)."""
    text = turn.info.get(INTERMEDIATE_ANSWER)
    if text is None:
        return None
    if mode == CONTINUATION:
        return tags.until_close(text, tags.ANSWER)
    block = tags.first_block(text, tags.ANSWER)
    return text.strip() if block is None else block[1]


def intermediate_answers(turns: Sequence[Turn], mode: str = CONTINUATION) -> list[str]:
    """The answers elicited after a row's search turns, in order."""
    return [answer for turn in turns if (answer := intermediate_answer(turn, mode)) is not None]


def minimal_sufficient_depth(golds: Sequence[str], intermediate: Sequence[str], final: str,
                             num_searches: int) -> int | None:
    """The first search step after which the policy's answer is an exact match, or None.

    Step j's answer is its intermediate answer; the final answer (given after the last search) also counts, at
    depth `num_searches`, so a right final answer without any search is depth 0. Unlike the reward's
    `rewards.minimal_depth` (which needs d < n: a later search to penalise), every step counts here.
    """
    for step, answer in enumerate(intermediate, start=1):
        if qa.exact_match(answer, golds):
            return step
    return num_searches if qa.exact_match(final, golds) else None


def autosearch_record(turns: Sequence[Turn], golds: Sequence[str],
                      mode: str = CONTINUATION) -> rewards.AutoSearchRecord:
    """The AutoSearch view of a row: every non-answer turn is a search step (invalid ones with no query and a
    failed format check), the answer turn last; each real search with its intermediate answer."""
    steps, step_answers, answer_turn = [], [], None
    for turn in turns:
        if turn.action.kind == ANSWER:
            answer_turn = rewards.AnswerTurn(turn.text, protocol.check_turn(turn.text, ANSWER).ok)
            continue
        searched = turn.action.kind == SEARCH
        ok = searched and protocol.check_turn(turn.text, SEARCH).ok
        steps.append(rewards.SearchTurn(turn.text, turn.action.content if searched else None, ok))
        step_answers.append(intermediate_answer(turn, mode) if searched else None)
    return rewards.AutoSearchRecord(steps, answer_turn, step_answers, list(golds))
