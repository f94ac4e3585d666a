"""Query-rewriting analyses (DeepRetrieval) beyond the evaluation report (which has the raw query
against the rewrite, the paper's Tables 1-3): the shapes of the rewarded queries at two checkpoints
(its Figure 12) and the reasoning and query lengths over training (its Figure 4).

    python -m searchrl.tasks.deepretrieval.rewrites --predictions A/predictions.jsonl,B/predictions.jsonl \
        [--metrics RUN/metrics.jsonl] [--out DIR] [--top 10]

`--predictions`: the predictions.jsonl files of `python -m searchrl.eval` runs at two (or more) checkpoints;
`--metrics`: a training run's metrics.jsonl. Prints the tables and writes rewrite_analysis.png to --out.
"""
from __future__ import annotations

import collections
import json
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from absl import app, flags

from searchrl import cli
from searchrl.eval.report import markdown_table

LENGTHS = ("env/reasoning_words", "env/query_words")  # Figure 4's curves, as the trainer logs them
_QUERY_TOKEN = re.compile(r'"[^"]*"|\(|\)|\[[^\]\[]*\]|\bAND\b|\bOR\b|\bNOT\b|[^\s()"\[\]]+')  # linear time


def query_shape(query: str) -> str:
    """A query's structure with its words abstracted: runs of plain terms become `T`, quoted phrases `"P"`;
    Boolean operators, parentheses and field tags ([tiab], [MeSH Terms]) stay. `(heart OR cardiac) AND
    "myocardial infarction"[tiab]` -> `(T OR T) AND "P"[tiab]`."""
    parts: list[str] = []
    for token in _QUERY_TOKEN.findall(query):
        if token in ("AND", "OR", "NOT", "(", ")") or token.startswith("["):
            parts.append(token)
        elif token.startswith('"'):
            parts.append('"P"')
        elif not parts or parts[-1] != "T":
            parts.append("T")
    text = " ".join(parts)
    return re.sub(r"\( ", "(", re.sub(r" \)", ")", re.sub(r" \[", "[", text)))


def rewarded_shapes(rows: Sequence[Mapping[str, Any]], top: int = 10) -> list[tuple[str, int, float]]:
    """The most common shapes of the rewarded queries (reward > 0): (shape, count, share of them)."""
    rewarded = [row["query"] for row in rows if row.get("reward", 0) > 0 and row.get("query")]
    counts = collections.Counter(query_shape(q) for q in rewarded)
    return [(shape, n, n / len(rewarded)) for shape, n in counts.most_common(top)]


def length_curves(metrics: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of each LENGTHS metric over a training run's logged rows."""
    return {name: [(int(r["step"]), float(r[name])) for r in metrics if r.get(name) is not None]
            for name in LENGTHS}


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def markdown(shapes: Mapping[str, Sequence[tuple[str, int, float]]],
             curves: Mapping[str, Sequence[tuple[int, float]]] | None) -> str:
    parts = []
    for label, rows in shapes.items():
        parts += [f"## Rewarded query shapes: {label}", "",
                  markdown_table(("shape", "count", "share"), rows), ""]
    if curves:
        steps = sorted({s for points in curves.values() for s, _ in points})
        values = {name: dict(points) for name, points in curves.items()}
        every = max(1, len(steps) // 10)
        rows = [(s, *(values[n].get(s) for n in LENGTHS)) for s in steps[::every]]
        parts += ["## Reasoning and query length over training", "",
                  markdown_table(("step", *LENGTHS), rows), ""]
    return "\n".join(parts)


def plot(shapes: Mapping[str, Sequence[tuple[str, int, float]]],
         curves: Mapping[str, Sequence[tuple[int, float]]] | None, path: str | os.PathLike) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, points in (curves or {}).items():
        if points:
            axes[0].plot(*zip(*points), label=name)
    axes[0].set(xlabel="step", ylabel="words", title="reasoning and query length")
    axes[0].legend(fontsize=7)
    width = 0.8 / max(1, len(shapes))
    labels = list(dict.fromkeys(shape for rows in shapes.values() for shape, _, _ in rows))
    for i, (label, rows) in enumerate(shapes.items()):
        share = {shape: s for shape, _, s in rows}
        axes[1].barh([j + i * width for j in range(len(labels))], [share.get(s, 0.0) for s in labels], width,
                     label=label)
    axes[1].set_yticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, fontsize=7)
    axes[1].set(xlabel="share of rewarded queries", title="rewarded query shapes")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    predictions = flags.DEFINE_list("predictions", [], "predictions.jsonl of evaluations at two checkpoints.",
                                    flag_values=values)
    metrics = flags.DEFINE_string("metrics", "", "A training run's metrics.jsonl (reasoning / query length).",
                                  flag_values=values)
    out = flags.DEFINE_string("out", ".", "Where rewrite_analysis.png goes.", flag_values=values)
    top = flags.DEFINE_integer("top", 10, "Shapes listed per checkpoint.", flag_values=values)
    cli.parse(values, argv, __doc__)
    if not predictions.value and not metrics.value:
        raise app.UsageError("Give --predictions (eval outputs) and / or --metrics (a run's metrics.jsonl).")
    shapes = {path: rewarded_shapes(_read_jsonl(path), top.value) for path in predictions.value}
    curves = length_curves(_read_jsonl(metrics.value)) if metrics.value else None
    print(markdown(shapes, curves))
    Path(out.value).mkdir(parents=True, exist_ok=True)
    plot(shapes, curves, Path(out.value) / "rewrite_analysis.png")
    print(f"wrote {Path(out.value) / 'rewrite_analysis.png'}")


if __name__ == "__main__":
    cli.run(main)
