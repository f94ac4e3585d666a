"""AutoSearch's over- and under-search rates: how often a method searches more, or fewer, times than a
question's minimal sufficient depth, the smallest forced depth whose answer is an exact match in the
forced-depth pilot (`pilot`), for its comparison of Search-R1, StepSearch, HiPRAG and AutoSearch.

A question over-searches when the run's searches exceed its minimal depth d, under-searches when they fall
short of it; questions that no forced depth answers ("never") have no d and are counted apart, not in either
rate. Rows are matched by (dataset, id).

    python -m searchrl.tasks.autosearch.search_rates --pilot runs/pilot/predictions.jsonl \\
        --pilot_model M14B \\
        --runs search_r1=runs/sr1/eval/predictions.jsonl,autosearch=runs/as/eval/predictions.jsonl \\
        [--out runs/search_rates.md]
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from absl import flags

from searchrl import cli
from searchrl.data.jsonl import read_jsonl
from searchrl.eval import report
from searchrl.tasks.autosearch.pilot import minimal_depths

Key = tuple[str, str]  # dataset, question id


def pilot_depths(pilot_rows: Sequence[Mapping[str, Any]], model: str) -> dict[Key, int | None]:
    """Each question's minimal sufficient depth for `model` from a pilot's predictions.jsonl rows."""
    mine = [r for r in pilot_rows if r["model"] == model]
    if not mine:
        raise ValueError(f"the pilot has no rows of model {model!r}; it has "
                         f"{sorted({r['model'] for r in pilot_rows})}")
    runs: dict[int, list] = {}
    for row in mine:
        runs.setdefault(int(row["forced_depth"]), []).append(row)
    return {(r["dataset"], str(r["id"])): r["depth"] for r in minimal_depths(runs)}


def rates(rows: Sequence[Mapping[str, Any]], depths: Mapping[Key, int | None]) -> list[dict[str, Any]]:
    """Per dataset and over all: questions, over- and under-search rates among those with a minimal depth,
    the mean searches and the count without one (never)."""
    missing = [(r["dataset"], r["id"]) for r in rows if (r["dataset"], str(r["id"])) not in depths]
    if missing:
        raise ValueError(f"{len(missing)} evaluated questions are not in the pilot, first {missing[0]}")
    groups = {**report.by_dataset(rows), report.ALL: list(rows)}
    out = []
    for name, group in groups.items():
        known = [(r["searches"], depths[r["dataset"], str(r["id"])]) for r in group]
        scored = [(s, d) for s, d in known if d is not None]
        n = len(scored)
        out.append({"dataset": name, "n": len(group),
                    "over_search": sum(s > d for s, d in scored) / n if n else 0.0,
                    "under_search": sum(s < d for s, d in scored) / n if n else 0.0,
                    "searches": sum(r["searches"] for r in group) / len(group), "never": len(group) - n})
    return out


def rates_markdown(methods: Mapping[str, list[dict[str, Any]]]) -> str:
    """One table: a row per (method, dataset)."""
    keys = ("n", "over_search", "under_search", "searches", "never")
    return report.markdown_table(("method", "dataset", *keys), [
        (method, row["dataset"], *(row[k] for k in keys))
        for method, lines in methods.items() for row in lines])


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    pilot = flags.DEFINE_string("pilot", None, "The pilot's predictions.jsonl.", required=True,
                                flag_values=values)
    model = flags.DEFINE_string("pilot_model", None, "Whose minimal depths (a model label of the pilot).",
                                required=True, flag_values=values)
    runs = flags.DEFINE_string("runs", None, "label=predictions.jsonl pairs, comma-separated.", required=True,
                               flag_values=values)
    out = flags.DEFINE_string("out", "", "Write the table here too (markdown).", flag_values=values)
    cli.parse(values, argv, __doc__)
    depths = pilot_depths([row for _, row in read_jsonl(pilot.value)], model.value)
    methods = {}
    for pair in runs.value.split(","):
        label, sep, path = pair.partition("=")
        if not sep:
            cli.fail(f"--runs: {pair!r} is not label=path")
        methods[label] = rates([row for _, row in read_jsonl(path)], depths)
    table = rates_markdown(methods) + "\n"
    print(table, end="")
    if out.value:
        Path(out.value).write_text(table)


if __name__ == "__main__":
    cli.run(main)
