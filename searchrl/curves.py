"""A run's curves as a picture: `python -m searchrl.curves RUN_DIR_OR_METRICS_JSONL --out curves.png`.

Plots each of `--metrics` (default: the mean reward, the evaluation's metrics, tokens/s and the step time)
against the step, from the run's metrics.jsonl (`searchrl.metric_writer`), one panel each; a metric the run
never logged is skipped, and a run without any of them is an error naming the file.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from absl import flags  # noqa: E402

from searchrl import cli  # noqa: E402
from searchrl.metric_writer import read_metrics  # noqa: E402

DEFAULT = ("reward/mean", "eval/*", "perf/tokens_per_second", "perf/step_seconds")


def series(rows: Sequence[dict], patterns: Sequence[str]) -> dict[str, tuple[list[int], list[float]]]:
    """{metric: (steps, values)} of the rows' finite values, for each metric a pattern names ("eval/*": every
    eval/ metric), in the patterns' order."""
    names: list[str] = []
    for pattern in patterns:
        found = sorted({k for row in rows for k in row if k != "step" and (
            k.startswith(pattern[:-1]) if pattern.endswith("*") else k == pattern)})
        names += [name for name in found if name not in names]
    out = {}
    for name in names:
        points = [(row["step"], row[name]) for row in rows
                  if isinstance(row.get(name), (int, float)) and math.isfinite(row[name])]
        if points:
            out[name] = ([s for s, _ in points], [v for _, v in points])
    return out


def plot(curves: dict[str, tuple[list[int], list[float]]], title: str, path: str) -> None:
    """One panel per curve, in a row of up to 4."""
    columns = min(4, len(curves))
    rows = math.ceil(len(curves) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False)
    for ax, (name, (steps, values)) in zip(axes.flat, curves.items()):
        ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3)
        ax.set(title=name, xlabel="step")
    for ax in list(axes.flat)[len(curves):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    out = flags.DEFINE_string("out", None, "the PNG to write", required=True, flag_values=values)
    metrics = flags.DEFINE_list("metrics", list(DEFAULT), "metrics to plot; NAME/* for all under NAME/",
                                flag_values=values)
    source = cli.parse_argument(values, argv, __doc__, "run dir or metrics.jsonl")
    path = os.path.join(source, "metrics.jsonl") if os.path.isdir(source) else source
    if not os.path.isfile(path):
        cli.fail(f"no metrics file: {path}")
    curves = series(read_metrics(path), metrics.value)
    if not curves:
        cli.fail(f"{path}: none of {metrics.value} logged")
    os.makedirs(os.path.dirname(os.path.abspath(out.value)), exist_ok=True)
    plot(curves, os.path.basename(os.path.dirname(os.path.abspath(path))), out.value)
    print(f"wrote {out.value}: {', '.join(curves)}")


if __name__ == "__main__":
    cli.run(main)
