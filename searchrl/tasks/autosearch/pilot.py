"""AutoSearch's pilot study: accuracy when the policy makes exactly k searches (`forced_depth`), per dataset
and model, and the distribution of the minimal sufficient depth (the smallest forced k whose answer is an
exact match), for a list of checkpoints (e.g. Qwen2.5-3B/7B/14B-Instruct) evaluated with one config's env,
retriever and budgets.

    python -m searchrl.tasks.autosearch.pilot --config configs/autosearch.py:paper \\
        --checkpoints M3B,M7B,M14B [--depths 0,1,2,3,4] [--datasets nq,hotpotqa] [--split test] [--limit N]
        [--batch_size B] [--out DIR] [--config.x.y=value ...]

Writes pilot.md, pilot.json, pilot_accuracy.png, pilot_depth.png and predictions.jsonl (`write_pilot`) to --out
(default: <config.workdir>/pilot). Runs on the config's mesh and, with --config.distributed.*, as one process
of a multi-process run, as `python -m searchrl.eval` does (`harness.rollout_rows`); process 0 writes.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
from absl import flags

from searchrl import cli, distributed, experiment, models, run_config
from searchrl.eval import harness, report, selection
from searchrl.rollout.config import RolloutConfig
from searchrl.run_config import RunConfig
from searchrl.tasks.autosearch import analysis
from searchrl.tasks.autosearch.env import AutoSearchEnv
from searchrl.tasks.autosearch.forced_depth import ForcedDepthEnv
from searchrl.text import qa

Rows = list[dict[str, Any]]


def at_depth(row: Mapping[str, Any], k: int) -> dict[str, Any]:
    """A question's pilot row at forced depth k from its row of a forced-depth run (depth 0: its final answer;
    else the intermediate answer after search k, "" when the row ran out of room before it), scored."""
    answers = row.get("intermediate_answers", [])
    answer = row["answer"] if k == 0 else (answers[k - 1] if k <= len(answers) else "")
    searches = min(k, row["searches"])
    return {key: row[key] for key in ("dataset", "id", "hops", "question", "golden_answers")} | {
        "answer": answer, **qa.scores(answer, row["golden_answers"]), "searches": searches,
        "forced_searches": sum(row["forced"][:searches])}


def forced_depth_runs(model_cfg: models.ModelConfig, params, tokenizer, env: AutoSearchEnv,
                      datasets: Mapping[str, Sequence[dict]], rollout: RolloutConfig, batch_size: int,
                      depths: Sequence[int], placement: models.Placement) -> dict[int, Rows]:
    """The pilot rows at each forced depth: one greedy evaluation (`harness.evaluate_policy`, on the
    placement's mesh if any) at depth 0 and one at the deepest depth, whose intermediate answers give every
    depth in between."""
    def run(depth: int) -> Rows:
        return harness.evaluate_policy(model_cfg, params, tokenizer, ForcedDepthEnv(env, depth), datasets,
                                       rollout, batch_size, placement=placement)["predictions"]

    depths = sorted(set(depths))
    shallow = run(0) if depths[0] == 0 else []
    deepest = run(depths[-1]) if depths[-1] > 0 else []
    return {k: [at_depth(row, k) for row in (deepest if k else shallow)] for k in depths}


def minimal_depths(runs: Mapping[int, Sequence[Mapping[str, Any]]]) -> Rows:
    """Per question (every run holds the same questions in the same order): its dataset, id and hops and
    "depth", the smallest forced depth whose answer is an exact match (None: no depth's is)."""
    depths = sorted(runs)
    out = []
    for rows in zip(*(runs[k] for k in depths)):
        right = [k for k, row in zip(depths, rows) if row["em"]]
        first = rows[0]
        out.append({"dataset": first["dataset"], "id": first["id"], "hops": first["hops"],
                    "depth": min(right, default=None)})
    return out


def model_summary(label: str, runs: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """One model's pilot: every metric per forced depth (`report.budget_curves`: per dataset, their average
    and per hop count) and the minimal-sufficient-depth distribution."""
    return {"model": label, "accuracy": report.budget_curves(runs, analysis.REPORT),
            "depth": analysis.depth_distribution(minimal_depths(runs), max(runs))}


def model_labels(checkpoints: Sequence[str]) -> list[str]:
    """Each checkpoint's directory name (its path when two names clash); "policy" for the config's own."""
    names = [Path(c).name or "policy" for c in checkpoints]
    return names if len(set(names)) == len(names) else [c or "policy" for c in checkpoints]


def run_pilot(config: RunConfig, checkpoints: Sequence[str], depths: Sequence[int] = (), *,
              datasets: str = "", split: str = "", limit: int | None = None, batch_size: int = 0
              ) -> dict[str, Any]:
    """The pilot of every checkpoint (an HF model dir, trainer checkpoint or run dir; "": the config's policy)
    with the env, retriever, rollout budgets and mesh of `config`; depths default to 0 ..
    config.env.max_turns.
    Returns {"meta", "models": [model_summary ...], "predictions": rows tagged with model and forced
    depth}."""
    data, split = harness.load_eval_data(config, datasets, split, limit)
    depths = sorted(set(depths)) or list(range(config.env.max_turns + 1))
    summaries, predictions, placement = [], [], models.placement_of(config.mesh)
    for label, checkpoint in zip(model_labels(checkpoints), checkpoints):
        built = experiment.build(config, train_data=False, checkpoint=checkpoint)
        if not isinstance(built.env, AutoSearchEnv):
            raise ValueError(f"The pilot forces the searches of the autosearch env; config.env.name is "
                             f"{config.task!r}.")
        runs = forced_depth_runs(built.model_cfg, built.policy, built.tokenizer, built.env, data,
                                 built.rollout, batch_size or config.train.batch_size, depths, placement)
        summaries.append(model_summary(label, runs) | {"source": built.source})
        predictions += [{"model": label, "forced_depth": k, **row}
                        for k, rows in runs.items() for row in rows]
    meta = {"datasets": ",".join(data), "split": split, "questions": sum(map(len, data.values())),
            "depths": depths, "decoding": "greedy"}
    return {"meta": meta, "models": summaries, "predictions": predictions}


# ---- Tables and figures ----

def accuracy_rows(pilot: Mapping[str, Any], metric: str) -> list[tuple]:
    """(model, group, `metric` at each depth) per model and dataset (their average, then per hop count)."""
    return [(m["model"], analysis.hop_label(r), *r[metric])
            for m in pilot["models"] for r in m["accuracy"]["datasets"] + m["accuracy"]["by"][analysis.HOPS]]


def depth_rows(pilot: Mapping[str, Any]) -> list[tuple]:
    """(model, group, n, "count (fraction)" per depth bucket) per model and dataset (all, then per hop
    count)."""
    return [(m["model"], analysis.hop_label(r), r["n"],
             *(f"{r['counts'][k]} ({r['fractions'][k]:.2f})" for k in m["depth"]["buckets"]))
            for m in pilot["models"] for r in m["depth"]["datasets"] + m["depth"]["hops"]]


def pilot_markdown(pilot: Mapping[str, Any]) -> str:
    """The pilot's tables: accuracy at each forced depth, searches the env imposed, the depth distribution."""
    depths, metric = pilot["meta"]["depths"], pilot["models"][0]["accuracy"]["headline"]
    facts = "\n".join(f"- {k}: {v}" for k, v in pilot["meta"].items())
    buckets = pilot["models"][0]["depth"]["buckets"]
    return "\n".join([
        "# Pilot: accuracy at forced search depth", "", facts, "",
        f"## {metric} at forced depth k", "",
        "The policy makes exactly k searches, then answers; a turn before the k-th search that does not "
        "search is made a search with its own words as the query (searchrl.tasks.autosearch.forced_depth).", "",
        report.markdown_table(("model", "group", *(f"{metric} @ {k}" for k in depths)),
                              accuracy_rows(pilot, metric)), "",
        "## Searches the env imposed (mean per question)", "",
        report.markdown_table(("model", "group", *(f"k = {k}" for k in depths)),
                              accuracy_rows(pilot, "forced_searches")), "",
        "## Minimal sufficient search depth", "",
        f"d = the smallest forced depth whose answer is an exact match; never = none of {depths}. "
        "Counts (fractions).", "",
        report.markdown_table(("model", "group", "n", *buckets), depth_rows(pilot)),
    ]) + "\n"


def _panels(plt, count: int):
    fig, axes = plt.subplots(1, count, figsize=(4.5 * count, 3.8), squeeze=False)
    return fig, axes[0]


def plot_accuracy(pilot: Mapping[str, Any], path: str | os.PathLike) -> None:
    """One panel per dataset (and their average): the headline metric by forced depth, a line per model."""
    plt = report.pyplot()
    depths, metric = pilot["meta"]["depths"], pilot["models"][0]["accuracy"]["headline"]
    groups = [r["dataset"] for r in pilot["models"][0]["accuracy"]["datasets"]]
    fig, axes = _panels(plt, len(groups))
    for ax, group in zip(axes, groups):
        for m in pilot["models"]:
            row = next(r for r in m["accuracy"]["datasets"] if r["dataset"] == group)
            ax.plot(depths, row[metric], marker="o", label=m["model"])
        ax.set(xlabel="forced search depth k", ylabel=metric, xticks=depths, title=group, ylim=(0, 1.05))
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_depths(pilot: Mapping[str, Any], path: str | os.PathLike) -> None:
    """One panel per dataset (and all questions): the minimal-sufficient-depth distribution, bars by model."""
    plt = report.pyplot()
    groups = [r["dataset"] for r in pilot["models"][0]["depth"]["datasets"]]
    fig, axes = _panels(plt, len(groups))
    for ax, group in zip(axes, groups):
        bars = [(m["model"], next(r for r in m["depth"]["datasets"] if r["dataset"] == group)["fractions"])
                for m in pilot["models"]]
        analysis.depth_bars(ax, pilot["models"][0]["depth"]["buckets"], bars, title=group)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_pilot(pilot: Mapping[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes pilot.md, pilot.json (all but the predictions), predictions.jsonl and the two figures."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = ("pilot.md", "pilot.json", "predictions.jsonl", "pilot_accuracy.png", "pilot_depth.png")
    paths = {name: out / name for name in names}
    summary = {k: v for k, v in pilot.items() if k != "predictions"}
    paths["pilot.md"].write_text(pilot_markdown(summary))
    paths["pilot.json"].write_text(json.dumps(summary, indent=2) + "\n")
    paths["predictions.jsonl"].write_text("".join(json.dumps(row) + "\n" for row in pilot["predictions"]))
    plot_accuracy(summary, paths["pilot_accuracy.png"])
    plot_depths(summary, paths["pilot_depth.png"])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    values = flags.FlagValues()
    chosen = selection.define(values, "<config.workdir>/pilot")
    checkpoints = flags.DEFINE_list("checkpoints", [], "The checkpoints (HF model dirs, trainer checkpoint or "
                                    "run dirs; default: the config's policy).", flag_values=values)
    depths = flags.DEFINE_list("depths", [], "Forced search depths (default: 0 .. config.env.max_turns).",
                               flag_values=values)
    cli.parse(values, argv, __doc__)
    config = run_config.parse(chosen.config.value)
    distributed.initialize(config.distributed)
    results = run_pilot(config, checkpoints.value or [""], cli.non_negative_ints(depths.value, "depths"),
                        datasets=chosen.datasets.value, split=chosen.split.value, limit=chosen.limit.value,
                        batch_size=chosen.batch_size.value)
    if jax.process_index() != 0:
        return
    directory = chosen.out.value or Path(config.workdir) / "pilot"
    paths = write_pilot(results, directory)
    print(pilot_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {directory}")


if __name__ == "__main__":
    cli.run(main)
