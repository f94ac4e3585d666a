"""Merges evaluation runs into one comparison table, by default the main table of the runs' task (its
`searchrl.task.Report.main_table`, e.g. AutoSearch's: EM and the mean number of searches): per dataset,
each method's metrics, one row per method, and their average over the datasets.

    python -m searchrl.eval.merge --run METHOD=DIR [--run METHOD=DIR ...] --out OUT
        (--task NAME | --metrics em,searches) [--allow_incomparable]

DIR: an evaluation's output directory (or its results.json), as `python -m searchrl.eval` writes it
(`report.write_report`). The datasets are every run's, in first-seen order; a run without a dataset or a
metric leaves its cell empty, and its average (the papers' "Avg.", the unweighted mean over datasets) is left
empty unless it has every dataset, so that averages over different datasets are never compared. The table
shows each run's split and each dataset's question count (n).

Runs are comparable when they evaluated the same split and, on each dataset they share, the same number of
questions: a full test split beside a 10-question dev split is refused, with one line naming the
differences, unless --allow_incomparable tabulates them anyway (the differences then head the table and go
to stderr). A metric that is not a number (e.g. `--metrics answer`) is an error naming it. Writes
main_table.md, main_table.csv and main_table.json to OUT and prints the Markdown table.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from absl import flags

from searchrl import cli, task
from searchrl.eval import report

LABELS = {"em": "EM", "f1": "F1", "cover_em": "cover EM", "searches": "searches"}  # column titles
OUTPUTS = ("main_table.md", "main_table.csv", "main_table.json")


def load_results(path: str | Path) -> dict[str, Any]:
    """The results.json of an evaluation directory (or the file itself); an error names what is missing."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"no results.json at {path} (an output directory of "
                                "`python -m searchrl.eval`)")
    try:
        results = json.loads(file.read_text())
    except ValueError as e:
        raise ValueError(f"{file}: not JSON ({e})") from None
    if not isinstance(results, dict) or not isinstance(results.get("table"), list):
        raise ValueError(f"{file}: not an evaluation's results (no 'table' list)")
    if not all(isinstance(row, dict) and {"dataset", "n"} <= set(row) for row in results["table"]):
        raise ValueError(f"{file}: a row of its 'table' has no 'dataset' or 'n'")
    return results


def parse_run(spec: str) -> tuple[str, str]:
    """METHOD=DIR as (method, dir)."""
    method, sep, path = spec.partition("=")
    if not sep or not method.strip() or not path.strip():
        raise ValueError(f"--run {spec!r}: expected METHOD=DIR")
    return method.strip(), path.strip()


def _number(method: str, dataset: str, metric: str, value: Any) -> float | None:
    """A cell's value as a float (None stays None); anything else is a ValueError naming the cell."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise ValueError(f"{method}: {dataset} {metric}={value!r} is not a number: --metrics names numeric "
                     "columns of the results tables")


def differences(rows: Sequence[Mapping[str, Any]], datasets: Sequence[str]) -> list[str]:
    """What makes the runs of `rows` incomparable: another split, or another question count on a dataset
    they share ("split: test (a, b) vs dev (c)"); [] when they are comparable."""
    def spread(what: str, values: Mapping[str, Any]) -> list[str]:
        by_value: dict[str, list[str]] = {}
        for method, value in values.items():
            by_value.setdefault("unknown" if value is None else str(value), []).append(method)
        if len(by_value) < 2:
            return []
        return [f"{what}: " + " vs ".join(f"{value} ({', '.join(methods)})"
                                          for value, methods in by_value.items())]

    found = spread("split", {row["method"]: row["split"] for row in rows})
    for dataset in datasets:
        found += spread(f"{dataset} n", {row["method"]: row["n"][dataset]
                                         for row in rows if dataset in row["n"]})
    return found


def merge(runs: Sequence[tuple[str, Mapping[str, Any]]], metrics: Sequence[str],
          allow_incomparable: bool = False) -> dict[str, Any]:
    """The comparison table of `runs` ((method, results) pairs): its datasets, metrics, one row per method
    holding its `split`, `n[dataset]`, `cells[dataset][metric]` (None where the run has none) and
    `average[metric]`, and `differences` (`differences`). Runs that differ are a ValueError naming how,
    unless `allow_incomparable`."""
    methods = [method for method, _ in runs]
    if len(set(methods)) != len(methods):
        raise ValueError(f"a method is named twice: {methods}")
    tables = [{row["dataset"]: row for row in results["table"] if row["dataset"] != report.AVERAGE}
              for _, results in runs]
    datasets = list(dict.fromkeys(name for table in tables for name in table))
    rows = []
    for (method, results), table in zip(runs, tables):
        cells = {d: {m: _number(method, d, m, table[d].get(m)) if d in table else None for m in metrics}
                 for d in datasets}
        average = {m: float(np.mean([cells[d][m] for d in datasets]))
                   if all(cells[d][m] is not None for d in datasets) else None for m in metrics}
        rows.append({"method": method, "split": (results.get("meta") or {}).get("split"),
                     "n": {d: table[d]["n"] for d in table}, "cells": cells, "average": average})
    found = differences(rows, datasets)
    if found and not allow_incomparable:
        raise ValueError(f"the runs are not comparable ({'; '.join(found)}): evaluate them on the same split "
                         "and questions, or pass --allow_incomparable to tabulate them anyway")
    return {"datasets": datasets, "metrics": list(metrics), "rows": rows, "differences": found}


def columns(merged: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The table's (dataset, column) columns: each dataset's question count ("n") and metrics, then the
    average's metrics."""
    return ([(d, m) for d in merged["datasets"] for m in ("n", *merged["metrics"])]
            + [(report.AVERAGE, m) for m in merged["metrics"]])


def _value(row: Mapping[str, Any], dataset: str, metric: str) -> float | None:
    if dataset == report.AVERAGE:
        return row["average"][metric]
    return row["n"].get(dataset) if metric == "n" else row["cells"][dataset][metric]


def warning(merged: Mapping[str, Any]) -> str:
    """The line that heads a table of incomparable runs ("" for comparable ones)."""
    if not merged.get("differences"):
        return ""
    return f"WARNING: these runs are not comparable ({'; '.join(merged['differences'])})"


def markdown(merged: Mapping[str, Any]) -> str:
    """One row per method: its split, then a column per (dataset, n or metric); a warning line above the
    table of incomparable runs."""
    cols = columns(merged)
    header = ["method", "split", *(f"{d} {LABELS.get(m, m)}" for d, m in cols)]
    rows = [[r["method"], r.get("split") or "?", *(_value(r, d, m) for d, m in cols)] for r in merged["rows"]]
    table = report.markdown_table(header, rows)
    return f"**{warning(merged)}**\n\n{table}" if warning(merged) else table


def write(merged: Mapping[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Writes main_table.md, .csv (columns `<dataset>/<metric>`) and .json to `out_dir`; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in OUTPUTS}
    paths["main_table.md"].write_text(markdown(merged) + "\n")
    cols = columns(merged)
    with open(paths["main_table.csv"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["method", "split", *(f"{d}/{m}" for d, m in cols)])
        for row in merged["rows"]:
            cells = ("" if (v := _value(row, d, m)) is None else v for d, m in cols)
            writer.writerow([row["method"], row.get("split") or "", *cells])
    paths["main_table.json"].write_text(json.dumps(merged, indent=2) + "\n")
    return paths


def main_table(name: str) -> tuple[str, ...]:
    """The metrics of task `name`'s main table (`Report.main_table`); an error says what to pass instead."""
    if not name:
        raise ValueError("pass --task (its main table's metrics) or --metrics")
    metrics = task.get(name).report.main_table
    if not metrics:
        raise ValueError(f"task {name!r} declares no main table (Report.main_table): pass --metrics")
    return metrics


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    runs = flags.DEFINE_multi_string("run", None, "METHOD=DIR: a method's evaluation directory (repeat)",
                                     required=True, flag_values=values)
    out = flags.DEFINE_string("out", None, "output directory", required=True, flag_values=values)
    task_name = flags.DEFINE_string("task", "", "the runs' task: its main table's metrics "
                                    "(`Report.main_table`), unless --metrics", flag_values=values)
    metrics = flags.DEFINE_list("metrics", [], "the metrics of the table, in order", flag_values=values)
    allow = flags.DEFINE_bool("allow_incomparable", False, "tabulate runs of other splits or question counts "
                              "(the differences head the table)", flag_values=values)
    cli.parse(values, argv, __doc__)
    try:
        columns = metrics.value or main_table(task_name.value)
        specs = [parse_run(spec) for spec in runs.value]
        merged = merge([(method, load_results(path)) for method, path in specs], columns, allow.value)
    except (OSError, ValueError) as e:
        cli.fail(str(e))
    if warning(merged):
        print(warning(merged), file=sys.stderr)
    paths = write(merged, out.value)
    print(markdown(merged))
    print(f"wrote {', '.join(sorted(paths))} to {out.value}")


if __name__ == "__main__":
    cli.run(main)
