"""Greedy evaluation of a checkpoint: the papers' tables and AutoSearch's search-depth analysis.

    python -m searchrl.eval --config configs/FILE.py:PRESET --checkpoint CKPT [--datasets nq,hotpotqa]
        [--split test] [--out DIR] [--limit N] [--budgets 0,1,2,3,4] [--step N] [--batch_size B]
        [--noside_branch] [--config.x.y=value ...]

CKPT: a trainer checkpoint dir (`<workdir>/checkpoints`, or the workdir itself; --step picks a step, default
the latest) or a Hugging Face model dir; without it, the config's own policy (config.model.path) is evaluated.
Writes results.md / .csv / .json, predictions.jsonl and depth_analysis.png to --out (default:
<CKPT>/eval[/step_N], or <config.workdir>/eval) and prints the results table.
"""
from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from searchrl.eval import harness, report

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config: configs/FILE.py:PRESET.")
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Trainer checkpoint dir, run workdir or Hugging Face "
                                  "model dir (default: the config's policy).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_DATASETS = flags.DEFINE_string("datasets", "", "Comma-separated dataset names (default: config.data.eval).")
_SPLIT = flags.DEFINE_string("split", "", "Split to evaluate (default: config.data.eval_split).")
_OUT = flags.DEFINE_string("out", "", "Output directory (default: <checkpoint>/eval or <workdir>/eval).")
_LIMIT = flags.DEFINE_integer("limit", None, "First N questions per dataset (default: "
                              "config.data.eval_limit; 0: all).")
_BUDGETS = flags.DEFINE_list("budgets", [], "Search budgets for the accuracy-vs-budget curve, e.g. 0,1,2,3,4 "
                             "(default: none).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 0, "Rollout rows per batch (default: "
                                   "config.train.batch_size).")
_SIDE_BRANCH = flags.DEFINE_bool("side_branch", True, "Run the env's side branch (for search QA with "
                                 "config.env.intermediate_answers: the depth analysis).")


def parse_budgets(values: list[str]) -> list[int]:
    """Integers >= 0 from the --budgets list; anything else is a usage error naming the value."""
    budgets = []
    for value in values:
        if not value.strip().isdigit():
            raise app.UsageError(f"--budgets: {value!r} is not a non-negative integer.")
        budgets.append(int(value))
    return budgets


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    if _CONFIG.value is None:
        raise app.UsageError("--config is required, e.g. --config=configs/search_r1.py:tiny")
    results, info = harness.evaluate_checkpoint(
        _CONFIG.value, _CHECKPOINT.value, step=_STEP.value, datasets=_DATASETS.value, split=_SPLIT.value,
        limit=_LIMIT.value, budgets=parse_budgets(_BUDGETS.value), batch_size=_BATCH_SIZE.value,
        side_branch=_SIDE_BRANCH.value)
    out = _OUT.value or harness.default_out_dir(_CONFIG.value, info)
    paths = report.write_report(results, out)
    print(report.main_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {out}")


if __name__ == "__main__":
    app.run(main)
