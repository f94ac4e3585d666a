"""DeepRetrieval's part of an evaluation report: each retrieval metric of the user's own query (`raw_<metric>`,
which the env reports with `compare_raw`) beside the same metric of the policy's rewrite."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from searchrl.eval import report
from searchrl.task import Analysis, Report

RAW_PREFIX = "raw_"  # an env metric of the user's own query, next to the same metric of the policy's rewrite


def raw_vs_rewritten(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per dataset (and their average) and per metric with a raw twin: raw, rewritten and the gain."""
    out = []
    for row in report.results_table(rows):
        for name in row:
            if name.startswith(RAW_PREFIX) and name[len(RAW_PREFIX):] in row:
                metric = name[len(RAW_PREFIX):]
                out.append({"dataset": row["dataset"], "metric": metric, "raw": row[name],
                            "rewritten": row[metric], "gain": row[metric] - row[name]})
    return out


def raw_vs_rewritten_markdown(table: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> str:
    rows = [(r["dataset"], r["metric"], r["raw"], r["rewritten"], r["gain"]) for r in table]
    return "\n".join(["## Raw query vs rewritten query", "",
                      "Each retrieval metric of the user's own query (raw) and of the policy's rewrite, on the "
                      "same retriever.", "",
                      report.markdown_table(("dataset", "metric", "raw", "rewritten", "gain"), rows)])


REPORT = Report(analyses=(Analysis("raw_vs_rewritten", raw_vs_rewritten, raw_vs_rewritten_markdown),))
