"""Search-R1 / AutoSearch question answering: the policy searches with `<search>` and answers with `<answer>`.

Prompt, action parsing, observation format and the invalid-action message follow Search-R1
(`search_r1/llm_agent/generation.py`), so checkpoints and numbers carry over. With `intermediate_answers` on,
the env declares a side branch that answers the question after every search (AutoSearch's self-answering): the
AutoSearch reward and the minimal-sufficient-depth metric read those answers. `intermediate_answer_mode` says
how they are elicited: "continuation" appends `answer_prompt` to the trajectory; "public_prompt" samples
AutoSearch's separate chat prompt holding the question and the trajectory so far (`public_answer_prompt`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from searchrl.envs import INVALID, final_answer, tool_or_answer
from searchrl.episode import Action, Observation, SamplingParams, SideBranch, Trajectory, Turn
from searchrl.retrieval import make_retriever
from searchrl.retrieval.types import Hit, RetrievalError, Retriever, search_each
from searchrl.rewards import autosearch, protocol, qa, search_r1
from searchrl.text import chat, tags

REWARDS = ("em", "search_r1", "autosearch")
SEARCH, ANSWER = tags.SEARCH, tags.ANSWER  # the action kinds, with INVALID
INTERMEDIATE_ANSWER = "intermediate_answer"  # the side branch's name, the key of its text in `Turn.info`

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


@dataclasses.dataclass(frozen=True)
class Config:
    """`config.env` of `search_qa` (with `name="search_qa"`)."""

    reward: str = "search_r1"  # one of REWARDS
    topk: int = 3  # passages per search
    max_query_chars: int = 4096  # longer queries are not searched: the observation says so (server's limit)
    max_turns: int = 4  # search turns; the turn after the last one must answer
    prompt_template: str = SEARCH_R1_PROMPT
    intermediate_answers: bool = False  # answer after every search on a side branch (AutoSearch)
    intermediate_answer_mode: str = CONTINUATION  # or PUBLIC_PROMPT (module doc)
    answer_prompt: str = ANSWER_PROMPT  # continuation: appended after a search's observation to elicit it
    intermediate_answer_tokens: int = 32  # budget of one intermediate answer
    intermediate_answer_sampling: SamplingParams = SamplingParams(temperature=0.0)  # greedy by default
    search_r1: search_r1.RewardConfig = search_r1.RewardConfig()  # reward="search_r1"'s scores
    autosearch: autosearch.RewardConfig = autosearch.RewardConfig()


def format_passages(hits: Sequence[Hit]) -> str:
    """Search-R1's `_passages2string`: per hit, `Doc i(Title: <first line of its contents>) <the rest>`, the
    title line as stored (quotes and all)."""
    lines = []
    for i, hit in enumerate(hits):
        title, _, text = hit.contents.partition("\n")
        lines.append(f"Doc {i + 1}(Title: {title}) {text}\n")
    return "".join(lines)


def query_problem(query: str, max_chars: int) -> str | None:
    """Why a query is not searched, or None."""
    if not query.strip():
        return "The search query is empty."
    if len(query) > max_chars:
        return f"The search query has {len(query)} characters, more than {max_chars}: use a shorter one."
    return None


def search_observation(outcome: Sequence[Hit] | str) -> Observation:
    """A search's hits, or why it has none, in an `<information>` block; info: the doc ids and the error."""
    if isinstance(outcome, str):
        return Observation(f"\n\n{tags.block(tags.INFORMATION, outcome)}\n\n",
                           {"doc_ids": (), "error": outcome})
    text = f"\n\n{tags.block(tags.INFORMATION, format_passages(outcome).strip())}\n\n"
    return Observation(text, {"doc_ids": tuple(h.id for h in outcome), "error": None})


@dataclasses.dataclass
class SearchQAEnv:
    """Multi-turn retrieval-augmented QA over one retriever. Examples are dicts with a "question" and
    "golden_answers"."""

    retriever: Retriever
    config: Config = Config()
    stop_strings: tuple[str, ...] = (tags.close_tag(tags.SEARCH), tags.close_tag(tags.ANSWER))

    def __post_init__(self):
        if self.config.reward not in REWARDS:
            raise ValueError(f"config.env.reward {self.config.reward!r} is not one of {REWARDS}")
        if self.config.reward == "autosearch" and not self.config.intermediate_answers:
            raise ValueError("The autosearch reward needs intermediate answers: set "
                             "config.env.intermediate_answers=True.")
        if self.config.intermediate_answer_mode not in (CONTINUATION, PUBLIC_PROMPT):
            raise ValueError(f"config.env.intermediate_answer_mode {self._mode!r} is not one of "
                             f"{(CONTINUATION, PUBLIC_PROMPT)}")

    @property
    def max_turns(self) -> int:
        return self.config.max_turns

    def with_max_turns(self, max_turns: int) -> SearchQAEnv:
        """The same env with another search budget (the accuracy-vs-budget curve)."""
        return dataclasses.replace(self, config=dataclasses.replace(self.config, max_turns=max_turns))

    @property
    def _mode(self) -> str:
        return self.config.intermediate_answer_mode

    @property
    def side_branch(self) -> SideBranch | None:
        if not self.config.intermediate_answers:
            return None
        public, sampling = self._mode == PUBLIC_PROMPT, self.config.intermediate_answer_sampling
        return SideBranch(INTERMEDIATE_ANSWER, PUBLIC_ANSWER_USER if public else self.config.answer_prompt,
                          (tags.close_tag(tags.ANSWER),), self.config.intermediate_answer_tokens,
                          after_kinds=(SEARCH,), temperature=sampling.temperature, top_k=sampling.top_k,
                          top_p=sampling.top_p, separate_prompt=public)

    def side_branch_prompt(self, example: Mapping[str, Any], turns: Sequence[Turn]) -> list[dict[str, str]]:
        """The public_prompt mode's prompt for the answer after the last of `turns`: the question and every
        turn so far with its observation."""
        return public_answer_prompt(example["question"], "".join(t.text + t.observation for t in turns))

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
        is empty, blank or over `max_query_chars` is not searched and the observation names the problem. When
        the batched call raises `RetrievalError`, each query is searched alone and one whose search fails is
        told why. The run stops instead (the error is raised) when the retriever is down: it raised
        `RetrievalUnavailable` (its retries used up), or no query could be searched even alone.
        """
        outcomes = iter(self._search([a.content for a in actions if a.kind == SEARCH]))
        return [search_observation(next(outcomes)) if a.kind == SEARCH else Observation(INVALID_ACTION)
                for a in actions]

    def _search(self, queries: list[str]) -> list[list[Hit] | str]:
        """Each query's hits, or why it has none."""
        problems = [query_problem(q, self.config.max_query_chars) for q in queries]
        valid = [q for q, problem in zip(queries, problems) if problem is None]
        results = iter(self._retrieve(valid) if valid else [])
        return [next(results) if problem is None else problem for problem in problems]

    def _retrieve(self, queries: list[str]) -> list[list[Hit] | str]:
        """Each query's hits, or why its search failed (see `observe` for when it raises)."""
        return [f"The search failed: {outcome}"[:500] if isinstance(outcome, RetrievalError) else outcome
                for outcome in search_each(self.retriever, queries, self.config.topk)]

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        """Outcome rewards (`em`, `search_r1`) on the last turn, or AutoSearch's turn-level rewards."""
        out = []
        for b, example in enumerate(examples):
            turns, golds = trajectory.turns[b], example["golden_answers"]
            if self.config.reward == "autosearch":
                record = autosearch_record(turns, golds, self._mode)
                out.append(autosearch.autosearch_rewards(record, self.config.autosearch).total)
                continue
            if self.config.reward == "em":
                score = qa.exact_match(final_answer(turns), golds)
            else:
                score = search_r1.search_r1_reward(trajectory.response_text(b), golds,
                                                   **dataclasses.asdict(self.config.search_r1))
            out.append([0.0] * (len(turns) - 1) + [score])
        return out

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Per question: the final answer, its EM / F1 / cover-EM, the searches made, whether the response is
        well-formed and, when the intermediate answers ran, those answers and the minimal sufficient depth."""
        rows = []
        for b, example in enumerate(examples):
            turns, golds = trajectory.turns[b], list(example["golden_answers"])
            answer = final_answer(turns)
            row = {
                "question": example["question"], "golden_answers": golds, "answer": answer,
                **qa.scores(answer, golds), "searches": searches(turns),
                "format_valid": float(protocol.check_sequence(trajectory.response_text(b)).ok),
            }
            if trajectory.side_branch == INTERMEDIATE_ANSWER:
                row["intermediate_answers"] = intermediate_answers(turns, self._mode)
                row["depth"] = minimal_sufficient_depth(golds, row["intermediate_answers"], answer,
                                                        row["searches"])
            rows.append(row)
        return rows


def make(config: Config, retrieval: Mapping[str, Any]) -> SearchQAEnv:
    """The env of `config.env` over the retriever of `config.retrieval`."""
    return SearchQAEnv(make_retriever(retrieval), config)


def searches(turns: Sequence[Turn]) -> int:
    return sum(turn.action.kind == SEARCH for turn in turns)


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
    `autosearch.minimal_depth` (which needs d < n: a later search to penalise), every step counts here.
    """
    for step, answer in enumerate(intermediate, start=1):
        if qa.exact_match(answer, golds):
            return step
    return num_searches if qa.exact_match(final, golds) else None


def autosearch_record(turns: Sequence[Turn], golds: Sequence[str],
                      mode: str = CONTINUATION) -> autosearch.AutoSearchRecord:
    """The AutoSearch view of a row: every non-answer turn is a search step (invalid ones with no query and a
    failed format check), the answer turn last; each real search with its intermediate answer."""
    steps, step_answers, answer_turn = [], [], None
    for turn in turns:
        if turn.action.kind == ANSWER:
            answer_turn = autosearch.AnswerTurn(turn.text, protocol.check_turn(turn.text, ANSWER).ok)
            continue
        searched = turn.action.kind == SEARCH
        ok = searched and protocol.check_turn(turn.text, SEARCH).ok
        steps.append(autosearch.SearchTurn(turn.text, turn.action.content if searched else None, ok))
        step_answers.append(intermediate_answer(turn, mode) if searched else None)
    return autosearch.AutoSearchRecord(steps, answer_turn, step_answers, list(golds))
