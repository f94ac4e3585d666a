"""DeepRetrieval query rewriting: one turn in which the policy rewrites the user's query (or writes SQL),
and a reward from what a real retriever (or database) returns for it, with no reference query.

The policy answers `<think>...</think><answer>{"query": "..."}</answer>` (`{"sql": ...}` for SQL;
without reasoning just the answer). Four task families, each with its data format
(`config.data.format`), retriever, reward (`rewards.deepretrieval`) and evaluation metrics:

- literature: data `literature` (relevant ids); retriever: PubMed / CT.gov engine;
  reward: tiered recall of the top `depth`; eval: recall@depth.
- evidence: data `qa` (gold answers); retriever: BM25 over passages;
  reward: tiered rank of the first answer; eval: hit@1 / hit@5 / hit@20.
- classic: data `beir` (graded qrels); retriever: BM25 or dense (FAISS);
  reward: gated NDCG@ndcg_k (3000); eval: ndcg@10, recall@10/100.
- sql: data `spider` / `bird` (gold SQL + db); retriever: the example's SQLite db;
  reward: gated execution match; eval: execution_accuracy.

Rewards retrieve for the whole batch in one call; the metrics reuse those results and, with
`compare_raw`, score the user's own query too (`raw_*`), so the evaluation prints raw and rewritten
side by side.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from typing import Any, Mapping, Sequence

from searchrl.configlib import group, ranged
from searchrl.episode import Action, Env, Observation, Trajectory, outcome_reward
from searchrl.retrieval import make_retriever
from searchrl.retrieval import metrics as ir
from searchrl.retrieval.types import MAX_QUERY_CHARS, Hit, Retriever, search_or_explain
from searchrl.tasks.deepretrieval import prompts
from searchrl.tasks.deepretrieval import rewards as dr
from searchrl.text import chat, tags

TASKS = ("literature", "evidence", "classic", "sql")
REWRITE, INVALID = "rewrite", "invalid"  # the action kinds: a parsed query (or SQL), or why there is none
_TIERED = ("literature", "evidence")  # the tasks with tiered rewards; the others are gated
_HIT_KS = (1, 5, 20)  # evidence: hit@k of the first passage that holds an answer
_RECALL_KS = (10, 100)  # classic: recall@k next to ndcg@ndcg_k_eval
_SCORING_THREADS = 8  # rows scored at once (their SQL runs in that many sandbox workers at most)
DATE_FLOOR = "1970/01/01"  # a literature search's earliest publication date (the public code's mindate)


@group
class Config:
    """`config.env` of `query_rewrite` (with `name="query_rewrite"`)."""

    task: str = "evidence"  # one of TASKS
    reasoning: bool = True  # <think> before the answer; False: the paper's no-reasoning ablation
    chat_template: bool = False  # render the prompt with the tokenizer's chat template (instruct models)
    # A custom prompt: the user message ({question}, and {schema} / {knowledge} for SQL), the system message
    # and the assistant's first words. Empty user_template: the paper's prompt for task and reasoning.
    user_template: str = ""
    system: str = ""
    assistant_prefix: str = ""
    # docs retrieved per query: the cut-off of the reward's recall, rank tiers and NDCG
    depth: int = ranged(3000, "[1, inf)")
    compare_raw: bool = True  # metrics also score the user's own query (raw_*)
    # a longer rewrite is not searched: it retrieves nothing
    max_query_chars: int = ranged(MAX_QUERY_CHARS, "[1, inf)")
    reward: dr.RewardConfig = dr.RewardConfig()


@dataclasses.dataclass(frozen=True)
class RowResult:
    """One row's parsed answer, the metric its reward uses (None when nothing was parsed) and its eval
    metrics."""

    parsed: dr.ParsedAnswer
    reward_metric: float | None
    metrics: dict[str, float]


def plain_text(system: str, user: str, assistant: str) -> str:
    """The prompt of a base model (no chat template): the public code's layout, `Assistant:` before the
    assistant's first words."""
    return (f"{system}\n" if system else "") + f"{user}\nAssistant: {assistant}"


class QueryRewriteEnv(Env):
    """Single-turn query rewriting over one retriever (None for SQL, whose examples name their database).

    Examples: {"question", ...} plus "golden_answers" (evidence), "qrels" (literature, classic) or "db_path"
    and "gold_sql" (sql), as `searchrl.data.datasets.load_examples` reads them.
    """

    side_branch = None

    def __init__(self, config: Config, retriever: Retriever | None):
        if config.task not in TASKS:
            raise ValueError(f"config.env.task {config.task!r} is not one of {TASKS}")
        if config.task != "sql" and retriever is None:
            raise ValueError(f"config.env.task {config.task!r} needs a retriever (config.retrieval)")
        if config.depth < 1:
            raise ValueError(f"config.env.depth must be >= 1, got {config.depth}")
        self.config, self.retriever = config, retriever
        self.key = "sql" if config.task == "sql" else "query"
        paper = prompts.PROMPTS[config.task, config.reasoning]
        self.template = (prompts.TaskPrompt(config.system, config.user_template, config.assistant_prefix)
                         if config.user_template else paper)
        self.stop_strings = (tags.close_tag(tags.ANSWER),)
        self._last: tuple[Trajectory, Sequence, list[RowResult]] | None = None  # reused by metrics
        self._raw: dict[tuple[str, str], dict[str, float]] = {}  # raw-query metrics by (question, example id)

    def prompt(self, example: Mapping[str, Any]) -> str | list[dict[str, str]]:
        user = prompts.user_message(self.template.user, example)
        if self.config.chat_template:
            return chat.messages(self.template.system, user, self.template.assistant)
        return plain_text(self.template.system, user, self.template.assistant)

    def parse(self, response: str) -> dr.ParsedAnswer:
        """The answer of a response, read with the prompt's assistant prefix before it (the prefix may open
        `<think>` or `<answer>`, which the tag check counts)."""
        return dr.parse_json_answer(self.template.assistant + response, self.key, self.config.reasoning)

    def target_response(self, value: str, reasoning: str = "") -> str:
        """The response that writes `value` (a query or SQL) after the prompt's assistant prefix, in the
        public prompts' layout: `<think>\n...\n</think>\n<answer>\n{json}\n</answer>` (without the think
        block when the task has no reasoning). Cold starts train on it."""
        answer = (f"{tags.open_tag(tags.ANSWER)}\n{json.dumps({self.key: value})}\n"
                  f"{tags.close_tag(tags.ANSWER)}")
        full = (f"{tags.open_tag(tags.THINK)}\n{reasoning}\n{tags.close_tag(tags.THINK)}\n" + answer
                if self.config.reasoning else answer)
        prefix = self.template.assistant
        opened = prefix[prefix.rfind("<"):] if "<" in prefix else ""
        response = full[len(opened):] if opened and full.startswith(opened) else full
        if self.parse(response).value != value:
            raise ValueError(f"The assistant prefix {prefix!r} does not open the answer layout {full!r}: a "
                             "cold start cannot write its responses.")
        return response

    def reference_response(self, example: Mapping[str, Any]) -> str | None:
        """An example's supervised response for a cold start: the SQL tasks write the gold SQL after the
        example's "reasoning" (with `reasoning` off, the gold SQL alone, as the public SFT's wo_reasoning
        keeps only the answer); the retrieval tasks have no reference query (None). A reasoning cold start
        on an example without reasoning is an error: it would train an empty `<think>`."""
        if self.config.task != "sql":
            return None
        reasoning = example.get("reasoning", "") if self.config.reasoning else ""
        if self.config.reasoning and not reasoning:
            raise ValueError(f"SQL example {example.get('id')!r} ({example.get('dataset', '?')}) has no "
                             "\"reasoning\": a cold start with reasoning would train an empty <think>; add the "
                             "data's reasoning or use the preset's ,no_reasoning variant.")
        return self.target_response(example["gold_sql"], reasoning)

    def parse_action(self, turn_text: str, turn_index: int) -> Action:
        parsed = self.parse(turn_text)
        if parsed.value is None:
            return Action(INVALID, parsed.reason, done=True)
        return Action(REWRITE, parsed.value, done=True)

    def observe(self, actions: Sequence[Action]) -> list[Observation]:
        raise RuntimeError("query_rewrite episodes are one turn long: every action ends its episode")

    def max_date(self, example: Mapping[str, Any]) -> str:
        """The publication-date cut-off a search for `example` keeps to ("" for none): a literature example's
        "max_date"."""
        return (example.get("max_date") or "") if self.config.task == "literature" else ""

    def _retriever_for(self, max_date: str) -> Retriever:
        """The retriever restricted to what was published from DATE_FLOOR to `max_date` (as the public code's
        PubMed search passes mindate and maxdate): request parameters, never query text, so no query can
        switch the filter off."""
        if not max_date:
            return self.retriever
        restrict = getattr(self.retriever, "published_between", None)
        if restrict is None:
            raise ValueError(f"a literature example has max_date {max_date!r}, but the retriever "
                             f"({type(self.retriever).__name__}) cannot filter by publication date: use "
                             "config.retrieval.kind='pubmed', or examples without a max_date")
        return restrict(DATE_FLOOR, max_date)

    def _search(self, searches: Sequence[tuple[str, str]]) -> dict[tuple[str, str], list[Hit]]:
        """Every distinct (query, max_date) retrieved, one batched call per date cut-off. A query that
        cannot be searched (blank, over `max_query_chars`, not valid text) or that the retriever refuses for
        its text (`QueryRefused`, e.g. a Boolean query the search engine cannot parse) retrieves nothing;
        any other failure (the retriever down, a request it refuses as too large) raises: it is not the
        policy's doing, and scoring it as retrieving nothing would fake the rewards."""
        by_date: dict[str, list[str]] = {}
        for query, max_date in dict.fromkeys(searches):
            by_date.setdefault(max_date, []).append(query)
        found = {}
        for max_date, queries in by_date.items():
            for query, hits in zip(queries, self._retrieve(self._retriever_for(max_date), queries)):
                found[query, max_date] = hits
        return found

    def _retrieve(self, retriever: Retriever, queries: list[str]) -> list[list[Hit]]:
        """Each query's hits; [] for one that cannot be searched or is refused for its text (`_search`)."""
        outcomes = search_or_explain(retriever, queries, self.config.depth, self.config.max_query_chars)
        return [[] if isinstance(outcome, str) else outcome for outcome in outcomes]

    def _score(self, value: str, example: Mapping[str, Any], hits: Sequence[Hit] | None
               ) -> tuple[float, dict[str, float]]:
        """(the metric the reward uses, the eval metrics) of one query (or SQL) for one example."""
        cfg, task = self.config.reward, self.config.task
        if task == "sql":
            score, _ = dr.sql_execution_match(example["db_path"], value, example["gold_sql"], cfg)
            return score, {"execution_accuracy": float(score == 1.0)}
        ids = [hit.id for hit in hits]
        if task == "evidence":
            rank = ir.first_answer_rank([hit.contents for hit in hits], example["golden_answers"])
            return dr.answer_rank_score(rank, cfg), {f"hit@{k}": float(rank is not None and rank <= k)
                                                     for k in _HIT_KS}
        qrels = example["qrels"]
        if task == "literature":
            recall = ir.recall_at_k(ids, qrels, len(ids))
            return dr.recall_score(recall, cfg), {f"recall@{self.config.depth}": recall}
        return ir.ndcg_at_k(ids, qrels, cfg.ndcg_k), {
            f"ndcg@{cfg.ndcg_k_eval}": ir.ndcg_at_k(ids, qrels, cfg.ndcg_k_eval),
            **{f"recall@{k}": ir.recall_at_k(ids, qrels, k) for k in _RECALL_KS}}

    def _missing_metrics(self, example: Mapping[str, Any]) -> dict[str, float]:
        """The eval metrics of a row with no query: nothing retrieved, nothing found."""
        if self.config.task == "sql":
            return {"execution_accuracy": 0.0}
        _, zeros = self._score("", example, [])
        return zeros

    def results(self, responses: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> list[RowResult]:
        """Each row's parsed answer and scores; the retrieval for the whole batch is one call."""
        parsed = [self.parse(r) for r in responses]
        searches = [None if p.value is None else (p.value, self.max_date(ex))
                    for p, ex in zip(parsed, examples)]
        hits = self._search([s for s in searches if s is not None]) if self.retriever else {}

        def result(answer: dr.ParsedAnswer, search, example: Mapping[str, Any]) -> RowResult:
            if answer.value is None:
                return RowResult(answer, None, self._missing_metrics(example))
            return RowResult(answer, *self._score(answer.value, example, hits.get(search)))

        # Rows score concurrently: SQL runs in a pool of sandbox workers (`sql_sandbox.WORKER`).
        with concurrent.futures.ThreadPoolExecutor(_SCORING_THREADS) as pool:
            return list(pool.map(result, parsed, searches, examples))

    def _batch_results(self, trajectory: Trajectory,
                       examples: Sequence[Mapping[str, Any]]) -> list[RowResult]:
        """`results` of a finished batch, computed once for its rewards and its metrics."""
        if self._last is None or self._last[0] is not trajectory or self._last[1] is not examples:
            responses = [trajectory.response_text(b) for b in range(len(examples))]
            self._last = (trajectory, examples, self.results(responses, examples))
        return self._last[2]

    def reward(self, row: RowResult) -> float:
        """Format term plus the retrieval metric, as the task's public reward computes it."""
        combine = dr.tiered_reward if self.config.task in _TIERED else dr.gated_reward
        return combine(row.parsed, row.reward_metric, self.config.reward)

    def rewards(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[list[float]]:
        rows = self._batch_results(trajectory, examples)
        return [outcome_reward(self.reward(row), turns) for turns, row in zip(trajectory.turns, rows)]

    def raw_metrics(self, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
        """The eval metrics of the users' own queries (memoised: a question's raw query never changes)."""
        keys = [(ex["question"], str(ex.get("id", ""))) for ex in examples]
        todo = {key: ex for key, ex in zip(keys, examples) if key not in self._raw}
        searches = {key: (key[0], self.max_date(ex)) for key, ex in todo.items()}
        hits = self._search(list(searches.values()))
        for key, example in todo.items():
            self._raw[key] = self._score(key[0], example, hits[searches[key]])[1]
        return [self._raw[key] for key in keys]

    def metrics(self, trajectory: Trajectory, examples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Per row: the question and the rewritten query, the reward, whether the answer is well formed, the
        query's and the reasoning's length in words, the task's eval metrics and (`compare_raw`) the raw
        query's as `raw_*`."""
        rows = self._batch_results(trajectory, examples)
        compare = self.config.compare_raw and self.config.task != "sql"
        raw = self.raw_metrics(examples) if compare else [{}] * len(examples)
        out = []
        for b, (example, row) in enumerate(zip(examples, rows)):
            thoughts = tags.blocks(self.template.assistant + trajectory.response_text(b), tags.THINK)
            out.append({
                "question": example["question"], self.key: row.parsed.value or "", "reward": self.reward(row),
                "format_valid": float(row.parsed.structure_ok and row.parsed.value is not None),
                "query_words": len((row.parsed.value or "").split()),
                "reasoning_words": len(thoughts[0].split()) if thoughts else None,
                **row.metrics, **{f"raw_{name}": value for name, value in raw[b].items()}})
        return out


def make(config: Config, retrieval: Mapping[str, Any]) -> QueryRewriteEnv:
    """The env of `config.env`; SQL needs no retriever (each example names its database)."""
    return QueryRewriteEnv(config, None if config.task == "sql" else make_retriever(retrieval))
