"""Greedy evaluation of a checkpoint on any task: the papers' tables, accuracy by search budget, and the tables
the task adds (e.g. AutoSearch's search-depth analysis).

    python -m searchrl.eval --config configs/FILE.py:PRESET --checkpoint CKPT [--datasets nq,hotpotqa]
        [--split test] [--out DIR] [--limit N] [--budgets 0,1,2,3,4] [--budget_questions N] [--step N]
        [--batch_size B] [--noside_branch] [--config.x.y=value ...]

CKPT: a trainer checkpoint dir (`<workdir>/checkpoints`, or the workdir itself; --step picks a step, default
the latest) or a Hugging Face model dir; without it, the config's own policy (config.model.path) is evaluated.
Writes results.md / .csv / .json, predictions.jsonl and analysis.png to --out (default: under the run, never in
a model dir: <run>/eval/step_N for a trainer checkpoint, <config.workdir>/eval/<model dir name> for a Hugging
Face model dir, <config.workdir>/eval for the config's policy) and prints the results table. A task's own evaluations have
their own entry points in the task's package.

It runs on the config's mesh (--config.mesh.*) and, with --config.distributed.*, as one process of a
multi-process run (every host runs the same command): each process rolls out its rows of every batch, and
process 0 writes and prints the results.
"""
from __future__ import annotations

import jax
from absl import app, flags

from searchrl import cli, distributed, run_config, task
from searchrl.eval import harness, report, selection

_SELECTION = selection.define(flags.FLAGS, "<run>/eval/step_N, <workdir>/eval/<model dir name> or "
                             "<workdir>/eval")
flags.adopt_module_key_flags(selection)  # --help lists the shared flags too
_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "Trainer checkpoint dir, run workdir or Hugging Face "
                                  "model dir (default: the config's policy).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
_BUDGETS = flags.DEFINE_list("budgets", [], "Search budgets for the accuracy-vs-budget curve, e.g. 0,1,2,3,4 "
                             "(default: none).")
_BUDGET_QUESTIONS = flags.DEFINE_integer("budget_questions", None, "Roll out the budget runs on each "
                                         "dataset's first N questions only (default: all).", lower_bound=1)
_SIDE_BRANCH = flags.DEFINE_bool("side_branch", True, "Run the env's side branch (for search QA with "
                                 "config.env.intermediate_answers: the depth analysis).")


def run_eval() -> None:
    config, chosen = run_config.parse(_SELECTION.config.value), _SELECTION
    distributed.initialize(config.distributed)
    results, info = harness.evaluate_checkpoint(
        config, _CHECKPOINT.value, step=_STEP.value, datasets=chosen.datasets.value, split=chosen.split.value,
        limit=chosen.limit.value, budgets=cli.non_negative_ints(_BUDGETS.value, "budgets"),
        budget_questions=_BUDGET_QUESTIONS.value, batch_size=chosen.batch_size.value,
        side_branch=_SIDE_BRANCH.value)
    if jax.process_index() != 0:
        return
    out = chosen.out.value or harness.default_out_dir(config, info)
    paths = report.write_report(results, out, task.get(config.task).report)
    print(report.main_markdown(results))
    print(f"wrote {', '.join(sorted(paths))} to {out}")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    run_eval()


if __name__ == "__main__":
    cli.run_app(main)
