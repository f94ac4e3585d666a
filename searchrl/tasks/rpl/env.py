"""Retrieval Program Learning: the policy writes programs over the retrieval SDK instead of one query a
turn.

A turn is `<program> ... </program>` (a program in `searchrl.programs`' language, run in its sandbox against
the task's retrievers; the documents it `show`s come back in `<information>`) or the final `<answer>`. The
action space is the set of SDK functions programs may call (the paper's Table 4): `dense` (dense retrieval
only), `dual` (sparse and dense), `sdk` (all five: sparse, dense, fuse, dedup, rerank); program mutation (PM)
is a training schedule on top of `sdk`. Two more spaces: `sparse` (sparse retrieval, fuse and dedup, for a
corpus with no dense index), and `search`, the AutoSearch-style baseline: a turn is one `<search> query
</search>` whose top `search_top_k` passages come back, as in Search-R1, with their ids so that GlobalQA
answers can name them; it is scored and measured exactly as programs are.

Two kinds of example: open-domain QA ({"question", "golden_answers"}, EM reward) and GlobalQA-style
corpus-level tasks (metadata "type" in GLOBALQA_TYPES, "evidence_ids"; golden_answers are document ids),
rewarded with answer F1 over document ids; their dF1 is the F1 of every document shown against the evidence.
An answer names documents by id (`cite="id"`, as in the paper: "Doc <id>(Title: ...) text" lines), or by the
number each shown document has in its episode (`cite="rank"`: Search-R1's own "Doc <n>(Title: ...) text"
lines, numbered on across turns), which the env maps back to ids before scoring. A model trained from scratch
learns to cite a number it was shown far sooner than to copy a multi-token id (the RPL miniature).
Per episode the env reports context tokens consumed (observation tokens), retrieval calls, retrieval turns and
which SDK functions the programs called.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Mapping, Sequence

from searchrl.configlib import group, ranged
from searchrl.episode import Action, Env, Observation, Trajectory, Turn, outcome_reward
from searchrl.retrieval import RetrievalConfig, is_dense, load_retriever, make_retriever
from searchrl.retrieval.types import Hit, search_or_explain
from searchrl.tasks.rpl.config import MutationConfig
from searchrl.tasks.rpl.limits import Limits
from searchrl.tasks.rpl.sandbox import execute
from searchrl.tasks.rpl.sdk import SDK_FUNCTIONS, RetrievalSDK
from searchrl.text import chat, qa, tags
from searchrl.text.protocol import INVALID, final_answer, tool_or_answer

PROGRAM, SEARCH, ANSWER = tags.PROGRAM, tags.SEARCH, tags.ANSWER  # the action kinds, with INVALID
ACTION_SPACES = {"dense": ("dense_retrieval",), "dual": ("sparse_retrieval", "dense_retrieval"),
                 "sdk": SDK_FUNCTIONS, "sparse": ("sparse_retrieval", "fuse", "dedup"),
                 "search": ("sparse_retrieval",)}
GLOBALQA_TYPES = ("topk", "count", "sort", "minmax")
CITES = ("id", "rank")  # how observations name documents, and so how answers cite them
_FENCE = "```"

RPL_PROMPT = (
    "Answer the given question. You can retrieve documents by writing a program between <program> and "
    "</program>. A program is Python with these functions: {functions}, and show(docs), which puts documents "
    "into your context; they come back between <information> and </information>. Keep what you show short: "
    "only shown documents enter your context. When you can answer, give the answer between <answer> and "
    "</answer>{answer_hint}. Question: {question}\n"
)
SEARCH_PROMPT = (  # Search-R1's prompt, with documents named by id
    "Answer the given question. You can search by writing a query between <search> and </search>; the top "
    "documents come back between <information> and </information>. You can search as many times as you want. "
    "When you can answer, give the answer between <answer> and </answer>{answer_hint}. Question: {question}\n"
)
SIGNATURES = {  # how the prompt lists each SDK function
    "sparse_retrieval": "sparse_retrieval(q, top_k)", "dense_retrieval": "dense_retrieval(q, top_k)",
    "fuse": "fuse(*lists, top_k=None)", "dedup": "dedup(docs)", "rerank": "rerank(q, docs, top_k=None)"}
GLOBALQA_HINTS = {  # per cite
    "id": " (for questions about documents, the ids of the documents, separated by commas)",
    "rank": " (for questions about documents, the numbers of the documents, separated by commas)"}


@group
class Config:
    """`config.env` of `rpl`."""

    action_space: str = "sdk"  # one of ACTION_SPACES
    # program (or search) turns; the turn after the last one must answer
    max_turns: int = ranged(2, "[0, inf)")
    prompt_template: str = ""  # fields {question}, {functions}, {answer_hint}; "": the space's default prompt
    search_top_k: int = ranged(3, "[1, inf)")  # passages per query in the `search` space (Search-R1's topk)
    dense_index_dir: str = ""  # the dense index (config.retrieval's index is the sparse one)
    reranker_dir: str = ""  # a BERT cross-encoder (HF dir) for `rerank`; "": cosine with the dense encoder
    chat_template: bool = False  # render the prompt as a user message with the tokenizer's chat template
    enable_thinking: bool = True  # with the chat template: Qwen3's thinking switch
    limits: Limits = Limits()  # the sandbox's limits per program
    cite: str = "id"  # one of CITES: GlobalQA answers name shown documents by id or by their number
    mutation: MutationConfig = MutationConfig()  # program mutation inside an RL run (its train hook)


@dataclasses.dataclass(frozen=True)
class NumberedAction(Action):
    """A retrieval turn under `cite="rank"`: the documents it shows are numbered from `first_number` (a turn
    shows at most `docs_per_turn`, so numbers never repeat within an episode)."""

    first_number: int = 1


def is_globalqa(example: Mapping[str, Any]) -> bool:
    return (example.get("metadata") or {}).get("type") in GLOBALQA_TYPES


def program_span(content: str) -> slice:
    """Where the program of a `<program>` block's content is: inside a Markdown code fence when there is one
    (its language line skipped), without the whitespace around it."""
    start, stop = _stripped(content, 0, len(content))
    text = content[start:stop]
    if text.startswith(_FENCE) and text.endswith(_FENCE) and len(text) >= 2 * len(_FENCE):
        start, stop = start + len(_FENCE), stop - len(_FENCE)
        first, newline, _ = content[start:stop].partition("\n")
        if first.strip().isidentifier() or not first.strip():
            start = min(start + len(first) + len(newline), stop)
        start, stop = _stripped(content, start, stop)
    return slice(start, stop)


def _stripped(text: str, start: int, stop: int) -> tuple[int, int]:
    """text[start:stop]'s bounds without the whitespace at its ends."""
    part = text[start:stop]
    lead = len(part) - len(part.lstrip())
    return start + lead, max(start + lead, stop - (len(part) - len(part.rstrip())))


def program_source(content: str) -> str:
    """The program of a `<program>` block, without a Markdown code fence around it (`program_span`)."""
    return content[program_span(content)]


def parse_ids(answer: str) -> list[str]:
    """Document ids in an answer ("p12, p40", "[12] [40]", "Doc 12 and doc 40."), in order, without repeats:
    every run of letters, digits, "_" and "-" that holds a digit, "-" stripped from its ends (one pass, no
    regular expression)."""
    words = "".join(c if c.isalnum() or c in "_-" else " " for c in answer).split()
    return list(dict.fromkeys(w.strip("-") for w in words if any(c.isdigit() for c in w)))


def format_documents(hits: Sequence[Hit], first_number: int | None = None) -> str:
    """Search-R1's passage lines, each document named by its id, or (`first_number` given) numbered on from
    `first_number` as Search-R1 numbers its ranks."""
    names = ([hit.id for hit in hits] if first_number is None
             else range(first_number, first_number + len(hits)))
    return "".join(f"Doc {name}(Title: {hit.title}) {hit.text}\n" for name, hit in zip(names, hits))


def named_documents(info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, id) of each document a turn showed, as its observation named it: by the number it was given
    (`info["first_number"]`, `cite="rank"`) or by its id."""
    first = info.get("first_number")
    return [(doc if first is None else str(first + i), doc) for i, doc in enumerate(info.get("doc_ids", ()))]


def cited_ids(answer: str, turns: Sequence[Turn]) -> list[str]:
    """The document ids an answer cites: each name `parse_ids` finds, as the episode's observations named a
    document (`named_documents`); a name no shown document had stays as written, and so counts as a wrong
    document."""
    return _cited(answer, [named for turn in turns for named in named_documents(turn.info)])


def _cited(answer: str, shown: Sequence[tuple[str, str]]) -> list[str]:
    """`cited_ids` over the (name, id) of every document shown, a later name over an earlier one."""
    named = dict(shown)
    return list(dict.fromkeys(named.get(name, name) for name in parse_ids(answer)))


def globalqa_scores(answer: str, shown: Sequence[tuple[str, str]], example: Mapping[str, Any]
                    ) -> dict[str, float]:
    """A GlobalQA answer's scores: answer F1 of the ids it cites (`shown`: (name, id) of each document shown,
    in order) against golden_answers, and dF1 of the documents shown against metadata.evidence_ids."""
    return {"answer_f1": set_f1(_cited(answer, shown), example["golden_answers"]),
            "doc_f1": set_f1([doc for _, doc in shown], example["metadata"]["evidence_ids"])}


def set_f1(predicted: Sequence[str], gold: Sequence[str]) -> float:
    """F1 of two id sets (0 when either is empty)."""
    predicted, gold = set(predicted), set(gold)
    common = len(predicted & gold)
    if not common:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


class ProgramEnv(Env):
    """Multi-turn RPL over a sparse and / or a dense retriever."""

    side_branch = None

    def __init__(self, config: Config, sdk: RetrievalSDK):
        if config.action_space not in ACTION_SPACES:
            raise ValueError(f"config.env.action_space {config.action_space!r} is not one of "
                             f"{sorted(ACTION_SPACES)}")
        if config.max_turns < 0:
            raise ValueError(f"config.env.max_turns must be >= 0, got {config.max_turns}")
        if config.cite not in CITES:
            raise ValueError(f"config.env.cite {config.cite!r} is not one of {CITES}")
        self.config, self.sdk = config, sdk
        self.tool = SEARCH if config.action_space == "search" else PROGRAM
        self.docs_per_turn = config.search_top_k if self.tool == SEARCH else config.limits.max_shown
        self.stop_strings = (tags.close_tag(self.tool), tags.close_tag(tags.ANSWER))

    def prompt(self, example: Mapping[str, Any]) -> str | chat.Chat:
        functions = ", ".join(SIGNATURES[name] for name in self.sdk.available)
        hint = GLOBALQA_HINTS[self.config.cite] if is_globalqa(example) else ""
        template = self.config.prompt_template or (SEARCH_PROMPT if self.tool == SEARCH else RPL_PROMPT)
        text = (template.replace("{functions}", functions)
                .replace("{answer_hint}", hint).replace("{question}", example["question"]))
        if not self.config.chat_template:
            return text
        return chat.Chat(tuple(chat.messages("", text)), {"enable_thinking": self.config.enable_thinking})

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        noun = "programs" if self.tool == PROGRAM else "searches"
        action = tool_or_answer(turn_text, turn_index, self.config.max_turns, self.tool,
                                f"no complete <{self.tool}> or <answer> block",
                                f"no more {noun}: this turn must answer")
        if self.config.cite == "rank" and action.kind == self.tool:
            first = turn_index * self.docs_per_turn + 1
            return NumberedAction(action.kind, action.content, action.done, first)
        return action

    def run(self, source: str, first_number: int | None = None) -> Observation:
        """One program in the sandbox; what it showed (or its error) as the observation."""
        result = execute(program_source(source), self.sdk, self.config.limits)
        error = f"program error: {result.error}" if result.error else ""
        return _observation(result.shown, result.retrieval_calls, tuple(sorted(result.primitives)), error,
                            first_number)

    def search(self, queries: Sequence[str], first_numbers: Sequence[int | None] | None = None
               ) -> list[Observation]:
        """The `search` space's turns: each query's top `search_top_k` passages, in one batched call; a query
        that cannot be searched (blank, too long, not text, refused) is told why, as the search env does."""
        if self.sdk.sparse is None:
            raise ValueError("the search action space needs a sparse retriever (config.retrieval)")
        outcomes = search_or_explain(self.sdk.sparse, [q.strip() for q in queries], self.config.search_top_k)
        numbers = first_numbers or [None] * len(outcomes)
        return [_observation([], 0, (), outcome, first) if isinstance(outcome, str)
                else _observation(outcome, 1, ("sparse_retrieval",), "", first)
                for outcome, first in zip(outcomes, numbers)]

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        """Each action's observation: the searches in one batched call, the programs each in its own sandbox,
        run concurrently (a program waits on its retrieval calls; the sandboxes share nothing)."""
        searches = [a for a in actions if a.kind == SEARCH]
        searched = iter(self.search([a.content for a in searches], [_first_number(a) for a in searches]))
        programs = [a for a in actions if a.kind == PROGRAM]
        with concurrent.futures.ThreadPoolExecutor(max(len(programs), 1)) as pool:
            ran = iter(list(pool.map(lambda a: self.run(a.content, _first_number(a)), programs)))
        return [next(ran) if a.kind == PROGRAM else next(searched) if a.kind == SEARCH else
                Observation(f"\n\n{tags.block(tags.INFORMATION, 'invalid action: ' + a.content)}\n\n")
                for a in actions]

    def _scores(self, turns: Sequence[Turn], example: Mapping[str, Any]) -> dict[str, float]:
        answer = final_answer(turns)
        golds = list(example["golden_answers"])
        if is_globalqa(example):
            return globalqa_scores(answer, [named for turn in turns for named in named_documents(turn.info)],
                                   example)
        return {"em": qa.exact_match(answer, golds), "f1": qa.f1(answer, golds)}

    def episode_reward(self, turns: Sequence[Turn], example: Mapping[str, Any]) -> float:
        """One episode's reward: EM for QA, answer F1 over document ids for GlobalQA."""
        scores = self._scores(turns, example)
        return scores.get("answer_f1", scores.get("em", 0.0))

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        """The episode's reward (`episode_reward`) on its last turn."""
        return [outcome_reward(self.episode_reward(turns, example), turns)
                for turns, example in zip(trajectory.turns, examples)]

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Per episode: the answer, the task type (a GlobalQA type or "qa") and its scores, the context tokens
        consumed (observation tokens), retrieval calls, retrieval turns (programs or searches), program errors
        and, per SDK function, whether a turn called it (1 / 0)."""
        context = trajectory.observation_tokens
        rows = []
        for b, (turns, example) in enumerate(zip(trajectory.turns, examples)):
            programs = [t for t in turns if t.action.kind == self.tool]
            called = {name for t in programs for name in t.info.get("primitives", ())}
            rows.append({
                "question": example["question"], "answer": final_answer(turns),
                "task_type": example["metadata"]["type"] if is_globalqa(example) else "qa",
                **self._scores(turns, example),
                "context_tokens": int(context[b]), "retrieval_turns": len(programs),
                "retrieval_calls": sum(t.info.get("retrieval_calls", 0) for t in programs),
                "program_errors": sum(t.info.get("error") is not None for t in programs),
                **{f"uses_{name}": float(name in called) for name in SDK_FUNCTIONS}})
        return rows


def _first_number(action: Action) -> int | None:
    return action.first_number if isinstance(action, NumberedAction) else None


def _observation(shown: Sequence[Hit], retrieval_calls: int, primitives: tuple[str, ...], error: str,
                 first_number: int | None = None) -> Observation:
    """The `<information>` block of the shown documents (or of an error) and what the metrics count; the
    documents are numbered from `first_number` when it is given (`cite="rank"`), else named by id."""
    text = "\n".join(part for part in (format_documents(shown, first_number).strip(), error) if part)
    info = {"doc_ids": tuple(hit.id for hit in shown), "retrieval_calls": retrieval_calls,
            "primitives": primitives, "error": error or None}
    if first_number is not None:
        info["first_number"] = first_number
    return Observation(f"\n\n{tags.block(tags.INFORMATION, text or 'nothing was shown')}\n\n", info)


def make(config: Config, retrieval: RetrievalConfig) -> ProgramEnv:
    """The env over config.retrieval's index (the sparse retriever, or the dense one when it is a dense
    index), config.env.dense_index_dir and config.env.reranker_dir, exposing the action space's functions."""
    if config.action_space not in ACTION_SPACES:
        raise ValueError(f"config.env.action_space {config.action_space!r} is not one of "
                         f"{sorted(ACTION_SPACES)}")
    first = make_retriever(retrieval)
    first_is_dense = retrieval.kind == "local" and is_dense(retrieval.index_dir)
    sparse, dense = (None, first) if first_is_dense else (first, None)
    if config.dense_index_dir:
        dense = load_retriever(config.dense_index_dir)
    reranker = None
    if config.reranker_dir:
        from searchrl.retrieval.rerank import CrossEncoderReranker  # JAX and transformers: only when asked
        reranker = CrossEncoderReranker.from_pretrained(config.reranker_dir)
    sdk = RetrievalSDK(sparse=sparse, dense=dense, reranker=reranker,
                       available=ACTION_SPACES[config.action_space])
    return ProgramEnv(config, sdk)
