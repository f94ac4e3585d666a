"""DeepRetrieval rewards (pat-jj/DeepRetrieval, code/verl/utils/reward_score/*.py).

The policy writes `<think>...</think><answer>{"query": "..."}</answer>` (or `{"sql": "..."}` for
text-to-SQL). The env parses the answer, runs the retriever or the database, and scores the result:

- tiered (literature search and answer-span retrieval, e.g. pubmed.py, squad.py): a format term
  (+1 / -4) plus a tier score of recall or of the rank of the first passage holding an answer. The answer is
  scored only when the tags are well formed; a JSON that cannot be parsed scores parse_error_score.
- gated (BEIR and SQL, e.g. msmarco_beir.py, spider.py): a format term (+0.1 / -2, the format also needs
  valid JSON) plus the metric (NDCG@k, execution match) when the metric is positive; a well-formed answer
  with a zero metric scores 0.

The answer-rank reward and the evidence metrics (H@N) match answers with DPR's `has_answers`
(`searchrl.retrieval.metrics.has_answer`: DPR's simple tokenizer, token sequences), the matcher of the public
reward (squad.py, nq_serini.py, triviaqa.py) and evaluation (src/eval/BM25/{nq,squad,triviaqa}.py), so H@N is
the H@N of the paper's Table 1; not the SQuAD-normalised `qa.has_answer`.
Recall and NDCG@k (gain = rel, log2 discount, ideal from the qrels) come from `searchrl.retrieval.metrics`:
recall over everything retrieved is `recall_at_k(ids, qrels, len(ids))`. The public tables change from
dataset to dataset; every value lives in `RewardConfig`.

Differences from the public code, on purpose: code fences around the JSON are tolerated; an empty query
is a parse error (the public code scores it as format-only); the ideal NDCG ranking sorts the qrels by relevance (the public
code takes them in the given order); an SQL query that runs out of time is an error scoring 0 (the public
code compares an empty result, which can match an empty gold result).

Model output never raises out of a reward: an answer whose JSON cannot be read (too deeply nested, an
integer too long to convert) is a parse error, and model-written SQL runs in `sql_sandbox`'s worker process
(read-only, allowed functions only, bounded in time, rows, result bytes and memory), where any failure scores
0 with its reason.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import reprlib

from searchrl.configlib import group, ranged
from searchrl.tasks.deepretrieval import sql_sandbox
from searchrl.text import protocol, tags

_FENCE = "```"
_FENCE_LANGUAGE = re.compile(r"[\w-]*")  # anchored at the text's start: linear time
_SQL_MAX_RESULT_BYTES = 128_000_000  # the default cap on the bytes of one query's fetched values


@group
class TieredConfig:
    """tiered: format term for well-formed / malformed tags, and the answer score of unparseable JSON."""

    format_reward: float = ranged(1.0, "(-inf, inf)")
    format_penalty: float = ranged(-4.0, "(-inf, inf)")
    parse_error_score: float = ranged(-4.0, "(-inf, inf)")


@group
class GatedConfig:
    """gated (BEIR, SQL): format term; the tags must be well formed and the JSON valid."""

    format_reward: float = ranged(0.1, "(-inf, inf)")
    format_penalty: float = ranged(-2.0, "(-inf, inf)")


@group
class RewardConfig:
    """DeepRetrieval reward tables."""

    tiered: TieredConfig = TieredConfig()
    gated: GatedConfig = GatedConfig()
    # (max 1-based rank, score), ascending: rank of the first retrieved passage that holds a gold answer
    # (squad.py); answer_rank_miss when no passage does.
    answer_rank_tiers: tuple[tuple[int, float], ...] = ranged(
        ((5, 5.0), (20, 4.0), (50, 2.0), (100, 1.0), (1000, 0.5), (3000, 0.1)), "(-inf, inf)")
    answer_rank_miss: float = ranged(-3.5, "(-inf, inf)")
    # (min recall, score), descending (pubmed.py); recall_miss below the last threshold.
    recall_tiers: tuple[tuple[float, float], ...] = ranged(
        ((0.7, 5.0), (0.5, 4.0), (0.4, 3.0), (0.3, 1.0), (0.1, 0.5), (0.05, 0.1)), "(-inf, inf)")
    recall_miss: float = ranged(-3.5, "(-inf, inf)")
    # NDCG cut-off for training rewards (msmarco_beir.py retrieves and scores the top 3000) and for
    # evaluation (the paper's NDCG@10).
    ndcg_k: int = ranged(3000, "[1, inf)")
    ndcg_k_eval: int = ranged(10, "[1, inf)")
    # gated SQL: the score of a predicted query that executes but returns other rows (bird.py: 0.3; spider.py:
    # 0, so a query that runs but is wrong scores like one that fails).
    sql_executes_score: float = ranged(0.0, "(-inf, inf)")
    # SQL execution: wall-clock limit per query, the most rows one query may return and the most bytes its
    # values may hold (as Python objects).
    sql_timeout_s: float = ranged(30.0, "(0, inf)")
    sql_max_rows: int = ranged(100_000, "[1, inf)")
    sql_max_result_bytes: int = ranged(_SQL_MAX_RESULT_BYTES, "[1, inf)")


@dataclasses.dataclass(frozen=True)
class ParsedAnswer:
    """The JSON field of the answer (None when it could not be read), and the tag check."""

    value: str | None
    structure_ok: bool
    reason: str  # "" when both the tags and the JSON are fine


def _structure_tags(reasoning: bool) -> tuple[str, ...]:
    return tuple(t for tag in ((tags.THINK, tags.ANSWER) if reasoning else (tags.ANSWER,))
                 for t in (tags.open_tag(tag), tags.close_tag(tag)))


def check_structure(response: str, reasoning: bool) -> protocol.FormatCheck:
    """DeepRetrieval's tag check: `<think>`, `</think>`, `<answer>`, `</answer>` once each, in this order
    (without reasoning, the no_reason rewards: `<answer>`, `</answer>` once each, in order). `reasoning` is
    the env config's (`Config.reasoning`)."""
    text = protocol.response_part(response)
    structure_tags = _structure_tags(reasoning)
    for tag in structure_tags:
        if (count := text.count(tag)) != 1:
            return protocol.FormatCheck(False, f"{tag} appears {count} times, expected once")
    positions = [text.find(tag) for tag in structure_tags]
    if positions != sorted(positions):
        expected = "".join(structure_tags[i] + (".." if i % 2 == 0 else "")
                           for i in range(len(structure_tags)))
        return protocol.FormatCheck(False, f"tags out of order, expected {expected}")
    return protocol.FormatCheck(True, "")


def _unfenced(text: str) -> str:
    """The inside of a Markdown code fence (```json ... ```) around the whole text, else the text
    (linear time: string operations, no backtracking pattern)."""
    if len(text) < 2 * len(_FENCE) or not (text.startswith(_FENCE) and text.endswith(_FENCE)):
        return text
    inner = text[len(_FENCE):-len(_FENCE)]
    return inner[_FENCE_LANGUAGE.match(inner).end():].strip()


def _json_field(answer: str | None, key: str) -> tuple[str | None, str]:
    """Reads `{key: "..."}` from the answer text, tolerating a code fence; (value, reason)."""
    if answer is None:
        return None, "no <answer> block"
    text = _unfenced(answer.strip())
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # also nesting too deep, integers too long to convert
        return None, f"answer is not valid JSON: {e}"
    if not isinstance(data, dict) or key not in data:
        return None, f'answer JSON has no "{key}" field'
    value = data[key]
    if not isinstance(value, str) or not value.strip():
        return None, f'"{key}" must be a non-empty string, got {reprlib.repr(value)}'
    return value.strip(), ""


def parse_json_answer(response: str, key: str, reasoning: bool) -> ParsedAnswer:
    """Parses `<answer>{key: ...}</answer>` from a response and checks its tags."""
    structure = check_structure(response, reasoning)
    value, reason = _json_field(protocol.extract_answer(response), key)
    return ParsedAnswer(value=value, structure_ok=structure.ok, reason=structure.reason or reason)


def parse_query_answer(response: str, reasoning: bool) -> ParsedAnswer:
    """The search query of a DeepRetrieval answer `{"query": ...}`."""
    return parse_json_answer(response, "query", reasoning)


def parse_sql_answer(response: str, reasoning: bool) -> ParsedAnswer:
    """The SQL of a DeepRetrieval text-to-SQL answer `{"sql": ...}`."""
    return parse_json_answer(response, "sql", reasoning)


def tiered_reward(parsed: ParsedAnswer, metric_score: float | None,
                  cfg: RewardConfig = RewardConfig()) -> float:
    """Format term plus `metric_score` (a tier score); the metric is needed only when a value was parsed."""
    cfg = cfg.tiered
    if not parsed.structure_ok:
        return cfg.format_penalty
    if parsed.value is None:
        return cfg.format_reward + cfg.parse_error_score
    if metric_score is None:
        raise ValueError("a parsed answer needs its metric score")
    return cfg.format_reward + metric_score


def gated_reward(parsed: ParsedAnswer, metric_score: float | None,
                 cfg: RewardConfig = RewardConfig()) -> float:
    """Format term plus a positive metric; 0 for a well-formed answer whose metric is not positive."""
    cfg = cfg.gated
    if not parsed.structure_ok or parsed.value is None:
        return cfg.format_penalty
    if metric_score is None:
        raise ValueError("a parsed answer needs its metric score")
    return cfg.format_reward + metric_score if metric_score > 0 else 0.0




def answer_rank_score(rank: int | None, cfg: RewardConfig = RewardConfig()) -> float:
    """The tier score of an answer rank (None: no passage holds an answer)."""
    if rank is not None:
        for max_rank, score in cfg.answer_rank_tiers:
            if rank <= max_rank:
                return float(score)
    return float(cfg.answer_rank_miss)


def recall_score(value: float, cfg: RewardConfig = RewardConfig()) -> float:
    """The tier score of a recall."""
    for min_recall, score in cfg.recall_tiers:
        if value >= min_recall:
            return float(score)
    return float(cfg.recall_miss)


def _database(db_path: str | pathlib.Path) -> pathlib.Path:
    """The resolved path of an existing database file; FileNotFoundError otherwise (a setup error)."""
    path = pathlib.Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"SQL database not found: {path}")
    return path


def run_sql(db_path: str | pathlib.Path, sql: str, *, timeout_s: float, max_rows: int,
            max_result_bytes: int = _SQL_MAX_RESULT_BYTES) -> list[tuple]:
    """Runs one read-only statement in the SQL worker; raises sql_sandbox.SqlError when it fails or
    overruns a limit."""
    # immutable: no locks and no -wal/-shm files, so nothing is written next to the database.
    uri = f"{_database(db_path).as_uri()}?mode=ro&immutable=1"
    return sql_sandbox.WORKER.run(uri, sql, sql_sandbox.Limits(timeout_s, max_rows, max_result_bytes))


def sql_execution_match(db_path: str | pathlib.Path, pred_sql: str, gold_sql: str,
                        cfg: RewardConfig = RewardConfig()) -> tuple[float, str]:
    """1.0 when both queries return the same set of rows; `cfg.sql_executes_score` when the prediction runs
    but returns other rows; 0.0 when either query fails, whatever the failure. The reason says why it is
    not 1. Raises only when the database is missing."""
    _database(db_path)
    results = {}
    for name, sql in (("predicted", pred_sql), ("gold", gold_sql)):
        try:
            results[name] = set(run_sql(db_path, sql, timeout_s=cfg.sql_timeout_s, max_rows=cfg.sql_max_rows,
                                        max_result_bytes=cfg.sql_max_result_bytes))
        except Exception as e:  # noqa: BLE001 -- model SQL may fail in any way (e.g. a lone surrogate)
            return 0.0, f"{name} SQL failed: {sql_sandbox.error_message(e)}"
    if results["predicted"] != results["gold"]:
        return float(cfg.sql_executes_score), "result rows differ"
    return 1.0, ""
