"""Evaluation results from per-question rows: the papers' tables, accuracy per search budget and the
distribution of the minimal sufficient search depth, written as Markdown, CSV, JSON and a matplotlib figure.

A question row is a plain dict (one line of `predictions.jsonl`): "dataset", "hops" (int, or None outside
synthetic worlds), the env's per-row results — its numbers ("em", "f1", "searches", "recall", ...) are the
metrics summarised here, whatever the env — and, when the env reports it, "depth" (the minimal sufficient
search depth: int, or None when no answer along the trajectory was right). Everything here is a pure function
of such rows.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

NOT_METRICS = frozenset({"id", "hops", "depth"})  # numbers in a row that are not averaged
AVERAGE = "average"  # the papers' "Avg.": the unweighted mean over datasets
ALL = "all"  # every question of every dataset, pooled
NEVER = "never"
RAW_PREFIX = "raw_"  # an env metric of the user's own query, next to the same metric of the policy's rewrite


def metric_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The metrics of question rows: the keys whose values are numbers (bools count) in every row, in
    order."""
    if not rows:
        raise ValueError("no question rows")

    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float, np.number, np.bool_))

    return [k for k in rows[0] if k not in NOT_METRICS and all(is_number(r.get(k)) for r in rows)]


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Question count and the mean of each metric over `rows`."""
    return {"n": len(rows), **{m: float(np.mean([r[m] for r in rows])) for m in metric_names(rows)}}


def by_dataset(rows: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """Rows grouped by dataset, in first-seen order."""
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(row["dataset"], []).append(row)
    return groups


def by_dataset_and(rows: Sequence[Mapping[str, Any]], field: str) -> dict[tuple[str, Any], list]:
    """Rows that carry `field` (not None), grouped by (dataset, value), in first-seen order."""
    groups: dict[tuple[str, Any], list] = {}
    for row in rows:
        if row.get(field) is not None:
            groups.setdefault((row["dataset"], row[field]), []).append(row)
    return groups


def by_hops(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, int], list]:
    """Rows that carry a hop count, grouped by (dataset, hops), sorted."""
    groups = {(name, int(hops)): group for (name, hops), group in by_dataset_and(rows, "hops").items()}
    return dict(sorted(groups.items()))


def results_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per dataset, then the average over datasets (n: all questions)."""
    table = [{"dataset": name, "hops": None, **summarize(group)} for name, group in by_dataset(rows).items()]
    average = {m: float(np.mean([t[m] for t in table])) for m in metric_names(rows)}
    return table + [{"dataset": AVERAGE, "hops": None, "n": sum(t["n"] for t in table), **average}]


def hops_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, hop count); empty when no row carries hops."""
    return [{"dataset": name, "hops": hops, **summarize(group)}
            for (name, hops), group in by_hops(rows).items()]


def task_types_table(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, task type) when rows carry a "task_type" (the RPL paper's Table 3: F1 and dF1
    per GlobalQA type), in first-seen order; empty otherwise."""
    return [{"dataset": name, "task_type": kind, **summarize(group)}
            for (name, kind), group in by_dataset_and(rows, "task_type").items()]


def raw_vs_rewritten(table: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per dataset row of a results table and per metric with a raw twin: raw, rewritten and the gain."""
    out = []
    for row in table:
        for name in row:
            if name.startswith(RAW_PREFIX) and name[len(RAW_PREFIX):] in row:
                metric = name[len(RAW_PREFIX):]
                out.append({"dataset": row["dataset"], "metric": metric, "raw": row[name],
                            "rewritten": row[metric], "gain": row[metric] - row[name]})
    return out


def budget_curves(runs: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Every metric per search budget: per dataset, their average, and per (dataset, hops).

    `runs` maps each budget (env.max_turns) to the question rows of the run under that budget.
    """
    budgets = sorted(runs)
    per_budget = [by_dataset(runs[b]) for b in budgets]
    names = list(per_budget[0])
    metrics = metric_names(runs[budgets[0]])

    def curve(groups: list[dict], key) -> dict[str, list[float]]:
        return {m: [float(np.mean([r[m] for r in g[key]])) for g in groups] for m in metrics}

    datasets = [{"dataset": name, **curve(per_budget, name)} for name in names]
    average = {m: np.mean([d[m] for d in datasets], axis=0).tolist() for m in metrics}
    hops_groups = [by_hops(runs[b]) for b in budgets]
    hops = [{"dataset": name, "hops": h, **curve(hops_groups, (name, h))} for name, h in hops_groups[0]]
    # "headline": the metric tables and plots show per budget, the env's first (EM for question answering).
    return {"budgets": budgets, "headline": metrics[0],
            "datasets": datasets + [{"dataset": AVERAGE, **average}], "hops": hops}


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
                for name, group in by_dataset(rows).items()]
    pooled = {"dataset": ALL, **depth_counts(rows, max_depth)}
    hops = [{"dataset": name, "hops": h, **depth_counts(group, max_depth)}
            for (name, h), group in by_hops(rows).items()]
    return {"buckets": depth_buckets(max_depth), "datasets": datasets + [pooled], "hops": hops}


def aggregate(rows: Sequence[Mapping[str, Any]],
              budget_runs: Mapping[int, Sequence[Mapping[str, Any]]] | None = None,
              max_depth: int | None = None) -> dict[str, Any]:
    """Every summary of an evaluation: the main table, per-hop rows, budget curves and depth distribution.

    `max_depth`: the search budget of the rows' run when they carry depths (None: no depth analysis).
    """
    table = results_table(rows)
    return {
        "table": table,
        "raw_vs_rewritten": raw_vs_rewritten(table),
        "hops": hops_table(rows),
        "task_types": task_types_table(rows),
        "budgets": budget_curves(budget_runs) if budget_runs else None,
        "depth": depth_distribution(rows, max_depth) if max_depth is not None else None,
    }


# ---- Markdown / CSV / JSON ----

def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def group_label(row: Mapping[str, Any]) -> str:
    """A row's group: its dataset, with its hop count when it has one."""
    return f"{row['dataset']} ({row['hops']}-hop)" if row.get("hops") is not None else row["dataset"]


def main_markdown(results: Mapping[str, Any]) -> str:
    """The papers' table: each metric per dataset, and their average over datasets."""
    metrics = table_metrics(results)
    return markdown_table(("dataset", "n", *metrics),
                          [(group_label(r), r["n"], *(r[m] for m in metrics)) for r in results["table"]])


def table_metrics(results: Mapping[str, Any]) -> list[str]:
    """The metric columns of a results table (every column after dataset, hops and n)."""
    return [k for k in results["table"][0] if k not in ("dataset", "hops", "n")]


def markdown(results: Mapping[str, Any]) -> str:
    """Every table of `results` as one Markdown document."""
    meta = results.get("meta", {})
    facts = "\n".join(f"- {k}: {v}" for k, v in meta.items() if k != "side_branch_prompt")
    parts = ["# Evaluation", "", facts, "", "## Results", "", main_markdown(results)]
    metrics = table_metrics(results)
    if results.get("raw_vs_rewritten"):
        rows = [(r["dataset"], r["metric"], r["raw"], r["rewritten"], r["gain"])
                for r in results["raw_vs_rewritten"]]
        parts += ["", "## Raw query vs rewritten query", "",
                  "Each retrieval metric of the user's own query (raw) and of the policy's rewrite, on the "
                  "same retriever.", "",
                  markdown_table(("dataset", "metric", "raw", "rewritten", "gain"), rows)]
    if results["hops"]:
        header = ("dataset", "hops", "n", *metrics)
        rows = [(r["dataset"], r["hops"], r["n"], *(r[m] for m in metrics)) for r in results["hops"]]
        parts += ["", "## By hop count", "", markdown_table(header, rows)]
    if results.get("task_types"):
        header = ("dataset", "task type", "n", *metrics)
        rows = [(r["dataset"], r["task_type"], r["n"], *(r[m] for m in metrics))
                for r in results["task_types"]]
        parts += ["", "## By task type", "", markdown_table(header, rows)]
    curves = results.get("budgets")
    if curves:
        metric = curves["headline"]
        header = ("group", *(f"{metric} @ {b}" for b in curves["budgets"]))
        rows = [(group_label(r), *r[metric]) for r in curves["datasets"] + curves["hops"]]
        parts += ["", "## Accuracy by search budget", "",
                  f"{metric} when at most b searches are allowed (env.max_turns = b; the turn after the last "
                  "search cannot search, and a search there is an invalid action that scores 0).", "",
                  markdown_table(header, rows)]
    depth = results.get("depth")
    if depth:
        rows = [(group_label(r), r["n"], *(f"{r['counts'][k]} ({r['fractions'][k]:.2f})"
                                      for k in depth["buckets"]))
                for r in depth["datasets"] + depth["hops"]]
        prompt = json.dumps(meta.get("side_branch_prompt"))
        parts += ["", "## Minimal sufficient search depth", "",
                  "d = the first search step after which the policy's answer is right: its intermediate "
                  f"answer (elicited with the answer prompt {prompt}), or its final answer after its last "
                  "search; 0 = right without searching; never = no answer along the trajectory was right. "
                  "Counts (fractions).", "",
                  markdown_table(("group", "n", *depth["buckets"]), rows)]
    return "\n".join(parts) + "\n"


def write_csv(results: Mapping[str, Any], path: str | os.PathLike) -> None:
    """The main table and the per-hop rows, one CSV (hops empty on whole-dataset rows)."""
    columns = ["dataset", "hops", "n", *table_metrics(results)]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in list(results["table"]) + list(results["hops"]):
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


def write_report(results: Mapping[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes results.md, results.csv, results.json, predictions.jsonl (when `results` has "predictions") and
    depth_analysis.png (when there are budget curves or a depth distribution); returns the paths by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("results.md", "results.csv", "results.json")}
    summary = {k: v for k, v in results.items() if k != "predictions"}
    paths["results.md"].write_text(markdown(summary))
    write_csv(summary, paths["results.csv"])
    paths["results.json"].write_text(json.dumps(summary, indent=2) + "\n")
    if results.get("predictions"):
        paths["predictions.jsonl"] = out / "predictions.jsonl"
        with open(paths["predictions.jsonl"], "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in results["predictions"])
    if results.get("budgets") or results.get("depth"):
        paths["depth_analysis.png"] = out / "depth_analysis.png"
        plot_depth_analysis(summary, paths["depth_analysis.png"])
    return paths


# ---- Plot ----

def pyplot():
    """matplotlib.pyplot on the Agg backend (imported here: only plotting needs it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_depth_analysis(results: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Accuracy vs search budget (per dataset, and per hop count when known) and the depth histogram."""
    plt = pyplot()
    curves, depth = results.get("budgets"), results.get("depth")
    panels = ([("datasets", curves["datasets"])] if curves else [])
    panels += [("hops", curves["hops"])] if curves and curves["hops"] else []
    panels += [("depth", depth)] if depth else []
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (kind, content) in zip(axes[0], panels):
        if kind == "depth":
            _depth_bars(ax, content)
            continue
        for row in content:
            style = "--" if row["dataset"] == AVERAGE else "-"
            ax.plot(curves["budgets"], row[curves["headline"]], style, marker="o", label=group_label(row))
        headline = curves["headline"]
        ax.set(xlabel="searches allowed (env.max_turns)", ylabel=headline, xticks=curves["budgets"],
               title=f"{headline} by search budget" + (" and hop count" if kind == "hops" else ""))
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _depth_bars(ax, depth: Mapping[str, Any]) -> None:
    """The fraction of questions at each minimal sufficient depth, one colour per dataset."""
    groups = depth["datasets"]
    if len(groups) == 2:  # one dataset: its bars are the pooled ones
        groups = groups[:1]
    depth_bars(ax, depth["buckets"], [(group_label(row), row["fractions"]) for row in groups])


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
