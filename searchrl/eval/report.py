"""Evaluation results from per-question rows: the papers' table, tables by the groups a task names, accuracy
per search budget and the task's own analyses, written as Markdown, CSV, JSON and a matplotlib figure.

A question row is a plain dict (one line of `predictions.jsonl`): "dataset", "id" and the env's per-row
results; its numbers ("em", "f1", "searches", "recall", ...) are the metrics summarised here, whatever the
env, except the fields the task's `searchrl.task.Report` names as labels (e.g. a question's hop count).
Everything here is a pure function of such rows and the task's `Report`; nothing here knows a task.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from searchrl.task import Report

AVERAGE = "average"  # the papers' "Avg.": the unweighted mean over datasets
ALL = "all"  # every question of every dataset, pooled
NOT_METRICS = frozenset({"id"})  # numbers in every row that are not averaged (with a task's labels)


def metric_names(rows: Sequence[Mapping[str, Any]], labels: Sequence[str] = ()) -> list[str]:
    """The metrics of question rows: the keys whose values are numbers (bools count) in every row, in order,
    but "id" and the task's `labels`."""
    if not rows:
        raise ValueError("no question rows")

    def is_number(value: Any) -> bool:
        return isinstance(value, (int, float, np.number, np.bool_))

    skip = NOT_METRICS | set(labels)
    return [k for k in rows[0] if k not in skip and all(is_number(r.get(k)) for r in rows)]


def summarize(rows: Sequence[Mapping[str, Any]], labels: Sequence[str] = ()) -> dict[str, float]:
    """Question count and the mean of each metric over `rows`."""
    return {"n": len(rows), **{m: float(np.mean([r[m] for r in rows])) for m in metric_names(rows, labels)}}


def by_dataset(rows: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """Rows grouped by dataset, in first-seen order."""
    groups: dict[str, list] = {}
    for row in rows:
        groups.setdefault(row["dataset"], []).append(row)
    return groups


def by_dataset_and(rows: Sequence[Mapping[str, Any]], field: str) -> dict[tuple[str, Any], list]:
    """Rows that carry `field` (not None), grouped by (dataset, value): sorted when the values are numbers,
    else in first-seen order."""
    groups: dict[tuple[str, Any], list] = {}
    for row in rows:
        if row.get(field) is not None:
            groups.setdefault((row["dataset"], row[field]), []).append(row)
    numeric = all(isinstance(value, (int, np.integer)) for _, value in groups)
    return dict(sorted(groups.items())) if numeric else groups


def results_table(rows: Sequence[Mapping[str, Any]], labels: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per dataset, then the average over datasets (n: all questions)."""
    table = [{"dataset": name, **summarize(group, labels)} for name, group in by_dataset(rows).items()]
    average = {m: float(np.mean([t[m] for t in table])) for m in metric_names(rows, labels)}
    return table + [{"dataset": AVERAGE, "n": sum(t["n"] for t in table), **average}]


def group_table(rows: Sequence[Mapping[str, Any]], field: str, labels: Sequence[str] = ()
                ) -> list[dict[str, Any]]:
    """One row per (dataset, value of `field`); empty when no row carries it."""
    return [{"dataset": name, field: value, **summarize(group, labels)}
            for (name, value), group in by_dataset_and(rows, field).items()]


def budget_curves(runs: Mapping[int, Sequence[Mapping[str, Any]]], spec: Report = Report()) -> dict[str, Any]:
    """Every metric per search budget: per dataset, their average, and per (dataset, value) of each of the
    task's groups.

    `runs` maps each budget (env.max_turns) to the question rows of the run under that budget.
    """
    budgets = sorted(runs)
    per_budget = [by_dataset(runs[b]) for b in budgets]
    names = list(per_budget[0])
    metrics = metric_names(runs[budgets[0]], spec.labels)

    def curve(groups: list[dict], key) -> dict[str, list[float]]:
        return {m: [float(np.mean([r[m] for r in g[key]])) for g in groups] for m in metrics}

    datasets = [{"dataset": name, **curve(per_budget, name)} for name in names]
    average = {m: np.mean([d[m] for d in datasets], axis=0).tolist() for m in metrics}
    by = {}
    for field in spec.groups:
        grouped = [by_dataset_and(runs[b], field) for b in budgets]
        by[field] = [{"dataset": name, field: value, **curve(grouped, (name, value))}
                     for name, value in grouped[0]]
    # "headline": the metric tables and plots show per budget, the env's first (EM for question answering).
    return {"budgets": budgets, "headline": metrics[0],
            "datasets": datasets + [{"dataset": AVERAGE, **average}], "by": by}


def aggregate(rows: Sequence[Mapping[str, Any]],
              budget_runs: Mapping[int, Sequence[Mapping[str, Any]]] | None = None, spec: Report = Report(),
              meta: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every summary of an evaluation: the main table, a table by each of the task's groups, the budget
    curves, and the task's analyses (each under its name; `meta` is the run's, which they may read)."""
    results = {"table": results_table(rows, spec.labels),
               "by": {field: group_table(rows, field, spec.labels) for field in spec.groups},
               "budgets": budget_curves(budget_runs, spec) if budget_runs else None}
    for analysis in spec.analyses:
        results[analysis.name] = analysis.summarize(rows, meta or {})
    return results


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


def main_markdown(results: Mapping[str, Any]) -> str:
    """The papers' table: each metric per dataset, and their average over datasets."""
    metrics = table_metrics(results)
    return markdown_table(("dataset", "n", *metrics),
                          [(r["dataset"], r["n"], *(r[m] for m in metrics)) for r in results["table"]])


def table_metrics(results: Mapping[str, Any]) -> list[str]:
    """The metric columns of a results table (every column after dataset and n)."""
    return [k for k in results["table"][0] if k not in ("dataset", "n")]


def group_label(row: Mapping[str, Any], field: str | None = None, title: str = "") -> str:
    """A row's group: its dataset, with its value of `field` when it is a row of that group."""
    return f"{row['dataset']} ({title or field} {row[field]})" if field else row["dataset"]


def markdown(results: Mapping[str, Any], spec: Report = Report()) -> str:
    """Every table of `results` (and the task's analyses, `spec`) as one Markdown document."""
    meta = results.get("meta", {})
    facts = "\n".join(f"- {k}: {v}" for k, v in meta.items() if k != "side_branch_prompt")
    parts = ["# Evaluation", "", facts, "", "## Results", "", main_markdown(results)]
    metrics = table_metrics(results)
    for field, title in spec.groups.items():
        table = results["by"].get(field)
        if table:
            header = ("dataset", title, "n", *metrics)
            rows = [(r["dataset"], r[field], r["n"], *(r[m] for m in metrics)) for r in table]
            parts += ["", f"## By {title}", "", markdown_table(header, rows)]
    curves = results.get("budgets")
    if curves:
        metric = curves["headline"]
        header = ("group", *(f"{metric} @ {b}" for b in curves["budgets"]))
        rows = [(group_label(r), *r[metric]) for r in curves["datasets"]]
        rows += [(group_label(r, field, spec.groups[field]), *r[metric])
                 for field in spec.groups for r in curves["by"].get(field, [])]
        parts += ["", "## Accuracy by search budget", "",
                  f"{metric} when at most b searches are allowed (env.max_turns = b; the turn after the last "
                  "search cannot search, and a search there is an invalid action that scores 0).", "",
                  markdown_table(header, rows)]
    for analysis in spec.analyses:
        if results.get(analysis.name):
            parts += ["", analysis.markdown(results[analysis.name], meta)]
    return "\n".join(parts) + "\n"


def write_csv(results: Mapping[str, Any], path: str | os.PathLike, spec: Report = Report()) -> None:
    """The main table and the rows by each of the task's groups, one CSV (a group's column empty on the rows
    of the others)."""
    columns = ["dataset", *spec.groups, "n", *table_metrics(results)]
    rows = list(results["table"]) + [r for field in spec.groups for r in results["by"].get(field, [])]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


def write_report(results: Mapping[str, Any], out_dir: str | os.PathLike, spec: Report = Report()
                 ) -> dict[str, Path]:
    """Writes results.md, results.csv, results.json, predictions.jsonl (when `results` has "predictions") and
    analysis.png (when there are budget curves or a task analysis with a plot); returns the paths by name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ("results.md", "results.csv", "results.json")}
    summary = {k: v for k, v in results.items() if k != "predictions"}
    paths["results.md"].write_text(markdown(summary, spec))
    write_csv(summary, paths["results.csv"], spec)
    paths["results.json"].write_text(json.dumps(summary, indent=2) + "\n")
    if results.get("predictions"):
        paths["predictions.jsonl"] = out / "predictions.jsonl"
        with open(paths["predictions.jsonl"], "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in results["predictions"])
    if _panels(summary, spec):
        paths["analysis.png"] = out / "analysis.png"
        plot_analysis(summary, spec, paths["analysis.png"])
    return paths


# ---- Plot ----

def pyplot():
    """matplotlib.pyplot on the Agg backend (imported here: only plotting needs it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(results: Mapping[str, Any], spec: Report) -> list[tuple[str, Any]]:
    """The figure's panels: budget curves per dataset and per each group, then the analyses that plot."""
    curves = results.get("budgets")
    panels = [("datasets", None)] if curves else []
    panels += [("group", field) for field in spec.groups if curves and curves["by"].get(field)]
    return panels + [("analysis", a) for a in spec.analyses if a.plot is not None and results.get(a.name)]


def plot_analysis(results: Mapping[str, Any], spec: Report, path: str | os.PathLike) -> None:
    """Accuracy vs search budget (per dataset, and per group value) and the task's analyses' panels."""
    plt = pyplot()
    curves, panels = results.get("budgets"), _panels(results, spec)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (kind, what) in zip(axes[0], panels):
        if kind == "analysis":
            what.plot(ax, results[what.name])
            continue
        rows = curves["datasets"] if kind == "datasets" else curves["by"][what]
        for row in rows:
            style = "--" if row["dataset"] == AVERAGE else "-"
            label = group_label(row, what, spec.groups.get(what, "")) if kind == "group" else group_label(row)
            ax.plot(curves["budgets"], row[curves["headline"]], style, marker="o", label=label)
        headline = curves["headline"]
        by = f" and {spec.groups[what]}" if kind == "group" else ""
        ax.set(xlabel="searches allowed (env.max_turns)", ylabel=headline, xticks=curves["budgets"],
               title=f"{headline} by search budget{by}")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
