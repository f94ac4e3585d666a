"""RPL's Figures 4 and 5 from training runs' metrics (their workdirs' metrics.jsonl).

Figure 4 (retrieval and training efficiency): per run, context consumption (`rollout/context_tokens`, the
observation tokens that enter the model context), retrieval turns (`rollout/retrieval_turns`, valid actions
answered with an observation) and seconds per training step (`perf/step_seconds`), all logged by the trainer for
any env (so a Search-R1 or AutoSearch run compares with RPL's), each run's mean over its logged steps divided
by the midpoint of the first run's (RPL's) min-max range, as the paper normalises, the raw range written on
each bar. Figure 5 (primitive
adoption): the percentage of held-out rollouts whose programs call sparse retrieval or reranking at least
once (`eval/uses_sparse_retrieval`, `eval/uses_rerank`, logged at train.eval_every) over training, a line
style per run; `--adoption env` draws the training rollouts' (`env/uses_*`, every step) for runs without
evaluations.

    python -m searchrl.tasks.rpl.figures --runs rpl=runs/rpl,search=runs/rpl_search --out runs/figures \
        [--adoption eval|env]

Writes figure4.png, figure5.png and figures.json (every number drawn) to --out.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from absl import flags

from searchrl import cli
from searchrl.eval import report
from searchrl.tasks.rpl.demo import curve

EFFICIENCY = (("rollout/context_tokens", "context consumption (tokens)"),
              ("rollout/retrieval_turns", "retrieval turns"),
              ("perf/step_seconds", "training time (s / step)"))
ADOPTION = (("uses_sparse_retrieval", "sparse retrieval"), ("uses_rerank", "reranking"))
SOURCES = ("eval", "env")  # Figure 5 over held-out rollouts (the paper's) or the training rollouts


def efficiency(runs: Mapping[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """Figure 4's numbers: per metric and run, the mean, min and max over the logged steps and the mean over
    the midpoint of the first run's min-max range; a run that never logged a metric is an error naming it."""
    out = {}
    for metric, _ in EFFICIENCY:
        values = {}
        for label, workdir in runs.items():
            points = [v for _, v in curve(workdir, metric)]
            if not points:
                raise ValueError(f"{workdir}/metrics.jsonl ({label}) has no {metric!r}")
            values[label] = points
        first = next(iter(values.values()))
        midpoint = (min(first) + max(first)) / 2 or 1.0
        out[metric] = {label: {"mean": sum(v) / len(v), "min": min(v), "max": max(v),
                               "normalized": sum(v) / len(v) / midpoint} for label, v in values.items()}
    return out


def adoption(runs: Mapping[str, str], source: str = "eval") -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Figure 5's curves: per primitive and run, (step, percent of `source`'s rollouts calling it)."""
    if source not in SOURCES:
        raise ValueError(f"adoption source {source!r} is not one of {SOURCES}")
    return {metric: {label: [(step, 100 * v) for step, v in curve(workdir, f"{source}/{metric}")]
                     for label, workdir in runs.items()} for metric, _ in ADOPTION}


def plot_efficiency(numbers: Mapping[str, Any], path: Path) -> None:
    plt = report.pyplot()
    fig, axes = plt.subplots(1, len(EFFICIENCY), figsize=(4.2 * len(EFFICIENCY), 3.6), squeeze=False)
    for ax, (metric, title) in zip(axes[0], EFFICIENCY):
        labels = list(numbers[metric])
        bars = ax.bar(labels, [numbers[metric][label]["normalized"] for label in labels])
        for bar, label in zip(bars, labels):
            row = numbers[metric][label]
            ax.annotate(f"{row['min']:.3g}-{row['max']:.3g}", (bar.get_x() + bar.get_width() / 2,
                                                              bar.get_height()), ha="center", va="bottom",
                        fontsize="small")
        ax.set(title=title, ylabel="relative to RPL's mid-range")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_adoption(curves: Mapping[str, Any], path: Path) -> None:
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    styles = ("-", "--", ":", "-.")
    for colour, (metric, name) in zip(("tab:blue", "tab:orange"), ADOPTION):
        for style, (label, points) in zip(styles, curves[metric].items()):
            if points:
                ax.plot(*zip(*points), style, color=colour, label=f"{name} ({label})")
    ax.set(xlabel="training step", ylabel="% of rollouts calling it", ylim=(0, 105),
           title="Primitive adoption over RL training")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_figures(runs: Mapping[str, str], out: str | Path, source: str = "eval") -> dict[str, Any]:
    """Figures 4 and 5 (adoption from `source`) and figures.json (their numbers) in `out`; returns the
    numbers."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    numbers = {"figure4": efficiency(runs), "figure5": adoption(runs, source)}
    plot_efficiency(numbers["figure4"], out / "figure4.png")
    plot_adoption(numbers["figure5"], out / "figure5.png")
    (out / "figures.json").write_text(json.dumps(numbers, indent=1) + "\n")
    return numbers


def parse_runs(text: str) -> dict[str, str]:
    """label=workdir pairs, comma-separated, in order (RPL's run first)."""
    runs = {}
    for pair in text.split(","):
        label, sep, workdir = pair.partition("=")
        if not sep or not label or not workdir:
            raise ValueError(f"--runs: {pair!r} is not label=workdir")
        runs[label] = workdir
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    runs = flags.DEFINE_string("runs", None, "label=workdir pairs, comma-separated; the first is RPL's.",
                               required=True, flag_values=values)
    out = flags.DEFINE_string("out", None, "Output directory.", required=True, flag_values=values)
    source = flags.DEFINE_enum("adoption", "eval", SOURCES, "Figure 5 over held-out (eval) or training (env) "
                               "rollouts.", flag_values=values)
    cli.parse(values, argv, __doc__)
    try:
        write_figures(parse_runs(runs.value), out.value, source.value)
    except ValueError as e:
        cli.fail(str(e))
    print(f"wrote figure4.png, figure5.png and figures.json to {out.value}")


if __name__ == "__main__":
    cli.run(main)
