"""AutoSearch's part of an evaluation report: results by hop count, and the distribution of the minimal
sufficient search depth (the first search step after which the policy's answer is right), per dataset, over
all questions and per (dataset, hop count)."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from searchrl.eval import report
from searchrl.task import Analysis, Report

NEVER = "never"  # no answer along the trajectory was right
HOPS = "hops"  # a question's hop count (synthetic worlds): a label of its row, and a group of the report


def depth_buckets(max_depth: int) -> list[str]:
    """Bucket names: 0 (right without searching), 1 .. max_depth, then never."""
    return [str(d) for d in range(max_depth + 1)] + [NEVER]


def depth_counts(rows: Sequence[Mapping[str, Any]], max_depth: int) -> dict[str, Any]:
    """Counts and fractions of the minimal sufficient depth over `rows`."""
    buckets = depth_buckets(max_depth)
    counts = dict.fromkeys(buckets, 0)
    for row in rows:
        depth = row["depth"]
        if depth is not None and not 0 <= depth <= max_depth:
            raise ValueError(f"depth {depth} of question {row.get('id')!r} is outside 0..{max_depth}")
        counts[NEVER if depth is None else str(depth)] += 1
    return {"n": len(rows), "counts": counts, "fractions": {k: v / len(rows) for k, v in counts.items()}}


def depth_distribution(rows: Sequence[Mapping[str, Any]], max_depth: int) -> dict[str, Any]:
    """The depth distribution per dataset, over all questions, and per (dataset, hops)."""
    datasets = [{"dataset": name, **depth_counts(group, max_depth)}
                for name, group in report.by_dataset(rows).items()]
    pooled = {"dataset": report.ALL, **depth_counts(rows, max_depth)}
    hops = [{"dataset": name, HOPS: h, **depth_counts(group, max_depth)}
            for (name, h), group in report.by_dataset_and(rows, HOPS).items()]
    return {"buckets": depth_buckets(max_depth), "datasets": datasets + [pooled], HOPS: hops}


def hop_label(row: Mapping[str, Any]) -> str:
    """A row's group: its dataset, with its hop count when it has one."""
    return f"{row['dataset']} ({row[HOPS]}-hop)" if row.get(HOPS) is not None else row["dataset"]


def summarize_depth(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """The depth distribution of a run whose rows carry depths (its search budget: meta's max_turns)."""
    return depth_distribution(rows, meta["max_turns"]) if rows and "depth" in rows[0] else None


def depth_markdown(depth: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    rows = [(hop_label(r), r["n"], *(f"{r['counts'][k]} ({r['fractions'][k]:.2f})" for k in depth["buckets"]))
            for r in depth["datasets"] + depth[HOPS]]
    prompt = json.dumps(meta.get("side_branch_prompt"))
    return "\n".join([
        "## Minimal sufficient search depth", "",
        "d = the first search step after which the policy's answer is right: its intermediate answer (elicited "
        f"with the answer prompt {prompt}), or its final answer after its last search; 0 = right without "
        "searching; never = no answer along the trajectory was right. Counts (fractions).", "",
        report.markdown_table(("group", "n", *depth["buckets"]), rows)])


def depth_bars(ax, buckets: Sequence[str], bars: Sequence[tuple[str, Mapping[str, float]]],
               title: str = "Minimal sufficient search depth") -> None:
    """Grouped bars: per (label, fractions by bucket) one colour, the fraction of questions at each depth."""
    width = 0.8 / len(bars)
    x = np.arange(len(buckets))
    for i, (label, fractions) in enumerate(bars):
        ax.bar(x + (i - (len(bars) - 1) / 2) * width, [fractions[k] for k in buckets], width, label=label)
    ax.set(xticks=x, xticklabels=buckets, xlabel="minimal sufficient depth", ylabel="fraction of questions",
           title=title)
    ax.legend(fontsize="small")


def plot_depth(ax, depth: Mapping[str, Any]) -> None:
    """The fraction of questions at each minimal sufficient depth, one colour per dataset."""
    groups = depth["datasets"]
    if len(groups) == 2:  # one dataset: its bars are the pooled ones
        groups = groups[:1]
    depth_bars(ax, depth["buckets"], [(row["dataset"], row["fractions"]) for row in groups])


REPORT = Report(labels=(HOPS, "depth"), groups={HOPS: "hop count"},
                analyses=(Analysis("depth", summarize_depth, depth_markdown, plot_depth),),
                main_table=("em", "searches"))  # the paper's main table: EM and the mean number of searches
