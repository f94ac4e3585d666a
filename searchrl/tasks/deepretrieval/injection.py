"""DeepRetrieval's knowledge-injection audit (its Figure 3 and Appendix E): an auxiliary LLM reads each
rewrite beside the user's question and the gold answers, says whether the rewrite holds an answer span that
cannot be derived from the question without prior knowledge, and returns the rewrite with those spans removed;
the rewrite and the cleaned rewrite are both retrieved, and the table puts the injection rate beside H@k
before and after removal.

The prompt is the public one, byte for byte ([DR] pat-jj/DeepRetrieval code/src/eval/baselines/
answer_filtered_test.py, `create_prompt`, lines 72-124; the paper's Figure 18), sent as one user message over
any OpenAI-compatible endpoint (`searchrl.eval.chat_api`; the paper used Claude-3.5-Sonnet). As in the public
code, a verdict is an injection when its "has_answer" and "cannot_be_derived" both read true, and the cleaned
query is its "cleaned_query". Deviations: the verdict is the JSON of the last <answer> block only (the public
code also tries code fences, bare braces and string surgery); a verdict that cannot be read counts as
"unreadable" and keeps the rewrite (the public code counts it as an injection and drops the row from the
cleaned scores).

    python -m searchrl.tasks.deepretrieval.injection --config configs/deepretrieval.py:evidence_nq \
        --rewrites runs/nq/eval/predictions.jsonl --api_base_url URL --api_model NAME [--out DIR]

--rewrites is any predictions.jsonl of `python -m searchrl.eval` or `api_rewrites` (rows with "dataset", "id"
and the rewrite as "query", or a "response" the env parses); the questions and gold answers come from the
config's evaluation data. Writes injection.json and injection.md to --out (default: beside --rewrites).
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from absl import app, flags

from searchrl import cli, run_config, task
from searchrl.data.jsonl import read_jsonl
from searchrl.eval import chat_api, harness, selection
from searchrl.tasks.deepretrieval.env import QueryRewriteEnv
from searchrl.text import chat, tags

Generate = Callable[[Sequence[chat.Prompt], tuple[str, ...]], list[str]]  # prompts, stops -> texts
HIT_KS = (1, 5, 20)  # the H@k the evidence env reports

_HEAD = (  # create_prompt's text up to the original query
    "You are a helpful assistant that checks the quality of query augmentation. As we use "
    "LLM to augment the query, we need to check if the augmented query can be derived from "
    "the original query.\n"
    "Your task is to analyze if there are answer spans in the query that directly match the "
    "answer candidates and cannot be derived from the original query without using prior "
    "knowledge.\n"
    "\n"
    "Instructions:\n"
    "1. Check if any part of the augmented query exactly matches or paraphrases any answer "
    "candidate, if so, set \"has_answer\" to true.\n"
    "2. If the augmented query cannot be derived from the original query without using prior "
    "knowledge, set \"cannot_be_derived\" to true.\n"
    "3. If both \"has_answer\" and \"cannot_be_derived\" are true, remove those answer spans "
    "from the query, without changing other parts of the augmented query.\n"
    "4. Return your analysis in a strict JSON format\n"
    "\n"
    "IMPORTANT: \n"
    "You must respond with valid JSON wrapped in <answer> tags. The JSON must have this "
    "exact structure:\n"
    "The content between <answer> and </answer> MUST be a valid JSON object:\n"
    "- Use double quotes for strings\n"
    "- Escape special characters with backslashes (e.g., \\\" for quotes within strings)\n"
    "- Follow standard JSON formatting rules\n"
    "\n"
    "Example valid response:\n"
    "For the following original query:\n"
    "\"How many people live in New York City in 2020?\"\n"
    "\n"
    "and the augmented query:\n"
    "(\"population\" OR \"residents\") AND \"new york city\" AND \"2020\" AND \"8 million\"\n"
    "\n"
    "Answer candidates to check against:\n"
    "[\"8.253 million\", \"8,253,213\", \"8.25M\", \"approximately 8.25 million\"]\n"
    "\n"
    "<answer>\n"
    "{\n"
    "    \"has_answer\": true,\n"
    "    \"cannot_be_derived\": true,\n"
    "    \"answer_span_in_query\": [\"8 million\"],\n"
    "    \"matched_answer_candidates\": [\"approximately 8.25 million\", \"8.25M\"],\n"
    "    \"cleaned_query\": \"(\"population\" OR \"residents\") AND \"new york city\" AND \"2020\"\"\n"
    "}\n"
    "</answer>\n"
    "\n"
    "Now, your turn:\n"
    "\n"
    "Original query:\n"
)


def audit_prompt(question: str, rewrite: str, answers: Sequence[str]) -> str:
    """The public `create_prompt(original_query, query, answer_candidates)`; the candidates are written as
    the repr of a Python list, as there."""
    return (_HEAD + question + "\n\nAugmented query to analyze:\n" + rewrite
            + "   \n\nAnswer candidates to check against:\n" + str(list(answers)) + "\n\nYour response:\n")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The auxiliary LLM's reading of one rewrite: `injected` (None: its answer could not be read), the
    answer spans it found and the cleaned rewrite."""

    injected: bool | None
    spans: tuple[str, ...] = ()
    cleaned: str = ""


def _true(value: Any) -> bool:
    return "true" in str(value).lower()  # the public test: "true" in str(field).lower()


def read_verdict(text: str, rewrite: str) -> Verdict:
    """The verdict in the last <answer> block of a response (see the module docstring)."""
    blocks = tags.blocks(text, tags.ANSWER)
    try:
        verdict = json.loads(blocks[-1]) if blocks else None
    except ValueError:
        verdict = None
    if not isinstance(verdict, dict):
        return Verdict(None, (), rewrite)
    if not (_true(verdict.get("has_answer")) and _true(verdict.get("cannot_be_derived"))):
        return Verdict(False, (), rewrite)
    spans = verdict.get("answer_span_in_query") or []
    cleaned = verdict.get("cleaned_query", rewrite)
    return Verdict(True, tuple(map(str, spans if isinstance(spans, list) else [spans])),
                   cleaned if isinstance(cleaned, str) else rewrite)


def rewrite_of(env: QueryRewriteEnv, row: Mapping[str, Any]) -> str:
    """A predictions row's rewrite: its "query", else what the env parses from its "response" ("": none)."""
    if isinstance(row.get(env.key), str):
        return row[env.key]
    return env.parse(row.get("response") or "").value or ""


def hits(env: QueryRewriteEnv, queries: Sequence[str], examples: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Each query's H@k for its example, by the env's retriever and answer match ("" retrieves nothing)."""
    results = env.results([env.target_response(q) if q else "" for q in queries], examples)
    return [{f"hit@{k}": r.metrics.get(f"hit@{k}", 0.0) for k in HIT_KS} for r in results]


def audit(env: QueryRewriteEnv, rows: Sequence[Mapping[str, Any]], examples: Sequence[Mapping[str, Any]],
          generate: Generate) -> list[dict[str, Any]]:
    """One row per rewrite: its verdict, cleaned rewrite and H@k before ("hit@k") and after
    ("cleaned_hit@k") removal (a rewrite without injection keeps its own)."""
    if env.config.task != "evidence":
        raise ValueError(f"config.env.task is {env.config.task!r}: the injection audit needs gold answers "
                         "(the evidence task)")
    rewrites = [rewrite_of(env, row) for row in rows]
    texts = generate([chat.messages("", audit_prompt(ex["question"], q, ex["golden_answers"]))
                      for ex, q in zip(examples, rewrites)], ())
    verdicts = [read_verdict(text, q) for text, q in zip(texts, rewrites)]
    before = hits(env, rewrites, examples)
    after = hits(env, [v.cleaned for v in verdicts], examples)
    return [harness.question_row(ex, {
        "query": q, "injected": v.injected, "spans": list(v.spans), "cleaned_query": v.cleaned, **b,
        **{f"cleaned_{k}": x for k, x in a.items()}, "verdict": text})
        for ex, q, v, b, a, text in zip(examples, rewrites, verdicts, before, after, texts)]


def table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Figure 3's numbers per dataset and over all rows: questions, injection rate (of the readable
    verdicts), unreadable verdicts, and mean H@k before and after removal."""
    names = dict.fromkeys(r["dataset"] for r in rows)
    out = []
    groups = {**{n: [r for r in rows if r["dataset"] == n] for n in names}, "all": list(rows)}
    for name, group in groups.items():
        readable = [r for r in group if r["injected"] is not None]
        injected = sum(bool(r["injected"]) for r in readable)
        rate = injected / len(readable) if readable else 0.0
        line = {"dataset": name, "n": len(group), "injection_rate": rate,
                "unreadable": len(group) - len(readable)}
        for k in HIT_KS:
            line[f"hit@{k}"] = sum(r[f"hit@{k}"] for r in group) / len(group)
            line[f"cleaned_hit@{k}"] = sum(r[f"cleaned_hit@{k}"] for r in group) / len(group)
        out.append(line)
    return out


def markdown(lines: Sequence[Mapping[str, Any]]) -> str:
    """The table as markdown, rates and H@k to three decimals."""
    keys = list(lines[0])
    cell = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
                     + ["| " + " | ".join(cell(line[k]) for k in keys) + " |" for line in lines]) + "\n"


def joined(rows: Sequence[Mapping[str, Any]], examples: Sequence[Mapping[str, Any]], where: str
           ) -> list[Mapping[str, Any]]:
    """The example of each predictions row, by (dataset, id); a row without one is an error naming it."""
    by_id = {(ex["dataset"], str(ex.get("id"))): ex for ex in examples}
    keys = [(r.get("dataset"), str(r.get("id"))) for r in rows]
    missing = [key for key in keys if key not in by_id]
    if missing:
        raise ValueError(f"{where}: {len(missing)} rows name no question of the config's evaluation data, "
                         f"first (dataset, id) = {missing[0]}")
    return [by_id[key] for key in keys]


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    chosen = selection.define(values, "the folder of --rewrites")
    rewrites = flags.DEFINE_string("rewrites", None, "predictions.jsonl holding the rewrites to audit.",
                                   flag_values=values, required=True)
    api_flags = chat_api.define_flags(values)
    cli.parse(values, argv, __doc__)
    api = chat_api.config_from_flags(api_flags)
    if api is None:
        raise app.UsageError("Give --api_model and --api_base_url: the auxiliary LLM's chat endpoint.")
    config = run_config.parse(chosen.config.value)
    data, _ = harness.load_eval_data(config, chosen.datasets.value, chosen.split.value, 0)
    env = task.build(config.task, config.env, config.retrieval)
    rows = [row for _, row in read_jsonl(rewrites.value)]
    audited = audit(env, rows, joined(rows, harness.tagged_examples(data), rewrites.value),
                    chat_api.ChatGenerate(chat_api.ChatClient(api)))
    out = Path(chosen.out.value or Path(rewrites.value).parent)
    out.mkdir(parents=True, exist_ok=True)
    lines = table(audited)
    (out / "injection.json").write_text(json.dumps({"model": api.model, "table": lines, "rows": audited},
                                                   indent=1) + "\n")
    (out / "injection.md").write_text(markdown(lines))
    print(markdown(lines) + f"wrote injection.json and injection.md to {out}")


if __name__ == "__main__":
    cli.run(main)
